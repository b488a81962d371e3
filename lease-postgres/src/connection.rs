//! Connections, for both backends of this crate: connect options from a URL (TLS files,
//! `statement_timeout`, transaction poolers), the pools, the bound of every call, the
//! table's creation and the settings read at connect.

use super::*;

/// Parses a `postgres://` / `postgresql://` URL (without this crate's own parameters,
/// see [`split_own_params`]) into connect options: with `statement_timeout` set to
/// `request_timeout` in the startup parameters, or, behind a transaction pooler, with no
/// startup parameters a pooler refuses and no statement cache. `tls`'s files are added
/// (as `sslrootcert`, `sslcert`, `sslkey`); when any TLS file is given and neither the
/// URL nor `PGSSLMODE` sets `sslmode`, it is `verify-full`. Errors never contain the
/// password.
pub(crate) fn connect_options(
    url: &str,
    request_timeout: Duration,
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
    Ok(options.options([(
        "statement_timeout",
        millis_ceil(request_timeout).to_string(),
    )]))
}

/// The client-side bound of a call with call timeout `after`: a little beyond the pool's
/// acquire timeout and the server's `statement_timeout` (both `after`), so that their
/// more telling errors win the race.
pub(crate) fn client_bound(after: Duration) -> Duration {
    after + after / 4
}

/// Runs `fut` within [`client_bound`]`(after)`, converting its error for `backend`;
/// [`Error::Timeout`] when the bound runs out. Where the caller drops the call no later
/// (a `LeaseClient`'s call timeout, [`lease_core::raw::deadline::within`]), no timer of
/// the backend's own is set.
///
/// Not an `async fn`: one would hold `fut` twice (as its argument and inside the
/// timer), and every byte of a statement's future is copied each time a future holding
/// it moves (into the trait's box, for one). Cancel safety: as `fut`'s.
pub(crate) fn bounded_call<T>(
    backend: &'static str,
    operation: &'static str,
    after: Duration,
    fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> impl Future<Output = Result<T>> {
    use futures::FutureExt;
    let deadline = tokio::time::Instant::now() + client_bound(after);
    lease_core::raw::deadline::within(deadline, fut).map(move |r| match r {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(convert(backend, operation, after, e)),
        None => Err(Error::Timeout { operation, after }),
    })
}

/// [`PostgresBackend::create_table`] on `pool`, bounded by `request_timeout`.
pub(crate) async fn create_schema_in(
    pool: &PgPool,
    table: &TableName,
    request_timeout: Duration,
) -> Result<()> {
    // PostgreSQL checks the CREATE privilege before it honours IF NOT EXISTS: a role that
    // may only use the table would fail on the DDL. So look first (no privilege needed).
    let exists = sql::table_exists_sql(table);
    let found = bounded_call(
        BACKEND,
        "create schema",
        request_timeout,
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
    bounded_call(BACKEND, "create schema", request_timeout, run).await?;
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
    session: impl sqlx::Executor<'_, Database = sqlx::Postgres>,
    request_timeout: Duration,
) -> Result<SessionSettings> {
    const PROBE: &str = "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
         (SELECT setting FROM pg_settings WHERE name = 'statement_timeout')";
    let row = bounded_call(
        backend,
        "connect",
        request_timeout,
        sqlx::raw_sql(PROBE).fetch_one(session),
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
pub(crate) const RENEWAL_CONNECTIONS: u32 = 2;

/// The pool settings of the pools this crate builds: every acquisition (including
/// connecting) bounded; no extra round trip to test a connection before each call (a
/// broken connection fails that call with a retryable error and is discarded).
pub(crate) fn pool_options(max_connections: u32, request_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(request_timeout)
        .test_before_acquire(false)
}

/// Whether `e` says the call's connection was closed (so the call never ran on it, or
/// its outcome is unknown and the call is safe to repeat): an I/O error, or the server
/// ending the session (`57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot
/// connect now, class `08` connection exceptions other than a refused startup packet).
pub(crate) fn connection_closed(e: &sqlx::Error) -> bool {
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

/// `d` in whole milliseconds, rounded up (the granularity of this backend).
pub(crate) fn millis_ceil(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}
