#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod error;
mod keys;
mod state;
#[cfg(feature = "_tls")]
mod tls_probe;
mod url;
mod watch;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, LeaseTimeToLiveOptions,
    PutOptions, Txn, TxnOp, TxnOpResponse,
};
use futures::StreamExt;
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
    TlsFiles,
};
use tokio::time::Instant;

use crate::error::{
    BACKEND, bounded, call, call_retrying, convert, is_lease_not_found, retrying, unexpected,
};
use crate::keys::{Layout, decode_value, encode_value};
use crate::state::{FlightGuard, Held, Orphan, Pending, Session, Shared, WaiterGuard};

/// The `etcd-client` crate this backend is built on, for [`EtcdBackend::from_client`].
pub use etcd_client;

/// How often `renew` looks for keys nobody renewed within their TTL.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The shortest etcd lease a default etcd server grants: it raises any shorter TTL to
/// `ceil(1.5 × election timeout)`, 2 s with the default election timeout of 1 s (a lease
/// asked for 1 s lives 2 s). The default of [`EtcdConfig::min_ttl`]; the backend reads
/// every granted TTL back and logs when a server grants more.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// Largest renewal batch accepted in one call. A batch costs one keepalive per etcd lease
/// involved (normally one), whatever its size.
pub const MAX_RENEW_BATCH: usize = 1_000_000;

/// Settings of an [`EtcdBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_etcd::EtcdConfig;
/// let config = EtcdConfig {
///     prefix: "billing/leases".into(),
///     request_timeout: Duration::from_secs(2),
///     ..EtcdConfig::default()
/// };
/// assert_eq!(config.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// First part of every key (default `lease`): leases live under `<prefix>/l/`. 1 to 256
    /// bytes, no whitespace or control characters. Prefixes of different deployments
    /// should not nest (`a` and `a/l/...`).
    pub prefix: String,
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
            prefix: "lease".to_owned(),
            user: None,
            password: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            tls: None,
            min_ttl: MIN_TTL,
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("prefix", &self.prefix)
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
    /// assert_eq!(config.prefix, "billing");
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

    fn validate(&self) -> std::result::Result<(), InvalidInput> {
        keys::validate_prefix(&self.prefix)?;
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

    fn connect_options(&self) -> Result<ConnectOptions> {
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

/// `error`, or the TLS failure behind it: when TLS is configured and the connection
/// failed (rather than the server answering with an error), a handshake of our own tells
/// what the server refused (see `tls_probe`), knowing whether a client certificate was
/// sent (gRPC's own error may carry the server's alert, which does not say that).
async fn explain_tls(
    error: Error,
    config: &EtcdConfig,
    endpoints: &[String],
    bound: Duration,
) -> Error {
    #[cfg(feature = "_tls")]
    if let (Some(files), Error::Unavailable { .. } | Error::Backend { .. } | Error::Tls { .. }) =
        (&config.tls, &error)
        && let Ok(pem) = files.load(BACKEND)
    {
        for endpoint in endpoints.iter().filter(|e| e.starts_with("https://")) {
            if let Some(why) = tls_probe::diagnose(endpoint, &pem, bound).await {
                return Error::tls(BACKEND, why);
            }
        }
    }
    #[cfg(not(feature = "_tls"))]
    let _ = (config, endpoints, bound);
    error
}

/// `options` with TLS set up from `files`.
#[cfg(feature = "_tls")]
fn tls_options(options: ConnectOptions, files: &TlsFiles) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let pem = files.load(BACKEND)?;
    let mut tls = TlsOptions::new();
    tls = match pem.ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = pem.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "_tls"))]
fn tls_options(_: ConnectOptions, _: &TlsFiles) -> Result<ConnectOptions> {
    Err(Error::tls(
        BACKEND,
        "etcds:// needs the `tls` feature (of the lease crate, or of lease-etcd)",
    ))
}

/// A lease store on an etcd v3 cluster (etcd 3.4 or later).
///
/// Cheap to clone: clones share one connection (balanced over the endpoints), one session
/// lease per TTL, one watch and one record of held keys. See the [crate docs](crate) for
/// the design.
///
/// ```no_run
/// # async fn demo() -> Result<(), lease_core::Error> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseClient, LeaseOptions};
/// use lease_etcd::EtcdBackend;
///
/// let backend = EtcdBackend::from_url("etcd://127.0.0.1:2379").await?;
/// let client = LeaseClient::new(Arc::new(backend));
/// let guard = client.acquire("nightly-report", &LeaseOptions::new(Duration::from_secs(30))?).await?;
/// println!("fencing token {}", guard.fencing());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    layout: Layout,
    /// Endpoints without credentials, for Debug and logs.
    endpoints: Vec<String>,
    shared: Arc<Shared>,
    /// Serializes session lease grants, so concurrent first acquires grant one lease.
    grant_lock: tokio::sync::Mutex<()>,
    watch_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    keepalives: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let task = self
            .watch_task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.config.prefix)
            .field("user", &self.inner.config.user)
            .finish_non_exhaustive()
    }
}

/// The TTL etcd is asked for: whole seconds, rounded up, at least 1.
fn ttl_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

fn secs_i64(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn fencing_of(operation: &'static str, revision: i64) -> Result<FencingToken> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 => Ok(FencingToken(r)),
        _ => Err(unexpected(operation, format!("revision {revision}"))),
    }
}

/// How long a key's etcd lease has left.
enum Remaining {
    Left(Duration),
    /// The key has no lease: it never expires.
    NoExpiry,
    /// The lease is gone, so the key is too.
    Gone,
}

/// The outcome of one keepalive (and, when the watch cannot be trusted, a look at the keys
/// attached to the lease).
struct LeaseCheck {
    id: i64,
    sent: Instant,
    alive: bool,
    keys: Option<Attached>,
}

/// The keys attached to a lease at a store revision.
struct Attached {
    revision: i64,
    keys: HashSet<Vec<u8>>,
}

impl EtcdBackend {
    /// Connects to `endpoints` (`host:port` or `http://host:port`) with `config`.
    ///
    /// Without a user this does not talk to the server yet (the connection is made on first
    /// use); with a user it authenticates at once.
    ///
    /// Errors: [`InvalidInput`] for a bad config or endpoint; [`Error::Unavailable`],
    /// [`Error::Timeout`] or [`Error::Auth`] (bad credentials) when authenticating fails.
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect(endpoints: &[String], config: EtcdConfig) -> Result<Self> {
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
        if config.tls.is_some() && config.user.is_none() {
            // Without a user nothing has been sent yet; with TLS, find out now whether
            // the handshake works (a certificate problem is a configuration error that
            // every call would otherwise report).
            let mut probe = client.clone();
            match bounded("connect", bound, probe.status()).await? {
                Ok(_) => {}
                Err(e) => {
                    let e = convert("connect", bound, e);
                    return Err(explain_tls(e, &config, endpoints, bound).await);
                }
            }
        }
        Ok(Self::build(client, config, endpoints.to_vec()))
    }

    /// Connects to an `etcd://[user[:password]@]host[:port][,host[:port]...][/prefix]` URL
    /// with default timeouts. See [`EtcdConfig::from_url`] and [`EtcdBackend::connect`].
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn from_url(url: &str) -> Result<Self> {
        let (endpoints, config) = EtcdConfig::from_url(url)?;
        Self::connect(&endpoints, config).await
    }

    /// Uses an existing `etcd-client` [`Client`] (for connection settings
    /// this crate does not expose). `config`'s prefix and request timeout apply; its
    /// connection settings and credentials are ignored.
    pub fn from_client(client: Client, config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::build(client, config, Vec::new()))
    }

    fn build(client: Client, config: EtcdConfig, endpoints: Vec<String>) -> Self {
        EtcdBackend {
            inner: Arc::new(Inner {
                client,
                layout: Layout::new(&config.prefix),
                endpoints,
                config,
                shared: Arc::default(),
                grant_lock: tokio::sync::Mutex::new(()),
                watch_task: Mutex::new(None),
                keepalives: AtomicU64::new(0),
            }),
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// How many etcd lease keepalives `renew` has sent (for tests and metrics).
    #[doc(hidden)]
    pub fn keepalives_sent(&self) -> u64 {
        self.inner.keepalives.load(Ordering::Relaxed)
    }

    /// How many distinct etcd leases the keys this instance holds are attached to.
    #[doc(hidden)]
    pub fn etcd_leases_in_use(&self) -> usize {
        let st = self.inner.shared.lock();
        let ids: HashSet<i64> = st
            .keys
            .values()
            .filter_map(|k| k.held.as_ref().map(|h| h.lease))
            .collect();
        ids.len()
    }
}

impl Inner {
    fn timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// How often a request that could not reach a member is sent again.
    fn tries(&self) -> usize {
        2 * self.endpoints.len().max(2) + 1
    }

    /// One request, bounded by the request timeout, retried while it did not reach a
    /// server; the raw result.
    async fn rpc<T, F, Fut>(
        &self,
        operation: &'static str,
        attempt: F,
    ) -> Result<std::result::Result<T, etcd_client::Error>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        retrying(operation, self.timeout(), self.tries(), attempt).await
    }

    /// [`Inner::rpc`] with the error converted.
    async fn call<T, F, Fut>(&self, operation: &'static str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        call_retrying(operation, self.timeout(), self.tries(), attempt).await
    }

    /// The session lease for `secs`, granting one if there is none or the current one has
    /// less than half its TTL left.
    async fn session(&self, secs: u64, operation: &'static str) -> Result<Session> {
        if let Some(s) = self.usable_session(secs) {
            return Ok(s);
        }
        let _grant = self.grant_lock.lock().await;
        if let Some(s) = self.usable_session(secs) {
            return Ok(s);
        }
        let sent = Instant::now();
        let resp = self
            .call(operation, || {
                let mut lease = self.client.lease_client();
                async move { lease.grant(secs_i64(secs), None).await }
            })
            .await?;
        let granted = u64::try_from(resp.ttl())
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| {
                unexpected(operation, format!("lease granted with ttl {}", resp.ttl()))
            })?;
        if resp.id() == 0 {
            return Err(unexpected(operation, "lease granted with id 0"));
        }
        if granted > secs.max(self.config.min_ttl.as_secs()) {
            tracing::warn!(
                asked_secs = secs,
                granted_secs = granted,
                "etcd granted a longer lease than asked: its minimum lease TTL (1.5 x its \
                 election timeout) is above the {}s of EtcdConfig::min_ttl; leases of \
                 crashed holders stay taken that long",
                self.config.min_ttl.as_secs()
            );
        }
        let session = Session {
            id: resp.id(),
            granted: Duration::from_secs(granted),
            refreshed_at: sent,
        };
        tracing::debug!(
            lease_id = session.id,
            ttl_secs = granted,
            "granted etcd session lease"
        );
        self.shared.lock().sessions.insert(secs, session);
        let revision = resp.header().map_or(0, |h| h.revision());
        self.ensure_watch(revision + 1);
        Ok(session)
    }

    fn usable_session(&self, secs: u64) -> Option<Session> {
        let now = Instant::now();
        self.shared
            .lock()
            .sessions
            .get(&secs)
            .filter(|s| s.usable(now))
            .copied()
    }

    fn forget_session(&self, secs: u64, id: i64) {
        let mut st = self.shared.lock();
        if st.sessions.get(&secs).is_some_and(|s| s.id == id) {
            st.sessions.remove(&secs);
        }
    }

    /// Starts the watch (once), from `start_rev` at the latest; restarts it if its task
    /// ended.
    fn ensure_watch(&self, start_rev: i64) {
        let mut task = self.watch_task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        {
            let mut st = self.shared.lock();
            if !st.watch.started {
                st.watch.next_rev = start_rev.max(1);
                st.watch.started = true;
            }
            st.watch.healthy = false;
        }
        *task = Some(tokio::spawn(watch::run(
            self.client.watch_client(),
            self.layout.range_prefix().to_vec(),
            self.shared.clone(),
            self.timeout(),
        )));
    }

    /// Restarts a watch task that ended (it only ends by a panic in the client library).
    fn check_watch(&self) {
        let finished = self
            .watch_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| t.is_finished());
        if finished {
            let next = self.shared.lock().watch.next_rev;
            self.ensure_watch(next);
        }
    }

    /// One keepalive for lease `id`, or the answer of one already in flight that was sent
    /// after `call_started` (concurrent renewals of the same etcd lease share it: the lease
    /// was refreshed after each of them started). With `verify`, also the list of keys
    /// attached to the lease (never shared).
    async fn check_lease(
        &self,
        id: i64,
        verify: bool,
        call_started: Instant,
    ) -> Result<LeaseCheck> {
        if !verify {
            let joined = {
                let st = self.shared.lock();
                st.flights
                    .get(&id)
                    .filter(|f| f.sent >= call_started)
                    .map(|f| (f.sent, f.answer.clone()))
            };
            if let Some((sent, mut answer)) = joined {
                let shared = tokio::time::timeout(self.timeout(), async {
                    loop {
                        if let Some(alive) = *answer.borrow_and_update() {
                            return Some(alive);
                        }
                        if answer.changed().await.is_err() {
                            return None; // it failed or was cancelled: send our own
                        }
                    }
                })
                .await;
                if let Ok(Some(alive)) = shared {
                    return Ok(LeaseCheck {
                        id,
                        sent,
                        alive,
                        keys: None,
                    });
                }
            }
        }
        let t = self.timeout();
        let sent = Instant::now();
        let flight = (!verify).then(|| FlightGuard::start(&self.shared, id, sent));
        self.keepalives.fetch_add(1, Ordering::Relaxed);
        let keep_alive = async {
            let reply = self
                .rpc("renew", || {
                    let mut lease = self.client.lease_client();
                    async move { lease.keep_alive(id).await }
                })
                .await?;
            match reply {
                // Creating the keeper sends one keepalive and waits for its answer (TTL > 0);
                // dropping keeper and stream ends the stream.
                Ok(_) => Ok(true),
                Err(e) if is_lease_not_found(&e) => Ok(false),
                Err(e) => Err(convert("renew", t, e)),
            }
        };
        if let Some(flight) = flight {
            let alive = keep_alive.await?;
            flight.finish(alive);
            return Ok(LeaseCheck {
                id,
                sent,
                alive,
                keys: None,
            });
        }
        let attached = async {
            let resp = self
                .call("renew", || {
                    let mut lease = self.client.lease_client();
                    async move {
                        lease
                            .time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
                            .await
                    }
                })
                .await?;
            let revision = resp.header().map_or(0, |h| h.revision());
            Ok::<_, Error>((resp.ttl() >= 0).then(|| Attached {
                revision,
                keys: resp.keys().iter().cloned().collect(),
            }))
        };
        let (alive, keys) = tokio::try_join!(keep_alive, attached)?;
        Ok(LeaseCheck {
            id,
            sent,
            alive: alive && keys.is_some(),
            keys,
        })
    }

    /// How long `kv` has left, if it is a key this instance holds (a lower bound: counted
    /// from when the last keepalive was sent).
    fn local_remaining(&self, kv: &KeyValue) -> Option<Duration> {
        let st = self.shared.lock();
        let h = st.held(kv.key())?;
        let now = Instant::now();
        (h.lease == kv.lease() && h.rev == kv.mod_revision() && h.deadline > now)
            .then(|| h.deadline - now)
    }

    /// How long the lease of `kv` has left: from our own record when it is our key (no
    /// request), else asked of etcd (whose answer is whole seconds; this reports the upper
    /// bound, capped at the granted TTL).
    async fn remaining(&self, operation: &'static str, kv: &KeyValue) -> Result<Remaining> {
        if kv.lease() == 0 {
            return Ok(Remaining::NoExpiry);
        }
        if let Some(left) = self.local_remaining(kv) {
            return Ok(Remaining::Left(left));
        }
        let id = kv.lease();
        let resp = self
            .call(operation, || {
                let mut lease = self.client.lease_client();
                async move { lease.time_to_live(id, None).await }
            })
            .await?;
        let (Ok(ttl), granted) = (u64::try_from(resp.ttl()), resp.granted_ttl()) else {
            return Ok(Remaining::Gone);
        };
        let upper = ttl.saturating_add(1);
        let upper = u64::try_from(granted)
            .ok()
            .filter(|g| *g > 0)
            .map_or(upper, |g| upper.min(g));
        Ok(Remaining::Left(Duration::from_secs(upper)))
    }

    /// Deletes each key if it is still at its revision (ours), in the background, a few
    /// at a time.
    fn spawn_owner_deletes(&self, keys: Vec<(Vec<u8>, i64)>) {
        if keys.is_empty() {
            return;
        }
        let kv = self.client.kv_client();
        let t = self.timeout();
        tokio::spawn(async move {
            futures::stream::iter(keys)
                .for_each_concurrent(8, |(key, rev)| {
                    let mut kv = kv.clone();
                    async move {
                        let txn = Txn::new()
                            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                            .and_then([TxnOp::delete(key, None)]);
                        if let Err(e) = call("release", t, kv.txn(txn)).await {
                            tracing::debug!(error = %e, "deleting an unrenewed etcd key failed");
                        }
                    }
                })
                .await;
        });
    }

    /// Deletes keys that acquires may have put without their callers hearing so, each only
    /// while it still has the acquire's own value and etcd lease, in the background. A
    /// record is dropped once a delete sent after the acquire's request timeout was
    /// answered (by then the put has been applied or never will be); until then every
    /// renewal that keeps its etcd lease alive sends the delete again.
    fn spawn_orphan_deletes(&self, orphans: Vec<Orphan>) {
        let kv = self.client.kv_client();
        let t = self.timeout();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            futures::stream::iter(orphans)
                .for_each_concurrent(8, |o| {
                    let mut kv = kv.clone();
                    let shared = shared.clone();
                    async move {
                        let sent = Instant::now();
                        let txn = Txn::new()
                            .when([
                                Compare::value(o.key.clone(), CompareOp::Equal, o.value.clone()),
                                Compare::lease(o.key.clone(), CompareOp::Equal, o.lease),
                            ])
                            .and_then([TxnOp::delete(o.key.clone(), None)]);
                        let done = call("release", t, kv.txn(txn)).await;
                        match &done {
                            Ok(r) if r.succeeded() => {
                                tracing::info!(lease_id = o.lease, "deleted a key put by an acquire whose reply never arrived")
                            }
                            Ok(_) => {}
                            Err(e) => tracing::debug!(error = %e, "deleting an orphaned etcd key failed; the next renewal tries again"),
                        }
                        let final_answer = done.is_ok() && sent >= o.sent + t;
                        shared.lock().orphan_done(&o, final_answer);
                    }
                })
                .await;
        });
    }

    /// Revokes an etcd lease nobody uses, in the background (it would expire anyway).
    fn spawn_revoke(&self, id: i64) {
        let mut lease = self.client.lease_client();
        let t = self.timeout();
        tokio::spawn(async move {
            let _ = call("release", t, lease.revoke(id)).await;
        });
    }
}

#[lease_core::async_trait]
impl LeaseBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.backend = BACKEND;
        caps.fencing = Fencing::Durable;
        caps.expires = true;
        caps.min_ttl = self.inner.config.min_ttl;
        caps.ttl_granularity = Duration::from_secs(1);
        caps.holder_info = true;
        caps.keep_for = true;
        caps.release_notification = true;
        caps.max_renew_batch = MAX_RENEW_BATCH;
        caps
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let inner = &*self.inner;
        let t = inner.timeout();
        let secs = ttl_secs(ttl);
        let key = inner.layout.key(name.as_bytes());
        let value = encode_value(&owner.token, owner.label.as_str(), false);
        let started = Instant::now();
        let mut retried = false;
        loop {
            let session = inner.session(secs, "acquire").await?;
            // Until the store answers, the key may be put without this call hearing so:
            // dropped unsettled, `pending` records it for `renew` to delete.
            let mut pending = Pending::new(
                inner.shared.clone(),
                key.clone(),
                value.clone(),
                owner.token,
                session.id,
            );
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                .or_else([TxnOp::get(key.clone(), None)]);
            let reply = inner
                .rpc("acquire", || {
                    let mut kv = inner.client.kv_client();
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await?;
            let resp = match reply {
                Ok(resp) => {
                    pending.settle();
                    resp
                }
                Err(e) if !retried && is_lease_not_found(&e) => {
                    // Refused: nothing was put.
                    pending.settle();
                    // The session lease expired (or was revoked) behind our back.
                    tracing::debug!(lease = %name, lease_id = session.id, "session lease gone; granting a new one");
                    inner.forget_session(secs, session.id);
                    retried = true;
                    continue;
                }
                Err(e) => {
                    if is_lease_not_found(&e) {
                        pending.settle();
                    }
                    return Err(convert("acquire", t, e));
                }
            };
            if resp.succeeded() {
                let rev = resp.header().map_or(0, |h| h.revision());
                let fencing = fencing_of("acquire", rev)?;
                let expires = session.expires_at();
                {
                    let mut st = inner.shared.lock();
                    let k = st.keys.entry(key.clone()).or_default();
                    let lost = k.last_event_rev > rev;
                    k.held = Some(Held {
                        token: owner.token,
                        label: owner.label.as_str().to_owned(),
                        lease: session.id,
                        granted: session.granted,
                        rev,
                        locked_at: started,
                        deadline: expires,
                        lost,
                    });
                }
                drop(pending);
                tracing::debug!(lease = %name, fencing = rev, lease_id = session.id, "acquired");
                return Ok(AcquireOutcome::Acquired {
                    fencing,
                    ttl: expires
                        .saturating_duration_since(started)
                        .min(session.granted),
                });
            }
            drop(pending);
            let kv = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                    _ => None,
                })
                .ok_or_else(|| unexpected("acquire", "key exists but the read returned nothing"))?;
            let stored = decode_value(kv.value())
                .map_err(|e| unexpected("acquire", format!("lease {name}: {e}")))?;
            // Who holds it comes with the read; how long is known without another request
            // only when the holder is this instance (a waiting client is woken by the
            // release notification, which also covers expiry).
            let remaining = inner.local_remaining(&kv);
            tracing::debug!(lease = %name, holder = %stored.label, "held elsewhere");
            return Ok(AcquireOutcome::Held(HeldBy {
                holder: Some(stored.label),
                remaining,
            }));
        }
    }

    async fn renew(&self, leases: &[RenewItem], _ttl: Duration) -> Result<Vec<RenewOutcome>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let call_started = Instant::now();
        let inner = &*self.inner;
        inner.check_watch();
        let keys: Vec<Vec<u8>> = leases
            .iter()
            .map(|item| inner.layout.key(item.name.as_bytes()))
            .collect();
        let (ids, verify, generation) = {
            let st = inner.shared.lock();
            let ids: BTreeSet<i64> = keys
                .iter()
                .zip(leases)
                .filter_map(|(key, item)| {
                    st.held(key)
                        .filter(|h| h.token == item.token && !h.lost)
                        .map(|h| h.lease)
                })
                .collect();
            (
                ids,
                !st.watch.healthy || st.watch.needs_resync,
                st.watch.generation,
            )
        };
        if ids.is_empty() {
            return Ok(vec![RenewOutcome::Lost; leases.len()]);
        }
        let asked = Instant::now();
        let checks = futures::future::try_join_all(
            ids.iter()
                .map(|id| inner.check_lease(*id, verify, call_started)),
        )
        .await?;
        tracing::debug!(
            leases = leases.len(),
            etcd_leases = ids.len(),
            verify,
            took = ?asked.elapsed(),
            "keepalive"
        );

        let mut sweep = Vec::new();
        let orphans;
        let outcomes = {
            let mut st = inner.shared.lock();
            let mut renewed: HashMap<i64, Instant> = HashMap::new();
            for check in &checks {
                if !check.alive {
                    tracing::warn!(
                        lease_id = check.id,
                        "etcd session lease expired: every lease on it is lost"
                    );
                    st.on_lease_gone(check.id);
                    continue;
                }
                renewed.insert(check.id, check.sent);
                for s in st.sessions.values_mut() {
                    if s.id == check.id && s.refreshed_at < check.sent {
                        s.refreshed_at = check.sent;
                    }
                }
                if let Some(attached) = &check.keys {
                    for (key, k) in st.keys.iter_mut() {
                        if let Some(h) = &mut k.held {
                            // Keys put after the snapshot are not in it, but not lost.
                            if h.lease == check.id
                                && h.rev <= attached.revision
                                && !attached.keys.contains(key)
                            {
                                h.lost = true;
                            }
                        }
                    }
                }
            }
            if verify
                && st.watch.healthy
                && st.watch.generation == generation
                && checks.iter().all(|c| c.keys.is_some() || !c.alive)
            {
                st.watch.needs_resync = false;
            }
            let mut outcomes = Vec::with_capacity(leases.len());
            let mut lost = Vec::new();
            for (key, item) in keys.iter().zip(leases) {
                let held = st.keys.get_mut(key).and_then(|k| k.held.as_mut());
                let outcome = match held {
                    Some(h) if h.token == item.token => match renewed.get(&h.lease) {
                        Some(sent) if !h.lost => {
                            h.deadline = h.deadline.max(*sent + h.granted);
                            RenewOutcome::Renewed
                        }
                        _ => {
                            lost.push((key.clone(), h.rev, &item.name));
                            RenewOutcome::Lost
                        }
                    },
                    _ => RenewOutcome::Lost,
                };
                outcomes.push(outcome);
            }
            for (key, rev, name) in lost {
                tracing::info!(lease = %name, "lease lost on etcd (expired, deleted or overwritten)");
                st.forget_held(&key, rev);
            }
            // A keepalive renews every key on the lease. Keys nobody renewed within their
            // own TTL must not live on because of their neighbours: delete them. (A scan of
            // every held key, so at most every SWEEP_EVERY.)
            let now = Instant::now();
            if !renewed.is_empty()
                && st
                    .last_sweep
                    .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
            {
                st.last_sweep = Some(now);
                for (key, k) in &st.keys {
                    if let Some(h) = &k.held
                        && let Some(sent) = renewed.get(&h.lease)
                        && h.deadline < *sent
                        && !h.lost
                    {
                        sweep.push((key.clone(), h.rev));
                    }
                }
            }
            for (key, rev) in &sweep {
                st.forget_held(key, *rev);
            }
            orphans = st.orphans_to_delete(&renewed);
            outcomes
        };
        if !orphans.is_empty() {
            tracing::info!(
                keys = orphans.len(),
                "deleting keys put by acquires whose reply never arrived"
            );
            inner.spawn_orphan_deletes(orphans);
        }
        if !sweep.is_empty() {
            tracing::info!(
                keys = sweep.len(),
                "deleting keys nobody renewed within their ttl"
            );
            inner.spawn_owner_deletes(sweep);
        }
        Ok(outcomes)
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let inner = &*self.inner;
        let key = inner.layout.key(name.as_bytes());
        let local = inner
            .shared
            .lock()
            .held(&key)
            .filter(|h| h.token == *token && !h.lost)
            .map(|h| (h.rev, Some(h.locked_at), h.label.clone()));
        let (rev, locked_at, label) = match local {
            Some(found) => found,
            None => {
                // Not acquired through this instance (or lost): ask the store.
                let resp = inner
                    .call("release", || {
                        let mut kv = inner.client.kv_client();
                        let key = key.clone();
                        async move { kv.get(key, None).await }
                    })
                    .await?;
                let Some(kv) = resp.kvs().first() else {
                    return Ok(ReleaseOutcome::NotOwner);
                };
                match decode_value(kv.value()) {
                    Ok(s) if s.token == *token && !s.released => (kv.mod_revision(), None, s.label),
                    _ => return Ok(ReleaseOutcome::NotOwner),
                }
            }
        };
        // keep-for counts from the acquisition as this process saw it; for a lease taken
        // through another instance, from now.
        let keep = match locked_at {
            Some(at) => at.checked_add(keep_for).map_or(keep_for, |until| {
                until.saturating_duration_since(Instant::now())
            }),
            None => keep_for,
        };
        let owned = Compare::mod_revision(key.clone(), CompareOp::Equal, rev);
        let txn_call = |txn: Txn| {
            inner.call("release", move || {
                let mut kv = inner.client.kv_client();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
        };
        let succeeded = if keep.is_zero() {
            let txn = Txn::new()
                .when([owned])
                .and_then([TxnOp::delete(key.clone(), None)]);
            txn_call(txn).await?.succeeded()
        } else {
            // A lease of its own, never renewed: the key expires by itself, rounded up to
            // whole seconds, and the `released` state stops any renewal.
            let secs = secs_i64(ttl_secs(keep));
            let grant = inner
                .call("release", || {
                    let mut lease = inner.client.lease_client();
                    async move { lease.grant(secs, None).await }
                })
                .await?;
            if grant.id() == 0 || grant.ttl() <= 0 {
                return Err(unexpected(
                    "release",
                    format!("lease granted with id {} ttl {}", grant.id(), grant.ttl()),
                ));
            }
            let txn = Txn::new().when([owned]).and_then([TxnOp::put(
                key.clone(),
                encode_value(token, &label, true),
                Some(PutOptions::new().with_lease(grant.id())),
            )]);
            // On an error the transaction may have been applied (its reply was lost, the
            // leader changed after the commit): the new etcd lease may then carry the key,
            // and revoking it would end the keep-for at once. It is left to expire by
            // itself (it is never renewed), which is what the keep-for asks anyway.
            let succeeded = txn_call(txn).await?.succeeded();
            if !succeeded {
                // Answered and not applied: the new etcd lease carries nothing.
                inner.spawn_revoke(grant.id());
            }
            succeeded
        };
        inner.shared.lock().forget_held(&key, rev);
        tracing::debug!(lease = %name, released = succeeded, keep_for = ?keep, "release");
        Ok(if succeeded {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        })
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let inner = &*self.inner;
        let key = inner.layout.key(name.as_bytes());
        let mut resp = inner
            .call("inspect", || {
                let mut kv = inner.client.kv_client();
                let key = key.clone();
                async move { kv.get(key, None).await }
            })
            .await?;
        let Some(kv) = resp.take_kvs().into_iter().next() else {
            return Ok(None);
        };
        let stored = decode_value(kv.value())
            .map_err(|e| unexpected("inspect", format!("lease {name}: {e}")))?;
        let fencing = fencing_of("inspect", kv.create_revision())?;
        let remaining = match inner.remaining("inspect", &kv).await? {
            Remaining::Left(d) => Some(d),
            Remaining::NoExpiry => None,
            Remaining::Gone => return Ok(None),
        };
        Ok(Some(LeaseInfo {
            holder: Some(stored.label),
            fencing: Some(fencing),
            remaining,
        }))
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let inner = &*self.inner;
        let key = inner.layout.key(name.as_bytes());
        let resp = inner
            .call("force_release", || {
                let mut kv = inner.client.kv_client();
                let key = key.clone();
                async move { kv.delete(key, None).await }
            })
            .await?;
        let rev = resp.header().map_or(i64::MAX, |h| h.revision());
        {
            // A holder in this instance learns at once; one elsewhere through its watch.
            let mut st = inner.shared.lock();
            if let Some(h) = st.keys.get_mut(&key).and_then(|k| k.held.as_mut())
                && h.rev < rev
            {
                h.lost = true;
            }
        }
        tracing::info!(lease = %name, freed = resp.deleted() > 0, "force release");
        Ok(resp.deleted() > 0)
    }

    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        let inner = &*self.inner;
        let key = inner.layout.key(name.as_bytes());
        let waiter = WaiterGuard::new(inner.shared.clone(), key.clone());
        let notified = waiter.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Registered first, then looked: a delete after this read reaches the watch,
        // which starts at the latest right after it.
        let resp = inner
            .call("wait_released", || {
                let mut kv = inner.client.kv_client();
                let key = key.clone();
                async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        if resp.count() == 0 {
            return Ok(());
        }
        inner.ensure_watch(resp.header().map_or(0, |h| h.revision()) + 1);
        let _ = tokio::time::timeout(max_wait, notified).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(600)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }

    #[test]
    fn config_debug_hides_the_password() {
        let c = EtcdConfig {
            user: Some("root".into()),
            password: Some("hunter2".into()),
            ..EtcdConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("root") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn config_validation() {
        assert!(EtcdConfig::default().validate().is_ok());
        let bad = EtcdConfig {
            password: Some("x".into()),
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = EtcdConfig {
            request_timeout: Duration::ZERO,
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = EtcdConfig {
            prefix: String::new(),
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn capabilities_match_etcd() {
        let caps = {
            let mut c = Capabilities::default();
            c.min_ttl = MIN_TTL;
            c.ttl_granularity = Duration::from_secs(1);
            c
        };
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(600)),
            Duration::from_secs(2)
        );
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
    }
}
