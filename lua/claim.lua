-- claim.lua: take (or take over) the producer lease of a run.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  new producer token
-- ARGV[2]  lease length, ms
-- ARGV[3]  "1" to take a live lease by force, else "0"
-- ARGV[4]  session id, "" for none (kept from the first claim once set)
-- ARGV[5]  rolling TTL of the run's keys, ms
-- ARGV[6]  the turn's order in its session ("" when the claim opens no turn: no
--          session, or a retired one); session_claim.lua handed it out just before
-- ARGV[7]  the shaped operator message the turn opens with (JSON), "" for none
-- KEYS[3]  the run's turn record (hash)   KEYS[4]  its text (string)  (turn_fold.lua)
--
-- A claim that succeeds with a session opens the run's turn record in this same step
-- (once: a takeover claim keeps it).
--
-- Returns {"ok", epoch, lease_until_ms, session_id_or_""}
--       | {"owned", lease_until_ms}      a live lease is held and ARGV[3] is "0"
--       | {"ended", status}              the run already has an END
--       | {"session", session_id_or_""}  ARGV[4] names a session the run is not in
--! include turn_fold
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

--! read run KEYS[1] status token lease_until epoch session tpend tpark
if run_status and run_status ~= 'running' then
  return {'ended', run_status}
end
-- A writer that predates the run record may have left an END with no meta.
local tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if tail and tail[2][1] == 'end' then
  return {'ended', tail[2][2]}
end

-- A run's session is fixed by its first claim: a later claim may repeat it or omit it.
if run_token and ARGV[4] ~= '' and (run_session or '') ~= ARGV[4] then
  return {'session', run_session or ''}
end

local lease_until = tonumber(run_lease_until or '0')
if run_token and lease_until > now and ARGV[3] ~= '1' then
  return {'owned', string.format('%d', lease_until)}
end

local epoch = tonumber(run_epoch or '0') + 1
local new_until = now + tonumber(ARGV[2])
local session = run_session or ARGV[4]
redis.call('HSETNX', KEYS[1], 'created', string.format('%d', now))
redis.call('HSET', KEYS[1],
  'status', 'running', 'token', ARGV[1], 'epoch', string.format('%d', epoch),
  'lease_until', string.format('%d', new_until), 'lease_ms', ARGV[2],
  'updated', string.format('%d', now),
  'session', session)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if session ~= '' and session == ARGV[4] and ARGV[6] ~= '' then
  local ok, opened = pcall(turn_library().open, KEYS[3], session, ARGV[6], ARGV[7], now, ARGV[5])
  if not ok then
    redis.log(redis.LOG_WARNING, 'turn record not opened: ' .. tostring(opened))
  elseif opened and ((run_tpend or '0') ~= '0' or (run_tpark or '0') ~= '0') then
    -- a new record (its session was cleared): what the log held for the old one
    -- (pending text, a parked state) is not this turn's
    redis.call('HSET', KEYS[1], 'tpend', '0', 'tpark', '0')
  end
end
return {'ok', epoch, string.format('%d', new_until), session}
