-- read.lua: one consistent read of a run log for a subscriber.
--
-- The entries and the trim boundary are read atomically, so a reader can tell
-- "nothing after my cursor was trimmed" from "I fell out of the retained window".
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  read entries after this id ("-" for from the start)
-- ARGV[2]  at most this many entries
--
-- Returns {exists (0|1), last_trimmed_id_or_"", entries, tail, status}
--   entries  XRANGE replies: {id, {field, value, ...}}
--   tail     the newest entry when nothing was found after ARGV[1] (tells a cursor at
--            or past an END from one waiting at a live tail), else ""
--   status   the run record's status when the log is missing, else ""
local exists = redis.call('EXISTS', KEYS[2])
local trimmed = redis.call('HGET', KEYS[1], 'trimmed') or ''
local entries = {}
if ARGV[1] == '-' then
  entries = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', tonumber(ARGV[2]))
elseif ARGV[1] ~= '18446744073709551615-18446744073709551615' then
  -- (nothing can follow the largest id, and XRANGE refuses an exclusive start there)
  entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
end
local tail = ''
if #entries == 0 then
  tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1] or ''
end
local status = ''
if exists == 0 then
  status = redis.call('HGET', KEYS[1], 'status') or ''
end
return {exists, trimmed, entries, tail, status}
