//! Checks shared by the backends' outage and load tests (a server stopped or frozen, or
//! the backend's connections busy, while a client holds a lease): what a caller and a
//! holder must see meanwhile.

use std::time::Duration;

use lease_core::{Error, LeaseClient, LeaseGuard, LeaseOptions, LossReason};
use tokio::time::Instant;

/// While the server is unreachable or frozen, a new acquisition of `name` fails with a
/// typed, retryable error (`Unavailable` or `Timeout`) no later than the call timeout,
/// plus 200 ms of scheduling slack.
pub async fn acquire_fails_typed(client: &LeaseClient, name: &str, opts: &LeaseOptions) {
    let t0 = Instant::now();
    match client.try_acquire(name, opts).await {
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            assert!(
                matches!(e, Error::Unavailable { .. } | Error::Timeout { .. }),
                "{e:?}"
            );
        }
        Ok(other) => panic!("acquired while the server is out: {other:?}"),
    }
    assert!(
        t0.elapsed() <= opts.call_timeout() + Duration::from_millis(200),
        "the failing acquire took {:?} (call timeout {:?})",
        t0.elapsed(),
        opts.call_timeout()
    );
}

/// The holder of `guard` (a lease of `opts`) is told `DeadlinePassed` at its deadline:
/// last successful renewal + TTL - safety margin, so at most TTL - margin after the
/// outage began at `out_since`, plus 150 ms of scheduling slack. Returns how long after
/// `out_since` the signal came.
pub async fn lost_at_the_deadline(
    guard: &LeaseGuard,
    opts: &LeaseOptions,
    out_since: Instant,
) -> Duration {
    let ttl = opts.ttl();
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("no lost signal within 2x TTL");
    assert_eq!(reason, LossReason::DeadlinePassed);
    let after = out_since.elapsed();
    assert!(
        after <= ttl - opts.safety_margin() + Duration::from_millis(150),
        "lost signal {after:?} after the outage began"
    );
    eprintln!("lost signal {after:?} after the outage began");
    after
}

/// The holder of `guard` (a lease of `opts`) keeps it for `span` while the caller keeps
/// the backend busy otherwise (every pooled connection taken by other work, a flood of
/// contenders): renewals must not wait behind other calls for as long as the lease's
/// deadline. Waits on the guard's loss signal, which must not come within `span`.
pub async fn kept_while_busy(guard: &LeaseGuard, opts: &LeaseOptions, span: Duration) {
    if let Ok(reason) = tokio::time::timeout(span, guard.lost()).await {
        panic!(
            "the lease (ttl {:?}) was lost while the backend was busy: {reason:?}",
            opts.ttl()
        );
    }
    assert!(guard.is_held(), "the guard no longer holds the lease");
}
