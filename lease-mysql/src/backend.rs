//! [`MysqlBackend`]: connecting, its pools, the bound of every call, and the
//! [`LeaseBackend`] implementation.

use super::*;

/// A lease store on a MySQL (8.0 and later) or MariaDB (10.6 and later) table.
///
/// Renewals go through a pool of their own (up to two connections, one kept open, built
/// from the main pool's connect options), so that a renewal never waits for a pooled
/// connection behind acquisitions or the application's own queries: the server sees up
/// to `max_connections + 2` connections from one backend. Clones share both pools.
///
/// On a pool the backend built itself ([`MysqlBackend::connect`], `connect_with`), a
/// statement that ended well keeps its connection for the backend's next statement
/// instead of giving it back to the pool, which pings every connection that comes back
/// (one more round trip per statement, for the client and the server). A connection
/// unused for [`KEEP_IDLE`] or first kept [`KEEP_AT_MOST`] ago goes back to the pool, and
/// so does one whose statement failed or was dropped; the pool's own checks then apply.
/// While kept, a connection counts as taken from [`MysqlBackend::pool`]. A backend on a
/// pool of the caller's ([`MysqlBackend::from_pool`]) gives every connection back.
#[derive(Clone)]
pub struct MysqlBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: MySqlPool,
    /// Connections kept between statements (only on a pool the backend built).
    pub(crate) idle: Option<IdleList<PoolConnection<MySql>>>,
    /// A pool of its own for renewals (at most two connections, one kept open), so that
    /// a renewal never waits for a pooled connection behind a flood of acquisitions: a
    /// holder's lease must not lapse because others are trying to take it.
    pub(crate) renewals: MySqlPool,
    pub(crate) sql: Statements,
    pub(crate) table: TableName,
    pub(crate) caps: Capabilities,
    pub(crate) request_timeout: Duration,
    pub(crate) server: String,
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
    /// let config = MysqlConfig::default().with_tls(
    ///     TlsFiles::default()
    ///         .with_ca("/etc/lease/ca.pem")
    ///         .with_client("/etc/lease/client.pem", "/etc/lease/client.key"),
    /// );
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
        if url_tls.verify_ca {
            crate::tls::ensure_crypto_provider();
        }
        // UTC sessions (the driver's default too). The lock statements read
        // UTC_TIMESTAMP(6) and do not depend on it; it keeps the session's NOW() in the
        // table's zone for anyone reading the pool's connections.
        let options = options.timezone(Some("+00:00".to_owned()));
        // No ping before each checkout (sqlx's default): it is a round trip per statement.
        // A connection the server closed fails its call instead, which is sent again on
        // another where that is safe (`call_again`).
        let pool = MySqlPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.request_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        let server = lease_core::redact_url(&driver_url);
        Self::build(pool, config, server, true).await
    }

    /// A backend on a pool of your own. Its sessions may use any time zone: the
    /// statements read the time with `UTC_TIMESTAMP(6)` and the table holds UTC, so the
    /// pool agrees with backends on other pools whatever their zones (a zone with
    /// daylight saving included). The pool's options carry its TLS
    /// settings: a non-empty [`MysqlConfig::tls`] is an [`Error::InvalidInput`] here.
    /// With `ssl_mode(VerifyCa)` in those options the driver needs rustls's process-wide
    /// crypto provider: install one before connecting (the URL path does that itself).
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
        Self::build(pool, config, "(a pool of the caller's)".into(), false).await
    }

    pub(crate) async fn build(
        pool: MySqlPool,
        config: MysqlConfig,
        server: String,
        keep_connections: bool,
    ) -> Result<Self> {
        let table = config.validate()?;
        let timeout = config.request_timeout;
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
        let caps = Capabilities::new(BACKEND)
            .with_fencing(if durable {
                Fencing::Durable
            } else {
                Fencing::Volatile
            })
            .with_ttl_granularity(Duration::from_micros(1))
            .with_max_renew_batch(MAX_RENEW_BATCH);
        tracing::debug!(%server, %version, innodb_flush_log_at_trx_commit = flush, "mysql backend ready");
        // Renewals of one heartbeat go one batch at a time: two connections serve two
        // clients on one backend without waiting.
        let renewals = MySqlPoolOptions::new()
            .max_connections(2)
            .min_connections(1)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        // Opened now: the first renewal must not pay a connect (a TLS handshake, the
        // password's hashing) inside the lease's deadline.
        drop(bounded("connect", timeout, renewals.acquire()).await?);
        let idle = keep_connections.then(|| {
            IdleList::new(
                usize::try_from(config.max_connections).unwrap_or(usize::MAX),
                KEEP_IDLE,
                KEEP_AT_MOST,
            )
        });
        let inner = Arc::new(Inner {
            pool,
            idle,
            renewals,
            sql: Statements::new(&table),
            table,
            caps,
            request_timeout: timeout,
            server,
        });
        if inner.idle.is_some() {
            // Gives back the connections nobody took again within KEEP_IDLE.
            idle::sweep(Arc::downgrade(&inner), |i| i.idle.as_ref(), KEEP_IDLE);
        }
        Ok(MysqlBackend { inner })
    }

    /// A connection for one statement: the one the backend's last statement kept, or
    /// one from the pool. Cancel safe: a dropped call leaves the connection with the
    /// pool (if it was taken from there) or drops it back into the pool.
    pub(crate) async fn connection(
        &self,
    ) -> std::result::Result<Checkout<'_, PoolConnection<MySql>>, sqlx::Error> {
        let pool = &self.inner.pool;
        let max = pool.options().get_max_connections();
        IdleList::checkout_from(
            self.inner.idle.as_ref(),
            || pool.try_acquire(),
            || pool.size() < max,
            // Boxed: the pool's checkout future is several KiB, and inline it would be
            // copied with every future that holds this one (the statement's, the
            // timeout's, the trait's box) on every call, though only a call that finds
            // no kept connection runs it.
            || Box::pin(pool.acquire()),
        )
        .await
    }

    /// The pool. Connections the backend keeps between its statements (see
    /// [`MysqlBackend`]) count as taken from it until they go back, at most about two
    /// [`KEEP_IDLE`] after their last statement: while the backend's statements keep
    /// coming, a query of your own on a full pool waits for a connection the pool holds
    /// (or opens), not for one the backend keeps.
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

    /// [`bounded`] with this backend's call timeout (not an `async fn`, for the reason
    /// given there).
    pub(crate) fn call<T, F>(
        &self,
        operation: &'static str,
        fut: F,
    ) -> impl Future<Output = Result<T>>
    where
        F: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        bounded(operation, self.inner.request_timeout, fut)
    }

    /// [`Self::call`] for a call that is safe to send again (renew, release, inspect,
    /// force release): when it fails because its pooled connection was closed (the
    /// server restarted, an administrator or `wait_timeout` ended the session), it is sent
    /// again on another connection, within the same deadline, as many times as `pool`
    /// may hold closed connections plus one. The pools this crate builds do not ping a
    /// connection before handing it out (a round trip per call), so after a restart each
    /// of their connections would otherwise fail one call. Acquire is not sent again:
    /// if the lost reply was a success, a second run would find the lease held by its
    /// own owner. A release (or force release) whose first run applied but whose reply
    /// was lost with its connection reports `NotOwner` (`false`) on the second run: the
    /// lease is free either way (PostgreSQL's backend has the same gap).
    pub(crate) async fn call_again<T, F, Fut>(
        &self,
        operation: &'static str,
        pool: &MySqlPool,
        call: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        let after = self.inner.request_timeout;
        let deadline = tokio::time::Instant::now() + after;
        let attempts = pool.options().get_max_connections().saturating_add(1);
        let mut attempt = 1;
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if attempt < attempts && connection_closed(&e) => {
                    tracing::debug!(operation, error = %e, attempt, "mysql connection closed; sending again");
                    attempt += 1;
                }
                Ok(Err(e)) => return Err(convert(operation, after, e)),
                Err(_) => return Err(Error::Timeout { operation, after }),
            }
        }
    }

    pub(crate) async fn held_by(&self, name: &LeaseName) -> Result<HeldBy> {
        Ok(match self.inspect(name).await? {
            Some(info) => HeldBy {
                holder: info.holder,
                remaining: info.remaining,
            },
            None => HeldBy::default(),
        })
    }
}

/// Runs `fut` within `after`, converting its error; [`Error::Timeout`] when `after` runs
/// out. Where the caller drops the call no later (a `LeaseClient`'s call timeout,
/// [`lease_core::raw::deadline::within`]), no timer of the backend's own is set.
///
/// Not an `async fn`: one would hold `fut` twice (as its argument and inside the timer),
/// and every byte of a statement's future is copied each time a future holding it moves
/// (into the trait's box, for one). Cancel safety: as `fut`'s.
pub(crate) fn bounded<T, F>(
    operation: &'static str,
    after: Duration,
    fut: F,
) -> impl Future<Output = Result<T>>
where
    F: Future<Output = std::result::Result<T, sqlx::Error>>,
{
    use futures::FutureExt;
    lease_core::raw::deadline::within(tokio::time::Instant::now() + after, fut).map(
        move |r| match r {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(convert(operation, after, e)),
            None => Err(Error::Timeout { operation, after }),
        },
    )
}

/// `d` in whole microseconds, rounded up.
pub(crate) fn micros_ceil(what: &str, d: Duration) -> Result<u64> {
    let us = d.as_nanos().div_ceil(1_000);
    u64::try_from(us)
        .ok()
        .filter(|us| *us <= i64::MAX as u64)
        .ok_or_else(|| InvalidInput::Other(format!("{what} {d:?} is too large")).into())
}

pub(crate) fn remaining(us: i64) -> Duration {
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
            .call("acquire", async {
                let mut conn = self.connection().await?;
                let done = sqlx::query(AssertSqlSafe(self.inner.sql.acquire.as_str()))
                    .bind(name.as_bytes())
                    .bind(&owner.token.as_bytes()[..])
                    .bind(owner.label.as_str())
                    .bind(ttl_us)
                    .execute(&mut **conn.get_mut())
                    .await;
                conn.done(&done);
                done
            })
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
        let renewals = &self.inner.renewals;
        let rows = self
            .call_again("renew", renewals, || {
                sqlx::raw_sql(AssertSqlSafe(text.clone())).fetch_all(renewals)
            })
            .await?;
        let mut ok = vec![false; pairs.len()];
        for row in rows {
            let name: Vec<u8> = row
                .try_get(0)
                .map_err(|e| convert("renew", self.inner.request_timeout, e))?;
            let token: Vec<u8> = row
                .try_get(1)
                .map_err(|e| convert("renew", self.inner.request_timeout, e))?;
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
        let pool = &self.inner.pool;
        let done = self
            .call_again("release", pool, || async {
                let mut conn = self.connection().await?;
                let done = sqlx::query(AssertSqlSafe(self.inner.sql.release.as_str()))
                    .bind(keep_us)
                    .bind(name.as_bytes())
                    .bind(&token.as_bytes()[..])
                    .execute(&mut **conn.get_mut())
                    .await;
                conn.done(&done);
                done
            })
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
        let pool = &self.inner.pool;
        let row: Option<(Option<String>, u64, i64)> = self
            .call_again("inspect", pool, || async {
                let mut conn = self.connection().await?;
                let row = sqlx::query_as(AssertSqlSafe(self.inner.sql.inspect.as_str()))
                    .bind(name.as_bytes())
                    .fetch_optional(&mut **conn.get_mut())
                    .await;
                conn.done(&row);
                row
            })
            .await?;
        Ok(row.map(|(holder, fencing, us)| LeaseInfo {
            holder,
            fencing: Some(FencingToken(fencing)),
            remaining: Some(remaining(us)),
        }))
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let pool = &self.inner.pool;
        let done = self
            .call_again("force release", pool, || async {
                let mut conn = self.connection().await?;
                let done = sqlx::query(AssertSqlSafe(self.inner.sql.force_release.as_str()))
                    .bind(name.as_bytes())
                    .execute(&mut **conn.get_mut())
                    .await;
                conn.done(&done);
                done
            })
            .await?;
        tracing::info!(lease = %name, freed = done.rows_affected() > 0, "force release");
        Ok(done.rows_affected() > 0)
    }
}
