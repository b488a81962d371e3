//! The SQL of the table mode, built once per backend for its table.
//!
//! Every statement reads the time with `clock_timestamp()` (the server's wall clock at the
//! moment of the call), never `now()` (the start of the surrounding transaction) and
//! never the client's clock. (Acquire also compares with `statement_timestamp()`, only
//! to tell a lease it took from one the same token took before, never to decide expiry.)

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
    /// Schema-qualified and unquoted, e.g. `locks.lease_locks` (`public.lease_locks` for
    /// `lease_locks`).
    plain: String,
    /// Schema part (`public` when not given).
    schema: String,
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
        // An unqualified name means schema `public`, never "the first schema on the
        // search_path": roles with different search paths (a role with a schema of its
        // own name has it first by default) must find the same table, or two of them
        // could each hold the same lease in a table of their own.
        let (schema, name) = match parts.as_slice() {
            [schema, name] => (*schema, *name),
            [name] => ("public", *name),
            _ => return Err(invalid()),
        };
        Ok(TableName {
            plain: format!("{schema}.{name}"),
            schema: schema.to_owned(),
            quoted: format!("\"{schema}\".\"{name}\""),
        })
    }

    pub(crate) fn plain(&self) -> &str {
        &self.plain
    }

    /// Quoted for SQL, e.g. `"locks"."lease_locks"`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
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

/// A query whose one row says whether `table` exists (`to_regclass` needs no privilege
/// on the table or its schema).
pub(crate) fn table_exists_sql(table: &TableName) -> String {
    // Names are [a-z0-9_] only (see `valid_identifier`): safe inside a string literal.
    format!("SELECT to_regclass('{}') IS NOT NULL", table.quoted)
}

/// The DDL for `table`: `CREATE SCHEMA IF NOT EXISTS` (for a schema other than `public`)
/// and `CREATE TABLE IF NOT EXISTS`, separated by `;`.
pub(crate) fn schema_sql(table: &TableName) -> String {
    let mut sql = String::new();
    if table.schema != "public" {
        sql.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\";\n",
            table.schema
        ));
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
        // One statement that always returns one row. First a plain read (`live`): when
        // the row is live (`lock_until > now`), the statement writes nothing and reports
        // its holder and remaining time from that read. Only otherwise (no row, or
        // released or expired) does it upsert: `EXCLUDED.locked_at` is one reading of
        // clock_timestamp(), taken when the insert runs, and every column decides on it:
        // a free row is taken (new owner, fencing + 1, new expiry); a row another
        // statement took since the read is written back unchanged, and RETURNING then
        // reports its holder, in the same statement.
        //
        // Why the read first: an upsert of a live row locks it and writes it back, so
        // every attempt on a held lease was a write, holding the row's lock until its
        // commit (on a server with default durability, until its WAL flush). Attempts on
        // one name queued on that lock one commit after another, and the holder's renewal
        // (an UPDATE of the same row) waited behind them: in the lab's 1,000-contender
        // scenario with a 100 ms lease on such a server, the holder lost its lease in 2 of
        // 8 runs and its smallest renewal margin was 7 to 31 ms; with the read, 8 of 8
        // kept it with 42 to 53 ms. A read takes no lock and writes nothing
        // (`a_held_attempt_neither_waits_for_nor_writes_the_row`); the free path costs one
        // more index probe of the same row.
        //
        // `acquired` is true only for the row this statement took: its owner is ours and
        // its `locked_at` is this statement's clock reading, kept not earlier than
        // `statement_timestamp()` (the statement's start) even if the clock steps back.
        // A lease this same token took in an earlier statement has an earlier
        // `locked_at`, so it is reported as held, as the trait asks. (Two calls with the
        // same token at the same moment can both be told Acquired; `LeaseClient` uses a
        // fresh token for every call.) The upsert's clock reading is taken before any
        // wait for the row's lock, so an acquire that waited may call held a lease that
        // lapsed during the wait: the safe direction. `live` is referenced twice, so it
        // is computed once: exactly one of its row and the upsert's row is returned.
        let acquire = format!(
            "WITH live AS (\n\
             \x20 SELECT fencing, holder, lock_until FROM {t}\n\
             \x20 WHERE name = $1::bytea AND lock_until > clock_timestamp()\n\
             ), taken AS (\n\
             \x20 INSERT INTO {t} AS l (name, owner_token, holder, fencing, locked_at, lock_until, released)\n\
             \x20 SELECT $1::bytea, $2::uuid, $3::text, 1, GREATEST(clock_timestamp(), statement_timestamp()), clock_timestamp() + $4::bigint * interval '1 millisecond', false\n\
             \x20 WHERE NOT EXISTS (SELECT FROM live)\n\
             \x20 ON CONFLICT (name) DO UPDATE SET\n\
             \x20   owner_token = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN EXCLUDED.owner_token ELSE l.owner_token END,\n\
             \x20   holder = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN EXCLUDED.holder ELSE l.holder END,\n\
             \x20   fencing = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN l.fencing + 1 ELSE l.fencing END,\n\
             \x20   locked_at = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN EXCLUDED.locked_at ELSE l.locked_at END,\n\
             \x20   lock_until = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN EXCLUDED.lock_until ELSE l.lock_until END,\n\
             \x20   released = CASE WHEN l.lock_until <= EXCLUDED.locked_at THEN false ELSE l.released END\n\
             \x20 RETURNING COALESCE(l.owner_token = $2::uuid AND l.locked_at >= statement_timestamp(), false) AS acquired, l.fencing, l.holder,\n\
             \x20   (extract(epoch FROM l.lock_until - clock_timestamp()) * 1000000)::bigint AS remaining_us\n\
             )\n\
             SELECT acquired, fencing, holder, remaining_us FROM taken\n\
             UNION ALL\n\
             SELECT false, fencing, holder, (extract(epoch FROM lock_until - clock_timestamp()) * 1000000)::bigint FROM live"
        );
        // $1 names, $2 tokens (deduplicated by the caller), $3 ttl in ms. Returns the
        // 1-based ordinals of the renewed pairs.
        //
        // The liveness test is written as a join condition (`OR b.i IS NULL`, never true:
        // ordinals start at 1) so that the planner cannot estimate it on the table alone.
        // As a plain filter on `l`, statistics gathered while most rows were released
        // (the normal state of a lock table) made it estimate one live row, and the
        // cached generic plan of this prepared statement then scanned the table once and
        // the whole batch for every row: with 100,000 rows and a batch of 10,000, over
        // 30 s instead of 0.1 s. Joined on name and token only, every plan the planner
        // picks for any table size (hash join, or the batch driving the primary key) is
        // linear in table + batch; `batch_renewal_survives_stale_statistics` shows it.
        let renew = format!(
            "UPDATE {t} AS l SET lock_until = clock_timestamp() + $3 * interval '1 millisecond'\n\
             FROM unnest($1::bytea[], $2::uuid[]) WITH ORDINALITY AS b(name, token, i)\n\
             WHERE l.name = b.name AND l.owner_token = b.token\n\
             \x20 AND (NOT l.released AND l.lock_until > clock_timestamp() OR b.i IS NULL)\n\
             RETURNING b.i"
        );
        // $1 name, $2 token, $3 keep-for in ms. The channel and payload prefix are
        // literals (fewer parameters to send on the hot path; both are [a-z0-9_. ]).
        // keep-for zero (or already elapsed): lock_until becomes now, the lease is free.
        // The row stays, so the fencing counter never resets. One plain UPDATE without
        // RETURNING (a RETURNING costs the server a result store per call): its row count
        // says whether this owner held the lease. A lease freed now is announced with
        // pg_notify, delivered when the statement commits, but only when someone waits for
        // it (`waiters` > 0): NOTIFY serialises commits database-wide (it takes a global
        // lock at commit), which halved throughput under concurrency. The call sits in
        // the assignment of `waiters`, which keeps its value either way; the outer CASE
        // runs pg_notify only when a waiter is registered and the lease is freed now.
        // If a concurrent update makes the row fail its recheck, the notification may
        // go out for a release that changed nothing: a waiter then wakes early and finds
        // the lease held, which waiting allows.
        let notify = |name: &str| {
            format!(
                "pg_notify('{RELEASE_CHANNEL}', '{}' || encode({name}, 'hex'))",
                table.payload_prefix()
            )
        };
        let release = format!(
            "UPDATE {t} SET owner_token = NULL, released = true,\n\
             \x20 lock_until = GREATEST(clock_timestamp(), locked_at + $3 * interval '1 millisecond'),\n\
             \x20 waiters = CASE WHEN waiters > 0 AND locked_at + $3 * interval '1 millisecond' <= clock_timestamp()\n\
             \x20   THEN CASE WHEN {} IS NULL THEN waiters ELSE waiters END ELSE waiters END\n\
             WHERE name = $1 AND owner_token = $2 AND NOT released AND lock_until > clock_timestamp()",
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
            Ok("\"public\".\"lease_locks\"".into()),
            "an unqualified name is in schema public, whatever the search_path"
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
        // No CREATE SCHEMA for public: it needs the CREATE privilege on the database even
        // when the schema exists.
        let sql = schema_sql(&TableName::parse("locks").expect("valid"));
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS \"public\".\"locks\""));
        assert_eq!(
            table_exists_sql(&t),
            "SELECT to_regclass('\"ops\".\"locks\"') IS NOT NULL"
        );
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
