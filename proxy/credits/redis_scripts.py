"""The Lua scripts of :mod:`proxy.credits.redis_store`: one per operation, so every check-and-write is atomic.

Every script touches only one user's keys (all tagged ``{user}``, so they share a Redis Cluster slot). Amounts
are integer micro-credits; computed values are written back through ``int()`` (``%d``) because Lua would print
large numbers in exponent form, which ``HINCRBY`` rejects. Lua numbers are exact up to 2**53 micro-credits.
"""

from __future__ import annotations

_INT = "local function int(x) return string.format('%d', x) end\n"

RESERVE = (
    _INT
    + """
-- KEYS: account, holds (zset rid -> deadline ms), hold amounts (hash rid -> amount), closed marker of rid
-- ARGV: request id, amount, deadline ms
local rid, amount = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[4]) == 1 then return {-1, 0, 0, 0} end
local available = tonumber(redis.call('HGET', KEYS[1], 'available') or '0')
local held = redis.call('HGET', KEYS[3], rid)
if held then
  return {1, tonumber(held), available, tonumber(redis.call('ZSCORE', KEYS[2], rid))}
end
if redis.call('EXISTS', KEYS[1]) == 0 or available < amount then return {0, amount, available, 0} end
redis.call('HINCRBY', KEYS[1], 'available', int(-amount))
redis.call('HINCRBY', KEYS[1], 'held', int(amount))
redis.call('HSET', KEYS[3], rid, int(amount))
redis.call('ZADD', KEYS[2], ARGV[3], rid)
return {1, amount, available - amount, tonumber(ARGV[3])}
"""
)

SETTLE = (
    _INT
    + """
-- KEYS: account, holds, hold amounts, closed marker of rid, ledger stream
-- ARGV: request id, actual, now ms, retention s, tenant, model, tier, prompt, completion, cached,
--       usage source
local rid, actual = ARGV[1], tonumber(ARGV[2])
local closed = redis.call('GET', KEYS[4])
local available = tonumber(redis.call('HGET', KEYS[1], 'available') or '0')
if closed then
  return {'duplicate', tonumber(string.match(closed, ':(%-?%d+)$')), available, 0}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[4], 'no_account:0', 'EX', ARGV[4])
  return {'no_account', 0, 0, 0}
end
local hold_text = redis.call('HGET', KEYS[3], rid)
local hold = tonumber(hold_text or '0')
local charged = math.min(actual, hold + available)
available = available + hold - charged
local held = tonumber(redis.call('HINCRBY', KEYS[1], 'held', int(-hold)))
redis.call('HSET', KEYS[1], 'available', int(available))
redis.call('HDEL', KEYS[3], rid)
redis.call('ZREM', KEYS[2], rid)
redis.call('SET', KEYS[4], 'settled:' .. int(charged), 'EX', ARGV[4])
redis.call('XADD', KEYS[5], '*', 'request_id', rid, 'tenant', ARGV[5], 'kind', 'charge',
  'amount', int(-charged), 'balance_after', int(available + held), 'time', ARGV[3], 'model', ARGV[6],
  'tier', ARGV[7], 'prompt_tokens', ARGV[8], 'completion_tokens', ARGV[9], 'cached_tokens', ARGV[10],
  'usage_source', ARGV[11], 'shortfall', int(actual - charged))
local outcome = 'late'
if hold_text then outcome = 'settled' end
return {outcome, charged, available, actual - charged}
"""
)

RELEASE = """
-- KEYS: account, holds, hold amounts, closed marker of rid ; ARGV: request id, retention s
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
redis.call('SET', KEYS[4], 'released:0', 'EX', ARGV[2])
local hold = redis.call('HGET', KEYS[3], ARGV[1])
if not hold then return 0 end
redis.call('HINCRBY', KEYS[1], 'available', hold)
redis.call('HINCRBY', KEYS[1], 'held', '-' .. hold)
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

REAP = """
-- KEYS: account, holds, hold amounts ; ARGV: now ms, most holds to release
local rids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[2])
for _, rid in ipairs(rids) do
  local hold = redis.call('HGET', KEYS[3], rid)
  if hold then
    redis.call('HINCRBY', KEYS[1], 'available', hold)
    redis.call('HINCRBY', KEYS[1], 'held', '-' .. hold)
    redis.call('HDEL', KEYS[3], rid)
  end
  redis.call('ZREM', KEYS[2], rid)
end
return #rids
"""

TOP_UP = (
    _INT
    + """
-- KEYS: account, ledger stream, closed marker of the entry ; ARGV: amount, tenant, now ms, entry id, note, retention s
if redis.call('SET', KEYS[3], 'topped-up', 'NX', 'EX', ARGV[6]) == false then
  return tonumber(redis.call('HGET', KEYS[1], 'available'))
end
redis.call('HSETNX', KEYS[1], 'tenant', ARGV[2])
redis.call('HSETNX', KEYS[1], 'held', '0')
local available = tonumber(redis.call('HINCRBY', KEYS[1], 'available', ARGV[1]))
local held = tonumber(redis.call('HGET', KEYS[1], 'held'))
redis.call('XADD', KEYS[2], '*', 'request_id', ARGV[4], 'tenant', redis.call('HGET', KEYS[1], 'tenant'),
  'kind', 'top_up', 'amount', ARGV[1], 'balance_after', int(available + held), 'time', ARGV[3],
  'note', ARGV[5])
return available
"""
)
