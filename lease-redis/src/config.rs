//! Settings of a backend: [`RedisConfig`] and [`WaitForReplicas`].

use super::*;

/// Settings of a [`RedisBackend`].
///
/// ```
/// use std::time::Duration;
/// use lease_redis::RedisConfig;
/// let config = RedisConfig::default()
///     .with_key_prefix("billing:lease")
///     .with_request_timeout(Duration::from_secs(2));
/// assert_eq!(config.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// First part of every key (default `lease`). 1 to 256 bytes; no braces (they would
    /// change the cluster hash slot), whitespace or control characters.
    pub key_prefix: String,
    /// Bound of every connection attempt, including reconnects (default 5 s).
    pub connect_timeout: Duration,
    /// Bound of every call while the connection is up (default 5 s). After a failed
    /// call (the connection may have to be made again first) the next call may take up
    /// to `connect_timeout + request_timeout`.
    pub request_timeout: Duration,
    /// Whether fencing tokens survive a server restart. `None` (default): ask the server
    /// once at connect (`CONFIG GET appendonly` / `appendfsync`): durable only with
    /// `appendonly yes` and `appendfsync always`; volatile if `CONFIG` is not allowed.
    /// `Some(_)` skips the question and trusts the operator.
    pub persistent_fencing: Option<bool>,
    /// TLS files for `rediss://` URLs (feature `tls`): a CA bundle (default: the system's
    /// trust store) and a client certificate with its key (mutual TLS). The URL
    /// parameters `tls_ca`, `tls_cert` and `tls_key` set them too; giving one file two
    /// different ways is an error.
    pub tls: TlsFiles,
    /// Replica acknowledgement (`WAIT`) of acquisitions and renewals: see
    /// [`WaitForReplicas`]. `None` (default): a write counts once the primary applied it.
    pub wait_for_replicas: Option<WaitForReplicas>,
    /// Leases per renewal script call (default [`DEFAULT_RENEW_BATCH`], at most
    /// [`RENEW_BATCH_LIMIT`]); on a cluster, per primary. A larger batch takes fewer calls
    /// per tick and keeps the server (each primary) busy longer in each: Redis runs one
    /// script at a time, so every other client of that server waits meanwhile
    /// (BENCHMARKS.md gives the time per tick for each batch size).
    pub renew_batch: usize,
}

/// Acquisitions and renewals count only once `replicas` replicas acknowledged them
/// (Redis `WAIT`, sent in the same pipeline as the script, so on the same connection and
/// to the same node as the write).
///
/// **What it buys.** Replication is asynchronous: a primary that fails right after a
/// write may be replaced by a replica that never saw it. Without this option that can
/// lose an acquisition (the new primary has no lease, so a second holder gets it while
/// the first still believes), its fencing counter's `INCR` (a token issued again), or a
/// renewal (the lease lapses on the new primary up to one renewal period before its
/// holder's deadline). With it, an acquisition or renewal that fewer replicas
/// acknowledged within `timeout` is not counted: the acquire fails with a retryable
/// error and releases what it took, and a renewal fails (retryable), so the holder's
/// deadline does not move and it stops by the deadline of its last acknowledged one.
///
/// **What it costs.** Every acquisition and renewal waits for the replicas' replies: a
/// round trip from the primary to them. The server blocks the connection during a
/// `WAIT`, so the backend's other calls queue behind it: while the replicas do not
/// answer, `n` calls in flight take up to `n × timeout` (and calls past
/// [`RedisConfig::request_timeout`] fail with a timeout). Keep `timeout` small. While
/// fewer than `replicas` replicas are connected and in sync, no lease can be taken or
/// kept: availability is traded for the guarantee.
///
/// **What it does not buy.** `WAIT` is not consensus. A failover may still promote a
/// replica that had not acknowledged (one of several, or after a partition), and the
/// acknowledgement is of the replica's memory, not of its disk. It narrows the window;
/// for a lease that must never be lost to a failover use a consensus store (the etcd
/// backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitForReplicas {
    /// How many replicas must acknowledge (at least 1).
    pub replicas: u32,
    /// How long the primary waits for them: more than zero, and less than
    /// [`RedisConfig::request_timeout`] (which bounds the whole call).
    pub timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            key_prefix: "lease".to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            persistent_fencing: None,
            tls: TlsFiles::default(),
            wait_for_replicas: None,
            renew_batch: DEFAULT_RENEW_BATCH,
        }
    }
}

impl RedisConfig {
    /// Sets [`key_prefix`](Self::key_prefix).
    pub fn with_key_prefix(mut self, value: impl Into<String>) -> Self {
        self.key_prefix = value.into();
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, value: Duration) -> Self {
        self.connect_timeout = value;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, value: Duration) -> Self {
        self.request_timeout = value;
        self
    }

    /// Sets [`persistent_fencing`](Self::persistent_fencing).
    pub fn with_persistent_fencing(mut self, value: Option<bool>) -> Self {
        self.persistent_fencing = value;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn with_tls(mut self, value: TlsFiles) -> Self {
        self.tls = value;
        self
    }

    /// Sets [`wait_for_replicas`](Self::wait_for_replicas).
    pub fn with_wait_for_replicas(mut self, value: Option<WaitForReplicas>) -> Self {
        self.wait_for_replicas = value;
        self
    }

    /// Sets [`renew_batch`](Self::renew_batch).
    pub fn with_renew_batch(mut self, value: usize) -> Self {
        self.renew_batch = value;
        self
    }
}

impl RedisConfig {
    pub(crate) fn validate(&self) -> std::result::Result<(), InvalidInput> {
        keys::validate_prefix(&self.key_prefix)?;
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(InvalidInput::Other(format!(
                    "redis {what} must be greater than zero"
                )));
            }
        }
        if !(1..=RENEW_BATCH_LIMIT).contains(&self.renew_batch) {
            return Err(InvalidInput::Other(format!(
                "redis renew_batch must be 1 to {RENEW_BATCH_LIMIT}, not {}",
                self.renew_batch
            )));
        }
        if let Some(w) = self.wait_for_replicas {
            if w.replicas == 0 {
                return Err(InvalidInput::Other(
                    "redis wait_for_replicas.replicas must be at least 1".into(),
                ));
            }
            if w.timeout.is_zero() || w.timeout >= self.request_timeout {
                return Err(InvalidInput::Other(format!(
                    "redis wait_for_replicas.timeout ({:?}) must be more than zero and less \
                     than request_timeout ({:?})",
                    w.timeout, self.request_timeout
                )));
            }
        }
        Ok(())
    }

    /// The bound of one call: a reconnect plus a reply.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.connect_timeout.saturating_add(self.request_timeout)
    }

    pub(crate) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Replies are bounded by one timer per call in `RedisBackend::send`.
            .set_response_timeout(None)
            // Fail fast while the server is down (each call triggers a new reconnect),
            // and reconnect promptly once it is back.
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_write_backpressure_boundary(WRITE_BATCH_BYTES)
    }
}

/// How many bytes of queued commands a connection may gather before it writes them
/// (`redis`'s write backpressure boundary, 8 KiB unless set). Concurrent callers share
/// one connection, and their commands go out in one write while they fit: 32 acquires
/// with 40-byte names are about 8.5 KiB, which the default split into two writes (and
/// the server into two reads and two event-loop passes). The buffer grows only as far
/// as a burst needs it.
pub(crate) const WRITE_BATCH_BYTES: usize = 64 * 1024;
