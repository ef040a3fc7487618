"""The ETL example and `raykafka demo`: Ray producer tasks -> topic -> a consumer group of
member actors that enrich each record -> a second topic -> a Spark aggregation written to
Parquet, with progress bars and a summary table.

1. ``--tasks`` Ray tasks each produce their share of ``--records`` orders (JSON: id, user,
   amount in cents; key = the user) to ``pipeline-orders`` with acks=all;
2. ``cluster.consumer_group`` starts ``--members`` member actors of group
   ``pipeline-enrich``: each reads its partitions, adds a price tier and the order's source
   position to every order and writes it to ``pipeline-enriched`` (keyed by user), then
   commits what it processed. That is at least once: a member that dies between writing and
   committing makes the next owner write those orders again;
3. Spark (RayDP) reads ``pipeline-enriched`` with ``read_topic_df``, drops the repeats by
   order id (what makes the result exact), sums orders and amounts per tier and writes that
   to Parquet (``--output``, a directory of part files as Spark writes it; default a new
   temporary directory; the executors write it, so on several machines it must be a
   filesystem they share).

Spark's session starts on a thread as soon as Ray is up and runs step 3's code paths once
on one order (``warm_up``) while the cluster starts and steps 1-2 run; each step's line says how long it
took, its start-up (worker processes, the group's join, waiting for Spark) apart from its
work. What prints: raykafka's lines, progress bars and the table; Ray's, Ray Data's and
Spark's own logs only with ``--verbose`` (jobs/quiet.py).

The driver knows what it produced, so it reads the Parquet back, checks it against the
expected aggregate (every order counted once, per tier) and prints a table. Run it directly (an embedded
cluster, shut down at the end) or against a running cluster as a Ray job:

    python jobs/examples/etl.py [--records 100000] [--output DIR]
    ray job submit --working-dir . -- python jobs/examples/etl.py --namespace raykafka

The last line printed is one JSON object (``ok`` false when a check failed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

DEFAULT_NAMESPACE = "raykafka"
ORDERS = "pipeline-orders"
ENRICHED = "pipeline-enriched"
GROUP = "pipeline-enrich"
USERS = 500
#: The embedded cluster's settings (``Cluster.start``'s config) for this one-machine run:
#: the offsets topic of its one group as 1 partition on 1 broker (the default, 6 partitions
#: x 3 replicas, is 18 replica actors, each a Ray worker process to start while the group
#: waits: 6-11 s of the group's join on 2 cores), and no initial rebalance delay, as Kafka's
#: own config/server.properties sets for development (its 3 s default waits for members
#: that here all start at once).
EMBEDDED_CONFIG = {"offsets.topic.num.partitions": "1",
                   "offsets.topic.replication.factor": "1",
                   "group.initial.rebalance.delay.ms": "0"}
SPARK_START_TIMEOUT_S = 300.0
#: The JVM option of the demo's Spark session: HotSpot's quick compiler (C1) only. The job
#: reads a few thousand records, so its JVMs spend their start-up compiling, not running:
#: the session (driver, app master, executor) started in 23-25 s instead of 31-33 s on the
#: 2-core machine. ``spark_session``'s own default keeps C2 for long jobs.
SMALL_JOB_JAVA_OPTION = "-XX:TieredStopAtLevel=1"
#: Price tiers by amount in cents: [low, high) -> name.
TIERS = ((0, 1_000, "small"), (1_000, 10_000, "medium"), (10_000, 10**12, "large"))


def order(i: int) -> tuple[bytes, dict]:
    """Order ``i``: deterministic, so the driver knows the expected aggregate."""
    user = f"user-{i % USERS:04d}"
    amount = (i * 7919) % 25_000          # 0.00 .. 249.99
    return user.encode(), {"id": i, "user": user, "amount_cents": amount}


def tier(amount_cents: int) -> str:
    for low, high, name in TIERS:
        if low <= amount_cents < high:
            return name
    raise ValueError(f"amount {amount_cents} has no tier")


def expected(records: int) -> dict[str, tuple[int, int]]:
    """{tier: (orders, amount in cents)} of orders 0 .. records-1."""
    out: dict[str, list[int]] = {}
    for i in range(records):
        amount = order(i)[1]["amount_cents"]
        acc = out.setdefault(tier(amount), [0, 0])
        acc[0] += 1
        acc[1] += amount
    return {t: (n, a) for t, (n, a) in out.items()}


def produce_share(namespace: str, start: int, stop: int) -> tuple[int, float]:
    """A Ray task's body: produce orders start .. stop-1; returns how many were acked and
    when (``time.time()``) its producer was ready to send (the task's start-up behind it)."""
    from actors import Cluster
    cluster = Cluster.connect(namespace)
    with cluster.producer(acks="all", linger_ms=5) as producer:
        ready_at = time.time()
        for lo in range(start, stop, 5_000):
            hi = min(lo + 5_000, stop)
            keys, values = [], []
            for i in range(lo, hi):
                key, body = order(i)
                keys.append(key)
                values.append(json.dumps(body).encode())
            producer.send_batch(ORDERS, values, keys=keys).wait(timeout=120)
    return stop - start, ready_at


class Enricher:
    """The member actors' process_fn: tier and source position added, written to the
    enriched topic before the member commits (its producer is made in the member)."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self._producer = None

    def __getstate__(self):
        return {"namespace": self.namespace, "_producer": None}

    def __call__(self, records) -> None:
        if self._producer is None:
            from actors import Cluster
            self._producer = Cluster.connect(self.namespace).producer(acks="all",
                                                                      linger_ms=5)
        keys, values = [], []
        for r in records:
            body = json.loads(r.value)
            body["tier"] = tier(body["amount_cents"])
            body["source"] = [r.partition, r.offset]
            keys.append(r.key)
            values.append(json.dumps(body).encode())
        self._producer.send_batch(ENRICHED, values, keys=keys).wait(timeout=120)


def aggregate(spark, cluster, output: str, phases: dict | None = None
              ) -> dict[str, tuple[int, int]]:
    """Spark: the enriched topic, repeats dropped by order id, summed per tier, written to
    Parquet at ``output`` (replacing what is there); returns what the Parquet holds.
    ``phases`` gets ``read_s`` (``read_topic_df``: the offsets resolved) and ``spark_job_s``
    (Spark's job, which reads the topic in its executors, and the Parquet read back)."""
    import pyarrow.parquet as pq

    from jobs.spark import read_topic_df
    phases = {} if phases is None else phases
    t = time.perf_counter()
    topic = read_topic_df(spark, cluster, ENRICHED)
    phases["read_s"] = time.perf_counter() - t
    t = time.perf_counter()
    tier_totals(topic).coalesce(1).write.mode("overwrite").parquet(output)
    rows = pq.read_table(output).to_pylist()
    phases["spark_job_s"] = time.perf_counter() - t
    return {row["tier"]: (int(row["orders"]), int(row["amount"])) for row in rows}


def tier_totals(topic):
    """The aggregation of a DataFrame of enriched orders (``read_topic_df``'s columns):
    repeats dropped by order id, then orders and amount per tier."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    schema = T.StructType([T.StructField("id", T.LongType()),
                           T.StructField("amount_cents", T.LongType()),
                           T.StructField("tier", T.StringType())])
    orders = (topic.select(F.from_json(F.col("value").cast("string"), schema).alias("o"))
              .select("o.*")
              .dropDuplicates(["id"]))
    return orders.groupBy("tier").agg(F.count("*").alias("orders"),
                                      F.sum("amount_cents").alias("amount"))


def warm_up(spark) -> None:
    """Step 4's Spark work once, on one order: the executor's first job of this shape
    (class loading, code generation) and its Python worker (already attached to Ray by
    ``spark_session``) running an Arrow map. Start-up work: the demo does it on the
    thread that starts Spark, while the cluster starts and steps 2-3 run."""
    import datetime

    import pyarrow as pa

    from jobs.spark import ARROW_SCHEMA, SPARK_SCHEMA
    key, body = order(0)
    row = {"key": key, "value": json.dumps({**body, "tier": tier(body["amount_cents"])}).encode(),
           "topic": ENRICHED, "partition": 0, "offset": 0,
           "timestamp": datetime.datetime.now(datetime.timezone.utc), "timestampType": 0,
           "headers": None}
    batch = pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
    df = spark.range(0, 1, 1, numPartitions=1).mapInArrow(_Rows(batch), SPARK_SCHEMA)
    tier_totals(df).write.format("noop").mode("overwrite").save()


class _Rows:
    """A mapInArrow function that yields ``batch`` (what ``read_topic_df``'s reader yields)."""

    def __init__(self, batch):
        self.batch = batch

    def __call__(self, batches):
        for _ in batches:
            yield self.batch


def _fresh_topics(cluster, partitions: int, say) -> None:
    admin = cluster.admin()
    for name in (ORDERS, ENRICHED):
        if name in admin.list_topics():
            say(f"      deleting the {name!r} an earlier run left")
            admin.delete_topic(name)
    deadline = time.monotonic() + 60
    while set(admin.list_topics()) & {ORDERS, ENRICHED}:
        if time.monotonic() > deadline:
            from actors.errors import KafkaTimeoutError
            raise KafkaTimeoutError("the earlier run's topics were not deleted within 60 s")
        time.sleep(0.1)
    for name in (ORDERS, ENRICHED):
        admin.create_topic(name, partitions=partitions, replication_factor=1)
    if GROUP in {g for g in admin.list_groups()}:
        try:
            admin.delete_group_offsets(GROUP)
        except Exception:  # noqa: BLE001 - a group that still has members keeps its offsets
            pass


def run(*, records: int = 100_000, tasks: int = 4, members: int = 3, partitions: int = 6,
        namespace: str | None = None, brokers: int = 3, data_dir: str | None = None,
        output: str | None = None, quiet: bool = False) -> dict:
    """The pipeline; returns the summary (see the module docstring). ``namespace`` None
    starts an embedded cluster (in ``data_dir``, default a temporary dir, with
    ``EMBEDDED_CONFIG``) and shuts it down at the end; a namespace attaches to that running
    cluster. ``output`` is the Parquet directory of the aggregate (default a new temporary
    directory). Spark's session starts on a thread as soon as Ray is up."""
    import tempfile

    from actors import Cluster
    from jobs.quiet import quiet_ray_data
    from jobs.spark import active_session, stop_spark

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    output = os.path.abspath(output or os.path.join(
        tempfile.mkdtemp(prefix="raykafka-etl-"), "tiers.parquet"))
    phases: dict[str, float] = {}
    started = time.perf_counter()
    embedded = namespace is None
    spark = active_session()
    spark_start = _SparkStart() if spark is None else None     # as soon as Ray is up
    cluster = None
    try:
        cluster = (Cluster.start(num_brokers=brokers, data_dir=data_dir,
                                 namespace="raykafka-demo", config=EMBEDDED_CONFIG)
                   if embedded else Cluster.connect(namespace))
        quiet_ray_data()
        phases["start_s"] = time.perf_counter() - started
        say(f"[1/4] cluster {cluster.namespace!r} ready in {phases['start_s']:.1f}s "
            f"(brokers {cluster.broker_ids()}; start-up: Ray, ZooKeeper, the brokers' "
            f"actors)" + ("; Spark's session is starting since Ray came up"
                          if spark_start else ""))
        _fresh_topics(cluster, partitions, say)
        tasks = _produce(cluster, records, tasks, phases, say, quiet)
        _enrich(cluster, records, members, phases, say, quiet)

        t = time.perf_counter()
        if spark is None:
            spark = spark_start.result()
        phases["spark_wait_s"] = time.perf_counter() - t
        phases["spark_start_s"] = spark_start.seconds if spark_start else 0.0
        t = time.perf_counter()
        got = aggregate(spark, cluster, output, phases)
        phases["aggregate_s"] = time.perf_counter() - t
        say(f"[4/4] Spark aggregated {ENRICHED!r} into {output} in "
            f"{phases['aggregate_s']:.1f}s: offsets resolved {phases['read_s']:.1f}s, "
            f"Spark's job (reading the topic) {phases['spark_job_s']:.1f}s"
            + (f"; its session had started and warmed up in {phases['spark_start_s']:.1f}s "
               f"since Ray came up, {phases['spark_wait_s']:.1f}s of it waited for here"
               if spark_start else ""))
    finally:
        if spark_start is not None:
            spark_start.cancel()
            spark_start.join()
            stop_spark()
        if embedded and cluster is not None:
            cluster.shutdown()
    phases["total_s"] = time.perf_counter() - started

    want = expected(records)
    problems = [f"tier {name}: got {got.get(name)}, expected {want.get(name)}"
                for name in sorted(set(want) | set(got)) if got.get(name) != want.get(name)]
    summary = {"ok": not problems, "records": records, "tasks": tasks,
               "members": members, "partitions": partitions, "parquet": output,
               "tiers": {name: {"orders": n, "amount_cents": a}
                         for name, (n, a) in sorted(got.items())},
               **{k: round(v, 2) for k, v in phases.items()}, "problems": problems}
    if not quiet:
        print()
        print(f"  {'tier':<8} {'orders':>10} {'amount':>16}   check")
        for name in sorted(set(want) | set(got)):
            n, a = got.get(name, (0, 0))
            mark = "ok" if got.get(name) == want.get(name) else f"expected {want.get(name)}"
            print(f"  {name:<8} {n:>10,} {a / 100:>16,.2f}   {mark}")
        print(f"  every order counted once: {'yes' if not problems else 'NO'}")
        print(f"  {phases['total_s']:.1f}s in all, shutdown included")
    print(json.dumps(summary), flush=True)
    return summary


def _produce(cluster, records: int, tasks: int, phases: dict, say, quiet: bool) -> int:
    """Step 2: up to ``tasks`` Ray tasks produce the orders; returns how many ran."""
    import ray
    from tqdm import tqdm

    t = time.perf_counter()
    submitted_at = time.time()
    share = -(-records // tasks)
    task = ray.remote(num_cpus=0)(produce_share)
    refs = [task.remote(cluster.namespace, lo, min(lo + share, records))
            for lo in range(0, records, share)]
    bar = tqdm(total=records, desc="produce (Ray tasks)", unit="rec", unit_scale=True,
               disable=True if quiet else None, file=sys.stdout, leave=False)
    pending, ready = list(refs), []
    while pending:
        done, pending = ray.wait(pending, timeout=600)
        if not done:
            from actors.errors import KafkaTimeoutError
            raise KafkaTimeoutError("producer tasks made no progress in 600 s")
        for n, ready_at in ray.get(done):
            bar.update(n)
            ready.append(ready_at)
    bar.close()
    phases["produce_s"] = time.perf_counter() - t
    phases["produce_startup_s"] = max(0.0, min(ready) - submitted_at)
    say(f"[2/4] {len(refs)} Ray tasks produced {records:,} orders to {ORDERS!r} in "
        f"{phases['produce_s']:.1f}s: {phases['produce_startup_s']:.1f}s until the first "
        f"task could send (a worker process, attaching to the cluster), then "
        f"{phases['produce_s'] - phases['produce_startup_s']:.1f}s of producing")
    return len(refs)


def _enrich(cluster, records: int, members: int, phases: dict, say, quiet: bool) -> None:
    """Step 3: the consumer group's member actors enrich every order; done when the group
    has committed every partition's end (what it processed: repeats of at-least-once
    delivery after a rebalance count once)."""
    from tqdm import tqdm

    from actors.errors import KafkaTimeoutError
    t = time.perf_counter()
    started_at = time.time()
    group = cluster.consumer_group(GROUP, [ORDERS], members, Enricher(cluster.namespace),
                                   auto_offset_reset="earliest", max_poll_records=2_000)
    try:
        bar = tqdm(total=records, desc="enrich (group actors)", unit="rec",
                   unit_scale=True, disable=True if quiet else None, file=sys.stdout,
                   leave=False)
        done, first_at = 0, None
        deadline = time.monotonic() + 600
        while done < records:
            time.sleep(0.1)
            stats = group.stats()
            failed = [m for m in stats["members"].values() if m["state"] == "failed"]
            if failed:
                raise RuntimeError(f"an enriching member failed: {failed[0]['error']}")
            committed: dict = {}
            for m in stats["members"].values():
                for tp, offset in (m.get("committed") or {}).items():
                    committed[tp] = max(committed.get(tp, 0), offset)
                if m.get("first_poll_at"):
                    first_at = min(first_at or m["first_poll_at"], m["first_poll_at"])
            bar.update(min(sum(committed.values()), records) - done)
            done = min(sum(committed.values()), records)
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"enrichment stalled at {done:,} of {records:,}")
        bar.close()
        final = group.stop()
    except BaseException:
        group.stop()
        raise
    phases["enrich_s"] = time.perf_counter() - t
    phases["enrich_startup_s"] = max(0.0, (first_at or time.time()) - started_at)
    say(f"[3/4] {members} member actors of group {GROUP!r} enriched {records:,} orders into "
        f"{ENRICHED!r} in {phases['enrich_s']:.1f}s: {phases['enrich_startup_s']:.1f}s for "
        f"the members to start and join the group, then "
        f"{phases['enrich_s'] - phases['enrich_startup_s']:.1f}s of enriching"
        + (f" ({final['processed'] - records:,} processed again after a rebalance: "
           f"step 4 drops the repeats)" if final["processed"] > records else ""))


class _SparkStart:
    """``jobs.spark.spark_session`` and ``warm_up`` on a thread, from the moment Ray is up
    (``Cluster.start`` brings Ray up first, then ZooKeeper and the brokers): its JVMs (the
    driver here, RayDP's app master and executor as Ray actors) take 20-40 s to start
    beside the cluster on 2 cores, and the first use of each part of step 4 several
    seconds more; all of it while steps 1-3 run."""

    def __init__(self):
        self.session = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._start, name="spark-session-start",
                                        daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Give up if Ray is not up yet (the cluster did not start)."""
        self._cancelled.set()

    def _start(self) -> None:
        import ray

        from jobs.spark import JAVA_OPTION_KEYS, spark_session
        deadline = time.monotonic() + SPARK_START_TIMEOUT_S
        while not ray.is_initialized():
            if self._cancelled.wait(0.05) or time.monotonic() > deadline:
                return
        t = time.perf_counter()
        try:
            session = spark_session(app_name="raykafka-pipeline", configs={
                key: SMALL_JOB_JAVA_OPTION for key in JAVA_OPTION_KEYS})
            warm_up(session)
            self.session = session
        except BaseException as exc:  # noqa: BLE001 - raised by result() in the caller
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t

    def join(self, timeout_s: float = SPARK_START_TIMEOUT_S) -> None:
        self._thread.join(timeout_s)

    def result(self, timeout_s: float = SPARK_START_TIMEOUT_S):
        self.join(timeout_s)
        if self._thread.is_alive():
            from actors.errors import KafkaTimeoutError
            raise KafkaTimeoutError(f"Spark's session did not start within {timeout_s:.0f}s")
        if self.error is not None:
            raise self.error
        if self.session is None:
            from actors.errors import KafkaTimeoutError
            raise KafkaTimeoutError("Spark's session was not started: Ray never came up")
        return self.session


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--tasks", type=int, default=4, help="Ray producer tasks")
    p.add_argument("--members", type=int, default=3, help="consumer-group member actors")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--brokers", type=int, default=3, help="brokers of the embedded cluster")
    p.add_argument("--data-dir", default=None,
                   help="the embedded cluster's data (default: a temporary directory)")
    p.add_argument("--output", default=None,
                   help="the Parquet directory of the aggregate (default: a new temporary "
                        "directory)")
    p.add_argument("--namespace", default=None,
                   help="attach to this raykafka cluster (default: "
                        f"{DEFAULT_NAMESPACE!r} under `ray job submit`, else an embedded one)")
    p.add_argument("--verbose", action="store_true",
                   help="also show what Ray and Spark log of their own (RAYKAFKA_VERBOSE=1)")
    args = p.parse_args(argv)
    for name in ("records", "tasks", "members", "partitions", "brokers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.verbose:
        from jobs.quiet import VERBOSE_ENV
        os.environ[VERBOSE_ENV] = "1"
    namespace = args.namespace or (DEFAULT_NAMESPACE if os.environ.get("RAY_ADDRESS")
                                   else None)
    try:
        summary = run(records=args.records, tasks=args.tasks, members=args.members,
                      partitions=args.partitions, namespace=namespace, brokers=args.brokers,
                      data_dir=args.data_dir, output=args.output)
    except KeyboardInterrupt:
        print("etl: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - one line, as raykafka's CLI (which runs this)
        from jobs.quiet import verbose
        if verbose() or os.environ.get("RAYKAFKA_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"etl: {type(exc).__name__}: {first} (RAYKAFKA_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(1)
    if not summary["ok"]:
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
