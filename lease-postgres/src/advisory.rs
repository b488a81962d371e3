//! The session advisory-lock mode, kept for comparison.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::MAX_RENEW_BATCH;
use crate::config::split_own_params;
use crate::connection::{
    bounded_call, connect_options, millis_ceil, pool_options, session_settings,
};
use crate::error::ADVISORY_BACKEND;

mod shared;

use shared::{SharedLock, SharedSessions};

/// The refusal of a connection through a pooler: advisory locks belong to a server
/// session, and a transaction pooler shares one session among many clients (each would
/// be told it holds the same lock) and hands one client's statements to several.
fn behind_a_pooler(why: &str) -> Error {
    Error::Rejected {
        backend: ADVISORY_BACKEND,
        source: format!(
            "{why}: the advisory-lock mode needs a server session of its own per lock and \
             cannot work through a connection pooler such as PgBouncer (two holders of one \
             lock through a shared session); connect to PostgreSQL directly, or use the \
             table mode (PostgresBackend), which works behind a transaction pooler with \
             pooler=transaction"
        )
        .into(),
    }
}

/// The advisory-lock key of a name (an SQL `bytea` expression), computed by the server:
/// the first 64 bits of `md5(name)` as a signed `bigint`.
macro_rules! key_of {
    ($name:literal) => {
        concat!("('x' || left(md5(", $name, "), 16))::bit(64)::bigint")
    };
}

/// Matches a granted session-level advisory lock (`pg_advisory_lock(bigint)` form,
/// `objsubid = 1`) of this database in `pg_locks` alias `l` against a key expression.
///
/// This database's OID is read from the statistics of this session's own backend, not
/// from `pg_database`: that is a shared catalog, whose lock (unlike a database's own
/// catalogs', which take a backend's fast-path slots) needs an entry in the server's lock
/// table, the table advisory locks fill. Looked up there, every renewal failed with "out
/// of shared memory" once many leases on shared sessions had filled it
/// (`advisory_shared_lock_table_full_refuses_and_loses_nothing`).
macro_rules! granted_lock_matches {
    ($key:expr) => {
        concat!(
            "l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
             AND l.database = (SELECT pg_stat_get_backend_dbid(s) \
             FROM pg_stat_get_backend_idset() s \
             WHERE pg_stat_get_backend_pid(s) = pg_backend_pid()) \
             AND ((l.classid::bigint << 32) | l.objid::bigint) = ",
            $key
        )
    };
}

const TRY_LOCK: &str = concat!(
    "SELECT pg_try_advisory_lock(",
    key_of!("$1::bytea"),
    "), pg_backend_pid()"
);

const UNLOCK: &str = concat!("SELECT pg_advisory_unlock(", key_of!("$1::bytea"), ")");

const RENEW: &str = concat!(
    "SELECT b.i FROM unnest($1::bytea[], $2::int4[]) WITH ORDINALITY AS b(name, pid, i) ",
    "WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = b.pid AND ",
    granted_lock_matches!(key_of!("b.name")),
    ")"
);

const INSPECT: &str = concat!(
    "SELECT l.pid FROM pg_locks l WHERE ",
    granted_lock_matches!(key_of!("$1::bytea")),
    " LIMIT 1"
);

const TERMINATE_HOLDER: &str = concat!(
    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE ",
    granted_lock_matches!(key_of!("$1::bytea"))
);

/// Leases as Postgres **session advisory locks**: `pg_try_advisory_lock(key)` on a
/// connection dedicated to that one lease, held until released or until the session
/// ends. This is the session advisory-lock design, kept to compare against the table mode
/// ([`PostgresBackend`](crate::PostgresBackend)); prefer the table mode.
///
/// What it is, and what it cannot do:
///
/// - **No TTL** ([`Capabilities::expires`] is `false`). A holder that is alive but stuck
///   holds the lock forever; it is freed only by `release`, by the holder's process or
///   connection dying, or by an operator (`SELECT pg_terminate_backend(pid)`). The
///   requested TTL is ignored; `renew` reports whether the session still holds the lock
///   (one query on `pg_locks` for the whole batch).
/// - **No lead time** ([`Capabilities::lost_before_taken`] is `false`). When the
///   holder's session ends (its connection cut, a server-side timeout, an operator's
///   `pg_terminate_backend`), the lock is free at once, while the holder's guard learns
///   at its next renewal: for up to one renewal period
///   ([`LeaseOptions::renew_every`](lease_core::LeaseOptions::renew_every)) two
///   processes believe they hold the lease, and without fencing tokens nothing tells
///   them apart (`tests/advisory_lead_time.rs` measures it: taken 5 ms after the
///   session ended, the guard told 2 s later with renewals every 2 s). The table mode
///   keeps a lease until its TTL, so its guard hears "lost" first. The conformance
///   suite reports its lead-time checks as not applicable here.
/// - **One connection per held lease.** Each held lease keeps its own connection, taken
///   out of the pool, so the server's `max_connections` bounds how many leases a fleet
///   can hold. After a release (or an attempt that found the lease held) the connection,
///   which then holds no lock, is kept for the next attempt: as many are kept as were in
///   use at once (held, being tried or being released) in the last minute, at least 16,
///   so that a steady load of N concurrent holders reuses N sessions instead of opening
///   new ones; a kept connection unused for a minute is closed at the backend's next
///   attempt or release (or when the backend is dropped).
///   [`set_max_sessions`](Self::set_max_sessions) bounds the sessions in use, as a
///   pool's size bounds `sqlx`'s `PgAdvisoryLock`: attempts beyond it wait for a release.
///   [`set_shared_sessions`](Self::set_shared_sessions) lets leases share a bounded set
///   of sessions instead, each holding the locks of many leases.
/// - **No fencing tokens** ([`Fencing::None`]: always 0), no holder label, no remaining
///   time, no keep-for (a release always frees at once).
/// - **Keys are hashes.** The key of a name is the first 64 bits of `md5(name)` as a
///   signed `bigint` (computed by the server: `('x' || left(md5(name), 16))::bit(64)::bigint`).
///   Two different names collide with a probability of about n²/2⁶⁵ for n names, and
///   names can be crafted to collide; guarantee 10 of the design (distinct names never
///   share a key) therefore holds only probabilistically in this mode. Other software
///   using `pg_advisory_lock(bigint)` in the same database shares the key space.
/// - Advisory locks are per database: clients must connect to the same database.
/// - `force_release` terminates the holder's session (`pg_terminate_backend`), which
///   needs the same role as the holder, `pg_signal_backend` membership or a superuser.
///
/// Dropping the backend closes the dedicated connections, which frees their locks.
/// Without shared sessions, a connection goes back to the kept set only after
/// `pg_advisory_unlock` returned true on it (each connection takes at most one lock at a
/// time).
#[derive(Clone)]
pub struct AdvisoryLockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    request_timeout: Duration,
    held: Mutex<HashMap<(LeaseName, OwnerToken), HeldLock>>,
    /// Dedicated connections that hold no lock, kept for the next attempt: opening a
    /// session costs more than the lock itself.
    idle: Mutex<Vec<Kept>>,
    /// Dedicated connections out of `idle`: holding a lock, being tried or released.
    out: Arc<AtomicUsize>,
    /// The most connections out at once, and when that was last reached: how many idle
    /// ones are worth keeping.
    peak: Mutex<(usize, Instant)>,
    /// At most this many dedicated connections out at once, when limited
    /// ([`AdvisoryLockBackend::set_max_sessions`]): one permit per connection out.
    sessions: Option<Arc<Semaphore>>,
    /// The sessions leases share, when they do
    /// ([`AdvisoryLockBackend::set_shared_sessions`]).
    shared: Option<SharedSessions>,
}

/// Idle dedicated connections kept whatever the recent peak.
const MIN_IDLE_KEPT: usize = 16;
/// Idle dedicated connections kept at most, whatever the recent peak.
const MAX_IDLE_KEPT: usize = 512;
/// Kept connections idle longer than this are closed instead of used (a firewall may
/// have dropped them silently).
const MAX_IDLE_AGE: Duration = Duration::from_secs(60);

impl Inner {
    fn lock_held_is_empty(&self) -> bool {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    fn take_idle(&self) -> Option<Kept> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // Anything idle longer than the limit goes (dropping closes it).
        idle.retain(|kept| kept.since.elapsed() < MAX_IDLE_AGE);
        idle.pop()
    }

    /// Counts a connection out of the idle set until the returned mark drops, and
    /// raises the recent peak. `permit` is the connection's place under the session
    /// limit, if there is one; it is given back with the mark.
    fn check_out(&self, permit: Option<OwnedSemaphorePermit>) -> Checkout {
        let now_out = self.out.fetch_add(1, Ordering::Relaxed) + 1;
        self.note_out(now_out);
        Checkout {
            out: self.out.clone(),
            _permit: permit,
        }
    }

    /// Records `now_out` connections out at once: the peak rises to it, and a peak
    /// older than a minute is replaced by it (leases held for longer than a minute
    /// still count when they come back).
    fn note_out(&self, now_out: usize) {
        let mut peak = self.peak.lock().unwrap_or_else(|p| p.into_inner());
        if now_out >= peak.0 || peak.1.elapsed() > MAX_IDLE_AGE {
            *peak = (now_out, Instant::now());
        }
    }

    /// How many idle connections are worth keeping: the most that were out at once in
    /// the last minute (a steady load needs that many), within the bounds.
    fn idle_wanted(&self) -> usize {
        let peak = *self.peak.lock().unwrap_or_else(|p| p.into_inner());
        let recent = if peak.1.elapsed() <= MAX_IDLE_AGE {
            peak.0
        } else {
            0
        };
        recent.clamp(MIN_IDLE_KEPT, MAX_IDLE_KEPT)
    }

    /// Keeps a connection that holds no lock for the next attempt (or drops it, which
    /// closes it, when enough are kept).
    fn put_idle(&self, conn: PgConnection, pid: i32, checkout: Checkout) {
        // Still out until the mark drops: a lease held since before the last minute
        // counts as in use now.
        self.note_out(self.out.load(Ordering::Relaxed));
        let wanted = self.idle_wanted();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|kept| kept.since.elapsed() < MAX_IDLE_AGE);
        if idle.len() < wanted {
            idle.push(Kept {
                conn,
                pid,
                since: Instant::now(),
            });
        }
        drop(checkout);
    }
}

/// A dedicated connection that holds no lock, kept for the next attempt.
struct Kept {
    conn: PgConnection,
    /// Its session's server process id.
    pid: i32,
    /// Since when it has been kept.
    since: Instant,
}

/// A dedicated connection counted out of the idle set; dropping it counts it back (the
/// connection itself went back to the idle set or was closed) and gives its place
/// under the session limit to the next attempt.
struct Checkout {
    out: Arc<AtomicUsize>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        self.out.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A held lease's lock: on a session of its own, or on a shared one.
enum HeldLock {
    Dedicated(DedicatedLock),
    Shared(SharedLock),
}

impl HeldLock {
    /// The server process id of the session holding the lock.
    fn pid(&self) -> i32 {
        match self {
            HeldLock::Dedicated(d) => d.pid,
            HeldLock::Shared(s) => s.pid(),
        }
    }
}

/// A lock on a connection of its own.
struct DedicatedLock {
    conn: PgConnection,
    pid: i32,
    checkout: Checkout,
}

impl fmt::Debug for AdvisoryLockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvisoryLockBackend")
            .field("held", &self.lock_held().len())
            .field(
                "shared_sessions",
                &self.inner.shared.as_ref().map(SharedSessions::len),
            )
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

impl AdvisoryLockBackend {
    /// Connects with a pool of 10 connections for attempts, renewals and inspection, and
    /// a call timeout of 5 s (pool acquire timeout, `statement_timeout`, client bound).
    ///
    /// It opens two sessions: one the pool keeps (renewals, inspection) and one kept for
    /// the first lock, so neither the first acquire nor the first renewal opens a session
    /// within its own call timeout.
    ///
    /// Errors as for [`PostgresBackend::connect`](crate::PostgresBackend::connect).
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, Duration::from_secs(5), 10).await
    }

    /// Connects with the given call timeout and pool size; opens two sessions, as
    /// [`connect`](Self::connect).
    ///
    /// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
    /// must clean up.
    pub async fn connect_with(
        url: &str,
        request_timeout: Duration,
        max_connections: u32,
    ) -> Result<Self> {
        if request_timeout.is_zero() || max_connections == 0 {
            return Err(InvalidInput::Other(
                "postgres request_timeout and max_connections must be greater than zero".into(),
            )
            .into());
        }
        let (url, own) = split_own_params(url)?;
        if own.pooler {
            return Err(behind_a_pooler("the URL says pooler=transaction"));
        }
        let options = connect_options(
            &url,
            request_timeout,
            false,
            &lease_core::TlsFiles::default(),
        )?;
        let dedicated = options.clone();
        let pool = pool_options(max_connections, request_timeout).connect_lazy_with(options);
        // The first contact. A pooler that refuses the startup parameters fails here (see
        // `error::convert`); one that ignores them is caught by the setting it dropped.
        // The session stays in the pool, for renewals and inspection.
        crate::tls::ensure_crypto_provider_for(&pool);
        let mut pooled = bounded_call(
            ADVISORY_BACKEND,
            "connect",
            request_timeout,
            Box::pin(pool.acquire()),
        )
        .await?;
        let settings = session_settings(ADVISORY_BACKEND, &mut *pooled, request_timeout).await?;
        let expected = millis_ceil(request_timeout);
        if settings.statement_timeout_ms != Some(expected) {
            return Err(behind_a_pooler(&format!(
                "the server runs with statement_timeout = {:?} ms although {expected} ms was \
                 sent at connect, so a connection pooler dropped the startup parameters",
                settings.statement_timeout_ms
            )));
        }
        // A second session, kept for the first lock, so that the first acquire does not
        // open one within its call timeout (a new session is a new server process, which
        // on a loaded machine takes longer than a short call timeout). Opened outside the
        // pool, as a lock's session is detached from it anyway: the pool keeps the first
        // one, even a pool of one connection.
        let (first_lock, pid) = bounded_call(
            ADVISORY_BACKEND,
            "connect",
            request_timeout,
            Box::pin(async {
                let mut conn = dedicated.connect().await?;
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut conn)
                    .await?;
                Ok((conn, pid))
            }),
        )
        .await?;
        drop(pooled);
        // sqlx gives a dropped pooled session back in a task of its own, after a round
        // trip (a ping); a renewal made before it is back would open another session
        // within its call timeout, which is what the second session above avoids for
        // the first acquire. Wait for it, within the call timeout.
        back_in_pool(&pool, request_timeout).await;
        let backend = Self::from_pool(pool, request_timeout);
        backend
            .inner
            .put_idle(first_lock, pid, backend.inner.check_out(None));
        Ok(backend)
    }

    /// Uses an existing pool; every call is bounded by `request_timeout` on the client.
    /// Connections of held leases are detached from the pool.
    pub fn from_pool(pool: PgPool, request_timeout: Duration) -> Self {
        crate::tls::ensure_crypto_provider_for(&pool);
        AdvisoryLockBackend {
            inner: Arc::new(Inner {
                pool,
                request_timeout,
                held: Mutex::new(HashMap::new()),
                idle: Mutex::new(Vec::new()),
                out: Arc::new(AtomicUsize::new(0)),
                peak: Mutex::new((0, Instant::now())),
                sessions: None,
                shared: None,
            }),
        }
    }

    /// Uses at most `max` server sessions for leases at once (held, being tried or being
    /// released), as a pool of `max` connections bounds `sqlx`'s `PgAdvisoryLock`. The
    /// default is no limit: every held lease keeps a session, up to the server's
    /// `max_connections`.
    ///
    /// With a limit, an attempt beyond `max` sessions in use waits, in arrival order, for
    /// one to be released, within its call timeout; when none is, it fails with
    /// [`Error::Timeout`] (a retry may help once a lease is released) and takes nothing.
    /// Fewer server processes make each cycle cheaper for the server when many callers
    /// run at once (docs/benchmark-notes.md, PostgreSQL), at the price of leases waiting
    /// for sessions rather than for each other.
    ///
    /// Set it on a new backend, before it is cloned: it fails with
    /// [`InvalidInput::Other`], changing nothing, when `max` is zero or when the backend
    /// has clones (they would not share the limit).
    ///
    /// ```no_run
    /// # async fn f() -> lease_core::Result<()> {
    /// let mut backend = lease_postgres::AdvisoryLockBackend::connect("postgres://db/app").await?;
    /// backend.set_max_sessions(10)?;
    /// # Ok(()) }
    /// ```
    pub fn set_max_sessions(&mut self, max: usize) -> Result<()> {
        if max == 0 || max > Semaphore::MAX_PERMITS {
            return Err(InvalidInput::Other(format!(
                "advisory max_sessions must be between 1 and {}, not {max}",
                Semaphore::MAX_PERMITS
            ))
            .into());
        }
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(InvalidInput::Other(
                "AdvisoryLockBackend::set_max_sessions must be called before the backend is \
                 cloned"
                    .into(),
            )
            .into());
        };
        if inner.shared.is_some() {
            return Err(InvalidInput::Other(
                "AdvisoryLockBackend::set_max_sessions cannot follow set_shared_sessions".into(),
            )
            .into());
        }
        inner.sessions = Some(Arc::new(Semaphore::new(max)));
        Ok(())
    }

    /// Lets leases share at most `max` server sessions: each session holds the locks of
    /// any number of leases, so the number of leases held at once is not bounded by the
    /// sessions (as it is with [`set_max_sessions`](Self::set_max_sessions) and with
    /// `sqlx`'s `PgAdvisoryLock` on a pool), and an attempt or a release waits only for
    /// its session's current statement. New sessions open while every open one is busy,
    /// up to `max`; a session with no lock on it that was not used for a minute is
    /// closed at the next attempt.
    ///
    /// What sharing changes, against a session per lease:
    /// - **A session lost loses every lease on it.** Its connection cut, a server-side
    ///   timeout or an operator's `pg_terminate_backend` (which is what
    ///   [`force_release`](LeaseBackend::force_release) does to the holder's session)
    ///   frees the locks of every lease held there, here or in another process that
    ///   shares the same backend; each is told at its next renewal. A statement that fails
    ///   on the connection (not one the server refused) closes its session for the same
    ///   reason: its state is unknown.
    /// - **A caller giving up never cuts a connection** other leases' locks live on: a
    ///   statement given up mid-flight is followed, on its session, by an unlock of its
    ///   name in a task of the backend's, so a lock taken for nobody is released there.
    /// - **Advisory locks share the server's lock table**
    ///   (about `max_locks_per_transaction` × (`max_connections` +
    ///   `max_prepared_transactions` + the server's own processes) entries), which many
    ///   leases on few sessions can fill: an attempt then fails with a retryable error
    ///   keeping the server's "out of shared memory", and the session stays in use. The leases held still renew on an open session of the pool (their
    ///   renewal needs no entry), but a new session fails at its start meanwhile, so a
    ///   call that needs one (the pool's sessions busy, one still being given back, or
    ///   closed by the pool's idle timeout or lifetime) fails the same way until there
    ///   is room.
    /// - Two names whose keys collide (see the type's docs) are one lock, as with a
    ///   session per lease: while one is held or tried on a shared session, an attempt at
    ///   the other is tried on another session (which the server refuses) or, with every
    ///   session taken, refused here. (Granting both on one session, as advisory locks
    ///   are re-entrant, would let an unlock meant for one free the other's.)
    ///
    /// Set it on a new backend, before it is cloned: it fails with
    /// [`InvalidInput::Other`], changing nothing, when `max` is zero, when the backend has
    /// clones or when [`set_max_sessions`](Self::set_max_sessions) was called (the two
    /// bound sessions in different ways).
    ///
    /// ```no_run
    /// # async fn f() -> lease_core::Result<()> {
    /// let mut backend = lease_postgres::AdvisoryLockBackend::connect("postgres://db/app").await?;
    /// backend.set_shared_sessions(10)?;
    /// # Ok(()) }
    /// ```
    pub fn set_shared_sessions(&mut self, max: usize) -> Result<()> {
        if max == 0 {
            return Err(InvalidInput::Other(
                "advisory shared sessions must be at least 1, not 0".into(),
            )
            .into());
        }
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(InvalidInput::Other(
                "AdvisoryLockBackend::set_shared_sessions must be called before the backend \
                 is cloned"
                    .into(),
            )
            .into());
        };
        if inner.sessions.is_some() || inner.shared.is_some() {
            return Err(InvalidInput::Other(
                "AdvisoryLockBackend::set_shared_sessions cannot follow set_max_sessions or \
                 another set_shared_sessions"
                    .into(),
            )
            .into());
        }
        if !inner.lock_held_is_empty() {
            return Err(InvalidInput::Other(
                "AdvisoryLockBackend::set_shared_sessions must be called before any lease is \
                 held"
                    .into(),
            )
            .into());
        }
        let shared = SharedSessions::new(max, inner.pool.clone(), inner.request_timeout);
        // The sessions kept for the next attempt become the first shared ones.
        let kept = std::mem::take(&mut *inner.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for Kept { conn, pid, .. } in kept {
            shared.add_open(conn, pid);
        }
        inner.shared = Some(shared);
        Ok(())
    }

    /// The server process id of the session holding `name` for `token`, if this backend
    /// holds it (for operators and tests: `SELECT pg_terminate_backend(pid)`).
    pub fn holder_pid(&self, name: &LeaseName, token: &OwnerToken) -> Option<i32> {
        self.lock_held()
            .get(&(name.clone(), *token))
            .map(HeldLock::pid)
    }

    fn lock_held(&self) -> MutexGuard<'_, HashMap<(LeaseName, OwnerToken), HeldLock>> {
        // Every mutation is a single insert or remove: the map stays consistent even if
        // a panic poisoned the mutex.
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`bounded_call`] with this backend's call timeout (not an `async fn`, for the
    /// reason given there).
    fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> impl Future<Output = Result<T>> {
        bounded_call(ADVISORY_BACKEND, operation, self.inner.request_timeout, fut)
    }
}

/// Tries the lock on a dedicated connection: a kept idle one, else one detached from the
/// pool (a pooled connection must never go back to the pool holding a lock). The future
/// owns the connection: a caller that gives up (timeout, drop) at any point drops it,
/// which ends its session and frees whatever lock it took; there is no await between
/// the lock's reply and the caller recording the held lock.
async fn try_lock(
    inner: &Inner,
    name: &LeaseName,
) -> std::result::Result<Option<DedicatedLock>, sqlx::Error> {
    // A place under the session limit first (in arrival order); the caller's call
    // timeout bounds the wait.
    let permit = match &inner.sessions {
        Some(sessions) => Some(match sessions.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                tracing::debug!(
                    lease = %name,
                    "every session of the limit is in use; waiting for a release"
                );
                sessions
                    .clone()
                    .acquire_owned()
                    .await
                    // Never closed: the backend holds the semaphore for its whole life.
                    .map_err(|_| sqlx::Error::PoolClosed)?
            }
        }),
        None => None,
    };
    let checkout = inner.check_out(permit);
    // The session of a kept connection given up on: its attempt may have taken the lock.
    let mut abandoned = None;
    if let Some(Kept { mut conn, pid, .. }) = inner.take_idle() {
        // A kept connection gets half the call's time: one that a firewall dropped
        // silently must not use it all up.
        match tokio::time::timeout(inner.request_timeout / 2, lock_on(&mut conn, name)).await {
            Ok(Ok((true, pid))) => {
                return Ok(Some(DedicatedLock {
                    conn,
                    pid,
                    checkout,
                }));
            }
            Ok(Ok((false, pid))) => {
                inner.put_idle(conn, pid, checkout);
                return Ok(None);
            }
            // A kept connection that died (server restarted, idle timeout) or lost the
            // reply: drop it and try on a fresh one.
            Ok(Err(error)) => {
                tracing::debug!(%error, "idle advisory connection failed; using a fresh one");
            }
            Err(_) => tracing::debug!("idle advisory connection did not answer; using a fresh one"),
        }
        abandoned = Some(pid);
    }
    // Boxed: sqlx's pool future is the largest part of this one (see `acquire`).
    let mut conn = Box::pin(inner.pool.acquire()).await?.detach();
    let mut terminated = false;
    loop {
        let (taken, pid) = lock_on(&mut conn, name).await?;
        if taken {
            return Ok(Some(DedicatedLock {
                conn,
                pid,
                checkout,
            }));
        }
        // Held. By the session just given up on, if its attempt took the lock before
        // its reply was lost: then the lock is this attempt's own, not another holder's.
        // That session ends when the server sees its connection closed (at once, unless
        // the network dropped the close); it is ended here, and the lock taken again
        // once it has gone, within the caller's call timeout.
        let Some(stale) = abandoned else {
            inner.put_idle(conn, pid, checkout);
            return Ok(None);
        };
        let holder: Option<i32> = sqlx::query_scalar(INSPECT)
            .bind(name.as_bytes())
            .fetch_optional(&mut conn)
            .await?;
        match holder {
            Some(holder) if holder == stale => {
                if !terminated {
                    tracing::debug!(
                        lease = %name,
                        pid = stale,
                        "the lock is held by this backend's abandoned session; ending it"
                    );
                    // Should the server refuse, it still ends that session on its own
                    // once it sees the connection closed.
                    if let Err(error) = sqlx::query("SELECT pg_terminate_backend($1)")
                        .bind(stale)
                        .execute(&mut conn)
                        .await
                    {
                        tracing::debug!(%error, "could not end the abandoned session");
                    }
                    terminated = true;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Freed meanwhile: try again.
            None => {}
            Some(_) => {
                inner.put_idle(conn, pid, checkout);
                return Ok(None);
            }
        }
    }
}

/// The key the statements above lock for `name`, computed as the server does
/// (`key_of!`: the first 64 bits of `md5(name)` as a signed `bigint`, which reads them
/// big-endian). Shared sessions reserve keys on a session, not names: two names whose
/// keys collide are then never tried on one session (see `shared`).
fn advisory_key(name: &LeaseName) -> i64 {
    use md5::Digest;
    let digest = md5::Md5::digest(name.as_bytes());
    let mut first = [0u8; 8];
    for (to, from) in first.iter_mut().zip(digest.iter()) {
        *to = *from;
    }
    i64::from_be_bytes(first)
}

/// `pg_try_advisory_lock` on `conn`: whether it was taken, and the session's pid.
async fn lock_on(
    conn: &mut PgConnection,
    name: &LeaseName,
) -> std::result::Result<(bool, i32), sqlx::Error> {
    sqlx::query_as(TRY_LOCK)
        .bind(name.as_bytes())
        .fetch_one(conn)
        .await
}

#[async_trait::async_trait]
impl LeaseBackend for AdvisoryLockBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(ADVISORY_BACKEND)
            .with_fencing(Fencing::None)
            .with_expires(false)
            .with_lost_before_taken(false)
            .with_holder_info(false)
            .with_keep_for(false)
            .with_max_renew_batch(MAX_RENEW_BATCH)
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        if ttl.is_zero() {
            return Err(InvalidInput::TtlZero.into());
        }
        // Boxed: the attempt's future holds sqlx's pool and query futures, kilobytes
        // that every move (into the timeout, into this call's own future) would
        // otherwise copy.
        let joined = match &self.inner.shared {
            Some(shared) => self
                .bounded("acquire", Box::pin(shared.try_lock(name)))
                .await?
                .map(|taken| HeldLock::Shared(taken.disarm())),
            None => self
                .bounded("acquire", Box::pin(try_lock(&self.inner, name)))
                .await?
                .map(HeldLock::Dedicated),
        };
        match joined {
            Some(held) => {
                tracing::debug!(lease = %name, pid = held.pid(), "advisory lock taken");
                self.lock_held().insert((name.clone(), owner.token), held);
                Ok(AcquireOutcome::Acquired {
                    fencing: FencingToken(0),
                    ttl,
                })
            }
            None => {
                tracing::debug!(lease = %name, "advisory lock held elsewhere");
                Ok(AcquireOutcome::Held(HeldBy::default()))
            }
        }
    }

    async fn renew(&self, leases: &[RenewItem], _ttl: Duration) -> Result<Vec<RenewOutcome>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > MAX_RENEW_BATCH {
            return Err(InvalidInput::BatchTooLarge {
                len: leases.len(),
                max: MAX_RENEW_BATCH,
            }
            .into());
        }
        // Only leases this backend holds can be ours; ask the server about those.
        let pids: Vec<Option<i32>> = {
            let held = self.lock_held();
            leases
                .iter()
                .map(|item| {
                    held.get(&(item.name.clone(), item.token))
                        .map(HeldLock::pid)
                })
                .collect()
        };
        let mut names: Vec<&[u8]> = Vec::new();
        let mut sent_pids: Vec<i32> = Vec::new();
        let mut index: Vec<usize> = Vec::new();
        for (i, (item, pid)) in leases.iter().zip(&pids).enumerate() {
            if let Some(pid) = pid {
                names.push(item.name.as_bytes());
                sent_pids.push(*pid);
                index.push(i);
            }
        }
        let mut outcomes = vec![RenewOutcome::Lost; leases.len()];
        if names.is_empty() {
            return Ok(outcomes);
        }
        let alive: Vec<i64> = self
            .bounded(
                "renew",
                sqlx::query_scalar(RENEW)
                    .bind(&names)
                    .bind(&sent_pids)
                    .fetch_all(&self.inner.pool),
            )
            .await?;
        for ordinal in alive {
            let slot = usize::try_from(ordinal - 1)
                .ok()
                .and_then(|s| index.get(s))
                .ok_or_else(|| {
                    Error::unexpected(
                        ADVISORY_BACKEND,
                        format!("renew returned ordinal {ordinal}"),
                    )
                })?;
            outcomes[*slot] = RenewOutcome::Renewed;
        }
        Ok(outcomes)
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        _keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let Some(held) = self.lock_held().remove(&(name.clone(), *token)) else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        let mut held = match held {
            HeldLock::Dedicated(held) => held,
            HeldLock::Shared(lock) => {
                let unlocked = self
                    .bounded(
                        "release",
                        shared::release(lock, name, self.inner.request_timeout),
                    )
                    .await;
                return match unlocked {
                    Ok(true) => {
                        tracing::debug!(lease = %name, "advisory lock released");
                        Ok(ReleaseOutcome::Released)
                    }
                    // The session no longer held it: it was closed or terminated.
                    Ok(false) | Err(Error::Unavailable { .. }) => Ok(ReleaseOutcome::NotOwner),
                    Err(e) => Err(e),
                };
            }
        };
        let unlocked = self
            .bounded(
                "release",
                sqlx::query_scalar::<_, bool>(UNLOCK)
                    .bind(name.as_bytes())
                    .fetch_one(&mut held.conn),
            )
            .await;
        // Unlocked: the session holds nothing, keep it for the next attempt. Otherwise
        // close it: ending the session frees the lock (the server notices the closed
        // connection).
        let DedicatedLock {
            conn,
            pid,
            checkout,
        } = held;
        if matches!(unlocked, Ok(true)) {
            self.inner.put_idle(conn, pid, checkout);
        } else {
            let _ = tokio::time::timeout(self.inner.request_timeout, conn.close()).await;
            drop(checkout);
        }
        match unlocked {
            Ok(true) => {
                tracing::debug!(lease = %name, "advisory lock released");
                Ok(ReleaseOutcome::Released)
            }
            // The session no longer held it (it was terminated meanwhile).
            Ok(false) => Ok(ReleaseOutcome::NotOwner),
            // The connection is dead, so the session and its lock are gone (or going):
            // we did not hold it any more.
            Err(Error::Unavailable { .. }) => Ok(ReleaseOutcome::NotOwner),
            Err(e) => Err(e),
        }
    }

    /// Terminates the session holding the lock (there is no other way to take a session
    /// lock away) and waits until the server has let go of it.
    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let terminated: Vec<bool> = self
            .bounded(
                "force release",
                sqlx::query_scalar(TERMINATE_HOLDER)
                    .bind(name.as_bytes())
                    .fetch_all(&self.inner.pool),
            )
            .await?;
        if !terminated.contains(&true) {
            return Ok(false);
        }
        tracing::info!(lease = %name, "force release: holder's session terminated");
        // Termination is asynchronous: the lock goes when the session has ended.
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        while self.inspect(name).await?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    operation: "force release",
                    after: self.inner.request_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(true)
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let pid: Option<i32> = self
            .bounded(
                "inspect",
                sqlx::query_scalar(INSPECT)
                    .bind(name.as_bytes())
                    .fetch_optional(&self.inner.pool),
            )
            .await?;
        Ok(pid.map(|_| LeaseInfo {
            holder: None,
            fencing: None,
            remaining: None,
        }))
    }
}

/// Waits until every session of `pool` is idle in it, or `limit` has passed: a session
/// being given back (sqlx pings it first, in a task) counts in the pool's size but not as
/// idle until it is back; one whose ping failed is closed and leaves the size. sqlx sends
/// no event for either, so this looks every millisecond; it runs once, at connect.
async fn back_in_pool(pool: &PgPool, limit: Duration) {
    let deadline = Instant::now() + limit;
    while pool.num_idle() < pool.size() as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements() {
        assert_eq!(
            TRY_LOCK,
            "SELECT pg_try_advisory_lock(('x' || left(md5($1::bytea), 16))::bit(64)::bigint), \
             pg_backend_pid()"
        );
        assert!(RENEW.contains("= ('x' || left(md5(b.name), 16))::bit(64)::bigint)"));
        assert!(INSPECT.ends_with("= ('x' || left(md5($1::bytea), 16))::bit(64)::bigint LIMIT 1"));
    }

    /// The key computed here is the one `key_of!` has the server compute: md5("abc") is
    /// 900150983cd24fb0d6963f7d28e17f72, whose first 16 hex digits read as a signed
    /// 64-bit integer (PostgreSQL's `bit(64)::bigint`) are 0x900150983cd24fb0 - 2^64.
    #[test]
    fn advisory_key_is_the_servers() {
        let abc = LeaseName::new("abc").unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(advisory_key(&abc), 0x9001_5098_3cd2_4fb0_u64 as i64);
        assert!(advisory_key(&abc) < 0);
        let other = LeaseName::new("abd").unwrap_or_else(|e| unreachable!("{e}"));
        assert_ne!(advisory_key(&abc), advisory_key(&other));
    }
}
