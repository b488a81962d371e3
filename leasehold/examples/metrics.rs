//! Metrics with a Prometheus exporter: holds three leases, loses one (an operator frees
//! it by force, and the next renewal hears so), keeps a caller waiting on another, and
//! prints the exposition text a Prometheus server would scrape.
//!
//! ```text
//! cargo run -p leasehold --example metrics --features metrics             # in memory
//! cargo run -p leasehold --example metrics --features metrics,redis -- redis://127.0.0.1:6379
//! ```

use std::time::Duration;

use leasehold::{LeaseClient, LeaseOptions, LossReason};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The application picks the exporter; the library reports to whatever is installed.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("seconds".into()),
            &[0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full("lease_renew_batch_size".into()),
            &[1.0, 10.0, 100.0, 1000.0],
        )?
        .install_recorder()?;

    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let backend = leasehold::connect(&url).await?;
    let client = LeaseClient::new(backend.clone());
    let opts = LeaseOptions::builder(Duration::from_secs(1))
        .renew_every(Duration::from_millis(200))
        .build()?;

    let jobs = client.acquire("example/jobs", &opts).await?;
    let outbox = client.acquire("example/outbox", &opts).await?;
    let doomed = client.acquire("example/doomed", &opts).await?;

    // Another caller waits for `jobs` while we hold it (counted in lease_waiters).
    let waiter = {
        let client = LeaseClient::new(backend.clone());
        let opts = LeaseOptions::builder(Duration::from_secs(1))
            .wait(Duration::from_secs(30))
            .build()?;
        tokio::spawn(async move { client.acquire("example/jobs", &opts).await })
    };

    // An operator frees `example/doomed` by force (`lease release --force`); the holder
    // hears it at its next renewal.
    backend.force_release(doomed.name()).await?;
    let reason = doomed.lost().await;
    assert_eq!(reason, LossReason::NotOwner);
    println!("# lost example/doomed: {reason}\n");

    // A few renewals of the two leases still held.
    tokio::time::sleep(Duration::from_millis(700)).await;
    println!("{}", prometheus.render());

    waiter.abort();
    jobs.release().await?;
    outbox.release().await?;
    drop(doomed);
    Ok(())
}
