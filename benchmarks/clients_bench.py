"""Unmodified Kafka clients against raykafka (issue 22): confluent-kafka's producer and
consumer through the brokers' Kafka listeners, next to raykafka's own clients and Redis
Streams measured in the same run, and librdkafka's end-to-end latency next to a Ray call.

One run, on a private local Ray with a 3-broker cluster, 6-partition topics, 100-byte
records (values of random bytes, no compression). Before anything is timed the group
coordinator is brought up (``group_coordinator_s``: ``__consumer_offsets`` and its replica
processes, which the first client with a ``group.id`` would otherwise start inside a timed
phase; wire_bench.warm_group_coordinator):
- ``confluent_rf1_*``: a confluent-kafka Producer (acks=1, linger.ms 5, ``produce_batch``
  of 10,000 records per partition in turn) into an RF=1 topic, then a Consumer assigned
  every partition from the beginning (``consume(100000)``) reading all of it back.
  ``raw_append_rf1_MB_per_s``: the same bytes appended to a plain file just before (this
  VM's page-cache writes cost 2.4 ms/MB in some hours and 0.2 in others: docs/sizing.md).
- ``confluent_rf3_*``: the same with acks=all into an RF=3 topic.
- ``raykafka_rf1_*`` / ``raykafka_rf3_*``: raykafka's Producer (``perf.produce``,
  send_batch, acks 1 / all) and SimpleConsumer (``perf.consume``, iter_columns) on topics
  of their own, through Ray.
- ``redis_xadd_records_per_s`` / ``redis_xreadgroup_records_per_s``: Redis Streams from
  redis-py (benchmarks/cluster_bench.py's peer: AOF everysec, pipelines of 1000).
- ``local_*``: the same confluent-kafka produce, consume and paced e2e against a
  LocalBroker (one Python process: our listener and handlers over a storage.Log, no Ray,
  no replica hop): the ceiling this client and a Python broker leave on this machine, with
  ``confluent_produce_vs_local`` / ``confluent_consume_vs_local`` as ratios;
  ``client_consume_ceiling_records_per_s`` (and ``_nogc_``): ``consume(100000)`` timed
  only once librdkafka holds every record in its own queues, the records counted and not
  read, so no broker is in it: the most this Python client hands over here.
- ``confluent_e2e_p50_ms`` / ``_p99_ms``: a confluent-kafka producer (acks=all, linger 0)
  paced at 1,000 records/s into the RF=1 topic, a consumer long-polling every partition
  stamping their arrival (benchmarks/wire_bench.e2e_once); ``confluent_e2e_rf3_*`` the same
  into the RF=3 topic; ``ray_call_p50_ms``: an empty Ray actor call in the same Ray.

Goals (issue 22): confluent produce at RF=1 >= 1,500,000 records/s, consume >= 3,000,000;
e2e p50 <= 2 x and p99 <= 10 x ray_call_p50_ms. ``--profile SECONDS`` records every broker
with py-spy during one more confluent RF=1 produce and then its consume (raw stacks written
under ``--profile-dir``; the busiest threads and top functions printed).

Progress on stderr, a table, then one JSON object as the last line of stdout. About 3-4
minutes (``--quick``: about 2).

    python benchmarks/clients_bench.py [--quick] [--profile 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from benchmarks.cluster_bench import bench_redis  # noqa: E402
from benchmarks.replication_bench import raw_append  # noqa: E402
from benchmarks.common import (bench_cluster, drop_topic, finish, phase, ratio,  # noqa: E402
                               say)
from benchmarks.wire_bench import (_end, _spawn, e2e_once, time_ray_calls,  # noqa: E402
                                   warm_group_coordinator)

PARTITIONS = 6
RECORD_SIZE = 100
CHUNK = 10_000
GOAL_PRODUCE_RF1 = 1_500_000
GOAL_CONSUME = 3_000_000
GOAL_E2E_P50_X = 2.0
GOAL_E2E_P99_X = 10.0
WAIT_S = 120
PREFETCH_S_PER_MILLION = 4.0   # the client's fetch of every record before a timed hand-over
PROFILE_RATE = 100             # py-spy samples per second


def _topic(cluster, name: str, rf: int) -> str:
    """A PARTITIONS-partition topic of replication factor ``rf``, once a client's Metadata
    shows every partition led with all its replicas in sync."""
    from confluent_kafka import Producer
    cluster.admin().create_topic(name, partitions=PARTITIONS, replication_factor=rf)
    deadline = time.monotonic() + WAIT_S
    probe = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    while time.monotonic() < deadline:
        md = probe.list_topics(name, timeout=10).topics[name]
        if md.error is None and len(md.partitions) == PARTITIONS and all(
                p.leader >= 0 and len(p.isrs) == rf for p in md.partitions.values()):
            return name
        time.sleep(0.2)
    raise TimeoutError(f"{name}: partitions not led and in sync after {WAIT_S}s")


# -- confluent-kafka ------------------------------------------------------------------------
def confluent_produce(bootstrap: str, topic: str, records: int, acks: str) -> dict:
    """``records`` 100-byte records, CHUNK at a time to one partition after another, with
    produce_batch. Records/s from the first produce to the last acknowledgement.

    ``delivery.report.only.error``: librdkafka reports only the records that failed, so
    the Python callback runs per failure instead of per record (about 0.3 s of the client's
    CPU per million records here, on the thread that also calls produce). Nothing goes
    unchecked: a failed record is reported, and ``flush`` returning 0 means every record
    was acknowledged."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                         "batch.size": 1_000_000, "compression.type": "none",
                         "delivery.report.only.error": True,
                         "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 1_048_576})
    payload = os.urandom(RECORD_SIZE)
    batch = [{"value": payload}] * CHUNK
    failed: list = []

    def delivered(err, _msg):
        if err is not None:
            failed.append(err)

    sent, part = 0, 0
    t0 = time.perf_counter()
    while sent < records and not failed:
        todo = batch[:min(CHUNK, records - sent)]
        while todo:
            queued = producer.produce_batch(topic, todo, partition=part, on_delivery=delivered)
            todo = todo[queued:]
            if todo:
                producer.poll(0.005)          # queue full: serve delivery reports
        sent += min(CHUNK, records - sent)
        part = (part + 1) % PARTITIONS
        producer.poll(0)
    left = producer.flush(WAIT_S)
    elapsed = time.perf_counter() - t0
    if failed or left:
        raise RuntimeError(f"confluent produce: {len(failed)} failed ({failed[:1]}), "
                           f"{left} undelivered")
    return {"records": records, "records_per_s": round(records / elapsed),
            "MB_per_s": round(records * RECORD_SIZE / elapsed / 1e6, 1)}


def confluent_consume(bootstrap: str, topic: str, records: int, *, prefetch: bool = False,
                      gc_off: bool = False) -> dict:
    """Every partition assigned from the beginning; consume(100000) until ``records``
    were read (their values' bytes counted).

    ``prefetch``: the clock starts after a wait long enough for librdkafka to hold every
    record in its own queues (checked afterwards from its statistics' ``fetchq_cnt``), and
    the records handed over are counted, not looked at: what is timed is ``consume`` alone, the most this client can hand a Python
    program here whatever the broker does (a program that reads each record's value, as
    the timed runs do, gets less). ``gc_off``: Python's garbage collector disabled while
    timing (the 100,000 Message objects a call returns trigger collections)."""
    import gc
    import json as _json

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    peak = [0]

    def stats(raw: str) -> None:
        parts = _json.loads(raw).get("topics", {}).get(topic, {}).get("partitions", {})
        # the partitions' fetch queues forward to the consumer's: each reports that count
        peak[0] = max([peak[0]] + [p.get("fetchq_cnt", 0) for p in parts.values()])

    conf = {"bootstrap.servers": bootstrap, "group.id": "clients-bench",
            "enable.auto.commit": False, "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.max.messages.kbytes": 1_048_576,
            "queued.min.messages": 10_000_000}
    if prefetch:
        conf.update({"statistics.interval.ms": 100, "stats_cb": stats})
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = nbytes = 0
    deadline = time.monotonic() + WAIT_S
    t0 = None
    try:
        if prefetch:
            # Let librdkafka fetch everything (about 1.2 s per million here). Taking even
            # one record to serve the statistics callback before the clock made every
            # consume() after it about 2.5 times slower, so the wait is a time, and the
            # statistics served by the timed calls prove afterwards that it was enough.
            time.sleep(PREFETCH_S_PER_MILLION * max(records / 1e6, 1.0))
        if gc_off:
            gc.disable()
        while got < records and time.monotonic() < deadline:
            asked = time.perf_counter()
            msgs = consumer.consume(100_000, 1.0)
            if t0 is None and msgs:
                t0 = asked       # from the call that returned the first records: the
            if prefetch:         # the bare hand-over: no record looked at
                got += len(msgs)
                continue
            for m in msgs:       # assign's own metadata and offset lookups are not counted
                if m.error() is None:
                    got += 1
                    nbytes += len(m.value())
        elapsed = time.perf_counter() - (t0 or time.perf_counter())
    finally:
        gc.enable()
        consumer.close()
    if got < records:
        raise RuntimeError(f"confluent consume read {got} of {records} in {WAIT_S}s")
    if prefetch and peak[0] < records:
        raise RuntimeError(f"confluent consume: {peak[0]} of {records} records were in the "
                           f"client's queue before the clock: not the hand-over alone")
    return {"records": got, "records_per_s": round(got / elapsed) if elapsed else None,
            "MB_per_s": round(nbytes / elapsed / 1e6, 1) if elapsed else None}


def _confluent(cluster, topic: str, records: int, acks: str, prefix: str) -> dict:
    bootstrap = cluster.bootstrap_servers
    produced = confluent_produce(bootstrap, topic, records, acks)
    say(f"  {prefix} produce: {produced}")
    consumed = confluent_consume(bootstrap, topic, records)
    say(f"  {prefix} consume: {consumed}")
    return {f"{prefix}_produce_records_per_s": produced["records_per_s"],
            f"{prefix}_produce_MB_per_s": produced["MB_per_s"],
            f"{prefix}_consume_records_per_s": consumed["records_per_s"],
            f"{prefix}_consume_MB_per_s": consumed["MB_per_s"],
            f"{prefix}_records": records}


# -- the floor: the same client against one Python process serving a storage.Log ----------
_LOCAL_BROKER = """
import sys, tempfile
from actors.server.log_backend import LocalBroker
broker = LocalBroker(tempfile.mkdtemp(prefix="clients-bench-local-")).start()
broker.create_topic("local", %d)
print(broker.server.port, flush=True)
sys.stdin.read()
broker.close()
""" % PARTITIONS


def _local(records: int, seconds: float) -> dict:
    """confluent-kafka's produce, consume and paced e2e against a LocalBroker: one Python
    process, our listener and handlers over a storage.Log, no Ray, no replica hop, no
    replication. What this client reaches against the simplest broker of ours on this
    machine in this run: the ceiling the client and one Python broker leave."""
    proc, port = _spawn(_LOCAL_BROKER)
    try:
        bootstrap = f"127.0.0.1:{port}"
        produced = confluent_produce(bootstrap, "local", records, "1")
        consumed = confluent_consume(bootstrap, "local", records)
        handed = confluent_consume(bootstrap, "local", records, prefetch=True)
        handed_nogc = confluent_consume(bootstrap, "local", records, prefetch=True,
                                        gc_off=True)
        e2e = e2e_once(bootstrap, "local", PARTITIONS, 1000, seconds)
    finally:
        _end(proc)
    say(f"  local broker: produce {produced}, consume {consumed}, e2e {e2e}; records "
        f"already in the client handed to Python: {handed} (garbage collector off: "
        f"{handed_nogc})")
    return {"local_produce_records_per_s": produced["records_per_s"],
            "local_consume_records_per_s": consumed["records_per_s"],
            "client_consume_ceiling_records_per_s": handed["records_per_s"],
            "client_consume_ceiling_nogc_records_per_s": handed_nogc["records_per_s"],
            "local_e2e_p50_ms": e2e["p50_ms"], "local_e2e_p99_ms": e2e["p99_ms"],
            "local_records": records}


# -- raykafka's own clients ---------------------------------------------------------------
def _raykafka(cluster, topic: str, records: int, acks, prefix: str) -> dict:
    from actors.tools import perf
    produced = perf.produce(cluster, topic, num_records=records, record_size=RECORD_SIZE,
                            acks=acks, progress=False)
    consumed = perf.consume(cluster, topic, num_records=records, progress=False)
    say(f"  {prefix}: produce {produced['records_per_s']:,}/s, consume "
        f"{consumed['records_per_s']:,}/s")
    return {f"{prefix}_produce_records_per_s": produced["records_per_s"],
            f"{prefix}_consume_records_per_s": consumed["records_per_s"],
            f"{prefix}_records": records}


# -- latency --------------------------------------------------------------------------------
def _e2e(cluster, topic: str, seconds: float, prefix: str) -> dict:
    run = e2e_once(cluster.bootstrap_servers, topic, PARTITIONS, 1000, seconds)
    say(f"  {prefix}: {run}")
    return {f"{prefix}_p50_ms": run["p50_ms"], f"{prefix}_p99_ms": run["p99_ms"],
            f"{prefix}_records": run["records"]}


# -- profile --------------------------------------------------------------------------------
def _profile(cluster, topic: str, records: int, seconds: int, out_dir: str) -> dict:
    """py-spy record (--gil: only the thread holding the GIL is sampled) of every broker
    process for ``seconds`` while a confluent producer writes ``records`` to ``topic``, then
    again while a consumer reads them back; per broker and run, the busiest threads and
    the top functions by own samples. The raw (collapsed-stack) files stay in
    ``out_dir``."""
    import ray
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return {"profile_skipped": "py-spy is not installed (pip install py-spy)"}
    os.makedirs(out_dir, exist_ok=True)
    pids = [ray.get(cluster.broker(b).pids.remote(), timeout=60)[0]["pid"]
            for b in cluster.broker_ids()]
    bootstrap = cluster.bootstrap_servers
    runs = (("produce", lambda: confluent_produce(bootstrap, topic, records, "1")),
            ("consume", lambda: confluent_consume(bootstrap, topic, records)))
    files = []
    for label, load in runs:
        procs = []
        for pid in pids:
            raw = os.path.join(out_dir, f"{label}-broker-{pid}.txt")
            procs.append((pid, raw, subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate",
                 str(PROFILE_RATE), "--gil", "--threads", "--format", "raw", "--output", raw],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(1)                             # py-spy attached
        say(f"  {label} under py-spy: {load()}")
        for pid, raw, proc in procs:
            proc.wait(seconds + 60)
            files.append(raw)
            total, threads, leaves = _top(raw, 6)
            say(f"  {label}, broker pid {pid} ({raw}): the GIL held in "
                f"{100 * total / (seconds * PROFILE_RATE):.0f}% of the samples; by thread: "
                f"{threads}")
            for line in leaves:
                say(f"    {line}")
    return {"profile_files": files}


def _top(raw_path: str, n: int) -> tuple[int, str, list[str]]:
    """From a py-spy raw (collapsed) file recorded with --threads: the samples, the share
    of each of the ``n`` busiest threads, and the ``n`` leaf frames with the most
    samples."""
    if not os.path.exists(raw_path):
        return 0, "(no samples)", []
    own: dict[str, int] = {}
    per_thread: dict[str, int] = {}
    total = 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            thread = frames[0].split("): ", 1)[-1]       # "thread (tid): name"
            per_thread[thread] = per_thread.get(thread, 0) + int(count)
            own[frames[-1]] = own.get(frames[-1], 0) + int(count)
            total += int(count)
    if not total:
        return 0, "(none)", []
    threads = ", ".join(f"{name} {100 * c / total:.0f}%" for name, c in
                        sorted(per_thread.items(), key=lambda kv: -kv[1])[:n])
    leaves = [f"{100 * c / total:5.1f}%  {leaf}" for leaf, c in
              sorted(own.items(), key=lambda kv: -kv[1])[:n]]
    return total, threads, leaves


# -- the run --------------------------------------------------------------------------------
def goals(out: dict) -> None:
    call = out.get("ray_call_p50_ms")
    p50, p99 = out.get("confluent_e2e_p50_ms"), out.get("confluent_e2e_p99_ms")
    for what in ("produce", "consume"):
        out[f"confluent_{what}_vs_local"] = ratio(
            out.get(f"confluent_rf1_{what}_records_per_s"),
            out.get(f"local_{what}_records_per_s"))
    out["e2e_p50_vs_ray_call"] = ratio(p50, call)
    out["e2e_p99_vs_ray_call"] = ratio(p99, call)
    out["goal_confluent_produce_rf1_met"] = (out.get("confluent_rf1_produce_records_per_s")
                                             or 0) >= GOAL_PRODUCE_RF1
    out["goal_confluent_consume_met"] = (out.get("confluent_rf1_consume_records_per_s")
                                         or 0) >= GOAL_CONSUME
    out["goal_e2e_p50_met"] = bool(p50 and call and p50 <= GOAL_E2E_P50_X * call)
    out["goal_e2e_p99_met"] = bool(p99 and call and p99 <= GOAL_E2E_P99_X * call)


def table(out: dict) -> None:
    def fmt(v):
        return "-" if v is None else f"{v:,}"

    rows = [("confluent-kafka produce, RF=1 acks=1", "confluent_rf1_produce_records_per_s",
             f">= {GOAL_PRODUCE_RF1:,}"),
            ("  raw file append just before it, MB/s", "raw_append_rf1_MB_per_s",
             "(this moment's page-cache write cost)"),
            ("confluent-kafka consume, RF=1", "confluent_rf1_consume_records_per_s",
             f">= {GOAL_CONSUME:,}"),
            ("confluent-kafka produce, RF=3 acks=all", "confluent_rf3_produce_records_per_s",
             ""),
            ("confluent-kafka consume, RF=3", "confluent_rf3_consume_records_per_s", ""),
            ("raykafka Producer, RF=1 acks=1", "raykafka_rf1_produce_records_per_s", ""),
            ("raykafka SimpleConsumer, RF=1", "raykafka_rf1_consume_records_per_s", ""),
            ("raykafka Producer, RF=3 acks=all", "raykafka_rf3_produce_records_per_s", ""),
            ("raykafka SimpleConsumer, RF=3", "raykafka_rf3_consume_records_per_s", ""),
            ("confluent-kafka produce, LocalBroker (floor)", "local_produce_records_per_s",
             ""),
            ("confluent-kafka consume, LocalBroker (floor)", "local_consume_records_per_s",
             ""),
            ("  records already in the client, handed over",
             "client_consume_ceiling_records_per_s", "(the client's ceiling)"),
            ("  the same, garbage collector off", "client_consume_ceiling_nogc_records_per_s",
             ""),
            ("redis-py XADD, pipelines of 1000", "redis_xadd_records_per_s", ""),
            ("redis-py XREADGROUP NOACK COUNT 1000", "redis_xreadgroup_records_per_s", "")]
    say(f"\n{'records/s (100-byte records)':<44}{'measured':>14}  goal")
    for what, key, goal in rows:
        say(f"{what:<44}{fmt(out.get(key)):>14}  {goal}")
    call = out.get("ray_call_p50_ms")
    say(f"confluent e2e at 1,000/s (RF=1): p50 {out.get('confluent_e2e_p50_ms')} ms "
        f"(goal <= {GOAL_E2E_P50_X:g} x ray call = "
        f"{round(GOAL_E2E_P50_X * call, 3) if call else '-'}), p99 "
        f"{out.get('confluent_e2e_p99_ms')} ms (goal <= {GOAL_E2E_P99_X:g} x = "
        f"{round(GOAL_E2E_P99_X * call, 3) if call else '-'}); RF=3: p50 "
        f"{out.get('confluent_e2e_rf3_p50_ms')} ms, p99 {out.get('confluent_e2e_rf3_p99_ms')}"
        f" ms; LocalBroker (floor): p50 {out.get('local_e2e_p50_ms')} ms, p99 "
        f"{out.get('local_e2e_p99_ms')} ms; ray call p50 {call} ms, p99 "
        f"{out.get('ray_call_p99_ms')} ms")
    met = {k: v for k, v in out.items() if k.startswith("goal_")}
    say("goals: " + ", ".join(f"{k[5:]}={'met' if v else 'MISSED'}" for k, v in met.items()))
    say(f"load average (1 min) at start {out.get('load_avg_1m')}, at end "
        f"{out.get('load_avg_1m_end')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records (about 2 minutes)")
    ap.add_argument("--records", type=int, default=None,
                    help="confluent RF=1 records (default 2,000,000; --quick 1,000,000); "
                         "RF=3 and raykafka's runs use half")
    ap.add_argument("--peer-records", type=int, default=None,
                    help="Redis records (default 300,000; --quick 100,000)")
    ap.add_argument("--e2e-seconds", type=float, default=None,
                    help="seconds of each paced latency run (default 10; --quick 5)")
    ap.add_argument("--keep-topics", action="store_true",
                    help="make the four topics at the start and keep them through every "
                         "phase (default: each topic lives only through its own phases)")
    ap.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                    help="py-spy the brokers for this long during an extra confluent "
                         "RF=1 produce (default 0: no profile)")
    ap.add_argument("--profile-dir", default=None,
                    help="where the profiles go (default: a new temporary directory)")
    a = ap.parse_args(argv)
    records = a.records or (1_000_000 if a.quick else 2_000_000)
    half = max(records // 2, 1)
    peer_n = a.peer_records or (100_000 if a.quick else 300_000)
    seconds = a.e2e_seconds or (5.0 if a.quick else 10.0)
    t_start = time.perf_counter()
    out: dict = {"load_avg_1m": round(os.getloadavg()[0], 2), "record_size": RECORD_SIZE,
                 "partitions": PARTITIONS, "brokers": 3, "topics_kept": a.keep_topics}
    work = tempfile.mkdtemp(prefix="raykafka-clients-bench-")
    try:
        phase(out, "redis", _redis, peer_n, work)
        phase(out, "local_broker", _local, records, seconds)
        with contextlib.ExitStack() as stack:
            try:
                cluster, _ = stack.enter_context(bench_cluster("clients-bench", 3))
            except Exception as exc:  # noqa: BLE001 - reported in the JSON line
                out["cluster_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                say(f"cluster start failed: {out['cluster_error']}")
                cluster = None
            if cluster is not None:
                _measure(out, cluster, work, a, records, half, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return finish(out, t_start, goals, table)


def _measure(out: dict, cluster, work: str, a, records: int, half: int,
             seconds: float) -> None:
    """Every phase on the running cluster (each records its own failure). Each topic lives
    only through the phases that use it (``--keep-topics``: all four from the start)."""
    phase(out, "ray_call", time_ray_calls, 2000)
    specs = {"rf1": ("c-rf1", 1), "rf3": ("c-rf3", 3), "rk1": ("rk-rf1", 1),
             "rk3": ("rk-rf3", 3)}
    topics: dict = {}

    def make(*keys) -> dict:
        for key in keys:
            name, rf = specs[key]
            topics[key] = _topic(cluster, name, rf)
        return {}

    def drop(key: str) -> None:
        name, rf = specs[key]
        if not a.keep_topics and topics.pop(key, None):
            phase(out, f"drop_{key}", drop_topic, cluster, name, PARTITIONS * rf)

    phase(out, "topics", make, *(specs if a.keep_topics else ["rf1"]))
    if "rf1" not in topics:
        return
    # warm-up: the first produce after a start runs on cold workers (docs/ray-notes.md)
    phase(out, "warm_up", lambda: confluent_produce(
        cluster.bootstrap_servers, topics["rf1"], max(records // 10, 1), "1") and {})
    phase(out, "group_coordinator", warm_group_coordinator, cluster.bootstrap_servers)
    # this moment's page-cache write cost, which moves a lot on this VM (docs/sizing.md)
    phase(out, "raw_append", raw_append, work, "rf1", records * RECORD_SIZE)
    phase(out, "confluent_rf1", _confluent, cluster, topics["rf1"], records, "1",
          "confluent_rf1")
    phase(out, "confluent_e2e", _e2e, cluster, topics["rf1"], seconds, "confluent_e2e")
    if a.profile:
        phase(out, "profile", _profile, cluster, topics["rf1"], records, a.profile,
              a.profile_dir or tempfile.mkdtemp(prefix="raykafka-clients-profile-"))
    drop("rf1")
    # (phase name, function, its arguments after cluster and topic): the name is also the
    # prefix of the figures the function returns
    later = {"rf3": [("confluent_rf3", _confluent, half, "all"),
                     ("confluent_e2e_rf3", _e2e, seconds)],
             "rk1": [("raykafka_rf1", _raykafka, half, 1)],
             "rk3": [("raykafka_rf3", _raykafka, half, "all")]}
    for key, runs in later.items():
        if key not in topics:
            phase(out, f"topic_{key}", make, key)
        if key in topics:
            for name, fn, *args in runs:
                phase(out, name, fn, cluster, topics[key], *args, name)
            drop(key)


def _redis(n: int, work: str) -> dict:
    res = bench_redis(n, RECORD_SIZE, work)
    if "skipped" in res:
        return {"redis_skipped": res["skipped"]}
    return {"redis_xadd_records_per_s": round(res["produce"]),
            "redis_xreadgroup_records_per_s": round(res["consume"])}


if __name__ == "__main__":
    sys.exit(main())
