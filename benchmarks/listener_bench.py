"""End to end through the Brokers' Kafka listeners (issue 21): a 3-broker raykafka cluster
on a private local Ray, a confluent-kafka producer (acks=all, linger 0, 100-byte records)
paced at each rate, a confluent-kafka consumer long-polling every partition stamping each
record's arrival (wire_bench.e2e_once), on a 6-partition topic at RF=1 and at RF=3 (acks=all
waits for both followers, which still replicate through Ray calls), next to an empty Ray
actor call measured in the same Ray.

Prints ``rf<R>_e2e_<rate>_p50_ms`` / ``_p99_ms`` / ``_records`` and ``ray_call_p50_ms`` /
``_p99_ms`` as one JSON line on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import bench_cluster, phase, say  # noqa: E402
from benchmarks.wire_bench import (e2e_once, time_ray_calls,  # noqa: E402
                                   warm_group_coordinator)

PARTITIONS = 6


def _e2e(cluster, rf: int, rates: list[int], seconds: float) -> dict:
    from confluent_kafka import Producer
    topic = f"e2e-rf{rf}"
    cluster.admin().create_topic(topic, partitions=PARTITIONS, replication_factor=rf)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:           # every partition led and listed
        md = Producer({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(
            topic, timeout=10).topics[topic]
        if len(md.partitions) == PARTITIONS and all(
                p.leader >= 0 and len(p.isrs) == rf for p in md.partitions.values()):
            break
        time.sleep(0.2)
    out = {}
    for rate in rates:
        run = e2e_once(cluster.bootstrap_servers, topic, PARTITIONS, rate, seconds)
        out.update({f"rf{rf}_e2e_{rate}_{k}": v for k, v in run.items()})
        say(f"  rf={rf} {rate}/s: {run}")
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rf", default="1,3", help="replication factors to run")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    out = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    with bench_cluster("listener-bench", 3) as (cluster, _):
        phase(out, "ray_call", time_ray_calls, args.calls)
        # e2e_once's consumer has a group.id: __consumer_offsets starts before the timing
        phase(out, "group_coordinator", warm_group_coordinator, cluster.bootstrap_servers)
        for rf in (int(r) for r in args.rf.split(",")):
            phase(out, f"e2e_rf{rf}", _e2e, cluster, rf, rates, args.seconds)
        phase(out, "ray_call_after", lambda: {
            k.replace("ray_call", "ray_call_after"): v
            for k, v in time_ray_calls(args.calls).items()})
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
