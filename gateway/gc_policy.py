"""How a serving process runs Python's cyclic garbage collector: decided here, once.

A full (generation 2) pass walks every container object the process holds and stalls
the event loop while it does. Under Python's defaults (thresholds 700, 10, 10) a busy
gateway runs one every second or two: the objects that outlive two young passes (each
event kept in a run's fan-out window, each open connection's state) are promoted fast
enough that CPython's rule for a full pass (the objects promoted since the last one
exceed a quarter of those it kept) is met at every chance. Each pass walked about
100,000 objects at 100 streaming runs, tens of milliseconds: the whole of the
publish -> receive p99 there (docs/operations.md has the figures).

`apply(settings)` runs once the server has started (the app built, the bridge open, the
lifespan done), before it handles a request:
- `gc.collect()`, then `gc.freeze()`: what is alive then (modules, classes, the app and
  its routes, validators, the Redis client: about 60,000 objects) moves to the
  permanent generation and is never walked again. Frozen objects that die later are
  still freed by reference counting; only a cycle among them would stay, and start-up
  objects do not form and drop cycles at run time;
- thresholds `GC_THRESHOLDS`: a full pass is considered every 25 generation-1 passes
  instead of 10, and a young pass runs every 2,000 net allocations instead of 700, so
  full passes come about a tenth as often (measured: 6 instead of 70 in 90 s at 100
  runs). The larger young threshold also gives short-lived objects (a request's, a
  round trip's) time to die before a young pass would promote them; young and middle
  passes stay a few milliseconds at most. Memory stayed flat (docs/operations.md).
Every generation is still collected, so cyclic garbage is still freed and memory stays
bounded. `settings.gc_tuning` off leaves Python's defaults. A library user who serves
`create_app` under a server of their own can call `apply` the same way.
"""

from __future__ import annotations

import gc
from typing import Final

from .settings import Settings

GC_THRESHOLDS: Final = (2_000, 10, 25)


def apply(settings: Settings) -> bool:
    """Apply the collector policy to this process; True when it was applied."""
    if not settings.gc_tuning:
        return False
    gc.collect()  # start-up garbage goes now, rather than being frozen with the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True
