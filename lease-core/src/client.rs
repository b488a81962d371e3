//! [`LeaseClient`]: acquisition, waiting, run-exclusive, over any [`LeaseBackend`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::LeaseBackend;
use crate::error::{Error, Result};
use crate::guard::{GuardShared, LeaseGuard, LossReason};
use crate::heartbeat::{self, Command, HeartbeatHandle, Registration};
use crate::types::{
    AcquireOutcome, Capabilities, FencingToken, HeldBy, HolderLabel, LeaseInfo, LeaseName,
    LeaseOptions, Owner,
};
use crate::util::backoff_delay;

/// Answer to [`LeaseClient::try_acquire`].
#[derive(Debug)]
#[must_use]
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
    /// Cancelled when the lease is lost.
    pub lost: CancellationToken,
}

/// Outcome of [`LeaseClient::run_exclusive`].
#[derive(Debug, PartialEq, Eq)]
#[must_use]
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
pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn LeaseBackend>,
    caps: Capabilities,
    label: HolderLabel,
    heartbeat: OnceLock<HeartbeatHandle>,
    next_id: AtomicU64,
    epoch: Instant,
}

impl ClientInner {
    /// Sends a command to the heartbeat; `false` if it is not running.
    pub(crate) fn send(&self, cmd: Command) -> bool {
        match self.heartbeat.get() {
            Some(hb) => hb.send(cmd),
            None => false,
        }
    }

    /// Queues an unregistration without waking the heartbeat.
    pub(crate) fn unregister_quiet(&self, id: u64) {
        if let Some(hb) = self.heartbeat.get() {
            hb.unregister_quiet(id);
        }
    }

    fn heartbeat(&self) -> Result<&HeartbeatHandle> {
        if let Some(hb) = self.heartbeat.get() {
            return Ok(hb);
        }
        let tx = heartbeat::spawn(self.backend.clone(), self.caps.max_renew_batch, self.epoch)?;
        // If another task won the race, its sender is kept and ours is dropped, which
        // ends the extra heartbeat task at once.
        Ok(self.heartbeat.get_or_init(|| tx))
    }
}

/// The shared client: acquires leases on a [`LeaseBackend`] and keeps them alive with one
/// heartbeat task that renews all of this client's leases in batches.
///
/// Cheap to clone; clones share the heartbeat. Create one per process (or per holder
/// label) and share it.
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
        LeaseClient {
            inner: Arc::new(ClientInner {
                backend,
                caps,
                label,
                heartbeat: OnceLock::new(),
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
        // Start the heartbeat before touching the store, so a missing runtime is an
        // error before anything is taken.
        let hb = inner.heartbeat()?;
        let owner = Owner::new(inner.label.clone());
        let span = tracing::debug_span!("lease.acquire", lease = %name, holder = %inner.label);
        async {
            let sent_at = Instant::now();
            let reply = tokio::time::timeout(
                opts.call_timeout(),
                inner.backend.acquire(name, &owner, opts.ttl()),
            )
            .await;
            match reply {
                Err(_) => {
                    // The store may have granted it after all: free it in the background
                    // rather than blocking everyone until the TTL.
                    self.spawn_cleanup(name.clone(), owner, opts.call_timeout());
                    tracing::warn!(timeout = ?opts.call_timeout(), "acquire timed out");
                    Err(Error::Timeout {
                        operation: "acquire",
                        after: opts.call_timeout(),
                    })
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, retryable = e.is_retryable(), "acquire failed");
                    Err(e)
                }
                Ok(Ok(AcquireOutcome::Held(by))) => {
                    tracing::debug!(held_by = %by, "lease held elsewhere");
                    Ok(TryAcquire::Held(by))
                }
                Ok(Ok(AcquireOutcome::Acquired { fencing, ttl })) => {
                    let ttl = ttl.min(opts.ttl());
                    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                    let shared = Arc::new(GuardShared::new(
                        name.clone(),
                        owner.token,
                        fencing,
                        owner.label.clone(),
                        inner.epoch,
                    ));
                    let first_deadline = sent_at + ttl.saturating_sub(opts.safety_margin());
                    shared.set_deadline(first_deadline);
                    let reg = Registration {
                        id,
                        name: name.clone(),
                        token: owner.token,
                        ttl: opts.ttl(),
                        renew_every: opts.renew_every(),
                        margin: opts.safety_margin(),
                        call_timeout: opts.call_timeout(),
                        backoff: (opts.backoff_min(), opts.backoff_max()),
                        sent_at,
                        first_deadline,
                        shared: shared.clone(),
                    };
                    let guard = LeaseGuard::new(
                        shared,
                        self.inner.clone(),
                        id,
                        opts.keep_for(),
                        opts.call_timeout(),
                    );
                    if !hb.register(reg) {
                        // Cannot happen while `inner` holds the sender; treat as lost.
                        return Err(Error::unexpected("client", "heartbeat task stopped"));
                    }
                    tracing::info!(fencing = fencing.get(), "acquired");
                    Ok(TryAcquire::Acquired(guard))
                }
            }
        }
        .instrument(span)
        .await
    }

    fn spawn_cleanup(&self, name: LeaseName, owner: Owner, call_timeout: Duration) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let _ = crate::guard::release_on_store(
                &inner,
                &name,
                &owner.token,
                Duration::ZERO,
                call_timeout,
            )
            .await;
        });
    }

    /// Takes `name`, waiting up to `opts.wait()` while someone else holds it.
    ///
    /// Between attempts it waits for the backend's release notification where the
    /// capabilities offer one, otherwise it polls with jittered exponential backoff. Store
    /// errors that may be retried are retried until the wait runs out.
    ///
    /// Errors: [`Error::StillHeld`] when the wait ran out while the lease was held; the
    /// last store error when the store failed until the end; any non-retryable error at once.
    pub async fn acquire(&self, name: impl AsRef<[u8]>, opts: &LeaseOptions) -> Result<LeaseGuard> {
        let name = LeaseName::new(name)?;
        self.acquire_name(&name, opts).await
    }

    async fn acquire_name(&self, name: &LeaseName, opts: &LeaseOptions) -> Result<LeaseGuard> {
        let start = Instant::now();
        let deadline = start + opts.wait();
        let mut attempt = 0u32;
        loop {
            let held = match self.try_acquire_name(name, opts).await {
                Ok(TryAcquire::Acquired(g)) => return Ok(g),
                Ok(TryAcquire::Held(by)) => Ok(by),
                Err(e) if e.is_retryable() => Err(e),
                Err(e) => return Err(e),
            };
            let now = Instant::now();
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
            let left = deadline - now;
            let pause = backoff_delay(opts.backoff_min(), opts.backoff_max(), attempt).min(left);
            attempt = attempt.saturating_add(1);
            match &held {
                Ok(by) if self.inner.caps.release_notification => {
                    // Sleep until a release notification, the holder's expiry or our
                    // deadline, whichever is first.
                    let max = by.remaining.map_or(left, |r| r.min(left));
                    let waited = tokio::time::timeout(
                        max + opts.call_timeout(),
                        self.inner.backend.wait_released(name, max),
                    )
                    .await;
                    if !matches!(waited, Ok(Ok(()))) {
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
    /// the work completes the lease is released (honouring keep-for).
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

    /// Reads the current holder of `name` from the store.
    pub async fn inspect(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>> {
        let name = LeaseName::new(name)?;
        self.inspect_with_timeout(&name, Duration::from_secs(5))
            .await
    }

    /// Reads the current holder of `name`, bounded by `timeout`.
    pub async fn inspect_with_timeout(
        &self,
        name: &LeaseName,
        timeout: Duration,
    ) -> Result<Option<LeaseInfo>> {
        match tokio::time::timeout(timeout, self.inner.backend.inspect(name)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                operation: "inspect",
                after: timeout,
            }),
        }
    }
}

/// Runs `work` under `guard`, cancelling it when the lease is lost, then releases.
pub(crate) async fn run_with_guard<F, Fut, T>(guard: LeaseGuard, work: F) -> RunOutcome<T>
where
    F: FnOnce(LeaseContext) -> Fut,
    Fut: Future<Output = T>,
{
    let ctx = LeaseContext {
        name: guard.name().clone(),
        fencing: guard.fencing(),
        lost: guard.lost_token(),
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
    // Errors are logged by `release`; the lease lapses at its TTL if it fails.
    let _ = guard.release().await;
    outcome
}
