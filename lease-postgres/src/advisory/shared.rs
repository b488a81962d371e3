//! Shared sessions for the advisory-lock mode
//! ([`AdvisoryLockBackend::set_shared_sessions`](super::AdvisoryLockBackend::set_shared_sessions)):
//! the locks of many leases on a few server sessions.
//!
//! A session advisory lock belongs to the session that took it, and one session may hold
//! the locks of any number of keys. So a bounded set of sessions can hold any number of
//! leases: each lease's lock sits on one of them, and an attempt or a release waits only
//! for the session's current statement, never for another lease's release.
//!
//! Rules that keep each lease's lock its own:
//! - A key is never tried on a session that holds it or is trying it (advisory locks are
//!   re-entrant within a session: a second owner would be told it took the lease). Keys,
//!   not names: two names whose keys collide are one lock to the server, and on one
//!   session the second would be granted, and an unlock meant for one (a cleanup after
//!   a caller gave up) would free the other's. On two sessions the second is refused.
//! - A statement runs in its caller's future, which owns the session's connection for
//!   the statement's length. A caller that gives up (its call timeout, a drop) never
//!   drops the connection, which would end every other lease's lock on it: its
//!   [`Flight`] guard has a task of its own unlock the name on the session (sqlx's
//!   connection first reads the reply of the statement given up), and only then gives
//!   the name back.
//! - A session whose statement failed on the connection (I/O, protocol, the cleanup's
//!   bound) is closed and never used again: its state is unknown, and closing it ends
//!   its session, which frees every lock on it. The leases held there are told at their
//!   next renewal (`renew` asks the server whether the session still holds each lock).
//!   A statement the server answered with an error (a `Database` error) leaves the
//!   session in use. After an attempt's error the key is unlocked there all the same:
//!   the error may have come after the lock was taken (a cancel or `statement_timeout`
//!   is noticed after the function ran), or be an earlier given-up statement's, which
//!   sqlx reports to the next statement on the connection. An unlock that meets an error
//!   is sent once more before the session is closed, for the same reason.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_core::LeaseName;
use sqlx::postgres::{PgConnection, PgPool};
use tokio::sync::OwnedMutexGuard;

use super::{UNLOCK, advisory_key, lock_on};
use crate::connection::client_bound;

/// Sessions with no lock on them that were not used for this long are closed (a
/// firewall may have dropped them silently), at the next attempt's pick.
const MAX_IDLE_AGE: Duration = Duration::from_secs(60);

/// How often an attempt picks another session when the one it was given ended before
/// its turn (failed to open, or closed after a failed statement).
const PICKS: usize = 3;

/// The shared sessions of one backend.
pub(super) struct SharedSessions {
    max: usize,
    pool: PgPool,
    request_timeout: Duration,
    sessions: Mutex<Vec<Arc<Session>>>,
}

/// One server session that holds the locks of any number of leases.
pub(super) struct Session {
    /// The connection, owned by whichever caller (or cleanup task) runs a statement on
    /// it. `None` before the
    /// session is opened (its opener holds the guard meanwhile) and after it was closed.
    conn: Arc<tokio::sync::Mutex<Option<PgConnection>>>,
    /// Its server process id (0 until it is opened).
    pid: AtomicI32,
    /// Keys whose lock this session holds or is trying (see the module's docs).
    keys: Mutex<HashSet<i64>>,
    /// Statements waiting for the connection or running on it.
    queued: AtomicUsize,
    /// Closed: never used again.
    closed: AtomicBool,
    /// When a statement last ended on it.
    last_used: Mutex<Instant>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every mutation is a single insert, remove or assignment: the data stays
    // consistent even if a panic poisoned the mutex.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    fn new(conn: Option<PgConnection>, pid: i32) -> Arc<Self> {
        Arc::new(Session {
            conn: Arc::new(tokio::sync::Mutex::new(conn)),
            pid: AtomicI32::new(pid),
            keys: Mutex::new(HashSet::new()),
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
        })
    }

    /// The session's server process id (0 if it never opened).
    pub(super) fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    fn idle_too_long(&self) -> bool {
        self.queued.load(Ordering::Relaxed) == 0
            && locked(&self.keys).is_empty()
            && locked(&self.last_used).elapsed() > MAX_IDLE_AGE
    }

    /// Closes the session: its connection is dropped, which ends it on the server and
    /// frees every lock on it.
    fn close(&self, conn: &mut Option<PgConnection>) {
        self.closed.store(true, Ordering::Relaxed);
        *conn = None;
    }

    /// A statement on this session ended (whatever its result).
    fn done(&self, key: i64) {
        locked(&self.keys).remove(&key);
        *locked(&self.last_used) = Instant::now();
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What an attempt's pick found.
enum Pick {
    /// A session to run the attempt on (the name's key reserved, counted as queued).
    Use(Arc<Session>),
    /// A new session, not yet open; the guard is its connection's, held by the opener.
    Open(Arc<Session>, OwnedMutexGuard<Option<PgConnection>>),
    /// Every session already holds or tries the name's key, and no new one may be opened.
    HeldHere,
}

/// A name's key reserved on a session by an attempt or a release that has not finished: a
/// drop guard. Dropped without [`disarm`](Self::disarm) (its caller gave up, the attempt
/// took a lock that nobody received, or the server answered it with an error), it frees
/// the key on its session: when a statement may have taken the lock (or a release had
/// not ended), a task of its own unlocks it there (`pg_advisory_unlock` of a key the
/// session does not hold only returns false; no other name's lock can be on that key
/// there, as the key is reserved); before that, it gives the key back.
pub(super) struct Flight {
    session: Option<Arc<Session>>,
    name: LeaseName,
    /// The name's advisory key, reserved on the session.
    key: i64,
    request_timeout: Duration,
    /// The statement was sent, or this is a release: the lock may be on the session.
    unlock: bool,
    /// Counted in the session's `queued` (until its statement ended).
    counted: bool,
    /// The session was being opened by this flight: it is closed instead.
    opening: bool,
}

impl Flight {
    fn new(session: Arc<Session>, name: &LeaseName, key: i64, request_timeout: Duration) -> Self {
        Flight {
            session: Some(session),
            name: name.clone(),
            key,
            request_timeout,
            unlock: false,
            counted: true,
            opening: false,
        }
    }

    /// Keeps the lock: the caller records it as held.
    pub(super) fn disarm(mut self) -> SharedLock {
        let session = self.session.take();
        SharedLock {
            session: session.unwrap_or_else(|| Session::new(None, 0)),
            key: self.key,
        }
    }

    /// The statement ended: the name is given back (refused, failed) and nothing is left
    /// to do on drop.
    fn finish(mut self) {
        if let Some(session) = self.session.take() {
            session.done(self.key);
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if self.opening {
            // Never opened: nobody can use it (its attempts pick again).
            session.closed.store(true, Ordering::Relaxed);
            session.done(self.key);
            return;
        }
        if !self.unlock {
            session.done(self.key);
            return;
        }
        tracing::debug!(
            lease = %self.name,
            pid = session.pid(),
            "advisory statement given up on a shared session; unlocking its name there"
        );
        if !self.counted {
            // A lock taken for nobody: its unlock is a statement of its own.
            session.queued.fetch_add(1, Ordering::Relaxed);
        }
        let (name, key) = (self.name.clone(), self.key);
        let timeout = self.request_timeout;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = unlock_on(&session, &name, key, timeout).await;
                });
            }
            // No runtime to run the unlock on: close the session instead (which ends
            // every lock on it; the leases held there are told at their next renewal).
            Err(_) => {
                if let Ok(mut conn) = session.conn.try_lock() {
                    session.close(&mut conn);
                } else {
                    session.closed.store(true, Ordering::Relaxed);
                }
                session.done(key);
            }
        }
    }
}

/// A held lease's lock on a shared session.
pub(super) struct SharedLock {
    session: Arc<Session>,
    /// The name's advisory key.
    key: i64,
}

impl SharedLock {
    /// The server process id of the session holding the lock.
    pub(super) fn pid(&self) -> i32 {
        self.session.pid()
    }
}

impl SharedSessions {
    pub(super) fn new(max: usize, pool: PgPool, request_timeout: Duration) -> Self {
        SharedSessions {
            max,
            pool,
            request_timeout,
            sessions: Mutex::new(Vec::new()),
        }
    }

    /// Adds an open session that holds no lock.
    pub(super) fn add_open(&self, conn: PgConnection, pid: i32) {
        let mut sessions = locked(&self.sessions);
        if sessions.len() < self.max {
            sessions.push(Session::new(Some(conn), pid));
        }
    }

    /// Sessions open or being opened (for tests and `Debug`).
    pub(super) fn len(&self) -> usize {
        locked(&self.sessions).len()
    }

    fn pick(&self, key: i64) -> Pick {
        let mut sessions = locked(&self.sessions);
        sessions.retain(|s| !s.closed.load(Ordering::Relaxed) && !s.idle_too_long());
        let mut best: Option<(&Arc<Session>, usize)> = None;
        for s in sessions.iter() {
            if locked(&s.keys).contains(&key) {
                continue;
            }
            let queued = s.queued.load(Ordering::Relaxed);
            if best.is_none_or(|(_, q)| queued < q) {
                best = Some((s, queued));
            }
        }
        let full = sessions.len() >= self.max;
        if let Some((s, queued)) = best
            && (queued == 0 || full)
        {
            locked(&s.keys).insert(key);
            s.queued.fetch_add(1, Ordering::Relaxed);
            return Pick::Use(s.clone());
        }
        if full {
            return Pick::HeldHere;
        }
        let session = Session::new(None, 0);
        let Ok(guard) = session.conn.clone().try_lock_owned() else {
            // Unreachable: nobody else knows of the session yet. Use it anyway; its
            // attempt waits for the guard like any other.
            locked(&session.keys).insert(key);
            session.queued.fetch_add(1, Ordering::Relaxed);
            sessions.push(session.clone());
            return Pick::Use(session);
        };
        locked(&session.keys).insert(key);
        session.queued.fetch_add(1, Ordering::Relaxed);
        sessions.push(session.clone());
        Pick::Open(session, guard)
    }

    /// Tries `name`'s lock on a shared session. `Some` when taken: dropping it unlocks
    /// it again ([`Flight`]).
    ///
    /// Cancel safety: cancel-safe. Dropped at any point, it leaves no lock taken for
    /// nobody: once its statement was sent, its drop has the name unlocked on the session
    /// by a task of its own (the connection stays usable: the next statement on it first
    /// reads the reply of the one given up).
    pub(super) async fn try_lock(
        &self,
        name: &LeaseName,
    ) -> std::result::Result<Option<Flight>, sqlx::Error> {
        let key = advisory_key(name);
        for _ in 0..PICKS {
            let (session, opener) = match self.pick(key) {
                Pick::Use(s) => (s, None),
                Pick::Open(s, g) => (s, Some(g)),
                Pick::HeldHere => {
                    tracing::debug!(
                        lease = %name,
                        "every shared session holds or tries this name's key already"
                    );
                    return Ok(None);
                }
            };
            let mut flight = Flight::new(session.clone(), name, key, self.request_timeout);
            let mut guard = match opener {
                Some(guard) => guard,
                None => session.conn.clone().lock_owned().await,
            };
            if guard.is_none() {
                if session.closed.load(Ordering::Relaxed) {
                    // It failed to open, or was closed, before this attempt's turn.
                    drop(guard);
                    flight.finish();
                    continue;
                }
                flight.opening = true;
                // Boxed: sqlx's pool future is large.
                match Box::pin(self.pool.acquire()).await {
                    Ok(conn) => *guard = Some(conn.detach()),
                    Err(error) => {
                        session.close(&mut guard);
                        drop(guard);
                        flight.finish();
                        return Err(error);
                    }
                }
                flight.opening = false;
            }
            let Some(conn) = guard.as_mut() else {
                drop(guard);
                flight.finish();
                continue;
            };
            flight.unlock = true;
            let outcome = lock_on(conn, name).await;
            return match outcome {
                Ok((taken, pid)) => {
                    session.pid.store(pid, Ordering::Relaxed);
                    drop(guard);
                    if taken {
                        // The name stays reserved: the lock is on this session now.
                        *locked(&session.last_used) = Instant::now();
                        session.queued.fetch_sub(1, Ordering::Relaxed);
                        flight.counted = false;
                        Ok(Some(flight))
                    } else {
                        flight.finish();
                        Ok(None)
                    }
                }
                Err(error) => {
                    if !matches!(error, sqlx::Error::Database(_)) || session.pid() == 0 {
                        tracing::debug!(
                            %error,
                            pid = session.pid(),
                            "shared advisory session failed; closing it"
                        );
                        session.close(&mut guard);
                        drop(guard);
                        flight.finish();
                    } else {
                        // The server's error may have come after the lock was taken, or
                        // be an earlier given-up statement's (then this one was not
                        // sent): either way the key may be held for nobody. The flight's
                        // drop unlocks it on the session, in a task; the key stays
                        // reserved until then.
                        tracing::debug!(
                            lease = %name,
                            %error,
                            pid = session.pid(),
                            "advisory attempt failed on a shared session; unlocking its key there"
                        );
                        drop(guard);
                        drop(flight);
                    }
                    Err(error)
                }
            };
        }
        Err(sqlx::Error::PoolTimedOut)
    }
}

/// `pg_advisory_unlock` of `name` (whose key is `key`) on `session` (whose statement
/// count includes this one). `Ok(false)`: the session did not hold it (it was closed
/// meanwhile, or, for a cleanup, the attempt had not taken it).
///
/// A server error is answered by one more unlock: the error may be an earlier given-up
/// statement's, which sqlx reports to the next statement on the connection (this one
/// was then not sent), or this statement's own (a statement timeout under load), which
/// may leave the lock held. The key is never held more than once on a session (it is
/// reserved there), so after the second unlock's answer the session does not hold it;
/// `Ok(true)` then, since the first may have freed it. A second error, a timeout or a
/// failed connection closes the session instead, which frees the lock (and every other
/// lock on it; those leases are told at their next renewal).
///
/// Dropped before its end it gives nothing back; [`release`]'s flight then runs it again
/// in a task.
async fn unlock_on(
    session: &Arc<Session>,
    name: &LeaseName,
    key: i64,
    request_timeout: Duration,
) -> std::result::Result<bool, sqlx::Error> {
    let mut guard = session.conn.clone().lock_owned().await;
    let mut retried = false;
    let result = loop {
        let Some(conn) = guard.as_mut() else {
            break Ok(false);
        };
        let run = sqlx::query_scalar::<_, bool>(UNLOCK)
            .bind(name.as_bytes())
            .fetch_one(conn);
        match tokio::time::timeout(client_bound(request_timeout), run).await {
            Ok(Ok(unlocked)) => break Ok(unlocked || retried),
            Ok(Err(error @ sqlx::Error::Database(_))) if !retried => {
                tracing::debug!(
                    lease = %name,
                    %error,
                    pid = session.pid(),
                    "advisory unlock failed on a shared session; sending it once more"
                );
                retried = true;
            }
            Ok(Err(error)) => {
                session.close(&mut guard);
                break Err(error);
            }
            Err(_) => {
                session.close(&mut guard);
                break Err(sqlx::Error::PoolTimedOut);
            }
        }
    };
    drop(guard);
    session.done(key);
    result
}

/// Releases a held lease's lock on its shared session. `Ok(false)`: the session no longer
/// held it (it was closed or terminated).
///
/// Cancel safety: cancel-safe. Dropped at any point, the release still happens, in a task
/// of its own ([`Flight`]).
pub(super) async fn release(
    lock: SharedLock,
    name: &LeaseName,
    request_timeout: Duration,
) -> std::result::Result<bool, sqlx::Error> {
    let SharedLock { session, key } = lock;
    session.queued.fetch_add(1, Ordering::Relaxed);
    let mut flight = Flight::new(session.clone(), name, key, request_timeout);
    flight.unlock = true;
    let result = unlock_on(&session, name, key, request_timeout).await;
    // Ended, whatever the result: `unlock_on` gave the key back.
    flight.session = None;
    result
}
