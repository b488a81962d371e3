//! Conversion of `sqlx` errors into [`lease_core::Error`].

use std::time::Duration;

use lease_core::{Error, InvalidInput};

/// Backend name used in errors and logs of the table mode.
pub(crate) const BACKEND: &str = "postgres";

/// Backend name of the advisory-lock mode.
pub(crate) const ADVISORY_BACKEND: &str = "postgres-advisory";

/// Maps a `sqlx` error of `operation` to the crate family's error.
///
/// `timeout` is the bound that applied to the call (reported when the server cancelled the
/// statement because of `statement_timeout`).
pub(crate) fn convert(
    backend: &'static str,
    operation: &'static str,
    timeout: Duration,
    error: sqlx::Error,
) -> Error {
    use sqlx::Error as E;
    match error {
        E::Tls(ref e) => {
            let text = lease_core::raw::errors::error_chain_text(e.as_ref());
            let detail = if text.contains("without TLS support") {
                "TLS (an sslmode other than disable or prefer, or TLS files) needs the `tls` \
                 feature (of the lease crate, or of lease-postgres)"
                    .to_owned()
            } else if let Some(why) = lease_core::raw::tls::tls_failure(e.as_ref()) {
                why
            } else if text.contains("does not support TLS") {
                format!("the server does not accept TLS connections (ssl = off?): {text}")
            } else {
                text
            };
            Error::Tls { backend, detail }
        }
        E::Io(ref io) if lease_core::raw::tls::tls_failure(io).is_some() => Error::Tls {
            backend,
            detail: lease_core::raw::tls::tls_failure(io).unwrap_or_default(),
        },
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => Error::Unavailable {
            backend,
            source: Box::new(error),
        },
        E::Database(ref db) if db.message().starts_with("unsupported startup parameter") => {
            let hint = if backend == ADVISORY_BACKEND {
                "a connection pooler such as PgBouncer refused the startup parameters; the \
                 advisory-lock mode needs a server session of its own per lock and cannot \
                 work through a pooler: connect to PostgreSQL directly"
            } else {
                "a connection pooler such as PgBouncer refused the startup parameters: add \
                 pooler=transaction to the URL (or set PostgresConfig::transaction_pooler) \
                 when it pools by transaction, or connect to PostgreSQL directly"
            };
            Error::Rejected {
                backend,
                source: format!("{}: {hint}", db.message()).into(),
            }
        }
        E::Database(ref db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            from_sqlstate(backend, operation, timeout, &code, error)
        }
        E::Protocol(_)
        | E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_) => Error::UnexpectedReply {
            backend,
            detail: format!("{operation}: {error}"),
        },
        E::Encode(_) | E::InvalidArgument(_) => Error::InvalidInput(InvalidInput::Other(format!(
            "{backend} {operation}: {error}"
        ))),
        E::Configuration(_) => Error::Rejected {
            backend,
            source: Box::new(error),
        },
        other => Error::Backend {
            backend,
            retryable: false,
            source: Box::new(other),
        },
    }
}

/// Classifies a database error by its SQLSTATE.
fn from_sqlstate(
    backend: &'static str,
    operation: &'static str,
    timeout: Duration,
    code: &str,
    error: sqlx::Error,
) -> Error {
    let class = code.get(..2).unwrap_or("");
    match (class, code) {
        // query_canceled: statement_timeout (or a cancel request) stopped the statement.
        (_, "57014") => Error::Timeout {
            operation,
            after: timeout,
        },
        // Connection exceptions; the server shutting down, crashing or still starting up.
        ("08", _) | (_, "57P01" | "57P02" | "57P03" | "57P04" | "57P05") => Error::Unavailable {
            backend,
            source: Box::new(error),
        },
        // Serialization failure, deadlock, lock not available, insufficient resources
        // (too many connections, out of memory or disk): a later retry may succeed.
        (_, "40001" | "40P01" | "55P03") | ("53", _) => Error::Backend {
            backend,
            retryable: true,
            source: Box::new(error),
        },
        // Invalid authorization: wrong password, no pg_hba.conf entry, a client
        // certificate required or refused.
        ("28", _) => Error::Auth {
            backend,
            source: Box::new(error),
        },
        // Missing database or schema, read-only transaction, syntax error or undefined
        // table/column, insufficient privilege, data exceptions: the same call will fail
        // again.
        ("42" | "3D" | "3F" | "22" | "23", _) | (_, "25006") => Error::Rejected {
            backend,
            source: Box::new(error),
        },
        _ => Error::Backend {
            backend,
            retryable: false,
            source: Box::new(error),
        },
    }
}

pub(crate) use lease_core::redact_url;

/// `message` with every occurrence of the password (as written in the URL and
/// percent-decoded, found by [`lease_core::raw::url::url_password`]) replaced by `***`.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    let Some(password) = lease_core::raw::url::url_password(url) else {
        return message.to_owned();
    };
    let mut out = message.replace(password, "***");
    // A password that does not decode (a stray '%') is replaced as written only.
    if let Ok(decoded) = lease_core::raw::url::percent_decode(password)
        && !decoded.is_empty()
        && decoded != password
    {
        out = out.replace(&decoded, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_password() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db?x=1"),
            "postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("not a url"), "(not a URL)");
        assert_eq!(
            redact_url("postgresql://u:p@ss@h/db"),
            "postgresql://u:***@h/db"
        );
    }

    #[test]
    fn scrubs_encoded_and_decoded_password() {
        let url = "postgres://u:p%40ss@h/db";
        assert_eq!(scrub("bad p%40ss and p@ss", url), "bad *** and ***");
        assert_eq!(scrub("nothing", "postgres://h/db"), "nothing");
    }

    #[test]
    fn tls_errors_are_tls_never_unreachable() {
        // sqlx's own words when TLS is asked for and not compiled in: before, exit 69 and
        // "retryable"; now a configuration error naming the feature.
        let off = sqlx::Error::Tls("SQLx was built without TLS support".into());
        let e = convert(BACKEND, "connect", Duration::from_secs(1), off);
        assert!(matches!(e, Error::Tls { .. }), "{e:?}");
        assert!(e.to_string().contains("`tls` feature"), "{e}");
        assert!(!e.is_retryable());
        let refused = sqlx::Error::Tls("server does not support TLS".into());
        let e = convert(BACKEND, "connect", Duration::from_secs(1), refused);
        assert!(e.to_string().contains("does not accept TLS"), "{e}");
    }

    #[test]
    fn statement_timeout_is_a_timeout() {
        let e = from_sqlstate(
            BACKEND,
            "acquire",
            Duration::from_secs(1),
            "57014",
            sqlx::Error::Protocol("x".into()),
        );
        assert!(matches!(
            e,
            Error::Timeout {
                operation: "acquire",
                ..
            }
        ));
        let e = from_sqlstate(
            BACKEND,
            "acquire",
            Duration::ZERO,
            "42P01",
            sqlx::Error::Protocol("x".into()),
        );
        assert!(matches!(e, Error::Rejected { .. }));
        let e = from_sqlstate(
            BACKEND,
            "acquire",
            Duration::ZERO,
            "40P01",
            sqlx::Error::Protocol("x".into()),
        );
        assert!(e.is_retryable());
        let e = from_sqlstate(
            BACKEND,
            "acquire",
            Duration::ZERO,
            "08006",
            sqlx::Error::Protocol("x".into()),
        );
        assert!(matches!(e, Error::Unavailable { .. }));
    }
}
