-- session_legacy.lua: turn records written before they moved to their runs' slots (an
-- upgrade): `<prefix>session:{<sid>}:turn:<run>` hashes (rev, state, doc), listed in the
-- session's `turns` zset (run_id -> last_updated) with their expiries in `exp`. Read
-- (and settled from their runs by the caller) until they expire; removed with the
-- session. One slot: the `{session_id}` keys.
--
-- KEYS[1]  legacy turns zset   KEYS[2]  legacy expiries zset
-- ARGV[1]  "read" | "delete"
-- ARGV[2]  the turn key prefix (`<prefix>session:{<sid>}:turn:`)
-- ARGV[3]  read: how many, newest first
--
-- read:   drops entries whose turn expired (their hashes are gone), then returns
--         {run_id, doc, run_id, doc, ...}
-- delete: deletes every legacy turn and both zsets; returns {run_id, ...}
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'delete' then
  local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, id in ipairs(ids) do redis.call('DEL', ARGV[2] .. id) end
  redis.call('DEL', KEYS[1], KEYS[2])
  return ids
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms, 'LIMIT', 0, 64)) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
local out = {}
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)) do
  local doc = redis.call('HGET', ARGV[2] .. id, 'doc')
  if doc then
    out[#out + 1] = id
    out[#out + 1] = doc
  end
end
return out
