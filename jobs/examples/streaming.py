"""Micro-batch streaming: Spark (RayDP) turns a topic of page views into per-user counts, one
Parquet directory per batch, exactly once even when the job is killed and started again.

Each batch (``jobs.streaming.MicroBatchStream``) reads the views from where the last one
ended up to the topic's high watermark (at most ``--max-offsets-per-trigger`` records),
counts views and bytes per user with Spark and writes them to ``<output>/batch=<N>``
(``ParquetSink``: a temporary directory renamed into place; a batch already there is
skipped). The checkpoint directory records each batch's offsets before it runs and its
commit after its result is written: a job killed anywhere and run again with the same
``--checkpoint`` re-runs the batch it was in with exactly the same offsets, so the sink
holds every view exactly once. The summary reads the whole sink back and checks its total
against the records of the topic that the committed batches cover.

Run it directly, on the embedded default (a private Ray, an embedded ZooKeeper, 3 brokers,
sample views produced first; everything is shut down at the end):

    python jobs/examples/streaming.py

or against a running cluster (``raykafka start``, or brokers started inside ``ray up``),
as a Ray job; it attaches to the cluster of ``--namespace`` (default "raykafka"), creates
the topic when it is missing (and then fills it with sample views) and leaves the cluster
running; run it again to process what was produced since:

    ray job submit --working-dir . -- python jobs/examples/streaming.py
    ray job submit --working-dir . -- python jobs/examples/streaming.py --follow --timeout 600

By default it stops once everything that was in the topic when it started is processed
(Spark's Trigger.AvailableNow); ``--follow`` keeps polling every ``--trigger-interval``
seconds until ``--timeout`` or ``--max-batches``. ``--checkpoint`` and ``--output``
default to ``<tmp>/raykafka-streaming/<namespace>/<topic>/`` (a fixed place, so a
re-submitted job goes on where the last one stopped; under ``ray job submit`` the working
directory is a new copy each time). Spark's executors write ``--output``: on several
machines it must be a file system they share with the driver.

The last line printed is one JSON object: the batches run, the re-runs, the records
processed, and the sink's totals, checked against the running total of the committed
batches (``ok`` false when they differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

DEFAULT_NAMESPACE = "raykafka"
DEFAULT_TOPIC = "page-views"
USERS = 50
PAGES = ("/", "/search", "/cart", "/checkout", "/help")


def view(i: int) -> tuple[bytes, bytes]:
    """Page view ``i`` (key = the user): deterministic, so a run can be checked."""
    user = f"user-{i % USERS:03d}"
    page = PAGES[(i * 7) % len(PAGES)]
    return user.encode(), json.dumps({"user": user, "page": page, "n": i}).encode()


def per_user(df):
    """The transformation each batch runs: views and value bytes per user."""
    from pyspark.sql import functions as F
    return (df.where(F.col("key").isNotNull())
            .groupBy(F.col("key").cast("string").alias("user"))
            .agg(F.count(F.lit(1)).alias("views"),
                 F.sum(F.length("value")).alias("bytes")))


def produce_views(cluster, topic: str, first: int, count: int) -> None:
    with cluster.producer(acks="all") as producer:
        for lo in range(first, first + count, 10_000):
            batch = [view(i) for i in range(lo, min(lo + 10_000, first + count))]
            producer.send_batch(topic, [v for _, v in batch],
                                keys=[k for k, _ in batch]).wait(timeout=120)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespace", default=None,
                   help="attach to the raykafka cluster of this namespace (default: "
                        f"{DEFAULT_NAMESPACE!r} when RAY_ADDRESS is set, as under `ray job "
                        "submit`; otherwise an embedded cluster is started)")
    p.add_argument("--embedded", action="store_true",
                   help="start an embedded cluster even when RAY_ADDRESS is set")
    p.add_argument("--brokers", type=int, default=3, help="brokers of an embedded cluster")
    p.add_argument("--topic", default=DEFAULT_TOPIC, help="topic of page views")
    p.add_argument("--partitions", type=int, default=3,
                   help="partitions of the topic when this job creates it")
    p.add_argument("--records", type=int, default=20_000,
                   help="sample views produced when this job creates the topic")
    p.add_argument("--produce", type=int, default=0,
                   help="views produced while the stream runs (in the background, "
                        "1,000 every --trigger-interval), to watch it follow")
    p.add_argument("--checkpoint", default=None, help="checkpoint directory")
    p.add_argument("--output", default=None, help="Parquet sink directory")
    p.add_argument("--max-offsets-per-trigger", type=int, default=5_000,
                   help="records per batch at most (0: no cap)")
    p.add_argument("--follow", action="store_true",
                   help="keep polling for new views (until --timeout / --max-batches)")
    p.add_argument("--trigger-interval", type=float, default=1.0,
                   help="seconds between batches with --follow")
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--pause-before-commit", type=float, default=0.0,
                   help="seconds each batch waits after its result is written and before "
                        "it is committed: a window to kill the job in, to see the restart "
                        "run that batch again with the same offsets")
    args = p.parse_args(argv)
    if args.embedded and args.namespace:
        p.error("--embedded and --namespace exclude each other")
    for name in ("brokers", "partitions"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    for name in ("records", "produce", "max_offsets_per_trigger"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.max_batches is not None and args.max_batches < 1:
        p.error("--max-batches must be >= 1")
    if args.timeout is not None and args.timeout <= 0:
        p.error("--timeout must be > 0")
    if args.trigger_interval < 0 or args.pause_before_commit < 0:
        p.error("--trigger-interval and --pause-before-commit must be >= 0")
    return args


def sink_totals(spark, output: str) -> dict:
    """What the sink holds: batches, rows, views and users."""
    from pyspark.sql import functions as F
    from jobs.streaming import ParquetSink
    batches = ParquetSink(output).batches()
    if not batches:
        return {"batches": 0, "views": 0, "users": 0}
    df = spark.read.parquet(output)
    row = df.agg(F.sum("views").alias("views"), F.countDistinct("user").alias("users"),
                 F.countDistinct("batch").alias("batches")).collect()[0]
    return {"batches": int(row["batches"]), "views": int(row["views"] or 0),
            "users": int(row["users"])}


def main(argv=None) -> dict:
    """Run the job (see the module docstring); returns the summary it prints."""
    args = parse_args(argv)
    from actors import Cluster
    from actors.errors import TopicAlreadyExistsError
    from jobs.quiet import quiet_ray_data
    from jobs.spark import active_session, spark_session, stop_spark
    from jobs.streaming import MicroBatchStream, ParquetSink

    started = time.monotonic()
    embedded = args.embedded or (args.namespace is None and not os.environ.get("RAY_ADDRESS"))
    if embedded:
        cluster = Cluster.start(num_brokers=args.brokers,
                                namespace=f"streaming-{os.getpid()}")
    else:
        cluster = Cluster.connect(args.namespace or DEFAULT_NAMESPACE)
    quiet_ray_data()                    # Ray Data's own logs only with RAYKAFKA_VERBOSE=1
    base = os.path.join(tempfile.gettempdir(), "raykafka-streaming", cluster.namespace,
                        args.topic)
    checkpoint = args.checkpoint or os.path.join(base, "checkpoint")
    output = args.output or os.path.join(base, "output")
    spark = None
    own_spark = False
    producer_thread = None
    stop_producing = threading.Event()
    stream = None
    try:
        try:
            cluster.admin().create_topic(args.topic, partitions=args.partitions,
                                         replication_factor=min(3, len(cluster.broker_ids()) or 1))
            produce_views(cluster, args.topic, 0, args.records)
        except TopicAlreadyExistsError:
            pass
        spark = active_session()
        if spark is None:
            spark = spark_session(app_name="streaming")
            own_spark = True
        stream = MicroBatchStream(cluster, args.topic, checkpoint, spark=spark,
                                  max_offsets_per_trigger=args.max_offsets_per_trigger or None)
        sink = ParquetSink(output, transform=per_user)

        def write_then_pause(df, batch_id):
            rows = sink(df, batch_id)
            if args.pause_before_commit:
                print(f"batch {batch_id}: written to {sink.batch_dir(batch_id)}, pausing "
                      f"{args.pause_before_commit:g}s before the commit", flush=True)
                time.sleep(args.pause_before_commit)
            return rows

        def report(info):
            print(f"batch {info.batch_id}{' (re-run)' if info.rerun else ''}: "
                  f"{info.num_records} views in {info.latency_s:.1f}s "
                  f"({info.records_per_s:,.0f} views/s)", flush=True)

        if args.produce:
            producer_thread = threading.Thread(
                target=_produce_live, args=(cluster, args.topic, args.produce,
                                            args.trigger_interval, stop_producing),
                daemon=True)
            producer_thread.start()
        done = stream.run(write_then_pause, available_now=not args.follow,
                          trigger_interval_s=args.trigger_interval if args.follow else 0.0,
                          max_batches=args.max_batches, timeout_s=args.timeout,
                          on_batch=report)
        totals = sink_totals(spark, output)
        committed = stream.checkpoint.total_records()
    finally:
        if producer_thread is not None:
            stop_producing.set()
            producer_thread.join(timeout=60)
        if stream is not None:
            stream.close()
        if own_spark:
            stop_spark()
        if embedded:
            cluster.shutdown()
    records = sum(info.num_records for info in done)
    ok = totals["views"] == committed
    print(f"{len(done)} batch(es) this run ({sum(i.rerun for i in done)} re-run), "
          f"{records} views; the sink holds {totals['batches']} batch(es), "
          f"{totals['views']} views of {totals['users']} users; the committed batches "
          f"cover {committed} records: {'ok' if ok else 'MISMATCH'}", flush=True)
    summary = {"namespace": cluster.namespace, "topic": args.topic, "checkpoint": checkpoint,
               "output": output, "batches": [i.batch_id for i in done],
               "reruns": sum(i.rerun for i in done), "records": records,
               "sink": totals, "committed_records": committed, "ok": ok,
               "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary), flush=True)
    return summary


def _produce_live(cluster, topic: str, count: int, interval_s: float, stop) -> None:
    first = 10**9                       # views numbered apart from the sample ones
    sent = 0
    while sent < count and not stop.is_set():
        n = min(1_000, count - sent)
        produce_views(cluster, topic, first + sent, n)
        sent += n
        stop.wait(max(interval_s, 0.1))


if __name__ == "__main__":
    main()
