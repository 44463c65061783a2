-- publish_end.lua: append the END entry of a run log, at most once.
--
-- Token check first (or, for an unowned recovery END, a check that the lease has
-- expired); then the tail: an END there makes this an idempotent success. With the
-- legacy scan on, a non-END tail triggers a scan of the whole retained window for an
-- older END (left by an unfenced legacy writer, possibly followed by events): that
-- costs O(retained bytes) and blocks Redis while it runs. With it off, END
-- publication is tail-only.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  producer token, "" for an unowned recovery END
-- ARGV[2]  END status
-- ARGV[3]  error JSON, "" for none
-- ARGV[4]  "1" to run the legacy END scan, else "0"
-- ARGV[5]  how long the finished log stays readable, ms
-- ARGV[6]  TTL of the run record after END, ms
--
-- Returns {"ok", end_id, deduplicated (0|1), session_id_or_"", scanned (0|1)}
--         scanned is 1 when this call ran the legacy scan of the retained window
--       | {"noop"}                         recovery END on a missing stream: nothing created
--       | {"fenced", "token" | "lease_expired" | "lease_live"}
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

local meta = redis.call('HMGET', KEYS[1], 'token', 'lease_until', 'status', 'end_id', 'session')
local session = meta[5] or ''
local lease_until = tonumber(meta[2] or '0')
local exists = redis.call('EXISTS', KEYS[2]) == 1

if ARGV[1] == '' then
  if not exists then
    return {'noop'}
  end
  if meta[1] and lease_until > now then
    return {'fenced', 'lease_live'}
  end
elseif not meta[1] or meta[1] ~= ARGV[1] then
  return {'fenced', 'token'}
end

local function settle(end_id, status)
  redis.call('HSET', KEYS[1], 'status', status, 'end_id', end_id,
    'updated', string.format('%d', now), 'lease_until', '0')
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end

local tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if tail and tail[2][1] == 'end' then
  if meta[3] == 'running' or not meta[3] then settle(tail[1], tail[2][2]) end
  return {'ok', tail[1], 1, session, 0}
end
if not tail and meta[3] and meta[3] ~= 'running' then
  return {'ok', meta[4] or '', 1, session, 0}
end
-- Repeating an END is idempotent even after the lease lapsed; a first END is not.
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
        settle(entry[1], entry[2][2])
        return {'ok', entry[1], 1, session, 1}
      end
    end
    if #page < 512 then break end
    cursor = '(' .. page[#page][1]
  end
end

local end_id
if ARGV[3] ~= '' then
  end_id = redis.call('XADD', KEYS[2], '*', 'end', ARGV[2], 'err', ARGV[3])
else
  end_id = redis.call('XADD', KEYS[2], '*', 'end', ARGV[2])
end
settle(end_id, ARGV[2])
redis.call('PUBLISH', KEYS[2], '')  -- wake the gateways following this run
return {'ok', end_id, 0, session, scanned}
