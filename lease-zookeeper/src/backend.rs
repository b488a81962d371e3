//! [`ZkBackend`]: the trait's primitives on ZooKeeper.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, LeaseBackend, LeaseInfo,
    LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
};
use tokio::time::Instant;
use tracing::Instrument;
use zookeeper_client as zk;

use crate::config::{ZkConfig, parse_url};
use crate::error::{BACKEND, bounded, convert, unexpected};
use crate::nodes::{
    self, FREE, HELD, Kind, Layout, NameData, RELEASED, decode_keep, decode_name, encode_keep,
    encode_name, holder_node,
};
use crate::records::Record;
use crate::sessions::{Sessions, after_barrier, barrier, runtime_of};
use crate::sweep::sweep;

/// The timeout asked for the session that reads, watches and forces releases (the server
/// may grant less or more).
const MAIN_SESSION: Duration = Duration::from_secs(10);

/// Leases per `multiRead` of a renewal (two reads each; a reply stays well below the
/// client's and server's 1 MB packet limit).
const RENEW_CHUNK: usize = 1_000;

/// Largest renewal batch accepted in one call (one `multiRead` per 1,000 leases).
pub const MAX_RENEW_BATCH: usize = 100_000;

/// A lease backend on ZooKeeper. Cheap to clone; clones share the sessions.
///
/// See the crate documentation for the design.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: Arc<Sessions>,
    layout: Layout,
    /// The shortest TTL: the configured one or the server's minimum session, whichever
    /// is longer.
    min_ttl: Duration,
    acls: zk::Acls<'static>,
    /// `multiRead` requests sent by renewals (round trips, for benchmarks; the barrier
    /// sent with each session's first is not counted).
    renew_requests: AtomicU64,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("servers", &self.inner.sessions.connect)
            .field("config", &self.inner.sessions.config)
            .finish()
    }
}

/// What an acquire found when the holder node existed.
struct Found {
    name: Option<(NameData, zk::Stat)>,
    holder: Option<(Vec<u8>, zk::Stat)>,
}

impl ZkBackend {
    /// Connects to `zk://[user[:password]@]host[:port][,host[:port]...][/prefix]` with the
    /// default settings.
    ///
    /// Errors: [`Error::InvalidInput`] for a malformed URL (its message never shows the
    /// password); the connection errors of [`ZkBackend::connect_with`].
    ///
    /// Cancel safety: cancel-safe; a dropped call leaves nothing behind (a session it had
    /// opened is closed).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_url_with(url, ZkConfig::default()).await
    }

    /// [`ZkBackend::connect`] on top of `config` (what the URL gives replaces it).
    ///
    /// Cancel safety: cancel-safe.
    pub async fn connect_url_with(url: &str, config: ZkConfig) -> Result<Self> {
        let (servers, config) = parse_url(url, config)?;
        Self::connect_with(&servers, config).await
    }

    /// Connects to the servers of a ZooKeeper connect string (`host:port,host:port`) and
    /// creates the prefix's nodes where they are missing.
    ///
    /// Errors: [`Error::Timeout`] when no session is made within the connect timeout;
    /// [`Error::Auth`] for refused credentials; [`Error::Rejected`] when the prefix may not
    /// be created or written (ACLs).
    ///
    /// Cancel safety: cancel-safe; a dropped call leaves nothing behind.
    pub async fn connect_with(servers: &str, config: ZkConfig) -> Result<Self> {
        config.validate()?;
        let layout = Layout::new(&config.prefix);
        let acls = if config.user.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        };
        let sessions = Arc::new(Sessions::new(servers.to_owned(), config));
        let server_min = sessions.shortest_session().await?;
        let min_ttl = sessions
            .config
            .min_ttl
            .unwrap_or(server_min)
            .max(server_min);
        let main = sessions.any(MAIN_SESSION).await?;
        let t = sessions.config.request_timeout;
        let opts = zk::CreateMode::Persistent.with_acls(acls);
        for path in [layout.leases(), layout.clock()] {
            match bounded("connect", t, main.mkdir(&path, &opts)).await? {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(convert("connect", t, e)),
            }
        }
        let sweeper = runtime_of(&sessions.config)?.spawn(sweep(Arc::downgrade(&sessions)));
        tracing::debug!(servers, prefix = layout.prefix(), "connected to zookeeper");
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                sessions,
                layout,
                min_ttl,
                acls,
                renew_requests: AtomicU64::new(0),
                sweeper,
            }),
        })
    }

    /// The session for reads, watches, forced releases and the clock.
    async fn main(&self) -> Result<zk::Client> {
        self.inner.sessions.any(MAIN_SESSION).await
    }

    fn timeout(&self) -> Duration {
        self.inner.sessions.config.request_timeout
    }

    /// Opens the session for leases of `ttl` now, so that the first acquire with that TTL
    /// does not pay for it. An acquire with a TTL no lease has used yet opens a session
    /// (a TCP connection, the TLS handshake where configured, the session handshake):
    /// under load that can take longer than a short per-call timeout, so an application
    /// whose TTLs are known calls this at start. Idempotent.
    ///
    /// Errors: as [`ZkBackend::connect_with`]; [`lease_core::InvalidInput::TooLarge`] for a
    /// TTL above the server's `maxSessionTimeout`.
    ///
    /// Cancel safety: cancel-safe; a dropped call leaves no session behind (the next
    /// acquire opens it).
    pub async fn prepare(&self, ttl: Duration) -> Result<()> {
        let ttl = self.capabilities().effective_ttl(ttl);
        self.inner.sessions.session(ttl).await.map(|_| ())
    }

    /// How many `multiRead` requests renewals have sent (one per session and 1,000
    /// leases; each session's first also has a barrier write before it, not counted here:
    /// it is sent with the read, in the same round trip); for benchmarks.
    pub fn renew_requests(&self) -> u64 {
        self.inner.renew_requests.load(Ordering::Relaxed)
    }

    /// How many leases this backend holds (or may hold: acquires whose reply is
    /// outstanding); for tests and metrics.
    pub fn held_count(&self) -> usize {
        self.inner.sessions.records().len()
    }

    /// The server's clock in ms since the epoch: the mtime of a write to the clock node.
    async fn server_now_ms(&self, operation: &'static str) -> Result<i64> {
        let t = self.timeout();
        let clock = self.inner.layout.clock();
        let main = self.main().await?;
        let (main, clock) = (&main, &clock);
        let answer = self
            .resending(main, is_loss, move || {
                bounded(operation, t, main.set_data(clock, b"", None))
            })
            .await?;
        match answer {
            Ok(stat) => Ok(stat.mtime),
            Err(e) => Err(convert(operation, t, e)),
        }
    }

    /// The name node's data and the holder node's, read in one `multiRead` (one
    /// consistent view: no write falls between the two reads).
    ///
    /// With [`Fresh::Ordered`] the read is preceded by a [`barrier`]: it then sees every
    /// write confirmed before it was sent, on whichever member. [`Fresh::AfterOwnWrite`] is for a
    /// read on the session whose write (applied or refused) was just answered: the
    /// member it is on has applied everything up to that write.
    async fn read_pair(
        &self,
        client: &zk::Client,
        path: &str,
        op: &'static str,
        fresh: Fresh,
    ) -> Result<Found> {
        let t = self.timeout();
        let holder = holder_node(path);
        let holder_path = holder.as_str();
        let read = move || async move {
            let mut reader = client.new_multi_reader();
            reader
                .add_get_data(path)
                .and_then(|()| reader.add_get_data(holder_path))
                .map_err(|e| convert(op, t, e))?;
            // The barrier is sent here, before the read (requests go out in call order).
            let ordered = (fresh == Fresh::Ordered).then(|| barrier(client, nodes::parent(path)));
            bounded(op, t, after_barrier(ordered, reader.commit())).await
        };
        let results = match self.resending(client, is_loss, read).await? {
            Ok(r) => r,
            Err(e) => return Err(convert(op, t, e)),
        };
        let mut it = results.into_iter();
        let (Some(name), Some(holder), None) = (it.next(), it.next(), it.next()) else {
            return Err(unexpected(op, "multiRead reply without two results"));
        };
        let name = match name {
            zk::MultiReadResult::Data { data, stat } => match decode_name(&data) {
                Some(d) => Some((d, stat)),
                None => {
                    return Err(unexpected(
                        op,
                        format!("{path} holds data this backend did not write"),
                    ));
                }
            },
            zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            } => None,
            zk::MultiReadResult::Error { err } => return Err(convert(op, t, err)),
            _ => return Err(unexpected(op, "not data for a read")),
        };
        let holder = match holder {
            zk::MultiReadResult::Data { data, stat } => Some((data, stat)),
            zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            } => None,
            zk::MultiReadResult::Error { err } => return Err(convert(op, t, err)),
            _ => return Err(unexpected(op, "not data for a read")),
        };
        Ok(Found { name, holder })
    }

    /// Creates the name node if it is missing.
    async fn ensure_name_node(&self, client: &zk::Client, path: &str) -> Result<()> {
        let t = self.timeout();
        let opts = zk::CreateMode::Persistent.with_acls(self.inner.acls);
        let opts = &opts;
        let create = move || bounded("acquire", t, client.create(path, &[], opts));
        match self.resending(client, is_loss, create).await? {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(convert("acquire", t, e)),
        }
    }

    /// One acquisition attempt: the holder node and the name node's data in one `multi`;
    /// with `replace`, an expired keep-for node (the name node at that version) goes in
    /// the same step. `Ok(None)`: the holder node exists (or, with `replace`, the name
    /// changed since it was read).
    async fn try_create(
        &self,
        client: &zk::Client,
        path: &str,
        data: &[u8],
        replace: Option<i32>,
        t: Duration,
    ) -> Result<std::result::Result<zk::Stat, zk::Error>> {
        let holder = holder_node(path);
        let mut multi = client.new_multi_writer();
        let eph = zk::CreateMode::Ephemeral.with_acls(self.inner.acls);
        let added = match replace {
            Some(v) => multi
                .add_set_data(path, data, Some(v))
                .and_then(|()| multi.add_delete(&holder, None))
                .and_then(|()| multi.add_create(&holder, &[], &eph)),
            None => multi
                .add_create(&holder, &[], &eph)
                .and_then(|()| multi.add_set_data(path, data, None)),
        };
        added.map_err(|e| convert("acquire", t, e))?;
        match bounded("acquire", t, multi.commit()).await? {
            Ok(results) => {
                let stat = results.into_iter().find_map(|r| match r {
                    zk::MultiWriteResult::SetData { stat } => Some(stat),
                    _ => None,
                });
                stat.map(Ok).ok_or_else(|| {
                    unexpected("acquire", "multi reply without the name node's stat")
                })
            }
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => Ok(Err(source)),
            Err(zk::MultiWriteError::RequestFailed { source }) => Ok(Err(source)),
        }
    }

    fn record_key(path: &str, token: &OwnerToken) -> (String, OwnerToken) {
        (path.to_owned(), *token)
    }
}

/// One `multiRead` of a renewal: the session's client, the session (TTL in ms, id), the
/// indexes of its leases in the batch, and whether it is the session's first.
type Chunk = (zk::Client, (u64, i64), Vec<usize>, bool);

/// How fresh a read must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fresh {
    /// A [`barrier`] first: every write confirmed before the read was sent is seen.
    Ordered,
    /// Right after this session's own write was answered: nothing more is needed.
    AfterOwnWrite,
}

impl ZkBackend {
    async fn acquire_in_span(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let ttl = self.capabilities().effective_ttl(ttl);
        let (ttl_ms, client) = self.inner.sessions.session(ttl).await?;
        let session = client.session_id().0;
        let path = self.inner.layout.name_node(name);
        let key = Self::record_key(&path, &owner.token);
        let data = encode_name(HELD, &owner.token, owner.label.as_str());
        // The record of this acquisition: taken (`version` known) or maybe taken.
        let held = |version: Option<i32>, fencing: u64, sent: Instant| Record {
            ttl_ms,
            session,
            version,
            fencing,
            label: owner.label.as_str().to_owned(),
            acquired_at: Instant::now(),
            deadline: sent + ttl,
        };
        let mut replace = None;
        // The whole call, re-sends included, within the request timeout.
        let deadline = Instant::now() + self.timeout();
        for attempt in 0..4 {
            let sent = Instant::now();
            // Recorded before the request goes out: if this call is dropped or its reply
            // lost, the sweep deletes what it may have made at the TTL.
            self.inner.sessions.records().put(
                key.clone(),
                Record {
                    ttl_ms,
                    session,
                    version: None,
                    fencing: 0,
                    label: owner.label.as_str().to_owned(),
                    acquired_at: sent,
                    deadline: sent + ttl,
                },
            );
            let left = deadline.saturating_duration_since(sent);
            let outcome = self
                .try_create(&client, &path, &data, replace.take(), left)
                .await;
            let failed = match outcome {
                Ok(Ok(stat)) => {
                    let fencing = u64::try_from(stat.mzxid)
                        .map_err(|_| unexpected("acquire", format!("zxid {}", stat.mzxid)))?;
                    self.inner
                        .sessions
                        .records()
                        .confirm(&key, held(Some(stat.version), fencing, sent));
                    return Ok(AcquireOutcome::Acquired {
                        fencing: FencingToken(fencing),
                        ttl,
                    });
                }
                Ok(Err(e)) => e,
                Err(e) => return Err(e), // timeout: the record stays for the sweep
            };
            match failed {
                zk::Error::NodeExists | zk::Error::BadVersion => {}
                zk::Error::NoNode => {
                    self.inner.sessions.records().remove(&key);
                    self.ensure_name_node(&client, &path).await?;
                    continue;
                }
                zk::Error::SessionExpired => {
                    // Where the session lives on (a replaced connection's report), the
                    // acquire was not sent: a lost connection, retryable.
                    let ended = self.inner.sessions.expired(ttl_ms, session).await;
                    let e = if ended {
                        zk::Error::SessionExpired
                    } else {
                        zk::Error::ConnectionLoss
                    };
                    return Err(convert("acquire", self.timeout(), e));
                }
                // The outcome is unknown (the connection broke or was given up with the
                // request in flight): the record stays for the sweep.
                //
                // A connection the client library gave up on (no answer within 2/5 of the
                // session timeout: a stalled server or a starved machine) or that failed
                // with an I/O error (`Custom`): the session outlives it and the client
                // library connects again at once (to another member where there is one),
                // so within the request timeout the acquire is sent again on the same
                // session; a first run that took the lease is recognised below as this
                // owner's. A connection closed by the other end or not made at all
                // (`ConnectionLoss`) fails the acquire at once: the server, or the way to
                // it, is likely down, and the client library waits longer and longer
                // between its attempts to connect again. Unless a retired connection of
                // the session took it back (`Sessions::taken_back`): the client connects
                // again at once, and the acquire is sent again as above.
                zk::Error::ConnectionLoss
                    if attempt < 3
                        && Instant::now() < deadline
                        && self.inner.sessions.taken_back(session) =>
                {
                    tracing::debug!(
                        "connection taken back by a retired one of the session with the acquire in flight; sending it again"
                    );
                    continue;
                }
                e @ zk::Error::Custom(_) if attempt < 3 && Instant::now() < deadline => {
                    tracing::debug!(
                        error = %e,
                        "connection given up with the acquire in flight; sending it again on the session"
                    );
                    continue;
                }
                e @ (zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_)) => {
                    return Err(convert("acquire", self.timeout(), e));
                }
                e => {
                    self.inner.sessions.records().remove(&key);
                    return Err(convert("acquire", self.timeout(), e));
                }
            }
            // The name is taken (or changed under a takeover): see by whom.
            self.inner.sessions.records().remove(&key);
            let found = self
                .read_pair(&client, &path, "acquire", Fresh::AfterOwnWrite)
                .await?;
            let Some((hdata, hstat)) = found.holder else {
                continue; // released in between: try again
            };
            let (nd, nstat) = match found.name {
                Some(n) => n,
                None => continue,
            };
            match nodes::kind(hstat.ephemeral_owner) {
                Kind::Ephemeral(owner_session) => {
                    if nd.state == HELD && nd.token == owner.token && hstat.czxid == nstat.mzxid {
                        // A re-sent acquire whose first run took the lease.
                        if owner_session != session {
                            return Err(unexpected(
                                "acquire",
                                "own holder node on another session",
                            ));
                        }
                        let fencing = u64::try_from(hstat.czxid).unwrap_or(0);
                        self.inner
                            .sessions
                            .records()
                            .put(key.clone(), held(Some(nstat.version), fencing, sent));
                        return Ok(AcquireOutcome::Acquired {
                            fencing: FencingToken(fencing),
                            ttl,
                        });
                    }
                    let remaining = {
                        let recs = self.inner.sessions.records();
                        recs.by_key
                            .get(&(path.clone(), nd.token))
                            .map(|r| r.deadline.saturating_duration_since(Instant::now()))
                    };
                    return Ok(AcquireOutcome::Held(HeldBy {
                        holder: Some(nd.label),
                        remaining,
                    }));
                }
                Kind::Ttl(_) | Kind::Persistent => {
                    // A keep-for node: expired by the server's clock?
                    let keep_ms = decode_keep(&hdata)
                        .map(|(ms, _)| ms)
                        .ok_or_else(|| unexpected("acquire", "keep-for node without its ttl"))?;
                    let now = self.server_now_ms("acquire").await?;
                    let until = hstat
                        .mtime
                        .saturating_add(i64::try_from(keep_ms).unwrap_or(i64::MAX));
                    if until > now {
                        return Ok(AcquireOutcome::Held(HeldBy {
                            holder: Some(nd.label),
                            remaining: Some(Duration::from_millis(
                                u64::try_from(until - now).unwrap_or(0),
                            )),
                        }));
                    }
                    replace = Some(nstat.version);
                    continue;
                }
            }
        }
        // Four rounds of a name changing under us: report it as held by whoever has it.
        Ok(AcquireOutcome::Held(HeldBy {
            holder: None,
            remaining: None,
        }))
    }

    // Cancel safety: cancel-safe; a dropped call changes nothing (the reads are
    // read-only; the deadlines move only when the answers arrive).
    async fn renew_in_span(
        &self,
        leases: &[RenewItem],
        ttl: Duration,
    ) -> Result<Vec<RenewOutcome>> {
        // Renewals use the sessions they find (no opening): checked here.
        self.inner.sessions.check_runtime()?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > MAX_RENEW_BATCH {
            return Err(Error::InvalidInput(
                lease_core::InvalidInput::BatchTooLarge {
                    len: leases.len(),
                    max: MAX_RENEW_BATCH,
                },
            ));
        }
        let ttl = self.capabilities().effective_ttl(ttl);
        let t = self.timeout();
        // What each item must still be: its record, on a session that is still current.
        let mut plan = Vec::with_capacity(leases.len());
        let mut clients: std::collections::HashMap<(u64, i64), Option<zk::Client>> =
            std::collections::HashMap::new();
        for item in leases {
            let path = self.inner.layout.name_node(&item.name);
            let rec = self
                .inner
                .sessions
                .records()
                .by_key
                .get(&(path.clone(), item.token))
                .cloned();
            // Past its deadline the lease is the sweep's, even while its delete is still
            // being tried (the store did not answer it): not renewed again.
            let now = Instant::now();
            let Some(rec) = rec.filter(|r| r.version.is_some() && r.deadline > now) else {
                plan.push(None);
                continue;
            };
            if ttl > Duration::from_millis(rec.ttl_ms) {
                return Err(Error::InvalidInput(lease_core::InvalidInput::TooLarge {
                    what: "renewal ttl (above the ttl the lease was acquired with)",
                    value: ttl,
                    max: Duration::from_millis(rec.ttl_ms),
                }));
            }
            let ck = (rec.ttl_ms, rec.session);
            if let std::collections::hash_map::Entry::Vacant(slot) = clients.entry(ck) {
                slot.insert(self.inner.sessions.existing(rec.ttl_ms, rec.session).await);
            }
            match clients.get(&ck).cloned().flatten() {
                Some(c) => plan.push(Some((path, rec, c))),
                None => plan.push(None),
            }
        }
        // One `multiRead` per session and chunk of leases: the holder node and the name
        // node of each, read atomically on the lease's own session (which the request
        // keeps alive). All chunks are sent before any answer is awaited.
        let mut chunks: Vec<Chunk> = Vec::new();
        {
            let mut by_session: std::collections::HashMap<(u64, i64), Vec<usize>> =
                std::collections::HashMap::new();
            for (i, p) in plan.iter().enumerate() {
                if let Some((_, rec, _)) = p {
                    by_session
                        .entry((rec.ttl_ms, rec.session))
                        .or_default()
                        .push(i);
                }
            }
            for (ck, idx) in by_session {
                let Some(client) = clients.get(&ck).cloned().flatten() else {
                    continue;
                };
                for (n, part) in idx.chunks(RENEW_CHUNK).enumerate() {
                    chunks.push((client.clone(), ck, part.to_vec(), n == 0));
                }
            }
        }
        let leases_dir = self.inner.layout.leases();
        let sent = Instant::now();
        let reads = chunks.iter().map(|(client, _, idx, first)| {
            let mut reader = client.new_multi_reader();
            let mut added = Ok(());
            for &i in idx {
                if let Some((path, _, _)) = &plan[i] {
                    added = added
                        .and_then(|()| reader.add_get_data(&holder_node(path)))
                        .and_then(|()| reader.add_get_data(path));
                }
            }
            self.inner.renew_requests.fetch_add(1, Ordering::Relaxed);
            // A barrier before the session's first read (its later reads wait behind it
            // too): a lease another session released or forced free is seen as gone even
            // where this session's member had not applied that yet.
            let ordered = (*first && added.is_ok()).then(|| barrier(client, &leases_dir));
            let commit = added.map(|()| reader.commit());
            async move {
                match commit {
                    Ok(c) => after_barrier(ordered, c).await,
                    Err(e) => Err(e),
                }
            }
        });
        let answers = tokio::time::timeout(t, futures::future::join_all(reads))
            .await
            .map_err(|_| Error::Timeout {
                operation: "renew",
                after: t,
            })?;
        let mut alive = vec![false; leases.len()];
        let mut expired = Vec::new();
        for ((_, ck, idx, _), answer) in chunks.iter().zip(answers) {
            let results = match answer {
                Ok(r) => r,
                Err(zk::Error::SessionExpired) => {
                    expired.push(*ck);
                    continue;
                }
                Err(e) => return Err(convert("renew", t, e)),
            };
            if results.len() != 2 * idx.len() {
                return Err(unexpected(
                    "renew",
                    format!("{} results for {} reads", results.len(), 2 * idx.len()),
                ));
            }
            for (&i, pair) in idx.iter().zip(results.chunks(2)) {
                let Some((_, rec, _)) = &plan[i] else {
                    continue;
                };
                let (h, n) = (&pair[0], &pair[1]);
                alive[i] = match (h, n) {
                    (
                        zk::MultiReadResult::Data { stat: h, .. },
                        zk::MultiReadResult::Data { stat: n, .. },
                    ) => {
                        Some(n.version) == rec.version
                            && nodes::kind(h.ephemeral_owner) == Kind::Ephemeral(rec.session)
                    }
                    (
                        zk::MultiReadResult::Error {
                            err: zk::Error::NoNode,
                        },
                        _,
                    )
                    | (
                        _,
                        zk::MultiReadResult::Error {
                            err: zk::Error::NoNode,
                        },
                    ) => false,
                    (zk::MultiReadResult::Error { err }, _)
                    | (_, zk::MultiReadResult::Error { err }) => {
                        return Err(convert("renew", t, err.clone()));
                    }
                    _ => return Err(unexpected("renew", "not data for a read")),
                };
            }
        }
        for (ttl_ms, id) in expired {
            if !self.inner.sessions.expired(ttl_ms, id).await {
                // A replaced connection's report: the session lives on its new
                // connection, and its leases are not known lost.
                return Err(convert("renew", t, zk::Error::ConnectionLoss));
            }
        }
        let mut out = Vec::with_capacity(leases.len());
        {
            let mut records = self.inner.sessions.records();
            for (i, ok) in alive.iter().enumerate() {
                out.push(if *ok {
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::Lost
                });
                if *ok && let Some((path, _, _)) = &plan[i] {
                    records.extend(&(path.clone(), leases[i].token), sent + ttl);
                }
            }
        }
        Ok(out)
    }

    // Cancel safety: cancel-safe; the release is one `multi`, applied whole or not at
    // all. A dropped call may have released; the lease's record is kept until the
    // answer, so an unanswered release is swept at the TTL (by the name node's version:
    // it never touches a later holder).
    async fn release_in_span(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let t = self.timeout();
        let path = self.inner.layout.name_node(name);
        let key = Self::record_key(&path, token);
        let holder = holder_node(&path);
        // What the release needs of the record (not the whole record: one copy less).
        let known = self
            .inner
            .sessions
            .records()
            .by_key
            .get(&key)
            .and_then(|r| {
                r.version.map(|v| {
                    (
                        v,
                        r.label.clone(),
                        r.fencing,
                        r.acquired_at,
                        (r.ttl_ms, r.session),
                    )
                })
            });
        // The release goes through the session the holder node is on where that session
        // is current and connected: it answered the acquire and keeps the lease. The main
        // session may still be reconnecting after a member was lost (each session's
        // client library backs off on its own), and a release through it would fail
        // `ConnectionLoss` while the lease's own session could send it. Otherwise (the
        // lease's session disconnected, or not known here) through the main session.
        let mut via = None;
        let (version, label, fencing, rest) = match known {
            Some((v, label, fencing, acquired_at, (ttl_ms, session))) => {
                // The lease's session is found without opening one: checked here.
                self.inner.sessions.check_runtime()?;
                via = self
                    .inner
                    .sessions
                    .existing(ttl_ms, session)
                    .await
                    .filter(|c| c.state() == zk::SessionState::SyncConnected);
                (
                    v,
                    label,
                    fencing,
                    keep_for.saturating_sub(acquired_at.elapsed()),
                )
            }
            None => {
                // Not acquired through this backend (or its reply was lost): read the name.
                let found = self
                    .read_pair(&self.main().await?, &path, "release", Fresh::Ordered)
                    .await?;
                let (Some((nd, nstat)), Some((_, hstat))) = (found.name, found.holder) else {
                    self.inner.sessions.records().remove(&key);
                    return Ok(ReleaseOutcome::NotOwner);
                };
                if nd.state != HELD
                    || nd.token != *token
                    || !matches!(nodes::kind(hstat.ephemeral_owner), Kind::Ephemeral(_))
                    || hstat.czxid != nstat.mzxid
                {
                    self.inner.sessions.records().remove(&key);
                    return Ok(ReleaseOutcome::NotOwner);
                }
                let rest = if keep_for.is_zero() {
                    Duration::ZERO
                } else {
                    let now = self.server_now_ms("release").await?;
                    let elapsed = u64::try_from(now.saturating_sub(nstat.mtime)).unwrap_or(0);
                    keep_for.saturating_sub(Duration::from_millis(elapsed))
                };
                (
                    nstat.version,
                    nd.label,
                    u64::try_from(hstat.czxid).unwrap_or(0),
                    rest,
                )
            }
        };
        let released = encode_name(RELEASED, token, &label);
        // Rounded up: the server counts whole milliseconds, and keep-for is never short.
        let rest_ms = u64::try_from(rest.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        let keep = encode_keep(rest_ms, fencing);
        // Sent again once where a retired connection of the session took it back with the
        // release in flight; the second run then finds the name node moved on if the first
        // was applied, and the name node tells.
        let mut resent = false;
        loop {
            let client = match &via {
                Some(c) => c.clone(),
                None => self.main().await?,
            };
            let mut multi = client.new_multi_writer();
            let mut added = multi
                .add_set_data(&path, &released, Some(version))
                .and_then(|()| multi.add_delete(&holder, None));
            // The keep-for node is persistent, not a TTL node: the server's reaper of TTL
            // nodes lists the lapsed ones, then deletes each by its path with no second
            // look at its TTL, so a TTL node put at the holder's path after the listing
            // (the name taken and released again while a pass is under way) would be
            // deleted with its keep-for still running. The next acquirer that finds it
            // lapsed (by the server's clock) replaces it; one node per name stays meanwhile,
            // beside the name node.
            if rest_ms > 0 {
                let opts = zk::CreateMode::Persistent.with_acls(self.inner.acls);
                added = added.and_then(|()| multi.add_create(&holder, &keep, &opts));
            }
            added.map_err(|e| convert("release", t, e))?;
            match bounded("release", t, multi.commit()).await? {
                Ok(_) => {
                    self.inner.sessions.records().remove(&key);
                    return Ok(ReleaseOutcome::Released);
                }
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion | zk::Error::NoNode,
                    ..
                }) => {
                    let ours = resent
                        && self
                            .read_pair(&client, &path, "release", Fresh::AfterOwnWrite)
                            .await?
                            .name
                            .is_some_and(|(nd, _)| nd.state == RELEASED && nd.token == *token);
                    self.inner.sessions.records().remove(&key);
                    return Ok(if ours {
                        ReleaseOutcome::Released
                    } else {
                        ReleaseOutcome::NotOwner
                    });
                }
                Err(zk::MultiWriteError::RequestFailed {
                    source: zk::Error::ConnectionLoss,
                }) if !resent && self.inner.sessions.taken_back(client.session_id().0) => {
                    tracing::debug!(
                        "connection taken back by a retired one of the session with the release in flight; sending it again"
                    );
                    resent = true;
                }
                Err(zk::MultiWriteError::OperationFailed { source, .. })
                | Err(zk::MultiWriteError::RequestFailed { source }) => {
                    return Err(convert("release", t, source));
                }
            }
        }
    }

    /// `send` (one request on `client`) and, where it failed with an error `lost` picks
    /// out while a retired connection of the same session may have taken the session's
    /// connection back ([`Sessions::taken_back`]), once more: the client connects again at
    /// once and the second request waits for it. Only for requests that may run twice
    /// with the same effect (reads, writes that change nothing the second time).
    ///
    /// [`Sessions::taken_back`]: crate::sessions::Sessions::taken_back
    async fn resending<T, E, Fut>(
        &self,
        client: &zk::Client,
        lost: fn(&E) -> bool,
        mut send: impl FnMut() -> Fut,
    ) -> Result<std::result::Result<T, E>>
    where
        Fut: std::future::Future<Output = Result<std::result::Result<T, E>>>,
    {
        match send().await? {
            Err(e) if lost(&e) && self.inner.sessions.taken_back(client.session_id().0) => {
                tracing::debug!(
                    session = %client.session_id(),
                    "connection taken back by a retired one of the session; the request sent again"
                );
                send().await
            }
            other => Ok(other),
        }
    }
}

/// Whether a request failed because its connection was lost with it in flight.
fn is_loss(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss)
}

#[async_trait]
impl LeaseBackend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .with_fencing(Fencing::Durable)
            .with_min_ttl(self.inner.min_ttl)
            .with_ttl_granularity(Duration::from_millis(1))
            .with_holder_info(true)
            .with_keep_for(true)
            // The keep-for node ends by the server's clock to the millisecond, however
            // little keep-for was left (the session's minimum is the holder's, not its).
            .with_keep_for_tail(Duration::ZERO)
            .with_release_notification(true)
            .with_max_renew_batch(MAX_RENEW_BATCH)
    }

    /// Cancel safety: cancel-safe. A dropped call may have created the holder node: it is
    /// recorded before the request is sent, and the sweep deletes it at the TTL unless a
    /// renewal by its token confirms it.
    ///
    /// An acquire whose connection the client library gave up in flight (no answer within
    /// 2/5 of the session timeout) is sent again on the same session until the request
    /// timeout has run out; a first run that took the lease is then found as this
    /// owner's. A connection closed by the server or the network fails it at once.
    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let span =
            tracing::debug_span!("zookeeper.acquire", lease = %name, owner = owner.label.as_str());
        self.acquire_in_span(name, owner, ttl)
            .instrument(span)
            .await
    }

    /// Cancel safety: cancel-safe; the reads and the `multi` of every round trip are
    /// applied whole or not at all.
    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        let span = tracing::debug_span!("zookeeper.renew", leases = leases.len());
        self.renew_in_span(leases, ttl).instrument(span).await
    }

    /// Cancel safety: cancel-safe; the release is one `multi`, applied whole or not at
    /// all. A dropped call may have released; the lease's record is kept until the
    /// answer, so an unanswered release is swept at the TTL (by the name node's version:
    /// it never touches a later holder).
    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let span = tracing::debug_span!("zookeeper.release", lease = %name, owner = %token);
        self.release_in_span(name, token, keep_for)
            .instrument(span)
            .await
    }

    /// Cancel safety: cancel-safe (reads only; a lease under a keep-for node also writes
    /// the clock node, which holds nothing).
    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let path = self.inner.layout.name_node(name);
        let found = self
            .read_pair(&self.main().await?, &path, "inspect", Fresh::Ordered)
            .await?;
        let (Some((nd, _)), Some((hdata, hstat))) = (found.name, found.holder) else {
            return Ok(None);
        };
        match nodes::kind(hstat.ephemeral_owner) {
            Kind::Ephemeral(_) => {
                let remaining = self
                    .inner
                    .sessions
                    .records()
                    .by_key
                    .get(&(path.clone(), nd.token))
                    .map(|r| r.deadline.saturating_duration_since(Instant::now()));
                Ok(Some(LeaseInfo {
                    holder: Some(nd.label),
                    fencing: u64::try_from(hstat.czxid).ok().map(FencingToken),
                    remaining,
                }))
            }
            Kind::Ttl(_) | Kind::Persistent => {
                let (keep_ms, fencing) = decode_keep(&hdata)
                    .ok_or_else(|| unexpected("inspect", "keep-for node without its ttl"))?;
                let now = self.server_now_ms("inspect").await?;
                let until = hstat
                    .mtime
                    .saturating_add(i64::try_from(keep_ms).unwrap_or(i64::MAX));
                if until <= now {
                    return Ok(None);
                }
                Ok(Some(LeaseInfo {
                    holder: Some(nd.label),
                    fencing: Some(FencingToken(fencing)),
                    remaining: Some(Duration::from_millis(
                        u64::try_from(until - now).unwrap_or(0),
                    )),
                }))
            }
        }
    }

    /// Cancel safety: cancel-safe; one `multi`, applied whole or not at all.
    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let t = self.timeout();
        let path = self.inner.layout.name_node(name);
        let holder = holder_node(&path);
        for _ in 0..8 {
            let found = self
                .read_pair(&self.main().await?, &path, "force release", Fresh::Ordered)
                .await?;
            let (Some((_, nstat)), Some(_)) = (found.name, found.holder) else {
                return Ok(false);
            };
            let free = encode_name(FREE, &OwnerToken::from_bytes([0; 16]), "");
            let main = self.main().await?;
            let mut multi = main.new_multi_writer();
            multi
                .add_set_data(&path, &free, Some(nstat.version))
                .and_then(|()| multi.add_delete(&holder, None))
                .map_err(|e| convert("force release", t, e))?;
            match bounded("force release", t, multi.commit()).await? {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion | zk::Error::NoNode,
                    ..
                }) => continue,
                Err(zk::MultiWriteError::OperationFailed { source, .. })
                | Err(zk::MultiWriteError::RequestFailed { source }) => {
                    return Err(convert("force release", t, source));
                }
            }
        }
        Err(Error::Backend {
            backend: BACKEND,
            retryable: true,
            source: "the lease changed holder during every attempt".into(),
        })
    }

    /// Cancel safety: cancel-safe; the watch is dropped with the call.
    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        let t = self.timeout();
        let holder = holder_node(&self.inner.layout.name_node(name));
        let main = self.main().await?;
        let watched = bounded("wait", t, main.check_and_watch_stat(&holder)).await?;
        // Not held while waiting: a copy of a client keeps it connected after the backend
        // replaced it (`Sessions::resume_stalled`), and two clients of one session take
        // its connection from each other. A watch on a replaced client ends with it (the
        // caller looks again).
        drop(main);
        match watched {
            Ok((None, _)) => Ok(()),
            Ok((Some(_), watcher)) => {
                let _ = tokio::time::timeout(max_wait, watcher.changed()).await;
                Ok(())
            }
            Err(e) => Err(convert("wait", t, e)),
        }
    }
}
