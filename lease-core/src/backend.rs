//! The [`LeaseBackend`] trait: the atomic primitives a store must provide.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::types::{
    AcquireOutcome, Capabilities, LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome,
    RenewItem, RenewOutcome,
};

/// The atomic primitives of a lease store.
///
/// A backend implements only these; everything else (heartbeat, deadlines, retries,
/// waiting, guards, scheduling) is built once on top of them by
/// [`LeaseClient`](crate::LeaseClient). Every primitive must be **atomic on the store**:
/// its check and its effect happen as one step that no other client can interleave with.
///
/// **Time.** Expiry is decided by the store's clock only. A backend never compares the
/// client's wall clock with anything stored.
///
/// **Timeouts.** The client wraps every call in its per-call timeout; a backend should
/// still bound its own connection attempts so that no call hangs forever when used
/// directly. While the client polls a call, [`raw::deadline::caller_deadline`] gives
/// the instant its timer fires: a backend timer that would fire later may be left out
/// (one timer per call instead of two).
///
/// [`raw::deadline::caller_deadline`]: crate::raw::deadline::caller_deadline
///
/// **Names.** Every [`LeaseName`] (any bytes except NUL, 1 to 1024 bytes) must map to a
/// key of its own: no two names share a key, and no name can reach another name's key or
/// range (escape or encode separators, braces and non-UTF-8 bytes).
///
/// **A dropped acquire.** The future of [`acquire`](LeaseBackend::acquire) may be dropped
/// at any await point (a timeout around it, a `select!`), also after the store applied it.
/// One rule says who cleans up:
/// - [`LeaseClient`](crate::LeaseClient) does: it releases, by the abandoned call's owner
///   token, whatever an acquire it gave up on may have taken, in a task of its own. A
///   backend needs nothing more for callers that go through the client.
/// - A backend guarantees that what a dropped acquire took lapses at its TTL at the
///   latest (a lock bound to a session without a TTL: is freed when the abandoned call's
///   session ends, as the PostgreSQL advisory backend does). Where something of the backend's own would keep it alive longer (etcd: the
///   key is attached to a session lease that renewals of other keys keep alive), the
///   backend deletes it itself (the etcd backend records such keys and deletes them at
///   its next renewals).
/// - A backend may also release eagerly for callers that use it directly (the Redis
///   backend releases an acquire dropped in flight), but only ever by the abandoned call's
///   own owner token, so that it can never free a lease someone else took since.
///
/// The `lease-conformance` crate checks all of this against a real store
/// (`cancelled_acquires_leave_nothing_held`, `lost_acquire_reply_frees_the_name`).
#[async_trait]
pub trait LeaseBackend: Send + Sync + std::fmt::Debug {
    /// What this backend can do. Must be cheap and constant for the backend's lifetime.
    fn capabilities(&self) -> Capabilities;

    /// Takes `name` for `owner` for `ttl` if nobody holds it.
    ///
    /// Must guarantee:
    /// - if no unexpired lease exists for `name`, store `owner` (token and label) with an
    ///   expiry of the store's now + `ttl` (rounded up per the capabilities), and return
    ///   [`AcquireOutcome::Acquired`] with a fencing token strictly greater than every token
    ///   returned before for `name` (across release and expiry; across a store restart only
    ///   if the capabilities say [`Fencing::Durable`](crate::Fencing::Durable));
    /// - otherwise change nothing and return [`AcquireOutcome::Held`], with the holder's
    ///   label and remaining time where [`Capabilities::holder_info`] says so;
    /// - the check and the write are one atomic step on the store.
    ///
    /// Owner tokens are new for every acquisition, so an acquire that finds `name` held by
    /// `owner.token` itself can only be a re-sent request whose first run took the lease
    /// (a reply lost, a client library's own retry). A backend that knows the request may
    /// have been re-sent returns [`AcquireOutcome::Acquired`] for it (the lease is the
    /// caller's); never `Held` naming the caller for such a re-send.
    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome>;

    /// Extends every lease in `leases` that is still held by the given token to `ttl` from
    /// the store's now.
    ///
    /// Must guarantee:
    /// - the result has exactly one entry per input, in the same order;
    /// - an entry is [`RenewOutcome::Renewed`] only if the lease was unexpired, held by that
    ///   exact token, and not released (also not released with keep-for); otherwise it is
    ///   [`RenewOutcome::Lost`] and nothing is changed for it;
    /// - each entry is checked and extended atomically; the batch should cost one round trip
    ///   where the store allows it (the heartbeat sends all due leases in one call);
    /// - an empty batch returns an empty result.
    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>>;

    /// Gives up `name` if `token` holds it.
    ///
    /// Must guarantee:
    /// - if `token` holds the unexpired lease: with `keep_for` zero, free it now; with
    ///   `keep_for` non-zero, make it expire at the later of the store's now and
    ///   *acquisition time + keep_for* (ShedLock's lockAtLeastFor); either way it can no
    ///   longer be renewed, and [`ReleaseOutcome::Released`] is returned;
    /// - otherwise (expired, someone else's, released already) change nothing and return
    ///   [`ReleaseOutcome::NotOwner`];
    /// - the fencing sequence for `name` is kept (the next acquisition gets a greater token).
    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome>;

    /// The current holder of `name`, or `None` if it is free.
    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>>;

    /// Frees `name` whoever holds it: an operator's manual release (`lease release
    /// --force`). Returns `true` if a live lease was freed, `false` if it was free.
    ///
    /// Must guarantee: the fencing sequence for `name` is kept, and the former holder's
    /// next renewal answers [`RenewOutcome::Lost`]. The default returns
    /// [`Error::Unsupported`].
    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.capabilities().backend,
            what: "force release",
        })
    }

    /// Waits until `name` may have become free, or `max_wait` has passed, whichever comes
    /// first. Returning early without a release is allowed (the caller retries `acquire`).
    ///
    /// Only called when [`Capabilities::release_notification`] is set; the default returns
    /// [`Error::Unsupported`].
    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        let _ = (name, max_wait);
        Err(Error::Unsupported {
            backend: self.capabilities().backend,
            what: "release notification",
        })
    }
}

macro_rules! forward_backend {
    ($ty:ty) => {
        #[async_trait]
        impl<B: LeaseBackend + ?Sized> LeaseBackend for $ty {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            // The hot path hands the inner backend's future on as it is (no second box
            // and poll layer); the signature is the one `#[async_trait]` gives.
            fn acquire<'s, 'n, 'o, 'f>(
                &'s self,
                name: &'n LeaseName,
                owner: &'o Owner,
                ttl: Duration,
            ) -> Pin<Box<dyn Future<Output = Result<AcquireOutcome>> + Send + 'f>>
            where
                's: 'f,
                'n: 'f,
                'o: 'f,
                Self: 'f,
            {
                (**self).acquire(name, owner, ttl)
            }
            async fn renew(
                &self,
                leases: &[RenewItem],
                ttl: Duration,
            ) -> Result<Vec<RenewOutcome>> {
                (**self).renew(leases, ttl).await
            }
            fn release<'s, 'n, 't, 'f>(
                &'s self,
                name: &'n LeaseName,
                token: &'t OwnerToken,
                keep_for: Duration,
            ) -> Pin<Box<dyn Future<Output = Result<ReleaseOutcome>> + Send + 'f>>
            where
                's: 'f,
                'n: 'f,
                't: 'f,
                Self: 'f,
            {
                (**self).release(name, token, keep_for)
            }
            async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
                (**self).inspect(name).await
            }
            async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
                (**self).wait_released(name, max_wait).await
            }
            async fn force_release(&self, name: &LeaseName) -> Result<bool> {
                (**self).force_release(name).await
            }
        }
    };
}

forward_backend!(Arc<B>);
forward_backend!(Box<B>);
