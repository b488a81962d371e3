//! The resource side of fencing for data in Redis: a write runs in one script with the
//! check, so that it happens only if its fencing token is not below the highest token
//! stored in the resource's fence key, and the token is stored with it, atomically.
//!
//! [`RedisFence`] has `SET`, `HSET` and `XADD` ready made and runs a script body of the
//! caller's own ([`FencedScript`]). The fence key holds the highest token as a decimal
//! string, with no TTL. On a cluster, the fence key and the data keys of one write must
//! share a hash slot: give them the same hash tag (`{orders}:fence`, `{orders}:last`).
//!
//! ```no_run
//! # async fn f(mut conn: lease_redis::redis::aio::MultiplexedConnection, guard: lease_core::LeaseGuard) -> Result<(), lease_core::Error> {
//! use lease_redis::fence::RedisFence;
//!
//! let fence = RedisFence::new("{report}:fence");
//! // Error::Fenced if a newer holder has written: nothing is written then.
//! fence.set(&mut conn, "{report}:latest", b"2026-11-26", guard.fencing()).await?;
//! # Ok(()) }
//! ```
//!
//! Tokens compare as decimal numbers of any length (a `u64`), not as Lua numbers.
//! Least privilege (ACL): the writer needs `EVALSHA`, `EVAL` (the first run of a script,
//! and after the server lost its script cache) and the commands the body runs, on the
//! fence key and the data keys: `+evalsha +eval +get +set ~{report}:*`.

use std::sync::LazyLock;

use lease_core::{Error, FencingToken};
use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Script, Value};

use crate::error::{convert, unexpected};
use crate::reply::text;

/// The check run before a fenced body: `KEYS[#KEYS]` is the fence key, `ARGV[#ARGV]` the
/// token. The body runs as a function of the caller's keys and arguments (the fence key
/// and the token are still at the end of `KEYS` and `ARGV`; `#KEYS - 1` and `#ARGV - 1`
/// count the caller's own).
const PRELUDE: &str = r"
local fence_key = KEYS[#KEYS]
local token = ARGV[#ARGV]
local seen = redis.call('GET', fence_key)
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
if seen and below(token, seen) then return {0, seen} end
if not seen or below(seen, token) then redis.call('SET', fence_key, token) end
local function body()
";

const EPILOGUE: &str = r"
end
return {1, body()}
";

/// A script body of the caller's own, run only if the token passes the fence.
///
/// The body is Lua, as in `EVAL`; it sees `KEYS` and `ARGV` with the caller's keys and
/// arguments first (the fence key and the token last) and its `return` value is the
/// call's result.
///
/// ```no_run
/// # async fn f(mut conn: lease_redis::redis::aio::MultiplexedConnection, token: lease_core::FencingToken) -> Result<(), lease_core::Error> {
/// use lease_redis::fence::{FencedScript, RedisFence};
///
/// // Move the batch's cursor and record the push, both or neither.
/// let script = FencedScript::new(
///     "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('RPUSH', KEYS[2], ARGV[2])",
/// );
/// let fence = RedisFence::new("{push}:fence");
/// let len: i64 = fence
///     .run(&mut conn, &script, &["{push}:cursor", "{push}:sent"], &[b"1042", b"user-7"], token)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FencedScript {
    script: Script,
}

impl FencedScript {
    /// Wraps `body` in the fence's check.
    pub fn new(body: &str) -> Self {
        FencedScript {
            script: Script::new(&format!("{PRELUDE}{body}{EPILOGUE}")),
        }
    }
}

static SET: LazyLock<FencedScript> =
    LazyLock::new(|| FencedScript::new("return redis.call('SET', KEYS[1], ARGV[1])"));
static HSET: LazyLock<FencedScript> =
    LazyLock::new(|| FencedScript::new("return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])"));
static XADD: LazyLock<FencedScript> = LazyLock::new(|| {
    FencedScript::new("return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 1, #ARGV - 1))")
});

/// The fence of one protected resource: the key that holds its highest token.
#[derive(Clone, Debug)]
pub struct RedisFence {
    key: String,
}

impl RedisFence {
    /// The fence whose highest token is kept in `fence_key`.
    pub fn new(fence_key: impl Into<String>) -> Self {
        RedisFence {
            key: fence_key.into(),
        }
    }

    /// The fence key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `SET key value` if `token` passes the fence.
    ///
    /// Errors: [`Error::Fenced`] for a stale token (nothing written); the connection's
    /// errors as the backend's.
    ///
    /// Cancel safety: dropped while in flight, the write may or may not have happened
    /// (as with any Redis command); calling it again with the same token is safe.
    pub async fn set<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        value: &[u8],
        token: FencingToken,
    ) -> Result<(), Error> {
        let _: Value = self.run(conn, &SET, &[key], &[value], token).await?;
        Ok(())
    }

    /// `HSET key field value` if `token` passes the fence. Errors and cancel safety as
    /// [`RedisFence::set`].
    pub async fn hset<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        field: &[u8],
        value: &[u8],
        token: FencingToken,
    ) -> Result<(), Error> {
        let _: Value = self
            .run(conn, &HSET, &[key], &[field, value], token)
            .await?;
        Ok(())
    }

    /// `XADD key * field value ...` if `token` passes the fence; returns the entry's id.
    /// Errors and cancel safety as [`RedisFence::set`].
    pub async fn xadd<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        fields: &[(&[u8], &[u8])],
        token: FencingToken,
    ) -> Result<String, Error> {
        let args: Vec<&[u8]> = fields.iter().flat_map(|(f, v)| [*f, *v]).collect();
        self.run(conn, &XADD, &[key], &args, token).await
    }

    /// Runs `script` with `keys` and `args` if `token` passes the fence; returns what the
    /// body returned. Errors and cancel safety as [`RedisFence::set`].
    pub async fn run<C: ConnectionLike + Send, T: FromRedisValue>(
        &self,
        conn: &mut C,
        script: &FencedScript,
        keys: &[&str],
        args: &[&[u8]],
        token: FencingToken,
    ) -> Result<T, Error> {
        const OP: &str = "fenced write";
        let mut inv = script.script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        inv.key(&self.key);
        for a in args {
            inv.arg(*a);
        }
        inv.arg(token.get());
        let reply: Value = inv
            .invoke_async(conn)
            .await
            .map_err(|e| convert(OP, std::time::Duration::ZERO, e))?;
        let Value::Array(mut items) = reply else {
            return Err(unexpected(OP, "the fence's reply is not an array"));
        };
        let result = if items.len() > 1 {
            items.swap_remove(1)
        } else {
            Value::Nil
        };
        match items.first() {
            Some(Value::Int(1)) => redis::from_redis_value(result)
                .map_err(|e| unexpected(OP, format!("the body's result: {e}"))),
            Some(Value::Int(0)) => {
                let highest = text(&result)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| unexpected(OP, "the fence key does not hold a token"))?;
                Err(Error::Fenced {
                    resource: self.key.clone(),
                    token: token.get(),
                    highest,
                })
            }
            _ => Err(unexpected(OP, "the fence's reply has no verdict")),
        }
    }

    /// The highest token stored in the fence key, if any.
    ///
    /// Cancel safety: cancel-safe (a read).
    pub async fn highest<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<Option<FencingToken>, Error> {
        let v: Option<String> = redis::cmd("GET")
            .arg(&self.key)
            .query_async(conn)
            .await
            .map_err(|e| convert("fence read", std::time::Duration::ZERO, e))?;
        v.map(|s| {
            s.parse()
                .map(FencingToken)
                .map_err(|_| unexpected("fence read", "the fence key does not hold a token"))
        })
        .transpose()
    }
}
