//! The Lua scripts, and the layout they share. Each primitive is one script or one
//! pipeline, so each is atomic where it must be and costs one round trip (`EVALSHA`; a
//! script is loaded once after a `NOSCRIPT`).
//!
//! The lease is a hash at the lock key, with the key's TTL as the lease's expiry:
//!
//! ```text
//! <owner token>   -> <anchor>\n<holder label>      while the owner holds it
//! <owner token>:w -> 1                            while someone waits for its release
//! released        -> <locked_at ms>\n<holder label> after a release with keep-for
//! ```
//!
//! A hash keyed by the owner token makes the common release a native command: `HDEL
//! <lock> <token> <token>:w` deletes the fields only if that owner holds the lease (no
//! other lease has fields of that name), and removing the last field deletes the key.
//! Its reply says what it found: 0 not the owner, 1 released, 2 released and waited for. So release is a plain compare-and-delete with no script,
//! and acquire + release cost the server one script run, as the bare `SET NX PX` + Lua
//! compare-and-delete do (every server-side step counts: the library's acquire + release
//! must cost what those bare commands cost). Renewal and the owner check of a kept lease
//! look the field up by token; the holder label has no control characters, so it is the
//! whole last line.
//!
//! The anchor says when the lease was taken (`locked_at`, which keep-for counts from):
//!
//! - `~<ttl ms>` as written by acquire: `locked_at` is the key's expiry minus that TTL, so
//!   it holds while the expiry set by acquire stands, and acquire needs no `TIME` (which
//!   measurably slows the script on the hot path);
//! - `<ms>`, the server's Unix time in milliseconds, written by the first renewal (which
//!   moves the expiry) and by a release with keep-for.
//!
//! The fencing counter (`...:fence`, same hash tag) is `INCR`ed only when the lease was
//! free, so while a lease is live the counter *is* its holder's fencing token: inspect
//! reads it from there, and the lease does not carry it. A counter that does not exist (a
//! new name, or one a restart without persistence lost) starts at the server's clock in
//! microseconds since the Unix epoch, not at 1: tokens then keep rising across a restart
//! that loses the counter, as long as the server's clock has not stepped back by more
//! than the number of acquisitions since the counter was seeded, in microseconds
//! (docs/fencing.md).
//!
//! A release is announced on the lease's channel only when it was waited for: waiters
//! add the `<owner token>:w` field after subscribing (`MARK_WAITING`), it goes with the
//! lease (released or expired), and a release whose `HDEL` removed it then publishes.
//!
//! Times come from the server's `TIME` and `PTTL` (scripts may call `TIME`: Redis >= 5
//! replicates a script's effects, not the script).

use std::sync::LazyLock;

use redis::Script;

/// Acquires one lease: `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner token, `ARGV[2]`
/// the field's value as acquire writes it (`~<ttl ms>\n<holder label>`, built by the
/// client), `ARGV[3]` ttl in ms.
///
/// Returns the fencing token (an integer) when acquired for the TTL asked for; else
/// `{0, holder, pttl}` when held by someone else, `{2, holder, pttl, fencing}` when held
/// by this very token (only a retry after a dropped connection can see that: owner
/// tokens are fresh for every acquisition), and `{3, error}` when the fencing counter or
/// the expiry could not be set (nothing taken). A write the server refuses at the start
/// (`OOM`, `READONLY`, `MISCONF`) is returned as the server's error reply, code and all.
///
/// Three commands when the lease is free: `HSETNX` of the owner's field, `PEXPIRE ... NX`,
/// `INCR` of the counter. Every lease key this crate writes carries a TTL, so `PEXPIRE
/// NX` succeeding means the key was created by this `HSETNX`: the lease was free. On a
/// held lease it fails, and the field just added is taken out again. (This is why the
/// crate needs Redis 7.0 or later; an older server fails the `PEXPIRE` and the script
/// takes nothing. A lock key left without a TTL by hand, with `PERSIST`, would count as
/// free.) A held attempt is a write too (the field goes in and out again): with
/// `appendfsync always` it costs an fsync, and it touches `WATCH`es on the key. A key of
/// another type counts as held; any other refused write (OOM, `READONLY`) is an error.
pub const ACQUIRE: &str = r"
local added = redis.pcall('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if type(added) == 'table' and added['err'] and not string.find(added['err'], '^WRONGTYPE') then
  -- A refused write (OOM, READONLY, MISCONF ...): the server's own error, so that the
  -- client sees its code; never reported as held.
  return added
end
if added == 1 then
  local set = redis.pcall('PEXPIRE', KEYS[1], ARGV[3], 'NX')
  if set == 1 then
    local f = redis.pcall('INCR', KEYS[2])
    if f == 1 then
      -- No counter: a new name, or a restart lost it. Start above every token handed out
      -- before: the server's clock in microseconds (one acquisition per microsecond since
      -- a counter was seeded would be needed to catch up with it).
      local t = redis.call('TIME')
      f = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', KEYS[2], string.format('%.0f', f))
    end
    if type(f) == 'number' then return f end
    redis.call('HDEL', KEYS[1], ARGV[1])
    return {3, 'fencing counter: ' .. tostring(f['err'] or f)}
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
  if set ~= 0 then
    return {3, 'PEXPIRE NX (Redis 7.0 or later is needed): ' .. tostring(set['err'] or set)}
  end
end
local pttl = redis.call('PTTL', KEYS[1])
local h = redis.pcall('HGETALL', KEYS[1])
if type(h) ~= 'table' or h['err'] then return {0, '', pttl} end
for i = 1, #h, 2 do
  if string.sub(h[i], -2) ~= ':w' then
    local label = string.match(h[i + 1], '\n(.*)$') or ''
    if h[i] == ARGV[1] then
      return {2, label, pttl, tonumber(redis.pcall('GET', KEYS[2])) or 0}
    end
    return {0, label, pttl}
  end
end
return {0, '', pttl}
";

/// The loop of [`RENEW`] and [`RENEW_CLUSTER`]: renews `keys[i]` for `tokens[i]` to
/// `ttl_ms`; each script sets the three from its arguments first.
macro_rules! renew_loop {
    () => {
        r"
local out = {}
local now
for i, key in ipairs(keys) do
  local m = redis.pcall('HGET', key, tokens[i])
  if type(m) == 'string' then
    local ttl, label = string.match(m, '^~(%d+)\n(.*)$')
    if ttl then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local pttl = redis.call('PTTL', key)
      local locked = now
      if pttl > 0 then locked = now + pttl - tonumber(ttl) end
      -- The expiry moves first: PEXPIRE needs no memory, and a server at maxmemory
      -- refuses a write that may (HSET) only as a script's first write.
      redis.call('PEXPIRE', key, ttl_ms)
      redis.call('HSET', key, tokens[i], string.format('%.0f', locked) .. '\n' .. label)
    else
      redis.call('PEXPIRE', key, ttl_ms)
    end
    out[i] = 1
  elseif redis.call('EXISTS', key) == 0 then
    -- No such key here: lapsed, or (on a cluster) migrated to another node, which only
    -- a call that declares the key can tell (the server answers ASK or MOVED).
    out[i] = 2
  else
    out[i] = 0
  end
end
return out
"
    };
}

/// `KEYS[i]` lock keys; `ARGV[1]` ttl in ms, `ARGV[i + 1]` the owner token for `KEYS[i]`.
///
/// Returns one integer per key: 1 renewed, 0 lost (another owner's lease, or a key of the
/// wrong type: counted as lost instead of failing the whole batch), 2 lost because the
/// key does not exist (on a cluster the client asks again with the key declared, since
/// the key may have moved to another node). A lease renewed for the first time has its
/// `~ttl` anchor replaced by the absolute `locked_at` (computed before its expiry moves;
/// `TIME` at most once per batch).
///
/// Renewal needs no new memory: at `maxmemory` with `noeviction` the server refuses a
/// command that may grow memory (`HSET`) only when it is a script's first write, and
/// every lease's `PEXPIRE` comes before its `HSET`.
pub const RENEW: &str = concat!(
    r"
local keys, ttl_ms, tokens = KEYS, ARGV[1], {}
for i = 1, #KEYS do tokens[i] = ARGV[i + 1] end",
    renew_loop!()
);

/// [`RENEW`] for one primary of a Redis Cluster, whose leases' keys belong to many slots:
/// `KEYS[1]` the first lease's lock key (declared so that the call is routed to its
/// node); `ARGV[1]` ttl in ms, then each lease's lock key and owner token
/// (`ARGV[2i]`, `ARGV[2i + 1]`), the first lease included. The `allow-cross-slot-keys`
/// flag (Redis 7+) lets the script touch keys of every slot its node serves; a key of a
/// slot served elsewhere fails the whole call, and the client renews that group lease by
/// lease. `allow-oom`: a script with flags is otherwise refused whole at `maxmemory`,
/// where [`RENEW`] (without flags) still runs, since it needs no new memory. Returns what
/// [`RENEW`] returns.
pub const RENEW_CLUSTER: &str = concat!(
    "#!lua flags=allow-cross-slot-keys,allow-oom",
    r"
local ttl_ms, keys, tokens = ARGV[1], {}, {}
for i = 2, #ARGV - 1, 2 do
  keys[#keys + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end",
    renew_loop!()
);

/// Releases one lease with keep-for: `KEYS[1]` lock; `ARGV[1]` owner token, `ARGV[2]`
/// keep-for in ms, `ARGV[3]` channel. (A release without keep-for is the native
/// `HDEL <lock> <token> <token>:w`, no script.)
///
/// Returns 1 released, 0 not the owner. The lease stays until
/// `max(now, locked_at + keep_for)`, under the `released` field (so the owner can neither
/// renew nor release it again); if that is not in the future it is deleted at once, and
/// announced on the channel when it was waited for. A kept lease is not announced (its
/// waiters wake at its expiry). The fencing counter is never touched.
pub const RELEASE_KEEP: &str = r"
local m = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(m) ~= 'string' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local locked = now
local rel_ttl, label = string.match(m, '^~(%d+)\n(.*)$')
if rel_ttl then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then locked = now + pttl - tonumber(rel_ttl) end
else
  local abs
  abs, label = string.match(m, '^(%d+)\n(.*)$')
  locked = tonumber(abs) or now
end
local keep_until = locked + (tonumber(ARGV[2]) or 0)
if keep_until > now and label then
  -- PEXPIRE first: at maxmemory the HSET is then not the script's first write.
  redis.call('PEXPIRE', KEYS[1], keep_until - now)
  redis.call('HSET', KEYS[1], 'released', string.format('%.0f', locked) .. '\n' .. label)
  redis.call('HDEL', KEYS[1], ARGV[1], ARGV[1] .. ':w')
  return 1
end
if redis.call('HDEL', KEYS[1], ARGV[1], ARGV[1] .. ':w') == 2 then
  redis.call('PUBLISH', ARGV[3], '1')
end
return 1
";

/// Marks a lease as waited for, so that its release is announced: `KEYS[1]` lock.
///
/// Returns the lock's `PTTL` (`-2`: free). A held lease gets the `<owner token>:w` field,
/// which lives and dies with it; a lease kept after its release (`released`) is not
/// marked (nobody can release it early: its waiters wake at its expiry). A waiter
/// subscribes first and marks second, so that a release either comes before the mark
/// (the mark sees the lease free) or after it (its `HDEL` removes the mark and it
/// publishes).
pub const MARK_WAITING: &str = r"
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return pttl end
local h = redis.pcall('HGETALL', KEYS[1])
if type(h) == 'table' and not h['err'] then
  for i = 1, #h, 2 do
    local f = h[i]
    if f ~= 'released' and string.sub(f, -2) ~= ':w' then
      redis.call('HSET', KEYS[1], f .. ':w', '1')
      break
    end
  end
end
return pttl
";

/// `KEYS[1]` lock, `KEYS[2]` fence.
///
/// Returns `{0}` when free, else `{1, holder, fencing, pttl}` (holder and fencing `''` when
/// missing, for a key this crate did not write).
pub const INSPECT: &str = r"
local h = redis.pcall('HGETALL', KEYS[1])
if type(h) == 'table' and h['err'] == nil and h[1] == nil then return {0} end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then return {0} end
if type(h) ~= 'table' or h['err'] then return {1, '', '', pttl} end
local f = redis.pcall('GET', KEYS[2])
if type(f) ~= 'string' then f = '' end
for i = 1, #h, 2 do
  if string.sub(h[i], -2) ~= ':w' then
    return {1, string.match(h[i + 1], '\n(.*)$') or '', f, pttl}
  end
end
return {1, '', f, pttl}
";

/// `KEYS[1]` lock; `ARGV[1]` channel. Deletes the lease whoever holds it (the fencing
/// counter stays) and announces it (always: this is rare). Returns 1 if a lease was
/// deleted, 0 if it was free.
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
pub(crate) static RELEASE_KEEP_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_KEEP));
pub(crate) static MARK_WAITING_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(MARK_WAITING));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
/// [`RENEW`] for a Redis Cluster group: the keys of one call belong to several slots of
/// the node it runs on, which the `allow-cross-slot-keys` flag (Redis 7+) allows.
pub(crate) static RENEW_CLUSTER_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RENEW_CLUSTER));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
