//! The SQL of the lock table, built once per backend for its table.
//!
//! **Time.** Every statement reads the time with `UTC_TIMESTAMP(6)`: the moment the
//! statement began, on the database server's clock, to the microsecond, in UTC.
//! - Not `NOW(6)` (or its synonym `CURRENT_TIMESTAMP(6)`): it is the same moment in the
//!   session's time zone. The columns are `DATETIME(6)`, which no session converts, so a
//!   session in another zone than the one that wrote a deadline would misread it by the
//!   zones' offset: a pool of the caller's in `+05:00` took over at once a lease just
//!   taken in UTC, and a lease it took read as held for five hours in UTC, also after
//!   its release (`tests/time_zone.rs`). A daylight-saving change would move every
//!   deadline by an hour. `UTC_TIMESTAMP(6)` ignores the session's zone, so any pool
//!   works and the rows are in UTC whichever wrote them.
//! - Not `SYSDATE(6)`: it reads the clock when it is evaluated, so two readings in one
//!   statement differ, and under statement-based replication a replica evaluates it
//!   again, at another time (unless the replica runs with `--sysdate-is-now`): the
//!   replica's table would then disagree with the primary's.
//! - Like `NOW()`, and unlike PostgreSQL's `now()`, `UTC_TIMESTAMP()` is per statement,
//!   not per transaction: a lock statement inside a caller's open transaction still
//!   decides on the time the statement began, not when the transaction began
//!   (`utc_timestamp_is_per_statement_inside_a_transaction` shows it). The binary log
//!   carries each statement's start time (`SET TIMESTAMP`), from which both are read, so
//!   replicas apply the same value (`tests/replication.rs`: with a replica applying the
//!   statements half a second late under `binlog_format=STATEMENT`, the rows of acquire
//!   and renew are identical on both, while a `SYSDATE(6)` deadline is half a second
//!   later on the replica).
//! - SQL of your own against the table must read the time the same way.
//!
//! Reading the time at the statement's start errs on the safe side: a statement that
//! waited for a row lock decides as if earlier, so it may call held a lease that lapsed
//! during the wait, never the reverse, and a lease it takes expires that much sooner.

use std::fmt::Write as _;

use lease_core::InvalidInput;

/// A validated table name: `table` or `database.table`, each part matching
/// `[a-z_][a-z0-9_]{0,63}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableName {
    /// The database part, when given.
    pub(crate) database: Option<String>,
    /// The table part.
    pub(crate) table: String,
    /// Quoted for SQL: `` `db`.`t` `` or `` `t` ``.
    pub(crate) quoted: String,
}

impl TableName {
    pub(crate) fn parse(text: &str) -> Result<Self, InvalidInput> {
        let invalid = || {
            InvalidInput::Other(format!(
                "mysql table name {text:?} must be `table` or `database.table`, each part 1 to \
                 64 characters of a-z, 0-9 and _, not starting with a digit"
            ))
        };
        let parts: Vec<&str> = text.split('.').collect();
        if !parts.iter().all(|p| valid_identifier(p)) {
            return Err(invalid());
        }
        match parts.as_slice() {
            [table] => Ok(TableName {
                database: None,
                table: (*table).to_owned(),
                quoted: format!("`{table}`"),
            }),
            [database, table] => Ok(TableName {
                database: Some((*database).to_owned()),
                table: (*table).to_owned(),
                quoted: format!("`{database}`.`{table}`"),
            }),
            _ => Err(invalid()),
        }
    }
}

fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c == '_' => {}
        _ => return false,
    }
    s.len() <= 64 && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The DDL of `table` (idempotent).
pub(crate) fn schema_sql(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20   name        VARBINARY(1024) NOT NULL,\n\
         \x20   owner_token BINARY(16) NULL,\n\
         \x20   holder      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,\n\
         \x20   fencing     BIGINT UNSIGNED NOT NULL,\n\
         \x20   locked_at   DATETIME(6) NOT NULL,\n\
         \x20   lock_until  DATETIME(6) NOT NULL,\n\
         \x20   released    TINYINT(1) NOT NULL DEFAULT 0,\n\
         \x20   PRIMARY KEY (name)\n\
         ) ENGINE=InnoDB",
        t = table.quoted
    )
}

/// A query whose one row counts the tables named `table` (in the URL's database when the
/// name is unqualified). Needs no privilege beyond some privilege on the table.
pub(crate) fn table_exists_sql(table: &TableName) -> String {
    // Names are [a-z0-9_] only: safe inside string literals.
    let database = match &table.database {
        Some(d) => format!("'{d}'"),
        None => "DATABASE()".to_owned(),
    };
    format!(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = {database} \
         AND table_name = '{}'",
        table.table
    )
}

/// The prepared statements of one table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) inspect: String,
    pub(crate) force_release: String,
    pub(crate) table: String,
}

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = &table.quoted;
        // ? name, ? owner token (16 bytes), ? holder label, ? ttl in µs.
        //
        // One statement decides and writes. A new name is inserted with fencing 1. An
        // existing row is taken only if it is free at UTC_TIMESTAMP(6) (never used,
        // released, or expired: `lock_until <= UTC_TIMESTAMP(6)`); a live row is written
        // back unchanged.
        //
        // The answer rides on LAST_INSERT_ID, which the server returns with the
        // statement's OK packet: the VALUES list sets it to 1 (a new row); on a
        // duplicate, the first assignment sets it to 0, and the fencing assignment sets it
        // to the new counter when the row is free. So the result is the fencing token
        // when this statement took the lease, and 0 when the lease is held.
        //
        // The assignments run left to right, and a column assigned earlier reads its new
        // value later: every condition reads `lock_until`, assigned last.
        let acquire = format!(
            "INSERT INTO {t} (name, owner_token, holder, fencing, locked_at, lock_until, released)\n\
             VALUES (?, ?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, 0)\n\
             ON DUPLICATE KEY UPDATE\n\
             \x20 released = IF(LAST_INSERT_ID(0) = 0 AND lock_until <= UTC_TIMESTAMP(6), 0, released),\n\
             \x20 owner_token = IF(lock_until <= UTC_TIMESTAMP(6), VALUES(owner_token), owner_token),\n\
             \x20 holder = IF(lock_until <= UTC_TIMESTAMP(6), VALUES(holder), holder),\n\
             \x20 fencing = IF(lock_until <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fencing + 1), fencing),\n\
             \x20 locked_at = IF(lock_until <= UTC_TIMESTAMP(6), VALUES(locked_at), locked_at),\n\
             \x20 lock_until = IF(lock_until <= UTC_TIMESTAMP(6), VALUES(lock_until), lock_until)"
        );
        // ? keep-for in µs, ? name, ? token. The connection reports matched rows
        // (CLIENT_FOUND_ROWS): 1 when this owner held the lease. keep-for zero (or already
        // elapsed): lock_until becomes now, the lease is free. The row stays, so the
        // fencing counter never resets.
        let release = format!(
            "UPDATE {t} SET owner_token = NULL, released = 1,\n\
             \x20 lock_until = GREATEST(UTC_TIMESTAMP(6), locked_at + INTERVAL ? MICROSECOND)\n\
             WHERE name = ? AND owner_token = ? AND released = 0 AND lock_until > UTC_TIMESTAMP(6)"
        );
        // ? name.
        let inspect = format!(
            "SELECT holder, fencing, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lock_until)\n\
             FROM {t} WHERE name = ? AND lock_until > UTC_TIMESTAMP(6)"
        );
        // ? name. Frees a live lease whoever holds it (also one kept by keep-for).
        let force_release = format!(
            "UPDATE {t} SET owner_token = NULL, released = 1, lock_until = UTC_TIMESTAMP(6)\n\
             WHERE name = ? AND lock_until > UTC_TIMESTAMP(6)"
        );
        Statements {
            acquire,
            release,
            inspect,
            force_release,
            table: t.clone(),
        }
    }

    /// The renewal of a batch of distinct (name, token) pairs: three statements in one
    /// round trip. The new deadline is read once into a session variable; the UPDATE
    /// extends every pair that is live, unreleased and held by that token; the SELECT
    /// returns the pairs whose deadline is now that value: the renewed ones. Names and
    /// tokens are written in as hexadecimal literals (nothing of them reaches the SQL
    /// otherwise); `ttl_us` is an integer.
    pub(crate) fn renew(&self, pairs: &[(&[u8], &[u8; 16])], ttl_us: u64) -> String {
        let mut names = String::with_capacity(pairs.len() * 40);
        let mut both = String::with_capacity(pairs.len() * 80);
        for (i, (name, token)) in pairs.iter().enumerate() {
            if i > 0 {
                names.push(',');
                both.push(',');
            }
            hex_literal(&mut names, name);
            both.push('(');
            hex_literal(&mut both, name);
            both.push(',');
            hex_literal(&mut both, &token[..]);
            both.push(')');
        }
        let t = &self.table;
        format!(
            "SET @lease_renewed_until = UTC_TIMESTAMP(6) + INTERVAL {ttl_us} MICROSECOND;\n\
             UPDATE {t} SET lock_until = @lease_renewed_until\n\
             WHERE name IN ({names}) AND (name, owner_token) IN ({both})\n\
             \x20 AND released = 0 AND lock_until > UTC_TIMESTAMP(6);\n\
             SELECT name, owner_token FROM {t}\n\
             WHERE name IN ({names}) AND (name, owner_token) IN ({both})\n\
             \x20 AND lock_until = @lease_renewed_until"
        )
    }
}

fn hex_literal(out: &mut String, bytes: &[u8]) {
    out.push_str("X'");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(
            TableName::parse("lease_locks").map(|t| t.quoted),
            Ok("`lease_locks`".into())
        );
        assert_eq!(
            TableName::parse("ops.lease_locks").map(|t| t.quoted),
            Ok("`ops`.`lease_locks`".into())
        );
        for bad in [
            "", "1abc", "Lease", "a-b", "a.b.c", ".a", "a.", "a`b", "a b", "a;drop", "잠금",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableName::parse(&"a".repeat(64)).is_ok());
        assert!(TableName::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn statements_use_the_statement_clock_in_utc_only() {
        let s = Statements::new(&TableName::parse("t").expect("valid"));
        let renew = s.renew(&[(b"a'\\", &[0u8; 16])], 5);
        for sql in [&s.acquire, &s.release, &s.inspect, &s.force_release, &renew] {
            assert!(sql.contains("UTC_TIMESTAMP(6)"), "{sql}");
            for zoned in [
                "SYSDATE",
                "NOW(",
                "CURRENT_TIMESTAMP",
                "LOCALTIME",
                "CURDATE",
            ] {
                assert!(!sql.contains(zoned), "{zoned} in {sql}");
            }
        }
        assert!(renew.contains("X'61275c'"), "{renew}");
        assert!(!renew.contains("a'"), "{renew}");
    }
}
