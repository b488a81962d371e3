#![cfg_attr(docsrs, feature(doc_cfg))]
//! MySQL and MariaDB backend for the `lease` crate family: a ShedLock-style lock table,
//! every decision taken on the database server's clock.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lease_core::Error> {
//! use std::{sync::Arc, time::Duration};
//! use lease_core::{LeaseClient, LeaseOptions, RunOutcome};
//! use lease_mysql::MysqlBackend;
//!
//! let backend = MysqlBackend::connect("mysql://app:secret@db.internal:3306/app").await?;
//! let client = LeaseClient::new(Arc::new(backend));
//! let opts = LeaseOptions::new(Duration::from_secs(30))?;
//! match client.run_exclusive("nightly-report", &opts, |ctx| async move {
//!     // ... work, passing ctx.fencing to the resource you write to ...
//! }).await? {
//!     RunOutcome::Ran(()) => {}
//!     other => println!("not run: {other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! One row per lease name, kept after release so that the fencing counter never goes
//! back: `name` (the key, `VARBINARY(1024)`), `owner_token`, `holder`, `fencing`,
//! `locked_at`, `lock_until`, `released`. [`schema_sql`] gives the DDL for migrations;
//! by default the backend runs it when the table is missing (several instances starting
//! at once are safe: `CREATE TABLE IF NOT EXISTS` takes the table's metadata lock). A
//! role with only `SELECT, INSERT, UPDATE` on an existing table works.
//!
//! # Primitives and round trips
//!
//! - acquire: one `INSERT ... ON DUPLICATE KEY UPDATE` that decides on
//!   `UTC_TIMESTAMP(6)` and returns the fencing token in its OK packet; when the lease is
//!   held, one more `SELECT` reads the holder and its remaining time for the answer;
//! - renew: one round trip per batch (up to [`MAX_RENEW_BATCH`] leases);
//! - release (with keep-for), inspect, force release: one statement each.
//!
//! Release notification: none; waiters poll with backoff (the capabilities say so).
//! See `sql.rs` for why `UTC_TIMESTAMP(6)` is the clock: the statements read the server's
//! time in UTC whatever the session's time zone, so a pool of your own
//! ([`MysqlBackend::from_pool`]) may use any zone.
//!
//! # Fencing durability
//!
//! The counter is a column of an InnoDB row. The backend says [`Fencing::Durable`] only
//! if the server runs with `innodb_flush_log_at_trx_commit = 1` (the default): with `0` or
//! `2` a crash may lose the last second of commits, counters included, and the backend
//! says [`Fencing::Volatile`]. [`MysqlConfig::persistent_fencing`] overrides the answer
//! (for example `Some(false)` when a failover may promote an asynchronous replica).
//!
//! # Cancel safety
//!
//! Every primitive is one or two statements on a pooled connection, bounded by
//! [`MysqlConfig::request_timeout`]. A dropped future abandons the call: a statement already
//! sent may still be applied by the server (an acquire then holds a lease nobody knows
//! of until its TTL passes; `LeaseClient` cleans up after calls it abandons). The
//! connection goes back to the pool with that reply pending, and the driver reads and
//! discards it before the connection's next statement (lease-lab's lost-reply test
//! drops calls in flight this way).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::raw::idle::{self, Checkout, IdleList};
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
    TlsFiles,
};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Row};

mod backend;
mod config;
mod error;
pub mod fence;
mod sql;
mod tls;

use error::{BACKEND, connection_closed, convert};
use sql::{Statements, TableName};

/// The `sqlx` this crate is built on, for [`MysqlBackend::from_pool`].
pub use sqlx;

/// Largest renewal batch sent in one round trip; the client splits larger batches.
pub const MAX_RENEW_BATCH: usize = 10_000;

/// Default table name.
pub const DEFAULT_TABLE: &str = "lease_locks";

pub use backend::MysqlBackend;
use config::*;
pub use config::{MysqlConfig, schema_sql};
pub use lease_core::raw::idle::{KEEP_AT_MOST, KEEP_IDLE};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::micros_ceil;

    #[test]
    fn own_url_parameters_are_split_off() {
        let mut c = MysqlConfig::default();
        let (url, tls) = split_own_params(
            "mariadb://u:p@h:3306/db?table=ops.locks&ssl-mode=REQUIRED&create_table=false",
            &mut c,
        )
        .expect("valid");
        assert_eq!(url, "mysql://u:p@h:3306/db?ssl-mode=REQUIRED");
        assert!(tls.mode_given);
        assert_eq!(c.table, "ops.locks");
        assert!(!c.create_table);
        assert!(split_own_params("mysql://h/db?create_table=maybe", &mut c).is_err());
    }

    /// Issue 31, finding 4: a password with an unencoded '/', '?' or '#' was cut there by
    /// the driver and printed in its "invalid port number" error.
    #[test]
    fn passwords_with_reserved_characters_are_refused_unshown() {
        for url in [
            "mysql://u:my/s3cr#t@h:3306/db",
            "mariadb://u:my?s3cret@h/db?table=t",
        ] {
            let mut c = MysqlConfig::default();
            let Err(e) = split_own_params(url, &mut c) else {
                panic!("{url} accepted");
            };
            assert!(
                matches!(e, Error::InvalidInput(InvalidInput::MalformedUrl(_))),
                "{url}: {e:?}"
            );
            assert!(!e.to_string().contains("s3cr"), "{url}: {e}");
            assert!(e.to_string().contains("percent-encode"), "{url}: {e}");
        }
        let mut c = MysqlConfig::default();
        let (url, _) =
            split_own_params("mysql://u:my%2Fs3cr%23t@h:3306/db", &mut c).expect("valid");
        assert!(MySqlConnectOptions::from_str(&url).is_ok());
    }

    #[test]
    fn tls_files_leave_the_url_for_the_config() {
        let mut c = MysqlConfig::default();
        let (url, tls) = split_own_params(
            "mysql://h/db?ssl-ca=%2Fetc%2Fca.pem&sslcert=/c.pem&ssl-key=/k%20x.pem&charset=utf8mb4",
            &mut c,
        )
        .expect("valid");
        assert_eq!(url, "mysql://h/db?charset=utf8mb4");
        assert!(!tls.mode_given);
        assert_eq!(
            c.tls,
            TlsFiles::default()
                .with_ca("/etc/ca.pem")
                .with_client("/c.pem", "/k x.pem")
        );
        for bad in [
            "mysql://h/db?ssl-ca=",
            "mysql://h/db?ssl-ca=/a&sslca=/a",
            "mysql://h/db?ssl-ca=%zz",
        ] {
            let mut c = MysqlConfig::default();
            assert!(split_own_params(bad, &mut c).is_err(), "{bad}");
        }
        // The same file in the config and the URL is fine; two different ones are not.
        let mut c = MysqlConfig {
            tls: TlsFiles::default().with_ca("/a.pem"),
            ..MysqlConfig::default()
        };
        assert!(split_own_params("mysql://h/db?ssl-ca=/a.pem", &mut c).is_ok());
        assert!(split_own_params("mysql://h/db?ssl-ca=/b.pem", &mut c).is_err());
    }

    #[test]
    fn micros_round_up() {
        assert_eq!(micros_ceil("ttl", Duration::from_nanos(1)).ok(), Some(1));
        assert_eq!(
            micros_ceil("ttl", Duration::from_millis(2)).ok(),
            Some(2000)
        );
        assert!(micros_ceil("ttl", Duration::MAX).is_err());
    }
}
