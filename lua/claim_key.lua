-- claim_key.lua: a claim's idempotency key in its session (gateway/bridge/turn_keys.py).
-- One slot: the `{session_id}` keys. The first step of a claim that carries a key,
-- before session_claim.lua and the run's claim.lua: of two claims with the same key at
-- once, exactly one takes the entry; the other is told who holds it.
--
-- KEYS[1]  the key's entry (hash: run, at = when taken, ms)
-- ARGV[1]  "take" | "release"
-- ARGV[2]  the claiming run
-- ARGV[3]  take: the run the entry may hold and still be replaced ("": only an absent
--          entry is taken); the gateway passes it once `turn_keys.decide` found that
--          holder no longer counts (ended past its TTL, or its claim never completed)
-- ARGV[4]  take: how long the entry lives, ms (bounded: it never outlives its run's
--          record by much, and a reader re-checks the holder anyway)
--
-- Returns take: {"taken"} | {"held", run, age_ms}
--         release (a claim that took the entry fresh and then failed): 1 | 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
--! read held KEYS[1] run at
if ARGV[1] == 'release' then
  if held_run == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
if held_run and held_run ~= ARGV[3] then
  return {'held', held_run, string.format('%d', math.max(0, now - tonumber(held_at or '0')))}
end
redis.call('HSET', KEYS[1], 'run', ARGV[2], 'at', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'taken'}
