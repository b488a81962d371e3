//! Connections: links to one server, a Sentinel-named primary or a cluster; connecting,
//! reconnecting after a failover, TLS, the call deadline and the retry after a dropped
//! connection, and the probes at connect (persistence, the plain port).

use super::*;

/// A connection to one server (self-reconnecting), or to a Redis Cluster (which routes
/// each call to its slot's primary and follows redirections).
#[derive(Clone)]
pub(crate) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(c) => c.req_packed_commands(cmd, offset, count),
            Link::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// One connection and the client it came from.
pub(crate) struct Conn {
    pub(crate) cm: Link,
    /// For dedicated pub/sub connections (release notification); `None` when built from a
    /// bare connection manager.
    pub(crate) client: Option<Client>,
    /// Counts replacements, so that only the first of many failed calls replaces it.
    pub(crate) generation: u64,
}

/// Where a [`RedisBackend`] gets a new connection when the server it talks to is no
/// longer a writable primary.
pub(crate) enum Source {
    /// The URL's (or the caller's) address: after a failover behind a stable address
    /// (a proxy, a DNS name, a cloud endpoint) it leads to the new primary.
    Client(Client),
    /// The primary Redis Sentinel names at the time of asking.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
    /// A connection manager given by the caller: it cannot be replaced.
    Fixed,
    /// A Redis Cluster: the cluster connection follows failovers itself; the URL gives
    /// the scheme and credentials of the waiters' pub/sub connections to single nodes.
    Cluster(cluster::ClusterUrl),
}

impl RedisBackend {
    /// Connects to `url` with the default [`RedisConfig`].
    ///
    /// URLs: `redis://[user][:password@]host[:port][/db]`, `rediss://...` (with the `tls`
    /// feature), `redis+unix:///path?db=N&pass=...`, and the `valkey` spellings; and
    /// `redis+sentinel://[user][:password@]host[:port][,host[:port]...]/service[/db]` for
    /// the primary that Redis Sentinel names (sentinel port 26379 by default; the
    /// credentials and the database are the Redis servers', the sentinels take none).
    ///
    /// Errors: [`InvalidInput::MalformedUrl`] (the message never shows the password),
    /// [`Error::Unavailable`] or [`Error::Timeout`] when the server cannot be reached within
    /// the connect timeout, [`Error::Auth`] for bad credentials, [`Error::Rejected`] for a
    /// user without the permissions the backend needs.
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisConfig::default()).await
    }

    /// Connects to `url` with `config`. See [`RedisBackend::connect`].
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect_with(url: &str, mut config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let (url, from_url) = TlsFiles::take_from_url(url)?;
        config.tls = config.tls.merged(&from_url)?;
        let url = url.as_str();
        if cluster::is_cluster_url(url) {
            let parsed = cluster::ClusterUrl::parse(url)?;
            if parsed.tls && !cfg!(feature = "_tls") {
                return Err(Error::tls(
                    BACKEND,
                    "rediss+cluster:// needs the `tls` feature (of the lease crate, or of \
                     lease-redis)",
                ));
            }
            if !parsed.tls && !config.tls.is_empty() {
                return Err(InvalidInput::MalformedUrl(format!(
                    "{}: TLS files are given, but the URL is not rediss+cluster://",
                    parsed.described
                ))
                .into());
            }
            return Self::connect_cluster(parsed, config).await;
        }
        if sentinel::is_sentinel_url(url) {
            if !config.tls.is_empty() {
                return Err(InvalidInput::Other(
                    "TLS files with redis+sentinel:// are not supported yet: connect to the \
                     primary with rediss://"
                        .into(),
                )
                .into());
            }
            let parsed = sentinel::SentinelUrl::parse(url)?;
            return Self::connect_sentinel(parsed, config).await;
        }
        let client = tls_client(url, &config.tls)?;
        Self::from_client(client, config).await
    }

    /// Connects to a Redis Cluster through its seed nodes (see the `cluster` module).
    pub(crate) async fn connect_cluster(
        url: cluster::ClusterUrl,
        config: RedisConfig,
    ) -> Result<Self> {
        if url.tls {
            ensure_crypto_provider();
        }
        let certs = tls_certificates(&config.tls)?;
        let conn =
            cluster::open(&url, config.connect_timeout, config.request_timeout, certs).await?;
        let described = url.described.clone();
        Self::build(
            Link::Cluster(conn),
            None,
            Source::Cluster(url),
            config,
            described,
        )
        .await
    }

    /// Connects to the primary that the sentinels name for the service.
    pub(crate) async fn connect_sentinel(
        url: sentinel::SentinelUrl,
        config: RedisConfig,
    ) -> Result<Self> {
        let server = url.describe();
        let mut sc = url.client()?;
        let client = bounded(
            "connect",
            config.connect_timeout,
            config.request_timeout,
            sc.async_get_client(),
        )
        .await?;
        let cm = open_manager(&client, &config).await?;
        let source = Source::Sentinel(tokio::sync::Mutex::new(sc));
        Self::build(Link::Single(cm), Some(client), source, config, server).await
    }

    /// Connects with an already configured `redis` client (custom TLS settings, RESP3,
    /// ...). The client is kept for the pub/sub connections of
    /// [`LeaseBackend::wait_released`], and for a new connection when the server stops
    /// being a writable primary (`READONLY`, `MASTERDOWN`, `LOADING`).
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn from_client(client: Client, config: RedisConfig) -> Result<Self> {
        config.validate()?;
        if matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            ensure_crypto_provider();
        }
        let server = client.get_connection_info().addr().to_string();
        let cm = open_manager(&client, &config).await?;
        let source = Source::Client(client.clone());
        Self::build(Link::Single(cm), Some(client), source, config, server).await
    }

    /// Wraps an existing connection manager. Its own timeouts apply to its connections;
    /// every call is still bounded as [`RedisConfig::request_timeout`] says.
    ///
    /// Without a [`Client`] there is no way to open a pub/sub connection, so the
    /// capabilities say `release_notification: false` (waiters poll with backoff); use
    /// [`RedisBackend::from_client`] to get notifications. Nor can the backend open a new
    /// connection when the server is demoted to a replica: calls fail with a retryable
    /// error until the connection manager itself reconnects.
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn from_connection_manager(
        cm: ConnectionManager,
        config: RedisConfig,
    ) -> Result<Self> {
        config.validate()?;
        Self::build(
            Link::Single(cm),
            None,
            Source::Fixed,
            config,
            "(connection manager)".to_owned(),
        )
        .await
    }

    pub(crate) async fn build(
        cm: Link,
        client: Option<Client>,
        source: Source,
        config: RedisConfig,
        server: String,
    ) -> Result<Self> {
        let slots = matches!(cm, Link::Cluster(_)).then(cluster::Slots::new);
        // On a cluster a renewal batch is split by primary, each part one script call of
        // at most `renew_batch` leases (about, as slots spread names evenly).
        let max_renew_batch = match (&cm, &slots) {
            (Link::Cluster(c), Some(slots)) => {
                let primaries = slots
                    .primaries(&mut c.clone(), config.request_timeout)
                    .await
                    .map_err(|e| convert("connect", config.request_timeout, e))?;
                config.renew_batch.saturating_mul(primaries.len().max(1))
            }
            _ => config.renew_batch,
        };
        let durable = match (config.persistent_fencing, &cm) {
            (Some(d), _) => d,
            (None, Link::Single(cm)) => probe_persistence(cm, &config).await?,
            (None, Link::Cluster(c)) => {
                probe_cluster_persistence(c, slots.as_ref(), &config).await?
            }
        };
        let caps = Capabilities::new(BACKEND)
            .with_fencing(if durable {
                Fencing::Durable
            } else {
                Fencing::Volatile
            })
            // A waiter needs a pub/sub connection: from the client, or on a cluster to the
            // node serving the lease's slot.
            .with_release_notification(client.is_some() || matches!(source, Source::Cluster(_)))
            .with_max_renew_batch(max_renew_batch);
        tracing::debug!(%server, prefix = %config.key_prefix, fencing = ?caps.fencing, "redis lease backend ready");
        // Up when this crate just connected, or the persistence probe got a reply.
        let up = client.is_some() || config.persistent_fencing.is_none();
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn: RwLock::new(Arc::new(Conn {
                    cm,
                    client,
                    generation: 0,
                })),
                reconnecting: tokio::sync::Mutex::new(()),
                source,
                config,
                caps,
                server,
                slots,
                up: AtomicBool::new(up),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The connection in use.
    pub(crate) fn current(&self) -> Arc<Conn> {
        self.inner
            .conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn conn(&self) -> Link {
        self.current().cm.clone()
    }

    /// Opens a new connection in place of the one of `generation`, unless another call
    /// already did: from the URL's address again (after a failover behind a stable
    /// address it leads to the new primary), or from the primary Sentinel names now.
    /// Returns the connection to use; the old one closes once its last call is done.
    pub(crate) async fn reconnect(&self, generation: u64, why: &RedisError) -> Result<Arc<Conn>> {
        let _one_at_a_time = self.inner.reconnecting.lock().await;
        let current = self.current();
        if current.generation != generation {
            return Ok(current);
        }
        let cfg = &self.inner.config;
        let client = match &self.inner.source {
            Source::Fixed | Source::Cluster(_) => return Ok(current),
            Source::Client(client) => client.clone(),
            Source::Sentinel(sc) => {
                let mut sc = sc.lock().await;
                bounded(
                    "connect",
                    cfg.connect_timeout,
                    cfg.request_timeout,
                    sc.async_get_client(),
                )
                .await?
            }
        };
        let cm = open_manager(&client, cfg).await?;
        let next = Arc::new(Conn {
            cm: Link::Single(cm),
            client: Some(client),
            generation: generation + 1,
        });
        *self.inner.conn.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        tracing::info!(server = %self.inner.server, reason = %why, "redis: opened a new connection");
        Ok(next)
    }

    /// Whether `e` calls for a new connection rather than a retry on this one: the server
    /// is no longer a writable primary (`READONLY`: demoted to a replica; `MASTERDOWN`: a
    /// replica cut off from its primary; `LOADING`: restarted), or, under Sentinel, it
    /// cannot be reached (the primary may have moved).
    pub(crate) fn needs_new_connection(&self, e: &RedisError) -> bool {
        let demoted = matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        demoted || (matches!(self.inner.source, Source::Sentinel(_)) && connection_failed(e))
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.inner.config.key_prefix
    }

    /// Runs a script, bounded by the call timeout, converting errors. Returns the reply
    /// and whether it came from a retry.
    ///
    /// The connection manager reports a dropped connection once (and reconnects in the
    /// background), so the first call after a server restart or an idle disconnect would
    /// fail although the server is fine. Such a call is retried once on the new
    /// connection, within the same time budget. The scripts are safe to repeat: renew and
    /// inspect are idempotent, a repeated acquire recognises its own token, and a repeated
    /// release can at worst report `NotOwner` for a lease it did release.
    pub(crate) async fn invoke(
        &self,
        operation: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<Reply> {
        self.send(operation, |mut conn| async move {
            inv.invoke_async::<Value>(&mut conn).await
        })
        .await
    }

    /// The call's deadline and the retry once after a dropped connection (see
    /// [`Self::invoke`]), for any call; `call` sends on the connection it is given.
    ///
    /// One timer per call: the connection manager's own reply timeout is off (it would be
    /// a second timer on every call). While the connection is known to be up (the last
    /// call got a reply, or connecting just succeeded) a call needs only its reply and
    /// gets `request_timeout`; otherwise it may have to reconnect first and gets
    /// `connect_timeout + request_timeout`, as does the retry after a dropped connection,
    /// counted from the first attempt.
    pub(crate) async fn send<F, Fut>(&self, operation: &'static str, call: F) -> Result<Reply>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = std::result::Result<Value, RedisError>>,
    {
        let cfg = &self.inner.config;
        let up = self.inner.up.load(Ordering::Relaxed);
        let budget = if up {
            cfg.request_timeout
        } else {
            cfg.call_timeout()
        };
        let start = tokio::time::Instant::now();
        let conn = self.current();
        // A call dropped in flight (by the caller's timer, or a `select!`) leaves the
        // connection not known to be up, as our own timeout does.
        let mut unknown = DownIfDropped(Some(&self.inner.up));
        // No timer of ours where the caller (`LeaseClient`) drops this call first. This is
        // `lease_core::raw::deadline::within` written out: through that function the call
        // future is moved twice more before its first poll, about 220 instructions per
        // call at this future's size (callgrind, `scripts/client-instructions.sh`).
        let first = if lease_core::raw::deadline::caller_bounds(start + budget) {
            Some(call(conn.cm.clone()).await)
        } else {
            tokio::time::timeout_at(start + budget, call(conn.cm.clone()))
                .await
                .ok()
        };
        unknown.0 = None;
        let first = match first {
            Some(Ok(v)) => {
                if !up {
                    self.inner.up.store(true, Ordering::Relaxed);
                }
                return Ok(Reply {
                    value: v,
                    retried: false,
                });
            }
            None => {
                self.inner.up.store(false, Ordering::Relaxed);
                return Err(Error::Timeout {
                    operation,
                    after: budget,
                });
            }
            Some(Err(e)) => e,
        };
        let deadline = start + cfg.call_timeout();
        let retry_on = if self.needs_new_connection(&first) {
            // Nothing was applied (a demoted server refuses the write; an unreachable one
            // never got it, or the retry recognises its own token): once more on a new
            // connection, within the same time budget.
            self.inner.up.store(false, Ordering::Relaxed);
            tracing::debug!(operation, error = %first, "redis server is not a writable primary; connecting again");
            // Boxed, as the retry below: rare paths, kept out of the size of every call's
            // future (which is moved into the trait's box on every call).
            match tokio::time::timeout_at(
                deadline,
                Box::pin(self.reconnect(conn.generation, &first)),
            )
            .await
            {
                Ok(Ok(next)) => next,
                Ok(Err(e)) => {
                    tracing::debug!(operation, error = %e, "redis: no new connection");
                    return Err(convert(operation, cfg.request_timeout, first));
                }
                Err(_) => return Err(convert(operation, cfg.request_timeout, first)),
            }
        } else if first.is_connection_dropped() {
            self.inner.up.store(false, Ordering::Relaxed);
            tracing::debug!(operation, error = %first, "redis connection dropped; retrying once");
            conn
        } else {
            if connection_failed(&first) {
                self.inner.up.store(false, Ordering::Relaxed);
            }
            return Err(convert(operation, cfg.request_timeout, first));
        };
        match tokio::time::timeout_at(deadline, Box::pin(call(retry_on.cm.clone()))).await {
            Ok(Ok(v)) => {
                self.inner.up.store(true, Ordering::Relaxed);
                Ok(Reply {
                    value: v,
                    retried: true,
                })
            }
            Ok(Err(e)) => Err(convert(operation, cfg.request_timeout, e)),
            // Still no connection: the original error says more than the timeout.
            Err(_) => Err(convert(operation, cfg.request_timeout, first)),
        }
    }
}

/// Clears the "connection is up" flag it holds when dropped holding it: a call whose
/// caller dropped it mid-flight (its timer fired) leaves the connection's state unknown,
/// as our own timeout does.
struct DownIfDropped<'a>(Option<&'a AtomicBool>);

impl Drop for DownIfDropped<'_> {
    fn drop(&mut self) {
        if let Some(up) = self.0 {
            up.store(false, Ordering::Relaxed);
        }
    }
}

/// Whether `e` says the connection failed (as opposed to an error reply from a working
/// server).
pub(crate) fn connection_failed(e: &RedisError) -> bool {
    e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error()
}

/// A connection manager on `client`, its first connection made within the connect timeout.
pub(crate) async fn open_manager(
    client: &Client,
    config: &RedisConfig,
) -> Result<ConnectionManager> {
    let connect = ConnectionManager::new_with_config(client.clone(), config.manager_config());
    let opened = bounded(
        "connect",
        config.connect_timeout,
        config.request_timeout,
        connect,
    )
    .await;
    match opened {
        Err(e @ (Error::Timeout { .. } | Error::Unavailable { .. })) => {
            Err(plain_port(client, config.request_timeout)
                .await
                .unwrap_or(e))
        }
        other => other,
    }
}

/// Bounds `fut` by `after` ([`Error::Timeout`] when it elapses) and converts its error;
/// `reply_timeout` is what an I/O timeout inside the client is reported as.
pub(crate) async fn bounded<T>(
    operation: &'static str,
    after: Duration,
    reply_timeout: Duration,
    fut: impl Future<Output = std::result::Result<T, RedisError>>,
) -> Result<T> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(convert(operation, reply_timeout, e)),
        Err(_) => Err(Error::Timeout { operation, after }),
    }
}

/// Asks the server whether writes survive a crash: `appendonly yes` and
/// `appendfsync always`. A server that refuses `CONFIG` counts as volatile.
pub(crate) async fn probe_persistence(
    cm: &ConnectionManager,
    config: &RedisConfig,
) -> Result<bool> {
    let mut conn = cm.clone();
    let mut pipe = redis::pipe();
    pipe.cmd("CONFIG").arg("GET").arg("appendonly");
    pipe.cmd("CONFIG").arg("GET").arg("appendfsync");
    let reply = bounded(
        "connect",
        config.call_timeout(),
        config.request_timeout,
        pipe.query_async::<Vec<Value>>(&mut conn),
    )
    .await;
    let values = match reply {
        Ok(v) => v,
        // Unreachable, or the credentials or TLS are wrong: every call would fail.
        Err(
            e @ (Error::Unavailable { .. }
            | Error::Timeout { .. }
            | Error::Auth { .. }
            | Error::Tls { .. }),
        ) => return Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "CONFIG GET refused; fencing tokens counted as volatile");
            return Ok(false);
        }
    };
    let mut appendonly = None;
    let mut appendfsync = None;
    for v in &values {
        for (k, val) in config_pairs(v) {
            match k.as_str() {
                "appendonly" => appendonly = Some(val),
                "appendfsync" => appendfsync = Some(val),
                _ => {}
            }
        }
    }
    let durable = appendonly.as_deref() == Some("yes") && appendfsync.as_deref() == Some("always");
    tracing::debug!(?appendonly, ?appendfsync, durable, "redis persistence");
    Ok(durable)
}

/// Asks every primary of a cluster whether writes survive a crash, as
/// [`probe_persistence`] asks one server: fencing is durable only if every primary says
/// so (a lease's counter lives on its slot's primary, and slots move).
pub(crate) async fn probe_cluster_persistence(
    conn: &ClusterConnection,
    slots: Option<&cluster::Slots>,
    config: &RedisConfig,
) -> Result<bool> {
    const OP: &str = "connect";
    let Some(slots) = slots else {
        return Ok(false);
    };
    let mut conn = conn.clone();
    let primaries = slots
        .primaries(&mut conn, config.request_timeout)
        .await
        .map_err(|e| convert(OP, config.request_timeout, e))?;
    if primaries.is_empty() {
        return Err(unexpected(OP, "CLUSTER SLOTS named no primary"));
    }
    let mut durable = true;
    for node in &primaries {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("appendonly").arg("appendfsync");
        let reply = cluster::on_node(&mut conn, node, cmd, config.request_timeout).await;
        let pairs = match reply {
            Ok(v) => config_pairs(&v),
            Err(e) if connection_failed(&e) || e.is_timeout() => {
                return Err(convert(OP, config.request_timeout, e));
            }
            Err(e) => {
                tracing::debug!(error = %e, node = %format!("{}:{}", node.0, node.1), "CONFIG GET refused; fencing tokens counted as volatile");
                Vec::new()
            }
        };
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let node_durable = get("appendonly") == Some("yes") && get("appendfsync") == Some("always");
        tracing::debug!(node = %format!("{}:{}", node.0, node.1), durable = node_durable, "redis cluster primary persistence");
        durable &= node_durable;
    }
    Ok(durable)
}

/// The key/value pairs of a `CONFIG GET` reply (RESP2 flat array or RESP3 map).
pub(crate) fn config_pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|p| Some((text(&p[0])?, text(&p[1])?)))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A reply, and whether it came from the retry after a dropped connection (then the call
/// may have run twice on the server).
pub(crate) struct Reply {
    pub(crate) value: Value,
    pub(crate) retried: bool,
}
