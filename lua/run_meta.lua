-- run_meta.lua: a run meta hash's fields, read by name in one HMGET per script.
-- `run_meta(KEYS[1], {'token', 'status'})` returns {token = ..., status = ...}; a field
-- the hash lacks is nil (HMGET's false left out), so `meta.x or default` reads plainly.
local function run_meta(key, names)
  local values = redis.call('HMGET', key, unpack(names))
  local meta = {}
  for i, name in ipairs(names) do
    if values[i] then meta[name] = values[i] end
  end
  return meta
end
