#!/usr/bin/env python3
"""Fault test 7 as a loop, with the evidence kept: a 3-broker cluster (18 s sessions) under
RF=3 acks=all load, ZooKeeper stopped for 10 s and restarted; did every broker keep its
session?

Each broker process logs kazoo (connection attempts, drops, "Session has expired") and its
session state changes to ``<out>/run<N>-broker<B>.log``; on a changed session id the
ZooKeeper directory (zoo.cfg, zookeeper.log, data) is copied to ``<out>/zk-run<N>``. This is
how the lost session of 2026-11-23 was found: a broker's kazoo connected while the restarted
ZooKeeper 3.8.0 was still loading its database, the server's refusal failed on a
NullPointerException and left the socket open, and kazoo waited the whole 18 s for the
handshake answer (docs/replication.md, "Fault tests"; fixed in coordination.session).

    .venv/bin/python scripts/zk_outage_repro.py [--runs 5] [--out /tmp/zk-outage]
"""

import argparse
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from actors import Cluster, raycompat  # noqa: E402
from cluster_helpers import (unique_namespace, wait_registered_with_controller,  # noqa: E402
                             wait_until)
from replication_helpers import (CONFIG, TOPIC_CONFIG, SequenceProducer,  # noqa: E402
                                 wait_for_full_isr)

ray = raycompat.ray


def _log_kazoo(broker, path: str) -> None:
    """Runs inside a Broker actor (``__ray_call__``): kazoo and session states to ``path``."""
    import logging
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d %(threadName)s %(name)s %(levelname)s %(message)s",
        "%H:%M:%S"))
    probe = logging.getLogger("zk-outage-probe")
    for logger in (logging.getLogger("kazoo"), probe):
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    kazoo = broker.zk.kazoo
    kazoo.add_listener(lambda state: probe.info("state %s, session %r", state,
                                                kazoo._session_id))


def _sessions(cluster) -> dict:
    return {b: ray.get(cluster.broker(b).session_id.remote(), timeout=30)
            for b in cluster.broker_ids()}


def one_run(run: int, out: str) -> bool:
    """True when every broker kept its session."""
    cluster = Cluster.start(num_brokers=3, namespace=unique_namespace("zkrepro"),
                            config={**CONFIG, "zookeeper.session.timeout.ms": 18000})
    producers = []
    try:
        for b in cluster.broker_ids():
            ray.get(cluster.broker(b).__ray_call__.remote(_log_kazoo,
                                                          f"{out}/run{run}-broker{b}.log"))
        cluster.admin().create_topic("outage", partitions=3, replication_factor=3,
                                     config=TOPIC_CONFIG)
        producers = [SequenceProducer(cluster, "outage", partition=p, tag=f"p{p}").start()
                     for p in range(3)]
        for prod in producers:
            prod.wait_for_more(100)
        for p in range(3):
            wait_for_full_isr(cluster, "outage", p)
        before = _sessions(cluster)
        server = cluster._zk_server
        server.stop()
        stopped = time.monotonic()
        while time.monotonic() - stopped < 10:
            time.sleep(0.5)
        server.restart()
        wait_registered_with_controller(cluster, [0, 1, 2])
        # kazoo names its session only while connected
        after = wait_until(lambda: (lambda got: got if None not in got.values() else None)(
            _sessions(cluster)), timeout_s=60, what="every broker connected again")
        if after == before:
            print(f"run {run}: every session survived", flush=True)
            return True
        keep = f"{out}/zk-run{run}"
        shutil.copytree(str(server.data_dir), keep, dirs_exist_ok=True)
        print(f"run {run}: sessions changed {before} -> {after}; ZooKeeper dir in {keep}",
              flush=True)
        return False
    finally:
        for prod in producers:
            prod.stop()
        cluster.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="/tmp/zk-outage")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    raycompat.init_local("zk-outage-repro")
    lost = sum(not one_run(run, args.out) for run in range(args.runs))
    print(f"{lost} of {args.runs} runs lost a session")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
