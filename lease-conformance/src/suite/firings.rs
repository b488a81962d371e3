//! Checks of scheduled jobs on a schedule of instants (cron, fixed rate): instances with
//! skewed clocks, started at random points of the period, run each firing exactly once;
//! a run dropped mid-way is followed by the next firing on another instance.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lease_core::{
    CancellationToken, JobStats, LeaseBackend, LeaseOptions, MissedFirings, Schedule, ScheduledJob,
};

use crate::faulty::{Fault, FaultyBackend, Op};
use crate::not_applicable::{Needs, applies};

use super::support::*;

/// What several instances of one scheduled job did.
#[derive(Debug)]
pub struct Firings {
    /// Every firing that ran, with the instances (by index) that ran it.
    pub runs: BTreeMap<SystemTime, Vec<usize>>,
    /// The firings every instance was up for (each must have run exactly once).
    pub expected: Vec<SystemTime>,
    /// Each instance's counts.
    pub stats: Vec<JobStats>,
}

impl Firings {
    /// Firings run more than once.
    pub fn twice(&self) -> Vec<(SystemTime, Vec<usize>)> {
        self.runs
            .iter()
            .filter(|(_, who)| who.len() > 1)
            .map(|(f, who)| (*f, who.clone()))
            .collect()
    }

    /// Expected firings that no instance ran.
    pub fn missed(&self) -> Vec<SystemTime> {
        self.expected
            .iter()
            .filter(|f| !self.runs.contains_key(f))
            .copied()
            .collect()
    }

    /// Panics unless every expected firing ran exactly once and none ran twice.
    pub fn assert_each_once(&self) {
        assert!(
            self.twice().is_empty(),
            "firings run twice: {:?} (stats {:?})",
            self.twice(),
            self.stats
        );
        assert!(
            self.missed().is_empty(),
            "firings no instance ran: {:?} of {} (stats {:?})",
            self.missed(),
            self.expected.len(),
            self.stats
        );
    }
}

/// Runs one instance of job `name` on `schedule` per entry of `offsets_ms` (each
/// instance's clock shifted by that many milliseconds; the job is told the largest
/// difference as its max skew), each started at a random point within `stagger`, until
/// `firings` firings have passed after the last one started. Each run takes 50 ms.
pub async fn skewed_instances(
    backend: Arc<dyn LeaseBackend>,
    name: &str,
    schedule: Schedule,
    offsets_ms: &[i64],
    stagger: Duration,
    firings: usize,
) -> Firings {
    let spread = offsets_ms.iter().max().copied().unwrap_or(0)
        - offsets_ms.iter().min().copied().unwrap_or(0);
    let max_skew = Duration::from_millis(spread.unsigned_abs()).max(Duration::from_millis(1));
    let opts = LeaseOptions::new(base_ttl(&*backend).max(Duration::from_secs(2))).expect("opts");
    let runs: Arc<Mutex<BTreeMap<SystemTime, Vec<usize>>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let started_by = tokio::time::Instant::now() + stagger;
    for (i, offset) in offsets_ms.iter().copied().enumerate() {
        let job = ScheduledJob::on(
            client(&backend, &format!("instance-{i}")),
            name,
            schedule.clone(),
            opts.clone(),
        )
        .expect("job")
        .with_max_skew(max_skew)
        .expect("skew")
        .with_clock_offset_ms(offset);
        let (runs, shutdown) = (runs.clone(), shutdown.clone());
        let start = stagger.mul_f64(fastrand::f64());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start).await;
            job.run(shutdown, move |ctx| {
                let runs = runs.clone();
                async move {
                    let firing = ctx.firing.expect("a firing of a schedule of instants");
                    runs.lock()
                        .expect("lock")
                        .entry(firing)
                        .or_default()
                        .push(i);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
        }));
    }
    tokio::time::sleep_until(started_by).await;
    // Every instance is up from here (true time); judge the firings after every clock,
    // however skewed, has passed this point, and before the stop, with room for the
    // latest clock and a run.
    let all_up = SystemTime::now() + Duration::from_millis(spread.unsigned_abs() + 200);
    let mut expected = Vec::with_capacity(firings);
    let mut next = schedule.next_after(all_up);
    while let Some(f) = next {
        if expected.len() == firings {
            break;
        }
        expected.push(f);
        next = schedule.next_after(f);
    }
    let last = *expected.last().expect("firings");
    let stop_at = last + max_skew + Duration::from_millis(1500);
    if let Ok(wait) = stop_at.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    shutdown.cancel();
    let mut stats = Vec::new();
    for t in tasks {
        stats.push(t.await.expect("instance task"));
    }
    let runs = runs.lock().expect("lock").clone();
    Firings {
        runs,
        expected,
        stats,
    }
}

/// Three instances with clocks up to 1 s apart (-500 ms, 0, +500 ms), started at random
/// points of a 1 s fixed rate, run each of 6 firings exactly once.
pub async fn firings_run_once_across_skewed_instances(backend: Arc<dyn LeaseBackend>) {
    if !applies(
        &*backend,
        "firings_run_once_across_skewed_instances",
        Needs::KeepFor,
    ) {
        return;
    }
    let ns = namespace();
    let name = format!("{ns}firings");
    let schedule = Schedule::fixed_rate(Duration::from_secs(1)).expect("schedule");
    let firings = skewed_instances(
        backend,
        &name,
        schedule,
        &[-500, 0, 500],
        Duration::from_secs(1),
        6,
    )
    .await;
    eprintln!(
        "{} firings, {} runs, stats {:?}",
        firings.expected.len(),
        firings.runs.len(),
        firings.stats
    );
    firings.assert_each_once();
}

/// The run of a firing that is dropped mid-way (its instance's task aborted) holds the
/// job's lease until the drop releases it; the next firing after that runs on another
/// instance, and no firing runs twice.
pub async fn firing_after_a_dropped_run_runs_elsewhere(backend: Arc<dyn LeaseBackend>) {
    if !applies(
        &*backend,
        "firing_after_a_dropped_run_runs_elsewhere",
        Needs::KeepFor,
    ) {
        return;
    }
    let ns = namespace();
    let name = format!("{ns}dropped-run");
    let schedule = Schedule::fixed_rate(Duration::from_secs(1)).expect("schedule");
    let opts = LeaseOptions::new(base_ttl(&*backend).max(Duration::from_secs(2))).expect("opts");
    let runs: Arc<Mutex<Vec<(SystemTime, usize)>>> = Arc::default();
    let hung = Arc::new(tokio::sync::Notify::new());
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..2usize {
        let job = ScheduledJob::on(
            client(&backend, &format!("instance-{i}")),
            &name,
            schedule.clone(),
            opts.clone(),
        )
        .expect("job");
        let (runs, hung, shutdown) = (runs.clone(), hung.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            job.run(shutdown, move |ctx| {
                let (runs, hung) = (runs.clone(), hung.clone());
                async move {
                    let first = {
                        let mut runs = runs.lock().expect("lock");
                        runs.push((ctx.firing.expect("firing"), i));
                        runs.len() == 1
                    };
                    if first {
                        // The first run hangs until its task is aborted.
                        hung.notify_one();
                        std::future::pending::<()>().await;
                    }
                }
            })
            .await
        }));
    }
    tokio::time::timeout(Duration::from_secs(10), hung.notified())
        .await
        .expect("no firing ran within 10 s");
    let hanging = runs.lock().expect("lock")[0].1;
    // Two more firings pass while the run hangs: skipped, the job's lease is held.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        runs.lock().expect("lock").len(),
        1,
        "a firing ran beside the hanging run"
    );
    tasks[hanging].abort();
    let aborted_at = SystemTime::now();
    let by = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let after: Vec<(SystemTime, usize)> = runs
            .lock()
            .expect("lock")
            .iter()
            .filter(|(f, _)| *f > aborted_at)
            .copied()
            .collect();
        if let Some((_, who)) = after.first() {
            assert_ne!(*who, hanging, "the aborted instance ran again");
            break;
        }
        assert!(
            tokio::time::Instant::now() < by,
            "no firing ran within 10 s after the hanging run was dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    for (i, t) in tasks.into_iter().enumerate() {
        if i != hanging {
            t.await.expect("instance task");
        }
    }
    let runs = runs.lock().expect("lock").clone();
    let mut seen = std::collections::BTreeSet::new();
    for (f, _) in &runs {
        assert!(seen.insert(*f), "firing {f:?} ran twice: {runs:?}");
    }
}

/// Under [`MissedFirings::RunOnce`], a firing that no instance was up for runs once, late,
/// when instances come back: two that start together, and whose first tries fail with a
/// store error (they start before the store answers them), run it once between them
/// when the store answers again, one that starts after them does not run it again, one
/// with the default policy ([`MissedFirings::Skip`]) does not run it, and the next firing
/// runs once as usual and is not run again by an instance that starts after every
/// instance has tried it.
///
/// The instances' clocks are shifted together so that they start 1.2 s after a firing of
/// a fixed rate whose period leaves room for the recovery on this store (its TTL
/// granularity and minimum TTL): that firing passed with no instance up.
pub async fn missed_firing_runs_once_on_recovery(backend: Arc<dyn LeaseBackend>) {
    if !applies(
        &*backend,
        "missed_firing_runs_once_on_recovery",
        Needs::KeepFor,
    ) {
        return;
    }
    let caps = backend.capabilities();
    let ns = namespace();
    let name = format!("{ns}recovery");
    let (skew, window) = (Duration::from_millis(100), Duration::from_millis(300));
    // Every instance has tried a firing 1 s after it (window + 2 * skew + 0.5 s); a
    // recovery must end its record 3 * skew + 0.5 s, the granularity and the minimum TTL
    // before the next one; 1.5 s more leave room for the runs.
    let needed = Duration::from_millis(1000 + 300 + 500 + 1500)
        + caps.ttl_granularity
        + caps.min_ttl.max(Duration::from_millis(500));
    let period = Duration::from_secs(needed.as_secs_f64().ceil() as u64);
    let schedule = Schedule::fixed_rate(period).expect("schedule");
    let period_ms = period.as_millis() as i64;
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let offset_ms = (1200 - now_ms % period_ms).rem_euclid(period_ms);
    let shifted = SystemTime::now() + Duration::from_millis(offset_ms as u64);
    let missed = schedule
        .last_at_or_before(shifted)
        .expect("the firing that passed");
    let following = schedule.next_after(missed).expect("the next firing");
    let opts = LeaseOptions::new(base_ttl(&*backend).max(Duration::from_secs(2))).expect("opts");
    let runs: Arc<Mutex<Vec<(SystemTime, usize)>>> = Arc::default();
    let ran = Arc::new(tokio::sync::Notify::new());
    let shutdown = CancellationToken::new();
    // The two that start together reach the store through this one.
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let unreachable: Arc<dyn LeaseBackend> = faulty.clone();
    let start = |i: usize, policy: MissedFirings, through: &Arc<dyn LeaseBackend>| {
        let job = ScheduledJob::on(
            client(through, &format!("instance-{i}")),
            &name,
            schedule.clone(),
            opts.clone(),
        )
        .expect("job")
        .with_max_skew(skew)
        .expect("skew")
        .with_start_window(window)
        .expect("window")
        .with_clock_offset_ms(offset_ms)
        .with_missed_firings(policy);
        let (runs, ran, shutdown) = (runs.clone(), ran.clone(), shutdown.clone());
        tokio::spawn(async move {
            job.run(shutdown, move |ctx| {
                let (runs, ran) = (runs.clone(), ran.clone());
                async move {
                    runs.lock()
                        .expect("lock")
                        .push((ctx.firing.expect("firing"), i));
                    ran.notify_waiters();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
        })
    };
    let wait_for = |firing: SystemTime, within: Duration| {
        let (runs, ran) = (runs.clone(), ran.clone());
        async move {
            let by = tokio::time::Instant::now() + within;
            loop {
                let notified = ran.notified();
                if runs.lock().expect("lock").iter().any(|(f, _)| *f == firing) {
                    return;
                }
                if tokio::time::timeout_at(by, notified).await.is_err() {
                    panic!(
                        "firing {firing:?} did not run within {within:?}: runs {:?}",
                        runs.lock().expect("lock")
                    );
                }
            }
        }
    };
    // Their first tries fail, as when the store does not answer yet (a session or a
    // connection still being opened); they try again once it answers.
    faulty.set(Op::Acquire, Fault::Fail);
    let mut tasks = vec![
        start(0, MissedFirings::RunOnce, &unreachable),
        start(1, MissedFirings::RunOnce, &unreachable),
        start(2, MissedFirings::Skip, &backend),
    ];
    tokio::time::timeout(
        Duration::from_secs(2),
        faulty.wait_for_calls(Op::Acquire, 2),
    )
    .await
    .expect("the two recovering instances tried within 2 s of their start");
    faulty.set(Op::Acquire, Fault::Pass);
    wait_for(missed, Duration::from_secs(3)).await;
    // After the recovery ran: a late starter finds the firing taken.
    tasks.push(start(3, MissedFirings::RunOnce, &backend));
    wait_for(following, period + Duration::from_secs(3)).await;
    // The next firing ran at its instant; an instance that starts once every instance has
    // tried it finds it taken and does not recover it.
    let settled = following + Duration::from_millis(1200);
    let shifted_now = SystemTime::now() + Duration::from_millis(offset_ms as u64);
    if let Ok(wait) = settled.duration_since(shifted_now) {
        tokio::time::sleep(wait).await;
    }
    tasks.push(start(4, MissedFirings::RunOnce, &backend));
    // Room for a second run of either firing, were there one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    let mut stats = Vec::new();
    for t in tasks {
        stats.push(t.await.expect("instance task"));
    }
    let runs = runs.lock().expect("lock").clone();
    let of = |f: SystemTime| runs.iter().filter(|(g, _)| *g == f).collect::<Vec<_>>();
    assert_eq!(
        of(missed).len(),
        1,
        "the missed firing ran {} times: {runs:?} (stats {stats:?})",
        of(missed).len()
    );
    assert!(
        of(missed)[0].1 < 2,
        "the missed firing ran on an instance that should not recover it: {runs:?}"
    );
    assert_eq!(
        of(following).len(),
        1,
        "the next firing ran {} times: {runs:?} (stats {stats:?})",
        of(following).len()
    );
    assert_eq!(runs.len(), 2, "other firings ran: {runs:?}");
    assert_eq!(
        stats.iter().map(|s| s.recovered).sum::<u64>(),
        1,
        "recovered counts: {stats:?}"
    );
}
