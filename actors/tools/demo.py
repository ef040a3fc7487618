"""``raykafka demo``: the embedded default end to end.

Starts a local Ray, an embedded ZooKeeper and ``brokers`` brokers (``Cluster.start``),
creates a topic of ``partitions`` partitions, produces ``records`` keyed records with the
producer's bulk path, reads every partition back with the simple consumer's columnar path,
and checks what a Kafka user relies on:

- every record produced is read back exactly once (counts per partition and in total);
- each key's records sit on one partition, the one Kafka's murmur2 picks for that key;
- each key's records come back in the order they were sent (a per-key sequence number in
  the value: 0, 1, 2, ... with no gap).

It prints a progress bar per phase and a summary (records, MB/s, time per phase), shuts the
cluster down and returns the summary (``ok`` False when a check failed). The storage crash
demo is ``raykafka demo --storage`` (actors/storage_demo.py).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import numpy as np

from ..errors import KafkaTimeoutError

TOPIC = "demo-events"
KEYS = 1000
VALUE_BYTES = 100
CHUNK_RECORDS = 50_000


def _records(start: int, n: int):
    """Keys ``user-<i % KEYS>`` and values ``<key>|<per-key sequence>|`` padded to 100 B."""
    keys, values = [], []
    for i in range(start, start + n):
        k = i % KEYS
        key = b"user-%04d" % k
        keys.append(key)
        head = b"%s|%09d|" % (key, i // KEYS)
        values.append(head + b"." * (VALUE_BYTES - len(head)))
    return keys, values


def run(*, records: int = 200_000, partitions: int = 6, brokers: int = 3,
        data_dir: str | None = None, quiet: bool = False) -> dict:
    from tqdm import tqdm

    from .. import raycompat
    from ..cluster import Cluster
    from ..client.murmur2 import partitions_for_keys

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    own_dir = data_dir is None
    root = data_dir or tempfile.mkdtemp(prefix="raykafka-demo-")
    phases: dict[str, float] = {}
    summary: dict = {"ok": False}

    say(f"raykafka demo: {brokers} brokers, topic {TOPIC!r} with {partitions} partitions, "
        f"{records:,} keyed records of {VALUE_BYTES} B")
    t = time.perf_counter()
    raycompat.init_local("raykafka-demo")
    cluster = Cluster.start(num_brokers=brokers, data_dir=root, namespace="raykafka-demo")
    phases["start_s"] = time.perf_counter() - t
    say(f"[1/4] cluster up in {phases['start_s']:.1f}s: brokers {cluster.broker_ids()}, "
        f"controller {cluster.controller_id()}, zookeeper {cluster.zk_hosts}")
    try:
        t = time.perf_counter()
        admin = cluster.admin()
        if TOPIC in admin.list_topics():  # a --data-dir kept from an earlier demo
            say(f"      deleting the {TOPIC!r} an earlier demo left in {root}")
            admin.delete_topic(TOPIC)
            deadline = time.monotonic() + 60
            while TOPIC in admin.list_topics():
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(f"topic {TOPIC!r} was not deleted within 60 s")
                time.sleep(0.1)
        admin.create_topic(TOPIC, partitions=partitions, replication_factor=1,
                           config={"max.message.bytes": str(8 << 20)})
        leaders = {r["partition"]: r["leader"] for r in admin.describe_topic(TOPIC)}
        phases["create_s"] = time.perf_counter() - t
        say(f"[2/4] topic created in {phases['create_s']:.2f}s; leaders by partition: "
            f"{leaders}")

        t = time.perf_counter()
        producer = cluster.producer(acks="all", linger_ms=0, max_request_size=4 << 20,
                                    batch_size=4 << 20)
        futures = []
        bar = tqdm(total=records, desc="produce", unit="rec", unit_scale=True,
                   disable=True if quiet else None, file=sys.stdout, leave=False)
        built_s = 0.0
        for start in range(0, records, CHUNK_RECORDS):
            n = min(CHUNK_RECORDS, records - start)
            b0 = time.perf_counter()
            keys, values = _records(start, n)
            built_s += time.perf_counter() - b0
            futures.append(producer.send_batch(TOPIC, values, keys=keys))
            while futures and futures[0].is_done:
                f = futures.pop(0)
                f.wait()
                bar.update(len(f))
        for f in futures:
            f.wait(timeout=120)
            bar.update(len(f))
        producer.close(timeout=30)
        bar.close()
        phases["produce_s"] = time.perf_counter() - t
        say(f"[3/4] produced {records:,} records in {phases['produce_s']:.2f}s "
            f"({records / phases['produce_s']:,.0f} records/s, "
            f"{records * VALUE_BYTES / phases['produce_s'] / 1e6:.1f} MB/s; "
            f"{built_s:.2f}s of it making the test records), acks=all")

        t = time.perf_counter()
        consumer = cluster.simple_consumer()
        bar = tqdm(total=records, desc="consume", unit="rec", unit_scale=True,
                   disable=True if quiet else None, file=sys.stdout, leave=False)
        per_partition: dict[int, list] = {p: [] for p in range(partitions)}
        read = 0
        for p, table in consumer.iter_columns(TOPIC, max_bytes=4 << 20):
            per_partition[p].append(table)
            read += table.num_rows
            bar.update(table.num_rows)
        bar.close()
        phases["consume_s"] = time.perf_counter() - t
        say(f"[4/4] consumed {read:,} records in {phases['consume_s']:.2f}s "
            f"({read / phases['consume_s']:,.0f} records/s, "
            f"{read * VALUE_BYTES / phases['consume_s'] / 1e6:.1f} MB/s)")

        t = time.perf_counter()
        problems = _check(per_partition, records, partitions, partitions_for_keys)
        phases["check_s"] = time.perf_counter() - t
        counts = {p: sum(tb.num_rows for tb in ts) for p, ts in per_partition.items()}
        summary = {
            "ok": not problems, "records_produced": records, "records_consumed": read,
            "keys": KEYS, "partitions": partitions, "brokers": brokers,
            "records_per_partition": counts,
            "produce_records_per_s": round(records / phases["produce_s"]),
            "produce_MB_per_s": round(records * VALUE_BYTES / phases["produce_s"] / 1e6, 1),
            "consume_records_per_s": round(read / phases["consume_s"]),
            "consume_MB_per_s": round(read * VALUE_BYTES / phases["consume_s"] / 1e6, 1),
            **{k: round(v, 2) for k, v in phases.items()},
            "problems": problems[:10],
        }
    finally:
        t = time.perf_counter()
        cluster.shutdown()
        phases["shutdown_s"] = time.perf_counter() - t
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    summary["shutdown_s"] = round(phases["shutdown_s"], 2)
    _print_summary(say, summary)
    return summary


def _check(per_partition: dict, records: int, partitions: int, partitions_for_keys) -> list:
    """Problems found (empty when all is well); see the module docstring."""
    problems = []
    seen_total = 0
    next_seq: dict[bytes, int] = {}
    key_partition: dict[bytes, int] = {}
    for p, tables in sorted(per_partition.items()):
        last_offset = -1
        for table in tables:
            offsets = table.column("offset").to_numpy()
            if len(offsets) and (offsets[0] <= last_offset or np.any(np.diff(offsets) <= 0)):
                problems.append(f"partition {p}: offsets not strictly increasing")
            if len(offsets):
                last_offset = int(offsets[-1])
            for key, value in zip(table.column("key").to_pylist(),
                                  table.column("value").to_pylist()):
                seen_total += 1
                seq = int(value.split(b"|", 2)[1])
                want = next_seq.get(key, 0)
                if seq != want:
                    problems.append(f"key {key.decode()}: sequence {seq} where {want} was "
                                    f"expected (partition {p})")
                next_seq[key] = seq + 1
                if key_partition.setdefault(key, p) != p:
                    problems.append(f"key {key.decode()} on partitions {key_partition[key]} "
                                    f"and {p}")
    if seen_total != records:
        problems.append(f"read {seen_total} records, produced {records}")
    expected_keys = min(KEYS, records)
    if len(next_seq) != expected_keys:
        problems.append(f"{len(next_seq)} distinct keys read, {expected_keys} produced")
    keys = sorted(key_partition)
    if keys:
        want = partitions_for_keys(keys, partitions)
        wrong = [k for k, w in zip(keys, np.asarray(want).tolist()) if key_partition[k] != w]
        if wrong:
            problems.append(f"{len(wrong)} keys not on their murmur2 partition "
                            f"(e.g. {wrong[0].decode()})")
    return problems


def _print_summary(say, s: dict) -> None:
    say("")
    say("summary")
    rows = [("records produced", f"{s.get('records_produced', 0):,}"),
            ("records consumed", f"{s.get('records_consumed', 0):,}"),
            ("distinct keys", f"{s.get('keys', 0):,}"),
            ("produce", f"{s.get('produce_records_per_s', 0):,} records/s, "
                        f"{s.get('produce_MB_per_s', 0)} MB/s"),
            ("consume", f"{s.get('consume_records_per_s', 0):,} records/s, "
                        f"{s.get('consume_MB_per_s', 0)} MB/s")]
    for phase in ("start_s", "create_s", "produce_s", "consume_s", "check_s", "shutdown_s"):
        if phase in s:
            rows.append((f"time: {phase[:-2]}", f"{s[phase]:.2f} s"))
    if "records_per_partition" in s:
        rows.append(("per partition", ", ".join(f"{p}:{n:,}" for p, n in
                                                sorted(s["records_per_partition"].items()))))
    for name, value in rows:
        say(f"  {name:<18} {value}")
    if s.get("ok"):
        say("every record read back once, each key on its murmur2 partition, in send order")
    else:
        say("DEMO FAILED:")
        for problem in s.get("problems") or ["the demo did not complete"]:
            say(f"  - {problem}")
