-- session_claim.lua: a run's claim under a session takes the session's next order, the
-- first step of a claim with a session (claim.lua then opens the turn record with it, in
-- the run's slot). One slot: the `{session_id}` keys. Idempotent per run: a takeover
-- claim gets the order it had.
--
-- KEYS[1]  tombstone   KEYS[2]  session meta (seq, last_updated, c:<run> claim ms,
--          parked + p:<run>: the session's parked turns, session_touch.lua)
-- KEYS[3]  order zset
-- ARGV[1]  run_id
-- ARGV[2]  how long the session's keys live at least from now, ms
--
-- Returns {"retired"} (no turn opens) | {"ok", order, new (0|1), last_updated}
-- A new order SPUBLISHes the session's feed channel (below).
--! include session_ttl
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'retired'}
end
local known = redis.call('ZSCORE', KEYS[3], ARGV[1])
if known then
  return {'ok', tonumber(known), 0, redis.call('HGET', KEYS[2], 'last_updated') or '0'}
end
local t = redis.call('TIME')
local stamp = string.format('%d.%06d', t[1], t[2])
local order = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('ZADD', KEYS[3], order, ARGV[1])
-- when the claim took its order: a reader finding no record yet waits for it a while
redis.call('HSET', KEYS[2], 'last_updated', stamp,
  'c:' .. ARGV[1], string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
-- The keys outlive the turns they point at (a reader drops entries whose record is
-- gone), and lose their TTL only while a turn of the session is parked.
session_keep(KEYS[2], KEYS[3], tonumber(ARGV[2]))
-- Wake the session's feeds in this same step, so that no crash can lose the news of a
-- turn (they then wait only on this channel, with no poll of their own). The channel
-- is the session's `feed` (redis/session_keys.py), named like its keys: same slot.
redis.call('SPUBLISH', (string.gsub(KEYS[1], ':tomb$', ':feed')), '')
return {'ok', order, 1, stamp}
