-- publish.lua: append events to a run log, fenced by the producer token.
--
-- Order matters and is the contract: token check, then END detection (O(1), whatever
-- the retained history), then the lease, then XADD with exact trimming and TTL refresh.
-- Nothing is written unless every check passes.
--
-- A lone token costs EVALSHA, TIME, HMGET, XADD, HSET and SPUBLISH. The END check reads
-- the record, not the log: publish_end.lua marks the record ended in the step that
-- appends the END, and `last` (rewritten by every append, in the one HSET) is the log's
-- newest id, so the log is read (XREVRANGE) only when the record cannot say: the
-- legacy END scan is on (ARGV[8]: an unfenced writer's END is in the log alone; only
-- entries after `last` are read), or the run has appended nothing yet. A log removed
-- under the producer is found by the first XADD (NOMKSTREAM), which then goes again as
-- on a missing log.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  producer token
-- ARGV[2]  events kept per run (MAXLEN, trimmed exactly once the log holds ARGV[5] more)
-- ARGV[3]  rolling TTL of the run's keys, ms
-- ARGV[4]  the largest notification that carries the events themselves, bytes
-- ARGV[5]  trim slack: events past ARGV[2] tolerated before trimming (0: always exact)
-- ARGV[6]  the batch's producer sequence number, "" when unnumbered (see below)
-- ARGV[7]  the server's identity as the gateway's connection saw it ("": unknown; "?": ask
--          the server, on a cluster), for
--          the run's epoch (entry_id.lua)
-- ARGV[8]  "1" when the legacy END scan is on (unfenced writers may have appended an END
--          the record does not know of: what follows `last` is read), else "0"
-- ARGV[9..] event name, JSON payload, event name, JSON payload, ...
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
--! include entry_id
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

-- The batch's number; nil when unnumbered.
local batch_seq = tonumber(ARGV[6])
-- The run record's fields, read by name into locals run_<field> (scripts.py expands it);
-- the numbering's only for a numbered batch, and the rare ones (`floor`, `end_id`) where
-- they are needed: each field read costs about 1 % of a lone append's Redis time.
--! read run KEYS[1] token lease_until status cancel lease_ms session last remove_at len
--!+ ttl_at srv ep tpend tfold tpark
--!+ when batch_seq: seq_tok seq_next seq_last seq_base seq_cur seq_n
local FIRST = 9  -- ARGV index of the first event's name
if not run_token or run_token ~= ARGV[1] then
  return {'fenced', 'token'}
end
-- The numbering belongs to this token (see "Numbered appends" below), and the number
-- it expects next.
local mine = batch_seq and run_seq_tok == ARGV[1]
local expected = mine and tonumber(run_seq_next) or 1
-- The tail: its entry, or for a numbered batch that overlaps what was applied (a retry)
-- only its id when nothing follows the newest event this run appended (`last`), read
-- without loading any event (a retry's cost must not depend on the events' size; a
-- tail that is not that event is read as always: an END, or a legacy writer's entries).
local tail = nil
local retry = mine and run_last
local after_last = false  -- the log holds entries after `last` (an END, a legacy write)
if retry and batch_seq < expected then
  if #redis.call('XRANGE', KEYS[2], '(' .. run_last, '+', 'COUNT', 1) == 0 then
    if redis.call('EXISTS', KEYS[2]) == 1 then tail = {run_last} end
  else
    retry, after_last = false, true
  end
else
  retry = false
end
-- From the record (see the top): an END, or the newest id, presumed still in the log.
local presumed = false
if not retry then
  if run_last and not after_last then
    if run_status and run_status ~= 'running' then
      return {'ended', redis.call('HGET', KEYS[1], 'end_id') or ''}
    end
    if ARGV[8] == '1' then
      -- The legacy scan: an unfenced writer's entries follow `last` (XADD * ids grow).
      -- Reading just those (none, nearly always) loads no event of the run's own. (Not
      -- seen: an END such a writer put in a log it recreated, after a removal, at or
      -- below `last`, in the same millisecond or by a clock behind. Readers still stop
      -- at it; only the producer's refusal is missed.)
      tail = redis.call('XREVRANGE', KEYS[2], '+', '(' .. run_last, 'COUNT', 1)[1]
    end
    if not tail then tail, presumed = {run_last}, true end
  else
    tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
  end
end
if tail and tail[2] and tail[2][1] == 'end' then
  return {'ended', tail[1]}
end
-- The log of an ended run was removed: the record still says it ended.
if not tail and run_status and run_status ~= 'running' then
  return {'ended', ''}
end
-- The owner's lease lapsing fences it too (checked after END, so a late write to an
-- ended run is reported as such).
if tonumber(run_lease_until or '0') <= now then
  return {'fenced', 'lease_expired'}
end

-- Numbered appends, the last check before writing: the rule of gateway/sequence.py. The
-- numbering belongs to one token (a takeover starts a new one): seq_tok, seq_next (next
-- expected number), seq_last (id of event seq_next-1) and seq_base (events seq_base ..
-- seq_next-1 are the log's newest numbered entries, back to back). A batch below seq_next
-- has its applied events' ids taken from the record below (never read from the log, so
-- the cost does not depend on the events' size) and appends only its tail; a batch past
-- seq_next is a gap; an overlap whose ids are not recorded, or no longer in the log
-- (removed, or not newer than its floor), is a conflict.
--
-- The record of the numbering's newest ids: buckets of at least SEQ_BUCKET events, the
-- open one in `seq_cur` (rewritten by each numbered append, which reads it with the rest
-- of the record), closed ones in the ring of fields sq0 .. sq<SEQ_BUCKETS-1> (`seq_n`
-- closed so far in this numbering; bucket j is `sq<j % SEQ_BUCKETS>`), so at least
-- LOOKBACK events are always recorded. A bucket is "<first number>:<base ms>" and, per
-- run of consecutive ids, " <count>:<ms - base ms>-<first sequence part>": a few bytes an
-- append. `floor` (the newest id trimmed or removed) is written with it when it moves.
--! const LOOKBACK
--! const SEQ_BUCKET
--! const SEQ_BUCKETS

local function id_parts(id)
  local ms, part = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(part)
end

-- Appends to `out` the ids `bucket` records for numbers `from` on, up to `want` in all.
local function bucket_ids(bucket, from, want, out)
  local first, base = string.match(bucket, '^(%d+):(%d+)')
  local at = tonumber(first)
  base = tonumber(base)
  for k, dms, part in string.gmatch(bucket, ' (%d+):(%d+)%-(%d+)') do
    k = tonumber(k)
    if at + k > from then
      local ms, part0 = base + tonumber(dms), tonumber(part)
      for i = math.max(0, from - at), k - 1 do
        if #out == want then return end
        out[#out + 1] = string.format('%d-%d', ms, part0 + i)
      end
    end
    at = at + k
  end
end

local function bucket_start(bucket)
  return tonumber(string.match(bucket, '^(%d+)'))
end

-- The recorded ids of numbers `from` .. from+want-1 (fewer when not recorded).
local function recorded_ids(cur, closed, from, want)
  local out = {}
  if cur ~= '' and bucket_start(cur) <= from then
    bucket_ids(cur, from, want, out)
    return out
  end
  -- the newest closed bucket that starts at or before `from` (buckets start in order)
  local lo, hi, found = math.max(0, closed - SEQ_BUCKETS), closed - 1, nil
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local bucket = redis.call('HGET', KEYS[1], 'sq' .. (mid % SEQ_BUCKETS))
    if bucket and bucket_start(bucket) <= from then
      found, lo = mid, mid + 1
    else
      hi = mid - 1
    end
  end
  if not found then return out end
  for j = found, closed - 1 do
    local bucket = redis.call('HGET', KEYS[1], 'sq' .. (j % SEQ_BUCKETS))
    if not bucket then return out end
    bucket_ids(bucket, from, want, out)
    if #out == want then return out end
  end
  if cur ~= '' then bucket_ids(cur, from, want, out) end
  return out
end

local count = (#ARGV - FIRST + 1) / 2
local skip = 0
local applied = {}
if batch_seq then
  if batch_seq > expected then
    return {'sequence_gap', expected}
  end
  if batch_seq < expected then
    local lookback = expected - batch_seq
    if batch_seq < tonumber(run_seq_base) or lookback > LOOKBACK then
      return {'sequence_conflict', expected}
    end
    skip = math.min(count, lookback)
    applied = recorded_ids(run_seq_cur or '', tonumber(run_seq_n or '0'), batch_seq, skip)
    if #applied < skip or not tail then
      return {'sequence_conflict', expected}
    end
    local run_floor = redis.call('HGET', KEYS[1], 'floor')
    if run_floor then  -- the first of them must be newer than the log's floor
      local ms, part = id_parts(applied[1])
      local fms, fpart = id_parts(run_floor)
      if ms < fms or (ms == fms and part <= fpart) then
        return {'sequence_conflict', expected}
      end
    end
    if skip == count then
      -- All applied before: nothing is appended; like any publish it renews the lease.
      redis.call('HSET', KEYS[1], 'lease_until', string.format('%d', now + tonumber(run_lease_ms)))
      local dup = {'duplicate', run_cancel == '1' and 1 or 0, run_session or ''}
      for i = 1, #applied do dup[#dup + 1] = applied[i] end
      return dup
    end
    count = count - skip
  end
end

-- No log but the run handed out ids before: it was removed under a live producer, and
-- the new log's ids follow the last one (its floor).
local floor = nil
if not tail and run_last then
  floor = run_last
end
local server = server_identity(ARGV[7])
local epoch, epoch_moved = run_epoch(run_srv, run_ep, server)
local prev = tail and tail[1] or run_last
local in_log = tail ~= nil

local reply = {'ok', run_cancel == '1' and 1 or 0, run_session or ''}
local push_limit = tonumber(ARGV[4])
local push = {}
local push_bytes = 0
local runs = {}  -- numbered: the new ids as runs of consecutive ones, {ms, part, count}
for i = FIRST + 2 * skip, #ARGV, 2 do
  local id = nil
  if presumed then
    presumed = false
    id = redis.call('XADD', KEYS[2], 'NOMKSTREAM', entry_id(epoch, prev, now, in_log), 'e',
      ARGV[i], 'd', ARGV[i + 1])
    if not id then
      -- The log was removed under the producer: as for any missing log, the new one's
      -- ids follow the last one the run handed out, its floor.
      tail, floor, in_log = nil, run_last, false
    end
  end
  if not id then
    id = redis.call('XADD', KEYS[2], entry_id(epoch, prev, now, in_log), 'e', ARGV[i],
      'd', ARGV[i + 1])
  end
  prev, in_log = id, true
  reply[#reply + 1] = id
  if batch_seq then
    local ms, part = id_parts(id)
    local run = runs[#runs]
    if run and run[1] == ms and run[2] + run[3] == part then
      run[3] = run[3] + 1
    else
      runs[#runs + 1] = {ms, part, 1}
    end
  end
  push_bytes = push_bytes + #ARGV[i + 1]
  if push_bytes <= push_limit then
    push[#push + 1] = string.format('%s %s %d\n', id, ARGV[i], #ARGV[i + 1]) .. ARGV[i + 1]
  end
end
local last = reply[#reply]

local numbering = nil
if batch_seq then
  -- The numbered run goes on while nothing else was appended since its newest event
  -- (then its token and base stay as they are); else it starts at this batch.
  -- (Written with the record's other fields, in the one HSET below; a field that keeps
  -- its value is not written again.)
  local first_new = batch_seq + skip
  numbering = {'seq_next', string.format('%d', first_new + count), 'seq_last', last}
  if not (mine and run_last == run_seq_last) then
    numbering[#numbering + 1] = 'seq_tok'
    numbering[#numbering + 1] = ARGV[1]
    numbering[#numbering + 1] = 'seq_base'
    numbering[#numbering + 1] = string.format('%d', first_new)
  end
  -- The record: these ids join the open bucket (a new numbering starts a new record),
  -- which closes into the ring once it holds SEQ_BUCKET events.
  local cur, closed = '', 0
  if mine then cur, closed = run_seq_cur or '', tonumber(run_seq_n or '0') end
  local closes = not mine  -- seq_n is written: a new numbering's, or a closing bucket's
  if cur == '' then cur = string.format('%d:%d', first_new, runs[1][1]) end
  local bucket_base = tonumber(string.match(cur, ':(%d+)'))
  local parts = {cur}
  for _, run in ipairs(runs) do
    parts[#parts + 1] = string.format(' %d:%d-%d', run[3], run[1] - bucket_base, run[2])
  end
  cur = table.concat(parts)
  if first_new + count - bucket_start(cur) >= SEQ_BUCKET then
    numbering[#numbering + 1] = 'sq' .. (closed % SEQ_BUCKETS)
    numbering[#numbering + 1] = cur
    cur, closed, closes = '', closed + 1, true
  end
  numbering[#numbering + 1] = 'seq_cur'
  numbering[#numbering + 1] = cur
  if closes then
    numbering[#numbering + 1] = 'seq_n'
    numbering[#numbering + 1] = string.format('%d', closed)
  end
  if skip > 0 then
    -- The reply lists every event of the batch: first-assigned ids, then the new ones.
    local full = {'overlap', reply[2], reply[3], skip}
    for i = 1, skip do full[#full + 1] = applied[i] end
    for i = 4, #reply do full[#full + 1] = reply[i] end
    reply = full
  end
end

local maxlen = tonumber(ARGV[2])
local length = (tail and tonumber(run_len or '0') or 0) + count
local trimming = length > maxlen + tonumber(ARGV[5])
local ttl = tonumber(ARGV[3])
local remove_at = run_remove_at and tonumber(run_remove_at) or 0
local ttl_at = tonumber(run_ttl_at or '0')
local refresh = not tail or now - ttl_at >= ttl / 16 or remove_at > 0

-- The turn record follows the append in this same step (turn_fold.lua): the events
-- appended now (an overlapping numbered batch folded its first `skip` events before)
-- fold at once, but text, which waits in the log until a fold is due (`tpend`, `tfold`:
-- see turn_fold.lua); due before this script trims or a scheduled removal can take it.
-- While the turn is parked (`tpark`) its text folds at once: the record then outlives
-- the run's keys (no TTL), and text waiting in the log would expire with them.
local pending = nil  -- the record's new `tpend`, `tfold` and `tpark`, when they move
if run_session and run_session ~= '' and KEYS[3] then
  local pend, after = tonumber(run_tpend or '0'), run_tfold
  local at_once, deferred, moves = {}, false, false
  local parked = run_tpark == '1'
  for i = FIRST + 2 * skip, #ARGV, 2 do
    if TURN_IS_TEXT(ARGV[i]) and not parked then
      deferred = true
    else
      at_once[#at_once + 1] = {ARGV[i], ARGV[i + 1], now}
      moves = moves or ARGV[i] == 'state' or ARGV[i] == 'status'
    end
  end
  if pend == 0 and deferred then after = tail and tail[1] or '0-0' end
  if pend > 0 or deferred then pend = pend + count end
  local fold_now = #at_once > 0 or refresh  -- (else folding nothing changes nothing)
  local fold_text = pend > 0 and (pend >= TURN_FOLD_EVERY or moves or trimming or remove_at > 0)
  local now_parked = nil
  -- The library is made only by a call that folds or renews the record: a text event
  -- between folds needs neither. A state or status event (`moves`) folds at once.
  if fold_now or fold_text then
    local turn = turn_library()
    if fold_now then
      turn.guarded(turn.fold_events, KEYS[3], KEYS[4], at_once, ttl, refresh)
    end
    if fold_text then
      turn.guarded(turn.fold_pending, KEYS[3], KEYS[4], KEYS[2], after, pend)
      pend = 0
    end
    if moves then  -- (the pending text is folded: none waits while parked)
      local state = redis.call('HGET', KEYS[3], turn.FIELD.state) or ''
      now_parked = turn.PARKED[state] and '1' or '0'
    end
  end
  if pend > 0 then
    pending = {'tpend', string.format('%d', pend)}
    if after ~= run_tfold then  -- (a field that keeps its value is not written again)
      pending[3], pending[4] = 'tfold', after
    end
  elseif run_tpend and run_tpend ~= '0' then
    pending = {'tpend', '0'}
  end
  if now_parked and now_parked ~= (run_tpark or '0') then
    pending = pending or {}
    pending[#pending + 1] = 'tpark'
    pending[#pending + 1] = now_parked
  end
end

if trimming then
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

local updated = string.format('%d', now)
local record = {'lease_until', string.format('%d', now + tonumber(run_lease_ms)),
  'updated', updated, 'last', last, 'len', string.format('%d', length)}
if refresh then
  record[#record + 1] = 'ttl_at'
  record[#record + 1] = updated
end
if numbering then
  for i = 1, #numbering do record[#record + 1] = numbering[i] end
end
if floor then  -- what an overlap's ids are checked against (above)
  record[#record + 1] = 'floor'
  record[#record + 1] = floor
end
if pending then
  for i = 1, #pending do record[#record + 1] = pending[i] end
end
if epoch_moved then
  record[#record + 1] = 'srv'
  record[#record + 1] = server
  record[#record + 1] = 'ep'
  record[#record + 1] = string.format('%d', epoch)
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
-- Wake the gateways following this run (the channel is the log key's name).
if tail and #push == count then
  redis.call('SPUBLISH', KEYS[2],
    string.format('e %s %d\n', tail[1], count) .. table.concat(push))
else
  redis.call('SPUBLISH', KEYS[2], '')
end
return reply
