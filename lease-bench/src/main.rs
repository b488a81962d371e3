//! The benchmark report: every store against its bare commands and the peer libraries,
//! renewal at scale, handoff and takeover, measured in one run against local servers
//! started by the test harness (or the `LEASE_TEST_*` addresses).
//!
//! ```text
//! cargo run --release -p lease-bench -- [--out BENCHMARKS.md] [--svg docs/benchmarks.svg]
//!     [--notes docs/benchmark-notes.md] [--only redis,postgres,etcd,mysql,zookeeper] [--quick]
//! ```
//!
//! `lease-bench count-cycles STORE URL CASE N [TASKS]` runs N cycles of one case and nothing else,
//! for the report's client instructions per cycle ([`instructions`], under callgrind, where
//! `valgrind` is installed) and for `scripts/client-instructions.sh`.
//!
//! `lease-bench heartbeat-at-scale N [BATCH [STORE]]` holds N leases through one
//! `LeaseClient` on the in-memory backend (or on a throwaway server of STORE) and reports
//! what its heartbeat costs per renewal period.
//!
//! `lease-bench renew-at-scale STORE N [TICKS]` holds N leases (TTL 30 s) on a throwaway
//! server and times the heartbeat's renewal ticks against TTL/3 (see `at_scale`).
//!
//! Without `--out` the report goes to standard output. `--quick` runs fewer rounds and
//! sizes (a smoke run; its figures are not the ones to quote); `--cycles-only` runs only
//! the acquire + release tables. Nothing here asserts a
//! speed: a benchmark measures, tests decide.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark binary: failures should be loud

mod at_scale;
mod cluster;
mod cost;
mod count;
mod cycles;
mod handoff;
mod hb_scale;
mod instructions;
mod metered;
mod placement;
mod report;
mod scale;

use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseBackend;
use lease_etcd::EtcdBackend;
use lease_mysql::MysqlBackend;
use lease_postgres::{AdvisoryLockBackend, PostgresBackend};
use lease_redis::RedisBackend;
use lease_test_servers::{EtcdServer, MariaDbServer, PostgresServer, RedisServer, ZooKeeperServer};
use lease_zookeeper::ZkBackend;

use crate::cycles::{Case, Plan};
use crate::report::StoreResult;

struct Args {
    out: Option<String>,
    svg: Option<String>,
    notes: String,
    stores: Vec<String>,
    quick: bool,
    cycles_only: bool,
}

const USAGE: &str = "usage: lease-bench [--out FILE] [--svg FILE] [--notes FILE] \
                     [--only redis,postgres,etcd,mysql,zookeeper] [--quick] [--cycles-only]\n       lease-bench hold URL NAME TTL_MS\n       lease-bench renew-at-scale redis|redis-cluster|etcd|postgres|mysql|zookeeper N [TICKS]\n       lease-bench heartbeat-at-scale N [BATCH [STORE]]\n       lease-bench count-cycles redis|etcd|postgres|mysql|zookeeper URL bare|bare-held|backend|backend-pool|client|peer|raw|native|shedlock|advisory|advisory-10|advisory-shared-10|backend-rt|client-rt N [TASKS]";

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        out: None,
        svg: None,
        notes: "docs/benchmark-notes.md".into(),
        stores: vec![
            "redis".into(),
            "postgres".into(),
            "etcd".into(),
            "mysql".into(),
            "zookeeper".into(),
        ],
        quick: false,
        cycles_only: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--out" => a.out = Some(value()?),
            "--svg" => a.svg = Some(value()?),
            "--notes" => a.notes = value()?,
            "--only" => {
                a.stores = value()?.split(',').map(|s| s.trim().to_owned()).collect();
                if let Some(bad) = a.stores.iter().find(|s| {
                    !matches!(
                        s.as_str(),
                        "redis" | "postgres" | "etcd" | "mysql" | "zookeeper"
                    )
                }) {
                    return Err(format!("unknown store {bad:?}"));
                }
            }
            "--quick" => a.quick = true,
            "--cycles-only" => a.cycles_only = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_owned(), |s| s.trim().to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or("unknown".to_owned(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0)
        });
    let kernel = read("/proc/sys/kernel/osrelease");
    let cmd = |c: &str, args: &[&str]| {
        std::process::Command::new(c)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    format!(
        "- Date: {}\n- CPU: {cpus} × {model} (a virtual machine: other tenants add noise)\n\
         - Memory: {mem}\n- Kernel: Linux {}\n- Compiler: {}, `--release`\n\
         - Client and servers on the same machine, over loopback TCP",
        cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        kernel.trim(),
        cmd("rustc", &["--version"]),
    )
}

struct Sizes {
    plan: Plan,
    scale: Vec<usize>,
    handoff: (usize, usize),
    takeover: Vec<(Duration, usize)>,
    /// A smoke run: instructions are counted once, not three times.
    quick: bool,
}

/// How much of the report to run.
#[derive(Clone, Copy)]
struct Mode {
    quick: bool,
    cycles_only: bool,
}

fn sizes(mode: Mode, cycles_one: usize, cycles_per_task: usize, rounds: usize) -> Sizes {
    let mut s = full_sizes(mode.quick, cycles_one, cycles_per_task, rounds);
    if mode.cycles_only {
        s.scale.clear();
        s.handoff = (0, 0);
        s.takeover.clear();
    }
    s
}

fn full_sizes(quick: bool, cycles_one: usize, cycles_per_task: usize, rounds: usize) -> Sizes {
    if quick {
        Sizes {
            plan: Plan {
                rounds: 7,
                cycles_one,
                tasks: 32,
                cycles_per_task,
            },
            scale: vec![1_000, 10_000],
            handoff: (10, 6),
            takeover: vec![(Duration::from_secs(1), 2)],
            quick,
        }
    } else {
        Sizes {
            plan: Plan {
                rounds,
                cycles_one,
                tasks: 32,
                cycles_per_task,
            },
            scale: vec![1_000, 10_000, 100_000],
            handoff: (50, 30),
            takeover: vec![(Duration::from_secs(1), 5), (Duration::from_secs(3), 3)],
            quick,
        }
    }
}

/// The label of the semaphore row, the same on every store.
const SEMAPHORE_ROW: &str = "library Semaphore (3 permits) try_acquire + release";

/// The label of the metrics row, the same on every store.
const METRICS_ROW: &str = "library LeaseClient try_acquire + release, metrics on (Prometheus)";

/// What one store brings to the common measurements.
struct Setup {
    store: &'static str,
    /// The store's name for `count-cycles` (the instruction counts).
    key: &'static str,
    server: String,
    url: String,
    cases: Vec<Case>,
    backend: Arc<dyn LeaseBackend>,
    counter: Option<scale::Counter>,
    round_trip_source: &'static str,
    /// How the server's side of a cycle's cost is read.
    meter: cost::ServerMeter,
}

async fn common(setup: Setup, s: &Sizes) -> StoreResult {
    let Setup {
        store,
        key,
        server,
        url,
        cases,
        backend,
        counter,
        round_trip_source,
        meter,
    } = setup;
    let url = url.as_str();
    eprintln!("{store}: acquire + release ({} rounds)", s.plan.rounds);
    cycles::warm_up(&cases, 200).await;
    let rows = cycles::run(&cases, s.plan).await;
    // After the rounds: a server that compiles as it runs (ZooKeeper's JVM) has done so
    // by then, and the first case measured would otherwise pay for it.
    eprintln!("{store}: cost per cycle ({} cycles per case)", cost::CYCLES);
    let costs = cost::per_cycle(&cases, &meter).await;
    let pinned = one_cpu(store, &cases, &meter, s.plan).await;
    eprintln!("{store}: client instructions per cycle (callgrind)");
    let instructions = instructions::count(key, url, s.quick).await;
    if let Err(why) = &instructions {
        eprintln!("{store}: instructions not counted: {why}");
    }
    eprintln!("{store}: renewal at scale {:?}", s.scale);
    let scale = scale::renewal(backend.clone(), &s.scale, 5, counter).await;
    eprintln!("{store}: handoff");
    let handoff_notify = if backend.capabilities().release_notification && s.handoff.0 > 0 {
        Some(handoff::handoff(backend.clone(), false, s.handoff.0).await)
    } else {
        None
    };
    let handoff_poll = handoff::handoff(backend.clone(), true, s.handoff.1).await;
    eprintln!("{store}: takeover");
    let mut takeover = Vec::new();
    for &(ttl, rounds) in &s.takeover {
        takeover.push(handoff::takeover(backend.clone(), url, ttl, rounds).await);
    }
    StoreResult {
        store,
        server,
        plan: s.plan,
        peer: 3,
        // The semaphore against the mutex through LeaseClient, and the same LeaseClient
        // cycle with metrics on against off (the last two cases).
        extra_pairs: vec![
            (rows.len().saturating_sub(2), 2),
            (rows.len().saturating_sub(1), 2),
        ],
        rows,
        costs,
        scale,
        round_trip_source,
        handoff_notify,
        handoff_poll,
        takeover,
        pinned,
        instructions,
        notes: Vec::new(),
    }
}

/// The one-task rounds again with this process and the server on one CPU
/// ([`placement`]): a cycle's time is then the client's work and the server's, without
/// the wake-ups of idle CPUs that decide the rates of the rounds above. Not run where the
/// server's processes cannot be seen (a container's).
async fn one_cpu(
    store: &str,
    cases: &[Case],
    meter: &cost::ServerMeter,
    plan: cycles::Plan,
) -> Result<report::OneCpu, String> {
    let server = meter
        .pid
        .ok_or("the server's processes are not visible to this process (a container)")?;
    let pinned = placement::Pinned::one_cpu(server)?;
    eprintln!(
        "{store}: one task on one CPU (CPU {}, {} rounds)",
        pinned.cpu(),
        plan.rounds
    );
    let rows = cycles::run_one_task(cases, plan.rounds, plan.cycles_one).await;
    // The cost per cycle again, on the one CPU: without the wake-ups of idle CPUs, which
    // the CPU time of the unpinned measurement includes and which move it between runs.
    eprintln!("{store}: cost per cycle on one CPU");
    let costs = cost::per_cycle(cases, meter).await;
    let cpu = pinned.cpu();
    drop(pinned);
    Ok(report::OneCpu {
        cpu,
        rounds: plan.rounds,
        cycles: plan.cycles_one,
        rows,
        costs,
    })
}

async fn redis_store(mode: Mode) -> StoreResult {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let client = redis::Client::open(url.as_str()).expect("redis client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin.clone())
        .await
        .expect("INFO");
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let backend: Arc<dyn LeaseBackend> =
        Arc::new(RedisBackend::connect(&url).await.expect("redis backend"));

    let cases = vec![
        cycles::redis_bare(conn.clone()),
        cycles::backend_case("library backend acquire + release", backend.clone()),
        cycles::client_case("library LeaseClient try_acquire + release", backend.clone()),
        cycles::redis_rslock(&url),
        cycles::redis_library_scripts_raw(conn),
        cycles::semaphore_case(SEMAPHORE_ROW, backend.clone()),
        // The LeaseClient row's cycle with its metrics recorded (last).
        metered::client_case(METRICS_ROW, backend.clone()),
    ];
    let commandstats = move |count: fn(&str) -> u64| -> scale::Counter {
        let admin = admin.clone();
        Box::new(move || {
            let mut admin = admin.clone();
            Box::pin(async move {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut admin)
                    .await
                    .expect("INFO commandstats");
                count(&info)
            })
        })
    };
    let counter = commandstats(lease_test_servers::redis::script_calls);
    let requests = commandstats(cost::redis_commands);
    let s = sizes(mode, 400, 40, 101);
    let mut notes = Vec::new();
    let setup = Setup {
        store: "Redis",
        key: "redis",
        server: format!("Redis {version} ({}, no persistence)", server.source()),
        url,
        cases,
        backend,
        counter: Some(counter),
        round_trip_source: "script calls, INFO commandstats",
        meter: cost::ServerMeter {
            pid: server.pid(),
            requests: Some((
                requests,
                "commands run, scripts' own included, INFO commandstats",
            )),
        },
    };
    let mut r = common(setup, &s).await;
    notes.push(metered::memory_cost().await);
    notes.extend(cluster::notes(s.plan, &s.scale).await);
    r.notes = notes;
    r
}

async fn postgres_store(mode: Mode) -> StoreResult {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    // Renewing 100,000 leases is ten concurrent 10,000-lease statements; on this 2-vCPU
    // machine a tick has taken more than the default 5 s call timeout, so the
    // benchmark allows 30 s (the report shows the slowest tick).
    let pg = PostgresBackend::connect_with(
        &url,
        lease_postgres::PostgresConfig::default().with_request_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("postgres backend");
    // The statements sent raw (and sqlx's `PgAdvisoryLock`) go through a pool of their
    // own, of ten connections with no ping before a checkout, as the backend's is; sqlx
    // pings each connection that comes back to it, where the backend keeps its
    // connections between statements.
    let pool = lease_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .expect("postgres pool");
    let (version,): (String,) = lease_postgres::sqlx::query_as("SHOW server_version")
        .fetch_one(&pool)
        .await
        .expect("server_version");
    let (fsync,): (String,) = lease_postgres::sqlx::query_as("SHOW fsync")
        .fetch_one(&pool)
        .await
        .expect("fsync");
    cycles::postgres_bare_table(&pool).await;
    // Every case has a table of its own, as the floor has: cases sharing one table would
    // share its pages, and each case's row versions would crowd the others'.
    let client_pg = PostgresBackend::connect_with(
        &url,
        lease_postgres::PostgresConfig::default().with_table("lease_locks_client".to_owned()),
    )
    .await
    .expect("postgres backend");
    let raw_pg = PostgresBackend::from_pool(
        pool.clone(),
        lease_postgres::PostgresConfig::default().with_table("lease_locks_raw".to_owned()),
    )
    .await
    .expect("postgres backend");
    let (acquire_sql, release_sql) = raw_pg.cycle_statements();
    let raw = cycles::postgres_library_statements_raw(
        pool.clone(),
        acquire_sql.to_owned(),
        release_sql.to_owned(),
    );
    let backend: Arc<dyn LeaseBackend> = Arc::new(pg);
    let client_backend: Arc<dyn LeaseBackend> = Arc::new(client_pg);
    let advisory: Arc<dyn LeaseBackend> = Arc::new(
        AdvisoryLockBackend::connect(&url)
            .await
            .expect("advisory backend"),
    );
    // The advisory mode on as many server sessions as sqlx's pool has connections.
    let peer_pool = pool.options().get_max_connections() as usize;
    let mut advisory_limited = AdvisoryLockBackend::connect(&url)
        .await
        .expect("advisory backend");
    advisory_limited
        .set_max_sessions(peer_pool)
        .expect("advisory session limit");
    let advisory_limited: Arc<dyn LeaseBackend> = Arc::new(advisory_limited);
    // The advisory mode with leases sharing as many sessions as sqlx's pool has
    // connections: the holders are not bounded by them.
    let mut advisory_shared = AdvisoryLockBackend::connect(&url)
        .await
        .expect("advisory backend");
    advisory_shared
        .set_shared_sessions(peer_pool)
        .expect("advisory shared sessions");
    let advisory_shared: Arc<dyn LeaseBackend> = Arc::new(advisory_shared);
    let cases = vec![
        cycles::postgres_bare(pool.clone()),
        cycles::backend_case("library backend acquire + release", backend.clone()),
        cycles::client_case(
            "library LeaseClient try_acquire + release",
            client_backend.clone(),
        ),
        cycles::postgres_shedlock(pool.clone()),
        cycles::postgres_sqlx_advisory(pool.clone()),
        cycles::backend_case("library advisory mode: backend acquire + release", advisory),
        cycles::backend_case(
            &format!(
                "library advisory mode, at most {peer_pool} sessions (the peer's pool): backend \
                 acquire + release"
            ),
            advisory_limited,
        ),
        cycles::backend_case(
            &format!(
                "library advisory mode, leases sharing at most {peer_pool} sessions: backend \
                 acquire + release"
            ),
            advisory_shared,
        ),
        raw,
        cycles::postgres_bare_held(pool.clone()),
        cycles::semaphore_case(SEMAPHORE_ROW, backend.clone()),
        // The LeaseClient row's cycle with its metrics recorded (last).
        metered::client_case(METRICS_ROW, client_backend.clone()),
    ];
    let s = sizes(mode, 120, 15, 101);
    let setup = Setup {
        store: "PostgreSQL",
        key: "postgres",
        server: format!(
            "PostgreSQL {version} ({}, fsync {fsync}; pool of {} connections)",
            server.source(),
            pool.options().get_max_connections()
        ),
        url,
        cases,
        backend,
        counter: None,
        round_trip_source: "",
        // Not counted: PostgreSQL's statistics views lag by up to its idle flush
        // interval (10 s).
        meter: cost::ServerMeter {
            pid: server.pid(),
            requests: None,
        },
    };
    let mut r = common(setup, &s).await;
    // The advisory mode against sqlx's `PgAdvisoryLock`.
    r.extra_pairs.push((5, 4));
    r.extra_pairs.push((6, 4));
    r.extra_pairs.push((7, 4));
    r
}

async fn etcd_store(mode: Mode) -> StoreResult {
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let endpoints = server.endpoints();
    let mut bare = lease_etcd::etcd_client::Client::connect(endpoints.clone(), None)
        .await
        .expect("etcd client");
    let version = match endpoints.first() {
        Some(ep) => bare
            .status()
            .await
            .map(|s| s.version().to_owned())
            .unwrap_or_else(|_| format!("? at {ep}")),
        None => "?".into(),
    };
    let lease = bare.lease_grant(60, None).await.expect("lease grant").id();
    // Keep the bare floor's and the lock service's lease alive for the whole run.
    let (mut keeper, _stream) = bare.lease_keep_alive(lease).await.expect("keepalive");
    let keep = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            if keeper.keep_alive().await.is_err() {
                break;
            }
        }
    });
    let etcd = Arc::new(EtcdBackend::connect(&url).await.expect("etcd backend"));
    let backend: Arc<dyn LeaseBackend> = etcd.clone();
    let cases = vec![
        cycles::etcd_bare(bare.clone(), lease),
        cycles::backend_case("library backend acquire + release", backend.clone()),
        cycles::client_case("library LeaseClient try_acquire + release", backend.clone()),
        cycles::etcd_lock_service(bare.clone(), lease),
        cycles::etcd_plain_delete(bare.clone(), lease),
        cycles::semaphore_case(SEMAPHORE_ROW, backend.clone()),
        // The LeaseClient row's cycle with its metrics recorded (last).
        metered::client_case(METRICS_ROW, backend.clone()),
    ];
    let counter: scale::Counter = Box::new(move || {
        let etcd = etcd.clone();
        Box::pin(async move { etcd.keepalives_sent() })
    });
    let metrics_url = endpoints.first().cloned().unwrap_or_default();
    let requests: scale::Counter = Box::new(move || {
        let url = metrics_url.clone();
        Box::pin(async move { cost::etcd_messages(&cost::etcd_metrics(&url).await) })
    });
    let s = sizes(mode, 80, 10, 101);
    let setup = Setup {
        store: "etcd",
        key: "etcd",
        server: format!("etcd {version} ({}, single member)", server.source()),
        url,
        cases,
        backend,
        counter: Some(counter),
        round_trip_source: "keepalive requests sent",
        meter: cost::ServerMeter {
            pid: server.pid(),
            requests: Some((requests, "gRPC messages received, /metrics")),
        },
    };
    let r = common(setup, &s).await;
    keep.abort();
    r
}

async fn zookeeper_store(mode: Mode) -> StoreResult {
    // A local standalone server (tick 200 ms, data in /dev/shm: ZooKeeper fsyncs its log
    // before every write's answer, as etcd does, and the harness keeps both in memory).
    let server = ZooKeeperServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("zk://{}/bench", server.address());
    let version = server
        .srvr()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Zookeeper version: "))
                .and_then(|v| v.split([',', '-']).next())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".into());
    let bare = lease_zookeeper::zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(&server.address())
        .await
        .expect("zookeeper client");
    cycles::zk_case_dirs(&bare)
        .await
        .unwrap_or_else(|e| panic!("bench dirs: {e}"));
    // Renewing 100,000 leases is 100 multiReads in one tick: more than the default 5 s
    // call timeout may pass on this machine.
    let zk = Arc::new(
        ZkBackend::connect_url_with(
            &url,
            lease_zookeeper::ZkConfig::default().with_request_timeout(Duration::from_secs(30)),
        )
        .await
        .expect("zookeeper backend"),
    );
    let backend: Arc<dyn LeaseBackend> = zk.clone();
    // The same backend with its sessions on this runtime instead of its own I/O thread.
    let on_this_runtime: Arc<dyn LeaseBackend> = Arc::new(
        ZkBackend::connect_url_with(
            &url,
            lease_zookeeper::ZkConfig::default()
                .with_request_timeout(Duration::from_secs(30))
                .with_runtime(tokio::runtime::Handle::current()),
        )
        .await
        .expect("zookeeper backend"),
    );
    let cases = vec![
        cycles::zk_bare(bare.clone()),
        cycles::backend_case("library backend acquire + release", backend.clone()),
        cycles::client_case("library LeaseClient try_acquire + release", backend.clone()),
        cycles::zk_curator(bare.clone()),
        cycles::zk_library_raw(bare.clone()),
        cycles::backend_case(
            "library backend acquire + release, sessions on the caller's runtime (ZkConfig::with_runtime)",
            on_this_runtime,
        ),
        cycles::semaphore_case(SEMAPHORE_ROW, backend.clone()),
        metered::client_case(METRICS_ROW, backend.clone()),
    ];
    let counter: scale::Counter = Box::new(move || {
        let zk = zk.clone();
        Box::pin(async move { zk.renew_requests() })
    });
    let zk_port = server.port();
    let requests: scale::Counter = Box::new(move || {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                lease_test_servers::zookeeper::four_letter(zk_port, "srvr")
            })
            .await
            .ok()
            .flatten()
            .and_then(|s| cost::zookeeper_received(&s))
            .expect("ZooKeeper srvr's Received count")
        })
    });
    let s = sizes(mode, 200, 20, 101);
    let setup = Setup {
        store: "ZooKeeper",
        key: "zookeeper",
        server: format!(
            "ZooKeeper {version} (local process, standalone, tickTime 200 ms, data in /dev/shm)"
        ),
        url,
        cases,
        backend,
        counter: Some(counter),
        round_trip_source: "multiRead requests sent",
        meter: cost::ServerMeter {
            pid: server.pid(),
            requests: Some((requests, "packets received, srvr")),
        },
    };
    common(setup, &s).await
}

async fn mysql_store(mode: Mode) -> StoreResult {
    // A local server with the default durability (`innodb_flush_log_at_trx_commit=1`, a
    // log flush per commit), as PostgreSQL runs with fsync on.
    let server = MariaDbServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    // As for PostgreSQL: ten concurrent 10,000-lease renewals may take more than the
    // default 5 s call timeout on this machine.
    let config =
        || lease_mysql::MysqlConfig::default().with_request_timeout(Duration::from_secs(30));
    let my = MysqlBackend::connect_with(&url, config())
        .await
        .expect("mysql backend");
    // The statements sent raw go through a pool of their own, built as the backend builds
    // its own (ten connections, no ping before a checkout); sqlx pings each connection
    // that comes back to it, where the backend keeps its connections between statements.
    let pool = lease_mysql::sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .expect("mysql pool");
    let (version, flush): (String, i64) = lease_mysql::sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)",
    )
    .fetch_one(&pool)
    .await
    .expect("version");
    cycles::mysql_bare_tables(&pool).await;
    // A table per case, as for PostgreSQL.
    let client_my =
        MysqlBackend::connect_with(&url, config().with_table("lease_locks_client".to_owned()))
            .await
            .expect("mysql backend");
    let raw_my = MysqlBackend::from_pool(
        pool.clone(),
        config().with_table("lease_locks_raw".to_owned()),
    )
    .await
    .expect("mysql backend");
    let (acquire_sql, release_sql) = raw_my.cycle_statements();
    let raw = cycles::mysql_library_statements_raw(
        pool.clone(),
        acquire_sql.to_owned(),
        release_sql.to_owned(),
    );
    let backend: Arc<dyn LeaseBackend> = Arc::new(my);
    let client_backend: Arc<dyn LeaseBackend> = Arc::new(client_my);
    let cases = vec![
        cycles::mysql_bare(pool.clone()),
        cycles::backend_case("library backend acquire + release", backend.clone()),
        cycles::client_case(
            "library LeaseClient try_acquire + release",
            client_backend.clone(),
        ),
        cycles::mysql_shedlock(pool.clone()),
        raw,
        cycles::mysql_bare_held(pool.clone()),
        cycles::semaphore_case(SEMAPHORE_ROW, backend.clone()),
        // The LeaseClient row's cycle with its metrics recorded (last).
        metered::client_case(METRICS_ROW, client_backend.clone()),
    ];
    // Round trips of a renewal tick, counted by the server: every renew call runs one
    // UPDATE (with its SET and SELECT, in one round trip).
    let admin = pool.clone();
    let counter: scale::Counter = Box::new(move || {
        let admin = admin.clone();
        Box::pin(async move {
            let (_, n): (String, String) =
                lease_mysql::sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Com_update'")
                    .fetch_one(&admin)
                    .await
                    .expect("Com_update");
            n.parse().expect("Com_update is a number")
        })
    });
    // Statements the server ran for clients (`Questions`), less those that read it.
    let admin = pool.clone();
    let readings = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let requests: scale::Counter = Box::new(move || {
        let admin = admin.clone();
        let readings = readings.clone();
        Box::pin(async move {
            let (_, n): (String, String) =
                lease_mysql::sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                    .fetch_one(&admin)
                    .await
                    .expect("Questions");
            let read = readings.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            n.parse::<u64>()
                .expect("Questions is a number")
                .saturating_sub(read)
        })
    });
    let s = sizes(mode, 120, 15, 101);
    let setup = Setup {
        store: "MySQL",
        key: "mysql",
        server: format!(
            "MariaDB {version} ({}, innodb_flush_log_at_trx_commit={flush}; pool of {} \
             connections)",
            server.source(),
            pool.options().get_max_connections()
        ),
        url,
        cases,
        backend,
        counter: Some(counter),
        round_trip_source: "UPDATE statements, Com_update",
        meter: cost::ServerMeter {
            pid: server.pid(),
            requests: Some((requests, "statements, Questions")),
        },
    };
    common(setup, &s).await
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("count-cycles") {
        // On a runtime of one thread, without the metrics recorder: what callgrind
        // counts is the case's own work.
        if let Err(e) = count::main(&argv[1..]) {
            eprintln!("lease-bench count-cycles: {e}\n{USAGE}");
            std::process::exit(64);
        }
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(async_main(argv));
}

async fn async_main(argv: Vec<String>) {
    metered::install();
    if argv.first().map(String::as_str) == Some("hold") {
        let [_, url, name, ttl_ms] = argv.as_slice() else {
            eprintln!("{USAGE}");
            std::process::exit(64);
        };
        let ttl = Duration::from_millis(ttl_ms.parse().unwrap_or(1000));
        handoff::hold(url, name, ttl).await;
        return;
    }
    if argv.first().map(String::as_str) == Some("heartbeat-at-scale") {
        let (n, batch, store) = match argv.as_slice() {
            [_, n] => (n.as_str(), "10000", None),
            [_, n, batch] => (n.as_str(), batch.as_str(), None),
            [_, n, batch, store] => (n.as_str(), batch.as_str(), Some(store.as_str())),
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(64);
            }
        };
        let (Ok(n), Ok(batch)) = (
            n.replace('_', "").parse::<usize>(),
            batch.replace('_', "").parse::<usize>(),
        ) else {
            eprintln!("{USAGE}");
            std::process::exit(64);
        };
        hb_scale::run(n, batch, store).await;
        return;
    }
    if argv.first().map(String::as_str) == Some("renew-at-scale") {
        let (store, n, ticks) = match argv.as_slice() {
            [_, store, n] => (store, n, "3"),
            [_, store, n, ticks] => (store, n, ticks.as_str()),
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(64);
            }
        };
        let (Ok(n), Ok(ticks)) = (n.replace('_', "").parse::<usize>(), ticks.parse::<usize>())
        else {
            eprintln!("{USAGE}");
            std::process::exit(64);
        };
        at_scale::run(store, n, ticks.max(1)).await;
        return;
    }
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("lease-bench: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if e.is_empty() { 0 } else { 64 });
        }
    };
    let command = if argv.is_empty() {
        "cargo run --release -p lease-bench".to_owned()
    } else {
        format!("cargo run --release -p lease-bench -- {}", argv.join(" "))
    };
    let mode = Mode {
        quick: args.quick,
        cycles_only: args.cycles_only,
    };
    let mut results = Vec::new();
    for store in &args.stores {
        results.push(match store.as_str() {
            "redis" => redis_store(mode).await,
            "postgres" => postgres_store(mode).await,
            "mysql" => mysql_store(mode).await,
            "zookeeper" => zookeeper_store(mode).await,
            _ => etcd_store(mode).await,
        });
    }
    let notes = std::fs::read_to_string(&args.notes).unwrap_or_default();
    let md = report::markdown(&results, &machine(), &command, &notes);
    match &args.out {
        Some(path) => {
            std::fs::write(path, &md).unwrap_or_else(|e| panic!("write {path}: {e}"));
            eprintln!("wrote {path}");
        }
        None => println!("{md}"),
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, report::svg(&results)).unwrap_or_else(|e| panic!("write {path}: {e}"));
        eprintln!("wrote {path}");
    }
}
