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
    """A progress bar on stderr, shown only on a terminal (``disable=None``: a redirected
    run's output carries no bar redraws) and never with RAYKAFKA_NO_PROGRESS=1."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=True if os.environ.get("RAYKAFKA_NO_PROGRESS") == "1" else None,
                mininterval=0.25, leave=False)


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


# -- perf scale: the cost of a partition ------------------------------------------------------
SCALE_SIZES = (10, 30, 60)
SCALE_GOALS = {"memory_ratio": 1.2, "idle_cpu_ratio": 1.2, "create_ratio": 1.5,
               "first_send_ms_p50": 20.0}
SCALE_REFERENCE_BARE = 10          # bare actors kept alive as the idle baseline
SCALE_SETTLE_S = 1.0


def _bare_actor_class():
    """The baseline: a Ray actor with no body. Defined in a function so that Ray ships it by
    value: its worker imports nothing of ours (the floor the replicas are compared with)."""
    class BareActor:
        def pid(self) -> int:
            import os as _os
            return _os.getpid()
    return BareActor


def _actor_options(name: str, namespace: str) -> dict:
    """What a Broker gives its PartitionReplica actors (server/broker.py), for the baseline."""
    from .. import raycompat
    return {"name": name, "namespace": namespace, "num_cpus": 0, "max_concurrency": 8,
            "scheduling_strategy": raycompat.this_node()}


def _median(values):
    return float(np.median(values)) if len(values) else None


def _procs_usage(pids: list[int], idle_s: float) -> dict:
    """Memory (USS, RSS in MB), thread count and CPU % of one core over ``idle_s`` for each
    pid, all sampled in the same window."""
    import psutil
    procs = [psutil.Process(pid) for pid in pids]
    t0 = time.perf_counter()
    before = [p.cpu_times() for p in procs]
    time.sleep(idle_s)
    after = [p.cpu_times() for p in procs]
    elapsed = time.perf_counter() - t0
    cpu = [100.0 * ((a.user + a.system) - (b.user + b.system)) / elapsed
           for a, b in zip(after, before)]
    mem = [p.memory_full_info() for p in procs]
    return {"cpu_pct": cpu, "uss_mb": [m.uss / 1e6 for m in mem],
            "rss_mb": [m.rss / 1e6 for m in mem], "threads": [p.num_threads() for p in procs]}


def _replica_pid(handle) -> int:
    import ray
    return ray.get(handle.__ray_call__.remote(lambda self: __import__("os").getpid()),
                   timeout=60)


def _spread_produce(cluster, topics: dict, records: int, record_size: int) -> dict:
    """``records`` records of ``record_size`` bytes over every partition of ``topics``
    ({name: partitions}) from one producer (send_batch, acks=1); records/s and MB/s."""
    total_parts = sum(topics.values())
    per_partition = max(records // total_parts, 1)
    payload = os.urandom(record_size)
    producer = cluster.producer(acks=1, linger_ms=0, batch_size=512 << 10,
                                max_request_size=1 << 20, buffer_memory=512 << 20,
                                request_timeout_ms=int(WAIT_TIMEOUT_S * 1000))
    try:
        futures = []
        t0 = time.perf_counter()
        for topic, parts in topics.items():
            futures.append(producer.send_batch(topic, [payload] * (per_partition * parts)))
        for f in futures:
            f.wait(timeout=WAIT_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
    finally:
        producer.close(timeout=30)
    n = per_partition * total_parts
    return {"records": n, "records_per_s": round(n / elapsed),
            "MB_per_s": round(n * record_size / elapsed / 1e6, 2)}


def scale(*, sizes=SCALE_SIZES, brokers: int = 3, idle_s: float = 10.0,
          records: int = 200_000, record_size: int = 100, data_dir: str | None = None,
          out=sys.stdout) -> dict:
    """The cost of a partition (``raykafka perf scale``, benchmarks/scale_bench.py).

    Starts a private Ray and a ``brokers``-broker cluster, then for each total in ``sizes``
    (increasing) creates a topic with the missing partitions (RF 1) and measures, next to
    bare Ray actors started in the same run with the replicas' actor options: start time
    per actor (bare: all of a step's actors started at once until each answers; replicas:
    ``create_topic`` until every leader serves), first-send latency per partition from a
    fresh client (its own Metadata and Producer: one record, acks=1, sent and awaited
    partition by partition; then a second round, warm), memory (USS, RSS) and idle CPU of
    each replica's and each reference bare actor's worker process over the same
    ``idle_s`` window, and produce throughput spread over all partitions. Prints a table
    and returns the summary (the CLI prints it as the last line, JSON).
    """
    import shutil
    import tempfile

    import ray

    import actors
    from ..client.metadata import Metadata
    from ..cluster import Cluster

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    sizes = list(sizes)
    own_dir = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="raykafka-scale-")
    namespace = f"scale-{os.getpid()}"
    t_start = time.perf_counter()
    own_ray = not ray.is_initialized()
    cluster = Cluster.start(num_brokers=brokers, data_dir=data_dir, namespace=namespace)
    bare_cls = ray.remote(_bare_actor_class())
    reference: list = []         # bare actors kept for the idle baseline
    steps: list[dict] = []
    topics: dict[str, int] = {}
    replica_pids: list[int] = []
    first_all: list[float] = []
    create_total = bare_total = 0.0
    made = 0
    try:
        say(f"cluster of {brokers} brokers up in {time.perf_counter() - t_start:.1f}s "
            f"(namespace {namespace}, data {data_dir})")
        for size in sizes:
            new = size - made
            # bare actors: start `new` at once, as a topic starts its replicas
            t0 = time.perf_counter()
            bare = [bare_cls.options(**_actor_options(f"bare-{made + i}", namespace)).remote()
                    for i in range(new)]
            bare_pids = ray.get([b.pid.remote() for b in bare], timeout=600)
            bare_s = time.perf_counter() - t0
            keep = max(SCALE_REFERENCE_BARE - len(reference), 0)
            reference += list(zip(bare[:keep], bare_pids[:keep]))
            _kill_and_wait(bare[keep:], bare_pids[keep:])
            # replicas: a topic of `new` partitions, until every leader serves
            topic = f"scale-{size}"
            t0 = time.perf_counter()
            cluster.admin().create_topic(topic, partitions=new, replication_factor=1)
            create_s = time.perf_counter() - t0
            topics[topic] = new
            # first send per partition, from a fresh client
            producer = actors.Producer(Metadata(namespace, cluster.broker_ids()), acks=1,
                                       linger_ms=0)
            try:
                rounds = []
                for _ in range(2):
                    lat = []
                    for p in range(new):
                        t0 = time.perf_counter()
                        producer.send(topic, b"x" * record_size, partition=p).get(timeout=60)
                        lat.append((time.perf_counter() - t0) * 1000)
                    rounds.append(lat)
            finally:
                producer.close(timeout=30)
            first_all += rounds[0]
            replica_pids += [_replica_pid(cluster.metadata.leader(topic, p).handle)
                             for p in range(new)]
            time.sleep(SCALE_SETTLE_S)
            usage = _procs_usage(replica_pids + [pid for _, pid in reference], idle_s)
            k = len(replica_pids)
            rep = {key: vals[:k] for key, vals in usage.items()}
            ref = {key: vals[k:] for key, vals in usage.items()}
            tput = _spread_produce(cluster, topics, records, record_size)
            create_total += create_s
            bare_total += bare_s
            made = size
            step = {
                "partitions": size, "new_partitions": new,
                "replica_uss_mb": _median(rep["uss_mb"]), "bare_actor_uss_mb": _median(ref["uss_mb"]),
                "replica_rss_mb": _median(rep["rss_mb"]), "bare_actor_rss_mb": _median(ref["rss_mb"]),
                "replica_idle_cpu_pct": float(np.mean(rep["cpu_pct"])),
                "bare_actor_idle_cpu_pct": float(np.mean(ref["cpu_pct"])),
                "replica_threads": _median(rep["threads"]),
                "bare_actor_threads": _median(ref["threads"]),
                "create_s_per_partition": create_s / new, "bare_actor_start_s": bare_s / new,
                "first_send_ms_p50": _median(rounds[0]), "first_send_ms_max": max(rounds[0]),
                "second_send_ms_p50": _median(rounds[1]),
                "produce_records_per_s": tput["records_per_s"],
                "produce_MB_per_s": tput["MB_per_s"],
            }
            steps.append(step)
            _print_step(say, step)
    finally:
        for handle, _ in reference:
            ray.kill(handle, no_restart=True)
        cluster.shutdown()
        if own_ray:
            ray.shutdown()   # its own Ray, and no raylet warning printed after the summary
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    last = steps[-1]
    summary = {
        "tool": "perf scale", "brokers": brokers, "sizes": sizes, "idle_window_s": idle_s,
        "replica_uss_mb": _r(last["replica_uss_mb"]),
        "bare_actor_uss_mb": _r(last["bare_actor_uss_mb"]),
        "replica_rss_mb": _r(last["replica_rss_mb"]),
        "bare_actor_rss_mb": _r(last["bare_actor_rss_mb"]),
        "replica_idle_cpu_pct": _r(last["replica_idle_cpu_pct"], 3),
        "bare_actor_idle_cpu_pct": _r(last["bare_actor_idle_cpu_pct"], 3),
        "create_s_per_partition": _r(create_total / made, 3),
        "bare_actor_start_s": _r(bare_total / made, 3),
        "first_send_ms_p50": _r(_median(first_all)),
        "first_send_ms_max": _r(max(first_all)),
        "second_send_ms_p50": _r(_median([s["second_send_ms_p50"] for s in steps])),
        "produce_records_per_s": last["produce_records_per_s"],
        "produce_MB_per_s": last["produce_MB_per_s"],
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "steps": [{k: (_r(v, 3) if isinstance(v, float) else v) for k, v in s.items()}
                  for s in steps],
    }
    ratios = {
        "uss_ratio": summary["replica_uss_mb"] / summary["bare_actor_uss_mb"],
        "rss_ratio": summary["replica_rss_mb"] / summary["bare_actor_rss_mb"],
        "idle_cpu_ratio": (summary["replica_idle_cpu_pct"]
                           / max(summary["bare_actor_idle_cpu_pct"], 1e-9)),
        "create_ratio": summary["create_s_per_partition"] / summary["bare_actor_start_s"],
    }
    summary.update({k: round(v, 3) for k, v in ratios.items()})
    g = SCALE_GOALS
    summary["goals"] = {
        "memory": ratios["uss_ratio"] <= g["memory_ratio"]
        and ratios["rss_ratio"] <= g["memory_ratio"],
        "idle_cpu": ratios["idle_cpu_ratio"] <= g["idle_cpu_ratio"],
        "create": ratios["create_ratio"] <= g["create_ratio"],
        "first_send": summary["first_send_ms_p50"] <= g["first_send_ms_p50"],
    }
    say(f"whole run {summary['elapsed_s']}s; per replica vs bare actor (last step): "
        f"USS x{ratios['uss_ratio']:.2f}, RSS x{ratios['rss_ratio']:.2f}, idle CPU "
        f"x{ratios['idle_cpu_ratio']:.2f}; start x{ratios['create_ratio']:.2f} (all steps); "
        f"first send p50 {summary['first_send_ms_p50']} ms; goals "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in summary["goals"].items()))
    return summary


def _r(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


def _kill_and_wait(handles, pids, timeout_s: float = 60.0) -> None:
    """Kill bare actors and wait until their processes are gone (their exit is not noise in
    the next measurement)."""
    import psutil
    import ray
    for h in handles:
        ray.kill(h, no_restart=True)
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)


def _print_step(say, s: dict) -> None:
    say(f"-- {s['partitions']} partitions ({s['new_partitions']} new)        replica   bare actor")
    rows = [("memory USS MB (median)", "replica_uss_mb", "bare_actor_uss_mb", "{:.1f}"),
            ("memory RSS MB (median)", "replica_rss_mb", "bare_actor_rss_mb", "{:.1f}"),
            ("idle CPU % of a core (mean)", "replica_idle_cpu_pct", "bare_actor_idle_cpu_pct",
             "{:.2f}"),
            ("threads (median)", "replica_threads", "bare_actor_threads", "{:.0f}"),
            ("start s per actor", "create_s_per_partition", "bare_actor_start_s", "{:.3f}")]
    for label, a, b, fmt in rows:
        say(f"   {label:<32}{fmt.format(s[a]):>9}{fmt.format(s[b]):>13}")
    say(f"   {'first send ms p50 / max':<32}{s['first_send_ms_p50']:>9.1f}"
        f"{s['first_send_ms_max']:>13.1f} (max)")
    say(f"   {'second send ms p50':<32}{s['second_send_ms_p50']:>9.1f}")
    say(f"   {'produce over all partitions':<32}{s['produce_records_per_s']:>9,} records/s "
        f"({s['produce_MB_per_s']} MB/s)")
