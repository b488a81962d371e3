//! Leader election: one leader per name at a time, with a fencing token that protects
//! its writes.
//!
//! Leadership is the lease of the election's name: the leader is its holder, renewed by
//! the heartbeat, and the leader's *term* is the lease's fencing token, which grows with
//! every new leadership. A leader that passes its term to the resources it writes lets
//! them refuse a deposed leader that still believes it leads (after a pause, a partition,
//! a long GC): that is the part that etcd's `Election` and Kubernetes' leader election
//! leave to the user. Built on the backend's primitives alone, it works on every backend.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{LeaseClient, LeaseContext, RunOutcome, run_with_guard};
use crate::error::Result;
use crate::guard::LeaseGuard;
use crate::shared::LossReason;
use crate::types::{Fencing, FencingToken, LeaseName, LeaseOptions};
use crate::util::{Site, call};

/// An election: the instances that campaign on the same name, through their own clients.
///
/// ```
/// # async fn demo() -> lease_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{Election, LeaseClient, LeaseOptions, MemoryBackend};
///
/// let client = LeaseClient::new(Arc::new(MemoryBackend::new()));
/// let election = Election::new(client, "scheduler")?;
/// let opts = LeaseOptions::new(Duration::from_secs(10))?;
/// let leadership = election.campaign(&opts).await?;
/// let leader = election.leader().await?.expect("a leader");
/// assert_eq!(leader.term, Some(leadership.term()));
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    client: LeaseClient,
    name: LeaseName,
}

/// This instance's leadership: the lease of the election's name, renewed while it lives.
#[must_use = "dropping the leadership resigns"]
#[derive(Debug)]
pub struct Leadership {
    guard: LeaseGuard,
}

/// The current leader, as the store reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's holder label, where the store keeps one.
    pub holder: Option<String>,
    /// The leader's term: its lease's fencing token, where the store issues one.
    pub term: Option<FencingToken>,
}

impl Election {
    /// The election `name`, campaigned in through `client`.
    ///
    /// Errors: [`crate::InvalidInput`] for an invalid name.
    pub fn new(client: LeaseClient, name: impl AsRef<[u8]>) -> Result<Self> {
        Ok(Election {
            client,
            name: LeaseName::new(name)?,
        })
    }

    /// The election's name (the lease's).
    pub fn name(&self) -> &LeaseName {
        &self.name
    }

    /// Waits until this instance leads, however long that takes (`opts.wait()` does not
    /// apply), and returns its leadership: woken by the store's release notification
    /// where it has one, else polling with backoff, never later than the leader's
    /// expiry. Store errors that may be retried are retried with backoff.
    ///
    /// Errors: only errors that are not retryable (bad options, credentials, TLS).
    ///
    /// Cancel safety: cancel-safe: drop the future to stop campaigning; a leadership the
    /// store granted as the future was dropped is released by its owner token in the
    /// background (see [`LeaseClient::try_acquire`]).
    pub async fn campaign(&self, opts: &LeaseOptions) -> Result<Leadership> {
        // Waits for the leader's release (notification) or expiry (its remaining time),
        // with backoff, as `LeaseClient::acquire` does, but without an end; store errors
        // that may be retried are retried there.
        let guard = self.client.acquire_waiting(&self.name, opts, None).await?;
        tracing::info!(election = %self.name, term = guard.fencing().get(), "leading");
        Ok(Leadership { guard })
    }

    /// The current leader, or `None` when nobody leads (one inspect, bounded by 5 s).
    ///
    /// Cancel safety: cancel-safe; it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.client.inspect(&self.name).await?.map(|info| Leader {
            holder: info.holder,
            term: info.fencing,
        }))
    }

    /// A watch of the leader: a background task reads the leader every `poll` (and at
    /// once when the store notifies a release, where it can) and publishes each change,
    /// in order. With durable fencing, terms only grow along the published values (a
    /// stale reading is dropped); with volatile fencing a store restart may start terms
    /// again at 1, and such a leader is published too.
    ///
    /// What it sees: readings are at most `poll` plus one read apart while the store
    /// answers, so every leadership that lasts longer than that is published, once, in
    /// the order they led (the conformance check
    /// `election_observer_sees_every_leadership_in_order` holds every store to it). A
    /// leadership shorter than that may come and go between two readings and not be
    /// seen: the receiver holds the latest leader, not a log. The gap between two terms
    /// tells that leaderships were missed (and how many, on stores whose tokens count
    /// acquisitions: Redis, PostgreSQL, MySQL, memory; etcd's are revisions). While the
    /// store does not answer, nothing is published. The task stops when every receiver
    /// is dropped. Needs a tokio runtime.
    pub fn observe(&self, poll: Duration) -> watch::Receiver<Option<Leader>> {
        let (tx, rx) = watch::channel(None);
        let election = self.clone();
        let poll = poll.max(Duration::from_millis(1));
        tokio::spawn(async move {
            let caps = election.client.capabilities().clone();
            // Terms can start again at 1 after a store restart unless fencing is durable:
            // only then does a lower term mean a stale reading.
            let durable = caps.fencing == Fencing::Durable;
            let mut last_term: Option<FencingToken> = None;
            loop {
                let reading = tokio::select! {
                    r = election.leader() => r,
                    () = tx.closed() => return,
                };
                let led = matches!(reading, Ok(Some(_)));
                if let Ok(leader) = reading {
                    let stale = match (&leader, last_term) {
                        (Some(Leader { term: Some(t), .. }), Some(last)) => durable && *t <= last,
                        _ => false,
                    };
                    if !stale {
                        if let Some(Leader { term: Some(t), .. }) = &leader {
                            last_term = Some(*t);
                        }
                        tx.send_if_modified(|cur| {
                            if *cur == leader {
                                false
                            } else {
                                *cur = leader.clone();
                                true
                            }
                        });
                    }
                }
                let started = Instant::now();
                let wait = async {
                    // Woken early by a release only while someone leads: on a free lease
                    // the store's wait returns at once, and looping on it would spin.
                    if caps.release_notification && led {
                        let backend = election.client.backend().clone();
                        let _ = call(
                            Site::new(caps.backend, "wait_released", &election.name)
                                .owner(election.client.label()),
                            poll * 2,
                            backend.wait_released(&election.name, poll),
                        )
                        .await;
                        // At least a millisecond between readings, whatever the wait did.
                        tokio::time::sleep_until(started + Duration::from_millis(1)).await;
                    } else {
                        tokio::time::sleep_until(started + poll).await;
                    }
                };
                tokio::select! {
                    () = wait => {}
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }

    /// Runs `work` only while this instance leads: campaigns, runs `work` with the
    /// leadership's context (its `fencing` is the term), and when leadership is lost,
    /// cancels `work` and campaigns again. Returns when `work` completes while leading
    /// (resigning first).
    ///
    /// Errors: as [`Election::campaign`].
    ///
    /// Cancel safety: cancel-safe: dropped while campaigning it stops campaigning;
    /// dropped while leading, `work` is dropped and the leadership released in the
    /// background.
    pub async fn run_while_leader<F, Fut, T>(&self, opts: &LeaseOptions, mut work: F) -> Result<T>
    where
        F: FnMut(LeaseContext) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let leadership = self.campaign(opts).await?;
            match run_with_guard(leadership.guard, &mut work).await {
                RunOutcome::Ran(out) => return Ok(out),
                RunOutcome::Lost(reason) => {
                    tracing::warn!(election = %self.name, %reason, "leadership lost; campaigning again");
                }
                RunOutcome::Skipped(_) => {}
            }
        }
    }
}

impl Leadership {
    /// The term: this leadership's fencing token. Pass it to what the leader writes.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing()
    }

    /// Whether this instance still leads, as far as it knows (see [`LeaseGuard::is_held`]).
    pub fn is_leading(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost: before the store can elect anyone else (unless
    /// an operator frees the lease by force, which the next renewal reports, or the store
    /// has no lead time: see
    /// [`Capabilities::lost_before_taken`](crate::Capabilities::lost_before_taken)).
    ///
    /// Cancel safety: cancel-safe; it only waits.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// The lease guard of the leadership.
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// The lease guard, for the functions that take one.
    pub fn into_guard(self) -> LeaseGuard {
        self.guard
    }

    /// Steps down: renewal stops and the lease is released, so another candidate can lead
    /// at once.
    ///
    /// Cancel safety: as [`LeaseGuard::release`].
    pub async fn resign(self) -> Result<crate::types::ReleaseOutcome> {
        self.guard.release().await
    }
}
