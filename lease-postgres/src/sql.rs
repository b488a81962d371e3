//! The SQL of the table mode, built once per backend for its table.
//!
//! Every statement reads the time with `clock_timestamp()` (the server's wall clock at the
//! moment of the call), never `now()` (the start of the surrounding transaction) and
//! never the client's clock.

use std::sync::Arc;

use lease_core::InvalidInput;

/// Key of the transaction-level advisory lock that serialises schema creation, so that
/// several instances starting at once do not race in `CREATE TABLE IF NOT EXISTS`
/// (which can fail with a unique violation on `pg_type` when two sessions create the same
/// table concurrently). The bytes spell `lease_sc`.
pub(crate) const SCHEMA_LOCK_KEY: i64 = 0x6c65_6173_655f_7363;

/// Channel of the release notifications (`pg_notify`), shared by all lease tables of a
/// database; the payload is `<table> <hex of the name>`.
pub(crate) const RELEASE_CHANNEL: &str = "lease_released";

/// A validated table name: `table` or `schema.table`, each part matching
/// `[a-z_][a-z0-9_]{0,62}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableName {
    /// As given (unquoted), e.g. `locks.lease_locks`.
    plain: String,
    /// Schema part, if qualified.
    schema: Option<String>,
    /// Quoted for SQL, e.g. `"locks"."lease_locks"`.
    quoted: String,
}

impl TableName {
    pub(crate) fn parse(table: &str) -> Result<Self, InvalidInput> {
        let invalid = || {
            InvalidInput::Other(format!(
                "postgres table name {table:?} must be `table` or `schema.table`, each part \
                 1 to 63 characters of a-z, 0-9 and _, not starting with a digit"
            ))
        };
        let parts: Vec<&str> = table.split('.').collect();
        if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| valid_identifier(p)) {
            return Err(invalid());
        }
        let quoted = parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(".");
        let schema = (parts.len() == 2).then(|| parts[0].to_owned());
        Ok(TableName {
            plain: table.to_owned(),
            schema,
            quoted,
        })
    }

    pub(crate) fn plain(&self) -> &str {
        &self.plain
    }

    /// The prefix of this table's release notifications: `<table> `, then the name in
    /// hex. Also a safe SQL string literal: names are `[a-z0-9_.]` only.
    pub(crate) fn payload_prefix(&self) -> String {
        format!("{} ", self.plain)
    }
}

fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c == '_' => {}
        _ => return false,
    }
    s.len() <= 63 && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The DDL for `table`: `CREATE SCHEMA IF NOT EXISTS` (when schema-qualified) and
/// `CREATE TABLE IF NOT EXISTS`, separated by `;`.
pub(crate) fn schema_sql(table: &TableName) -> String {
    let mut sql = String::new();
    if let Some(schema) = &table.schema {
        sql.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n"));
    }
    sql.push_str(&format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20   name        BYTEA PRIMARY KEY,\n\
         \x20   owner_token UUID,\n\
         \x20   holder      TEXT,\n\
         \x20   fencing     BIGINT NOT NULL,\n\
         \x20   locked_at   TIMESTAMPTZ NOT NULL,\n\
         \x20   lock_until  TIMESTAMPTZ NOT NULL,\n\
         \x20   released    BOOLEAN NOT NULL DEFAULT false,\n\
         \x20   waiters     INTEGER NOT NULL DEFAULT 0\n\
         );\n",
        t = table.quoted
    ));
    sql
}

/// The statements of one table, shared by all calls (and cached as prepared statements
/// per connection by sqlx).
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) acquire: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) inspect: Arc<str>,
    pub(crate) force_release: Arc<str>,
    pub(crate) waiters: Arc<str>,
}

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = &table.quoted;
        // $1 name, $2 owner token, $3 holder label, $4 ttl in ms.
        //
        // The upsert takes a free (never used, released or expired) row and bumps the
        // fencing counter; on a live row it does nothing and returns nothing. The outer
        // SELECT always returns one row: the new fencing token, or (only then, as the
        // CASE runs its subquery lazily) the holder and remaining time from the
        // statement's snapshot, in the same statement (one round trip). A UNION of a
        // holder branch cost about 10 us more per call even when the lease was free,
        // because the branch was set up for every call. Under a concurrent hand-over the
        // snapshot may be one acquisition behind; such a row is recognisable (it looks
        // expired, or is missing) and reported as "held, holder unknown".
        let acquire = format!(
            "WITH up AS (\n\
             \x20 INSERT INTO {t} AS l (name, owner_token, holder, fencing, locked_at, lock_until, released)\n\
             \x20 VALUES ($1, $2, $3, 1, clock_timestamp(), clock_timestamp() + $4 * interval '1 millisecond', false)\n\
             \x20 ON CONFLICT (name) DO UPDATE SET\n\
             \x20   owner_token = EXCLUDED.owner_token,\n\
             \x20   holder = EXCLUDED.holder,\n\
             \x20   fencing = l.fencing + 1,\n\
             \x20   locked_at = clock_timestamp(),\n\
             \x20   lock_until = clock_timestamp() + $4 * interval '1 millisecond',\n\
             \x20   released = false\n\
             \x20 WHERE l.lock_until <= clock_timestamp()\n\
             \x20 RETURNING l.fencing\n\
             )\n\
             SELECT up.fencing,\n\
             \x20 CASE WHEN up.fencing IS NULL THEN (\n\
             \x20   SELECT ROW(h.holder, (extract(epoch FROM h.lock_until - clock_timestamp()) * 1000000)::bigint)\n\
             \x20   FROM {t} h WHERE h.name = $1\n\
             \x20 ) END AS held\n\
             FROM (VALUES (1)) AS one (x) LEFT JOIN up ON true"
        );
        // $1 names, $2 tokens (deduplicated by the caller), $3 ttl in ms. Returns the
        // 1-based ordinals of the renewed pairs.
        let renew = format!(
            "UPDATE {t} AS l SET lock_until = clock_timestamp() + $3 * interval '1 millisecond'\n\
             FROM unnest($1::bytea[], $2::uuid[]) WITH ORDINALITY AS b(name, token, i)\n\
             WHERE l.name = b.name AND l.owner_token = b.token\n\
             \x20 AND NOT l.released AND l.lock_until > clock_timestamp()\n\
             RETURNING b.i"
        );
        // $1 name, $2 token, $3 keep-for in ms. The channel and payload prefix are
        // literals (fewer parameters to send on the hot path; both are [a-z0-9_. ]).
        // keep-for zero (or already elapsed): lock_until becomes now, the lease is free.
        // The row stays, so the fencing counter never resets. A lease freed now is
        // announced with pg_notify (from RETURNING, evaluated for the updated row),
        // delivered when the statement commits, but only when someone waits for it
        // (`waiters` > 0): NOTIFY serialises commits database-wide (it takes a global
        // lock at commit), which halved throughput under concurrency. One plain UPDATE:
        // its row count says whether this owner held the lease.
        let notify = |name: &str| {
            format!(
                "pg_notify('{RELEASE_CHANNEL}', '{}' || encode({name}, 'hex'))",
                table.payload_prefix()
            )
        };
        let release = format!(
            "UPDATE {t} SET owner_token = NULL, released = true,\n\
             \x20 lock_until = GREATEST(clock_timestamp(), locked_at + $3 * interval '1 millisecond')\n\
             WHERE name = $1 AND owner_token = $2 AND NOT released AND lock_until > clock_timestamp()\n\
             RETURNING CASE WHEN waiters > 0 AND lock_until <= clock_timestamp() THEN {} IS NULL END AS notified",
            notify("name")
        );
        // $1 name.
        let inspect = format!(
            "SELECT h.holder, h.fencing, (extract(epoch FROM h.lock_until - c.now) * 1000000)::bigint AS remaining_us\n\
             FROM {t} h CROSS JOIN (SELECT clock_timestamp() AS now) c\n\
             WHERE h.name = $1 AND h.lock_until > c.now"
        );
        // $1 name. Frees a live lease whoever holds it (also one kept by keep-for); the
        // row and its counter stay.
        let force_release = format!(
            "WITH r AS (\n\
             \x20 UPDATE {t} SET owner_token = NULL, released = true, lock_until = clock_timestamp()\n\
             \x20 WHERE name = $1 AND lock_until > clock_timestamp()\n\
             \x20 RETURNING name\n\
             )\n\
             SELECT {} IS NULL AS notified FROM r",
            notify("r.name")
        );
        // $1 name, $2 +1 or -1. A waiter registers before it waits (and re-checks the lease
        // after), so a release either sees it and notifies, or commits before the
        // re-check. A waiter that dies registered only costs needless notifications.
        let waiters = format!("UPDATE {t} SET waiters = GREATEST(waiters + $2, 0) WHERE name = $1");
        Statements {
            waiters: waiters.into(),
            acquire: acquire.into(),
            force_release: force_release.into(),
            renew: renew.into(),
            release: release.into(),
            inspect: inspect.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(
            TableName::parse("lease_locks").map(|t| t.quoted),
            Ok("\"lease_locks\"".into())
        );
        assert_eq!(
            TableName::parse("ops.lease_locks").map(|t| t.quoted),
            Ok("\"ops\".\"lease_locks\"".into())
        );
        assert!(TableName::parse("_x1").is_ok());
        assert!(TableName::parse(&"a".repeat(63)).is_ok());
        for bad in [
            "",
            "1abc",
            "Lease",
            "a-b",
            "a.b.c",
            ".a",
            "a.",
            "a\"b",
            "a b",
            "a;drop table x",
            "잠금",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableName::parse(&"a".repeat(64)).is_err());
    }

    #[test]
    fn schema_sql_is_idempotent_ddl() {
        let t = TableName::parse("ops.locks").expect("valid");
        let sql = schema_sql(&t);
        assert!(sql.starts_with("CREATE SCHEMA IF NOT EXISTS \"ops\";"));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"ops\".\"locks\""));
    }

    #[test]
    fn statements_use_the_database_clock_only() {
        let s = Statements::new(&TableName::parse("t").expect("valid"));
        for sql in [
            &s.acquire,
            &s.renew,
            &s.release,
            &s.inspect,
            &s.force_release,
        ] {
            assert!(sql.contains("clock_timestamp()"));
            assert!(!sql.contains("now()"), "{sql}");
            assert!(!sql.contains("current_timestamp"), "{sql}");
        }
    }
}
