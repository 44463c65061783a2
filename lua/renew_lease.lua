-- renew_lease.lua: extend a producer's lease without writing an event.
--
-- KEYS[1]  run meta hash      KEYS[2]  run log stream
-- ARGV[1]  producer token
-- ARGV[2]  lease length, ms; "" keeps the length the lease was claimed for
-- ARGV[3]  rolling TTL of the run's keys, ms
-- ARGV[4]  the mark of the streamed append renewing: the run's current stream, the
--          only one whose drop may cut the lease (lease_cut.lua); "" for a renewal from
--          elsewhere (`POST …/lease`), whose time is noted instead (`renewed`)
--
-- Returns {"ok", lease_until_ms, cancel_requested (0|1), now_ms (Redis' clock)}
--       | {"fenced", "token" | "lease_expired"}
--       | {"ended", status}
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)

--! read run KEYS[1] token lease_until status cancel lease_ms
if not run_token or run_token ~= ARGV[1] then
  return {'fenced', 'token'}
end
if run_status and run_status ~= 'running' then
  return {'ended', run_status}
end
if tonumber(run_lease_until or '0') <= now then
  return {'fenced', 'lease_expired'}
end
local tail = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
if tail and tail[2][1] == 'end' then
  return {'ended', tail[2][2]}
end

local lease_ms = ARGV[2]
if lease_ms == '' then lease_ms = run_lease_ms end
local new_until = now + tonumber(lease_ms)
redis.call('HSET', KEYS[1], 'lease_until', string.format('%d', new_until), 'lease_ms', lease_ms)
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'stream', ARGV[4])
else  -- a renewal from elsewhere: a drop seen before it cuts nothing (lease_cut.lua)
  redis.call('HSET', KEYS[1], 'renewed', string.format('%d', now))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
-- (and Redis' own time: the gateway reports the lease by its length, never comparing
-- this server's clock with its own)
return {'ok', string.format('%d', new_until), run_cancel == '1' and 1 or 0, string.format('%d', now)}
