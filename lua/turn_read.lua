-- turn_read.lua: one turn record, atomically (its hash and its text; turn_fold.lua).
-- KEYS[1]  the run's turn record (hash)   KEYS[2]  its text (string)
-- Returns {} when there is none, else {text, field, value, field, value, ...}
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {} end
local out = {redis.call('GET', KEYS[2]) or ''}
for _, v in ipairs(fields) do out[#out + 1] = v end
return out
