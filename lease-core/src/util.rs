//! Small helpers shared by the client and the heartbeat.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::metrics::Outcome;
use crate::types::{HolderLabel, LeaseName};

/// Where a store call comes from, for its span: the backend, the operation, the lease
/// (none for a renewal batch, which gives its size instead) and the owner's label.
#[derive(Clone, Copy)]
pub(crate) struct Site<'a> {
    pub(crate) backend: &'static str,
    pub(crate) operation: &'static str,
    pub(crate) lease: Option<&'a LeaseName>,
    pub(crate) owner: Option<&'a HolderLabel>,
    pub(crate) leases: Option<usize>,
}

impl<'a> Site<'a> {
    /// A call on one lease.
    pub(crate) fn new(
        backend: &'static str,
        operation: &'static str,
        lease: &'a LeaseName,
    ) -> Self {
        Site {
            backend,
            operation,
            lease: Some(lease),
            owner: None,
            leases: None,
        }
    }

    /// The same, made for `owner`.
    pub(crate) fn owner(mut self, owner: &'a HolderLabel) -> Self {
        self.owner = Some(owner);
        self
    }
}

/// Whether a span at `level` could be seen: a `tracing` subscriber enables that level
/// somewhere, or a `log` logger does (while no subscriber is set, `tracing` with its `log`
/// feature, which dependencies such as sqlx turn on, writes spans to `log`). Where
/// neither is so, a span made by `tracing`'s macros is disabled but still records its
/// fields and checks the `log` level again when dropped: on every store call, a
/// measurable part of the client's own work. [`span!`](crate::util::span) makes none then.
pub(crate) fn spans_seen(level: tracing::Level) -> bool {
    if tracing::level_filters::LevelFilter::current() >= level {
        return true;
    }
    let level = match level {
        tracing::Level::ERROR => log::Level::Error,
        tracing::Level::WARN => log::Level::Warn,
        tracing::Level::INFO => log::Level::Info,
        tracing::Level::DEBUG => log::Level::Debug,
        tracing::Level::TRACE => log::Level::Trace,
    };
    log::max_level() >= level
}

/// `tracing::span!(Level::$level, ...)` where [`spans_seen`] says it could be seen, and
/// `Span::none()` otherwise: for the spans of every store call.
macro_rules! span {
    ($level:ident, $($rest:tt)*) => {
        if $crate::util::spans_seen(tracing::Level::$level) {
            tracing::span!(tracing::Level::$level, $($rest)*)
        } else {
            tracing::Span::none()
        }
    };
}
pub(crate) use span;

/// `fut` inside `span` where a subscriber collects the span, and `fut` alone otherwise:
/// a disabled span entered and left on every poll, and dropped at the end, still costs
/// something on every store call (with `tracing`'s `log` feature, which a dependency such
/// as sqlx may turn on, a check of the `log` level per enter and per exit). Events inside
/// `fut` are emitted either way.
///
/// Cancel-safe as `fut` is: dropping it drops `fut`.
pub(crate) fn in_span<F: Future>(
    span: tracing::Span,
    fut: F,
) -> futures::future::Either<tracing::instrument::Instrumented<F>, F> {
    if span.is_disabled() {
        futures::future::Either::Right(fut)
    } else {
        futures::future::Either::Left(fut.instrument(span))
    }
}

/// One call to a backend, as the client makes every call: bounded by `timeout`, and with
/// a panic inside the backend's future turned into [`Error::Panicked`] instead of
/// unwinding through the caller (the heartbeat task above all). Each call is a debug
/// span `lease.store` with the fields `backend`, `op`, `lease`, `owner` (the holder
/// label), `leases` (a renewal batch's size), and, when it ends, `outcome` (a reply's
/// word, or the [error kind](Error::kind)) and `duration_ms`. No field carries a secret:
/// names and labels are the caller's, never a URL or a credential.
///
/// Cancel-safe in the sense that dropping it drops the backend's future; what the store
/// may have applied by then is the caller's to clean up.
pub(crate) async fn call<T: Outcome>(
    site: Site<'_>,
    timeout: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    // Where no span could be seen, none is made, cloned, recorded or dropped.
    if !spans_seen(tracing::Level::DEBUG) {
        return bounded(site, timeout, fut).await;
    }
    let span = tracing::span!(
        tracing::Level::DEBUG,
        "lease.store",
        backend = site.backend,
        op = site.operation,
        lease = tracing::field::Empty,
        owner = tracing::field::Empty,
        leases = tracing::field::Empty,
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    // Read only where the span records it: a clock read is a measurable part of a call.
    let started = (!span.is_disabled()).then(Instant::now);
    if !span.is_disabled() {
        if let Some(lease) = site.lease {
            span.record("lease", tracing::field::display(lease));
        }
        if let Some(owner) = site.owner {
            span.record("owner", tracing::field::display(owner));
        }
        if let Some(n) = site.leases {
            span.record("leases", n);
        }
    }
    let reply = in_span(span.clone(), bounded(site, timeout, fut)).await;
    if let Some(started) = started {
        span.record("outcome", reply.outcome());
        span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
    }
    reply
}

async fn bounded<T>(
    site: Site<'_>,
    timeout: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    // A timeout too large for the clock bounds nothing (as `tokio::time::timeout` treats it).
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365 * 30));
    // The backend may read the deadline and leave out a timer of its own that would fire
    // later (`raw::deadline`).
    let fut = crate::raw::deadline::with_deadline(deadline, AssertUnwindSafe(fut).catch_unwind());
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(panic)) => Err(Error::Panicked {
            backend: site.backend,
            operation: site.operation,
            message: panic_message(&*panic),
        }),
        Err(_) => Err(Error::Timeout {
            operation: site.operation,
            after: timeout,
        }),
    }
}

/// The message of a panic payload, where it is a string.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Exponential backoff with "equal jitter": the delay for `attempt` (0-based) is drawn
/// uniformly from `[d/2, d]` where `d = min(max, min * 2^attempt)`.
pub(crate) fn backoff_delay(min: Duration, max: Duration, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
    let d = min.saturating_mul(factor).min(max).max(min);
    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let half = nanos / 2;
    Duration::from_nanos(half + fastrand::u64(0..=nanos - half))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_bounds_and_grows() {
        let min = Duration::from_millis(10);
        let max = Duration::from_millis(1000);
        for attempt in 0..40 {
            for _ in 0..100 {
                let d = backoff_delay(min, max, attempt);
                assert!(d >= min / 2 && d <= max, "attempt {attempt}: {d:?}");
            }
        }
        // By attempt 10 the cap is reached: at least half of max.
        assert!(backoff_delay(min, max, 10) >= max / 2);
    }

    /// A store call's span is made only where something could see it: with no
    /// subscriber and no logger, none; with a subscriber at DEBUG, the span with its
    /// fields (lease-lab's `spans` tests read them all back on real stores).
    #[test]
    fn store_call_spans_are_made_only_where_seen() {
        use std::sync::{Arc, Mutex};
        let made = || span!(DEBUG, "lease.test", lease = "n");
        // No other test of this binary sets a subscriber or a logger.
        assert!(!spans_seen(tracing::Level::DEBUG));
        let none = made();
        assert!(none.is_none(), "a span was made with nobody to see it");
        let names = Arc::new(Mutex::new(Vec::new()));
        let seen = names.clone();
        let subscriber = tracing_subscriber::layer::SubscriberExt::with(
            tracing_subscriber::registry(),
            NewSpans(seen),
        );
        tracing::subscriber::with_default(subscriber, || {
            assert!(spans_seen(tracing::Level::DEBUG));
            let span = made();
            assert!(!span.is_disabled());
        });
        assert_eq!(*names.lock().unwrap(), ["lease.test"]);
    }

    struct NewSpans(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NewSpans {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.lock().unwrap().push(attrs.metadata().name());
        }
    }

    /// A backend's future polled by `call` sees the call's deadline (so that it may leave
    /// out a timer of its own that would fire later); outside `call`, and in a task it
    /// spawns, it sees none.
    #[tokio::test(start_paused = true)]
    async fn a_call_shows_its_deadline_to_the_backend() {
        use crate::raw::deadline::{caller_bounds, caller_deadline};
        let name = LeaseName::new("deadline").unwrap();
        let site = Site::new("test", "acquire", &name);
        let timeout = Duration::from_secs(3);
        let before = Instant::now();
        let mut seen = None;
        call(site, timeout, async {
            let spawned = tokio::spawn(async { caller_deadline() }).await.unwrap();
            seen = Some((
                caller_deadline(),
                caller_bounds(before + timeout),
                caller_bounds(before + timeout / 2),
                spawned,
            ));
            Ok(())
        })
        .await
        .unwrap();
        let (deadline, bounds_later, bounds_earlier, spawned) = seen.unwrap();
        assert_eq!(deadline, Some(before + timeout));
        assert!(bounds_later, "a timer firing at the deadline is not needed");
        assert!(!bounds_earlier, "a timer firing before it is");
        assert_eq!(spawned, None);
        assert_eq!(caller_deadline(), None);
    }
}
