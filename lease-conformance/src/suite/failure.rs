//! Checks of the paths real deployments hit first: a call dropped half-way (a `timeout`, a
//! `select!`, a request handler whose client hung up), a reply lost or delayed after the
//! store applied the call, a renewal that panics, a heartbeat whose runtime is gone or
//! no longer driven, and a scheduled job on instances whose ticks are apart.
//!
//! Each check is a `pub async fn` of [`crate::suite`], run by
//! [`crate::conformance_suite!`] like every other check.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use lease_core::{
    Error, InvalidInput, LeaseBackend, LeaseClient, LeaseGuard, LeaseName, LeaseOptions,
    LossReason, MAX_TTL, ReleaseOutcome, RunOutcome, ScheduledJob, TryAcquire,
};
use tokio::time::Instant;

use super::{
    acquire_timeline, assert_acquisitions_keep_for_apart, base_ttl, client, name, namespace, opts,
};
use crate::faulty::{Fault, FaultyBackend, Op};

/// How many acquire calls [`cancelled_acquires_leave_nothing_held`] drops.
pub const CANCELLED_CALLS: usize = 1000;

/// How late a lost signal may come after the guard's safety deadline when the signal
/// comes from the guard's own timer: the scheduling delay of a loaded 2-core machine.
pub const SIGNAL_TOLERANCE: Duration = Duration::from_millis(100);

/// Options with a TTL far longer than the checks run, so that nothing they find free was
/// freed by expiry, and a per-call timeout of `call_timeout`.
fn long_lease(backend: &dyn LeaseBackend, call_timeout: Duration) -> LeaseOptions {
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(60));
    LeaseOptions::builder(ttl)
        .call_timeout(call_timeout)
        .build()
        .expect("valid options")
}

async fn held_guard(c: &LeaseClient, n: &LeaseName, options: &LeaseOptions) -> LeaseGuard {
    match c.try_acquire(n, options).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("{n} unexpectedly held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

/// Waits for `g` to hear "lost" (for at most two TTLs) and checks that it came by the
/// guard's safety deadline, as it stood before the wait, plus [`SIGNAL_TOLERANCE`].
async fn lost_by_deadline(g: &LeaseGuard, ttl: Duration, what: &str, backend: &str) -> LossReason {
    let deadline = g.deadline();
    let reason = tokio::time::timeout(ttl * 2, g.lost())
        .await
        .unwrap_or_else(|_| panic!("{what}: no lost signal within two TTLs"));
    let now = Instant::now();
    let late = now.saturating_duration_since(deadline);
    eprintln!(
        "{what} on {backend}: lost ({reason}) {late:?} after the deadline ({:?} before it)",
        deadline.saturating_duration_since(now)
    );
    assert!(
        late <= SIGNAL_TOLERANCE,
        "{what}: lost signalled {late:?} after the deadline ({reason})"
    );
    assert!(!g.is_held());
    reason
}

/// How many of `names` the store reports held.
async fn count_held(backend: &dyn LeaseBackend, names: &[LeaseName]) -> Vec<LeaseName> {
    futures::stream::iter(names)
        .map(|n| async move {
            backend
                .inspect(n)
                .await
                .expect("inspect")
                .map(|_| n.clone())
        })
        .buffer_unordered(16)
        .filter_map(|held| async move { held })
        .collect()
        .await
}

/// Waits until the store reports `n` free, for at most `within`; returns how long it took.
async fn free_within(backend: &dyn LeaseBackend, n: &LeaseName, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if backend.inspect(n).await.expect("inspect").is_none() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{n} still held {within:?} after the call ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`CANCELLED_CALLS`] acquire calls dropped at random points, half of them right after
/// their first poll, leave no lease held once the call timeout plus one second has
/// passed (guarantee 11). The TTL is a minute, so nothing is freed by expiry.
pub async fn cancelled_acquires_leave_nothing_held(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let call_timeout = Duration::from_secs(1);
    let options = long_lease(&*backend, call_timeout);
    let c = client(&backend, "canceller");
    // The time one acquire takes on this store: the random drop points spread over it.
    let mut took = Vec::new();
    for i in 0..5 {
        let n = name(&ns, &format!("probe-{i}"));
        let start = Instant::now();
        let g = held_guard(&c, &n, &options).await;
        took.push(start.elapsed());
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    took.sort();
    let latency = took[2].max(Duration::from_micros(50));
    let names: Vec<LeaseName> = (0..CANCELLED_CALLS)
        .map(|i| name(&ns, &format!("dropped-{i}")))
        .collect();
    let dropped = AtomicUsize::new(0);
    let completed = AtomicUsize::new(0);
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(8, |(i, n)| {
            let (c, options, dropped, completed) = (&c, &options, &dropped, &completed);
            async move {
                let outcome = if i % 2 == 0 {
                    // Polled once, then dropped.
                    let mut call = pin!(c.try_acquire(n, options));
                    match futures::poll!(call.as_mut()) {
                        Poll::Ready(r) => Some(r),
                        Poll::Pending => None,
                    }
                } else {
                    let at = latency.mul_f64(2.0 * fastrand::f64());
                    tokio::time::timeout(at, c.try_acquire(n, options))
                        .await
                        .ok()
                };
                match outcome {
                    None => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    // Finished before the drop point: the guard is dropped at once, which
                    // must release it too.
                    Some(Ok(TryAcquire::Acquired(_guard))) => {
                        completed.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(TryAcquire::Held(by))) => panic!("{n} held by {by}"),
                    Some(Err(e)) => panic!("acquire of {n} failed: {e}"),
                    _ => unreachable!("an outcome added to the enum after this code was written"),
                }
            }
        })
        .await;
    let last_drop = Instant::now();
    let dropped = dropped.into_inner();
    // A backend that answers within its first poll (the in-memory one) cannot be dropped
    // mid-call; every other backend must have had many calls dropped, or this check did
    // not test what it says.
    assert!(
        dropped >= CANCELLED_CALLS / 4 || completed.load(Ordering::Relaxed) == CANCELLED_CALLS,
        "only {dropped} of {CANCELLED_CALLS} calls were dropped before they finished; \
         the check did not test cancellation (latency {latency:?})"
    );
    tokio::time::sleep_until(last_drop + call_timeout + Duration::from_secs(1)).await;
    let held = count_held(&*backend, &names).await;
    eprintln!(
        "cancelled acquires on {}: {CANCELLED_CALLS} calls, {dropped} dropped mid-call, {} \
         finished before their drop point; {} names held {:?} after the last drop",
        backend.capabilities().backend,
        completed.load(Ordering::Relaxed),
        held.len(),
        last_drop.elapsed()
    );
    assert!(
        held.is_empty(),
        "{} of {CANCELLED_CALLS} names still held {:?} after the last drop \
         ({dropped} dropped mid-call, {} finished; call timeout {call_timeout:?}): {:?}",
        held.len(),
        last_drop.elapsed(),
        completed.into_inner(),
        &held[..held.len().min(5)]
    );
}

/// An acquire the store applied but whose reply never came (a reset stream, a leader
/// change after the commit) ends in a timeout, and the name is free again within the call
/// timeout plus one cleanup round trip, not blocked until the TTL (guarantee 12).
pub async fn lost_acquire_reply_frees_the_name(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "lost-reply");
    let call_timeout = Duration::from_millis(500);
    let options = long_lease(&*backend, call_timeout);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set_once(Op::Acquire, Fault::LoseReply);
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "reply-lost");
    match c.try_acquire(&n, &options).await {
        Err(e @ Error::Timeout { .. }) => assert!(e.is_retryable()),
        other => panic!("expected a timeout, got {other:?}"),
    }
    free_within(&*backend, &n, call_timeout + Duration::from_secs(1)).await;
    // The same, and the cleanup's first release fails too (a pooled connection the store
    // had closed): it is sent again at once, not only after the call timeout.
    faulty.set_once(Op::Acquire, Fault::LoseReply);
    faulty.set_once(Op::Release, Fault::Fail);
    let started = Instant::now();
    assert!(c.try_acquire(&n, &options).await.is_err());
    let timed_out = started.elapsed();
    free_within(&*backend, &n, call_timeout / 2).await;
    assert!(timed_out >= call_timeout, "{timed_out:?}");
    // Lost release reply: the call times out, the store has applied it anyway.
    let g = held_guard(&c, &n, &options).await;
    faulty.set_once(Op::Release, Fault::LoseReply);
    let releases = faulty.calls(Op::Release);
    assert!(matches!(
        g.release().await,
        Err(Error::Timeout {
            operation: "release",
            ..
        })
    ));
    free_within(&*backend, &n, Duration::from_secs(1)).await;
    // The failed release is sent again in the background at once; let it land before the
    // next fault is set, which it would otherwise take for itself.
    let started = Instant::now();
    while faulty.calls(Op::Release) < releases + 2 {
        assert!(
            started.elapsed() < call_timeout * 2,
            "the failed release was not sent again"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A release that fails (the store unreachable for a moment) is sent again in the
    // background.
    let g = held_guard(&c, &n, &options).await;
    faulty.set_once(Op::Release, Fault::Fail);
    assert!(matches!(g.release().await, Err(Error::Unavailable { .. })));
    free_within(&*backend, &n, call_timeout + Duration::from_secs(1)).await;
}

/// The safety deadline counts from when a call was sent, not from when its reply came:
/// with every reply held back by an eighth of the TTL, the deadline of the acquisition
/// and of each renewal lies at most TTL - margin after the call was sent, and the lease
/// is still kept alive (guarantee 6).
///
/// Any delay shows a deadline counted from the reply (it would be late by the delay).
/// The delay must leave the call itself room within the call timeout (TTL/3 by default):
/// with a quarter of the TTL held back, a call had TTL/12 (50 ms at the suite's 600 ms
/// TTL) of its own, which the advisory-lock mode's acquire (a connection of its own per
/// lock) overran when the whole suite ran at once on two cores.
pub async fn deadline_counts_from_send_time(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "slow-replies");
    let ttl = base_ttl(&*backend);
    let options = opts(ttl);
    let budget = ttl - options.safety_margin();
    let delay = ttl / 8;
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Acquire, Fault::DelayReply(delay));
    faulty.set(Op::Renew, Fault::DelayReply(delay));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "slow-replies");
    let g = held_guard(&c, &n, &options).await;
    let replied = Instant::now();
    // The call was sent at least `delay` before its reply arrived.
    assert!(
        g.deadline() + delay <= replied + budget,
        "acquire deadline {:?} after the reply, more than TTL - margin - reply delay ({:?})",
        g.deadline() - replied,
        budget - delay
    );
    // Three renewals, each replied to `delay` after the store applied it.
    let mut seen = g.deadline();
    for _ in 0..3 {
        let start = Instant::now();
        let renewed = loop {
            if g.deadline() > seen {
                break Instant::now();
            }
            assert!(
                start.elapsed() < ttl * 2,
                "no renewal for 2 TTLs: {:?}",
                g.loss_reason()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        seen = g.deadline();
        assert!(
            seen + delay <= renewed + budget,
            "renewal deadline {:?} after the reply, more than TTL - margin - reply delay ({:?})",
            seen - renewed,
            budget - delay
        );
        assert!(g.is_held(), "lost: {:?}", g.loss_reason());
    }
    faulty.set_all(Fault::Pass);
    g.release().await.expect("release");
}

/// A renewal that panics counts as a failed renewal: once, and the lease is renewed by the
/// retry; every time, and the guard hears "lost" at its deadline. Either way the client's
/// heartbeat lives on and the same client acquires and renews again afterwards.
pub async fn renew_panic_is_a_failed_renewal(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend);
    let options = opts(ttl);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "panicky");
    // Once.
    let g = held_guard(&c, &name(&ns, "panic-once"), &options).await;
    faulty.set_once(Op::Renew, Fault::Panic);
    let before = faulty.calls(Op::Renew);
    tokio::time::timeout(ttl * 2, faulty.wait_for_calls(Op::Renew, before + 2))
        .await
        .unwrap_or_else(|_| panic!("no renewal after one that panicked: {:?}", g.loss_reason()));
    tokio::time::sleep(ttl * 2).await;
    assert!(
        g.is_held(),
        "one panicking renewal lost the lease: {:?}",
        g.loss_reason()
    );
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Every time.
    let g = held_guard(&c, &name(&ns, "panic-always"), &options).await;
    faulty.set(Op::Renew, Fault::Panic);
    let backend_name = backend.capabilities().backend;
    let reason = lost_by_deadline(&g, ttl, "every renewal panicking", backend_name).await;
    assert_eq!(reason, LossReason::DeadlinePassed);
    faulty.set(Op::Renew, Fault::Pass);
    drop(g);
    // The same client works on.
    let g = held_guard(&c, &name(&ns, "after-panics"), &options).await;
    tokio::time::sleep(ttl * 2).await;
    assert!(
        g.is_held(),
        "not renewed after the panics: {:?}",
        g.loss_reason()
    );
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A current-thread runtime on a thread of its own, driven only while
/// [`SideRuntime::run`] runs a future on it; between runs it is alive but idle, as a
/// runtime is that nobody drives. Dropped, it drops the runtime.
type SideJob = Box<dyn FnOnce(&tokio::runtime::Runtime) + Send>;

struct SideRuntime {
    jobs: Option<std::sync::mpsc::Sender<SideJob>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SideRuntime {
    fn start() -> Self {
        let (jobs, rx) = std::sync::mpsc::channel::<SideJob>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            while let Ok(job) = rx.recv() {
                job(&rt);
            }
            drop(rt);
        });
        SideRuntime {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Runs `fut` to completion on the side runtime.
    async fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .as_ref()
            .expect("running")
            .send(Box::new(move |rt: &tokio::runtime::Runtime| {
                let _ = tx.send(rt.block_on(fut));
            }))
            .expect("side runtime thread");
        rx.await.expect("side runtime job")
    }

    /// Drops the runtime (and every task on it) and waits until it is gone.
    async fn shut_down(mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            tokio::task::spawn_blocking(move || t.join().expect("side runtime thread"))
                .await
                .expect("join");
        }
    }
}

impl Drop for SideRuntime {
    fn drop(&mut self) {
        // Without `shut_down`, the thread ends on its own once the channel closes.
        self.jobs = None;
    }
}

/// The runtime that ran a client's first acquire (and so its heartbeat) is dropped while
/// the guard lives on in another runtime: the guard hears "lost" by its deadline, and the
/// same client acquires again from the other runtime with a new heartbeat that renews.
pub async fn heartbeat_runtime_dropped(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend);
    let options = opts(ttl);
    let c = client(&backend, "runtime-dropped");
    let first = name(&ns, "first");
    let side = SideRuntime::start();
    let g = {
        let (c, first, options) = (c.clone(), first.clone(), options.clone());
        side.run(async move { held_guard(&c, &first, &options).await })
            .await
    };
    side.shut_down().await;
    let reason = lost_by_deadline(
        &g,
        ttl,
        "heartbeat runtime dropped",
        backend.capabilities().backend,
    )
    .await;
    assert!(
        matches!(
            reason,
            LossReason::HeartbeatStopped | LossReason::DeadlinePassed
        ),
        "{reason:?}"
    );
    drop(g);
    // The same client, from this runtime: a new heartbeat renews.
    let wait = LeaseOptions::builder(ttl)
        .wait(ttl * 3)
        .build()
        .expect("opts");
    let g = c
        .acquire(name(&ns, "second"), &wait)
        .await
        .expect("the client cannot acquire after its heartbeat's runtime was dropped");
    tokio::time::sleep(ttl * 2).await;
    assert!(g.is_held(), "not renewed: {:?}", g.loss_reason());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // The first lease is free again: released by the drop above or expired.
    free_within(&*backend, &first, ttl + super::EXPIRY_TOLERANCE).await;
}

/// A heartbeat that is not dropped but no longer driven (its current-thread runtime idle)
/// with renewals in flight: a guard still hears "lost" by its deadline, and `release` and
/// a dropped guard do not wait for the stalled renewal beyond the call timeout (guarantee
/// 12, bounded waits). The released and dropped leases have a TTL of a minute, so only
/// the release can have freed them.
///
/// Only the heartbeat runs on the stalled runtime: the acquires and releases run on the
/// test's own, so that the backend's connections are not tied to the stalled one.
pub async fn stalled_heartbeat_bounds_lost_and_release(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend);
    let short = opts(ttl);
    let call_timeout = Duration::from_secs(1);
    let long = LeaseOptions::builder(
        backend
            .capabilities()
            .effective_ttl(Duration::from_secs(60)),
    )
    .renew_every(Duration::from_millis(200))
    .call_timeout(call_timeout)
    .build()
    .expect("opts");
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "stalled");
    // Start the client's heartbeat on the side runtime: an acquire refused before it
    // reaches the store. (A failure that may have reached the store would spawn a
    // cleanup on the side runtime, and a cleanup stalled there mid-call would hold one of
    // the backend's connections.)
    let side = SideRuntime::start();
    faulty.set_once(Op::Acquire, Fault::RefuseInput);
    {
        let (c, short) = (c.clone(), short.clone());
        let n = name(&ns, "start-heartbeat");
        assert!(
            side.run(async move { c.try_acquire(&n, &short).await.is_err() })
                .await
        );
    }
    faulty.set(Op::Renew, Fault::Hang);
    let names = [
        name(&ns, "lost"),
        name(&ns, "released"),
        name(&ns, "dropped"),
    ];
    let lost = held_guard(&c, &names[0], &short).await;
    let released = held_guard(&c, &names[1], &long).await;
    let dropped = held_guard(&c, &names[2], &long).await;
    // Drive the side runtime until the heartbeat has a renewal of each in flight (hung).
    {
        let (faulty, names) = (faulty.clone(), names.clone());
        side.run(async move {
            loop {
                let log = faulty.renew_log();
                let flying = |n: &LeaseName| {
                    log.iter()
                        .any(|call| call.finished.is_none() && call.names.contains(n))
                };
                if names.iter().all(flying) {
                    break;
                }
                faulty
                    .wait_for_calls(Op::Renew, faulty.calls(Op::Renew) + 1)
                    .await;
            }
        })
        .await;
    }
    // The side runtime is idle from here on: the heartbeat cannot run.
    let reason = lost_by_deadline(
        &lost,
        ttl,
        "heartbeat stalled",
        backend.capabilities().backend,
    )
    .await;
    assert_eq!(reason, LossReason::DeadlinePassed);
    lost.disarm();
    faulty.set(Op::Renew, Fault::Pass);
    let started = Instant::now();
    let outcome = tokio::time::timeout(call_timeout * 3, released.release())
        .await
        .expect("release waited on the stalled heartbeat");
    let took = started.elapsed();
    assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
    assert!(
        took <= call_timeout + Duration::from_millis(500),
        "release took {took:?} with a call timeout of {call_timeout:?}"
    );
    free_within(&*backend, &names[1], Duration::from_millis(100)).await;
    drop(dropped);
    free_within(&*backend, &names[2], call_timeout + Duration::from_secs(1)).await;
    side.shut_down().await;
}

/// The lost token of a run, and a guard's, is cancelled when the run ends or the guard is
/// released, with the reason `Released`, so tasks spawned with it stop; `is_held` stays
/// false from then on.
pub async fn lost_token_fires_when_the_run_ends(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend);
    let options = opts(ttl);
    let c = client(&backend, "run-ends");
    let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
    let out = c
        .run_exclusive(name(&ns, "run"), &options, |ctx| async move {
            let token = ctx.lost.clone();
            let task = tokio::spawn(async move {
                token.cancelled().await;
                ctx.loss_reason()
            });
            let _ = spawned_tx.send(task);
            7
        })
        .await
        .expect("run");
    assert_eq!(out, RunOutcome::Ran(7));
    let task = spawned_rx.await.expect("task handle");
    let reason = tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("a task spawned with ctx.lost still runs after the run ended")
        .expect("join");
    assert_eq!(reason, Some(LossReason::Released));
    let g = held_guard(&c, &name(&ns, "guard"), &options).await;
    let token = g.lost_token();
    assert!(!token.is_cancelled());
    g.release().await.expect("release");
    assert!(
        token.is_cancelled(),
        "release left the lost token uncancelled"
    );
}

/// A scheduled job with default lease options, on two instances whose ticks are apart by
/// a fifth, a half and four fifths of the derived keep-for, runs once per period:
/// keep-for is derived from the period (nine tenths of it, or the period minus the store's
/// TTL granularity where that is coarser).
///
/// Two runs are kept apart by keep-for where the store took their leases, which the
/// instances observe only through their `acquire` calls: the store took a lease after its
/// call started and before it returned. So the check is that each acquisition's call
/// returned at least keep-for after the previous acquisition's call started, which holds
/// however late each run's work starts after its call returned. (Timing the work's start
/// instead failed once under load: two runs 535.9 ms apart with a keep-for of 540 ms, the
/// first run's work having started later after its acquisition than the second's.)
pub async fn scheduled_job_defaults_once_per_period(backend: Arc<dyn LeaseBackend>) {
    let caps = backend.capabilities();
    if !crate::not_applicable::applies(
        &*backend,
        "scheduled_job_defaults_once_per_period",
        crate::not_applicable::Needs::KeepFor,
    ) {
        return; // `scheduled_job_validates_keep_for` checks the refusal.
    }
    let ns = namespace();
    let ttl = base_ttl(&*backend);
    // At least two granules: a store that rounds keep-for up to whole seconds still
    // frees the lease before the next tick of the instance that ran; plus the store's
    // minimum TTL where it exceeds a granule (etcd: a lease released with a sliver of
    // keep-for left lives 2 s).
    let period = ttl.max(caps.ttl_granularity * 2 + crate::suite::min_ttl_tail(&caps));
    let periods = 5u32;
    let options = LeaseOptions::new(ttl).expect("defaults");
    let keep_for = ScheduledJob::new(client(&backend, "probe"), "probe", period, options.clone())
        .expect("job with default keep-for")
        .keep_for();
    let tail = crate::suite::min_ttl_tail(&caps);
    assert!(
        keep_for >= (period - tail) / 2 && keep_for + tail < period,
        "derived keep-for {keep_for:?} for a period of {period:?} (minimum TTL {tail:?})"
    );
    let mut runs = Vec::new();
    for (k, offset) in [keep_for / 5, keep_for / 2, keep_for * 4 / 5]
        .into_iter()
        .enumerate()
    {
        let n = name(&ns, &format!("offset-{k}"));
        let log = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
        let shutdown = lease_core::CancellationToken::new();
        let mut tasks = Vec::new();
        let mut calls = Vec::new();
        for (i, start_after) in [Duration::ZERO, offset].into_iter().enumerate() {
            // Each instance's calls recorded, to bound when the store took each lease.
            let recorded = Arc::new(FaultyBackend::new(backend.clone()));
            calls.push(recorded.clone());
            let job = ScheduledJob::new(
                client(
                    &(recorded as Arc<dyn LeaseBackend>),
                    &format!("instance-{i}"),
                ),
                &n,
                period,
                options.clone(),
            )
            .expect("job with default keep-for");
            let (log, shutdown) = (log.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(start_after).await;
                job.run(shutdown, move |_| {
                    let log = log.clone();
                    async move { log.lock().expect("lock").push(Instant::now()) }
                })
                .await
            }));
        }
        runs.push((offset, log, shutdown, tasks, calls));
    }
    tokio::time::sleep(period * periods + period / 2).await;
    for (offset, log, shutdown, tasks, calls) in runs {
        shutdown.cancel();
        for t in tasks {
            t.await.expect("task");
        }
        let log = log.lock().expect("lock").clone();
        // Ticks at 0, P, .., 5P by the first instance: six periods begun.
        assert!(
            log.len() <= periods as usize + 1 && log.len() >= periods as usize - 1,
            "{} runs in {periods}.5 periods of {period:?}, instances {offset:?} apart\n{}",
            log.len(),
            acquire_timeline(&calls)
        );
        assert_acquisitions_keep_for_apart(
            &calls,
            log.len(),
            keep_for,
            &format!("period {period:?}, instances {offset:?} apart"),
        );
    }
}

/// A scheduled job refuses keep-for at or above the period, and a backend that cannot
/// keep a lease after release.
pub async fn scheduled_job_validates_keep_for(backend: Arc<dyn LeaseBackend>) {
    let ttl = base_ttl(&*backend);
    let period = Duration::from_secs(60);
    let c = client(&backend, "validator");
    let with_keep = |keep: Duration| {
        LeaseOptions::builder(ttl)
            .keep_for(keep)
            .build()
            .expect("opts")
    };
    let made = ScheduledJob::new(c.clone(), "job", period, with_keep(period / 2));
    if !backend.capabilities().keep_for {
        assert!(
            matches!(made, Err(Error::Unsupported { .. })),
            "a backend without keep-for must be refused: {made:?}"
        );
        return;
    }
    made.expect("keep-for below the period");
    let long = ScheduledJob::new(c.clone(), "job", MAX_TTL * 5, with_keep(Duration::ZERO))
        .expect("a long period");
    assert!(long.keep_for() <= MAX_TTL, "derived {:?}", long.keep_for());
    for keep in [period, period * 2] {
        let refused = ScheduledJob::new(c.clone(), "job", period, with_keep(keep));
        assert!(
            matches!(
                refused,
                Err(Error::InvalidInput(
                    InvalidInput::KeepForNotBelowPeriod { .. }
                ))
            ),
            "keep-for {keep:?} with a period of {period:?}: {refused:?}"
        );
    }
}
