//! Checks of expiry: an unrenewed lease lapses, fencing survives it, and the holder hears
//! "lost" before the store frees the lease.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseBackend, LossReason, TryAcquire};
use tokio::time::Instant;

use crate::faulty::{Fault, FaultyBackend, Op};

use super::support::*;

/// Fencing tokens grow strictly when a lease expires and is taken again.
pub async fn fencing_increases_across_expiry(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "fencing_increases_across_expiry",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "fence-expiry");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    let first = raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    let (second, _) = acquire_when_free(&*backend, &n, &b, ttl, ttl + EXPIRY_TOLERANCE).await;
    assert!(second > first, "token {second} after expiry of {first}");
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// An unrenewed lease lapses on the store after its TTL.
pub async fn unrenewed_lease_expires(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "unrenewed_lease_expires",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "expires");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    let (_, took) = acquire_when_free(&*backend, &n, &b, ttl, ttl + EXPIRY_TOLERANCE).await;
    // The store must not free it much before the TTL (it may round up, never down).
    assert!(
        took + Duration::from_millis(50) >= ttl,
        "freed after {took:?}, before the ttl {ttl:?}"
    );
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// When renewals fail, the guard signals lost at its safety deadline, before the store
/// gives the lease to anyone else. Reported not applicable (see
/// [`crate::not_applicable_reports`]) to a backend without lead time or expiry.
pub async fn lost_signal_before_store_expiry(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::lead_time_applies(&*backend, "lost_signal_before_store_expiry") {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "lost-early");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Renew, Fault::Fail);
    // The probe below must answer within the safety margin of the signal (a tenth of the
    // TTL): whatever it needs the first time (a ZooKeeper session of its TTL, a pooled
    // connection) is made first, on another name, not in that window (nor
    // between the acquire and its deadline).
    assert!(
        !is_held(&*backend, &name(&ns, "lost-early-warm")).await,
        "a fresh name is held"
    );
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "doomed");
    let started = Instant::now();
    let guard = match c.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("no lost signal within 2x ttl");
    let lost_after = started.elapsed();
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(!guard.is_held());
    assert!(
        lost_after < ttl,
        "lost signalled after {lost_after:?}, not before the ttl"
    );
    // At the moment of the signal the store still has it: nobody else could take it yet.
    let signalled = Instant::now();
    let held = is_held(&*backend, &n).await;
    assert!(
        held,
        "the store gave the lease away before the guard signalled loss (signal {lost_after:?} \
         after the acquire; the probe answered {:?} after the signal, the safety margin is \
         {:?})",
        signalled.elapsed(),
        opts(ttl).safety_margin()
    );
    assert!(faulty.calls(Op::Renew) >= 2, "renewal was not retried");
    guard.disarm();
}

/// A store that hangs: renewals time out, the guard signals lost at its deadline.
pub async fn lost_signal_when_store_hangs(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "lost-hang");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "hung");
    let guard = match c.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    faulty.set(Op::Renew, Fault::Hang);
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("no lost signal within 2x ttl");
    assert_eq!(reason, LossReason::DeadlinePassed);
    faulty.set(Op::Renew, Fault::Pass);
    // Release still works (owner-checked) once the store answers again.
    let _ = guard.release().await.expect("release");
}
