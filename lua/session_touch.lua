-- session_touch.lua: a turn's state moved (parked, unparked, ended): the session's own
-- keys take note. One slot: the `{session_id}` keys. A hint, like the global index: the
-- turn record (run slot) is the truth, written in the same step as the write itself.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta   KEYS[3]  order zset
-- ARGV[1]  the turn's last_updated (seconds)
-- ARGV[2]  "1" when the turn is parked on the operator (the session then keeps its
--          keys without TTL: a parked turn is never swept), else "0"
-- ARGV[3]  the turn's run_id
-- ARGV[4]  how long the session's keys live at least from now, ms, once none of its
--          turns is parked (session_ttl.lua)
--
-- Returns 1 when the session is live and took note, else 0 (retired, or no index).
--! include session_ttl
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local last = tonumber(redis.call('HGET', KEYS[2], 'last_updated') or '0')
if tonumber(ARGV[1]) > last then
  redis.call('HSET', KEYS[2], 'last_updated', ARGV[1])
end
session_parked(KEYS[2], KEYS[3], ARGV[3], ARGV[2] == '1', tonumber(ARGV[4]))
return 1
