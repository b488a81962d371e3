//! What the checks share: names isolated per check, the base TTL, clients and owners,
//! raw acquisitions, and the expiry tolerance.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, FencingToken, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions,
    Owner,
};
use tokio::time::Instant;

/// Extra time allowed, beyond the TTL, for a lease to be seen expired on the store: covers
/// store-side expiry granularity (Redis expires lazily or in its 10 Hz cycle; etcd checks
/// leases on its own schedule) and scheduling delays of a loaded 2-core test machine.
pub const EXPIRY_TOLERANCE: Duration = Duration::from_millis(1500);

/// A random prefix that isolates one check's names from every other check and run.
pub fn namespace() -> String {
    format!("conformance-{}/", uuid::Uuid::new_v4().simple())
}

/// A lease name inside `ns`.
pub fn name(ns: &str, suffix: &str) -> LeaseName {
    LeaseName::new(format!("{ns}{suffix}")).expect("valid test name")
}

/// The base TTL used by the checks for this backend.
pub fn base_ttl(backend: &dyn LeaseBackend) -> Duration {
    backend
        .capabilities()
        .effective_ttl(Duration::from_millis(600))
}

/// Every TTL the checks give their leases on this backend (each once, shortest first),
/// for a fixture whose store opens something per TTL: a ZooKeeper backend opens a session
/// per TTL at the first acquire that uses it, within that acquire's call timeout (a third
/// of the TTL), which a loaded machine can exceed (TCP, TLS, the session handshake). A
/// fixture opens them ahead, as an application whose TTLs are known does at start
/// (`ZkBackend::prepare`), so that the checks test what they are about.
pub fn ttls(backend: &dyn LeaseBackend) -> Vec<Duration> {
    let base = base_ttl(backend);
    let caps = backend.capabilities();
    let mut ttls: Vec<Duration> = [
        base,
        base * 2,
        base * 5,
        base * 10,
        // Scheduled jobs on instants (firings.rs).
        base.max(Duration::from_secs(2)),
        // Leases that outlast a check (failure.rs).
        Duration::from_secs(60),
    ]
    .into_iter()
    .map(|t| caps.effective_ttl(t))
    .collect();
    ttls.sort();
    ttls.dedup();
    ttls
}

pub(crate) fn opts(ttl: Duration) -> LeaseOptions {
    LeaseOptions::new(ttl).expect("valid options")
}

pub(crate) fn client(backend: &Arc<dyn LeaseBackend>, label: &str) -> LeaseClient {
    LeaseClient::with_label(backend.clone(), HolderLabel::new(label).expect("label"))
}

pub(crate) fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).expect("label"))
}

pub(crate) async fn raw_acquire(
    backend: &dyn LeaseBackend,
    name: &LeaseName,
    owner: &Owner,
    ttl: Duration,
) -> FencingToken {
    match backend.acquire(name, owner, ttl).await.expect("acquire") {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        AcquireOutcome::Held(by) => panic!("{name} unexpectedly held by {by}"),
    }
}

pub(crate) async fn is_held(backend: &dyn LeaseBackend, name: &LeaseName) -> bool {
    let probe = owner("probe");
    match backend
        .acquire(name, &probe, Duration::from_secs(30))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(_) => true,
        AcquireOutcome::Acquired { .. } => {
            backend
                .release(name, &probe.token, Duration::ZERO)
                .await
                .expect("release probe");
            false
        }
    }
}

/// Polls `acquire` until it succeeds, within `within`; returns the fencing token and how
/// long it took.
pub(crate) async fn acquire_when_free(
    backend: &dyn LeaseBackend,
    name: &LeaseName,
    owner: &Owner,
    ttl: Duration,
    within: Duration,
) -> (FencingToken, Duration) {
    let start = Instant::now();
    loop {
        if let AcquireOutcome::Acquired { fencing, .. } =
            backend.acquire(name, owner, ttl).await.expect("acquire")
        {
            return (fencing, start.elapsed());
        }
        assert!(
            start.elapsed() < within,
            "{name} still held after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long past its release a lease released with a sliver of keep-for left may live
/// ([`Capabilities::keep_for_overrun`](lease_core::Capabilities::keep_for_overrun): etcd
/// 2 s, most stores nothing). A scheduled job's period must leave room for it (see
/// `ScheduledJob::new`).
pub fn min_ttl_tail(caps: &lease_core::Capabilities) -> Duration {
    caps.keep_for_overrun()
}

/// The acquire calls `calls` recorded, per instance, for a failure message: each call's
/// start (ms from the first call's), how long it took and whether it took the lease. A
/// run count or a keep-for bound that fails under load then shows where the time went.
pub(crate) fn acquire_timeline(calls: &[Arc<crate::FaultyBackend>]) -> String {
    let logs: Vec<_> = calls.iter().map(|c| c.acquire_log()).collect();
    let Some(origin) = logs.iter().flatten().map(|c| c.started).min() else {
        return "no acquire calls".to_owned();
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = format!("acquire calls (ms from the first call's start; {origin:?}):");
    for (i, log) in logs.iter().enumerate() {
        out.push_str(&format!("\n  instance {i}:"));
        for c in log {
            let took = c.finished.map_or("unanswered".to_owned(), |f| {
                format!("{:.1}", ms(f - c.started))
            });
            let what = if c.acquired { "taken" } else { "refused" };
            out.push_str(&format!(" {:.1}+{took} {what};", ms(c.started - origin)));
        }
    }
    out
}

/// Checks the acquisitions that `calls` recorded (each a job instance's pass-through
/// [`FaultyBackend`](crate::FaultyBackend)) against the `runs` they ran: every run had an
/// acquisition (one taken as the shutdown came may not have run), and each acquisition's
/// call returned at least `keep_for` after the previous acquisition's call started. The
/// store took a lease between its call's start and return, so this bounds keep-for where
/// the store applied it, however late each run's work started. `context` goes into the
/// failure messages.
pub(crate) fn assert_acquisitions_keep_for_apart(
    calls: &[Arc<crate::FaultyBackend>],
    runs: usize,
    keep_for: Duration,
    context: &str,
) {
    let mut taken: Vec<_> = calls
        .iter()
        .flat_map(|c| c.acquire_log())
        .filter(|c| c.acquired)
        .collect();
    taken.sort_by_key(|c| c.started);
    assert!(
        taken.len() >= runs,
        "{} acquisitions for {runs} runs ({context})\n{}",
        taken.len(),
        acquire_timeline(calls)
    );
    for w in taken.windows(2) {
        let returned = w[1].finished.expect("an acquisition that returned");
        assert!(
            returned - w[0].started >= keep_for,
            "a lease taken again within {:?} of the call that took it before (at most; \
             keep-for {keep_for:?}, {context})\n{}",
            returned - w[0].started,
            acquire_timeline(calls)
        );
    }
}
