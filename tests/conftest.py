"""Shared test set-up: the tests directory is importable (helpers modules)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# -- the modules that share a local Ray run one after another ------------------------------
def pytest_collection_modifyitems(session, config, items):
    """Modules whose tests use the ``local_ray`` fixture (cluster_helpers) run after the
    others, one after another, so that one Ray serves them all (``local_ray`` keeps it for
    the next module that uses it: a Ray's start and stop cost 5-7 s on 2 cores). The order
    inside a module, and among the other modules, is unchanged."""
    first_seen: dict[str, int] = {}
    uses_ray: dict[str, bool] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        first_seen.setdefault(module, len(first_seen))
        uses_ray[module] = uses_ray.get(module, False) or "local_ray" in item.fixturenames
    rank = {module: (uses_ray[module], first) for module, first in first_seen.items()}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


# -- where the suite's time goes, by module (the 35-minute budget is spent per module) ------
_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if len(_module_seconds) < 2:
        return
    total = sum(_module_seconds.values())
    terminalreporter.section("slowest 20 modules (setup + call + teardown)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {module}")
    terminalreporter.write_line(f"{total:8.1f}s in {len(_module_seconds)} modules")
