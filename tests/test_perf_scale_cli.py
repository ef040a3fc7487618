"""``raykafka perf scale`` (and benchmarks/scale_bench.py): argument handling only; the
figures themselves are the benchmark's business, not a timed unit test's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *argv], capture_output=True, timeout=120, env=env,
                          cwd=ROOT)


@pytest.mark.parametrize("args, needle", [
    (["--sizes", "30,10"], "increasing"),
    (["--sizes", "10,10"], "increasing"),
    (["--sizes", "0,10"], "positive"),
    (["--sizes", "ten"], "comma-separated"),
    (["--idle-seconds", "0"], "--idle-seconds"),
    (["--brokers", "-1"], "--brokers"),
    (["--records", "many"], "--records"),
    (["--no-such-option"], "unrecognized arguments"),
])
@pytest.mark.parametrize("entry", ["cli", "script"])
def test_bad_arguments_answer_one_line_and_exit_2(entry, args, needle):
    """A bad `perf scale` argument, through the CLI or the benchmark script, prints one line
    on stderr naming the problem (no traceback, no usage dump), exits 2 and starts nothing."""
    argv = (["-m", "actors.tools.cli", "perf", "scale"] if entry == "cli"
            else [os.path.join("benchmarks", "scale_bench.py")])
    proc = _run(*argv, *args)
    err = proc.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and needle in lines[0], err
    assert proc.stdout == b""
