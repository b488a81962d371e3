//! The state of one held lease shared by its guard, the heartbeat and the guard's own
//! deadline timer, and why a lease stops being held.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::types::{FencingToken, HolderLabel, LeaseName, OwnerToken};

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
    /// The client's metrics series (with the backend's short name).
    series: crate::metrics::Series,
    name: LeaseName,
    token: OwnerToken,
    fencing: FencingToken,
    holder: HolderLabel,
    /// Set once, when the lease is lost (or released).
    lost: AtomicBool,
    /// Wakes [`Self::wait_lost`] when `lost` is set.
    lost_notify: Notify,
    /// The token [`LeaseGuard::lost_token`] hands out, made on its first call: most
    /// guards never need one, and making and cancelling a `CancellationToken` (a shared
    /// allocation and its lock) was a measurable part of every acquire + release.
    lost_token: OnceLock<CancellationToken>,
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
    /// Counted in the `lease_held` gauge until it is lost or released (or dropped).
    pub(crate) fn new(
        series: crate::metrics::Series,
        name: LeaseName,
        token: OwnerToken,
        fencing: FencingToken,
        holder: HolderLabel,
        epoch: Instant,
    ) -> Self {
        series.held(&name, 1.0);
        GuardShared {
            series,
            name,
            token,
            fencing,
            holder,
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
            lost_token: OnceLock::new(),
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

    pub(crate) fn token(&self) -> &OwnerToken {
        &self.token
    }

    pub(crate) fn holder(&self) -> &HolderLabel {
        &self.holder
    }

    pub(crate) fn fencing(&self) -> FencingToken {
        self.fencing
    }

    /// The lost token, made on the first call; cancelled at once if the lease is lost
    /// already, and by [`Self::mark_lost`] otherwise.
    pub(crate) fn lost_token(&self) -> &CancellationToken {
        let token = self.lost_token.get_or_init(CancellationToken::new);
        // Pairs with the fence in `mark_lost`: either it sees this token, or this sees
        // `lost` set, so the token is cancelled either way.
        fence(Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            token.cancel();
        }
        token
    }

    pub(crate) fn set_deadline(&self, deadline: Instant) {
        let nanos = deadline.saturating_duration_since(self.epoch).as_nanos();
        self.deadline_nanos
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Release);
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }

    /// Marks the lease released by its holder (before renewal is stopped; see
    /// `start_due` in the heartbeat for the order of the two flags).
    pub(crate) fn set_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
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
        self.lost.store(true, Ordering::SeqCst);
        // Pairs with the fence in `lost_token`.
        fence(Ordering::SeqCst);
        if let Some(token) = self.lost_token.get() {
            token.cancel();
        }
        self.lost_notify.notify_waiters();
        if first {
            self.series.held(&self.name, -1.0);
            // The `reason` label of `lease_losses_total`; a release is not a loss.
            let label = match reason {
                LossReason::DeadlinePassed => Some("deadline_passed"),
                LossReason::NotOwner => Some("not_owner"),
                LossReason::HeartbeatStopped => Some("heartbeat_stopped"),
                LossReason::Released => None,
            };
            if let Some(label) = label {
                self.series.loss(&self.name, label);
            }
        }
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
            // Registered before `lost` is read, so a loss marked in between still wakes it.
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                break;
            }
            let deadline = self.deadline();
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => {
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
    pub(crate) fn watch(self: &Arc<Self>) {
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

impl Drop for GuardShared {
    fn drop(&mut self) {
        // Never marked lost or released (a registration that did not take): uncount it.
        if self.reason.get().is_none() {
            self.series.held(&self.name, -1.0);
        }
    }
}
