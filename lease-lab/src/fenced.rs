//! A fenced resource and its checker, for tests that attack real holder processes.
//!
//! The resource is a tiny line-based TCP server on loopback. Holders send
//!
//! - `W <writer> <token> <seq>`: a write carrying a fencing token. It is accepted only if
//!   the token is not lower than the highest token accepted so far. The decision is made
//!   by a [`ResourceFence`]: the store's own fence that users run (`PgFence`,
//!   `MysqlFence`, `RedisFence`, one real write per `W` on the store the holders lease
//!   from), or `lease_core::fence::Fence` where the store has none (etcd, memory). The
//!   answer is `OK` or `STALE <highest>`.
//! - `B <writer> <token> start|end`: the writer starts or stops believing it holds the
//!   lease (acquired / lost or released). Answer `OK`.
//! - `T <writer> <operation> <ms>`: a call to the store took longer than its timeout
//!   allows. Answer `OK`.
//!
//! Every write, accepted or rejected, is recorded with its time and writer. [`Report`]
//! checks the records: accepted writes out of token order (must be 0), stale writes
//! rejected, periods where two writers believed they held the lease, takeover times.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lease_core::{Error, FencingToken};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// What decides whether a write is accepted: the public fence of the store the holders
/// lease from, doing a real write, or the in-memory fence for stores without one.
#[derive(Debug)]
pub enum ResourceFence {
    /// `lease_core::fence::Fence` (etcd, memory, or holders whose store the test process
    /// cannot reach).
    Memory(lease_core::fence::Fence),
    /// `lease_postgres::fence::PgFence`: check and an `UPDATE` of a data row in one
    /// transaction.
    Postgres {
        /// A pool on the holders' database.
        pool: lease_postgres::sqlx::PgPool,
        /// The fence.
        fence: lease_postgres::fence::PgFence,
        /// The protected write: `UPDATE` of the one row of a table of its own.
        update: String,
    },
    /// `lease_mysql::fence::MysqlFence`: check and an `UPDATE` in one transaction.
    Mysql {
        /// A pool on the holders' database.
        pool: lease_mysql::sqlx::MySqlPool,
        /// The fence.
        fence: lease_mysql::fence::MysqlFence,
        /// The protected write: `UPDATE` of the one row of a table of its own.
        update: String,
    },
    /// `lease_redis::fence::RedisFence`: a fenced `SET`.
    Redis {
        /// A connection to the holders' server (reconnecting after a restart).
        conn: lease_redis::redis::aio::ConnectionManager,
        /// The fence.
        fence: lease_redis::fence::RedisFence,
        /// The protected key.
        key: String,
    },
}

impl ResourceFence {
    /// The store's own fence for the store at `url` (PostgreSQL, MySQL, Redis; a new fence
    /// table or key per call), or the in-memory fence for other stores.
    pub async fn for_store(url: &str) -> Result<ResourceFence, String> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let scheme = url.split("://").next().unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => {
                use lease_postgres::sqlx;
                let pool = sqlx::PgPool::connect(url)
                    .await
                    .map_err(|e| e.to_string())?;
                let fence = lease_postgres::fence::PgFence::new(&format!("fences_{id}"))
                    .map_err(|e| e.to_string())?;
                fence.create_table(&pool).await.map_err(|e| e.to_string())?;
                let data = format!("fenced_{id}");
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "CREATE TABLE {data} (id int PRIMARY KEY, token bigint); \
                     INSERT INTO {data} VALUES (1, 0)"
                )))
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
                Ok(ResourceFence::Postgres {
                    pool,
                    fence,
                    update: format!("UPDATE {data} SET token = $1 WHERE id = 1"),
                })
            }
            "mysql" | "mariadb" => {
                use lease_mysql::sqlx;
                let pool = sqlx::MySqlPool::connect(url)
                    .await
                    .map_err(|e| e.to_string())?;
                let fence = lease_mysql::fence::MysqlFence::new(&format!("fences_{id}"))
                    .map_err(|e| e.to_string())?;
                fence.create_table(&pool).await.map_err(|e| e.to_string())?;
                let data = format!("fenced_{id}");
                for sql in [
                    format!(
                        "CREATE TABLE {data} (id int PRIMARY KEY, token bigint unsigned) ENGINE=InnoDB"
                    ),
                    format!("INSERT INTO {data} VALUES (1, 0)"),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&pool)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok(ResourceFence::Mysql {
                    pool,
                    fence,
                    update: format!("UPDATE {data} SET token = ? WHERE id = 1"),
                })
            }
            "redis" | "rediss" => {
                let client = lease_redis::redis::Client::open(url).map_err(|e| e.to_string())?;
                let conn = client
                    .get_connection_manager()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(ResourceFence::Redis {
                    conn,
                    fence: lease_redis::fence::RedisFence::new(format!("{{fenced-{id}}}:fence")),
                    key: format!("{{fenced-{id}}}:data"),
                })
            }
            _ => Ok(ResourceFence::memory()),
        }
    }

    /// The in-memory fence.
    pub fn memory() -> ResourceFence {
        ResourceFence::Memory(lease_core::fence::Fence::new("lab resource"))
    }

    /// Which fence decides (for reports).
    pub fn kind(&self) -> &'static str {
        match self {
            ResourceFence::Memory(_) => "lease_core::fence::Fence",
            ResourceFence::Postgres { .. } => "lease_postgres::fence::PgFence",
            ResourceFence::Mysql { .. } => "lease_mysql::fence::MysqlFence",
            ResourceFence::Redis { .. } => "lease_redis::fence::RedisFence",
        }
    }

    /// One protected write carrying `token`: `Ok(None)` accepted, `Ok(Some(highest))`
    /// refused as stale, `Err` the store failed (counted as not accepted).
    async fn write(&self, token: u64) -> Result<Option<u64>, String> {
        let t = FencingToken(token);
        let r = match self {
            ResourceFence::Memory(f) => f.check(t),
            ResourceFence::Postgres {
                pool,
                fence,
                update,
            } => {
                use lease_postgres::sqlx;
                async {
                    let mut tx = pool.begin().await.map_err(sql_error)?;
                    fence.check(&mut tx, "lab", t).await?;
                    sqlx::query(sqlx::AssertSqlSafe(update.clone()))
                        .bind(token as i64)
                        .execute(&mut *tx)
                        .await
                        .map_err(sql_error)?;
                    tx.commit().await.map_err(sql_error)
                }
                .await
            }
            ResourceFence::Mysql {
                pool,
                fence,
                update,
            } => {
                use lease_mysql::sqlx;
                async {
                    let mut tx = pool.begin().await.map_err(sql_error)?;
                    fence.check(&mut tx, "lab", t).await?;
                    sqlx::query(sqlx::AssertSqlSafe(update.clone()))
                        .bind(token)
                        .execute(&mut *tx)
                        .await
                        .map_err(sql_error)?;
                    tx.commit().await.map_err(sql_error)
                }
                .await
            }
            ResourceFence::Redis { conn, fence, key } => {
                let mut conn = conn.clone();
                fence
                    .set(&mut conn, key, token.to_string().as_bytes(), t)
                    .await
            }
        };
        match r {
            Ok(()) => Ok(None),
            Err(Error::Fenced { highest, .. }) => Ok(Some(highest)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// One write as the resource saw it.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    /// Time since the resource started.
    pub at: Duration,
    /// The writer's id.
    pub writer: String,
    /// Its fencing token.
    pub token: u64,
    /// Its sequence number.
    pub seq: u64,
    /// Whether the resource accepted it.
    pub accepted: bool,
}

/// A period during which a writer believed it held the lease.
#[derive(Clone, Debug)]
pub struct Belief {
    /// The writer's id.
    pub writer: String,
    /// The fencing token of that acquisition.
    pub token: u64,
    /// When the belief started (since the resource started).
    pub start: Duration,
    /// When it ended; `None` while it lasts (or if the writer died believing).
    pub end: Option<Duration>,
}

#[derive(Debug, Default)]
struct State {
    store_errors: u64,
    writes: Vec<WriteRecord>,
    beliefs: Vec<Belief>,
    overruns: Vec<(String, String, u64)>,
}

/// The fenced resource server. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct FencedResource {
    addr: SocketAddr,
    started: Instant,
    state: Arc<Mutex<State>>,
    fence_kind: &'static str,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FencedResource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FencedResource {
    /// Starts the server on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts the server on a free port of `ip` (an address of this machine, e.g. one end
    /// of a test network namespace's link), with the in-memory fence.
    pub async fn start_on(ip: std::net::IpAddr) -> std::io::Result<Self> {
        Self::start_with(ip, ResourceFence::memory()).await
    }

    /// Starts the server on a free port of `ip`, deciding writes with `fence`.
    pub async fn start_with(ip: std::net::IpAddr, fence: ResourceFence) -> std::io::Result<Self> {
        let fence_kind = fence.kind();
        // One write at a time: the records are in the order the fence decided.
        let fence = Arc::new(tokio::sync::Mutex::new(fence));
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let started = Instant::now();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (st, fence) = (st.clone(), fence.clone());
                tokio::spawn(async move {
                    let (r, mut w) = sock.into_split();
                    let mut lines = BufReader::new(r).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = handle(&st, &fence, started, &line).await;
                        if w.write_all(reply.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(FencedResource {
            addr,
            started,
            state,
            fence_kind,
            task,
        })
    }

    /// Which fence decides the writes.
    pub fn fence_kind(&self) -> &'static str {
        self.fence_kind
    }

    /// `host:port` for holders.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Time since the resource started (the records' clock).
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Ends every open belief of `writer` at `now` (for a writer that was killed: it
    /// cannot report the end itself).
    pub fn end_beliefs_of(&self, writer: &str) {
        let now = self.now();
        for b in lock(&self.state).beliefs.iter_mut() {
            if b.writer == writer && b.end.is_none() {
                b.end = Some(now);
            }
        }
    }

    /// All writes so far.
    pub fn writes(&self) -> Vec<WriteRecord> {
        lock(&self.state).writes.clone()
    }

    /// All belief periods so far.
    pub fn beliefs(&self) -> Vec<Belief> {
        lock(&self.state).beliefs.clone()
    }

    /// Waits until `writer` has had at least `n` accepted writes.
    pub async fn wait_for_writes(&self, writer: &str, n: usize, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            let count = lock(&self.state)
                .writes
                .iter()
                .filter(|w| w.writer == writer && w.accepted)
                .count();
            if count >= n {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Writes the fence's store failed (it was down): neither accepted nor stale.
    pub fn store_errors(&self) -> u64 {
        lock(&self.state).store_errors
    }

    /// Calls past their timeout reported by writers: (writer, operation, ms).
    pub fn overruns(&self) -> Vec<(String, String, u64)> {
        lock(&self.state).overruns.clone()
    }

    /// The checker's report over everything recorded so far.
    pub fn report(&self) -> Report {
        let mut r = Report::from_records(&self.writes(), &self.beliefs(), self.now());
        r.overruns = self.overruns();
        r.fence = self.fence_kind;
        r
    }
}

/// A failed statement of the lab's own protected write.
fn sql_error(e: impl std::fmt::Display) -> Error {
    Error::unexpected("lab", e.to_string())
}

/// How long one fenced write may take.
const FENCE_TIMEOUT: Duration = Duration::from_millis(250);

async fn handle(
    st: &Mutex<State>,
    fence: &tokio::sync::Mutex<ResourceFence>,
    started: Instant,
    line: &str,
) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["W", writer, token, seq] => {
            let (Ok(token), Ok(seq)) = (token.parse::<u64>(), seq.parse::<u64>()) else {
                return "ERR bad numbers\n".into();
            };
            let fence = fence.lock().await;
            let at = started.elapsed();
            // Bounded as a real resource's statement timeout bounds it: with the store
            // down, the writer gets an error at once instead of waiting on the pool.
            let verdict = tokio::time::timeout(FENCE_TIMEOUT, fence.write(token))
                .await
                .unwrap_or_else(|_| Err(format!("the fence took over {FENCE_TIMEOUT:?}")));
            // A write the store failed (it is down) is neither accepted nor stale: it is
            // counted apart.
            match &verdict {
                Ok(v) => lock(st).writes.push(WriteRecord {
                    at,
                    writer: (*writer).to_owned(),
                    token,
                    seq,
                    accepted: v.is_none(),
                }),
                Err(_) => lock(st).store_errors += 1,
            }
            drop(fence);
            match verdict {
                Ok(None) => "OK\n".into(),
                Ok(Some(highest)) => format!("STALE {highest}\n"),
                Err(e) => format!("ERR store {}\n", e.replace('\n', " ")),
            }
        }
        parts => handle_other(st, started.elapsed(), parts),
    }
}

fn handle_other(st: &Mutex<State>, at: Duration, parts: &[&str]) -> String {
    match parts {
        ["B", writer, token, what] => {
            let Ok(token) = token.parse::<u64>() else {
                return "ERR bad token\n".into();
            };
            let mut s = lock(st);
            match *what {
                "start" => s.beliefs.push(Belief {
                    writer: (*writer).to_owned(),
                    token,
                    start: at,
                    end: None,
                }),
                "end" => {
                    if let Some(b) = s
                        .beliefs
                        .iter_mut()
                        .rev()
                        .find(|b| b.writer == *writer && b.token == token && b.end.is_none())
                    {
                        b.end = Some(at);
                    }
                }
                _ => return "ERR start or end\n".into(),
            }
            "OK\n".into()
        }
        ["T", writer, op, ms] => {
            let Ok(ms) = ms.parse::<u64>() else {
                return "ERR bad ms\n".into();
            };
            lock(st)
                .overruns
                .push(((*writer).to_owned(), (*op).to_owned(), ms));
            "OK\n".into()
        }
        _ => "ERR unknown command\n".into(),
    }
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Writes accepted.
    pub accepted: u64,
    /// Writes rejected because their token was stale.
    pub stale_rejected: u64,
    /// Writes a paused holder made with its old token after resuming (each must be
    /// among the rejected; set by the paused-holder case).
    pub stale_after_resume: u64,
    /// The fence that decided the writes.
    pub fence: &'static str,
    /// Accepted writes whose token was lower than an earlier accepted write's (must be 0).
    pub accepted_out_of_order: u64,
    /// Periods where two writers believed they held the lease at once: (writer a, writer
    /// b, overlap).
    pub double_beliefs: Vec<(String, String, Duration)>,
    /// Time from the end of one writer's belief to the start of the next writer's.
    pub takeovers: Vec<Duration>,
    /// Distinct fencing tokens seen in accepted writes, in order.
    pub tokens: Vec<u64>,
    /// Calls to the store that outlived their timeout: (writer, operation, ms).
    pub overruns: Vec<(String, String, u64)>,
}

impl Report {
    /// Computes the report from raw records.
    pub fn from_records(writes: &[WriteRecord], beliefs: &[Belief], now: Duration) -> Self {
        let mut r = Report::default();
        let mut highest = 0;
        for w in writes {
            if w.accepted {
                r.accepted += 1;
                if w.token < highest {
                    r.accepted_out_of_order += 1;
                }
                highest = highest.max(w.token);
                if r.tokens.last() != Some(&w.token) {
                    r.tokens.push(w.token);
                }
            } else {
                r.stale_rejected += 1;
            }
        }
        let mut sorted: Vec<&Belief> = beliefs.iter().collect();
        sorted.sort_by_key(|b| b.start);
        for (i, a) in sorted.iter().enumerate() {
            let a_end = a.end.unwrap_or(now);
            for b in &sorted[i + 1..] {
                if b.writer == a.writer {
                    continue;
                }
                if b.start < a_end {
                    let overlap = a_end.min(b.end.unwrap_or(now)) - b.start;
                    r.double_beliefs
                        .push((a.writer.clone(), b.writer.clone(), overlap));
                }
            }
        }
        for pair in sorted.windows(2) {
            if let Some(end) = pair[0].end
                && pair[1].start >= end
            {
                r.takeovers.push(pair[1].start - end);
            }
        }
        r
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes accepted, {} stale writes rejected ({} of them a resumed holder's, \
             by {}), {} accepted out of token order, {} double-belief periods, {} calls past \
             their timeout, takeovers {:?}, tokens {:?}",
            self.accepted,
            self.stale_rejected,
            self.stale_after_resume,
            if self.fence.is_empty() {
                "the resource"
            } else {
                self.fence
            },
            self.accepted_out_of_order,
            self.double_beliefs.len(),
            self.overruns.len(),
            self.takeovers,
            self.tokens
        )
    }
}

/// Per-writer counts, for messages.
pub fn writes_by_writer(writes: &[WriteRecord]) -> HashMap<String, (u64, u64)> {
    let mut m: HashMap<String, (u64, u64)> = HashMap::new();
    for w in writes {
        let e = m.entry(w.writer.clone()).or_default();
        if w.accepted {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    m
}
