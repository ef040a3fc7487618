"""Garbage-collector pauses of a server process (a Broker or replica actor).

A full (generation 2) collection walks every container object the process holds. A broker
holds some 90,000 right after it starts (Ray's worker, kazoo, the modules, its own state),
and each full collection measured 164-268 ms on this 2-core machine (gc.callbacks in the
broker, 2026-11-26): the network thread, which answers every client, waited that long, and
those pauses were the p99 of a paced produce-to-consume run at RF=1 (160-300 ms).

``freeze_startup_heap`` moves everything alive once a server has started into the
permanent generation (``gc.freeze``), so later collections walk only what was made since.
What is frozen is never collected: a cycle that became garbage before the call stays (the
start's garbage, made once); everything made later is collected as usual.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_startup_heap() -> bool:
    """Once per process: freeze what is alive now. True the first time."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        gc.freeze()
        _frozen = True
        return True
