-- session_delete.lua: retire or clear a session, atomically with its active-turn check.
-- One slot: every key carries the `{session_id}` hash tag. The turn hashes are addressed
-- as ARGV[3] .. run_id (same tag, same slot) because their ids are only known here.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  turns zset   KEYS[4]  expiries zset
-- ARGV[1]  "retire" | "clear"
-- ARGV[2]  tombstone value (retire time, seconds)
-- ARGV[3]  turn key prefix (`<prefix>session:{<id>}:turn:`)
--
-- retire: writes the durable tombstone (no TTL, never evicted by us), then deletes every
--         turn. Returns {"ok", run_id...}.
-- clear:  {"active", run_id} when a turn is `running` (nothing deleted); otherwise deletes
--         every turn and the session's lists and returns {"ok", run_id...}.
local ids = redis.call('ZRANGE', KEYS[3], 0, -1)
if ARGV[1] == 'clear' then
  for _, id in ipairs(ids) do
    if redis.call('HGET', ARGV[3] .. id, 'state') == 'running' then
      return {'active', id}
    end
  end
else
  redis.call('SET', KEYS[1], ARGV[2])
end
local out = {'ok'}
for _, id in ipairs(ids) do
  redis.call('DEL', ARGV[3] .. id)
  out[#out + 1] = id
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return out
