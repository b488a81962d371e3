//! Checks of [`Semaphore`] (N permits per name) on the backend under test: it is built on
//! the backend's primitives alone, so every backend gets it, and these checks prove it
//! there.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{Fencing, LeaseBackend, LeaseOptions, Permit, Semaphore, TryPermit};
use tokio::time::Instant;

use super::{EXPIRY_TOLERANCE, base_ttl, client, name, namespace, owner, raw_acquire};
use crate::faulty::{Fault, FaultyBackend, Op};

fn waiting(ttl: Duration, wait: Duration) -> LeaseOptions {
    LeaseOptions::builder(ttl)
        .wait(wait)
        .build()
        .expect("valid options")
}

async fn take(sem: &Semaphore, opts: &LeaseOptions) -> Permit {
    match sem.try_acquire(opts).await.expect("try_acquire") {
        TryPermit::Acquired(p) => p,
        TryPermit::Full(by) => panic!("{} full: {by:?}", sem.name()),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

/// 3 permits, 12 contenders waiting in `acquire`, many rounds: never more than 3 holders
/// at once, and every contender gets its turns.
pub async fn semaphore_never_more_than_n(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "room");
    let ttl = base_ttl(&*backend) * 5;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let opts = waiting(ttl, Duration::from_secs(60));
    let mut tasks = Vec::new();
    for t in 0..12 {
        let sem = Semaphore::new(client(&backend, &format!("c{t}")), &n, 3).expect("semaphore");
        let (inside, max_inside, wins, opts) = (
            inside.clone(),
            max_inside.clone(),
            wins.clone(),
            opts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let permit = sem.acquire(&opts).await.expect("acquire a permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                wins.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(permit.is_held(), "permit lost while held");
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let max = max_inside.load(Ordering::SeqCst);
    assert!(max <= 3, "{max} holders of 3 permits at once");
    assert!(
        max >= 2,
        "never two holders at once: the permits were not used"
    );
    assert_eq!(
        wins.load(Ordering::SeqCst),
        48,
        "some contender missed a turn"
    );
}

/// Each permit's fencing token grows strictly across release and taking it again (where
/// the backend issues tokens), and a full semaphore answers `Full` with its holders.
pub async fn semaphore_fencing_grows_per_permit(backend: Arc<dyn LeaseBackend>) {
    let fenced = backend.capabilities().fencing != Fencing::None;
    let ns = namespace();
    let n = name(&ns, "fenced");
    let ttl = base_ttl(&*backend) * 10;
    let opts = waiting(ttl, Duration::ZERO);
    let sem = Semaphore::new(client(&backend, "a"), &n, 3).expect("semaphore");
    let mut last = [0u64; 3];
    for round in 0..3 {
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(take(&sem, &opts).await);
        }
        let mut slots: Vec<u32> = held.iter().map(Permit::slot).collect();
        slots.sort_unstable();
        assert_eq!(slots, [0, 1, 2], "two permits on one slot");
        match sem.try_acquire(&opts).await.expect("try_acquire") {
            TryPermit::Full(by) => assert_eq!(by.len(), 3, "{by:?}"),
            TryPermit::Acquired(p) => panic!("a fourth permit: slot {}", p.slot()),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
        assert_eq!(sem.holders().await.expect("holders").len(), 3);
        for p in held {
            let slot = usize::try_from(p.slot()).expect("slot");
            let token = p.fencing().get();
            assert!(
                !fenced || token > last[slot],
                "round {round}: slot {slot} token {token} after {}",
                last[slot]
            );
            last[slot] = token;
            p.release().await.expect("release");
        }
    }
    assert!(sem.holders().await.expect("holders").is_empty());
}

/// A crashed holder (a permit taken and never renewed) gives its permit up at its TTL:
/// a waiter gets it then, not before, also when the semaphore has more held permits than
/// a waiter watches for release (4 here) and the store does not report the others'
/// remaining time (etcd): the waiter must still try again in time, not wait on the
/// wrong slots.
pub async fn semaphore_crashed_permit_expires(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "semaphore_crashed_permit_expires",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "crashed");
    let ttl = base_ttl(&*backend);
    let sem = Semaphore::new(client(&backend, "waiter"), &n, 4).expect("semaphore");
    // The crashed holder's permit: slot 0's lease, taken without a heartbeat.
    let crashed_at = Instant::now();
    raw_acquire(
        &*backend,
        sem.slot_name(0).expect("slot 0"),
        &owner("crashed"),
        ttl,
    )
    .await;
    let mut live = Vec::new();
    for _ in 0..3 {
        live.push(take(&sem, &waiting(ttl * 10, Duration::ZERO)).await);
    }
    assert!(live.iter().all(|p| p.slot() != 0));
    let opts = waiting(ttl, ttl + EXPIRY_TOLERANCE * 4);
    let permit = sem.acquire(&opts).await.expect("the crashed permit frees");
    let after = crashed_at.elapsed();
    assert_eq!(permit.slot(), 0);
    assert!(
        after >= ttl,
        "the crashed holder's permit was taken after {after:?}, before its TTL {ttl:?}"
    );
    // Soon after it lapses: within the store's expiry tolerance and one backoff pause
    // (`backoff_max`), not at the end of the wait.
    let bound = ttl + EXPIRY_TOLERANCE + opts.backoff_max();
    assert!(
        after <= bound,
        "the crashed holder's permit was taken only after {after:?} (bound {bound:?})"
    );
    permit.release().await.expect("release");
    for p in live {
        p.release().await.expect("release");
    }
}

/// A holder whose renewals fail (paused, cut off) signals its permit lost at its
/// deadline, before a waiter takes that permit: never more than N believers. Reported
/// not applicable (see [`crate::not_applicable_reports`]) to a backend without lead time
/// or expiry.
pub async fn semaphore_lost_before_permit_taken_over(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::lead_time_applies(
        &*backend,
        "semaphore_lost_before_permit_taken_over",
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "paused");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Renew, Fault::Fail);
    let doomed_client = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "doomed");
    let doomed = Semaphore::new(doomed_client, &n, 1).expect("semaphore");
    let waiter = Semaphore::new(client(&backend, "waiter"), &n, 1).expect("semaphore");
    let permit = take(&doomed, &waiting(ttl, Duration::ZERO)).await;
    // The doomed holder's guard stays alive and never releases; its belief ends at its
    // deadline (read off the guard, not the time a task woke to see it).
    let signal = tokio::spawn(async move {
        permit.lost().await;
        let deadline = permit.guard().deadline();
        let believed = permit.is_held();
        (permit, deadline, believed)
    });
    let opts = waiting(ttl, ttl * 2 + EXPIRY_TOLERANCE * 2);
    let taken = waiter.acquire(&opts).await.expect("the permit frees");
    let taken_at = Instant::now();
    let (doomed_permit, deadline, believed) = signal.await.expect("lost signal task");
    assert!(!believed, "is_held after the lost signal");
    assert!(
        deadline < taken_at,
        "the permit was taken {:?} before its old holder's belief ended",
        deadline - taken_at
    );
    doomed_permit.into_guard().disarm();
    taken.release().await.expect("release");
}
