-- session_turn_write.lua: store one turn record of a session, tombstone-checked, and keep
-- the session's per-session indexes (turn list, expiry list, meta) in step. All keys
-- carry the `{session_id}` hash tag, so this touches one Cluster slot. The global index
-- (another slot) is updated by session_index.lua afterwards; readers verify it.
--
-- Optimistic concurrency: the caller read `rev`, evolved the record in Python (turns.py,
-- the one definition of how a turn evolves) and writes it back only if `rev` is unchanged.
--
-- KEYS[1]  tombstone (string, no TTL)     KEYS[2]  session meta (hash)
-- KEYS[3]  turns (zset run_id -> last_updated, seconds)
-- KEYS[4]  expiries (zset run_id -> expiry, ms since epoch; +inf while parked)
-- KEYS[5]  the turn record (hash: rev, state, doc)
-- ARGV[1]  run_id                ARGV[2]  expected rev ("0" = the turn must not exist)
-- ARGV[3]  record JSON           ARGV[4]  record state
-- ARGV[5]  created_at (s)        ARGV[6]  last_updated (s)
-- ARGV[7]  TTL ms (0 = no TTL: a parked turn is never swept)
-- ARGV[8]  prune budget: at most this many expired turns are dropped from the lists
-- ARGV[9]  the session's feed channel: told when this write creates the turn (a new
--          turn is what session feeds wait for). Not a key, but a shard channel with
--          the `{session_id}` tag, so in this script's slot (SPUBLISH checks that)
--
-- Returns {"ok", session last_updated, state of the newest-created turn, turn count}
--       | {"retired"} (nothing written) | {"conflict"} (re-read and retry)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'retired'}
end
local rev = redis.call('HGET', KEYS[5], 'rev') or '0'
if rev ~= ARGV[2] then
  return {'conflict'}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run_id = ARGV[1]
local state = ARGV[4]
local created = tonumber(ARGV[5])
local updated = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])

redis.call('HSET', KEYS[5], 'rev', tonumber(rev) + 1, 'state', state, 'doc', ARGV[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[5], ttl)
  redis.call('ZADD', KEYS[4], now_ms + ttl, run_id)
else
  redis.call('PERSIST', KEYS[5])
  redis.call('ZADD', KEYS[4], '+inf', run_id)
end
redis.call('ZADD', KEYS[3], updated, run_id)
if ARGV[2] == '0' and ARGV[9] then
  redis.call('SPUBLISH', ARGV[9], run_id)
end

-- drop list entries of expired turns (their hashes are gone already), bounded
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[8]))
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end

local meta = redis.call('HMGET', KEYS[2], 'last_updated', 'newest_run', 'newest_created', 'last_state')
local last_updated = math.max(tonumber(meta[1] or '0'), updated)
local newest_run, newest_created, last_state = meta[2], tonumber(meta[3] or '-1'), meta[4]
if newest_run == run_id then
  last_state = state
elseif (ARGV[2] == '0' and created >= newest_created) or created > newest_created then
  newest_run, newest_created, last_state = run_id, created, state
end
redis.call('HSET', KEYS[2], 'last_updated', tostring(last_updated), 'newest_run', newest_run,
  'newest_created', tostring(newest_created), 'last_state', last_state)

-- the session's own keys live as long as its longest-lived turn (forever while parked)
local top = redis.call('ZREVRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if top[2] == 'inf' or tonumber(top[2]) == math.huge then
  redis.call('PERSIST', KEYS[2]); redis.call('PERSIST', KEYS[3]); redis.call('PERSIST', KEYS[4])
else
  local at = math.floor(tonumber(top[2]))
  redis.call('PEXPIREAT', KEYS[2], at); redis.call('PEXPIREAT', KEYS[3], at)
  redis.call('PEXPIREAT', KEYS[4], at)
end
return {'ok', tostring(last_updated), last_state, redis.call('ZCARD', KEYS[3])}
