//! [`LeaseGuard`]: a held lease, kept alive by the client's heartbeat.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::heartbeat::Command;
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
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::DeadlinePassed => {
                f.write_str("no renewal succeeded before the safety deadline")
            }
            LossReason::NotOwner => f.write_str("the store says the lease is no longer ours"),
        }
    }
}

/// State shared between a guard and the heartbeat task.
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
            epoch,
            deadline_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn holder(&self) -> &HolderLabel {
        &self.holder
    }

    pub(crate) fn fencing(&self) -> FencingToken {
        self.fencing
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

    pub(crate) fn set_in_flight(&self, on: bool) {
        self.in_flight.store(on, Ordering::SeqCst);
    }

    pub(crate) fn mark_lost(&self, reason: LossReason) {
        let _ = self.reason.set(reason);
        self.lost.cancel();
    }
}

/// A held lease.
///
/// While the guard lives, the client's heartbeat renews the lease. The guard knows a
/// local safety deadline; if no renewal succeeds before it, or the store says the lease is
/// gone, the guard is *lost*: [`LeaseGuard::lost`] completes, [`LeaseGuard::lost_token`]
/// is cancelled and [`LeaseGuard::is_held`] turns false, before the store can hand the
/// lease to anyone else.
///
/// Release with [`LeaseGuard::release`]: renewal stops first, then the lease is released
/// (or shortened to keep-for). Dropping the guard does the same in the background when a
/// tokio runtime is running; otherwise the lease lapses at its TTL.
#[must_use = "dropping the guard releases the lease"]
#[derive(Debug)]
pub struct LeaseGuard {
    shared: Arc<GuardShared>,
    client: Arc<ClientInner>,
    id: u64,
    keep_for: Duration,
    call_timeout: Duration,
    armed: bool,
}

impl LeaseGuard {
    pub(crate) fn new(
        shared: Arc<GuardShared>,
        client: Arc<ClientInner>,
        id: u64,
        keep_for: Duration,
        call_timeout: Duration,
    ) -> Self {
        LeaseGuard {
            shared,
            client,
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
    /// released, and the safety deadline not passed.
    pub fn is_held(&self) -> bool {
        !self.shared.lost.is_cancelled()
            && !self.shared.released.load(Ordering::SeqCst)
            && Instant::now() < self.shared.deadline()
    }

    /// Completes when the lease is lost, with the reason. Never completes while the lease
    /// is held; after a release it stays pending.
    pub async fn lost(&self) -> LossReason {
        self.shared.lost.cancelled().await;
        self.shared
            .reason
            .get()
            .copied()
            .unwrap_or(LossReason::DeadlinePassed)
    }

    /// A token cancelled when the lease is lost; hand it to work that should stop then.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.clone()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.reason.get().copied()
    }

    /// Stops renewal, waits until no renewal is in flight, then releases the lease on the
    /// store (or shortens it to keep-for).
    ///
    /// Returns [`ReleaseOutcome::NotOwner`] if the lease had already lapsed or been taken.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        let span = tracing::info_span!(
            "lease.release",
            lease = %self.shared.name,
            holder = %self.shared.holder,
            fencing = self.shared.fencing.get(),
        );
        async {
            self.shared.released.store(true, Ordering::SeqCst);
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
                Err(e) => tracing::warn!(error = %e, "release failed; the lease lapses at its TTL"),
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// Stops renewal and forgets the lease without releasing it: it stays taken until its
    /// TTL (or keep-for) runs out on the store.
    pub fn disarm(mut self) {
        self.armed = false;
        self.shared.released.store(true, Ordering::SeqCst);
        self.client.unregister_quiet(self.id);
    }

    /// Call after setting `released`: returns once no renewal of this lease is in flight
    /// and none can start.
    async fn stop_renewal(&self) {
        if !self.shared.in_flight.load(Ordering::SeqCst) {
            self.client.unregister_quiet(self.id);
            return;
        }
        let (tx, rx) = oneshot::channel();
        if self.client.send(Command::Unregister {
            id: self.id,
            ack: Some(tx),
        }) {
            // An error means the heartbeat task is gone: nothing is renewing any more.
            let _ = rx.await;
        }
    }
}

pub(crate) async fn release_on_store(
    client: &ClientInner,
    name: &LeaseName,
    token: &OwnerToken,
    keep_for: Duration,
    call_timeout: Duration,
) -> Result<ReleaseOutcome> {
    match tokio::time::timeout(call_timeout, client.backend.release(name, token, keep_for)).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            operation: "release",
            after: call_timeout,
        }),
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.released.store(true, Ordering::SeqCst);
        let wait = if self.shared.in_flight.load(Ordering::SeqCst) {
            let (tx, rx) = oneshot::channel();
            self.client
                .send(Command::Unregister {
                    id: self.id,
                    ack: Some(tx),
                })
                .then_some(rx)
        } else {
            self.client.unregister_quiet(self.id);
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
                let _ = rx.await;
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
