//! Redis Cluster (`redis+cluster://`) on a real cluster of 3 primaries and 3 replicas
//! (containers where a Docker engine answers, else local processes; over TLS, local
//! processes): the whole conformance suite on a shared cluster, also with every write
//! acknowledged by a replica (`WAIT`); a renewal batch that is one
//! script call per primary; and failovers, coordinated (`CLUSTER FAILOVER`) and by a
//! killed primary, after which every lease either is still held by its guard (and
//! refused to others) or was reported lost (and its next holder's fencing token is
//! higher).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, Fencing, HolderLabel, LeaseBackend, LeaseClient, LeaseGuard,
    LeaseName, LeaseOptions, Owner, RenewItem, RenewOutcome, TryAcquire,
};
use lease_redis::RedisBackend;
use lease_test_servers::RedisCluster;
use lease_test_servers::redis::script_calls;

mod conformance {
    use lease_conformance::Fixture;

    use super::*;

    async fn cluster() -> Fixture {
        let cluster = RedisCluster::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let backend = RedisBackend::connect(&cluster.url())
            .await
            .expect("connect");
        Fixture::new(Arc::new(backend))
    }

    lease_conformance::conformance_suite!(cluster);
}

/// The whole suite again with every acquisition and renewal acknowledged by a replica
/// (`WAIT 1`, in the same pipeline as the script, so sent to the primary that ran it).
mod conformance_acknowledged {
    use lease_conformance::Fixture;
    use lease_redis::{RedisConfig, WaitForReplicas};

    use super::*;

    async fn cluster() -> Fixture {
        let cluster = RedisCluster::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let config = RedisConfig::default()
            .with_key_prefix("acked")
            .with_wait_for_replicas(Some(WaitForReplicas {
                replicas: 1,
                timeout: Duration::from_secs(2),
            }));
        let backend = RedisBackend::connect_with(&cluster.url(), config)
            .await
            .expect("connect");
        Fixture::new(Arc::new(backend))
    }

    lease_conformance::conformance_suite!(cluster);
}

/// A cluster whose nodes take clients, each other (the bus) and their replicas over TLS:
/// started once per test binary, with its certificates.
async fn tls_cluster() -> &'static (lease_test_servers::TestCerts, RedisCluster) {
    static SHARED: tokio::sync::OnceCell<(lease_test_servers::TestCerts, RedisCluster)> =
        tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let certs = lease_test_servers::TestCerts::generate().unwrap();
            let cluster = RedisCluster::start_tls(&certs).await.unwrap();
            (certs, cluster)
        })
        .await
}

fn tls_config(ca: &std::path::Path) -> lease_redis::RedisConfig {
    lease_redis::RedisConfig::default().with_tls(lease_core::TlsFiles::default().with_ca(ca))
}

/// The whole suite over TLS (`rediss+cluster://`, the CA given as a file): the cluster
/// connection, the nodes it is redirected to, and the waiters' pub/sub connections.
mod conformance_tls {
    use lease_conformance::Fixture;

    use super::*;

    async fn cluster() -> Fixture {
        let (certs, cluster) = tls_cluster().await;
        let backend = RedisBackend::connect_with(
            &cluster.tls_url().expect("a TLS cluster"),
            tls_config(&certs.ca),
        )
        .await
        .expect("connect");
        Fixture::new(Arc::new(backend))
    }

    lease_conformance::conformance_suite!(cluster);
}

/// Over TLS: a CA that signed nothing of the cluster's is refused (a TLS error, not
/// retryable); TLS files with a `redis+cluster://` URL are refused before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_refuses_a_wrong_ca_and_tls_files_without_rediss() {
    let (certs, cluster) = tls_cluster().await;
    let url = cluster.tls_url().expect("a TLS cluster");
    let config = tls_config(&certs.other_ca).with_connect_timeout(Duration::from_secs(3));
    match RedisBackend::connect_with(&url, config).await {
        Err(e @ lease_core::Error::Tls { .. }) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(
                e.to_string().contains("not signed by a CA you trust"),
                "{e}"
            );
        }
        Err(e) => panic!("wanted a TLS error, got {e:?}"),
        Ok(_) => panic!("connected with a CA that signed nothing of the cluster's"),
    }
    let plain = url.replacen("rediss+cluster://", "redis+cluster://", 1);
    let err = RedisBackend::connect_with(&plain, tls_config(&certs.ca))
        .await
        .expect_err("TLS files with redis+cluster:// accepted");
    assert!(err.to_string().contains("not rediss+cluster://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_on_a_cluster() {
    let cluster = RedisCluster::shared().await.unwrap();
    let backend = RedisBackend::connect(&cluster.url())
        .await
        .expect("connect");
    let caps: Capabilities = backend.capabilities();
    // The cluster's nodes run without AOF: volatile, as each primary says.
    assert_eq!(caps.fencing, Fencing::Volatile);
    // Release notification: a waiter subscribes on the node serving the lease's slot,
    // and a release's PUBLISH reaches every node.
    assert!(caps.release_notification);
    // Up to 10,000 leases per primary in one renew call.
    assert_eq!(caps.max_renew_batch, 3 * lease_redis::DEFAULT_RENEW_BATCH);
    let shown = format!("{backend:?}");
    let first = cluster.address(cluster.ports()[0]);
    assert!(shown.contains(&format!("cluster {first}")), "{shown}");
    // A larger batch per script call: per primary too.
    let config = lease_redis::RedisConfig::default().with_renew_batch(40_000);
    let backend = RedisBackend::connect_with(&cluster.url(), config)
        .await
        .expect("connect");
    assert_eq!(backend.capabilities().max_renew_batch, 120_000);
}

/// 300 leases spread over the slots of all three primaries, renewed in one batch: one
/// script call reaches each primary, and no other call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_batch_is_one_script_call_per_primary() {
    let mut cluster = RedisCluster::start().await.unwrap();
    let backend = RedisBackend::connect(&cluster.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let mut items = Vec::new();
    for i in 0..300 {
        let name = LeaseName::new(format!("spread-{i}")).unwrap();
        let owner = Owner::new(HolderLabel::new("batch").unwrap());
        match backend.acquire(&name, &owner, ttl).await.unwrap() {
            AcquireOutcome::Acquired { .. } => {}
            held => panic!("{held:?}"),
        }
        items.push(RenewItem {
            name,
            token: owner.token,
        });
    }
    // The first renewal loads the script on every primary (NOSCRIPT, then SCRIPT LOAD).
    let first = backend.renew(&items, ttl).await.unwrap();
    assert!(first.iter().all(|o| *o == RenewOutcome::Renewed));
    let primaries = cluster.primaries().await.unwrap();
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    for p in &primaries {
        cluster.cli(*p, &["CONFIG", "RESETSTAT"]).await.unwrap();
    }
    let outcomes = backend.renew(&items, ttl).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == RenewOutcome::Renewed));
    let mut per_primary = Vec::new();
    for p in &primaries {
        let stats = cluster.cli(*p, &["INFO", "commandstats"]).await.unwrap();
        per_primary.push((*p, script_calls(&stats)));
    }
    assert!(
        per_primary.iter().all(|(_, calls)| *calls == 1),
        "script calls per primary for one batch of 300: {per_primary:?}"
    );
}

/// A new cluster, a backend on it with `config`, and `n` leases (`{prefix}-{i}`, TTL 4 s)
/// held through a client labelled "holder" that renews every `renew_every`.
async fn hold_leases(
    prefix: &str,
    n: usize,
    renew_every: Duration,
    config: lease_redis::RedisConfig,
) -> (
    RedisCluster,
    Arc<dyn LeaseBackend>,
    Vec<(String, LeaseGuard)>,
) {
    let cluster = RedisCluster::start().await.unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(
        RedisBackend::connect_with(&cluster.url(), config)
            .await
            .expect("connect"),
    );
    let client = LeaseClient::with_label(backend.clone(), HolderLabel::new("holder").unwrap());
    let opts = LeaseOptions::builder(Duration::from_secs(4))
        .renew_every(renew_every)
        .build()
        .unwrap();
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let guard = client.acquire(&name, &opts).await.expect("acquire");
        guards.push((name, guard));
    }
    (cluster, backend, guards)
}

/// Holds 30 leases through a client, fails a primary over (`how`), and checks every
/// lease afterwards: still held by its guard, and then refused to another client; or
/// reported lost, and then taken by another client with a higher fencing token.
async fn failover(how: &str) {
    let (mut cluster, backend, guards) = hold_leases(
        "failover",
        30,
        Duration::from_millis(400),
        lease_redis::RedisConfig::default(),
    )
    .await;
    // The acquisitions have reached the replicas (their offsets caught up).
    cluster
        .wait_replicated(Duration::from_secs(10))
        .await
        .unwrap();
    let primaries = cluster.primaries().await.unwrap();
    let victim = primaries[0];
    let nodes = cluster.cli(victim, &["CLUSTER", "NODES"]).await.unwrap();
    let victim_id = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned();
    let replica: u16 = nodes
        .lines()
        .find(|l| l.contains("slave") && l.contains(&victim_id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|a| a.split('@').next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no replica of {victim} in:\n{nodes}"));
    match how {
        "manual" => {
            let out = cluster
                .cli(replica, &["CLUSTER", "FAILOVER"])
                .await
                .unwrap();
            assert!(out.contains("OK"), "{out}");
        }
        "kill" => cluster.kill_node(victim).unwrap(),
        other => panic!("{other}"),
    }
    // Wait until the replica is a primary and the cluster is whole again.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now_primaries = cluster.primaries().await.unwrap_or_default();
        if now_primaries.contains(&replica) && now_primaries.len() == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{replica} never became a primary: {now_primaries:?}\n{}",
            cluster.log_tail(10)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_ok(Duration::from_secs(30)).await.unwrap();
    // A few renewal periods on the new topology.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (survived, lost) = check_leases(how, &backend, guards).await;
    eprintln!("{how} failover: {survived} leases survived, {lost} reported lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_coordinated_failover_or_are_reported_lost() {
    failover("manual").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_killed_primary_or_are_reported_lost() {
    failover("kill").await;
}

/// The id of the node on `port`, from its own `CLUSTER NODES` line.
async fn node_id(cluster: &RedisCluster, port: u16) -> String {
    let nodes = cluster.cli(port, &["CLUSTER", "NODES"]).await.unwrap();
    nodes
        .lines()
        .find(|l| l.contains("myself"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned()
}

/// Slots move from one primary to another (`redis-cli --cluster reshard`, which migrates
/// the keys with `MIGRATE` while the slots are in `MIGRATING`/`IMPORTING`) while 40
/// leases are renewed every 200 ms and another client acquires and releases in a loop:
/// every lease is still held afterwards or was reported lost (never taken by another
/// while its guard believes it holds it), and every acquire either succeeded or failed
/// with a retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_hold_while_slots_migrate() {
    let (mut cluster, backend, guards) = hold_leases(
        "migrating",
        40,
        Duration::from_millis(200),
        lease_redis::RedisConfig::default(),
    )
    .await;
    // Another client cycles acquire + release on names of its own meanwhile.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cycling = {
        let (backend, stop) = (backend.clone(), stop.clone());
        tokio::spawn(async move {
            let other = LeaseClient::with_label(backend, HolderLabel::new("cycler").unwrap());
            let opts = LeaseOptions::builder(Duration::from_secs(4))
                .build()
                .unwrap();
            let (mut done, mut retryable) = (0u32, 0u32);
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                match other.try_acquire(format!("cycle-{}", i % 200), &opts).await {
                    Ok(TryAcquire::Acquired(g)) => {
                        g.release().await.expect("release");
                        done += 1;
                    }
                    Ok(TryAcquire::Held(by)) => panic!("cycle-{} held by {by}", i % 200),
                    Err(e) if e.is_retryable() => retryable += 1,
                    Err(e) => panic!("an acquire failed and may not be retried: {e}"),
                    _ => unreachable!("an outcome added to the enum after this code was written"),
                }
            }
            (done, retryable)
        })
    };
    let primaries = cluster.primaries().await.unwrap();
    let (from, to) = (
        node_id(&cluster, primaries[0]).await,
        node_id(&cluster, primaries[1]).await,
    );
    let out = cluster
        .cli(
            primaries[0],
            &[
                "--cluster",
                "reshard",
                &cluster.address(primaries[0]),
                "--cluster-from",
                &from,
                "--cluster-to",
                &to,
                "--cluster-slots",
                "3000",
                "--cluster-yes",
                "--cluster-pipeline",
                "10",
            ],
        )
        .await
        .unwrap();
    assert!(
        !out.contains("[ERR]") && out.contains("Moving slot"),
        "reshard failed:\n{out}"
    );
    cluster.wait_ok(Duration::from_secs(30)).await.unwrap();
    // A few renewal periods on the new slot map.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (cycles, retryable) = cycling.await.expect("cycling task");

    let (survived, lost) = check_leases("resharding", &backend, guards).await;
    let moved = out.matches("Moving slot").count();
    eprintln!(
        "resharding ({moved} slot moves): {survived} leases survived, {lost} reported lost; \
         the cycling client made {cycles} acquire + release cycles and met {retryable} \
         retryable errors"
    );
    assert!(cycles > 0);
}

/// After a fault: every lease is still held by its guard, and then refused to another
/// client; or was reported lost, and then (once its TTL has passed, if it is still on the
/// store) taken by another client with a higher fencing token. Returns how many were
/// held and how many lost.
async fn check_leases(
    how: &str,
    backend: &Arc<dyn LeaseBackend>,
    guards: Vec<(String, LeaseGuard)>,
) -> (usize, usize) {
    let other = LeaseClient::with_label(backend.clone(), HolderLabel::new("other").unwrap());
    let quick = LeaseOptions::builder(Duration::from_secs(4))
        .build()
        .unwrap();
    let wait = LeaseOptions::builder(Duration::from_secs(4))
        .wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let (mut survived, mut lost) = (0, 0);
    for (name, guard) in guards {
        let old = guard.fencing();
        if guard.is_held() {
            match other.try_acquire(&name, &quick).await.expect("try_acquire") {
                TryAcquire::Held(_) => survived += 1,
                TryAcquire::Acquired(g) => panic!(
                    "{how}: {name} taken by another client (token {}) while its guard \
                     (token {old}) believes it holds it",
                    g.fencing()
                ),
                _ => unreachable!("an outcome added to the enum after this code was written"),
            }
            guard.release().await.expect("release");
        } else {
            lost += 1;
            let g = other
                .acquire(&name, &wait)
                .await
                .expect("acquire a lost lease");
            assert!(
                g.fencing() > old,
                "{how}: {name}: the next holder's token {} is not above the lost holder's {old}",
                g.fencing()
            );
            g.release().await.expect("release");
        }
    }
    (survived, lost)
}
