//! Settings of a backend: [`EtcdConfig`].

use super::*;

/// Settings of an [`EtcdBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_etcd::EtcdConfig;
/// let config = EtcdConfig::default()
///     .with_key_prefix("billing/leases")
///     .with_request_timeout(Duration::from_secs(2));
/// assert_eq!(config.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// First part of every key (default `lease`): leases live under `<prefix>/l/`. 1 to 256
    /// bytes, no whitespace or control characters. Prefixes of different deployments
    /// should not nest (`a` and `a/l/...`).
    pub key_prefix: String,
    /// User name for etcd authentication (`None`: no authentication).
    pub user: Option<String>,
    /// Password for `user`. Never shown by `Debug` or in errors.
    pub password: Option<String>,
    /// Bound of every connection attempt (default 5 s).
    pub connect_timeout: Duration,
    /// Bound of every single request to etcd (default 5 s).
    pub request_timeout: Duration,
    /// TLS (feature `tls`): `None` (default) connects in plain text to `http://`
    /// endpoints; `Some(files)` connects over TLS to `https://` endpoints (what `etcds://`
    /// URLs give), verifying the server with `files.ca` (default: the system's trust
    /// store) and presenting `files.cert` and `files.key` when given (mutual TLS).
    pub tls: Option<TlsFiles>,
    /// The server's minimum lease TTL, reported as [`Capabilities::min_ttl`] (default
    /// [`MIN_TTL`], 2 s: etcd's minimum with its default 1 s election timeout). etcd
    /// raises every shorter lease to `ceil(1.5 × --election-timeout)`; set this to that
    /// value for a server with other raft timing. Whole seconds, at least 1 s.
    pub min_ttl: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            key_prefix: "lease".to_owned(),
            user: None,
            password: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            tls: None,
            min_ttl: MIN_TTL,
        }
    }
}

impl EtcdConfig {
    /// Sets [`key_prefix`](Self::key_prefix).
    pub fn with_key_prefix(mut self, value: impl Into<String>) -> Self {
        self.key_prefix = value.into();
        self
    }

    /// Sets [`user`](Self::user).
    pub fn with_user(mut self, value: Option<String>) -> Self {
        self.user = value;
        self
    }

    /// Sets [`password`](Self::password).
    pub fn with_password(mut self, value: Option<String>) -> Self {
        self.password = value;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, value: Duration) -> Self {
        self.connect_timeout = value;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, value: Duration) -> Self {
        self.request_timeout = value;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn with_tls(mut self, value: Option<TlsFiles>) -> Self {
        self.tls = value;
        self
    }

    /// Sets [`min_ttl`](Self::min_ttl).
    pub fn with_min_ttl(mut self, value: Duration) -> Self {
        self.min_ttl = value;
        self
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("key_prefix", &self.key_prefix)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls)
            .field("min_ttl", &self.min_ttl)
            .finish()
    }
}

impl EtcdConfig {
    /// Parses `etcd://[user[:password]@]host[:port][,host[:port]...][/prefix]` into the
    /// endpoints (`http://host:port`, port 2379 by default) and a config with the URL's
    /// user, password and prefix (default `lease`) and default timeouts.
    ///
    /// ```
    /// let (endpoints, config) =
    ///     lease_etcd::EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2/billing")?;
    /// assert_eq!(endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
    /// assert_eq!(config.key_prefix, "billing");
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    ///
    /// Errors: [`InvalidInput::MalformedUrl`], whose message never contains the password.
    /// `etcds://` gives `https://` endpoints and `tls: Some(files)`, with the files of the
    /// URL parameters `tls_ca`, `tls_cert` and `tls_key`.
    pub fn from_url(url: &str) -> std::result::Result<(Vec<String>, EtcdConfig), InvalidInput> {
        let parsed = url::parse(url)?;
        parsed.1.validate()?;
        Ok(parsed)
    }

    pub(crate) fn validate(&self) -> std::result::Result<(), InvalidInput> {
        keys::validate_prefix(&self.key_prefix)?;
        if self.min_ttl < Duration::from_secs(1) || self.min_ttl.subsec_nanos() != 0 {
            return Err(InvalidInput::Other(format!(
                "etcd min_ttl {:?} must be whole seconds, at least 1 s",
                self.min_ttl
            )));
        }
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(InvalidInput::Other(format!(
                    "etcd {what} must be greater than zero"
                )));
            }
        }
        if self.user.is_none() && self.password.is_some() {
            return Err(InvalidInput::Other(
                "etcd password given without a user".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn connect_options(&self) -> Result<ConnectOptions> {
        // etcd's default --grpc-keepalive-min-time is 5 s: ping less often than that.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from its leader answers "no leader" at once (and cancels
            // watches) instead of letting requests hang until they time out.
            .with_require_leader(true);
        if let Some(user) = &self.user {
            options = options
                .with_user(user.clone(), self.password.clone().unwrap_or_default())
                .with_auto_token_refresh(true);
        }
        if let Some(files) = &self.tls {
            options = tls_options(options, files)?;
        }
        Ok(options)
    }
}
