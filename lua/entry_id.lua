-- entry_id.lua (included by publish.lua and publish_end.lua): the ids of a run log's new
-- entries, never an id the run handed out before, whatever the server lost.
--
-- Redis' own ids (XADD *) follow the stream's last generated id on the server that runs
-- the write. After a failover to a replica that had not received the newest entries, or
-- a restart that lost them, that id is older than ids readers already hold, and with a
-- clock behind the lost one Redis would hand out those very ids again, to other events.
-- So each run has an epoch (`ep` in its record, 0 at first), and the server its last
-- write ran on (`srv`: the server's run_id, which every restart and every other server
-- changes; the gateway learns it when its connection connects and passes it in). A write
-- that finds another server than the last moves the epoch on, and from then on the
-- entries' ids are chosen here with a sequence part of at least epoch * EPOCH_SPAN: no
-- id of an earlier epoch has one that large, so none can be handed out again (a run's
-- ids stay below 2^53 for 8,191 epochs). Epoch 0 keeps Redis' own ids, as before.
-- Readers whose position the server lost get a gap (bridge/rules.py, `unvouched`).
--! const EPOCH_SPAN

-- The identity of the server running this write: the gateway passes it (its connection
-- learned it on connecting; "" when unknown), or '?' asks the server itself: on a Redis
-- Cluster the client routes the script (and follows redirections), so only the server
-- running it knows which it is (INFO server, ~2 us).
local function server_identity(given)
  if given ~= '?' then
    return given
  end
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
end

-- The run's epoch for a write on `server` ("" when unknown: the epoch stays), given the
-- stored `srv` and `ep`. Returns the epoch and whether the record must note it.
local function run_epoch(stored_server, stored_epoch, server)
  local epoch = tonumber(stored_epoch or '0')
  if server == '' or stored_server == server then
    return epoch, false
  end
  if stored_server then
    epoch = epoch + 1  -- the last write ran elsewhere: what followed it may be lost
  end
  return epoch, true
end

-- The id of an entry after `prev` (the newest id it must exceed; nil for none) in
-- `epoch` at `now` (ms): '*' where Redis' own choice is that id (epoch 0 after an entry
-- of the log), else explicit.
local function entry_id(epoch, prev, now, in_log)
  if epoch == 0 and (in_log or not prev) then
    return '*'
  end
  local base = epoch * EPOCH_SPAN
  if not prev then
    return string.format('%d-%d', now, base)
  end
  local ms, seq = string.match(prev, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if now > ms then
    return string.format('%d-%d', now, base)
  end
  if seq >= base then
    return string.format('%d-%d', ms, seq + 1)
  end
  return string.format('%d-%d', ms, base)
end
