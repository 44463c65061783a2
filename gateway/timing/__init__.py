"""The timing primitives: cheap waits, deadlines and pacing, each one kept because a
benchmark showed what the plain form cost (BENCHMARKS.md names the figures).

deadlines.py   `Signal` (one wake-up for every waiter of a run), `Deadlines`/`Slots`
               (one loop timer per 25 ms slot shared by every heartbeat deadline, instead
               of a timer per reader) and `CallDeadlines` (the Redis bridge's per-command
               bound on the same slots, instead of an `asyncio.timeout` per call, which
               was about a tenth of an awaited publish's CPU; `bench/publish_call.py`).
               Idle streams are what a process holds thousands of (`bench/sse_idle.py`,
               17.4 KB each): per wait, one future and a place in a set, no timer.
pacing.py      `WakePacer`: wake a run's readers at once, unless appends come closer
               than twice the time they took to catch up, so a shared loop never
               starves the producer (`bench/bridge_fanout.py`, `bench/sse_memory.py`).
send_watch.py  `SendWatch`: one timer per event loop watches every write in flight
               (SSE responses, streamed-append acks) for the send timeout, instead of a
               timeout scope around each write (`bench/sse_memory.py`, `sse_idle.py`).
"""
