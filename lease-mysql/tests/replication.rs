//! Statement-based replication of the lock table, on a real primary and replica (two
//! local `mariadbd`, the primary with `--binlog-format=STATEMENT`): why the backend reads
//! the time with `UTC_TIMESTAMP(6)` (the statement's start, as `NOW(6)`) and not
//! `SYSDATE(6)`.
//!
//! The replica's SQL thread is held while the primary runs the statements, and released
//! 500 ms later, so the replica applies them half a second after the primary did (time is
//! the subject here; 500 ms is far above the clock's microsecond resolution and the
//! 400 ms the check asks for leaves 100 ms for scheduling). A statement that reads
//! `UTC_TIMESTAMP(6)` gives the same row on both: the binary log carries each
//! statement's start time. One that reads `SYSDATE(6)` gives a replica row half a second later than the
//! primary's: after a failover, the promoted replica would hold such a lease longer than
//! its holder was told.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseName, Owner, RenewItem, RenewOutcome,
};
use lease_mysql::MysqlBackend;
use lease_test_servers::mariadb::MariaDbServer;

/// The primary's current binary log file and position.
fn position(primary: &MariaDbServer) -> (String, u64) {
    let rows = primary.sql("SHOW MASTER STATUS").unwrap();
    let row = rows.first().expect("the primary writes a binary log");
    let mut cols = row.split('\t');
    let file = cols.next().unwrap().to_owned();
    let pos = cols.next().unwrap().parse().unwrap();
    (file, pos)
}

/// Waits until the replica has applied everything the primary logged so far.
fn caught_up(primary: &MariaDbServer, replica: &MariaDbServer) {
    let (file, pos) = position(primary);
    let got = replica
        .sql(&format!("SELECT MASTER_POS_WAIT('{file}', {pos}, 30)"))
        .unwrap();
    // The number of events waited for; -1 after the timeout, NULL when not replicating.
    let waited = got.first().and_then(|v| v.parse::<i64>().ok());
    assert!(
        waited.is_some_and(|n| n >= 0),
        "the replica did not catch up: {got:?}; {:?}",
        replica.sql("SHOW SLAVE STATUS")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_based_replication_carries_utc_timestamp_but_not_sysdate() {
    let primary = MariaDbServer::start_with_options(&[
        "--server-id=1",
        "--log-bin=binlog",
        "--binlog-format=STATEMENT",
    ])
    .await
    .unwrap();
    let replica = MariaDbServer::start_with_options(&["--server-id=2", "--relay-log=relay"])
        .await
        .unwrap();
    let (file, pos) = position(&primary);
    replica
        .sql(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', \
             MASTER_PASSWORD='', MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}, \
             MASTER_USE_GTID=no; START SLAVE",
            primary.port().unwrap()
        ))
        .unwrap();
    primary
        .sql(
            "CREATE DATABASE repl; CREATE TABLE repl.sysdate_locks \
             (name VARCHAR(64) PRIMARY KEY, lock_until DATETIME(6) NOT NULL) ENGINE=InnoDB",
        )
        .unwrap();
    let url = format!("mysql://root@127.0.0.1:{}/repl", primary.port().unwrap());
    let backend = MysqlBackend::connect(&url).await.unwrap();
    caught_up(&primary, &replica);

    // The replica applies what follows 500 ms after the primary ran it.
    replica.sql("STOP SLAVE SQL_THREAD").unwrap();
    let lease = LeaseName::new("nightly-job").unwrap();
    let owner = Owner::new(HolderLabel::new("worker-1").unwrap());
    let fencing = match backend
        .acquire(&lease, &owner, Duration::from_secs(30))
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { fencing, .. } => fencing.get(),
        AcquireOutcome::Held(by) => panic!("held by {by}"),
    };
    let renewed = backend
        .renew(
            &[RenewItem {
                name: lease.clone(),
                token: owner.token,
            }],
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        matches!(renewed.as_slice(), [RenewOutcome::Renewed]),
        "{renewed:?}"
    );
    primary
        .sql(
            "INSERT INTO repl.sysdate_locks VALUES \
             ('nightly-job', SYSDATE(6) + INTERVAL 30 SECOND)",
        )
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replica.sql("START SLAVE SQL_THREAD").unwrap();
    caught_up(&primary, &replica);

    // UTC_TIMESTAMP(6): the same row on both, to the microsecond (acquire and renew).
    let rows = "SELECT name, HEX(owner_token), holder, fencing, locked_at, lock_until, released \
                FROM repl.lease_locks ORDER BY name";
    let on_primary = primary.sql(rows).unwrap();
    let on_replica = replica.sql(rows).unwrap();
    assert_eq!(on_primary.len(), 1, "{on_primary:?}");
    assert_eq!(on_primary, on_replica);
    assert!(
        on_primary[0].contains(&format!("\t{fencing}\t")),
        "{on_primary:?}"
    );

    // SYSDATE(6): the replica evaluated it again, half a second later.
    let primary_until = primary
        .sql("SELECT lock_until FROM repl.sysdate_locks")
        .unwrap()
        .remove(0);
    let late_us: i64 = replica
        .sql(&format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, '{primary_until}', lock_until) \
             FROM repl.sysdate_locks"
        ))
        .unwrap()
        .remove(0)
        .parse()
        .unwrap();
    assert!(
        late_us >= 400_000,
        "SYSDATE(6) on the replica was only {late_us} µs later than on the primary"
    );
    eprintln!(
        "statement-based replication: the UTC_TIMESTAMP(6) row is identical on the replica; the \
         SYSDATE(6) row's deadline is {:.3} s later there",
        late_us as f64 / 1e6
    );
}
