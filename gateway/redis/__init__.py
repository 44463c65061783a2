"""Everything that speaks Redis, in one package (the memory backend needs none of it).

bridge.py        RedisStreamBridge: connect, the call boundary (`command`: deadlines,
                 retries, error mapping that never shows the address), publish, read;
                 `_RunView`, a subscription's view for the shared loop (bridge/reader.py)
sessions.py      RedisSessionStore: turn records in their runs' slots, the session index,
                 on the bridge's call boundary
wire.py          the command pool and its connections (commands packed with hiredis)
turns.py         turns at the pool; the connections scripts keep between turns
notifier.py      change notifications: sharded pub/sub, one listener per node
fanout.py        RunFeed: a run's log read once per change, shared by local subscribers
codec.py         stream entries, read replies and pushed notifications, decoded
replies.py       conversions at the boundary (`as_text`, `ceil_ms`)
scripts.py       the Lua scripts of `lua/` (and `--! include` lines), loaded and reloaded
keys.py          run key names ({run_id} hash tag)   session_keys.py: session key names
compat.py        every redis-py hook beyond its documented API, with the versions checked
"""
