-- read.lua: one consistent read of a run log for a subscriber.
--
-- The entries and the log's boundaries are read atomically, so a reader can tell
-- "nothing after my cursor was removed" from "I fell out of the retained window". The
-- boundaries come from the stream's own metadata (XINFO STREAM), which trimming keeps
-- and only the removal of the stream loses: the scripts record the log's floor as its
-- max-deleted-entry-id (see publish.lua), and entries-added > length says the log
-- dropped entries itself.
--
-- On one server the bridge reads the same in one MULTI/EXEC of plain commands instead
-- (`gateway/redis/reads.py`): a script's reply converts every entry
-- to a Lua table and back, several times the XRANGE's own cost. This script is the
-- cluster's read (its client routes a script to the slot's node); keep the two alike.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  read entries from this id on, itself included ("-" for from the start)
-- ARGV[2]  at most this many entries
--
-- Returns {exists (0|1), length, entries_added, max_deleted_id, last_generated_id,
--          first_id, entries, tail, status, error, end_id, last}
--   first_id  the oldest retained entry's id, "" when the log is empty
--   entries   XRANGE replies: {id, {field, value, ...}}, the position's own first when
--             it is an entry
--   tail      the newest entry, "" when the log is empty (tells a cursor at or past an
--             END from one waiting at a live tail, and a new reader where the log ends)
--   status, error, end_id, last  the run record's status, END and last event id when
--             the log is missing (a reader before `last` missed events: a gap)
if redis.call('EXISTS', KEYS[2]) == 0 then
  --! read run KEYS[1] status err end_id last
  return {0, 0, 0, '', '', '', {}, '', run_status or '', run_err or '', run_end_id or '',
    run_last or ''}
end
local info = redis.call('XINFO', 'STREAM', KEYS[2])
local field = {}
for i = 1, #info, 2 do field[info[i]] = info[i + 1] end
-- From the position itself, inclusive: the reader learns whether it is an entry of the
-- log (a position the log cannot vouch for is a gap) and drops it (codec._log_read).
local entries = redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
local tail = field['last-entry'] or ''
local first = field['first-entry']
return {1, field['length'], field['entries-added'], field['max-deleted-entry-id'],
  field['last-generated-id'], first and first[1] or '', entries, tail, '', '', '', ''}
