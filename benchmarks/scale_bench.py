#!/usr/bin/env python3
"""The cost of a partition: replica actors next to bare Ray actors, measured in one run.

Starts a private local Ray (127.0.0.1, free ports), an embedded ZooKeeper and a 3-broker
cluster; creates topics totalling 10, 30 and 60 partitions (RF=1) and after each step prints,
next to bare Ray actors started in the same run with the replicas' actor options: memory per
replica (USS and RSS of its worker process, psutil), idle CPU per replica (over a 10 s window,
the same window for both), start time per partition (``create_topic`` until every leader
serves) against a bare actor's start, first-send latency per partition from a fresh client,
and produce throughput spread over all partitions. The last line is one JSON object
(replica_uss_mb, bare_actor_uss_mb, replica_idle_cpu_pct, bare_actor_idle_cpu_pct,
create_s_per_partition, bare_actor_start_s, first_send_ms_p50, first_send_ms_max, ratios,
goals). Same as ``raykafka perf scale``; the options are its options:

    python benchmarks/scale_bench.py                   # ~3-4 minutes on 2 cores
    python benchmarks/scale_bench.py --sizes 6,12 --idle-seconds 5     # a quick look

Nothing outside this run is touched: the Ray it starts is its own and ends with it.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from actors.tools import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli.main(["perf", "scale", *sys.argv[1:]]))
