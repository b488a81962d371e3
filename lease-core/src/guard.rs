//! [`LeaseGuard`]: a held lease, kept alive by the client's heartbeat.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::LeaseBackend;
use crate::error::Result;
use crate::heartbeat::{Command, HeartbeatHandle};
use crate::shared::{GuardShared, LossReason};
use crate::types::{
    FencingToken, HolderLabel, LeaseName, LeaseOptions, OwnerToken, ReleaseOutcome,
};
use crate::util::in_span;

/// A held lease.
///
/// While the guard lives, the client's heartbeat renews the lease. The guard knows a
/// local safety deadline; if no renewal succeeds before it, or the store says the lease is
/// gone, the guard is *lost*: [`LeaseGuard::lost`] completes, [`LeaseGuard::lost_token`]
/// is cancelled and [`LeaseGuard::is_held`] turns false, before the store can hand the
/// lease to anyone else (on stores whose capabilities say
/// [`lost_before_taken`](crate::Capabilities::lost_before_taken); a Postgres advisory
/// lock is free the moment its holder's session ends, and the guard learns at its next
/// renewal). The deadline is enforced by the guard itself too, so the signal comes on
/// time even if the heartbeat has died or its runtime is not running.
///
/// Release with [`LeaseGuard::release`]: renewal stops first, then the lease is released
/// (or shortened to keep-for). Dropping the guard does the same in the background when a
/// tokio runtime is running; otherwise the lease lapses at its TTL.
#[must_use = "dropping the guard releases the lease"]
#[derive(Debug)]
pub struct LeaseGuard {
    shared: Arc<GuardShared>,
    store: Store,
    /// The heartbeat this lease is registered with (a client starts a new one if its
    /// heartbeat dies, so this is not necessarily the client's current one).
    heartbeat: Arc<HeartbeatHandle>,
    id: u64,
    /// The options the lease was taken with (keep-for and the call timeout of its
    /// release), carried whole.
    opts: LeaseOptions,
    armed: bool,
}

impl LeaseGuard {
    pub(crate) fn new(
        shared: Arc<GuardShared>,
        store: Store,
        heartbeat: Arc<HeartbeatHandle>,
        id: u64,
        opts: LeaseOptions,
    ) -> Self {
        LeaseGuard {
            shared,
            store,
            heartbeat,
            id,
            opts,
            armed: true,
        }
    }

    /// Sets the keep-for its release will ask for.
    pub(crate) fn set_keep_for(&mut self, keep_for: Duration) {
        self.opts = self
            .opts
            .clone()
            .with_keep_for(keep_for.min(crate::types::MAX_TTL));
    }

    /// The lease name.
    pub fn name(&self) -> &LeaseName {
        self.shared.name()
    }

    pub(crate) fn shared(&self) -> &Arc<GuardShared> {
        &self.shared
    }

    /// The fencing token of this acquisition. Pass it to the protected resource with every
    /// write; the resource rejects tokens lower than the highest it has seen.
    pub fn fencing(&self) -> FencingToken {
        self.shared.fencing()
    }

    /// The holder label stored with the lease.
    pub fn holder(&self) -> &HolderLabel {
        self.shared.holder()
    }

    /// The local safety deadline: if no renewal succeeds before it, the guard is lost.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// Whether the lease is still ours as far as this process can tell: not lost, not
    /// released, and the safety deadline not passed. Once `false`, always `false`.
    pub fn is_held(&self) -> bool {
        self.shared.held_at(Instant::now())
    }

    /// Completes when the lease is lost, with the reason; never while the lease is held.
    ///
    /// It fires at the safety deadline by its own timer even if the heartbeat has died or
    /// cannot run.
    ///
    /// Cancel safety: cancel-safe; it only waits.
    pub async fn lost(&self) -> LossReason {
        self.shared.wait_lost().await
    }

    /// A token cancelled when the lease is lost, and when the guard is released, dropped
    /// or disarmed (reason [`LossReason::Released`]); hand it to tasks that must stop
    /// then.
    ///
    /// The first call starts a small task on the current runtime that cancels the token
    /// at the safety deadline even if the heartbeat cannot.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.watch();
        self.shared.lost_token().clone()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss_reason()
    }

    /// Stops renewal, waits until no renewal is in flight (at most the call timeout, and
    /// 100 ms more if the heartbeat is not running), then releases the lease on the store
    /// (or shortens it to keep-for). The lost token is cancelled first, with
    /// [`LossReason::Released`] unless the lease was lost already.
    ///
    /// Returns [`ReleaseOutcome::NotOwner`] if the lease had already lapsed or been taken.
    /// If the store call fails, the error is returned and the release is sent again in the
    /// background: at once (up to three attempts while the error is retryable), and once
    /// more after the call timeout if those fail too.
    ///
    /// Cancel safety: cancel-safe. If the future is dropped before the store answered,
    /// the guard's drop releases in the background as if the guard had been dropped.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        let span = crate::util::span!(
            INFO,
            "lease.release",
            lease = %self.shared.name(),
            holder = %self.shared.holder(),
            fencing = self.shared.fencing().get(),
        );
        in_span(span, async {
            self.shared.set_released();
            self.shared.mark_lost(LossReason::Released);
            self.stop_renewal().await;
            let outcome = self
                .store
                .release(
                    self.shared.name(),
                    self.shared.token(),
                    self.opts.keep_for(),
                    self.opts.call_timeout(),
                )
                .await;
            self.armed = false;
            match &outcome {
                Ok(ReleaseOutcome::Released) => tracing::info!("released"),
                Ok(ReleaseOutcome::NotOwner) => {
                    tracing::warn!("release found the lease no longer ours")
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "release failed; trying again in the background, at once and after \
                         the call timeout, else the lease lapses at its TTL"
                    );
                    self.retry_release_later();
                }
            }
            outcome
        })
        .await
    }

    /// After a failed release (the store down, a pooled connection the store had closed,
    /// or its reply lost after it applied the release): the release again in the
    /// background at once (see [`Store::release_in_background`]), and if that fails too,
    /// once more after the call timeout, where a runtime exists.
    fn retry_release_later(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, shared) = (self.store.clone(), self.shared.clone());
        let (keep_for, call_timeout) = (self.opts.keep_for(), self.opts.call_timeout());
        let span = tracing::Span::current();
        rt.spawn(
            async move {
                let release = || {
                    store.release_in_background(
                        shared.name(),
                        shared.token(),
                        keep_for,
                        call_timeout,
                    )
                };
                let outcome = match release().await {
                    Ok(outcome) => Ok(outcome),
                    Err(_) => {
                        tokio::time::sleep(call_timeout).await;
                        release().await
                    }
                };
                match outcome {
                    Ok(outcome) => tracing::info!(?outcome, "release retried"),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "release failed again; the lease lapses at its TTL"
                    ),
                }
            }
            .instrument(span),
        );
    }

    /// Stops renewal and forgets the lease without releasing it: it stays taken until its
    /// TTL (or keep-for) runs out on the store. The lost token is cancelled.
    pub fn disarm(mut self) {
        self.armed = false;
        self.shared.set_released();
        self.shared.mark_lost(LossReason::Released);
        self.heartbeat.unregister_quiet(self.id);
    }

    /// Call after setting `released`: returns once no renewal of this lease is in flight
    /// and none can start (the heartbeat gives up on a renewal at the call timeout), or,
    /// if the heartbeat does not answer, after the call timeout and
    /// [`RENEWAL_ACK_GRACE`]. A renewal still in flight then (its heartbeat not running)
    /// can only be refused by the store once the release lands:
    /// a backend renews only a lease that is held by the token and not released.
    async fn stop_renewal(&self) {
        if !self.shared.is_in_flight() {
            self.heartbeat.unregister_quiet(self.id);
            return;
        }
        let (tx, rx) = oneshot::channel();
        if self.heartbeat.send(Command::Unregister {
            id: self.id,
            ack: Some(tx),
        }) {
            wait_for_renewal(rx, self.opts.call_timeout()).await;
        }
    }
}

/// How long past the call timeout a release waits for the heartbeat's word on a renewal
/// in flight.
///
/// The heartbeat bounds the renewal by the same call timeout, counted from its send,
/// which came before the release began waiting: a running heartbeat gives up on it, and
/// answers, by the end of the release's call timeout. But both timers can fire in the
/// same tick of the clock, and the release's task can run first; without this grace it
/// would then go on while the renewal is still in flight in the client (a renewal slower
/// than the call timeout, on a loaded machine, is enough). Only a heartbeat that is not
/// running keeps the release waiting the whole grace.
const RENEWAL_ACK_GRACE: Duration = Duration::from_millis(100);

/// Waits for the heartbeat's word that no renewal is in flight, for at most
/// `call_timeout` plus [`RENEWAL_ACK_GRACE`]. An error means the heartbeat task is gone:
/// nothing renews any more.
async fn wait_for_renewal(rx: oneshot::Receiver<()>, call_timeout: Duration) {
    let limit = call_timeout.saturating_add(RENEWAL_ACK_GRACE);
    if tokio::time::timeout(limit, rx).await.is_err() {
        tracing::warn!(
            timeout = ?limit,
            "a renewal is still in flight after the call timeout (the heartbeat is not \
             running); releasing anyway"
        );
    }
}

/// What a guard needs of the store: the backend and its short name.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    pub(crate) backend: Arc<dyn LeaseBackend>,
    /// The backend's short name ([`Capabilities::backend`](crate::Capabilities::backend)).
    pub(crate) backend_name: &'static str,
    /// The holder label of the client, for the spans of its calls.
    pub(crate) label: HolderLabel,
    /// The client's metrics series.
    pub(crate) series: crate::metrics::Series,
}

impl Store {
    /// Releases `name` held by `token`, bounded by `call_timeout`.
    pub(crate) async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
        call_timeout: Duration,
    ) -> Result<ReleaseOutcome> {
        let outcome = crate::util::call(
            crate::util::Site::new(self.backend_name, "release", name).owner(&self.label),
            call_timeout,
            self.backend.release(name, token, keep_for),
        )
        .await;
        self.series
            .release(name, crate::metrics::Outcome::outcome(&outcome));
        outcome
    }

    /// [`Store::release`] for releases nobody waits for (in the background): a failure a
    /// retry may cure (a pooled connection the store had closed, a moment of
    /// unavailability) is retried at once, up to [`BACKGROUND_RELEASE_ATTEMPTS`] attempts
    /// in all, 20 ms and then 40 ms apart. A release is safe to repeat: a second one finds
    /// the lease no longer this owner's and changes nothing.
    pub(crate) async fn release_in_background(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
        call_timeout: Duration,
    ) -> Result<ReleaseOutcome> {
        let mut pause = Duration::from_millis(20);
        let mut attempt = 1;
        loop {
            match self.release(name, token, keep_for, call_timeout).await {
                Err(e) if e.is_retryable() && attempt < BACKGROUND_RELEASE_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "background release failed; again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

/// How many times a release in the background is tried when it fails with a retryable
/// error (see [`Store::release_in_background`]).
pub(crate) const BACKGROUND_RELEASE_ATTEMPTS: u32 = 3;

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.set_released();
        self.shared.mark_lost(LossReason::Released);
        let wait = if self.shared.is_in_flight() {
            let (tx, rx) = oneshot::channel();
            self.heartbeat
                .send(Command::Unregister {
                    id: self.id,
                    ack: Some(tx),
                })
                .then_some(rx)
        } else {
            self.heartbeat.unregister_quiet(self.id);
            None
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(lease = %self.shared.name(), "guard dropped outside a runtime; the lease lapses at its TTL");
            return;
        };
        let store = self.store.clone();
        let shared = self.shared.clone();
        let keep_for = self.opts.keep_for();
        let call_timeout = self.opts.call_timeout();
        handle.spawn(async move {
            if let Some(rx) = wait {
                wait_for_renewal(rx, call_timeout).await;
            }
            match store
                .release_in_background(shared.name(), shared.token(), keep_for, call_timeout)
                .await
            {
                Ok(outcome) => tracing::debug!(
                    lease = %shared.name(),
                    holder = %shared.holder(),
                    ?outcome,
                    "guard dropped: released in the background"
                ),
                Err(e) => tracing::warn!(
                    lease = %shared.name(),
                    holder = %shared.holder(),
                    error = %e,
                    "guard dropped: background release failed; the lease lapses at its TTL"
                ),
            }
        });
    }
}
