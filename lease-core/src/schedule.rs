//! Scheduled jobs: at most one run per period across all instances.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::client::{LeaseClient, LeaseContext, RunOutcome, TryAcquire, run_with_guard_at};
use crate::error::{Error, InvalidInput};
use crate::shared::LossReason;
use crate::timetable::{Schedule, epoch_nanos};
use crate::types::{HeldBy, LeaseName, LeaseOptions, MAX_TTL};

/// What one tick of a [`ScheduledJob`] did.
#[derive(Debug)]
#[must_use]
#[non_exhaustive]
pub enum JobRun<T> {
    /// This instance ran the job.
    Ran(T),
    /// Another instance holds the lease (running the job, or keeping it for keep-for).
    Skipped(HeldBy),
    /// The lease was lost while the job ran; the job was cancelled.
    Lost(LossReason),
    /// The store could not be asked; the run was skipped.
    StoreError(Error),
    /// This instance came to a firing more than the start window after its instant (the
    /// process was paused, the runtime overloaded) and did not try it: another instance
    /// ran it, or nobody did.
    Missed {
        /// The firing's scheduled instant.
        firing: SystemTime,
        /// How late this instance came to it, by its own clock.
        late_by: Duration,
    },
}

/// Counts of what [`ScheduledJob::run`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobStats {
    /// Ticks on which this instance ran the job.
    pub ran: u64,
    /// Ticks skipped because another instance held the lease.
    pub skipped: u64,
    /// Runs cancelled because the lease was lost.
    pub lost: u64,
    /// Ticks skipped because the store failed.
    pub store_errors: u64,
    /// Firings this instance came to too late to try ([`JobRun::Missed`]).
    pub missed: u64,
    /// Firings that no instance ran at their instant, run late by this instance under
    /// [`MissedFirings::RunOnce`] (also counted in `ran`).
    pub recovered: u64,
}

/// What a job on a schedule of instants (cron, fixed rate) does about a firing that no
/// instance ran at its instant: every instance was down, paused, or cut off from the
/// store. Set with [`ScheduledJob::with_missed_firings`]. Instances of one job may use
/// different policies (during a rolling change of it, say): every instance records the
/// firings it runs, and the policy only decides whether an instance recovers one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissedFirings {
    /// Not run later (the default): the next firing is the next run.
    #[default]
    Skip,
    /// Run once, late, by the first instance that finds it missed (at its start, or
    /// after it came to a firing too late or could not reach the store), if that is
    /// before the next firing comes near. Only the latest missed firing is run, once
    /// across all instances, with [`LeaseContext::firing`] saying which it was. A
    /// recovery try that meets a retryable store error (the store not answering yet at
    /// the instance's start, say) is made again 0.25 s later, then after pauses doubling
    /// up to 8 s, until it runs, finds the firing taken, or the next firing is near.
    ///
    /// The instance that runs a firing (under either policy) keeps the firing's lease
    /// until shortly before the next firing, so that a recovering instance can tell a
    /// firing that ran from one that did not. A firing is recovered only between
    /// `window + 2 * skew + 0.5 s` after its instant (when every instance has tried it)
    /// and `3 * skew + 0.5 s` plus the store's TTL granularity before the next one (and
    /// not within the store's minimum TTL of that point, e.g. etcd's 2 s); with firings
    /// closer than that, the next firing is the recovery. The conformance check
    /// `missed_firing_runs_once_on_recovery` shows it on every store.
    RunOnce,
}

impl<T> From<RunOutcome<T>> for JobRun<T> {
    fn from(outcome: RunOutcome<T>) -> Self {
        match outcome {
            RunOutcome::Ran(t) => JobRun::Ran(t),
            RunOutcome::Lost(r) => JobRun::Lost(r),
            RunOutcome::Skipped(by) => JobRun::Skipped(by),
        }
    }
}

impl JobStats {
    fn count<T>(&mut self, run: &JobRun<T>) {
        match run {
            JobRun::Ran(_) => self.ran += 1,
            JobRun::Skipped(_) => self.skipped += 1,
            JobRun::Lost(_) => self.lost += 1,
            JobRun::StoreError(_) => self.store_errors += 1,
            JobRun::Missed { .. } => self.missed += 1,
        }
    }
}

/// A job that runs on every instance's schedule but at most once per period across all
/// instances, ShedLock style.
///
/// The lease TTL is lockAtMostFor (how long a crashed runner blocks others; the heartbeat
/// keeps it alive while the job runs, so it need not cover the job's duration), keep-for is
/// lockAtLeastFor (how long after the start the lease stays taken even if the job finishes
/// early, so an instance whose schedule is a little behind does not run it again).
///
/// Keep-for must be below the period, so that the instance that ran finds its lease free
/// at its next tick. Left at zero it is derived from the period: the period minus a tenth
/// of it, or minus the store's TTL granularity where that is coarser (etcd rounds up to
/// whole seconds), and at most [`MAX_TTL`]. Instances whose ticks are apart by less than keep-for then run the job
/// once per period between them; an instance further apart than keep-for may run it once
/// more in the first period. A backend that cannot keep a lease after release
/// ([`Capabilities::keep_for`](crate::Capabilities::keep_for) false, e.g. session-bound
/// advisory locks) is refused: without keep-for a fast job runs on every instance.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{JobRun, LeaseClient, LeaseOptions, MemoryBackend, ScheduledJob};
///
/// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
/// let opts = LeaseOptions::builder(Duration::from_secs(30))
///     .keep_for(Duration::from_secs(50))
///     .build()?;
/// let job = ScheduledJob::new(client, "outbox", Duration::from_secs(60), opts)?;
/// let run = job.run_once(|ctx| async move { ctx.fencing }).await;
/// assert!(matches!(run, JobRun::Ran(_)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ScheduledJob {
    client: LeaseClient,
    name: LeaseName,
    mode: Mode,
    opts: LeaseOptions,
    /// How long a run in progress may go on after shutdown (zero: dropped at once).
    grace: Duration,
    /// Added to this instance's wall clock (tests and labs simulate skewed clocks).
    clock_offset_ms: i64,
}

/// How a job's runs are placed in time.
#[derive(Debug, Clone)]
enum Mode {
    /// [`ScheduledJob::new`]: every period, counted from this instance's start.
    Interval(Duration),
    /// Firings at wall-clock instants (cron, fixed rate), one run per firing.
    Instants(Box<Instants>),
    /// A fixed delay after the previous run ended, across instances.
    Delay(Duration),
}

/// The settings of [`Mode::Instants`].
#[derive(Debug, Clone)]
struct Instants {
    schedule: Schedule,
    /// The largest difference between two instances' clocks the job is set up for.
    max_skew: Duration,
    /// How late after a firing's instant (by its own clock) an instance still tries it.
    window: Duration,
    /// How long a firing's slot lease stays taken after its acquisition.
    hold: Duration,
    /// How many slot names the firings cycle through.
    slots: u64,
    /// What happens to a firing no instance ran.
    missed: MissedFirings,
    /// The store's TTL granularity (a lease may end up to that much late).
    granularity: Duration,
}

/// Margin added to a firing's hold for the acquire's round trip and scheduling.
const HOLD_MARGIN: Duration = Duration::from_millis(500);
/// The fewest slot names a job's firings cycle through.
const MIN_SLOTS: u64 = 8;
/// Under [`MissedFirings::RunOnce`], how long after a recovery try that met a retryable
/// store error the next try is made; doubled after each such try, up to
/// [`RECOVERY_RETRY_MAX`].
const RECOVERY_RETRY: Duration = Duration::from_millis(250);
/// The longest pause between recovery tries.
const RECOVERY_RETRY_MAX: Duration = Duration::from_secs(8);

impl ScheduledJob {
    /// A job named `name` run every `period` with the given lease options. The options'
    /// `wait` is ignored: a tick never waits for another instance. A zero keep-for is
    /// derived from the period (see above).
    ///
    /// Errors: [`InvalidInput::PeriodZero`]; [`InvalidInput::KeepForNotBelowPeriod`] for a
    /// keep-for at or above the period; [`InvalidInput::PeriodTooShort`] when no keep-for
    /// can be derived (a period not above the store's TTL granularity);
    /// [`Error::Unsupported`] for a backend without keep-for.
    pub fn new(
        client: LeaseClient,
        name: impl AsRef<[u8]>,
        period: Duration,
        opts: LeaseOptions,
    ) -> Result<Self, Error> {
        if period.is_zero() {
            return Err(InvalidInput::PeriodZero.into());
        }
        let name = LeaseName::new(name)?;
        let caps = client.capabilities();
        needs_keep_for(
            caps,
            "keep-for (lockAtLeastFor), which a scheduled job needs to run at most once per \
             period",
        )?;
        // A lease released with a sliver of its keep-for left may still live the store's
        // minimum TTL (etcd grants at least 2 s): that much more must fit in the period.
        let tail = caps.keep_for_overrun();
        let keep_for = if opts.keep_for().is_zero() {
            let derived = period
                .saturating_sub((period / 10).max(caps.ttl_granularity))
                .saturating_sub(tail)
                .min(MAX_TTL);
            if derived.is_zero() {
                return Err(InvalidInput::PeriodTooShort {
                    period,
                    granularity: caps.ttl_granularity,
                }
                .into());
            }
            derived
        } else {
            opts.keep_for()
        };
        if keep_for >= period {
            return Err(InvalidInput::KeepForNotBelowPeriod { keep_for, period }.into());
        }
        if keep_for.saturating_add(tail) >= period {
            return Err(InvalidInput::KeepForTooLongForStore {
                keep_for,
                period,
                min_ttl: tail,
            }
            .into());
        }
        Ok(ScheduledJob {
            client,
            name,
            mode: Mode::Interval(period),
            opts: opts.with_keep_for(keep_for),
            grace: Duration::ZERO,
            clock_offset_ms: 0,
        })
    }

    /// A job named `name` run on `schedule` with the given lease options (its TTL is
    /// lockAtMostFor; `wait` is ignored).
    ///
    /// For a [`Schedule`] of instants (cron, fixed rate), each firing runs at most once
    /// across all instances, identified by its instant: the instance that runs it takes
    /// the firing's own lease (one of a few slot names, `NAME#n`, that the firings cycle
    /// through) and keeps it after the run for as long as another instance, with a clock
    /// up to [`with_max_skew`](Self::with_max_skew) apart or up to the start window late,
    /// may still try that firing (in practice until shortly before the next firing, see
    /// [`MissedFirings::RunOnce`]); those find it taken and skip it. The job's lease
    /// `NAME` is held while a run goes on, so that a firing that comes while the previous
    /// run still goes on waits for it to end until the start window is over, and is then
    /// skipped rather than run beside it. A firing that no instance
    /// was up for is not run later unless
    /// [`with_missed_firings`](Self::with_missed_firings) says so. The options' keep-for
    /// is not used: the hold follows from the skew, the window and the schedule.
    ///
    /// For [`Schedule::FixedDelay`], instances try the job's lease every quarter of the
    /// delay (at most every second); the one that runs releases it keeping it `delay`
    /// past the end of its run, so that the next run, on any instance, starts `delay`
    /// after the previous one ended (give or take that polling).
    ///
    /// Defaults: a clock skew of up to 1 s between instances, a start window of 1 s.
    ///
    /// Errors: those of [`ScheduledJob::new`] for the name and the backend (keep-for is
    /// needed); a name too long to take the `#n` suffix is an invalid name.
    pub fn on(
        client: LeaseClient,
        name: impl AsRef<[u8]>,
        schedule: Schedule,
        opts: LeaseOptions,
    ) -> Result<Self, Error> {
        let name = LeaseName::new(name)?;
        let caps = client.capabilities();
        needs_keep_for(
            caps,
            "keep-for (lockAtLeastFor), which a scheduled job needs to run at most once per \
             firing",
        )?;
        let mode = match schedule {
            Schedule::FixedDelay(delay) => Mode::Delay(delay),
            schedule => Mode::Instants(Box::new(Instants {
                schedule,
                max_skew: Duration::from_secs(1),
                window: Duration::from_secs(1),
                hold: Duration::ZERO,
                slots: 0,
                missed: MissedFirings::Skip,
                granularity: Duration::ZERO,
            })),
        };
        let job = ScheduledJob {
            client,
            name,
            mode,
            opts: opts.with_keep_for(Duration::ZERO),
            grace: Duration::ZERO,
            clock_offset_ms: 0,
        };
        job.settled()
    }

    /// Sets the largest difference between two instances' wall clocks that the job must
    /// tolerate (default 1 s; a schedule of instants only). Larger values keep each
    /// firing's lease longer.
    ///
    /// Errors: [`InvalidInput::Schedule`] for a value above one hour.
    pub fn with_max_skew(mut self, max_skew: Duration) -> Result<Self, Error> {
        if max_skew > Duration::from_secs(3600) {
            return Err(InvalidInput::Schedule(format!(
                "a clock skew of {max_skew:?} (at most one hour)"
            ))
            .into());
        }
        if let Mode::Instants(i) = &mut self.mode {
            i.max_skew = max_skew;
        }
        self.settled()
    }

    /// Sets how late after a firing's instant (by its own clock) an instance still tries
    /// it (default 1 s; a schedule of instants only). An instance that comes later (a
    /// paused process, an overloaded runtime) reports [`JobRun::Missed`] instead.
    ///
    /// Errors: [`InvalidInput::Schedule`] for a zero window or one above one hour.
    pub fn with_start_window(mut self, window: Duration) -> Result<Self, Error> {
        if window.is_zero() || window > Duration::from_secs(3600) {
            return Err(InvalidInput::Schedule(format!(
                "a start window of {window:?} (more than zero, at most one hour)"
            ))
            .into());
        }
        if let Mode::Instants(i) = &mut self.mode {
            i.window = window;
        }
        self.settled()
    }

    /// Sets what happens to a firing that no instance ran at its instant (default
    /// [`MissedFirings::Skip`]; a schedule of instants only). See [`MissedFirings`].
    pub fn with_missed_firings(mut self, policy: MissedFirings) -> Self {
        if let Mode::Instants(i) = &mut self.mode {
            i.missed = policy;
        }
        self
    }

    /// Lets a run in progress go on for up to `grace` after `run`'s shutdown token is
    /// cancelled, instead of dropping it at once (the default, zero).
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Shifts this instance's view of the wall clock by `offset_ms` milliseconds
    /// (positive: ahead). For tests and labs that run several instances with skewed
    /// clocks in one process; an application leaves it at zero.
    pub fn with_clock_offset_ms(mut self, offset_ms: i64) -> Self {
        self.clock_offset_ms = offset_ms;
        self
    }

    /// The hold and slot count of a schedule of instants, from its skew and window.
    fn settled(mut self) -> Result<Self, Error> {
        let caps = self.client.capabilities();
        if let Mode::Instants(i) = &mut self.mode {
            // Every other instance tries a firing within `window + 2 * max_skew` of the
            // first try (the first instance's clock may be `max_skew` ahead, the last
            // one's `max_skew` behind and `window` late).
            let hold = i
                .window
                .saturating_add(i.max_skew.saturating_mul(2))
                .saturating_add(HOLD_MARGIN);
            let hold = round_up(hold, caps.ttl_granularity).max(caps.min_ttl);
            // A slot name comes back only after its last firing's lease is gone: at the
            // latest `window + max_skew + hold` after that firing (plus a store's rounding
            // up), before the next firing on it may be tried, `max_skew` early.
            let span = i
                .window
                .saturating_add(i.max_skew.saturating_mul(2))
                .saturating_add(hold)
                .saturating_add(caps.ttl_granularity);
            let unit = i.schedule.unit().as_nanos().max(1);
            let needed = u64::try_from(span.as_nanos().div_ceil(unit))
                .unwrap_or(u64::MAX)
                .saturating_add(2);
            i.hold = hold;
            i.granularity = caps.ttl_granularity;
            i.slots = needed.max(MIN_SLOTS);
            if i.slots > 100_000 {
                return Err(InvalidInput::Schedule(format!(
                    "{} slot names for firings {:?} apart with a skew of {:?} and a window \
                     of {:?}: give a smaller skew or window",
                    i.slots,
                    i.schedule.unit(),
                    i.max_skew,
                    i.window
                ))
                .into());
            }
        }
        if let Mode::Instants(i) = &self.mode {
            // The longest slot name must be a valid lease name.
            self.slot_name(i.slots.saturating_sub(1))?;
        }
        Ok(self)
    }

    /// `NAME#slot`.
    fn slot_name(&self, slot: u64) -> Result<LeaseName, InvalidInput> {
        let mut bytes = self.name.as_bytes().to_vec();
        bytes.extend_from_slice(format!("#{slot}").as_bytes());
        LeaseName::new(bytes)
    }

    /// This instance's wall clock (with its test offset).
    fn wall_now(&self) -> SystemTime {
        let now = SystemTime::now();
        let offset = Duration::from_millis(self.clock_offset_ms.unsigned_abs());
        if self.clock_offset_ms >= 0 {
            now + offset
        } else {
            now.checked_sub(offset).unwrap_or(now)
        }
    }

    /// The keep-for each run's lease is released with (derived from the period if the
    /// options left it zero).
    pub fn keep_for(&self) -> Duration {
        self.opts.keep_for()
    }

    /// The lease name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }

    /// One tick: run the job if no other instance holds the lease. Never panics and never
    /// returns an error: store failures are a skipped run.
    ///
    /// Cancel safety: cancel-safe. Dropped while acquiring, nothing stays held beyond the
    /// call timeout plus one round trip; dropped while the job runs, the job is dropped
    /// and the lease released in the background (honouring keep-for).
    pub async fn run_once<F, Fut, T>(&self, job: F) -> JobRun<T>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let span =
            tracing::info_span!("lease.job", lease = %self.name, holder = %self.client.label());
        async move {
        match self.client.try_acquire(&self.name, &self.opts).await {
            Ok(TryAcquire::Acquired(guard)) => {
                tracing::info!(lease = %self.name, fencing = guard.fencing().get(), "job starting");
                JobRun::from(run_with_guard_at(guard, None, None, job).await)
            }
            Ok(TryAcquire::Held(by)) => {
                tracing::info!(lease = %self.name, held_by = %by, "job skipped: held by another instance");
                JobRun::Skipped(by)
            }
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, retryable = e.is_retryable(), "job skipped: store error");
                JobRun::StoreError(e)
            }
        }
        }
        .instrument(span)
        .await
    }

    /// Runs the job on its schedule until `shutdown` is cancelled; returns what it did.
    ///
    /// - [`ScheduledJob::new`]: on every tick of the period from this instance's start;
    ///   the first tick is immediate, missed ticks are skipped, not bunched.
    /// - A schedule of instants ([`ScheduledJob::on`]): at each firing's instant by this
    ///   instance's wall clock (firings that pass while a run goes on are not tried by
    ///   this instance).
    /// - A fixed delay: as soon as the job's lease is free, checked every quarter of the
    ///   delay (at most every second).
    ///
    /// Cancelling `shutdown` drops a run in progress, or lets it finish within the
    /// [shutdown grace](Self::with_shutdown_grace).
    ///
    /// Cancel safety: cancel-safe, as [`ScheduledJob::run_once`] is; the counts are lost.
    pub async fn run<F, Fut, T>(&self, shutdown: CancellationToken, mut job: F) -> JobStats
    where
        F: FnMut(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut stats = JobStats::default();
        match &self.mode {
            Mode::Interval(period) => {
                let mut ticks = tokio::time::interval(*period);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return stats,
                        _ = ticks.tick() => {}
                    }
                    match self.finish(&shutdown, self.run_once(&mut job)).await {
                        Some(run) => stats.count(&run),
                        None => return stats,
                    }
                }
            }
            Mode::Instants(i) => {
                let recover = i.missed == MissedFirings::RunOnce;
                // Under RunOnce: when to look for a firing that nobody ran (at the start,
                // and once every instance has tried a firing this one could not run).
                let mut check_at = recover.then(|| self.wall_now());
                // The pause before the next recovery try after a store error.
                let mut retry = RECOVERY_RETRY;
                let mut next = i.schedule.next_after(self.wall_now());
                while let Some(firing) = next {
                    if let Some(at) = check_at.take().filter(|at| *at < firing) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return stats,
                            _ = self.sleep_until_wall(at) => {}
                        }
                        match self.finish(&shutdown, self.recover(i, &mut job)).await {
                            Some(Some(run)) => {
                                if matches!(run, JobRun::Ran(_)) {
                                    stats.recovered += 1;
                                }
                                if !matches!(run, JobRun::Skipped(_)) {
                                    stats.count(&run);
                                }
                                // The store did not answer (not there yet, or down): try
                                // again while the firing may still be recovered (`recover`
                                // answers `None` once the next firing is near).
                                if matches!(&run, JobRun::StoreError(e) if e.is_retryable()) {
                                    tracing::debug!(lease = %self.name, ?retry, "missed-firing recovery: store error, trying again");
                                    check_at = Some(self.wall_now() + retry);
                                    retry = retry.saturating_mul(2).min(RECOVERY_RETRY_MAX);
                                } else {
                                    retry = RECOVERY_RETRY;
                                }
                            }
                            Some(None) => retry = RECOVERY_RETRY,
                            None => return stats,
                        }
                        next = i.schedule.next_after(self.wall_now().max(at));
                        continue;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return stats,
                        _ = self.sleep_until_wall(firing) => {}
                    }
                    let run = match self
                        .finish(&shutdown, self.run_firing(firing, &mut job))
                        .await
                    {
                        Some(run) => run,
                        None => return stats,
                    };
                    stats.count(&run);
                    if recover && matches!(run, JobRun::Missed { .. } | JobRun::StoreError(_)) {
                        check_at = Some(firing + settle_time(i));
                    }
                    next = i.schedule.next_after(self.wall_now().max(firing));
                }
                stats
            }
            Mode::Delay(delay) => {
                let poll = (*delay / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
                loop {
                    let run = match self
                        .finish(&shutdown, self.run_after_delay(*delay, &mut job))
                        .await
                    {
                        Some(run) => run,
                        None => return stats,
                    };
                    // The one that ran knows the lease is kept for `delay`: no need to ask
                    // before then.
                    let pause = if matches!(run, JobRun::Ran(_)) {
                        *delay
                    } else {
                        poll
                    };
                    if !matches!(run, JobRun::Skipped(_)) {
                        stats.count(&run);
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return stats,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// Awaits `run`; once `shutdown` is cancelled, for at most the shutdown grace more.
    /// `None`: the run was dropped (shutdown).
    async fn finish<R>(
        &self,
        shutdown: &CancellationToken,
        run: impl Future<Output = R>,
    ) -> Option<R> {
        tokio::pin!(run);
        tokio::select! {
            r = &mut run => return Some(r),
            _ = shutdown.cancelled() => {}
        }
        if self.grace.is_zero() {
            return None;
        }
        tracing::info!(lease = %self.name, grace = ?self.grace, "shutdown: letting the run in progress finish");
        match tokio::time::timeout(self.grace, run).await {
            Ok(r) => Some(r),
            Err(_) => {
                tracing::warn!(lease = %self.name, grace = ?self.grace, "shutdown: the run did not finish within the grace; dropped");
                None
            }
        }
    }

    /// Sleeps until this instance's wall clock reads `t` (in steps of at most a minute,
    /// so that a clock that is set meanwhile is followed).
    async fn sleep_until_wall(&self, t: SystemTime) {
        loop {
            let Ok(left) = t.duration_since(self.wall_now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_secs(60))).await;
        }
    }

    /// Runs the firing at `firing` (a schedule of instants) if no instance has taken it:
    /// takes the firing's slot lease, then the job's lease (held by a run still going on:
    /// the firing is skipped), runs, releases the job's lease and the slot's, which stays
    /// taken for the hold. Never panics and never returns an error.
    ///
    /// Cancel safety: cancel-safe, as [`ScheduledJob::run_once`] is.
    pub async fn run_firing<F, Fut, T>(&self, firing: SystemTime, job: F) -> JobRun<T>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let Mode::Instants(i) = &self.mode else {
            return self.run_once(job).await;
        };
        let span = tracing::info_span!(
            "lease.job",
            lease = %self.name,
            holder = %self.client.label(),
            firing_ms = (epoch_nanos(firing) / 1_000_000) as u64,
        );
        async move {
            let late_by = self.wall_now().duration_since(firing).unwrap_or_default();
            if late_by > i.window {
                tracing::warn!(?late_by, window = ?i.window, "firing missed: this instance came to it too late");
                return JobRun::Missed { firing, late_by };
            }
            // Kept until shortly before the next firing (never shorter than the hold),
            // whatever this instance's policy, so that an instance recovering missed
            // firings finds that this one ran.
            let hold = record_hold(i, firing, self.wall_now())
                .unwrap_or(i.hold)
                .max(i.hold);
            // A run still going on (another instance's, of the firing before) is waited
            // for until the start window ends: with clocks apart by about a period, one
            // instance's firing comes while another runs the one before.
            let wait = i.window.saturating_sub(late_by);
            self.take_firing(i, firing, hold, wait, job).await
        }
        .instrument(span)
        .await
    }

    /// Under [`MissedFirings::RunOnce`]: runs the latest firing that every instance has
    /// tried by now, if nobody took it and the next firing is not near. `None`: no such
    /// firing to look at.
    async fn recover<F, Fut, T>(&self, i: &Instants, job: F) -> Option<JobRun<T>>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let now = self.wall_now();
        let firing = i
            .schedule
            .last_at_or_before(now.checked_sub(settle_time(i))?)?;
        let hold = record_hold(i, firing, now)?;
        // A lease shorter than the store's minimum TTL would outlive the hold.
        let caps = self.client.capabilities();
        if hold < caps.min_ttl.max(HOLD_MARGIN) {
            return None;
        }
        let span = tracing::info_span!(
            "lease.job",
            lease = %self.name,
            holder = %self.client.label(),
            firing_ms = (epoch_nanos(firing) / 1_000_000) as u64,
            recovery = true,
        );
        let run = self
            .take_firing(i, firing, hold, Duration::ZERO, job)
            .instrument(span)
            .await;
        match &run {
            JobRun::Ran(_) => {
                tracing::info!(lease = %self.name, firing_ms = (epoch_nanos(firing) / 1_000_000) as u64, "missed firing run on recovery")
            }
            JobRun::Skipped(_) => {
                tracing::debug!(lease = %self.name, "no missed firing: the latest one ran")
            }
            _ => {}
        }
        Some(run)
    }

    /// Takes the firing's slot lease (kept for `hold` from its acquisition), then the
    /// job's lease (waiting up to `wait` for a run still going on to end), runs, and
    /// releases both.
    async fn take_firing<F, Fut, T>(
        &self,
        i: &Instants,
        firing: SystemTime,
        hold: Duration,
        wait: Duration,
        job: F,
    ) -> JobRun<T>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let unit = i.schedule.unit().as_nanos().max(1);
        let slot =
            u64::try_from((epoch_nanos(firing) / unit) % u128::from(i.slots.max(1))).unwrap_or(0);
        let slot_name = match self.slot_name(slot) {
            Ok(n) => n,
            Err(e) => return JobRun::StoreError(e.into()),
        };
        let slot_opts = self.opts.clone().with_keep_for(hold);
        let mut slot_guard = match self.client.try_acquire(&slot_name, &slot_opts).await {
            Ok(TryAcquire::Acquired(g)) => g,
            Ok(TryAcquire::Held(by)) => {
                tracing::debug!(held_by = %by, "firing skipped: taken by another instance");
                return JobRun::Skipped(by);
            }
            Err(e) => {
                tracing::warn!(error = %e, retryable = e.is_retryable(), "firing skipped: store error");
                return JobRun::StoreError(e);
            }
        };
        let taken = match self.client.try_acquire(&self.name, &self.opts).await {
            Ok(TryAcquire::Held(by)) if !wait.is_zero() => {
                tracing::debug!(held_by = %by, ?wait, "firing waits for the previous run to end");
                match self
                    .client
                    .acquire_waiting(&self.name, &self.opts, Some(wait))
                    .await
                {
                    Ok(guard) => Ok(TryAcquire::Acquired(guard)),
                    Err(Error::StillHeld { .. }) => Ok(TryAcquire::Held(by)),
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        let run = match taken {
            Ok(TryAcquire::Acquired(guard)) => {
                tracing::info!(fencing = guard.fencing().get(), "job starting");
                JobRun::from(run_with_guard_at(guard, Some(firing), None, job).await)
            }
            Ok(TryAcquire::Held(by)) => {
                tracing::info!(held_by = %by, "firing skipped: the previous run still goes on");
                JobRun::Skipped(by)
            }
            Err(e) => {
                // Not run: free the firing's slot at once, so that another instance
                // may still run it within the window.
                tracing::warn!(error = %e, retryable = e.is_retryable(), "firing not run: store error");
                slot_guard.set_keep_for(Duration::ZERO);
                JobRun::StoreError(e)
            }
        };
        // Errors are logged by `release`; the slot then lapses at its TTL.
        let _ = slot_guard.release().await;
        run
    }

    /// One try of a fixed-delay job: runs if the job's lease is free, and releases it
    /// keeping it `delay` past the end of the run.
    async fn run_after_delay<F, Fut, T>(&self, delay: Duration, job: F) -> JobRun<T>
    where
        F: FnOnce(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let started = Instant::now();
        match self.client.try_acquire(&self.name, &self.opts).await {
            Ok(TryAcquire::Acquired(guard)) => {
                tracing::info!(lease = %self.name, fencing = guard.fencing().get(), "job starting");
                JobRun::from(run_with_guard_at(guard, None, Some((started, delay)), job).await)
            }
            Ok(TryAcquire::Held(by)) => JobRun::Skipped(by),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, retryable = e.is_retryable(), "job skipped: store error");
                JobRun::StoreError(e)
            }
        }
    }
}

/// How long after its instant every instance has tried a firing: the latest clock is
/// `2 * max_skew` behind the earliest, and tries up to the window late.
fn settle_time(i: &Instants) -> Duration {
    i.window
        .saturating_add(i.max_skew.saturating_mul(2))
        .saturating_add(HOLD_MARGIN)
}

/// How long a lease on `firing`'s slot taken at `now`
/// (this instance's clock) is kept so that it ends shortly before any instance tries the
/// next firing (up to `2 * max_skew` early in this clock, a margin for the round trip,
/// and the store's rounding up). `None`: that end is not after `now` plus the skew of a
/// recovering instance's clock (no room to record the firing).
fn record_hold(i: &Instants, firing: SystemTime, now: SystemTime) -> Option<Duration> {
    let next = i.schedule.next_after(firing)?;
    let end = next
        .checked_sub(i.max_skew.saturating_mul(2))?
        .checked_sub(HOLD_MARGIN)?
        .checked_sub(i.granularity)?;
    // A recovering instance's clock may be `max_skew` behind this one: it must look
    // before the lease ends by this clock.
    let end_for_others = end.checked_sub(i.max_skew)?;
    end_for_others.duration_since(now).ok()?;
    end.duration_since(now).ok()
}

/// `d` rounded up to a multiple of `granularity` (unchanged for a zero granularity).
fn round_up(d: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_nanos();
    if g == 0 {
        return d;
    }
    let n = d.as_nanos().div_ceil(g).saturating_mul(g);
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// A scheduled job needs keep-for (lockAtLeastFor) to run at most once per period or
/// firing across instances: [`Error::Unsupported`], saying `what` is needed, for a
/// backend without it.
fn needs_keep_for(caps: &crate::Capabilities, what: &'static str) -> Result<(), Error> {
    if caps.keep_for {
        return Ok(());
    }
    Err(Error::Unsupported {
        backend: caps.backend,
        what,
    })
}
