//! The resource side of fencing for data in MySQL or MariaDB: a fence table with one row
//! per protected resource (the highest fencing token seen), checked inside the caller's
//! own transaction, so that the check and the write commit together or not at all.
//!
//! [`MysqlFence::check`] upserts the resource's row, keeping the higher of the stored and
//! the given token, then reads it back with a locking read: the row stays locked until the
//! transaction ends, so the writes of two holders to one resource are serialised by it (a
//! newer holder's check waits for an older holder's open transaction), and a token below
//! the stored one fails with [`Error::Fenced`]. Roll the transaction back on that error
//! (dropping it does). InnoDB only (a table without transactions cannot hold the lock).
//!
//! ```no_run
//! # async fn f(pool: lease_mysql::sqlx::MySqlPool, guard: lease_core::LeaseGuard) -> Result<(), Box<dyn std::error::Error>> {
//! use lease_mysql::fence::MysqlFence;
//!
//! let fence = MysqlFence::new("lease_fences")?;
//! fence.create_table(&pool).await?; // or run fence.ddl() in a migration
//! let mut tx = pool.begin().await?;
//! fence.check(&mut tx, "outbox", guard.fencing()).await?; // Error::Fenced if stale
//! lease_mysql::sqlx::query("UPDATE outbox SET sent = TRUE WHERE id = ?")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Least privilege: the writing user needs `SELECT, INSERT, UPDATE` on the fence table:
//! `GRANT SELECT, INSERT, UPDATE ON app.lease_fences TO 'app_writer'@'%';`.

use std::time::Duration;

use lease_core::{Error, FencingToken, InvalidInput};
// The statements are built from a validated, quoted table name only.
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::error::convert;
use crate::sql::TableName;

/// A fence table and its statements. Cheap to clone; build one and keep it.
#[derive(Clone, Debug)]
pub struct MysqlFence {
    quoted: String,
    upsert: String,
    locked_read: String,
    read: String,
}

impl MysqlFence {
    /// The fence in table `table` (`table` or `database.table`; the same rules as the
    /// lock table's name).
    ///
    /// Errors: [`InvalidInput`] for a name outside those rules.
    pub fn new(table: &str) -> Result<Self, InvalidInput> {
        let table = TableName::parse(table)?;
        let q = table.quoted;
        Ok(MysqlFence {
            upsert: format!(
                "INSERT INTO {q} (resource, token) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))"
            ),
            locked_read: format!("SELECT token FROM {q} WHERE resource = ? FOR UPDATE"),
            read: format!("SELECT token FROM {q} WHERE resource = ?"),
            quoted: q,
        })
    }

    /// The table's DDL, for a migration.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (resource VARBINARY(255) NOT NULL PRIMARY KEY, \
             token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
            self.quoted
        )
    }

    /// Creates the table if it does not exist (needs `CREATE` on the database).
    ///
    /// Cancel safety: cancel-safe; the statement is idempotent.
    pub async fn create_table<'c, E>(&self, executor: E) -> Result<(), Error>
    where
        E: sqlx::MySqlExecutor<'c>,
    {
        sqlx::query(AssertSqlSafe(self.ddl()))
            .execute(executor)
            .await
            .map(|_| ())
            .map_err(|e| convert("fence create table", Duration::ZERO, e))
    }

    /// Accepts `token` for `resource` (at most 255 bytes) if it is not below the highest
    /// token stored for it, and stores it, inside the transaction `conn`; the row stays
    /// locked until that transaction ends. Call it before the protected write, in the same
    /// transaction.
    ///
    /// Errors: [`Error::Fenced`] for a stale token (nothing stored; roll back); the
    /// connection's errors as the backend's (a deadlock is retryable: retry the whole
    /// transaction).
    ///
    /// Bounded by the session's `innodb_lock_wait_timeout` (the check waits for the row
    /// while another transaction holds it) and the connection's timeouts.
    ///
    /// Cancel safety: like any statement of a transaction: dropped, the transaction must
    /// be rolled back (dropping it does).
    pub async fn check(
        &self,
        conn: &mut MySqlConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), Error> {
        if resource.len() > 255 {
            return Err(Error::InvalidInput(InvalidInput::Other(format!(
                "fence resource name of {} bytes (at most 255)",
                resource.len()
            ))));
        }
        sqlx::query(AssertSqlSafe(self.upsert.clone()))
            .bind(resource.as_bytes())
            .bind(token.get())
            .execute(&mut *conn)
            .await
            .map_err(|e| convert("fence check", Duration::ZERO, e))?;
        let (highest,): (u64,) = sqlx::query_as(AssertSqlSafe(self.locked_read.clone()))
            .bind(resource.as_bytes())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| convert("fence read", Duration::ZERO, e))?;
        if highest > token.get() {
            return Err(Error::Fenced {
                resource: resource.to_owned(),
                token: token.get(),
                highest,
            });
        }
        Ok(())
    }

    /// The highest token stored for `resource`, if any.
    ///
    /// Cancel safety: cancel-safe (a read).
    pub async fn highest<'c, E>(
        &self,
        executor: E,
        resource: &str,
    ) -> Result<Option<FencingToken>, Error>
    where
        E: sqlx::MySqlExecutor<'c>,
    {
        let row: Option<(u64,)> = sqlx::query_as(AssertSqlSafe(self.read.clone()))
            .bind(resource.as_bytes())
            .fetch_optional(executor)
            .await
            .map_err(|e| convert("fence read", Duration::ZERO, e))?;
        Ok(row.map(|(h,)| FencingToken(h)))
    }
}
