//! Timing of the shared layer under tokio's paused clock: exact, fast and not flaky.
//! The in-memory backend follows the same clock, so "the store" expires leases exactly
//! when the clock says.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{Fault, FaultyBackend, Op};
use lease_core::{
    HolderLabel, JobStats, LeaseBackend, LeaseClient, LeaseOptions, LossReason, MemoryBackend,
    ScheduledJob, TryAcquire,
};
use tokio::time::Instant;

fn setup() -> (Arc<MemoryBackend>, Arc<FaultyBackend>, LeaseClient) {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(memory.clone()));
    let client = LeaseClient::with_label(faulty.clone(), HolderLabel::new("paused").unwrap());
    (memory, faulty, client)
}

/// A slow store: renew calls of at most ten leases, each taking the store a second.
fn slow_store() -> (Arc<FaultyBackend>, LeaseClient) {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(memory).with_max_renew_batch(10));
    faulty.set(Op::Renew, Fault::Delay(Duration::from_secs(1)));
    let client = LeaseClient::with_label(faulty.clone(), HolderLabel::new("paused").unwrap());
    (faulty, client)
}

async fn held(client: &LeaseClient, name: &str, opts: &LeaseOptions) -> lease_core::LeaseGuard {
    match client.try_acquire(name, opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

#[tokio::test(start_paused = true)]
async fn thousand_leases_cost_one_renew_call_per_tick() {
    let (_memory, faulty, client) = setup();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(held(&client, &format!("lease-{i}"), &opts).await);
    }
    // Five renewal periods (10 s each) and a little.
    tokio::time::sleep(Duration::from_secs(51)).await;
    let log = faulty.renew_log();
    assert_eq!(log.len(), 5, "one renew call per tick");
    assert!(log.iter().all(|c| c.names.len() == 1000));
    assert!(guards.iter().all(|g| g.is_held()));
}

/// A tick of many batches on a slow store: at most four `renew` calls are in flight at
/// once (`lease_core::raw::RENEW_CALLS_IN_FLIGHT`), the others start as calls finish, so
/// no call waits behind more than three others, and every lease is renewed.
#[tokio::test(start_paused = true)]
async fn a_tick_of_many_batches_keeps_at_most_four_renew_calls_in_flight() {
    let (faulty, client) = slow_store();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let start = Instant::now();
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(held(&client, &format!("lease-{i}"), &opts).await);
    }
    // The first tick is due 10 s after the acquisitions: ten calls of ten leases, four at
    // a time, a second each: over by 13 s.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let log = faulty.renew_log();
    assert_eq!(log.len(), 10, "ten calls of ten leases: {log:?}");
    assert!(log.iter().all(|c| c.names.len() == 10));
    let finished: Vec<_> = log
        .iter()
        .map(|c| (c.started, c.finished.expect("every call finished")))
        .collect();
    let most_at_once = finished
        .iter()
        .map(|(s, f)| finished.iter().filter(|(s2, f2)| s2 < f && s < f2).count())
        .max()
        .unwrap();
    assert_eq!(most_at_once, lease_core::raw::RENEW_CALLS_IN_FLIGHT);
    let last = finished.iter().map(|(_, f)| *f).max().unwrap();
    assert_eq!(
        last - start,
        Duration::from_secs(13),
        "4 + 4 + 2 calls of 1 s from 10 s"
    );
    assert!(guards.iter().all(|g| g.is_held()));
}

/// The calls of one tick go out a few at a time, so on a slow store a tick lasts a
/// while; the leases it renews are next due one period after the pass that planned the
/// tick, not after their own call, so they stay together. 150 leases acquired over 25 s
/// (longer than a renewal period), renew calls of ten leases taking a second each (a tick
/// of all of them lasts 4 s): once settled, one tick per period renews every lease, and
/// each lease is renewed a period after its last renewal. (Counted from each call's send,
/// the leases of a tick were due spread over its 4 s, and the next tick, planned when the
/// first of them was due, took only some: ticks of 122 and 148 leases every 6 to 7 s.)
#[tokio::test(start_paused = true)]
async fn the_leases_of_a_long_tick_stay_together() {
    let (faulty, client) = slow_store();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let mut guards = Vec::new();
    for i in 0..150 {
        guards.push(held(&client, &format!("lease-{i}"), &opts).await);
        tokio::time::sleep(Duration::from_millis(166)).await; // spread over 25 s
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let settled = Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let log: Vec<_> = faulty
        .renew_log()
        .into_iter()
        .filter(|c| c.started >= settled)
        .collect();
    // Ticks: calls that start within 2 s of the one before.
    let mut ticks: Vec<Vec<&lease_conformance::RenewCall>> = Vec::new();
    for c in &log {
        match ticks.last_mut() {
            Some(t) if c.started <= t[t.len() - 1].started + Duration::from_secs(2) => t.push(c),
            _ => ticks.push(vec![c]),
        }
    }
    let sizes: Vec<usize> = ticks
        .iter()
        .map(|t| t.iter().map(|c| c.names.len()).sum())
        .collect();
    assert!(
        sizes.len() >= 5 && sizes[1..sizes.len() - 1].iter().all(|n| *n == 150),
        "one tick of every lease per period, leases per tick: {sizes:?}"
    );
    for name in (0..150).map(|i| format!("lease-{i}")) {
        let at: Vec<Instant> = log
            .iter()
            .filter(|c| c.names.iter().any(|n| n.to_string_lossy() == name))
            .map(|c| c.started)
            .collect();
        let apart: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            apart.iter().all(|d| *d >= Duration::from_secs(10)),
            "{name} renewed {apart:?} apart"
        );
    }
    assert!(guards.iter().all(|g| g.is_held()));
}

#[tokio::test(start_paused = true)]
async fn leases_acquired_apart_fall_into_step() {
    let (_memory, faulty, client) = setup();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(held(&client, &format!("lease-{i}"), &opts).await);
        tokio::time::sleep(Duration::from_millis(70)).await; // spread over 7 s
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let settled = faulty.renew_log().len();
    tokio::time::sleep(Duration::from_secs(50)).await;
    let log = faulty.renew_log();
    assert_eq!(
        log.len() - settled,
        5,
        "after settling: one call per 10 s tick"
    );
    assert!(log[settled..].iter().all(|c| c.names.len() == 100));
}

#[tokio::test(start_paused = true)]
async fn lost_signal_fires_exactly_at_the_safety_deadline() {
    let (memory, faulty, client) = setup();
    let opts = LeaseOptions::builder(Duration::from_secs(30))
        .safety_margin(Duration::from_secs(3))
        .build()
        .unwrap();
    let start = Instant::now();
    let guard = held(&client, "job", &opts).await;
    // Two renewals succeed (t = 10 s, 20 s), then the store goes down at 25 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    faulty.set(Op::Renew, Fault::Fail);
    assert_eq!(guard.deadline() - start, Duration::from_secs(20 + 27));
    let reason = guard.lost().await;
    assert_eq!(reason, LossReason::DeadlinePassed);
    // Lost at last successful send (20 s) + ttl (30 s) - margin (3 s).
    assert_eq!(start.elapsed(), Duration::from_secs(47));
    // Retried with backoff in between (t = 30 s .. 47 s, at most 1 s apart).
    let failed = faulty.renew_log().len() - 2;
    assert!(failed >= 15, "only {failed} retries");
    // The store still has it for another 3 s: nobody else can take it yet.
    let other = LeaseClient::with_label(memory.clone(), HolderLabel::new("other").unwrap());
    assert!(matches!(
        other.try_acquire("job", &opts).await.unwrap(),
        TryAcquire::Held(_)
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(matches!(
        other.try_acquire("job", &opts).await.unwrap(),
        TryAcquire::Acquired(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn hung_store_times_out_and_loses_at_the_deadline() {
    let (_memory, faulty, client) = setup();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    assert_eq!(opts.call_timeout(), Duration::from_secs(5));
    let start = Instant::now();
    let guard = held(&client, "job", &opts).await;
    faulty.set(Op::Renew, Fault::Hang);
    assert_eq!(guard.lost().await, LossReason::DeadlinePassed);
    assert_eq!(start.elapsed(), Duration::from_secs(27));
    assert!(!guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn store_saying_lost_is_reported_as_not_owner_at_the_next_tick() {
    let (_memory, faulty, client) = setup();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let start = Instant::now();
    let guard = held(&client, "job", &opts).await;
    let token = guard.lost_token();
    faulty.set(Op::Renew, Fault::AnswerLost);
    assert_eq!(guard.lost().await, LossReason::NotOwner);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "at the first renewal"
    );
    assert!(token.is_cancelled());
    assert!(!guard.is_held());
    assert_eq!(guard.loss_reason(), Some(LossReason::NotOwner));
}

/// Holds "job" (TTL 30 s, renewal every 10 s, call timeout 5 s) with every renewal
/// delayed by `delay`, releases it while its first renewal is in flight (t = 10 s), and
/// returns how long the release took.
async fn release_during_a_renewal(
    delay: Duration,
) -> (Arc<MemoryBackend>, Arc<FaultyBackend>, Duration) {
    let (memory, faulty, client) = setup();
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    assert_eq!(opts.call_timeout(), Duration::from_secs(5));
    faulty.set(Op::Renew, Fault::Delay(delay));
    let guard = held(&client, "job", &opts).await;
    faulty.wait_for_calls(Op::Renew, 1).await;
    let t0 = Instant::now();
    guard.release().await.unwrap();
    (memory, faulty, t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn release_waits_for_in_flight_renewal() {
    // The renewal answers at t = 12 s.
    let (_memory, faulty, took) = release_during_a_renewal(Duration::from_secs(2)).await;
    assert_eq!(
        took,
        Duration::from_secs(2),
        "release waited for the renewal"
    );
    let renew_done = faulty.renew_log()[0].finished.unwrap();
    assert!(renew_done <= Instant::now());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(faulty.renew_log().len(), 1, "no renewal after release");
}

/// A renewal slower than the call timeout: the heartbeat gives up on it at the call
/// timeout, and the release, which waits for it, goes on then. The fault log shows the
/// renewal dropped, not left in flight.
#[tokio::test(start_paused = true)]
async fn release_waits_for_a_slow_renewal_until_the_call_timeout() {
    // The renewal would answer at t = 18 s; the heartbeat drops it at 15 s.
    let (memory, faulty, took) = release_during_a_renewal(Duration::from_secs(8)).await;
    assert_eq!(
        took,
        Duration::from_secs(5),
        "release waited for the renewal until the call timeout"
    );
    let log = faulty.renew_log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].finished, None, "the renewal never returned");
    assert_eq!(
        log[0].dropped,
        Some(log[0].started + Duration::from_secs(5)),
        "the heartbeat dropped the renewal at the call timeout"
    );
    assert!(
        memory
            .inspect(&lease_core::LeaseName::new("job").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(faulty.renew_log().len(), 1, "no renewal after release");
}

#[tokio::test(start_paused = true)]
async fn scheduled_job_runs_once_per_period_across_instances() {
    let memory: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new());
    let period = Duration::from_secs(60);
    let opts = LeaseOptions::builder(Duration::from_secs(30))
        .keep_for(Duration::from_secs(55))
        .build()
        .unwrap();
    let shutdown = lease_core::CancellationToken::new();
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3u64 {
        let client =
            LeaseClient::with_label(memory.clone(), HolderLabel::new(format!("i{i}")).unwrap());
        let job = ScheduledJob::new(client, "report", period, opts.clone()).unwrap();
        let (shutdown, runs) = (shutdown.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            // Schedules a little apart, as on real hosts.
            tokio::time::sleep(Duration::from_millis(700 * i)).await;
            job.run(shutdown, move |ctx| {
                let runs = runs.clone();
                async move {
                    // A fast job: done long before the next instance's tick.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    runs.lock()
                        .unwrap()
                        .push((Instant::now(), i, ctx.fencing.get()));
                }
            })
            .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(10 * 60 - 5)).await;
    shutdown.cancel();
    let mut total = JobStats::default();
    for t in tasks {
        let s = t.await.unwrap();
        total.ran += s.ran;
        total.skipped += s.skipped;
        total.store_errors += s.store_errors;
    }
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 10, "one run per period in 10 periods: {runs:?}");
    assert_eq!(total.ran, 10);
    assert_eq!(total.skipped, 20);
    assert_eq!(total.store_errors, 0);
}

#[tokio::test(start_paused = true)]
async fn scheduled_job_skips_runs_while_the_store_is_down() {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(memory));
    let client = LeaseClient::with_label(faulty.clone(), HolderLabel::new("solo").unwrap());
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let job = ScheduledJob::new(client, "report", Duration::from_secs(60), opts).unwrap();
    let shutdown = lease_core::CancellationToken::new();
    let s2 = shutdown.clone();
    let f2 = faulty.clone();
    let driver = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(90)).await;
        f2.set_all(Fault::Fail); // down for ticks at 120 s and 180 s
        tokio::time::sleep(Duration::from_secs(120)).await;
        f2.set_all(Fault::Pass);
        tokio::time::sleep(Duration::from_secs(100)).await; // ticks 240 s, 300 s
        s2.cancel();
    });
    let stats = job.run(shutdown, |_| async {}).await;
    driver.await.unwrap();
    assert_eq!(stats.ran, 4, "{stats:?}");
    assert_eq!(stats.store_errors, 2, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn timed_backend_records_calls_past_the_limit_even_when_cancelled() {
    use lease_conformance::TimedBackend;
    let memory = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(memory));
    let timed = TimedBackend::new(faulty.clone(), Duration::from_millis(100));
    let owner = lease_core::Owner::new(HolderLabel::new("t").unwrap());
    let name = lease_core::LeaseName::new("x").unwrap();
    timed
        .acquire(&name, &owner, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        timed.take_overruns().is_empty(),
        "a quick call is not an overrun"
    );
    faulty.set(Op::Inspect, Fault::Hang);
    let _ = tokio::time::timeout(Duration::from_millis(300), timed.inspect(&name)).await;
    let o = timed.take_overruns();
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].operation, "inspect");
    assert_eq!(o[0].took, Duration::from_millis(300));
}

/// A backend that grants a quarter of the TTL asked for on acquire of names starting with
/// "short" (as a store does whose leases are shared and partly elapsed), and passes
/// everything else through.
#[derive(Debug)]
struct ShortGrant(Arc<MemoryBackend>);

#[async_trait::async_trait]
impl LeaseBackend for ShortGrant {
    fn capabilities(&self) -> lease_core::Capabilities {
        self.0.capabilities()
    }
    async fn acquire(
        &self,
        name: &lease_core::LeaseName,
        owner: &lease_core::Owner,
        ttl: Duration,
    ) -> lease_core::Result<lease_core::AcquireOutcome> {
        let ttl = if name.as_bytes().starts_with(b"short") {
            ttl / 4
        } else {
            ttl
        };
        self.0.acquire(name, owner, ttl).await
    }
    async fn renew(
        &self,
        leases: &[lease_core::RenewItem],
        ttl: Duration,
    ) -> lease_core::Result<Vec<lease_core::RenewOutcome>> {
        self.0.renew(leases, ttl).await
    }
    async fn release(
        &self,
        name: &lease_core::LeaseName,
        token: &lease_core::OwnerToken,
        keep_for: Duration,
    ) -> lease_core::Result<lease_core::ReleaseOutcome> {
        self.0.release(name, token, keep_for).await
    }
    async fn inspect(
        &self,
        name: &lease_core::LeaseName,
    ) -> lease_core::Result<Option<lease_core::LeaseInfo>> {
        self.0.inspect(name).await
    }
}

/// A lease granted less TTL than asked is renewed half-way to its first deadline, even
/// when the heartbeat sleeps until a little before that deadline for another lease:
/// registration decides whether to wake the heartbeat by the same rule that schedules the
/// first renewal. (With "wake by the deadline" but "renew half-way", the heartbeat slept
/// on, renewed just before the deadline, and the reply came too late.)
#[tokio::test(start_paused = true)]
async fn a_short_grant_is_renewed_before_its_first_deadline() {
    let memory = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(Arc::new(ShortGrant(memory.clone()))));
    let client = LeaseClient::with_label(faulty.clone(), HolderLabel::new("short").unwrap());
    faulty.set(Op::Renew, Fault::Delay(Duration::from_millis(200)));
    let t0 = Instant::now();
    // The first lease (TTL 20.7 s, renewed every 6.9 s) makes the heartbeat sleep until
    // t = 6.9 s.
    let first = held(
        &client,
        "first",
        &LeaseOptions::new(Duration::from_millis(20_700)).unwrap(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // 40 s asked (margin 4 s), 10 s granted at t = 1 s: first deadline at t = 7 s, first
    // renewal due half-way, at t = 4 s.
    let opts = LeaseOptions::new(Duration::from_secs(40)).unwrap();
    let second = held(&client, "short-second", &opts).await;
    assert_eq!(second.deadline() - Instant::now(), Duration::from_secs(6));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(second.is_held(), "lost: {:?}", second.loss_reason());
    assert!(first.is_held());
    let first_renewal = faulty
        .renew_log()
        .into_iter()
        .find(|c| c.names.iter().any(|n| n.as_bytes() == b"short-second"))
        .unwrap();
    assert_eq!(
        first_renewal.started - t0,
        Duration::from_secs(4),
        "first renewal of the short grant"
    );
}

/// A renewal whose reply comes after the safety deadline does not bring a lost guard
/// back: `is_held` stays false and the reason stays "deadline passed".
#[tokio::test(start_paused = true)]
async fn is_held_never_turns_back_to_true() {
    let (_memory, faulty, client) = setup();
    // TTL 3 s: renew at 1 s, call timeout 1 s, deadline 2.7 s. Renewals fail until
    // t = 2.6 s; the retry sent then is applied at once, but its reply comes 900 ms later,
    // after the deadline.
    let opts = LeaseOptions::builder(Duration::from_secs(3))
        .backoff(Duration::from_millis(10), Duration::from_millis(20))
        .build()
        .unwrap();
    faulty.set(Op::Renew, Fault::Fail);
    let guard = held(&client, "late-reply", &opts).await;
    tokio::time::sleep(Duration::from_millis(2600)).await;
    faulty.set(Op::Renew, Fault::DelayReply(Duration::from_millis(900)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!guard.is_held());
    tokio::time::sleep(Duration::from_secs(1)).await; // the reply (Renewed) has come
    let late = faulty
        .renew_log()
        .into_iter()
        .filter(|c| c.started >= Instant::now() - Duration::from_millis(1200))
        .filter_map(|c| c.finished)
        .count();
    assert_eq!(
        late, 1,
        "one renewal sent before and answered after the deadline"
    );
    assert!(!guard.is_held(), "a late renewal revived a lost guard");
    assert_eq!(guard.loss_reason(), Some(LossReason::DeadlinePassed));
}
