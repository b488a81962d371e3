//! The start-up rule and the health probe, checked on a real store behind a switch that
//! cuts it off (each backend's test file puts a fault proxy in front of its server): see
//! [`lease_core::startup`] for the rule.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Error, HeartbeatState, LeaseBackend, LeaseClient, LeaseOptions, TryAcquire, connect_when_ready,
};
use tokio::time::Instant;

/// How long after the store comes back `connect_when_ready` may take: its longest pause
/// between attempts (2 s) plus one connect's round trips and scheduling slack.
const READY_SLACK: Duration = Duration::from_millis(2500);

/// The start-up rule on one store. `connect` connects through a switch that `cut` opens
/// (every connection refused or reset) and `restore` closes; `bound` is the backend's
/// connect bound with its configuration.
///
/// 1. Cut off, `connect` fails with a retryable [`Error::Unavailable`] or
///    [`Error::Timeout`] within `bound` (plus 500 ms of scheduling slack).
/// 2. [`connect_when_ready`] started while the store is cut off returns a backend once it
///    is back (1 s later), within 2.5 s plus `bound` of that (its longest pause between
///    attempts, one connect and scheduling slack).
///
/// Returns the backend of step 2.
pub async fn startup_rule<C, Fut>(
    connect: C,
    cut: impl Fn(),
    restore: impl Fn() + Send + 'static,
    bound: Duration,
) -> Arc<dyn LeaseBackend>
where
    C: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn LeaseBackend>, Error>>,
{
    cut();
    let t0 = Instant::now();
    match connect().await {
        Ok(_) => panic!("connected while the store is cut off"),
        Err(e) => {
            assert!(
                e.is_retryable(),
                "an unreachable store must be retryable: {e:?}"
            );
            assert!(
                matches!(e, Error::Unavailable { .. } | Error::Timeout { .. }),
                "an unreachable store must be Unavailable or Timeout: {e:?}"
            );
        }
    }
    let failed_after = t0.elapsed();
    eprintln!("connect to a cut-off store failed after {failed_after:?} (bound {bound:?})");
    assert!(
        failed_after <= bound + Duration::from_millis(500),
        "connect took {failed_after:?} to fail (bound {bound:?})"
    );

    let back_at = Instant::now() + Duration::from_secs(1);
    let restorer = tokio::spawn(async move {
        tokio::time::sleep_until(back_at).await;
        restore();
    });
    let backend = connect_when_ready(Duration::from_secs(30), connect)
        .await
        .unwrap_or_else(|e| panic!("no connection within 30 s of waiting: {e}"));
    let ready = Instant::now();
    restorer.await.expect("restorer");
    assert!(ready >= back_at, "connected before the store was back");
    eprintln!(
        "connect_when_ready returned {:?} after the store came back",
        ready - back_at
    );
    assert!(
        ready - back_at <= READY_SLACK + bound,
        "connect_when_ready returned {:?} after the store came back",
        ready - back_at
    );
    backend
}

/// The health probe on one store, with the switch of [`startup_rule`] closed at the start.
///
/// 1. Nothing taken yet: the store answers, the heartbeat has not started.
/// 2. A lease taken and renewed at least once: the heartbeat runs and keeps one lease,
///    and the last renewal was answered less than a renewal period ago.
/// 3. The store cut off: the probe fails with a retryable error within its timeout (plus
///    500 ms of slack) and the client is not healthy; restored, it is healthy again.
pub async fn health_reports(client: &LeaseClient, cut: impl Fn(), restore: impl Fn()) {
    let probe = Duration::from_secs(2);
    let health = client.health(probe).await;
    assert!(health.is_healthy(), "{health}");
    assert_eq!(health.heartbeat, HeartbeatState::NotStarted, "{health}");
    assert_eq!(health.leases, 0);

    let opts = LeaseOptions::new(Duration::from_secs(2)).expect("options");
    let name = format!("health-{}", uuid::Uuid::new_v4().simple());
    let guard = match client.try_acquire(&name, &opts).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        other => panic!("a fresh name was not granted: {other:?}"),
    };
    // The renewal is the event waited for; the guard's deadline moves when it lands.
    let first_deadline = guard.deadline();
    let until = Instant::now() + opts.ttl();
    while guard.deadline() == first_deadline {
        assert!(Instant::now() < until, "no renewal within the TTL");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let health = client.health(probe).await;
    assert!(health.is_healthy(), "{health}");
    assert_eq!(health.heartbeat, HeartbeatState::Running, "{health}");
    assert_eq!(health.leases, 1, "{health}");
    let age = health.last_renewal.expect("a renewal was answered");
    assert!(
        age < opts.renew_every() + Duration::from_millis(500),
        "{health}"
    );

    cut();
    let t0 = Instant::now();
    let health = client.health(probe).await;
    assert!(
        !health.is_healthy(),
        "healthy while the store is cut off: {health}"
    );
    let e = health.store.as_ref().expect_err("the probe failed");
    assert!(e.is_retryable(), "{e:?}");
    assert!(
        t0.elapsed() <= probe + Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    eprintln!("health while cut off: {health}");
    restore();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let health = client.health(probe).await;
        if health.is_healthy() {
            break;
        }
        assert!(
            Instant::now() < until,
            "not healthy 10 s after the store came back: {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(guard);
}

/// [`startup_rule`], then [`health_reports`] on a client of the backend it connected: the
/// whole start-up and health test of one store. `cut` and `restore` open and close the
/// switch in front of the store.
pub async fn startup_and_health<C, Fut>(
    connect: C,
    cut: impl Fn() + Clone + Send + 'static,
    restore: impl Fn() + Clone + Send + 'static,
    bound: Duration,
) where
    C: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn LeaseBackend>, Error>>,
{
    let backend = startup_rule(connect, cut.clone(), restore.clone(), bound).await;
    health_reports(&LeaseClient::new(backend), cut, restore).await;
}
