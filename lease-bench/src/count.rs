//! `lease-bench count-cycles STORE URL CASE N [TASKS]`: N acquire + release cycles of one
//! case, with one connection, on a current-thread runtime (spread over TASKS concurrent
//! tasks, default 1), and nothing else: the program that
//! `scripts/client-instructions.sh` runs under callgrind twice (N and 2N cycles), so that
//! the difference is the client's instructions for N cycles, without start-up and
//! connection set-up. Instructions are counted, not timed, so the figure repeats on a
//! loaded machine. With `LEASE_BENCH_WORKERS=N` the cycles run on a multi-thread runtime
//! of N workers instead, as the benchmark's rounds do, so that hand-overs between
//! threads show in the system calls and the CPU time it prints.

use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseBackend;

use crate::cycles::{self, Case};

/// Builds the case and runs 200 warm-up cycles, then `n`, on the caller's runtime, the `n`
/// spread over `tasks` concurrent tasks (`n / tasks` each). Prints to standard error what
/// the `n` cycles cost this process per cycle: read and write system calls (`syscr`,
/// `syscw` of `/proc/self/io`) and CPU time (`getrusage`), which on Linux repeat
/// far better than a rate and show how well concurrent requests share system calls, and
/// the wall time (which, unlike the others, includes the server's time).
pub async fn run(store: &str, url: &str, case: &str, n: usize, tasks: usize) -> Result<(), String> {
    let case = build(store, url, case).await?;
    let tasks = tasks.max(1);
    let prefix = format!("count-{}", uuid::Uuid::new_v4().simple());
    // Every task's loop goes over up to 64 names of its own. The warm-up takes each of
    // them once (a name's first acquisition does more: a Redis fencing counter is
    // seeded), so the counted cycles find their names as the benchmark's rounds do, and
    // the same warm-up in both runs cancels out of the difference.
    let spread = |per_task: usize| {
        let run = case.run.clone();
        let prefix = prefix.clone();
        async move {
            let handles: Vec<_> = (0..tasks)
                .map(|t| tokio::spawn(run(format!("{prefix}-{t}"), per_task)))
                .collect();
            for h in handles {
                h.await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }
    };
    spread(200).await?;
    let before = Usage::read();
    let started = std::time::Instant::now();
    spread(n / tasks).await?;
    let wall = started.elapsed();
    let cycles = n / tasks * tasks;
    if let (Some(a), Some(b)) = (before, Usage::read()) {
        let per = |x: u64, y: u64| y.saturating_sub(x) as f64 / cycles.max(1) as f64;
        eprintln!(
            "per cycle ({cycles} cycles, {tasks} task(s)): {:.3} read syscalls, {:.3} write syscalls, {:.1} us CPU, {:.1} us wall",
            per(a.syscr, b.syscr),
            per(a.syscw, b.syscw),
            b.cpu.saturating_sub(a.cpu).as_secs_f64() * 1e6 / cycles.max(1) as f64,
            wall.as_secs_f64() * 1e6 / cycles.max(1) as f64,
        );
    }
    Ok(())
}

/// This process's read and write system calls and CPU time so far, on Linux.
#[derive(Clone, Copy)]
struct Usage {
    syscr: u64,
    syscw: u64,
    cpu: Duration,
}

impl Usage {
    fn read() -> Option<Usage> {
        let io = std::fs::read_to_string("/proc/self/io").ok()?;
        let field = |name: &str| {
            io.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(Usage {
            syscr: field("syscr:")?,
            syscw: field("syscw:")?,
            cpu: crate::scale::cpu_now(),
        })
    }
}

/// The case named `case` on `store`: `bare`, `backend`, `client`, `peer` (rslock; etcd's
/// lock service), and on Redis `raw` (the library's commands sent with the bare floor's
/// client code) and `native` (an acquire without Lua, sent raw); on PostgreSQL also
/// `shedlock` (ShedLock's statements), `advisory` (the advisory-lock mode's backend),
/// `advisory-10` (the same with at most 10 sessions), `advisory-shared-10` (leases sharing
/// at most 10 sessions) and `peer` (sqlx's `PgAdvisoryLock`
/// on a pool of 10); on PostgreSQL and MySQL also `bare-held` (the floor's statements on
/// a connection the loop holds: no ping on the way back to the pool) and `backend-pool`
/// (the backend on a pool of the caller's, which gives every connection back); on MySQL
/// `shedlock` and `raw` too; on ZooKeeper `raw` (the library's requests sent with the
/// bare floor's client code), `backend-rt` and `client-rt` (the sessions on the calling
/// runtime: `ZkConfig::with_runtime`) and `peer` (Curator's `InterProcessMutex` recipe
/// sent raw).
async fn build(store: &str, url: &str, case: &str) -> Result<Case, String> {
    match store {
        "redis" => {
            let client = redis::Client::open(url).map_err(|e| e.to_string())?;
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            let backend = || async { shared(lease_redis::RedisBackend::connect(url).await) };
            Ok(match case {
                "bare" => cycles::redis_bare(conn),
                "backend" => cycles::backend_case("backend", backend().await?),
                "client" => cycles::client_case("client", backend().await?),
                "peer" => cycles::redis_rslock(url),
                "raw" => cycles::redis_library_scripts_raw(conn),
                "native" => cycles::redis_native_acquire_sketch(conn),
                other => return Err(format!("unknown case {other:?}")),
            })
        }
        "etcd" => {
            let endpoint = url.trim_start_matches("etcd://").to_owned();
            let mut bare = lease_etcd::etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(|e| e.to_string())?;
            let backend = || async { shared(lease_etcd::EtcdBackend::connect(url).await) };
            // A lease for the bare floor and the lock service, as in the report (long
            // enough for any run; revoked when the server goes).
            let lease = || {
                let mut bare = bare.clone();
                async move {
                    bare.lease_grant(3600, None)
                        .await
                        .map(|r| r.id())
                        .map_err(|e| e.to_string())
                }
            };
            let case = match case {
                "bare" => cycles::etcd_bare(bare.clone(), lease().await?),
                "backend" => cycles::backend_case("backend", backend().await?),
                "client" => cycles::client_case("client", backend().await?),
                "peer" => cycles::etcd_lock_service(bare.clone(), lease().await?),
                other => return Err(format!("unknown case {other:?} on etcd")),
            };
            // Touch the connection so that its set-up is outside the counted cycles.
            bare.status().await.map_err(|e| e.to_string())?;
            Ok(case)
        }
        "postgres" => {
            // No ping before a checkout, as the backend's pool and the benchmark's.
            let pool_of = |max: u32| async move {
                lease_postgres::sqlx::postgres::PgPoolOptions::new()
                    .max_connections(max)
                    .test_before_acquire(false)
                    .connect(url)
                    .await
                    .map_err(|e| e.to_string())
            };
            let pool = pool_of(1).await?;
            cycles::postgres_bare_table(&pool).await;
            let table = || async { shared(lease_postgres::PostgresBackend::connect(url).await) };
            Ok(match case {
                "bare" => cycles::postgres_bare(pool),
                "bare-held" => cycles::postgres_bare_held(pool),
                "backend" => cycles::backend_case("backend", table().await?),
                // The backend on a pool of the caller's: every statement gives its
                // connection back to the pool (which pings it). A pool of 10, as the
                // backend's own, not the floor's pool of one.
                "backend-pool" => {
                    let ten = pool_of(10).await?;
                    cycles::backend_case(
                        "backend-pool",
                        Arc::new(
                            lease_postgres::PostgresBackend::from_pool(ten, Default::default())
                                .await
                                .map_err(|e| e.to_string())?,
                        ),
                    )
                }
                "client" => cycles::client_case("client", table().await?),
                "shedlock" => cycles::postgres_shedlock(pool),
                "advisory" => cycles::backend_case(
                    "advisory",
                    shared(lease_postgres::AdvisoryLockBackend::connect(url).await)?,
                ),
                "advisory-10" => {
                    let mut b = lease_postgres::AdvisoryLockBackend::connect(url)
                        .await
                        .map_err(|e| e.to_string())?;
                    b.set_max_sessions(10).map_err(|e| e.to_string())?;
                    cycles::backend_case("advisory-10", Arc::new(b))
                }
                "advisory-shared-10" => {
                    let mut b = lease_postgres::AdvisoryLockBackend::connect(url)
                        .await
                        .map_err(|e| e.to_string())?;
                    b.set_shared_sessions(10).map_err(|e| e.to_string())?;
                    cycles::backend_case("advisory-shared-10", Arc::new(b))
                }
                // On a pool of 10, as in the benchmark: on the pool of one above, its
                // tasks would take turns on one session.
                "peer" => cycles::postgres_sqlx_advisory(
                    lease_postgres::sqlx::postgres::PgPoolOptions::new()
                        .max_connections(10)
                        .connect(url)
                        .await
                        .map_err(|e| e.to_string())?,
                ),
                other => return Err(format!("unknown case {other:?} on postgres")),
            })
        }
        "zookeeper" => {
            use lease_zookeeper::zookeeper_client as zk;
            let address = url
                .trim_start_matches("zk://")
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let bare = zk::Client::connector()
                .with_session_timeout(Duration::from_secs(30))
                .connect(&address)
                .await
                .map_err(|e| e.to_string())?;
            cycles::zk_case_dirs(&bare).await?;
            let backend = || async { shared(lease_zookeeper::ZkBackend::connect(url).await) };
            // Sessions on this runtime (`ZkConfig::with_runtime`) instead of the backend's
            // own I/O thread.
            let on_this_runtime = || async {
                let config = lease_zookeeper::ZkConfig::default()
                    .with_runtime(tokio::runtime::Handle::current());
                shared(lease_zookeeper::ZkBackend::connect_url_with(url, config).await)
            };
            Ok(match case {
                "bare" => cycles::zk_bare(bare),
                "raw" => cycles::zk_library_raw(bare),
                "backend" => cycles::backend_case("backend", backend().await?),
                "client" => cycles::client_case("client", backend().await?),
                "backend-rt" => cycles::backend_case("backend-rt", on_this_runtime().await?),
                "client-rt" => cycles::client_case("client-rt", on_this_runtime().await?),
                "peer" => cycles::zk_curator(bare),
                other => return Err(format!("unknown case {other:?} on zookeeper")),
            })
        }
        "mysql" => {
            let backend = || async {
                lease_mysql::MysqlBackend::connect(url)
                    .await
                    .map_err(|e| e.to_string())
            };
            // The statements sent raw go through a backend's pool, as in the benchmark
            // (no ping before each statement).
            let pool = backend().await?.pool().clone();
            cycles::mysql_bare_tables(&pool).await;
            Ok(match case {
                "bare" => cycles::mysql_bare(pool),
                "bare-held" => cycles::mysql_bare_held(pool),
                "shedlock" => cycles::mysql_shedlock(pool),
                "backend" => cycles::backend_case("backend", Arc::new(backend().await?)),
                // The backend on a pool of the caller's: every statement gives its
                // connection back to the pool (which pings it).
                "backend-pool" => cycles::backend_case(
                    "backend-pool",
                    Arc::new(
                        lease_mysql::MysqlBackend::from_pool(pool, Default::default())
                            .await
                            .map_err(|e| e.to_string())?,
                    ),
                ),
                "client" => cycles::client_case("client", Arc::new(backend().await?)),
                "raw" => {
                    let b = backend().await?;
                    let (acquire, release) = b.cycle_statements();
                    cycles::mysql_library_statements_raw(
                        pool,
                        acquire.to_owned(),
                        release.to_owned(),
                    )
                }
                other => return Err(format!("unknown case {other:?} on mysql")),
            })
        }
        other => Err(format!(
            "count-cycles runs on redis, etcd, postgres, mysql or zookeeper, not {other:?}"
        )),
    }
}

/// A connected backend as the cases take it, or its error as text.
fn shared<B: LeaseBackend + 'static>(
    connected: lease_core::Result<B>,
) -> Result<Arc<dyn LeaseBackend>, String> {
    connected
        .map(|b| Arc::new(b) as Arc<dyn LeaseBackend>)
        .map_err(|e| e.to_string())
}

/// Parses `STORE URL CASE N [TASKS]` and runs it on a current-thread runtime (or a
/// multi-thread one of `LEASE_BENCH_WORKERS` workers).
pub fn main(args: &[String]) -> Result<(), String> {
    let (store, url, case, n, tasks) = match args {
        [store, url, case, n] => (store, url, case, n, None),
        [store, url, case, n, tasks] => (store, url, case, n, Some(tasks)),
        _ => return Err("count-cycles needs STORE URL CASE N [TASKS]".into()),
    };
    let n: usize = n.parse().map_err(|e| format!("N: {e}"))?;
    let tasks: usize = match tasks {
        Some(t) => t.parse().map_err(|e| format!("TASKS: {e}"))?,
        None => 1,
    };
    // `LEASE_BENCH_WORKERS=N`: on a multi-thread runtime of N workers instead, as the
    // benchmark's rounds run (its wake-ups between threads are then counted too).
    let workers = std::env::var("LEASE_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&w| w > 0);
    let rt = match workers {
        Some(w) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(w)
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .map_err(|e| e.to_string())?;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3600), run(store, url, case, n, tasks))
            .await
            .map_err(|_| "timed out".to_owned())?
    })
}
