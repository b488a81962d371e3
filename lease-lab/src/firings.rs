//! The source documents' scheduled job, two ways, side by side on one store: three
//! instances with clocks up to 1 s apart (-500 ms, 0, +500 ms) fire every 2 s at the
//! instants of the cron schedule `*/2 * * * * *` by their own clocks, over many firings,
//! and one instance's tick comes late now and then (a pause: a stop-the-world collection,
//! a starved runtime, a VM migration).
//!
//! - **Aligned** (`ScheduledJob::on`, [`ScheduledJob::run_firing`] at each tick): a
//!   firing is identified by its instant and runs once; a tick later than the start
//!   window is reported missed and not run.
//! - **ShedLock style** (Spring's `@Scheduled(cron)` ticks with ShedLock's
//!   `lockAtLeastFor`: `ScheduledJob::new`'s tick, [`ScheduledJob::run_once`], with the
//!   source documents' ratio of lockAtLeastFor to period, 50 s to 60 s, here 1.67 s to
//!   2 s): one lease per job, kept for lockAtLeastFor after each run.
//!
//! Every [`LATE_EVERY`]th firing, the tick of instance 1 (clock 0) comes [`LATE_BY`] late,
//! in both setups alike. For the ShedLock-style job that tick finds the lease free (the
//! instance 500 ms ahead took it 500 ms before the firing, for 1.67 s) and runs the firing
//! again; its lockAtLeastFor then covers the next firing's ticks, which nobody runs.
//!
//! Both count, per firing, the firings run twice or more and the firings not run at all.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lease_core::{
    CancellationToken, LeaseBackend, LeaseClient, LeaseOptions, Schedule, ScheduledJob,
};

/// Firings of one setup that ran twice or more, or not at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Firings judged.
    pub periods: usize,
    /// Firings run twice or more.
    pub twice: usize,
    /// Firings no instance ran.
    pub missed: usize,
    /// Late ticks among them.
    pub late_ticks: usize,
}

/// One store's row: the aligned job and the ShedLock-style one over the same firings.
#[derive(Clone, Debug)]
pub struct Row {
    /// `ScheduledJob::on` with a cron schedule.
    pub aligned: Count,
    /// `ScheduledJob::new`'s tick with lockAtLeastFor at Spring's cron ticks, or why it
    /// refuses this period on this store.
    pub shedlock: Result<Count, String>,
}

const PERIOD: Duration = Duration::from_secs(2);
/// lockAtLeastFor of the ShedLock-style job: 50/60 of the period.
const LOCK_AT_LEAST_FOR: Duration = Duration::from_millis(1667);
/// Every this many firings, one instance's tick comes late.
pub const LATE_EVERY: usize = 6;
/// How late that tick comes.
pub const LATE_BY: Duration = Duration::from_millis(1200);
/// The instances' clock offsets.
const OFFSETS_MS: [i64; 3] = [-500, 0, 500];

/// Runs both setups at once on `backend` for `firings` firings 2 s apart.
pub async fn compare(backend: Arc<dyn LeaseBackend>, firings: usize) -> Row {
    let ns = uuid::Uuid::new_v4().simple().to_string();
    let aligned = run_setup(
        backend.clone(),
        format!("firings-{ns}-aligned"),
        true,
        firings,
    );
    let shedlock = run_setup(backend, format!("firings-{ns}-shedlock"), false, firings);
    let (aligned, shedlock) = tokio::join!(aligned, shedlock);
    Row {
        aligned: aligned.unwrap_or_else(|e| panic!("the aligned job was refused: {e}")),
        shedlock,
    }
}

/// Instance `i` of one setup.
fn instance(
    backend: &Arc<dyn LeaseBackend>,
    name: &str,
    aligned: bool,
    i: usize,
) -> Result<ScheduledJob, String> {
    let client = LeaseClient::with_label(
        backend.clone(),
        lease_core::HolderLabel::new(format!("instance-{i}")).expect("label"),
    );
    if aligned {
        let opts = LeaseOptions::new(Duration::from_secs(2)).expect("opts");
        let spread = OFFSETS_MS[2] - OFFSETS_MS[0];
        Ok(ScheduledJob::on(client, name, schedule(), opts)
            .map_err(|e| e.to_string())?
            .with_max_skew(Duration::from_millis(spread.unsigned_abs()))
            .map_err(|e| e.to_string())?
            .with_clock_offset_ms(OFFSETS_MS[i]))
    } else {
        let opts = LeaseOptions::builder(Duration::from_secs(2))
            .keep_for(LOCK_AT_LEAST_FOR)
            .build()
            .expect("opts");
        ScheduledJob::new(client, name, PERIOD, opts).map_err(|e| e.to_string())
    }
}

fn schedule() -> Schedule {
    Schedule::cron("*/2 * * * * *").expect("cron")
}

/// Three instances of one setup, each ticking at the firings by its own clock, over
/// `firings` firings; runs counted per firing.
async fn run_setup(
    backend: Arc<dyn LeaseBackend>,
    name: String,
    aligned: bool,
    firings: usize,
) -> Result<Count, String> {
    let runs: Arc<Mutex<BTreeMap<SystemTime, usize>>> = Arc::default();
    let shutdown = CancellationToken::new();
    // The firings judged: from the first one every clock reaches after a second.
    let first = schedule()
        .next_after(SystemTime::now() + Duration::from_secs(1))
        .expect("firing");
    let mut judged = vec![first];
    while judged.len() < firings {
        let last = *judged.last().expect("firing");
        judged.push(schedule().next_after(last).expect("firing"));
    }
    let last = *judged.last().expect("firing");
    let late: Vec<SystemTime> = judged
        .iter()
        .copied()
        .skip(LATE_EVERY - 1)
        .step_by(LATE_EVERY)
        .collect();
    let mut tasks = Vec::new();
    for (i, offset) in OFFSETS_MS.iter().copied().enumerate() {
        let job = instance(&backend, &name, aligned, i)?;
        let (runs, late, shutdown) = (runs.clone(), late.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            let mut firing = first;
            while firing <= last && !shutdown.is_cancelled() {
                // This instance's clock reads `firing` at true time `firing - offset`.
                let mut at = if offset >= 0 {
                    firing - Duration::from_millis(offset.unsigned_abs())
                } else {
                    firing + Duration::from_millis(offset.unsigned_abs())
                };
                if i == 1 && late.contains(&firing) {
                    at += LATE_BY;
                }
                if let Ok(wait) = at.duration_since(SystemTime::now()) {
                    tokio::time::sleep(wait).await;
                }
                let record = |runs: &Arc<Mutex<BTreeMap<SystemTime, usize>>>| {
                    *runs.lock().expect("lock").entry(firing).or_default() += 1;
                };
                if aligned {
                    let _ = job
                        .run_firing(firing, |_| async {
                            record(&runs);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        })
                        .await;
                } else {
                    let _ = job
                        .run_once(|_| async {
                            record(&runs);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        })
                        .await;
                }
                firing = schedule().next_after(firing).expect("firing");
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    shutdown.cancel();
    let runs = runs.lock().expect("lock").clone();
    let mut count = Count {
        periods: judged.len(),
        late_ticks: late.len(),
        ..Count::default()
    };
    for f in &judged {
        match runs.get(f).copied().unwrap_or(0) {
            0 => count.missed += 1,
            1 => {}
            _ => count.twice += 1,
        }
    }
    Ok(count)
}
