//! `lease-bench renew-at-scale STORE N [TICKS]`: N leases with a 30 s TTL held by this
//! process on a throwaway server of STORE (`redis`, `redis-cluster` of 3 primaries,
//! `etcd`, `postgres`, `mysql`, `zookeeper`), renewed TICKS times the way the heartbeat
//! renews them (one `renew` call per `max_renew_batch` leases, at most
//! `lease_core::raw::RENEW_CALLS_IN_FLIGHT` of a tick's calls at once). Prints each tick's wall time against the renewal period (TTL/3 = 10 s), its
//! slowest `renew` call against the call timeout that bounds each heartbeat call (5 s), the
//! client's CPU time per tick, and on Redis the server's script time per tick on each
//! primary (`INFO commandstats`), which shows whether the work spreads over a cluster.
//!
//! While the leases are being acquired (minutes for a million on some stores), what is
//! held so far is renewed every TTL/3 as a heartbeat would, so that nothing expires before
//! the measured ticks.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseName, Owner, RenewItem, RenewOutcome,
};
use lease_test_servers::{
    EtcdServer, MariaDbServer, PostgresServer, RedisCluster, RedisServer, ZooKeeperServer,
};

use crate::scale::cpu_now;

const TTL: Duration = Duration::from_secs(30);

/// What keeps the server running, and where its Redis primaries listen (for the script
/// time per primary).
pub(crate) struct Server {
    pub(crate) url: String,
    redis_ports: Vec<u16>,
    _keep: Box<dyn std::any::Any + Send>,
}

impl Server {
    /// A server that is not Redis (no script time to read).
    fn other(url: String, keep: impl std::any::Any + Send) -> Server {
        Server {
            url,
            redis_ports: Vec::new(),
            _keep: Box::new(keep),
        }
    }
}

/// A throwaway server of `store` (the stores this subcommand names).
pub(crate) async fn server(store: &str) -> Server {
    match store {
        "redis" => {
            let s = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
            let url = s.url();
            let p = port_of(&url);
            Server {
                url,
                redis_ports: vec![p],
                _keep: Box::new(s),
            }
        }
        "redis-cluster" => {
            let mut c = RedisCluster::start_sized(3, 0)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let ports = c.primaries().await.unwrap_or_else(|e| panic!("{e}"));
            Server {
                url: c.url(),
                redis_ports: ports,
                _keep: Box::new(c),
            }
        }
        "etcd" => {
            let s = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
            Server::other(s.url(), s)
        }
        "postgres" => {
            let s = PostgresServer::start()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            Server::other(s.url(), s)
        }
        "mysql" => {
            let s = MariaDbServer::start()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            Server::other(s.url(), s)
        }
        "zookeeper" => {
            let s = ZooKeeperServer::start_local()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            Server::other(format!("zk://{}/lease-bench", s.address()), s)
        }
        other => panic!("unknown store {other:?}"),
    }
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// Microseconds the Redis server at `port` has spent in script calls since it started.
async fn script_usec(port: u16) -> u64 {
    lease_test_servers::redis::script_usec(&crate::scale::redis_commandstats(port).await)
}

/// Renews `items` once as the heartbeat does (calls of `max_renew_batch` leases, at most
/// `lease_core::raw::RENEW_CALLS_IN_FLIGHT` of them at once); returns how many were not
/// renewed and the slowest `renew` call (the heartbeat bounds each call by the call
/// timeout).
async fn tick(backend: &Arc<dyn LeaseBackend>, items: &[RenewItem]) -> (usize, Duration) {
    use futures::StreamExt;
    let batch = backend.capabilities().max_renew_batch.max(1);
    let mut chunks = items.chunks(batch);
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut done = Vec::new();
    loop {
        while in_flight.len() < lease_core::raw::RENEW_CALLS_IN_FLIGHT {
            let Some(c) = chunks.next() else { break };
            in_flight.push(timed_renew(backend, c));
        }
        match in_flight.next().await {
            Some(r) => done.push(r),
            None => break,
        }
    }
    let mut lost = 0;
    let mut slowest = Duration::ZERO;
    for (r, took) in done {
        slowest = slowest.max(took);
        lost += r
            .expect("renew")
            .iter()
            .filter(|o| **o != RenewOutcome::Renewed)
            .count();
    }
    (lost, slowest)
}

/// One `renew` call and how long it took.
async fn timed_renew(
    backend: &Arc<dyn LeaseBackend>,
    items: &[RenewItem],
) -> (lease_core::Result<Vec<RenewOutcome>>, Duration) {
    let started = Instant::now();
    let r = backend.renew(items, TTL).await;
    (r, started.elapsed())
}

/// Runs the subcommand.
pub async fn run(store: &str, n: usize, ticks: usize) {
    let server = server(store).await;
    let backend: Arc<dyn LeaseBackend> = leasehold::connect(&server.url)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let period = TTL / 3;
    let held: Arc<Mutex<Vec<RenewItem>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let done = Arc::new(tokio::sync::Notify::new());
    // The heartbeat during the acquisitions.
    let keeper = {
        let (backend, held, done) = (backend.clone(), held.clone(), done.clone());
        tokio::spawn(async move {
            let mut next = Instant::now() + period;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(next.into()) => {}
                    () = done.notified() => return,
                }
                next = Instant::now() + period;
                let snapshot: Vec<RenewItem> = held.lock().expect("held").clone();
                let started = Instant::now();
                let (lost, _) = tick(&backend, &snapshot).await;
                assert_eq!(lost, 0, "{lost} leases lost while acquiring");
                eprintln!(
                    "  (renewed {} held so far in {:.0} ms)",
                    snapshot.len(),
                    started.elapsed().as_secs_f64() * 1000.0
                );
            }
        })
    };
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let tasks = 64usize;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (backend, held, tag) = (backend.clone(), held.clone(), tag.clone());
            tokio::spawn(async move {
                let label = HolderLabel::new("bench-scale").expect("label");
                for i in (t..n).step_by(tasks) {
                    let name = LeaseName::new(format!("s-{tag}-{i}")).expect("name");
                    let owner = Owner::new(label.clone());
                    match backend.acquire(&name, &owner, TTL).await.expect("acquire") {
                        AcquireOutcome::Acquired { .. } => {}
                        AcquireOutcome::Held(by) => panic!("{name} held by {by}"),
                    }
                    // Held at once: the keeper renews it from its next pass.
                    held.lock().expect("held").push(RenewItem {
                        name,
                        token: owner.token,
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("acquire task");
    }
    let acquired_in = started.elapsed();
    // notify_one keeps the wake-up if the keeper is renewing right now.
    done.notify_one();
    keeper.await.expect("keeper");
    let items: Vec<RenewItem> = std::mem::take(&mut *held.lock().expect("held"));
    assert_eq!(items.len(), n);
    println!(
        "{store}: {n} leases acquired in {:.1} s ({:.0}/s, {tasks} tasks), TTL {TTL:?}, renewal period {period:?}",
        acquired_in.as_secs_f64(),
        n as f64 / acquired_in.as_secs_f64()
    );
    let batch = backend.capabilities().max_renew_batch.max(1);
    let mut walls = Vec::with_capacity(ticks);
    let mut slowest_calls = Vec::with_capacity(ticks);
    // The heartbeat bounds each renew call by the lease's call timeout (default
    // min(5 s, TTL/3)): every call of a tick must answer within it.
    let call_timeout = lease_core::LeaseOptions::new(TTL)
        .expect("options")
        .call_timeout();
    for t in 0..ticks {
        let mut script0 = Vec::new();
        for p in &server.redis_ports {
            script0.push(script_usec(*p).await);
        }
        let (cpu0, start) = (cpu_now(), Instant::now());
        let (lost, slowest_call) = tick(&backend, &items).await;
        let wall = start.elapsed();
        let cpu = cpu_now().saturating_sub(cpu0);
        assert_eq!(lost, 0, "{lost} leases lost in tick {t}");
        let mut per_primary = Vec::new();
        for (p, before) in server.redis_ports.iter().zip(&script0) {
            per_primary.push(format!(
                "{:.0} ms",
                script_usec(*p).await.saturating_sub(*before) as f64 / 1000.0
            ));
        }
        println!(
            "{store}: tick {t}: {n} leases renewed in {:.0} ms ({:.1}% of the {period:?} period), \
             {} renew calls, slowest call {:.0} ms (call timeout {call_timeout:?}), client CPU {:.0} ms{}",
            wall.as_secs_f64() * 1000.0,
            wall.as_secs_f64() * 100.0 / period.as_secs_f64(),
            n.div_ceil(batch),
            slowest_call.as_secs_f64() * 1000.0,
            cpu.as_secs_f64() * 1000.0,
            if per_primary.is_empty() {
                String::new()
            } else {
                format!(
                    ", server script time per primary: {}",
                    per_primary.join(", ")
                )
            }
        );
        walls.push(wall);
        slowest_calls.push(slowest_call);
        // The next tick a period after this one started, as the heartbeat does.
        if t + 1 < ticks {
            tokio::time::sleep(period.saturating_sub(wall)).await;
        }
    }
    walls.sort();
    let worst = walls.last().copied().unwrap_or_default();
    let worst_call = slowest_calls.iter().max().copied().unwrap_or_default();
    println!(
        "{store}: {n} leases, {ticks} ticks: median {:.0} ms, slowest {:.0} ms per tick ({} the \
         renewal period {period:?}); slowest renew call {:.0} ms ({} the call timeout {call_timeout:?})",
        walls[walls.len() / 2].as_secs_f64() * 1000.0,
        worst.as_secs_f64() * 1000.0,
        if worst < period {
            "every tick within"
        } else {
            "**not** within"
        },
        worst_call.as_secs_f64() * 1000.0,
        if worst_call < call_timeout {
            "within"
        } else {
            "**not** within"
        }
    );
}
