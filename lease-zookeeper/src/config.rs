//! [`ZkConfig`]: where the backend's nodes live, its timeouts and credentials, and the
//! `zk://` URL.

use std::fmt;
use std::time::Duration;

use lease_core::raw::url::percent_decode;
use lease_core::{InvalidInput, TlsFiles};

/// Default client port of ZooKeeper.
pub(crate) const DEFAULT_PORT: u16 = 2181;

/// Settings of a [`ZkBackend`](crate::ZkBackend).
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub struct ZkConfig {
    /// The path under which every node of the backend lives (`/lease` by default). It is
    /// created (with its parents) when the backend connects.
    pub prefix: String,
    /// Bound on every request to the server (default 5 s).
    pub request_timeout: Duration,
    /// Bound on establishing a session (default 10 s).
    pub connect_timeout: Duration,
    /// The shortest TTL: a shorter one is raised to it (the capabilities report it as the
    /// minimum TTL). `None` (the default): the server's `minSessionTimeout` (`2 × tickTime`,
    /// 4 s with ZooKeeper's default tick of 2 s), asked of the server at connect by
    /// opening a session with the shortest timeout and reading what it granted. A value
    /// below the server's minimum is raised to it.
    pub min_ttl: Option<Duration>,
    /// A user for ZooKeeper's `digest` authentication; the nodes the backend creates are
    /// then readable and writable by this user only (`auth` ACL).
    pub user: Option<String>,
    /// The user's password (needs `user`).
    pub password: Option<String>,
    /// TLS to the servers' secure client port (`zks://` URLs set it; feature `tls`): the
    /// CA file is required, a client certificate and key are given for servers that
    /// require one (`ssl.clientAuth=need`).
    pub tls: Option<TlsFiles>,
    /// The runtime the sessions' connection tasks (and the sweep of unanswered acquires)
    /// run on. `None` (the default): a runtime of the crate's own, one worker thread
    /// (`lease-zookeeper-io`) kept for the life of the process, so the backend keeps
    /// working whatever runtime made it or calls it, at the cost of handing every request
    /// and reply across threads.
    ///
    /// `Some(handle)`, usually [`tokio::runtime::Handle::current()`] of the application's
    /// runtime: no hand-over between threads. On a current-thread runtime that saves
    /// about 14% of the client's instructions per acquire and release; on a
    /// multi-thread runtime the CPU time per cycle measured no lower (see the ZooKeeper
    /// section of the benchmark notes). The backend then works only while that runtime runs: once
    /// it has shut down, its sessions are gone (their leases are lost, freed by the
    /// server within their TTL) and every call fails at once with a non-retryable
    /// [`Error::Backend`](lease_core::Error::Backend) saying so: a new backend must be
    /// made. Where a current-thread runtime is given, calls from another runtime wait
    /// while nobody drives it.
    pub runtime: Option<tokio::runtime::Handle>,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            prefix: "/lease".into(),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            min_ttl: None,
            user: None,
            password: None,
            tls: None,
            runtime: None,
        }
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("min_ttl", &self.min_ttl)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("tls", &self.tls)
            .field(
                "runtime",
                &self.runtime.as_ref().map(|h| h.runtime_flavor()),
            )
            .finish()
    }
}

impl ZkConfig {
    /// Sets [`ZkConfig::prefix`].
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets [`ZkConfig::request_timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`ZkConfig::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`ZkConfig::min_ttl`].
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = Some(min_ttl);
        self
    }

    /// Sets the `digest` user and password.
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Sets [`ZkConfig::tls`].
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Sets [`ZkConfig::runtime`]: the sessions' tasks run on `handle`'s runtime, and the
    /// backend works only while it runs.
    pub fn with_runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Checks the settings: a prefix that is an absolute ZooKeeper path other than `/`,
    /// timeouts and minimum TTL above zero, no password without a user.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let p = &self.prefix;
        let bad_segment = p
            .split('/')
            .skip(1)
            .any(|s| s.is_empty() || s == "." || s == ".." || s.chars().any(char::is_control));
        if !p.starts_with('/') || p.len() < 2 || bad_segment {
            return Err(InvalidInput::Other(format!(
                "zookeeper prefix {p:?} must be an absolute path such as /lease (no empty, . \
                 or .. segments, no trailing /)"
            )));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(InvalidInput::Other(
                "zookeeper request and connect timeouts must be above zero".into(),
            ));
        }
        if self.min_ttl.is_some_and(|t| t.is_zero()) {
            return Err(InvalidInput::Other(
                "zookeeper min_ttl must be above zero".into(),
            ));
        }
        if self.tls.as_ref().is_some_and(|t| t.ca.is_none()) {
            return Err(InvalidInput::Other(
                "zookeeper TLS needs a CA file (tls_ca): the servers' certificates are \
                 checked against it"
                    .into(),
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(InvalidInput::Other(
                "a zookeeper password needs a user".into(),
            ));
        }
        if self
            .user
            .as_deref()
            .is_some_and(|u| u.is_empty() || u.contains(':'))
        {
            return Err(InvalidInput::Other(
                "a zookeeper digest user must be non-empty and without ':'".into(),
            ));
        }
        Ok(())
    }
}

/// Parses `zk://[user[:password]@]host[:port][,host[:port]...][/prefix]`, or
/// `zks://...[?tls_ca=FILE&tls_cert=FILE&tls_key=FILE]` for the secure client port, into
/// the connect string (`host:port,...`) and the settings (on top of `base`).
///
/// The port defaults to 2181; user, password, prefix and file names may be
/// percent-encoded. Errors never contain the password.
pub(crate) fn parse_url(url: &str, base: ZkConfig) -> Result<(String, ZkConfig), InvalidInput> {
    let redacted = lease_core::raw::url::redact_url(url);
    let malformed = |why: &str| InvalidInput::MalformedUrl(format!("{redacted}: {why}"));
    let (url, tls_files) = TlsFiles::take_from_url(url)?;
    let url = url.as_str();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(malformed(
            "expected zk://[user:password@]host:port[,host:port...][/prefix]",
        ));
    };
    let secure = match scheme.to_ascii_lowercase().as_str() {
        "zk" => false,
        "zks" => true,
        _ => return Err(malformed("the scheme must be zk:// or zks://")),
    };
    if rest.contains(['?', '#']) {
        return Err(malformed(
            "the only query parameters are tls_ca, tls_cert and tls_key (for zks://)",
        ));
    }
    if !secure && (!tls_files.is_empty() || base.tls.is_some()) {
        return Err(malformed("TLS files are given, but the URL is not zks://"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let mut config = base;
    if secure {
        config.tls = Some(match &config.tls {
            Some(files) => files.merged(&tls_files)?,
            None => tls_files,
        });
    }
    let hosts = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = percent_decode(user).map_err(|e| malformed(&format!("user: {e}")))?;
            if user.is_empty() {
                return Err(malformed("empty user name before '@'"));
            }
            config.user = Some(user);
            config.password = match password {
                Some(p) => Some(percent_decode(p).map_err(|_| malformed("bad password encoding"))?),
                None => None,
            };
            &authority[at + 1..]
        }
        None => authority,
    };
    let mut connect = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(malformed("empty host"));
        }
        let with_port = match host.rsplit_once(':') {
            // `[::1]` alone: the colon is inside the brackets.
            Some((h, _)) if h.starts_with('[') && !h.ends_with(']') => {
                format!("{host}:{DEFAULT_PORT}")
            }
            Some((h, port)) => {
                if h.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                    return Err(malformed(&format!("bad host:port {host:?}")));
                }
                host.to_owned()
            }
            None => format!("{host}:{DEFAULT_PORT}"),
        };
        connect.push(with_port);
    }
    if path.len() > 1 {
        let prefix = percent_decode(path.trim_end_matches('/'))
            .map_err(|e| malformed(&format!("prefix: {e}")))?;
        config.prefix = prefix;
    }
    config.validate().map_err(|e| malformed(&e.to_string()))?;
    Ok((connect.join(","), config))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn urls() {
        let (c, cfg) = parse_url("zk://a:1,b/app/locks", ZkConfig::default()).unwrap();
        assert_eq!(c, "a:1,b:2181");
        assert_eq!(cfg.prefix, "/app/locks");
        let (c, cfg) = parse_url("zk://u:p%2Fw@h:2181", ZkConfig::default()).unwrap();
        assert_eq!(c, "h:2181");
        assert_eq!(cfg.prefix, "/lease");
        assert_eq!(cfg.user.as_deref(), Some("u"));
        assert_eq!(cfg.password.as_deref(), Some("p/w"));
        let (_, cfg) = parse_url(
            "zks://h:2281/p?tls_ca=%2Fca.pem&tls_cert=%2Fc.pem&tls_key=%2Fc.key",
            ZkConfig::default(),
        )
        .unwrap();
        let tls = cfg.tls.unwrap();
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("/c.key")));
        for bad in [
            "zks://h",
            "zk://h?tls_ca=%2Fca.pem",
            "redis://h",
            "zk://",
            "zk://h:0",
            "zk://h:x",
            "zk://h,,i",
            "zk://h?x=1",
            "zk://h/a//b",
            "zk://h/a/../b",
        ] {
            assert!(parse_url(bad, ZkConfig::default()).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_and_debug_hide_the_password() {
        let e = parse_url("zk://u:sekrit@h:0", ZkConfig::default()).unwrap_err();
        assert!(!e.to_string().contains("sekrit"), "{e}");
        let cfg = ZkConfig::default().with_credentials("u", "sekrit");
        assert!(!format!("{cfg:?}").contains("sekrit"));
    }
}
