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
  its routes, validators, the Redis client: about 64,000 objects) moves to the
  permanent generation and is never walked again. Frozen objects that die later are
  still freed by reference counting; only a cycle among them would stay, and start-up
  objects do not form and drop cycles at run time;
- thresholds `GC_THRESHOLDS`: a full pass is considered every 70 generation-1 passes
  instead of 10, so full passes come about a sixth as often (measured: 46 instead of
  260 in 408 s at 100 runs) and, with the start-up objects frozen, each is about half
  as long. The young thresholds stay Python's: a larger first one (2,000 was tried)
  makes fewer passes but the middle ones twice as long, and kept more garbage waiting.
Every generation is still collected, so cyclic garbage is still freed, later than
under the defaults: over 15 minutes under load RSS levelled off within 1 MiB of
theirs (docs/operations.md).
`settings.gc_tuning` off leaves Python's defaults. A library user who serves
`create_app` under a server of their own can call `apply` the same way.
"""

from __future__ import annotations

import gc
from typing import Final

from .settings import Settings

# Python's young and middle thresholds; a full pass considered every 70 middle passes.
GC_THRESHOLDS: Final = (700, 10, 70)


def apply(settings: Settings) -> bool:
    """Apply the collector policy to this process; True when it was applied."""
    if not settings.gc_tuning:
        return False
    gc.collect()  # start-up garbage goes now, rather than being frozen with the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True
