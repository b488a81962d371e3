//! PostgreSQL benchmark: the bare upsert + release statements against the library's
//! acquire + release, on the same pool, in the same process and run.
//!
//! Run: `cargo run --release -p lease-postgres --example bench` (starts a throwaway
//! PostgreSQL with default durability, fsync on, through the test harness, or uses
//! `LEASE_TEST_POSTGRES_URL`). Prints cycles/s and ratios; asserts nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::needless_range_loop
)] // a benchmark binary

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::bench::{backend_cycles, client_cycles};
use lease_conformance::server::PostgresServer;
use lease_core::{HolderLabel, LeaseBackend, LeaseClient, LeaseName, Owner, RenewItem};
use lease_postgres::PostgresBackend;
use lease_postgres::sqlx::{self, PgPool};

const CYCLES: usize = 2_000;
const TASKS: usize = 32;
const ROUNDS: usize = 3;

async fn bare_cycles(pool: PgPool, prefix: String, n: usize) {
    for i in 0..n {
        let name = format!("{prefix}:{}", i % 64);
        let token = uuid::Uuid::new_v4();
        let r = sqlx::query(
            "INSERT INTO bare_locks (name, owner_token, lock_until) \
             VALUES ($1, $2, clock_timestamp() + interval '30 seconds') \
             ON CONFLICT (name) DO UPDATE SET owner_token = EXCLUDED.owner_token, \
             lock_until = EXCLUDED.lock_until WHERE bare_locks.lock_until <= clock_timestamp()",
        )
        .bind(name.as_bytes())
        .bind(token)
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(r.rows_affected(), 1);
        sqlx::query(
            "UPDATE bare_locks SET lock_until = clock_timestamp() \
             WHERE name = $1 AND owner_token = $2",
        )
        .bind(name.as_bytes())
        .bind(token)
        .execute(&pool)
        .await
        .unwrap();
    }
}

#[tokio::main]
async fn main() {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let pool = pg.pool().clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bare_locks (name BYTEA PRIMARY KEY, owner_token UUID, \
         lock_until TIMESTAMPTZ NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(pg);
    let client = LeaseClient::with_label(backend.clone(), HolderLabel::new("bench").unwrap());
    let run = uuid::Uuid::new_v4().simple().to_string();
    bare_cycles(pool.clone(), format!("warm-{run}"), 200).await;
    backend_cycles(backend.clone(), format!("warm-{run}"), 200).await;
    client_cycles(client.clone(), format!("warm-c-{run}"), 200).await;

    let labels = [
        "bare upsert + release statements",
        "library backend acquire + release",
        "library LeaseClient try_acquire + release",
    ];
    let rows = lease_conformance::bench::alternating(
        labels.len(),
        ROUNDS,
        CYCLES,
        TASKS,
        |case, prefix, per| {
            let (pool, backend, client) = (pool.clone(), backend.clone(), client.clone());
            async move {
                match case {
                    0 => bare_cycles(pool, prefix, per).await,
                    1 => backend_cycles(backend, prefix, per).await,
                    _ => client_cycles(client, prefix, per).await,
                }
            }
        },
    )
    .await;
    println!(
        "PostgreSQL benchmark (fsync on): {CYCLES} acquire+release cycles per case and round, \
         one pool ({} connections), median of {ROUNDS} alternating rounds\n",
        pool.options().get_max_connections()
    );
    lease_conformance::bench::print_table(&labels, TASKS, &rows);
    println!("(the library's acquire also bumps the fencing counter and returns it)\n");

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
        let start = Instant::now();
        for _ in 0..ticks {
            let r = backend
                .renew(&items, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(r.len(), n);
        }
        let per_tick = start.elapsed() / ticks;
        // One statement per call by construction; the round trips are counted on the
        // wire in tests/postgres_specific.rs.
        println!(
            "renew {n} held leases: {:.1} ms per tick, one renew call (one statement) per tick",
            per_tick.as_secs_f64() * 1000.0
        );
    }
}
