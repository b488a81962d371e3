//! etcd benchmark: the bare transactions against the library's acquire + release, with the
//! same client crate, in the same process and run.
//!
//! Run: `cargo run --release -p lease-etcd --example bench` (starts a throwaway etcd
//! through the test harness, or uses `LEASE_TEST_ETCD_ENDPOINTS`). Prints cycles/s and
//! ratios; asserts nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::needless_range_loop
)] // a benchmark binary

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::bench::{backend_cycles, client_cycles};
use lease_conformance::server::EtcdServer;
use lease_core::{HolderLabel, LeaseBackend, LeaseClient, LeaseName, Owner, RenewItem};
use lease_etcd::EtcdBackend;
use lease_etcd::etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

const CYCLES: usize = 2_000;
const TASKS: usize = 32;
const ROUNDS: usize = 3;

async fn bare_cycles(mut client: Client, lease: i64, prefix: String, n: usize) {
    for i in 0..n {
        let key = format!("bare/{prefix}/{}", i % 64);
        let value = uuid::Uuid::new_v4().to_string();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let r = client.txn(txn).await.unwrap();
        assert!(r.succeeded());
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, value)])
            .and_then([TxnOp::delete(key, None)]);
        client.txn(txn).await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let endpoints = server.endpoints();
    let mut bare = Client::connect(endpoints.clone(), None).await.unwrap();
    let bare_lease = bare.lease_grant(30, None).await.unwrap().id();
    let etcd = Arc::new(EtcdBackend::from_url(&server.url()).await.unwrap());
    let backend: Arc<dyn LeaseBackend> = etcd.clone();
    let client = LeaseClient::with_label(backend.clone(), HolderLabel::new("bench").unwrap());
    let run = uuid::Uuid::new_v4().simple().to_string();
    bare_cycles(bare.clone(), bare_lease, format!("warm-{run}"), 200).await;
    backend_cycles(backend.clone(), format!("warm-{run}"), 200).await;
    client_cycles(client.clone(), format!("warm-c-{run}"), 200).await;

    let labels = [
        "bare txn put-if-absent + txn compare-and-delete",
        "library backend acquire + release",
        "library LeaseClient try_acquire + release",
    ];
    let rows = lease_conformance::bench::alternating(
        labels.len(),
        ROUNDS,
        CYCLES,
        TASKS,
        |case, prefix, per| {
            let (bare, backend, client) = (bare.clone(), backend.clone(), client.clone());
            async move {
                match case {
                    0 => bare_cycles(bare, bare_lease, prefix, per).await,
                    1 => backend_cycles(backend, prefix, per).await,
                    _ => client_cycles(client, prefix, per).await,
                }
            }
        },
    )
    .await;
    println!(
        "etcd benchmark: {CYCLES} acquire+release cycles per case and round, one client \
         (one gRPC channel), median of {ROUNDS} alternating rounds\n"
    );
    lease_conformance::bench::print_table(&labels, TASKS, &rows);
    println!("(the library's fencing token is the put's revision: no extra work)\n");

    for n in [1_000usize, 10_000] {
        let owner = Owner::new(HolderLabel::new("bench").unwrap());
        let mut items = Vec::with_capacity(n);
        for i in 0..n {
            let name = LeaseName::new(format!("renew-{run}-{n}-{i}")).unwrap();
            backend
                .acquire(&name, &owner, Duration::from_secs(60))
                .await
                .unwrap();
            items.push(RenewItem {
                name,
                token: owner.token,
            });
        }
        let ticks = 10;
        let before = etcd.keepalives_sent();
        let start = Instant::now();
        for _ in 0..ticks {
            let r = backend
                .renew(&items, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(r.len(), n);
        }
        let per_tick = start.elapsed() / ticks;
        let keepalives = etcd.keepalives_sent() - before;
        println!(
            "renew {n} held leases: {:.1} ms per tick, {:.1} keepalive(s) per tick",
            per_tick.as_secs_f64() * 1000.0,
            keepalives as f64 / f64::from(ticks)
        );
    }
}
