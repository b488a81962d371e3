//! Redis Cluster: `LeaseClient` acquire + release with 32 tasks on a cluster of one
//! primary against one of three (no replicas, so that only the primaries work), and
//! renewal at scale on three primaries with the script calls counted on each.

use std::sync::Arc;

use lease_core::LeaseBackend;
use lease_redis::{RedisBackend, RedisConfig};
use lease_test_servers::RedisCluster;

use crate::cycles::{self, Plan};
use crate::scale;

/// The lines of the Redis section about the cluster.
pub async fn notes(plan: Plan, scale_sizes: &[usize]) -> Vec<String> {
    let one = RedisCluster::start_sized(1, 0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut three = RedisCluster::start_sized(3, 0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let connect = |url: String| async move {
        Arc::new(RedisBackend::connect(&url).await.expect("cluster backend"))
            as Arc<dyn LeaseBackend>
    };
    let b1 = connect(one.url()).await;
    let b3 = connect(three.url()).await;
    let cases = vec![
        cycles::client_case("LeaseClient on a cluster of 1 primary", b1),
        cycles::client_case("LeaseClient on a cluster of 3 primaries", b3.clone()),
    ];
    eprintln!("Redis Cluster: acquire + release ({} rounds)", plan.rounds);
    cycles::warm_up(&cases, 200).await;
    let rows = cycles::run(&cases, plan).await;
    let mut notes = vec![format!(
        "Redis Cluster (local processes, no replicas, no persistence; {} rounds): \
         `LeaseClient` try_acquire + release, 1 primary: {:.0} cycles/s with 1 task, {:.0} \
         with {} tasks; 3 primaries: {:.0} and {:.0}; 3 primaries / 1 primary: {:.2} \
         ({:.2}–{:.2}) with 1 task, **{:.2}** ({:.2}–{:.2}) with {} tasks (the goal is 2.5 \
         with 32 tasks)",
        plan.rounds,
        rows[0].rate[0].median,
        rows[0].rate[1].median,
        plan.tasks,
        rows[1].rate[0].median,
        rows[1].rate[1].median,
        rows[1].vs[0][0].median,
        rows[1].vs[0][0].min,
        rows[1].vs[0][0].max,
        rows[1].vs[0][1].median,
        rows[1].vs[0][1].min,
        rows[1].vs[0][1].max,
        plan.tasks,
    )];
    if scale_sizes.is_empty() {
        return notes;
    }
    let primaries = three.primaries().await.expect("the cluster's primaries");
    warm_up_renewal(&b3).await;
    eprintln!("Redis Cluster: renewal at scale {scale_sizes:?}");
    let rows = scale::renewal(b3, scale_sizes, 5, Some(script_counter(&primaries))).await;
    notes.push(format!(
        "Redis Cluster renewal at scale, 3 primaries (script calls counted by INFO \
         commandstats on every primary; a `renew` call holds up to 10,000 leases per primary, \
         so one script call reaches each primary per call): {}",
        describe(&rows)
    ));
    // The largest size again with `renew_batch` raised so that one `renew` call holds it
    // all: one script call per primary per tick, each one longer.
    if let Some(&largest) = scale_sizes.iter().max().filter(|&&n| n > 30_000) {
        let config = RedisConfig::default().with_renew_batch(WIDE_BATCH);
        let wide: Arc<dyn LeaseBackend> = Arc::new(
            RedisBackend::connect_with(&three.url(), config)
                .await
                .expect("cluster backend"),
        );
        warm_up_renewal(&wide).await;
        eprintln!("Redis Cluster: renewal of {largest} with renew_batch {WIDE_BATCH}");
        let rows = scale::renewal(wide, &[largest], 5, Some(script_counter(&primaries))).await;
        notes.push(format!(
            "Redis Cluster renewal with `renew_batch: {WIDE_BATCH}` (up to {WIDE_BATCH} leases \
             per primary in one script call), 3 primaries: {}",
            describe(&rows)
        ));
    }
    notes
}

/// Leases per primary per script call in the second renewal row.
const WIDE_BATCH: usize = 40_000;

fn describe(rows: &[scale::ScaleRow]) -> String {
    rows.iter()
        .map(|r| {
            format!(
                "{} leases: {} script call(s) per tick ({} `renew` call(s)), {:.0} ms",
                r.leases,
                r.round_trips_per_tick
                    .map_or_else(|| "?".to_owned(), |n| format!("{n:.1}")),
                r.calls_per_tick,
                r.ms_per_tick
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Counts the script calls of every primary (INFO commandstats).
fn script_counter(primaries: &[u16]) -> scale::Counter {
    let primaries = primaries.to_vec();
    Box::new(move || {
        let primaries = primaries.clone();
        Box::pin(async move {
            let mut total = 0;
            for port in primaries {
                let info = scale::redis_commandstats(port).await;
                total += lease_test_servers::redis::script_calls(&info);
            }
            total
        })
    })
}

/// Loads the renewal script first (SCRIPT LOAD reaches every primary), so that no tick
/// counts the load.
async fn warm_up_renewal(backend: &Arc<dyn LeaseBackend>) {
    let name = lease_core::LeaseName::new("warm-up").expect("name");
    let owner = lease_core::Owner::new(lease_core::HolderLabel::new("bench").expect("label"));
    let ttl = std::time::Duration::from_secs(30);
    backend.acquire(&name, &owner, ttl).await.expect("acquire");
    let item = lease_core::RenewItem {
        name: name.clone(),
        token: owner.token,
    };
    backend.renew(&[item], ttl).await.expect("renew");
    backend
        .release(&name, &owner.token, std::time::Duration::ZERO)
        .await
        .expect("release");
}
