//! [`LeaseClient`]: acquisition, waiting, run-exclusive, over any [`LeaseBackend`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::LeaseBackend;
use crate::error::{Error, Result};
use crate::guard::{LeaseGuard, Store};
use crate::health::{Health, HeartbeatState};
use crate::heartbeat::{self, HeartbeatHandle, Registration};
use crate::metrics::{self, Outcome};
use crate::shared::{GuardShared, LossReason};
use crate::types::{
    AcquireOutcome, Capabilities, FencingToken, HeldBy, HolderLabel, LeaseInfo, LeaseName,
    LeaseOptions, Owner, OwnerToken, ReleaseOutcome,
};
use crate::util::{Site, backoff_delay, call, in_span};

/// Answer to [`LeaseClient::try_acquire`].
#[derive(Debug)]
#[must_use]
#[non_exhaustive]
pub enum TryAcquire {
    /// The lease is ours.
    Acquired(LeaseGuard),
    /// Someone else holds it.
    Held(HeldBy),
}

/// Handed to work run under a lease.
#[derive(Debug, Clone)]
pub struct LeaseContext {
    /// The lease name.
    pub name: LeaseName,
    /// The fencing token of this acquisition: pass it with every write to the protected
    /// resource.
    pub fencing: FencingToken,
    /// Cancelled when the lease is lost, and when the run ends (reason
    /// [`LossReason::Released`]), so tasks spawned with it stop with the run.
    pub lost: CancellationToken,
    /// The scheduled instant of the firing being run, for a
    /// [`ScheduledJob`](crate::ScheduledJob) on a [`Schedule`](crate::Schedule) of
    /// instants (cron, fixed rate); `None` otherwise.
    pub firing: Option<std::time::SystemTime>,
    shared: Arc<GuardShared>,
}

impl LeaseContext {
    /// Why [`LeaseContext::lost`] was cancelled: `None` while the lease is held,
    /// [`LossReason::Released`] once the run has ended.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss_reason()
    }
}

/// Outcome of [`LeaseClient::run_exclusive`].
#[derive(Debug, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum RunOutcome<T> {
    /// The work ran to completion while the lease was held.
    Ran(T),
    /// Someone else held the lease (after waiting up to the options' `wait`); the work did
    /// not run.
    Skipped(HeldBy),
    /// The lease was lost while the work ran; the work was cancelled.
    Lost(LossReason),
}

#[derive(Debug)]
struct ClientInner {
    backend: Arc<dyn LeaseBackend>,
    caps: Capabilities,
    label: HolderLabel,
    /// The running heartbeat; replaced by a new one if it dies.
    heartbeat: Mutex<Option<Arc<HeartbeatHandle>>>,
    next_id: AtomicU64,
    epoch: Instant,
    /// The keys of the metrics every acquire and release reports, made once.
    series: metrics::Series,
}

impl ClientInner {
    /// The backend with its name, as guards and background releases use it.
    fn store(&self) -> Store {
        Store {
            backend: self.backend.clone(),
            backend_name: self.caps.backend,
            label: self.label.clone(),
            series: self.series.clone(),
        }
    }

    /// The client's heartbeat, started on the current runtime if there is none or the
    /// last one has stopped (its runtime was shut down, or it panicked). Fails only where
    /// no runtime is running, before anything is sent to the store.
    fn heartbeat(&self) -> Result<Arc<HeartbeatHandle>> {
        let mut slot = self.heartbeat.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hb) = slot.as_ref() {
            if hb.is_alive() {
                return Ok(hb.clone());
            }
            tracing::warn!(
                holder = %self.label,
                "the heartbeat task has stopped (its runtime was shut down, or it panicked); \
                 starting a new one on this runtime"
            );
        }
        let hb = Arc::new(heartbeat::spawn(
            self.backend.clone(),
            self.caps.backend,
            self.label.clone(),
            self.caps.max_renew_batch,
            self.epoch,
        )?);
        *slot = Some(hb.clone());
        Ok(hb)
    }
}

/// Armed around an acquire call: if the call does not end with a guard (it was dropped
/// at an await point, timed out, or failed after the store may have applied it), the
/// drop releases whatever the call may have taken, by its owner token, in the background.
/// Disarmed once a [`LeaseGuard`] owns the lease, or once the store said it is held.
struct AcquireCleanup {
    inner: Arc<ClientInner>,
    name: LeaseName,
    token: OwnerToken,
    call_timeout: Duration,
    armed: bool,
}

impl AcquireCleanup {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AcquireCleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                lease = %self.name,
                "acquire abandoned outside a runtime; anything it took lapses at its TTL"
            );
            return;
        };
        let span = tracing::debug_span!(
            "lease.cleanup",
            lease = %self.name,
            holder = %self.inner.label,
        );
        rt.spawn(
            release_abandoned(
                self.inner.store(),
                self.name.clone(),
                self.token,
                self.call_timeout,
            )
            .instrument(span),
        );
    }
}

/// Releases what an abandoned acquire may have taken. The release can overtake the
/// acquire on its way to the store (another connection, another stream), so if it finds
/// nothing it is sent once more after the call timeout, by when the acquire has been
/// applied or will not be. Each of the two is retried at once on a retryable error (see
/// `Store::release_in_background`): a pooled connection the store had closed must not
/// leave the lease to its TTL.
async fn release_abandoned(
    store: Store,
    name: LeaseName,
    token: OwnerToken,
    call_timeout: Duration,
) {
    let release = || store.release_in_background(&name, &token, Duration::ZERO, call_timeout);
    if let Ok(ReleaseOutcome::Released) = release().await {
        tracing::info!("an abandoned acquire had taken the lease; released it");
        return;
    }
    tokio::time::sleep(call_timeout).await;
    match release().await {
        Ok(ReleaseOutcome::Released) => {
            tracing::info!("an abandoned acquire had taken the lease; released it")
        }
        Ok(ReleaseOutcome::NotOwner) => {
            tracing::debug!("the abandoned acquire had taken nothing")
        }
        Err(e) => tracing::warn!(
            error = %e,
            "could not release what an abandoned acquire may have taken; it lapses at its TTL"
        ),
    }
}

/// The shared client: acquires leases on a [`LeaseBackend`] and keeps them alive with one
/// heartbeat task that renews all of this client's leases in batches.
///
/// Cheap to clone; clones share the heartbeat. Create one per process (or per holder
/// label) and share it.
///
/// The heartbeat task runs on the runtime of the first acquire. If it stops (that runtime
/// was shut down, or the task panicked), its leases hear [`LossReason::HeartbeatStopped`]
/// and the next acquire starts a new heartbeat on its own runtime before it touches the
/// store. A heartbeat whose runtime still exists but is not driven (a current-thread
/// runtime outside `block_on`) cannot renew: its guards still hear "lost" at their
/// deadline, but keep the runtime of the first acquire running.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseClient, LeaseOptions, MemoryBackend, RunOutcome};
///
/// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
/// let opts = LeaseOptions::builder(Duration::from_secs(10)).build()?;
/// let outcome = client
///     .run_exclusive("send-outbox", &opts, |ctx| async move {
///         // ... write to the protected resource with ctx.fencing ...
///         ctx.fencing.get()
///     })
///     .await?;
/// assert!(matches!(outcome, RunOutcome::Ran(1)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseClient {
    inner: Arc<ClientInner>,
}

impl LeaseClient {
    /// A client with the holder label `hostname:pid`.
    pub fn new(backend: Arc<dyn LeaseBackend>) -> Self {
        Self::with_label(backend, HolderLabel::default_for_process())
    }

    /// A client with the given holder label.
    pub fn with_label(backend: Arc<dyn LeaseBackend>, label: HolderLabel) -> Self {
        let caps = backend.capabilities();
        metrics::describe();
        LeaseClient {
            inner: Arc::new(ClientInner {
                backend,
                series: metrics::Series::new(caps.backend),
                caps,
                label,
                heartbeat: Mutex::new(None),
                next_id: AtomicU64::new(1),
                epoch: Instant::now(),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LeaseBackend> {
        &self.inner.backend
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// The holder label stored with every lease this client takes.
    pub fn label(&self) -> &HolderLabel {
        &self.inner.label
    }

    /// Tries once to take `name`; does not wait if it is held.
    ///
    /// Errors: a typed [`Error`] when the store fails or does not answer within the call
    /// timeout ([`Error::is_retryable`] says whether to try again later). A lease granted
    /// but answered after its safety deadline (send time + granted TTL - safety margin:
    /// the store granted less than the answer took, or a stalled runtime let a late
    /// answer through) is released and reported as [`Error::Timeout`] (retryable), with
    /// the time the answer had (granted TTL - margin) as `after`: the store could give
    /// such a lease away at any moment.
    ///
    /// Cancel safety: cancel-safe. If the future is dropped before it returns (a
    /// `timeout`, a `select!`, a request handler whose client hung up), whatever the
    /// store may have granted is released by its owner token in the background, once at
    /// once and once more after the call timeout (in case the release overtook the
    /// acquire): no lease stays held without a guard for longer than the call timeout
    /// plus one round trip. The same holds when the call times out or fails.
    pub async fn try_acquire(
        &self,
        name: impl AsRef<[u8]>,
        opts: &LeaseOptions,
    ) -> Result<TryAcquire> {
        let name = LeaseName::new(name)?;
        self.try_acquire_name(&name, opts).await
    }

    async fn try_acquire_name(&self, name: &LeaseName, opts: &LeaseOptions) -> Result<TryAcquire> {
        let inner = &self.inner;
        // Make sure a live heartbeat exists before touching the store, so a missing
        // runtime is an error before anything is taken.
        let hb = inner.heartbeat()?;
        let owner = Owner::new(inner.label.clone());
        let span = crate::util::span!(DEBUG, "lease.acquire", lease = %name, holder = %inner.label);
        in_span(span, async {
            let mut cleanup = AcquireCleanup {
                inner: inner.clone(),
                name: name.clone(),
                token: owner.token,
                call_timeout: opts.call_timeout(),
                armed: true,
            };
            let sent_at = Instant::now();
            let reply = call(
                Site::new(inner.caps.backend, "acquire", name).owner(&inner.label),
                opts.call_timeout(),
                inner.backend.acquire(name, &owner, opts.ttl()),
            )
            .await;
            inner
                .series
                .acquire(name, reply.outcome(), sent_at.elapsed());
            match reply {
                Err(e) => {
                    if !e.may_have_reached_the_store() {
                        cleanup.disarm();
                    }
                    // Anything the store may have granted is released by `cleanup`,
                    // rather than blocking everyone until the TTL.
                    tracing::warn!(error = %e, retryable = e.is_retryable(), "acquire failed");
                    Err(e)
                }
                Ok(AcquireOutcome::Held(by)) => {
                    cleanup.disarm();
                    tracing::debug!(held_by = %by, "lease held elsewhere");
                    Ok(TryAcquire::Held(by))
                }
                Ok(AcquireOutcome::Acquired { fencing, ttl }) => {
                    let granted = Granted {
                        name,
                        owner: &owner,
                        fencing,
                        ttl: ttl.min(opts.ttl()),
                        sent_at,
                    };
                    // The answer came after the lease's safety deadline (the store granted
                    // less time than the answer took, or this runtime or the store stalled
                    // past the call timeout and the answer won the race with the timer):
                    // the store may give the lease away at any moment, so it is no lease
                    // to work under. It is released as a timed-out acquire's is
                    // (`cleanup` stays armed) and the call reports a timeout.
                    let deadline = granted.deadline(opts);
                    if Instant::now() >= deadline {
                        tracing::warn!(
                            fencing = fencing.get(),
                            took = ?sent_at.elapsed(),
                            granted = ?granted.ttl,
                            "acquire answered after the lease's safety deadline; releasing it"
                        );
                        return Err(Error::Timeout {
                            operation: "acquire",
                            after: deadline - sent_at,
                        });
                    }
                    let guard = self.register(hb, &granted, opts)?;
                    cleanup.disarm();
                    tracing::info!(fencing = fencing.get(), "acquired");
                    Ok(TryAcquire::Acquired(guard))
                }
            }
        })
        .await
    }

    /// Hands a granted lease to the heartbeat and returns its guard. If the heartbeat died
    /// since the acquire started, a new one is started on this runtime and takes it.
    fn register(
        &self,
        mut hb: Arc<HeartbeatHandle>,
        granted: &Granted<'_>,
        opts: &LeaseOptions,
    ) -> Result<LeaseGuard> {
        let inner = &self.inner;
        for _ in 0..2 {
            let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let shared = Arc::new(GuardShared::new(
                inner.series.clone(),
                granted.name.clone(),
                granted.owner.token,
                granted.fencing,
                granted.owner.label.clone(),
                inner.epoch,
            ));
            let first_deadline = granted.deadline(opts);
            shared.set_deadline(first_deadline);
            let reg = Registration {
                id,
                name: granted.name.clone(),
                token: granted.owner.token,
                opts: opts.clone(),
                sent_at: granted.sent_at,
                first_deadline,
                shared: shared.clone(),
            };
            if hb.register(reg) {
                return Ok(LeaseGuard::new(shared, inner.store(), hb, id, opts.clone()));
            }
            hb = inner.heartbeat()?;
        }
        Err(Error::unexpected(
            "client",
            "the heartbeat task stopped twice while a lease was being registered",
        ))
    }

    /// Takes `name`, waiting up to `opts.wait()` while someone else holds it.
    ///
    /// Between attempts it waits for the backend's release notification where the
    /// capabilities offer one, otherwise it polls with jittered exponential backoff. Store
    /// errors that may be retried are retried until the wait runs out.
    ///
    /// Errors: [`Error::StillHeld`] when the wait ran out while the lease was held; the
    /// last store error when the store failed until the end; any non-retryable error at once.
    ///
    /// Cancel safety: cancel-safe, as [`LeaseClient::try_acquire`] is: a dropped call
    /// leaves no lease held without a guard beyond the call timeout plus one round trip.
    pub async fn acquire(&self, name: impl AsRef<[u8]>, opts: &LeaseOptions) -> Result<LeaseGuard> {
        let name = LeaseName::new(name)?;
        self.acquire_name(&name, opts).await
    }

    async fn acquire_name(&self, name: &LeaseName, opts: &LeaseOptions) -> Result<LeaseGuard> {
        self.acquire_waiting(name, opts, Some(opts.wait())).await
    }

    /// [`LeaseClient::acquire`] with the wait given apart from the options: `None` waits
    /// until the lease is taken or an error that is not retryable comes (elections).
    pub(crate) async fn acquire_waiting(
        &self,
        name: &LeaseName,
        opts: &LeaseOptions,
        wait: Option<Duration>,
    ) -> Result<LeaseGuard> {
        // "Forever" in steps of an hour: each step's sleeps are bounded by it.
        const STEP: Duration = Duration::from_secs(3600);
        let start = Instant::now();
        let deadline = match wait {
            Some(w) => start + w,
            None => start + STEP,
        };
        let mut deadline = deadline;
        let mut attempt = 0u32;
        // Counted in `lease_waiters` from the first refusal until this call ends.
        let mut waiting: Option<metrics::Waiting> = None;
        loop {
            let held = match self.try_acquire_name(name, opts).await {
                Ok(TryAcquire::Acquired(g)) => return Ok(g),
                Ok(TryAcquire::Held(by)) => Ok(by),
                Err(e) if e.is_retryable() => Err(e),
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline && wait.is_none() {
                deadline = now + STEP;
            }
            if now >= deadline {
                return match held {
                    Ok(by) => Err(Error::StillHeld {
                        name: name.to_string_lossy(),
                        waited: now - start,
                        holder: by.holder,
                    }),
                    Err(e) => Err(e),
                };
            }
            if waiting.is_none() {
                waiting = Some(metrics::Waiting::new(self.inner.caps.backend, name));
            }
            let left = deadline - now;
            let pause = backoff_delay(opts.backoff_min(), opts.backoff_max(), attempt).min(left);
            attempt = attempt.saturating_add(1);
            match &held {
                Ok(by) if self.inner.caps.release_notification => {
                    // Sleep until a release notification, the holder's expiry or our
                    // deadline, whichever is first.
                    // At least the minimum backoff: a holder at its expiry reports no time
                    // left, and the store's wait then returns at once.
                    let max = by
                        .remaining
                        .map_or(left, |r| r.max(opts.backoff_min()).min(left));
                    let waited = call(
                        Site::new(self.inner.caps.backend, "wait_released", name)
                            .owner(&self.inner.label),
                        max + opts.call_timeout(),
                        self.inner.backend.wait_released(name, max),
                    )
                    .await;
                    if waited.is_err() {
                        tokio::time::sleep(pause).await;
                    }
                }
                Ok(by) => {
                    let pause = by
                        .remaining
                        .map_or(pause, |r| pause.min(r.max(opts.backoff_min())));
                    tokio::time::sleep(pause).await;
                }
                Err(_) => tokio::time::sleep(pause).await,
            }
        }
    }

    /// Runs `work` while holding `name`.
    ///
    /// Waits for the lease up to `opts.wait()`; if it is still held, the work does not run
    /// and [`RunOutcome::Skipped`] is returned. If the lease is lost while the work runs,
    /// the work's future is dropped (cancelled) and [`RunOutcome::Lost`] is returned. After
    /// the work completes the lease is released (honouring keep-for). When the run ends,
    /// however it ends, [`LeaseContext::lost`] is cancelled, so tasks spawned with it stop.
    ///
    /// Cancel safety: cancel-safe. Dropped while acquiring, it behaves as a dropped
    /// [`LeaseClient::try_acquire`]; dropped while the work runs, the work is dropped with
    /// it and the lease is released in the background.
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        name: impl AsRef<[u8]>,
        opts: &LeaseOptions,
        work: F,
    ) -> Result<RunOutcome<T>>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let name = LeaseName::new(name)?;
        let guard = if opts.wait().is_zero() {
            match self.try_acquire_name(&name, opts).await? {
                TryAcquire::Acquired(g) => g,
                TryAcquire::Held(by) => return Ok(RunOutcome::Skipped(by)),
            }
        } else {
            match self.acquire_name(&name, opts).await {
                Ok(g) => g,
                Err(Error::StillHeld { holder, .. }) => {
                    return Ok(RunOutcome::Skipped(HeldBy {
                        holder,
                        remaining: None,
                    }));
                }
                Err(e) => return Err(e),
            }
        };
        Ok(run_with_guard(guard, work).await)
    }

    /// What a service's health endpoint reports: whether the store answers a read within
    /// `timeout` (and its round trip), the heartbeat's state, how many leases it keeps and
    /// how long ago the store last answered a renewal.
    ///
    /// The store probe reads the holder of [`HEALTH_PROBE_NAME`](crate::HEALTH_PROBE_NAME),
    /// which nothing holds: one read round trip, no write.
    ///
    /// Cancel safety: cancel-safe; it only reads.
    pub async fn health(&self, timeout: Duration) -> Health {
        let store = match LeaseName::new(crate::health::HEALTH_PROBE_NAME) {
            Ok(name) => {
                let sent = Instant::now();
                self.inspect_with_timeout(&name, timeout)
                    .await
                    .map(|_| sent.elapsed())
            }
            Err(e) => Err(e.into()),
        };
        let hb = self
            .inner
            .heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (heartbeat, leases, last_renewal) = match hb {
            None => (HeartbeatState::NotStarted, 0, None),
            Some(hb) => (
                if hb.is_alive() {
                    HeartbeatState::Running
                } else {
                    HeartbeatState::Stopped
                },
                hb.leases(),
                hb.last_answer().map(|t| t.elapsed()),
            ),
        };
        Health {
            heartbeat,
            leases,
            last_renewal,
            store,
        }
    }

    /// Reads the current holder of `name` from the store, bounded by 5 s.
    ///
    /// Cancel safety: cancel-safe; it only reads.
    pub async fn inspect(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>> {
        let name = LeaseName::new(name)?;
        self.inspect_with_timeout(&name, Duration::from_secs(5))
            .await
    }

    /// Reads the current holder of `name`, bounded by `timeout`.
    ///
    /// Cancel safety: cancel-safe; it only reads.
    pub async fn inspect_with_timeout(
        &self,
        name: &LeaseName,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>> {
        call(
            Site::new(self.inner.caps.backend, "inspect", name).owner(&self.inner.label),
            timeout,
            self.inner.backend.inspect(name),
        )
        .await
    }
}

/// What a successful acquire call granted.
struct Granted<'a> {
    name: &'a LeaseName,
    owner: &'a Owner,
    fencing: FencingToken,
    /// The TTL the store granted, at most the one asked for.
    ttl: Duration,
    sent_at: Instant,
}

impl Granted<'_> {
    /// The local safety deadline of the grant: send time + granted TTL - margin.
    fn deadline(&self, opts: &LeaseOptions) -> Instant {
        self.sent_at + self.ttl.saturating_sub(opts.safety_margin())
    }
}

/// Runs `work` under `guard`, cancelling it when the lease is lost, then releases.
pub(crate) async fn run_with_guard<F, Fut, T>(guard: LeaseGuard, work: F) -> RunOutcome<T>
where
    F: FnOnce(LeaseContext) -> Fut,
    Fut: Future<Output = T>,
{
    run_with_guard_at(guard, None, None, work).await
}

/// [`run_with_guard`] for a firing of a schedule: the context says which firing, and with
/// `keep_after`, the lease is released with keep-for = the time since `started` plus
/// `keep_after`, so that it stays taken `keep_after` past the end of the run (a fixed
/// delay between runs across instances).
pub(crate) async fn run_with_guard_at<F, Fut, T>(
    mut guard: LeaseGuard,
    firing: Option<std::time::SystemTime>,
    keep_after: Option<(Instant, Duration)>,
    work: F,
) -> RunOutcome<T>
where
    F: FnOnce(LeaseContext) -> Fut,
    Fut: Future<Output = T>,
{
    // The select below watches the deadline, so the context's token needs no watcher.
    let ctx = LeaseContext {
        name: guard.name().clone(),
        fencing: guard.fencing(),
        lost: guard.shared().lost_token().clone(),
        firing,
        shared: guard.shared().clone(),
    };
    let fut = work(ctx);
    let outcome = tokio::select! {
        biased;
        reason = guard.lost() => {
            tracing::warn!(lease = %guard.name(), %reason, "lease lost while work ran; work cancelled");
            RunOutcome::Lost(reason)
        }
        out = fut => RunOutcome::Ran(out),
    };
    if let Some((started, after)) = keep_after {
        guard.set_keep_for(started.elapsed().saturating_add(after));
    }
    // `release` cancels the context's token first (reason `Released`), so tasks spawned
    // with it stop before the lease is given up. Errors are logged by `release`; the
    // lease lapses at its TTL if it fails.
    let _ = guard.release().await;
    outcome
}
