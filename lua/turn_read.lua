-- turn_read.lua: one turn record, atomically (its hash and its text; turn_fold.lua),
-- with the text its run's log still holds for it folded in first, so a record never
-- lags what a reader of the log can read (the fold is written: a retry or the next read
-- finds nothing pending).
-- KEYS[1]  the run's turn record (hash)   KEYS[2]  its text (string)
-- KEYS[3]  the run meta hash              KEYS[4]  the run log stream
-- Returns {} when there is none, else {text, field, value, field, value, ...}
--! include turn_fold
--! read run KEYS[3] tpend tfold
if tonumber(run_tpend or '0') > 0 then
  local turn = turn_library()
  turn.guarded(turn.fold_pending, KEYS[1], KEYS[2], KEYS[4], run_tfold or '0-0',
    tonumber(run_tpend))
  redis.call('HSET', KEYS[3], 'tpend', '0')
end
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {} end
local out = {redis.call('GET', KEYS[2]) or ''}
for _, v in ipairs(fields) do out[#out + 1] = v end
return out
