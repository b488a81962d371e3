//! Converting `zookeeper-client` errors into [`lease_core::Error`].

use std::time::Duration;

use lease_core::Error;
use zookeeper_client as zk;

pub(crate) const BACKEND: &str = "zookeeper";

/// Maps a client error from `operation`:
/// - no server reachable, a connection lost or given up by the client library (its
///   `Custom` errors), a session moved, throttling -> retryable
///   ([`Error::Unavailable`] or a retryable [`Error::Backend`]);
/// - the client's own timeout -> [`Error::Timeout`];
/// - refused credentials -> [`Error::Auth`]; a missing permission (`NoAuth`), an ACL,
///   quota or a read-only server -> [`Error::Rejected`];
/// - anything else -> a non-retryable [`Error::Backend`].
///
/// `SessionExpired` is handled by the callers (the session's nodes are gone: its leases
/// are lost); where it reaches here it is retryable (a new session is made).
pub(crate) fn convert(operation: &'static str, timeout: Duration, e: zk::Error) -> Error {
    use zk::Error as E;
    match e {
        E::ConnectionLoss | E::NoHosts | E::ClientClosed => Error::unavailable(BACKEND, e),
        // The client library fails the requests in flight with whatever broke their
        // connection: an I/O error, or "no response from connection in N ms" after 2/5 of
        // the session timeout without a reply. As with `ConnectionLoss`, the session
        // reconnects and the call may be made again (its outcome is unknown).
        // (Opening a session maps them apart: [`open_error`].)
        E::Custom(_) => Error::unavailable(BACKEND, e),
        E::Timeout => Error::Timeout {
            operation,
            after: timeout,
        },
        E::SessionExpired | E::SessionMoved | E::Throttled => Error::Backend {
            backend: BACKEND,
            retryable: true,
            source: Box::new(e),
        },
        E::AuthFailed => Error::auth(BACKEND, e),
        E::NoAuth | E::InvalidAcl | E::QuotaExceeded | E::NotReadOnly | E::Unimplemented => {
            Error::Rejected {
                backend: BACKEND,
                source: Box::new(e),
            }
        }
        other => Error::Backend {
            backend: BACKEND,
            retryable: false,
            source: Box::new(other),
        },
    }
}

/// A session that could not be opened, as [`convert`] says, except the client library's
/// own errors (`Custom`): when opening a session they come from its configuration (a TLS
/// identity it refused), which trying again does not cure; on a request in flight they
/// mean a connection given up, which it may.
pub(crate) fn open_error(limit: Duration, e: zk::Error) -> Error {
    match e {
        zk::Error::Custom(_) => Error::Backend {
            backend: BACKEND,
            retryable: false,
            source: Box::new(e),
        },
        e => convert("connect", limit, e),
    }
}

/// A reply that cannot be what this backend wrote.
pub(crate) fn unexpected(operation: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::unexpected(BACKEND, format!("{operation}: {detail}"))
}

/// `fut` bounded by `timeout`: a [`Error::Timeout`] when it ran out. Where the caller
/// drops the call no later anyway ([`LeaseClient`](lease_core::LeaseClient)'s own call
/// timeout), no timer of the backend's own is set
/// ([`within`](lease_core::raw::deadline::within), as the etcd backend's requests use):
/// one timer per request either way.
pub(crate) async fn bounded<T, E>(
    operation: &'static str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, Error> {
    lease_core::raw::deadline::within(tokio::time::Instant::now() + timeout, fut)
        .await
        .ok_or(Error::Timeout {
            operation,
            after: timeout,
        })
}
