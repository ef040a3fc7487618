"""What the benchmark scripts share: progress lines on stderr, phases that record their
failure and let the run go on (so the last line is always one JSON object), ratios."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time


def say(text: str) -> None:
    """A progress line on stderr (stdout ends with the JSON line)."""
    print(text, file=sys.stderr, flush=True)


def phase(out: dict, name: str, fn, *args) -> None:
    """Run one measurement into ``out``; a failure is recorded as ``<name>_error`` and the
    run goes on."""
    t0 = time.perf_counter()
    say(f"{name} ...")
    try:
        out.update(fn(*args))
    except Exception as exc:  # noqa: BLE001 - reported in the JSON line
        lines = str(exc).splitlines()
        out[f"{name}_error"] = f"{type(exc).__name__}: {(lines[0] if lines else '')[:300]}"
        say(f"{name} failed: {out[f'{name}_error']}")
    say(f"{name} done in {time.perf_counter() - t0:.1f}s")


def ratio(x, y):
    """x / y rounded, None when either is missing or y is 0."""
    return round(x / y, 3) if x is not None and y else None


@contextlib.contextmanager
def bench_cluster(name: str, brokers: int, config: dict | None = None, **ray_kwargs):
    """A private local Ray (127.0.0.1; ``ray_kwargs`` such as ``num_cpus`` go to
    ``ray.init``) with a raykafka cluster of ``brokers`` brokers (``config``: its Kafka
    settings) in a temporary dir, all ended on exit: yields ``(cluster, work_dir)``."""
    import logging

    import ray

    from actors import Cluster, raycompat
    os.environ.setdefault("RAYKAFKA_NO_PROGRESS", "1")
    work = tempfile.mkdtemp(prefix=f"raykafka-{name}-")
    raycompat.init_local(f"raykafka-{name}", logging_level=logging.WARNING, **ray_kwargs)
    try:
        cluster = Cluster.start(num_brokers=brokers, data_dir=os.path.join(work, "cluster"),
                                namespace=f"{name}-{os.getpid()}", config=config)
        try:
            yield cluster, work
        finally:
            cluster.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def replica_processes() -> int:
    """How many partition-replica actor processes run on this machine now."""
    import psutil
    count = 0
    for proc in psutil.process_iter(["cmdline"]):
        if any("PartitionReplica" in part for part in proc.info["cmdline"] or ()):
            count += 1
    return count


def drop_topic(cluster, name: str, replicas: int, wait_s: float = 120) -> dict:
    """Delete topic ``name`` and wait until its ``replicas`` replica processes are gone, so
    the next phase does not share the 2 cores with them (docs/sizing.md: an idle replica
    process is woken 100 times a second by Ray). The processes are counted machine-wide:
    another Ray's replicas starting meanwhile can only make the wait run to its end."""
    before = replica_processes()
    cluster.admin().delete_topic(name)
    deadline = time.monotonic() + wait_s
    while replica_processes() > before - replicas:
        if time.monotonic() > deadline:
            say(f"  {name}: its replica processes still counted after {wait_s}s; going on")
            break
        time.sleep(0.2)
    return {}


def finish(out: dict, t_start: float, goals, table) -> int:
    """The end of a run: elapsed time, ``goals(out)``, ``table(out)`` (stderr), then the
    JSON line on stdout."""
    out["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    goals(out)
    table(out)
    print(json.dumps(out, allow_nan=False), flush=True)
    return 0
