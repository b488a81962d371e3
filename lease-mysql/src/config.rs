//! Settings of a backend: [`MysqlConfig`], the DDL, and this crate's own URL parameters
//! (the table, TLS files).

use super::*;

/// Settings of a [`MysqlBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_mysql::MysqlConfig;
/// let config = MysqlConfig::default()
///     .with_table("ops.lease_locks")
///     .with_request_timeout(Duration::from_secs(2));
/// assert!(config.create_table);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    pub request_timeout: Duration,
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
            request_timeout: Duration::from_secs(5),
            max_connections: 10,
            persistent_fencing: None,
            tls: TlsFiles::default(),
        }
    }
}

impl MysqlConfig {
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

impl MysqlConfig {
    pub(crate) fn validate(&self) -> std::result::Result<TableName, InvalidInput> {
        if self.request_timeout.is_zero() {
            return Err(InvalidInput::Other(
                "mysql request_timeout must be greater than zero".into(),
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

/// What [`split_own_params`] learned about TLS from the URL.
pub(crate) struct UrlTls {
    /// The URL sets `ssl-mode` (or `sslmode`).
    pub(crate) mode_given: bool,
    /// The URL's mode is `VERIFY_CA`: the driver then checks the certificate through
    /// rustls's process-wide crypto provider (see [`crate::tls::ensure_crypto_provider`]).
    pub(crate) verify_ca: bool,
}

/// Splits this crate's own parameters (`table`, `create_table`) and the TLS files
/// (`ssl-ca`, `ssl-cert`, `ssl-key`, merged into `config.tls`) off `url`; the rest is for
/// the driver. `mariadb://` is read as `mysql://`. Refuses a URL whose password has
/// unencoded reserved characters ([`lease_core::raw::url::check_url_userinfo`]), before anything
/// splits it.
pub(crate) fn split_own_params(url: &str, config: &mut MysqlConfig) -> Result<(String, UrlTls)> {
    lease_core::raw::url::check_url_userinfo(url)?;
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    let mut url_tls = UrlTls {
        mode_given: false,
        verify_ca: false,
    };
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
            let path = lease_core::raw::url::percent_decode_query(v)
                .map_err(|e| malformed(format!("{k}: {e}")))?;
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
            url_tls.verify_ca = v.eq_ignore_ascii_case("verify_ca");
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
