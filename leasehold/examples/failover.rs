//! Several workers share one job; at most one runs it per tick. The active worker is
//! killed (its process freezes: no renewal, no release) and another takes over within
//! TTL + renewal period. Every tick writes to a fenced resource with its fencing token.
//!
//! Run: `cargo run -p leasehold --example failover`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use leasehold::{
    AcquireOutcome, Capabilities, HolderLabel, LeaseBackend, LeaseClient, LeaseInfo, LeaseName,
    LeaseOptions, MemoryBackend, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(1000);
const TICK: Duration = Duration::from_millis(200);
const WORKERS: usize = 3;

/// A protected resource that accepts a write only with a fencing token not lower than the
/// highest it has accepted.
#[derive(Default)]
struct FencedResource {
    highest: u64,
    accepted: u64,
    rejected: u64,
}

impl FencedResource {
    fn write(&mut self, token: u64) -> bool {
        if token < self.highest {
            self.rejected += 1;
            return false;
        }
        self.highest = token;
        self.accepted += 1;
        true
    }
}

/// One worker "process"'s view of the store: freezing it makes every call hang, as if the
/// process had been killed mid-flight (no renewal, no release).
#[derive(Debug)]
struct Process {
    store: Arc<dyn LeaseBackend>,
    frozen: AtomicBool,
}

impl Process {
    async fn gate(&self) {
        if self.frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[leasehold::async_trait]
impl LeaseBackend for Process {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn acquire(
        &self,
        n: &LeaseName,
        o: &Owner,
        ttl: Duration,
    ) -> leasehold::Result<AcquireOutcome> {
        self.gate().await;
        self.store.acquire(n, o, ttl).await
    }
    async fn renew(&self, l: &[RenewItem], ttl: Duration) -> leasehold::Result<Vec<RenewOutcome>> {
        self.gate().await;
        self.store.renew(l, ttl).await
    }
    async fn release(
        &self,
        n: &LeaseName,
        t: &OwnerToken,
        k: Duration,
    ) -> leasehold::Result<ReleaseOutcome> {
        self.gate().await;
        self.store.release(n, t, k).await
    }
    async fn inspect(&self, n: &LeaseName) -> leasehold::Result<Option<LeaseInfo>> {
        self.gate().await;
        self.store.inspect(n).await
    }
    async fn wait_released(&self, n: &LeaseName, max: Duration) -> leasehold::Result<()> {
        self.gate().await;
        self.store.wait_released(n, max).await
    }
}

#[derive(Default)]
struct Log {
    /// (time, worker, fencing token) of every acquisition.
    acquired: Vec<(Instant, usize, u64)>,
    ticks: Vec<(Instant, usize, u64)>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let store: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new());
    let opts = LeaseOptions::builder(TTL)
        .wait(Duration::from_secs(30))
        .build()?;
    println!(
        "{WORKERS} workers, one job \"outbox\", ttl {TTL:?}, renewal every {:?}, tick {TICK:?}",
        opts.renew_every()
    );
    let resource = Arc::new(Mutex::new(FencedResource::default()));
    let log = Arc::new(Mutex::new(Log::default()));
    let start = Instant::now();

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        // Each worker reaches the store through its own "process": a decorator we can
        // freeze to simulate the process being killed.
        let process = Arc::new(Process {
            store: store.clone(),
            frozen: AtomicBool::new(false),
        });
        let client =
            LeaseClient::with_label(process.clone(), HolderLabel::new(format!("worker-{w}"))?);
        let (opts, resource, log) = (opts.clone(), resource.clone(), log.clone());
        let task = tokio::spawn(async move {
            loop {
                let guard = match client.acquire("outbox", &opts).await {
                    Ok(g) => g,
                    Err(e) => {
                        println!("worker-{w}: {e}");
                        continue;
                    }
                };
                let f = guard.fencing().get();
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .acquired
                    .push((Instant::now(), w, f));
                println!(
                    "{:>6.2}s worker-{w} acquired the lease, fencing token {f}",
                    start.elapsed().as_secs_f64()
                );
                while guard.is_held() {
                    let ok = resource.lock().unwrap_or_else(|p| p.into_inner()).write(f);
                    log.lock().unwrap_or_else(|p| p.into_inner()).ticks.push((
                        Instant::now(),
                        w,
                        f,
                    ));
                    println!(
                        "{:>6.2}s worker-{w} runs the job (token {f}){}",
                        start.elapsed().as_secs_f64(),
                        if ok { "" } else { " -- REJECTED as stale" }
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(TICK) => {}
                        reason = guard.lost() => {
                            println!("worker-{w}: lease lost ({reason})");
                            break;
                        }
                    }
                }
            }
        });
        workers.push((process, task));
    }

    let mut takeovers = Vec::new();
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let active = log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .acquired
            .last()
            .map(|a| a.1);
        let Some(active) = active else {
            return Err("nobody acquired the lease".into());
        };
        let (process, task) = &workers[active];
        // Kill: the process freezes (no renewal, no release) and its work stops.
        process.frozen.store(true, Ordering::SeqCst);
        task.abort();
        let killed_at = Instant::now();
        let before = log.lock().unwrap_or_else(|p| p.into_inner()).acquired.len();
        println!(
            "{:>6.2}s *** worker-{active} killed (round {}) ***",
            start.elapsed().as_secs_f64(),
            round + 1
        );
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let l = log.lock().unwrap_or_else(|p| p.into_inner());
            if l.acquired.len() > before {
                let took = l.acquired[before].0 - killed_at;
                println!(
                    "{:>6.2}s worker-{} took over after {} ms (bound: ttl + renewal period = {} ms)",
                    start.elapsed().as_secs_f64(),
                    l.acquired[before].1,
                    took.as_millis(),
                    (TTL + opts.renew_every()).as_millis()
                );
                takeovers.push(took);
                break;
            }
            if killed_at.elapsed() > Duration::from_secs(10) {
                return Err("no takeover within 10 s".into());
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for (_, task) in &workers {
        task.abort();
    }

    let l = log.lock().unwrap_or_else(|p| p.into_inner());
    let r = resource.lock().unwrap_or_else(|p| p.into_inner());
    let tokens: Vec<u64> = l.acquired.iter().map(|a| a.2).collect();
    let increasing = tokens.windows(2).all(|w| w[0] < w[1]);
    // At most one tick per tick period: two ticks by different workers never overlap in time
    // closer than the TICK (except right after a takeover, which follows a kill).
    println!();
    println!(
        "fencing tokens in order of acquisition: {tokens:?} (strictly increasing: {increasing})"
    );
    println!(
        "resource: {} writes accepted, {} rejected as stale",
        r.accepted, r.rejected
    );
    let bound = TTL + opts.renew_every() + Duration::from_millis(200);
    if !increasing || r.rejected > 0 || takeovers.iter().any(|t| *t > bound) {
        return Err(
            format!("failover check failed: takeovers {takeovers:?}, bound {bound:?}").into(),
        );
    }
    println!(
        "ok: takeovers {:?} within ttl + renewal period",
        takeovers.iter().map(|t| t.as_millis()).collect::<Vec<_>>()
    );
    Ok(())
}
