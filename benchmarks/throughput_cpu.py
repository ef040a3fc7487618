#!/usr/bin/env python3
"""Where a throughput run's CPU goes: ``perf.produce`` (acks=all, 100-byte records, as
replication_bench's throughput phases) to a 6-partition topic of each replication factor
asked, with the user and system CPU and the minor page faults every process of the
machine had meanwhile, summed by kind (this client, brokers, leader and follower
replicas, Ray's own processes).

A run is CPU-bound when the total is near 2 x its wall time on this 2-core machine; then
RF=3 / RF=1 throughput is the ratio of CPU per record (docs/dataplane.md, "what bounds
RF=3 / RF=1 on one machine"). ``--idle`` measures the cluster with the topic and no load;
``--paced R`` a paced end-to-end run instead (replication_bench's e2e: linger 0, acks=all,
R records/s for ``--seconds``, a long-polling consumer actor), with the CPU per record of
each kind, which says whether the run is queueing for the 2 cores.
Replica roles come from the partition states; processes of other sessions count in "other".
The last line is one JSON object.

    python benchmarks/throughput_cpu.py [--rf 1,3] [--records 2000000] [--idle]
    python benchmarks/throughput_cpu.py --rf 3 --paced 1000,10000 [--seconds 6]

``--perf PREFIX`` records each run with ``perf record -a -g`` (the whole machine, kernel
included: what a py-spy of one process cannot show, such as the page-cache copies).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from benchmarks.common import bench_cluster, drop_topic, say  # noqa: E402
from benchmarks.replication_bench import end_to_end, make_topic, throughput  # noqa: E402

RECORD_SIZE = 100
WARMUP = 200_000


def _kind(cmdline: str) -> str:
    if "PartitionReplica" in cmdline:
        return "replica"
    if "E2EConsumer" in cmdline:
        return "consumer"
    if "ray::Broker" in cmdline:
        return "broker"
    if "ray::" in cmdline or "raylet" in cmdline or "gcs_server" in cmdline \
            or "/ray/" in cmdline:
        return "ray"
    return "other"


def _minor_faults(pid: int) -> int:
    """The process's minor page faults so far (every thread's, ended ones included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2:].split()[7])


def _times() -> dict:
    import psutil
    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        kind = "client" if p.info["pid"] == os.getpid() else \
            _kind(" ".join(p.info["cmdline"] or []))
        out[p.info["pid"]] = (kind, t.user, t.system, _minor_faults(p.info["pid"]))
    return out


def _replica_roles(cluster, topic: str) -> dict:
    """pid -> "leader" / "follower" for the topic's replica actors."""
    import ray

    from actors.protocol import replica_actor_name
    roles = {}
    for part in cluster.admin().describe_topic(topic):
        for r in part["replicas"]:
            handle = ray.get_actor(replica_actor_name(topic, part["partition"], r),
                                   namespace=cluster.namespace)
            pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
            roles[pid] = "leader" if r == part["leader"] else "follower"
    return roles


def _perf_start(path: str | None):
    """``perf record`` of the whole machine (call graphs) into ``path`` until stopped."""
    if not path:
        return None
    import subprocess
    proc = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "1999", "-o", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)                             # perf's own start-up, before the run
    return proc


def _perf_stop(proc) -> None:
    if proc is not None:
        import signal
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def measure(cluster, topic: str, records: int, paced: int = 0, seconds: float = 6.0,
            perf: str | None = None) -> dict:
    """CPU by process kind over a throughput run of ``records`` (0: 3 idle seconds), or
    over the steady middle of a paced end-to-end run at ``paced`` records/s for
    ``seconds`` (its first and last second left out, with the set-up before them)."""
    roles = _replica_roles(cluster, topic)
    if paced:
        # the steady part of the run only: from 1 s after the first paced record to 1 s
        # before the last (the consumer actor's start, the producer's and the warm-up
        # cost about a second of CPU, which at 100 records/s is more than the records)
        window = max(1.0, seconds - 2.0)
        marks: list = []

        def sample():
            time.sleep(1.0)
            profiler = _perf_start(perf)
            marks.append((time.perf_counter(), _times()))
            time.sleep(window)
            marks.append((time.perf_counter(), _times()))
            _perf_stop(profiler)

        sampler = threading.Thread(target=sample, daemon=True)
        e2e = end_to_end(cluster, topic, seconds, RECORD_SIZE, paced, "e2e",
                         on_start=sampler.start)
        sampler.join()
        result = {"records_per_s": e2e["e2e_send_rate_records_per_s"]}
        (start, before), (stop, after) = marks
        wall = stop - start
        records = round(result["records_per_s"] * wall)
    else:
        if records:
            throughput(cluster, topic, WARMUP, 0, RECORD_SIZE)
        profiler = _perf_start(perf)
        before, t0 = _times(), time.perf_counter()
        e2e = {}
        result = throughput(cluster, topic, records, 0, RECORD_SIZE) if records \
            else (time.sleep(3.0) or {})
        wall, after = time.perf_counter() - t0, _times()
        _perf_stop(profiler)
    cpu = collections.defaultdict(lambda: [0.0, 0.0])
    faults = collections.defaultdict(int)
    for pid, (kind, user, system, minflt) in after.items():
        _, user0, system0, minflt0 = before.get(pid, (kind, 0.0, 0.0, 0))
        if kind == "replica":
            kind = f"{roles.get(pid, 'other')} replicas"
        cpu[kind][0] += user - user0
        cpu[kind][1] += system - system0
        faults[kind] += minflt - minflt0
    total = sum(u + s for u, s in cpu.values())
    per_record = {k: round((u + s) / records * 1000, 4) for k, (u, s) in cpu.items()} \
        if records else {}
    return {**{k: v for k, v in e2e.items() if k.endswith("_ms")},
            "cpu_ms_per_record": per_record,
            "records_per_s": result.get("records_per_s"), "wall_s": round(wall, 3),
            "cpu_s": {k: {"user": round(u, 3), "system": round(s, 3)}
                      for k, (u, s) in sorted(cpu.items())},
            "minor_faults": dict(sorted(faults.items())),
            "cpu_total_s": round(total, 3), "cores_busy": round(total / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rf", default="1,3", help="replication factors, in this order")
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--idle", action="store_true", help="no load: 3 s of the idle cluster")
    ap.add_argument("--paced", default="",
                    help="paced end-to-end runs at these rates (records/s) instead")
    ap.add_argument("--seconds", type=float, default=6.0, help="of each paced run")
    ap.add_argument("--perf", default="",
                    help="record each run (a paced one: its steady part) with `perf record "
                         "-a -g` into PREFIX.<run>.data (read with `perf report -i ... "
                         "--sort comm,dso,sym`)")
    a = ap.parse_args()
    out = {}
    rates = [int(x) for x in a.paced.split(",") if x]
    with bench_cluster("throughput-cpu", 3) as (cluster, _work):
        for rf in (int(x) for x in a.rf.split(",")):
            name = f"rf{rf}"
            make_topic(cluster, name, 6, rf)
            for rate in rates or [0]:
                key = f"{name}_{rate}" if rate else name
                r = out[key] = measure(cluster, name, 0 if a.idle else a.records, rate,
                                       a.seconds,
                                       f"{a.perf}.{key}.data" if a.perf else None)
                say(f"{key}: {r['records_per_s']} records/s in {r['wall_s']} s, "
                    f"{r['cpu_total_s']} s of CPU ({r['cores_busy']} cores)"
                    + (f", e2e p50 {r.get('e2e_p50_ms')} ms" if rate else ""))
                for kind, c in r["cpu_s"].items():
                    per = r["cpu_ms_per_record"].get(kind)
                    say(f"    {kind:20s} user {c['user']:6.2f}  system {c['system']:6.2f}  "
                        f"page faults {r['minor_faults'].get(kind, 0):9,d}"
                        + (f"  {per:.3f} ms/record" if per is not None else ""))
            drop_topic(cluster, name, 6 * rf)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
