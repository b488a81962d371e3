//! Connecting (endpoints, credentials, the status probe; TLS is in `tls`) and the
//! bound and retry of every request.

use super::*;
use crate::error::convert;
use tonic::Code;

impl EtcdBackend {
    /// Connects to an
    /// `etcd://[user[:password]@]host[:port][,host[:port]...][/prefix]` URL (`etcds://`
    /// for TLS) with default timeouts. See [`EtcdConfig::from_url`] for the URL and
    /// [`EtcdBackend::connect_endpoints`] for what connecting checks and its errors.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lease_core::Error> {
    /// let backend = lease_etcd::EtcdBackend::connect("etcd://10.0.0.1,10.0.0.2/billing").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdConfig::default()).await
    }

    /// Connects to `url` with `config` for what the URL does not say (timeouts, minimum
    /// TTL; the URL's user, password, prefix and TLS files replace the config's where it
    /// gives them). See [`EtcdBackend::connect_endpoints`].
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect_with(url: &str, config: EtcdConfig) -> Result<Self> {
        let (endpoints, config) = url::parse_onto(url, config)?;
        config.validate()?;
        Self::connect_endpoints(&endpoints, config).await
    }

    /// Connects to `endpoints` (`host:port` or `http://host:port`) with `config`.
    ///
    /// Reaches the store before it returns, as every backend's `connect` does (see
    /// [`lease_core::startup`]): with a user it authenticates, without one it asks a
    /// member for its status (trying each endpoint once while the connection is refused).
    ///
    /// Errors: [`InvalidInput`] for a bad config or endpoint; [`Error::Auth`] for bad
    /// credentials and [`Error::Tls`] for a failed handshake (not retryable);
    /// [`Error::Unavailable`] or [`Error::Timeout`] (retryable) when no member answers
    /// within `connect_timeout + request_timeout`.
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect_endpoints(endpoints: &[String], config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        if endpoints.is_empty() {
            return Err(InvalidInput::MalformedUrl("no etcd endpoints given".into()).into());
        }
        let bound = config
            .connect_timeout
            .saturating_add(config.request_timeout);
        let client = match bounded(
            "connect",
            bound,
            Client::connect(endpoints, Some(config.connect_options()?)),
        )
        .await?
        {
            Ok(client) => client,
            Err(
                e @ (etcd_client::Error::InvalidUri(_)
                | etcd_client::Error::InvalidArgs(_)
                | etcd_client::Error::EndpointError(_)),
            ) => {
                return Err(InvalidInput::MalformedUrl(format!(
                    "etcd endpoints {endpoints:?}: {e}"
                ))
                .into());
            }
            Err(e) => {
                let e = convert("connect", bound, e);
                return Err(explain_tls(e, &config, endpoints, bound).await);
            }
        };
        if config.user.is_none() {
            // Without a user nothing has been sent yet: reach a member now, so that an
            // unreachable store fails here as on every other backend, and a certificate
            // problem is reported as the configuration error it is.
            let tries = endpoints.len().max(1);
            match retrying("connect", bound, tries, || {
                let mut probe = client.clone();
                async move { probe.status().await }
            })
            .await?
            {
                Ok(_) => {}
                Err(e) => {
                    let e = convert("connect", bound, e);
                    return Err(explain_tls(e, &config, endpoints, bound).await);
                }
            }
        }
        Ok(Self::build(client, config, endpoints.to_vec()))
    }

    /// Uses an existing `etcd-client` [`Client`] (for connection settings
    /// this crate does not expose). `config`'s prefix and request timeout apply; its
    /// connection settings and credentials are ignored.
    pub fn from_client(client: Client, config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::build(client, config, Vec::new()))
    }

    pub(crate) fn build(client: Client, config: EtcdConfig, endpoints: Vec<String>) -> Self {
        EtcdBackend {
            inner: Arc::new(Inner {
                client,
                layout: Layout::new(&config.key_prefix),
                endpoints,
                config,
                shared: Arc::default(),
                grant_lock: tokio::sync::Mutex::new(()),
                keepalives: AtomicU64::new(0),
                waits_armed: AtomicU64::new(0),
            }),
        }
    }
}

/// Runs one request with a timeout; a raw result so callers can look at the error first.
pub(crate) async fn bounded<T>(
    operation: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<Result<T, etcd_client::Error>, Error> {
    // No timer of ours where the caller (`LeaseClient`) drops the call first. The
    // request's future is boxed: see `retrying`.
    lease_core::raw::deadline::within(tokio::time::Instant::now() + timeout, Box::pin(fut))
        .await
        .ok_or(Error::Timeout {
            operation,
            after: timeout,
        })
}

/// Whether a request failed before it reached any server (the connection to the member
/// the balancer picked was refused): then it is safe to send again, to another member.
pub(crate) fn not_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    if status.code() != Code::Unavailable {
        return false;
    }
    if status.message().contains("connect error") {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// Runs a request with a timeout, sending it again (up to `tries` times in all, within the
/// same timeout) while it fails without having reached a server. The client balances over
/// all endpoints and keeps sending to a member that is down; another try picks again.
pub(crate) async fn retrying<T, F, Fut>(
    operation: &'static str,
    timeout: Duration,
    tries: usize,
    mut attempt: F,
) -> Result<Result<T, etcd_client::Error>, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tried = 1;
    loop {
        // No timer of ours where the caller (`LeaseClient`) drops the call first.
        //
        // The request's future (etcd-client's and tonic's, about 2 KB) is boxed: by value
        // it would be copied whole at each move (into the timeout, into its `Either`,
        // into this future's state), and would make every operation's future, which
        // `#[async_trait]` boxes too, that much larger to copy. One allocation costs
        // less than those copies (docs/benchmark-notes.md, etcd).
        let result = lease_core::raw::deadline::within(deadline, Box::pin(attempt()))
            .await
            .ok_or(Error::Timeout {
                operation,
                after: timeout,
            })?;
        match result {
            Err(e) if tried < tries && not_sent(&e) => {
                tried += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            other => return Ok(other),
        }
    }
}

/// [`retrying`], converting the error.
pub(crate) async fn call_retrying<T, F, Fut>(
    operation: &'static str,
    timeout: Duration,
    tries: usize,
    attempt: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    retrying(operation, timeout, tries, attempt)
        .await?
        .map_err(|e| convert(operation, timeout, e))
}

/// Runs one request with a timeout and converts its error.
pub(crate) async fn call<T>(
    operation: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Error> {
    bounded(operation, timeout, fut)
        .await?
        .map_err(|e| convert(operation, timeout, e))
}
