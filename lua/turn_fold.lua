-- turn_fold.lua: the turn record of a run, written by the script that writes the run
-- (claim.lua, publish.lua, publish_end.lua include this file; text events later, from
-- the log, and before any read: see turn_fold_pending), so a record never lags what a
-- reader of its log can read and a write that appends nothing changes nothing. The rules are
-- gateway/sessions/turns.py's (`new_turn`, `fold_encoded`, `end_turn`): that module is
-- the spec, and tests/test_sessions_contract.py holds this file to it on the same event
-- sequences. Change both together.
--
-- The record is two keys in the run's slot (`{run_id}` tag, beside the run's meta/log):
--   turn hash  session, order, state, created / updated (ms), chars (text length in code
--              points), trunc ("1" once a cap dropped something), status (raw JSON),
--              arts (count), art:<i> (raw JSON), aid:<i> (its string artifactId),
--              hist (count), hist:<i> (raw JSON)
--   text       string: the joined answer text (APPENDed, so an append is O(piece))
-- The hash's field names are declared once, gateway/redis/turn_fields.py: the loader
-- gives them here as TURN_FIELD (never spell one in this file).
-- Items are stored as the payload bytes the log holds (compact JSON).
-- Retention follows the run: the run's rolling TTL while running, none while parked on
-- the operator, the ended record TTL after END.
--
-- The text events' fold is deferred (a token then costs the record no command): the
-- run record keeps `tpend`, how many log entries follow `tfold` (the newest entry whose
-- text is in the record) while any is pending, and the pending text is folded from the
-- log, at most TURN_FOLD_EVERY entries behind: by the append that reaches that many, by
-- one that moves the state, trims the log or writes under a scheduled removal, at END,
-- before a removal, and by every read of the record (turn_read.lua), so no reader sees
-- it lag the log. Text events change only text, chars, trunc and updated, which no other
-- event reads, so folding them later gives the record they would have given at once.
-- Not while the turn is parked (`tpark` in the run record, publish.lua): a parked record
-- has no TTL and outlives the run's keys, so its text is folded at once; and a claim
-- that opens a new record clears both (claim.lua).
-- These two are made outside the library: an append of a text event decides by them
-- alone, and makes the library only when it folds or renews the record. TURN_IS_TEXT
-- (name -> bool) is gateway/sessions/turns.py's TEXT_EVENTS, given by the loader.
--! const TURN_IS_TEXT
local TURN_FOLD_EVERY = 64

-- The library is made by calling turn_library(), once per script call, by a script that
-- touches a record and only when it does: its tables and closures, made at every call of
-- every script that includes this file, cost a lone append about a tenth of its Redis
-- time (34,000 of 314,000 instructions, callgrind; bench/lua_cost.py).
local function turn_library()
  --! const TURN_FIELD
  local TURN_MAX_TEXT, TURN_MAX_ARTS, TURN_MAX_HIST, TURN_MAX_ITEM = 200000, 32, 32, 65536
  -- orjson encodes at most 254 nested containers; an item is kept only if the record
  -- holding it, as readers get it ({"turns": [record]}), still encodes
  local TURN_MAX_NESTING, TURN_IN_RECORD, TURN_IN_LIST = 254, 3, 4
  local TURN_LIVE = {['running'] = true, ['input-required'] = true, ['auth-required'] = true}
  local TURN_PARKED = {['input-required'] = true, ['auth-required'] = true}
  local TURN_ENDED = {['success'] = true, ['error'] = true, ['cancelled'] = true,
    ['interrupted'] = true, ['producer_lost'] = true}
  local TURN_STATUS_MAP = {['input-required'] = 'input-required',
    ['auth-required'] = 'auth-required', ['running'] = 'running', ['working'] = 'running'}
  --! const TURN_IS_EVENT

  local function turn_chars(s)
    local _, n = string.gsub(s, '[^\128-\191]', '')
    return n
  end

  -- the first k code points of s
  local function turn_cut(s, k)
    if k <= 0 then return '' end
    local n = 0
    for start in string.gmatch(s, '()[^\128-\191]') do
      n = n + 1
      if n == k + 1 then return string.sub(s, 1, start - 1) end
    end
    return s
  end

  -- whether the payload, `around` containers deep, still encodes
  local function turn_nests(p, around)
    local _, opens = string.gsub(p, '[%[{]', '')
    if opens + around <= TURN_MAX_NESTING then return true end
    local s = string.gsub(string.gsub(string.gsub(p, '\\.', ''), '"[^"]*"', ''), '[^%[%]{}]', '')
    local depth, deepest = 0, 0
    for i = 1, #s do
      local c = string.byte(s, i)
      if c == 91 or c == 123 then
        depth = depth + 1
        if depth > deepest then deepest = depth end
      else
        depth = depth - 1
      end
    end
    return deepest + around <= TURN_MAX_NESTING
  end

  local function turn_item_ok(p, around)
    return #p <= TURN_MAX_ITEM and turn_nests(p, around)
  end

  local function turn_set_ttl(tk, xk, state, ttl)
    if TURN_PARKED[state] then
      redis.call('PERSIST', tk)
      redis.call('PERSIST', xk)
    else
      redis.call('PEXPIRE', tk, ttl)
      redis.call('PEXPIRE', xk, ttl)
    end
  end

  -- Open the turn (claim.lua): once per run; a takeover claim keeps it as it is.
  local function turn_open(tk, session, order, shaped, now, ttl)
    if redis.call('EXISTS', tk) == 1 then return false end
    redis.call('HSET', tk, TURN_FIELD.session, session, TURN_FIELD.order, order,
      TURN_FIELD.state, 'running', TURN_FIELD.created, string.format('%d', now),
      TURN_FIELD.updated, string.format('%d', now),
      TURN_FIELD.chars, '0', TURN_FIELD.arts, '0', TURN_FIELD.hist, shaped ~= '' and '1' or '0')
    if shaped ~= '' then redis.call('HSET', tk, TURN_FIELD.hist_item .. '1', shaped) end
    redis.call('PEXPIRE', tk, ttl)
    return true
  end

  -- `rec`: the record's counters as turn_fold read them (one HMGET), written back once.
  local function turn_text(tk, xk, piece, append, rec)
    local chars = rec.chars
    local n = turn_chars(piece)
    local limit = append and TURN_MAX_TEXT - chars or TURN_MAX_TEXT
    if n > limit then
      piece = turn_cut(piece, limit)
      n = math.max(limit, 0)
      redis.call('HSET', tk, TURN_FIELD.trunc, '1')
    end
    local created
    if append then
      if piece == '' then return false end
      created = redis.call('APPEND', xk, piece) == #piece
      rec.chars = chars + n
    else
      local old = redis.call('GET', xk)
      if (old or '') == piece then return false end
      redis.call('SET', xk, piece, 'KEEPTTL')
      created = not old
      rec.chars = n
    end
    -- A text key lives as long as its record: every later change of the record's TTL
    -- sets both (turn_set_ttl, turn_end), so only a new key takes it over here.
    if created then
      local ttl = redis.call('PTTL', tk)
      if ttl > 0 then redis.call('PEXPIRE', xk, ttl) end
    end
    return true
  end

  -- One event; returns changed, and the state after it.
  local function turn_apply(tk, xk, name, p, state, rec)
    local ok, data = pcall(cjson.decode, p)
    if not ok then return false, state end
    local object = string.byte(p, 1) == 123
    if name == 'token' or name == 'text-delta' or name == 'text-set' then
      local piece = nil
      if type(data) == 'string' then
        piece = data
      elseif object and type(data['text']) == 'string' then
        piece = data['text']
      end
      if not piece then return false, state end
      return turn_text(tk, xk, piece, name ~= 'text-set', rec), state
    elseif name == 'ui' then
      if not object or data['type'] ~= 'text-delta' or type(data['delta']) ~= 'string' then
        return false, state
      end
      return turn_text(tk, xk, data['delta'], true, rec), state
    elseif name == 'state' then
      local s = data
      if object then s = data['state'] end
      if type(s) ~= 'string' or not TURN_LIVE[s] or s == state then return false, state end
      redis.call('HSET', tk, TURN_FIELD.state, s)
      return true, s
    elseif not object then
      return false, state
    elseif name == 'artifact' then
      if not turn_item_ok(p, TURN_IN_LIST) then
        redis.call('HSET', tk, TURN_FIELD.trunc, '1')
        return true, state
      end
      local count = tonumber(redis.call('HGET', tk, TURN_FIELD.arts) or '0')
      local id = data['artifactId']
      if type(id) == 'string' then
        for i = 1, count do
          if redis.call('HGET', tk, TURN_FIELD.aid .. i) == id then
            redis.call('HSET', tk, TURN_FIELD.art .. i, p)
            return true, state
          end
        end
      end
      if count >= TURN_MAX_ARTS then
        redis.call('HSET', tk, TURN_FIELD.trunc, '1')
        return true, state
      end
      count = count + 1
      redis.call('HSET', tk, TURN_FIELD.arts, string.format('%d', count),
        TURN_FIELD.art .. count, p)
      if type(id) == 'string' then redis.call('HSET', tk, TURN_FIELD.aid .. count, id) end
      return true, state
    elseif name == 'status' then
      if not turn_item_ok(p, TURN_IN_RECORD) then
        redis.call('HSET', tk, TURN_FIELD.trunc, '1')
        return true, state
      end
      redis.call('HSET', tk, TURN_FIELD.status, p)
      local s = data['state']
      if type(s) == 'string' and TURN_STATUS_MAP[s] then
        state = TURN_STATUS_MAP[s]
        redis.call('HSET', tk, TURN_FIELD.state, state)
      end
      return true, state
    elseif name == 'history' or name == 'message' then
      local count = tonumber(redis.call('HGET', tk, TURN_FIELD.hist) or '0')
      if not turn_item_ok(p, TURN_IN_LIST) or count >= TURN_MAX_HIST then
        redis.call('HSET', tk, TURN_FIELD.trunc, '1')
        return true, state
      end
      count = count + 1
      redis.call('HSET', tk, TURN_FIELD.hist, string.format('%d', count),
        TURN_FIELD.hist_item .. count, p)
      return true, state
    end
    return false, state
  end

  -- Fold `events` ({name, payload, at ms} each, in log order) into the record, if the run
  -- has one that has not ended. `ttl`: the run's rolling TTL; the record's is renewed with
  -- the run's (`refresh`) and whenever its state moves in or out of parked. `updated`
  -- moves to the newest `at` of an event that changed the record (never backwards).
  local function turn_fold_events(tk, xk, events, ttl, refresh)
    local state = nil
    local retime = refresh
    local newest = nil
    local rec = nil
    for _, ev in ipairs(events) do
      if TURN_IS_EVENT(ev[1]) then
        if state == nil then
          -- what a text event needs, in one read
          local got = redis.call('HMGET', tk, TURN_FIELD.state, TURN_FIELD.chars,
            TURN_FIELD.updated)
          state = got[1]
          if not state or TURN_ENDED[state] then return end
          rec = {chars = tonumber(got[2] or '0'), updated = tonumber(got[3] or '0')}
        end
        local before = state
        local moved
        moved, state = turn_apply(tk, xk, ev[1], ev[2], state, rec)
        if moved and (not newest or ev[3] > newest) then newest = ev[3] end
        if TURN_PARKED[before] ~= TURN_PARKED[state] then retime = true end
      end
    end
    if newest then
      redis.call('HSET', tk, TURN_FIELD.chars, string.format('%d', rec.chars),
        TURN_FIELD.updated, string.format('%d', math.max(rec.updated, newest)))
    end
    if not retime then return end
    if state == nil then state = redis.call('HGET', tk, TURN_FIELD.state) end
    if state and not TURN_ENDED[state] then turn_set_ttl(tk, xk, state, ttl) end
  end

  -- Fold the pending text of the log `lk` (entries after `after`, `pend` events) into the
  -- record, if the run has one that has not ended (none: a cleared session's; nothing to
  -- fold into, nor to mark). Fewer events in the log than pending (an END or a gateway's
  -- entry is not one): it was removed (DEL) or evicted outside the scripts, which fold
  -- before every removal and trim they make, and took text the record had not folded: the
  -- record says so (`trunc`), as when a cap drops text.
  local function turn_fold_pending(tk, xk, lk, after, pend)
    local state = redis.call('HGET', tk, TURN_FIELD.state)
    if not state or TURN_ENDED[state] then return end
    local entries = redis.call('XRANGE', lk, '(' .. after, '+')
    local events, found = {}, 0
    for _, entry in ipairs(entries) do
      local f = entry[2]
      if f[1] == 'e' then
        found = found + 1
        if TURN_IS_TEXT(f[2]) then
          events[#events + 1] = {f[2], f[4], tonumber(string.match(entry[1], '^(%d+)'))}
        end
      end
    end
    if found < pend then redis.call('HSET', tk, TURN_FIELD.trunc, '1') end
    if #events > 0 then turn_fold_events(tk, xk, events, 0, false) end
  end

  -- The run's END (publish_end.lua's settle): the record takes the END status.
  local function turn_end(tk, xk, status, now, ttl)
    local state = redis.call('HGET', tk, TURN_FIELD.state)
    if not state or TURN_ENDED[state] then return end
    local updated = tonumber(redis.call('HGET', tk, TURN_FIELD.updated) or '0')
    redis.call('HSET', tk, TURN_FIELD.state, status,
      TURN_FIELD.updated, string.format('%d', math.max(updated, now)))
    redis.call('PEXPIRE', tk, ttl)
    redis.call('PEXPIRE', xk, ttl)
  end

  -- The including script has written the run already: a failure here must not abort it
  -- half way (Redis does not roll a script back). It is logged; none is expected (the
  -- rules above only branch on what they read, and decoding is guarded).
  local function turn_guarded(step, ...)
    local ok, err = pcall(step, ...)
    if not ok then
      redis.log(redis.LOG_WARNING, 'turn record not updated: ' .. tostring(err))
    end
  end

  return {
    FIELD = TURN_FIELD, PARKED = TURN_PARKED, open = turn_open,
    fold_events = turn_fold_events, fold_pending = turn_fold_pending, finish = turn_end,
    guarded = turn_guarded,
  }
end
