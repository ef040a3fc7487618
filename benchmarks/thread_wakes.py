#!/usr/bin/env python3
"""Where a paced record's wake-ups and CPU go, thread by thread.

replication_bench's end-to-end run (3 brokers, a 6-partition topic, 100-byte records,
acks=all, linger 0, a long-polling consumer actor) at each ``--rate``; over the steady
middle of the run (its first and last 2 s left out) every thread of every process of the
run is read from ``/proc/<pid>/task/<tid>``: its voluntary context switches (each one a
sleep that something had to end: a socket read, a lock, a condition, a timer) and its
user + system CPU (the kernel's share printed apart) and its minor page faults (each one
a page the kernel had to map: costly in a VM). They are summed by process kind (broker,
leader / follower replica, controller, consumer, this driver, Ray's and ZooKeeper's
processes) and by thread name, which the servers give their threads in the kernel
(actors/server/threadnames.py), and printed per record: wake-ups per record, CPU per record, CPU per wake-up, the kernel's
share, page faults per record.

It says which threads a record wakes and what each wake-up costs (docs/dataplane.md,
"a record's wake-ups, thread by thread"); a rate the machine cannot carry without
queueing shows as CPU per record times the rate near 2 cores.

    python benchmarks/thread_wakes.py [--rate 100,1000] [--rf 3] [--seconds 12]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from benchmarks.common import bench_cluster, drop_topic, say  # noqa: E402
from benchmarks.replication_bench import end_to_end, make_topic  # noqa: E402
from benchmarks.throughput_cpu import _replica_roles  # noqa: E402

RECORD_SIZE = 100
EDGE_S = 2.0                     # left out at each end of a paced run
TICK = os.sysconf("SC_CLK_TCK")


def _kind(pid: int, roles: dict) -> str | None:
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return None
    if "PartitionReplica" in cmd:
        return f"{roles.get(pid, 'other')} replica"
    for name, kind in (("E2EConsumer", "consumer"), ("ray::Broker", "broker"),
                       ("ray::Controller", "controller"), ("ray::", "ray"),
                       ("raylet", "ray"), ("gcs_server", "ray"), ("/ray/", "ray"),
                       ("zookeeper", "zookeeper")):
        if name in cmd:
            return kind
    return None


def snapshot(roles: dict) -> dict:
    """(pid, tid) -> (kind, thread name, CPU s, voluntary switches, system CPU s, minor
    page faults) for the run's threads."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        kind = _kind(pid, roles)
        if kind is None:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = f.read()
            except OSError:
                continue                                 # ended meanwhile
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            out[(pid, int(tid))] = (kind, name, cpu, switches, int(fields[12]) / TICK,
                                    int(fields[7]))
    return out


def _thread_kind(name: str) -> str:
    """A thread name without its numbers (ports, ids): threads of one kind sum up."""
    return re.sub(r"\d+", "N", name)


def measure(cluster, topic: str, rate: int, seconds: float) -> dict:
    roles = _replica_roles(cluster, topic)
    window = max(1.0, seconds - 2 * EDGE_S)
    marks: list = []

    def sample():
        time.sleep(EDGE_S)
        marks.append((time.perf_counter(), snapshot(roles)))
        time.sleep(window)
        marks.append((time.perf_counter(), snapshot(roles)))

    sampler = threading.Thread(target=sample, daemon=True)
    e2e = end_to_end(cluster, topic, seconds, RECORD_SIZE, rate, "e2e", on_start=sampler.start)
    sampler.join()
    (t0, before), (t1, after) = marks
    records = e2e["e2e_send_rate_records_per_s"] * (t1 - t0)
    threads = collections.defaultdict(lambda: [0.0, 0, 0.0, 0])
    for key, (kind, name, cpu, switches, sys_cpu, faults) in after.items():
        if key not in before:
            continue
        _, _, cpu0, switches0, sys0, faults0 = before[key]
        row = threads[(kind, _thread_kind(name))]
        row[0] += cpu - cpu0
        row[1] += switches - switches0
        row[2] += sys_cpu - sys0
        row[3] += faults - faults0
    rows = []
    for (kind, name), (cpu, wakes, sys_cpu, faults) in threads.items():
        if wakes == 0 and cpu == 0:
            continue
        rows.append({"process": kind, "thread": name,
                     "wakes_per_record": round(wakes / records, 3),
                     "cpu_ms_per_record": round(cpu / records * 1000, 4),
                     "cpu_us_per_wake": round(cpu / wakes * 1e6) if wakes else None,
                     "system_share": round(sys_cpu / cpu, 2) if cpu else None,
                     "faults_per_record": round(faults / records, 2)})
    rows.sort(key=lambda r: -r["cpu_ms_per_record"])
    total_cpu = sum(row[0] for row in threads.values())
    total_sys = sum(row[2] for row in threads.values())
    return {"rate": rate, "records": round(records), "window_s": round(t1 - t0, 2),
            "e2e_p50_ms": e2e.get("e2e_p50_ms"), "e2e_p99_ms": e2e.get("e2e_p99_ms"),
            "cores_busy": round(total_cpu / (t1 - t0), 2),
            "cpu_ms_per_record": round(total_cpu / records * 1000, 3),
            "system_share": round(total_sys / total_cpu, 2) if total_cpu else None,
            "faults_per_record": round(sum(row[3] for row in threads.values()) / records, 1),
            "wakes_per_record": round(sum(row[1] for row in threads.values()) / records, 2),
            "threads": [r for r in rows if r["cpu_ms_per_record"] > 0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="100,1000", help="records/s, one run each")
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0, help="of each paced run")
    ap.add_argument("--top", type=int, default=16, help="threads printed per run")
    a = ap.parse_args()
    rates = [int(x) for x in a.rate.split(",") if x]
    if not rates or min(rates) <= 0 or a.seconds < 2 * EDGE_S + 1:
        ap.error(f"--rate takes positive records/s; --seconds at least {2 * EDGE_S + 1:g}")
    out = {}
    with bench_cluster("thread-wakes", 3) as (cluster, _work):
        make_topic(cluster, "wakes", 6, a.rf)
        for rate in rates:
            r = out[f"rf{a.rf}_{rate}"] = measure(cluster, "wakes", rate, a.seconds)
            say(f"RF={a.rf} at {rate:,} records/s: e2e p50 {r['e2e_p50_ms']} ms, "
                f"{r['cores_busy']} cores busy, {r['cpu_ms_per_record']} ms of CPU and "
                f"{r['wakes_per_record']} wake-ups and {r['faults_per_record']} page faults "
                f"per record, {r['system_share']:.0%} of the CPU in the kernel "
                f"(over {r['window_s']} s)")
            say(f"    {'process':17s} {'thread':18s} {'wakes/rec':>9s} {'CPU ms/rec':>10s} "
                f"{'us/wake':>8s} {'kernel':>6s} {'faults/rec':>10s}")
            for t in r["threads"][:a.top]:
                say(f"    {t['process']:17s} {t['thread']:18s} {t['wakes_per_record']:9.2f} "
                    f"{t['cpu_ms_per_record']:10.3f} {t['cpu_us_per_wake'] or 0:8d} "
                    f"{t['system_share'] or 0:6.0%} {t['faults_per_record']:10.2f}")
        drop_topic(cluster, "wakes", 6 * a.rf)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
