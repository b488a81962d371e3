//! The one heartbeat task per client.
//!
//! It owns every held lease of its client, renews all due leases in one batched `renew`
//! call per TTL per tick, retries failures with jittered backoff until each lease's local
//! safety deadline, and signals a lease lost at that deadline (or as soon as the store
//! says it is not ours). Unregistering a lease that is part of an in-flight renewal waits
//! for that renewal to finish, so no renewal can reach the store after the release.
//!
//! The task is supervised from inside: a backend future that panics is caught and counts
//! as a failed renewal, and if the task itself ends abnormally (its runtime is shut down,
//! or a bug panics) the drop of its state tells every lease it held that it is lost
//! ([`LossReason::HeartbeatStopped`]). The client sees the closed channel and starts a new
//! heartbeat for its next acquire. Logs are written per batch, not per lease.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::backend::LeaseBackend;
use crate::error::Error;
use crate::metrics;
use crate::shared::{GuardShared, LossReason};
use crate::types::{HolderLabel, LeaseName, LeaseOptions, OwnerToken, RenewItem, RenewOutcome};
use crate::util::{Site, backoff_delay, call};

/// At most this many lease names are written into one log event about a batch.
const NAMES_IN_LOG: usize = 5;

/// At most this many `renew` calls of one [`LeaseClient`](crate::LeaseClient)'s
/// heartbeat are in flight at once, each of at most
/// [`Capabilities::max_renew_batch`](crate::Capabilities::max_renew_batch) leases; due
/// leases beyond them wait for a call to finish.
///
/// A store serves the batches of a tick at the speed it serves them either way, but each
/// call is bounded by the call timeout: sent all at once, the 100 calls that renew a
/// million leases on one Redis server queue behind each other on its one thread, and on a
/// slow host the last of them was answered after more than the default call timeout of
/// 5 s. With four in flight, a call waits for at most three others.
///
/// ```
/// assert_eq!(lease_core::raw::RENEW_CALLS_IN_FLIGHT, 4);
/// ```
pub const RENEW_CALLS_IN_FLIGHT: usize = 4;

/// After a registration, the heartbeat wakes at least this often (for as long as leases
/// keep being registered), even with nothing due: a new lease whose first renewal is
/// later than its next wake-up is then only queued, not woken for, so that a stream of
/// leases acquired and released within a renewal period costs the heartbeat one wake-up
/// per tick instead of one per lease. A wake-up that is only the tick takes the queue and
/// makes no pass over the leases held. A tick with no registration since the one before
/// lets the heartbeat sleep until its next renewal (or until woken).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// What the heartbeat needs to keep one lease alive.
pub(crate) struct Registration {
    pub id: u64,
    pub name: LeaseName,
    pub token: OwnerToken,
    /// The options the lease was taken with (TTL, renewal period, safety margin, call
    /// timeout, backoff), carried whole.
    pub opts: LeaseOptions,
    pub sent_at: Instant,
    /// Local safety deadline after the acquisition: send time + the TTL the store
    /// granted (which may be shorter than requested, e.g. a shared etcd lease) - margin.
    pub first_deadline: Instant,
    pub shared: Arc<GuardShared>,
}

impl Registration {
    /// When the first renewal is due: one renewal period after the acquire was sent, or
    /// half-way to the first deadline if the store granted less TTL than asked (so that
    /// a retry still fits before the deadline). The one rule for the first renewal, used
    /// both to decide whether to wake the heartbeat and to schedule the renewal.
    fn first_due(&self) -> Instant {
        let halfway =
            self.sent_at + self.first_deadline.saturating_duration_since(self.sent_at) / 2;
        (self.sent_at + self.opts.renew_every()).min(halfway)
    }
}

pub(crate) enum Command {
    Register(Box<Registration>),
    /// Look at the pending queue now.
    Wake,
    /// Stop renewing `id`; `ack` fires once no renewal for it is in flight.
    Unregister {
        id: u64,
        ack: Option<oneshot::Sender<()>>,
    },
}

struct Entry {
    reg: Registration,
    next_due: Instant,
    deadline: Instant,
    attempt: u32,
    in_flight: bool,
    /// Due at the last full pass, in a batch of the backlog that waits for a free call
    /// (`RENEW_CALLS_IN_FLIGHT`).
    queued: bool,
    lost: bool,
    /// Set when unregistered during an in-flight renewal.
    unregister_acks: Option<Vec<oneshot::Sender<()>>>,
}

impl Entry {
    /// A lease just handed to the heartbeat: not renewed yet, nothing in flight.
    fn new(reg: Registration, next_due: Instant, deadline: Instant) -> Self {
        Entry {
            reg,
            next_due,
            deadline,
            attempt: 0,
            in_flight: false,
            queued: false,
            lost: false,
            unregister_acks: None,
        }
    }
}

type BatchFuture = Pin<Box<dyn Future<Output = BatchResult> + Send>>;

struct BatchResult {
    ids: Vec<u64>,
    /// When the pass that planned the batch ran (see [`Batch::planned`]).
    planned: Instant,
    sent_at: Instant,
    result: Result<Vec<RenewOutcome>, Error>,
}

/// The client's side of the heartbeat.
///
/// Registrations and quiet unregistrations go to a queue that the heartbeat drains each
/// time it wakes; the task is woken only when a new lease needs attention before its
/// next scheduled wake-up. So acquiring and releasing a lease costs no cross-task wake-up
/// in the steady state, only a queue push.
#[derive(Debug)]
pub(crate) struct HeartbeatHandle {
    tx: mpsc::UnboundedSender<Command>,
    shared: Arc<Queue>,
}

struct Queue {
    pending: Mutex<Vec<Command>>,
    /// The heartbeat's next wake-up in nanoseconds after `epoch`; `u64::MAX` while idle.
    wake_at: AtomicU64,
    epoch: Instant,
    /// When the last renewal call that the store answered was sent, in nanoseconds after
    /// `epoch`, plus one; 0 before the first. Read by [`LeaseClient::health`].
    ///
    /// [`LeaseClient::health`]: crate::LeaseClient::health
    answered_at: AtomicU64,
    /// How many leases the heartbeat keeps (as of its last pass).
    leases: AtomicU64,
    /// Registrations so far: the heartbeat ticks ([`IDLE_TICK`]) while this grows, even
    /// when each lease was released (and taken out of the queue) before it looked.
    registered: AtomicU64,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("wake_at", &self.wake_at)
            .finish_non_exhaustive()
    }
}

impl Queue {
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn push(&self, cmd: Command) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cmd);
    }

    fn take(&self) -> Vec<Command> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl HeartbeatHandle {
    /// Whether the heartbeat task still runs (or at least has not ended).
    pub(crate) fn is_alive(&self) -> bool {
        !self.tx.is_closed()
    }

    /// When the store last answered a renewal call (sent at that instant), if ever.
    pub(crate) fn last_answer(&self) -> Option<Instant> {
        match self.shared.answered_at.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.shared.epoch + Duration::from_nanos(n - 1)),
        }
    }

    /// How many leases the heartbeat keeps.
    pub(crate) fn leases(&self) -> u64 {
        self.shared.leases.load(Ordering::Relaxed)
    }

    /// Hands a new lease to the heartbeat; `false` if the heartbeat is gone.
    pub(crate) fn register(&self, reg: Registration) -> bool {
        let attention = self.shared.nanos(reg.first_due());
        self.shared.registered.fetch_add(1, Ordering::Relaxed);
        self.shared.push(Command::Register(Box::new(reg)));
        // Pushed before reading `wake_at`; the heartbeat publishes `wake_at` before it
        // drains the queue. So either it sees this entry, or we see its wake-up time and
        // wake it if that is too late.
        if self.shared.wake_at.load(Ordering::SeqCst) > attention {
            return self.tx.send(Command::Wake).is_ok();
        }
        !self.tx.is_closed()
    }

    /// Stops renewing `id` without waiting (the guard has set its `released` flag and no
    /// renewal of it is in flight). A lease whose registration the heartbeat has not
    /// taken yet (acquired and released between two of its passes) is taken out of the
    /// queue instead: it costs the heartbeat nothing, and the queue does not grow with
    /// the acquisitions of a renewal period.
    pub(crate) fn unregister_quiet(&self, id: u64) {
        let mut pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Searched from the end: a short lease's registration is usually the last entry.
        let queued = pending
            .iter()
            .rposition(|c| matches!(c, Command::Register(reg) if reg.id == id));
        match queued {
            Some(i) => {
                pending.remove(i);
            }
            None => pending.push(Command::Unregister { id, ack: None }),
        }
    }

    /// How many commands wait for the heartbeat's next pass (for tests).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The heartbeat's published next wake-up, in nanoseconds after the epoch (for tests).
    #[cfg(test)]
    fn wake_at(&self) -> u64 {
        self.shared.wake_at.load(Ordering::SeqCst)
    }

    /// Sends a command that needs the heartbeat now; `false` if it is gone.
    pub(crate) fn send(&self, cmd: Command) -> bool {
        self.tx.send(cmd).is_ok()
    }
}

/// Spawns the heartbeat task on the current runtime.
pub(crate) fn spawn(
    backend: Arc<dyn LeaseBackend>,
    backend_name: &'static str,
    owner: HolderLabel,
    max_batch: usize,
    epoch: Instant,
) -> Result<HeartbeatHandle, Error> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Queue {
        pending: Mutex::new(Vec::new()),
        wake_at: AtomicU64::new(u64::MAX),
        epoch,
        answered_at: AtomicU64::new(0),
        leases: AtomicU64::new(0),
        registered: AtomicU64::new(0),
    });
    let span = tracing::info_span!("lease.heartbeat", backend = backend_name);
    let state = State {
        entries: BTreeMap::new(),
        rx,
        queue: shared.clone(),
    };
    handle.spawn(crate::util::in_span(
        span,
        run(backend, backend_name, owner, max_batch.max(1), state),
    ));
    Ok(HeartbeatHandle { tx, shared })
}

/// The heartbeat's state. Dropped when the task ends: normally (the client and every
/// guard are gone) it holds nothing live; when the runtime shuts down or the task
/// panics, its drop tells every lease still registered that it is lost.
struct State {
    entries: BTreeMap<u64, Entry>,
    rx: mpsc::UnboundedReceiver<Command>,
    queue: Arc<Queue>,
}

impl Drop for State {
    fn drop(&mut self) {
        // Close first, then drain: a registration pushed after the drain sees the closed
        // channel (the queue's lock orders the two), and its client starts a new heartbeat.
        self.rx.close();
        let mut stranded: Vec<Arc<GuardShared>> = std::mem::take(&mut self.entries)
            .into_values()
            .map(|e| e.reg.shared)
            .collect();
        for cmd in self.queue.take() {
            if let Command::Register(reg) = cmd {
                stranded.push(reg.shared);
            }
        }
        while let Ok(cmd) = self.rx.try_recv() {
            if let Command::Register(reg) = cmd {
                stranded.push(reg.shared);
            }
        }
        let lost: Vec<&LeaseName> = stranded
            .iter()
            .filter(|s| !s.is_released() && s.mark_lost(LossReason::HeartbeatStopped))
            .map(|s| s.name())
            .collect();
        if !lost.is_empty() {
            tracing::warn!(
                leases = lost.len(),
                names = %names_for_log(lost.iter().copied(), lost.len()),
                "the heartbeat stopped (its runtime shut down, or it panicked): its leases \
                 are lost and lapse at their TTL"
            );
        }
    }
}

/// Up to [`NAMES_IN_LOG`] of `names`, for a log event about `total` leases.
fn names_for_log<'a>(names: impl IntoIterator<Item = &'a LeaseName>, total: usize) -> String {
    let mut out = String::new();
    for (i, n) in names.into_iter().take(NAMES_IN_LOG).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&n.to_string_lossy());
    }
    if total > NAMES_IN_LOG {
        out.push_str(&format!(" and {} more", total - NAMES_IN_LOG));
    }
    out
}

async fn run(
    backend: Arc<dyn LeaseBackend>,
    backend_name: &'static str,
    owner: HolderLabel,
    max_batch: usize,
    mut state: State,
) {
    let State { entries, rx, queue } = &mut state;
    let queue = queue.clone();
    let mut in_flight: FuturesUnordered<BatchFuture> = FuturesUnordered::new();
    // Batches the last full pass found due and could not start yet.
    let mut backlog: VecDeque<Batch> = VecDeque::new();
    // The full passes over all entries (expire, start due batches, next wake-up) run only
    // when the timer fires or a batch finishes, not on every command: registering N leases
    // one by one must not cost O(N^2).
    let mut dirty = true;
    let mut wake: Option<Instant> = None;
    // The idle tick (`IDLE_TICK`): when it fires next, and the registrations seen by then.
    let mut tick: Option<Instant> = None;
    let mut seen = 0;
    loop {
        for cmd in queue.take() {
            if let Some(t) = apply(entries, cmd) {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            }
        }
        if dirty {
            let now = Instant::now();
            let Plan {
                backlog: due,
                wake: next,
            } = plan(max_batch, entries, now);
            backlog = due;
            wake = next;
            start_batches(
                &backend,
                backend_name,
                &owner,
                entries,
                &mut backlog,
                &mut in_flight,
            );
            dirty = false;
        }
        queue.leases.store(entries.len() as u64, Ordering::Relaxed);
        let registered = queue.registered.load(Ordering::Relaxed);
        if registered != seen {
            seen = registered;
            tick = Some(Instant::now() + IDLE_TICK);
        }
        let until = match (wake, tick) {
            (Some(w), Some(t)) => Some(w.min(t)),
            (w, t) => w.or(t),
        };
        // Publish the wake-up time, then look at the queue once more (see `register`).
        queue
            .wake_at
            .store(until.map_or(u64::MAX, |w| queue.nanos(w)), Ordering::SeqCst);
        let late = queue.take();
        if !late.is_empty() {
            for cmd in late {
                if let Some(t) = apply(entries, cmd) {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                }
            }
            continue;
        }
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { break };
                let mut next = Some(cmd);
                while let Some(cmd) = next {
                    if let Some(t) = apply(entries, cmd) {
                        wake = Some(wake.map_or(t, |w| w.min(t)));
                    }
                    next = rx.try_recv().ok();
                }
            }
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                if done.result.is_ok() {
                    queue
                        .answered_at
                        .fetch_max(queue.nanos(done.sent_at).saturating_add(1), Ordering::Relaxed);
                }
                // No full pass here (it costs a look at every lease, and a tick of a
                // million leases finishes a hundred calls): the batch's own leases are
                // settled and their next renewal (or retry) planned, and the backlog's
                // next batch starts. The wake-up planned by the last full pass still
                // covers every lease outside the backlog and the calls in flight.
                if let Some(t) = finish(backend_name, entries, done) {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                }
                start_batches(
                    &backend,
                    backend_name,
                    &owner,
                    entries,
                    &mut backlog,
                    &mut in_flight,
                );
            }
            _ = sleep_until_opt(until) => {
                // A full pass only when an entry needs one; a wake-up that is only the
                // tick takes the queue (at the top of the loop) and nothing more.
                dirty = until == wake;
                if tick == until {
                    tick = None;
                }
            }
        }
    }
    // The client and all its guards are gone; let in-flight renewals finish so that
    // nothing is left running against the store.
    while let Some(done) = in_flight.next().await {
        let _ = finish(backend_name, entries, done);
    }
}

/// Applies one command; returns the time the new entry needs attention, if any.
fn apply(entries: &mut BTreeMap<u64, Entry>, cmd: Command) -> Option<Instant> {
    match cmd {
        Command::Register(reg) => {
            let deadline = reg.first_deadline;
            reg.shared.set_deadline(deadline);
            let next_due = reg.first_due();
            let entry = Entry::new(*reg, next_due, deadline);
            let attention = entry.next_due.min(entry.deadline);
            entries.insert(entry.reg.id, entry);
            Some(attention)
        }
        Command::Unregister { id, ack } => {
            unregister(entries, id, ack);
            None
        }
        Command::Wake => None,
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn unregister(entries: &mut BTreeMap<u64, Entry>, id: u64, ack: Option<oneshot::Sender<()>>) {
    match entries.get_mut(&id) {
        Some(e) if e.in_flight => {
            e.lost = true; // stop scheduling it
            let acks = e.unregister_acks.get_or_insert_with(Vec::new);
            acks.extend(ack);
        }
        Some(_) => {
            entries.remove(&id);
            if let Some(ack) = ack {
                let _ = ack.send(());
            }
        }
        None => {
            if let Some(ack) = ack {
                let _ = ack.send(());
            }
        }
    }
}

/// Whether a lease next due at `next_due` is renewed with a batch that starts at `now`:
/// when it is due within 3/5 of its renewal period.
///
/// The window must be wider than half a period. Two clusters of leases half a period
/// apart would otherwise each just miss the other's batch: each pass starts a little
/// after its own due time (timer lateness) and each batch's next due time is counted from
/// when its call is sent (a little later still), so their offset can stay just above half
/// a period for ever, costing two calls per tick. With a window of 3/5, of any two
/// clusters one lies within the other's window, whatever their offset. A lease is then
/// renewed at most 3/5 of a period early: at least every 2/5 of a period.
fn joins_batch(next_due: Instant, now: Instant, renew_every: Duration) -> bool {
    next_due <= now + renew_every * 3 / 5
}

/// One `renew` call to make: leases of one TTL and call timeout.
struct Batch {
    ttl: Duration,
    call_timeout: Duration,
    ids: Vec<u64>,
    /// When the pass that made it ran. A renewed lease is next due one renewal period
    /// after this, not after its own call was sent: the calls of one tick go out one
    /// after the other (at most [`RENEW_CALLS_IN_FLIGHT`] at once), so counted from each
    /// send the leases of one tick would be due spread over the tick's length, and the
    /// next pass, made when the first of them is due, would take only some of them; the
    /// rest a pass later, and so on, a tick splitting into several per period (seen at a
    /// million leases acquired over 39 s on one Redis server: five ticks of 3 to 3.7 s in
    /// 31 s, each renewing 70 to 80% of the leases, each lease renewed about every 8 s).
    /// Counted from the pass, the leases of a tick stay together. The safety deadline
    /// still counts from the send.
    planned: Instant,
}

/// What the tick's one pass over every lease found.
struct Plan {
    /// The batches due now, in calls of at most `max_batch` leases, each lease marked
    /// queued.
    backlog: VecDeque<Batch>,
    /// When the heartbeat must look at its leases next: a lease's renewal or its deadline
    /// (only the deadline for a lease in flight or queued, whose renewal starts when a
    /// call in flight finishes, which wakes the heartbeat anyway).
    wake: Option<Instant>,
}

/// Leases that share a `(ttl, call timeout)`: one renew call per group per tick.
struct Group {
    key: (Duration, Duration),
    any_due: bool,
    ids: Vec<u64>,
}

/// The tick's one pass over every lease, in a single sweep of the table (at a million
/// leases each sweep is a walk through hundreds of megabytes, and each look at a lease's
/// shared state a cache miss, so the pass looks at each lease once):
/// - drops released leases, and marks lost (one log event for all) those whose deadline
///   has passed or that the guard's own timer marked lost already;
/// - groups the leases that [`joins_batch`] by `(ttl, call timeout)`; a group with a lease
///   due now is cut into batches of at most `max_batch`;
/// - finds the next wake-up.
fn plan(max_batch: usize, entries: &mut BTreeMap<u64, Entry>, now: Instant) -> Plan {
    let mut groups: Vec<Group> = Vec::new();
    // Nearly every lease of a client shares one group: look at the last one used first.
    let mut index: HashMap<(Duration, Duration), usize> = HashMap::new();
    let mut last = 0;
    let mut lost = LostLog::default();
    let mut wake: Option<Instant> = None;
    let mut wake_at = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
    entries.retain(|id, e| {
        e.queued = false;
        if e.reg.shared.is_released() {
            // Released (its unregistration may still be queued): never reported lost;
            // kept until its renewal in flight ends.
            if e.in_flight && !e.lost {
                wake_at(e.deadline);
            }
            return e.in_flight;
        }
        if !e.lost && (e.deadline <= now || e.reg.shared.is_lost()) {
            e.lost = true;
            e.reg.shared.mark_lost(LossReason::DeadlinePassed);
            lost.add(&e.reg);
            return e.in_flight;
        }
        if e.lost {
            return true;
        }
        if e.in_flight {
            wake_at(e.deadline);
            return true;
        }
        if !joins_batch(e.next_due, now, e.reg.opts.renew_every()) {
            wake_at(e.next_due.min(e.deadline));
            return true;
        }
        let key = (e.reg.opts.ttl(), e.reg.opts.call_timeout());
        if groups.get(last).is_none_or(|g| g.key != key) {
            last = *index.entry(key).or_insert_with(|| {
                groups.push(Group {
                    key,
                    any_due: false,
                    ids: Vec::new(),
                });
                groups.len() - 1
            });
        }
        if let Some(group) = groups.get_mut(last) {
            group.any_due |= e.next_due <= now;
            group.ids.push(*id);
            e.queued = true;
            wake_at(e.deadline);
        }
        true
    });
    lost.log(LossReason::DeadlinePassed);
    // When any lease of a group is due, every lease of the group that `joins_batch` is
    // renewed with it, so leases acquired at different times fall into step within a
    // round or two and then cost one call per tick.
    let mut backlog = VecDeque::new();
    for Group {
        key: (ttl, call_timeout),
        any_due,
        mut ids,
    } in groups
    {
        if !any_due {
            // Not due yet after all: waits for its own renewal time.
            for id in &ids {
                if let Some(e) = entries.get_mut(id) {
                    e.queued = false;
                    wake_at(e.next_due.min(e.deadline));
                }
            }
            continue;
        }
        ids.sort_unstable();
        for chunk in ids.chunks(max_batch) {
            backlog.push_back(Batch {
                ttl,
                call_timeout,
                ids: chunk.to_vec(),
                planned: now,
            });
        }
    }
    Plan { backlog, wake }
}

/// Leases lost together, for one log event: how many, the first few names, and the
/// first lease's shared state (its holder and fencing token when it is the only one).
#[derive(Default)]
struct LostLog {
    count: usize,
    names: Vec<LeaseName>,
    first: Option<Arc<GuardShared>>,
}

impl LostLog {
    fn add(&mut self, reg: &Registration) {
        self.count += 1;
        if self.names.len() < NAMES_IN_LOG {
            self.names.push(reg.name.clone());
        }
        if self.first.is_none() {
            self.first = Some(reg.shared.clone());
        }
    }

    /// One warning for all of them: with the lease's name, holder and fencing token when
    /// it is one, with their number and a few names when they are many.
    fn log(&self, reason: LossReason) {
        match (self.count, &self.first, self.names.first()) {
            (0, _, _) => {}
            (1, Some(shared), Some(name)) => tracing::warn!(
                lease = %name,
                holder = %shared.holder(),
                fencing = shared.fencing().get(),
                %reason,
                "lease lost"
            ),
            _ => tracing::warn!(
                leases = self.count,
                names = %names_for_log(self.names.iter(), self.count),
                %reason,
                "leases lost"
            ),
        }
    }
}

/// Starts batches of `backlog` while fewer than [`RENEW_CALLS_IN_FLIGHT`] calls are in
/// flight. A lease released, lost or already in flight since the batch was made is left
/// out of it.
fn start_batches(
    backend: &Arc<dyn LeaseBackend>,
    backend_name: &'static str,
    owner: &HolderLabel,
    entries: &mut BTreeMap<u64, Entry>,
    backlog: &mut VecDeque<Batch>,
    in_flight: &mut FuturesUnordered<BatchFuture>,
) {
    while in_flight.len() < RENEW_CALLS_IN_FLIGHT {
        let Some(Batch {
            ttl,
            call_timeout,
            ids: chunk,
            planned,
        }) = backlog.pop_front()
        else {
            return;
        };
        let mut items = Vec::with_capacity(chunk.len());
        let mut ids = Vec::with_capacity(chunk.len());
        for id in &chunk {
            let Some(e) = entries.get_mut(id) else {
                continue;
            };
            if !e.queued {
                continue;
            }
            e.queued = false;
            if e.lost || e.in_flight || e.reg.shared.is_lost() {
                continue;
            }
            // Mark in flight first, then check `released` (the guard sets `released`
            // first, then checks in flight): a release either sees this renewal and waits
            // for it, or this renewal sees the release.
            e.reg.shared.set_in_flight(true);
            if e.reg.shared.is_released() {
                e.reg.shared.set_in_flight(false);
                e.lost = true;
                continue;
            }
            e.in_flight = true;
            ids.push(*id);
            items.push(RenewItem {
                name: e.reg.name.clone(),
                token: e.reg.token,
            });
        }
        if ids.is_empty() {
            continue;
        }
        let backend = backend.clone();
        let owner = owner.clone();
        tracing::debug!(leases = items.len(), ?ttl, "renewing batch");
        in_flight.push(Box::pin(async move {
            let sent_at = Instant::now();
            // A panic inside the backend's future is caught here and counts as a failed
            // renewal; it cannot take the heartbeat down.
            let site = Site {
                backend: backend_name,
                operation: "renew",
                lease: None,
                owner: Some(&owner),
                leases: Some(items.len()),
            };
            let result = call(site, call_timeout, backend.renew(&items, ttl)).await;
            metrics::renew_call(backend_name, items.len(), sent_at.elapsed());
            BatchResult {
                ids,
                planned,
                sent_at,
                result,
            }
        }));
    }
}

/// Settles a finished renew call's leases; returns when the first of those it keeps needs
/// the heartbeat again (its next renewal, or its retry after a failed call).
fn finish(
    backend: &'static str,
    entries: &mut BTreeMap<u64, Entry>,
    done: BatchResult,
) -> Option<Instant> {
    let now = Instant::now();
    let BatchResult {
        ids,
        planned,
        sent_at,
        result,
    } = done;
    let result = match result {
        Ok(outcomes) if outcomes.len() == ids.len() => Ok(outcomes),
        Ok(outcomes) => Err(Error::unexpected(
            "heartbeat",
            format!(
                "renew returned {} results for {} leases",
                outcomes.len(),
                ids.len()
            ),
        )),
        Err(e) => Err(e),
    };
    // One backoff for the whole batch, so that its leases are retried together (looked
    // up only when the call failed: at a million leases each look is a cache miss).
    let attempt = if result.is_err() {
        ids.iter()
            .filter_map(|id| entries.get(id))
            .map(|e| e.attempt)
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    let mut renewals = metrics::Renewals::new(backend);
    let mut retry: Option<(Duration, Vec<u64>)> = None;
    let mut again: Option<Instant> = None;
    let mut not_ours = LostLog::default();
    let mut late = LostLog::default();
    for (i, id) in ids.iter().enumerate() {
        let Some(e) = entries.get_mut(id) else {
            continue;
        };
        e.in_flight = false;
        e.reg.shared.set_in_flight(false);
        if let Some(acks) = e.unregister_acks.take() {
            for ack in acks {
                let _ = ack.send(());
            }
            entries.remove(id);
            continue;
        }
        if e.lost || e.reg.shared.is_lost() {
            entries.remove(id);
            continue;
        }
        match &result {
            Ok(outcomes) => match outcomes.get(i) {
                Some(RenewOutcome::Renewed) if now < e.deadline => {
                    renewals.renewed(&e.reg.name, e.deadline - now);
                    e.attempt = 0;
                    e.deadline =
                        sent_at + e.reg.opts.ttl().saturating_sub(e.reg.opts.safety_margin());
                    e.reg.shared.set_deadline(e.deadline);
                    // From the pass that planned the call (`Batch::planned`), never
                    // later than from the send.
                    e.next_due = planned.min(sent_at) + e.reg.opts.renew_every();
                    again = Some(again.map_or(e.next_due, |t: Instant| t.min(e.next_due)));
                    tracing::trace!(lease = %e.reg.name, "renewed");
                }
                Some(RenewOutcome::Renewed) => {
                    // The reply came after the safety deadline: the lost signal was due
                    // then, and it stays given.
                    metrics::renewal(backend, &e.reg.name, "lost");
                    e.lost = true;
                    e.reg.shared.mark_lost(LossReason::DeadlinePassed);
                    late.add(&e.reg);
                    entries.remove(id);
                }
                _ => {
                    metrics::renewal(backend, &e.reg.name, "lost");
                    e.lost = true;
                    e.reg.shared.mark_lost(LossReason::NotOwner);
                    not_ours.add(&e.reg);
                    entries.remove(id);
                }
            },
            Err(_) => {
                metrics::renewal(backend, &e.reg.name, "error");
                let (delay, failed) = retry.get_or_insert_with(|| {
                    (
                        backoff_delay(e.reg.opts.backoff_min(), e.reg.opts.backoff_max(), attempt),
                        Vec::new(),
                    )
                });
                failed.push(*id);
                e.attempt = e.attempt.saturating_add(1);
                e.next_due = (now + *delay).min(e.deadline);
                again = Some(again.map_or(e.next_due, |t: Instant| t.min(e.next_due)));
            }
        }
    }
    renewals.finish();
    if let (Err(err), Some((delay, failed))) = (&result, retry) {
        let names = failed
            .iter()
            .filter_map(|id| entries.get(id))
            .map(|e| &e.reg.name);
        tracing::warn!(
            leases = failed.len(),
            names = %names_for_log(names, failed.len()),
            error = %err,
            retry_in = ?delay,
            "renewal failed; retrying until the safety deadline"
        );
    }
    not_ours.log(LossReason::NotOwner);
    late.log(LossReason::DeadlinePassed);
    again
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two clusters of leases, `offset` apart, each renewed by a batch whose pass runs
    /// `late` after its due time and whose call is sent `send_delay` after the pass (the
    /// next due time counts from the send). Returns how many renewal periods pass before
    /// one batch takes both clusters, or `None` if it never happens within 20 periods.
    fn periods_to_merge(offset: Duration, late: Duration, send_delay: Duration) -> Option<u32> {
        let period = Duration::from_secs(1);
        let start = Instant::now();
        let mut due = [start + period, start + period + offset];
        for round in 0..40u32 {
            // The cluster due first is renewed; the other joins it if `joins_batch` says so.
            let (first, other) = if due[0] <= due[1] { (0, 1) } else { (1, 0) };
            let now = due[first] + late;
            let sent = now + send_delay;
            if joins_batch(due[other], now, period) {
                return Some(round / 2);
            }
            due[first] = sent + period;
        }
        None
    }

    #[test]
    fn clusters_at_any_offset_fall_into_step() {
        // Timer lateness and send delays like those of a loaded two-core machine with
        // thousands of leases (send_delay > late is what can keep two clusters apart when
        // the window is only half a period).
        let ms = Duration::from_millis;
        for (late, send_delay) in [
            (ms(0), ms(0)),
            (ms(1), ms(3)),
            (ms(2), ms(20)),
            (ms(0), ms(50)),
        ] {
            for offset_ms in 1..1000 {
                let offset = ms(offset_ms);
                let merged = periods_to_merge(offset, late, send_delay);
                assert!(
                    merged.is_some_and(|p| p <= 1),
                    "clusters {offset:?} apart (late {late:?}, send delay {send_delay:?}) \
                     merged after {merged:?} periods"
                );
            }
        }
    }

    /// A registration of lease `n{id}` sent now, with its guard's state on the memory
    /// backend's series.
    fn registration(
        id: u64,
        opts: LeaseOptions,
        first_deadline: Instant,
        label: &HolderLabel,
        epoch: Instant,
    ) -> Registration {
        let name = LeaseName::new(format!("n{id}")).expect("name");
        let token = OwnerToken::random();
        Registration {
            id,
            name: name.clone(),
            token,
            opts,
            sent_at: Instant::now(),
            first_deadline,
            shared: Arc::new(GuardShared::new(
                crate::metrics::Series::new("memory"),
                name,
                token,
                crate::types::FencingToken(id),
                label.clone(),
                epoch,
            )),
        }
    }

    /// The tick's one sweep: a group with a lease due is cut into batches and its leases
    /// wait queued (the next wake-up is then their deadline); a group whose leases are
    /// only within the joining window, none due, is left for its own renewal time, which
    /// the next wake-up covers; a released lease is dropped; a lease past its deadline is
    /// marked lost and dropped.
    #[tokio::test(start_paused = true)]
    async fn one_sweep_plans_due_groups_and_leaves_the_others_for_their_time() {
        let label = HolderLabel::new("t").expect("label");
        let epoch = Instant::now();
        let now = Instant::now();
        let short = LeaseOptions::new(Duration::from_secs(30)).expect("options");
        let long = LeaseOptions::new(Duration::from_secs(60)).expect("options");
        let mut entries = BTreeMap::new();
        let mut add = |id: u64, opts: &LeaseOptions, next_due: Instant, deadline: Instant| {
            let reg = registration(id, opts.clone(), deadline, &label, epoch);
            let shared = reg.shared.clone();
            entries.insert(id, Entry::new(reg, next_due, deadline));
            shared
        };
        let s = Duration::from_secs;
        // Short group (renewal period 10 s): 0 is due, 1..=4 within 3/5 of a period.
        add(0, &short, now, now + s(20));
        for id in 1..=4 {
            add(id, &short, now + s(id), now + s(20));
        }
        // Long group (period 20 s): within its window (12 s) but none due.
        add(10, &long, now + s(7), now + s(50));
        add(11, &long, now + s(9), now + s(50));
        // Released, and past its deadline.
        add(20, &short, now, now + s(20)).set_released();
        let late = add(21, &short, now, now);
        let plan = plan(2, &mut entries, now);
        let batches: Vec<Vec<u64>> = plan.backlog.iter().map(|b| b.ids.clone()).collect();
        assert_eq!(batches, [vec![0, 1], vec![2, 3], vec![4]]);
        assert!(plan.backlog.iter().all(|b| b.ttl == s(30)));
        assert_eq!(
            plan.wake,
            Some(now + s(7)),
            "the long group's first renewal"
        );
        for id in [0, 1, 2, 3, 4] {
            assert!(entries[&id].queued, "{id}");
        }
        for id in [10, 11] {
            assert!(!entries[&id].queued, "{id}");
        }
        assert!(!entries.contains_key(&20) && !entries.contains_key(&21));
        assert_eq!(late.loss_reason(), Some(LossReason::DeadlinePassed));
    }

    /// A lease acquired and released before the heartbeat's next pass leaves nothing in
    /// its queue (before: a registration and an unregistration per lease, each holding
    /// the guard's state until the next pass).
    #[tokio::test(start_paused = true)]
    async fn short_leases_leave_nothing_queued() {
        let backend: Arc<dyn LeaseBackend> = Arc::new(crate::memory::MemoryBackend::new());
        let label = HolderLabel::new("t").expect("label");
        let hb = spawn(backend, "memory", label.clone(), 100, Instant::now()).expect("spawn");
        let opts = LeaseOptions::new(Duration::from_secs(30)).expect("options");
        // One long lease: the heartbeat's next pass is a renewal period away.
        let reg = |id: u64| {
            let deadline = Instant::now() + Duration::from_secs(27);
            registration(id, opts.clone(), deadline, &label, Instant::now())
        };
        assert!(hb.register(reg(0)));
        tokio::task::yield_now().await;
        for id in 1..=1000 {
            assert!(hb.register(reg(id)));
            hb.unregister_quiet(id);
        }
        assert_eq!(hb.queued(), 0);
        // A lease the heartbeat has taken is unregistered through the queue.
        assert!(hb.register(reg(2000)));
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        hb.unregister_quiet(2000);
        assert!(hb.queued() <= 2);
    }

    /// Leases acquired and released within their renewal period do not wake the
    /// heartbeat one by one: once it has seen a registration, it wakes again within one
    /// idle tick, so a lease due later than that is only queued; a lease due sooner still
    /// wakes it; and after a tick with no registration it sleeps until woken again.
    #[tokio::test(start_paused = true)]
    async fn a_stream_of_short_leases_wakes_the_heartbeat_once_per_tick() {
        let backend: Arc<dyn LeaseBackend> = Arc::new(crate::memory::MemoryBackend::new());
        let label = HolderLabel::new("t").expect("label");
        let epoch = Instant::now();
        let hb = spawn(backend, "memory", label.clone(), 100, epoch).expect("spawn");
        let reg = |id: u64, ttl: Duration| {
            let opts = LeaseOptions::new(ttl).expect("options");
            let deadline = Instant::now() + ttl - opts.safety_margin();
            registration(id, opts, deadline, &label, epoch)
        };
        let nanos = |t: Instant| u64::try_from((t - epoch).as_nanos()).expect("nanos");
        tokio::task::yield_now().await;
        assert_eq!(hb.wake_at(), u64::MAX, "an idle heartbeat has no wake-up");
        // The first lease wakes it (a renewal period away, but nothing earlier is planned).
        assert!(hb.register(reg(1, Duration::from_secs(30))));
        hb.unregister_quiet(1);
        tokio::task::yield_now().await;
        let first = hb.wake_at();
        assert!(
            first <= nanos(Instant::now() + IDLE_TICK),
            "after a registration the heartbeat wakes within a tick: {first}"
        );
        // More 30 s leases: queued only, each taken out again at its release.
        for id in 2..100 {
            assert!(hb.register(reg(id, Duration::from_secs(30))));
            hb.unregister_quiet(id);
        }
        assert_eq!(hb.queued(), 0);
        // A lease due before the tick (TTL 300 ms: first renewal after 100 ms) wakes it,
        // and it plans that renewal.
        assert!(hb.register(reg(100, Duration::from_millis(300))));
        tokio::task::yield_now().await;
        assert!(
            hb.wake_at() <= nanos(Instant::now() + Duration::from_millis(100)),
            "a lease due before the tick is planned at once"
        );
        hb.unregister_quiet(100);
        // With no registration for a tick, the heartbeat sleeps again.
        tokio::time::sleep(IDLE_TICK * 3).await;
        assert_eq!(
            hb.wake_at(),
            u64::MAX,
            "the tick stops once leases stop coming"
        );
    }

    #[test]
    fn a_lease_joins_a_batch_within_three_fifths_of_its_period() {
        let now = Instant::now();
        let period = Duration::from_secs(10);
        assert!(joins_batch(now + Duration::from_secs(6), now, period));
        assert!(!joins_batch(
            now + Duration::from_millis(6_001),
            now,
            period
        ));
    }
}
