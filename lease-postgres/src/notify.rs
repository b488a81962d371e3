//! Release notifications: one `LISTEN` connection per backend, started on the first
//! `wait_released`, fanning the `pg_notify` payloads out to the waiters.
//!
//! Notifications are a latency optimisation only. A waiter never relies on one arriving:
//! it is bounded by its `max_wait` (which the client caps at the holder's expiry), it
//! returns early whenever the listener is (re)connecting, and returning early is always
//! allowed (the caller simply tries `acquire` again).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::CancellationToken;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::sql::RELEASE_CHANNEL;

/// How long after the listener became ready a waiter still double-checks the lease
/// state itself (a release just before `LISTEN` took effect sends nothing to us).
const FRESH_LISTENER: Duration = Duration::from_secs(5);

/// Pause between reconnection attempts of the listener.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// What the listener tells the waiters.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// This lease name was freed.
    Released(Arc<[u8]>),
    /// The listening connection was lost: notifications may have been missed.
    Reset,
}

/// The state of the listener as seen by a waiter.
pub(crate) enum Listening {
    /// Not listening (yet): the waiter should return soon and let the caller retry.
    NotReady,
    /// Listening; `fresh` when it started listening only a moment ago.
    Ready {
        events: broadcast::Receiver<Event>,
        fresh: bool,
    },
}

struct Running {
    task: JoinHandle<()>,
    ready: watch::Receiver<Option<Instant>>,
    events: broadcast::Sender<Event>,
}

/// The release listener of one backend.
pub(crate) struct Releases {
    /// A separate pool of one connection for `LISTEN`, so the listener never takes a
    /// connection from the pool that serves the lease calls.
    pool: PgPool,
    /// Payload prefix of this table: `<table> `.
    prefix: String,
    running: Mutex<Option<Running>>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Releases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releases")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Releases {
    pub(crate) fn new(main: &PgPool, prefix: String) -> Self {
        let options = main.connect_options().as_ref().clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(main.options().get_acquire_timeout())
            .test_before_acquire(false)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(options);
        Releases {
            pool,
            prefix,
            running: Mutex::new(None),
            shutdown: CancellationToken::new(),
        }
    }

    /// Starts the listener if it is not running (in the current tokio runtime) and says
    /// whether it listens.
    pub(crate) fn listening(&self) -> Listening {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let alive = running.as_ref().is_some_and(|r| !r.task.is_finished());
        if !alive {
            *running = Some(self.spawn());
        }
        let Some(r) = running.as_ref() else {
            return Listening::NotReady;
        };
        let since = *r.ready.borrow();
        match since {
            Some(since) => Listening::Ready {
                events: r.events.subscribe(),
                fresh: since.elapsed() < FRESH_LISTENER,
            },
            None => Listening::NotReady,
        }
    }

    /// Waits until the listener listens, at most `max`.
    pub(crate) async fn wait_ready(&self, max: Duration) {
        let ready = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.as_ref().map(|r| r.ready.clone())
        };
        if let Some(mut ready) = ready {
            let _ = tokio::time::timeout(max, ready.wait_for(Option::is_some)).await;
        }
    }

    fn spawn(&self) -> Running {
        let (ready_tx, ready) = watch::channel(None);
        let (events, _) = broadcast::channel(1024);
        let task = tokio::spawn(listen(
            self.pool.clone(),
            self.prefix.clone(),
            events.clone(),
            ready_tx,
            self.shutdown.clone(),
        ));
        Running {
            task,
            ready,
            events,
        }
    }
}

impl Drop for Releases {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn listen(
    pool: PgPool,
    prefix: String,
    events: broadcast::Sender<Event>,
    ready: watch::Sender<Option<Instant>>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            l = connect(&pool) => l,
        };
        let mut listener = match connected {
            Ok(l) => l,
            Err(error) => {
                tracing::debug!(%error, "release listener could not connect; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(RECONNECT_PAUSE) => continue,
                }
            }
        };
        ready.send_replace(Some(Instant::now()));
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = listener.try_recv() => n,
            };
            match next {
                Ok(Some(n)) => {
                    if let Some(name) = n.payload().strip_prefix(&prefix).and_then(decode_hex) {
                        let _ = events.send(Event::Released(name.into()));
                    }
                }
                Ok(None) | Err(_) => {
                    tracing::debug!("release listener lost its connection; reconnecting");
                    ready.send_replace(None);
                    let _ = events.send(Event::Reset);
                    break;
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(RELEASE_CHANNEL).await?;
    Ok(listener)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::decode_hex;

    #[test]
    fn hex() {
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex(""), Some(vec![]));
    }
}
