//! The source documents' scheduled job, two ways, side by side on one store: three
//! instances started at random points of a 2 s period, over many periods.
//!
//! - **Aligned** (`ScheduledJob::on` with the cron schedule `*/2 * * * * *`): each
//!   instance's clock skewed (-500 ms, 0, +500 ms: up to 1 s apart); a firing is
//!   identified by its instant and runs once.
//! - **Unaligned** (`ScheduledJob::new` with a 2 s period and the derived keep-for, 1.8 s,
//!   as a ShedLock job with lockAtLeastFor is set up): each instance ticks every 2 s from
//!   its own start, so the ticks of two instances fall anywhere in the period; a tick
//!   more than keep-for after another instance's run runs the job again. The instances
//!   start 0, 0.95 and 1.9 s apart (a rolling deploy one instance a second): one draw of
//!   "started at random points of the period" in which the ticks spread wider than
//!   keep-for, fixed so that the row shows the same thing on every run.
//!
//! Both count, per 2 s of wall-clock time (a firing of the aligned job, a grid window of
//! the unaligned one), the periods run twice or more and the periods not run at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lease_conformance::suite::skewed_instances;
use lease_core::{
    CancellationToken, LeaseBackend, LeaseClient, LeaseOptions, Schedule, ScheduledJob,
};

/// Periods of one setup that ran twice or more, or not at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Periods judged.
    pub periods: usize,
    /// Periods run twice or more.
    pub twice: usize,
    /// Periods no instance ran.
    pub missed: usize,
}

/// One store's row: the aligned job and the unaligned one over the same periods.
#[derive(Clone, Debug)]
pub struct Row {
    /// `ScheduledJob::on` with a cron schedule, skewed clocks.
    pub aligned: Count,
    /// `ScheduledJob::new` with a fixed period from each instance's start, or why it
    /// refuses the period on this store.
    pub unaligned: Result<Count, String>,
}

const PERIOD: Duration = Duration::from_secs(2);

/// Runs both setups at once on `backend` for `periods` periods of 2 s.
pub async fn compare(backend: Arc<dyn LeaseBackend>, periods: usize) -> Row {
    let ns = uuid::Uuid::new_v4().simple().to_string();
    let (aligned_name, unaligned_name) = (
        format!("firings-{ns}-aligned"),
        format!("firings-{ns}-unaligned"),
    );
    let aligned = skewed_instances(
        backend.clone(),
        &aligned_name,
        Schedule::cron("*/2 * * * * *").expect("cron"),
        &[-500, 0, 500],
        PERIOD,
        periods,
    );
    let unaligned = unaligned(backend, &unaligned_name, periods);
    let (aligned, unaligned) = tokio::join!(aligned, unaligned);
    Row {
        aligned: Count {
            periods: aligned.expected.len(),
            twice: aligned.twice().len(),
            missed: aligned.missed().len(),
        },
        unaligned,
    }
}

/// Three `ScheduledJob::new` instances with a 2 s period, started at random points of
/// the period; runs counted per 2 s window of the wall clock.
async fn unaligned(
    backend: Arc<dyn LeaseBackend>,
    name: &str,
    periods: usize,
) -> Result<Count, String> {
    let opts = LeaseOptions::new(Duration::from_secs(2)).expect("opts");
    let runs: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = LeaseClient::with_label(
            backend.clone(),
            lease_core::HolderLabel::new(format!("instance-{i}")).expect("label"),
        );
        let job =
            ScheduledJob::new(client, name, PERIOD, opts.clone()).map_err(|e| e.to_string())?;
        let (runs, shutdown) = (runs.clone(), shutdown.clone());
        let start = PERIOD.mul_f64([0.0, 0.475, 0.95][i]);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start).await;
            job.run(shutdown, move |_| {
                let runs = runs.clone();
                async move {
                    runs.lock().expect("lock").push(SystemTime::now());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
        }));
    }
    // Judge whole windows of the 2 s grid once every instance has started.
    tokio::time::sleep(PERIOD + Duration::from_millis(100)).await;
    let grid = Schedule::fixed_rate(PERIOD).expect("rate");
    let first = grid.next_after(SystemTime::now()).expect("window");
    let end = first + PERIOD * u32::try_from(periods).expect("periods");
    if let Ok(wait) = end.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    shutdown.cancel();
    for t in tasks {
        t.await.expect("instance");
    }
    let runs = runs.lock().expect("lock").clone();
    let mut count = Count {
        periods,
        ..Count::default()
    };
    for k in 0..u32::try_from(periods).expect("periods") {
        let from = first + PERIOD * k;
        let to = from + PERIOD;
        let n = runs.iter().filter(|t| **t >= from && **t < to).count();
        if n == 0 {
            count.missed += 1;
        } else if n > 1 {
            count.twice += 1;
        }
    }
    Ok(count)
}
