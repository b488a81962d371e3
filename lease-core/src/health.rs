//! What a service's health endpoint can report about its leases:
//! [`LeaseClient::health`](crate::LeaseClient::health).

use std::time::Duration;

use crate::Error;

/// The name read by the store probe of [`LeaseClient::health`](crate::LeaseClient::health).
/// Nothing ever holds it; reading it costs one read round trip on every store.
pub const HEALTH_PROBE_NAME: &str = "lease.health-probe";

/// The state of a client's heartbeat (the task that renews its leases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatState {
    /// No lease has been taken yet: the heartbeat starts with the first.
    NotStarted,
    /// The heartbeat runs.
    Running,
    /// The heartbeat has stopped (its runtime shut down, or it panicked): the leases it
    /// kept were reported lost; the next acquire starts a new one.
    Stopped,
}

/// A client's health, as [`LeaseClient::health`](crate::LeaseClient::health) found it.
///
/// ```
/// # async fn demo(client: lease_core::LeaseClient) {
/// let health = client.health(std::time::Duration::from_secs(1)).await;
/// if !health.is_healthy() {
///     eprintln!("lease store: {health}");
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Health {
    /// The heartbeat's state.
    pub heartbeat: HeartbeatState,
    /// How many leases the heartbeat keeps.
    pub leases: u64,
    /// How long ago the store last answered a renewal call (the call was sent that long
    /// ago), or `None` if no renewal has been answered yet. With leases held, an age
    /// approaching their TTL means renewals are failing.
    pub last_renewal: Option<Duration>,
    /// The round trip of a read from the store, or why it failed (bounded by the
    /// timeout given to `health`). [`Error::is_retryable`] tells an outage from a
    /// configuration problem.
    pub store: Result<Duration, Error>,
}

impl Health {
    /// Whether the store answered and the heartbeat has not stopped.
    pub fn is_healthy(&self) -> bool {
        self.store.is_ok() && self.heartbeat != HeartbeatState::Stopped
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.store {
            Ok(rtt) => write!(f, "store answered in {rtt:?}")?,
            Err(e) => write!(f, "store: {e}")?,
        }
        let heartbeat = match self.heartbeat {
            HeartbeatState::NotStarted => "not started",
            HeartbeatState::Running => "running",
            HeartbeatState::Stopped => "stopped",
        };
        write!(f, "; heartbeat {heartbeat}, {} leases", self.leases)?;
        if let Some(age) = self.last_renewal {
            write!(f, ", last renewal answered {age:?} ago")?;
        }
        Ok(())
    }
}
