//! Settings of a backend: [`PostgresConfig`], the DDL, and this crate's own URL
//! parameters.

use super::*;

/// Settings of a [`PostgresBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_postgres::PostgresConfig;
/// let config = PostgresConfig::default()
///     .with_table("ops.lease_locks")
///     .with_request_timeout(Duration::from_secs(2));
/// assert!(config.create_table);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    pub create_table: bool,
    /// Bound of every call (default 5 s): the pool's acquire timeout (which includes
    /// connecting), the connections' `statement_timeout` (for pools this crate builds)
    /// and a client-side timeout around every statement.
    pub request_timeout: Duration,
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
            create_table: true,
            request_timeout: Duration::from_secs(5),
            max_connections: 10,
            transaction_pooler: false,
            persistent_fencing: None,
            tls: TlsFiles::default(),
        }
    }
}

impl PostgresConfig {
    /// Sets [`table`](Self::table).
    pub fn with_table(mut self, value: impl Into<String>) -> Self {
        self.table = value.into();
        self
    }

    /// Sets [`create_table`](Self::create_table).
    pub fn with_create_table(mut self, value: bool) -> Self {
        self.create_table = value;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, value: Duration) -> Self {
        self.request_timeout = value;
        self
    }

    /// Sets [`max_connections`](Self::max_connections).
    pub fn with_max_connections(mut self, value: u32) -> Self {
        self.max_connections = value;
        self
    }

    /// Sets [`transaction_pooler`](Self::transaction_pooler).
    pub fn with_transaction_pooler(mut self, value: bool) -> Self {
        self.transaction_pooler = value;
        self
    }

    /// Sets [`persistent_fencing`](Self::persistent_fencing).
    pub fn with_persistent_fencing(mut self, value: Option<bool>) -> Self {
        self.persistent_fencing = value;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn with_tls(mut self, value: TlsFiles) -> Self {
        self.tls = value;
        self
    }
}

impl PostgresConfig {
    pub(crate) fn validate(&self) -> std::result::Result<TableName, InvalidInput> {
        if self.request_timeout.is_zero() {
            return Err(InvalidInput::Other(
                "postgres request_timeout must be greater than zero".into(),
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
/// their schema with migrations and set [`PostgresConfig::create_table`] to `false`.
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
/// has unencoded reserved characters ([`lease_core::raw::url::check_url_userinfo`]), before anything
/// splits it.
pub(crate) fn split_own_params(
    url: &str,
) -> std::result::Result<(String, OwnParams), InvalidInput> {
    lease_core::raw::url::check_url_userinfo(url)?;
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
pub(crate) fn url_param<'a>(url: &'a str, keys: &[&str]) -> Option<&'a str> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        keys.contains(&k).then_some(v)
    })
}
