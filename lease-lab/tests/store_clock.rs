//! Redis and PostgreSQL decide expiry by the wall clock of the host the store runs on. A
//! forward step of that clock (an NTP step, `date -s`, a VM resumed from a snapshot)
//! expires every lease early: the store frees it at once, another client takes it, and
//! the old holder believes it holds the lease until its next renewal tells it otherwise.
//! The fencing token is what tells the two apart. These tests step a real server's clock
//! (libfaketime, see `lease_test_servers::clock`) and measure that window.
//!
//! (etcd counts lease time on its leader's monotonic clock; its Go binary cannot be run
//! under libfaketime, so it is not stepped here.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_test_servers::clock::SteppedClock;
use leasehold::{HolderLabel, LeaseClient, LeaseName, LeaseOptions, LossReason, TryAcquire};
use tokio::time::Instant;

async fn forward_step(store: &str, url: &str, clock: &mut SteppedClock) {
    let backend = leasehold::connect(url).await.unwrap();
    let first = LeaseClient::with_label(backend.clone(), HolderLabel::new("first").unwrap());
    let second = LeaseClient::with_label(backend.clone(), HolderLabel::new("second").unwrap());
    let opts = LeaseOptions::new(Duration::from_secs(6)).unwrap();
    let name = LeaseName::new(format!("clock-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let guard = match first.try_acquire(&name, &opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    // Right after a renewal, so that the window below is a whole renewal period.
    tokio::time::sleep(Duration::from_millis(100)).await;
    clock.step(60).unwrap();
    let stepped = Instant::now();
    let taken = match second.try_acquire(&name, &opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!(
            "{store}: a +60 s step of the server's clock did not free a 6 s lease (held by {by})"
        ),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    assert!(
        guard.is_held(),
        "{store}: the first holder already knew (it learns at its next renewal)"
    );
    assert!(
        taken.fencing() > guard.fencing(),
        "{store}: fencing {} after {}",
        taken.fencing(),
        guard.fencing()
    );
    let reason = tokio::time::timeout(opts.renew_every() * 2, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{store}: the first holder never learned"));
    let window = stepped.elapsed();
    assert!(
        matches!(reason, LossReason::NotOwner | LossReason::DeadlinePassed),
        "{store}: {reason:?}"
    );
    assert!(
        window <= opts.renew_every() + Duration::from_secs(1),
        "{store}: two believers for {window:?}"
    );
    eprintln!(
        "{store}: +60 s step of the server's clock: a 6 s lease freed at once, taken by \
         another client (token {} after {}); the first holder learned {window:?} later \
         ({reason:?}); renewal period {:?}",
        taken.fencing(),
        guard.fencing(),
        opts.renew_every()
    );
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_forward_clock_step_expires_leases_early() {
    let mut clock = SteppedClock::new().unwrap_or_else(|e| panic!("{e}"));
    let server = lease_test_servers::RedisServer::start_with_clock(&clock)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    forward_step("redis", &server.url(), &mut clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_forward_clock_step_expires_leases_early() {
    let mut clock = SteppedClock::new().unwrap_or_else(|e| panic!("{e}"));
    let server = lease_test_servers::PostgresServer::start_with_clock(&clock)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    forward_step("postgres", &server.url(), &mut clock).await;
}
