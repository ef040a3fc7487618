"""``raykafka perf produce`` / ``perf consume``: Kafka's producer/consumer perf tools.

Both take a connected (or embedded) ``Cluster`` and return a result dict; ``print_result``
prints a human summary on stderr and, as the last line on stdout, one JSON object with
``records_per_s``, ``MB_per_s``, ``p50_ms``, ``p99_ms`` (and more).

What is measured:
- produce: the producer's bulk path (``send_batch``) with one payload of ``record_size``
  random bytes (as Kafka's ProducerPerformance reuses one random payload), no keys. The clock
  runs from the first ``send_batch`` to the last acknowledgement (``acks`` as given).
  Latency is per ``send_batch`` call (a chunk of ``chunk_records`` records, cut by the
  producer into one request per partition or more): from the call to the acknowledgement of
  its last request, as seen by a waiter thread taking the chunks in order. It is *not* a
  per-record latency.
- consume: ``SimpleConsumer.iter_columns`` (fetches pipelined per partition, batches decoded
  straight into Arrow columns: the fastest path), all partitions from the log start until
  ``num_records`` records. Latency is per fetched batch: how long the consumer waited for it
  (fetch round trip not hidden by the pipelining, plus decoding). MB/s counts value bytes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

from ..errors import InvalidConfigurationError, UnknownTopicOrPartitionError

DEFAULT_REQUEST_BYTES = 4 << 20
PERF_TOPIC_CONFIG = {"max.message.bytes": str(16 << 20), "segment.bytes": str(256 << 20)}
FETCH_MAX_BYTES = 4 << 20
WAIT_TIMEOUT_S = 120.0


def ensure_topic(cluster, topic: str, *, partitions: int, create: bool) -> None:
    """Create ``topic`` (RF 1, large-request config) when missing and ``create`` is set."""
    try:
        cluster.metadata.partitions_for(topic)
        return
    except UnknownTopicOrPartitionError:
        if not create:
            raise UnknownTopicOrPartitionError(
                f"unknown topic {topic!r} (create it with `raykafka topics create`, or pass "
                f"--create)") from None
    cluster.admin().create_topic(topic, partitions=partitions, replication_factor=1,
                                 config=PERF_TOPIC_CONFIG)


def _request_bytes(cluster, topic: str, wanted: int | None) -> int:
    """The request size: ``wanted`` (default 4 MiB), at most the topic's max.message.bytes."""
    try:
        limit = int(cluster.admin().topic_config(topic).get("max.message.bytes", 1048588))
    except Exception:  # noqa: BLE001 - the broker default
        limit = 1048588
    size = wanted or DEFAULT_REQUEST_BYTES
    if wanted is not None and wanted > limit:
        raise InvalidConfigurationError(
            f"--batch-size {wanted} is larger than the topic's max.message.bytes={limit}")
    return min(size, limit)


def _bar(total: int, desc: str, unit: str = "rec"):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=os.environ.get("RAYKAFKA_NO_PROGRESS") == "1", mininterval=0.25,
                leave=False)


def _percentiles(latencies_s: list) -> tuple[float | None, float | None]:
    """(p50, p99) in ms; (None, None) without samples (JSON null, not NaN)."""
    if not latencies_s:
        return None, None
    arr = np.asarray(latencies_s) * 1000
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def produce(cluster, topic: str, *, num_records: int, record_size: int, acks="all",
            batch_size: int | None = None, chunk_records: int | None = None,
            progress: bool = True, throughput: int | None = None) -> dict:
    """Produce ``num_records``; ``throughput`` (records/s) paces the chunks as Kafka's
    ``--throughput`` does (None: as fast as possible), so latency can be measured below
    saturation."""
    if throughput is not None and throughput <= 0:
        throughput = None
    request_bytes = _request_bytes(cluster, topic, batch_size)
    parts = len(cluster.metadata.partitions_for(topic))
    per_request = max(request_bytes // (record_size + 40), 1)
    chunk = chunk_records or max(min(per_request * parts, 200_000), 1)
    producer = cluster.producer(acks=acks, batch_size=request_bytes,
                                max_request_size=request_bytes, linger_ms=0,
                                buffer_memory=max(512 << 20, 4 * chunk * (record_size + 40)),
                                request_timeout_ms=int(WAIT_TIMEOUT_S * 1000))
    payload = os.urandom(record_size)
    pending: list = []
    cond = threading.Condition()
    latencies: list = []
    errors: list = []
    bar = _bar(num_records, "produce") if progress else None

    def waiter():
        while True:
            with cond:
                while not pending:
                    cond.wait()
                item = pending.pop(0)
            if item is None:
                return
            sent_at, future = item
            try:
                future.wait(timeout=WAIT_TIMEOUT_S)
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)
                return
            latencies.append(time.perf_counter() - sent_at)
            if bar is not None:
                bar.update(len(future))

    thread = threading.Thread(target=waiter, daemon=True, name="perf-acks")
    thread.start()
    values_full = [payload] * chunk
    t0 = time.perf_counter()
    sent = 0
    try:
        while sent < num_records and not errors:
            n = min(chunk, num_records - sent)
            values = values_full if n == chunk else values_full[:n]
            if throughput is not None:
                due = t0 + sent / throughput
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
            sent_at = time.perf_counter()
            future = producer.send_batch(topic, values)
            with cond:
                pending.append((sent_at, future))
                cond.notify()
            sent += n
        with cond:
            pending.append(None)
            cond.notify()
        thread.join(WAIT_TIMEOUT_S * 2)
        elapsed = time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.close()
        producer.close(timeout=30)
    if errors:
        raise errors[0]
    p50, p99 = _percentiles(latencies)
    return {"tool": "perf produce", "topic": topic, "records": num_records,
            "record_size": record_size, "acks": acks, "request_bytes": request_bytes,
            "chunk_records": chunk, "partitions": parts, "elapsed_s": round(elapsed, 3),
            "records_per_s": round(num_records / elapsed),
            "MB_per_s": round(num_records * record_size / elapsed / 1e6, 2),
            "p50_ms": _ms(p50), "p99_ms": _ms(p99),
            "throughput_limit": throughput,
            "latency": "per send_batch chunk (call to last ack)"}


def fill(cluster, topic: str, *, num_records: int, record_size: int) -> None:
    """Make sure ``topic`` holds at least ``num_records`` (for ``perf consume --embedded``)."""
    sc = cluster.simple_consumer()
    have = sum(sc.offsets_before(topic, p, -1)[0] - sc.offsets_before(topic, p, -2)[0]
               for p in cluster.metadata.partitions_for(topic))
    if have < num_records:
        produce(cluster, topic, num_records=num_records - have, record_size=record_size,
                progress=True)


def consume(cluster, topic: str, *, num_records: int, progress: bool = True,
            fetch_max_bytes: int = FETCH_MAX_BYTES) -> dict:
    consumer = cluster.simple_consumer(request_timeout_ms=int(WAIT_TIMEOUT_S * 1000))
    bar = _bar(num_records, "consume") if progress else None
    latencies = []
    count = 0
    value_bytes = 0
    t0 = time.perf_counter()
    asked = t0
    try:
        it = consumer.iter_columns(topic, max_bytes=fetch_max_bytes)
        for _, table in it:
            now = time.perf_counter()
            latencies.append(now - asked)
            n = table.num_rows
            if count + n > num_records:
                table = table.slice(0, num_records - count)
                n = table.num_rows
            count += n
            value_bytes += _binary_bytes(table.column("value"))
            if bar is not None:
                bar.update(n)
            if count >= num_records:
                break
            asked = time.perf_counter()
        elapsed = time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.close()
    p50, p99 = _percentiles(latencies)
    result = {"tool": "perf consume", "topic": topic, "records": count,
              "elapsed_s": round(elapsed, 3),
              "records_per_s": round(count / elapsed) if elapsed else 0,
              "MB_per_s": round(value_bytes / elapsed / 1e6, 2) if elapsed else 0,
              "p50_ms": _ms(p50), "p99_ms": _ms(p99), "fetches": len(latencies),
              "latency": "per fetched batch (time the consumer waited for it)"}
    if count < num_records:
        result["short"] = f"the topic held only {count} records"
    return result


def _binary_bytes(column) -> int:
    """Bytes of a (chunked) binary Arrow column's values, from its offsets."""
    total = 0
    for chunk in column.chunks:
        if len(chunk):
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32,
                                    count=len(chunk) + 1 + chunk.offset)
            total += int(offsets[chunk.offset + len(chunk)] - offsets[chunk.offset])
    return total


def print_result(result: dict) -> None:
    what = result["tool"]
    line = (f"{what}: {result['records']:,} records in {result['elapsed_s']:.2f}s, "
            f"{result['records_per_s']:,.0f} records/s, {result['MB_per_s']:.1f} MB/s, "
            f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms ({result['latency']})")
    print(line, file=sys.stderr)
    if "short" in result:
        print(f"note: {result['short']}", file=sys.stderr)
    print(json.dumps(result, allow_nan=False), flush=True)
