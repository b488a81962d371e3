//! Small helpers shared by the client and the heartbeat.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::error::{Error, Result};

/// One call to a backend, as the client makes every call: bounded by `timeout`, and with
/// a panic inside the backend's future turned into [`Error::Panicked`] instead of
/// unwinding through the caller (the heartbeat task above all).
///
/// Cancel-safe in the sense that dropping it drops the backend's future; what the store
/// may have applied by then is the caller's to clean up.
pub(crate) async fn call<T>(
    backend: &'static str,
    operation: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(panic)) => Err(Error::Panicked {
            backend,
            operation,
            message: panic_message(&*panic),
        }),
        Err(_) => Err(Error::Timeout {
            operation,
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
}
