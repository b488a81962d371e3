//! The resource side of fencing for data in PostgreSQL: a fence table with one row per
//! protected resource (the highest fencing token seen), checked inside the caller's own
//! transaction, so that the check and the write commit together or not at all.
//!
//! [`PgFence::check`] upserts the resource's row only if the token is not below the one
//! stored. The upsert locks the row until the transaction ends, so the writes of two
//! holders to one resource are serialised by it: a newer holder's check waits for an older
//! holder's open transaction, and an older holder's check after a newer one's commit
//! fails with [`Error::Fenced`]. Roll the transaction back on that error (dropping it does).
//!
//! ```no_run
//! # async fn f(pool: lease_postgres::sqlx::PgPool, guard: lease_core::LeaseGuard) -> Result<(), Box<dyn std::error::Error>> {
//! use lease_postgres::fence::PgFence;
//!
//! let fence = PgFence::new("lease_fences")?;
//! fence.create_table(&pool).await?; // or run fence.ddl() in a migration
//! let mut tx = pool.begin().await?;
//! fence.check(&mut tx, "outbox", guard.fencing()).await?; // Error::Fenced if stale
//! lease_postgres::sqlx::query("UPDATE outbox SET sent = true WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Least privilege: the role that writes needs `SELECT, INSERT, UPDATE` on the fence table
//! (no `DELETE`, no DDL once the table exists): `GRANT SELECT, INSERT, UPDATE ON
//! lease_fences TO app_writer;`.

use std::time::Duration;

use lease_core::{Error, FencingToken, InvalidInput};
// The statements are built from a validated, quoted table name only.
use sqlx::{AssertSqlSafe, PgConnection};

use crate::error::convert;
use crate::sql::TableName;

use crate::error::BACKEND as FENCE;

/// A fence table and its statements. Cheap to clone; build one and keep it.
#[derive(Clone, Debug)]
pub struct PgFence {
    table: TableName,
    check: String,
    highest: String,
}

impl PgFence {
    /// The fence in table `table` (`table` or `schema.table`, schema `public` when not
    /// given; the same rules as the lease table's name).
    ///
    /// Errors: [`InvalidInput`] for a name outside those rules.
    pub fn new(table: &str) -> Result<Self, InvalidInput> {
        let table = TableName::parse(table)?;
        let q = table.quoted();
        Ok(PgFence {
            check: format!(
                "INSERT INTO {q} AS f (resource, token) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token \
                 WHERE f.token <= EXCLUDED.token RETURNING f.token"
            ),
            highest: format!("SELECT token FROM {q} WHERE resource = $1"),
            table,
        })
    }

    /// The table's DDL, for a migration: `CREATE TABLE IF NOT EXISTS ... (resource text
    /// PRIMARY KEY, token bigint NOT NULL)`.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (resource text PRIMARY KEY, token bigint NOT NULL)",
            self.table.quoted()
        )
    }

    /// Creates the table if it does not exist (needs `CREATE` on the schema).
    ///
    /// Cancel safety: cancel-safe; the statement is idempotent.
    pub async fn create_table<'c, E>(&self, executor: E) -> Result<(), Error>
    where
        E: sqlx::PgExecutor<'c>,
    {
        sqlx::query(AssertSqlSafe(self.ddl()))
            .execute(executor)
            .await
            .map(|_| ())
            .map_err(|e| convert(FENCE, "fence create table", Duration::ZERO, e))
    }

    /// Accepts `token` for `resource` if it is not below the highest token stored for
    /// it, and stores it, inside the transaction (or on the connection) `conn`; the row
    /// stays locked until that transaction ends. Call it before the protected write, in
    /// the same transaction. Resource names are any text.
    ///
    /// Errors: [`Error::Fenced`] for a stale token (nothing stored; roll back); the
    /// connection's errors as the backend's (a serialisation failure under `REPEATABLE
    /// READ` or `SERIALIZABLE` is retryable: retry the whole transaction).
    ///
    /// Bounded by the connection's `statement_timeout` (the caller's session; the check
    /// waits for the row while another transaction holds it).
    ///
    /// Cancel safety: like any statement of a transaction: dropped, the transaction must
    /// be rolled back (dropping it does).
    pub async fn check(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), Error> {
        let value = i64::try_from(token.get()).map_err(|_| {
            Error::InvalidInput(InvalidInput::Other(format!(
                "fencing token {token} does not fit a bigint"
            )))
        })?;
        let accepted: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.check.clone()))
            .bind(resource)
            .bind(value)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| convert(FENCE, "fence check", Duration::ZERO, e))?;
        if accepted.is_some() {
            return Ok(());
        }
        // Not updated: a higher token is stored (read it after the wait, for the error).
        let highest: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.highest.clone()))
            .bind(resource)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| convert(FENCE, "fence read", Duration::ZERO, e))?;
        Err(Error::Fenced {
            resource: resource.to_owned(),
            token: token.get(),
            highest: highest.and_then(|(h,)| u64::try_from(h).ok()).unwrap_or(0),
        })
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
        E: sqlx::PgExecutor<'c>,
    {
        let row: Option<(i64,)> = sqlx::query_as(AssertSqlSafe(self.highest.clone()))
            .bind(resource)
            .fetch_optional(executor)
            .await
            .map_err(|e| convert(FENCE, "fence read", Duration::ZERO, e))?;
        Ok(row.and_then(|(h,)| u64::try_from(h).ok()).map(FencingToken))
    }
}
