-- session_delete.lua: retire, clear, or prune a session's index. One slot: the
-- `{session_id}` keys. The turn records live in their runs' slots: the caller removes
-- them (with the run logs) from the run ids this returns.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  order zset
-- ARGV[1]  "retire" | "clear" | "prune"
-- retire:  ARGV[2] tombstone value. Writes the durable tombstone (no TTL), then drops the
--          index. Returns {"ok", run_id...}.
-- clear:   ARGV[2] the session's `seq` the caller saw when it checked that no turn is
--          running. {"moved"} when a claim took an order since (nothing deleted: check
--          again); otherwise drops the index (the counter is kept: an order is never
--          handed out twice) and returns {"ok", run_id...}.
-- prune:   ARGV[2..] run_id, order, ...: entries whose record the caller found gone;
--          removed while they still have that order. Returns {"ok"}.
-- (A dropped entry's parked mark goes with it: session_ttl.lua.) Retire and clear wake
-- the session's feeds (SPUBLISH on its feed channel).
local op = ARGV[1]

local function forget(run)
  redis.call('HDEL', KEYS[2], 'c:' .. run)
  if redis.call('HDEL', KEYS[2], 'p:' .. run) == 1 then
    redis.call('HINCRBY', KEYS[2], 'parked', -1)
  end
end

if op == 'prune' then
  for i = 2, #ARGV, 2 do
    if redis.call('ZSCORE', KEYS[3], ARGV[i]) == ARGV[i + 1] then
      redis.call('ZREM', KEYS[3], ARGV[i])
      forget(ARGV[i])
    end
  end
  return {'ok'}
end
if op == 'clear' then
  if (redis.call('HGET', KEYS[2], 'seq') or '0') ~= ARGV[2] then
    return {'moved'}
  end
else
  redis.call('SET', KEYS[1], ARGV[2])
end
local out = {'ok'}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  out[#out + 1] = id
  forget(id)
end
redis.call('DEL', KEYS[3])
if op == 'retire' then redis.call('DEL', KEYS[2]) end
-- Wake the session's feeds in this same step (they learn of it with no poll of their
-- own; no crash can lose it): the session's `feed` channel, named like its keys.
redis.call('SPUBLISH', (string.gsub(KEYS[1], ':tomb$', ':feed')), '')
return out
