#!/usr/bin/env python3
"""Cluster benchmark: raykafka produce/consume next to Redis Streams and NATS JetStream.

One run measures, on this machine and in this order:
- Redis Streams (redis-server, AOF everysec, on 127.0.0.1:<free port>) from redis-py: XADD
  with 1000 commands per non-transactional pipeline; XREADGROUP ... NOACK COUNT 1000.
- NATS JetStream (nats-server -js, file store, R1, on 127.0.0.1:<free port>) from nats-py:
  ``publish_async`` with 4000 pending; a pull consumer with AckPolicy.NONE fetching 1000.
- raykafka: an embedded cluster (private local Ray, embedded ZooKeeper, 3 brokers), a
  6-partition RF=1 topic, 100-byte values from one producer process: ``perf.produce``
  (Producer.send_batch, acks=all) after a warm-up, then ``perf.consume``
  (SimpleConsumer.iter_columns) of everything produced.

It prints a table and, as its last line, one JSON object (produce_records_per_s,
consume_records_per_s, produce_p99_ms, redis_xadd_records_per_s,
nats_publish_records_per_s, the ratios and the goals: issue 21's are produce >= 15 x and
consume >= 30 x Redis Streams). Peer servers are started and stopped
by PID; nothing else on the machine is touched.

    python benchmarks/cluster_bench.py --quick     # under 3 minutes
    python benchmarks/cluster_bench.py             # ~5 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)

GOAL_PRODUCE = 1_000_000
GOAL_CONSUME = 2_000_000
GOAL_PEER_RATIO = 10.0
GOAL_PRODUCE_VS_REDIS = 15.0   # issue 21 (the data plane): produce >= 15 x Redis Streams
GOAL_CONSUME_VS_REDIS = 30.0   # and consume >= 30 x, in the same run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


# -- peers ------------------------------------------------------------------------------------
def bench_redis(n: int, size: int, work: str) -> dict:
    binary = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        return {"skipped": "redis-py is not installed (pip install redis)"}
    if binary is None:
        return {"skipped": "redis-server is not installed (apt-get install redis-server)"}
    data = os.path.join(work, "redis")
    os.makedirs(data)
    port = free_port()
    srv = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "yes", "--appendfsync", "everysec", "--dir", data,
                            "--daemonize", "no", "--logfile", os.path.join(data, "log")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        r = redis.Redis(host="127.0.0.1", port=port)
        payload = os.urandom(size)
        pipe_n = 1000
        t0 = time.perf_counter()
        for _ in range(n // pipe_n):
            pipe = r.pipeline(transaction=False)
            for _ in range(pipe_n):
                pipe.xadd("s", {"v": payload})
            pipe.execute()
        produce = (n // pipe_n * pipe_n) / (time.perf_counter() - t0)
        r.xgroup_create("s", "g", id="0")
        got = 0
        t0 = time.perf_counter()
        while got < n // pipe_n * pipe_n:
            resp = r.xreadgroup("g", "c", {"s": ">"}, count=pipe_n, noack=True)
            got += len(resp[0][1])
        consume = got / (time.perf_counter() - t0)
        r.close()
        return {"produce": produce, "consume": consume}
    finally:
        _stop(srv)


def bench_nats(n: int, size: int, work: str) -> dict:
    binary = shutil.which("nats-server") or ("/usr/sbin/nats-server"
                                             if os.path.exists("/usr/sbin/nats-server") else None)
    try:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
    except ImportError:
        return {"skipped": "nats-py is not installed (pip install nats-py)"}
    if binary is None:
        return {"skipped": "nats-server is not installed (apt-get install nats-server)"}
    store = os.path.join(work, "nats")
    os.makedirs(store)
    port = free_port()
    srv = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def run():
        nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=2,
                                max_reconnect_attempts=0)
        js = nc.jetstream(publish_async_max_pending=4000)
        await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"],
                                         storage=StorageType.FILE, num_replicas=1))
        payload = os.urandom(size)
        t0 = time.perf_counter()
        futs = [await js.publish_async("bench.x", payload) for _ in range(n)]
        await js.publish_async_completed()
        for f in futs:
            f.result()
        produce = n / (time.perf_counter() - t0)
        psub = await js.pull_subscribe(
            "bench.x", durable="c1", stream="BENCH",
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                                  max_ack_pending=-1))
        got = 0
        t0 = time.perf_counter()
        while got < n:
            got += len(await psub.fetch(1000, timeout=10))
        consume = got / (time.perf_counter() - t0)
        await nc.close()
        return {"produce": produce, "consume": consume}

    try:
        _wait_port(port)
        return asyncio.run(run())
    finally:
        _stop(srv)


# -- raykafka ---------------------------------------------------------------------------------
def bench_raykafka(n: int, warmup: int, size: int, brokers: int, partitions: int,
                   work: str) -> dict:
    import logging

    from actors import Cluster, raycompat
    from actors.tools import perf
    ray = raycompat.ray
    raycompat.init_local("raykafka-bench", logging_level=logging.WARNING)
    t0 = time.perf_counter()
    cluster = Cluster.start(num_brokers=brokers, data_dir=os.path.join(work, "cluster"),
                            namespace=f"bench-{os.getpid()}")
    try:
        started_s = time.perf_counter() - t0
        perf.ensure_topic(cluster, "bench", partitions=partitions, create=True)
        # warm-up on the same topic: each partition replica is its own actor process, and
        # the first requests to a fresh one are several times slower than the next
        perf.produce(cluster, "bench", num_records=warmup, record_size=size, progress=False)
        perf.consume(cluster, "bench", num_records=warmup, progress=False)
        produced = perf.produce(cluster, "bench", num_records=n, record_size=size,
                                progress=False)
        consumed = perf.consume(cluster, "bench", num_records=n + warmup, progress=False)
        # latency below saturation: chunks of 10,000 records paced at 10% of the rate above
        paced_rate = max(int(produced["records_per_s"] * 0.1), 10_000)
        paced = perf.produce(cluster, "bench", num_records=min(n, paced_rate * 5),
                             record_size=size, chunk_records=10_000, throughput=paced_rate,
                             progress=False)
        return {"produce": produced, "consume": consumed, "paced": paced,
                "start_s": started_s}
    finally:
        cluster.shutdown()
        ray.shutdown()


def _fmt(v) -> str:
    return "skipped" if v is None else f"{v:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (under 3 minutes)")
    ap.add_argument("--records", type=int, default=None,
                    help="raykafka records (default 10M, --quick 3M)")
    ap.add_argument("--peer-records", type=int, default=None,
                    help="records per peer (default 300k, --quick 100k)")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--skip-peers", action="store_true")
    a = ap.parse_args()
    n = a.records or (3_000_000 if a.quick else 10_000_000)
    peer_n = a.peer_records or (100_000 if a.quick else 300_000)
    warmup = 500_000 if a.quick else 1_000_000
    if os.environ.get("RAYKAFKA_NO_PROGRESS") is None:
        os.environ["RAYKAFKA_NO_PROGRESS"] = "1"
    work = tempfile.mkdtemp(prefix="raykafka-cluster-bench-")
    peers: dict = {}
    try:
        if not a.skip_peers:
            print(f"redis streams: {peer_n:,} records ...", file=sys.stderr, flush=True)
            peers["redis"] = bench_redis(peer_n, a.record_size, work)
            print(f"nats jetstream: {peer_n:,} records ...", file=sys.stderr, flush=True)
            peers["nats"] = bench_nats(peer_n, a.record_size, work)
        print(f"raykafka: {a.brokers} brokers, {a.partitions} partitions, warm-up "
              f"{warmup:,}, then {n:,} records ...", file=sys.stderr, flush=True)
        rk = bench_raykafka(n, warmup, a.record_size, a.brokers, a.partitions, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    prod, cons = rk["produce"], rk["consume"]
    redis_res = peers.get("redis", {"skipped": "--skip-peers"})
    nats_res = peers.get("nats", {"skipped": "--skip-peers"})
    rp, rc = redis_res.get("produce"), redis_res.get("consume")
    np_, nc = nats_res.get("produce"), nats_res.get("consume")

    def ratio(x, y):
        return round(x / y, 2) if x and y else None

    mb = a.record_size / 1e6
    print(f"\n{'what':<44}{'records/s':>14}{'MB/s':>10}  {'raykafka ratio':>14}")
    rows = [("raykafka produce (acks=all, send_batch)", prod["records_per_s"], None),
            ("raykafka consume (iter_columns)", cons["records_per_s"], None),
            ("redis-py XADD, pipelines of 1000", rp, ratio(prod["records_per_s"], rp)),
            ("redis-py XREADGROUP NOACK COUNT 1000", rc, ratio(cons["records_per_s"], rc)),
            ("nats-py JetStream publish_async", np_, ratio(prod["records_per_s"], np_)),
            ("nats-py JetStream pull fetch(1000)", nc, ratio(cons["records_per_s"], nc))]
    for what, v, r in rows:
        print(f"{what:<44}{_fmt(v):>14}{(f'{v * mb:,.1f}' if v else '-'):>10}  "
              f"{(f'{r:.1f}x' if r else ''):>14}")
    paced = rk["paced"]
    print(f"raykafka produce latency per send_batch chunk: saturated (chunks of "
          f"{prod['chunk_records']:,}) p50 {prod['p50_ms']} ms, p99 {prod['p99_ms']} ms; "
          f"paced at {paced['throughput_limit']:,} records/s (chunks of 10,000) p50 "
          f"{paced['p50_ms']} ms, p99 {paced['p99_ms']} ms; cluster start {rk['start_s']:.1f} s")
    for name, res in (("redis", redis_res), ("nats", nats_res)):
        if "skipped" in res:
            print(f"{name}: skipped: {res['skipped']}")
    out = {
        "records": n, "record_size": a.record_size, "brokers": a.brokers,
        "partitions": a.partitions, "peer_records": peer_n,
        "produce_records_per_s": prod["records_per_s"], "produce_MB_per_s": prod["MB_per_s"],
        "produce_p50_ms": prod["p50_ms"], "produce_p99_ms": prod["p99_ms"],
        "paced_produce_records_per_s": paced["records_per_s"],
        "paced_produce_p50_ms": paced["p50_ms"], "paced_produce_p99_ms": paced["p99_ms"],
        "consume_records_per_s": cons["records_per_s"], "consume_MB_per_s": cons["MB_per_s"],
        "redis_xadd_records_per_s": round(rp) if rp else None,
        "redis_xreadgroup_records_per_s": round(rc) if rc else None,
        "nats_publish_records_per_s": round(np_) if np_ else None,
        "nats_fetch_records_per_s": round(nc) if nc else None,
        "produce_vs_redis": ratio(prod["records_per_s"], rp),
        "produce_vs_nats": ratio(prod["records_per_s"], np_),
        "consume_vs_redis": ratio(cons["records_per_s"], rc),
        "consume_vs_nats": ratio(cons["records_per_s"], nc),
        "goal_produce_met": prod["records_per_s"] >= GOAL_PRODUCE,
        "goal_consume_met": cons["records_per_s"] >= GOAL_CONSUME,
        "goal_10x_peers_met": all(r is not None and r >= GOAL_PEER_RATIO for r in (
            ratio(prod["records_per_s"], rp), ratio(prod["records_per_s"], np_))),
        "goal_produce_15x_redis_met": (ratio(prod["records_per_s"], rp) or 0)
        >= GOAL_PRODUCE_VS_REDIS,
        "goal_consume_30x_redis_met": (ratio(cons["records_per_s"], rc) or 0)
        >= GOAL_CONSUME_VS_REDIS,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
