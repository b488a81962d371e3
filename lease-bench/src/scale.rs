//! Renewal at scale: N leases held by one client, renewed the way the heartbeat does it
//! (one `renew` call per `max_renew_batch` leases, the calls of a tick concurrently).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseName, Owner, RenewItem, RenewOutcome,
};
use nix::sys::resource::{UsageWho, getrusage};

/// Counts something on the server (script calls, keepalives) so that round trips per
/// tick are measured, not assumed.
pub type Counter = Box<dyn Fn() -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

/// One size.
#[derive(Clone, Debug)]
pub struct ScaleRow {
    /// Leases held.
    pub leases: usize,
    /// `renew` calls per tick (the heartbeat's split by `max_renew_batch`).
    pub calls_per_tick: f64,
    /// Round trips per tick as counted by `counter` (on the server where possible).
    pub round_trips_per_tick: Option<f64>,
    /// Median wall time of a tick.
    pub ms_per_tick: f64,
    /// Slowest tick.
    pub max_ms_per_tick: f64,
    /// The client process's CPU time (user + system) per tick.
    pub cpu_ms_per_tick: f64,
}

/// This process's CPU time (user + system).
pub fn cpu_now() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Acquires `n` leases with 32 concurrent tasks; returns them as renew items.
async fn hold(
    backend: &Arc<dyn LeaseBackend>,
    tag: &str,
    n: usize,
    ttl: Duration,
) -> Vec<RenewItem> {
    let tasks = 32usize;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let backend = backend.clone();
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let label = HolderLabel::new("bench-scale").expect("label");
                let mut items = Vec::new();
                for i in (t..n).step_by(tasks) {
                    let name = LeaseName::new(format!("scale-{tag}-{i}")).expect("name");
                    let owner = Owner::new(label.clone());
                    match backend.acquire(&name, &owner, ttl).await.expect("acquire") {
                        AcquireOutcome::Acquired { .. } => {}
                        AcquireOutcome::Held(by) => panic!("{name} held by {by}"),
                    }
                    items.push(RenewItem {
                        name,
                        token: owner.token,
                    });
                }
                items
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.await.expect("acquire task"));
    }
    all
}

/// Releases what [`hold`] took, with 32 concurrent tasks.
async fn release_all(backend: &Arc<dyn LeaseBackend>, items: Vec<RenewItem>) {
    let items = Arc::new(items);
    let tasks = 32usize;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (backend, items) = (backend.clone(), items.clone());
            tokio::spawn(async move {
                for item in items.iter().skip(t).step_by(tasks) {
                    let _ = backend
                        .release(&item.name, &item.token, Duration::ZERO)
                        .await;
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.await;
    }
}

/// Holds each size in turn, renews it `ticks` times, releases it.
pub async fn renewal(
    backend: Arc<dyn LeaseBackend>,
    sizes: &[usize],
    ticks: usize,
    counter: Option<Counter>,
) -> Vec<ScaleRow> {
    let ttl = Duration::from_secs(300);
    let batch = backend.capabilities().max_renew_batch.max(1);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut rows = Vec::new();
    for &n in sizes {
        let items = hold(&backend, &format!("{tag}-{n}"), n, ttl).await;
        let before = match &counter {
            Some(c) => Some(c().await),
            None => None,
        };
        let mut walls = Vec::with_capacity(ticks);
        let mut cpu = Duration::ZERO;
        let mut calls = 0usize;
        for _ in 0..ticks {
            let (cpu0, start) = (cpu_now(), Instant::now());
            // As the heartbeat sends them: a call per `batch` leases, at most
            // `RENEW_CALLS_IN_FLIGHT` at once.
            let futures: Vec<_> = items
                .chunks(batch)
                .map(|chunk| backend.renew(chunk, ttl))
                .collect();
            calls += futures.len();
            let replies: Vec<_> =
                futures::StreamExt::collect(futures::StreamExt::buffer_unordered(
                    futures::stream::iter(futures),
                    lease_core::raw::RENEW_CALLS_IN_FLIGHT,
                ))
                .await;
            for r in replies {
                let r = r.expect("renew");
                assert!(
                    r.iter().all(|o| *o == RenewOutcome::Renewed),
                    "a lease was lost"
                );
            }
            walls.push(start.elapsed());
            cpu += cpu_now().saturating_sub(cpu0);
        }
        let round_trips = match (&counter, before) {
            (Some(c), Some(b)) => Some(c().await.saturating_sub(b) as f64 / ticks as f64),
            _ => None,
        };
        walls.sort();
        rows.push(ScaleRow {
            leases: n,
            calls_per_tick: calls as f64 / ticks as f64,
            round_trips_per_tick: round_trips,
            ms_per_tick: walls[walls.len() / 2].as_secs_f64() * 1000.0,
            max_ms_per_tick: walls[walls.len() - 1].as_secs_f64() * 1000.0,
            cpu_ms_per_tick: cpu.as_secs_f64() * 1000.0 / ticks as f64,
        });
        release_all(&backend, items).await;
    }
    rows
}

/// The reply to `INFO commandstats` of the Redis server at `127.0.0.1:port` (script calls
/// and their time are counted from it).
pub async fn redis_commandstats(port: u16) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("redis client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats")
}
