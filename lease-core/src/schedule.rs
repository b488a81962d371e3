//! Scheduled jobs: at most one run per period across all instances.

use std::future::Future;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::client::{LeaseClient, LeaseContext, RunOutcome, TryAcquire, run_with_guard};
use crate::error::{Error, InvalidInput};
use crate::shared::LossReason;
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
    period: Duration,
    opts: LeaseOptions,
}

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
        if !caps.keep_for {
            return Err(Error::Unsupported {
                backend: caps.backend,
                what: "keep-for (lockAtLeastFor), which a scheduled job needs to run at most \
                       once per period",
            });
        }
        // A lease released with a sliver of its keep-for left still lives the store's
        // minimum TTL (etcd grants at least 2 s): that much more must fit in the period.
        let tail = if caps.min_ttl > caps.ttl_granularity {
            caps.min_ttl
        } else {
            Duration::ZERO
        };
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
            period,
            opts: opts.with_keep_for(keep_for),
        })
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
                match run_with_guard(guard, job).await {
                    RunOutcome::Ran(t) => JobRun::Ran(t),
                    RunOutcome::Lost(r) => JobRun::Lost(r),
                    RunOutcome::Skipped(by) => JobRun::Skipped(by),
                }
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

    /// Runs the job on every tick of `period` until `shutdown` is cancelled; returns what
    /// it did. The first tick is immediate; missed ticks are skipped, not bunched.
    /// Cancelling `shutdown` drops a run in progress, as dropping this future does.
    ///
    /// Cancel safety: cancel-safe, as [`ScheduledJob::run_once`] is; the counts are lost.
    pub async fn run<F, Fut, T>(&self, shutdown: CancellationToken, mut job: F) -> JobStats
    where
        F: FnMut(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut stats = JobStats::default();
        let mut ticks = tokio::time::interval(self.period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return stats,
                _ = ticks.tick() => {}
            }
            let run = tokio::select! {
                _ = shutdown.cancelled() => return stats,
                run = self.run_once(&mut job) => run,
            };
            match run {
                JobRun::Ran(_) => stats.ran += 1,
                JobRun::Skipped(_) => stats.skipped += 1,
                JobRun::Lost(_) => stats.lost += 1,
                JobRun::StoreError(_) => stats.store_errors += 1,
            }
        }
    }
}
