//! One ZooKeeper session per TTL (and one for reads, watches and forced releases): opened
//! on first use, resumed on a new connection of the backend's own when the client
//! library's reconnection would wait too long ([`Sessions::resume_stalled`]), closed when
//! the backend is dropped. The leases held on them are in [`crate::records`]; the sweep
//! that deletes what nobody renewed is [`crate::sweep`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lease_core::{Error, InvalidInput, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::open_error;
use crate::records::Records;

/// The runtime the sessions' connection tasks and the sweep run on: one worker thread,
/// `lease-zookeeper-io`, made on first use and kept for the life of the process, so that
/// a backend keeps working when the runtime that created it ends.
pub(crate) fn io_runtime() -> Result<&'static tokio::runtime::Handle> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lease-zookeeper-io")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    match rt {
        Ok(rt) => Ok(rt.handle()),
        Err(e) => Err(Error::Backend {
            backend: crate::error::BACKEND,
            retryable: false,
            source: format!("cannot start the zookeeper I/O runtime: {e}").into(),
        }),
    }
}

/// The runtime the sessions' tasks run on: [`ZkConfig::runtime`](crate::ZkConfig::runtime)
/// where it is set, else the crate's own I/O runtime ([`io_runtime`]).
pub(crate) fn runtime_of(c: &crate::ZkConfig) -> Result<tokio::runtime::Handle> {
    match &c.runtime {
        Some(handle) => Ok(handle.clone()),
        None => io_runtime().cloned(),
    }
}

/// `connector` with TLS from `files` (the CA required; a client identity where given).
#[cfg(feature = "_tls")]
fn with_tls(connector: zk::Connector, files: &lease_core::TlsFiles) -> Result<zk::Connector> {
    let pem = files.load(crate::error::BACKEND)?;
    let text = |what: &str, bytes: &[u8]| {
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            Error::tls(
                crate::error::BACKEND,
                format!("the {what} is not UTF-8 PEM text"),
            )
        })
    };
    let bad = |what: &str, e: zk::Error| {
        Error::tls(
            crate::error::BACKEND,
            format!("the {what} was refused: {e}"),
        )
    };
    let ca = pem
        .ca
        .as_deref()
        .ok_or_else(|| Error::tls(crate::error::BACKEND, "zks:// needs a CA file (tls_ca)"))?;
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&text("CA file", ca)?)
        .map_err(|e| bad("CA file", e))?;
    if let Some((cert, key)) = &pem.identity {
        options = options
            .with_pem_identity(
                &text("client certificate", cert)?,
                &text("client key", key)?,
            )
            .map_err(|e| bad("client certificate or key", e))?;
    }
    lease_core::raw::tls::ensure_crypto_provider(
        || {
            #[cfg(feature = "tls-ring")]
            return (rustls::crypto::ring::default_provider(), "ring");
            #[cfg(not(feature = "tls-ring"))]
            return (rustls::crypto::aws_lc_rs::default_provider(), "aws-lc-rs");
        },
        "zookeeper",
    );
    Ok(connector.with_tls(options))
}

#[cfg(not(feature = "_tls"))]
fn with_tls(_: zk::Connector, _: &lease_core::TlsFiles) -> Result<zk::Connector> {
    Err(Error::tls(
        crate::error::BACKEND,
        "zks:// needs the `tls` feature (of the lease crate, or of lease-zookeeper)",
    ))
}

/// What a session's connection is opened for.
#[derive(Clone)]
enum Opening {
    /// A probe of the server's shortest session: closed when dropped.
    Probe,
    /// A session the backend keeps: detached, so that no connection of it closes the
    /// session when it is dropped (a connection retired by [`Sessions::resume_stalled`]
    /// reconnects once before it ends); the backend closes its sessions when it is
    /// dropped (`Drop for Sessions`).
    Kept,
    /// The same session again on a new connection: detached; each server tried once.
    Resume(zk::SessionInfo),
    /// The same session again, to close it: closed when dropped.
    Close(zk::SessionInfo),
}

/// One attempt at a session with timeout `timeout` on `servers`, bounded by `limit`, on
/// the backend's I/O runtime (the session's task lives there, not on the caller's
/// runtime, which may end while the backend is still used).
async fn open_client(
    c: &crate::ZkConfig,
    servers: &str,
    timeout: Duration,
    limit: Duration,
    kind: Opening,
) -> Result<std::result::Result<zk::Client, zk::Error>> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(timeout)
        .with_connection_timeout(c.connect_timeout);
    if let Some(user) = &c.user {
        let secret = format!("{user}:{}", c.password.as_deref().unwrap_or(""));
        connector = connector.with_auth("digest", secret.as_bytes());
    }
    connector = match kind {
        Opening::Probe => connector,
        Opening::Kept => connector.with_detached(),
        Opening::Resume(info) => connector
            .with_session(info)
            .with_detached()
            .with_fail_eagerly(),
        Opening::Close(info) => connector.with_session(info),
    };
    let secure = c.tls.is_some();
    if let Some(files) = &c.tls {
        connector = with_tls(connector, files)?;
    }
    let servers = servers.to_owned();
    runtime_of(c)?
        .spawn(async move {
            tokio::time::timeout(limit, async move {
                #[cfg(feature = "_tls")]
                if secure {
                    return connector.secure_connect(&servers).await;
                }
                let _ = secure;
                connector.connect(&servers).await
            })
            .await
        })
        .await
        .map_err(|e| Error::Backend {
            backend: crate::error::BACKEND,
            retryable: true,
            source: format!("the task connecting to zookeeper failed: {e}").into(),
        })?
        .map_err(|_| Error::Timeout {
            operation: "connect",
            after: limit,
        })
}

/// The slot of the session that serves no lease TTL (reads, watches, forced releases).
const MAIN_SLOT: u64 = u64::MAX;

/// The sessions, by TTL in ms.
pub(crate) struct Sessions {
    pub(crate) connect: String,
    pub(crate) config: crate::ZkConfig,
    /// The open sessions, by slot (TTL in ms, or [`MAIN_SLOT`]). Locked only briefly,
    /// never across a request: renewals of one TTL never wait for another's opening.
    map: Mutex<HashMap<u64, zk::Client>>,
    /// One gate per slot, held while that slot's session is being opened, so that
    /// concurrent first acquires with one TTL open one session.
    gates: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) records: Mutex<Records>,
    /// The sessions found disconnected, by slot: see [`Sessions::resume_stalled`].
    stalled: Mutex<HashMap<u64, Stalled>>,
    /// The connections [`Sessions::resume_stalled`] replaced, until [`TAKEN_BACK_FOR`]
    /// after they were seen ended: see [`Retired`].
    retired: Mutex<Vec<Retired>>,
    /// Where [`ZkConfig::runtime`](crate::ZkConfig::runtime) is set: alive while a task
    /// parked on that runtime for good holds its `Arc`, that is, until the runtime shuts
    /// down (its tasks, the sessions' among them, are dropped then).
    runtime_alive: Option<std::sync::Weak<()>>,
}

/// A connection [`Sessions::resume_stalled`] replaced. Until it ends, requests queued on
/// it while it was disconnected are sent when it reconnects. It reconnects once (at the
/// client library's next attempt, up to 7/5 of the session timeout after its last
/// answer) and ends at once, since nothing holds it; but its reconnection moves the
/// session to it. The current client's connection stays open and its pings are
/// answered, but the server closes it at the next request that reaches the leader,
/// which fails `ConnectionLoss` although the store is reachable (the client connects
/// again at once). [`Sessions::settle`] sends that request as soon as the sweep sees the
/// retired connection ended; a caller's request caught in the same moment is sent again
/// ([`Sessions::taken_back`]).
struct Retired {
    /// The session's id.
    id: i64,
    state: zk::StateWatcher,
    /// When it was first seen ended (the sweep looks every 100 ms).
    ended: Option<Instant>,
    /// Whether [`Sessions::settle`] was sent for it.
    settled: bool,
}

/// How long after a retired connection was seen ended a `ConnectionLoss` on its session
/// is still put down to it ([`Sessions::taken_back`]): [`Sessions::settle`], sent within
/// a sweep (100 ms) of its end, closes the moved connection within a round trip.
const TAKEN_BACK_FOR: Duration = Duration::from_secs(1);

/// A session found disconnected by [`Sessions::resume_stalled`].
struct Stalled {
    /// The session's id (a slot's session can change).
    id: i64,
    /// When it was first found disconnected.
    since: Instant,
    /// When the last attempt to resume it started, and how many are still running.
    tried: Option<Instant>,
    trying: usize,
}

/// How long a session stays disconnected before the backend resumes it on a new
/// connection of its own. The client library reconnects on its own, with waits that
/// double from 100 ms each round (0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 12.7 s ... after the
/// loss, with no cap but the session's end): within the first second it tries about as
/// often as the backend would.
pub(crate) const RESUME_AFTER: Duration = Duration::from_secs(1);

/// How often a disconnected session is tried on a new connection after [`RESUME_AFTER`].
pub(crate) const RESUME_EVERY: Duration = Duration::from_millis(250);

/// How long an attempt to resume a session runs before the next one starts beside it. A
/// server answers a session's reattachment within milliseconds, but one that accepts a
/// connection while it starts may never answer on it (ZooKeeper 3.8 leaves some of the
/// connections made in the moment it starts listening unanswered, while it answers the
/// next at once): an attempt waiting on such a connection until its bound (up to 2/5 of
/// the session timeout) would hold the session's resumption back that long.
pub(crate) const RESUME_UNANSWERED: Duration = Duration::from_secs(1);

/// At most this many attempts to resume one session run at once.
const RESUMES_AT_ONCE: usize = 3;

impl Sessions {
    pub(crate) fn new(connect: String, config: crate::ZkConfig) -> Self {
        let runtime_alive = config.runtime.as_ref().map(|handle| {
            let alive = Arc::new(());
            let weak = Arc::downgrade(&alive);
            handle.spawn(async move {
                let _alive = alive;
                std::future::pending::<()>().await
            });
            weak
        });
        Sessions {
            runtime_alive,
            connect,
            config,
            map: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            records: Mutex::new(Records::default()),
            stalled: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Refuses every call once the runtime given as `ZkConfig::runtime` has shut down: the
    /// sessions' tasks ended with it, and no call on this backend can succeed again.
    pub(crate) fn check_runtime(&self) -> Result<()> {
        match &self.runtime_alive {
            Some(alive) if alive.strong_count() == 0 => Err(Error::Backend {
                backend: crate::error::BACKEND,
                retryable: false,
                source: "the runtime given as ZkConfig::runtime has shut down, and the \
                         backend's sessions with it: make a new backend"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session with timeout `timeout`, authenticated where the config has a user.
    /// The client library gives up an attempt after the session timeout it asks for (600
    /// ms for a 600 ms TTL), which a TLS handshake on a loaded machine has exceeded: such
    /// an attempt is made again until the connect timeout has passed.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<zk::Client> {
        let limit = self.config.connect_timeout;
        let start = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let left = limit.saturating_sub(start.elapsed());
            match self.attempt(timeout, left, Opening::Kept).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(zk::Error::Timeout)) if start.elapsed() + timeout < limit => {
                    tracing::debug!(
                        attempts,
                        session_timeout_ms = timeout.as_millis() as u64,
                        "no zookeeper session within the session timeout; trying again"
                    );
                }
                Ok(Err(e)) => return Err(self.explain_tls(open_error(limit, e)).await),
                Err(e) => return Err(self.explain_tls(e).await),
            }
        }
    }

    /// One attempt at a session with timeout `timeout` (what the client library reports,
    /// its own `Timeout` included), bounded by `limit`.
    async fn attempt(
        &self,
        timeout: Duration,
        limit: Duration,
        kind: Opening,
    ) -> Result<std::result::Result<zk::Client, zk::Error>> {
        match open_client(&self.config, &self.connect, timeout, limit, kind).await {
            Err(Error::Timeout { operation, .. }) => Err(Error::Timeout {
                operation,
                after: self.config.connect_timeout,
            }),
            other => other,
        }
    }

    /// The server's shortest session (its `minSessionTimeout`): what it grants when asked
    /// for less. An attempt that asks for a short timeout gives up after it, so one that
    /// times out (a slow link, a TLS handshake) is made again, twice as long; where the
    /// server grants exactly what was asked, its minimum is at most that, and that is the
    /// answer (never below the server's minimum). A TLS handshake the server refuses is
    /// told at the first attempt that times out.
    pub(crate) async fn shortest_session(&self) -> Result<Duration> {
        let mut explained = false;
        for ask in [50, 100, 200, 400, 800, 1_600, 4_000].map(Duration::from_millis) {
            match self
                .attempt(ask, self.config.connect_timeout, Opening::Probe)
                .await?
            {
                Ok(probe) => return Ok(probe.session_timeout()),
                Err(zk::Error::Timeout) => {
                    if self.config.tls.is_some() && !explained {
                        explained = true;
                        let e = self
                            .explain_tls(Error::Timeout {
                                operation: "connect",
                                after: ask,
                            })
                            .await;
                        if matches!(e, Error::Tls { .. }) {
                            return Err(e);
                        }
                    }
                }
                Err(e) => {
                    let limit = self.config.connect_timeout;
                    return Err(self.explain_tls(open_error(limit, e)).await);
                }
            }
        }
        Err(Error::Timeout {
            operation: "connect",
            after: Duration::from_millis(4_000),
        })
    }

    /// `error`, or the TLS failure behind it: the client library retries a refused
    /// handshake until its timeout, so where TLS is configured a handshake of our own with
    /// the same files says what the server refused (lease-core's `probe_handshake`).
    async fn explain_tls(&self, error: Error) -> Error {
        #[cfg(feature = "_tls")]
        if let Some(files) = &self.config.tls
            && let Ok(pem) = files.load(crate::error::BACKEND)
        {
            for server in self.connect.split(',') {
                let Some((host, port)) = server.rsplit_once(':') else {
                    continue;
                };
                let Ok(port) = port.parse::<u16>() else {
                    continue;
                };
                let Some(config) = lease_core::raw::tls::client_config(
                    &pem,
                    || {
                        #[cfg(feature = "tls-ring")]
                        return rustls::crypto::ring::default_provider();
                        #[cfg(not(feature = "tls-ring"))]
                        return rustls::crypto::aws_lc_rs::default_provider();
                    },
                    Vec::new,
                ) else {
                    break;
                };
                let bound = Duration::from_secs(1);
                if let Some(why) =
                    lease_core::raw::tls::probe_handshake(host, port, config, None, bound).await
                {
                    return Error::tls(crate::error::BACKEND, why);
                }
            }
        }
        error
    }

    fn map(&self) -> MutexGuard<'_, HashMap<u64, zk::Client>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open session of `slot`; one that ended is taken out (and, for a lease TTL,
    /// its leases forgotten: the server deleted their nodes).
    fn current(&self, slot: u64) -> Option<zk::Client> {
        let mut map = self.map();
        let c = map.get(&slot)?;
        if matches!(
            c.state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        ) {
            let id = c.session_id().0;
            map.remove(&slot);
            drop(map);
            self.records().forget_session(id);
            return None;
        }
        Some(c.clone())
    }

    /// The session of `slot`, opened with `timeout` if there is none. The opening runs in
    /// a task of its own holding the slot's gate until the session is in the map: a
    /// caller that gives up (its call timeout) leaves it to finish, and the next call
    /// finds the session ready.
    async fn open(self: &Arc<Self>, slot: u64, timeout: Duration) -> Result<zk::Client> {
        self.check_runtime()?;
        if let Some(c) = self.current(slot) {
            return Ok(c);
        }
        let gate = self
            .gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(slot)
            .or_default()
            .clone();
        let guard = gate.lock_owned().await;
        if let Some(c) = self.current(slot) {
            return Ok(c); // opened while this call waited at the gate
        }
        let this = self.clone();
        runtime_of(&self.config)?
            .spawn(async move {
                let _opening = guard;
                let client = this.connect(timeout).await?;
                tracing::debug!(
                    slot,
                    session = %client.session_id(),
                    granted_ms = client.session_timeout().as_millis() as u64,
                    "zookeeper session opened"
                );
                this.map().insert(slot, client.clone());
                Ok::<_, Error>(client)
            })
            .await
            .map_err(|e| Error::Backend {
                backend: crate::error::BACKEND,
                retryable: true,
                source: format!("the task opening a zookeeper session failed: {e}").into(),
            })?
    }

    /// The session for leases of `ttl`, made if there is none or the last one ended.
    ///
    /// Errors: [`InvalidInput::TooLarge`] when the server grants a shorter session than
    /// `ttl` (its `maxSessionTimeout`, 20 ticks by default): a lease on it could vanish
    /// before its holder's deadline.
    pub(crate) async fn session(self: &Arc<Self>, ttl: Duration) -> Result<(u64, zk::Client)> {
        let ttl_ms = u64::try_from(ttl.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, MAIN_SLOT - 1);
        let client = self.open(ttl_ms, Duration::from_millis(ttl_ms)).await?;
        check_granted(ttl, ttl_ms, client)
    }

    /// A session of about `timeout` for what is not bound to a lease (reads, watches,
    /// forced releases, the clock), made again if the last one ended; not checked
    /// against what the server grants.
    pub(crate) async fn any(self: &Arc<Self>, timeout: Duration) -> Result<zk::Client> {
        self.open(MAIN_SLOT, timeout).await
    }

    /// The current session for `ttl_ms` if it is still `id`.
    pub(crate) async fn existing(&self, ttl_ms: u64, id: i64) -> Option<zk::Client> {
        // `current` takes out a session that ended (and forgets its leases).
        self.current(ttl_ms).filter(|c| c.session_id().0 == id)
    }

    /// Resumes sessions that have been disconnected for [`RESUME_AFTER`] on a new
    /// connection, tried every [`RESUME_EVERY`]; called by the sweep.
    ///
    /// The client library waits twice as long before each round of reconnection attempts
    /// and caps the wait only at the session's end (7/5 of its timeout after the last
    /// answer): after an outage of D its next attempt can come about D after the server is
    /// back, and past the session's end it declares the session expired although the
    /// server (which restores sessions when it restarts) kept it, and every lease on it is
    /// lost. A new client with the session's id and password (each server tried once,
    /// bounded) reattaches the session as soon as a server answers; it takes the old
    /// client's place, and the old one, dropped, ends when it next connects (it is
    /// detached: it does not close the session). Its reconnection moves the session to
    /// it for a moment, and the new client's next request through the leader fails
    /// `ConnectionLoss` ([`Retired`]): [`Sessions::settle`] sends that request, and the
    /// backend sends a caller's request caught in the same moment again
    /// ([`Sessions::taken_back`]). A call
    /// still holding a copy of the old client (at most its request timeout; nothing here
    /// holds one longer) keeps it connected: until the copy is dropped the two clients
    /// take the connection from each other, and requests on either may fail
    /// `ConnectionLoss`. A `SessionExpired` the old one reports once it gives up (7/5 of
    /// the session timeout without a server) does not end the session ([`Sessions::expired`]).
    ///
    /// An attempt not yet answered after [`RESUME_UNANSWERED`] does not keep the next from
    /// starting (at most [`RESUMES_AT_ONCE`] run at once, each bounded): a server may never
    /// answer a connection it accepted while starting. Where two attempts both reattach
    /// the session, the server keeps the later one's connection and closes the earlier's;
    /// whichever client the backend then keeps reconnects once, at once (its requests then
    /// in flight fail `ConnectionLoss`, retryable).
    ///
    /// A server that answers that the session expired ends it here at once (its leases
    /// are reported lost on their next renewal, rather than at the client library's next
    /// attempt).
    pub(crate) fn resume_stalled(self: &Arc<Self>) {
        let now = Instant::now();
        // Retired connections that reconnected (and so took their session back) since the
        // last look: see [`Sessions::settle`].
        let settle: Vec<i64> = self
            .retired_now(now)
            .iter_mut()
            .filter(|r| {
                !r.settled && r.ended.is_some() && r.state.peek_state() == zk::SessionState::Closed
            })
            .map(|r| {
                r.settled = true;
                r.id
            })
            .collect();
        let sessions: Vec<(u64, zk::Client)> =
            self.map().iter().map(|(k, c)| (*k, c.clone())).collect();
        let settle: Vec<zk::Client> = sessions
            .iter()
            .filter(|(_, c)| settle.contains(&c.session_id().0))
            .map(|(_, c)| c.clone())
            .collect();
        let mut start = Vec::new();
        {
            let mut stalled = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
            stalled.retain(|slot, st| {
                sessions.iter().any(|(s, c)| {
                    s == slot
                        && c.session_id().0 == st.id
                        && c.state() == zk::SessionState::Disconnected
                })
            });
            for (slot, c) in &sessions {
                if c.state() != zk::SessionState::Disconnected {
                    continue;
                }
                let id = c.session_id().0;
                let st = stalled.entry(*slot).or_insert(Stalled {
                    id,
                    since: now,
                    tried: None,
                    trying: 0,
                });
                // While an attempt runs, the next waits until it looks unanswered.
                let pause = if st.trying == 0 {
                    RESUME_EVERY
                } else {
                    RESUME_UNANSWERED
                };
                if st.trying >= RESUMES_AT_ONCE
                    || now < st.since + RESUME_AFTER
                    || st.tried.is_some_and(|t| now < t + pause)
                {
                    continue;
                }
                st.trying += 1;
                st.tried = Some(now);
                start.push((*slot, c.session().clone(), c.session_timeout()));
            }
        }
        drop(sessions);
        let Ok(rt) = runtime_of(&self.config) else {
            return;
        };
        for (slot, info, timeout) in start {
            rt.spawn(self.clone().resume(slot, info, timeout));
        }
        for client in settle {
            rt.spawn(Self::settle(client, self.config.request_timeout));
        }
    }

    /// Sends one request through the leader on `client`, whose session a retired
    /// connection took back when it reconnected ([`Retired`]). The server keeps the
    /// client's connection open and answers its pings, but closes it at the first request
    /// that reaches the leader (the session has moved): that request fails
    /// `ConnectionLoss`, and the client connects again at once. Sent here, this request
    /// takes that failure instead of a caller's, which could come any time later; a
    /// caller's request in flight meanwhile is sent again ([`Sessions::taken_back`]).
    async fn settle(client: zk::Client, timeout: Duration) {
        let answer = crate::error::bounded("settle", timeout, barrier(&client, "/")).await;
        tracing::debug!(
            session = %client.session_id(),
            answer = ?answer,
            "a retired connection took the session back; its connection settled"
        );
    }

    /// One attempt to resume session `info` of `slot` on a new connection.
    async fn resume(self: Arc<Self>, slot: u64, info: zk::SessionInfo, timeout: Duration) {
        let id = info.id().0;
        let limit = (timeout * 2 / 5)
            .max(Duration::from_secs(1))
            .min(self.config.connect_timeout);
        let opened = open_client(
            &self.config,
            &self.connect,
            timeout,
            limit,
            Opening::Resume(info),
        )
        .await;
        if let Some(st) = self
            .stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&slot)
            .filter(|st| st.id == id)
        {
            st.trying = st.trying.saturating_sub(1);
        }
        match opened {
            Ok(Ok(client)) => {
                let mut map = self.map();
                let replace = map.get(&slot).is_some_and(|old| {
                    old.session_id().0 == id && old.state() == zk::SessionState::Disconnected
                });
                if replace {
                    let old = map.insert(slot, client);
                    drop(map);
                    if let Some(old) = old {
                        self.retired
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Retired {
                                id,
                                state: old.state_watcher(),
                                ended: None,
                                settled: false,
                            });
                    }
                    tracing::info!(
                        slot,
                        session = %zk::SessionId(id),
                        "zookeeper session resumed on a new connection"
                    );
                }
                // Otherwise the old connection came back first (or the session changed):
                // the new one is dropped and ends; it does not close the session.
            }
            Ok(Err(zk::Error::SessionExpired)) => {
                if self
                    .map()
                    .get(&slot)
                    .is_some_and(|c| c.session_id().0 == id)
                {
                    self.forget(slot, id); // the server said so
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(slot, session = %zk::SessionId(id), error = %e, "zookeeper session not resumed yet");
            }
            Err(e) => {
                tracing::debug!(slot, session = %zk::SessionId(id), error = %e, "zookeeper session not resumed yet");
            }
        }
    }

    /// Whether a connection of session `id` that [`Sessions::resume_stalled`] replaced may
    /// still send requests queued on it while it was disconnected: it has not ended (it
    /// ends when it next connects with no copy of it held, or at 7/5 of the session
    /// timeout after its last answer).
    pub(crate) fn replay_pending(&self, id: i64) -> bool {
        self.retired_now(Instant::now())
            .iter()
            .any(|r| r.id == id && r.ended.is_none())
    }

    /// Whether a request on session `id` that failed `ConnectionLoss` may have lost its
    /// connection to a retired one of the same session taking it back ([`Retired`]): one
    /// is still alive, or was seen ended less than [`TAKEN_BACK_FOR`] ago. Such a request
    /// may be sent again on the current client, which reconnects at once.
    pub(crate) fn taken_back(&self, id: i64) -> bool {
        self.retired_now(Instant::now()).iter().any(|r| r.id == id)
    }

    /// The retired connections, each marked ended where it has ended, without those
    /// seen ended [`TAKEN_BACK_FOR`] ago or longer.
    fn retired_now(&self, now: Instant) -> MutexGuard<'_, Vec<Retired>> {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        for r in retired.iter_mut() {
            if r.ended.is_none() && r.state.peek_state().is_terminated() {
                r.ended = Some(now);
            }
        }
        retired.retain(|r| r.ended.is_none_or(|e| now < e + TAKEN_BACK_FOR));
        retired
    }

    /// Drops the session `id`: a request on it failed with `SessionExpired`. Ignored while
    /// the map holds a client of `id` that has not ended: the error came from a client
    /// [`Sessions::resume_stalled`] replaced, which declares the session expired on its
    /// own once it has not reached a server for 7/5 of the session timeout, while the new
    /// client keeps the session (the client library marks a client expired before it
    /// fails its requests so, so a session the server ended is never ignored here).
    ///
    /// Returns whether the session ended (false: it lives on, the caller's request failed
    /// on a replaced connection and may be sent again).
    pub(crate) async fn expired(&self, ttl_ms: u64, id: i64) -> bool {
        let live = self
            .map()
            .get(&ttl_ms)
            .is_some_and(|c| c.session_id().0 == id && !c.state().is_terminated());
        if live {
            tracing::debug!(ttl_ms, session = %zk::SessionId(id), "a replaced connection declared the session expired; the session lives on");
            return false;
        }
        self.forget(ttl_ms, id);
        true
    }

    /// Drops the session `id` (it expired) and forgets its leases.
    fn forget(&self, ttl_ms: u64, id: i64) {
        {
            let mut map = self.map();
            if map.get(&ttl_ms).is_some_and(|c| c.session_id().0 == id) {
                map.remove(&ttl_ms);
            }
        }
        self.records().forget_session(id);
        tracing::warn!(ttl_ms, session = %zk::SessionId(id), "zookeeper session expired: its leases are lost");
    }
}

impl Drop for Sessions {
    /// Closes the backend's sessions (they are detached: dropping their clients does not):
    /// their ephemeral nodes go at once, not at the session timeout. Each client is
    /// dropped, and once its connection has ended (at most 1 s) the session is reattached
    /// by a client that closes it when dropped, bounded by the connect timeout. A session
    /// whose servers are unreachable meanwhile ends at its timeout.
    fn drop(&mut self) {
        let clients: Vec<zk::Client> = self
            .map
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, c)| c)
            .collect();
        let Ok(rt) = runtime_of(&self.config) else {
            return;
        };
        for c in clients {
            if c.state().is_terminated() {
                continue;
            }
            let info = c.session().clone();
            let timeout = c.session_timeout();
            let mut state = c.state_watcher();
            drop(c);
            let (config, servers) = (self.config.clone(), self.connect.clone());
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while !state.peek_state().is_terminated() {
                        state.changed().await;
                    }
                })
                .await;
                let limit = config.connect_timeout;
                let closing =
                    open_client(&config, &servers, timeout, limit, Opening::Close(info)).await;
                if let Ok(Ok(closer)) = closing {
                    drop(closer); // sends CloseSession
                }
            });
        }
    }
}

fn check_granted(ttl: Duration, ttl_ms: u64, c: zk::Client) -> Result<(u64, zk::Client)> {
    let granted = c.session_timeout();
    if granted < ttl {
        return Err(Error::InvalidInput(InvalidInput::TooLarge {
            what: "ttl (above the zookeeper server's maxSessionTimeout)",
            value: ttl,
            max: granted,
        }));
    }
    Ok((ttl_ms, c))
}

/// A write that changes nothing: a `multi` of one version check (any version) on `dir`
/// (the leases node). A read sent after it on the same session sees every write
/// confirmed, to any session on any member, before the barrier was sent.
///
/// ZooKeeper serves a read from the member the session is connected to, and on a
/// follower that member may not yet have applied a write the leader already confirmed
/// to a session on another member (measured on a 3-member ensemble: an acquisition
/// confirmed on one member missed by a read on another in 17 of 1,800 tries, with no
/// load). A `sync` is not enough: on the leader it waits for nothing, and the leader
/// sends a commit to its followers before it applies the write itself, so a follower
/// can confirm a write the leader's own reads do not show yet (reads on the leader
/// after a `sync` missed 54 of 60 acquisitions confirmed on a follower, with the
/// leader's quorum threads starved of CPU: `starved_leader_reads_what_a_follower_confirmed`
/// in `tests/ensemble_reads.rs`). A write does: the leader numbers it after every write
/// already confirmed, each member applies writes in that order, and a member holds a
/// session's reads until that session's earlier writes are applied. It holds across a
/// change of leader too (a deposed leader cannot commit the barrier), where a `sync` is
/// not acknowledged by a quorum (ZOOKEEPER-1675).
///
/// The cost is a quorum write in place of a read: every member logs it, the reply waits
/// for a majority, and each barrier is one more entry in the transaction log (so the log
/// rolls and snapshots sooner). The barrier and the read are both sent before either is
/// awaited: one round trip from the client, plus the write's trip through the quorum.
///
/// A check refused (`NoNode` if the leases node was deleted, `NoAuth` without read
/// permission on it) is still logged and ordered like any other write: still a barrier.
/// Other refusals (the session expired or moved) are the read's errors too, and pass on.
pub(crate) fn barrier<'a>(
    client: &'a zk::Client,
    dir: &str,
) -> impl std::future::Future<Output = std::result::Result<(), zk::Error>> + Send + 'a {
    let mut multi = client.new_multi_writer();
    let sent = multi.add_check_version(dir, -1).map(|()| multi.commit());
    async move {
        match sent?.await {
            Ok(_)
            | Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode | zk::Error::NoAuth | zk::Error::BadVersion,
                ..
            }) => Ok(()),
            Err(
                zk::MultiWriteError::OperationFailed { source, .. }
                | zk::MultiWriteError::RequestFailed { source },
            ) => Err(source),
        }
    }
}

/// `read`'s answer, after the [`barrier`] sent just before it where there is one.
pub(crate) async fn after_barrier<T>(
    barrier: Option<impl std::future::Future<Output = std::result::Result<(), zk::Error>>>,
    read: impl std::future::Future<Output = std::result::Result<T, zk::Error>>,
) -> std::result::Result<T, zk::Error> {
    match barrier {
        None => read.await,
        Some(b) => {
            let (b, r) = futures::future::join(b, read).await;
            b.and(r)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// A session being opened (to a server that takes the connection and never answers)
    /// holds up nothing else: the lookups of renewals and expiries of other sessions answer
    /// at once (they waited for the whole opening before, up to the connect timeout).
    #[tokio::test]
    async fn a_slow_opening_holds_up_no_other_session() {
        // The kernel completes connections to a listener that never accepts them.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = crate::ZkConfig::default().with_connect_timeout(Duration::from_secs(5));
        let sessions = Arc::new(Sessions::new(
            silent.local_addr().unwrap().to_string(),
            config,
        ));
        let opening = tokio::spawn({
            let s = sessions.clone();
            async move { s.session(Duration::from_secs(4)).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !opening.is_finished(),
            "the opening ended: {:?}",
            opening.await
        );
        let start = Instant::now();
        assert!(sessions.existing(5_000, 1).await.is_none());
        sessions.expired(5_000, 1).await;
        assert!(sessions.current(5_000).is_none());
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(50),
            "waited {took:?} for another slot's opening"
        );
        opening.abort();
    }
}
