//! [`PostgresBackend`], the table mode: its statements' calls and outcomes, and the
//! [`LeaseBackend`] implementation.

use super::*;

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
/// the first time a connection runs it.)
///
/// On a pool the backend built itself ([`PostgresBackend::connect`], `connect_with`; not
/// behind a transaction pooler), a statement that ended well keeps its connection for
/// the backend's next statement instead of giving it back to the pool, which pings every
/// connection that comes back (one more round trip per statement, for the client and the
/// server). A connection unused for [`KEEP_IDLE`](crate::KEEP_IDLE) or first kept
/// [`KEEP_AT_MOST`](crate::KEEP_AT_MOST) ago goes back to the pool, and so does one whose
/// statement failed or was dropped; the pool's own checks then apply. A backend on a
/// pool of the caller's ([`PostgresBackend::from_pool`]) gives every connection back.
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    /// A pool of its own for renewals (at most two connections, one kept open), so that
    /// a renewal never waits for a pooled connection behind a flood of acquisitions: a
    /// holder's lease must not lapse because others are trying to take it.
    pub(crate) renewals: PgPool,
    pub(crate) table: TableName,
    pub(crate) request_timeout: Duration,
    pub(crate) sql: Statements,
    pub(crate) releases: Releases,
    /// Behind a transaction pooler: statements as simple queries, no `LISTEN`.
    pub(crate) pooler: bool,
    /// Connections kept between statements (only on a pool the backend built).
    pub(crate) idle: Option<IdleList<PoolConnection<Postgres>>>,
    pub(crate) caps: Capabilities,
}

impl fmt::Debug for PostgresBackend {
    // Neither the pool's connect options nor anything else that could hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.table.plain())
            .field("request_timeout", &self.inner.request_timeout)
            .field("pool_size", &self.inner.pool.size())
            .field("transaction_pooler", &self.inner.pooler)
            .field("fencing", &self.inner.caps.fencing)
            .finish_non_exhaustive()
    }
}

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
            config.create_table = create;
        }
        config.validate()?;
        // The certificate and key files must be there and be PEM: say which one is not,
        // before the driver tries them on every connection.
        config.tls.load(BACKEND)?;
        let options = connect_options(
            &url,
            config.request_timeout,
            config.transaction_pooler,
            &config.tls,
        )?;
        let pool =
            pool_options(config.max_connections, config.request_timeout).connect_lazy_with(options);
        Self::build(pool, config, true).await
    }

    /// Uses an existing pool. The pool's own settings apply (this crate's pools set
    /// `statement_timeout` and an acquire timeout; yours should bound both too); every
    /// call is additionally bounded by `config.request_timeout` on the client. Behind a
    /// transaction pooler, set [`PostgresConfig::transaction_pooler`] and give the pool
    /// no statement cache (`statement_cache_capacity(0)`) and no startup `options`.
    ///
    /// Creates the table if `config.create_table` is set, then reads the server's
    /// durability settings (unless [`PostgresConfig::persistent_fencing`] says).
    ///
    /// Cancel safety: cancel-safe: dropped, the table creation is rolled back or has
    /// committed (it is idempotent; call again); no lease is taken.
    pub async fn from_pool(pool: PgPool, config: PostgresConfig) -> Result<Self> {
        Self::build(pool, config, false).await
    }

    async fn build(pool: PgPool, config: PostgresConfig, keep_connections: bool) -> Result<Self> {
        let table = config.validate()?;
        crate::tls::ensure_crypto_provider_for(&pool);
        if config.create_table {
            create_schema_in(&pool, &table, config.request_timeout).await?;
        }
        // Also the first contact when the schema is not created here: a wrong address
        // or credentials fail now.
        let settings = session_settings(BACKEND, &pool, config.request_timeout).await?;
        let expected = millis_ceil(config.request_timeout);
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
        let caps = Capabilities::new(BACKEND)
            .with_fencing(if durable {
                Fencing::Durable
            } else {
                Fencing::Volatile
            })
            .with_release_notification(!config.transaction_pooler)
            .with_max_renew_batch(MAX_RENEW_BATCH);
        let releases = Releases::new(&pool, table.payload_prefix());
        let renewals = pool_options(RENEWAL_CONNECTIONS, config.request_timeout)
            .min_connections(1)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        // Opened now: the first renewal must not pay a connect (a TLS handshake, the
        // password's hashing) inside the lease's deadline.
        drop(
            bounded_call(
                BACKEND,
                "connect",
                config.request_timeout,
                renewals.acquire(),
            )
            .await?,
        );
        let idle = (keep_connections && !config.transaction_pooler).then(|| {
            IdleList::new(
                usize::try_from(config.max_connections).unwrap_or(usize::MAX),
                KEEP_IDLE,
                KEEP_AT_MOST,
            )
        });
        let inner = Arc::new(Inner {
            sql: Statements::new(&table),
            pool,
            renewals,
            table,
            request_timeout: config.request_timeout,
            releases,
            pooler: config.transaction_pooler,
            idle,
            caps,
        });
        if inner.idle.is_some() {
            // Gives back the connections nobody took again within KEEP_IDLE.
            idle::sweep(Arc::downgrade(&inner), |i| i.idle.as_ref(), KEEP_IDLE);
        }
        Ok(PostgresBackend { inner })
    }

    /// A connection for one statement: the one the backend's last statement kept, or
    /// one from the pool ([`IdleList::checkout`]). Cancel safe: a dropped call has taken
    /// nothing, or drops what it took back into the pool.
    pub(crate) async fn connection(
        &self,
    ) -> std::result::Result<Checkout<'_, PoolConnection<Postgres>>, sqlx::Error> {
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

    /// The pool (for your own queries against the same database). Connections the backend
    /// keeps between its statements (see [`PostgresBackend`]) count as taken from it until
    /// they go back, at most about two [`KEEP_IDLE`](crate::KEEP_IDLE) after their last
    /// statement: while the backend's statements keep coming, a query of your own on a
    /// full pool waits for a connection the pool holds (or opens), not for one the
    /// backend keeps.
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
    pub async fn create_table(&self) -> Result<()> {
        create_schema_in(
            &self.inner.pool,
            &self.inner.table,
            self.inner.request_timeout,
        )
        .await
    }

    /// Runs `fut` bounded by the call timeout, converting errors ([`bounded_call`]; not
    /// an `async fn`, for the reason given there).
    pub(crate) fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> impl Future<Output = Result<T>> {
        bounded_call(BACKEND, operation, self.inner.request_timeout, fut)
    }

    /// [`Self::bounded`] for a call that is safe to send again (renew, release, inspect,
    /// force release): when it fails because its pooled connection was closed (the
    /// server restarted or failed over, an administrator or a pooler ended the session,
    /// a firewall dropped it), it is sent again on another connection, within the same
    /// deadline, as many times as the pool may hold closed connections plus one. The pool
    /// does not test connections before handing them out (that would cost a round trip
    /// per call), so after a restart each of its connections would otherwise fail one call.
    pub(crate) async fn bounded_retry<T, F, Fut>(
        &self,
        operation: &'static str,
        call: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        let after = self.inner.request_timeout;
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
    pub(crate) async fn inline_rows(
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
    pub(crate) async fn inline_execute(
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

    pub(crate) async fn acquire_with<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let ttl_ms = checked_ms("ttl", ttl)?;
        let row = self
            .bounded("acquire", self.acquire_row(executor, name, owner, ttl_ms))
            .await?;
        acquire_outcome(name, ttl_ms, row)
    }

    /// The acquire statement's one row, on `executor`.
    async fn acquire_row<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        name: &LeaseName,
        owner: &Owner,
        ttl_ms: i64,
    ) -> std::result::Result<AcquireRow, sqlx::Error> {
        sqlx::query_as(AssertSqlSafe(self.inner.sql.acquire.clone()))
            .bind(name.as_bytes())
            .bind(owner.token.as_uuid())
            .bind(owner.label.as_str())
            .bind(ttl_ms)
            .fetch_one(executor)
            .await
    }

    /// Acquire as one simple query (behind a transaction pooler).
    pub(crate) async fn acquire_inline(
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
    pub(crate) async fn add_waiter(&self, name: &LeaseName, delta: i32) -> Result<()> {
        self.bounded("wait_released", async {
            let mut conn = self.connection().await?;
            let done = sqlx::query(AssertSqlSafe(self.inner.sql.waiters.clone()))
                .bind(name.as_bytes())
                .bind(delta)
                .execute(&mut **conn.get_mut())
                .await;
            conn.done(&done);
            done
        })
        .await?;
        Ok(())
    }

    pub(crate) async fn is_live(&self, name: &LeaseName) -> Result<Option<Duration>> {
        Ok(self.inspect(name).await?.and_then(|i| i.remaining))
    }
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
        let ttl_ms = checked_ms("ttl", ttl)?;
        let row = self
            .bounded("acquire", async {
                let mut conn = self.connection().await?;
                let row = self
                    .acquire_row(&mut **conn.get_mut(), name, owner, ttl_ms)
                    .await;
                conn.done(&row);
                row
            })
            .await?;
        acquire_outcome(name, ttl_ms, row)
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
            self.bounded_retry("release", || async {
                let mut conn = self.connection().await?;
                let done = sqlx::query(AssertSqlSafe(self.inner.sql.release.clone()))
                    .bind(name.as_bytes())
                    .bind(token.as_uuid())
                    .bind(keep_ms)
                    .execute(&mut **conn.get_mut())
                    .await;
                conn.done(&done);
                done
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
            self.bounded_retry("inspect", || async {
                let mut conn = self.connection().await?;
                let row = sqlx::query_as(AssertSqlSafe(self.inner.sql.inspect.clone()))
                    .bind(name.as_bytes())
                    .fetch_optional(&mut **conn.get_mut())
                    .await;
                conn.done(&row);
                row
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
                .bounded_retry("force release", || async {
                    let mut conn = self.connection().await?;
                    let row =
                        sqlx::query_scalar(AssertSqlSafe(self.inner.sql.force_release.clone()))
                            .bind(name.as_bytes())
                            .fetch_optional(&mut **conn.get_mut())
                            .await;
                    conn.done(&row);
                    row
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
                    .wait_ready(max_wait.min(self.inner.request_timeout))
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
pub(crate) struct WaiterGuard {
    pub(crate) backend: PostgresBackend,
    pub(crate) name: LeaseName,
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
