-- session_index.lua: the global session index, two sorted sets sharing one hash tag
-- (one slot): "by activity" (session_id -> last_updated, seconds) and "parked"
-- (session_id -> last_updated, only sessions whose newest-created turn waits on the
-- operator). The index is a hint kept close to the truth; the per-session keys are the
-- truth, and readers verify every row against them (session_read.lua).
--
-- KEYS[1]  by-activity zset   KEYS[2]  parked zset
-- ARGV[1]  operation:
--   "touch", session_id, last_updated, parked (1|0)
--       by-activity: ZADD GT. parked=1: ZADD GT into parked; parked=0: remove it from
--       parked unless its score is newer than last_updated (an out-of-order older
--       update must not unpark a newer parked state).
--   "remove", session_id, before (seconds, or "+inf")
--       remove from both where the score is <= before (a clear must not erase the
--       entry of a turn started after it).
--   "drop", which (1 = by-activity, 2 = parked), session_id, score, ...
--       compare-and-remove stale rows found by a reader: only while the score is still
--       the one the reader saw.
-- Returns the number of entries changed.
local op = ARGV[1]
local changed = 0
if op == 'touch' then
  local sid, score = ARGV[2], tonumber(ARGV[3])
  changed = changed + redis.call('ZADD', KEYS[1], 'GT', 'CH', score, sid)
  if ARGV[4] == '1' then
    changed = changed + redis.call('ZADD', KEYS[2], 'GT', 'CH', score, sid)
  else
    local cur = redis.call('ZSCORE', KEYS[2], sid)
    if cur and tonumber(cur) <= score then
      changed = changed + redis.call('ZREM', KEYS[2], sid)
    end
  end
elseif op == 'remove' then
  local sid, before = ARGV[2], tonumber(ARGV[3])
  for i = 1, 2 do
    local cur = redis.call('ZSCORE', KEYS[i], sid)
    if cur and tonumber(cur) <= before then
      changed = changed + redis.call('ZREM', KEYS[i], sid)
    end
  end
elseif op == 'drop' then
  for i = 2, #ARGV, 3 do
    local key = KEYS[tonumber(ARGV[i])]
    local cur = redis.call('ZSCORE', key, ARGV[i + 1])
    if cur and tonumber(cur) == tonumber(ARGV[i + 2]) then
      changed = changed + redis.call('ZREM', key, ARGV[i + 1])
    end
  end
end
return changed
