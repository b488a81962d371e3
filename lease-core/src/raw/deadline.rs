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

use std::cell::Cell;
use std::future::Future;

use tokio::time::Instant;

thread_local! {
    /// The deadline of the call being polled on this thread: set by [`with_deadline`] for
    /// the span of each poll of the call and put back as it was after it. A thread-local
    /// `Cell` (const-initialised, nothing to drop) rather than a `tokio::task_local!`,
    /// whose scope borrows a `RefCell` and swaps an `Option` in and out on each poll: on
    /// every store call the client makes, that was the larger part of what this costs.
    static CALL_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// When the caller drops the store call being polled, if it bounds it by a timer of its
/// own: [`LeaseClient`](crate::LeaseClient) does, for every call. `None` outside such a
/// call (a backend called directly, or a task the backend spawned).
///
/// ```
/// assert!(lease_core::raw::deadline::caller_deadline().is_none());
/// ```
pub fn caller_deadline() -> Option<Instant> {
    CALL_DEADLINE.try_with(Cell::get).ok().flatten()
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

/// Polls `fut` with [`caller_deadline`] answering `deadline` while it is polled (not
/// while it is dropped, and not in a task it spawns).
///
/// Cancel-safe as `fut` is: dropping it drops `fut`.
pub(crate) async fn with_deadline<F: Future>(deadline: Instant, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        let _scope = Scope::enter(deadline);
        fut.as_mut().poll(cx)
    })
    .await
}

/// The deadline of one poll: set on entry, and what was there before (an outer call's,
/// or none) put back on drop, also when the poll unwinds.
struct Scope(Option<Instant>);

impl Scope {
    fn enter(deadline: Instant) -> Self {
        Scope(
            CALL_DEADLINE
                .try_with(|d| d.replace(Some(deadline)))
                .ok()
                .flatten(),
        )
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let before = self.0;
        let _ = CALL_DEADLINE.try_with(|d| d.set(before));
    }
}
