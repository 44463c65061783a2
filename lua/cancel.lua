-- cancel.lua: flag a run for cancellation; its producer sees it in its next reply.
--
-- KEYS[1]  run meta hash
-- Returns 1 when the run is known, 0 otherwise (nothing is created).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'cancel', '1')
return 1
