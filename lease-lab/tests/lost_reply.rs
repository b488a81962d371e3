//! A reply lost after the store applied the call, on real servers (see
//! `lease_lab::lost_reply`): each acquire, renewal and release ends with the lease ours
//! with a guard, or with nothing held once the cleanup has run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use lease_lab::lost_reply::{KEEP_FOR_ROUNDS, ROUNDS, lost_replies};

/// `orphans`: whether the store must show the orphan case happening (an acquire applied,
/// its reply lost, its cleanup cut off). On PostgreSQL and MySQL the reply the proxy loses
/// first is not the acquire's (the pool's connection check comes before it), so there the
/// round checks only that nothing stays held.
async fn run(store: &str, url: &str, orphans: bool) {
    let seen = lost_replies(store, url).await;
    assert!(
        seen.acquired_anyway + seen.failed_and_cleaned == ROUNDS,
        "{store}: {seen:?}"
    );
    assert_eq!(seen.keep_for_kept, KEEP_FOR_ROUNDS, "{store}: {seen:?}");
    assert!(
        seen.orphans > 0 || !orphans,
        "{store}: no acquire left a key behind with its cleanup failing: {seen:?}"
    );
    eprintln!("{store}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_replies() {
    let server = lease_test_servers::RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    run("redis", &server.url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_replies() {
    let db = lease_test_servers::PostgresServer::shared()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    run("postgres", &db.url(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lost_replies() {
    let server = lease_test_servers::EtcdServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    run("etcd", &server.url(), true).await;
}

/// The advisory-lock mode: a lock lives as long as its session, and a lost reply cuts the
/// connection, so whatever the lost call took is gone with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory_lost_replies() {
    let db = lease_test_servers::PostgresServer::shared()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seen = lease_lab::lost_reply::lost_replies_with("postgres-advisory", &db.url(), &|u| {
        Box::pin(async move {
            let b = lease_postgres::AdvisoryLockBackend::connect_with(
                &u,
                std::time::Duration::from_secs(1),
                4,
            )
            .await
            .expect("connect");
            std::sync::Arc::new(b) as std::sync::Arc<dyn leasehold::LeaseBackend>
        })
    })
    .await;
    assert!(
        seen.acquired_anyway + seen.failed_and_cleaned == ROUNDS,
        "postgres-advisory: {seen:?}"
    );
    eprintln!("postgres-advisory: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lost_replies() {
    let db = lease_test_servers::MariaDbServer::shared()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    run("mysql", &db.url(), false).await;
}

/// ZooKeeper: the proxy cuts the connection when it drops a reply; the session survives
/// the reconnection, so a lost acquire reply leaves a node the session keeps alive: the
/// client's cleanup (or the backend's sweep at the TTL) must remove it. Whether the
/// first reply lost is the acquire's depends on the client's pings, so the orphan case
/// is not required to happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_lost_replies() {
    let servers = lease_test_servers::ZooKeeperServer::shared()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("zk://{servers}/lost-{}", uuid::Uuid::new_v4().simple());
    run("zookeeper", &url, false).await;
}
