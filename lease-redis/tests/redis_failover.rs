//! The Redis backend on the failure paths of real deployments: a primary demoted behind a
//! stable address, a failover under Redis Sentinel, and a server at `maxmemory` with
//! `noeviction`. All on real redis-server (and redis-sentinel) processes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions, Owner,
    ReleaseOutcome, RenewItem, RenewOutcome, TryAcquire,
};
use lease_redis::RedisBackend;
mod common;
use common::admin;
use lease_test_servers::RedisServer;
use lease_test_servers::proxy::FaultProxy;
use tokio::time::Instant;

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).unwrap())
}

fn name(prefix: &str, i: usize) -> LeaseName {
    LeaseName::new(format!("{prefix}-{}-{i}", uuid::Uuid::new_v4().simple())).unwrap()
}

async fn config_set(conn: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

async fn acquired(b: &dyn LeaseBackend, n: &LeaseName, o: &Owner, ttl: Duration) -> u64 {
    match b.acquire(n, o, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fencing, .. } => fencing.get(),
        AcquireOutcome::Held(by) => panic!("{n} held by {by}"),
    }
}

/// At `maxmemory` with `noeviction` the server refuses every write that may need memory
/// (`HSET`, `HSETNX`). Renewing and releasing leases already held needs none: a batch
/// whose first lease still carries the anchor written at acquire (its first renewal
/// rewrites it) is renewed whole, a release with keep-for keeps the lease, and only new
/// acquires are refused, with a retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_keeps_held_leases() {
    let server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let mut conn = admin(&server.url()).await;
    let ttl = Duration::from_secs(30);
    let o = owner("oom");
    let names: Vec<LeaseName> = (0..20).map(|i| name("oom", i)).collect();
    let mut fencing = Vec::new();
    for n in &names {
        fencing.push(acquired(&backend, n, &o, ttl).await);
    }
    let items: Vec<RenewItem> = names
        .iter()
        .map(|n| RenewItem {
            name: n.clone(),
            token: o.token,
        })
        .collect();
    config_set(&mut conn, "maxmemory-policy", "noeviction").await;
    config_set(&mut conn, "maxmemory", "1").await;

    // First renewal of every lease (each rewrites its anchor), then a second.
    for round in 0..2 {
        let out = backend.renew(&items, ttl).await;
        let out = out.unwrap_or_else(|e| panic!("round {round}: renewal under OOM failed: {e}"));
        assert!(
            out.iter().all(|o| *o == RenewOutcome::Renewed),
            "round {round}: {out:?}"
        );
    }
    // New acquires need memory: refused, retryable, nothing taken.
    let fresh = name("oom-new", 0);
    match backend.acquire(&fresh, &o, ttl).await {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(other) => panic!("acquire under OOM: {other:?}"),
    }
    // A release with keep-for keeps the lease (its holder shown, its token kept); a plain
    // release frees the name.
    let keep = backend
        .release(&names[0], &o.token, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("release with keep-for under OOM: {e}"));
    assert_eq!(keep, ReleaseOutcome::Released);
    let kept = backend.inspect(&names[0]).await.unwrap().expect("kept");
    assert_eq!(kept.fencing.map(|f| f.get()), Some(fencing[0]));
    let plain = backend
        .release(&names[1], &o.token, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(plain, ReleaseOutcome::Released);
    assert!(backend.inspect(&names[1]).await.unwrap().is_none());
    assert!(backend.inspect(&fresh).await.unwrap().is_none());

    // Through the client: guards taken before the pressure stay held for 3 TTLs.
    config_set(&mut conn, "maxmemory", "0").await;
    let client = LeaseClient::new(Arc::new(backend.clone()));
    let opts = LeaseOptions::new(Duration::from_secs(1)).unwrap();
    let mut guards = Vec::new();
    for i in 0..10 {
        match client
            .try_acquire(&name("oom-guard", i), &opts)
            .await
            .unwrap()
        {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Held(by) => panic!("held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
    config_set(&mut conn, "maxmemory", "1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    config_set(&mut conn, "maxmemory", "0").await;
    assert_eq!(held, guards.len(), "guards lost under memory pressure");
    for g in guards {
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
    }
}

/// Acquires `n` through a failover: every failure on the way must be retryable, and the
/// acquire must succeed within `within`. Returns the fencing token.
async fn acquire_within(backend: &dyn LeaseBackend, n: &LeaseName, within: Duration) -> u64 {
    let start = Instant::now();
    loop {
        match backend
            .acquire(n, &owner("after"), Duration::from_secs(30))
            .await
        {
            Ok(AcquireOutcome::Acquired { fencing, .. }) => return fencing.get(),
            Ok(AcquireOutcome::Held(by)) => panic!("held by {by}"),
            Err(e) => {
                assert!(e.is_retryable(), "not retryable in a failover: {e}");
                assert!(
                    start.elapsed() < within,
                    "acquires still fail {within:?} after the failover: {e}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Makes `replica` a replica of `primary` and waits until it is in sync.
async fn replicate(primary: &RedisServer, replica: &RedisServer) {
    let mut r = admin(&replica.url()).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port().unwrap())
        .query_async(&mut r)
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut r)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "replica not in sync: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The primary counts the replica online only after the replica's first
    // acknowledgement (sent once a second), a moment after the replica sees the link up;
    // `FAILOVER TO` refuses a replica that is not online yet ("FAILOVER target replica
    // is not online", seen once in a full run).
    let mut p = admin(&primary.url()).await;
    let replica_port = format!("port={},state=online", replica.port().unwrap());
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut p)
            .await
            .unwrap();
        if info.contains(&replica_port) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the primary does not count the replica online: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the server at `url` reports `role`.
async fn wait_role(url: &str, role: &str) {
    let mut c = admin(url).await;
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c)
            .await
            .unwrap();
        if info.contains(&format!("role:{role}")) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{url} never became {role}: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A failover behind a stable address (a proxy, a DNS name, a cloud endpoint): the old
/// primary becomes a replica and answers `READONLY` on the connection the backend has
/// open, while new connections reach the new primary. The backend drops that connection
/// and opens another: guards stay held (the coordinated `FAILOVER` loses no write),
/// acquires work, and the fencing sequence goes on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left() {
    let a = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    replicate(&a, &b).await;
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", a.port().unwrap()).parse().unwrap())
        .await
        .unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(
        RedisBackend::connect(&format!("redis://{}/", proxy.addr()))
            .await
            .unwrap(),
    );
    let client = LeaseClient::new(backend.clone());
    let opts = LeaseOptions::new(Duration::from_secs(2)).unwrap();
    let held = name("failover-held", 0);
    let guard = match client.try_acquire(&held, &opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    let before = guard.fencing().get();

    // The coordinated failover: A pauses writes, waits for B to catch up, B takes over.
    let mut ca = admin(&a.url()).await;
    let _: () = redis::cmd("FAILOVER")
        .arg("TO")
        .arg("127.0.0.1")
        .arg(b.port().unwrap())
        .query_async(&mut ca)
        .await
        .unwrap();
    proxy.set_target(format!("127.0.0.1:{}", b.port().unwrap()).parse().unwrap());
    wait_role(&b.url(), "master").await;
    wait_role(&a.url(), "slave").await;

    // The connection to A is still open and healthy: every write on it gets READONLY.
    let taken = acquire_within(&*backend, &name("failover-new", 0), Duration::from_secs(5)).await;
    assert!(taken >= 1);
    // The guard lives on through renewals on B.
    tokio::time::sleep(opts.ttl() * 2).await;
    assert!(
        guard.is_held(),
        "the lease was lost in a failover that lost no write"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let after = acquired(&*backend, &held, &owner("next"), Duration::from_secs(30)).await;
    assert!(after > before, "fencing went from {before} to {after}");
    // A and B by their own addresses agree on who is primary, and the proxy's first
    // connection was given up.
    assert!(
        proxy.connections() >= 2,
        "the backend never opened a new connection"
    );
}

/// Asks a sentinel for the service's primary port.
async fn sentinel_primary(sentinel_port: u16, service: &str) -> Option<u16> {
    let mut c = admin(&format!("redis://127.0.0.1:{sentinel_port}/")).await;
    let addr: Option<Vec<String>> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(service)
        .query_async(&mut c)
        .await
        .ok();
    addr.and_then(|a| a.get(1).and_then(|p| p.parse().ok()))
}

/// Under Redis Sentinel (`redis+sentinel://`): the primary is killed, the sentinels
/// promote its replica, and the backend finds the new primary through them. Guards held
/// across the failover are either still held, with the new primary agreeing, or told
/// they are lost; acquires work again; and a fencing token issued after the failover is
/// above every token issued before it (the replica was in sync when the primary died,
/// which `WAIT` makes sure of here: an asynchronous replica that lags can lose writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_moves_to_the_new_primary() {
    const SERVICE: &str = "lease-primary";
    let mut a = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    replicate(&a, &b).await;
    let sentinels = lease_test_servers::RedisSentinels::start(a.port().unwrap(), SERVICE, 3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Each sentinel must know the replica before it can promote it.
    let start = Instant::now();
    for port in sentinels.ports() {
        let mut c = admin(&format!("redis://127.0.0.1:{port}/")).await;
        loop {
            let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(SERVICE)
                .query_async(&mut c)
                .await
                .unwrap();
            if !replicas.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sentinels never saw the replica:\n{}",
                sentinels.log_tail(10)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let backend: Arc<dyn LeaseBackend> =
        Arc::new(RedisBackend::connect(&sentinels.url()).await.unwrap());
    let client = LeaseClient::new(backend.clone());
    let opts = LeaseOptions::new(Duration::from_secs(10)).unwrap();
    let mut guards = Vec::new();
    let mut max_before = 0;
    for i in 0..5 {
        let n = name("sentinel", i);
        match client.try_acquire(&n, &opts).await.unwrap() {
            TryAcquire::Acquired(g) => {
                max_before = max_before.max(g.fencing().get());
                guards.push((n, g));
            }
            TryAcquire::Held(by) => panic!("held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
    let mut ca = admin(&a.url()).await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut ca)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the writes");

    a.kill().unwrap();
    let killed = Instant::now();
    let b_port = b.port().unwrap();
    while sentinel_primary(sentinels.ports()[0], SERVICE).await != Some(b_port) {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no failover within 20 s:\n{}",
            sentinels.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_role(&b.url(), "master").await;
    let failed_over = killed.elapsed();

    // Acquires work again, through the sentinels' new answer.
    let after = acquire_within(&*backend, &name("sentinel-new", 0), Duration::from_secs(10)).await;
    let working = killed.elapsed();
    assert!(after >= 1);

    // A TTL after the kill: a guard still held was renewed on B (else its lease would
    // have expired there), and B agrees on its token.
    tokio::time::sleep(opts.ttl()).await;
    let mut held = 0;
    for (n, g) in &guards {
        let on_b = backend.inspect(n).await.unwrap();
        if g.is_held() {
            held += 1;
            assert_eq!(
                on_b.and_then(|i| i.fencing),
                Some(g.fencing()),
                "{n}: the guard believes it holds a lease the new primary does not give it"
            );
        }
    }
    // Tokens go on rising on the new primary.
    let (n0, g0) = guards.remove(0);
    let t0 = g0.fencing().get();
    drop(g0);
    let start = Instant::now();
    let next = loop {
        match backend
            .acquire(&n0, &owner("next"), Duration::from_secs(30))
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired { fencing, .. } => break fencing.get(),
            AcquireOutcome::Held(_) => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "{n0} never freed"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        next > t0,
        "fencing token {next} after {t0} on the new primary"
    );
    eprintln!(
        "sentinel failover: promoted {failed_over:?} after the kill, acquires working again \
         {working:?} after it; {held} of 5 guards held through it (the rest reported lost); \
         highest token before {max_before}; a released name's token {t0} before, {next} after"
    );
}
