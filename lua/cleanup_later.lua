-- cleanup_later.lua: remove a run's log, now or after a delay, whatever is written
-- meanwhile.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- KEYS[3]  the run's turn record (hash)   KEYS[4]  its text (string)
-- ARGV[1]  delay, ms (0: remove it now)
--
-- The text the turn record has not folded yet (turn_fold.lua) is folded first: once the
-- log is gone it could not be. A removal now deletes the log. A later one makes the log
-- expire after the delay, and the record keeps the moment (`remove_at`) so that writes
-- before it do not refresh the log's TTL past it (publish.lua, publish_end.lua), and
-- fold their text at once.
-- Returns 1 when a log was removed or scheduled for removal, 0 when there is none.
--! include turn_fold
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
--! read run KEYS[1] tpend tfold
if KEYS[3] and tonumber(run_tpend or '0') > 0 then
  local turn = turn_library()
  turn.guarded(turn.fold_pending, KEYS[3], KEYS[4], KEYS[2], run_tfold or '0-0',
    tonumber(run_tpend))
  redis.call('HSET', KEYS[1], 'tpend', '0')
end
if tonumber(ARGV[1]) <= 0 then
  redis.call('DEL', KEYS[2])
  return 1
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'remove_at', string.format('%d', now + tonumber(ARGV[1])))
end
return 1
