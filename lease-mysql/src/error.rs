//! Conversion of `sqlx` errors into [`lease_core::Error`].

use std::time::Duration;

use lease_core::{Error, InvalidInput};

/// Backend name used in errors and logs.
pub(crate) const BACKEND: &str = "mysql";

/// Whether `e` says the call's connection was closed, so the call never ran on it or its
/// outcome is unknown: an I/O error (what sqlx reports for a socket the server closed),
/// or the server ending the session (1053 server shutdown, 1927 connection killed,
/// SQLSTATE `08S01` communication link failure). Not the other `08` states: "too many
/// connections" (08004) is not helped by sending again at once.
pub(crate) fn connection_closed(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            let number = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map_or(0, sqlx::mysql::MySqlDatabaseError::number);
            matches!(number, 1053 | 1927) || db.code().as_deref() == Some("08S01")
        }
        _ => false,
    }
}

/// Maps a `sqlx` error of `operation` (bounded by `timeout`) to the crate family's error.
pub(crate) fn convert(operation: &'static str, timeout: Duration, error: sqlx::Error) -> Error {
    use sqlx::Error as E;
    match error {
        E::Tls(ref e) => {
            let text = lease_core::raw::errors::error_chain_text(e.as_ref());
            let detail = if text.contains("without TLS support") {
                "TLS (an ssl-mode of REQUIRED or stricter) needs the `tls` feature (of the \
                 lease crate, or of lease-mysql)"
                    .to_owned()
            } else {
                lease_core::raw::tls::tls_failure(e.as_ref()).unwrap_or(text)
            };
            Error::Tls {
                backend: BACKEND,
                detail,
            }
        }
        E::Io(ref io) if lease_core::raw::tls::tls_failure(io).is_some() => Error::Tls {
            backend: BACKEND,
            detail: lease_core::raw::tls::tls_failure(io).unwrap_or_default(),
        },
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => Error::Unavailable {
            backend: BACKEND,
            source: Box::new(error),
        },
        E::Database(ref db) => {
            let code = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map_or(0, sqlx::mysql::MySqlDatabaseError::number);
            from_code(operation, timeout, code, error)
        }
        E::Protocol(_)
        | E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_) => Error::UnexpectedReply {
            backend: BACKEND,
            detail: format!("{operation}: {error}"),
        },
        E::Encode(_) | E::InvalidArgument(_) | E::Configuration(_) => Error::InvalidInput(
            InvalidInput::Other(format!("{BACKEND} {operation}: {error}")),
        ),
        _ => Error::Backend {
            backend: BACKEND,
            retryable: false,
            source: Box::new(error),
        },
    }
}

/// By the server's error number (MySQL's and MariaDB's agree on these).
fn from_code(operation: &'static str, timeout: Duration, code: u16, error: sqlx::Error) -> Error {
    match code {
        // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR.
        1045 | 1698 => Error::Auth {
            backend: BACKEND,
            source: Box::new(error),
        },
        // ER_DBACCESS_DENIED_ERROR, ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR,
        // ER_SPECIFIC_ACCESS_DENIED_ERROR: the role lacks a privilege.
        1044 | 1142 | 1143 | 1227 => Error::Rejected {
            backend: BACKEND,
            source: format!(
                "{error} (the lease table needs SELECT, INSERT, UPDATE on it; creating it needs \
                 CREATE: see lease_mysql::schema_sql for the DDL)"
            )
            .into(),
        },
        // ER_NO_SUCH_TABLE, ER_BAD_DB_ERROR.
        1146 | 1049 => Error::Rejected {
            backend: BACKEND,
            source: Box::new(error),
        },
        // ER_OPTION_PREVENTS_STATEMENT (read_only / super_read_only), ER_CANT_EXECUTE_IN_
        // READ_ONLY_TRANSACTION: a demoted primary or a replica. A retry after the
        // connection reaches the new primary may succeed.
        1290 | 1792 | 1836 => Error::Backend {
            backend: BACKEND,
            retryable: true,
            source: format!("{error} (the server is read-only: a replica or a demoted primary)")
                .into(),
        },
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK, ER_SERVER_SHUTDOWN, ER_CON_COUNT_ERROR,
        // ER_TOO_MANY_USER_CONNECTIONS.
        1205 | 1213 | 1053 | 1040 | 1203 => Error::Backend {
            backend: BACKEND,
            retryable: true,
            source: Box::new(error),
        },
        // MariaDB's max_statement_time, MySQL's max_execution_time.
        1969 | 3024 => Error::Timeout {
            operation,
            after: timeout,
        },
        _ => Error::Backend {
            backend: BACKEND,
            retryable: false,
            source: Box::new(error),
        },
    }
}
