//! The Lua scripts. Each primitive is one script, so each is atomic on the server and costs
//! one round trip (`EVALSHA`; the script is loaded once after a `NOSCRIPT`).
//!
//! The lease is a string at the lock key with a TTL (`SET ... PX`), one line per field:
//!
//! ```text
//! <owner token, 36 chars>\n<released: 0 or 1>\n<anchor>\n<holder label>
//! ```
//!
//! One string (not a hash) so that acquire is one `SET ... NX PX` and the owner check of
//! renew and release is a prefix comparison: every server-side command counts, since the
//! library's acquire + release must cost what the bare `SET NX PX` + compare-and-delete
//! cost. Holder labels have no control characters, so the label is the whole last line.
//!
//! The anchor says when the lease was taken (`locked_at`, which keep-for counts from):
//!
//! - `~<ttl ms>` as written by acquire: `locked_at` is the key's expiry minus that TTL, so
//!   it holds while the expiry set by acquire stands, and acquire needs no `TIME` (which
//!   measurably slows the script on the hot path);
//! - `<ms>`, the server's Unix time in milliseconds, written by the first renewal (which
//!   moves the expiry) and by a release with keep-for.
//!
//! The fencing counter (`...:fence`, same hash tag) is `INCR`ed only when `SET NX`
//! succeeded, so while a lease is live the counter *is* its holder's fencing token:
//! inspect reads it from there, and the value does not carry it.
//!
//! Times come from the server's `TIME` and `PTTL` (scripts may call `TIME`: Redis >= 5
//! replicates a script's effects, not the script).

use std::sync::LazyLock;

use redis::Script;

/// Acquires one or more leases (concurrent acquires are combined into one run, see
/// `batch.rs`). For request `i`: `KEYS[2i-1]` lock, `KEYS[2i]` fence; `ARGV[3i-2]` owner
/// token, `ARGV[3i-1]` holder label, `ARGV[3i]` ttl in ms.
///
/// Returns one item per request: the fencing token (an integer) when acquired for the
/// TTL asked for; else `{0, holder, pttl}` when held by someone else,
/// `{2, holder, pttl, fencing}` when held by this very token (only a retry after a
/// dropped connection can see that: owner tokens are fresh for every acquisition), and
/// `{3, error}` when the fencing counter failed (nothing taken; the other requests of
/// the run are unaffected). Two
/// requests for one name in one run are served in order: the second finds it held.
pub const ACQUIRE: &str = r"
local out = {}
for i = 1, #KEYS / 2 do
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  local tok, label, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  if redis.call('SET', lock, tok .. '\n0\n~' .. ttl .. '\n' .. label, 'NX', 'PX', ttl) then
    local f = redis.pcall('INCR', fence)
    if type(f) == 'number' then
      out[i] = f
    else
      -- The counter is unusable (wrong type, overflow): take nothing, fail this request only.
      redis.call('DEL', lock)
      out[i] = {3, tostring(f['err'] or f)}
    end
  else
    local v = redis.pcall('GET', lock)
    local pttl = redis.call('PTTL', lock)
    local t, rel, holder
    if type(v) == 'string' then
      t, rel, holder = string.match(v, '^(.-)\n(.)\n[~%d.]+\n(.*)$')
    end
    if t == nil then
      out[i] = {0, '', pttl}
    elseif t == tok and rel == '0' then
      out[i] = {2, holder, pttl, tonumber(redis.pcall('GET', fence)) or 0}
    else
      out[i] = {0, holder, pttl}
    end
  end
end
return out
";

/// `KEYS[i]` lock keys; `ARGV[1]` ttl in ms, `ARGV[i + 1]` the owner token for `KEYS[i]`.
///
/// Returns one integer per key: 1 renewed, 0 lost. A key of the wrong type counts as lost
/// instead of failing the whole batch. A lease renewed for the first time has its
/// `~ttl` anchor replaced by the absolute `locked_at` before its expiry moves (`TIME` at
/// most once per batch).
pub const RENEW: &str = r"
local out = {}
local now
for i, key in ipairs(KEYS) do
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and string.sub(v, 1, 38) == ARGV[i + 1] .. '\n0' then
    local ttl, label = string.match(v, '^~(%d+)\n(.*)$', 40)
    if ttl then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local pttl = redis.call('PTTL', key)
      local locked = now
      if pttl > 0 then locked = now + pttl - tonumber(ttl) end
      redis.call('SET', key, string.sub(v, 1, 39) .. string.format('%.0f', locked) .. '\n' .. label,
        'PX', ARGV[1])
    else
      redis.call('PEXPIRE', key, ARGV[1])
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// Releases one or more leases (combined like acquire). For request `i`: `KEYS[i]`
/// lock; `ARGV[3i-2]` owner token, `ARGV[3i-1]` keep-for in ms, `ARGV[3i]` channel.
///
/// Returns one integer per request: 1 released, 0 not the owner. With keep-for the lease
/// stays until `max(now, locked_at + keep_for)` and is marked released (renew then
/// fails); if that is not in the future it is deleted at once. The fencing counter is
/// never touched.
pub const RELEASE: &str = r"
local out = {}
local now
for i, lock in ipairs(KEYS) do
  local tok, keep, channel = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]) or 0, ARGV[3 * i]
  local v = redis.pcall('GET', lock)
  if type(v) ~= 'string' or string.sub(v, 1, 38) ~= tok .. '\n0' then
    out[i] = 0
  else
    out[i] = 1
    local kept = false
    if keep > 0 then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local locked = now
      local rel_ttl, label = string.match(v, '^~(%d+)\n(.*)$', 40)
      if rel_ttl then
        local pttl = redis.call('PTTL', lock)
        if pttl > 0 then locked = now + pttl - tonumber(rel_ttl) end
      else
        local abs
        abs, label = string.match(v, '^(%d+)\n(.*)$', 40)
        locked = tonumber(abs) or now
      end
      local keep_until = locked + keep
      if keep_until > now and label then
        redis.call('SET', lock, tok .. '\n1\n' .. string.format('%.0f', locked) .. '\n' .. label,
          'PX', keep_until - now)
        kept = true
      end
    end
    if not kept then
      redis.call('DEL', lock)
      redis.call('PUBLISH', channel, '1')
    end
  end
end
return out
";

/// `KEYS[1]` lock, `KEYS[2]` fence.
///
/// Returns `{0}` when free, else `{1, holder, fencing, pttl}` (holder and fencing `''` when
/// missing, for a key this crate did not write).
pub const INSPECT: &str = r"
local v = redis.pcall('GET', KEYS[1])
if v == false or v == nil then return {0} end
local pttl = redis.call('PTTL', KEYS[1])
if type(v) ~= 'string' then return {1, '', '', pttl} end
local tok, rel, holder = string.match(v, '^(.-)\n(.)\n[~%d.]+\n(.*)$')
if tok == nil then return {1, '', '', pttl} end
return {1, holder, redis.call('GET', KEYS[2]) or '', pttl}
";

/// `KEYS[1]` lock; `ARGV[1]` channel. Deletes the lease whoever holds it (the fencing
/// counter stays). Returns 1 if a lease was deleted, 0 if it was free.
pub const FORCE_RELEASE: &str = r"
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
