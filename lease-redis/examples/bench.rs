//! Redis benchmark: the bare commands against the library, same client crate, same
//! connection kind, same process, same run.
//!
//! Run: `cargo run --release -p lease-redis --example bench`
//! (starts a throwaway redis-server through the test harness, or uses
//! `LEASE_TEST_REDIS_URL`). Prints cycles/s and ratios; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark binary

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::bench::{backend_cycles, client_cycles};
use lease_conformance::server::RedisServer;
use lease_core::{HolderLabel, LeaseBackend, LeaseClient, LeaseName, Owner, RenewItem};
use lease_redis::RedisBackend;

const CYCLES: usize = 10_000;
const TASKS: usize = 32;

const CAD: &str = r#"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"#;

async fn bare_cycles(conn: redis::aio::MultiplexedConnection, prefix: String, n: usize) {
    let script = redis::Script::new(CAD);
    let mut conn = conn;
    for i in 0..n {
        let key = format!("{prefix}:{}", i % 64);
        let token = uuid::Uuid::new_v4().to_string();
        let ok: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ok.is_some());
        let _: i64 = script
            .key(&key)
            .arg(&token)
            .invoke_async(&mut conn)
            .await
            .unwrap();
    }
}

async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::main]
async fn main() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let bare_conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let lease_client = LeaseClient::with_label(backend.clone(), HolderLabel::new("bench").unwrap());
    let run = uuid::Uuid::new_v4().simple().to_string();

    // Warm up scripts and connections.
    bare_cycles(bare_conn.clone(), format!("warm-bare-{run}"), 500).await;
    backend_cycles(backend.clone(), format!("warm-lib-{run}"), 500).await;
    client_cycles(lease_client.clone(), format!("warm-client-{run}"), 500).await;

    const ROUNDS: usize = 5;
    let labels = [
        "bare SET NX PX + Lua compare-and-delete",
        "library backend acquire + release",
        "library LeaseClient try_acquire + release",
    ];
    let rows = lease_conformance::bench::alternating(
        labels.len(),
        ROUNDS,
        CYCLES,
        TASKS,
        |case, prefix, per| {
            let (bare, backend, client) =
                (bare_conn.clone(), backend.clone(), lease_client.clone());
            async move {
                match case {
                    0 => bare_cycles(bare, prefix, per).await,
                    1 => backend_cycles(backend, prefix, per).await,
                    _ => client_cycles(client, prefix, per).await,
                }
            }
        },
    )
    .await;
    println!(
        "Redis benchmark: {CYCLES} acquire+release cycles per case and round, one connection, \
         median of {ROUNDS} alternating rounds (rounds alternate the cases so that noise from \
         the machine hits them alike)\n"
    );
    lease_conformance::bench::print_table(&labels, TASKS, &rows);
    println!("(the library's acquire also INCRs the fencing counter and returns the token)\n");

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
        let calls_before = evalsha_calls(&mut admin).await;
        let ticks = 10;
        let start = Instant::now();
        for _ in 0..ticks {
            let r = backend
                .renew(&items, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(r.len(), n);
        }
        let per_tick = start.elapsed() / ticks;
        let calls = evalsha_calls(&mut admin).await - calls_before;
        println!(
            "renew {n} held leases: {:.1} ms per tick, {} script call(s) per tick",
            per_tick.as_secs_f64() * 1000.0,
            calls as f64 / ticks as f64
        );
    }
}
