//! The caller's deadline for the store call being polled.
//!
//! [`LeaseClient`](crate::LeaseClient) bounds every call it makes to a backend by its own
//! timer (the lease's call timeout) and drops the backend's future when that fires. A
//! backend that also bounds each call by a timer of its own pays for two timers per
//! call, where the one that fires first is all that matters. While the client polls a
//! backend's future, [`caller_deadline`] says when the client's timer fires, so that a
//! backend whose own deadline would come later can leave its timer out. Called directly
//! (not through the client), a backend sees `None` and keeps its own bound.
//!
//! A backend that leaves its timer out this way must not depend on reaching its own
//! timeout path: the call ends by being dropped instead, so state kept for the next call
//! (say, "the connection answered last time") is updated by a drop guard, not after an
//! `.await` that never returns.

use std::future::Future;

use tokio::time::Instant;

tokio::task_local! {
    static CALL_DEADLINE: Instant;
}

/// When the caller drops the store call being polled, if it bounds it by a timer of its
/// own: [`LeaseClient`](crate::LeaseClient) does, for every call. `None` outside such a
/// call (a backend called directly, or a task the backend spawned).
///
/// ```
/// assert!(lease_core::raw::deadline::caller_deadline().is_none());
/// ```
pub fn caller_deadline() -> Option<Instant> {
    CALL_DEADLINE.try_with(|d| *d).ok()
}

/// Whether a timer of the backend's own, firing at `own`, may be left out of the call
/// being polled: the caller drops the call at or before `own` anyway.
pub fn caller_bounds(own: Instant) -> bool {
    caller_deadline().is_some_and(|d| d <= own)
}

/// `fut` bounded by a timer of the backend's own firing at `deadline`, or, where the
/// caller drops the call no later than that ([`caller_bounds`]), `fut` alone: one timer
/// per call either way. `None` when the backend's own timer fired.
///
/// Cancel safety: as `fut`'s; dropping this drops `fut`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use lease_core::raw::deadline::within;
///
/// let soon = tokio::time::Instant::now() + Duration::from_millis(10);
/// assert_eq!(within(soon, async { 7 }).await, Some(7));
/// assert_eq!(within(soon, std::future::pending::<()>()).await, None);
/// # }
/// ```
///
/// Not an `async fn`: the choice is made when it is called (inside the backend's future,
/// where [`caller_deadline`] answers), and the future it returns is no larger than
/// `fut` with a timer (an `async fn` would hold `fut` twice, as its argument and inside
/// the timer; a backend's call future is large, and every byte of it is copied when the
/// trait boxes it).
pub fn within<F: Future>(deadline: Instant, fut: F) -> impl Future<Output = Option<F::Output>> {
    use futures::FutureExt;
    use futures::future::Either;
    if caller_bounds(deadline) {
        Either::Left(fut.map(Some))
    } else {
        Either::Right(tokio::time::timeout_at(deadline, fut).map(Result::ok))
    }
}

/// Polls `fut` with [`caller_deadline`] answering `deadline`.
pub(crate) fn with_deadline<F: Future>(
    deadline: Instant,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<Instant, F> {
    CALL_DEADLINE.scope(deadline, fut)
}
