"""A fix for how Ray Data 2.60 starts every execution: one task at a time for its first second.

Ray Data's ``ResourceManager`` sizes its budgets by the resources the cluster autoscaling
coordinator (an actor) reserved for the execution. It asks without blocking: the first
answer is the empty cache, so the limits it computes at the start are zero, and it keeps
that zero for ``GLOBAL_LIMITS_UPDATE_INTERVAL_S`` (1 s) before asking again. With zero
limits the operators get no budget, and the executor only lets an idle operator run one
task (its liveness allowance), so for the first second a read runs its tasks one after
another on any cluster. Measured on this 2-CPU machine: twelve 150 ms tasks ran at a
concurrency of 0.48 (tasks strictly one after another until the limits came); a warm
``read_topic(...).materialize()`` of 10M records spent its first second that way
(docs/jobs.md, "What bounds them").

``fix()`` makes a limit of zero CPUs and zero GPUs not cached: the executor asks the
coordinator again at its next step (an ``ray.wait`` with timeout 0 on the reply in flight,
as it does anyway), so it uses the reservation as soon as the coordinator has answered.
Nothing else changes: once the answer is there, limits are refreshed every second as
before. It is idempotent, and does nothing on a Ray whose ``ResourceManager`` lacks what it
patches (a later release may have fixed the start).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_MARK = "_raykafka_limits_fix"


def fix() -> bool:
    """Apply the fix to this process's Ray Data (the process whose executor runs the
    Dataset: the driver that materializes or iterates it). True when it is in place."""
    try:
        from ray.data._internal.execution.resource_manager import ResourceManager
    except ImportError:                     # pragma: no cover - Ray Data moved the class
        return False
    original = getattr(ResourceManager, "get_global_limits", None)
    if original is None:                    # pragma: no cover - a different Ray Data
        return False
    if getattr(original, _MARK, False):
        return True

    def get_global_limits(self):
        limits = original(self)
        if limits.cpu == 0 and limits.gpu == 0 and \
                hasattr(self, "_global_limits_last_update_time"):
            # no reservation yet: ask again at the next step instead of in a second
            self._global_limits_last_update_time = 0
        return limits

    setattr(get_global_limits, _MARK, True)
    get_global_limits.__doc__ = original.__doc__
    ResourceManager.get_global_limits = get_global_limits
    log.debug("Ray Data: zero resource limits are no longer cached (jobs.raydata_fix)")
    return True
