#![cfg_attr(docsrs, feature(doc_cfg))]
//! MySQL and MariaDB backend for the `lease` crate family: a ShedLock-style lock table,
//! every decision taken on the database server's clock.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lease_core::Error> {
//! use std::{sync::Arc, time::Duration};
//! use lease_core::{LeaseClient, LeaseOptions, RunOutcome};
//! use lease_mysql::MysqlBackend;
//!
//! let backend = MysqlBackend::connect("mysql://app:secret@db.internal:3306/app").await?;
//! let client = LeaseClient::new(Arc::new(backend));
//! let opts = LeaseOptions::new(Duration::from_secs(30))?;
//! match client.run_exclusive("nightly-report", &opts, |ctx| async move {
//!     // ... work, passing ctx.fencing to the resource you write to ...
//! }).await? {
//!     RunOutcome::Ran(()) => {}
//!     other => println!("not run: {other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! One row per lease name, kept after release so that the fencing counter never goes
//! back: `name` (the key, `VARBINARY(1024)`), `owner_token`, `holder`, `fencing`,
//! `locked_at`, `lock_until`, `released`. [`schema_sql`] gives the DDL for migrations;
//! by default the backend runs it when the table is missing (several instances starting
//! at once are safe: `CREATE TABLE IF NOT EXISTS` takes the table's metadata lock). A
//! role with only `SELECT, INSERT, UPDATE` on an existing table works.
//!
//! # Primitives and round trips
//!
//! - acquire: one `INSERT ... ON DUPLICATE KEY UPDATE` that decides on
//!   `UTC_TIMESTAMP(6)` and returns the fencing token in its OK packet; when the lease is
//!   held, one more `SELECT` reads the holder and its remaining time for the answer;
//! - renew: one round trip per batch (up to [`MAX_RENEW_BATCH`] leases);
//! - release (with keep-for), inspect, force release: one statement each.
//!
//! Release notification: none; waiters poll with backoff (the capabilities say so).
//! See `sql.rs` for why `UTC_TIMESTAMP(6)` is the clock: the statements read the server's
//! time in UTC whatever the session's time zone, so a pool of your own
//! ([`MysqlBackend::from_pool`]) may use any zone.
//!
//! # Fencing durability
//!
//! The counter is a column of an InnoDB row. The backend says [`Fencing::Durable`] only
//! if the server runs with `innodb_flush_log_at_trx_commit = 1` (the default): with `0` or
//! `2` a crash may lose the last second of commits, counters included, and the backend
//! says [`Fencing::Volatile`]. [`MysqlConfig::persistent_fencing`] overrides the answer
//! (for example `Some(false)` when a failover may promote an asynchronous replica).
//!
//! # Cancel safety
//!
//! Every primitive is one or two statements on a pooled connection, bounded by
//! [`MysqlConfig::call_timeout`]. A dropped future abandons the call: a statement already
//! sent may still be applied by the server (an acquire then holds a lease nobody knows
//! of until its TTL passes; `LeaseClient` cleans up after calls it abandons). The
//! connection goes back to the pool with that reply pending, and the driver reads and
//! discards it before the connection's next statement (lease-lab's lost-reply test
//! drops calls in flight this way).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
    TlsFiles,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::{AssertSqlSafe, Row};

mod error;
mod sql;

use error::{BACKEND, convert};
use sql::{Statements, TableName};

/// The `sqlx` this crate is built on, for [`MysqlBackend::from_pool`].
pub use sqlx;

/// Largest renewal batch sent in one round trip; the client splits larger batches.
pub const MAX_RENEW_BATCH: usize = 10_000;

/// Default table name.
pub const DEFAULT_TABLE: &str = "lease_locks";

/// Settings of a [`MysqlBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_mysql::MysqlConfig;
/// let config = MysqlConfig {
///     table: "ops.lease_locks".into(),
///     call_timeout: Duration::from_secs(2),
///     ..MysqlConfig::default()
/// };
/// assert!(config.create_table);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MysqlConfig {
    /// The lock table (default `lease_locks`, in the URL's database): `table` or
    /// `database.table`, each part matching `[a-z_][a-z0-9_]{0,63}` (always quoted in
    /// SQL). The URL parameter `table=` sets it too.
    pub table: String,
    /// Whether to create the table if missing, at construction (default `true`; the URL
    /// parameter `create_table=false` turns it off). A table that exists is never created
    /// again. Without it, see [`schema_sql`].
    pub create_table: bool,
    /// Bound of every call (default 5 s): the pool's acquire timeout (which includes
    /// connecting) and a client-side timeout around every statement.
    pub call_timeout: Duration,
    /// Size of the pool built by [`MysqlBackend::connect_with`] (default 10).
    pub max_connections: u32,
    /// Whether fencing tokens survive a crash of the server. `None` (default): ask the
    /// server at connect (durable only with `innodb_flush_log_at_trx_commit = 1`).
    pub persistent_fencing: Option<bool>,
    /// TLS files (feature `tls`): a CA bundle, a client certificate and its key. The URL
    /// parameters `ssl-ca`, `ssl-cert` and `ssl-key` (or `sslca`, `sslcert`, `sslkey`)
    /// set them too; the same file given twice with different paths is an error. When
    /// any file is given and the URL sets no `ssl-mode`, the mode is `VERIFY_IDENTITY`
    /// (the server's certificate must be signed by the CA and name the host), as with
    /// libpq's `verify-full`. Each file is read and checked at connect, so a missing or
    /// malformed one is an [`Error::Tls`] naming it.
    pub tls: TlsFiles,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        MysqlConfig {
            table: DEFAULT_TABLE.to_owned(),
            create_table: true,
            call_timeout: Duration::from_secs(5),
            max_connections: 10,
            persistent_fencing: None,
            tls: TlsFiles::default(),
        }
    }
}

impl MysqlConfig {
    fn validate(&self) -> std::result::Result<TableName, InvalidInput> {
        if self.call_timeout.is_zero() {
            return Err(InvalidInput::Other(
                "mysql call_timeout must be greater than zero".into(),
            ));
        }
        if self.max_connections == 0 {
            return Err(InvalidInput::Other(
                "mysql max_connections must be greater than zero".into(),
            ));
        }
        TableName::parse(&self.table)
    }
}

/// The DDL of the lock table `table` (`table` or `database.table`), for users who manage
/// their schema with migrations and set [`MysqlConfig::create_table`] to `false`.
///
/// ```
/// let ddl = lease_mysql::schema_sql("lease_locks")?;
/// assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS `lease_locks`"));
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
pub fn schema_sql(table: &str) -> std::result::Result<String, InvalidInput> {
    Ok(sql::schema_sql(&TableName::parse(table)?))
}

/// A lease store on a MySQL (8.0 and later) or MariaDB (10.6 and later) table.
///
/// Renewals go through a pool of their own (up to two connections, one kept open, built
/// from the main pool's connect options), so that a renewal never waits for a pooled
/// connection behind acquisitions or the application's own queries: the server sees up
/// to `max_connections + 2` connections from one backend. Clones share both pools.
#[derive(Clone)]
pub struct MysqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    /// A pool of its own for renewals (at most two connections, one kept open), so that
    /// a renewal never waits for a pooled connection behind a flood of acquisitions: a
    /// holder's lease must not lapse because others are trying to take it.
    renewals: MySqlPool,
    sql: Statements,
    table: TableName,
    caps: Capabilities,
    call_timeout: Duration,
    server: String,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("server", &self.inner.server)
            .field("table", &self.inner.table.quoted)
            .field("fencing", &self.inner.caps.fencing)
            .finish()
    }
}

/// What [`split_own_params`] learned about TLS from the URL.
struct UrlTls {
    /// The URL sets `ssl-mode` (or `sslmode`).
    mode_given: bool,
}

/// Splits this crate's own parameters (`table`, `create_table`) and the TLS files
/// (`ssl-ca`, `ssl-cert`, `ssl-key`, merged into `config.tls`) off `url`; the rest is for
/// the driver. `mariadb://` is read as `mysql://`. Refuses a URL whose password has
/// unencoded reserved characters ([`lease_core::check_url_userinfo`]), before anything
/// splits it.
fn split_own_params(url: &str, config: &mut MysqlConfig) -> Result<(String, UrlTls)> {
    lease_core::check_url_userinfo(url)?;
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    let mut url_tls = UrlTls { mode_given: false };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url, url_tls));
    };
    let malformed = |why: String| -> Error {
        InvalidInput::MalformedUrl(format!("{}: {why}", lease_core::redact_url(&url))).into()
    };
    let mut files = TlsFiles::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match k {
            "ssl-ca" | "sslca" => Some(&mut files.ca),
            "ssl-cert" | "sslcert" => Some(&mut files.cert),
            "ssl-key" | "sslkey" => Some(&mut files.key),
            _ => None,
        };
        if let Some(slot) = slot {
            let path = lease_core::percent_decode(v).map_err(|e| malformed(format!("{k}: {e}")))?;
            if path.is_empty() {
                return Err(malformed(format!("{k} is empty")));
            }
            if slot.replace(path.into()).is_some() {
                return Err(malformed(format!("{k} given twice")));
            }
            continue;
        }
        if matches!(k, "ssl-mode" | "sslmode") {
            url_tls.mode_given = true;
        }
        match k {
            "table" => config.table = v.to_owned(),
            "create_table" => {
                config.create_table = match v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(InvalidInput::MalformedUrl(format!(
                            "create_table={other}: expected true or false"
                        ))
                        .into());
                    }
                }
            }
            _ => kept.push(pair),
        }
    }
    config.tls = config.tls.merged(&files)?;
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, url_tls))
}

impl MysqlBackend {
    /// Connects with the default [`MysqlConfig`] (and the URL's `table=` and
    /// `create_table=`). See [`MysqlBackend::connect_with`].
    ///
    /// Cancel safe: a dropped call leaves at most a table it created.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, MysqlConfig::default()).await
    }

    /// Connects to `url` (`mysql://user:password@host:port/database?params`, or
    /// `mariadb://`; the driver's parameters such as `ssl-mode` pass through; the TLS
    /// files `ssl-ca`, `ssl-cert`, `ssl-key` join [`MysqlConfig::tls`]), probes the
    /// durability settings and creates the table if missing and allowed.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lease_core::Error> {
    /// use lease_core::TlsFiles;
    /// use lease_mysql::{MysqlBackend, MysqlConfig};
    /// // Mutual TLS, the server verified against a CA of your own (VERIFY_IDENTITY).
    /// let config = MysqlConfig {
    ///     tls: TlsFiles::default()
    ///         .with_ca("/etc/lease/ca.pem")
    ///         .with_client("/etc/lease/client.pem", "/etc/lease/client.key"),
    ///     ..MysqlConfig::default()
    /// };
    /// let backend = MysqlBackend::connect_with("mysql://lease_client@db.internal/app", config).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: [`Error::InvalidInput`] for a malformed URL or config; [`Error::Tls`] for a
    /// TLS file that is missing or not PEM, a server certificate that does not verify, a
    /// server without TLS under `ssl-mode=REQUIRED` or stricter, or TLS asked of a build
    /// without the `tls` feature; [`Error::Auth`] for refused credentials (also what the
    /// server answers to a user that must use TLS, or a client certificate, connecting
    /// without: MySQL and MariaDB say "Access denied" for both); [`Error::Unavailable`]
    /// when the server cannot be reached within the call timeout; [`Error::Rejected`] when
    /// the table is missing and cannot be created. Cancel safe: a dropped call leaves at
    /// most a table it created.
    pub async fn connect_with(url: &str, mut config: MysqlConfig) -> Result<Self> {
        let (driver_url, url_tls) = split_own_params(url, &mut config)?;
        config.validate()?;
        // The files must be there and be PEM: say which one is not, before the driver
        // tries them on every connection.
        config.tls.load(BACKEND)?;
        let mut options = MySqlConnectOptions::from_str(&driver_url).map_err(|e| {
            InvalidInput::MalformedUrl(format!("{}: {e}", lease_core::redact_url(&driver_url)))
        })?;
        if let Some(ca) = &config.tls.ca {
            options = options.ssl_ca(ca);
        }
        if let Some(cert) = &config.tls.cert {
            options = options.ssl_client_cert(cert);
        }
        if let Some(key) = &config.tls.key {
            options = options.ssl_client_key(key);
        }
        if !config.tls.is_empty() && !url_tls.mode_given {
            options = options.ssl_mode(MySqlSslMode::VerifyIdentity);
        }
        // UTC sessions (the driver's default too). The lock statements read
        // UTC_TIMESTAMP(6) and do not depend on it; it keeps the session's NOW() in the
        // table's zone for anyone reading the pool's connections.
        let options = options.timezone(Some("+00:00".to_owned()));
        let pool = MySqlPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.call_timeout)
            .connect_lazy_with(options);
        let server = lease_core::redact_url(&driver_url);
        Self::build(pool, config, server).await
    }

    /// A backend on a pool of your own. Its sessions may use any time zone: the
    /// statements read the time with `UTC_TIMESTAMP(6)` and the table holds UTC, so the
    /// pool agrees with backends on other pools whatever their zones (a zone with
    /// daylight saving included). The pool's options carry its TLS
    /// settings: a non-empty [`MysqlConfig::tls`] is an [`Error::InvalidInput`] here.
    ///
    /// Cancel safe, as [`MysqlBackend::connect_with`].
    pub async fn from_pool(pool: MySqlPool, config: MysqlConfig) -> Result<Self> {
        config.validate()?;
        if !config.tls.is_empty() {
            return Err(InvalidInput::Other(
                "MysqlConfig::tls is for connect_with; a pool of your own takes its TLS files \
                 from its MySqlConnectOptions (ssl_ca, ssl_client_cert, ssl_client_key)"
                    .into(),
            )
            .into());
        }
        Self::build(pool, config, "(a pool of the caller's)".into()).await
    }

    async fn build(pool: MySqlPool, config: MysqlConfig, server: String) -> Result<Self> {
        let table = config.validate()?;
        let timeout = config.call_timeout;
        let (flush, version): (i64, String) = bounded(
            "connect",
            timeout,
            sqlx::query_as("SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), VERSION()")
                .fetch_one(&pool),
        )
        .await?;
        let exists: i64 = bounded(
            "connect",
            timeout,
            sqlx::query_scalar(AssertSqlSafe(sql::table_exists_sql(&table))).fetch_one(&pool),
        )
        .await?;
        if exists == 0 {
            if !config.create_table {
                return Err(Error::Rejected {
                    backend: BACKEND,
                    source: format!(
                        "table {} does not exist and create_table is off; create it with the \
                         DDL of lease_mysql::schema_sql",
                        table.quoted
                    )
                    .into(),
                });
            }
            if table.database.is_none() {
                let db: Option<String> = bounded(
                    "connect",
                    timeout,
                    sqlx::query_scalar("SELECT DATABASE()").fetch_one(&pool),
                )
                .await?;
                if db.is_none() {
                    return Err(InvalidInput::MalformedUrl(format!(
                        "{server} names no database: add one to the URL \
                         (mysql://host/database) or qualify the table (table=database.name)"
                    ))
                    .into());
                }
            }
            bounded(
                "create table",
                timeout,
                sqlx::query(AssertSqlSafe(sql::schema_sql(&table))).execute(&pool),
            )
            .await?;
            tracing::info!(table = %table.quoted, "created the lease table");
        }
        let durable = config.persistent_fencing.unwrap_or(flush == 1);
        let mut caps = Capabilities::default();
        caps.backend = BACKEND;
        caps.fencing = if durable {
            Fencing::Durable
        } else {
            Fencing::Volatile
        };
        caps.expires = true;
        caps.min_ttl = Duration::from_millis(1);
        caps.ttl_granularity = Duration::from_micros(1);
        caps.holder_info = true;
        caps.keep_for = true;
        caps.release_notification = false;
        caps.max_renew_batch = MAX_RENEW_BATCH;
        tracing::debug!(%server, %version, innodb_flush_log_at_trx_commit = flush, "mysql backend ready");
        // Renewals of one heartbeat go one batch at a time: two connections serve two
        // clients on one backend without waiting.
        let renewals = MySqlPoolOptions::new()
            .max_connections(2)
            .min_connections(1)
            .acquire_timeout(timeout)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        // Opened now: the first renewal must not pay a connect (a TLS handshake, the
        // password's hashing) inside the lease's deadline.
        drop(bounded("connect", timeout, renewals.acquire()).await?);
        Ok(MysqlBackend {
            inner: Arc::new(Inner {
                pool,
                renewals,
                sql: Statements::new(&table),
                table,
                caps,
                call_timeout: timeout,
                server,
            }),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The table, quoted as in SQL (`` `lease_locks` ``, `` `db`.`lease_locks` ``).
    pub fn quoted_table(&self) -> &str {
        &self.inner.table.quoted
    }

    /// The acquire and release statements, for benchmarks that compare the library with
    /// the bare statements.
    pub fn cycle_statements(&self) -> (&str, &str) {
        (&self.inner.sql.acquire, &self.inner.sql.release)
    }

    async fn call<T, F>(&self, operation: &'static str, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        bounded(operation, self.inner.call_timeout, fut).await
    }

    async fn held_by(&self, name: &LeaseName) -> Result<HeldBy> {
        Ok(match self.inspect(name).await? {
            Some(info) => HeldBy {
                holder: info.holder,
                remaining: info.remaining,
            },
            None => HeldBy::default(),
        })
    }
}

async fn bounded<T, F>(operation: &'static str, after: Duration, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, sqlx::Error>>,
{
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(convert(operation, after, e)),
        Err(_) => Err(Error::Timeout { operation, after }),
    }
}

/// `d` in whole microseconds, rounded up.
fn micros_ceil(what: &str, d: Duration) -> Result<u64> {
    let us = d.as_nanos().div_ceil(1_000);
    u64::try_from(us)
        .ok()
        .filter(|us| *us <= i64::MAX as u64)
        .ok_or_else(|| InvalidInput::Other(format!("{what} {d:?} is too large")).into())
}

fn remaining(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

#[async_trait::async_trait]
impl LeaseBackend for MysqlBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let ttl = self.inner.caps.effective_ttl(ttl);
        let ttl_us = micros_ceil("ttl", ttl)?;
        let done = self
            .call(
                "acquire",
                sqlx::query(AssertSqlSafe(self.inner.sql.acquire.as_str()))
                    .bind(name.as_bytes())
                    .bind(&owner.token.as_bytes()[..])
                    .bind(owner.label.as_str())
                    .bind(ttl_us)
                    .execute(&self.inner.pool),
            )
            .await?;
        let fencing = done.last_insert_id();
        if fencing > 0 {
            tracing::debug!(lease = %name, owner = %owner.label.as_str(), fencing, "acquired");
            return Ok(AcquireOutcome::Acquired {
                fencing: FencingToken(fencing),
                ttl,
            });
        }
        let by = self.held_by(name).await?;
        tracing::debug!(lease = %name, owner = %owner.label.as_str(), held_by = %by, "held");
        Ok(AcquireOutcome::Held(by))
    }

    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > MAX_RENEW_BATCH {
            return Err(InvalidInput::BatchTooLarge {
                len: leases.len(),
                max: MAX_RENEW_BATCH,
            }
            .into());
        }
        let ttl_us = micros_ceil("ttl", self.inner.caps.effective_ttl(ttl))?;
        let mut slot_of: HashMap<(&[u8], &[u8; 16]), usize> = HashMap::new();
        let mut pairs: Vec<(&[u8], &[u8; 16])> = Vec::new();
        let slots: Vec<usize> = leases
            .iter()
            .map(|item| {
                let key = (item.name.as_bytes(), item.token.as_bytes());
                *slot_of.entry(key).or_insert_with(|| {
                    pairs.push(key);
                    pairs.len() - 1
                })
            })
            .collect();
        let text = self.inner.sql.renew(&pairs, ttl_us);
        let rows = self
            .call(
                "renew",
                sqlx::raw_sql(AssertSqlSafe(text)).fetch_all(&self.inner.renewals),
            )
            .await?;
        let mut ok = vec![false; pairs.len()];
        for row in rows {
            let name: Vec<u8> = row
                .try_get(0)
                .map_err(|e| convert("renew", self.inner.call_timeout, e))?;
            let token: Vec<u8> = row
                .try_get(1)
                .map_err(|e| convert("renew", self.inner.call_timeout, e))?;
            let key_token: [u8; 16] = token.as_slice().try_into().map_err(|_| {
                Error::unexpected(
                    BACKEND,
                    format!("renew returned a token of {} bytes", token.len()),
                )
            })?;
            match slot_of.get(&(name.as_slice(), &key_token)) {
                Some(slot) => {
                    if let Some(flag) = ok.get_mut(*slot) {
                        *flag = true;
                    }
                }
                None => {
                    return Err(Error::unexpected(
                        BACKEND,
                        "renew returned a pair that was not in the batch",
                    ));
                }
            }
        }
        let outcomes: Vec<RenewOutcome> = slots
            .iter()
            .map(|s| {
                if ok.get(*s).copied().unwrap_or(false) {
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::Lost
                }
            })
            .collect();
        for (item, outcome) in leases.iter().zip(&outcomes) {
            if *outcome == RenewOutcome::Lost {
                tracing::debug!(lease = %item.name, "renewal found the lease lost");
            }
        }
        Ok(outcomes)
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let keep_us = micros_ceil("keep_for", keep_for)?;
        let done = self
            .call(
                "release",
                sqlx::query(AssertSqlSafe(self.inner.sql.release.as_str()))
                    .bind(keep_us)
                    .bind(name.as_bytes())
                    .bind(&token.as_bytes()[..])
                    .execute(&self.inner.pool),
            )
            .await?;
        let outcome = if done.rows_affected() > 0 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        };
        tracing::debug!(lease = %name, ?outcome, "release");
        Ok(outcome)
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let row: Option<(Option<String>, u64, i64)> = self
            .call(
                "inspect",
                sqlx::query_as(AssertSqlSafe(self.inner.sql.inspect.as_str()))
                    .bind(name.as_bytes())
                    .fetch_optional(&self.inner.pool),
            )
            .await?;
        Ok(row.map(|(holder, fencing, us)| LeaseInfo {
            holder,
            fencing: Some(FencingToken(fencing)),
            remaining: Some(remaining(us)),
        }))
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let done = self
            .call(
                "force release",
                sqlx::query(AssertSqlSafe(self.inner.sql.force_release.as_str()))
                    .bind(name.as_bytes())
                    .execute(&self.inner.pool),
            )
            .await?;
        tracing::info!(lease = %name, freed = done.rows_affected() > 0, "force release");
        Ok(done.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_url_parameters_are_split_off() {
        let mut c = MysqlConfig::default();
        let (url, tls) = split_own_params(
            "mariadb://u:p@h:3306/db?table=ops.locks&ssl-mode=REQUIRED&create_table=false",
            &mut c,
        )
        .expect("valid");
        assert_eq!(url, "mysql://u:p@h:3306/db?ssl-mode=REQUIRED");
        assert!(tls.mode_given);
        assert_eq!(c.table, "ops.locks");
        assert!(!c.create_table);
        assert!(split_own_params("mysql://h/db?create_table=maybe", &mut c).is_err());
    }

    /// Issue 31, finding 4: a password with an unencoded '/', '?' or '#' was cut there by
    /// the driver and printed in its "invalid port number" error.
    #[test]
    fn passwords_with_reserved_characters_are_refused_unshown() {
        for url in [
            "mysql://u:my/s3cr#t@h:3306/db",
            "mariadb://u:my?s3cret@h/db?table=t",
        ] {
            let mut c = MysqlConfig::default();
            let Err(e) = split_own_params(url, &mut c) else {
                panic!("{url} accepted");
            };
            assert!(
                matches!(e, Error::InvalidInput(InvalidInput::MalformedUrl(_))),
                "{url}: {e:?}"
            );
            assert!(!e.to_string().contains("s3cr"), "{url}: {e}");
            assert!(e.to_string().contains("percent-encode"), "{url}: {e}");
        }
        let mut c = MysqlConfig::default();
        let (url, _) =
            split_own_params("mysql://u:my%2Fs3cr%23t@h:3306/db", &mut c).expect("valid");
        assert!(MySqlConnectOptions::from_str(&url).is_ok());
    }

    #[test]
    fn tls_files_leave_the_url_for_the_config() {
        let mut c = MysqlConfig::default();
        let (url, tls) = split_own_params(
            "mysql://h/db?ssl-ca=%2Fetc%2Fca.pem&sslcert=/c.pem&ssl-key=/k%20x.pem&charset=utf8mb4",
            &mut c,
        )
        .expect("valid");
        assert_eq!(url, "mysql://h/db?charset=utf8mb4");
        assert!(!tls.mode_given);
        assert_eq!(
            c.tls,
            TlsFiles::default()
                .with_ca("/etc/ca.pem")
                .with_client("/c.pem", "/k x.pem")
        );
        for bad in [
            "mysql://h/db?ssl-ca=",
            "mysql://h/db?ssl-ca=/a&sslca=/a",
            "mysql://h/db?ssl-ca=%zz",
        ] {
            let mut c = MysqlConfig::default();
            assert!(split_own_params(bad, &mut c).is_err(), "{bad}");
        }
        // The same file in the config and the URL is fine; two different ones are not.
        let mut c = MysqlConfig {
            tls: TlsFiles::default().with_ca("/a.pem"),
            ..MysqlConfig::default()
        };
        assert!(split_own_params("mysql://h/db?ssl-ca=/a.pem", &mut c).is_ok());
        assert!(split_own_params("mysql://h/db?ssl-ca=/b.pem", &mut c).is_err());
    }

    #[test]
    fn micros_round_up() {
        assert_eq!(micros_ceil("ttl", Duration::from_nanos(1)).ok(), Some(1));
        assert_eq!(
            micros_ceil("ttl", Duration::from_millis(2)).ok(),
            Some(2000)
        );
        assert!(micros_ceil("ttl", Duration::MAX).is_err());
    }
}
