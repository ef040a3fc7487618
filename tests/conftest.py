"""Shared test set-up: the tests directory is importable (helpers modules)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# -- the modules that share a local Ray run one after another ------------------------------
#: Fixtures that keep what they start (a Ray with 4 logical CPUs for the client modules'
#: fakes; a Ray with a Spark session; a Ray for clusters) for the next module that uses
#: them: such modules run one after another, after the others, in this order.
SHARED_FIXTURES = ("client_ray", "spark_ray", "local_ray")


def pytest_collection_modifyitems(session, config, items):
    """Modules whose tests use a fixture of SHARED_FIXTURES (``local_ray`` in cluster_helpers
    and ``client_ray`` in client_fakes: a Ray's start and stop cost 5-7 s on 2 cores;
    ``spark_ray`` in spark_helpers: a Spark session 25-30 s more) run after the others,
    grouped by that fixture, so that one Ray (and Spark) serves each group. The order inside
    a module, and among the other modules, is unchanged."""
    first_seen: dict[str, int] = {}
    group: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        first_seen.setdefault(module, len(first_seen))
        uses = [i + 1 for i, f in enumerate(SHARED_FIXTURES) if f in item.fixturenames]
        group[module] = max([group.get(module, 0), *uses])
    rank = {module: (group[module], first) for module, first in first_seen.items()}
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
