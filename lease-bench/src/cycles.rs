//! Acquire + release cycles: the runner (cases in alternating rounds, one task and many
//! tasks, per-round ratios) and the cycle loops of the bare commands, the library and the
//! peer libraries.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions, Owner,
    OwnerToken, Semaphore, TryAcquire, TryPermit,
};
use lease_etcd::etcd_client::{self, Compare, CompareOp, PutOptions, Txn, TxnOp};
use lease_mysql::sqlx::MySqlPool;
use lease_postgres::sqlx::{self, PgPool};

/// A boxed cycle loop: `(prefix, cycles)`; each task gets a prefix of its own, so tasks
/// never contend.
pub type Loop =
    Arc<dyn Fn(String, usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One measured case.
pub struct Case {
    /// What it runs.
    pub label: String,
    /// Its cycle loop.
    pub run: Loop,
}

impl Case {
    /// A case from a cycle loop.
    pub fn new<F, Fut>(label: impl Into<String>, f: F) -> Self
    where
        F: Fn(String, usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Case {
            label: label.into(),
            run: Arc::new(move |p, n| Box::pin(f(p, n))),
        }
    }
}

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Rounds; every round runs every case once with one task and once with `tasks`.
    pub rounds: usize,
    /// Cycles per round with one task.
    pub cycles_one: usize,
    /// Concurrent tasks of the second mode.
    pub tasks: usize,
    /// Cycles per task and round with `tasks` tasks.
    pub cycles_per_task: usize,
}

/// Median and spread of one figure over the rounds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Lower end of the median's 95% confidence interval.
    pub lo: f64,
    /// Upper end of the median's 95% confidence interval.
    pub hi: f64,
    /// Lowest round.
    pub min: f64,
    /// Highest round.
    pub max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return Spread::default();
        }
        let (lo, hi) = median_interval(v.len());
        Spread {
            median: v[v.len() / 2],
            lo: v[lo],
            hi: v[hi],
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

/// The ranks (0-based, in the sorted rounds) that bound a 95% confidence interval of the
/// median of `n` rounds, whatever their distribution, the rounds taken as independent
/// draws: the number of rounds below the true median is binomial (n, 1/2), so the interval runs from rank n/2 - 0.98 sqrt(n) to rank
/// n/2 + 0.98 sqrt(n), rounded outwards (the normal approximation; 1.96 standard deviations of that count,
/// which is sqrt(n)/2). With 101 rounds: ranks 40 to 60. With few rounds it widens to the
/// lowest and highest round.
pub fn median_interval(n: usize) -> (usize, usize) {
    if n == 0 {
        return (0, 0);
    }
    // The median's own rank, as `Spread::of` takes it, and the same distance either side.
    let m = n / 2;
    let d = (0.98 * (n as f64).sqrt()).ceil() as usize;
    (m.saturating_sub(d), (m + d).min(n - 1))
}

/// The results of one case: cycles/s and its ratio to the first case (the floor), for one
/// task (`[0]`) and for many (`[1]`).
#[derive(Clone, Debug)]
pub struct Row {
    /// The case's label.
    pub label: String,
    /// Cycles per second over the rounds.
    pub rate: [Spread; 2],
    /// Per-round ratio to the first case of the same round.
    pub ratio: [Spread; 2],
    /// Per-round ratios to each other case (`vs[j]` = this case / case `j`).
    pub vs: Vec<[Spread; 2]>,
}

async fn timed(case: &Case, tasks: usize, per_task: usize, tag: &str) -> Duration {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn((case.run)(format!("{tag}-{t}"), per_task)))
        .collect();
    for h in handles {
        h.await.expect("benchmark task");
    }
    start.elapsed()
}

/// Slices per round: a case's cycles of one round run in this many slices, interleaved
/// with the other cases' slices (one task, many tasks).
const SLICES: [usize; 2] = [8, 4];

/// Runs every case in `plan.rounds` rounds. Within a round each case's cycles run in
/// slices interleaved with the other cases' slices, starting at a different case each
/// slice, so that drift and bursts of load on the machine (a shared VM's CPU steal comes
/// in bursts of milliseconds) hit all cases alike; a case's rate in a round is its cycles
/// over the sum of its slices' times, its ratio is taken within the round, and the median
/// over rounds is reported.
pub async fn run(cases: &[Case], plan: Plan) -> Vec<Row> {
    let modes = [(1, plan.cycles_one), (plan.tasks, plan.cycles_per_task)];
    // rates[case][mode][round]
    let rates = rates_by_mode(cases, plan.rounds, &modes).await;
    let k = cases.len();
    (0..k)
        .map(|c| Row {
            label: cases[c].label.clone(),
            rate: [
                Spread::of(rates[c][0].clone()),
                Spread::of(rates[c][1].clone()),
            ],
            ratio: [ratios(&rates, c, 0, 0), ratios(&rates, c, 0, 1)],
            vs: (0..k)
                .map(|j| [ratios(&rates, c, j, 0), ratios(&rates, c, j, 1)])
                .collect(),
        })
        .collect()
}

/// One case's figures over rounds of one mode only.
#[derive(Clone, Debug)]
pub struct OneModeRow {
    /// The case's label.
    pub label: String,
    /// Cycles per second over the rounds.
    pub rate: Spread,
    /// Per-round ratio to the first case of the same round.
    pub ratio: Spread,
    /// Per-round ratios to each other case (`vs[j]` = this case / case `j`).
    pub vs: Vec<Spread>,
}

/// Every case in `rounds` rounds of one task only, `cycles` per round in slices
/// interleaved as [`run`] does.
pub async fn run_one_task(cases: &[Case], rounds: usize, cycles: usize) -> Vec<OneModeRow> {
    let rates = rates_by_mode(cases, rounds, &[(1, cycles)]).await;
    let k = cases.len();
    (0..k)
        .map(|c| OneModeRow {
            label: cases[c].label.clone(),
            rate: Spread::of(rates[c][0].clone()),
            ratio: ratios(&rates, c, 0, 0),
            vs: (0..k).map(|j| ratios(&rates, c, j, 0)).collect(),
        })
        .collect()
}

/// Case `c`'s rate over case `j`'s, round by round, in `mode`.
fn ratios(rates: &[Vec<Vec<f64>>], c: usize, j: usize, mode: usize) -> Spread {
    Spread::of(
        rates[c][mode]
            .iter()
            .zip(&rates[j][mode])
            .map(|(a, b)| a / b)
            .collect(),
    )
}

/// Each case's rate in each round of each mode (`(tasks, cycles per task)`):
/// `rates[case][mode][round]`. Within a round, each mode in turn; within a mode, each
/// case's cycles in slices interleaved with the other cases' slices.
async fn rates_by_mode(
    cases: &[Case],
    rounds: usize,
    modes: &[(usize, usize)],
) -> Vec<Vec<Vec<f64>>> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let k = cases.len();
    let mut rates = vec![vec![Vec::new(); modes.len()]; k];
    for round in 0..rounds {
        for (mode, &(tasks, per)) in modes.iter().enumerate() {
            let slices = SLICES[usize::from(tasks > 1)].min(per).max(1);
            let mut spent = vec![Duration::ZERO; k];
            for slice in 0..slices {
                // This slice's share of the per-task cycles (the shares add up to `per`).
                let n = per * (slice + 1) / slices - per * slice / slices;
                for i in 0..k {
                    let c = (i + round + slice) % k;
                    // The same names in every slice and every round, as in one long
                    // run: a lock table's rows are updated, not inserted, once its names
                    // exist (with new names each round, most PostgreSQL cycles measured
                    // an INSERT of a new row and its index entry instead).
                    let tag = format!("{run_id}-{c}-{mode}");
                    spent[c] += timed(&cases[c], tasks, n, &tag).await;
                }
            }
            for (c, spent) in spent.into_iter().enumerate() {
                rates[c][mode].push((tasks * per) as f64 / spent.as_secs_f64());
            }
        }
    }
    rates
}

/// Warms every case up (connections, prepared statements, scripts).
pub async fn warm_up(cases: &[Case], cycles: usize) {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    for (i, c) in cases.iter().enumerate() {
        (c.run)(format!("warm-{tag}-{i}"), cycles).await;
    }
}

// ---------------------------------------------------------------------------------------
// The library.

/// The library's acquire + release through the backend primitives, over 64 names.
pub fn backend_case(label: &str, backend: Arc<dyn LeaseBackend>) -> Case {
    Case::new(label, move |prefix, n| {
        let backend = backend.clone();
        async move {
            let label = HolderLabel::new("bench").expect("label");
            for i in 0..n {
                let name = LeaseName::new(format!("{prefix}:{}", i % 64)).expect("name");
                let owner = Owner {
                    token: OwnerToken::random(),
                    label: label.clone(),
                };
                match backend
                    .acquire(&name, &owner, Duration::from_secs(30))
                    .await
                    .expect("acquire")
                {
                    AcquireOutcome::Acquired { .. } => {}
                    AcquireOutcome::Held(by) => panic!("{name} held by {by}"),
                }
                backend
                    .release(&name, &owner.token, Duration::ZERO)
                    .await
                    .expect("release");
            }
        }
    })
}

/// The library's acquire + release through [`LeaseClient`] (guard, heartbeat
/// registration), over 64 names.
pub fn client_case(label: &str, backend: Arc<dyn LeaseBackend>) -> Case {
    let client = LeaseClient::with_label(backend, HolderLabel::new("bench").expect("label"));
    Case::new(label, move |prefix, n| {
        client_cycles(client.clone(), prefix, n)
    })
}

/// `n` cycles of try_acquire + release through `client`, over 64 names under `prefix`.
pub async fn client_cycles(client: LeaseClient, prefix: String, n: usize) {
    let opts = LeaseOptions::new(Duration::from_secs(30)).expect("options");
    for i in 0..n {
        match client
            .try_acquire(format!("{prefix}:{}", i % 64), &opts)
            .await
            .expect("try_acquire")
        {
            TryAcquire::Acquired(g) => {
                g.release().await.expect("release");
            }
            TryAcquire::Held(by) => panic!("held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
}

/// A permit of a 3-permit [`Semaphore`] taken and given back through [`LeaseClient`], over
/// 64 semaphores: with permits free, one acquire (of a slot picked at random) and one
/// release, the round trips of the mutex row above.
pub fn semaphore_case(label: &str, backend: Arc<dyn LeaseBackend>) -> Case {
    let client = LeaseClient::with_label(backend, HolderLabel::new("bench").expect("label"));
    Case::new(label, move |prefix, n| {
        let client = client.clone();
        async move {
            let opts = LeaseOptions::new(Duration::from_secs(30)).expect("options");
            for i in 0..n {
                let sem = Semaphore::new(client.clone(), format!("{prefix}:{}", i % 64), 3)
                    .expect("semaphore");
                match sem.try_acquire(&opts).await.expect("try_acquire") {
                    TryPermit::Acquired(p) => {
                        p.release().await.expect("release");
                    }
                    TryPermit::Full(by) => panic!("full: {by:?}"),
                    _ => unreachable!("an outcome added to the enum after this code was written"),
                }
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Redis: the bare commands and rslock.

const CAD: &str = r#"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"#;

/// `SET key token NX PX 30000` + Lua compare-and-delete, on one multiplexed connection.
pub fn redis_bare(conn: redis::aio::MultiplexedConnection) -> Case {
    let script = Arc::new(redis::Script::new(CAD));
    Case::new(
        "bare SET NX PX + Lua compare-and-delete",
        move |prefix, n| {
            let (mut conn, script) = (conn.clone(), script.clone());
            async move {
                for i in 0..n {
                    let key = format!("bare:{prefix}:{}", i % 64);
                    let token = uuid::Uuid::new_v4().to_string();
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                    assert!(ok.is_some(), "{key} taken");
                    let _: i64 = script
                        .key(&key)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await
                        .expect("compare-and-delete");
                }
            }
        },
    )
}

/// The library's release without keep-for, sent raw: `HDEL <lock> <token> <token>:w`,
/// which must find the owner's field.
async fn library_release(conn: &mut redis::aio::MultiplexedConnection, lock: &str, token: &str) {
    let freed: i64 = redis::cmd("HDEL")
        .arg(lock)
        .arg(token)
        .arg(format!("{token}:w"))
        .query_async(conn)
        .await
        .expect("release");
    assert_eq!(freed, 1);
}

/// The library's own acquire script and release command, sent with the bare floor's
/// client code (no library code around them): splits the library's cost into the server's
/// (scripts) and the client's (everything else). A diagnostic, not a way to use Redis.
pub fn redis_library_scripts_raw(conn: redis::aio::MultiplexedConnection) -> Case {
    let acquire = Arc::new(redis::Script::new(lease_redis::scripts::ACQUIRE));
    Case::new(
        "diagnostic: the library's commands sent raw",
        move |prefix, n| {
            let (mut conn, acquire) = (conn.clone(), acquire.clone());
            async move {
                for i in 0..n {
                    let base = format!("raw:{{{prefix}:{}}}", i % 64);
                    let (lock, fence) = (format!("{base}:lock"), format!("{base}:fence"));
                    let token = uuid::Uuid::new_v4().to_string();
                    let r: redis::Value = acquire
                        .key(&lock)
                        .key(&fence)
                        .arg(&token)
                        .arg("~30000\nbench")
                        .arg(30_000)
                        .invoke_async(&mut conn)
                        .await
                        .expect("acquire script");
                    assert!(matches!(&r, redis::Value::Int(_)), "{lock} taken: {r:?}");
                    library_release(&mut conn, &lock, &token).await;
                }
            }
        },
    )
}

/// A sketch of an acquire without Lua, sent raw: one `MULTI` of `HSET` of the owner's
/// field into a key of the attempt's own, `PEXPIRE` of it, `RENAMENX` onto the lock key
/// (which moves the key only where no lease is, its TTL with it), `DEL` of what is left
/// and `INCR` of the fencing counter, with the library's `HDEL` as release. The `INCR`
/// also counts held attempts (atomic with the rename, so tokens still rise from holder
/// to holder), so the counter is no longer the holder's token, as the library's layout
/// needs (`lease_redis::scripts`). A diagnostic of what the server would spend without
/// a script, not a way to use Redis.
pub fn redis_native_acquire_sketch(conn: redis::aio::MultiplexedConnection) -> Case {
    Case::new(
        "diagnostic: an acquire without Lua (MULTI: HSET, PEXPIRE, RENAMENX, DEL, INCR), sent raw",
        move |prefix, n| {
            let mut conn = conn.clone();
            async move {
                for i in 0..n {
                    let base = format!("native:{{{prefix}:{}}}", i % 64);
                    let token = uuid::Uuid::new_v4().simple().to_string();
                    let (lock, fence) = (format!("{base}:lock"), format!("{base}:fence"));
                    let attempt = format!("{base}:a:{token}");
                    let (renamed, fencing): (i64, i64) = redis::pipe()
                        .atomic()
                        .hset(&attempt, &token, "~30000\nbench")
                        .ignore()
                        .pexpire(&attempt, 30_000)
                        .ignore()
                        .cmd("RENAMENX")
                        .arg(&attempt)
                        .arg(&lock)
                        .del(&attempt)
                        .ignore()
                        .incr(&fence, 1)
                        .query_async(&mut conn)
                        .await
                        .expect("acquire transaction");
                    assert_eq!(renamed, 1, "{lock} taken");
                    assert!(fencing > 0);
                    library_release(&mut conn, &lock, &token).await;
                }
            }
        },
    )
}

/// rslock (Redlock on one instance): `lock` + `unlock`.
pub fn redis_rslock(url: &str) -> Case {
    let manager = rslock::LockManager::new(vec![url.to_owned()]);
    Case::new(
        "rslock lock + unlock (no fencing token)",
        move |prefix, n| {
            let manager = manager.clone();
            async move {
                for i in 0..n {
                    let key = format!("rslock:{prefix}:{}", i % 64);
                    let lock = manager
                        .lock(key.as_bytes(), Duration::from_secs(30))
                        .await
                        .expect("rslock lock");
                    manager.unlock(&lock).await;
                }
            }
        },
    )
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: the bare statements and sqlx's advisory lock.

/// The bare floor's table.
pub async fn postgres_bare_table(pool: &PgPool) {
    for ddl in [
        "CREATE TABLE IF NOT EXISTS bare_locks (name BYTEA PRIMARY KEY, owner_token UUID, \
         lock_until TIMESTAMPTZ NOT NULL)",
        // ShedLock's documented PostgreSQL table.
        "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
         lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, \
         locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))",
    ] {
        sqlx::query(ddl)
            .execute(pool)
            .await
            .expect("create a benchmark table");
    }
}

/// ShedLock's PostgreSQL statements with the database's time (`usingDbTime()`), on its
/// table: the `UPDATE` of a name it has seen before, its `INSERT ... ON CONFLICT DO
/// UPDATE` the first time, and its unlock (`lockAtLeastFor` zero). ShedLock is Java and
/// cannot be run here; these are its statements, sent by the same client as the other
/// rows. Its `locked_by` is a host name; here it carries a value per cycle, so that the
/// unlock is as selective as the other rows' (and a cycle that frees nothing fails).
pub fn postgres_shedlock(pool: PgPool) -> Case {
    // ShedLock's `now` with `usingDbTime()`.
    macro_rules! now {
        () => {
            "timezone('utc', CURRENT_TIMESTAMP)"
        };
    }
    const UPDATE: &str = concat!(
        "UPDATE shedlock SET lock_until = ",
        now!(),
        " + make_interval(secs => $1), ",
        "locked_at = ",
        now!(),
        ", locked_by = $2 ",
        "WHERE shedlock.name = $3 AND shedlock.lock_until <= ",
        now!()
    );
    const INSERT: &str = concat!(
        "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) ",
        "VALUES ($3, ",
        now!(),
        " + make_interval(secs => $1), ",
        now!(),
        ", $2) ",
        "ON CONFLICT (name) DO UPDATE SET lock_until = ",
        now!(),
        " + make_interval(secs => $1), ",
        "locked_at = ",
        now!(),
        ", locked_by = $2 ",
        "WHERE shedlock.name = $3 AND shedlock.lock_until <= ",
        now!()
    );
    const UNLOCK: &str = concat!(
        "UPDATE shedlock SET lock_until = CASE ",
        "WHEN locked_at + make_interval(secs => $1) > ",
        now!(),
        " ",
        "THEN locked_at + make_interval(secs => $1) ELSE ",
        now!(),
        " END ",
        "WHERE name = $2 AND locked_by = $3"
    );
    Case::new(
        "ShedLock's PostgreSQL statements (usingDbTime; no fencing token)",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                for i in 0..n {
                    let name = format!("{prefix}:{}", i % 64);
                    let by = uuid::Uuid::new_v4().simple().to_string();
                    let taken = sqlx::query(UPDATE)
                        .bind(30.0_f64)
                        .bind(&by)
                        .bind(&name)
                        .execute(&pool)
                        .await
                        .expect("update")
                        .rows_affected();
                    if taken == 0 {
                        let r = sqlx::query(INSERT)
                            .bind(30.0_f64)
                            .bind(&by)
                            .bind(&name)
                            .execute(&pool)
                            .await
                            .expect("insert");
                        assert_eq!(r.rows_affected(), 1, "{name} taken");
                    }
                    let r = sqlx::query(UNLOCK)
                        .bind(0.0_f64)
                        .bind(&name)
                        .bind(&by)
                        .execute(&pool)
                        .await
                        .expect("unlock");
                    assert_eq!(r.rows_affected(), 1, "{name} not unlocked");
                }
            }
        },
    )
}

/// The PostgreSQL floor's acquire: the upsert that takes a new or expired row. The
/// pooled floor and the held-connection diagnostic send the same statements.
const PG_BARE_TAKE: &str = "INSERT INTO bare_locks (name, owner_token, lock_until) \
    VALUES ($1, $2, clock_timestamp() + interval '30 seconds') \
    ON CONFLICT (name) DO UPDATE SET owner_token = EXCLUDED.owner_token, \
    lock_until = EXCLUDED.lock_until WHERE bare_locks.lock_until <= clock_timestamp()";
/// The PostgreSQL floor's owner-checked release.
const PG_BARE_RELEASE: &str = "UPDATE bare_locks SET lock_until = clock_timestamp() \
    WHERE name = $1 AND owner_token = $2";
/// The MySQL floor's acquire: the `UPDATE` that takes an expired row. The pooled floor
/// and the held-connection diagnostic send the same statements.
const MY_BARE_TAKE: &str = "UPDATE bare_locks SET owner_token = ?, \
    lock_until = NOW(6) + INTERVAL 30 SECOND \
    WHERE name = ? AND lock_until <= NOW(6)";
/// The MySQL floor's first acquire of a name (when its `UPDATE` found no row).
const MY_BARE_INSERT: &str = "INSERT IGNORE INTO bare_locks (name, owner_token, lock_until) \
    VALUES (?, ?, NOW(6) + INTERVAL 30 SECOND)";
/// The MySQL floor's owner-checked release.
const MY_BARE_RELEASE: &str = "UPDATE bare_locks SET owner_token = NULL, lock_until = NOW(6) \
    WHERE name = ? AND owner_token = ?";

/// The upsert (`INSERT ... ON CONFLICT DO UPDATE ... WHERE lock_until <= clock_timestamp()`)
/// + an owner-checked `UPDATE` release, on the pool.
pub fn postgres_bare(pool: PgPool) -> Case {
    Case::new("bare upsert + release statements", move |prefix, n| {
        let pool = pool.clone();
        async move {
            for i in 0..n {
                let name = format!("{prefix}:{}", i % 64);
                let token = uuid::Uuid::new_v4();
                let r = sqlx::query(PG_BARE_TAKE)
                    .bind(name.as_bytes())
                    .bind(token)
                    .execute(&pool)
                    .await
                    .expect("upsert");
                assert_eq!(r.rows_affected(), 1, "{name} taken");
                sqlx::query(PG_BARE_RELEASE)
                    .bind(name.as_bytes())
                    .bind(token)
                    .execute(&pool)
                    .await
                    .expect("release");
            }
        }
    })
}

/// The bare floor's statements on one connection the loop holds from start to end, so
/// that no statement returns its connection to the pool (sqlx pings every connection
/// that goes back, one more round trip per statement).
pub fn postgres_bare_held(pool: PgPool) -> Case {
    Case::new(
        "diagnostic: bare statements on a connection held by the loop (no ping on return)",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await.expect("a connection");
                for i in 0..n {
                    let name = format!("{prefix}:{}", i % 64);
                    let token = uuid::Uuid::new_v4();
                    let r = sqlx::query(PG_BARE_TAKE)
                        .bind(name.as_bytes())
                        .bind(token)
                        .execute(&mut *conn)
                        .await
                        .expect("upsert");
                    assert_eq!(r.rows_affected(), 1, "{name} taken");
                    sqlx::query(PG_BARE_RELEASE)
                        .bind(name.as_bytes())
                        .bind(token)
                        .execute(&mut *conn)
                        .await
                        .expect("release");
                }
            }
        },
    )
}

/// The library's own acquire and release statements, sent with the bare floor's client
/// code (no library code around them): splits the library's cost into the server's and
/// the client's. A diagnostic, not a way to use the table.
pub fn postgres_library_statements_raw(pool: PgPool, acquire: String, release: String) -> Case {
    let (acquire, release): (Arc<str>, Arc<str>) = (acquire.into(), release.into());
    Case::new(
        "diagnostic: the library's statements sent raw",
        move |prefix, n| {
            let (pool, acquire, release) = (pool.clone(), acquire.clone(), release.clone());
            async move {
                for i in 0..n {
                    let name = format!("raw:{prefix}:{}", i % 64);
                    let token = uuid::Uuid::new_v4();
                    let (acquired, _, _, _): (bool, i64, Option<String>, i64) =
                        sqlx::query_as(sqlx::AssertSqlSafe(acquire.clone()))
                            .bind(name.as_bytes())
                            .bind(token)
                            .bind("bench")
                            .bind(30_000_i64)
                            .fetch_one(&pool)
                            .await
                            .expect("acquire statement");
                    assert!(acquired, "{name} taken");
                    let r = sqlx::query(sqlx::AssertSqlSafe(release.clone()))
                        .bind(name.as_bytes())
                        .bind(token)
                        .bind(0_i64)
                        .execute(&pool)
                        .await
                        .expect("release statement");
                    assert_eq!(r.rows_affected(), 1, "{name} not released");
                }
            }
        },
    )
}

/// sqlx's `PgAdvisoryLock`: a pooled connection, `pg_advisory_lock` +
/// `pg_advisory_unlock` (no TTL, no fencing token, held by the session).
pub fn postgres_sqlx_advisory(pool: PgPool) -> Case {
    Case::new(
        "sqlx PgAdvisoryLock acquire + release (no TTL, no fencing token)",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                for i in 0..n {
                    let lock = sqlx::postgres::PgAdvisoryLock::new(format!("{prefix}:{}", i % 64));
                    let conn = pool.acquire().await.expect("pool connection");
                    let guard = lock.acquire(conn).await.expect("advisory lock");
                    guard.release_now().await.expect("advisory unlock");
                }
            }
        },
    )
}

// ---------------------------------------------------------------------------------------
// etcd: the bare transactions and etcd's lock service.

/// The bare floor's acquire: a put-if-absent transaction on `key` with `lease`; panics if
/// the key was taken (each task cycles over names of its own).
async fn etcd_put_if_absent(
    client: &mut etcd_client::Client,
    key: &str,
    value: String,
    lease: i64,
) {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let r = client.txn(txn).await.expect("txn acquire");
    assert!(r.succeeded(), "{key} taken");
}

/// Put-if-absent transaction (with a lease granted once) + compare-and-delete
/// transaction.
pub fn etcd_bare(client: etcd_client::Client, lease: i64) -> Case {
    Case::new(
        "bare txn put-if-absent + txn compare-and-delete",
        move |prefix, n| {
            let mut client = client.clone();
            async move {
                for i in 0..n {
                    let key = format!("bare/{prefix}/{}", i % 64);
                    let value = uuid::Uuid::new_v4().to_string();
                    etcd_put_if_absent(&mut client, &key, value.clone(), lease).await;
                    let txn = Txn::new()
                        .when([Compare::value(key.clone(), CompareOp::Equal, value)])
                        .and_then([TxnOp::delete(key, None)]);
                    client.txn(txn).await.expect("txn release");
                }
            }
        },
    )
}

/// Diagnostic: the bare floor's put-if-absent transaction, freed by a plain `DeleteRange`
/// with no owner check (what etcd's lock service's `Unlock` sends for its key of one
/// lease), to tell the compare-and-delete transaction's cost from the rest.
pub fn etcd_plain_delete(client: etcd_client::Client, lease: i64) -> Case {
    Case::new(
        "diagnostic: txn put-if-absent + plain delete (no owner check)",
        move |prefix, n| {
            let mut client = client.clone();
            async move {
                for i in 0..n {
                    let key = format!("plain/{prefix}/{}", i % 64);
                    let value = uuid::Uuid::new_v4().to_string();
                    etcd_put_if_absent(&mut client, &key, value, lease).await;
                    client.delete(key, None).await.expect("delete");
                }
            }
        },
    )
}

/// etcd's lock service through `etcd-client` (`Lock` + `Unlock` RPCs, with a lease
/// granted once, as in the bare floor).
pub fn etcd_lock_service(client: etcd_client::Client, lease: i64) -> Case {
    Case::new(
        "etcd-client lock + unlock (etcd lock service)",
        move |prefix, n| {
            let mut client = client.clone();
            async move {
                for i in 0..n {
                    let name = format!("svc/{prefix}/{}", i % 64);
                    let r = client
                        .lock(
                            name,
                            Some(etcd_client::LockOptions::new().with_lease(lease)),
                        )
                        .await
                        .expect("etcd lock");
                    client.unlock(r.key()).await.expect("etcd unlock");
                }
            }
        },
    )
}

// ---------------------------------------------------------------------------------------
// ZooKeeper: the bare operations and Curator's InterProcessMutex recipe, sent raw.

use lease_zookeeper::zookeeper_client as zk;

/// The parent nodes of the ZooKeeper cases' nodes (bare, Curator's recipe, the library's
/// requests sent raw), made where missing.
pub async fn zk_case_dirs(client: &zk::Client) -> Result<(), String> {
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for dir in ["/bench-bare", "/bench-curator", "/bench-raw"] {
        match client.create(dir, b"", &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(format!("{dir}: {e}")),
        }
    }
    Ok(())
}

/// The least a lock on ZooKeeper takes: create an ephemeral node at the name's path
/// (`NodeExists` = held) and delete it. No fencing token read back, no holder label, no
/// owner check on release.
pub fn zk_bare(client: zk::Client) -> Case {
    Case::new("bare create ephemeral + delete", move |prefix, n| {
        let client = client.clone();
        async move {
            let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
            for i in 0..n {
                let path = format!("/bench-bare/{prefix}-{}", i % 64);
                client.create(&path, b"", &eph).await.expect("create");
                client.delete(&path, None).await.expect("delete");
            }
        }
    })
}

/// The library's own requests, sent with the bare floor's client code (no library code
/// around them): acquire is one `multi` of the ephemeral holder node's create and the
/// name node's `setData` (state, owner token, label: its `mzxid` is the fencing token,
/// its version what the release names), release one `multi` of the name node's
/// `setData` at that version and the holder node's delete. The name node is made once
/// per name, as the library's is. Splits the library's cost into the server's (two
/// writes per request instead of one) and the client's. A diagnostic, not a way to use
/// ZooKeeper.
pub fn zk_library_raw(client: zk::Client) -> Case {
    Case::new(
        "diagnostic: the library's requests sent raw",
        move |prefix, n| {
            let client = client.clone();
            async move {
                let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
                let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                for i in 0..n {
                    let path = format!("/bench-raw/{prefix}-{}", i % 64);
                    let holder = format!("{path}/holder");
                    // The library's name node data: format, state, owner token, label.
                    let token = uuid::Uuid::new_v4();
                    let mut held = vec![1u8, 1];
                    held.extend_from_slice(token.as_bytes());
                    held.extend_from_slice(b"bench");
                    let version = loop {
                        let mut multi = client.new_multi_writer();
                        multi.add_create(&holder, b"", &eph).expect("multi create");
                        multi.add_set_data(&path, &held, None).expect("multi set");
                        match multi.commit().await {
                            Ok(results) => {
                                break results
                                    .into_iter()
                                    .find_map(|r| match r {
                                        zk::MultiWriteResult::SetData { stat } => {
                                            Some(stat.version)
                                        }
                                        _ => None,
                                    })
                                    .expect("the name node's stat");
                            }
                            Err(zk::MultiWriteError::OperationFailed {
                                source: zk::Error::NoNode,
                                ..
                            }) => match client.create(&path, b"", &persistent).await {
                                Ok(_) | Err(zk::Error::NodeExists) => {}
                                Err(e) => panic!("name node: {e}"),
                            },
                            Err(e) => panic!("acquire multi: {e}"),
                        }
                    };
                    held[1] = 2;
                    let mut multi = client.new_multi_writer();
                    multi
                        .add_set_data(&path, &held, Some(version))
                        .expect("multi set");
                    multi.add_delete(&holder, None).expect("multi delete");
                    multi.commit().await.expect("release multi");
                }
            }
        },
    )
}

/// Apache Curator's `InterProcessMutex`, uncontended, sent raw: create a protected
/// ephemeral-sequential node under the lock's path (its parent made once per name, as
/// Curator's `creatingParentContainersIfNeeded` does), list the children to see that it
/// is the lowest, delete it to release. Three round trips; no fencing token.
pub fn zk_curator(client: zk::Client) -> Case {
    Case::new(
        "Curator InterProcessMutex recipe, sent raw (create ephemeral-sequential + getChildren + delete)",
        move |prefix, n| {
            let client = client.clone();
            async move {
                let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
                let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                for i in 0..n {
                    let dir = format!("/bench-curator/{prefix}-{}", i % 64);
                    let node = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
                    let (_, seq) = match client.create(&node, b"", &eph).await {
                        Ok(r) => r,
                        Err(zk::Error::NoNode) => {
                            match client.create(&dir, b"", &container).await {
                                Ok(_) | Err(zk::Error::NodeExists) => {}
                                Err(e) => panic!("curator dir: {e}"),
                            }
                            client.create(&node, b"", &eph).await.expect("create")
                        }
                        Err(e) => panic!("curator create: {e}"),
                    };
                    let children = client.list_children(&dir).await.expect("children");
                    let ours = format!("{seq}");
                    let lowest = children
                        .iter()
                        .filter_map(|c| c.rsplit("-lock-").next())
                        .min()
                        .map(str::to_owned);
                    assert_eq!(
                        lowest.as_deref().map(|l| l.trim_start_matches('0')),
                        Some(ours.trim_start_matches('0')),
                        "{dir}: not the lowest"
                    );
                    client
                        .delete(&format!("{node}{seq}"), None)
                        .await
                        .expect("delete");
                }
            }
        },
    )
}

// ---------------------------------------------------------------------------------------
// MySQL / MariaDB: the bare statements, ShedLock's statements, and the library's sent raw.

/// The tables of the bare floor and of ShedLock's statements.
pub async fn mysql_bare_tables(pool: &MySqlPool) {
    for ddl in [
        "CREATE TABLE IF NOT EXISTS bare_locks (name VARBINARY(255) PRIMARY KEY, \
         owner_token BINARY(16) NULL, lock_until DATETIME(6) NOT NULL) ENGINE=InnoDB",
        // ShedLock's documented MySQL table.
        "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
         lock_until TIMESTAMP(3) NOT NULL, locked_at TIMESTAMP(3) NOT NULL \
         DEFAULT CURRENT_TIMESTAMP(3), locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name)) \
         ENGINE=InnoDB",
    ] {
        lease_mysql::sqlx::query(ddl)
            .execute(pool)
            .await
            .expect("create a benchmark table");
    }
}

/// The least a lock on a MySQL table takes, deciding on the database's clock: an
/// `UPDATE` that takes the row only if it has expired, and an owner-checked `UPDATE` that
/// frees it (a name's row is inserted once, by its first cycle, as ShedLock does). No
/// fencing token, no holder label, no reply beyond the row count.
pub fn mysql_bare(pool: MySqlPool) -> Case {
    Case::new(
        "bare UPDATE-if-expired + release statements",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                for i in 0..n {
                    let name = format!("{prefix}:{}", i % 64);
                    let token = *uuid::Uuid::new_v4().as_bytes();
                    let taken = lease_mysql::sqlx::query(MY_BARE_TAKE)
                        .bind(&token[..])
                        .bind(name.as_bytes())
                        .execute(&pool)
                        .await
                        .expect("update")
                        .rows_affected();
                    if taken == 0 {
                        let r = lease_mysql::sqlx::query(MY_BARE_INSERT)
                            .bind(name.as_bytes())
                            .bind(&token[..])
                            .execute(&pool)
                            .await
                            .expect("insert");
                        assert_eq!(r.rows_affected(), 1, "{name} taken");
                    }
                    let r = lease_mysql::sqlx::query(MY_BARE_RELEASE)
                        .bind(name.as_bytes())
                        .bind(&token[..])
                        .execute(&pool)
                        .await
                        .expect("release");
                    assert_eq!(r.rows_affected(), 1, "{name} not released");
                }
            }
        },
    )
}

/// The bare floor's statements on one connection the loop holds from start to end, so
/// that no statement returns its connection to the pool (sqlx pings every connection
/// that goes back, one more round trip per statement).
pub fn mysql_bare_held(pool: MySqlPool) -> Case {
    Case::new(
        "diagnostic: bare statements on a connection held by the loop (no ping on return)",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await.expect("a connection");
                for i in 0..n {
                    let name = format!("{prefix}:{}", i % 64);
                    let token = *uuid::Uuid::new_v4().as_bytes();
                    let taken = lease_mysql::sqlx::query(MY_BARE_TAKE)
                        .bind(&token[..])
                        .bind(name.as_bytes())
                        .execute(&mut *conn)
                        .await
                        .expect("update")
                        .rows_affected();
                    if taken == 0 {
                        let r = lease_mysql::sqlx::query(MY_BARE_INSERT)
                            .bind(name.as_bytes())
                            .bind(&token[..])
                            .execute(&mut *conn)
                            .await
                            .expect("insert");
                        assert_eq!(r.rows_affected(), 1, "{name} taken");
                    }
                    let r = lease_mysql::sqlx::query(MY_BARE_RELEASE)
                        .bind(name.as_bytes())
                        .bind(&token[..])
                        .execute(&mut *conn)
                        .await
                        .expect("release");
                    assert_eq!(r.rows_affected(), 1, "{name} not released");
                }
            }
        },
    )
}

/// ShedLock's MySQL statements with the database's time (`usingDbTime()`), on its table:
/// the `UPDATE` of a name it has seen before, its `INSERT IGNORE` the first time, and its
/// unlock. ShedLock is Java and cannot be run here; these are its statements, sent by the
/// same client as the other rows. Its `locked_by` is a host name, so its unlock frees the
/// lock for any holder on the same host; here it carries a token per cycle, so that the
/// unlock is as selective as the other rows' (and a cycle that frees nothing fails).
pub fn mysql_shedlock(pool: MySqlPool) -> Case {
    Case::new(
        "ShedLock's MySQL statements (usingDbTime; no fencing token)",
        move |prefix, n| {
            let pool = pool.clone();
            async move {
                for i in 0..n {
                    let name = format!("{prefix}:{}", i % 64);
                    let by = uuid::Uuid::new_v4().simple().to_string();
                    let taken = lease_mysql::sqlx::query(
                        "UPDATE shedlock SET lock_until = \
                         TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), \
                         locked_at = UTC_TIMESTAMP(3), locked_by = ? \
                         WHERE name = ? AND lock_until <= UTC_TIMESTAMP(3)",
                    )
                    .bind(30_000_000_i64)
                    .bind(&by)
                    .bind(&name)
                    .execute(&pool)
                    .await
                    .expect("update")
                    .rows_affected();
                    if taken == 0 {
                        let r = lease_mysql::sqlx::query(
                            "INSERT IGNORE INTO shedlock (name, lock_until, locked_at, locked_by) \
                             VALUES (?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), \
                             UTC_TIMESTAMP(3), ?)",
                        )
                        .bind(&name)
                        .bind(30_000_000_i64)
                        .bind(&by)
                        .execute(&pool)
                        .await
                        .expect("insert");
                        assert_eq!(r.rows_affected(), 1, "{name} taken");
                    }
                    let r = lease_mysql::sqlx::query(
                        "UPDATE shedlock SET lock_until = IF(\
                         TIMESTAMPADD(MICROSECOND, ?, locked_at) > UTC_TIMESTAMP(3), \
                         TIMESTAMPADD(MICROSECOND, ?, locked_at), UTC_TIMESTAMP(3)) \
                         WHERE name = ? AND locked_by = ?",
                    )
                    .bind(0_i64)
                    .bind(0_i64)
                    .bind(&name)
                    .bind(&by)
                    .execute(&pool)
                    .await
                    .expect("unlock");
                    assert_eq!(r.rows_affected(), 1, "{name} not unlocked");
                }
            }
        },
    )
}

/// The library's own acquire and release statements, sent with the bare floor's client
/// code (no trait, no timeout, no reply checks beyond the token).
pub fn mysql_library_statements_raw(pool: MySqlPool, acquire: String, release: String) -> Case {
    let (acquire, release): (Arc<str>, Arc<str>) = (acquire.into(), release.into());
    Case::new(
        "diagnostic: the library's statements sent raw",
        move |prefix, n| {
            let (pool, acquire, release) = (pool.clone(), acquire.clone(), release.clone());
            async move {
                for i in 0..n {
                    let name = format!("raw:{prefix}:{}", i % 64);
                    let token = *uuid::Uuid::new_v4().as_bytes();
                    let r =
                        lease_mysql::sqlx::query(lease_mysql::sqlx::AssertSqlSafe(acquire.clone()))
                            .bind(name.as_bytes())
                            .bind(&token[..])
                            .bind("bench")
                            .bind(30_000_000_i64)
                            .execute(&pool)
                            .await
                            .expect("acquire statement");
                    assert!(r.last_insert_id() > 0, "{name} taken");
                    let r =
                        lease_mysql::sqlx::query(lease_mysql::sqlx::AssertSqlSafe(release.clone()))
                            .bind(0_i64)
                            .bind(name.as_bytes())
                            .bind(&token[..])
                            .execute(&pool)
                            .await
                            .expect("release statement");
                    assert_eq!(r.rows_affected(), 1, "{name} not released");
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_medians_interval_is_the_41st_to_61st_of_101_rounds() {
        assert_eq!(median_interval(101), (40, 60));
        assert_eq!(median_interval(7), (0, 6));
        assert_eq!(median_interval(1), (0, 0));
        assert_eq!(median_interval(0), (0, 0));
        let s = Spread::of((0..101).map(f64::from).collect());
        assert_eq!(
            (s.median, s.lo, s.hi, s.min, s.max),
            (50.0, 40.0, 60.0, 0.0, 100.0)
        );
    }
}
