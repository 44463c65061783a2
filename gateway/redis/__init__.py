"""Everything that speaks Redis, in one package (the memory backend needs none of it).

bridge.py        RedisStreamBridge: the producer's writes, and the wiring of the rest
calls.py         the one call boundary (a pass at the pool, the deadline, re-sends, one
                 error mapping that never shows the address): the bridge's and the
                 session store's
connect.py       connection setup: the command client, where the notifier listens
reads.py         reads of a run, one round trip each; first reads shared by a crowd
view.py          RunView, a subscription's view for the shared loop (bridge/reader.py)
session_hints.py a session's side of a run's writes: its order, the index hints
sessions.py      RedisSessionStore: turn records in their runs' slots, the session index,
                 on the same call boundary
wire.py          the command pool and its connections (commands packed with hiredis)
pool.py          PoolGate: passes at the pool; the connections scripts keep between them
notifier.py      change notifications: sharded pub/sub, one listener per node
fanout.py        RunFeed: a run's log read once per change, shared by local subscribers
codec.py         stream entries, read replies and pushed notifications, decoded
replies.py       conversions at the boundary (`as_text`, `ceil_ms`)
scripts.py       the Lua scripts of `lua/` (and `--! include` lines), loaded and reloaded
keys.py          run key names ({run_id} hash tag)   session_keys.py: session key names
compat.py        every redis-py hook beyond its documented API, with the versions checked
"""
