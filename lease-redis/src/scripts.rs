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
//! Release announces itself on the lease's channel only when the waiting marker
//! (`...:waiting`, same hash tag, with its own TTL) exists: waiters set it after
//! subscribing ([`MARK_WAITING`]), and a release deletes it with the lease in one `DEL`.
//!
//! Times come from the server's `TIME` and `PTTL` (scripts may call `TIME`: Redis >= 5
//! replicates a script's effects, not the script).

use std::sync::LazyLock;

use redis::Script;

/// The body shared by [`ACQUIRE`] and [`ACQUIRE_ONE`]: one acquire, as a Lua function.
macro_rules! acquire_fn {
    () => {
        r"
local function acquire(lock, fence, value, ttl)
  if redis.call('SET', lock, value, 'NX', 'PX', ttl) then
    local f = redis.pcall('INCR', fence)
    if type(f) == 'number' then return f end
    -- The counter is unusable (wrong type, overflow): take nothing, fail this request only.
    redis.call('DEL', lock)
    return {3, tostring(f['err'] or f)}
  end
  local v = redis.pcall('GET', lock)
  local pttl = redis.call('PTTL', lock)
  local t, rel, holder
  if type(v) == 'string' then
    t, rel, holder = string.match(v, '^(.-)\n(.)\n[~%d.]+\n(.*)$')
  end
  if t == nil then return {0, '', pttl} end
  if rel == '0' and t == string.sub(value, 1, #t) and string.sub(value, #t + 1, #t + 1) == '\n' then
    return {2, holder, pttl, tonumber(redis.pcall('GET', fence)) or 0}
  end
  return {0, holder, pttl}
end
"
    };
}

/// Acquires one lease: `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` the lease's value as
/// acquire writes it (`<owner token>\n0\n~<ttl ms>\n<holder label>`, built by the
/// client), `ARGV[2]` ttl in ms.
///
/// Returns the fencing token (an integer) when acquired for the TTL asked for; else
/// `{0, holder, pttl}` when held by someone else, `{2, holder, pttl, fencing}` when held
/// by this very token (only a retry after a dropped connection can see that: owner
/// tokens are fresh for every acquisition), and `{3, error}` when the fencing counter
/// failed (nothing taken).
///
/// On the hot path this is a `SET NX PX` and an `INCR`: the script does no string work
/// of its own, since each Lua operation costs server CPU that the bare `SET NX PX` does
/// not spend.
pub const ACQUIRE_ONE: &str = concat!(
    acquire_fn!(),
    "return acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2])\n"
);

/// Acquires several leases in one run (concurrent acquires combined, see `batch.rs`).
/// For request `i`: `KEYS[2i-1]` lock, `KEYS[2i]` fence; `ARGV[2i-1]` value, `ARGV[2i]`
/// ttl in ms, as for [`ACQUIRE_ONE`]. Returns one item per request, each as
/// [`ACQUIRE_ONE`] returns it. Two requests for one name in one run are served in
/// order: the second finds it held; a failing counter fails only its own request.
pub const ACQUIRE: &str = concat!(
    acquire_fn!(),
    r"local out = {}
for i = 1, #KEYS / 2 do
  out[i] = acquire(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], ARGV[2 * i])
end
return out
"
);

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

/// Releases one lease without keep-for, the common case: `KEYS[1]` lock, `KEYS[2]`
/// waiting marker; `ARGV[1]` the owner token followed by `\n0` (the prefix of a live,
/// unreleased lease of that owner), `ARGV[2]` channel.
///
/// Returns 1 released, 0 not the owner. Publishes on the channel only when a waiter
/// has set the waiting marker ([`MARK_WAITING`]), so that a release nobody waits for
/// costs what the bare compare-and-delete costs, plus deleting a key that is not there.
pub const RELEASE_ONE: &str = r"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and string.sub(v, 1, 38) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 2 then redis.call('PUBLISH', ARGV[2], '1') end
  return 1
end
return 0
";

/// Releases one or more leases, with or without keep-for (combined like acquire). For
/// request `i`: `KEYS[2i-1]` lock, `KEYS[2i]` waiting marker; `ARGV[3i-2]` owner token
/// followed by `\n0`, `ARGV[3i-1]` keep-for in ms, `ARGV[3i]` channel.
///
/// Returns one integer per request: 1 released, 0 not the owner. With keep-for the lease
/// stays until `max(now, locked_at + keep_for)` and is marked released (renew then
/// fails); if that is not in the future it is deleted at once. A deleted lease is
/// announced on the channel when a waiter has set the marker; a kept one is not (its
/// waiters wake at its expiry). The fencing counter is never touched.
pub const RELEASE: &str = r"
local out = {}
local now
for i = 1, #KEYS / 2 do
  local lock, waiting = KEYS[2 * i - 1], KEYS[2 * i]
  local own, keep, channel = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]) or 0, ARGV[3 * i]
  local v = redis.pcall('GET', lock)
  if type(v) ~= 'string' or string.sub(v, 1, 38) ~= own then
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
        redis.call('SET', lock, string.sub(v, 1, 37) .. '1\n' .. string.format('%.0f', locked) .. '\n' .. label,
          'PX', keep_until - now)
        kept = true
      end
    end
    if not kept and redis.call('DEL', lock, waiting) == 2 then
      redis.call('PUBLISH', channel, '1')
    end
  end
end
return out
";

/// Marks a lease as waited for, so that its release is announced: `KEYS[1]` lock,
/// `KEYS[2]` waiting marker; `ARGV[1]` how long the marker must live, in ms.
///
/// Returns the lock's `PTTL` (`-2`: free, and no marker set). Otherwise the marker lives
/// at least `ARGV[1]` ms (a longer life set by another waiter is kept). A waiter
/// subscribes first and marks second, so that a release either comes before the mark
/// (the mark sees the lease free) or after it (the release sees the marker and
/// publishes).
pub const MARK_WAITING: &str = r"
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return pttl end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
end
return pttl
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

/// `KEYS[1]` lock, `KEYS[2]` waiting marker; `ARGV[1]` channel. Deletes the lease
/// whoever holds it (the fencing counter stays) and announces it (always: this is rare).
/// Returns 1 if a lease was deleted, 0 if it was free.
pub const FORCE_RELEASE: &str = r"
redis.call('DEL', KEYS[2])
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], '1')
  return 1
end
return 0
";

pub(crate) static FORCE_RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE));
pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
pub(crate) static ACQUIRE_ONE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_ONE));
pub(crate) static RELEASE_ONE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_ONE));
pub(crate) static MARK_WAITING_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(MARK_WAITING));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
