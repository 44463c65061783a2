-- session_ttl.lua (included): how long a session's own keys (meta hash, order zset) live.
--
-- They live at least the given TTL after the newest claim or turn move, and without TTL
-- while a turn of the session is parked on the operator (its record is not swept
-- either). Which turns are parked is counted in the meta hash, idempotently (a touch is
-- resent after a lost reply): `p:<run>` per parked turn and `parked`, their number.
-- A key with no TTL while none is parked (left by a gateway before this rule) gets one.

-- The keys of a session with no parked turn expire `ttl` ms from now at the earliest.
local function session_keep(meta, order, ttl)
  if tonumber(redis.call('HGET', meta, 'parked') or '0') > 0 then
    return
  end
  for _, key in ipairs({meta, order}) do
    local left = redis.call('PTTL', key)
    -- -2: no such key (nothing to keep); -1: no TTL; else ms left
    if left == -1 or (left >= 0 and left < ttl) then redis.call('PEXPIRE', key, ttl) end
  end
end

-- Run `run` is parked (true) or not any more (false): the count follows, and the keys
-- lose their TTL while any is parked, and get it back when none is.
local function session_parked(meta, order, run, parked, ttl)
  if parked then
    if redis.call('HSETNX', meta, 'p:' .. run, '1') == 1 then
      redis.call('HINCRBY', meta, 'parked', 1)
    end
    redis.call('PERSIST', meta)
    redis.call('PERSIST', order)
  else
    if redis.call('HDEL', meta, 'p:' .. run) == 1 then
      redis.call('HINCRBY', meta, 'parked', -1)
    end
    session_keep(meta, order, ttl)
  end
end
