//! What a firing of a schedule of instants costs the store: three instances of one job
//! (clocks up to 500 ms apart) over 5 firings of a 1 s fixed rate, on the in-memory backend
//! with every call counted. The instance that runs a firing makes 4 calls (take the
//! firing's slot, take the job's lease, release both), every other instance 1 (the slot
//! is taken): 6 calls per firing for three instances, no renewal for a run shorter than
//! the renewal period. (With clocks a whole period apart, one instance's firing comes
//! while another runs the firing before, and waits for that run to end: one more acquire;
//! the clocks here stay clear of that, to measure the usual case.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::suite::skewed_instances;
use lease_conformance::{FaultyBackend, Op};
use lease_core::{LeaseBackend, MemoryBackend, Schedule};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_costs_four_calls_on_the_runner_and_one_on_each_other_instance() {
    let counted = Arc::new(FaultyBackend::new(Arc::new(MemoryBackend::new())));
    let backend: Arc<dyn LeaseBackend> = counted.clone();
    let firings = skewed_instances(
        backend,
        "cost",
        Schedule::fixed_rate(Duration::from_secs(1)).unwrap(),
        &[-250, 0, 250],
        Duration::from_secs(1),
        5,
    )
    .await;
    firings.assert_each_once();
    // Runs started (a run in progress at the stop is not in the stats, but it made its
    // calls, and its guards' drops release).
    let ran = firings.runs.values().map(Vec::len).sum::<usize>() as u64;
    let skipped: u64 = firings.stats.iter().map(|s| s.skipped).sum();
    let tried = ran + skipped;
    let (acquires, releases, renews) = (
        counted.calls(Op::Acquire),
        counted.calls(Op::Release),
        counted.calls(Op::Renew),
    );
    eprintln!(
        "{ran} firings run, {tried} tries by 3 instances: {acquires} acquires, {releases} \
         releases, {renews} renewals: {:.1} calls per firing (stats {:?})",
        (acquires + releases + renews) as f64 / ran as f64,
        firings.stats
    );
    // Every try takes the slot once; the runner also takes the job's lease and releases
    // both. Up to one try per instance may be cut by the stop between its calls (it is
    // then neither a run nor a skip, and its drop releases what it took).
    assert!(
        (tried + ran..=tried + ran + 3).contains(&acquires),
        "{acquires} acquires for {tried} tries and {ran} runs"
    );
    assert!(
        (2 * ran..=2 * ran + 3).contains(&releases),
        "{releases} releases for {ran} runs"
    );
    assert_eq!(
        renews, 0,
        "renewals of runs shorter than the renewal period"
    );
    // Every instance tries every firing it was up for: each of the expected ones at
    // least (the instances start at random points of the first period, with clocks 500 ms
    // apart, and stop together, so at either end an instance may have been up for fewer
    // firings than the others: up to two at the start, one at the stop). A try is of a
    // firing that one try won, unless the winner was cut by the stop.
    for (i, s) in firings.stats.iter().enumerate() {
        assert!(
            s.ran + s.skipped >= firings.expected.len() as u64,
            "instance {i} tried {} of the {} firings every instance was up for ({s:?})",
            s.ran + s.skipped,
            firings.expected.len()
        );
    }
    assert!(
        tried <= 3 * ran + 3,
        "{tried} tries for {ran} firings run by 3 instances"
    );
}
