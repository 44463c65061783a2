-- session_read.lua: one session's index row (and optionally its newest turn ids), after
-- dropping list entries of expired turns (bounded work). One slot: `{session_id}` keys.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  turns zset   KEYS[4]  expiries zset
-- ARGV[1]  prune budget (expired entries dropped per call, at most)
-- ARGV[2]  how many turn ids to return, newest last_updated first (0 = none)
--
-- Returns {"retired"}
--       | {"ok", last_updated or "", last_state or "", turn count, run_id...}
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'retired'}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end
local count = redis.call('ZCARD', KEYS[3])
if count == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return {'ok', '', '', 0}
end
local meta = redis.call('HMGET', KEYS[2], 'last_updated', 'last_state')
local out = {'ok', meta[1] or '', meta[2] or '', count}
local want = tonumber(ARGV[2])
if want > 0 then
  local ids = redis.call('ZREVRANGE', KEYS[3], 0, want - 1)
  for _, id in ipairs(ids) do
    out[#out + 1] = id
  end
end
return out
