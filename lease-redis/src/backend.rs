//! [`RedisBackend`] and its [`LeaseBackend`] implementation: the primitives as script
//! runs, acknowledgement by replicas, cluster renewal by primary, and the release of
//! acquires abandoned in flight.

use super::*;

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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The connection in use; replaced (see [`RedisBackend::reconnect`]) when the server
    /// behind it stops being a writable primary.
    pub(crate) conn: RwLock<Arc<Conn>>,
    /// Held while a replacement connection is opened, so that a burst of failed calls
    /// opens one.
    pub(crate) reconnecting: tokio::sync::Mutex<()>,
    /// Where new connections come from.
    pub(crate) source: Source,
    pub(crate) config: RedisConfig,
    pub(crate) caps: Capabilities,
    /// Server address without credentials, for Debug and logs.
    pub(crate) server: String,
    /// The slot map, on a cluster (renewal batches are grouped by primary).
    pub(crate) slots: Option<cluster::Slots>,
    /// Whether the connection is known to be up: the last call got a reply (see
    /// [`RedisBackend::send`]).
    pub(crate) up: AtomicBool,
}

/// One acquire, as carried in a (possibly shared) script run.
pub(crate) struct AcquireReq {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) token: String,
    /// The lease field's value as acquire writes it (see `scripts`).
    pub(crate) meta: String,
    pub(crate) ttl_ms: u64,
}

impl AcquireReq {
    pub(crate) fn new(prefix: &str, name: &LeaseName, owner: &Owner, ttl_ms: u64) -> Self {
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
pub(crate) fn token_string(token: &OwnerToken) -> String {
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

/// The reply of a script that writes: the script's own reply, whether it came from the
/// retry after a dropped connection, and how many replicas acknowledged the write (`None`
/// without [`RedisConfig::wait_for_replicas`]).
pub(crate) struct WriteReply {
    pub(crate) value: Value,
    pub(crate) retried: bool,
    pub(crate) acks: Option<i64>,
}

impl RedisBackend {
    /// Sends one acquire. If the caller gives up while it is in flight (its future is
    /// dropped: a timeout around it, a `select!`), the lease may be taken for nobody, so
    /// it is released at once by its owner token instead of being left to its TTL.
    pub(crate) async fn acquire_req(&self, req: &AcquireReq) -> Result<WriteReply> {
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
    pub(crate) async fn run_script(
        &self,
        operation: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<WriteReply> {
        let Some(w) = self.inner.config.wait_for_replicas else {
            let Reply { value, retried } = self.invoke(operation, inv).await?;
            return Ok(WriteReply {
                value,
                retried,
                acks: None,
            });
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
        let Reply {
            value: reply,
            retried,
        } = self
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
        Ok(WriteReply {
            value: script,
            retried,
            acks: Some(acks),
        })
    }

    /// With [`RedisConfig::wait_for_replicas`]: a retryable error unless `acks` replicas
    /// are enough. `retried` (the write's connection dropped, and the reply came on a new
    /// one, whose `WAIT` covers nothing written before it) never counts as acknowledged.
    pub(crate) fn acknowledged(&self, what: &str, acks: Option<i64>, retried: bool) -> Result<()> {
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
    pub(crate) async fn release_now(&self, lock: &str, token: &str) -> Result<bool> {
        const OP: &str = "release";
        let mut marker = String::with_capacity(token.len() + 2);
        marker.push_str(token);
        marker.push_str(":w");
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(lock).arg(token).arg(&marker);
        let cmd = &cmd;
        let Reply {
            value: reply,
            retried,
        } = self
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
            if let Err(error) = bounded(OP, cfg.call_timeout(), cfg.request_timeout, publish).await
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
    pub(crate) async fn node_client(
        &self,
        url: &cluster::ClusterUrl,
        lock: &str,
    ) -> Result<Client> {
        const OP: &str = "wait_released";
        let reply_timeout = self.inner.config.request_timeout;
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
    pub(crate) async fn renew_cluster(
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
                self.inner.config.request_timeout,
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
            if let Ok(WriteReply { retried, acks, .. }) = &reply {
                // Renewed on the primary, but not acknowledged: none of the batch counts.
                self.acknowledged("renewal", *acks, *retried)?;
            }
            let parsed = reply.and_then(|r| renew_replies(OP, r.value, ids.len()));
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
                let reply = self.run_script(OP, &inv).await.and_then(|r| {
                    self.acknowledged("renewal", r.acks, r.retried)?;
                    renew_results(OP, r.value, 1)
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
    pub(crate) fn release_abandoned(&self, lock: String, token: String) {
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
pub(crate) struct InFlight<'a> {
    pub(crate) backend: &'a RedisBackend,
    pub(crate) taken: Option<(&'a str, &'a str)>,
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
        let WriteReply {
            value: reply,
            retried,
            acks,
        } = self.acquire_req(&req).await?;
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
        // The invocation copies each key and token: built in two reused buffers, not in a
        // string each (at 10,000 leases a call, allocation was a large part of the
        // client's work).
        let (mut key, mut token) = (String::new(), String::new());
        for item in leases {
            keys::write_lock_key(&mut key, prefix, &item.name);
            token.clear();
            // Writing into a `String` cannot fail.
            let _ = fmt::Write::write_fmt(&mut token, format_args!("{}", item.token));
            inv.key(key.as_str()).arg(token.as_str());
        }
        let WriteReply {
            value: reply,
            retried,
            acks,
        } = self.run_script(OP, &inv).await?;
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
            let reply = self.invoke(OP, &inv).await?.value;
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
        let reply = self.invoke(OP, &inv).await?.value;
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
        let reply = self.invoke(OP, &inv).await?.value;
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
            cfg.request_timeout,
            client.get_async_pubsub(),
        )
        .await?;
        bounded(
            OP,
            cfg.request_timeout,
            cfg.request_timeout,
            pubsub.subscribe(&k.channel),
        )
        .await?;
        // Subscribed first, marked second: a release before the mark is seen by the
        // mark (the lease is free), one after it removes the mark and publishes.
        let mut inv = scripts::MARK_WAITING_SCRIPT.prepare_invoke();
        inv.key(&k.lock);
        let pttl = self.invoke(OP, &inv).await?.value;
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
