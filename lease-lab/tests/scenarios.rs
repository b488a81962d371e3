//! The comparison scenarios, asserting what each demonstrates, on every store here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseBackend, MemoryBackend};
use lease_lab::scenarios::{self, DilemmaMode, SEED_004_TTL};
use lease_test_servers::RedisServer;

/// The heartbeat's warnings (a lease lost, a renewal failed, with the store's error) in
/// the output of a failed test; `RUST_LOG` chooses others.
fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("lease_core::heartbeat=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

async fn redis() -> (RedisServer, Arc<dyn LeaseBackend>) {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let backend = leasehold::connect(&server.url()).await.unwrap();
    (server, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_capacity() {
    let none = scenarios::room_without_lock(30, 3).await;
    assert!(
        none.joined > 3,
        "without a lock the room must overfill: {none:?}"
    );
    let memory = scenarios::room_with_lease(Arc::new(MemoryBackend::new()), 30, 3).await;
    assert_eq!(memory.joined, 3);
    let (seats, _) = scenarios::room_with_semaphore(Arc::new(MemoryBackend::new()), 30, 3).await;
    assert_eq!(seats.joined, 3);
    let (server, backend) = redis().await;
    let with_lease = scenarios::room_with_lease(backend.clone(), 30, 3).await;
    assert_eq!(with_lease.joined, 3);
    let (seats, _) = scenarios::room_with_semaphore(backend, 30, 3).await;
    assert_eq!(seats.joined, 3, "a semaphore of 3 permits seats 3");
    let (watch, aborted) = scenarios::room_with_watch_multi(&server.url(), 30, 3)
        .await
        .unwrap();
    assert_eq!(watch.joined, 3);
    assert!(
        aborted > 0,
        "optimistic locking should have aborted some attempts"
    );
    eprintln!(
        "room of 3, 30 joiners: no lock {}, lease {}, WATCH/MULTI {} with {aborted} aborted attempts",
        none.joined, with_lease.joined, watch.joined
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_ttl_without_watchdog_duplicates_and_watchdog_does_not() {
    logs();
    let (_server, backend) = redis().await;
    let fixed = scenarios::fixed_ttl_vs_watchdog(backend.clone(), 1000, SEED_004_TTL, false).await;
    assert!(fixed.acquired > 1 && fixed.max_concurrent > 1, "{fixed:?}");
    let watchdog = scenarios::fixed_ttl_vs_watchdog(backend, 1000, SEED_004_TTL, true).await;
    assert_eq!(watchdog.acquired, 1, "{watchdog:?}");
    assert_eq!(watchdog.max_concurrent, 1);
    eprintln!("1000 tasks, 100 ms ttl, 1 s work: fixed ttl {fixed:?}; watchdog {watchdog:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_at_most_for_dilemma() {
    let (_server, backend) = redis().await;
    let short =
        scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::ShortFixedTtl).await;
    let long =
        scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::LongFixedTtl).await;
    let watchdog = scenarios::lock_at_most_for_dilemma(backend, DilemmaMode::Watchdog).await;
    assert!(short.duplicated, "a short fixed ttl duplicates a slow job");
    assert!(!long.duplicated);
    assert!(!watchdog.duplicated, "the watchdog must not duplicate");
    assert!(
        long.recovery > watchdog.recovery * 3,
        "long ttl recovery {:?} vs watchdog {:?}",
        long.recovery,
        watchdog.recovery
    );
    eprintln!("dilemma: short {short:?}, long {long:?}, watchdog {watchdog:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_at_least_for_runs_once_per_period() {
    let (_server, backend) = redis().await;
    let without = scenarios::lock_at_least_for(backend.clone(), false, 4).await;
    let with = scenarios::lock_at_least_for(backend, true, 4).await;
    assert!(
        without.ran >= 7,
        "without keep-for both instances run it: {without:?}"
    );
    assert!(
        with.ran <= 4 && with.ran >= 3,
        "with keep-for once per period: {with:?}"
    );
    eprintln!("4 periods, 2 instances: without keep-for {without:?}; with {with:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_holder_lease_recovers_after_its_ttl() {
    let (_server, backend) = redis().await;
    let took = scenarios::stuck_holder_lease(backend, Duration::from_secs(5)).await;
    let took = took.expect("the lease must recover after its ttl");
    assert!(took <= Duration::from_millis(500 + 700), "{took:?}");
}

mod postgres {
    use super::*;
    use lease_postgres::AdvisoryLockBackend;
    use lease_test_servers::PostgresServer;

    /// The seed's 1,000 contenders on PostgreSQL with 300 ms leases, not the seed's 100 ms.
    /// With 100 ms the renewal has about 57 ms for its round trip, and a PostgreSQL round
    /// trip shares the two cores with a backend process per pooled connection (ten of
    /// them busy with the contenders' attempts) and, in CI, with the other lane's tests.
    /// Beside four busy loops, 100 ms leases were lost in 3 of 3 runs (renewal round trips
    /// of 34 to 76 ms, then one past the deadline; most attempts timed out at their 33 ms
    /// call timeout); 200 and 300 ms kept them in 3 of 3 each. Beside the CI's other lane, 300 ms
    /// kept them in 3 of 3 here; with 100 ms the holder lost the lease in 2 of 3 (once
    /// 35 µs after its acquire returned) and nobody acquired at all in the third. In a
    /// whole clean-clone run beside that lane 300 ms was lost once too (a renewal timed
    /// out at 100 ms), so this binary now runs in the rest lane, one binary at a time
    /// (scripts/test-lanes.py). Redis keeps the seed's figure.
    const PG_TTL: Duration = Duration::from_millis(300);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_scenarios() {
        logs();
        let db = PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let backend = leasehold::connect(&db.url()).await.unwrap();
        let room = scenarios::room_with_lease(backend.clone(), 30, 3).await;
        assert_eq!(room.joined, 3);
        let (seats, _) = scenarios::room_with_semaphore(backend.clone(), 30, 3).await;
        assert_eq!(seats.joined, 3);
        let fixed = scenarios::fixed_ttl_vs_watchdog(backend.clone(), 1000, PG_TTL, false).await;
        assert!(fixed.max_concurrent > 1, "{fixed:?}");
        let watchdog = scenarios::fixed_ttl_vs_watchdog(backend.clone(), 1000, PG_TTL, true).await;
        assert_eq!(
            (watchdog.acquired, watchdog.max_concurrent),
            (1, 1),
            "{watchdog:?}"
        );
        let short =
            scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::ShortFixedTtl).await;
        let long =
            scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::LongFixedTtl).await;
        let wd = scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::Watchdog).await;
        assert!(short.duplicated && !long.duplicated && !wd.duplicated);
        assert!(long.recovery > wd.recovery * 3, "{long:?} vs {wd:?}");
        let with = scenarios::lock_at_least_for(backend.clone(), true, 4).await;
        assert!((3..=4).contains(&with.ran), "{with:?}");
        let recovered = scenarios::stuck_holder_lease(backend, Duration::from_secs(5)).await;
        assert!(
            recovered.is_some_and(|d| d <= Duration::from_millis(1200)),
            "{recovered:?}"
        );
    }

    /// A session advisory lock has no TTL: a holder that is alive but stuck
    /// (its connection open) blocks everyone indefinitely, where the lease recovers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn advisory_lock_blocks_while_holder_is_stuck() {
        let db = PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let advisory: Arc<dyn LeaseBackend> =
            Arc::new(AdvisoryLockBackend::connect(&db.url()).await.unwrap());
        let blocked = scenarios::stuck_holder_lease(advisory, Duration::from_secs(3)).await;
        assert_eq!(
            blocked, None,
            "the advisory lock should still block after 3 s"
        );
    }
}

mod etcd {
    use super::*;
    use lease_test_servers::EtcdServer;

    // Three tests (each on its own server), so that the binary runs them beside the
    // others: with etcd's 1 s TTL granularity each scenario takes tens of seconds.
    async fn etcd() -> (EtcdServer, Arc<dyn LeaseBackend>) {
        let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        let backend = leasehold::connect(&server.url()).await.unwrap();
        (server, backend)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_room_and_watchdog() {
        logs();
        let (_server, backend) = etcd().await;
        let room = scenarios::room_with_lease(backend.clone(), 30, 3).await;
        assert_eq!(room.joined, 3);
        // Timings scale with etcd's 1 s TTL granularity.
        let fixed =
            scenarios::fixed_ttl_vs_watchdog(backend.clone(), 1000, SEED_004_TTL, false).await;
        assert!(fixed.max_concurrent > 1, "{fixed:?}");
        let watchdog = scenarios::fixed_ttl_vs_watchdog(backend, 1000, SEED_004_TTL, true).await;
        assert_eq!(
            (watchdog.acquired, watchdog.max_concurrent),
            (1, 1),
            "{watchdog:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_dilemma_and_keep_for() {
        let (_server, backend) = etcd().await;
        let wd = scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::Watchdog).await;
        assert!(!wd.duplicated, "{wd:?}");
        let with = scenarios::lock_at_least_for(backend, true, 4).await;
        assert!(
            (3..=4).contains(&with.ran),
            "keep-for: once per period: {with:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_stuck_holder() {
        let (_server, backend) = etcd().await;
        let recovered = scenarios::stuck_holder_lease(backend, Duration::from_secs(8)).await;
        assert!(recovered.is_some(), "the lease must recover after its ttl");
    }
}

mod zookeeper {
    use super::*;
    use lease_test_servers::ZooKeeperServer;

    /// The seed's contenders on ZooKeeper with 1 s leases (the shortest session is 400 ms).
    /// With 400 ms, the holder heard "lost" once in a CI run beside the other lane
    /// (`HoldersResult { acquired: 2, max_concurrent: 1, lost: 1 }`, the reason not
    /// recorded then; the check now prints it). Not reproduced here in 22 runs beside that
    /// lane, where renewals were at most 151 ms apart against a 360 ms deadline: a renewal
    /// sent a third of the TTL in must be answered by nine tenths: 227 ms with 400 ms
    /// leases, 567 ms with 1 s ones.
    const ZK_TTL: Duration = Duration::from_secs(1);

    /// The scenarios on a standalone ZooKeeper (shortest session 400 ms: the 500 ms TTL of
    /// the scenarios fits; keep-for leaves the minimum TTL below the period).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_scenarios() {
        logs();
        let servers = ZooKeeperServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let backend = leasehold::connect(&format!("zk://{servers}/scenarios-{prefix}"))
            .await
            .unwrap();
        let room = scenarios::room_with_lease(backend.clone(), 30, 3).await;
        assert_eq!(room.joined, 3);
        let watchdog = scenarios::fixed_ttl_vs_watchdog(backend.clone(), 1000, ZK_TTL, true).await;
        assert_eq!(
            (watchdog.acquired, watchdog.max_concurrent),
            (1, 1),
            "{watchdog:?}"
        );
        let wd = scenarios::lock_at_most_for_dilemma(backend.clone(), DilemmaMode::Watchdog).await;
        assert!(!wd.duplicated, "{wd:?}");
        let with = scenarios::lock_at_least_for(backend.clone(), true, 4).await;
        assert!(
            (3..=4).contains(&with.ran),
            "keep-for: once per period: {with:?}"
        );
        let recovered = scenarios::stuck_holder_lease(backend, Duration::from_secs(5)).await;
        assert!(recovered.is_some(), "the lease must recover after its ttl");
    }
}
