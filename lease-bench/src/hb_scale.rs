//! `lease-bench heartbeat-at-scale N [BATCH [STORE]]`: N leases (TTL 30 s) held through
//! one `LeaseClient` on the in-memory backend, renewed by the client's own heartbeat in
//! calls of at most BATCH leases (default 10,000, Redis's `max_renew_batch`), for three
//! renewal periods. With STORE (`redis`, `redis-cluster`, `etcd`, ... as for
//! `renew-at-scale`), the leases are held on a throwaway server of that store instead,
//! end to end through the client and its heartbeat; BATCH 0 keeps the backend's own
//! `max_renew_batch`. Prints each tick's calls and duration, the process's CPU time per renewal
//! period, and, for comparison, one tick of the same calls sent straight to the backend:
//! the difference is what the heartbeat's own bookkeeping costs at that size (the
//! in-memory store's renewal work is in both).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, HolderLabel, LeaseBackend, LeaseClient, LeaseGuard, LeaseInfo,
    LeaseName, LeaseOptions, MemoryBackend, Owner, OwnerToken, ReleaseOutcome, RenewItem,
    RenewOutcome, TryAcquire,
};
use tokio::time::Instant;

use crate::scale::cpu_now;

const TTL: Duration = Duration::from_secs(30);

/// A backend with a given renew batch (0: its own), recording when each `renew` call ran.
#[derive(Debug)]
struct Recorded {
    inner: Arc<dyn LeaseBackend>,
    batch: usize,
    calls: Mutex<Vec<(Instant, Instant, usize)>>,
    /// While `Some`, every renewed item is copied here (after the measured periods).
    captured: Mutex<Option<Vec<RenewItem>>>,
}

#[lease_core::async_trait]
impl LeaseBackend for Recorded {
    fn capabilities(&self) -> Capabilities {
        match self.batch {
            0 => self.inner.capabilities(),
            n => self.inner.capabilities().with_max_renew_batch(n),
        }
    }
    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> lease_core::Result<AcquireOutcome> {
        self.inner.acquire(name, owner, ttl).await
    }
    async fn renew(
        &self,
        leases: &[RenewItem],
        ttl: Duration,
    ) -> lease_core::Result<Vec<RenewOutcome>> {
        if let Some(c) = self
            .captured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            c.extend_from_slice(leases);
        }
        let started = Instant::now();
        let r = self.inner.renew(leases, ttl).await;
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push((
            started,
            Instant::now(),
            leases.len(),
        ));
        r
    }
    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> lease_core::Result<ReleaseOutcome> {
        self.inner.release(name, token, keep_for).await
    }
    async fn inspect(&self, name: &LeaseName) -> lease_core::Result<Option<LeaseInfo>> {
        self.inner.inspect(name).await
    }
    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> lease_core::Result<()> {
        self.inner.wait_released(name, max_wait).await
    }
    async fn force_release(&self, name: &LeaseName) -> lease_core::Result<bool> {
        self.inner.force_release(name).await
    }
}

/// Runs the subcommand.
pub async fn run(n: usize, batch: usize, store: Option<&str>) {
    // Kept until the process exits.
    let mut _server = None;
    let inner: Arc<dyn LeaseBackend> = match store {
        None | Some("memory") => Arc::new(MemoryBackend::new()),
        Some(store) => {
            let server = crate::at_scale::server(store).await;
            let backend = leasehold::connect(&server.url)
                .await
                .unwrap_or_else(|e| panic!("connect: {e}"));
            _server = Some(server);
            backend
        }
    };
    let rec = Arc::new(Recorded {
        inner,
        batch,
        calls: Mutex::new(Vec::new()),
        captured: Mutex::new(None),
    });
    let label = HolderLabel::new("heartbeat-at-scale").expect("label");
    let client = LeaseClient::with_label(rec.clone(), label.clone());
    let opts = LeaseOptions::new(TTL).expect("options");
    let started = Instant::now();
    let tasks = 64usize;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, opts) = (client.clone(), opts.clone());
            tokio::spawn(async move {
                let mut guards: Vec<LeaseGuard> = Vec::new();
                for i in (t..n).step_by(tasks) {
                    match client.try_acquire(format!("hb-{i}"), &opts).await {
                        Ok(TryAcquire::Acquired(g)) => guards.push(g),
                        other => panic!("acquire hb-{i}: {other:?}"),
                    }
                }
                guards
            })
        })
        .collect();
    let mut guards = Vec::with_capacity(n);
    for h in handles {
        guards.extend(h.await.expect("acquire task"));
    }
    println!(
        "heartbeat-at-scale: {n} leases acquired through one LeaseClient on {} in {:.1} s; \
         renew batch {}, TTL {TTL:?}, renewal period {:?}",
        store.unwrap_or("memory"),
        started.elapsed().as_secs_f64(),
        rec.capabilities().max_renew_batch,
        TTL / 3
    );
    // Three renewal periods from the end of the acquisitions.
    let (cpu0, t0) = (cpu_now(), Instant::now());
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    let cpu = cpu_now().saturating_sub(cpu0);
    let calls: Vec<_> = rec
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|c| c.0 >= t0)
        .copied()
        .collect();
    // Calls more than a second apart belong to different ticks.
    let mut ticks: Vec<Vec<(Instant, Instant, usize)>> = Vec::new();
    for c in calls {
        match ticks.last_mut() {
            Some(t)
                if t.iter()
                    .map(|x| x.1)
                    .max()
                    .is_some_and(|e| c.0 <= e + Duration::from_secs(1)) =>
            {
                t.push(c)
            }
            _ => ticks.push(vec![c]),
        }
    }
    for (i, t) in ticks.iter().enumerate() {
        let first = t.iter().map(|c| c.0).min().unwrap_or(t0);
        let last = t.iter().map(|c| c.1).max().unwrap_or(t0);
        let leases: usize = t.iter().map(|c| c.2).sum();
        println!(
            "heartbeat-at-scale: tick {i}: {} renew calls, {leases} leases, {} ms from the \
             first call's start to the last call's end",
            t.len(),
            (last - first).as_millis()
        );
    }
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!(
        "heartbeat-at-scale: process CPU {:.0} ms per renewal period over {:.1} s (three \
         periods); {held} of {n} leases held at the end",
        cpu.as_secs_f64() * 1000.0 / 3.0,
        t0.elapsed().as_secs_f64()
    );
    // The same calls straight to the backend, without the heartbeat: the items of the
    // heartbeat's next tick, copied as it sends them.
    *rec.captured.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::with_capacity(n));
    tokio::time::sleep(TTL / 3 + Duration::from_secs(1)).await;
    let items = rec
        .captured
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    let (cpu1, t1) = (cpu_now(), Instant::now());
    let batch = rec.capabilities().max_renew_batch.max(1);
    for chunk in items.chunks(batch) {
        let r = rec.renew(chunk, TTL).await.expect("renew");
        assert!(
            r.iter().all(|o| *o == RenewOutcome::Renewed),
            "a lease was lost"
        );
    }
    println!(
        "heartbeat-at-scale: the same {} calls straight to the backend: {} ms, CPU {:.0} ms",
        items.len().div_ceil(batch),
        t1.elapsed().as_millis(),
        cpu_now().saturating_sub(cpu1).as_secs_f64() * 1000.0
    );
    // Leave without releasing a million leases one by one.
    std::process::exit(0);
}
