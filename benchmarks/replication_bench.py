#!/usr/bin/env python3
"""Replication benchmark (issue 8): what RF=3 with acks=all costs, and end-to-end latency.

One run, under 5 minutes on 2 cores: a private local Ray (127.0.0.1), an embedded ZooKeeper
and a 3-broker cluster, 6-partition topics, 100-byte values, one producer process (this
one). It measures, in this order:

1. ``ray_call_p50_ms``: an empty call to a bare Ray actor (1000 calls after a warm-up): the
   floor every request here stands on.
2. ``rf1_records_per_s``: ``perf.produce`` (Producer.send_batch, acks=all) to an RF=1 topic.
3. ``rf3_acks_all_records_per_s``: the same to an RF=3 topic with min.insync.replicas=2.
4. ``e2e_p50_ms`` / ``e2e_p99_ms``: RF=3, acks=all, paced at 10,000 records/s (10
   records every millisecond through ``Producer.send``, which batches what arrives while a
   partition's request is in flight, as Kafka's producer does; ``send_batch`` would send each
   chunk as its own request), each value stamped with its send time; a long-polling Consumer (``fetch_max_wait_ms`` 500) in its own process (a Ray
   actor on this machine) takes the receive time of each record after ``poll`` returns.
   Latency = receive - send, wall clock (one machine, one clock), after a warm-up (the
   producer's connections, the consumer's, its polling started). ``e2e_send_to_ack_*``
   times send -> acknowledgement of one record per millisecond: the share of the latency
   spent in the producer and replication, before the consumer could read the record.

Before each throughput run, ``raw_append_rf1_MB_per_s`` / ``raw_append_rf3_MB_per_s``:
the bytes that run will write (records x record size x copies) appended to a new file
in the same directory, 1 MiB at a time, by this process: the machine's page-cache write
cost at that moment, which on this VM varies up to ten times between runs (writes into
memory the guest has not used lately cost 2.4 ms per MB instead of 0.2: docs/sizing.md).
``rf1_vs_raw_append`` / ``rf3_vs_raw_append`` put each run's MB/s (counting every copy)
next to it.

Goals (issue 21's): RF=1 acks=all >= 1,500,000 records/s; RF=3 acks=all >= 1,000,000
records/s and >= 0.7 x RF=1 in the same run; end to end at both 1,000 records/s
(``e2e_1k_*``) and 10,000 records/s (``e2e_*``): p50 <= 2 x ray_call_p50_ms and p99 <= 10 x.
``socket_rtt_p50_ms`` (a round trip between two processes over a local TCP socket) is the
floor of one data-plane hop, printed next to the Ray call. A phase that fails is
reported (``<phase>_error``) and the run goes on, so the last line is always one JSON object.

    python benchmarks/replication_bench.py            # ~3 minutes
    python benchmarks/replication_bench.py --quick    # ~1.5 minutes

Nothing outside this run is touched: the Ray it starts is its own and ends with it.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from actors import hoptrace  # noqa: E402
from benchmarks.common import (bench_cluster, drop_topic, finish, phase, ratio,  # noqa: E402
                               say)

GOAL_RF1_RECORDS_PER_S = 1_500_000
GOAL_RF3_RECORDS_PER_S = 1_000_000
GOAL_RF3_VS_RF1 = 0.7
GOAL_E2E_P50_X_RAY_CALL = 2.0      # issue 21: at 1,000 and at 10,000 records/s
GOAL_E2E_P99_X_RAY_CALL = 10.0
E2E_RATE = 10_000
E2E_RATE_1K = 1_000
STAMP = "<d"                       # the send time (time.time()) at the start of each value
# (a format string, not a struct.Struct: the consumer actor below is shipped by value)



def percentile(values, q: float):
    import numpy as np
    return round(float(np.percentile(values, q)), 3) if len(values) else None


# -- 1. the floor: an empty actor call ---------------------------------------------------------
class Empty:
    def ping(self) -> None:
        return None


def ray_call_ms(n: int = 1000) -> dict:
    import ray
    actor = ray.remote(Empty).options(num_cpus=0).remote()
    try:
        for _ in range(100):
            ray.get(actor.ping.remote(), timeout=60)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            ray.get(actor.ping.remote(), timeout=60)
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        ray.kill(actor, no_restart=True)
    return {"ray_call_p50_ms": percentile(samples, 50),
            "ray_call_p99_ms": percentile(samples, 99)}


# -- 2./3. throughput ---------------------------------------------------------------------------
def make_topic(cluster, name: str, partitions: int, rf: int, wait_s: float = 120) -> None:
    """Create the topic and return once every partition is led with all its replicas in
    sync (the phase that uses it then times no start-up)."""
    from actors.tools import perf
    config = dict(perf.PERF_TOPIC_CONFIG)
    if rf > 1:
        config["min.insync.replicas"] = "2"
    admin = cluster.admin()
    admin.create_topic(name, partitions=partitions, replication_factor=rf, config=config)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        parts = admin.describe_topic(name)
        if len(parts) == partitions and all(
                p["leader"] is not None and p["leader"] >= 0 and len(p["isr"]) == rf
                for p in parts):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{name}: partitions not led and in sync after {wait_s}s")


def throughput(cluster, topic: str, records: int, warmup: int, size: int) -> dict:
    from actors.tools import perf
    perf.produce(cluster, topic, num_records=warmup, record_size=size, acks="all",
                 progress=False)
    return perf.produce(cluster, topic, num_records=records, record_size=size, acks="all",
                        progress=False)


def raw_append(work: str, name: str, nbytes: int) -> dict:
    """``nbytes`` appended to a new file in ``work`` 1 MiB at a time, then removed: MB/s
    (storage_bench's raw append, module docstring)."""
    from benchmarks.storage_bench import raw_append_MBps
    mbps = raw_append_MBps(os.path.join(work, f"raw-append-{name}.bin"),
                           os.urandom(1 << 20), nbytes)
    return {f"raw_append_{name}_MB_per_s": round(mbps, 1)}


# -- 4. end to end ------------------------------------------------------------------------------
class E2EConsumer:
    """A long-polling Consumer in its own process: assigned every partition of ``topic``
    at its end; ``run`` polls until ``n`` records came (or the deadline) and answers each
    record's latency (receive - send stamp) in ms."""

    def __init__(self, namespace: str, topic: str, fetch_max_wait_ms: int):
        from actors import Cluster
        self.cluster = Cluster.connect(namespace)
        self.consumer = self.cluster.consumer(fetch_max_wait_ms=fetch_max_wait_ms)
        parts = self.cluster.metadata.partitions_for(topic)
        self.consumer.assign([(topic, p) for p in parts])
        self.consumer.seek_to_end()
        for tp in self.consumer.assignment():
            self.consumer.position(tp)
        self._running = threading.Event()      # set once ``run`` polls

    def ready(self) -> bool:
        self.consumer.poll(timeout_ms=0)       # connects to the leaders (warm-up)
        return True

    def running(self, timeout_s: float) -> bool:
        """Whether ``run`` has started polling (the actor runs two calls at once)."""
        return self._running.wait(timeout_s)

    def run(self, n: int, timeout_s: float) -> dict:
        latencies = []
        deadline = time.monotonic() + timeout_s
        polls = 0
        self.consumer.poll(timeout_ms=0)       # the first long polls are out
        self._running.set()
        while len(latencies) < n and time.monotonic() < deadline:
            got = self.consumer.poll(timeout_ms=500)
            now = time.time()
            if hoptrace.DIR and got:
                hoptrace.hop(f"POLL {sum(len(v) for v in got.values())}")
            polls += 1
            for records in got.values():
                for r in records:
                    latencies.append((now - struct.unpack_from(STAMP, r.value)[0]) * 1000)
        self.consumer.close()
        return {"latencies_ms": latencies, "polls": polls}


# -- 1b. the new floor: a round trip between two processes over a local socket -------------------
def _echo_server(port: int) -> None:
    import socket
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = conn.recv(4096)
        if not data:
            return
        conn.sendall(data)


def socket_rtt_ms(n: int = 2000) -> dict:
    """p50 / p99 of a 100-byte round trip between this process and a child process over a
    TCP connection on 127.0.0.1 (what one hop of the data plane costs at the least)."""
    import multiprocessing
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ctx = multiprocessing.get_context("spawn")       # never fork a process running Ray
    child = ctx.Process(target=_echo_server, args=(listener.getsockname()[1],), daemon=True)
    child.start()
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * 100
    samples = []
    try:
        for i in range(n + 200):
            t0 = time.perf_counter()
            conn.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(conn.recv(4096))
            if i >= 200:
                samples.append((time.perf_counter() - t0) * 1000)
    finally:
        conn.close()
        listener.close()
        child.join(5)
    return {"socket_rtt_p50_ms": percentile(samples, 50),
            "socket_rtt_p99_ms": percentile(samples, 99)}


def end_to_end(cluster, topic: str, seconds: float, size: int, rate: int = E2E_RATE,
               prefix: str = "e2e", before_end=None, on_start=None) -> dict:
    """Paced at ``rate`` records/s (rate/1000 records every millisecond), RF=3 acks=all,
    a long-polling Consumer in another process stamps the arrivals (module docstring).
    ``before_end()`` runs once the records are in, before the consumer's actor ends
    (throughput_cpu.py reads every process's CPU there); ``on_start()`` just before the
    first paced record is sent (on this thread: it must return at once)."""
    import ray

    from actors import raycompat
    chunk = max(1, rate // 1000)
    n = int(rate * seconds) // chunk * chunk
    pad = b"\0" * (size - struct.calcsize(STAMP))
    producer = cluster.producer(acks="all", linger_ms=0)
    # warm-up, not timed: the producer's metadata and its connection to every leader (one
    # record to each partition, before the consumer starts at the end of the log), and
    # the consumer's connections (its first poll, in ready); else the first records of a
    # run wait for them
    try:
        for p in producer.partitions_for(topic):
            producer.send(topic, b"warm-up", partition=p).get(timeout=60)
    except BaseException:
        producer.close(timeout=30)
        raise
    reader = ray.remote(E2EConsumer).options(
        num_cpus=0, max_concurrency=2, scheduling_strategy=raycompat.this_node()).remote(
            cluster.namespace, topic, 500)
    ray.get(reader.ready.remote(), timeout=120)
    result_ref = reader.run.remote(n, seconds + 60)
    # the first records must not wait for the call that starts run (tens of ms here)
    ray.get(reader.running.remote(60), timeout=120)
    late = 0
    acked_ms: list = []
    try:
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()
        futures = []
        for i in range(n // chunk):
            due = t0 + i * chunk / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            elif wait < -0.01:
                late += 1
            for _ in range(chunk):
                if hoptrace.DIR:
                    hoptrace.hop("SEND")
                sent_at = time.time()
                futures.append(producer.send(topic, struct.pack(STAMP, sent_at) + pad))
            # one record per tick also times send -> acknowledgement (acks=all): the part
            # of the end-to-end latency spent before a consumer could read the record
            futures[-1].add_callback(
                lambda _md, t=sent_at: acked_ms.append((time.time() - t) * 1000))
        producer.flush(timeout=120)
        for f in futures:
            f.get(timeout=120)
        elapsed = time.perf_counter() - t0
    finally:
        producer.close(timeout=30)
    got = ray.get(result_ref, timeout=seconds + 120)
    if before_end is not None:
        before_end()
    ray.kill(reader, no_restart=True)
    lat = got["latencies_ms"]
    out = {"records": n, "received": len(lat),
           "send_rate_records_per_s": round(n / elapsed),
           "chunks_sent_late": late, "polls": got["polls"],
           "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
           "send_to_ack_p50_ms": percentile(acked_ms, 50),
           "send_to_ack_p99_ms": percentile(acked_ms, 99),
           "max_ms": round(max(lat), 3) if lat else None}
    return {f"{prefix}_{k}": v for k, v in out.items()}


# -- the run -----------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (~1.5 minutes)")
    ap.add_argument("--records", type=int, default=None,
                    help="records per throughput run (default 1,000,000; --quick 300,000)")
    ap.add_argument("--e2e-seconds", type=float, default=None,
                    help="seconds of the paced end-to-end run (default 10; --quick 5)")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--keep-topics", action="store_true",
                    help="create every topic at the start and keep it to the end (the "
                         "layout before 2026-11-28: later phases share the machine with "
                         "the earlier topics' idle replicas)")
    a = ap.parse_args()
    records = a.records or (300_000 if a.quick else 1_000_000)
    warmup = max(records // 5, 10_000)
    e2e_s = a.e2e_seconds or (5.0 if a.quick else 10.0)
    t_start = time.perf_counter()
    out: dict = {"brokers": a.brokers, "partitions": a.partitions,
                 "record_size": a.record_size, "records": records, "warmup": warmup}
    with bench_cluster("replication-bench", a.brokers) as (cluster, work):
        out["cluster_start_s"] = round(time.perf_counter() - t_start, 1)
        phase(out, "ray_call", ray_call_ms)
        phase(out, "socket_rtt", socket_rtt_ms)
        # each topic lives only through its own phase (``--keep-topics``: all three from
        # the start): an idle replica process costs the others CPU (docs/sizing.md)
        topics = [("rf1", 1), ("rf3", 3), ("e2e", 3)]
        for name, rf in topics if a.keep_topics else topics[:1]:
            make_topic(cluster, name, a.partitions, rf)

        def done(name: str, rf: int, then: str | None, then_rf: int) -> None:
            if a.keep_topics:
                return
            phase(out, f"drop_{name}", drop_topic, cluster, name, a.partitions * rf)
            if then is not None:
                make_topic(cluster, then, a.partitions, then_rf)

        volume = records * a.record_size
        phase(out, "raw_append_rf1", raw_append, work, "rf1", volume)
        phase(out, "rf1", lambda: _rate("rf1", throughput(
            cluster, "rf1", records, warmup, a.record_size)))
        done("rf1", 1, "rf3", 3)
        phase(out, "raw_append_rf3", raw_append, work, "rf3", 3 * volume)
        phase(out, "rf3", lambda: _rate("rf3_acks_all", throughput(
            cluster, "rf3", records, warmup, a.record_size)))
        done("rf3", 3, "e2e", 3)
        phase(out, "e2e_1k", end_to_end, cluster, "e2e", e2e_s, a.record_size,
              E2E_RATE_1K, "e2e_1k")
        phase(out, "e2e", end_to_end, cluster, "e2e", e2e_s, a.record_size)
    return finish(out, t_start, _goals, _table)


def _rate(prefix: str, result: dict) -> dict:
    return {f"{prefix}_records_per_s": result["records_per_s"],
            f"{prefix}_MB_per_s": result["MB_per_s"],
            f"{prefix}_chunk_p50_ms": result["p50_ms"], f"{prefix}_chunk_p99_ms": result["p99_ms"]}




def _goals(out: dict) -> None:
    rf1, rf3 = out.get("rf1_records_per_s"), out.get("rf3_acks_all_records_per_s")
    call = out.get("ray_call_p50_ms")
    out["rf3_vs_rf1"] = ratio(rf3, rf1)
    for name, copies, key in (("rf1", 1, "rf1_MB_per_s"), ("rf3", 3, "rf3_acks_all_MB_per_s")):
        mbps = out.get(key)
        out[f"{name}_vs_raw_append"] = ratio(mbps * copies if mbps is not None else None,
                                             out.get(f"raw_append_{name}_MB_per_s"))
    out["socket_rtt_x_ray_call"] = ratio(out.get("socket_rtt_p50_ms"), call)
    goals = {
        "rf1_records_per_s": rf1 is not None and rf1 >= GOAL_RF1_RECORDS_PER_S,
        "rf3_records_per_s": rf3 is not None and rf3 >= GOAL_RF3_RECORDS_PER_S,
        "rf3_vs_rf1": out["rf3_vs_rf1"] is not None and out["rf3_vs_rf1"] >= GOAL_RF3_VS_RF1,
    }
    for prefix in ("e2e_1k", "e2e"):
        for q, goal in (("p50", GOAL_E2E_P50_X_RAY_CALL), ("p99", GOAL_E2E_P99_X_RAY_CALL)):
            x = out[f"{prefix}_{q}_x_ray_call"] = ratio(out.get(f"{prefix}_{q}_ms"), call)
            goals[f"{prefix}_{q}"] = x is not None and x <= goal
    out["goals"] = goals


def _table(out: dict) -> None:
    def fmt(v, spec="{:,.0f}"):
        return "-" if v is None else spec.format(v)
    goals = out["goals"]
    rows = [
        ("empty Ray actor call p50 / p99 ms",
         f"{fmt(out.get('ray_call_p50_ms'), '{:.3f}')} / "
         f"{fmt(out.get('ray_call_p99_ms'), '{:.3f}')}", ""),
        ("local socket round trip p50 / p99 ms",
         f"{fmt(out.get('socket_rtt_p50_ms'), '{:.3f}')} / "
         f"{fmt(out.get('socket_rtt_p99_ms'), '{:.3f}')}", "the new floor"),
        ("RF=1 acks=all records/s", fmt(out.get("rf1_records_per_s")),
         f">= {GOAL_RF1_RECORDS_PER_S:,}: {'met' if goals['rf1_records_per_s'] else 'MISSED'}"),
        ("RF=3 acks=all records/s", fmt(out.get("rf3_acks_all_records_per_s")),
         f">= {GOAL_RF3_RECORDS_PER_S:,}: {'met' if goals['rf3_records_per_s'] else 'MISSED'}"),
        ("raw append before RF=1 / RF=3 MB/s",
         f"{fmt(out.get('raw_append_rf1_MB_per_s'))} / "
         f"{fmt(out.get('raw_append_rf3_MB_per_s'))}",
         "this moment's page-cache write cost"),
        ("RF=1 / RF=3 MB/s (x copies) / raw",
         f"{fmt(out.get('rf1_vs_raw_append'), '{:.3f}')} / "
         f"{fmt(out.get('rf3_vs_raw_append'), '{:.3f}')}", ""),
        ("RF=3 / RF=1", fmt(out.get("rf3_vs_rf1"), "{:.2f}"),
         f">= {GOAL_RF3_VS_RF1}: {'met' if goals['rf3_vs_rf1'] else 'MISSED'}"),
    ]
    for prefix, rate in (("e2e_1k", E2E_RATE_1K), ("e2e", E2E_RATE)):
        for q, goal in (("p50", GOAL_E2E_P50_X_RAY_CALL), ("p99", GOAL_E2E_P99_X_RAY_CALL)):
            rows.append((f"e2e {rate:,}/s {q} ms (x ray call)",
                         f"{fmt(out.get(f'{prefix}_{q}_ms'), '{:.2f}')} "
                         f"({fmt(out.get(f'{prefix}_{q}_x_ray_call'), '{:.1f}')}x)",
                         f"<= {goal}x: {'met' if goals[f'{prefix}_{q}'] else 'MISSED'}"))
    for what, value, goal in rows:
        say(f"{what:<36}{value:>22}   {goal}")
    for key in sorted(k for k in out if k.endswith("_error")):
        say(f"{key}: {out[key]}")
    say(f"whole run {out['elapsed_s']}s")


if __name__ == "__main__":
    sys.exit(main())
