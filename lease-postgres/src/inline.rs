//! Statements with their parameters written into the SQL, for servers reached through a
//! transaction pooler (`pooler=transaction`).
//!
//! Behind PgBouncer in transaction mode consecutive protocol messages of one client may
//! reach different server sessions. The extended protocol as sqlx uses it sends a
//! statement's `Parse` and its `Bind`/`Execute` in two steps, each ended by `Sync`, and
//! the pooler may hand each step to another session ("prepared statement does not
//! exist"), named or unnamed. So in that mode every statement goes as one simple-protocol
//! `Query` message, self-contained, with its parameters as literals.
//!
//! The literals can carry nothing but what they stand for: bytes as `decode('<hex>',
//! 'hex')`, text as `convert_from(decode('<hex>', 'hex'), 'UTF8')`, UUIDs as their
//! hyphenated form and integers as digits. No part of a parameter reaches the SQL
//! unencoded, whatever the server's `standard_conforming_strings`.

use std::fmt::Write;

/// One parameter of a statement.
#[derive(Debug)]
pub(crate) enum Param<'a> {
    Bytea(&'a [u8]),
    Text(&'a str),
    Uuid(uuid::Uuid),
    Int(i64),
    ByteaArray(&'a [&'a [u8]]),
    UuidArray(&'a [uuid::Uuid]),
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    out.push_str("decode('");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push_str("', 'hex')");
}

impl Param<'_> {
    fn write(&self, out: &mut String) {
        match self {
            Param::Bytea(b) => push_hex(out, b),
            Param::Text(s) => {
                out.push_str("convert_from(");
                push_hex(out, s.as_bytes());
                out.push_str(", 'UTF8')");
            }
            Param::Uuid(u) => {
                let _ = write!(out, "'{}'::uuid", u.hyphenated());
            }
            Param::Int(i) => {
                let _ = write!(out, "({i})::bigint");
            }
            Param::ByteaArray(items) => {
                if items.is_empty() {
                    out.push_str("'{}'::bytea[]");
                    return;
                }
                out.push_str("ARRAY[");
                for (i, b) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_hex(out, b);
                }
                out.push(']');
            }
            Param::UuidArray(items) => {
                if items.is_empty() {
                    out.push_str("'{}'::uuid[]");
                    return;
                }
                out.push_str("ARRAY[");
                for (i, u) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "'{}'::uuid", u.hyphenated());
                }
                out.push(']');
            }
        }
    }
}

/// `sql` with each placeholder `$N` replaced by `params[N - 1]` as a literal, in
/// parentheses. The statements of this crate use `$` for placeholders only. A
/// placeholder without a parameter is left as it is (the server then rejects the
/// statement).
pub(crate) fn inline(sql: &str, params: &[Param<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let digits = bytes[i + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let param = sql
                .get(i + 1..i + 1 + digits)
                .and_then(|d| d.parse::<usize>().ok())
                .and_then(|n| n.checked_sub(1))
                .and_then(|n| params.get(n));
            if let Some(p) = param {
                out.push('(');
                p.write(&mut out);
                out.push(')');
                i += 1 + digits;
                continue;
            }
        }
        // Copy one whole character (the SQL is ASCII, but stay correct for any UTF-8).
        let ch_len = sql[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&sql[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_parameter_as_an_encoded_literal() {
        let token = uuid::Uuid::nil();
        let sql = inline(
            "SELECT $1, $2, $3, $4, $10, $1",
            &[
                Param::Bytea(b"a'\\"),
                Param::Text("it's \u{c7a0}"),
                Param::Uuid(token),
                Param::Int(-5),
            ],
        );
        assert_eq!(
            sql,
            "SELECT (decode('61275c', 'hex')), (convert_from(decode('6974277320ec9ea0', 'hex'), 'UTF8')), \
             ('00000000-0000-0000-0000-000000000000'::uuid), ((-5)::bigint), $10, (decode('61275c', 'hex'))"
        );
        let names: [&[u8]; 2] = [b"x", b""];
        let sql = inline(
            "f($1::bytea[], $2::uuid[], $3)",
            &[
                Param::ByteaArray(&names),
                Param::UuidArray(&[token]),
                Param::ByteaArray(&[]),
            ],
        );
        assert_eq!(
            sql,
            "f((ARRAY[decode('78', 'hex'),decode('', 'hex')])::bytea[], \
             (ARRAY['00000000-0000-0000-0000-000000000000'::uuid])::uuid[], ('{}'::bytea[]))"
        );
    }
}
