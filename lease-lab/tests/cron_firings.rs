//! The source documents' scheduled job on every store, aligned and ShedLock style side by
//! side (see `lease_lab::firings`): three instances with clocks up to 1 s apart firing
//! every 2 s, 60 firings, one instance's tick 1.2 s late every sixth firing. The aligned
//! job runs each firing exactly once on every store; the ShedLock-style job's duplicates
//! and gaps are printed beside it (and must show: the late ticks are what they are for).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use lease_core::LeaseBackend;
use lease_lab::firings::{Row, compare};
use lease_test_servers::{EtcdServer, MariaDbServer, PostgresServer, RedisServer};

const PERIODS: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_firings_on_every_store_aligned_and_shedlock_style() {
    let (redis, postgres, etcd, mariadb) = tokio::join!(
        RedisServer::start(),
        PostgresServer::start(),
        EtcdServer::start(),
        MariaDbServer::start()
    );
    let (redis, postgres, etcd, mariadb) = (
        redis.unwrap_or_else(|e| panic!("{e}")),
        postgres.unwrap_or_else(|e| panic!("{e}")),
        etcd.unwrap_or_else(|e| panic!("{e}")),
        mariadb.unwrap_or_else(|e| panic!("{e}")),
    );
    let stores: Vec<(&str, Arc<dyn LeaseBackend>)> = vec![
        ("redis", leasehold::connect(&redis.url()).await.unwrap()),
        (
            "postgres",
            leasehold::connect(&postgres.url()).await.unwrap(),
        ),
        ("etcd", leasehold::connect(&etcd.url()).await.unwrap()),
        ("mysql", leasehold::connect(&mariadb.url()).await.unwrap()),
    ];
    let rows: Vec<Row> = futures::future::join_all(
        stores
            .iter()
            .map(|(_, backend)| compare(backend.clone(), PERIODS)),
    )
    .await;
    eprintln!(
        "| store | late ticks | aligned (`ScheduledJob::on`): firings, run twice, not run | ShedLock style (cron ticks, lockAtLeastFor 1.67 s): firings, run twice, not run |"
    );
    eprintln!("|---|---|---|---|");
    for ((store, _), row) in stores.iter().zip(&rows) {
        let shedlock = match &row.shedlock {
            Ok(c) => format!("{}, {}, {}", c.periods, c.twice, c.missed),
            Err(e) => format!("refused: {e}"),
        };
        eprintln!(
            "| {store} | {} | {}, {}, {} | {shedlock} |",
            row.aligned.late_ticks, row.aligned.periods, row.aligned.twice, row.aligned.missed,
        );
    }
    for ((store, _), row) in stores.iter().zip(&rows) {
        assert_eq!(row.aligned.periods, PERIODS, "{store}: {row:?}");
        assert_eq!(row.aligned.twice, 0, "{store}: firings run twice: {row:?}");
        assert_eq!(row.aligned.missed, 0, "{store}: firings not run: {row:?}");
        // The late ticks must show what they provoke where the ShedLock-style job runs
        // (it refuses a 2 s period on etcd: no keep-for fits etcd's TTL granularity).
        if let Ok(c) = &row.shedlock {
            assert!(
                c.twice > 0,
                "{store}: the late ticks provoked nothing: {row:?}"
            );
        }
    }
}
