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
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

DEFAULT_NAMESPACE = "raykafka"
ORDERS = "pipeline-orders"
ENRICHED = "pipeline-enriched"
GROUP = "pipeline-enrich"
USERS = 500
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


def produce_share(namespace: str, start: int, stop: int) -> int:
    """A Ray task's body: produce orders start .. stop-1; returns how many were acked."""
    from actors import Cluster
    cluster = Cluster.connect(namespace)
    with cluster.producer(acks="all", linger_ms=5) as producer:
        for lo in range(start, stop, 5_000):
            hi = min(lo + 5_000, stop)
            keys, values = [], []
            for i in range(lo, hi):
                key, body = order(i)
                keys.append(key)
                values.append(json.dumps(body).encode())
            producer.send_batch(ORDERS, values, keys=keys).wait(timeout=120)
    return stop - start


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


def aggregate(spark, cluster, output: str) -> dict[str, tuple[int, int]]:
    """Spark: the enriched topic, repeats dropped by order id, summed per tier, written to
    Parquet at ``output`` (replacing what is there); returns what the Parquet holds."""
    import pyarrow.parquet as pq

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from jobs.spark import read_topic_df
    schema = T.StructType([T.StructField("id", T.LongType()),
                           T.StructField("amount_cents", T.LongType()),
                           T.StructField("tier", T.StringType())])
    orders = (read_topic_df(spark, cluster, ENRICHED)
              .select(F.from_json(F.col("value").cast("string"), schema).alias("o"))
              .select("o.*")
              .dropDuplicates(["id"]))
    (orders.groupBy("tier")
     .agg(F.count("*").alias("orders"), F.sum("amount_cents").alias("amount"))
     .coalesce(1)
     .write.mode("overwrite").parquet(output))
    rows = pq.read_table(output).to_pylist()
    return {row["tier"]: (int(row["orders"]), int(row["amount"])) for row in rows}


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
    starts an embedded cluster (in ``data_dir``, default a temporary dir) and shuts it
    down at the end; a namespace attaches to that running cluster. ``output`` is the
    Parquet directory of the aggregate (default a new temporary directory)."""
    import tempfile

    import ray
    from tqdm import tqdm

    from actors import Cluster
    from jobs.spark import active_session, spark_session, stop_spark

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    output = os.path.abspath(output or os.path.join(
        tempfile.mkdtemp(prefix="raykafka-etl-"), "tiers.parquet"))
    phases: dict[str, float] = {}
    t = time.perf_counter()
    embedded = namespace is None
    cluster = (Cluster.start(num_brokers=brokers, data_dir=data_dir, namespace="raykafka-demo")
               if embedded else Cluster.connect(namespace))
    phases["start_s"] = time.perf_counter() - t
    say(f"[1/4] cluster {cluster.namespace!r} ready in {phases['start_s']:.1f}s "
        f"(brokers {cluster.broker_ids()})")
    spark, own_spark, group = None, False, None
    try:
        _fresh_topics(cluster, partitions, say)

        t = time.perf_counter()
        share = -(-records // tasks)
        task = ray.remote(num_cpus=0)(produce_share)
        refs = [task.remote(cluster.namespace, lo, min(lo + share, records))
                for lo in range(0, records, share)]
        bar = tqdm(total=records, desc="produce (Ray tasks)", unit="rec", unit_scale=True,
                   disable=quiet, file=sys.stdout, leave=False)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, timeout=600)
            if not done:
                from actors.errors import KafkaTimeoutError
                raise KafkaTimeoutError("producer tasks made no progress in 600 s")
            bar.update(sum(ray.get(done)))
        bar.close()
        phases["produce_s"] = time.perf_counter() - t
        say(f"[2/4] {len(refs)} Ray tasks produced {records:,} orders to {ORDERS!r} in "
            f"{phases['produce_s']:.1f}s ({records / phases['produce_s']:,.0f} records/s)")

        t = time.perf_counter()
        group = cluster.consumer_group(GROUP, [ORDERS], members, Enricher(cluster.namespace),
                                       auto_offset_reset="earliest", max_poll_records=2_000)
        bar = tqdm(total=records, desc="enrich (group actors)", unit="rec", unit_scale=True,
                   disable=quiet, file=sys.stdout, leave=False)
        processed = 0
        deadline = time.monotonic() + 600
        while processed < records:
            stats = group.stats()
            failed = [m for m in stats["members"].values() if m["state"] == "failed"]
            if failed:
                raise RuntimeError(f"an enriching member failed: {failed[0]['error']}")
            bar.update(min(stats["processed"], records) - processed)
            processed = min(stats["processed"], records)
            if time.monotonic() > deadline:
                from actors.errors import KafkaTimeoutError
                raise KafkaTimeoutError(f"enrichment stalled at {processed:,} of {records:,}")
            time.sleep(0.2)
        bar.close()
        final = group.stop()
        group = None
        phases["enrich_s"] = time.perf_counter() - t
        say(f"[3/4] {members} member actors of group {GROUP!r} enriched "
            f"{final['processed']:,} records into {ENRICHED!r} in {phases['enrich_s']:.1f}s")

        t = time.perf_counter()
        spark = active_session()
        if spark is None:
            spark = spark_session(app_name="raykafka-pipeline")
            own_spark = True
        phases["spark_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        got = aggregate(spark, cluster, output)
        phases["aggregate_s"] = time.perf_counter() - t
        say(f"[4/4] Spark aggregated {ENRICHED!r} into {output} in "
            f"{phases['aggregate_s']:.1f}s (session start {phases['spark_start_s']:.1f}s)")
    finally:
        if group is not None:
            group.stop()
        if own_spark:
            stop_spark()
        if embedded:
            cluster.shutdown()

    want = expected(records)
    problems = [f"tier {name}: got {got.get(name)}, expected {want.get(name)}"
                for name in sorted(set(want) | set(got)) if got.get(name) != want.get(name)]
    summary = {"ok": not problems, "records": records, "tasks": len(refs),
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
    print(json.dumps(summary), flush=True)
    return summary


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--tasks", type=int, default=4, help="Ray producer tasks")
    p.add_argument("--members", type=int, default=3, help="consumer-group member actors")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--output", default=None,
                   help="the Parquet directory of the aggregate (default: a new temporary "
                        "directory)")
    p.add_argument("--namespace", default=None,
                   help="attach to this raykafka cluster (default: "
                        f"{DEFAULT_NAMESPACE!r} under `ray job submit`, else an embedded one)")
    args = p.parse_args(argv)
    for name in ("records", "tasks", "members", "partitions"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    namespace = args.namespace or (DEFAULT_NAMESPACE if os.environ.get("RAY_ADDRESS")
                                   else None)
    summary = run(records=args.records, tasks=args.tasks, members=args.members,
                  partitions=args.partitions, namespace=namespace, output=args.output)
    if not summary["ok"]:
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
