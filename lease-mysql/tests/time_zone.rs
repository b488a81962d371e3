//! A pool of the caller's (`MysqlBackend::from_pool`) whose sessions use a time zone other
//! than UTC, sharing the lock table with a backend from `connect` (UTC sessions). The
//! deadlines are `DATETIME(6)`, which no session converts: if the statements read the
//! session's local time, the two would disagree by the zones' offset (a lease taken over
//! at once, or held for hours after its TTL or its release). Every reading must agree
//! with the TTLs, whatever the session's zone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseName, Owner, ReleaseOutcome, RenewItem,
    RenewOutcome,
};
use lease_mysql::sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use lease_mysql::sqlx::{self, AssertSqlSafe};
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::mariadb::MariaDbServer;

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).unwrap())
}

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// A pool whose every connection runs `SET time_zone = 'zone'` once connected, as an
/// application's pool may.
async fn pool_in_zone(url: &str, zone: &'static str) -> MySqlPool {
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(format!("SET time_zone = '{zone}'")))
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .unwrap();
    let (tz,): (String,) = sqlx::query_as("SELECT @@session.time_zone")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tz, zone, "the pool's sessions are not in {zone}");
    pool
}

/// What a backend reads of `lease`: `None` when free, else the remaining time.
async fn remaining(backend: &MysqlBackend, lease: &LeaseName) -> Option<Duration> {
    backend
        .inspect(lease)
        .await
        .unwrap()
        .map(|info| info.remaining.unwrap())
}

/// `Some(r)` with `r` in (ttl - 10 s, ttl]: 10 s of margin for a loaded machine, far below
/// the hours an offset would add.
fn about(r: Option<Duration>, ttl: Duration) -> bool {
    r.is_some_and(|r| r <= ttl && r > ttl.saturating_sub(Duration::from_secs(10)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_in_another_time_zone_agrees_with_utc_sessions() {
    let db = MariaDbServer::shared().await.unwrap();
    let utc = MysqlBackend::connect(&db.url()).await.unwrap();
    let ttl = Duration::from_secs(30);
    let mut misreads = Vec::new();
    for zone in ["+05:00", "-05:00"] {
        let zoned =
            MysqlBackend::from_pool(pool_in_zone(&db.url(), zone).await, MysqlConfig::default())
                .await
                .unwrap();

        // A lease taken in UTC: the zoned backend must see it held for its TTL.
        let by_utc = name(&format!("taken-in-utc {zone}"));
        let a = owner("utc");
        assert!(matches!(
            utc.acquire(&by_utc, &a, ttl).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        let seen = remaining(&zoned, &by_utc).await;
        if !about(seen, ttl) {
            misreads.push(format!(
                "{zone}: a {ttl:?} lease taken in UTC reads as {seen:?} remaining"
            ));
        }
        match zoned.acquire(&by_utc, &owner(zone), ttl).await.unwrap() {
            AcquireOutcome::Held(by) => {
                if by.holder.as_deref() != Some("utc") || !about(by.remaining, ttl) {
                    misreads.push(format!(
                        "{zone}: the acquire of a lease held in UTC answered held by {by}"
                    ));
                }
            }
            AcquireOutcome::Acquired { fencing, .. } => misreads.push(format!(
                "{zone}: took over at once (fencing {}) a {ttl:?} lease just taken in UTC",
                fencing.get()
            )),
        }

        // A lease taken in the zone: the UTC backend must see it held for its TTL, also
        // after a renewal.
        let by_zoned = name(&format!("taken-in-zone {zone}"));
        let z = owner(zone);
        assert!(matches!(
            zoned.acquire(&by_zoned, &z, ttl).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        let seen = remaining(&utc, &by_zoned).await;
        if !about(seen, ttl) {
            misreads.push(format!(
                "{zone}: a {ttl:?} lease taken in the zone reads in UTC as {seen:?} remaining"
            ));
        }
        let renewed = zoned
            .renew(
                &[RenewItem {
                    name: by_zoned.clone(),
                    token: z.token,
                }],
                ttl,
            )
            .await
            .unwrap();
        let seen = remaining(&utc, &by_zoned).await;
        if renewed != [RenewOutcome::Renewed] || !about(seen, ttl) {
            misreads.push(format!(
                "{zone}: after a renewal in the zone ({renewed:?}) UTC reads {seen:?} remaining"
            ));
        }

        // Released in the zone: free for the UTC backend at once.
        assert_eq!(
            zoned
                .release(&by_zoned, &z.token, Duration::ZERO)
                .await
                .unwrap(),
            ReleaseOutcome::Released
        );
        match utc.acquire(&by_zoned, &owner("utc"), ttl).await.unwrap() {
            AcquireOutcome::Acquired { .. } => {}
            AcquireOutcome::Held(by) => misreads.push(format!(
                "{zone}: a lease released in the zone is still held in UTC: {by}"
            )),
        }
    }
    assert!(
        misreads.is_empty(),
        "session time zone misreads:\n{}",
        misreads.join("\n")
    );
}
