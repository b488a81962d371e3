//! The in-memory reference backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::LeaseBackend;
use crate::error::{Error, Result};
use crate::types::{
    AcquireOutcome, Capabilities, HeldBy, LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome,
    RenewItem, RenewOutcome,
};

#[derive(Debug)]
struct Holder {
    token: OwnerToken,
    label: String,
    fencing: u64,
    locked_at: Instant,
    expires_at: Instant,
    released: bool,
}

#[derive(Debug, Default)]
struct Slot {
    /// Last fencing token handed out for this name; never goes back.
    counter: u64,
    holder: Option<Holder>,
    notify: Arc<Notify>,
}

impl Slot {
    /// The holder if its lease has not lapsed at `now`.
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }
}

/// A lease store inside this process: the reference implementation of every primitive.
///
/// Time is tokio's clock ([`tokio::time::Instant`]), so tests can run it under a paused
/// clock (`#[tokio::test(start_paused = true)]`) and expiry happens exactly when the
/// clock says. Fencing tokens never go back for as long as the backend lives. Clones share
/// the same store, so several clients in one process contend as if on a real server.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseClient, LeaseOptions, MemoryBackend, TryAcquire};
///
/// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
/// let opts = LeaseOptions::new(Duration::from_secs(5))?;
/// match client.try_acquire("report", &opts).await? {
///     TryAcquire::Acquired(guard) => {
///         println!("fencing token {}", guard.fencing());
///         guard.release().await?;
///     }
///     TryAcquire::Held(by) => println!("held by {by}"),
///     // `TryAcquire` is `#[non_exhaustive]`: outcomes may be added in a minor release.
///     _ => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    slots: Arc<Mutex<HashMap<LeaseName, Slot>>>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<LeaseName, Slot>> {
        // A poisoned mutex means a panic while holding it; the map itself is still
        // consistent (every mutation is a single assignment), so keep going.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn remaining(h: &Holder, now: Instant) -> Duration {
    h.expires_at.saturating_duration_since(now)
}

#[async_trait]
impl LeaseBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("memory").with_release_notification(true)
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let now = Instant::now();
        let mut slots = self.lock();
        let slot = slots.entry(name.clone()).or_default();
        if let Some(h) = slot.live_holder(now) {
            return Ok(AcquireOutcome::Held(HeldBy {
                holder: Some(h.label.clone()),
                remaining: Some(remaining(h, now)),
            }));
        }
        let expires_at = now
            .checked_add(ttl)
            .ok_or_else(|| Error::unexpected("memory", "ttl overflows the clock"))?;
        slot.counter += 1;
        slot.holder = Some(Holder {
            token: owner.token,
            label: owner.label.as_str().to_owned(),
            fencing: slot.counter,
            locked_at: now,
            expires_at,
            released: false,
        });
        Ok(AcquireOutcome::Acquired {
            fencing: crate::FencingToken(slot.counter),
            ttl,
        })
    }

    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        let now = Instant::now();
        let expires_at = now
            .checked_add(ttl)
            .ok_or_else(|| Error::unexpected("memory", "ttl overflows the clock"))?;
        let mut slots = self.lock();
        Ok(leases
            .iter()
            .map(|item| {
                let held = slots
                    .get_mut(&item.name)
                    .and_then(|s| s.holder.as_mut())
                    .filter(|h| h.expires_at > now && h.token == item.token && !h.released);
                match held {
                    Some(h) => {
                        h.expires_at = expires_at;
                        RenewOutcome::Renewed
                    }
                    None => RenewOutcome::Lost,
                }
            })
            .collect())
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let now = Instant::now();
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        let Some(h) = slot.holder.as_mut() else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        if h.expires_at <= now || h.token != *token || h.released {
            return Ok(ReleaseOutcome::NotOwner);
        }
        let keep_until = h.locked_at.checked_add(keep_for).unwrap_or(h.expires_at);
        if keep_until > now {
            h.expires_at = keep_until;
            h.released = true;
        } else {
            slot.holder = None;
            slot.notify.notify_waiters();
        }
        Ok(ReleaseOutcome::Released)
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let now = Instant::now();
        let slots = self.lock();
        Ok(slots
            .get(name)
            .and_then(|s| s.live_holder(now))
            .map(|h| LeaseInfo {
                holder: Some(h.label.clone()),
                fencing: Some(crate::FencingToken(h.fencing)),
                remaining: Some(remaining(h, now)),
            }))
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let now = Instant::now();
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(false);
        };
        let was_live = slot.live_holder(now).is_some();
        slot.holder = None;
        slot.notify.notify_waiters();
        Ok(was_live)
    }

    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        let (notify, expires_at) = {
            let now = Instant::now();
            let mut slots = self.lock();
            let slot = slots.entry(name.clone()).or_default();
            match slot.live_holder(now) {
                None => return Ok(()),
                Some(h) => (slot.notify.clone(), h.expires_at),
            }
        };
        // Expiry sends no notification, so never sleep past it.
        let until = Instant::now()
            .checked_add(max_wait)
            .map_or(expires_at, |t| t.min(expires_at));
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Re-check after registering, so a release between the check and now is not missed.
        {
            let now = Instant::now();
            let slots = self.lock();
            if slots.get(name).and_then(|s| s.live_holder(now)).is_none() {
                return Ok(());
            }
        }
        let _ = tokio::time::timeout_at(until, notified).await;
        Ok(())
    }
}
