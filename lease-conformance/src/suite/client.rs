//! Checks of the client layer on the backend: the watchdog, `run_exclusive`, release
//! and drop, scheduled jobs, and typed errors while the store is down.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Error, Fencing, FencingToken, JobRun, LeaseBackend, LeaseOptions, LossReason, ReleaseOutcome,
    RunOutcome, ScheduledJob, TryAcquire,
};
use tokio::time::Instant;

use crate::faulty::{Fault, FaultyBackend, Op};

use super::support::*;

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
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    let until = Instant::now() + ttl * 3;
    let mut attempts = 0;
    while Instant::now() < until {
        match b.try_acquire(&n, &options).await.expect("try_acquire") {
            TryAcquire::Held(_) => attempts += 1,
            TryAcquire::Acquired(_) => {
                panic!("a second worker got the lease while the first worked")
            }
            _ => unreachable!("an outcome added to the enum after this code was written"),
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
/// and a renewal in flight during release ends before the release is sent.
///
/// A renewal ends when its reply comes, or when the heartbeat gives up on it at the call
/// timeout (TTL/3 here). Each renewal is delayed by TTL/5, so a store that takes more
/// than the remaining TTL·2/15 (80 ms at the suite's 600 ms TTL) to renew has its
/// renewal dropped at the call timeout (a three-member ZooKeeper ensemble, with four
/// checks at once on two cores); the release then waits for the heartbeat's word of
/// that, not for a reply. Either way nothing of the renewal is outstanding in the client
/// once release returns.
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
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    // Release while the first renewal is in flight.
    faulty.wait_for_calls(Op::Renew, 1).await;
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let released_at = Instant::now();
    let log = faulty.renew_log();
    for call in log.iter().filter(|c| c.names.contains(&n)) {
        let ended = match (call.finished, call.dropped) {
            (Some(finished), _) => finished,
            // Given up on at the call timeout, counted from the heartbeat's send; the
            // log's start is the first poll, a little after the heartbeat set its timer:
            // 10 ms of tolerance for that.
            (None, Some(dropped)) => {
                assert!(
                    dropped + Duration::from_millis(10) >= call.started + options.call_timeout(),
                    "a renewal was dropped {:?} after it started, before the call timeout \
                     ({:?})",
                    dropped - call.started,
                    options.call_timeout()
                );
                dropped
            }
            (None, None) => panic!(
                "a renewal still in flight after release returned (started {:?} before)",
                released_at - call.started
            ),
        };
        assert!(
            ended <= released_at,
            "a renewal ended after release returned"
        );
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
        _ => unreachable!("an outcome added to the enum after this code was written"),
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

/// A scheduled job on three instances runs at most once per keep-for window: each
/// acquisition's call returns at least keep-for after the previous acquisition's call
/// started (the store took each lease between its call's start and return; see
/// `scheduled_job_defaults_once_per_period`).
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
    let mut calls = Vec::new();
    for i in 0..3u32 {
        // Each instance's calls recorded, to bound when the store took each lease.
        let recorded = Arc::new(FaultyBackend::new(backend.clone()));
        calls.push(recorded.clone());
        let job = ScheduledJob::new(
            client(
                &(recorded as Arc<dyn LeaseBackend>),
                &format!("instance-{i}"),
            ),
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
        "{} runs in 4.5 periods: {stats:?}\n{}",
        runs.len(),
        acquire_timeline(&calls)
    );
    for w in runs.windows(2) {
        if caps.fencing != Fencing::None {
            assert!(w[1].1 > w[0].1);
        }
    }
    assert_acquisitions_keep_for_apart(&calls, runs.len(), keep_for, "three instances");
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
