-- publish_end.lua: append the END entry of a run log, at most once.
--
-- Token check first (or, for an unowned recovery END, a check that the lease has
-- expired); then the tail: an END there makes this an idempotent success for the
-- writer of that END (anyone else's token is fenced). With the legacy scan on, a
-- non-END tail triggers a scan of the whole retained window for an older END (left by
-- an unfenced legacy writer, possibly followed by events): that costs O(retained
-- bytes) and blocks Redis while it runs. With it off, END publication is tail-only.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  producer token, "" for an unowned recovery END
-- ARGV[2]  END status
-- ARGV[3]  error JSON, "" for none
-- ARGV[4]  "1" to run the legacy END scan, else "0"
-- ARGV[5]  how long the finished log stays readable, ms
-- ARGV[6]  TTL of the run record after END, ms
-- ARGV[7]  the server's identity as the gateway's connection saw it ("": unknown; "?": ask
--          the server, on a cluster), for
--          the run's epoch (entry_id.lua)
-- KEYS[3]  the run's turn record (hash)   KEYS[4]  its text (string)
--
-- Whenever the run settles (an END written, found, or a record marked ended), the turn
-- record takes the END status in this same step (turn_fold.lua), so a de-duplicated END
-- or a retry after a lost reply can never leave it running.
--
-- The record keeps the END (status, id, error, and who wrote it: `end_by`, the token,
-- "-" for a recovery END, "?" for an END found in the log), so readers learn how a run ended after its log is gone.
--
-- Returns {"ok", end_id, deduplicated (0|1), session_id_or_"", scanned (0|1)}
--         scanned is 1 when this call ran the legacy scan of the retained window
--       | {"noop"}                 recovery END on a missing stream and no run record
--       | {"recorded", session}    recovery END of a run that never wrote a log: only
--                                  the record is marked, no log is created
--       | {"fenced", "token" | "lease_expired" | "lease_live" | "ended_by_another"}
--! include turn_fold
--! include entry_id
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

-- The run record's fields, read by name into locals run_<field> (scripts.py expands it)
--! read run KEYS[1] token lease_until status end_id session last end_by remove_at srv ep
--!+ tpend tfold
local session = run_session or ''
local lease_until = tonumber(run_lease_until or '0')
local exists = redis.call('EXISTS', KEYS[2]) == 1
local writer = ARGV[1] == '' and '-' or ARGV[1]

local function settle(end_id, status, by)
  redis.call('HSET', KEYS[1], 'status', status, 'end_id', end_id,
    'updated', string.format('%d', now), 'lease_until', '0', 'end_by', by)
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'err', ARGV[3]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  if KEYS[3] then
    local turn = turn_library()
    -- the text still pending in the log first (turn_fold.lua), then the END
    if tonumber(run_tpend or '0') > 0 then
      turn.guarded(turn.fold_pending, KEYS[3], KEYS[4], KEYS[2], run_tfold or '0-0',
        tonumber(run_tpend))
      redis.call('HSET', KEYS[1], 'tpend', '0')
    end
    turn.guarded(turn.finish, KEYS[3], KEYS[4], status, now, ARGV[6])
  end
  local remove_at = tonumber(run_remove_at or '0')
  if remove_at > now and remove_at - now < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[2], remove_at - now)
  else
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
end

-- An END that is already there: the same writer repeating it is deduplicated; anyone
-- else learns it was fenced (a producer whose lease lapsed and got the recovery END).
local function repeated(end_id)
  if ARGV[1] ~= '' and run_end_by and run_end_by ~= '?' and run_end_by ~= ARGV[1] then
    return {'fenced', 'ended_by_another'}
  end
  return {'ok', end_id, 1, session, 0}
end

if ARGV[1] == '' then
  if run_token and lease_until > now then
    return {'fenced', 'lease_live'}
  end
  if not exists then
    if run_status == 'running' then
      -- Claimed, never published, lease gone: mark the record so its readers end.
      settle('', ARGV[2], '-')
      redis.call('SPUBLISH', KEYS[2], '')
      return {'recorded', session}
    end
    if not run_status then
      return {'noop'}
    end
  end
elseif not run_token or run_token ~= ARGV[1] then
  return {'fenced', 'token'}
end

local tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if tail and tail[2][1] == 'end' then
  if run_status == 'running' or not run_status then settle(tail[1], tail[2][2], '?') end
  return repeated(tail[1])
end
if not tail and run_status and run_status ~= 'running' then
  return repeated(run_end_id or '')
end
-- A first END needs a live lease.
if ARGV[1] ~= '' and lease_until <= now then
  return {'fenced', 'lease_expired'}
end

local scanned = 0
if ARGV[4] == '1' and tail then
  scanned = 1
  local cursor = '-'
  while true do
    local page = redis.call('XRANGE', KEYS[2], cursor, '+', 'COUNT', 512)
    for _, entry in ipairs(page) do
      if entry[2][1] == 'end' then
        settle(entry[1], entry[2][2], '?')
        return {'ok', entry[1], 1, session, 1}
      end
    end
    if #page < 512 then break end
    cursor = '(' .. page[#page][1]
  end
end

-- A log removed under a live owner is recreated above every id the run handed out; and
-- an END never takes an id of an earlier epoch (entry_id.lua).
local floor = nil
if not tail and run_last then
  floor = run_last
end
local server = server_identity(ARGV[7])
local epoch, epoch_moved = run_epoch(run_srv, run_ep, server)
local next_id = entry_id(epoch, tail and tail[1] or run_last, now, tail ~= nil)
if epoch_moved then
  redis.call('HSET', KEYS[1], 'srv', server, 'ep', string.format('%d', epoch))
end
local end_id
if ARGV[3] ~= '' then
  end_id = redis.call('XADD', KEYS[2], next_id, 'end', ARGV[2], 'err', ARGV[3])
else
  end_id = redis.call('XADD', KEYS[2], next_id, 'end', ARGV[2])
end
if floor then
  redis.call('XSETID', KEYS[2], end_id, 'MAXDELETEDID', floor)
end
settle(end_id, ARGV[2], writer)
-- Wake the gateways following this run, with the END itself when it follows the tail
-- (the format of publish.lua's notifications; an END is "x ...", its data the error).
if tail then
  redis.call('SPUBLISH', KEYS[2], string.format('x %s 1\n%s %s %d\n', tail[1], end_id, ARGV[2],
    #ARGV[3]) .. ARGV[3])
else
  redis.call('SPUBLISH', KEYS[2], '')
end
return {'ok', end_id, 0, session, scanned}
