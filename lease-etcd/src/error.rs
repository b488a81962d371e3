//! Converting `etcd-client` errors into [`lease_core::Error`].

use std::time::Duration;

use lease_core::Error;
use tonic::Code;

pub(crate) const BACKEND: &str = "etcd";

/// Maps an `etcd-client` error from `operation` to the error of the crate family.
///
/// - connection failures (also a status `Unknown` whose source is tonic's transport
///   error: a broken pipe, a reset stream), `Unavailable` (no leader, leader changed,
///   request timed out on the server, member stopping), cancelled or reset streams ->
///   [`Error::Unavailable`];
/// - `DeadlineExceeded` -> [`Error::Timeout`];
/// - `ResourceExhausted` for load shedding ("too many requests") -> retryable;
/// - a failed TLS handshake -> [`Error::Tls`];
/// - wrong credentials -> [`Error::Auth`];
/// - permission failures, requests the server refuses as too large or out of space,
///   unknown RPCs -> [`Error::Rejected`];
/// - undecodable replies -> [`Error::UnexpectedReply`];
/// - anything else -> [`Error::Backend`].
pub(crate) fn convert(operation: &'static str, timeout: Duration, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    if let Some(why) = lease_core::raw::tls::tls_failure(&e) {
        return Error::tls(BACKEND, why);
    }
    match e {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::Cancelled | Code::Aborted => {
                Error::unavailable(BACKEND, status)
            }
            Code::DeadlineExceeded => Error::Timeout {
                operation,
                after: timeout,
            },
            // "etcdserver: too many requests": the server is behind on applying, and says
            // so to shed load. The store out of space, or a message over gRPC's limit, do
            // not pass on their own.
            Code::ResourceExhausted
                if !status.message().contains("space exceeded")
                    && !status.message().contains("larger than max") =>
            {
                Error::Backend {
                    backend: BACKEND,
                    retryable: true,
                    source: Box::new(status),
                }
            }
            // "etcdserver: authentication failed, invalid user ID or password", and a
            // token the server no longer takes after the client authenticated again.
            Code::Unauthenticated => Error::auth(BACKEND, status),
            Code::InvalidArgument if status.message().contains("authentication failed") => {
                Error::auth(BACKEND, status)
            }
            Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::Unimplemented => Error::Rejected {
                backend: BACKEND,
                source: Box::new(status),
            },
            // tonic reports a broken connection (a reset or closed stream) as `Unknown`
            // with its transport error as the source: the store was out of reach, as
            // with `Unavailable`.
            Code::Unknown | Code::Internal
                if lease_core::raw::errors::find_cause::<tonic::transport::Error>(&status)
                    .is_some() =>
            {
                Error::unavailable(BACKEND, status)
            }
            Code::Unknown | Code::Internal => {
                // Other h2 errors: retryable, but not known to be the connection.
                Error::Backend {
                    backend: BACKEND,
                    retryable: true,
                    source: Box::new(status),
                }
            }
            _ => Error::Backend {
                backend: BACKEND,
                retryable: false,
                source: Box::new(status),
            },
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => Error::unavailable(BACKEND, e),
        E::LeaseKeepAliveError(_) => Error::Backend {
            backend: BACKEND,
            retryable: true,
            source: Box::new(e),
        },
        E::Utf8Error(_) => Error::unexpected(BACKEND, format!("{operation}: {e}")),
        _ => Error::Backend {
            backend: BACKEND,
            retryable: false,
            source: Box::new(e),
        },
    }
}

/// Whether a write failed because the etcd lease it refers to no longer exists
/// (`etcdserver: requested lease not found`).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::NotFound && s.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

/// A reply of the wrong shape.
pub(crate) fn unexpected(operation: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::unexpected(BACKEND, format!("{operation}: {detail}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::connection::not_sent;

    fn status(code: Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn classification() {
        let t = Duration::from_secs(1);
        let e = convert(
            "acquire",
            t,
            status(Code::Unavailable, "etcdserver: no leader"),
        );
        assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable());
        let e = convert("acquire", t, status(Code::DeadlineExceeded, "x"));
        assert!(matches!(
            e,
            Error::Timeout {
                operation: "acquire",
                ..
            }
        ));
        let e = convert(
            "acquire",
            t,
            status(Code::PermissionDenied, "etcdserver: permission denied"),
        );
        assert!(matches!(e, Error::Rejected { .. }) && !e.is_retryable());
        let e = convert(
            "acquire",
            t,
            status(Code::InvalidArgument, "etcdserver: user name is empty"),
        );
        assert!(matches!(e, Error::Rejected { .. }));
        // Load shedding passes; no space and oversized messages do not.
        let e = convert(
            "renew",
            t,
            status(Code::ResourceExhausted, "etcdserver: too many requests"),
        );
        assert!(e.is_retryable(), "{e}");
        let e = convert(
            "acquire",
            t,
            status(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
        );
        assert!(matches!(e, Error::Rejected { .. }) && !e.is_retryable());
        let e = convert(
            "renew",
            t,
            status(
                Code::ResourceExhausted,
                "grpc: received message larger than max (5000000 vs. 4194304)",
            ),
        );
        assert!(!e.is_retryable());
        assert!(is_lease_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(!is_lease_not_found(&status(Code::NotFound, "key")));
        assert!(not_sent(&status(Code::Unavailable, "tcp connect error")));
        assert!(!not_sent(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(!not_sent(&status(Code::Internal, "tcp connect error")));
    }
}
