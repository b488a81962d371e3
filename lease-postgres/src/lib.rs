#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod advisory;
mod error;
mod inline;
mod notify;
mod sql;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
    Result, TlsFiles,
};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgExecutor, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

pub use crate::advisory::AdvisoryLockBackend;
use crate::error::{BACKEND, convert, redact_url, scrub};
use crate::inline::Param;
use crate::notify::{Event, Listening, Releases};
use crate::sql::{SCHEMA_LOCK_KEY, Statements, TableName};

/// The `sqlx` crate this backend is built on, for [`PostgresBackend::from_pool`] and
/// [`AdvisoryLockBackend::from_pool`].
pub use sqlx;

/// Largest renewal batch sent as one statement; the client splits larger batches.
pub const MAX_RENEW_BATCH: usize = 10_000;

/// Default table name.
pub const DEFAULT_TABLE: &str = "lease_locks";

/// Settings of a [`PostgresBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_postgres::PostgresConfig;
/// let config = PostgresConfig {
///     table: "ops.lease_locks".into(),
///     call_timeout: Duration::from_secs(2),
///     ..PostgresConfig::default()
/// };
/// assert!(config.create_schema);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresConfig {
    /// The lock table (default `lease_locks`): `table` or `schema.table`, each part
    /// matching `[a-z_][a-z0-9_]{0,62}` (always quoted in SQL). An unqualified name is in
    /// schema `public`, whatever the role's `search_path` says, so that every role finds
    /// the same table. The URL parameter `table=` sets it too.
    pub table: String,
    /// Whether to create the table (and schema) if missing, at construction (default
    /// `true`; the URL parameter `create_table=false` turns it off). A table that exists
    /// is never created again, so a role with only `SELECT, INSERT, UPDATE, DELETE` on it
    /// works either way. Without it, see [`schema_sql`] for the DDL to put in your
    /// migrations.
    pub create_schema: bool,
    /// Bound of every call (default 5 s): the pool's acquire timeout (which includes
    /// connecting), the connections' `statement_timeout` (for pools this crate builds)
    /// and a client-side timeout around every statement.
    pub call_timeout: Duration,
    /// Size of the pool built by [`PostgresBackend::connect_with`] (default 10).
    pub max_connections: u32,
    /// Whether a transaction pooler (PgBouncer with `pool_mode = transaction`, and
    /// poolers like it) sits between this backend and PostgreSQL (default `false`; the
    /// URL parameter `pooler=transaction` sets it too). Then the backend keeps no session
    /// state: no startup parameters (no server-side `statement_timeout`: the client-side
    /// bound still applies), no prepared statements (each statement goes as one
    /// self-contained simple query with its parameters written in as encoded literals),
    /// and no `LISTEN` (release notification is off: waiters poll with backoff).
    pub transaction_pooler: bool,
    /// Whether fencing tokens survive a crash of the server. `None` (default): ask the
    /// server at connect: durable only with `fsync = on` and `synchronous_commit` not
    /// `off` in the backend's sessions. `Some(_)` skips the question and trusts the
    /// operator (for example `Some(false)` when a failover may promote an asynchronous
    /// standby, which can lose acknowledged commits).
    pub persistent_fencing: Option<bool>,
    /// TLS files (feature `tls`): a CA bundle (`sslrootcert`), a client certificate
    /// (`sslcert`) and its key (`sslkey`). They add to the URL's own libpq parameters;
    /// when any is given and the URL sets no `sslmode` (nor does `PGSSLMODE`), the mode is
    /// `verify-full`.
    pub tls: TlsFiles,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            table: DEFAULT_TABLE.to_owned(),
            create_schema: true,
            call_timeout: Duration::from_secs(5),
            max_connections: 10,
            transaction_pooler: false,
            persistent_fencing: None,
            tls: TlsFiles::default(),
        }
    }
}

impl PostgresConfig {
    fn validate(&self) -> std::result::Result<TableName, InvalidInput> {
        if self.call_timeout.is_zero() {
            return Err(InvalidInput::Other(
                "postgres call_timeout must be greater than zero".into(),
            ));
        }
        if self.max_connections == 0 {
            return Err(InvalidInput::Other(
                "postgres max_connections must be greater than zero".into(),
            ));
        }
        TableName::parse(&self.table)
    }
}

/// The DDL of the lock table `table` (`table` or `schema.table`), for users who manage
/// their schema with migrations and set [`PostgresConfig::create_schema`] to `false`.
///
/// ```
/// let ddl = lease_postgres::schema_sql("lease_locks")?;
/// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"public\".\"lease_locks\""));
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
pub fn schema_sql(table: &str) -> std::result::Result<String, InvalidInput> {
    Ok(sql::schema_sql(&TableName::parse(table)?))
}

/// This crate's own URL parameters, taken out of the URL before the driver sees it.
#[derive(Debug, Default)]
pub(crate) struct OwnParams {
    /// `pooler=transaction` (a transaction pooler sits in between), `pooler=session` or
    /// `pooler=none` (it does not).
    pub(crate) pooler: bool,
    /// `table=schema.name`: the lock table.
    pub(crate) table: Option<String>,
    /// `create_table=true|false`: whether to create the table when it is missing.
    pub(crate) create_table: Option<bool>,
}

/// Takes this crate's own URL parameters (`pooler`, `table`, `create_table`) out of
/// `url`. Returns the URL without them, and what they said. Refuses a URL whose password
/// has unencoded reserved characters ([`lease_core::check_url_userinfo`]), before anything
/// splits it.
pub(crate) fn split_own_params(
    url: &str,
) -> std::result::Result<(String, OwnParams), InvalidInput> {
    lease_core::check_url_userinfo(url)?;
    let mut own = OwnParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), own));
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let bad = |what: String| InvalidInput::MalformedUrl(format!("{}: {what}", redact_url(url)));
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("pooler", value)) => {
                own.pooler = match value {
                    "transaction" => true,
                    "session" | "none" => false,
                    other => {
                        return Err(bad(format!(
                            "pooler={other:?}: expected transaction, session or none"
                        )));
                    }
                }
            }
            Some(("table", value)) => own.table = Some(value.to_owned()),
            Some(("create_table", value)) => {
                own.create_table = Some(match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    other => {
                        return Err(bad(format!(
                            "create_table={other:?}: expected true or false"
                        )));
                    }
                })
            }
            _ if !pair.is_empty() => kept.push(pair),
            _ => {}
        }
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok((out, own))
}

/// The value of query parameter `key` (any of `keys`) in `url`, as written.
fn url_param<'a>(url: &'a str, keys: &[&str]) -> Option<&'a str> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        keys.contains(&k).then_some(v)
    })
}

/// Parses a `postgres://` / `postgresql://` URL (without this crate's own parameters,
/// see [`split_own_params`]) into connect options: with `statement_timeout` set to
/// `call_timeout` in the startup parameters, or, behind a transaction pooler, with no
/// startup parameters a pooler refuses and no statement cache. `tls`'s files are added
/// (as `sslrootcert`, `sslcert`, `sslkey`); when any TLS file is given and neither the
/// URL nor `PGSSLMODE` sets `sslmode`, it is `verify-full`. Errors never contain the
/// password.
pub(crate) fn connect_options(
    url: &str,
    call_timeout: Duration,
    transaction_pooler: bool,
    tls: &TlsFiles,
) -> std::result::Result<PgConnectOptions, InvalidInput> {
    let scheme_ok = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !scheme_ok {
        return Err(InvalidInput::MalformedUrl(format!(
            "{}: expected a postgres:// or postgresql:// URL",
            redact_url(url)
        )));
    }
    let mut options = PgConnectOptions::from_str(url).map_err(|e| {
        InvalidInput::MalformedUrl(format!(
            "{}: {}",
            redact_url(url),
            scrub(&e.to_string(), url)
        ))
    })?;
    for (file, keys, what) in [
        (
            &tls.ca,
            &["sslrootcert", "ssl-root-cert", "ssl-ca"][..],
            "CA file",
        ),
        (
            &tls.cert,
            &["sslcert", "ssl-cert"][..],
            "client certificate",
        ),
        (&tls.key, &["sslkey", "ssl-key"][..], "client key"),
    ] {
        let Some(path) = file else { continue };
        if let Some(in_url) = url_param(url, keys)
            && std::path::Path::new(in_url) != path.as_path()
        {
            return Err(InvalidInput::Other(format!(
                "the TLS {what} is given twice: {in_url} (in the URL) and {}",
                path.display()
            )));
        }
    }
    if let Some(ca) = &tls.ca {
        options = options.ssl_root_cert(ca);
    }
    if let Some(cert) = &tls.cert {
        options = options.ssl_client_cert(cert);
    }
    if let Some(key) = &tls.key {
        options = options.ssl_client_key(key);
    }
    let mode_given = url_param(url, &["sslmode", "ssl-mode"]).is_some()
        || std::env::var_os("PGSSLMODE").is_some();
    if !tls.is_empty() && !mode_given {
        options = options.ssl_mode(sqlx::postgres::PgSslMode::VerifyFull);
    }
    if transaction_pooler {
        return Ok(options.extra_float_digits(None).statement_cache_capacity(0));
    }
    Ok(options.options([("statement_timeout", millis_ceil(call_timeout).to_string())]))
}

/// The client-side bound of a call with call timeout `after`: a little beyond the pool's
/// acquire timeout and the server's `statement_timeout` (both `after`), so that their
/// more telling errors win the race.
fn client_bound(after: Duration) -> Duration {
    after + after / 4
}

/// Runs `fut` within [`client_bound`]`(after)`, converting its error for `backend`;
/// [`Error::Timeout`] when the bound runs out.
pub(crate) async fn bounded_call<T>(
    backend: &'static str,
    operation: &'static str,
    after: Duration,
    fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> Result<T> {
    match tokio::time::timeout(client_bound(after), fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(convert(backend, operation, after, e)),
        Err(_) => Err(Error::Timeout { operation, after }),
    }
}

/// [`PostgresBackend::create_schema`] on `pool`, bounded by `call_timeout`.
async fn create_schema_in(pool: &PgPool, table: &TableName, call_timeout: Duration) -> Result<()> {
    // PostgreSQL checks the CREATE privilege before it honours IF NOT EXISTS: a role that
    // may only use the table would fail on the DDL. So look first (no privilege needed).
    let exists = sql::table_exists_sql(table);
    let found = bounded_call(
        BACKEND,
        "create schema",
        call_timeout,
        sqlx::raw_sql(AssertSqlSafe(exists.clone())).fetch_one(pool),
    )
    .await?;
    if found.try_get::<bool, _>(0).unwrap_or(false) {
        tracing::debug!(table = table.plain(), "lease table exists");
        return Ok(());
    }
    let ddl = sql::schema_sql(table);
    let run = async {
        let mut tx = pool.begin().await?;
        // Unnamed (not kept as a prepared statement in the session): behind a
        // transaction pooler the session serves other clients afterwards.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SCHEMA_LOCK_KEY)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
        tx.commit().await
    };
    bounded_call(BACKEND, "create schema", call_timeout, run).await?;
    tracing::debug!(table = table.plain(), "lease table ready");
    Ok(())
}

/// What a session of this backend runs with, read at connect.
pub(crate) struct SessionSettings {
    /// `fsync = on` and `synchronous_commit` not `off`.
    pub(crate) durable: bool,
    /// `statement_timeout` in milliseconds.
    pub(crate) statement_timeout_ms: Option<i64>,
    pub(crate) fsync: String,
    pub(crate) synchronous_commit: String,
}

/// Reads the settings that decide durability, and `statement_timeout`, in one simple
/// query (no prepared statement: it also works behind a transaction pooler).
pub(crate) async fn session_settings(
    backend: &'static str,
    pool: &PgPool,
    call_timeout: Duration,
) -> Result<SessionSettings> {
    const PROBE: &str = "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
         (SELECT setting FROM pg_settings WHERE name = 'statement_timeout')";
    let row = bounded_call(
        backend,
        "connect",
        call_timeout,
        sqlx::raw_sql(PROBE).fetch_one(pool),
    )
    .await?;
    let text = |i: usize| -> Result<String> {
        row.try_get::<String, _>(i).map_err(|e| {
            Error::unexpected(backend, format!("connect: setting {i} of the probe: {e}"))
        })
    };
    let fsync = text(0)?;
    let synchronous_commit = text(1)?;
    let statement_timeout_ms = text(2)?.parse::<i64>().ok();
    Ok(SessionSettings {
        durable: fsync == "on" && synchronous_commit != "off",
        statement_timeout_ms,
        fsync,
        synchronous_commit,
    })
}

/// Connections of the renewal pool: renewals of one heartbeat go one batch at a time, so
/// two serve two clients on one backend without waiting.
const RENEWAL_CONNECTIONS: u32 = 2;

/// The pool settings of the pools this crate builds: every acquisition (including
/// connecting) bounded; no extra round trip to test a connection before each call (a
/// broken connection fails that call with a retryable error and is discarded).
pub(crate) fn pool_options(max_connections: u32, call_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(call_timeout)
        .test_before_acquire(false)
}

/// A lease store in a Postgres table, ShedLock style, on the database's clock.
///
/// One row per lease name (`name BYTEA PRIMARY KEY`), never deleted, so its fencing
/// counter never resets: tokens survive releases, expiry and server restarts
/// ([`Fencing::Durable`]). Expiry is decided with `clock_timestamp()` on the server only.
///
/// | primitive | statements | round trips |
/// |---|---|---|
/// | acquire | one (`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`, deciding on `lock_until <= clock_timestamp()`; the holder comes back in the same statement) | 1 |
/// | renew (whole batch) | one (`UPDATE ... FROM unnest(names, tokens)`) | 1 |
/// | release | one (`UPDATE` + `pg_notify`) | 1 |
/// | inspect | one `SELECT` | 1 |
/// | force_release | one `UPDATE` + `pg_notify` | 1 |
///
/// (sqlx prepares each statement once per connection, which costs one extra round trip
/// the first time a connection runs it; and when a connection goes back to the pool it
/// sends a one-message liveness ping, after the caller already has its answer.)
///
/// `wait_released` listens for release notifications (`LISTEN lease_released`) on one
/// extra connection per backend, started on first use. Renewals go through a pool of
/// their own (up to two connections, one kept open, built from the main pool's connect
/// options), so that a renewal never waits for a pooled connection behind acquisitions
/// or the application's own queries: the server sees up to `max_connections + 3`
/// connections from one backend.
///
/// Clones share the pool.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    /// A pool of its own for renewals (at most two connections, one kept open), so that
    /// a renewal never waits for a pooled connection behind a flood of acquisitions: a
    /// holder's lease must not lapse because others are trying to take it.
    renewals: PgPool,
    table: TableName,
    call_timeout: Duration,
    sql: Statements,
    releases: Releases,
    /// Behind a transaction pooler: statements as simple queries, no `LISTEN`.
    pooler: bool,
    caps: Capabilities,
}

impl fmt::Debug for PostgresBackend {
    // Neither the pool's connect options nor anything else that could hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.table.plain())
            .field("call_timeout", &self.inner.call_timeout)
            .field("pool_size", &self.inner.pool.size())
            .field("transaction_pooler", &self.inner.pooler)
            .field("fencing", &self.inner.caps.fencing)
            .finish_non_exhaustive()
    }
}

/// Outcome row of the acquire statement: whether this statement took the lease, the
/// row's fencing token, holder label and remaining time in microseconds.
type AcquireRow = (bool, i64, Option<String>, i64);

impl PostgresBackend {
    /// Connects with [`PostgresConfig::default`]: table `lease_locks`, created if missing.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lease_core::Error> {
    /// let backend = lease_postgres::PostgresBackend::connect("postgres://app@db/app").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: [`InvalidInput::MalformedUrl`] (password redacted) for a bad URL;
    /// [`Error::Unavailable`] when the server cannot be reached within the call timeout;
    /// [`Error::Auth`] for wrong credentials; [`Error::Rejected`] when it refuses otherwise
    /// (missing database, no permission to create the table).
    ///
    /// Cancel safety: cancel-safe: dropped, the table creation is rolled back or has
    /// committed (it is idempotent; call again); no lease is taken.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresConfig::default()).await
    }

    /// Connects with the given settings. See [`PostgresBackend::connect`].
    ///
    /// Cancel safety: cancel-safe: dropped, the table creation is rolled back or has
    /// committed (it is idempotent; call again); no lease is taken.
    pub async fn connect_with(url: &str, mut config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let (url, own) = split_own_params(url)?;
        config.transaction_pooler |= own.pooler;
        if let Some(table) = own.table {
            config.table = table;
        }
        if let Some(create) = own.create_table {
            config.create_schema = create;
        }
        config.validate()?;
        // The certificate and key files must be there and be PEM: say which one is not,
        // before the driver tries them on every connection.
        config.tls.load(BACKEND)?;
        let options = connect_options(
            &url,
            config.call_timeout,
            config.transaction_pooler,
            &config.tls,
        )?;
        let pool =
            pool_options(config.max_connections, config.call_timeout).connect_lazy_with(options);
        Self::from_pool(pool, config).await
    }

    /// Uses an existing pool. The pool's own settings apply (this crate's pools set
    /// `statement_timeout` and an acquire timeout; yours should bound both too); every
    /// call is additionally bounded by `config.call_timeout` on the client. Behind a
    /// transaction pooler, set [`PostgresConfig::transaction_pooler`] and give the pool
    /// no statement cache (`statement_cache_capacity(0)`) and no startup `options`.
    ///
    /// Creates the table if `config.create_schema` is set, then reads the server's
    /// durability settings (unless [`PostgresConfig::persistent_fencing`] says).
    ///
    /// Cancel safety: cancel-safe: dropped, the table creation is rolled back or has
    /// committed (it is idempotent; call again); no lease is taken.
    pub async fn from_pool(pool: PgPool, config: PostgresConfig) -> Result<Self> {
        let table = config.validate()?;
        if config.create_schema {
            create_schema_in(&pool, &table, config.call_timeout).await?;
        }
        // Also the first contact when the schema is not created here: a wrong address
        // or credentials fail now.
        let settings = session_settings(BACKEND, &pool, config.call_timeout).await?;
        let expected = millis_ceil(config.call_timeout);
        if !config.transaction_pooler && settings.statement_timeout_ms != Some(expected) {
            tracing::warn!(
                statement_timeout_ms = settings.statement_timeout_ms,
                expected,
                "the server did not apply the statement_timeout sent at connect: a \
                 connection pooler in between? (behind a transaction pooler, add \
                 pooler=transaction to the URL)"
            );
        }
        let durable = config.persistent_fencing.unwrap_or(settings.durable);
        tracing::debug!(
            fsync = %settings.fsync,
            synchronous_commit = %settings.synchronous_commit,
            durable,
            "postgres durability"
        );
        let mut caps = Capabilities::default();
        caps.backend = BACKEND;
        caps.fencing = if durable {
            Fencing::Durable
        } else {
            Fencing::Volatile
        };
        caps.expires = true;
        caps.min_ttl = Duration::from_millis(1);
        caps.ttl_granularity = Duration::from_millis(1);
        caps.holder_info = true;
        caps.keep_for = true;
        caps.release_notification = !config.transaction_pooler;
        caps.max_renew_batch = MAX_RENEW_BATCH;
        let releases = Releases::new(&pool, table.payload_prefix());
        let renewals = pool_options(RENEWAL_CONNECTIONS, config.call_timeout)
            .min_connections(1)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        // Opened now: the first renewal must not pay a connect (a TLS handshake, the
        // password's hashing) inside the lease's deadline.
        drop(bounded_call(BACKEND, "connect", config.call_timeout, renewals.acquire()).await?);
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                sql: Statements::new(&table),
                pool,
                renewals,
                table,
                call_timeout: config.call_timeout,
                releases,
                pooler: config.transaction_pooler,
                caps,
            }),
        })
    }

    /// The pool (for your own queries against the same database).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The acquire and release (keep-for) statements, for the benchmark's diagnostic row
    /// that sends them without the library around them. Not part of the API.
    #[doc(hidden)]
    pub fn cycle_statements(&self) -> (&str, &str) {
        (&self.inner.sql.acquire, &self.inner.sql.release)
    }

    /// The lock table, schema-qualified and unquoted (`public.lease_locks` by default).
    pub fn table(&self) -> &str {
        self.inner.table.plain()
    }

    /// Creates the table (and schema) if missing. Idempotent, and safe when many
    /// instances start at once: the DDL runs in a transaction that first takes a
    /// transaction-level advisory lock, so concurrent creators queue instead of racing in
    /// the catalog.
    ///
    /// Cancel safety: cancel-safe: dropped, the table creation is rolled back or has
    /// committed (it is idempotent; call again); no lease is taken.
    pub async fn create_schema(&self) -> Result<()> {
        create_schema_in(&self.inner.pool, &self.inner.table, self.inner.call_timeout).await
    }

    /// Runs `fut` bounded by the call timeout, converting errors.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        bounded_call(BACKEND, operation, self.inner.call_timeout, fut).await
    }

    /// [`Self::bounded`] for a call that is safe to send again (renew, release, inspect,
    /// force release): when it fails because its pooled connection was closed (the
    /// server restarted or failed over, an administrator or a pooler ended the session,
    /// a firewall dropped it), it is sent again on another connection, within the same
    /// deadline, as many times as the pool may hold closed connections plus one. The pool
    /// does not test connections before handing them out (that would cost a round trip
    /// per call), so after a restart each of its connections would otherwise fail one call.
    async fn bounded_retry<T, F, Fut>(&self, operation: &'static str, call: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        let after = self.inner.call_timeout;
        let deadline = tokio::time::Instant::now() + client_bound(after);
        let attempts = self
            .inner
            .pool
            .options()
            .get_max_connections()
            .saturating_add(1);
        let mut attempt = 1;
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if attempt < attempts && connection_closed(&e) => {
                    tracing::debug!(operation, error = %e, attempt, "postgres connection closed; sending again");
                    attempt += 1;
                }
                Ok(Err(e)) => return Err(convert(BACKEND, operation, after, e)),
                Err(_) => return Err(Error::Timeout { operation, after }),
            }
        }
    }

    /// Runs `sql` with `params` written in (see [`inline`]) as one simple query: the
    /// statement form behind a transaction pooler. `idempotent`: sent again on a closed
    /// connection (see [`Self::bounded_retry`]).
    async fn inline_rows(
        &self,
        pool: &PgPool,
        operation: &'static str,
        sql: &str,
        params: &[Param<'_>],
        idempotent: bool,
    ) -> Result<Vec<PgRow>> {
        let text = inline::inline(sql, params);
        if idempotent {
            let text = &text;
            self.bounded_retry(operation, || {
                sqlx::raw_sql(AssertSqlSafe(text.clone())).fetch_all(pool)
            })
            .await
        } else {
            self.bounded(operation, async move {
                sqlx::raw_sql(AssertSqlSafe(text)).fetch_all(pool).await
            })
            .await
        }
    }

    /// Runs `sql` as [`Self::inline_rows`] does, for its row count; always idempotent.
    async fn inline_execute(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64> {
        let text = inline::inline(sql, params);
        let pool = &self.inner.pool;
        let text = &text;
        self.bounded_retry(operation, || {
            sqlx::raw_sql(AssertSqlSafe(text.clone())).execute(pool)
        })
        .await
        .map(|r| r.rows_affected())
    }

    /// The acquire statement on a given connection (for tests that run it inside an
    /// open transaction). Not part of the API.
    ///
    /// Cancel safety: as for `LeaseBackend::acquire`: dropped after the statement was sent,
    /// it may have taken the lease; the caller's transaction decides whether it stays.
    #[doc(hidden)]
    pub async fn acquire_on(
        &self,
        conn: &mut PgConnection,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        self.acquire_with(conn, name, owner, ttl).await
    }

    async fn acquire_with<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let ttl_ms = checked_ms("ttl", ttl)?;
        let row: AcquireRow = self
            .bounded(
                "acquire",
                sqlx::query_as(AssertSqlSafe(self.inner.sql.acquire.clone()))
                    .bind(name.as_bytes())
                    .bind(owner.token.as_uuid())
                    .bind(owner.label.as_str())
                    .bind(ttl_ms)
                    .fetch_one(executor),
            )
            .await?;
        acquire_outcome(name, ttl_ms, row)
    }

    /// Acquire as one simple query (behind a transaction pooler).
    async fn acquire_inline(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        const OP: &str = "acquire";
        let ttl_ms = checked_ms("ttl", ttl)?;
        let rows = self
            .inline_rows(
                &self.inner.pool,
                OP,
                &self.inner.sql.acquire,
                &[
                    Param::Bytea(name.as_bytes()),
                    Param::Uuid(owner.token.as_uuid()),
                    Param::Text(owner.label.as_str()),
                    Param::Int(ttl_ms),
                ],
                false,
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::unexpected(BACKEND, "acquire: no row"))?;
        let decoded: AcquireRow = (
            column(row, 0, OP)?,
            column(row, 1, OP)?,
            column(row, 2, OP)?,
            column(row, 3, OP)?,
        );
        acquire_outcome(name, ttl_ms, decoded)
    }

    /// Whether `name` is held right now (unexpired on the server's clock).
    async fn add_waiter(&self, name: &LeaseName, delta: i32) -> Result<()> {
        self.bounded(
            "wait_released",
            sqlx::query(AssertSqlSafe(self.inner.sql.waiters.clone()))
                .bind(name.as_bytes())
                .bind(delta)
                .execute(&self.inner.pool),
        )
        .await?;
        Ok(())
    }

    async fn is_live(&self, name: &LeaseName) -> Result<Option<Duration>> {
        Ok(self.inspect(name).await?.and_then(|i| i.remaining))
    }
}

/// The outcome of an acquire from its row.
fn acquire_outcome(name: &LeaseName, ttl_ms: i64, row: AcquireRow) -> Result<AcquireOutcome> {
    match row {
        (true, fencing, _, _) => {
            let fencing = u64::try_from(fencing).map_err(|_| {
                Error::unexpected(BACKEND, format!("negative fencing token {fencing}"))
            })?;
            tracing::debug!(lease = %name, fencing, "acquired");
            Ok(AcquireOutcome::Acquired {
                fencing: FencingToken(fencing),
                ttl: Duration::from_millis(ttl_ms.unsigned_abs()),
            })
        }
        (false, _, holder, remaining_us) => {
            tracing::debug!(lease = %name, holder = holder.as_deref(), "held");
            Ok(AcquireOutcome::Held(HeldBy {
                holder,
                // Not positive: it lapsed between the decision and the reply.
                remaining: u64::try_from(remaining_us)
                    .ok()
                    .filter(|us| *us > 0)
                    .map(Duration::from_micros),
            }))
        }
    }
}

/// Whether `e` says the call's connection was closed (so the call never ran on it, or
/// its outcome is unknown and the call is safe to repeat): an I/O error, or the server
/// ending the session (`57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot
/// connect now, class `08` connection exceptions other than a refused startup packet).
fn connection_closed(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            matches!(code, "57P01" | "57P02" | "57P03")
                || (code.starts_with("08") && code != "08P01")
        }
        _ => false,
    }
}

/// Column `i` of a row of a simple query, decoded as `T`.
fn column<'r, T>(row: &'r PgRow, i: usize, operation: &'static str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<T, _>(i)
        .map_err(|e| Error::unexpected(BACKEND, format!("{operation}: column {i}: {e}")))
}

/// `d` in whole milliseconds, rounded up (the granularity of this backend).
pub(crate) fn millis_ceil(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// `d` in milliseconds, rejecting zero TTLs and anything above [`MAX_TTL`].
fn checked_ms(what: &'static str, d: Duration) -> std::result::Result<i64, InvalidInput> {
    if what == "ttl" && d.is_zero() {
        return Err(InvalidInput::TtlZero);
    }
    if d > MAX_TTL {
        return Err(InvalidInput::TooLarge {
            what,
            value: d,
            max: MAX_TTL,
        });
    }
    Ok(millis_ceil(d))
}

#[async_trait::async_trait]
impl LeaseBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        if self.inner.pooler {
            return self.acquire_inline(name, owner, ttl).await;
        }
        self.acquire_with(&self.inner.pool, name, owner, ttl).await
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
        let ttl_ms = checked_ms("ttl", ttl)?;
        // Deduplicate (name, token) pairs: an UPDATE ... FROM joins each row at most once,
        // so a duplicate pair would otherwise get no answer of its own.
        let mut slot_of: HashMap<(&[u8], uuid::Uuid), usize> = HashMap::new();
        let mut names: Vec<&[u8]> = Vec::new();
        let mut tokens: Vec<uuid::Uuid> = Vec::new();
        let slots: Vec<usize> = leases
            .iter()
            .map(|item| {
                let key = (item.name.as_bytes(), item.token.as_uuid());
                *slot_of.entry(key).or_insert_with(|| {
                    names.push(key.0);
                    tokens.push(key.1);
                    names.len() - 1
                })
            })
            .collect();
        let renewed: Vec<i64> = if self.inner.pooler {
            let rows = self
                .inline_rows(
                    &self.inner.renewals,
                    "renew",
                    &self.inner.sql.renew,
                    &[
                        Param::ByteaArray(&names),
                        Param::UuidArray(&tokens),
                        Param::Int(ttl_ms),
                    ],
                    true,
                )
                .await?;
            rows.iter()
                .map(|r| column(r, 0, "renew"))
                .collect::<Result<_>>()?
        } else {
            let (names, tokens) = (&names, &tokens);
            self.bounded_retry("renew", || {
                sqlx::query_scalar(AssertSqlSafe(self.inner.sql.renew.clone()))
                    .bind(names)
                    .bind(tokens)
                    .bind(ttl_ms)
                    .fetch_all(&self.inner.renewals)
            })
            .await?
        };
        let mut ok = vec![false; names.len()];
        for ordinal in renewed {
            let slot = usize::try_from(ordinal - 1)
                .ok()
                .filter(|s| *s < ok.len())
                .ok_or_else(|| {
                    Error::unexpected(BACKEND, format!("renew returned ordinal {ordinal}"))
                })?;
            ok[slot] = true;
        }
        let outcomes: Vec<RenewOutcome> = slots
            .iter()
            .map(|s| {
                if ok[*s] {
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::Lost
                }
            })
            .collect();
        tracing::trace!(
            batch = leases.len(),
            renewed = outcomes
                .iter()
                .filter(|o| **o == RenewOutcome::Renewed)
                .count(),
            "renewed"
        );
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
        let keep_ms = checked_ms("keep_for", keep_for)?;
        // One row when this owner held the lease (executed, not fetched: the row's
        // contents are not needed, only whether there is one).
        let done = if self.inner.pooler {
            self.inline_execute(
                "release",
                &self.inner.sql.release,
                &[
                    Param::Bytea(name.as_bytes()),
                    Param::Uuid(token.as_uuid()),
                    Param::Int(keep_ms),
                ],
            )
            .await?
        } else {
            self.bounded_retry("release", || {
                sqlx::query(AssertSqlSafe(self.inner.sql.release.clone()))
                    .bind(name.as_bytes())
                    .bind(token.as_uuid())
                    .bind(keep_ms)
                    .execute(&self.inner.pool)
            })
            .await?
            .rows_affected()
        };
        Ok(match done {
            0 => {
                tracing::debug!(lease = %name, "release by a non-owner: nothing changed");
                ReleaseOutcome::NotOwner
            }
            _ => {
                tracing::debug!(lease = %name, keep_for_ms = keep_ms, "released");
                ReleaseOutcome::Released
            }
        })
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let row: Option<(Option<String>, i64, i64)> = if self.inner.pooler {
            const OP: &str = "inspect";
            let rows = self
                .inline_rows(
                    &self.inner.pool,
                    OP,
                    &self.inner.sql.inspect,
                    &[Param::Bytea(name.as_bytes())],
                    true,
                )
                .await?;
            match rows.first() {
                None => None,
                Some(r) => Some((column(r, 0, OP)?, column(r, 1, OP)?, column(r, 2, OP)?)),
            }
        } else {
            self.bounded_retry("inspect", || {
                sqlx::query_as(AssertSqlSafe(self.inner.sql.inspect.clone()))
                    .bind(name.as_bytes())
                    .fetch_optional(&self.inner.pool)
            })
            .await?
        };
        row.map(|(holder, fencing, remaining_us)| {
            let fencing = u64::try_from(fencing).map_err(|_| {
                Error::unexpected(BACKEND, format!("negative fencing token {fencing}"))
            })?;
            Ok(LeaseInfo {
                holder,
                fencing: Some(FencingToken(fencing)),
                remaining: Some(Duration::from_micros(remaining_us.max(1).unsigned_abs())),
            })
        })
        .transpose()
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let freed = if self.inner.pooler {
            !self
                .inline_rows(
                    &self.inner.pool,
                    "force release",
                    &self.inner.sql.force_release,
                    &[Param::Bytea(name.as_bytes())],
                    true,
                )
                .await?
                .is_empty()
        } else {
            let row: Option<Option<bool>> = self
                .bounded_retry("force release", || {
                    sqlx::query_scalar(AssertSqlSafe(self.inner.sql.force_release.clone()))
                        .bind(name.as_bytes())
                        .fetch_optional(&self.inner.pool)
                })
                .await?;
            row.is_some()
        };
        tracing::info!(lease = %name, freed, "force release");
        Ok(freed)
    }

    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        if self.inner.pooler {
            // LISTEN needs a session of its own, which a transaction pooler does not give.
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "release notification behind a transaction pooler",
            });
        }
        let releases = &self.inner.releases;
        let (mut events, fresh) = match releases.listening() {
            Listening::Ready { events, fresh } => (events, fresh),
            Listening::NotReady => {
                // Starting (or reconnecting): wait for it briefly, then let the caller
                // retry `acquire`, which sees any release that happened meanwhile.
                releases
                    .wait_ready(max_wait.min(self.inner.call_timeout))
                    .await;
                return Ok(());
            }
        };
        let _ = fresh;
        // Register as a waiter (releases notify only when someone waits), then look
        // again: a release that committed before the registration was not announced.
        self.add_waiter(name, 1).await?;
        let registered = WaiterGuard {
            backend: self.clone(),
            name: name.clone(),
        };
        if self.is_live(name).await?.is_none() {
            drop(registered);
            return Ok(());
        }
        let wait = async {
            loop {
                match events.recv().await {
                    Ok(Event::Released(n)) if *n == *name.as_bytes() => return,
                    Ok(Event::Released(_)) => continue,
                    // Missed notifications (lagged, reconnecting) or the listener stopped:
                    // return early and let the caller look.
                    Ok(Event::Reset) | Err(_) => return,
                }
            }
        };
        let _ = tokio::time::timeout(max_wait, wait).await;
        drop(registered);
        Ok(())
    }
}

/// Unregisters a waiter when the wait ends (also when the wait is cancelled): in the
/// background, best effort.
struct WaiterGuard {
    backend: PostgresBackend,
    name: LeaseName,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let (backend, name) = (self.backend.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = backend.add_waiter(&name, -1).await {
                    tracing::debug!(lease = %name, error = %e, "could not unregister a waiter");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_own_parameters_out_of_the_url() {
        let (url, own) = split_own_params(
            "postgres://u:pw@h/db?sslmode=disable&pooler=transaction&table=ops.locks&create_table=false",
        )
        .unwrap();
        assert_eq!(url, "postgres://u:pw@h/db?sslmode=disable");
        assert!(own.pooler);
        assert_eq!(own.table.as_deref(), Some("ops.locks"));
        assert_eq!(own.create_table, Some(false));
        let (url, own) = split_own_params("postgres://h/db?pooler=session").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert!(!own.pooler);
        let (url, own) = split_own_params("postgres://h/db").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert!(!own.pooler && own.table.is_none() && own.create_table.is_none());
        let e = split_own_params("postgres://u:secret@h/db?pooler=yes").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("transaction"), "{e}");
        let e = split_own_params("postgres://u:secret@h/db?create_table=maybe").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    /// Issue 31, finding 4: a password with an unencoded '/', '?' or '#' was cut there by
    /// the driver and printed in its "invalid port number" error.
    #[test]
    fn passwords_with_reserved_characters_are_refused_unshown() {
        for (url, secret) in [
            ("postgres://u:pg/w0rd@h:5432/db", "w0rd"),
            ("postgresql://u:pg?w0rd#x@h/db?pooler=transaction", "w0rd"),
            ("postgres://u:pg#w0rd@h1,h2/db", "w0rd"),
        ] {
            let e = split_own_params(url).unwrap_err();
            assert!(matches!(e, InvalidInput::MalformedUrl(_)), "{url}: {e:?}");
            assert!(!e.to_string().contains(secret), "{url}: {e}");
            assert!(e.to_string().contains("percent-encode"), "{url}: {e}");
        }
        // Percent-encoded, the same password is fine; '@' needs no encoding.
        for url in ["postgres://u:pg%2Fw0rd@h:5432/db", "postgres://u:p@ss@h/db"] {
            let (url, _) = split_own_params(url).unwrap();
            let tls = TlsFiles::default();
            assert!(connect_options(&url, Duration::from_secs(1), false, &tls).is_ok());
        }
    }

    #[test]
    fn tls_files_set_verify_full_unless_the_url_sets_a_mode() {
        use sqlx::postgres::PgSslMode;
        let tls = TlsFiles::default().with_ca("/ca.pem");
        let full = connect_options("postgres://h/db", Duration::from_secs(1), false, &tls).unwrap();
        assert!(matches!(full.get_ssl_mode(), PgSslMode::VerifyFull));
        let ca = connect_options(
            "postgres://h/db?sslmode=verify-ca",
            Duration::from_secs(1),
            false,
            &tls,
        )
        .unwrap();
        assert!(matches!(ca.get_ssl_mode(), PgSslMode::VerifyCa));
        let twice = connect_options(
            "postgres://u:secret@h/db?sslrootcert=/other.pem",
            Duration::from_secs(1),
            false,
            &tls,
        )
        .unwrap_err();
        assert!(twice.to_string().contains("given twice"), "{twice}");
        assert!(!twice.to_string().contains("secret"), "{twice}");
    }
}
