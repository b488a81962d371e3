//! [`LeaseGuard`]: a held lease, kept alive by the client's heartbeat.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::client::ClientInner;
use crate::error::Result;
use crate::heartbeat::{Command, HeartbeatHandle};
use crate::types::{FencingToken, HolderLabel, LeaseName, OwnerToken, ReleaseOutcome};

/// Why a guard stopped holding its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal succeeded before the local safety deadline (send time of the last
    /// successful renewal + TTL - margin). The store may give the lease away soon.
    DeadlinePassed,
    /// The store answered that the lease is no longer ours (it lapsed, was released by
    /// an operator, or the store lost it).
    NotOwner,
    /// The holder gave the lease up: the guard was released, dropped or disarmed, or the
    /// run it guarded ended. Tasks holding the lost token stop because the work is over.
    Released,
    /// The client's heartbeat task stopped (its runtime was shut down, or it panicked), so
    /// nothing renews the lease any more; the store frees it at its TTL.
    HeartbeatStopped,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::DeadlinePassed => {
                f.write_str("no renewal succeeded before the safety deadline")
            }
            LossReason::NotOwner => f.write_str("the store says the lease is no longer ours"),
            LossReason::Released => f.write_str("the holder released the lease"),
            LossReason::HeartbeatStopped => {
                f.write_str("the heartbeat that renews the lease has stopped")
            }
        }
    }
}

/// State shared between a guard, the heartbeat task and the guard's own deadline timer.
#[derive(Debug)]
pub(crate) struct GuardShared {
    name: LeaseName,
    token: OwnerToken,
    fencing: FencingToken,
    holder: HolderLabel,
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    released: AtomicBool,
    /// Set by the heartbeat while a renewal of this lease is in flight.
    in_flight: AtomicBool,
    /// Whether a task watching the deadline for [`LeaseGuard::lost_token`] was started.
    watched: AtomicBool,
    epoch: Instant,
    /// Local safety deadline in nanoseconds after `epoch`.
    deadline_nanos: AtomicU64,
}

impl GuardShared {
    pub(crate) fn new(
        name: LeaseName,
        token: OwnerToken,
        fencing: FencingToken,
        holder: HolderLabel,
        epoch: Instant,
    ) -> Self {
        GuardShared {
            name,
            token,
            fencing,
            holder,
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            released: AtomicBool::new(false),
            in_flight: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            epoch,
            deadline_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn name(&self) -> &LeaseName {
        &self.name
    }

    pub(crate) fn holder(&self) -> &HolderLabel {
        &self.holder
    }

    pub(crate) fn fencing(&self) -> FencingToken {
        self.fencing
    }

    pub(crate) fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn set_deadline(&self, deadline: Instant) {
        let nanos = deadline.saturating_duration_since(self.epoch).as_nanos();
        self.deadline_nanos
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Release);
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    pub(crate) fn set_in_flight(&self, on: bool) {
        self.in_flight.store(on, Ordering::SeqCst);
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.reason.get().copied()
    }

    /// Marks the lease lost for `reason`, unless it was lost for another reason already;
    /// `true` if this call marked it.
    pub(crate) fn mark_lost(&self, reason: LossReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        self.lost.cancel();
        first
    }

    /// Whether the lease still counts as held at `now`. Once the deadline has passed it
    /// is marked lost, so the answer never turns back to `true` when a late renewal moves
    /// the deadline.
    pub(crate) fn held_at(&self, now: Instant) -> bool {
        if self.is_lost() || self.is_released() {
            return false;
        }
        if now >= self.deadline() {
            self.mark_lost(LossReason::DeadlinePassed);
            return false;
        }
        true
    }

    /// Completes when the lease is lost: when the heartbeat (or a release) says so, or by
    /// this task's own timer at the safety deadline, whichever is first. So the signal
    /// does not depend on the heartbeat running.
    pub(crate) async fn wait_lost(&self) -> LossReason {
        loop {
            let deadline = self.deadline();
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => break,
                _ = tokio::time::sleep_until(deadline) => {
                    // A renewal may have moved the deadline while we slept.
                    if !self.held_at(Instant::now()) {
                        break;
                    }
                }
            }
        }
        self.loss_reason().unwrap_or(LossReason::DeadlinePassed)
    }

    /// Starts, once, a task on the current runtime that cancels the lost token at the
    /// deadline even if the heartbeat cannot; it ends when the lease is lost or released.
    fn watch(self: &Arc<Self>) {
        if self.watched.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let shared = self.clone();
            rt.spawn(async move {
                shared.wait_lost().await;
            });
        }
    }
}

/// A held lease.
///
/// While the guard lives, the client's heartbeat renews the lease. The guard knows a
/// local safety deadline; if no renewal succeeds before it, or the store says the lease is
/// gone, the guard is *lost*: [`LeaseGuard::lost`] completes, [`LeaseGuard::lost_token`]
/// is cancelled and [`LeaseGuard::is_held`] turns false, before the store can hand the
/// lease to anyone else. The deadline is enforced by the guard itself too, so the signal
/// comes on time even if the heartbeat has died or its runtime is not running.
///
/// Release with [`LeaseGuard::release`]: renewal stops first, then the lease is released
/// (or shortened to keep-for). Dropping the guard does the same in the background when a
/// tokio runtime is running; otherwise the lease lapses at its TTL.
#[must_use = "dropping the guard releases the lease"]
#[derive(Debug)]
pub struct LeaseGuard {
    shared: Arc<GuardShared>,
    client: Arc<ClientInner>,
    /// The heartbeat this lease is registered with (a client starts a new one if its
    /// heartbeat dies, so this is not necessarily the client's current one).
    heartbeat: Arc<HeartbeatHandle>,
    id: u64,
    keep_for: Duration,
    call_timeout: Duration,
    armed: bool,
}

impl LeaseGuard {
    pub(crate) fn new(
        shared: Arc<GuardShared>,
        client: Arc<ClientInner>,
        heartbeat: Arc<HeartbeatHandle>,
        id: u64,
        keep_for: Duration,
        call_timeout: Duration,
    ) -> Self {
        LeaseGuard {
            shared,
            client,
            heartbeat,
            id,
            keep_for,
            call_timeout,
            armed: true,
        }
    }

    /// The lease name.
    pub fn name(&self) -> &LeaseName {
        &self.shared.name
    }

    pub(crate) fn shared(&self) -> &Arc<GuardShared> {
        &self.shared
    }

    /// The fencing token of this acquisition. Pass it to the protected resource with every
    /// write; the resource rejects tokens lower than the highest it has seen.
    pub fn fencing(&self) -> FencingToken {
        self.shared.fencing
    }

    /// The holder label stored with the lease.
    pub fn holder(&self) -> &HolderLabel {
        &self.shared.holder
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
        self.shared.lost.clone()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss_reason()
    }

    /// Stops renewal, waits until no renewal is in flight (at most the call timeout), then
    /// releases the lease on the store (or shortens it to keep-for). The lost token is
    /// cancelled first, with [`LossReason::Released`] unless the lease was lost already.
    ///
    /// Returns [`ReleaseOutcome::NotOwner`] if the lease had already lapsed or been taken.
    /// If the store call fails, the error is returned and the release is sent once more in
    /// the background after the call timeout.
    ///
    /// Cancel safety: cancel-safe. If the future is dropped before the store answered,
    /// the guard's drop releases in the background as if the guard had been dropped.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        let span = tracing::info_span!(
            "lease.release",
            lease = %self.shared.name,
            holder = %self.shared.holder,
            fencing = self.shared.fencing.get(),
        );
        async {
            self.shared.released.store(true, Ordering::SeqCst);
            self.shared.mark_lost(LossReason::Released);
            self.stop_renewal().await;
            let outcome = release_on_store(
                &self.client,
                &self.shared.name,
                &self.shared.token,
                self.keep_for,
                self.call_timeout,
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
                        "release failed; trying once more in the background after the call \
                         timeout, else the lease lapses at its TTL"
                    );
                    self.retry_release_later();
                }
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// After a failed release (the store down, or its reply lost after it applied the
    /// release), one more release in the background after the call timeout, where a
    /// runtime exists.
    fn retry_release_later(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, shared) = (self.client.clone(), self.shared.clone());
        let (keep_for, call_timeout) = (self.keep_for, self.call_timeout);
        let span = tracing::Span::current();
        rt.spawn(
            async move {
                tokio::time::sleep(call_timeout).await;
                match release_on_store(&client, &shared.name, &shared.token, keep_for, call_timeout)
                    .await
                {
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
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.mark_lost(LossReason::Released);
        self.heartbeat.unregister_quiet(self.id);
    }

    /// Call after setting `released`: returns once no renewal of this lease is in flight
    /// and none can start, or after the call timeout. A renewal still in flight then (its
    /// heartbeat not running) can only be refused by the store once the release lands:
    /// a backend renews only a lease that is held by the token and not released.
    async fn stop_renewal(&self) {
        if !self.shared.in_flight.load(Ordering::SeqCst) {
            self.heartbeat.unregister_quiet(self.id);
            return;
        }
        let (tx, rx) = oneshot::channel();
        if self.heartbeat.send(Command::Unregister {
            id: self.id,
            ack: Some(tx),
        }) {
            wait_for_renewal(rx, self.call_timeout).await;
        }
    }
}

/// Waits for the heartbeat's word that no renewal is in flight, for at most
/// `call_timeout`. An error means the heartbeat task is gone: nothing renews any more.
async fn wait_for_renewal(rx: oneshot::Receiver<()>, call_timeout: Duration) {
    if tokio::time::timeout(call_timeout, rx).await.is_err() {
        tracing::warn!(
            timeout = ?call_timeout,
            "a renewal is still in flight after the call timeout (the heartbeat is not \
             running); releasing anyway"
        );
    }
}

pub(crate) async fn release_on_store(
    client: &ClientInner,
    name: &LeaseName,
    token: &OwnerToken,
    keep_for: Duration,
    call_timeout: Duration,
) -> Result<ReleaseOutcome> {
    crate::util::call(
        client.caps.backend,
        "release",
        call_timeout,
        client.backend.release(name, token, keep_for),
    )
    .await
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.released.store(true, Ordering::SeqCst);
        self.shared.mark_lost(LossReason::Released);
        let wait = if self.shared.in_flight.load(Ordering::SeqCst) {
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
            tracing::debug!(lease = %self.shared.name, "guard dropped outside a runtime; the lease lapses at its TTL");
            return;
        };
        let client = self.client.clone();
        let shared = self.shared.clone();
        let keep_for = self.keep_for;
        let call_timeout = self.call_timeout;
        handle.spawn(async move {
            if let Some(rx) = wait {
                wait_for_renewal(rx, call_timeout).await;
            }
            match release_on_store(&client, &shared.name, &shared.token, keep_for, call_timeout)
                .await
            {
                Ok(outcome) => tracing::debug!(
                    lease = %shared.name,
                    holder = %shared.holder,
                    ?outcome,
                    "guard dropped: released in the background"
                ),
                Err(e) => tracing::warn!(
                    lease = %shared.name,
                    holder = %shared.holder,
                    error = %e,
                    "guard dropped: background release failed; the lease lapses at its TTL"
                ),
            }
        });
    }
}
