-- lease_cut.lua: a streamed append's connection dropped without ending its body: its
-- producer's lease is cut to end `grace` from now (never lengthened), so the liveness
-- path ends the run producer_lost then unless the producer writes again first (any
-- append or lease renewal, on any gateway, renews the whole lease). Only the stream
-- that dropped may cut: a reconnect of the same producer that already renewed under a
-- new stream mark (renew_lease.lua ARGV[4]), renewed its lease by `POST …/lease` after
-- the drop, or appended since (`last` moved) is left alone.
--
-- KEYS[1]  run meta hash
-- ARGV[1]  producer token
-- ARGV[2]  the dropped stream's mark
-- ARGV[3]  grace, ms
-- ARGV[4]  the id of the last event that stream appended ("" for none): an append since
--          (a batch of the same producer, or another stream) keeps the lease
-- ARGV[5]  how long ago the gateway saw the drop, ms: a renewal since (`renewed`, by
--          this server's clock; only durations cross the wire) keeps the lease
--
-- Returns {the lease's end, this server's time} (ms, as strings) when this stream's lease
-- is now cut (or was already shorter): the gateway takes only their difference, what is
-- left of the lease, into its own clock. 0 when it is not this stream's to cut (another
-- token or stream, a write since, or the run has ended).
--! read run KEYS[1] token status lease_until stream last renewed
if not run_token or run_token ~= ARGV[1] or run_stream ~= ARGV[2] then
  return 0
end
if ARGV[4] ~= '' and run_last ~= ARGV[4] then
  return 0
end
if run_status and run_status ~= 'running' then
  return 0
end
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
if tonumber(run_renewed or '0') > now - tonumber(ARGV[5]) then
  return 0
end
local lease_until = math.min(tonumber(run_lease_until or '0'), now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'lease_until', string.format('%d', lease_until))
return {string.format('%d', lease_until), string.format('%d', now)}
