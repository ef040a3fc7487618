"""A module imported on first use, for the imports a process may never need.

Every partition replica is a Ray worker process of its own, and starting one is most of
what creating a topic costs (docs/testing.md). numpy is 107 ms of the 188 ms that
importing ``actors.server.replica`` adds to a worker, yet a replica only needs it for the
columnar paths (batches built from many records, decoded into columns), which many never
run. ``lazy_module(globals(), "np", "numpy")`` stands in for ``import numpy as np``: the
first attribute read imports numpy and puts the module itself in the global, so every
later ``np.x`` is the plain global lookup it was before (no cost on the hot paths).
"""

from __future__ import annotations

import importlib


class _LazyModule:
    __slots__ = ("_namespace", "_name", "_module")

    def __init__(self, namespace: dict, name: str, module: str):
        self._namespace = namespace
        self._name = name
        self._module = module

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._module)
        self._namespace[self._name] = module      # later reads get the module itself
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self._module} (not imported yet)>"


def lazy_module(namespace: dict, name: str, module: str):
    """A stand-in for ``module``, bound to ``namespace[name]`` by the caller; replaced
    there by the module on its first attribute read."""
    return _LazyModule(namespace, name, module)
