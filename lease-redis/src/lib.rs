#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod cluster;
mod error;
mod keys;
/// The Lua sources of the primitives, for auditing them or loading them ahead
/// (`SCRIPT LOAD`) on servers that restrict scripting; the backend loads them itself
/// after a `NOSCRIPT`. Each constant's docs give its `KEYS`, `ARGV` and reply.
pub mod scripts;
mod sentinel;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
    Result, TlsFiles,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{BACKEND, convert, unexpected};

/// The `redis` client crate this backend is built on, for
/// [`RedisBackend::from_client`] and [`RedisBackend::from_connection_manager`].
pub use redis;

/// The default of [`RedisConfig::renew_batch`]: the largest renewal batch sent as one
/// script call; the client splits larger batches. One call of this size keeps the server
/// busy for a few milliseconds. On a Redis Cluster the backend takes this many per primary
/// in one `renew` call (its capabilities say `max_renew_batch` = this times the number of
/// primaries at connect).
pub const MAX_RENEW_BATCH: usize = 10_000;

/// The largest [`RedisConfig::renew_batch`] accepted.
pub const RENEW_BATCH_LIMIT: usize = 100_000;

/// Settings of a [`RedisBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_redis::RedisConfig;
/// let config = RedisConfig {
///     key_prefix: "billing:lease".into(),
///     response_timeout: Duration::from_secs(2),
///     ..RedisConfig::default()
/// };
/// assert_eq!(config.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// First part of every key (default `lease`). 1 to 256 bytes; no braces (they would
    /// change the cluster hash slot), whitespace or control characters.
    pub key_prefix: String,
    /// Bound of every connection attempt, including reconnects (default 5 s).
    pub connect_timeout: Duration,
    /// Bound of every call while the connection is up (default 5 s). After a failed
    /// call (the connection may have to be made again first) the next call may take up
    /// to `connect_timeout + response_timeout`.
    pub response_timeout: Duration,
    /// Whether fencing tokens survive a server restart. `None` (default): ask the server
    /// once at connect (`CONFIG GET appendonly` / `appendfsync`): durable only with
    /// `appendonly yes` and `appendfsync always`; volatile if `CONFIG` is not allowed.
    /// `Some(_)` skips the question and trusts the operator.
    pub persistent_fencing: Option<bool>,
    /// TLS files for `rediss://` URLs (feature `tls`): a CA bundle (default: the system's
    /// trust store) and a client certificate with its key (mutual TLS). The URL
    /// parameters `tls_ca`, `tls_cert` and `tls_key` set them too; giving one file two
    /// different ways is an error.
    pub tls: TlsFiles,
    /// Replica acknowledgement (`WAIT`) of acquisitions and renewals: see
    /// [`WaitForReplicas`]. `None` (default): a write counts once the primary applied it.
    pub wait_for_replicas: Option<WaitForReplicas>,
    /// Leases per renewal script call (default [`MAX_RENEW_BATCH`], at most
    /// [`RENEW_BATCH_LIMIT`]); on a cluster, per primary. A larger batch takes fewer calls
    /// per tick and keeps the server (each primary) busy longer in each: Redis runs one
    /// script at a time, so every other client of that server waits meanwhile
    /// (BENCHMARKS.md gives the time per tick for each batch size).
    pub renew_batch: usize,
}

/// Acquisitions and renewals count only once `replicas` replicas acknowledged them
/// (Redis `WAIT`, sent in the same pipeline as the script, so on the same connection and
/// to the same node as the write).
///
/// **What it buys.** Replication is asynchronous: a primary that fails right after a
/// write may be replaced by a replica that never saw it. Without this option that can
/// lose an acquisition (the new primary has no lease, so a second holder gets it while
/// the first still believes), its fencing counter's `INCR` (a token issued again), or a
/// renewal (the lease lapses on the new primary up to one renewal period before its
/// holder's deadline). With it, an acquisition or renewal that fewer replicas
/// acknowledged within `timeout` is not counted: the acquire fails with a retryable
/// error and releases what it took, and a renewal fails (retryable), so the holder's
/// deadline does not move and it stops by the deadline of its last acknowledged one.
///
/// **What it costs.** Every acquisition and renewal waits for the replicas' replies: a
/// round trip from the primary to them. The server blocks the connection during a
/// `WAIT`, so the backend's other calls queue behind it: while the replicas do not
/// answer, `n` calls in flight take up to `n × timeout` (and calls past
/// [`RedisConfig::response_timeout`] fail with a timeout). Keep `timeout` small. While
/// fewer than `replicas` replicas are connected and in sync, no lease can be taken or
/// kept: availability is traded for the guarantee.
///
/// **What it does not buy.** `WAIT` is not consensus. A failover may still promote a
/// replica that had not acknowledged (one of several, or after a partition), and the
/// acknowledgement is of the replica's memory, not of its disk. It narrows the window;
/// for a lease that must never be lost to a failover use a consensus store (the etcd
/// backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitForReplicas {
    /// How many replicas must acknowledge (at least 1).
    pub replicas: u32,
    /// How long the primary waits for them: more than zero, and less than
    /// [`RedisConfig::response_timeout`] (which bounds the whole call).
    pub timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            key_prefix: "lease".to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            persistent_fencing: None,
            tls: TlsFiles::default(),
            wait_for_replicas: None,
            renew_batch: MAX_RENEW_BATCH,
        }
    }
}

impl RedisConfig {
    fn validate(&self) -> std::result::Result<(), InvalidInput> {
        keys::validate_prefix(&self.key_prefix)?;
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(InvalidInput::Other(format!(
                    "redis {what} must be greater than zero"
                )));
            }
        }
        if !(1..=RENEW_BATCH_LIMIT).contains(&self.renew_batch) {
            return Err(InvalidInput::Other(format!(
                "redis renew_batch must be 1 to {RENEW_BATCH_LIMIT}, not {}",
                self.renew_batch
            )));
        }
        if let Some(w) = self.wait_for_replicas {
            if w.replicas == 0 {
                return Err(InvalidInput::Other(
                    "redis wait_for_replicas.replicas must be at least 1".into(),
                ));
            }
            if w.timeout.is_zero() || w.timeout >= self.response_timeout {
                return Err(InvalidInput::Other(format!(
                    "redis wait_for_replicas.timeout ({:?}) must be more than zero and less \
                     than response_timeout ({:?})",
                    w.timeout, self.response_timeout
                )));
            }
        }
        Ok(())
    }

    /// The bound of one call: a reconnect plus a reply.
    fn call_timeout(&self) -> Duration {
        self.connect_timeout.saturating_add(self.response_timeout)
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Replies are bounded by one timer per call in `RedisBackend::send`.
            .set_response_timeout(None)
            // Fail fast while the server is down (each call triggers a new reconnect),
            // and reconnect promptly once it is back.
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
    }
}

/// A lease store on a single Redis (or Valkey) server.
///
/// Cheap to clone: clones share one multiplexed, self-reconnecting connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), lease_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseClient, LeaseOptions};
/// use lease_redis::RedisBackend;
///
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let client = LeaseClient::new(Arc::new(backend));
/// let guard = client.acquire("nightly-report", &LeaseOptions::new(Duration::from_secs(30))?).await?;
/// println!("fencing token {}", guard.fencing());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// The connection in use; replaced (see [`RedisBackend::reconnect`]) when the server
    /// behind it stops being a writable primary.
    conn: RwLock<Arc<Conn>>,
    /// Held while a replacement connection is opened, so that a burst of failed calls
    /// opens one.
    reconnecting: tokio::sync::Mutex<()>,
    /// Where new connections come from.
    source: Source,
    config: RedisConfig,
    caps: Capabilities,
    /// Server address without credentials, for Debug and logs.
    server: String,
    /// The slot map, on a cluster (renewal batches are grouped by primary).
    slots: Option<cluster::Slots>,
    /// Whether the connection is known to be up: the last call got a reply (see
    /// [`RedisBackend::send`]).
    up: AtomicBool,
}

/// A connection to one server (self-reconnecting), or to a Redis Cluster (which routes
/// each call to its slot's primary and follows redirections).
#[derive(Clone)]
enum Link {
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
struct Conn {
    cm: Link,
    /// For dedicated pub/sub connections (release notification); `None` when built from a
    /// bare connection manager.
    client: Option<Client>,
    /// Counts replacements, so that only the first of many failed calls replaces it.
    generation: u64,
}

/// Where a [`RedisBackend`] gets a new connection when the server it talks to is no
/// longer a writable primary.
enum Source {
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

/// One acquire, as carried in a (possibly shared) script run.
struct AcquireReq {
    lock: String,
    fence: String,
    token: String,
    /// The lease field's value as acquire writes it (see `scripts`).
    meta: String,
    ttl_ms: u64,
}

impl AcquireReq {
    fn new(prefix: &str, name: &LeaseName, owner: &Owner, ttl_ms: u64) -> Self {
        let (lock, fence) = keys::lock_and_fence(prefix, name);
        let label = owner.label.as_str();
        let mut meta = String::with_capacity(22 + label.len());
        meta.push('~');
        meta.push_str(itoa::Buffer::new().format(ttl_ms));
        meta.push('\n');
        meta.push_str(label);
        AcquireReq {
            lock,
            fence,
            token: token_string(&owner.token),
            meta,
            ttl_ms,
        }
    }
}

/// The owner token as the hyphenated string stored in Redis.
fn token_string(token: &OwnerToken) -> String {
    let mut buf = uuid::Uuid::encode_buffer();
    token
        .as_uuid()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.inner.server)
            .field("key_prefix", &self.inner.config.key_prefix)
            .field("fencing", &self.inner.caps.fencing)
            .field(
                "release_notification",
                &self.inner.caps.release_notification,
            )
            .finish_non_exhaustive()
    }
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
    async fn connect_cluster(url: cluster::ClusterUrl, config: RedisConfig) -> Result<Self> {
        if url.tls {
            ensure_crypto_provider();
        }
        let certs = tls_certificates(&config.tls)?;
        let conn =
            cluster::open(&url, config.connect_timeout, config.response_timeout, certs).await?;
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
    async fn connect_sentinel(url: sentinel::SentinelUrl, config: RedisConfig) -> Result<Self> {
        let server = url.describe();
        let mut sc = url.client()?;
        let client = bounded(
            "connect",
            config.connect_timeout,
            config.response_timeout,
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
    /// every call is still bounded as [`RedisConfig::response_timeout`] says.
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

    async fn build(
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
                    .primaries(&mut c.clone(), config.response_timeout)
                    .await
                    .map_err(|e| convert("connect", config.response_timeout, e))?;
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
        // A waiter needs a pub/sub connection: from the client, or on a cluster to the
        // node serving the lease's slot.
        caps.release_notification = client.is_some() || matches!(source, Source::Cluster(_));
        caps.max_renew_batch = max_renew_batch;
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
    fn current(&self) -> Arc<Conn> {
        self.inner
            .conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn conn(&self) -> Link {
        self.current().cm.clone()
    }

    /// Opens a new connection in place of the one of `generation`, unless another call
    /// already did: from the URL's address again (after a failover behind a stable
    /// address it leads to the new primary), or from the primary Sentinel names now.
    /// Returns the connection to use; the old one closes once its last call is done.
    async fn reconnect(&self, generation: u64, why: &RedisError) -> Result<Arc<Conn>> {
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
                    cfg.response_timeout,
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
    fn needs_new_connection(&self, e: &RedisError) -> bool {
        let demoted = matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        demoted || (matches!(self.inner.source, Source::Sentinel(_)) && connection_failed(e))
    }

    fn prefix(&self) -> &str {
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
    async fn invoke(
        &self,
        operation: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<(Value, bool)> {
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
    /// gets `response_timeout`; otherwise it may have to reconnect first and gets
    /// `connect_timeout + response_timeout`, as does the retry after a dropped connection,
    /// counted from the first attempt.
    async fn send<F, Fut>(&self, operation: &'static str, call: F) -> Result<(Value, bool)>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = std::result::Result<Value, RedisError>>,
    {
        let cfg = &self.inner.config;
        let up = self.inner.up.load(Ordering::Relaxed);
        let budget = if up {
            cfg.response_timeout
        } else {
            cfg.call_timeout()
        };
        let start = tokio::time::Instant::now();
        let conn = self.current();
        let first = match tokio::time::timeout_at(start + budget, call(conn.cm.clone())).await {
            Ok(Ok(v)) => {
                if !up {
                    self.inner.up.store(true, Ordering::Relaxed);
                }
                return Ok((v, false));
            }
            Err(_) => {
                self.inner.up.store(false, Ordering::Relaxed);
                return Err(Error::Timeout {
                    operation,
                    after: budget,
                });
            }
            Ok(Err(e)) => e,
        };
        let deadline = start + cfg.call_timeout();
        let retry_on = if self.needs_new_connection(&first) {
            // Nothing was applied (a demoted server refuses the write; an unreachable one
            // never got it, or the retry recognises its own token): once more on a new
            // connection, within the same time budget.
            self.inner.up.store(false, Ordering::Relaxed);
            tracing::debug!(operation, error = %first, "redis server is not a writable primary; connecting again");
            match tokio::time::timeout_at(deadline, self.reconnect(conn.generation, &first)).await {
                Ok(Ok(next)) => next,
                Ok(Err(e)) => {
                    tracing::debug!(operation, error = %e, "redis: no new connection");
                    return Err(convert(operation, cfg.response_timeout, first));
                }
                Err(_) => return Err(convert(operation, cfg.response_timeout, first)),
            }
        } else if first.is_connection_dropped() {
            self.inner.up.store(false, Ordering::Relaxed);
            tracing::debug!(operation, error = %first, "redis connection dropped; retrying once");
            conn
        } else {
            if connection_failed(&first) {
                self.inner.up.store(false, Ordering::Relaxed);
            }
            return Err(convert(operation, cfg.response_timeout, first));
        };
        match tokio::time::timeout_at(deadline, call(retry_on.cm.clone())).await {
            Ok(Ok(v)) => {
                self.inner.up.store(true, Ordering::Relaxed);
                Ok((v, true))
            }
            Ok(Err(e)) => Err(convert(operation, cfg.response_timeout, e)),
            // Still no connection: the original error says more than the timeout.
            Err(_) => Err(convert(operation, cfg.response_timeout, first)),
        }
    }

    /// Sends one acquire. If the caller gives up while it is in flight (its future is
    /// dropped: a timeout around it, a `select!`), the lease may be taken for nobody, so
    /// it is released at once by its owner token instead of being left to its TTL.
    async fn acquire_req(&self, req: &AcquireReq) -> Result<(Value, bool, Option<i64>)> {
        let mut inv = scripts::ACQUIRE_SCRIPT.prepare_invoke();
        inv.key(&req.lock)
            .key(&req.fence)
            .arg(&req.token)
            .arg(&req.meta)
            .arg(req.ttl_ms);
        let mut in_flight = InFlight {
            backend: self,
            taken: Some((&req.lock, &req.token)),
        };
        let result = self.run_script("acquire", &inv).await;
        in_flight.taken = None;
        result
    }

    /// Runs a script that writes, and with [`RedisConfig::wait_for_replicas`] a `WAIT`
    /// after it in the same pipeline (so on the same connection and node). Returns the
    /// script's reply, whether it was retried after a dropped connection, and the number
    /// of replicas that acknowledged (`None` without the option).
    async fn run_script(
        &self,
        operation: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<(Value, bool, Option<i64>)> {
        let Some(w) = self.inner.config.wait_for_replicas else {
            let (v, retried) = self.invoke(operation, inv).await?;
            return Ok((v, retried, None));
        };
        let timeout_ms = u64::try_from(w.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.invoke_script(inv)
            .cmd("WAIT")
            .arg(w.replicas)
            .arg(timeout_ms);
        let pipe = &pipe;
        let (reply, retried) = self
            .send(operation, |mut conn| async move {
                match pipe.query_async::<Value>(&mut conn).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        inv.load_async(&mut conn).await?;
                        pipe.query_async::<Value>(&mut conn).await
                    }
                    other => other,
                }
            })
            .await?;
        let mut items = array(operation, reply)?.into_iter();
        let (Some(script), Some(acks), None) = (items.next(), items.next(), items.next()) else {
            return Err(unexpected(
                operation,
                "a script and WAIT pipeline did not get 2 replies",
            ));
        };
        let acks = int(operation, "WAIT", &acks)?;
        Ok((script, retried, Some(acks)))
    }

    /// With [`RedisConfig::wait_for_replicas`]: a retryable error unless `acks` replicas
    /// are enough. `retried` (the write's connection dropped, and the reply came on a new
    /// one, whose `WAIT` covers nothing written before it) never counts as acknowledged.
    fn acknowledged(&self, what: &str, acks: Option<i64>, retried: bool) -> Result<()> {
        let (Some(w), Some(acks)) = (self.inner.config.wait_for_replicas, acks) else {
            return Ok(());
        };
        if acks >= i64::from(w.replicas) && !retried {
            return Ok(());
        }
        let why = if retried {
            format!("the {what} was confirmed on a new connection, whose WAIT proves nothing")
        } else {
            format!(
                "{acks} of {} replicas acknowledged the {what} within {:?}",
                w.replicas, w.timeout
            )
        };
        Err(Error::unavailable(BACKEND, why))
    }

    /// Releases without keep-for: `HDEL <lock> <token> <token>:w`, a native command (no
    /// script), then, only if that freed a lease someone waits for (the `:w` field was
    /// there), `PUBLISH`. Returns whether this owner held the lease. A key of another
    /// type (not written by this crate) counts as not ours.
    async fn release_now(&self, lock: &str, token: &str) -> Result<bool> {
        const OP: &str = "release";
        let mut marker = String::with_capacity(token.len() + 2);
        marker.push_str(token);
        marker.push_str(":w");
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(lock).arg(token).arg(&marker);
        let cmd = &cmd;
        let (reply, retried) = self
            .send(OP, |mut conn| async move {
                match cmd.query_async::<Value>(&mut conn).await {
                    // Not a hash: not a lease of this crate, so not ours.
                    Err(e) if e.code() == Some("WRONGTYPE") => Ok(Value::Int(0)),
                    other => other,
                }
            })
            .await?;
        let removed = int(OP, "HDEL", &reply)?;
        // A second run of this `HDEL` (our retry after a dropped connection, or the
        // cluster client's own re-send, which this code does not see) removes nothing
        // although the first one may have freed a waited-for lease: announce it then too
        // (a waiter woken for nothing checks again and waits on).
        let maybe_rerun = removed == 0 && (retried || self.inner.slots.is_some());
        if removed == 2 || maybe_rerun {
            let mut conn = self.conn();
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(keys::sibling(lock, ":released")).arg("1");
            let publish = cmd.query_async::<i64>(&mut conn);
            let cfg = &self.inner.config;
            if let Err(error) = bounded(OP, cfg.call_timeout(), cfg.response_timeout, publish).await
            {
                // Released all the same; the waiters wake at the end of their wait.
                tracing::warn!(%error, "announcing a release failed");
            }
        }
        Ok(removed > 0)
    }

    /// On a cluster, a client of the primary serving `lock`'s slot, for a waiter's pub/sub
    /// connection. A release's `PUBLISH` reaches every node of a cluster (over its bus), so
    /// the node only needs to be up; the slot's primary is the one the release runs on.
    async fn node_client(&self, url: &cluster::ClusterUrl, lock: &str) -> Result<Client> {
        const OP: &str = "wait_released";
        let reply_timeout = self.inner.config.response_timeout;
        let (Some(slots), Link::Cluster(mut conn)) = (&self.inner.slots, self.conn()) else {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "release notification on a cluster without its connection",
            });
        };
        let node = slots
            .nodes_of(&mut conn, &[cluster::slot(lock.as_bytes())], reply_timeout)
            .await
            .map_err(|e| convert(OP, reply_timeout, e))?
            .into_iter()
            .flatten()
            .next()
            .ok_or_else(|| {
                Error::unavailable(BACKEND, "no node of the cluster serves the lease's slot")
            })?;
        // The node's URL has the cluster URL's scheme and credentials, and gets its TLS
        // files.
        tls_client(&url.node_url(&node), &self.inner.config.tls)
    }

    /// Renews a batch on a cluster: one script call per primary (the leases grouped by the
    /// primary that serves each one's slot in the slot map), sent concurrently; a group
    /// that fails (a slot moved since the map was read) is renewed again lease by lease,
    /// each call sent to its slot's node, and the map is read again.
    async fn renew_cluster(
        &self,
        slots: &cluster::Slots,
        conn: ClusterConnection,
        leases: &[RenewItem],
        ttl_ms: u64,
    ) -> Result<Vec<RenewOutcome>> {
        const OP: &str = "renew";
        let prefix = self.prefix();
        let keys: Vec<String> = leases
            .iter()
            .map(|l| keys::lock_key(prefix, &l.name))
            .collect();
        let tokens: Vec<String> = leases.iter().map(|l| l.token.to_string()).collect();
        let slot_ids: Vec<u16> = keys.iter().map(|k| cluster::slot(k.as_bytes())).collect();
        let nodes = match slots
            .nodes_of(
                &mut conn.clone(),
                &slot_ids,
                self.inner.config.response_timeout,
            )
            .await
        {
            Ok(nodes) => nodes,
            Err(error) => {
                tracing::debug!(%error, "redis cluster: no slot map; renewing lease by lease");
                vec![None; leases.len()]
            }
        };
        let mut groups: std::collections::BTreeMap<cluster::Node, Vec<usize>> =
            std::collections::BTreeMap::new();
        let mut singles = Vec::new();
        for (i, node) in nodes.into_iter().enumerate() {
            match node {
                Some(n) => groups.entry(n).or_default().push(i),
                None => singles.push(i),
            }
        }
        let mut out: Vec<Option<RenewOutcome>> = vec![None; leases.len()];
        let group_calls = groups.into_values().map(|ids| {
            let (keys, tokens) = (&keys, &tokens);
            async move {
                let mut inv = scripts::RENEW_CLUSTER_SCRIPT.prepare_invoke();
                inv.arg(ttl_ms);
                if let Some(&first) = ids.first() {
                    inv.key(&keys[first]);
                }
                for &i in &ids {
                    inv.arg(&keys[i]).arg(&tokens[i]);
                }
                let reply = self.run_script(OP, &inv).await;
                (ids, reply)
            }
        });
        for (ids, reply) in futures::future::join_all(group_calls).await {
            if let Ok((_, retried, acks)) = &reply {
                // Renewed on the primary, but not acknowledged: none of the batch counts.
                self.acknowledged("renewal", *acks, *retried)?;
            }
            let parsed = reply.and_then(|(v, _, _)| renew_replies(OP, v, ids.len()));
            match parsed {
                Ok(results) => {
                    for (i, r) in ids.into_iter().zip(results) {
                        match r {
                            Some(r) => out[i] = Some(r),
                            // Not on this node: lapsed, or its slot moved. Asked again
                            // with the key declared, the server redirects if it moved.
                            None => singles.push(i),
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, leases = ids.len(), "redis cluster: a renewal group failed; renewing its leases one by one");
                    slots.invalidate();
                    singles.extend(ids);
                }
            }
        }
        let single_calls = singles.into_iter().map(|i| {
            let (keys, tokens) = (&keys, &tokens);
            async move {
                let mut inv = scripts::RENEW_SCRIPT.prepare_invoke();
                inv.arg(ttl_ms).key(&keys[i]).arg(&tokens[i]);
                let reply = self
                    .run_script(OP, &inv)
                    .await
                    .and_then(|(v, retried, acks)| {
                        self.acknowledged("renewal", acks, retried)?;
                        renew_results(OP, v, 1)
                    });
                (i, reply)
            }
        });
        for (i, result) in futures::future::join_all(single_calls).await {
            out[i] = result?.into_iter().next();
        }
        out.into_iter()
            .zip(leases)
            .map(|(r, item)| {
                let r = r.ok_or_else(|| unexpected(OP, "a lease of the batch got no result"))?;
                if r == RenewOutcome::Lost {
                    tracing::debug!(lease = %item.name, "redis lease lost at renewal");
                }
                Ok(r)
            })
            .collect()
    }

    /// Releases, in a task of its own, a lease whose acquire was in flight when its
    /// caller gave up. The release goes out after the acquire on the same connection, so
    /// it cannot overtake it; if the acquire took nothing, it finds nothing to release.
    fn release_abandoned(&self, lock: String, token: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::debug!(key = %lock, "redis acquire abandoned in flight; releasing what it may have taken");
        let backend = self.clone();
        runtime.spawn(async move {
            if let Err(error) = backend.release_now(&lock, &token).await {
                tracing::warn!(%error, "releasing an abandoned acquire failed; the TTL frees it");
            }
        });
    }
}

/// An acquire in flight, or the release of an unacknowledged acquisition: dropped before
/// it is done (`taken` still set: lock key and owner token), it has the lease released in
/// a task of its own (see [`RedisBackend::acquire_req`]).
struct InFlight<'a> {
    backend: &'a RedisBackend,
    taken: Option<(&'a str, &'a str)>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some((lock, token)) = self.taken.take() {
            // Owned copies only here, on the rare path: the task outlives the call.
            self.backend
                .release_abandoned(lock.to_owned(), token.to_owned());
        }
    }
}

/// Whether `e` says the connection failed (as opposed to an error reply from a working
/// server).
fn connection_failed(e: &RedisError) -> bool {
    e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error()
}

/// The client for `url`, with `tls`'s files for a `rediss://` URL.
fn tls_client(url: &str, tls: &TlsFiles) -> Result<Client> {
    let secure = url
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"));
    if secure && !cfg!(feature = "_tls") {
        return Err(Error::tls(
            BACKEND,
            "rediss:// needs the `tls` feature (of the lease crate, or of lease-redis)",
        ));
    }
    if tls.is_empty() {
        return Client::open(url).map_err(|e| error::malformed_url(url, &e));
    }
    if !secure {
        return Err(InvalidInput::MalformedUrl(format!(
            "{}: TLS files are given, but the URL is not rediss://",
            error::redact_url(url)
        ))
        .into());
    }
    match tls_certificates(tls)? {
        #[cfg(feature = "_tls")]
        Some(certs) => Client::build_with_tls(url, certs).map_err(|e| {
            // The files were read; the client library could not use them.
            let text = lease_core::error_chain_text(&e);
            Error::tls(
                BACKEND,
                format!("the TLS files {tls:?} could not be used: {text}"),
            )
        }),
        #[cfg(not(feature = "_tls"))]
        Some(certs) => match certs {},
        None => Client::open(url).map_err(|e| error::malformed_url(url, &e)),
    }
}

/// Before a TLS connection: the redis client builds its TLS settings from rustls's
/// process-wide crypto provider (and rustls panics where it cannot pick one). If the
/// application installed a provider, it is used and nothing changes. Otherwise the one
/// this crate was built with is installed (ring with `tls` or `tls-ring`, aws-lc-rs with
/// `tls-aws-lc-rs`, ring when both are), and that is logged: rustls keeps one provider
/// per process, so an application that wants another installs it before its first TLS
/// connection to Redis. Without a TLS feature, nothing.
fn ensure_crypto_provider() {
    #[cfg(any(feature = "tls-ring", feature = "tls-aws-lc-rs"))]
    {
        if rustls::crypto::CryptoProvider::get_default().is_some() {
            return;
        }
        #[cfg(feature = "tls-ring")]
        let (provider, name) = (rustls::crypto::ring::default_provider(), "ring");
        #[cfg(not(feature = "tls-ring"))]
        let (provider, name) = (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs");
        // An error means another thread installed one meanwhile: that one is used.
        if provider.install_default().is_ok() {
            tracing::info!(
                provider = name,
                "installed rustls's process-wide crypto provider for TLS to Redis (the \
                 application had installed none; to use another, install it before the \
                 first TLS connection)"
            );
        }
    }
}

/// The certificates `tls`'s files give, read now (`None` without files). Installs a
/// crypto provider for rustls if the application installed none (see
/// [`ensure_crypto_provider`]).
fn tls_certificates(tls: &TlsFiles) -> Result<Option<cluster::Certs>> {
    if tls.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "_tls")]
    {
        ensure_crypto_provider();
        let pem = tls.load(BACKEND)?;
        Ok(Some(redis::TlsCertificates {
            client_tls: pem
                .identity
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: pem.ca,
        }))
    }
    #[cfg(not(feature = "_tls"))]
    {
        Err(Error::tls(
            BACKEND,
            "TLS files need the `tls` feature (of the lease crate, or of lease-redis)",
        ))
    }
}

/// A connection manager on `client`, its first connection made within the connect timeout.
async fn open_manager(client: &Client, config: &RedisConfig) -> Result<ConnectionManager> {
    let connect = ConnectionManager::new_with_config(client.clone(), config.manager_config());
    let opened = bounded(
        "connect",
        config.connect_timeout,
        config.response_timeout,
        connect,
    )
    .await;
    match opened {
        Err(e @ (Error::Timeout { .. } | Error::Unavailable { .. })) => {
            Err(plain_port(client, config.response_timeout)
                .await
                .unwrap_or(e))
        }
        other => other,
    }
}

/// For a `rediss://` connection that got no answer: whether the port speaks plain RESP
/// instead of TLS. redis-server reads a TLS hello on its plain port as the start of an
/// inline command and waits for the rest of the line, so the TLS connect just times out;
/// a plain `PING` on the same port answers at once.
async fn plain_port(client: &Client, bound: Duration) -> Option<Error> {
    let redis::ConnectionAddr::TcpTls { host, port, .. } = client.get_connection_info().addr()
    else {
        return None;
    };
    let probe = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .ok()?;
        tcp.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 16];
        let n = tcp.read(&mut reply).await.ok()?;
        let reply = reply.get(..n)?;
        (reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")).then(|| {
            Error::tls(
                BACKEND,
                format!(
                    "the server did not answer in TLS: port {port} speaks plain text (use \
                     redis:// there, or the server's tls-port with rediss://)"
                ),
            )
        })
    };
    tokio::time::timeout(bound, probe).await.ok().flatten()
}

/// Bounds `fut` by `after` ([`Error::Timeout`] when it elapses) and converts its error;
/// `reply_timeout` is what an I/O timeout inside the client is reported as.
async fn bounded<T>(
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
async fn probe_persistence(cm: &ConnectionManager, config: &RedisConfig) -> Result<bool> {
    let mut conn = cm.clone();
    let mut pipe = redis::pipe();
    pipe.cmd("CONFIG").arg("GET").arg("appendonly");
    pipe.cmd("CONFIG").arg("GET").arg("appendfsync");
    let reply = bounded(
        "connect",
        config.call_timeout(),
        config.response_timeout,
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

/// The results of a renew script's reply for `n` leases: 1 renewed, 0 lost, 2 lost
/// because the key is not there (`None`: on a cluster the key may have moved).
fn renew_replies(
    operation: &'static str,
    reply: Value,
    n: usize,
) -> Result<Vec<Option<RenewOutcome>>> {
    let items = array(operation, reply)?;
    if items.len() != n {
        return Err(unexpected(
            operation,
            format!("{} results for {n} leases", items.len()),
        ));
    }
    items
        .iter()
        .map(|v| match int(operation, "result", v)? {
            1 => Ok(Some(RenewOutcome::Renewed)),
            0 => Ok(Some(RenewOutcome::Lost)),
            2 => Ok(None),
            other => Err(unexpected(operation, format!("result {other}"))),
        })
        .collect()
}

/// [`renew_replies`] where a missing key is lost (one server, or a call that declared
/// the key: the server would have redirected it if the key had moved).
fn renew_results(operation: &'static str, reply: Value, n: usize) -> Result<Vec<RenewOutcome>> {
    Ok(renew_replies(operation, reply, n)?
        .into_iter()
        .map(|r| r.unwrap_or(RenewOutcome::Lost))
        .collect())
}

/// Asks every primary of a cluster whether writes survive a crash, as
/// [`probe_persistence`] asks one server: fencing is durable only if every primary says
/// so (a lease's counter lives on its slot's primary, and slots move).
async fn probe_cluster_persistence(
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
        .primaries(&mut conn, config.response_timeout)
        .await
        .map_err(|e| convert(OP, config.response_timeout, e))?;
    if primaries.is_empty() {
        return Err(unexpected(OP, "CLUSTER SLOTS named no primary"));
    }
    let mut durable = true;
    for node in &primaries {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("appendonly").arg("appendfsync");
        let reply = cluster::on_node(&mut conn, node, cmd, config.response_timeout).await;
        let pairs = match reply {
            Ok(v) => config_pairs(&v),
            Err(e) if connection_failed(&e) || e.is_timeout() => {
                return Err(convert(OP, config.response_timeout, e));
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
fn config_pairs(v: &Value) -> Vec<(String, String)> {
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

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn int(operation: &'static str, what: &str, v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(operation, format!("{what} is not an integer"))),
        other => Err(unexpected(
            operation,
            format!("{what}: expected an integer, got {other:?}"),
        )),
    }
}

fn non_negative(operation: &'static str, what: &str, v: &Value) -> Result<u64> {
    u64::try_from(int(operation, what, v)?)
        .map_err(|_| unexpected(operation, format!("negative {what}")))
}

fn array(operation: &'static str, v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(
            operation,
            format!("expected an array, got {other:?}"),
        )),
    }
}

/// A PTTL reply as a remaining time: `None` for "no expiry" (-1) or "no key" (-2).
fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// A duration in whole milliseconds, rounded up, at least 1 ms; rejects more than
/// [`MAX_TTL`].
fn ttl_millis(what: &'static str, d: Duration) -> std::result::Result<u64, InvalidInput> {
    if d > MAX_TTL {
        return Err(InvalidInput::TooLarge {
            what,
            value: d,
            max: MAX_TTL,
        });
    }
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    u64::try_from(ms).map_err(|_| InvalidInput::TooLarge {
        what,
        value: d,
        max: MAX_TTL,
    })
}

/// `keep_for` in whole milliseconds, rounded up; zero stays zero.
fn keep_millis(d: Duration) -> std::result::Result<u64, InvalidInput> {
    if d.is_zero() {
        Ok(0)
    } else {
        ttl_millis("keep_for", d)
    }
}

#[lease_core::async_trait]
impl LeaseBackend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        const OP: &str = "acquire";
        let ttl_ms = ttl_millis("ttl", ttl)?;
        let req = AcquireReq::new(self.prefix(), name, owner, ttl_ms);
        let (reply, retried, acks) = self.acquire_req(&req).await?;
        // Flag 2, "held by this very token": a second run of this same call (owner tokens
        // are new for every acquisition) when it may have been re-sent: by our retry after
        // a dropped connection, or on a cluster by the cluster client itself, which this
        // code does not see. Then the lease is ours, and a `WAIT` in the second run's
        // pipeline covers nothing the first run wrote. Otherwise (a caller acquiring again
        // with a token that holds the lease) it is `Held`, as the trait says.
        let rerun = (retried || self.inner.slots.is_some())
            && matches!(&reply, Value::Array(a) if matches!(a.first(), Some(Value::Int(2))));
        let acquired = matches!(reply, Value::Int(_)) || rerun;
        if acquired && let Err(e) = self.acknowledged("acquisition", acks, retried || rerun) {
            // Not counted: give back what the primary took (the TTL frees it if this
            // fails too); if the caller gives up meanwhile, a task of its own does.
            let mut giving_back = InFlight {
                backend: self,
                taken: Some((&req.lock, &req.token)),
            };
            if let Err(error) = self.release_now(&req.lock, &req.token).await {
                tracing::warn!(lease = %name, %error, "releasing an unacknowledged acquisition failed; its TTL frees it");
            }
            giving_back.taken = None;
            return Err(e);
        }
        // Acquired: the fencing token alone, for the TTL asked for.
        if let Value::Int(_) = reply {
            let fencing = non_negative(OP, "fencing token", &reply)?;
            tracing::debug!(lease = %name, fencing, ttl_ms, "redis lease acquired");
            return Ok(AcquireOutcome::Acquired {
                fencing: FencingToken(fencing),
                ttl: Duration::from_millis(ttl_ms),
            });
        }
        let items = array(OP, reply)?;
        let (flag, rest) = match items.split_first() {
            Some((flag, rest)) => (int(OP, "flag", flag)?, rest),
            None => return Err(unexpected(OP, "empty reply")),
        };
        match (flag, rest) {
            // Our own acquisition, seen by a second run of the same call.
            (2, [_, pttl, fencing]) if rerun => {
                let fencing = non_negative(OP, "fencing token", fencing)?;
                let pttl = non_negative(OP, "pttl", pttl)?;
                tracing::debug!(lease = %name, fencing, ttl_ms = pttl, "redis lease acquired (confirmed by retry)");
                Ok(AcquireOutcome::Acquired {
                    fencing: FencingToken(fencing),
                    ttl: Duration::from_millis(pttl),
                })
            }
            (3, [error]) => {
                let error = text(error).unwrap_or_default();
                Err(unexpected(
                    OP,
                    format!("the acquire script failed, nothing taken: {error}"),
                ))
            }
            (0, [holder, pttl]) | (2, [holder, pttl, _]) => {
                let holder =
                    text(holder).ok_or_else(|| unexpected(OP, "holder label is not a string"))?;
                let pttl = int(OP, "pttl", pttl)?;
                tracing::trace!(lease = %name, %holder, pttl, "redis lease held");
                Ok(AcquireOutcome::Held(HeldBy {
                    holder: (!holder.is_empty()).then_some(holder),
                    remaining: remaining(pttl),
                }))
            }
            (flag, rest) => Err(unexpected(
                OP,
                format!("flag {flag} with {} more items", rest.len()),
            )),
        }
    }

    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        const OP: &str = "renew";
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > self.inner.caps.max_renew_batch {
            return Err(InvalidInput::BatchTooLarge {
                len: leases.len(),
                max: self.inner.caps.max_renew_batch,
            }
            .into());
        }
        let ttl_ms = ttl_millis("ttl", ttl)?;
        let prefix = self.prefix();
        if let (Some(slots), Link::Cluster(conn)) = (&self.inner.slots, self.conn()) {
            return self.renew_cluster(slots, conn, leases, ttl_ms).await;
        }
        let mut inv = scripts::RENEW_SCRIPT.prepare_invoke();
        inv.arg(ttl_ms);
        for item in leases {
            inv.key(keys::lock_key(prefix, &item.name))
                .arg(item.token.to_string());
        }
        let (reply, retried, acks) = self.run_script(OP, &inv).await?;
        self.acknowledged("renewal", acks, retried)?;
        let items = array(OP, reply)?;
        if items.len() != leases.len() {
            return Err(unexpected(
                OP,
                format!("{} results for {} leases", items.len(), leases.len()),
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for (item, v) in leases.iter().zip(&items) {
            let outcome = match int(OP, "result", v)? {
                1 => RenewOutcome::Renewed,
                // 2: no such key (one server: it lapsed or was released).
                0 | 2 => RenewOutcome::Lost,
                other => return Err(unexpected(OP, format!("result {other}"))),
            };
            if outcome == RenewOutcome::Lost {
                tracing::debug!(lease = %item.name, "redis lease lost at renewal");
            }
            out.push(outcome);
        }
        tracing::trace!(count = leases.len(), "redis leases renewed");
        Ok(out)
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        const OP: &str = "release";
        let keep_ms = keep_millis(keep_for)?;
        let token = token_string(token);
        let released = if keep_ms == 0 {
            let lock = keys::lock_key(self.prefix(), name);
            self.release_now(&lock, &token).await?
        } else {
            let k = keys::keys(self.prefix(), name);
            let mut inv = scripts::RELEASE_KEEP_SCRIPT.prepare_invoke();
            inv.key(&k.lock).arg(&token).arg(keep_ms).arg(&k.channel);
            let (reply, _) = self.invoke(OP, &inv).await?;
            match int(OP, "result", &reply)? {
                1 => true,
                0 => false,
                other => return Err(unexpected(OP, format!("result {other}"))),
            }
        };
        if released {
            tracing::debug!(lease = %name, keep_for_ms = keep_ms, "redis lease released");
            Ok(ReleaseOutcome::Released)
        } else {
            tracing::debug!(lease = %name, "redis lease release: not the owner");
            Ok(ReleaseOutcome::NotOwner)
        }
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        const OP: &str = "inspect";
        let k = keys::keys(self.prefix(), name);
        let mut inv = scripts::INSPECT_SCRIPT.prepare_invoke();
        inv.key(&k.lock).key(&k.fence);
        let (reply, _) = self.invoke(OP, &inv).await?;
        let items = array(OP, reply)?;
        match items.as_slice() {
            [flag] if int(OP, "flag", flag)? == 0 => Ok(None),
            [flag, holder, fencing, pttl] if int(OP, "flag", flag)? == 1 => {
                let holder =
                    text(holder).ok_or_else(|| unexpected(OP, "holder label is not a string"))?;
                let fencing =
                    text(fencing).ok_or_else(|| unexpected(OP, "fencing token is not a string"))?;
                let fencing = if fencing.is_empty() {
                    None
                } else {
                    Some(FencingToken(fencing.parse().map_err(|_| {
                        unexpected(OP, format!("fencing token {fencing:?} is not a number"))
                    })?))
                };
                let pttl = int(OP, "pttl", pttl)?;
                if pttl == -2 {
                    return Ok(None);
                }
                Ok(Some(LeaseInfo {
                    holder: (!holder.is_empty()).then_some(holder),
                    fencing,
                    remaining: remaining(pttl),
                }))
            }
            _ => Err(unexpected(
                OP,
                format!("unexpected reply of {} items", items.len()),
            )),
        }
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        const OP: &str = "force_release";
        let k = keys::keys(self.prefix(), name);
        let mut inv = scripts::FORCE_RELEASE_SCRIPT.prepare_invoke();
        inv.key(&k.lock).arg(&k.channel);
        let (reply, _) = self.invoke(OP, &inv).await?;
        let freed = int(OP, "result", &reply)? == 1;
        tracing::info!(lease = %name, freed, "redis lease force-released");
        Ok(freed)
    }

    /// Subscribes to the lease's release channel on a dedicated pub/sub connection, then
    /// checks the lease, then waits for the release message, the lease's expiry (which
    /// sends no message) or `max_wait`, whichever comes first.
    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        const OP: &str = "wait_released";
        let cfg = &self.inner.config;
        let k = keys::keys(self.prefix(), name);
        let client = match (&self.inner.source, self.current().client.clone()) {
            (Source::Cluster(url), _) => self.node_client(url, &k.lock).await?,
            (_, Some(client)) => client,
            (_, None) => {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    what: "release notification without a redis::Client",
                });
            }
        };
        let mut pubsub = bounded(
            OP,
            cfg.connect_timeout,
            cfg.response_timeout,
            client.get_async_pubsub(),
        )
        .await?;
        bounded(
            OP,
            cfg.response_timeout,
            cfg.response_timeout,
            pubsub.subscribe(&k.channel),
        )
        .await?;
        // Subscribed first, marked second: a release before the mark is seen by the
        // mark (the lease is free), one after it removes the mark and publishes.
        let mut inv = scripts::MARK_WAITING_SCRIPT.prepare_invoke();
        inv.key(&k.lock);
        let (pttl, _) = self.invoke(OP, &inv).await?;
        let wait = match int(OP, "pttl", &pttl)? {
            -2 => return Ok(()),
            p => remaining(p).map_or(max_wait, |r| r.min(max_wait)),
        };
        let mut messages = pubsub.on_message();
        match tokio::time::timeout(wait, messages.next()).await {
            Ok(Some(_)) | Err(_) => Ok(()),
            Ok(None) => Err(Error::unavailable(
                BACKEND,
                "pub/sub connection closed while waiting for a release",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(ttl_millis("ttl", Duration::ZERO).unwrap(), 1);
        assert_eq!(ttl_millis("ttl", Duration::from_nanos(1)).unwrap(), 1);
        assert_eq!(ttl_millis("ttl", Duration::from_micros(1001)).unwrap(), 2);
        assert_eq!(ttl_millis("ttl", Duration::from_secs(3)).unwrap(), 3000);
        assert!(ttl_millis("ttl", MAX_TTL + Duration::from_millis(1)).is_err());
        assert_eq!(keep_millis(Duration::ZERO).unwrap(), 0);
        assert_eq!(keep_millis(Duration::from_micros(1)).unwrap(), 1);
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = RedisConfig::default();
        assert_eq!(c.key_prefix, "lease");
        assert!(c.validate().is_ok());
        let bad = RedisConfig {
            key_prefix: "a{b}".into(),
            ..RedisConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RedisConfig {
            response_timeout: Duration::ZERO,
            ..RedisConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn parses_config_replies() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"appendonly".to_vec()),
            Value::BulkString(b"yes".to_vec()),
        ]);
        assert_eq!(
            config_pairs(&resp2),
            vec![("appendonly".to_owned(), "yes".to_owned())]
        );
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"appendfsync".to_vec()),
            Value::BulkString(b"always".to_vec()),
        )]);
        assert_eq!(
            config_pairs(&resp3),
            vec![("appendfsync".to_owned(), "always".to_owned())]
        );
    }

    #[tokio::test]
    async fn connect_rejects_bad_urls_without_echoing_passwords() {
        let err = RedisBackend::connect("http://user:hunter2@localhost")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::InvalidInput(InvalidInput::MalformedUrl(_))),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        #[cfg(not(feature = "_tls"))]
        {
            let err = RedisBackend::connect("rediss://:hunter2@localhost")
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("`tls` feature"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let err = RedisBackend::connect("not a url at all :hunter2@")
            .await
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
    }
}
