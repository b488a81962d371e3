#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod advisory;
mod backend;
mod config;
mod connection;
mod error;
pub mod fence;
mod inline;
mod notify;
mod reply;
mod sql;
mod tls;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::raw::idle::{self, Checkout, IdleList};
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
    Result, TlsFiles,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgExecutor, PgPool, PgPoolOptions, PgRow, Postgres,
};
use sqlx::{AssertSqlSafe, Row};

pub use crate::advisory::AdvisoryLockBackend;
use crate::error::{BACKEND, convert, redact_url, scrub};
use crate::inline::Param;
use crate::notify::{Event, Listening, Releases};
use crate::sql::{SCHEMA_LOCK_KEY, Statements, TableName};

/// The `sqlx` crate this backend is built on, for [`PostgresBackend::from_pool`] and
/// [`AdvisoryLockBackend::from_pool`].
pub use sqlx;

/// Largest renewal batch sent as one statement; the client splits larger batches.
pub const MAX_RENEW_BATCH: usize = 10_000;

/// Default table name.
pub const DEFAULT_TABLE: &str = "lease_locks";

pub use backend::PostgresBackend;
use config::*;
pub use config::{PostgresConfig, schema_sql};
use connection::*;
pub use lease_core::raw::idle::{KEEP_AT_MOST, KEEP_IDLE};
use reply::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_own_parameters_out_of_the_url() {
        let (url, own) = split_own_params(
            "postgres://u:pw@h/db?sslmode=disable&pooler=transaction&table=ops.locks&create_table=false",
        )
        .unwrap();
        assert_eq!(url, "postgres://u:pw@h/db?sslmode=disable");
        assert!(own.pooler);
        assert_eq!(own.table.as_deref(), Some("ops.locks"));
        assert_eq!(own.create_table, Some(false));
        let (url, own) = split_own_params("postgres://h/db?pooler=session").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert!(!own.pooler);
        let (url, own) = split_own_params("postgres://h/db").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert!(!own.pooler && own.table.is_none() && own.create_table.is_none());
        let e = split_own_params("postgres://u:secret@h/db?pooler=yes").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("transaction"), "{e}");
        let e = split_own_params("postgres://u:secret@h/db?create_table=maybe").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    /// Issue 31, finding 4: a password with an unencoded '/', '?' or '#' was cut there by
    /// the driver and printed in its "invalid port number" error.
    #[test]
    fn passwords_with_reserved_characters_are_refused_unshown() {
        for (url, secret) in [
            ("postgres://u:pg/w0rd@h:5432/db", "w0rd"),
            ("postgresql://u:pg?w0rd#x@h/db?pooler=transaction", "w0rd"),
            ("postgres://u:pg#w0rd@h1,h2/db", "w0rd"),
        ] {
            let e = split_own_params(url).unwrap_err();
            assert!(matches!(e, InvalidInput::MalformedUrl(_)), "{url}: {e:?}");
            assert!(!e.to_string().contains(secret), "{url}: {e}");
            assert!(e.to_string().contains("percent-encode"), "{url}: {e}");
        }
        // Percent-encoded, the same password is fine; '@' needs no encoding.
        for url in ["postgres://u:pg%2Fw0rd@h:5432/db", "postgres://u:p@ss@h/db"] {
            let (url, _) = split_own_params(url).unwrap();
            let tls = TlsFiles::default();
            assert!(connect_options(&url, Duration::from_secs(1), false, &tls).is_ok());
        }
    }

    #[test]
    fn tls_files_set_verify_full_unless_the_url_sets_a_mode() {
        use sqlx::postgres::PgSslMode;
        let tls = TlsFiles::default().with_ca("/ca.pem");
        let full = connect_options("postgres://h/db", Duration::from_secs(1), false, &tls).unwrap();
        assert!(matches!(full.get_ssl_mode(), PgSslMode::VerifyFull));
        let ca = connect_options(
            "postgres://h/db?sslmode=verify-ca",
            Duration::from_secs(1),
            false,
            &tls,
        )
        .unwrap();
        assert!(matches!(ca.get_ssl_mode(), PgSslMode::VerifyCa));
        let twice = connect_options(
            "postgres://u:secret@h/db?sslrootcert=/other.pem",
            Duration::from_secs(1),
            false,
            &tls,
        )
        .unwrap_err();
        assert!(twice.to_string().contains("given twice"), "{twice}");
        assert!(!twice.to_string().contains("secret"), "{twice}");
    }
}
