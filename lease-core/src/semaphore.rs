//! A counting semaphore: at most N holders of one name at once, each with a lease of its
//! own.
//!
//! # How it works
//!
//! Permit `i` of name `jobs` is the lease named `jobs/permit/i` (`i` from 0 to N − 1). A
//! permit is taken by acquiring one of those leases, so each permit has its own owner
//! token, watchdog renewal, lost signal and fencing token (a counter per permit that grows
//! strictly, as every lease's does), and a crashed holder's permit expires at its TTL.
//! No two holders can hold the same slot, so there are never more than N holders: the
//! store's mutual exclusion, proved per backend by the conformance suite, is the whole
//! argument. It therefore works on every backend, custom ones included, with no code of
//! theirs.
//!
//! **Every participant must use the same N.** The permits are the slots, and a
//! participant that uses a larger N also takes the slots above the others' N: the bound
//! is then the largest N in use. To raise capacity, raise N everywhere (holders of the
//! old N keep their slots); to lower it, lower it everywhere and let the holders of the
//! slots above the new N finish.
//!
//! Round trips: a try takes one acquire per slot it tries, starting at a random slot (so
//! that contenders spread over the slots) and stopping at the first free one: 1 when
//! permits are plentiful, N when all are taken. A wait is woken by the store's release
//! notification of the slot that expires soonest or one other (where the capabilities
//! offer notification; each watched slot costs the store a subscription or a waiter
//! mark); it is never longer than the soonest expiry, nor, when more slots are held than
//! it watches, than the backoff pause. Without notification it polls with backoff.
//!
//! A plain lease of the semaphore's own name and its permits do not exclude each other:
//! `jobs` and `jobs/permit/0` are different leases.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{LeaseClient, TryAcquire};
use crate::error::{Error, InvalidInput, Result};
use crate::guard::LeaseGuard;
use crate::shared::LossReason;
use crate::types::{FencingToken, HeldBy, LeaseInfo, LeaseName, LeaseOptions};
use crate::util::{Site, backoff_delay, call};

/// Most permits a [`Semaphore`] may have. A full semaphore costs one round trip per
/// permit to try, so large counts are better served by a store's own counter.
pub const MAX_PERMITS: u32 = 1024;

/// N permits of one name, shared by every process that uses the same name and N.
///
/// ```
/// # async fn demo() -> lease_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseClient, LeaseOptions, MemoryBackend, Semaphore, TryPermit};
///
/// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
/// // A room of capacity 3.
/// let room = Semaphore::new(client, "room-42", 3)?;
/// let opts = LeaseOptions::new(Duration::from_secs(10))?;
/// let mut inside = Vec::new();
/// for _ in 0..3 {
///     match room.try_acquire(&opts).await? {
///         TryPermit::Acquired(p) => inside.push(p),
///         _ => unreachable!("three permits"),
///     }
/// }
/// assert!(matches!(room.try_acquire(&opts).await?, TryPermit::Full(_)));
/// assert_eq!(room.holders().await?.len(), 3);
/// inside.pop().unwrap().release().await?;
/// assert!(matches!(room.try_acquire(&opts).await?, TryPermit::Acquired(_)));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: LeaseClient,
    name: LeaseName,
    slots: Vec<LeaseName>,
}

/// How many held slots a waiter watches for a release at once.
const WATCHED_SLOTS: usize = 2;

/// [`Semaphore::try_slots`]' answer: the permit, or each held slot with its holder.
enum Tried {
    Acquired(Permit),
    Full(Vec<(usize, HeldBy)>),
}

/// A held permit: the lease of one slot, with its guard.
#[must_use = "dropping the permit releases it"]
#[derive(Debug)]
pub struct Permit {
    slot: u32,
    guard: LeaseGuard,
}

/// The answer of [`Semaphore::try_acquire`].
#[must_use = "dropping an acquired permit releases it"]
#[derive(Debug)]
#[non_exhaustive]
pub enum TryPermit {
    /// A permit was free and is now held.
    Acquired(Permit),
    /// Every permit is held; who holds them, where the store can tell.
    Full(Vec<HeldBy>),
}

/// One held permit as [`Semaphore::holders`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermitHolder {
    /// The slot (0 to N − 1).
    pub slot: u32,
    /// The slot's lease: holder, fencing token, remaining time.
    pub info: LeaseInfo,
}

impl Semaphore {
    /// A semaphore of `permits` permits named `name`, used through `client`.
    ///
    /// Errors: [`InvalidInput`] for zero permits, more than [`MAX_PERMITS`], or a name
    /// that is not a valid lease name once `/permit/N` is appended (at most
    /// [`LeaseName::MAX_LEN`] bytes in all).
    pub fn new(client: LeaseClient, name: impl AsRef<[u8]>, permits: u32) -> Result<Self> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(InvalidInput::Other(format!(
                "a semaphore needs 1 to {MAX_PERMITS} permits, not {permits}"
            ))
            .into());
        }
        let name = LeaseName::new(name)?;
        let slots = (0..permits)
            .map(|i| slot_name(&name, i))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Semaphore {
            client,
            name,
            slots,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }

    /// Its number of permits.
    pub fn permits(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// The lease name of permit `slot` (`NAME/permit/SLOT`), or `None` past N − 1.
    pub fn slot_name(&self, slot: u32) -> Option<&LeaseName> {
        self.slots.get(usize::try_from(slot).ok()?)
    }

    /// Tries once to take a permit: each slot at most once, starting at a random one; does
    /// not wait.
    ///
    /// Errors: the first error that is not retryable; a retryable error when some slot
    /// could not be asked and none of the others was free (then "full" would be a guess).
    ///
    /// Cancel safety: cancel-safe, as [`LeaseClient::try_acquire`]: a dropped call leaves
    /// no permit held without a guard beyond the call timeout plus one round trip.
    pub async fn try_acquire(&self, opts: &LeaseOptions) -> Result<TryPermit> {
        Ok(match self.try_slots(opts).await? {
            Tried::Acquired(p) => TryPermit::Acquired(p),
            Tried::Full(held) => TryPermit::Full(held.into_iter().map(|(_, by)| by).collect()),
        })
    }

    async fn try_slots(&self, opts: &LeaseOptions) -> Result<Tried> {
        let n = self.slots.len();
        let start = fastrand::usize(0..n);
        let mut held = Vec::with_capacity(n);
        let mut failed = None;
        for k in 0..n {
            let i = (start + k) % n;
            let Some(slot) = self.slots.get(i) else {
                continue;
            };
            match self.client.try_acquire(slot, opts).await {
                Ok(TryAcquire::Acquired(guard)) => {
                    return Ok(Tried::Acquired(Permit {
                        slot: u32::try_from(i).unwrap_or(u32::MAX),
                        guard,
                    }));
                }
                Ok(TryAcquire::Held(by)) => held.push((i, by)),
                Err(e) if e.is_retryable() => failed = Some(e),
                Err(e) => return Err(e),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(Tried::Full(held)),
        }
    }

    /// Takes a permit, waiting up to `opts.wait()` while all are held.
    ///
    /// Between tries it waits for a release notification of any slot where the store
    /// offers one (and at most until the soonest expiry it was told of), and otherwise
    /// polls with jittered exponential backoff.
    ///
    /// Errors: [`Error::StillHeld`] (retryable) when the wait ran out with every permit
    /// held; the last store error when the store failed until the end; any error that is
    /// not retryable at once.
    ///
    /// Cancel safety: cancel-safe, as [`Semaphore::try_acquire`].
    pub async fn acquire(&self, opts: &LeaseOptions) -> Result<Permit> {
        let start = Instant::now();
        let deadline = start + opts.wait();
        let mut attempt = 0u32;
        // Counted in `lease_waiters` (under the semaphore's name) from the first refusal
        // until this call ends.
        let mut waiting: Option<crate::metrics::Waiting> = None;
        loop {
            let full = match self.try_slots(opts).await {
                Ok(Tried::Acquired(p)) => return Ok(p),
                Ok(Tried::Full(held)) => Ok(held),
                Err(e) if e.is_retryable() => Err(e),
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                return match full {
                    Ok(held) => Err(Error::StillHeld {
                        name: self.name.to_string_lossy(),
                        waited: now - start,
                        holder: held.into_iter().find_map(|(_, b)| b.holder),
                    }),
                    Err(e) => Err(e),
                };
            }
            if waiting.is_none() {
                waiting = Some(crate::metrics::Waiting::new(
                    self.client.capabilities().backend,
                    &self.name,
                ));
            }
            let left = deadline - now;
            let pause = backoff_delay(opts.backoff_min(), opts.backoff_max(), attempt).min(left);
            attempt = attempt.saturating_add(1);
            let soonest = match &full {
                Ok(held) => held
                    .iter()
                    .filter_map(|(i, b)| b.remaining.map(|r| (r, *i)))
                    .min(),
                Err(_) => None,
            };
            match &full {
                Ok(held) if self.client.capabilities().release_notification => {
                    // Watching every held slot, the wait may last until the soonest expiry
                    // (at least the minimum backoff: a holder at its expiry reports no
                    // time left, and the store's wait then returns at once). Watching only
                    // some, a release or an expiry of another slot is seen only at the
                    // next try: then the wait lasts no longer than the backoff pause (a
                    // store that does not report other holders' remaining time, such as
                    // etcd, would otherwise wait out the whole `wait` on the wrong slots).
                    let until_expiry = soonest
                        .map_or(left, |(r, _)| r.max(opts.backoff_min()))
                        .min(left);
                    let max = if held.len() <= WATCHED_SLOTS {
                        until_expiry
                    } else {
                        until_expiry.min(pause)
                    };
                    if !self.wait_some_released(held, soonest, max, opts).await {
                        tokio::time::sleep(pause).await;
                    }
                }
                Ok(_) => {
                    let pause =
                        soonest.map_or(pause, |(r, _)| pause.min(r.max(opts.backoff_min())));
                    tokio::time::sleep(pause).await;
                }
                Err(_) => tokio::time::sleep(pause).await,
            }
        }
    }

    /// Waits until one of at most [`WATCHED_SLOTS`] held slots is released, or `max`
    /// passes: the slot that expires soonest and others picked at random (each watched
    /// slot costs the store a subscription or a waiter mark, so a full semaphore of many
    /// permits with many waiters must not watch them all; a release elsewhere is seen at
    /// the next try, at most `max` later). False when the store's waits failed.
    async fn wait_some_released(
        &self,
        held: &[(usize, HeldBy)],
        soonest: Option<(Duration, usize)>,
        max: Duration,
        opts: &LeaseOptions,
    ) -> bool {
        let mut watched: Vec<usize> = soonest.map(|(_, i)| i).into_iter().collect();
        let mut others: Vec<usize> = held
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| !watched.contains(i))
            .collect();
        fastrand::shuffle(&mut others);
        let room = WATCHED_SLOTS.saturating_sub(watched.len());
        watched.extend(others.into_iter().take(room));
        let backend = self.client.backend().clone();
        let name = self.client.capabilities().backend;
        let bound = max + opts.call_timeout();
        // Each wait as the client makes every call: bounded, a panic an error.
        let waits: Vec<Pin<Box<dyn Future<Output = Result<()>> + Send>>> = watched
            .iter()
            .filter_map(|i| self.slots.get(*i).cloned())
            .map(|slot| {
                let backend = backend.clone();
                let owner = self.client.label().clone();
                Box::pin(async move {
                    call(
                        Site::new(name, "wait_released", &slot).owner(&owner),
                        bound,
                        backend.wait_released(&slot, max),
                    )
                    .await
                }) as Pin<Box<dyn Future<Output = Result<()>> + Send>>
            })
            .collect();
        first_ok(waits).await
    }

    /// The permits held now, by slot, read from the store (one inspect per slot, bounded
    /// by 5 s each).
    ///
    /// Cancel safety: cancel-safe; it only reads.
    pub async fn holders(&self) -> Result<Vec<PermitHolder>> {
        let mut out = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(info) = self.client.inspect(slot).await? {
                out.push(PermitHolder {
                    slot: u32::try_from(i).unwrap_or(u32::MAX),
                    info,
                });
            }
        }
        Ok(out)
    }
}

/// Resolves when the first future succeeds (true), or when all have failed (false).
async fn first_ok(mut waits: Vec<Pin<Box<dyn Future<Output = Result<()>> + Send>>>) -> bool {
    while !waits.is_empty() {
        let (result, _, rest) = futures::future::select_all(waits).await;
        if result.is_ok() {
            return true;
        }
        waits = rest;
    }
    false
}

fn slot_name(name: &LeaseName, slot: u32) -> std::result::Result<LeaseName, InvalidInput> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.extend_from_slice(format!("/permit/{slot}").as_bytes());
    LeaseName::new(bytes)
}

impl Permit {
    /// The slot this permit holds (0 to N − 1).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The permit's fencing token: it grows strictly per slot, so a resource shared by
    /// all holders must compare it per slot (keep one fence per permit, named by
    /// [`Permit::fence_resource`]): the tokens of two slots are unrelated, and one fence
    /// for all would refuse a current holder whose slot's count is behind another's.
    pub fn fencing(&self) -> FencingToken {
        self.guard.fencing()
    }

    /// The name of this permit's fence for the protected resource `resource`:
    /// `RESOURCE/permit/SLOT`. A resource fenced by permits keeps one fence per slot
    /// (a row of a fence table, a fence key), and a holder writes through its slot's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lease_core::Error> {
    /// use std::{sync::Arc, time::Duration};
    /// use lease_core::{LeaseClient, LeaseOptions, MemoryBackend, Semaphore, TryPermit};
    /// use lease_core::fence::Fence;
    ///
    /// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
    /// let pool = Semaphore::new(client, "exporters", 2)?;
    /// let opts = LeaseOptions::new(Duration::from_secs(10))?;
    /// let TryPermit::Acquired(permit) = pool.try_acquire(&opts).await? else { unreachable!() };
    /// assert_eq!(permit.fence_resource("s3-export"), format!("s3-export/permit/{}", permit.slot()));
    /// let fences = [Fence::new("s3-export/permit/0"), Fence::new("s3-export/permit/1")];
    /// fences[permit.slot() as usize].check(permit.fencing())?;
    /// # Ok(()) }
    /// ```
    pub fn fence_resource(&self, resource: &str) -> String {
        format!("{resource}/permit/{}", self.slot)
    }

    /// The lease guard of the slot: its deadline, lost signal and release.
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// The lease guard, for the functions that take one.
    pub fn into_guard(self) -> LeaseGuard {
        self.guard
    }

    /// Whether the permit is still held, as far as this process knows (see
    /// [`LeaseGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the permit is lost (see [`LeaseGuard::lost`]).
    ///
    /// Cancel safety: cancel-safe; it only waits.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// Gives the permit back (see [`LeaseGuard::release`]).
    ///
    /// Cancel safety: as [`LeaseGuard::release`].
    pub async fn release(self) -> Result<crate::types::ReleaseOutcome> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;
    use std::sync::Arc;

    fn client() -> LeaseClient {
        LeaseClient::new(Arc::new(MemoryBackend::new()))
    }

    #[test]
    fn permits_and_names_are_checked() {
        assert!(Semaphore::new(client(), "x", 0).is_err());
        assert!(Semaphore::new(client(), "x", MAX_PERMITS + 1).is_err());
        assert!(Semaphore::new(client(), "", 3).is_err());
        let long = vec![b'a'; LeaseName::MAX_LEN - "/permit/9".len()];
        assert!(Semaphore::new(client(), &long, 3).is_ok());
        assert!(Semaphore::new(client(), &long, 100).is_err());
        let s = Semaphore::new(client(), "room", 3).unwrap();
        assert_eq!(s.permits(), 3);
        assert_eq!(s.slot_name(2).unwrap().as_bytes(), b"room/permit/2");
        assert!(s.slot_name(3).is_none());
    }
}
