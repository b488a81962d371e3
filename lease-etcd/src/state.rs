//! What one backend instance knows locally: its session leases, the keys it holds, the
//! state of its watch and who waits for a release.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lease_core::OwnerToken;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::keys::owned_key;

/// The maps of the local state, keyed by etcd keys and lease ids, hashed with foldhash
/// (seeded per process) rather than SipHash: an acquire + release cycle looks its key up
/// about twenty times, and SipHash over the benchmark's keys (50 to 70 bytes) was 2% of
/// a cycle's client instructions (docs/benchmark-notes.md, etcd).
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The shared, lock-protected state. Never held across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the maps consistent (every mutation is a
        // single insert/remove/assignment), so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Keys this instance holds, acquires right now, or has seen events for while doing so.
    pub(crate) keys: HashMap<Vec<u8>, KeyState>,
    /// The current session lease per TTL in whole seconds.
    pub(crate) sessions: HashMap<u64, Session>,
    pub(crate) watch: WatchStatus,
    /// Release waiters per key.
    pub(crate) waiters: HashMap<Vec<u8>, Waiter>,
    /// When `renew` last looked for keys nobody renewed.
    pub(crate) last_sweep: Option<Instant>,
    /// Keepalives in flight, per etcd lease.
    pub(crate) flights: HashMap<i64, Flight>,
    flight_seq: u64,
    /// Keys an acquire may have put without its caller ever hearing so (reply lost, call
    /// timed out or dropped): `renew` deletes them, since the keepalives it sends for the
    /// other keys of the same etcd lease would keep them alive for ever.
    pub(crate) orphans: Vec<Orphan>,
    /// Bytes of the keys held on each etcd lease (each key's length plus
    /// [`KEY_OVERHEAD`]): a session stops taking keys at [`SESSION_KEY_BYTES`], so that
    /// the list of its keys fits in one gRPC reply.
    pub(crate) lease_bytes: HashMap<i64, usize>,
    /// Names (by key) whose release on the local path ended without an answer: its plain
    /// delete may still be applied until the instant given (the request timeout after
    /// it ended), so an acquisition of the name until then takes a key of its own.
    pub(crate) unsettled_releases: HashMap<Vec<u8>, Instant>,
    /// The highest store revision in a reply to a write or read this instance received
    /// (not in a list of a lease's keys: etcd fills that reply's revision in after reading
    /// the list). A request sent after such a reply is served at this revision or later.
    pub(crate) last_rev: i64,
}

/// The bytes a key adds to etcd's list of the keys attached to a lease, beyond its own
/// length (the protobuf field's tag and length).
pub(crate) const KEY_OVERHEAD: usize = 4;

/// The bytes an acquisition of the name whose key is `key` adds at most to etcd's list
/// of the keys attached to its lease: its record's key is the name's key followed by 16
/// hex digits, or 49 characters (see [`crate::keys::owned_key`]).
pub(crate) fn key_bytes(key: &[u8]) -> usize {
    key.len() + 49 + KEY_OVERHEAD
}

/// How many key bytes one session lease carries at most. `renew` may ask etcd for the
/// keys attached to a lease (`LeaseTimeToLive` with keys), and etcd-client's lease client
/// accepts replies of up to 4 MiB (tonic's default, which it does not let a caller
/// raise); half of that leaves room for the reply's other fields. Keys carry the name in
/// hex: with names of 20 bytes that is about 40,000 keys per session.
pub(crate) const SESSION_KEY_BYTES: usize = 2 * 1024 * 1024;

/// A key to delete, sent again by renewals until a delete is answered: one an acquire
/// may have put although its caller never heard so, or a held key nobody renewed within
/// its TTL (the sweep's; a failed delete of it would otherwise leave it on an etcd lease
/// the other keys' renewals keep alive).
#[derive(Debug, Clone)]
pub(crate) struct Orphan {
    /// The name's key.
    pub(crate) key: Vec<u8>,
    /// The key the record was put at (see [`crate::keys::owned_key`]).
    pub(crate) own: Vec<u8>,
    /// What the key must still be for the delete to apply.
    pub(crate) ours: Ours,
    pub(crate) token: OwnerToken,
    /// The etcd lease the key was put with.
    pub(crate) lease: i64,
    /// When the acquire was sent: once its request timeout has passed too, the put has
    /// been applied or never will be.
    pub(crate) sent: Instant,
    /// A delete is in flight.
    pub(crate) deleting: bool,
}

/// How an [`Orphan`]'s delete knows the key is still the one to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ours {
    /// The exact value the acquire put (it holds the acquisition's owner token, unique to
    /// it): deleted only while the record's key still has this value and the orphan's
    /// lease.
    Value(Vec<u8>),
    /// The revision of a held key's put: deleted only while the key is still at it.
    Revision(i64),
}

/// A keepalive in flight that concurrent renewals may wait for.
#[derive(Debug)]
pub(crate) struct Flight {
    seq: u64,
    /// When it was sent.
    pub(crate) sent: Instant,
    /// `Some(alive)` once answered; the sender is dropped if it fails or is cancelled.
    pub(crate) answer: watch::Receiver<Option<bool>>,
}

/// Publishes a keepalive in flight; unpublishes it when dropped.
pub(crate) struct FlightGuard {
    shared: Arc<Shared>,
    lease: i64,
    seq: u64,
    answer: watch::Sender<Option<bool>>,
}

impl FlightGuard {
    pub(crate) fn start(shared: &Arc<Shared>, lease: i64, sent: Instant) -> Self {
        let (answer, rx) = watch::channel(None);
        let mut st = shared.lock();
        st.flight_seq += 1;
        let seq = st.flight_seq;
        st.flights.insert(
            lease,
            Flight {
                seq,
                sent,
                answer: rx,
            },
        );
        FlightGuard {
            shared: shared.clone(),
            lease,
            seq,
            answer,
        }
    }

    /// Hands the answer to everyone waiting for it.
    pub(crate) fn finish(self, alive: bool) {
        let _ = self.answer.send(Some(alive));
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if st
            .flights
            .get(&self.lease)
            .is_some_and(|f| f.seq == self.seq)
        {
            st.flights.remove(&self.lease);
        }
    }
}

/// One etcd lease shared by every key this instance acquires with the same TTL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session {
    pub(crate) id: i64,
    /// The TTL etcd granted (may exceed the request: the server has a minimum).
    pub(crate) granted: Duration,
    /// When the grant or the last successful keepalive was *sent*: the lease lasts at least
    /// until `refreshed_at + granted`.
    pub(crate) refreshed_at: Instant,
}

impl Session {
    pub(crate) fn expires_at(&self) -> Instant {
        self.refreshed_at + self.granted
    }

    /// Whether new keys may still join it: at least half its TTL is left. A key that joins
    /// gets only the lease's remaining time, so a lease nobody renews is replaced by a fresh
    /// one rather than handed out with little time left.
    pub(crate) fn usable(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.refreshed_at) <= self.granted / 2
    }
}

#[derive(Debug, Default)]
pub(crate) struct KeyState {
    pub(crate) held: Option<Held>,
    /// Acquisitions of this key in flight.
    pub(crate) pending: u32,
    /// Releases on the local path in flight (see [`Releasing`]).
    pub(crate) releasing: u32,
    /// Highest revision of any watch event seen for this key while it was held or pending.
    pub(crate) last_event_rev: i64,
}

/// A key this instance holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) token: OwnerToken,
    /// The key the record was put at (see [`crate::keys::owned_key`]).
    pub(crate) own: Vec<u8>,
    pub(crate) label: String,
    /// The etcd lease the key is attached to.
    pub(crate) lease: i64,
    pub(crate) granted: Duration,
    /// Revision of our put: the key's create and mod revision while it is ours.
    pub(crate) rev: i64,
    /// The store revision up to which the key is known to be ours without the watch: its
    /// put, or the latest look at the keys attached to its etcd lease that found it. The
    /// watch covers the key when it delivers every event after this revision.
    pub(crate) known_rev: i64,
    /// Start of the acquire call (keep-for is measured from here).
    pub(crate) locked_at: Instant,
    /// Lower bound of the key's expiry had nobody but its own renewals kept the lease alive.
    pub(crate) deadline: Instant,
    /// The watch saw the key deleted or overwritten by someone else.
    pub(crate) lost: bool,
}

/// The watch of the key range. It runs only while it is useful: started by the first
/// `renew` of a held key (a lease released before its first renewal never needs it) or by
/// a release waiter, and stopped once this instance neither holds, acquires nor waits for
/// any key.
#[derive(Debug, Default)]
pub(crate) struct WatchStatus {
    /// The watch task, while the watch runs.
    pub(crate) task: Option<tokio::task::JoinHandle<()>>,
    /// Bumped at every start and stop: a task whose epoch is no longer this one has been
    /// stopped and must not touch the state.
    pub(crate) epoch: u64,
    /// The watch stream is established.
    pub(crate) healthy: bool,
    /// The revision from which the running watch delivers every event, through
    /// reconnections (it resumes where it stopped); `i64::MAX` after history was
    /// compacted away, until it is established again from "now" (every release waiter is
    /// woken then).
    pub(crate) cont_from: i64,
    /// The revision from which `renew` trusts the watch: one past the store's revision
    /// when the watch stream was last established (events before it may still be
    /// replaying), or where the watch was started while no stream is established yet;
    /// `i64::MAX` after history was compacted away, until the stream is established
    /// again.
    pub(crate) from_rev: i64,
    /// The next revision the watch has not delivered yet (0: from "now").
    pub(crate) next_rev: i64,
}

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) notify: Arc<Notify>,
    count: usize,
}

impl State {
    pub(crate) fn held(&self, key: &[u8]) -> Option<&Held> {
        self.keys.get(key).and_then(|k| k.held.as_ref())
    }

    /// Whether `renew` must ask etcd which keys are attached to the etcd lease of `h`:
    /// the watch is not established, or it does not deliver every event after what is
    /// known of the key (it started later, or lost history since).
    pub(crate) fn needs_verify(&self, h: &Held) -> bool {
        !self.watch.healthy || h.known_rev.saturating_add(1) < self.watch.from_rev
    }

    /// Notes a revision the store answered at (see [`State::last_rev`]).
    pub(crate) fn saw_rev(&mut self, rev: i64) {
        self.last_rev = self.last_rev.max(rev);
    }

    /// Records that this instance holds `key` (replacing a record of an earlier hold).
    pub(crate) fn set_held(&mut self, key: &[u8], held: Held) {
        *self.lease_bytes.entry(held.lease).or_default() += key_bytes(key);
        let old = self
            .keys
            .entry(key.to_vec())
            .or_default()
            .held
            .replace(held);
        if let Some(old) = old {
            self.unaccount(old.lease, key_bytes(key));
        }
    }

    /// Takes `bytes` off the count of etcd lease `lease`.
    pub(crate) fn unaccount(&mut self, lease: i64, bytes: usize) {
        if let Some(count) = self.lease_bytes.get_mut(&lease) {
            *count = count.saturating_sub(bytes);
            if *count == 0 {
                self.lease_bytes.remove(&lease);
            }
        }
    }

    /// Drops the record of `key` once nothing refers to it, and stops the watch once no
    /// key and no waiter is left.
    pub(crate) fn forget_if_idle(&mut self, key: &[u8]) {
        if self
            .keys
            .get(key)
            .is_some_and(|k| k.held.is_none() && k.pending == 0 && k.releasing == 0)
        {
            self.keys.remove(key);
        }
        self.stop_watch_if_idle();
    }

    /// Forgets that we hold `key` at revision `rev` (released, lost or swept).
    pub(crate) fn forget_held(&mut self, key: &[u8], rev: i64) {
        if let Some(k) = self.keys.get_mut(key)
            && k.held.as_ref().is_some_and(|h| h.rev == rev)
            && let Some(old) = k.held.take()
        {
            self.unaccount(old.lease, key_bytes(key));
        }
        self.forget_if_idle(key);
    }

    /// Stops the watch when this instance neither holds, acquires nor waits for any key:
    /// nothing needs its events then. The next `renew` or release waiter starts it again.
    pub(crate) fn stop_watch_if_idle(&mut self) {
        if self.keys.is_empty() && self.waiters.is_empty() {
            self.stop_watch();
        }
    }

    /// Stops the watch task (it may finish its current step, but no longer touches the
    /// state: its epoch is gone).
    pub(crate) fn stop_watch(&mut self) {
        if let Some(task) = self.watch.task.take() {
            task.abort();
            self.watch.epoch += 1;
            self.watch.healthy = false;
            tracing::debug!("etcd watch stopped: no key held or waited for");
        }
    }

    /// A watch event: `key` was written (`delete == false`) or deleted at `rev`.
    pub(crate) fn on_event(&mut self, key: &[u8], rev: i64, delete: bool) {
        if let Some(k) = self.keys.get_mut(key) {
            k.last_event_rev = k.last_event_rev.max(rev);
            if let Some(h) = &mut k.held {
                // Our own put has exactly `h.rev`; anything later is someone else's
                // delete, expiry or overwrite (our own keep-for re-put happens after we
                // forgot the key).
                if rev > h.rev {
                    h.lost = true;
                }
            }
        }
        if delete && let Some(w) = self.waiters.get(key) {
            w.notify.notify_waiters();
        }
    }

    /// Wakes every release waiter (they re-check; used when events may have been lost).
    pub(crate) fn wake_all(&self) {
        for w in self.waiters.values() {
            w.notify.notify_waiters();
        }
    }

    /// The watch lost history: every held key must be verified on the store.
    pub(crate) fn on_history_lost(&mut self) {
        self.watch.from_rev = i64::MAX;
        self.watch.cont_from = i64::MAX;
        self.wake_all();
    }

    /// The orphans whose etcd lease `renewed` just kept alive (marked as being deleted),
    /// after dropping the records that need no delete: a key held again by the same token,
    /// or an etcd lease nothing keeps alive any more (it lapses with its keys).
    pub(crate) fn orphans_to_delete(&mut self, renewed: &HashMap<i64, Instant>) -> Vec<Orphan> {
        if self.orphans.is_empty() {
            return Vec::new();
        }
        let in_use: std::collections::HashSet<i64> = self
            .keys
            .values()
            .filter_map(|k| k.held.as_ref().map(|h| h.lease))
            .chain(self.sessions.values().map(|s| s.id))
            .collect();
        let keys = &self.keys;
        self.orphans.retain(|o| {
            let held_by_it = keys
                .get(&o.key)
                .and_then(|k| k.held.as_ref())
                .is_some_and(|h| h.token == o.token);
            !held_by_it && (in_use.contains(&o.lease) || o.deleting)
        });
        let mut due = Vec::new();
        for o in &mut self.orphans {
            if !o.deleting && renewed.contains_key(&o.lease) {
                o.deleting = true;
                due.push(o.clone());
            }
        }
        due
    }

    /// A delete of `orphan` was answered or failed; `final_answer`: the record can go.
    /// Matched by key, token, lease and check: the same owner may have another record of
    /// the key (a later acquisition's, at another revision or value).
    pub(crate) fn orphan_done(&mut self, orphan: &Orphan, final_answer: bool) {
        let same = |o: &Orphan| {
            o.key == orphan.key
                && o.token == orphan.token
                && o.lease == orphan.lease
                && o.ours == orphan.ours
        };
        if final_answer {
            self.orphans.retain(|o| !same(o));
        } else if let Some(o) = self.orphans.iter_mut().find(|o| same(o)) {
            o.deleting = false;
        }
    }

    /// Forgets the session lease `id` (expired or revoked) and every key attached to it.
    pub(crate) fn on_lease_gone(&mut self, id: i64) {
        self.sessions.retain(|_, s| s.id != id);
        self.orphans.retain(|o| o.lease != id);
        let gone: Vec<Vec<u8>> = self
            .keys
            .iter()
            .filter(|(_, k)| k.held.as_ref().is_some_and(|h| h.lease == id))
            .map(|(key, _)| key.clone())
            .collect();
        self.lease_bytes.remove(&id);
        for key in gone {
            if let Some(k) = self.keys.get_mut(&key) {
                k.held = None;
            }
            self.forget_if_idle(&key);
        }
    }
}

/// Marks an acquisition of `key` in flight, so watch events for it are recorded before
/// the acquisition's result is known, and holds the key's bytes reserved on its session
/// lease (see [`SESSION_KEY_BYTES`]; the reservation is made when the session is chosen).
/// Dropping it (also on cancellation) unmarks and gives the reservation back; dropping it
/// before [`Pending::settle`] (the call failed, timed out or was dropped without a reply)
/// records the key as an [`Orphan`] the next renewals delete.
pub(crate) struct Pending {
    shared: Arc<Shared>,
    key: Vec<u8>,
    lease: i64,
    unsettled: Option<Orphan>,
}

impl Pending {
    /// Marks the acquisition in flight and chooses the key its record goes to: the
    /// session's ([`owned_key`] of `lease`), shared by the acquisitions of the name
    /// through that session one after the other, unless this instance has another
    /// record of the name (held, being acquired, being released, or released without an
    /// answer within its request timeout). Then the owner token is added: a plain delete
    /// of the session's key sent for an earlier acquisition, which may still be applied,
    /// can never remove this one's record.
    pub(crate) fn new(
        shared: Arc<Shared>,
        key: Vec<u8>,
        value: Vec<u8>,
        token: OwnerToken,
        lease: i64,
    ) -> Self {
        let own = {
            let mut st = shared.lock();
            let now = Instant::now();
            st.unsettled_releases.retain(|_, until| *until > now);
            let busy = st.unsettled_releases.contains_key(&key)
                || st
                    .keys
                    .get(&key)
                    .is_some_and(|k| k.held.is_some() || k.pending > 0 || k.releasing > 0);
            st.keys.entry(key.clone()).or_default().pending += 1;
            owned_key(&key, lease, busy.then_some(&token))
        };
        Pending {
            shared,
            lease,
            unsettled: Some(Orphan {
                key: key.clone(),
                own,
                ours: Ours::Value(value),
                token,
                lease,
                sent: Instant::now(),
                deleting: false,
            }),
            key,
        }
    }

    /// The key the record goes to.
    pub(crate) fn own(&self) -> &[u8] {
        self.unsettled.as_ref().map_or(&[], |o| o.own.as_slice())
    }

    /// The store answered: whatever the acquire did is known to its caller.
    pub(crate) fn settle(&mut self) {
        self.unsettled = None;
    }
}

/// Marks a release on the local path (a plain delete of the record's key) in flight, from
/// before it is sent until [`Releasing::done`]. Dropped before that (the call failed,
/// timed out or was dropped), the delete may still be applied later: the name is then
/// recorded in [`State::unsettled_releases`] for `timeout`.
pub(crate) struct Releasing {
    shared: Arc<Shared>,
    key: Vec<u8>,
    timeout: Duration,
    done: bool,
}

impl Releasing {
    /// Marks the release in `st`, the locked state of `shared` (the lock under which the
    /// caller found the record).
    pub(crate) fn enter(
        st: &mut State,
        shared: &Arc<Shared>,
        key: Vec<u8>,
        timeout: Duration,
    ) -> Self {
        st.keys.entry(key.clone()).or_default().releasing += 1;
        Releasing {
            shared: shared.clone(),
            key,
            timeout,
            done: false,
        }
    }

    /// No delete of this release can be applied any more without its answer being known
    /// (answered, or the remaining steps are conditional on the record's revision).
    pub(crate) fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(k) = st.keys.get_mut(&self.key) {
            k.releasing = k.releasing.saturating_sub(1);
        }
        if !self.done {
            let until = Instant::now() + self.timeout;
            st.unsettled_releases.insert(self.key.clone(), until);
        }
        st.forget_if_idle(&self.key);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.unaccount(self.lease, key_bytes(&self.key));
        if let Some(k) = st.keys.get_mut(&self.key) {
            k.pending = k.pending.saturating_sub(1);
        }
        st.forget_if_idle(&self.key);
        if let Some(orphan) = self.unsettled.take() {
            st.orphans.push(orphan);
        }
    }
}

/// A registered release waiter; unregisters on drop.
pub(crate) struct WaiterGuard {
    shared: Arc<Shared>,
    key: Vec<u8>,
    pub(crate) notify: Arc<Notify>,
}

impl WaiterGuard {
    pub(crate) fn new(shared: Arc<Shared>, key: Vec<u8>) -> Self {
        let notify = {
            let mut st = shared.lock();
            let w = st.waiters.entry(key.clone()).or_insert_with(|| Waiter {
                notify: Arc::new(Notify::new()),
                count: 0,
            });
            w.count += 1;
            w.notify.clone()
        };
        WaiterGuard {
            shared,
            key,
            notify,
        }
    }
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let remove = match st.waiters.get_mut(&self.key) {
            Some(w) => {
                w.count = w.count.saturating_sub(1);
                w.count == 0
            }
            None => false,
        };
        if remove {
            st.waiters.remove(&self.key);
            st.stop_watch_if_idle();
        }
    }
}
