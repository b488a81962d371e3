//! The Lua scripts. Each primitive is one script, so each is atomic on the server and costs
//! one round trip (`EVALSHA`; the script is loaded once after a `NOSCRIPT`).
//!
//! The lease is a hash at the lock key with a TTL (PEXPIRE):
//!
//! | field       | value                                                    |
//! |-------------|----------------------------------------------------------|
//! | `owner`     | owner token, hyphenated UUID text                        |
//! | `holder`    | holder label                                             |
//! | `fencing`   | fencing token of this acquisition (decimal)              |
//! | `locked_at` | server time of the acquisition, ms since the Unix epoch  |
//! | `released`  | `0`, or `1` once released with keep-for                  |
//!
//! Times come from the server's `TIME` (scripts may call it: Redis >= 5 replicates a
//! script's effects, not the script; `redis.replicate_commands()` is called where it exists
//! for older servers).

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner token, `ARGV[2]` holder label,
/// `ARGV[3]` ttl in ms.
///
/// Returns `{1, fencing, ttl_ms}` when acquired, `{0, holder, pttl}` when held by someone
/// else, and `{2, holder, pttl, fencing}` when held by this very token (only a retry after
/// a dropped connection can see that: owner tokens are fresh for every acquisition).
const ACQUIRE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  local v = redis.pcall('HMGET', KEYS[1], 'owner', 'holder', 'fencing', 'released')
  if type(v) ~= 'table' or v.err ~= nil then return {0, '', pttl} end
  if v[1] == ARGV[1] and v[4] == '0' then
    return {2, v[2] or '', pttl, tonumber(v[3]) or 0}
  end
  return {0, v[2] or '', pttl}
end
local fencing = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'holder', ARGV[2], 'fencing', fencing,
  'locked_at', now, 'released', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fencing, tonumber(ARGV[3])}
";

/// `KEYS[i]` lock keys; `ARGV[1]` ttl in ms, `ARGV[i + 1]` the owner token for `KEYS[i]`.
///
/// Returns one integer per key: 1 renewed, 0 lost. A key of the wrong type counts as lost
/// instead of failing the whole batch.
const RENEW: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.pcall('HMGET', key, 'owner', 'released')
  if type(v) == 'table' and v.err == nil and v[1] == ARGV[i + 1] and v[2] == '0' then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// `KEYS[1]` lock; `ARGV[1]` owner token, `ARGV[2]` keep-for in ms, `ARGV[3]` channel.
///
/// Returns 1 released, 0 not the owner. With keep-for the lease stays until
/// `max(now, locked_at + keep_for)` and is marked released (renew then fails); if that is
/// not in the future it is deleted at once. The fencing counter is never touched.
const RELEASE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.pcall('HMGET', KEYS[1], 'owner', 'released', 'locked_at')
if type(v) ~= 'table' or v.err ~= nil or v[1] ~= ARGV[1] or v[2] ~= '0' then
  return 0
end
local keep = tonumber(ARGV[2]) or 0
if keep > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local keep_until = (tonumber(v[3]) or 0) + keep
  if keep_until > now then
    redis.call('HSET', KEYS[1], 'released', '1')
    redis.call('PEXPIRE', KEYS[1], keep_until - now)
    return 1
  end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '1')
return 1
";

/// `KEYS[1]` lock.
///
/// Returns `{0}` when free, else `{1, holder, fencing, pttl}` (holder and fencing `''` when
/// missing, for a key this crate did not write).
const INSPECT: &str = r"
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {0} end
local v = redis.pcall('HMGET', KEYS[1], 'holder', 'fencing')
if type(v) ~= 'table' or v.err ~= nil then return {1, '', '', pttl} end
return {1, v[1] or '', v[2] or '', pttl}
";

/// `KEYS[1]` lock; `ARGV[1]` channel. Deletes the lease whoever holds it (the fencing
/// counter stays). Returns 1 if a lease was deleted, 0 if it was free.
const FORCE_RELEASE: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], '1')
  return 1
end
return 0
";

pub(crate) static FORCE_RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE));
pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
