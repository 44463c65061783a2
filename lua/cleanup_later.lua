-- cleanup_later.lua: remove a run's log after a delay, whatever is written meanwhile.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  delay, ms
--
-- The log expires after the delay; the record keeps the moment (`remove_at`) so that
-- writes before it do not refresh the log's TTL past it (publish.lua, publish_end.lua).
-- Returns 1 when a log was scheduled for removal, 0 when there is none.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'remove_at', string.format('%d', now + tonumber(ARGV[1])))
end
return 1
