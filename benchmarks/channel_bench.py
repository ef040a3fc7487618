#!/usr/bin/env python3
"""The local channel to a replica (actors/server/replica_channel.py) next to a Ray actor
call to the same replica, in the same run: about 30 seconds.

One broker, one partition (RF 1), this driver on the same node as the replica actor:
- round trip of an empty fetch (at the log end), sequential, p50 / p99;
- produce of one 100-byte record per request (acks=1), sequential: p50 and requests/s;
- produce of 4 MiB requests (30k 100-byte records each, acks=1), 4 in flight: MB/s.
Prints a table, then one JSON object as its last line. MB/s means 10**6 bytes per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from actors import Cluster, raycompat  # noqa: E402
from actors.server.replica_channel import ReplicaChannel, wait  # noqa: E402
from storage.records import build  # noqa: E402

ray = raycompat.ray


def _p(values, q):
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] * 1e3


def _round_trips(call, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def _bulk(send, batch, n, in_flight=4):
    t = time.perf_counter()
    pending = []
    for _ in range(n):
        pending.append(send(batch))
        if len(pending) >= in_flight:
            pending.pop(0)()
    for done in pending:
        done()
    return n * len(batch) / (time.perf_counter() - t) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--bulk", type=int, default=60, help="4 MiB requests per transport")
    a = ap.parse_args()
    raycompat.init_local("channel-bench", logging_level=logging.WARNING)
    work = tempfile.mkdtemp(prefix="raykafka-channel-bench-")
    cluster = Cluster.start(num_brokers=1, data_dir=work, namespace=f"chb-{os.getpid()}")
    try:
        cluster.admin().create_topic("bench", partitions=1, config={
            "max.message.bytes": str(8 << 20), "segment.bytes": str(256 << 20)})
        handle = cluster.metadata.leader("bench", 0).handle
        chan = ReplicaChannel(ray.get(handle.channel_address.remote(), timeout=60))
        small = build([os.urandom(100)])
        big = build([os.urandom(100)] * 29959)
        ray.get(handle.produce.remote(small, 1, 1000))
        wait(chan.produce(small, 1), 10)
        out: dict = {}
        rounds = {"ray": {}, "channel": {}}
        for r in range(2):           # interleaved rounds, both transports on the same machine
            for name in ("ray", "channel") if r == 0 else ("channel", "ray"):
                leo = wait(chan.fetch(0, 0), 10).log_end_offset   # fetch there: empty
                if name == "ray":
                    def fetch():
                        return ray.get(handle.fetch.remote(leo, 1 << 20))

                    def produce():
                        return ray.get(handle.produce.remote(small, 1, 1000))

                    def send(b):
                        ref = handle.produce.remote(b, 1, 30000)
                        return lambda: ray.get(ref)
                else:
                    def fetch():
                        return wait(chan.fetch(leo, 1 << 20), 10)

                    def produce():
                        return wait(chan.produce(small, 1), 10)

                    def send(b):
                        future = chan.produce(b, 1, 30000)
                        return lambda: wait(future, 60)
                rt = _round_trips(fetch, a.calls // 2)
                pr = _round_trips(produce, a.calls // 2)
                mb = _bulk(send, big, a.bulk // 2)
                acc = rounds[name]
                acc.setdefault("rt", []).extend(rt)
                acc.setdefault("pr", []).extend(pr)
                acc.setdefault("mb", []).append(mb)
        for name, acc in rounds.items():
            out[f"{name}_fetch_p50_ms"] = round(_p(acc["rt"], 0.5), 3)
            out[f"{name}_fetch_p99_ms"] = round(_p(acc["rt"], 0.99), 3)
            out[f"{name}_small_produce_p50_ms"] = round(_p(acc["pr"], 0.5), 3)
            out[f"{name}_small_produce_per_s"] = round(len(acc["pr"]) / sum(acc["pr"]))
            out[f"{name}_bulk_produce_MBps"] = round(statistics.median(acc["mb"]), 1)
        chan.close()
    finally:
        cluster.shutdown()
        ray.shutdown()
    print(f"{'measure':<44}{'channel':>12}{'ray call':>12}{'ratio':>8}")
    for label, key, better in (("empty fetch round trip p50 (ms)", "fetch_p50_ms", "low"),
                               ("empty fetch round trip p99 (ms)", "fetch_p99_ms", "low"),
                               ("1-record produce p50 (ms)", "small_produce_p50_ms", "low"),
                               ("1-record produces per s, sequential", "small_produce_per_s",
                                "high"),
                               ("4 MiB produce MB/s, 4 in flight", "bulk_produce_MBps",
                                "high")):
        c, r = out[f"channel_{key}"], out[f"ray_{key}"]
        ratio = (r / c if better == "low" else c / r) if c and r else 0
        print(f"{label:<44}{c:>12,}{r:>12,}{ratio:>7.1f}x")
    out["fetch_p50_speedup"] = round(out["ray_fetch_p50_ms"] / out["channel_fetch_p50_ms"], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
