"""Word count: Spark (RayDP) reads a topic of text lines, counts the words, and writes one
record per word to another topic (key = the word, value = its count as text, on a compacted
topic: the newest count of a word is what stays).

Run it directly, on the embedded default (a private Ray, an embedded ZooKeeper, 3 brokers,
the sample text below as input; everything is shut down at the end):

    python jobs/examples/word_count.py

or against a running cluster (``raykafka start``, or brokers started inside ``ray up``),
as a Ray job; it attaches to the cluster of ``--namespace`` (default "raykafka"), creates
the topics when they are missing (an input topic it creates gets the sample text) and
leaves the cluster running:

    ray job submit --working-dir . -- python jobs/examples/word_count.py
    ray job submit --working-dir . -- python jobs/examples/word_count.py --input my-lines

(``ray job submit`` is told the job server with ``--address``, or RAY_ADDRESS; with token
auth on, as ``raykafka status`` prints, ``RAY_AUTH_MODE=token ray job submit ...``). A job
under ``ray job submit`` finds Ray through RAY_ADDRESS, which Ray sets for it; run directly
with ``--namespace NS`` it attaches to the cluster ``raykafka start --namespace NS`` left
running instead of starting one.

The last line printed is one JSON object: the namespace, the topics, the distinct words,
the total of the counts and the records written per partition.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):
    # run as a script (python jobs/examples/word_count.py, also under ray job submit, where
    # the working directory is a copy of the repository): make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

DEFAULT_NAMESPACE = "raykafka"
DEFAULT_INPUT = "lines"
DEFAULT_OUTPUT = "word-counts"
#: Words are runs of letters and digits (Java regex, as Spark's split takes it).
WORD_SPLIT = r"[^\p{L}\p{N}]+"

SAMPLE_LINES = [
    "A log is perhaps the simplest possible storage abstraction.",
    "It is an append-only, totally ordered sequence of records ordered by time.",
    "Records are appended to the end of the log, and reads proceed left to right.",
    "Each entry is assigned a unique sequential log entry number.",
    "The ordering of records defines a notion of time,",
    "since entries to the left are defined to be older than entries to the right.",
    "The log entry number can be thought of as the timestamp of the entry.",
    "A log is not all that different from a file or a table.",
    "A file is an array of bytes, a table is an array of records,",
    "and a log is really just a kind of table or file where the records are sorted by time.",
    "Partitioning the log lets each partition be written and read in parallel;",
    "replicating each partition keeps the log when a machine is lost.",
]


def count_words(spark, cluster, source: str, sink: str) -> tuple[dict[str, int], dict]:
    """Count the words of every record of ``source`` (values as UTF-8 text, lower-cased,
    split on what is not a letter or a digit) with Spark and write ``(word, count)``
    records to ``sink``. Returns ``({word: count}, {partition: records written})``."""
    from pyspark.sql import functions as F

    from jobs.spark import read_topic_df, write_topic_df

    lines = read_topic_df(spark, cluster, source)
    words = (lines
             .select(F.explode(F.split(F.lower(F.col("value").cast("string")), WORD_SPLIT))
                     .alias("word"))
             .where(F.col("word") != ""))
    counts = (words.groupBy("word").count()
              .select(F.col("word").alias("key"),
                      F.col("count").cast("string").alias("value"))
              .cache())
    try:
        result = {row["key"]: int(row["value"]) for row in counts.collect()}
        written = write_topic_df(counts, cluster, sink)
    finally:
        counts.unpersist()
    return result, written


def _ensure_topic(cluster, name: str, partitions: int, config: dict | None = None) -> bool:
    """Create ``name`` unless it exists; True when it was created here."""
    from actors.errors import TopicAlreadyExistsError
    try:
        cluster.admin().create_topic(name, partitions=partitions, config=config)
        return True
    except TopicAlreadyExistsError:
        return False


def _produce_sample(cluster, topic: str) -> None:
    with cluster.producer() as producer:
        producer.send_batch(topic, [line.encode() for line in SAMPLE_LINES]).wait(timeout=60)


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
    p.add_argument("--input", default=DEFAULT_INPUT, help="topic of text lines")
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="topic the counts go to")
    p.add_argument("--partitions", type=int, default=3,
                   help="partitions of the topics this job creates")
    p.add_argument("--sample", action="store_true",
                   help="produce the sample text to the input topic first, even if it exists")
    args = p.parse_args(argv)
    if args.embedded and args.namespace:
        p.error("--embedded and --namespace exclude each other")
    return args


def main(argv=None) -> dict:
    """Run the job (see the module docstring); returns the summary it prints."""
    args = parse_args(argv)
    from actors import Cluster
    from jobs.quiet import quiet_ray_data
    from jobs.spark import active_session, spark_session, stop_spark

    started = time.monotonic()
    embedded = args.embedded or (args.namespace is None and not os.environ.get("RAY_ADDRESS"))
    if embedded:
        cluster = Cluster.start(num_brokers=args.brokers,
                                namespace=f"word-count-{os.getpid()}")
    else:
        cluster = Cluster.connect(args.namespace or DEFAULT_NAMESPACE)
    quiet_ray_data()                    # Ray Data's own logs only with RAYKAFKA_VERBOSE=1
    spark = None
    own_spark = False
    try:
        created = _ensure_topic(cluster, args.input, args.partitions)
        _ensure_topic(cluster, args.output, args.partitions, {"cleanup.policy": "compact"})
        if created or args.sample:
            _produce_sample(cluster, args.input)
        spark = active_session()            # one Spark session per process: reuse it
        if spark is None:
            spark = spark_session(app_name="word-count")
            own_spark = True
        counts, written = count_words(spark, cluster, args.input, args.output)
    finally:
        if own_spark:
            stop_spark()
        if embedded:
            cluster.shutdown()
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    print(f"{args.input!r}: {len(counts)} distinct words, {sum(counts.values())} in all; "
          f"top: "
          + ", ".join(f"{w} {n}" for w, n in top), flush=True)
    summary = {"namespace": cluster.namespace, "input": args.input, "output": args.output,
               "words": len(counts), "total": sum(counts.values()),
               "written": {str(p): n for p, n in written.items()},
               "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary), flush=True)
    summary["counts"] = counts
    return summary


if __name__ == "__main__":
    main()
