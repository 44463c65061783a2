-- publish.lua: append events to a run log, fenced by the producer token.
--
-- Order matters and is the contract: token check, then END detection on the tail
-- only (O(1), whatever the retained history), then the lease, then XADD with exact
-- trimming and TTL refresh. Nothing is written unless every check passes.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  producer token
-- ARGV[2]  events kept per run (MAXLEN, trimmed exactly once the log holds ARGV[5] more)
-- ARGV[3]  rolling TTL of the run's keys, ms
-- ARGV[4]  the largest notification that carries the events themselves, bytes
-- ARGV[5]  trim slack: events past ARGV[2] tolerated before trimming (0: always exact)
-- ARGV[6]  the batch's producer sequence number, "" when unnumbered (see below)
-- ARGV[7..] event name, JSON payload, event name, JSON payload, ...
-- KEYS[3]  the run's turn record (hash)   KEYS[4]  its text (string)
--
-- A run of a session has a turn record (claim.lua opens it); the events fold into it
-- here, in the same step as the append (turn_fold.lua), so it never lags the log.
--
-- Every publish renews the lease by the length the producer claimed it for, and
-- SPUBLISHes on the shard channel named like the log key (so in this script's slot: on a
-- cluster only the slot's shard carries it) so following gateways wake. The
-- notification carries what was appended, with the id it follows, so a gateway whose
-- copy of the log ends there delivers without reading Redis (redis_codec.decode_push):
--   "e <prev_id> <count>\n" then per event "<id> <name> <bytes>\n<json>"
-- or is empty (read the log) when the events are larger than ARGV[4] or there was no log.
--
-- The record counts the log's length (`len`) and when the keys' TTL was last set
-- (`ttl_at`), so most publishes need neither XLEN nor PEXPIRE: trimming runs once the
-- log is ARGV[5] past its limit (then exactly, with XLEN), and the TTL is refreshed once
-- a sixteenth of it has passed (so keys live between 15/16 and all of the TTL after
-- the last write).
--
-- The log's floor (every event with a larger id is retained) lives in the stream itself,
-- as its max-deleted-entry-id (XSETID ... MAXDELETEDID): trimming sets it to the newest
-- trimmed id, and a log recreated after a removal starts with it at the last id the run
-- had handed out (`last` in the record), with ids above that. It vanishes only with the
-- stream, so readers can always tell what they missed.
--
-- Returns {"ok", cancel_requested (0|1), session_id_or_"", id, id, ...}
--       | {"overlap", cancel_requested (0|1), session_id_or_"", skipped, id, id, ...}
--         (a numbered batch whose first `skipped` events were applied before: their
--         first-assigned ids, then the ids of the tail appended now)
--       | {"duplicate", cancel_requested (0|1), session_id_or_"", id, id, ...}
--         (every event of the numbered batch was applied before: nothing appended)
--       | {"sequence_gap" | "sequence_conflict", next_expected_seq}
--       | {"fenced", "token" | "lease_expired"}
--       | {"ended", end_id_or_""}
--! include turn_fold
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

local meta = redis.call('HMGET', KEYS[1], 'token', 'lease_until', 'status', 'cancel', 'lease_ms',
  'session', 'last', 'remove_at', 'len', 'ttl_at', 'seq_tok', 'seq_next', 'seq_last', 'seq_base')
if not meta[1] or meta[1] ~= ARGV[1] then
  return {'fenced', 'token'}
end
local tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if tail and tail[2][1] == 'end' then
  return {'ended', tail[1]}
end
-- The log of an ended run was removed: the record still says it ended.
if not tail and meta[3] and meta[3] ~= 'running' then
  return {'ended', ''}
end
-- The owner's lease lapsing fences it too (checked after END, so a late write to an
-- ended run is reported as such).
if tonumber(meta[2] or '0') <= now then
  return {'fenced', 'lease_expired'}
end

-- Numbered appends, the last check before writing: the rule of gateway/sequence.py. The
-- numbering belongs to one token (a takeover starts a new one): seq_tok, seq_next (next
-- expected number), seq_last (id of event seq_next-1) and seq_base (events seq_base ..
-- seq_next-1 are the log's newest numbered entries, back to back). A batch below seq_next
-- has its applied events' ids read back from the log (XREVRANGE from seq_last, at most
-- LOOKBACK entries) and appends only its tail; a batch past seq_next is a gap; an overlap
-- whose ids are not in the log any more is a conflict.
local LOOKBACK = 1000  -- gateway.sequence.MAX_LOOKBACK
local batch_seq = tonumber(ARGV[6])
local count = (#ARGV - 6) / 2
local skip = 0
local applied = {}
local s = nil
if batch_seq then
  s = {meta[11], meta[12], meta[13], meta[14]}  -- read with the record, in one HMGET
  local mine = s[1] == ARGV[1]
  local expected = mine and tonumber(s[2]) or 1
  if batch_seq > expected then
    return {'sequence_gap', expected}
  end
  if batch_seq < expected then
    local lookback = expected - batch_seq
    if batch_seq < tonumber(s[4]) or lookback > LOOKBACK then
      return {'sequence_conflict', expected}
    end
    local back = redis.call('XREVRANGE', KEYS[2], s[3], '-', 'COUNT', lookback)
    if #back < lookback or back[1][1] ~= s[3] then
      return {'sequence_conflict', expected}
    end
    skip = math.min(count, lookback)
    for i = lookback, lookback - skip + 1, -1 do
      applied[#applied + 1] = back[i][1]
    end
    if skip == count then
      -- All applied before: nothing is appended; like any publish it renews the lease.
      redis.call('HSET', KEYS[1], 'lease_until', string.format('%d', now + tonumber(meta[5])))
      local dup = {'duplicate', meta[4] == '1' and 1 or 0, meta[6] or ''}
      for i = 1, #applied do dup[#dup + 1] = applied[i] end
      return dup
    end
    count = count - skip
  end
end

-- No log but the run handed out ids before: it was removed under a live producer.
local floor = nil
local next_id = '*'
if not tail and meta[7] then
  floor = meta[7]
  local ms, seq = string.match(floor, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if now > ms then
    next_id = string.format('%d-0', now)
  else
    next_id = string.format('%d-%d', ms, seq + 1)
  end
end

local reply = {'ok', meta[4] == '1' and 1 or 0, meta[6] or ''}
local push = {}
local push_bytes = 0
for i = 7 + 2 * skip, #ARGV, 2 do
  local id = redis.call('XADD', KEYS[2], next_id, 'e', ARGV[i], 'd', ARGV[i + 1])
  next_id = '*'
  reply[#reply + 1] = id
  push_bytes = push_bytes + #ARGV[i + 1]
  if push_bytes <= tonumber(ARGV[4]) then
    push[#push + 1] = string.format('%s %s %d\n', id, ARGV[i], #ARGV[i + 1]) .. ARGV[i + 1]
  end
end
local last = reply[#reply]

local numbering = nil
if batch_seq then
  -- The numbered run goes on while nothing else was appended since its newest event.
  local first_new = batch_seq + skip
  local base = first_new
  if s[1] == ARGV[1] and meta[7] == s[3] then base = tonumber(s[4]) end
  -- (written with the record's other fields, in the one HSET below)
  numbering = {'seq_tok', ARGV[1], 'seq_next', string.format('%d', first_new + count),
    'seq_last', last, 'seq_base', string.format('%d', base)}
  if skip > 0 then
    -- The reply lists every event of the batch: first-assigned ids, then the new ones.
    local full = {'overlap', reply[2], reply[3], skip}
    for i = 1, skip do full[#full + 1] = applied[i] end
    for i = 4, #reply do full[#full + 1] = reply[i] end
    reply = full
  end
end

local maxlen = tonumber(ARGV[2])
local length = (tail and tonumber(meta[9] or '0') or 0) + count
if length > maxlen + tonumber(ARGV[5]) then
  length = redis.call('XLEN', KEYS[2])
  local excess = length - maxlen
  if excess > 0 then
    local victims = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', excess)
    redis.call('XTRIM', KEYS[2], 'MAXLEN', maxlen)
    floor = victims[#victims][1]
    length = maxlen
  end
end
if floor then
  redis.call('XSETID', KEYS[2], last, 'MAXDELETEDID', floor)
end

local ttl = tonumber(ARGV[3])
local remove_at = tonumber(meta[8] or '0')
local ttl_at = tonumber(meta[10] or '0')
local refresh = not tail or now - ttl_at >= ttl / 16 or remove_at > 0
local record = {'lease_until', string.format('%d', now + tonumber(meta[5])),
  'updated', string.format('%d', now), 'last', last, 'len', string.format('%d', length),
  'ttl_at', string.format('%d', refresh and now or ttl_at)}
if numbering then
  for i = 1, #numbering do record[#record + 1] = numbering[i] end
end
redis.call('HSET', KEYS[1], unpack(record))
if refresh then
  redis.call('PEXPIRE', KEYS[1], ttl)
  -- A removal scheduled with cleanup(delay) is not put off by later writes.
  if remove_at > now then
    redis.call('PEXPIRE', KEYS[2], remove_at - now)
  else
    redis.call('PEXPIRE', KEYS[2], ttl)
    if remove_at > 0 then redis.call('HDEL', KEYS[1], 'remove_at') end
  end
end
-- The turn record follows the append in this same step (turn_fold.lua): only the events
-- appended now (an overlapping numbered batch folded its first `skip` events before).
if meta[6] and meta[6] ~= '' and KEYS[3] then
  turn_guarded(turn_fold, KEYS[3], KEYS[4], 7 + 2 * skip, now, ttl, refresh)
end
-- Wake the gateways following this run (the channel is the log key's name).
if tail and #push == count then
  redis.call('SPUBLISH', KEYS[2],
    string.format('e %s %d\n', tail[1], count) .. table.concat(push))
else
  redis.call('SPUBLISH', KEYS[2], '')
end
return reply
