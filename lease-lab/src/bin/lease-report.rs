//! Runs the comparison scenarios (fixed TTL against watchdog, keep-for, advisory locks, optimistic WATCH/MULTI) and the fault matrix against every store on local
//! servers started by the harness, and the container-level fault matrix on servers in
//! containers, and writes the comparison as Markdown tables.
//!
//! ```text
//! cargo build --release -p lease-lab && target/release/lease-report [--out docs/comparison.md] [--soak ROUNDS]
//!
//! (`cargo build -p lease-lab` builds `lease-holder` too, which the fault matrix needs next
//! to this binary.)
//! ```
//!
//! `--soak ROUNDS` also runs ROUNDS rounds of the fault matrix (holder killed, holder
//! paused, alternating over the stores) and reports the checker's totals.
//! `--no-containers` leaves out the container-level rows (they need a Docker engine).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test tool

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseBackend;
use lease_lab::container_faults;
use lease_lab::fenced::Report;
use lease_lab::matrix::{self, Matrix};
use lease_lab::scenarios::{self, DilemmaMode};
use lease_test_servers::docker::StoreKind;
use lease_test_servers::{EtcdServer, MariaDbServer, PostgresServer, RedisServer, ZooKeeperServer};
use tokio::sync::Mutex;

/// Runs a case in its own task so that a failed assertion becomes a cell, not a crash.
async fn cell<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
    show: impl FnOnce(T) -> String,
) -> String {
    match tokio::spawn(fut).await {
        Ok(v) => show(v),
        Err(e) => {
            let msg = e
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                })
                .unwrap_or_else(|| "cancelled".into());
            format!("**FAILED**: {}", msg.lines().next().unwrap_or_default())
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[derive(Default)]
struct Column {
    name: &'static str,
    cells: Vec<(&'static str, String)>,
}

enum Server {
    Redis(RedisServer),
    Postgres(PostgresServer),
    Etcd(EtcdServer),
    Mysql(MariaDbServer),
    ZooKeeper(ZooKeeperServer),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Redis(s) => s.url(),
            Server::Postgres(s) => s.url(),
            Server::Etcd(s) => s.url(),
            Server::Mysql(s) => s.url(),
            Server::ZooKeeper(s) => format!("zk://{}/lease", s.address()),
        }
    }
    async fn stop(&mut self) {
        match self {
            Server::Redis(s) => s.stop().await.unwrap(),
            Server::Postgres(s) => s.stop().await.unwrap(),
            Server::Etcd(s) => s.stop().await.unwrap(),
            Server::Mysql(s) => s.stop().await.unwrap(),
            // ZooKeeper has no clean stop that differs from a crash for its clients: its
            // data is in the transaction log either way.
            Server::ZooKeeper(s) => s.kill().unwrap(),
        }
    }
    async fn start_again(&mut self) {
        match self {
            Server::Redis(s) => s.start_again().await.unwrap(),
            Server::Postgres(s) => s.start_again().await.unwrap(),
            Server::Etcd(s) => s.start_again().await.unwrap(),
            Server::Mysql(s) => s.start_again().await.unwrap(),
            Server::ZooKeeper(s) => s.start_again().await.unwrap(),
        }
    }
}

/// A local server process of `kind` (the main table stops and restarts it).
async fn start(kind: &str) -> Server {
    match kind {
        "redis" => Server::Redis(RedisServer::start_owned().await.unwrap()),
        "postgres" => Server::Postgres(PostgresServer::start_local_process().await.unwrap()),
        "etcd" => Server::Etcd(EtcdServer::start_local().await.unwrap()),
        "mysql" => Server::Mysql(MariaDbServer::start_local().await.unwrap()),
        "zookeeper" => Server::ZooKeeper(ZooKeeperServer::start_local().await.unwrap()),
        other => panic!("unknown store {other}"),
    }
}

/// The container-level rows (`lease_lab::container_faults`), one column per store.
async fn container_columns(m: &Matrix) -> Vec<Column> {
    let mut columns = Vec::new();
    for kind in container_faults::KINDS {
        eprintln!("== containers: {kind}");
        let mut col = Column {
            name: match kind {
                StoreKind::Redis => "Redis",
                StoreKind::Postgres => "PostgreSQL",
                StoreKind::Etcd => "etcd",
                StoreKind::Mysql => "MySQL",
                StoreKind::ZooKeeper => "ZooKeeper",
            },
            ..Column::default()
        };
        for (key, _) in container_faults::ROWS {
            if key == "c-leader-killed" && !container_faults::has_leader(kind) {
                continue;
            }
            let m1 = m.clone();
            col.cells.push((
                key,
                cell(
                    async move { container_faults::run(key, kind, &m1).await },
                    |c| c,
                )
                .await,
            ));
        }
        columns.push(col);
    }
    columns
}

/// A Markdown table: one row per `rows` entry, one column per `columns` entry, and a
/// last column saying where the servers ran.
fn table(md: &mut String, rows: &[(&str, &str)], columns: &[Column], source: &str) {
    write!(md, "| scenario |").unwrap();
    for c in columns {
        write!(md, " {} |", c.name).unwrap();
    }
    writeln!(md, " servers |").unwrap();
    write!(md, "|---|").unwrap();
    for _ in columns {
        write!(md, "---|").unwrap();
    }
    writeln!(md, "---|").unwrap();
    for (key, title) in rows {
        write!(md, "| {title} |").unwrap();
        for c in columns {
            let v = c
                .cells
                .iter()
                .find(|(k, _)| k == key)
                .map_or("—".to_owned(), |(_, v)| v.clone());
            write!(md, " {} |", v.replace('|', "/")).unwrap();
        }
        writeln!(md, " {source} |").unwrap();
    }
}

async fn store_column(kind: &'static str, m: &Matrix) -> Column {
    let server = Arc::new(Mutex::new(start(kind).await));
    let url = server.lock().await.url();
    let backend: Arc<dyn LeaseBackend> = leasehold::connect(&url).await.unwrap();
    let mut col = Column {
        name: match kind {
            "redis" => "Redis",
            "postgres" => "PostgreSQL",
            "mysql" => "MySQL (MariaDB)",
            "zookeeper" => "ZooKeeper",
            _ => "etcd",
        },
        ..Column::default()
    };
    let b = backend.clone();
    col.cells.push((
        "room",
        cell(scenarios::room_with_lease(b, 30, 3), |r| {
            format!("{} joined", r.joined)
        })
        .await,
    ));
    let b = backend.clone();
    col.cells.push((
        "room-semaphore",
        cell(scenarios::room_with_semaphore(b, 30, 3), |(r, took)| {
            format!(
                "{} seated, {} turned away, in {} ms",
                r.joined,
                30 - r.joined,
                took.as_millis()
            )
        })
        .await,
    ));
    let b = backend.clone();
    col.cells.push((
        "fixed-ttl",
        cell(
            scenarios::fixed_ttl_vs_watchdog(b, 1000, scenarios::SEED_004_TTL, true),
            |r| {
                format!(
                    "{} acquired, at most {} at once",
                    r.acquired, r.max_concurrent
                )
            },
        )
        .await,
    ));
    let b = backend.clone();
    col.cells.push((
        "dilemma",
        cell(
            scenarios::lock_at_most_for_dilemma(b, DilemmaMode::Watchdog),
            |r| {
                format!(
                    "{}; recovery after a crash {}",
                    if r.duplicated {
                        "**duplicated**"
                    } else {
                        "no duplicate"
                    },
                    secs(r.recovery)
                )
            },
        )
        .await,
    ));
    let b = backend.clone();
    col.cells.push((
        "at-least-for",
        cell(scenarios::lock_at_least_for(b, true, 4), |s| {
            format!("{} runs in 4 periods (2 instances)", s.ran)
        })
        .await,
    ));
    let b = backend.clone();
    col.cells.push((
        "stuck",
        cell(
            scenarios::stuck_holder_lease(b, Duration::from_secs(5)),
            |r| match r {
                Some(d) => format!("others get in after {}", secs(d)),
                None => "**blocked** for 5 s".into(),
            },
        )
        .await,
    ));
    let (m1, u1) = (m.clone(), url.clone());
    col.cells.push((
        "killed",
        cell(
            async move { matrix::holder_killed(&m1, &u1).await },
            |(t, r)| {
                format!(
                    "takeover after {} ({} double beliefs)",
                    secs(t),
                    r.double_beliefs.len()
                )
            },
        )
        .await,
    ));
    let (m1, u1) = (m.clone(), url.clone());
    col.cells.push((
        "paused",
        cell(async move { matrix::holder_paused(&m1, &u1).await }, |r| {
            format!(
                "lost signal on resume; {} stale writes rejected, {} accepted out of order",
                r.stale_rejected, r.accepted_out_of_order
            )
        })
        .await,
    ));
    let (m1, u1, s1) = (m.clone(), url.clone(), server.clone());
    let s2 = server.clone();
    col.cells.push((
        "down",
        cell(
            async move {
                matrix::store_down(
                    &m1,
                    &u1,
                    async || s1.lock().await.stop().await,
                    async || s2.lock().await.start_again().await,
                )
                .await
            },
            |(lost, _)| {
                format!(
                    "holder stops {} after the outage began; work resumes",
                    secs(lost)
                )
            },
        )
        .await,
    ));
    let (u1, s1) = (url.clone(), server.clone());
    col.cells.push((
        "restart",
        cell(
            async move {
                matrix::store_restarted(&u1, async || {
                    let mut s = s1.lock().await;
                    s.stop().await;
                    s.start_again().await;
                })
                .await
            },
            |r| {
                format!(
                    "tokens {} → {} ({:?}, claim held: {})",
                    r.before,
                    r.after,
                    r.claim,
                    r.claim_held()
                )
            },
        )
        .await,
    ));
    let (u1, name) = (url.clone(), kind);
    col.cells.push((
        "reply-lost",
        cell(
            async move { lease_lab::lost_reply::lost_replies(name, &u1).await },
            |r| {
                format!(
                    "{} replies lost; acquire: {} ended with a guard, {} failed and left \
                     nothing held; renewal: {} kept (store agrees), {} reported lost; \
                     release: {} errors, name free; longest held without a guard after the \
                     call returned: {}",
                    r.lost,
                    r.acquired_anyway,
                    r.failed_and_cleaned,
                    r.renewals_kept,
                    r.renewals_lost,
                    r.releases_failed,
                    secs(r.longest_blocked)
                )
            },
        )
        .await,
    ));
    let (m1, u1) = (m.clone(), url.clone());
    col.cells.push((
        "cut",
        cell(
            async move {
                let addr = matrix::store_addr(&u1).expect("host:port in the url");
                matrix::network_cut(&m1, &u1, addr, |to| matrix::with_store_addr(&u1, to)).await
            },
            |r| match r {
                Ok(r) => format!(
                    "cut-off holder signals lost after {}, the other takes over after {}; \
                     after healing it does not believe it holds the lease",
                    secs(r.lost_after),
                    secs(r.takeover_after)
                ),
                Err(why) => format!("skipped: {why}"),
            },
        )
        .await,
    ));
    col
}

const ROWS: &[(&str, &str)] = &[
    ("room", "Room capacity 3, 30 concurrent joiners"),
    (
        "room-semaphore",
        "Room capacity 3 as a 3-permit `Semaphore`, 30 concurrent joiners",
    ),
    ("fixed-ttl", "1,000 tasks, 100 ms TTL, 1 s of work"),
    (
        "dilemma",
        "lockAtMostFor dilemma: slow job 3x TTL, then a crash",
    ),
    (
        "at-least-for",
        "Fast job, 2 instances 20% of a period apart",
    ),
    (
        "stuck",
        "Holder alive but stuck: frozen, connection open (session advisory lock)",
    ),
    ("killed", "Holder SIGKILLed (TTL 1 s, renewal 333 ms)"),
    ("paused", "Holder SIGSTOPped for 2x TTL, then resumed"),
    (
        "cut",
        "Network cut between one holder and the store (network namespace)",
    ),
    ("down", "Store down for 2x TTL"),
    (
        "reply-lost",
        "Reply lost after the store applied the call (TCP proxy; 5 acquires, 5 renewals, 5 releases)",
    ),
    ("restart", "Store restarted: fencing tokens before → after"),
];

/// How a store's alternatives column names the fixed-TTL cases.
struct FixedTtlLabels {
    fixed: &'static str,
    short: &'static str,
    long: &'static str,
    no_keep_for: &'static str,
}

/// The fixed-TTL alternatives on `backend` (the watchdog and keep-for off): many tasks on a
/// short fixed TTL, the lockAtMostFor dilemma, a fast job on instances a little apart.
async fn fixed_ttl_cells(col: &mut Column, backend: Arc<dyn LeaseBackend>, l: FixedTtlLabels) {
    let b = backend.clone();
    col.cells.push((
        "fixed-ttl",
        cell(
            scenarios::fixed_ttl_vs_watchdog(b, 1000, scenarios::SEED_004_TTL, false),
            move |r| {
                format!(
                    "{}: **{} acquired, {} at once**",
                    l.fixed, r.acquired, r.max_concurrent
                )
            },
        )
        .await,
    ));
    let (b1, b2) = (backend.clone(), backend.clone());
    col.cells.push((
        "dilemma",
        cell(
            async move {
                (
                    scenarios::lock_at_most_for_dilemma(b1, DilemmaMode::ShortFixedTtl).await,
                    scenarios::lock_at_most_for_dilemma(b2, DilemmaMode::LongFixedTtl).await,
                )
            },
            move |(short, long)| {
                format!(
                    "{}: {}; {}: recovery after {}",
                    l.short,
                    if short.duplicated {
                        "**duplicated**"
                    } else {
                        "no duplicate"
                    },
                    l.long,
                    secs(long.recovery)
                )
            },
        )
        .await,
    ));
    col.cells.push((
        "at-least-for",
        cell(scenarios::lock_at_least_for(backend, false, 4), move |s| {
            format!("{}: **{} runs** in 4 periods", l.no_keep_for, s.ran)
        })
        .await,
    ));
}

async fn alternatives(redis_url: &str, pg_url: &str) -> Column {
    let mut col = Column {
        name: "Alternatives (store)",
        ..Column::default()
    };
    let r = redis_url.to_owned();
    let room = cell(
        async move {
            let none = scenarios::room_without_lock(30, 3).await;
            let (watch, aborted) = scenarios::room_with_watch_multi(&r, 30, 3).await.unwrap();
            (none, watch, aborted)
        },
        |(none, watch, aborted)| {
            format!(
                "no lock: **{} joined**; WATCH/MULTI (Redis): {} joined, {aborted} aborted attempts",
                none.joined, watch.joined
            )
        },
    )
    .await;
    col.cells.push(("room", room));
    let backend = leasehold::connect(redis_url).await.unwrap();
    fixed_ttl_cells(
        &mut col,
        backend,
        FixedTtlLabels {
            fixed: "fixed TTL, no watchdog (Redis)",
            short: "short fixed TTL (Redis)",
            long: "long fixed TTL",
            no_keep_for: "no keep-for (Redis)",
        },
    )
    .await;
    let pg = pg_url.to_owned();
    col.cells.push((
        "stuck",
        cell(
            async move {
                let adv: Arc<dyn LeaseBackend> = Arc::new(
                    leasehold::postgres::AdvisoryLockBackend::connect(&pg)
                        .await
                        .unwrap(),
                );
                scenarios::stuck_holder_lease(adv, Duration::from_secs(5)).await
            },
            |r| match r {
                Some(d) => format!("PG advisory lock: others get in after {}", secs(d)),
                None => "PG advisory lock: **still blocked after 5 s**".into(),
            },
        )
        .await,
    ));
    col
}

/// Seed 002's MySQL alternatives: ShedLock's fixed TTL (the MySQL table without the
/// watchdog), `GET_LOCK` and `SELECT ... FOR UPDATE SKIP LOCKED`.
async fn mysql_alternatives(url: &str) -> Column {
    use lease_lab::mysql_alternatives::{self as alt, SessionLock, SessionLockBackend};
    let mut col = Column {
        name: "Alternatives (MySQL)",
        ..Column::default()
    };
    let backend = leasehold::connect(url).await.unwrap();
    fixed_ttl_cells(
        &mut col,
        backend,
        FixedTtlLabels {
            fixed: "ShedLock's fixed TTL, no watchdog",
            short: "ShedLock, short lockAtMostFor",
            long: "long",
            no_keep_for: "no lockAtLeastFor",
        },
    )
    .await;
    let u = url.to_owned();
    col.cells.push((
        "stuck",
        cell(
            async move {
                let mut out = Vec::new();
                for kind in [SessionLock::GetLock, SessionLock::SkipLocked] {
                    let b: Arc<dyn LeaseBackend> =
                        Arc::new(SessionLockBackend::connect(kind, &u).await.unwrap());
                    out.push(scenarios::stuck_holder_lease(b, Duration::from_secs(5)).await);
                }
                out
            },
            |r| {
                let show = |what: &str, d: &Option<Duration>| match d {
                    Some(d) => format!("{what}: others get in after {}", secs(*d)),
                    None => format!("{what}: **still blocked after 5 s**"),
                };
                format!(
                    "{}; {}",
                    show("GET_LOCK", &r[0]),
                    show("SKIP LOCKED (others skip it)", &r[1])
                )
            },
        )
        .await,
    ));
    let u = url.to_owned();
    col.cells.push((
        "killed",
        cell(
            async move {
                (
                    alt::freed_when_the_holder_dies(SessionLock::GetLock, &u).await,
                    alt::freed_when_the_holder_dies(SessionLock::SkipLocked, &u).await,
                )
            },
            |(get_lock, skip)| {
                format!(
                    "GET_LOCK: free {} after the holder's connection closed; SKIP LOCKED: the \
                     row lock free after {} (no TTL, no fencing token either way)",
                    secs(get_lock),
                    secs(skip)
                )
            },
        )
        .await,
    ));
    col
}

#[tokio::main]
async fn main() {
    let mut out = String::from("docs/comparison.md");
    let mut soak = 0usize;
    let mut containers = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = args.next().expect("--out PATH"),
            "--no-containers" => containers = false,
            "--soak" => {
                soak = args
                    .next()
                    .expect("--soak ROUNDS")
                    .parse()
                    .expect("a number")
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let m = Matrix::beside_current_exe().expect(
        "lease-holder next to lease-report: build both with `cargo build --release -p lease-lab`",
    );
    let mut columns = Vec::new();
    for kind in ["redis", "postgres", "etcd", "mysql", "zookeeper"] {
        eprintln!("== {kind}");
        columns.push(store_column(kind, &m).await);
    }
    let redis = RedisServer::start_owned().await.unwrap();
    let pg = PostgresServer::start_local_process().await.unwrap();
    columns.push(alternatives(&redis.url(), &pg.url()).await);
    let mysql = MariaDbServer::start_local().await.unwrap();
    columns.push(mysql_alternatives(&mysql.url()).await);
    let in_containers = if containers {
        match lease_test_servers::docker::available() {
            Ok(()) => Some(container_columns(&m).await),
            Err(why) => {
                eprintln!("no container rows: {why}");
                None
            }
        }
    } else {
        None
    };

    let mut md = String::new();
    writeln!(md, "# The alternatives, measured").unwrap();
    writeln!(md).unwrap();
    writeln!(
        md,
        "Generated by `cargo build --release -p lease-lab && target/release/lease-report{}` on \
         servers started by the test harness (Redis 7, PostgreSQL 15, etcd 3.4, MariaDB 10.11, \
         ZooKeeper 3.8, one machine): \
         local processes on loopback for this table, containers for the next one; the last \
         column of each row says which. Store columns use the library (lease with watchdog, TTL 500 ms or the \
         store's minimum; etcd rounds to whole seconds); the Alternatives columns run the \
         usual alternatives (fixed TTLs, ShedLock's statements, advisory locks, WATCH/MULTI). Bold marks the failure each scenario demonstrates.",
        if soak > 0 {
            format!(" --soak {soak}")
        } else {
            String::new()
        }
    )
    .unwrap();
    writeln!(md).unwrap();
    table(&mut md, ROWS, &columns, "local processes");
    writeln!(md).unwrap();
    writeln!(
        md,
        "Notes: etcd leases are whole seconds and etcd 3.4 expires them up to 0.5 s late, so \
         on etcd every timing is coarser; in the keep-for row the etcd case uses a 4 s \
         period and keeps 1.5 s of room below it (keep-for 2.1 s), because etcd rounds the \
         kept lease up to whole seconds and may expire it 0.5 s late; with less room the \
         lease is still held at the next tick and the job runs every other period. \
         Redis without persistence loses its fencing counter in a restart and seeds it \
         again from the server's clock in microseconds, so its tokens still rise unless \
         that clock stepped back (its capabilities say `Fencing::Volatile`, which promises \
         no more); with `appendonly yes` and `appendfsync always` it is `Durable` (tested \
         in the fault matrix). ZooKeeper: its shortest session is two ticks (400 ms on the \
         harness's servers), sessions expire at tick boundaries (a takeover can exceed the TTL \
         by up to one tick), and the store-down and restart rows kill the server (SIGKILL; \
         what it acknowledged is in its transaction log either way)."
    )
    .unwrap();

    if let Some(cols) = &in_containers {
        writeln!(md).unwrap();
        writeln!(md, "## Faults at the container level").unwrap();
        writeln!(md).unwrap();
        writeln!(
            md,
            "Each store in a Docker container on a private network (images built from \
             Debian's packages by `scripts/build-test-images.sh` where no registry answers; \
             etcd with the local process's raft timing), published on a loopback port; \
             holders as processes on this machine through that port, or, where a row says \
             so, in containers of their own that reach the store over the private network \
             and the fenced resource over a second network. TTL 1 s, renewal 333 ms. The \
             same cases run as tests: `cargo test -p lease-lab --test container_faults`."
        )
        .unwrap();
        writeln!(md).unwrap();
        table(&mut md, &container_faults::ROWS, cols, "containers");
    }

    if soak > 0 {
        let mut total = Report::default();
        let mut rounds = 0;
        let mut failures = Vec::new();
        let servers = [
            ("redis", start("redis").await),
            ("postgres", start("postgres").await),
            ("etcd", start("etcd").await),
            ("mysql", start("mysql").await),
            ("zookeeper", start("zookeeper").await),
        ];
        let started = std::time::Instant::now();
        while rounds < soak {
            for (kind, server) in &servers {
                if rounds >= soak {
                    break;
                }
                let url = server.url();
                let case = rounds % 2;
                // Short rounds: 400 ms TTL where the store allows it (etcd: 1 s).
                let mut m1 = m.clone();
                m1.ttl = if *kind == "etcd" {
                    Duration::from_secs(1)
                } else {
                    Duration::from_millis(400)
                };
                let result = tokio::spawn(async move {
                    if case == 0 {
                        matrix::holder_killed(&m1, &url).await.1
                    } else {
                        matrix::holder_paused(&m1, &url).await
                    }
                })
                .await;
                match result {
                    Ok(r) => {
                        total.accepted += r.accepted;
                        total.stale_rejected += r.stale_rejected;
                        total.accepted_out_of_order += r.accepted_out_of_order;
                        total.double_beliefs.extend(r.double_beliefs);
                        total.takeovers.extend(r.takeovers);
                        total.overruns.extend(r.overruns);
                    }
                    Err(e) => failures.push(format!("round {rounds} on {kind}: {e}")),
                }
                rounds += 1;
                if rounds % 50 == 0 {
                    eprintln!("soak: {rounds}/{soak} rounds, {:?}", started.elapsed());
                }
            }
        }
        let max_takeover = total.takeovers.iter().max().copied().unwrap_or_default();
        writeln!(md).unwrap();
        writeln!(md, "## Soak: {rounds} rounds of the fault matrix").unwrap();
        writeln!(md).unwrap();
        writeln!(
            md,
            "Holder killed and holder paused, alternating, over Redis, PostgreSQL, etcd, MariaDB \
             and ZooKeeper (TTL 400 ms; etcd 1 s), {:.0} minutes.\n\n- accepted writes: {}\n- stale writes rejected by token: {}\n\
             - accepted writes out of token order: **{}**\n- calls past their timeout \
             (measured in every holder until the call returned or was cancelled; limit: \
             call timeout + 200 ms): **{}**\n- periods with two believers \
             (a paused holder that has not yet seen its lost signal): {}\n- takeovers: {}, \
             longest {}\n- failed rounds (a case's assertion, a panic, a call past its \
             timeout): **{}**",
            started.elapsed().as_secs_f64() / 60.0,
            total.accepted,
            total.stale_rejected,
            total.accepted_out_of_order,
            total.overruns.len(),
            total.double_beliefs.len(),
            total.takeovers.len(),
            secs(max_takeover),
            failures.len()
        )
        .unwrap();
        for f in &failures {
            writeln!(md, "  - {f}").unwrap();
        }
        eprintln!(
            "soak totals: {rounds} rounds, {} accepted, {} stale rejected, {} out of order, {} overruns, {} failures",
            total.accepted,
            total.stale_rejected,
            total.accepted_out_of_order,
            total.overruns.len(),
            failures.len()
        );
    }
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, &md).unwrap();
    println!("{md}");
    eprintln!("wrote {out}");
}
