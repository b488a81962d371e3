//! Shared scaffolding of the store benchmarks: cases run in alternating rounds (so noise
//! from the machine hits them alike), one task and many tasks, medians, and a table with
//! each case's ratio to the first (the bare floor).

use std::future::Future;
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions, Owner,
    OwnerToken, TryAcquire,
};

/// Runs `run(case, prefix, cycles_per_task)` for every case, for 1 and `tasks` concurrent
/// tasks, `rounds` times in alternation; returns cycles/s medians as `[case][0 = 1 task, 1
/// = tasks]`. Each task gets a prefix of its own, so tasks never contend.
pub async fn alternating<F, Fut>(
    cases: usize,
    rounds: usize,
    cycles: usize,
    tasks: usize,
    run: F,
) -> Vec<[f64; 2]>
where
    F: Fn(usize, String, usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut samples = vec![[Vec::new(), Vec::new()]; cases];
    for round in 0..rounds {
        for (ti, n) in [1, tasks].into_iter().enumerate() {
            for (case, case_samples) in samples.iter_mut().enumerate() {
                let per = cycles / n;
                let start = Instant::now();
                let handles: Vec<_> = (0..n)
                    .map(|t| {
                        tokio::spawn(run(case, format!("{case}-{run_id}-{round}-{n}-{t}"), per))
                    })
                    .collect();
                for h in handles {
                    h.await.expect("benchmark task");
                }
                case_samples[ti].push((per * n) as f64 / start.elapsed().as_secs_f64());
            }
        }
    }
    samples
        .into_iter()
        .map(|[a, b]| [median(a), median(b)])
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Prints the cycles/s table and each case's ratio to the first case.
pub fn print_table(labels: &[&str], tasks: usize, rows: &[[f64; 2]]) {
    println!("| case | 1 task cycles/s | {tasks} tasks cycles/s |");
    println!("|---|---:|---:|");
    for (label, r) in labels.iter().zip(rows) {
        println!("| {label} | {:.0} | {:.0} |", r[0], r[1]);
    }
    println!();
    for (label, r) in labels.iter().zip(rows).skip(1) {
        println!(
            "ratio {label} / {}: {:.2} (1 task), {:.2} ({tasks} tasks)",
            labels[0],
            r[0] / rows[0][0],
            r[1] / rows[0][1]
        );
    }
}

/// The library's acquire + release through the backend primitives, `n` times over 64
/// names under `prefix`.
pub async fn backend_cycles(backend: std::sync::Arc<dyn LeaseBackend>, prefix: String, n: usize) {
    let label = HolderLabel::new("bench").expect("label");
    for i in 0..n {
        let name = LeaseName::new(format!("{prefix}:{}", i % 64)).expect("name");
        let owner = Owner {
            token: OwnerToken::random(),
            label: label.clone(),
        };
        match backend
            .acquire(&name, &owner, Duration::from_secs(30))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Acquired { .. } => {}
            AcquireOutcome::Held(by) => panic!("{name} held by {by}"),
        }
        backend
            .release(&name, &owner.token, Duration::ZERO)
            .await
            .expect("release");
    }
}

/// The library's acquire + release through [`LeaseClient`] (guard, heartbeat
/// registration), `n` times over 64 names under `prefix`.
pub async fn client_cycles(client: LeaseClient, prefix: String, n: usize) {
    let opts = LeaseOptions::new(Duration::from_secs(30)).expect("options");
    for i in 0..n {
        match client
            .try_acquire(format!("{prefix}:{}", i % 64), &opts)
            .await
            .expect("try_acquire")
        {
            TryAcquire::Acquired(g) => {
                g.release().await.expect("release");
            }
            TryAcquire::Held(by) => panic!("held by {by}"),
        }
    }
}
