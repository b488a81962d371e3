//! [`EtcdBackend`] and its [`LeaseBackend`] implementation: the primitives as
//! transactions on the shared sessions.

use super::*;

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
/// let backend = EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
/// let client = LeaseClient::new(Arc::new(backend));
/// let guard = client.acquire("nightly-report", &LeaseOptions::new(Duration::from_secs(30))?).await?;
/// println!("fencing token {}", guard.fencing());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.config.key_prefix)
            .field("user", &self.inner.config.user)
            .finish_non_exhaustive()
    }
}

/// The TTL etcd is asked for: whole seconds, rounded up, at least 1.
pub(crate) fn ttl_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

pub(crate) fn secs_i64(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

pub(crate) fn fencing_of(operation: &'static str, revision: i64) -> Result<FencingToken> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 => Ok(FencingToken(r)),
        _ => Err(unexpected(operation, format!("revision {revision}"))),
    }
}

/// How long a key's etcd lease has left.
pub(crate) enum Remaining {
    Left(Duration),
    /// The key has no lease: it never expires.
    NoExpiry,
    /// The lease is gone, so the key is too.
    Gone,
}

/// The outcome of one keepalive (and, when the watch cannot be trusted, a look at the keys
/// attached to the lease).
pub(crate) struct LeaseCheck {
    pub(crate) id: i64,
    pub(crate) sent: Instant,
    pub(crate) alive: bool,
    pub(crate) keys: Option<Attached>,
}

/// The keys attached to a lease. etcd reads the list, then fills in the reply's revision:
/// the list held at some revision between the last one this instance saw before asking
/// ([`State::last_rev`](crate::state::State)) and the reply's, so only the former is a
/// revision it is known to hold at.
pub(crate) struct Attached {
    pub(crate) keys: HashSet<Vec<u8>>,
}

impl EtcdBackend {
    /// The settings in use.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// How many etcd lease keepalives `renew` has sent (for tests and metrics).
    #[doc(hidden)]
    pub fn keepalives_sent(&self) -> u64 {
        self.inner.keepalives.load(Ordering::Relaxed)
    }

    /// Whether the watch of the key range runs (for tests).
    #[doc(hidden)]
    pub fn watch_running(&self) -> bool {
        self.inner.shared.lock().watch.task.is_some()
    }

    /// Whether the watch of the key range is established (for tests).
    #[doc(hidden)]
    pub fn watch_healthy(&self) -> bool {
        self.inner.shared.lock().watch.healthy
    }

    /// How many release waits looked at their key and then waited on the watch (for tests).
    #[doc(hidden)]
    pub fn release_waits_armed(&self) -> u64 {
        self.inner.waits_armed.load(Ordering::Relaxed)
    }

    /// Whether this instance holds a record of `name` that its watch saw deleted or taken
    /// by someone else (for tests).
    #[doc(hidden)]
    pub fn holds_lost(&self, name: &LeaseName) -> bool {
        let key = self.inner.layout.key(name.as_bytes());
        self.inner.shared.lock().held(&key).is_some_and(|h| h.lost)
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

#[lease_core::async_trait]
impl LeaseBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .with_fencing(Fencing::Durable)
            .with_min_ttl(self.inner.config.min_ttl)
            .with_ttl_granularity(Duration::from_secs(1))
            .with_release_notification(true)
            .with_max_renew_batch(MAX_RENEW_BATCH)
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
        // Whether a held attempt found the name free again when it read the holder.
        let mut reread = false;
        loop {
            // Reserves the key's bytes on the session; `pending` gives them back.
            let session = inner.session(secs, key_bytes(&key), "acquire").await?;
            // Until the store answers, the key may be put without this call hearing so:
            // dropped unsettled, `pending` records it for `renew` to delete. It also
            // chooses the record's key: the session's, or a key of this acquisition's own
            // while this instance has another record of the name (see `Pending::new`).
            let mut pending = Pending::new(
                inner.shared.clone(),
                key.clone(),
                value.clone(),
                owner.token,
                session.id,
            );
            let own = pending.own().to_vec();
            // Free when no key of the name exists (whoever's acquisition it is); then
            // the record goes in at its key. No read of the holder's record in the same
            // transaction: it would carry the name's key twice more, and with common
            // names that takes the request past h2's 256 bytes, above which it is
            // written apart (an extra system call and packet on every acquire). A held
            // attempt reads the holder with a request of its own (`held_by`).
            // `version == 0` holds for every key of the range exactly when it has none
            // (etcd compares an empty range with an absent key), as `create_revision == 0`
            // does; its target is the protocol's default, 2 bytes shorter on the wire.
            // Built for each attempt from the parts, not built once and cloned for each:
            // a clone copies every part too, on top of the build.
            let reply = inner
                .rpc("acquire", || {
                    let mut kv = inner.client.kv_client();
                    let txn = Txn::new()
                        .when([Compare::version(key.clone(), CompareOp::Equal, 0)
                            .with_range(range_end(&key))])
                        .and_then([TxnOp::put(
                            own.clone(),
                            value.clone(),
                            Some(PutOptions::new().with_lease(session.id)),
                        )]);
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
                    st.saw_rev(rev);
                    let lost = st.keys.get(&key).is_some_and(|k| k.last_event_rev > rev);
                    st.set_held(
                        &key,
                        Held {
                            token: owner.token,
                            own,
                            label: owner.label.as_str().to_owned(),
                            lease: session.id,
                            granted: session.granted,
                            rev,
                            known_rev: rev,
                            locked_at: started,
                            deadline: expires,
                            lost,
                        },
                    );
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
            match inner.held_by(name, &key).await? {
                Some(held) => {
                    tracing::debug!(lease = %name, holder = ?held.holder, "held elsewhere");
                    return Ok(AcquireOutcome::Held(held));
                }
                // Released between the transaction and the read: try once more.
                None if !reread => {
                    reread = true;
                    continue;
                }
                None => {
                    return Ok(AcquireOutcome::Held(HeldBy {
                        holder: None,
                        remaining: None,
                    }));
                }
            }
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
        // Per etcd lease involved: whether to ask which keys are attached to it, because
        // the watch does not cover one of the keys renewed on it.
        // `floor`: a revision every answer to this call's requests is at or after.
        let (ids, floor): (BTreeMap<i64, bool>, i64) = {
            let st = inner.shared.lock();
            let mut ids = BTreeMap::new();
            for (key, item) in keys.iter().zip(leases) {
                if let Some(h) = st.held(key).filter(|h| h.token == item.token && !h.lost) {
                    *ids.entry(h.lease).or_insert(false) |= st.needs_verify(h);
                }
            }
            (ids, st.last_rev)
        };
        if ids.is_empty() {
            return Ok(vec![RenewOutcome::Lost; leases.len()]);
        }
        let asked = Instant::now();
        let checks = futures::future::try_join_all(
            ids.iter()
                .map(|(id, verify)| inner.check_lease(*id, *verify, call_started)),
        )
        .await?;
        tracing::debug!(
            leases = leases.len(),
            etcd_leases = ids.len(),
            verified = checks.iter().filter(|c| c.keys.is_some()).count(),
            took = ?asked.elapsed(),
            "keepalive"
        );

        let mut sweep = Vec::new();
        let orphans;
        let outcomes = {
            let mut st = inner.shared.lock();
            let mut renewed: crate::state::HashMap<i64, Instant> = Default::default();
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
                    for k in st.keys.values_mut() {
                        if let Some(h) = &mut k.held {
                            // The list holds at `floor` or later: a key put by then and
                            // missing from it is lost, one in it was ours at `floor`. Keys
                            // put after `floor` may be missing from it without being lost.
                            if h.lease == check.id && h.rev <= floor {
                                if attached.keys.contains(&h.own) {
                                    h.known_rev = h.known_rev.max(floor);
                                } else {
                                    h.lost = true;
                                }
                            }
                        }
                    }
                }
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
                        // Recorded as an orphan, so that the renewals that keep its etcd
                        // lease alive send the delete again until one is answered.
                        sweep.push(Orphan {
                            key: key.clone(),
                            own: h.own.clone(),
                            ours: Ours::Revision(h.rev),
                            token: h.token,
                            lease: h.lease,
                            sent: h.locked_at,
                            deleting: true,
                        });
                    }
                }
            }
            for o in &sweep {
                if let Ours::Revision(rev) = o.ours {
                    st.forget_held(&o.key, rev);
                }
            }
            st.orphans.extend(sweep.iter().cloned());
            orphans = st.orphans_to_delete(&renewed);
            outcomes
        };
        // The watch runs while renewed keys are held, from the revision the lists just
        // read are known to hold at: it delivers every later event, so the next renewals
        // need only the keepalive.
        if outcomes.contains(&RenewOutcome::Renewed) && checks.iter().any(|c| c.keys.is_some()) {
            let _ = inner.ensure_watch(floor + 1);
        }
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
            inner.spawn_orphan_deletes(sweep);
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
        // On the local path, a release in flight is marked (see `Releasing`) under the
        // same lock that found the record, so that no acquisition of the name can take
        // the record's key between the two: one meanwhile takes a key of its own.
        let (local, mut releasing) = {
            let mut st = inner.shared.lock();
            match st.held(&key) {
                Some(h) if h.token == *token && h.lost => {
                    // Lost (deleted or taken by someone else): forget it whatever the
                    // store answers below, or its record would keep the watch running.
                    let rev = h.rev;
                    st.forget_held(&key, rev);
                    (None, None)
                }
                Some(h) if h.token == *token => {
                    let found = (h.rev, Some(h.locked_at), h.label.clone(), h.own.clone());
                    let releasing =
                        Releasing::enter(&mut st, &inner.shared, key.clone(), inner.timeout());
                    (Some(found), Some(releasing))
                }
                _ => (None, None),
            }
        };
        let (rev, locked_at, label, own) = match local {
            Some(found) => found,
            None => {
                // Not acquired through this instance (or lost): ask the store. The
                // name's range holds at most one record (an acquire puts one only into
                // an empty range).
                let resp = inner
                    .call("release", || {
                        let mut kv = inner.client.kv_client();
                        let key = key.clone();
                        let opts = GetOptions::new().with_range(range_end(&key)).with_limit(1);
                        async move { kv.get(key, Some(opts)).await }
                    })
                    .await?;
                let Some(kv) = resp.kvs().first() else {
                    return Ok(ReleaseOutcome::NotOwner);
                };
                match decode_value(kv.value()) {
                    Ok(s) if s.token == *token && !s.released => {
                        (kv.mod_revision(), None, s.label, kv.key().to_vec())
                    }
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
        let owned = Compare::mod_revision(own.clone(), CompareOp::Equal, rev);
        let txn_call = |txn: Txn| {
            inner.call("release", move || {
                let mut kv = inner.client.kv_client();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
        };
        let plain_delete = keep.is_zero() && locked_at.is_some();
        if !plain_delete && let Some(r) = &mut releasing {
            // The steps below are conditional on the revision of our put: they cannot
            // overtake a later put of the key.
            r.done();
        }
        let succeeded = if plain_delete {
            // This instance put the record at `rev` and is the only writer of its key: no
            // other acquisition of the name through this instance uses that key while
            // this record is known or its release is in flight (`Pending::new`), and
            // other instances write keys of their own etcd leases. Deleting it removes
            // our record or, if it expired or was deleted meanwhile, nothing.
            let resp = inner
                .call("release", || {
                    let mut kv = inner.client.kv_client();
                    let own = own.clone();
                    async move { kv.delete(own, None).await }
                })
                .await?;
            if let Some(r) = &mut releasing {
                r.done();
            }
            resp.deleted() > 0
        } else if keep.is_zero() {
            // Acquired elsewhere and read above: deleted only while still at the revision
            // read (a keep-for release through another instance may have rewritten it).
            let txn = Txn::new()
                .when([owned])
                .and_then([TxnOp::delete(own.clone(), None)]);
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
                own.clone(),
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
        drop(releasing);
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
        let Some((kv, stored)) = inner.holder_record("inspect", name, &key).await? else {
            return Ok(None);
        };
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
                let opts = DeleteOptions::new().with_range(range_end(&key));
                async move { kv.delete(key, Some(opts)).await }
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
        // Registered first, then looked: a delete after this read reaches the watch if it
        // delivers every event after the read. A watch that was already running may have
        // started later than that (a renewal started it meanwhile): then look again, which
        // reads at or after its start. After history was compacted away, the watch wakes
        // every waiter once it runs again.
        for _ in 0..3 {
            let resp = inner
                .call("wait_released", || {
                    let mut kv = inner.client.kv_client();
                    let key = key.clone();
                    let opts = GetOptions::new()
                        .with_range(range_end(&key))
                        .with_count_only();
                    async move { kv.get(key, Some(opts)).await }
                })
                .await?;
            if resp.count() == 0 {
                return Ok(());
            }
            let read = resp.header().map_or(0, |h| h.revision());
            let from = inner.ensure_watch(read + 1);
            if from <= read + 1 || from == i64::MAX {
                break;
            }
        }
        inner.waits_armed.fetch_add(1, Ordering::Relaxed);
        let _ = tokio::time::timeout(max_wait, notified).await;
        Ok(())
    }
}
