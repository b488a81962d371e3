//! Converting `redis` errors and malformed replies into [`lease_core::Error`].

use std::time::Duration;

use lease_core::{Error, InvalidInput};
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// Maps a `redis` error from `operation` to the error of the crate family.
///
/// - I/O errors (refused, reset, dropped, EOF) -> [`Error::Unavailable`];
/// - I/O timeouts -> [`Error::Timeout`] with `timeout`;
/// - a failed TLS handshake -> [`Error::Tls`] (what to check, and rustls's words);
/// - bad or missing credentials (`WRONGPASS`, `NOAUTH`) -> [`Error::Auth`];
/// - missing permissions (`NOPERM`), `WRONGTYPE`, `MISCONF` -> [`Error::Rejected`];
/// - transient server states (`READONLY` from a primary demoted in a failover, `LOADING`,
///   `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `OOM`, a `NOSCRIPT` that survived
///   the reload) -> [`Error::Backend`] retryable (for `READONLY`, `MASTERDOWN` and
///   `LOADING` the backend has already tried once more on a new connection);
/// - parse errors and unexpected reply types -> [`Error::UnexpectedReply`];
/// - anything else -> [`Error::Backend`] not retryable.
pub(crate) fn convert(operation: &'static str, timeout: Duration, e: RedisError) -> Error {
    if e.is_timeout() {
        return Error::Timeout {
            operation,
            after: timeout,
        };
    }
    if e.is_io_error()
        && let Some(why) = lease_core::raw::tls::tls_failure(&e)
    {
        return Error::tls(BACKEND, why);
    }
    if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        return Error::unavailable(BACKEND, e);
    }
    // A pipeline's error (the persistence probe) carries the code of its first failed
    // command only among its items.
    let code = match e.code() {
        Some(code) => code.to_owned(),
        None => e
            .clone()
            .into_server_errors()
            .and_then(|items| items.first().map(|(_, item)| item.code().to_owned()))
            .unwrap_or_default(),
    };
    // A command inside a script that the ACL user may not run comes back as a plain
    // error reply, not as NOPERM.
    if e.to_string()
        .contains("user executing the script can't run this command")
    {
        return rejected(e);
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => Error::auth(BACKEND, e),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            Error::unexpected(BACKEND, format!("{operation}: {e}"))
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            // A slot moved and the cluster client ran out of redirects (after its
            // connections were dropped, its map can lag): a new call goes to the slot's
            // node once the map is read again.
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::NoScript,
        ) => backend(e, true),
        ErrorKind::Server(ServerErrorKind::NoPerm) => rejected(e),
        _ => match code.as_str() {
            "NOAUTH" | "WRONGPASS" => Error::auth(BACKEND, e),
            "WRONGTYPE" | "NOPERM" | "MISCONF" => rejected(e),
            "BUSY" | "OOM" | "LOADING" | "MASTERDOWN" | "READONLY" => backend(e, true),
            _ => backend(e, false),
        },
    }
}

fn rejected(e: RedisError) -> Error {
    Error::Rejected {
        backend: BACKEND,
        source: Box::new(e),
    }
}

fn backend(e: RedisError, retryable: bool) -> Error {
    Error::Backend {
        backend: BACKEND,
        retryable,
        source: Box::new(e),
    }
}

/// A reply of the wrong shape.
pub(crate) fn unexpected(operation: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::unexpected(BACKEND, format!("{operation}: {detail}"))
}

/// A URL that could not be used, with the password (if any) removed from the message.
pub(crate) fn malformed_url(url: &str, e: &RedisError) -> Error {
    // The client's URL errors carry a fixed description (and at most the protocol
    // parameter), never the input itself; the URL we echo is redacted.
    let msg = format!("{}: {e}", redact_url(url));
    Error::InvalidInput(InvalidInput::MalformedUrl(msg))
}

pub(crate) use lease_core::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        let r = redact_url("redis://user:s3cret@localhost:6379/0");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("user:***@localhost"), "{r}");
        let r = redact_url("redis://:s3cret@localhost");
        assert!(!r.contains("s3cret"), "{r}");
        let r = redact_url("redis+unix:///tmp/redis.sock?db=1&pass=s3cret");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("db=1"), "{r}");
        let r = redact_url("redis://u:s3cret@[::1");
        assert!(!r.contains("s3cret"), "{r}");
        assert_eq!(
            redact_url("redis://localhost:6379"),
            "redis://localhost:6379"
        );
    }

    #[test]
    fn malformed_url_hides_password() {
        for url in [
            "http://u:s3cret@localhost",
            "redis://u:s3cret@localhost/notadb",
            "redis://u:s3cret@0.0.0.0",
            "redis://u:s3cret@[::1",
        ] {
            let e = match redis::Client::open(url) {
                Err(e) => e,
                Ok(_) => panic!("{url} parsed"),
            };
            let err = malformed_url(url, &e);
            let text = err.to_string();
            assert!(!text.contains("s3cret"), "{text}");
            assert!(matches!(
                err,
                Error::InvalidInput(InvalidInput::MalformedUrl(_))
            ));
        }
    }

    #[test]
    fn classifies_errors() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            convert("acquire", Duration::from_secs(1), io),
            Error::Unavailable { .. }
        ));
        let t = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(
            convert("renew", Duration::from_secs(1), t),
            Error::Timeout {
                operation: "renew",
                ..
            }
        ));
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "bad"));
        assert!(matches!(
            convert("inspect", Duration::from_secs(1), parse),
            Error::UnexpectedReply { .. }
        ));
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "no"));
        assert!(matches!(
            convert("inspect", Duration::from_secs(1), auth),
            Error::Auth { .. }
        ));
        let tls = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(matches!(
            convert("connect", Duration::from_secs(1), tls),
            Error::Tls { .. }
        ));
    }
}
