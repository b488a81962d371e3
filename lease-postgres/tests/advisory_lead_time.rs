//! The advisory-lock mode has no lead time: when the holder's session ends, the lock is
//! free at once, while the holder's guard learns only at its next renewal. For that
//! while, two processes believe they hold the lease (and the mode has no fencing tokens
//! to tell them apart). On the stores with a TTL the guard gives up at its safety
//! deadline, before the store can free the lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failures are assertions

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::suite;
use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions, Owner,
    TryAcquire,
};
use lease_postgres::AdvisoryLockBackend;
use lease_postgres::sqlx::{self, Connection, postgres::PgConnection};
use lease_test_servers::postgres::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_session_frees_the_lock_before_its_guard_knows() {
    let db = PostgresServer::shared().await.expect("server");
    let holder = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let contender = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let client = LeaseClient::new(Arc::new(holder.clone()));
    // Renewals every 2 s: the guard hears of the dead session at the next one.
    let opts = LeaseOptions::builder(Duration::from_secs(6))
        .renew_every(Duration::from_secs(2))
        .build()
        .expect("options");
    let n = LeaseName::new(format!("lead-time-{}", uuid::Uuid::new_v4().simple())).expect("name");
    let guard = match client.try_acquire(&n, &opts).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };

    // The holder's session dies (an operator, a crashed proxy, a server-side timeout):
    // the only advisory lock in this test's database is the holder's.
    let mut admin = PgConnection::connect(&db.url()).await.expect("connect");
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND granted AND database = (SELECT oid FROM pg_database \
         WHERE datname = current_database())",
    )
    .fetch_all(&mut admin)
    .await
    .expect("terminate");
    assert_eq!(ended, [true], "the holder's session was not ended");
    let ended_at = Instant::now();

    let b = Owner::new(HolderLabel::new("contender").expect("label"));
    let (taken_at, believed) = loop {
        match contender
            .acquire(&n, &b, Duration::from_secs(6))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Acquired { .. } => break (Instant::now(), guard.is_held()),
            AcquireOutcome::Held(_) => {
                assert!(ended_at.elapsed() < Duration::from_secs(5), "still held");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let reason = tokio::time::timeout(Duration::from_secs(6), guard.lost())
        .await
        .expect("no lost signal within the TTL");
    let overlap = taken_at.elapsed();
    eprintln!(
        "advisory mode: the lock was taken {:?} after the holder's session ended; its guard \
         still believed it held it then, and heard \"lost\" ({reason}) {overlap:?} later",
        taken_at - ended_at
    );
    assert!(
        believed,
        "the guard knew of the loss before the lock was taken: the mode would have a lead \
         time after all"
    );
    guard.disarm();
    // The capabilities say so.
    assert!(!holder.capabilities().lost_before_taken);
}

/// The conformance suite's lead-time checks report themselves not applicable to the
/// advisory mode (before its capabilities said so, they returned at once, as passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_time_checks_are_reported_not_applicable() {
    let db = PostgresServer::shared().await.expect("server");
    let backend: Arc<dyn LeaseBackend> = Arc::new(
        AdvisoryLockBackend::connect(&db.url())
            .await
            .expect("connect"),
    );
    let backend_name = backend.capabilities().backend;
    suite::lost_signal_before_store_expiry(backend.clone()).await;
    suite::semaphore_lost_before_permit_taken_over(backend.clone()).await;
    suite::election_deposed_leader_knows_first(backend).await;
    let reports: Vec<_> = lease_conformance::not_applicable_reports()
        .into_iter()
        .filter(|r| r.backend == backend_name)
        .collect();
    let checks: Vec<&str> = reports.iter().map(|r| r.check).collect();
    assert_eq!(
        checks,
        [
            "lost_signal_before_store_expiry",
            "semaphore_lost_before_permit_taken_over",
            "election_deposed_leader_knows_first",
        ]
    );
    assert!(
        reports
            .iter()
            .all(|r| r.reason == lease_conformance::NO_LEAD_TIME),
        "{reports:?}"
    );
}
