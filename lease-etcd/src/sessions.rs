//! What the clones of a backend share: one etcd lease (session) per TTL, the watch of
//! the prefix, the record of held keys, and the background deletes and revokes.

use super::*;

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    pub(crate) layout: Layout,
    /// Endpoints without credentials, for Debug and logs.
    pub(crate) endpoints: Vec<String>,
    pub(crate) shared: Arc<Shared>,
    /// Serializes session lease grants, so concurrent first acquires grant one lease.
    pub(crate) grant_lock: tokio::sync::Mutex<()>,
    pub(crate) keepalives: AtomicU64,
    /// Release waits that looked at their key and now wait on the watch.
    pub(crate) waits_armed: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.lock().stop_watch();
    }
}

impl Inner {
    pub(crate) fn timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// How often a request that could not reach a member is sent again.
    pub(crate) fn tries(&self) -> usize {
        2 * self.endpoints.len().max(2) + 1
    }

    /// One request, bounded by the request timeout, retried while it did not reach a
    /// server; the raw result.
    pub(crate) async fn rpc<T, F, Fut>(
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
    pub(crate) async fn call<T, F, Fut>(&self, operation: &'static str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        call_retrying(operation, self.timeout(), self.tries(), attempt).await
    }

    /// The session lease for `secs`, granting one if there is none, the current one has
    /// less than half its TTL left or carries [`SESSION_KEY_BYTES`] of keys; `key_bytes`
    /// are reserved on it under the same lock as that check (a [`Pending`] made right
    /// after, with no await between, gives them back).
    pub(crate) async fn session(
        &self,
        secs: u64,
        key_bytes: usize,
        operation: &'static str,
    ) -> Result<Session> {
        if let Some(s) = self.reserve_in_session(secs, key_bytes) {
            return Ok(s);
        }
        let _grant = self.grant_lock.lock().await;
        if let Some(s) = self.reserve_in_session(secs, key_bytes) {
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
        let mut st = self.shared.lock();
        st.sessions.insert(secs, session);
        *st.lease_bytes.entry(session.id).or_default() += key_bytes;
        Ok(session)
    }

    /// The current session lease for `secs` if a new key may still join it (at least half
    /// its TTL is left and its keys, those being acquired included, are below
    /// [`SESSION_KEY_BYTES`]), with `key_bytes` reserved on it.
    pub(crate) fn reserve_in_session(&self, secs: u64, key_bytes: usize) -> Option<Session> {
        let now = Instant::now();
        let mut st = self.shared.lock();
        let session = st.sessions.get(&secs).filter(|s| s.usable(now)).copied()?;
        let bytes = st.lease_bytes.entry(session.id).or_default();
        if *bytes >= SESSION_KEY_BYTES {
            return None;
        }
        *bytes += key_bytes;
        Some(session)
    }

    pub(crate) fn forget_session(&self, secs: u64, id: i64) {
        let mut st = self.shared.lock();
        if st.sessions.get(&secs).is_some_and(|s| s.id == id) {
            st.sessions.remove(&secs);
        }
    }

    /// Starts the watch from `start_rev` unless it runs or nothing needs it (no key held,
    /// acquired or waited for: it would only stop again at the next release); restarts it
    /// where it stopped if its task ended (only a panic in the client library ends it).
    /// Returns the revision from which the watch delivers every event (`i64::MAX` while
    /// that is not known, or when no watch runs): a running watch may have started after
    /// `start_rev`.
    pub(crate) fn ensure_watch(&self, start_rev: i64) -> i64 {
        let mut st = self.shared.lock();
        if st.keys.is_empty() && st.waiters.is_empty() {
            return i64::MAX;
        }
        match &st.watch.task {
            Some(task) if !task.is_finished() => return st.watch.cont_from,
            Some(_) => {} // resumes at `next_rev`: nothing was skipped
            None => {
                st.watch.next_rev = start_rev.max(1);
                st.watch.from_rev = st.watch.next_rev;
                st.watch.cont_from = st.watch.next_rev;
                tracing::debug!(from_rev = st.watch.next_rev, "etcd watch started");
            }
        }
        st.watch.epoch += 1;
        st.watch.healthy = false;
        st.watch.task = Some(tokio::spawn(watch::run(
            self.client.watch_client(),
            self.layout.range_prefix().to_vec(),
            self.shared.clone(),
            st.watch.epoch,
            self.timeout(),
        )));
        st.watch.cont_from
    }

    /// Restarts a watch task that ended (it only ends by a panic in the client library).
    pub(crate) fn check_watch(&self) {
        let finished = self
            .shared
            .lock()
            .watch
            .task
            .as_ref()
            .is_some_and(|t| t.is_finished());
        if finished {
            let _ = self.ensure_watch(0);
        }
    }

    /// One keepalive for lease `id`, or the answer of one already in flight that was sent
    /// after `call_started` (concurrent renewals of the same etcd lease share it: the lease
    /// was refreshed after each of them started). With `verify`, also the list of keys
    /// attached to the lease (never shared).
    pub(crate) async fn check_lease(
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
            Ok::<_, Error>((resp.ttl() >= 0).then(|| Attached {
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

    /// Who holds the name of `key` (a name's key, not a record's), for an acquire that
    /// found it taken: the holder's record, read with a request of its own; `None` when
    /// the name is free by then. How long it has left is known without another request
    /// only when the holder is this instance (a waiting client is woken by the release
    /// notification, which also covers expiry).
    ///
    /// Cancel-safe: a read.
    pub(crate) async fn held_by(&self, name: &LeaseName, key: &[u8]) -> Result<Option<HeldBy>> {
        Ok(self
            .holder_record("acquire", name, key)
            .await?
            .map(|(kv, stored)| HeldBy {
                holder: Some(stored.label),
                remaining: self.local_remaining(&kv),
            }))
    }

    /// The record of whoever holds the name of `key` (a name's key), decoded; `None` when
    /// the name is free. One range read (limit 1). Cancel-safe: a read.
    pub(crate) async fn holder_record(
        &self,
        operation: &'static str,
        name: &LeaseName,
        key: &[u8],
    ) -> Result<Option<(KeyValue, crate::keys::Stored)>> {
        let mut resp = self
            .call(operation, || {
                let mut kv = self.client.kv_client();
                let opts = GetOptions::new().with_range(range_end(key)).with_limit(1);
                async move { kv.get(key, Some(opts)).await }
            })
            .await?;
        let Some(kv) = resp.take_kvs().into_iter().next() else {
            return Ok(None);
        };
        let stored = decode_value(kv.value())
            .map_err(|e| unexpected(operation, format!("lease {name}: {e}")))?;
        Ok(Some((kv, stored)))
    }

    /// How long `kv` has left, if it is a key this instance holds (a lower bound: counted
    /// from when the last keepalive was sent).
    pub(crate) fn local_remaining(&self, kv: &KeyValue) -> Option<Duration> {
        let st = self.shared.lock();
        let h = st.held(self.layout.name_key_of(kv.key())?)?;
        let now = Instant::now();
        (h.own == kv.key()
            && h.lease == kv.lease()
            && h.rev == kv.mod_revision()
            && h.deadline > now)
            .then(|| h.deadline - now)
    }

    /// How long the lease of `kv` has left: from our own record when it is our key (no
    /// request), else asked of etcd (whose answer is whole seconds; this reports the upper
    /// bound, capped at the granted TTL).
    pub(crate) async fn remaining(
        &self,
        operation: &'static str,
        kv: &KeyValue,
    ) -> Result<Remaining> {
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

    /// Deletes keys that acquires may have put without their callers hearing so, each only
    /// while it still has the acquire's own value and etcd lease, and held keys nobody
    /// renewed, each only while it is still at its put's revision, in the background. A
    /// record is dropped once a delete sent after the acquire's request timeout was
    /// answered (by then the put has been applied or never will be); until then every
    /// renewal that keeps its etcd lease alive sends the delete again.
    pub(crate) fn spawn_orphan_deletes(&self, orphans: Vec<Orphan>) {
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
                        let own = o.own.clone();
                        let when = match &o.ours {
                            Ours::Value(value) => vec![
                                Compare::value(own.clone(), CompareOp::Equal, value.clone()),
                                Compare::lease(own.clone(), CompareOp::Equal, o.lease),
                            ],
                            Ours::Revision(rev) => {
                                vec![Compare::mod_revision(own.clone(), CompareOp::Equal, *rev)]
                            }
                        };
                        let txn = Txn::new()
                            .when(when)
                            .and_then([TxnOp::delete(own, None)]);
                        let done = call("release", t, kv.txn(txn)).await;
                        match &done {
                            Ok(r) if r.succeeded() => match o.ours {
                                Ours::Value(_) => tracing::info!(lease_id = o.lease, "deleted a key put by an acquire whose reply never arrived"),
                                Ours::Revision(_) => tracing::info!(lease_id = o.lease, "deleted a key nobody renewed within its ttl"),
                            },
                            Ok(_) => {}
                            Err(e) => tracing::debug!(error = %e, "deleting an etcd key failed; the next renewal tries again"),
                        }
                        // A put known by its revision is applied: any answer settles it.
                        let final_answer = done.is_ok()
                            && (matches!(o.ours, Ours::Revision(_)) || sent >= o.sent + t);
                        shared.lock().orphan_done(&o, final_answer);
                    }
                })
                .await;
        });
    }

    /// Revokes an etcd lease nobody uses, in the background (it would expire anyway).
    pub(crate) fn spawn_revoke(&self, id: i64) {
        let mut lease = self.client.lease_client();
        let t = self.timeout();
        tokio::spawn(async move {
            let _ = call("release", t, lease.revoke(id)).await;
        });
    }
}
