#!/usr/bin/env python3
"""Where one record's time goes: a traced end-to-end run (``actors/hoptrace.py``).

Starts a private 3-broker cluster with every process tracing its socket messages, runs
``replication_bench.end_to_end`` (RF=3 by default, acks=all, linger 0, a long-polling
Consumer) at ``--rate`` records/s, then prints

- the messages per record, by process kind and label (who sends and reads how much);
- the merged timeline of ``--show`` records from the middle of the run: milliseconds after
  ``SEND``, process, thread, label (at low rates one record's hops stand alone).

    python benchmarks/hop_trace.py --rate 100 --show 3
    python benchmarks/hop_trace.py --rate 1000 --rf 1

Tracing costs a system call per hop, so traced latencies sit above untraced ones; compare
traced runs with traced runs. docs/dataplane.md reads one such trace.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TRACE_DIR = tempfile.mkdtemp(prefix="raykafka-hops-")
os.environ["RAYKAFKA_HOP_TRACE"] = TRACE_DIR    # before actors is imported and Ray starts

import actors  # noqa: E402,F401
from benchmarks import replication_bench as rb  # noqa: E402
from benchmarks.common import bench_cluster  # noqa: E402


def _kind(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if cmd.startswith("ray::"):
        return cmd.split()[0].split(".")[0]
    return "driver" if pid == str(os.getpid()) else "other"


def _events() -> list:
    out = []
    for path in glob.glob(os.path.join(TRACE_DIR, "*")):
        with open(path) as f:
            for line in f:
                t, pid, thread, label = line.rstrip("\n").split(" ", 3)
                out.append((int(t), pid, thread, label))
    out.sort()
    return out


def report(events: list, kinds: dict, show: int) -> None:
    sends = [i for i, e in enumerate(events) if e[3] == "SEND"]
    if not sends:
        print("no SEND in the trace")
        return
    counts: collections.Counter = collections.Counter()
    for _, pid, thread, label in events[sends[0]:]:
        if label.startswith("R>"):
            label = label.split(":")[0]          # the op (replica_channel), not the bytes
        elif label.startswith("POLL"):
            label = "POLL"
        role = "fetcher" if "fetcher" in thread else thread.split("-")[0]
        counts[(kinds.get(pid, "?"), role, label)] += 1
    print(f"messages per record ({len(sends)} records):")
    for (kind, role, label), n in counts.most_common():
        if n / len(sends) >= 0.01:
            print(f"  {n / len(sends):6.2f}  {kind:24} {role:10} {label}")
    middle = len(sends) // 2
    for i in sends[middle:middle + show]:
        t0 = events[i][0]
        print("---- one record: ms after SEND")
        for t, pid, thread, label in events[i:]:
            ms = (t - t0) / 1e6
            if ms > 15 or (label == "SEND" and t != t0):
                break
            print(f"  {ms:7.3f}  {kinds.get(pid, '?'):24} {thread[:24]:24} {label}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=100, help="records per second (100)")
    ap.add_argument("--seconds", type=float, default=3.0, help="traced run length (3)")
    ap.add_argument("--rf", type=int, default=3, choices=(1, 2, 3))
    ap.add_argument("--show", type=int, default=3, help="records whose hops to print (3)")
    args = ap.parse_args(argv)
    with bench_cluster("hops", 3) as (cluster, _work):
        rb.make_topic(cluster, "hops", 6, args.rf)
        r = rb.end_to_end(cluster, "hops", args.seconds, 100, args.rate, "e2e")
        print({k: v for k, v in r.items() if "p50" in k or "p99" in k})
        events = _events()
        kinds = {pid: _kind(pid) for pid in {e[1] for e in events}}
        report(events, kinds, args.show)
    for path in glob.glob(os.path.join(TRACE_DIR, "*")):
        os.unlink(path)
    os.rmdir(TRACE_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
