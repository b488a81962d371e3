//! The comparison scenarios (the usual alternatives for a distributed lock): each runs the
//! alternatives side by side on one store and returns what it measured. Tests assert on the
//! results; `lease-scenarios` writes them as a table.
//!
//! Timings scale with the store's TTL granularity: a scenario that the documents describe
//! with a 100 ms TTL uses `capabilities().effective_ttl(100 ms)` (1 s on etcd) and scales
//! the work to match.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{
    AcquireOutcome, CancellationToken, HolderLabel, JobStats, LeaseBackend, LeaseClient, LeaseName,
    LeaseOptions, LossReason, Owner, RunOutcome, ScheduledJob, Semaphore, TryAcquire, TryPermit,
};
use tokio::time::Instant;

use lease_conformance::{Fault, FaultyBackend};

fn label(s: &str) -> HolderLabel {
    HolderLabel::new(s).expect("label")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Room capacity: concurrent joiners check a room's head count and then join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoomResult {
    /// Joiners that got in.
    pub joined: usize,
    /// The room's capacity.
    pub capacity: usize,
}

/// 30 joiners, capacity 3, check-then-join with no lock: the room overfills.
pub async fn room_without_lock(joiners: usize, capacity: usize) -> RoomResult {
    let count = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..joiners {
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            let seen = count.load(Ordering::SeqCst);
            // The gap between the check and the act (a round trip in the real service).
            tokio::time::sleep(Duration::from_millis(5)).await;
            if seen < capacity {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    RoomResult {
        joined: count.load(Ordering::SeqCst),
        capacity,
    }
}

/// The same, with check-then-join under a lease on the room: exactly `capacity` join.
pub async fn room_with_lease(
    backend: Arc<dyn LeaseBackend>,
    joiners: usize,
    capacity: usize,
) -> RoomResult {
    let room = unique("room");
    let count = Arc::new(AtomicUsize::new(0));
    let client = LeaseClient::with_label(backend.clone(), label("joiner"));
    let ttl = backend.capabilities().effective_ttl(Duration::from_secs(5));
    let opts = LeaseOptions::builder(ttl)
        .wait(Duration::from_secs(60))
        .build()
        .expect("options");
    let mut tasks = Vec::new();
    for _ in 0..joiners {
        let (count, client, opts, room) =
            (count.clone(), client.clone(), opts.clone(), room.clone());
        tasks.push(tokio::spawn(async move {
            let out = client
                .run_exclusive(&room, &opts, |_| async {
                    let seen = count.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if seen < capacity {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .await;
            out.is_ok()
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap_or(false), "a joiner failed to get the lease");
    }
    RoomResult {
        joined: count.load(Ordering::SeqCst),
        capacity,
    }
}

/// The room as a semaphore of `capacity` permits: each joiner takes a permit (a seat) and
/// keeps it while in the room; a joiner that finds every permit taken is turned away.
/// No check-then-act and no mutex around a head count: the store's per-slot mutual
/// exclusion is the capacity. Joiners stay until all have tried, so `joined` is the
/// number of seats taken at once; the answer also says how long the 30 attempts took.
pub async fn room_with_semaphore(
    backend: Arc<dyn LeaseBackend>,
    joiners: usize,
    capacity: usize,
) -> (RoomResult, Duration) {
    let room = unique("room-semaphore");
    let client = LeaseClient::with_label(backend.clone(), label("joiner"));
    let permits = u32::try_from(capacity).expect("capacity");
    let sem = Semaphore::new(client, &room, permits).expect("semaphore");
    let ttl = backend.capabilities().effective_ttl(Duration::from_secs(5));
    let opts = LeaseOptions::new(ttl).expect("options");
    let all_tried = Arc::new(tokio::sync::Barrier::new(joiners));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..joiners {
        let (sem, opts, all_tried) = (sem.clone(), opts.clone(), all_tried.clone());
        tasks.push(tokio::spawn(async move {
            let seat = match sem.try_acquire(&opts).await {
                Ok(TryPermit::Acquired(p)) => Some(p),
                Ok(TryPermit::Full(_)) => None,
                Err(e) => panic!("a joiner's try failed: {e}"),
                _ => unreachable!("an outcome added to the enum after this code was written"),
            };
            all_tried.wait().await;
            let joined = seat.is_some();
            if let Some(p) = seat {
                p.release().await.expect("leave the room");
            }
            joined
        }));
    }
    let mut joined = 0;
    for t in tasks {
        if t.await.expect("joiner") {
            joined += 1;
        }
    }
    (RoomResult { joined, capacity }, started.elapsed())
}

/// Duplicate holders over a run: how many tasks held at once at most, and how many
/// acquired at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldersResult {
    /// Tasks that acquired the lease.
    pub acquired: usize,
    /// Largest number of tasks that held it (and worked) at the same time.
    pub max_concurrent: usize,
    /// Holders whose guard reported the lease lost mid-work (the watchdog's renewals
    /// did not land in time); each stopped working when told, as a caller must.
    pub lost: usize,
    /// The first loss a holder heard: why, and how long after its acquire returned
    /// (what a failed check prints, to tell a store's answer from a renewal that came
    /// too late).
    pub first_loss: Option<(LossReason, Duration)>,
}

/// The seed's TTL for [`fixed_ttl_vs_watchdog`]: 100 ms (1,000 threads, 1 s of work).
pub const SEED_004_TTL: Duration = Duration::from_millis(100);

/// Seed 004: `tasks` tasks start spread over the first holder's work time; each tries once; the one
/// that gets the lease works for ten TTLs. With a fixed TTL shorter than the work and no
/// watchdog (`watchdog == false`) the lease lapses mid-work and others get in; with the
/// watchdog it is renewed and nobody else does.
///
/// `ttl` is what the tasks ask for ([`SEED_004_TTL`] in the seed; the store may round it
/// up to its shortest). The watchdog keeps the lease only while each renewal's round
/// trip, on a machine shared by 1,000 contenders, fits in about half the TTL: the
/// renewal is due a third of the way in, and the safety deadline is at nine tenths.
pub async fn fixed_ttl_vs_watchdog(
    backend: Arc<dyn LeaseBackend>,
    tasks: usize,
    ttl: Duration,
    watchdog: bool,
) -> HoldersResult {
    let ttl = backend.capabilities().effective_ttl(ttl);
    let work = ttl * 10;
    let name = LeaseName::new(unique("fixed-ttl")).expect("name");
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let first_loss = Arc::new(std::sync::OnceLock::new());
    let client = LeaseClient::with_label(backend.clone(), label("worker"));
    let opts = LeaseOptions::new(ttl).expect("options");
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (backend, name, inside, max_inside, acquired, lost, first_loss, client, opts) = (
            backend.clone(),
            name.clone(),
            inside.clone(),
            max_inside.clone(),
            acquired.clone(),
            lost.clone(),
            first_loss.clone(),
            client.clone(),
            opts.clone(),
        );
        // Tries spread over 90% of the first holder's work, so that every try falls
        // inside it.
        let offset = work * 9 / 10 * u32::try_from(i).unwrap_or(u32::MAX)
            / u32::try_from(tasks).unwrap_or(1);
        handles.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + offset).await;
            let enter = || {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                acquired.fetch_add(1, Ordering::SeqCst);
            };
            if watchdog {
                if let Ok(TryAcquire::Acquired(g)) = client.try_acquire(&name, &opts).await {
                    enter();
                    let held_from = Instant::now();
                    // The work stops when the guard says the lease is lost, as a caller
                    // must: the guard says so before another holder can take it.
                    tokio::select! {
                        () = tokio::time::sleep(work) => {}
                        reason = g.lost() => {
                            lost.fetch_add(1, Ordering::SeqCst);
                            let _ = first_loss.set((reason, held_from.elapsed()));
                        }
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = g.release().await;
                }
            } else {
                let owner = Owner::new(label("worker"));
                if let Ok(AcquireOutcome::Acquired { .. }) =
                    backend.acquire(&name, &owner, ttl).await
                {
                    enter();
                    tokio::time::sleep(work).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = backend.release(&name, &owner.token, Duration::ZERO).await;
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    HoldersResult {
        acquired: acquired.load(Ordering::SeqCst),
        max_concurrent: max_inside.load(Ordering::SeqCst),
        lost: lost.load(Ordering::SeqCst),
        first_loss: first_loss.get().copied(),
    }
}

/// Seed 002, the lockAtMostFor dilemma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DilemmaResult {
    /// Whether a second instance ran the slow job while the first still ran it.
    pub duplicated: bool,
    /// How long after the holder crashed another instance got the lease.
    pub recovery: Duration,
}

/// One alternative of the lockAtMostFor dilemma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DilemmaMode {
    /// A fixed TTL shorter than the job (no renewal).
    ShortFixedTtl,
    /// A fixed TTL long enough for the slowest job (no renewal).
    LongFixedTtl,
    /// A short TTL renewed by the watchdog.
    Watchdog,
}

/// Runs one alternative: (1) a slow job (3x the short TTL) while a second instance polls:
/// does it run the job too? (2) the holder crashes (stops renewing, never releases): how
/// long until the second instance gets the lease?
pub async fn lock_at_most_for_dilemma(
    backend: Arc<dyn LeaseBackend>,
    mode: DilemmaMode,
) -> DilemmaResult {
    let short = backend
        .capabilities()
        .effective_ttl(Duration::from_millis(500));
    let long = short * 6;
    let slow_job = short * 3;
    let poll = short / 10;
    // Part 1: duplication.
    let name = LeaseName::new(unique("dilemma-dup")).expect("name");
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let first = LeaseClient::with_label(faulty.clone(), label("first"));
    let second_owner = Owner::new(label("second"));
    let mut guard = None;
    let first_owner = Owner::new(label("first"));
    match mode {
        DilemmaMode::Watchdog => {
            let opts = LeaseOptions::new(short).expect("options");
            match first.try_acquire(&name, &opts).await {
                Ok(TryAcquire::Acquired(g)) => guard = Some(g),
                other => panic!("first instance could not start: {other:?}"),
            }
        }
        DilemmaMode::ShortFixedTtl | DilemmaMode::LongFixedTtl => {
            let ttl = if mode == DilemmaMode::ShortFixedTtl {
                short
            } else {
                long
            };
            let r = backend.acquire(&name, &first_owner, ttl).await;
            assert!(matches!(r, Ok(AcquireOutcome::Acquired { .. })), "{r:?}");
        }
    }
    let until = Instant::now() + slow_job;
    let mut duplicated = false;
    while Instant::now() < until {
        if let Ok(AcquireOutcome::Acquired { .. }) =
            backend.acquire(&name, &second_owner, short).await
        {
            duplicated = true;
            let _ = backend
                .release(&name, &second_owner.token, Duration::ZERO)
                .await;
            break;
        }
        tokio::time::sleep(poll).await;
    }
    // Part 2: crash recovery. The holder stops dead: no renewal, no release.
    let name = LeaseName::new(unique("dilemma-crash")).expect("name");
    match mode {
        DilemmaMode::Watchdog => {
            if let Some(g) = guard.take() {
                let _ = g.release().await;
            }
            let opts = LeaseOptions::new(short).expect("options");
            match first.try_acquire(&name, &opts).await {
                Ok(TryAcquire::Acquired(g)) => guard = Some(g),
                other => panic!("first instance could not start: {other:?}"),
            }
            faulty.set_all(Fault::Hang);
        }
        DilemmaMode::ShortFixedTtl | DilemmaMode::LongFixedTtl => {
            let ttl = if mode == DilemmaMode::ShortFixedTtl {
                short
            } else {
                long
            };
            let r = backend.acquire(&name, &first_owner, ttl).await;
            assert!(matches!(r, Ok(AcquireOutcome::Acquired { .. })), "{r:?}");
        }
    }
    let crashed = Instant::now();
    let recovery = loop {
        if let Ok(AcquireOutcome::Acquired { .. }) =
            backend.acquire(&name, &second_owner, short).await
        {
            break crashed.elapsed();
        }
        assert!(crashed.elapsed() < long * 3, "no recovery");
        tokio::time::sleep(poll).await;
    };
    if let Some(g) = guard {
        g.disarm();
    }
    let _ = backend
        .release(&name, &second_owner.token, Duration::ZERO)
        .await;
    DilemmaResult {
        duplicated,
        recovery,
    }
}

/// Seed 003, lockAtLeastFor: two instances with schedules `skew` apart run a fast job
/// every `period`. Returns how many times the job ran over `periods` periods.
///
/// With `keep_for`, each instance is a [`ScheduledJob`] with keep-for a little below the
/// period. Without it, each instance ticks on its own and runs the job under
/// [`LeaseClient::run_exclusive`] (a lock without lockAtLeastFor, which `ScheduledJob`
/// refuses to be).
pub async fn lock_at_least_for(
    backend: Arc<dyn LeaseBackend>,
    keep_for: bool,
    periods: u32,
) -> JobStats {
    let caps = backend.capabilities();
    let ttl = caps.effective_ttl(Duration::from_millis(500));
    // Keep-for must end before the next tick. Where TTLs are coarse (etcd: whole seconds,
    // expired up to 0.5 s late) it is rounded up on the store, so leave that much room;
    // where the store has a minimum TTL above its granularity (ZooKeeper: two ticks of
    // its server), a run released shortly before its keep-for ends keeps the lease that
    // long, which `ScheduledJob` refuses unless it fits below the period. The larger of
    // the two rooms is left (each alone is what its case needs).
    let coarse = caps.ttl_granularity >= Duration::from_secs(1);
    let coarse_slack = if coarse {
        caps.ttl_granularity + Duration::from_millis(500)
    } else {
        Duration::ZERO
    };
    let min_ttl_tail = caps.keep_for_overrun();
    let slack = coarse_slack.max(min_ttl_tail);
    let period = if coarse { ttl * 4 } else { ttl * 2 };
    let skew = period / 5;
    let mut b = LeaseOptions::builder(ttl);
    if keep_for {
        b = b.keep_for(period * 9 / 10 - slack);
    }
    let opts = b.build().expect("options");
    let name = unique("at-least-for");
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let fast_job = |_| async {
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for i in 0..2u32 {
        let client = LeaseClient::with_label(backend.clone(), label(&format!("instance-{i}")));
        let shutdown = shutdown.clone();
        if keep_for {
            let job = ScheduledJob::new(client, &name, period, opts.clone()).expect("job");
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(skew * i).await;
                job.run(shutdown, fast_job).await
            }));
            continue;
        }
        let (name, opts) = (name.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(skew * i).await;
            let mut stats = JobStats::default();
            let mut ticks = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return stats,
                    _ = ticks.tick() => {}
                }
                match client.run_exclusive(&name, &opts, fast_job).await {
                    Ok(RunOutcome::Ran(())) => stats.ran += 1,
                    Ok(RunOutcome::Skipped(_)) => stats.skipped += 1,
                    Ok(RunOutcome::Lost(_)) => stats.lost += 1,
                    Err(_) => stats.store_errors += 1,
                    _ => unreachable!("an outcome added to the enum after this code was written"),
                }
            }
        }));
    }
    tokio::time::sleep(period * periods - period / 2).await;
    shutdown.cancel();
    let mut total = JobStats::default();
    for t in tasks {
        if let Ok(s) = t.await {
            total.ran += s.ran;
            total.skipped += s.skipped;
            total.lost += s.lost;
            total.store_errors += s.store_errors;
        }
    }
    total
}

/// A session advisory lock vs a lease: the holder is alive but stuck (frozen: it neither renews nor
/// releases, but its connection stays open). Returns how long until another instance got
/// in, or `None` if it was still blocked after `give_up`.
pub async fn stuck_holder_lease(
    backend: Arc<dyn LeaseBackend>,
    give_up: Duration,
) -> Option<Duration> {
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_millis(500));
    let name = LeaseName::new(unique("stuck")).expect("name");
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let stuck = LeaseClient::with_label(faulty.clone(), label("stuck"));
    let opts = LeaseOptions::new(ttl).expect("options");
    let guard = match stuck.try_acquire(&name, &opts).await {
        Ok(TryAcquire::Acquired(g)) => g,
        other => panic!("could not start: {other:?}"),
    };
    faulty.set_all(Fault::Hang);
    let frozen = Instant::now();
    let other = Owner::new(label("other"));
    let result = loop {
        if let Ok(AcquireOutcome::Acquired { .. }) = backend.acquire(&name, &other, ttl).await {
            let _ = backend.release(&name, &other.token, Duration::ZERO).await;
            break Some(frozen.elapsed());
        }
        if frozen.elapsed() > give_up {
            break None;
        }
        tokio::time::sleep(ttl / 10).await;
    };
    guard.disarm();
    result
}

/// Room capacity with Redis optimistic locking (WATCH / MULTI / EXEC): exactly `capacity`
/// join, at the cost of aborted transactions that must be retried. Returns the result and
/// the number of aborted attempts.
pub async fn room_with_watch_multi(
    url: &str,
    joiners: usize,
    capacity: usize,
) -> Result<(RoomResult, usize), String> {
    use leasehold::redis::redis;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let key = unique("room-watch");
    let aborted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..joiners {
        // WATCH belongs to a connection: one per joiner.
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let (key, aborted) = (key.clone(), aborted.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                redis::cmd("WATCH")
                    .arg(&key)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let seen: Option<usize> = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if seen.unwrap_or(0) >= capacity {
                    redis::cmd("UNWATCH")
                        .query_async::<()>(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Ok::<bool, String>(false);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                let done: Option<(i64,)> = redis::pipe()
                    .atomic()
                    .cmd("INCR")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                match done {
                    Some(_) => return Ok(true),
                    None => {
                        aborted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    let mut joined = 0;
    for t in tasks {
        if t.await.map_err(|e| e.to_string())?? {
            joined += 1;
        }
    }
    Ok((
        RoomResult { joined, capacity },
        aborted.load(Ordering::SeqCst),
    ))
}
