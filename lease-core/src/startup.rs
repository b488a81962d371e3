//! The start-up rule, the same on every backend, and [`connect_when_ready`] for services
//! that may start before their store.
//!
//! Every backend's `connect` (and `connect_with`) reaches the store before it returns:
//! - bad input (URL, names, timeouts, TLS files) fails at once with
//!   [`Error::InvalidInput`] or [`Error::Tls`], before anything is sent;
//! - wrong credentials, a TLS handshake the server refuses, missing permissions fail with
//!   [`Error::Auth`], [`Error::Tls`] or [`Error::Rejected`] ([`Error::is_retryable`] is
//!   `false`: a retry cannot help);
//! - a store that cannot be reached fails within the backend's connect bound with
//!   [`Error::Unavailable`] or [`Error::Timeout`] (`is_retryable` is `true`).
//!
//! Backends do not connect lazily: what a backend can do ([`Capabilities`], such as
//! whether fencing tokens survive a restart) is read from the server at connect, and a
//! [`LeaseClient`] needs it before its first call. A service that may start before its
//! store waits for it with [`connect_when_ready`] instead.
//!
//! [`Capabilities`]: crate::Capabilities
//! [`LeaseClient`]: crate::LeaseClient

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// Calls `connect` until it succeeds, fails with an error a retry cannot help (returned at
/// once), or `wait` has passed (the last error is returned). Between attempts it waits
/// 100 ms, doubling up to 2 s, never past `wait`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lease_core::Error> {
/// # async fn connect(_: &str) -> Result<lease_core::MemoryBackend, lease_core::Error> { Ok(lease_core::MemoryBackend::new()) }
/// use std::time::Duration;
/// let backend = lease_core::connect_when_ready(Duration::from_secs(60), || {
///     connect("redis://redis:6379") // e.g. lease_redis::RedisBackend::connect
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// Cancel safety: as cancel-safe as `connect`'s futures (every backend's `connect` is):
/// dropped, it leaves nothing behind.
pub async fn connect_when_ready<T, F, Fut>(wait: Duration, mut connect: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(100);
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let error: Error = match connect().await {
            Ok(connected) => return Ok(connected),
            Err(e) if !e.is_retryable() => return Err(e),
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(error);
        }
        tracing::info!(attempt, error = %error, "the lease store is not ready; trying again");
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::InvalidInput;

    fn unavailable() -> Error {
        Error::Unavailable {
            backend: "test",
            source: "refused".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_store_answers() {
        let mut calls = 0;
        let got = connect_when_ready(Duration::from_secs(10), || {
            calls += 1;
            let n = calls;
            async move { if n < 4 { Err(unavailable()) } else { Ok(n) } }
        })
        .await
        .unwrap();
        assert_eq!(got, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_an_error_a_retry_cannot_help() {
        let mut calls = 0;
        let e = connect_when_ready(Duration::from_secs(10), || {
            calls += 1;
            async { Err::<(), _>(InvalidInput::Other("bad".into()).into()) }
        })
        .await
        .unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_with_the_last_error() {
        let start = Instant::now();
        let e = connect_when_ready(Duration::from_secs(3), || async {
            Err::<(), _>(unavailable())
        })
        .await
        .unwrap_err();
        assert!(e.is_retryable());
        assert!(start.elapsed() >= Duration::from_secs(3));
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
    }
}
