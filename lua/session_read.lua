-- session_read.lua: one session's index row and some of its run ids by order. One slot:
-- `{session_id}` keys. The turn records themselves are in their runs' slots: the caller
-- reads them next, and drops entries whose record is gone (session_delete.lua "prune").
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  order zset
-- KEYS[4]  the `turns` zset of records from before the order (session_legacy.lua)
-- ARGV[1]  how many run ids to return (0 = only one)
-- ARGV[2]  "" for the newest, highest order first; else an order: those above it,
--          lowest first
--
-- Returns {"retired"}
--       | {"ok", last_updated or "", entry count (legacy ones included), seq,
--          now (ms, the server's clock), legacy entry count,
--          run_id, order, claimed (ms, "" if unknown), run_id, order, claimed, ...}
--         (seq: the last order handed out, what a clear compares)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'retired'}
end
local legacy = redis.call('ZCARD', KEYS[4])
local count = redis.call('ZCARD', KEYS[3]) + legacy
--! read session KEYS[2] last_updated seq
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local out = {'ok', session_last_updated or '', count, session_seq or '0', now, legacy}
local want = math.max(tonumber(ARGV[1]), 1)
local ids
if (ARGV[2] or '') == '' then
  ids = redis.call('ZREVRANGE', KEYS[3], 0, want - 1, 'WITHSCORES')
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[2], '+inf', 'WITHSCORES',
    'LIMIT', 0, want)
end
for i = 1, #ids, 2 do
  out[#out + 1] = ids[i]
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], 'c:' .. ids[i]) or ''
end
return out
