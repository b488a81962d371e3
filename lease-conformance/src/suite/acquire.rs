//! Checks of acquisition: exclusion, fencing tokens, names, invalid input, waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, Fencing, HolderLabel, InvalidInput, LeaseBackend, LeaseClient,
    LeaseName, LeaseOptions, MAX_TTL, ReleaseOutcome, RenewItem, RenewOutcome, ScheduledJob,
    TryAcquire,
};
use tokio::time::Instant;

use super::support::*;

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
    if !crate::not_applicable::applies(
        &*backend,
        "fencing_increases_across_release",
        crate::not_applicable::Needs::Fencing,
    ) {
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

/// Concurrent acquisitions never hand out the same token twice.
pub async fn fencing_unique_under_contention(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "fencing_unique_under_contention",
        crate::not_applicable::Needs::Fencing,
    ) {
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
                    _ => unreachable!("an outcome added to the enum after this code was written"),
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
        _ => unreachable!("an outcome added to the enum after this code was written"),
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
