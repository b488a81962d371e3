//! The sweep that deletes what nobody renewed within its TTL.
//!
//! A session keeps every ephemeral node of it alive for as long as the client pings it,
//! which the client library does on its own. A lease must lapse at its TTL when its
//! holder stops renewing it (the guard was dropped, an acquire was abandoned) while the
//! process and with it the session live on: so every lease held here has a deadline
//! (the send time of its last confirmed acquire or renewal + TTL), and the sweep deletes
//! its holder node once the deadline has passed, by the name node's version (a holder
//! that changed since is never touched), trying again while the session lives. When the
//! process or its connection dies, the server expires the session within its timeout,
//! which is at least the TTL.

use std::sync::Weak;
use std::time::Duration;

use lease_core::{OwnerToken, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{bounded, convert};
use crate::nodes::{self, HELD};
use crate::records::Record;
use crate::sessions::{Sessions, after_barrier, barrier};

/// How often the sweep looks for leases past their deadline.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// When the sweep looks again at a lease it could not settle (the store did not answer,
/// the session was disconnected, or an acquire queued on a replaced connection may still
/// be sent).
const SWEEP_AGAIN: Duration = Duration::from_millis(500);

/// What the sweep did with a lease past its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Swept {
    /// Deleted, or nothing of it is left to delete.
    Done,
    /// Not settled: the session is disconnected, or the lease is not there yet but an
    /// acquire of it may still be sent. Looked at again.
    Again,
}

/// The sweep: every [`SWEEP_EVERY`], resumes sessions disconnected for too long
/// ([`Sessions::resume_stalled`]) and deletes the holder nodes of records past their
/// deadline (ends when the backend is dropped).
pub(crate) async fn sweep(sessions: Weak<Sessions>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = sessions.upgrade() else { return };
        s.resume_stalled();
        let expired = s.records().take_expired(Instant::now());
        for ((path, token), rec) in expired {
            let s = s.clone();
            tokio::spawn(async move {
                let again = match delete_unrenewed(&s, &path, &token, &rec).await {
                    Ok(swept) => swept == Swept::Again,
                    Err(e) => {
                        tracing::debug!(error = %e, "deleting an unrenewed zookeeper lease failed; trying again");
                        true
                    }
                };
                // Kept while its session lives: a lease left on it would be held for as
                // long as this backend keeps the session.
                if again && s.existing(rec.ttl_ms, rec.session).await.is_some() {
                    let rec = Record {
                        deadline: Instant::now() + SWEEP_AGAIN,
                        ..rec
                    };
                    s.records().put_back((path, token), rec);
                }
            });
        }
    }
}

/// Deletes the holder node of `path` if the lease is still the record's (the name node
/// at the record's version, or for an acquire whose reply was lost, naming its token).
///
/// An acquire whose reply was lost and that is not found may still be sent: it was queued
/// on a connection that [`Sessions::resume_stalled`] replaced and that has not ended
/// ([`Swept::Again`]). Had the record been dropped then, the acquire would take the lease
/// later with nobody to renew or delete it, held for as long as the session lives.
async fn delete_unrenewed(
    s: &Sessions,
    path: &str,
    token: &OwnerToken,
    rec: &Record,
) -> Result<Swept> {
    let Some(client) = s.existing(rec.ttl_ms, rec.session).await else {
        return Ok(Swept::Done); // the session ended: its nodes went with it
    };
    if client.state() == zk::SessionState::Disconnected {
        // Not queued on a connection that is down (it would wait there for the request
        // timeout, and be sent whenever the connection comes back): looked at again soon.
        return Ok(Swept::Again);
    }
    // Asked before the read: a retired connection that sends a queued acquire and ends
    // between the read's answer and this question would otherwise be missed.
    let pending = s.replay_pending(rec.session);
    let gone = || {
        if pending { Swept::Again } else { Swept::Done }
    };
    let t = s.config.request_timeout;
    let version = match rec.version {
        Some(v) => v,
        // After a barrier: where the acquire's reply was lost and the session reconnected
        // to another member, that member may not have applied the acquire yet.
        None => match bounded(
            "release",
            t,
            after_barrier(
                Some(barrier(&client, nodes::parent(path))),
                client.get_data(path),
            ),
        )
        .await?
        {
            Ok((data, stat)) => match nodes::decode_name(&data) {
                Some(d) if d.state == HELD && d.token == *token => stat.version,
                _ => return Ok(gone()),
            },
            Err(zk::Error::NoNode) => return Ok(gone()),
            Err(e) => return Err(convert("release", t, e)),
        },
    };
    let mut multi = client.new_multi_writer();
    let holder = nodes::holder_node(path);
    let released = nodes::encode_name(crate::nodes::RELEASED, token, &rec.label);
    multi
        .add_set_data(path, &released, Some(version))
        .and_then(|()| multi.add_delete(&holder, None))
        .map_err(|e| convert("release", t, e))?;
    match bounded("release", t, multi.commit()).await? {
        Ok(_) => {
            tracing::info!(node = path, "deleted a lease nobody renewed within its ttl");
            Ok(Swept::Done)
        }
        // The name node moved on (released, taken by another) or the holder went.
        Err(zk::MultiWriteError::OperationFailed { .. }) => Ok(Swept::Done),
        Err(zk::MultiWriteError::RequestFailed { source }) => Err(convert("release", t, source)),
    }
}
