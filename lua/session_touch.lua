-- session_touch.lua: a turn's state moved (parked, unparked, ended): the session's own
-- keys take note. One slot: the `{session_id}` keys. A hint, like the global index: the
-- turn record (run slot) is the truth, written in the same step as the write itself.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  order zset
-- ARGV[1]  the turn's last_updated (seconds)
-- ARGV[2]  "1" when the turn is parked on the operator (the session then keeps its
--          keys without TTL: a parked turn is never swept), else "0"
--
-- Returns 1 when the session is live and took note, else 0 (retired, or no index).
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local last = tonumber(redis.call('HGET', KEYS[2], 'last_updated') or '0')
if tonumber(ARGV[1]) > last then
  redis.call('HSET', KEYS[2], 'last_updated', ARGV[1])
end
if ARGV[2] == '1' then
  redis.call('PERSIST', KEYS[2])
  redis.call('PERSIST', KEYS[3])
end
return 1
