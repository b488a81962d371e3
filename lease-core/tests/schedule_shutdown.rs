//! Shutdown of a scheduled job while a run goes on: dropped at once by default, finished
//! within the shutdown grace when one is set (and dropped when it overruns the grace).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_core::{CancellationToken, LeaseClient, LeaseOptions, MemoryBackend, ScheduledJob};

/// Starts `job`'s loop with a run of `run_for`, cancels shutdown once the run started,
/// and says whether the run finished and how many runs the stats count.
async fn shutdown_mid_run(job: ScheduledJob, run_for: Duration) -> (bool, u64) {
    let started = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicBool::new(false));
    let shutdown = CancellationToken::new();
    let task = {
        let (started, finished, shutdown) = (started.clone(), finished.clone(), shutdown.clone());
        tokio::spawn(async move {
            job.run(shutdown, move |_| {
                let (started, finished) = (started.clone(), finished.clone());
                async move {
                    started.notify_one();
                    tokio::time::sleep(run_for).await;
                    finished.store(true, Ordering::SeqCst);
                }
            })
            .await
        })
    };
    started.notified().await;
    shutdown.cancel();
    let stats = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run() did not return after shutdown")
        .unwrap();
    (finished.load(Ordering::SeqCst), stats.ran)
}

fn job(name: &str) -> ScheduledJob {
    let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
    let opts = LeaseOptions::new(Duration::from_secs(5)).unwrap();
    ScheduledJob::new(client, name, Duration::from_secs(60), opts).unwrap()
}

#[tokio::test]
async fn without_grace_a_run_in_progress_is_dropped() {
    let (finished, ran) = shutdown_mid_run(job("no-grace"), Duration::from_millis(300)).await;
    assert!(!finished, "the run went on after shutdown");
    assert_eq!(ran, 0);
}

#[tokio::test]
async fn with_grace_a_run_in_progress_finishes() {
    let job = job("grace").with_shutdown_grace(Duration::from_secs(2));
    let (finished, ran) = shutdown_mid_run(job, Duration::from_millis(300)).await;
    assert!(finished, "the run was dropped despite the grace");
    assert_eq!(ran, 1);
}

#[tokio::test]
async fn a_run_longer_than_the_grace_is_dropped_at_its_end() {
    let job = job("overrun").with_shutdown_grace(Duration::from_millis(200));
    let start = tokio::time::Instant::now();
    let (finished, ran) = shutdown_mid_run(job, Duration::from_secs(3)).await;
    assert!(!finished);
    assert_eq!(ran, 0);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}
