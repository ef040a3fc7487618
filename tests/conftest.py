"""Shared test set-up: the tests directory is importable (helpers modules)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
