//! The conformance suite: one `pub async fn` per check, each taking the backend under
//! test. [`crate::conformance_suite!`] turns all of them into `#[tokio::test]`s.
//!
//! Every check isolates itself under a random name prefix and cleans up what it took.
//! Timings follow the backend's capabilities: the base TTL is 600 ms rounded up to the
//! store's minimum and granularity. Where a check waits for a TTL to run out on the store,
//! it polls with a stated tolerance ([`EXPIRY_TOLERANCE`]) because the store's clock and
//! this process's scheduler are not in lock-step; everything else waits on events.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, Fencing, FencingToken, HolderLabel, InvalidInput, JobRun, LeaseBackend,
    LeaseClient, LeaseName, LeaseOptions, LossReason, MAX_TTL, Owner, ReleaseOutcome, RenewItem,
    RenewOutcome, RunOutcome, ScheduledJob, TryAcquire,
};
use tokio::time::Instant;

use crate::faulty::{Fault, FaultyBackend, Op};

mod election;
mod failure;
mod semaphore;
pub use election::*;
pub use failure::*;
pub use semaphore::*;

/// Extra time allowed, beyond the TTL, for a lease to be seen expired on the store: covers
/// store-side expiry granularity (Redis expires lazily or in its 10 Hz cycle; etcd checks
/// leases on its own schedule) and scheduling delays of a loaded 2-core test machine.
pub const EXPIRY_TOLERANCE: Duration = Duration::from_millis(1500);

/// A random prefix that isolates one check's names from every other check and run.
pub fn namespace() -> String {
    format!("conformance-{}/", uuid::Uuid::new_v4().simple())
}

/// A lease name inside `ns`.
pub fn name(ns: &str, suffix: &str) -> LeaseName {
    LeaseName::new(format!("{ns}{suffix}")).expect("valid test name")
}

/// The base TTL used by the checks for this backend.
pub fn base_ttl(backend: &dyn LeaseBackend) -> Duration {
    backend
        .capabilities()
        .effective_ttl(Duration::from_millis(600))
}

fn opts(ttl: Duration) -> LeaseOptions {
    LeaseOptions::new(ttl).expect("valid options")
}

fn client(backend: &Arc<dyn LeaseBackend>, label: &str) -> LeaseClient {
    LeaseClient::with_label(backend.clone(), HolderLabel::new(label).expect("label"))
}

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).expect("label"))
}

async fn raw_acquire(
    backend: &dyn LeaseBackend,
    name: &LeaseName,
    owner: &Owner,
    ttl: Duration,
) -> FencingToken {
    match backend.acquire(name, owner, ttl).await.expect("acquire") {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        AcquireOutcome::Held(by) => panic!("{name} unexpectedly held by {by}"),
    }
}

async fn is_held(backend: &dyn LeaseBackend, name: &LeaseName) -> bool {
    let probe = owner("probe");
    match backend
        .acquire(name, &probe, Duration::from_secs(30))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(_) => true,
        AcquireOutcome::Acquired { .. } => {
            backend
                .release(name, &probe.token, Duration::ZERO)
                .await
                .expect("release probe");
            false
        }
    }
}

/// Polls `acquire` until it succeeds, within `within`; returns the fencing token and how
/// long it took.
async fn acquire_when_free(
    backend: &dyn LeaseBackend,
    name: &LeaseName,
    owner: &Owner,
    ttl: Duration,
    within: Duration,
) -> (FencingToken, Duration) {
    let start = Instant::now();
    loop {
        if let AcquireOutcome::Acquired { fencing, .. } =
            backend.acquire(name, owner, ttl).await.expect("acquire")
        {
            return (fencing, start.elapsed());
        }
        assert!(
            start.elapsed() < within,
            "{name} still held after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A held lease answers `Held` to everyone else, with the holder where the store can tell.
pub async fn acquire_then_held(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "job");
    let ttl = base_ttl(&*backend);
    let a = owner("holder-a");
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    let b = owner("holder-b");
    match backend.acquire(&n, &b, ttl).await.expect("acquire") {
        AcquireOutcome::Held(by) => {
            if backend.capabilities().holder_info {
                assert_eq!(by.holder.as_deref(), Some("holder-a"));
                if backend.capabilities().expires {
                    let r = by.remaining.expect("remaining ttl");
                    assert!(r <= backend.capabilities().effective_ttl(ttl * 10), "{r:?}");
                }
            }
        }
        other => panic!("second acquire must see the lease held, got {other:?}"),
    }
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// Fencing tokens grow strictly across release and re-acquisition.
pub async fn fencing_increases_across_release(backend: Arc<dyn LeaseBackend>) {
    if backend.capabilities().fencing == Fencing::None {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "fence");
    let ttl = base_ttl(&*backend);
    let mut last = None;
    for i in 0..5 {
        let o = owner(&format!("holder-{i}"));
        let f = raw_acquire(&*backend, &n, &o, ttl).await;
        if let Some(prev) = last {
            assert!(f > prev, "token {f} after {prev} is not greater");
        }
        last = Some(f);
        assert_eq!(
            backend
                .release(&n, &o.token, Duration::ZERO)
                .await
                .expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// Fencing tokens grow strictly when a lease expires and is taken again.
pub async fn fencing_increases_across_expiry(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().expires {
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

/// Concurrent acquisitions never hand out the same token twice.
pub async fn fencing_unique_under_contention(backend: Arc<dyn LeaseBackend>) {
    if backend.capabilities().fencing == Fencing::None {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "fence-contention");
    let ttl = base_ttl(&*backend) * 10;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let backend = backend.clone();
        let n = n.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..10 {
                let o = owner(&format!("t{t}"));
                if let AcquireOutcome::Acquired { fencing, .. } =
                    backend.acquire(&n, &o, ttl).await.expect("acquire")
                {
                    got.push(fencing);
                    backend
                        .release(&n, &o.token, Duration::ZERO)
                        .await
                        .expect("release");
                }
                tokio::task::yield_now().await;
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let got = t.await.expect("task");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "per-task tokens not increasing: {got:?}"
        );
        all.extend(got);
    }
    assert!(!all.is_empty());
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "a fencing token was handed out twice");
}

/// 64 contenders, many rounds: never two holders at once.
pub async fn mutual_exclusion_64_contenders(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "mutex");
    let ttl = base_ttl(&*backend) * 5;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let clients: Vec<LeaseClient> = (0..8).map(|i| client(&backend, &format!("c{i}"))).collect();
    let options = opts(ttl);
    let mut tasks = Vec::new();
    for t in 0..64 {
        let c = clients[t % clients.len()].clone();
        let (inside, max_inside, wins, n, options) = (
            inside.clone(),
            max_inside.clone(),
            wins.clone(),
            n.clone(),
            options.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                match c.try_acquire(&n, &options).await.expect("try_acquire") {
                    TryAcquire::Acquired(g) => {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        wins.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        assert!(g.is_held());
                        g.release().await.expect("release");
                    }
                    TryAcquire::Held(_) => tokio::task::yield_now().await,
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    assert!(
        wins.load(Ordering::SeqCst) >= 2,
        "too few acquisitions to mean anything"
    );
}

/// Only the owner token renews.
pub async fn only_owner_renews(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "renew-owner");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    let stranger = owner("stranger");
    let r = backend
        .renew(
            &[
                RenewItem {
                    name: n.clone(),
                    token: stranger.token,
                },
                RenewItem {
                    name: n.clone(),
                    token: a.token,
                },
            ],
            ttl * 10,
        )
        .await
        .expect("renew");
    assert_eq!(r, vec![RenewOutcome::Lost, RenewOutcome::Renewed]);
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// Only the owner token releases; a stranger's release changes nothing.
pub async fn only_owner_releases(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "release-owner");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let stranger = owner("stranger");
    assert_eq!(
        backend
            .release(&n, &stranger.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner
    );
    assert!(
        is_held(&*backend, &n).await,
        "a stranger's release freed the lease"
    );
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner,
        "a second release must say NotOwner"
    );
}

/// A holder whose lease expired cannot release the next holder's lease.
pub async fn stale_release_is_noop(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().expires {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "stale-release");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl * 10, ttl + EXPIRY_TOLERANCE).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner
    );
    assert!(
        is_held(&*backend, &n).await,
        "stale release freed the new holder's lease"
    );
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// A holder whose lease expired cannot renew it back to life.
pub async fn stale_renew_is_lost(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().expires {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "stale-renew");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl * 10, ttl + EXPIRY_TOLERANCE).await;
    let r = backend
        .renew(
            &[RenewItem {
                name: n.clone(),
                token: a.token,
            }],
            ttl * 10,
        )
        .await
        .expect("renew");
    assert_eq!(r, vec![RenewOutcome::Lost]);
    assert_eq!(
        backend
            .release(&n, &b.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released,
        "the stale renewal disturbed the new holder"
    );
}

/// A batch answers per lease, in input order.
pub async fn renew_batch_mixed(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    let n1 = name(&ns, "one");
    let n2 = name(&ns, "two");
    let never = name(&ns, "never-taken");
    raw_acquire(&*backend, &n1, &a, ttl).await;
    raw_acquire(&*backend, &n2, &a, ttl).await;
    let stranger = owner("stranger");
    let r = backend
        .renew(
            &[
                RenewItem {
                    name: n1.clone(),
                    token: a.token,
                },
                RenewItem {
                    name: n2.clone(),
                    token: stranger.token,
                },
                RenewItem {
                    name: never.clone(),
                    token: a.token,
                },
                RenewItem {
                    name: n2.clone(),
                    token: a.token,
                },
            ],
            ttl,
        )
        .await
        .expect("renew");
    assert_eq!(
        r,
        vec![
            RenewOutcome::Renewed,
            RenewOutcome::Lost,
            RenewOutcome::Lost,
            RenewOutcome::Renewed
        ]
    );
    assert!(
        !is_held(&*backend, &never).await,
        "renewing a free name must not take it"
    );
    for n in [&n1, &n2] {
        backend
            .release(n, &a.token, Duration::ZERO)
            .await
            .expect("release");
    }
}

/// An empty batch is answered with an empty result.
pub async fn renew_empty_batch(backend: Arc<dyn LeaseBackend>) {
    let r = backend
        .renew(&[], base_ttl(&*backend))
        .await
        .expect("renew");
    assert!(r.is_empty());
}

/// Renewal extends the lease from the store's now.
pub async fn renew_extends_ttl(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().expires {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "extend");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    // Renew a few times at half the TTL: after 2.5 TTLs the lease must still be held.
    for _ in 0..5 {
        tokio::time::sleep(ttl / 2).await;
        let r = backend
            .renew(
                &[RenewItem {
                    name: n.clone(),
                    token: a.token,
                }],
                ttl,
            )
            .await
            .expect("renew");
        assert_eq!(r, vec![RenewOutcome::Renewed]);
    }
    assert!(is_held(&*backend, &n).await);
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// An unrenewed lease lapses on the store after its TTL.
pub async fn unrenewed_lease_expires(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().expires {
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

/// Release frees the lease at once (keep-for zero).
pub async fn release_frees_immediately(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "release");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    let b = owner("b");
    raw_acquire(&*backend, &n, &b, ttl).await;
    assert!(backend.inspect(&n).await.expect("inspect").is_some());
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// keep-for (lockAtLeastFor) keeps the lease taken after release, not renewable, and then
/// frees it.
pub async fn keep_for_holds_after_release(backend: Arc<dyn LeaseBackend>) {
    let caps = backend.capabilities();
    if !caps.keep_for {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "keep-for");
    let ttl = base_ttl(&*backend);
    let keep_for = caps.effective_ttl(ttl * 2);
    let a = owner("a");
    let started = Instant::now();
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    assert_eq!(
        backend
            .release(&n, &a.token, keep_for)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        is_held(&*backend, &n).await,
        "keep-for did not keep the lease"
    );
    let r = backend
        .renew(
            &[RenewItem {
                name: n.clone(),
                token: a.token,
            }],
            ttl * 10,
        )
        .await
        .expect("renew");
    assert_eq!(
        r,
        vec![RenewOutcome::Lost],
        "a released lease must not be renewable"
    );
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl, keep_for + EXPIRY_TOLERANCE).await;
    assert!(
        started.elapsed() + Duration::from_millis(50) >= keep_for,
        "freed after {:?}, before keep-for {keep_for:?}",
        started.elapsed()
    );
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// keep-for already elapsed since acquisition: release frees at once.
pub async fn keep_for_elapsed_frees(backend: Arc<dyn LeaseBackend>) {
    if !backend.capabilities().keep_for {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "keep-for-elapsed");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::from_millis(1))
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        !is_held(&*backend, &n).await,
        "elapsed keep-for still held the lease"
    );
}

/// inspect shows holder, fencing token and remaining time; `None` once free.
pub async fn inspect_reports_holder(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "inspect");
    let ttl = base_ttl(&*backend) * 10;
    let caps = backend.capabilities();
    assert_eq!(backend.inspect(&n).await.expect("inspect"), None);
    let a = owner("inspect-holder");
    let f = raw_acquire(&*backend, &n, &a, ttl).await;
    let info = backend.inspect(&n).await.expect("inspect").expect("held");
    if caps.holder_info {
        assert_eq!(info.holder.as_deref(), Some("inspect-holder"));
    }
    if let Some(seen) = info.fencing {
        assert_eq!(seen, f);
    }
    if caps.expires {
        let r = info.remaining.expect("remaining");
        assert!(r <= caps.effective_ttl(ttl) && r > Duration::ZERO, "{r:?}");
    }
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
    assert_eq!(backend.inspect(&n).await.expect("inspect"), None);
}

/// Names with separators, braces, wildcards and non-UTF-8 bytes never collide.
pub async fn names_do_not_collide(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend) * 10;
    let mut raw: Vec<Vec<u8>> = [
        "a",
        "a:",
        "a:b",
        ":a",
        "{a}",
        "a}",
        "{",
        "}",
        "{}",
        "a/b",
        "a/",
        "a//b",
        "a%2Fb",
        "a\\b",
        "*",
        "a*",
        "?",
        "[x]",
        "a b",
        "lease:{a}:lock",
        "a:lock",
        "a:fence",
        "잠금",
        "'; DROP TABLE leases; --",
        "a\n",
        "\u{7f}",
    ]
    .iter()
    .map(|s| format!("{ns}{s}").into_bytes())
    .collect();
    for bytes in [&[0xffu8, 0xfe][..], &[0xc3, 0x28], &[0x01], &[0x80, 0x2f]] {
        let mut v = ns.clone().into_bytes();
        v.extend_from_slice(bytes);
        raw.push(v);
    }
    let mut long = ns.clone().into_bytes();
    long.resize(LeaseName::MAX_LEN, b'x');
    raw.push(long);
    let names: Vec<LeaseName> = raw
        .iter()
        .map(|r| LeaseName::new(r).expect("name"))
        .collect();
    let a = owner("a");
    let mut tokens = Vec::new();
    for n in &names {
        tokens.push(raw_acquire(&*backend, n, &a, ttl).await);
    }
    for (n, f) in names.iter().zip(&tokens) {
        let info = backend.inspect(n).await.expect("inspect").expect("held");
        if let Some(seen) = info.fencing {
            assert_eq!(seen, *f, "{n:?} reports another name's token");
        }
    }
    // Releasing one name leaves every other name held.
    assert_eq!(
        backend
            .release(&names[0], &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    for n in &names[1..] {
        assert!(
            is_held(&*backend, n).await,
            "{n:?} was freed by another name's release"
        );
    }
    let items: Vec<RenewItem> = names[1..]
        .iter()
        .map(|n| RenewItem {
            name: n.clone(),
            token: a.token,
        })
        .collect();
    let r = backend.renew(&items, ttl).await.expect("renew");
    assert!(r.iter().all(|o| *o == RenewOutcome::Renewed), "{r:?}");
    for n in &names[1..] {
        backend
            .release(n, &a.token, Duration::ZERO)
            .await
            .expect("release");
    }
}

/// Bad names are a typed error before anything reaches the store.
pub async fn invalid_names_rejected(backend: Arc<dyn LeaseBackend>) {
    let c = client(&backend, "input");
    let o = opts(base_ttl(&*backend));
    type Check = fn(&InvalidInput) -> bool;
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (Vec::new(), |e| matches!(e, InvalidInput::EmptyName)),
        (vec![b'x'; LeaseName::MAX_LEN + 1], |e| {
            matches!(e, InvalidInput::NameTooLong { .. })
        }),
        (b"a\0b".to_vec(), |e| {
            matches!(e, InvalidInput::NameContainsNul { offset: 1 })
        }),
    ];
    for (bytes, check) in cases {
        match c.try_acquire(&bytes, &o).await {
            Err(Error::InvalidInput(e)) => {
                assert!(check(&e), "wrong error {e:?}");
                assert!(!Error::InvalidInput(e).is_retryable());
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
        assert!(matches!(
            c.acquire(&bytes, &o).await,
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            c.inspect(&bytes).await,
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            c.run_exclusive(&bytes, &o, |_| async {}).await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert!(matches!(
        HolderLabel::new(""),
        Err(InvalidInput::HolderLabel(_))
    ));
    assert!(matches!(
        HolderLabel::new("a\nb"),
        Err(InvalidInput::HolderLabel(_))
    ));
}

/// Bad options are a typed error at construction.
pub async fn invalid_options_rejected(backend: Arc<dyn LeaseBackend>) {
    let s = Duration::from_secs;
    let b = LeaseOptions::builder;
    assert_eq!(
        LeaseOptions::new(Duration::ZERO),
        Err(InvalidInput::TtlZero)
    );
    assert!(matches!(
        LeaseOptions::new(MAX_TTL + s(1)),
        Err(InvalidInput::TooLarge { what: "ttl", .. })
    ));
    assert!(matches!(
        b(s(30)).renew_every(s(30)).build(),
        Err(InvalidInput::RenewPeriod { .. })
    ));
    assert!(matches!(
        b(s(30)).renew_every(s(40)).build(),
        Err(InvalidInput::RenewPeriod { .. })
    ));
    assert!(matches!(
        b(s(30)).renew_every(Duration::ZERO).build(),
        Err(InvalidInput::RenewPeriod { .. })
    ));
    assert!(matches!(
        b(s(30)).safety_margin(s(20)).build(),
        Err(InvalidInput::SafetyMargin { .. })
    ));
    assert!(matches!(
        b(s(30)).call_timeout(s(30)).build(),
        Err(InvalidInput::CallTimeout { .. })
    ));
    assert!(matches!(
        b(s(30)).call_timeout(Duration::ZERO).build(),
        Err(InvalidInput::CallTimeout { .. })
    ));
    assert!(matches!(
        b(s(30)).backoff(s(2), s(1)).build(),
        Err(InvalidInput::Backoff { .. })
    ));
    assert!(matches!(
        b(s(30)).backoff(Duration::ZERO, s(1)).build(),
        Err(InvalidInput::Backoff { .. })
    ));
    assert!(matches!(
        b(s(30)).keep_for(MAX_TTL + s(1)).build(),
        Err(InvalidInput::TooLarge {
            what: "keep_for",
            ..
        })
    ));
    assert!(matches!(
        b(s(30)).wait(MAX_TTL + s(1)).build(),
        Err(InvalidInput::TooLarge { what: "wait", .. })
    ));
    let ok = b(s(30)).build().expect("defaults are valid");
    assert_eq!(ok.renew_every(), s(10));
    let c = client(&backend, "input");
    assert!(matches!(
        ScheduledJob::new(c, "job", Duration::ZERO, ok),
        Err(Error::InvalidInput(InvalidInput::PeriodZero))
    ));
}

/// The watchdog keeps work that runs 3x the TTL exclusive: nobody else gets in.
pub async fn watchdog_long_work_not_run_twice(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "long-work");
    let ttl = base_ttl(&*backend);
    let a = client(&backend, "worker-a");
    let b = client(&backend, "worker-b");
    let options = opts(ttl);
    let guard = match a.try_acquire(&n, &options).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
    };
    let until = Instant::now() + ttl * 3;
    let mut attempts = 0;
    while Instant::now() < until {
        match b.try_acquire(&n, &options).await.expect("try_acquire") {
            TryAcquire::Held(_) => attempts += 1,
            TryAcquire::Acquired(_) => {
                panic!("a second worker got the lease while the first worked")
            }
        }
        assert!(
            guard.is_held(),
            "the working guard lost its lease: {:?}",
            guard.loss_reason()
        );
        tokio::time::sleep(ttl / 8).await;
    }
    assert!(attempts >= 10);
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// run_exclusive runs work longer than the TTL to completion.
pub async fn run_exclusive_runs_long_work(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "run-long");
    let ttl = base_ttl(&*backend);
    let c = client(&backend, "runner");
    let out = c
        .run_exclusive(&n, &opts(ttl), |ctx| async move {
            tokio::time::sleep(ttl * 2).await;
            assert!(!ctx.lost.is_cancelled());
            ctx.fencing
        })
        .await
        .expect("run");
    assert!(matches!(out, RunOutcome::Ran(_)), "{out:?}");
    assert!(
        !is_held(&*backend, &n).await,
        "run_exclusive must release afterwards"
    );
}

/// run_exclusive skips work when another holder has the lease.
pub async fn run_exclusive_skips_when_held(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "run-skip");
    let ttl = base_ttl(&*backend);
    let a = owner("other-instance");
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    let c = client(&backend, "runner");
    let out = c
        .run_exclusive(&n, &opts(ttl), |_| async { panic!("must not run") })
        .await
        .expect("run");
    match out {
        RunOutcome::Skipped(by) => {
            if backend.capabilities().holder_info {
                assert_eq!(by.holder.as_deref(), Some("other-instance"));
            }
        }
        other => panic!("expected Skipped, got {other:?}"),
    }
    backend
        .release(&n, &a.token, Duration::ZERO)
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
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "doomed");
    let started = Instant::now();
    let guard = match c.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
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
    assert!(
        is_held(&*backend, &n).await,
        "the store gave the lease away before the guard signalled loss"
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

/// run_exclusive cancels the work when the lease is lost.
pub async fn run_exclusive_cancelled_on_loss(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "run-lost");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Renew, Fault::Fail);
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "runner");
    let out = tokio::time::timeout(
        ttl * 3,
        c.run_exclusive(&n, &opts(ttl), |_| std::future::pending::<()>()),
    )
    .await
    .expect("run_exclusive did not end after the lease was lost")
    .expect("run");
    assert_eq!(out, RunOutcome::Lost(LossReason::DeadlinePassed));
}

/// Releasing stops renewal first: no renewal of the lease starts after release returns,
/// and a renewal in flight during release finishes before the release is sent.
pub async fn no_renewal_after_release(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "no-renew-after-release");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Renew, Fault::Delay(ttl / 5));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "releaser");
    let options = opts(ttl);
    let guard = match c.try_acquire(&n, &options).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
    };
    // Release while the first renewal is in flight.
    faulty.wait_for_calls(Op::Renew, 1).await;
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let released_at = Instant::now();
    let log = faulty.renew_log();
    for call in &log {
        if call.names.contains(&n) {
            let finished = call
                .finished
                .expect("renewal still in flight after release returned");
            assert!(finished <= released_at);
        }
    }
    // Two more renewal periods: nothing for this lease.
    tokio::time::sleep(options.renew_every() * 2).await;
    let after = faulty
        .renew_log()
        .iter()
        .filter(|c| c.names.contains(&n) && c.started > released_at)
        .count();
    assert_eq!(after, 0, "renewal after release");
    assert!(
        !is_held(&*backend, &n).await,
        "the lease is still held after release"
    );
}

/// Dropping a guard releases in the background, well before the TTL.
pub async fn drop_releases(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "drop");
    let ttl = base_ttl(&*backend) * 10;
    let a = client(&backend, "dropper");
    let options = opts(ttl);
    let guard = match a.try_acquire(&n, &options).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
    };
    let dropped_at = Instant::now();
    drop(guard);
    let b = client(&backend, "next");
    let wait = LeaseOptions::builder(ttl)
        .wait(ttl / 2)
        .build()
        .expect("opts");
    let g = b
        .acquire(&n, &wait)
        .await
        .expect("dropped lease was not released");
    assert!(dropped_at.elapsed() < ttl / 2);
    g.release().await.expect("release");
}

/// acquire waits for the holder's release and then takes the lease.
pub async fn acquire_waits_for_release(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "wait");
    let ttl = base_ttl(&*backend) * 10;
    let a = client(&backend, "first");
    let b = client(&backend, "second");
    let holder = match a.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
    };
    let first = holder.fencing();
    let wait = LeaseOptions::builder(ttl)
        .wait(ttl * 3)
        .build()
        .expect("opts");
    let waiter = tokio::spawn(async move { b.acquire(&n, &wait).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    holder.release().await.expect("release");
    let g = waiter
        .await
        .expect("task")
        .expect("waiter did not get the lease");
    let handoff = released_at.elapsed();
    if backend.capabilities().fencing != Fencing::None {
        assert!(g.fencing() > first);
    }
    assert!(handoff < ttl / 2, "handoff took {handoff:?}");
    g.release().await.expect("release");
}

/// acquire gives up after its wait with a typed, retryable error naming the holder.
pub async fn acquire_wait_times_out(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "wait-timeout");
    let ttl = base_ttl(&*backend);
    let a = owner("long-holder");
    raw_acquire(&*backend, &n, &a, ttl * 20).await;
    let c = client(&backend, "impatient");
    let wait = LeaseOptions::builder(ttl)
        .wait(ttl / 2)
        .build()
        .expect("opts");
    let started = Instant::now();
    match c.acquire(&n, &wait).await {
        Err(e @ Error::StillHeld { .. }) => {
            assert!(e.is_retryable());
            if backend.capabilities().holder_info {
                assert!(e.to_string().contains("long-holder"), "{e}");
            }
        }
        other => panic!("expected StillHeld, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took >= ttl / 2 && took < ttl / 2 + ttl, "waited {took:?}");
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// A scheduled job on three instances runs at most once per keep-for window.
pub async fn scheduled_job_once_per_period(backend: Arc<dyn LeaseBackend>) {
    let caps = backend.capabilities();
    if !caps.keep_for {
        // Once per period across instances needs lockAtLeastFor.
        return;
    }
    let ns = namespace();
    let n = name(&ns, "scheduled");
    let ttl = base_ttl(&*backend);
    // A lease released with a sliver of keep-for left lives the store's minimum TTL
    // (etcd: 2 s): the period leaves room for it after the keep-for.
    let caps = backend.capabilities();
    let tail = min_ttl_tail(&caps);
    let period = ttl.max(caps.ttl_granularity * 2 + tail);
    let keep_for = (period - tail) * 9 / 10;
    let options = LeaseOptions::builder(ttl)
        .keep_for(keep_for)
        .build()
        .expect("opts");
    let runs = Arc::new(std::sync::Mutex::new(Vec::<(Instant, FencingToken)>::new()));
    let shutdown = lease_core::CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..3u32 {
        let job = ScheduledJob::new(
            client(&backend, &format!("instance-{i}")),
            &n,
            period,
            options.clone(),
        )
        .expect("job");
        let runs = runs.clone();
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            // Instances start a little apart, as real ones do.
            tokio::time::sleep(Duration::from_millis(u64::from(i) * 37)).await;
            job.run(shutdown, move |ctx| {
                let runs = runs.clone();
                async move {
                    runs.lock()
                        .expect("lock")
                        .push((Instant::now(), ctx.fencing));
                }
            })
            .await
        }));
    }
    tokio::time::sleep(period * 4 + period / 2).await;
    shutdown.cancel();
    let mut stats = Vec::new();
    for t in tasks {
        stats.push(t.await.expect("task"));
    }
    let runs = runs.lock().expect("lock").clone();
    assert!(
        runs.len() >= 3 && runs.len() <= 6,
        "{} runs in 4.5 periods: {stats:?}",
        runs.len()
    );
    for w in runs.windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(
            gap + Duration::from_millis(50) >= keep_for,
            "two runs {gap:?} apart, keep-for {keep_for:?}"
        );
        if caps.fencing != Fencing::None {
            assert!(w[1].1 > w[0].1);
        }
    }
    let skipped: u64 = stats.iter().map(|s| s.skipped).sum();
    assert!(
        skipped > 0,
        "other instances never saw the lease held: {stats:?}"
    );
}

/// A store that is down gives typed, retryable errors and skipped runs, never a hang.
pub async fn store_down_typed_errors(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "down");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set_all(Fault::Fail);
    let as_dyn: Arc<dyn LeaseBackend> = faulty.clone();
    let c = client(&as_dyn, "down");
    let options = opts(ttl);
    match c.try_acquire(&n, &options).await {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let wait = LeaseOptions::builder(ttl)
        .wait(ttl / 4)
        .build()
        .expect("opts");
    assert!(matches!(
        c.acquire(&n, &wait).await,
        Err(Error::Unavailable { .. })
    ));
    if backend.capabilities().keep_for {
        let caps = backend.capabilities();
        let period = ttl.max(caps.ttl_granularity * 2 + min_ttl_tail(&caps));
        let job = ScheduledJob::new(c.clone(), &n, period, options.clone()).expect("job");
        assert!(matches!(
            job.run_once(|_| async {}).await,
            JobRun::StoreError(_)
        ));
    }
    // Hung store: the per-call timeout answers.
    faulty.set_all(Fault::Hang);
    let quick = LeaseOptions::builder(ttl)
        .call_timeout(ttl / 10)
        .build()
        .expect("opts");
    let started = Instant::now();
    match c.try_acquire(&n, &quick).await {
        Err(
            e @ Error::Timeout {
                operation: "acquire",
                ..
            },
        ) => assert!(e.is_retryable()),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(started.elapsed() < ttl / 10 + Duration::from_millis(500));
    faulty.set_all(Fault::Pass);
    // The store is back: work resumes.
    let out = c
        .run_exclusive(&n, &options, |_| async { 7 })
        .await
        .expect("run");
    assert_eq!(out, RunOutcome::Ran(7));
}

/// One client renews many leases with one `renew` call per tick, not one per lease.
pub async fn heartbeat_batches_renewals(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend) * 2;
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "batcher");
    let options = opts(ttl);
    let count = 200;
    let mut guards = Vec::new();
    for i in 0..count {
        match c
            .try_acquire(name(&ns, &format!("lease-{i}")), &options)
            .await
            .expect("acquire")
        {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Held(by) => panic!("held by {by}"),
        }
    }
    // Let the leases fall into step, then count calls over six renewal periods.
    tokio::time::sleep(options.renew_every() * 3).await;
    let before = faulty.renew_log().len();
    tokio::time::sleep(options.renew_every() * 6).await;
    let log = faulty.renew_log();
    let calls = &log[before..];
    let items: usize = calls.iter().map(|c| c.names.len()).sum();
    assert!(calls.len() <= 8, "{} renew calls for 6 ticks", calls.len());
    assert!(
        items >= count * 5,
        "only {items} renewals of {count} leases in 6 ticks"
    );
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.release().await.expect("release");
    }
}

/// An operator's force release frees the lease, keeps the fencing sequence, and the
/// former holder learns at its next renewal. Skipped where the backend does not support it.
pub async fn force_release_frees_and_holder_learns(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "force");
    let ttl = base_ttl(&*backend);
    match backend.force_release(&n).await {
        Err(Error::Unsupported { .. }) => return,
        Ok(freed) => assert!(!freed, "nothing was held"),
        Err(e) => panic!("force_release on a free name: {e}"),
    }
    let c = client(&backend, "victim");
    let guard = match c.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
    };
    assert!(backend.force_release(&n).await.expect("force_release"));
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the holder never learnt of the force release");
    assert_eq!(reason, LossReason::NotOwner);
    let o = owner("next");
    let f = raw_acquire(&*backend, &n, &o, ttl).await;
    if backend.capabilities().fencing != Fencing::None {
        assert!(
            f > guard.fencing(),
            "fencing sequence reset by force release"
        );
    }
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::NotOwner
    );
    backend
        .release(&n, &o.token, Duration::ZERO)
        .await
        .expect("release");
}

/// How long past its release a lease released with a sliver of keep-for left may live:
/// the store's minimum TTL where it exceeds the TTL granularity (etcd: 2 s), else nothing.
/// A scheduled job's period must leave room for it (see `ScheduledJob::new`).
pub fn min_ttl_tail(caps: &lease_core::Capabilities) -> Duration {
    if caps.min_ttl > caps.ttl_granularity {
        caps.min_ttl
    } else {
        Duration::ZERO
    }
}
