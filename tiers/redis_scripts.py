"""The shared L1's bookkeeping in Redis: Lua scripts that admit, evict and index entries per shard, atomically.

Each script works inside one shard, whose keys all carry the shard's Cluster hash tag (``B`` = ``P:{sN}``, see
:mod:`tiers.redis_store`), so one script call is atomic on standalone Redis and on a Cluster alike. Scripts
build the names of the entries they touch from ``B`` (same slot as the keys they declare).

Per shard::

    B:v:K   string  K's value (raw or lz4, see the record's flags), expiring with the entry (PX)
    B:e     hash    K -> record "size cost reads expires_ms evicted_ms flags\\n<indexed tags>\\n<other tags>"
                    (tags as JSON arrays; size = stored bytes; expires/evicted 0 = none)
    B:q     zset    live K -> GreedyDual deadline (the policy's queue)
    B:z     zset    tombstoned K -> when its tombstone may go (ms, Redis's clock)
    B:m     hash    used (bytes charged against the budget), off (rent charged per byte so far)
    B:t:T   set     keys of the entries carrying indexed tag T

The policy is :class:`tiers.policies.greedydual.GreedyDualPolicy` with ``frequency=True, bypass=True`` (the main
cache of the product's ``bpcache``), step for step, so the two agree entry for entry
(``tests/test_redis_admission.py``): a newcomer's deadline is ``off + cost / size``; a hit raises it to
``off + cost * reads / size``; to make room the lowest deadline leaves and ``off`` moves to it, and a newcomer
whose own deadline would come first is not admitted (bypass). Numbers cross the script boundary as ``%.17g``
text, which round-trips doubles exactly.

Tombstones: an entry pushed out by the policy, by Redis's ``maxmemory`` or by an overwrite keeps its record
(tags included) for ``grace`` ms after its value is gone, outside the budget. Near copies on replicas may
outlive the value by up to ``near_ttl_s``; while the record is there an invalidation by tag still finds the key
and broadcasts it. ``PUT`` returns the keys it left tombstones for, so that the caller can have every replica
drop its copies and then ``RELEASE`` them early. An entry past its TTL leaves no tombstone (no near copy
outlives the TTL).

Reaping: records whose value is gone are settled when read, when a ``put`` probes ``probes`` random records
of the shard, and when tombstones fall due (``put`` takes up to 8 per call), so the records stay bounded by the
budget plus the tombstones of the last ``grace`` ms.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_PRELUDE = r"""
local BASE = ARGV[1]
local E, Q, M, Z = BASE .. ':e', BASE .. ':q', BASE .. ':m', BASE .. ':z'
local function vkey(key) return BASE .. ':v:' .. key end
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function parse(rec)
  local s, c, r, x, d, f, rest = string.match(rec, '^(%d+) (%S+) (%d+) (%d+) (%d+) (%d+)\n(.*)$')
  return {size = tonumber(s), cost = tonumber(c), reads = tonumber(r), expires = tonumber(x),
          evicted = tonumber(d), flags = f, rest = rest}
end
local function encode(p)
  return int(p.size) .. ' ' .. num(p.cost) .. ' ' .. int(p.reads) .. ' ' .. int(p.expires) .. ' ' ..
    int(p.evicted) .. ' ' .. p.flags .. '\n' .. p.rest
end
local function unindex(key, p)
  local itags = string.match(p.rest, '^([^\n]*)')
  if itags ~= '[]' then
    for _, tag in ipairs(cjson.decode(itags)) do redis.call('SREM', BASE .. ':t:' .. tag, key) end
  end
end
-- the record goes entirely; returns the bytes it held against the budget
local function forget(key, p)
  redis.call('HDEL', E, key)
  redis.call('ZREM', Q, key)
  redis.call('ZREM', Z, key)
  unindex(key, p)
  if p.evicted > 0 then return 0 end
  return p.size
end
-- K's value is gone (deleted by the caller, expired, or evicted by Redis): expired entries go, others leave a
-- tombstone for `grace` ms; returns the bytes freed from the budget and whether a tombstone was left
local function settle(key, p, now, grace)
  if p.evicted > 0 then
    if now >= p.evicted + grace then forget(key, p) end
    return 0, false
  end
  if grace <= 0 or (p.expires > 0 and now >= p.expires) then return forget(key, p), false end
  p.evicted = now
  redis.call('HSET', E, key, encode(p))
  redis.call('ZREM', Q, key)
  redis.call('ZADD', Z, int(now + grace), key)
  return p.size, true
end
local function used_now() return tonumber(redis.call('HGET', M, 'used') or '0') end
local function offset_now() return tonumber(redis.call('HGET', M, 'off') or '0') end
"""

_PUT = r"""
-- ARGV: base, key, value, ttl_ms, cost, capacity (0: none), flags, grace_ms, probes, indexed tags (JSON),
-- other tags (JSON), indexed tag...
local key, value = ARGV[2], ARGV[3]
local ttl, cost, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local flags, grace, probes = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()
local used, offset = used_now(), offset_now()
local tombs = {}
local old = redis.call('HGET', E, key)
if old then
  redis.call('DEL', vkey(key))
  local freed, tomb = settle(key, parse(old), now, grace)
  used = used - freed
  if tomb then table.insert(tombs, key) end
end
for _, due in ipairs(redis.call('ZRANGEBYSCORE', Z, '-inf', now, 'LIMIT', 0, 8)) do
  local rec = redis.call('HGET', E, due)
  if rec then settle(due, parse(rec), now, grace) else redis.call('ZREM', Z, due) end
end
if probes > 0 then
  for _, other in ipairs(redis.call('HRANDFIELD', E, probes)) do
    if other ~= key and redis.call('EXISTS', vkey(other)) == 0 then
      local rec = redis.call('HGET', E, other)
      if rec then
        local freed, tomb = settle(other, parse(rec), now, grace)
        used = used - freed
        if tomb then table.insert(tombs, other) end
      end
    end
  end
end
local size = string.len(value)
local deadline = offset + cost / math.max(size, 1)
local admitted, evictions = 1, 0
local function evict(victim)
  local rec = redis.call('HGET', E, victim)
  if not rec then
    redis.call('ZREM', Q, victim)
    return 0
  end
  redis.call('DEL', vkey(victim))
  evictions = evictions + 1
  local freed, tomb = settle(victim, parse(rec), now, grace)
  if tomb then table.insert(tombs, victim) end
  return freed
end
if cap > 0 then
  if size > cap then
    admitted = 0
  elseif used + size > cap then
    while used + size > cap do
      local head = redis.call('ZRANGE', Q, 0, 0, 'WITHSCORES')
      if #head == 0 then used = 0 break end
      local due = tonumber(head[2])
      if deadline <= due then
        offset = deadline
        admitted = 0
        break
      end
      offset = due
      used = used - evict(head[1])
    end
    while true do
      local head = redis.call('ZRANGE', Q, 0, 0, 'WITHSCORES')
      if #head == 0 or tonumber(head[2]) > offset then break end
      used = used - evict(head[1])
    end
  end
end
if admitted == 1 then
  local tomb = redis.call('HGET', E, key)
  if tomb then forget(key, parse(tomb)) end
  if tombs[1] == key then table.remove(tombs, 1) end
  local expires = 0
  if ttl > 0 then
    redis.call('SET', vkey(key), value, 'PX', ttl)
    expires = now + ttl
  else
    redis.call('SET', vkey(key), value)
  end
  redis.call('HSET', E, key, encode({size = size, cost = cost, reads = 1, expires = expires, evicted = 0,
                                     flags = flags, rest = ARGV[10] .. '\n' .. ARGV[11]}))
  redis.call('ZADD', Q, num(deadline), key)
  for i = 12, #ARGV do redis.call('SADD', BASE .. ':t:' .. ARGV[i], key) end
  used = used + size
end
if used < 0 then used = 0 end
redis.call('HSET', M, 'used', int(used), 'off', num(offset))
local out = {admitted, evictions}
for _, tomb in ipairs(tombs) do table.insert(out, tomb) end
return out
"""

_GET = r"""
-- ARGV: base, key, grace_ms. Returns {value, pttl, flags} or nil; a hit raises the entry's deadline.
local key, grace = ARGV[2], tonumber(ARGV[3])
local value = redis.call('GET', vkey(key))
local rec = redis.call('HGET', E, key)
if not value then
  if rec then
    local freed = settle(key, parse(rec), now_ms(), grace)
    if freed > 0 then redis.call('HSET', M, 'used', int(math.max(0, used_now() - freed))) end
  end
  return false
end
local pttl = redis.call('PTTL', vkey(key))
local flags = '0'
if rec then
  local p = parse(rec)
  flags = p.flags
  if p.evicted == 0 then
    p.reads = p.reads + 1
    redis.call('ZADD', Q, num(offset_now() + p.cost * p.reads / math.max(p.size, 1)), key)
    redis.call('HSET', E, key, encode(p))
  end
end
return {value, pttl, flags}
"""

_DELETE = r"""
-- ARGV: base, key... Removes the entries and their tombstones; returns how many values existed.
local removed, freed = 0, 0
for i = 2, #ARGV do
  local key = ARGV[i]
  removed = removed + redis.call('DEL', vkey(key))
  local rec = redis.call('HGET', E, key)
  if rec then freed = freed + forget(key, parse(rec)) end
end
if freed > 0 then redis.call('HSET', M, 'used', int(math.max(0, used_now() - freed))) end
return removed
"""

_FILTER = r"""
-- ARGV: base, include tombstones ('1'/'0'), key... Returns the keys whose value is live, and with '1' also those
-- whose value is gone before their TTL (policy or Redis eviction, overwrite: near copies may still exist).
local include = ARGV[2] == '1'
local now = now_ms()
local out = {}
for i = 3, #ARGV do
  local key = ARGV[i]
  if redis.call('EXISTS', vkey(key)) == 1 then
    table.insert(out, key)
  elseif include then
    local rec = redis.call('HGET', E, key)
    if rec then
      local p = parse(rec)
      if p.evicted > 0 or p.expires == 0 or now < p.expires then table.insert(out, key) end
    end
  end
end
return out
"""

_RELEASE = r"""
-- ARGV: base, key... Drops the tombstones of these keys (every replica has dropped its near copies).
for i = 2, #ARGV do
  local rec = redis.call('HGET', E, ARGV[i])
  if rec then
    local p = parse(rec)
    if p.evicted > 0 then forget(ARGV[i], p) end
  end
end
return 1
"""

_CLEAR = r"""
-- ARGV: base, limit. Removes up to `limit` records with their values; returns {values removed, records left}.
local removed = 0
for _, key in ipairs(redis.call('HRANDFIELD', E, tonumber(ARGV[2]))) do
  removed = removed + redis.call('DEL', vkey(key))
  local rec = redis.call('HGET', E, key)
  if rec then forget(key, parse(rec)) end
end
local left = redis.call('HLEN', E)
if left == 0 then redis.call('DEL', M, Q, Z) end
return {removed, left}
"""


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1 (for ``EVALSHA``)."""

    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())


PUT = Script(_PRELUDE + _PUT)
GET = Script(_PRELUDE + _GET)
DELETE = Script(_PRELUDE + _DELETE)
FILTER = Script(_PRELUDE + _FILTER)
RELEASE = Script(_PRELUDE + _RELEASE)
CLEAR = Script(_PRELUDE + _CLEAR)
