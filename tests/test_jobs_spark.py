"""jobs.spark against the real thing (local Ray, embedded ZooKeeper, 2 brokers, RayDP 1.6.5 on
Java 17): the session's set-up, read_topic_df's schema, values and offsets, committed data
only, write_topic_df round trips, typed errors, and the word-count example run in-process and
under `ray job submit`. One cluster and one Spark session for the module (Spark is slow to
start)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from actors import Cluster, raycompat
from actors.errors import (ClusterNotFoundError, IllegalArgumentError, IllegalStateError,
                           InvalidConfigurationError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from cluster_helpers import ray, unique_namespace, wait_until
from jobs.data import read_topic, write_topic
from jobs.examples import word_count
from jobs.spark import (JAVA_OPTIONS, JVM_SOURCE_CLASS, READER_ENV, SPARK_SCHEMA,
                        _jvm_read_options, active_session, held_dfs, read_topic_df,
                        spark_session, write_topic_df)
from spark_helpers import APP_NAME, JOB_SUBMIT, OBJECT_STORE_BYTES, spark_ray  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = {"zookeeper.session.timeout.ms": 20000}
PARTS = 3
PER_PART = 40
BASE = (int(time.time()) - 3600) * 1000          # record i is stamped BASE + i seconds


def plain_record(p: int, i: int) -> dict:
    """What "plain" holds at (p, i), as read_topic_df gives it: null keys every 4th record,
    headers on even ones (the key "h" twice; null on odd ones, as Spark's Kafka source
    gives a record without headers), CreateTime (Spark's 0)."""
    return {"key": None if i % 4 == 0 else b"k%d-%d" % (p, i), "value": b"p%d-%d" % (p, i),
            "topic": "plain", "partition": p, "offset": i, "ts_ms": BASE + i * 1000,
            "timestampType": 0,
            "headers": [("h", b"a"), ("h", b"b"), ("n", b"%d" % i)] if i % 2 == 0 else None}


def sent_headers(p: int, i: int) -> list:
    """The headers "plain"'s record (p, i) was produced with ([] for none)."""
    return plain_record(p, i)["headers"] or []


@pytest.fixture(scope="module")
def started(spark_ray):  # noqa: F811
    """The cluster, started and its topics filled while the shared Spark session starts (it
    needs only Ray): (cluster, spark)."""
    c = None
    try:
        c = Cluster.start(num_brokers=2, namespace=unique_namespace("js"), config=CONFIG)
        admin = c.admin()
        admin.create_topic("plain", partitions=PARTS)
        admin.create_topic("empty", partitions=1)
        admin.create_topic("appended", partitions=1,
                           config={"message.timestamp.type": "LogAppendTime"})
        with c.producer() as producer:
            for p in range(PARTS):
                for lo, hi in ((0, 15), (15, PER_PART)):        # two batches per partition
                    recs = [plain_record(p, i) for i in range(lo, hi)]
                    producer.send_batch("plain", [r["value"] for r in recs],
                                        keys=[r["key"] for r in recs], partition=p,
                                        timestamps=[r["ts_ms"] for r in recs],
                                        headers=[sent_headers(p, i) for i in range(lo, hi)]
                                        ).wait(timeout=60)
            producer.send_batch("appended", [b"a", b"b"], timestamps=[5, 6]).wait(timeout=60)
        yield c, spark_ray.session()
    finally:
        if c is not None:
            c.shutdown()


@pytest.fixture(scope="module")
def cluster(started):
    return started[0]


@pytest.fixture(scope="module")
def spark(started):
    return started[1]


def rows(df) -> list[dict]:
    """The rows of a read_topic_df DataFrame as plain dicts (timestamp as ms since the epoch,
    headers as (key, value) tuples), sorted by (topic, partition, offset)."""
    out = []
    for r in df.withColumn("ts_ms", F.unix_millis("timestamp")).drop("timestamp").collect():
        d = r.asDict(recursive=True)
        d["key"] = None if d["key"] is None else bytes(d["key"])
        d["value"] = None if d["value"] is None else bytes(d["value"])
        if d["headers"] is not None:
            d["headers"] = [(h["key"], None if h["value"] is None else bytes(h["value"]))
                            for h in d["headers"]]
        out.append(d)
    return sorted(out, key=lambda d: (d["topic"], d["partition"], d["offset"]))


def offsets(df) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    for r in df.select("partition", "offset").collect():
        got.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(v) for p, v in sorted(got.items())}


# -- the session -------------------------------------------------------------------------------

def test_the_session_has_the_java_17_options_this_python_and_a_loopback_driver(spark):
    """spark_session passes the --add-opens option string to the driver, the executors and
    RayDP's app master, runs Python workers with this interpreter, binds the driver to
    127.0.0.1 (the loopback Ray's node address), and its executor runs jobs; asked again with
    the same arguments it returns the same session."""
    conf = spark.sparkContext.getConf()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
                "spark.ray.raydp_app_master.extraJavaOptions"):
        value = conf.get(key)
        assert JAVA_OPTIONS in value, (key, value)
        assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in JAVA_OPTIONS
    assert conf.get("spark.pyspark.python") == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"] == 499500
    # a Python worker (a UDF, an RDD lambda) runs this interpreter, not the system python3
    assert spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("sys").executable).collect() == [sys.executable]
    assert spark_session(app_name=APP_NAME) is spark is active_session()


# -- read_topic_df -----------------------------------------------------------------------------

def test_read_topic_df_has_exactly_sparks_kafka_source_schema(spark, cluster):
    """read_topic_df's schema is Spark's Kafka source's (key binary, value binary, topic
    string, partition int, offset long, timestamp timestamp, timestampType int, headers
    array<struct<key:string,value:binary>>), for a topic with records, an empty topic and an
    empty range."""
    kafka_source = T.StructType([
        T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField("headers", T.ArrayType(T.StructType([
            T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])))])
    assert SPARK_SCHEMA == kafka_source
    assert SPARK_SCHEMA.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>")
    df = read_topic_df(spark, cluster, "plain")
    assert df.schema == kafka_source
    for empty in (read_topic_df(spark, cluster, "empty"),
                  read_topic_df(spark, cluster, "plain", 7, 7)):
        assert empty.schema == kafka_source
        assert empty.count() == 0


def test_values_keys_headers_offsets_and_timestamps_round_trip(spark, cluster):
    """Every committed record of "plain" comes back once with its key (nulls too), value,
    topic, partition, offset, timestamp (to the ms), timestampType 0 (CreateTime) and headers
    with a repeated key kept in order; a LogAppendTime topic gives timestampType 1 and the
    broker's time; a list of topics reads them all."""
    got = rows(read_topic_df(spark, cluster, "plain"))
    assert got == [plain_record(p, i) for p in range(PARTS) for i in range(PER_PART)]

    both = rows(read_topic_df(spark, cluster, ["plain", "appended"]))
    appended = [r for r in both if r["topic"] == "appended"]
    assert len(both) == PARTS * PER_PART + 2
    assert [(r["value"], r["timestampType"]) for r in appended] == [(b"a", 1), (b"b", 1)]
    assert all(r["ts_ms"] > BASE for r in appended)           # not the 5 and 6 sent


def test_a_record_without_headers_has_null_headers_as_in_sparks_kafka_source(spark, cluster):
    """A record produced without headers has headers null (Spark's Kafka source:
    KafkaRecordToRowConverter gives null, not an empty array), also in a fetch where no
    record has any ("appended"); records with headers keep them."""
    df = read_topic_df(spark, cluster, ["plain", "appended"])
    assert df.where("headers IS NULL").count() == PARTS * PER_PART // 2 + 2
    assert df.where("size(headers) = 0").count() == 0
    assert df.where("topic = 'plain' AND offset % 2 = 0 AND size(headers) = 3").count() == \
        PARTS * PER_PART // 2


def test_read_topic_df_reads_in_spark_each_action_and_holds_nothing_in_ray(spark, cluster):
    """read_topic_df resolves the ranges when called and reads them when Spark computes the
    DataFrame, in Spark's executors: no Ray object is made for it (Ray's object store use
    does not grow), records appended after the call are not read, and every action reads
    the same records again."""
    cluster.admin().create_topic("lazy", partitions=2)
    with cluster.producer() as producer:
        producer.send_batch("lazy", [b"x%d" % i for i in range(500)]).wait(timeout=60)
    df = read_topic_df(spark, cluster, "lazy")
    with cluster.producer() as producer:
        producer.send_batch("lazy", [b"later"] * 100).wait(timeout=60)
    store = ray.available_resources().get("object_store_memory", 0)
    held = held_dfs()
    assert df.count() == 500
    assert df.where("value = 'later'").count() == 0
    assert df.selectExpr("sum(length(value)) AS n").collect()[0]["n"] == sum(
        len(b"x%d" % i) for i in range(500))
    assert held_dfs() == held
    # nothing of read_topic_df's went into the object store (a few KB of Ray's own
    # bookkeeping may come and go)
    assert ray.available_resources().get("object_store_memory", 0) >= store - (1 << 20)
    assert read_topic_df(spark, cluster, "lazy").count() == 600


def test_a_topic_larger_than_rays_object_store_is_read_without_using_it(spark, cluster):
    """A topic holding more bytes than Ray's object store (96 MiB here) is counted and
    summed through read_topic_df, and while Spark reads it the object store's free memory
    never drops by more than a few MiB: the records go from the replicas to Spark's
    executors without being stored in Ray."""
    n, size = 1_100_000, 100
    cluster.admin().create_topic("big", partitions=2)
    with cluster.producer(acks=1) as producer:
        for first in range(0, n, 100_000):
            producer.send_batch("big", [b"%012d" % i + b"x" * (size - 12)
                                        for i in range(first, first + 100_000)])
        producer.flush(timeout=120)
    assert n * size > OBJECT_STORE_BYTES
    free = [ray.available_resources().get("object_store_memory", 0)]
    done = threading.Event()

    def sample():
        while not done.is_set():
            free.append(ray.available_resources().get("object_store_memory", 0))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        row = read_topic_df(spark, cluster, "big").selectExpr(
            "count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
    finally:
        done.set()
        sampler.join(timeout=10)
    assert (row["n"], row["bytes"]) == (n, n * size)
    assert len(free) > 2
    assert min(free) >= free[0] - (8 << 20), (free[0], min(free))


def test_starting_and_ending_offsets_as_ints_dicts_json_and_words(spark, cluster):
    """starting/ending offsets as ints, per-partition dicts, Spark's JSON strings (-2
    earliest, -1 latest) and "earliest"/"latest" select exactly [start, end); an end past
    the high watermark is cut to it."""
    every = list(range(PER_PART))
    assert offsets(read_topic_df(spark, cluster, "plain", 10, 25)) == {
        p: list(range(10, 25)) for p in range(PARTS)}
    assert offsets(read_topic_df(spark, cluster, "plain", "earliest", "latest")) == {
        p: every for p in range(PARTS)}
    got = offsets(read_topic_df(spark, cluster, "plain", {"plain": {0: 5, 2: "earliest"}},
                                {"plain": {0: 7, 1: 30}}))
    assert got == {0: [5, 6], 1: list(range(30)), 2: every}
    got = offsets(read_topic_df(spark, cluster, "plain", '{"plain": {"0": 38, "1": -2}}',
                                '{"plain": {"1": 3, "2": -1}}'))
    assert got == {0: [38, 39], 1: [0, 1, 2], 2: every}
    assert offsets(read_topic_df(spark, cluster, "plain", 35, 10_000)) == {
        p: list(range(35, PER_PART)) for p in range(PARTS)}


def _hw_and_leo(cluster, topic):
    row = cluster.admin().describe_topic(topic)[0]
    return row["high_watermark"], row["log_end_offset"]


def test_only_records_below_the_high_watermark_are_read(spark, cluster):
    """With the follower paused, records the leader took with acks=1 sit above the high
    watermark: read_topic_df reads exactly up to it and none of them; once the follower
    catches up (resumed), they are read."""
    cluster.admin().create_topic("live", partitions=1, replication_factor=2)
    with cluster.producer(acks="all") as producer:
        producer.send_batch("live", [b"c-%d" % i for i in range(30)]).wait(timeout=60)
    row = cluster.admin().describe_topic("live")[0]
    follower = next(b for b in row["replicas"] if b != row["leader"])
    wait_until(lambda: len(cluster.admin().describe_topic("live")[0]["isr"]) == 2 and
               _hw_and_leo(cluster, "live") == (30, 30), timeout_s=60,
               what="both replicas in sync at 30")
    cluster.pause_broker(follower)
    try:
        uncommitted = [b"pending-%d" % i for i in range(20)]
        with cluster.producer(acks=1) as producer:
            producer.send_batch("live", uncommitted).wait(timeout=60)
        assert _hw_and_leo(cluster, "live") == (30, 50)
        got = rows(read_topic_df(spark, cluster, "live"))
        assert [r["offset"] for r in got] == list(range(30))
        assert [r["value"] for r in got] == [b"c-%d" % i for i in range(30)]
    finally:
        cluster.resume_broker(follower)
    wait_until(lambda: _hw_and_leo(cluster, "live")[0] == 50, timeout_s=60,
               what="the high watermark to reach the log end")
    got = rows(read_topic_df(spark, cluster, "live", 30))
    assert [r["value"] for r in got] == uncommitted


# -- the JVM reader (jobs/jvm) and its fallback ------------------------------------------------

def plan(df) -> str:
    """The physical plan Spark runs for ``df``."""
    return df._jdf.queryExecution().executedPlan().toString()


@contextlib.contextmanager
def reader(choice: str):
    """read_topic_df's reader forced to ``choice`` (RAYKAFKA_SPARK_READER) in the block."""
    old = os.environ.get(READER_ENV)
    os.environ[READER_ENV] = choice
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(READER_ENV, None)
        else:
            os.environ[READER_ENV] = old


def test_the_jvm_reader_gives_the_python_readers_rows_whole_and_from_inside_batches(
        spark, cluster):
    """On a cluster with PLAINTEXT listeners read_topic_df reads through the JVM reader
    (a BatchScan of raykafka's source, no Python node) and gives exactly the rows of the
    Python workers' path (RAYKAFKA_SPARK_READER=python: mapInArrow): keys, null values,
    headers (null without), timestamps, for the whole topic, for a range that starts and
    ends inside record batches, and for batches compressed with each codec."""
    cluster.admin().create_topic("jvm", partitions=1)
    codecs = (None, "gzip", "snappy", "lz4", "zstd")
    for n, codec in enumerate(codecs):
        with cluster.producer(compression_type=codec) as producer:
            producer.send_batch(
                "jvm", [None if i % 5 == 0 else b"v%d-%d" % (n, i) for i in range(20)],
                keys=[b"k%d" % i for i in range(20)],
                timestamps=[BASE + i for i in range(20)],
                headers=[[("c", (codec or "none").encode()), ("i", None)] if i % 3 else []
                         for i in range(20)]).wait(timeout=60)
    for start, end in (("earliest", "latest"), (13, 87)):     # 13..86: inside batches
        jvm_df = read_topic_df(spark, cluster, "jvm", start, end)
        assert "RaykafkaScan" in plan(jvm_df) and "Python" not in plan(jvm_df)
        with reader("python"):
            python_df = read_topic_df(spark, cluster, "jvm", start, end)
        assert "MapInArrow" in plan(python_df) and "RaykafkaScan" not in plan(python_df)
        got, want = rows(jvm_df), rows(python_df)
        assert got == want
        first = 0 if start == "earliest" else start
        assert [r["offset"] for r in got] == list(range(first, 100 if end == "latest" else end))
    assert rows(read_topic_df(spark, cluster, "plain")) == \
        [plain_record(p, i) for p in range(PARTS) for i in range(PER_PART)]


def test_counts_are_answered_from_the_leaders_batch_headers_without_reading(spark, cluster):
    """A count(), a count grouped by partition or by topic and partition, and a count of
    offsets are pushed into the JVM reader's scan (its description says so) and answered
    from the counts read_topic_df took from the leaders' batch headers: the same numbers as
    counting the rows, for a range that starts and ends inside batches. A count behind a
    filter is not pushed down and still right."""
    df = read_topic_df(spark, cluster, "plain", 3, 33)
    assert "pushed: COUNT, from" in plan(df.groupBy().count()), plan(df.groupBy().count())
    assert df.count() == PARTS * 30
    by_partition = df.groupBy("partition").count()
    assert "pushed: COUNT GROUP BY partition" in plan(by_partition), plan(by_partition)
    assert sorted(map(tuple, by_partition.collect())) == [(p, 30) for p in range(PARTS)]
    by_both = df.groupBy("topic", "partition").agg(F.count("*").alias("n"),
                                                   F.count("offset").alias("m"))
    assert "pushed: COUNT GROUP BY topic,partition" in plan(by_both), plan(by_both)
    assert sorted(map(tuple, by_both.collect())) == [("plain", p, 30, 30) for p in range(PARTS)]
    odd = df.filter(F.col("offset") % 2 == 1)
    assert "pushed" not in plan(odd.groupBy().count())
    assert odd.count() == PARTS * 15
    assert read_topic_df(spark, cluster, "plain").count() == PARTS * PER_PART


def test_count_groupby_and_sum_decode_only_the_columns_they_use(spark, cluster):
    """Without counts (a read with timeout_ms takes none) a count() asks the JVM reader's
    scan for no column, a groupBy("partition").count() for partition only (a constant per
    range) and sum(length(value)) for value only (the scan's description lists what it
    decodes), and each answers what the full rows say, also for a range inside batches."""
    df = read_topic_df(spark, cluster, "plain", 3, 33, timeout_ms=600_000)
    count = df.groupBy().count()
    assert "columns: ]" in plan(count), plan(count)
    assert count.collect()[0][0] == PARTS * 30
    by_partition = df.groupBy("partition").count()
    assert "columns: partition]" in plan(by_partition), plan(by_partition)
    assert sorted(map(tuple, by_partition.collect())) == [(p, 30) for p in range(PARTS)]
    lengths = df.selectExpr("sum(length(value)) AS n")
    assert "columns: value]" in plan(lengths), plan(lengths)
    assert lengths.collect()[0]["n"] == sum(len(plain_record(p, i)["value"])
                                            for p in range(PARTS) for i in range(3, 33))


def test_the_jvm_reader_finds_a_moved_leader_through_metadata(spark, cluster):
    """A range handed to the JVM reader with another broker's address (as after its leader
    moved) is refused there (without bootstrap addresses the read fails, naming Kafka's
    error); the reader asks the bootstrap brokers' Metadata for the leader and reads the
    whole range from it."""
    options = _jvm_read_options(spark, cluster, [("plain", 0, 0, PER_PART)], {
        "consumer_config": {}, "fetch_max_bytes": 1 << 20, "timeout_ms": None})
    leader, _ = cluster.metadata.leader_broker("plain", 0)
    other = next(b for b in cluster.broker_ids() if b != leader)
    host, port = cluster.metadata.broker_address(other)
    options["pieces"] = f"plain\t0\t0\t{PER_PART}\t{host}\t{port}"
    alone = spark.read.format(JVM_SOURCE_CLASS).options(
        **{**options, "bootstrap": "", "retries": "0"}).load()
    with pytest.raises(Exception, match="NOT_LEADER_OR_FOLLOWER|UNKNOWN_TOPIC_OR_PARTITION"):
        alone.count()
    df = spark.read.format(JVM_SOURCE_CLASS).options(**options).load()
    assert rows(df) == [plain_record(0, i) for i in range(PER_PART)]

def test_the_reader_jar_is_built_once_per_source_version_and_not_without_javac(
        tmp_path, monkeypatch):
    """jobs.jvm.build.jar_path compiles the Java sources into a jar under the user cache
    directory keyed by their hash, reuses it afterwards (not rebuilt), and answers None
    when there is no javac (read_topic_df then reads through Python workers)."""
    import zipfile

    from jobs.jvm import build
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(build, "_built", {})
    jar = build.jar_path()
    assert jar == tmp_path / "raykafka" / "jvm" / build.cache_key() / build.JAR_NAME
    assert "raykafka/spark/TopicSource.class" in zipfile.ZipFile(jar).namelist()
    built_at = jar.stat().st_mtime_ns
    monkeypatch.setattr(build, "_built", {})
    assert build.jar_path() == jar and jar.stat().st_mtime_ns == built_at
    jar.unlink()
    monkeypatch.setattr(build, "_built", {})
    monkeypatch.setattr(build, "javac", lambda: None)
    assert build.jar_path() is None

def test_python_workers_read_when_the_jvm_reader_cannot(spark, cluster):
    """The Python workers' path is taken when RAYKAFKA_SPARK_READER=python, for a secured
    cluster (its clients use SASL_SSL), a consumer_config asking for SSL, or a leader with
    no PLAINTEXT listener; RAYKAFKA_SPARK_READER=jvm then raises IllegalStateError saying
    why, and a value not in READERS raises InvalidConfigurationError."""
    from actors.errors import BrokerNotAvailableError
    pieces = [("plain", 0, 0, PER_PART)]
    options = {"consumer_config": {}, "fetch_max_bytes": 1 << 20, "timeout_ms": None}
    assert _jvm_read_options(spark, cluster, pieces, options)["pieces"].startswith(
        f"plain\t0\t0\t{PER_PART}\t127.0.0.1\t")

    class SaslOnly:                  # a leader registered with a SASL_SSL listener only
        security_files = None

        class metadata:
            @staticmethod
            def leader_broker(topic, partition):
                return 1, 0

            @staticmethod
            def broker_address(broker, protocol="PLAINTEXT"):
                raise BrokerNotAvailableError(f"broker {broker} has no {protocol} listener")

            @staticmethod
            def snapshot():
                return {"brokers": {1: {}}}

    class Secured:
        security_files = {"protocol": "SASL_SSL"}

    ssl = {**options, "consumer_config": {"security_protocol": "SSL"}}
    for target, opts in ((SaslOnly, options), (Secured, options), (cluster, ssl)):
        assert _jvm_read_options(spark, target, pieces, opts) is None
        with reader("jvm"), pytest.raises(IllegalStateError, match="JVM reader cannot"):
            _jvm_read_options(spark, target, pieces, opts)
    with reader("python"):
        df = read_topic_df(spark, cluster, "plain")
        assert "MapInArrow" in plan(df)
        assert df.count() == PARTS * PER_PART
    with reader("fastest"), pytest.raises(InvalidConfigurationError, match=READER_ENV):
        read_topic_df(spark, cluster, "plain")


# -- write_topic_df ----------------------------------------------------------------------------

def _read_back(cluster, topic) -> list[dict]:
    table = pa.concat_tables(read_topic(cluster, topic).iter_batches(
        batch_size=None, batch_format="pyarrow"))
    return table.to_pylist()


def test_write_topic_df_round_trips_string_and_binary_values_keys_and_headers(spark, cluster):
    """A DataFrame of string values and keys, one of binary values and keys with explicit
    partitions, timestamps and array<struct> headers, and one with map headers, each written
    by write_topic_df, read back (read_topic) as the same bytes, on the partitions given (or
    the key's), with per-partition counts returned as write_topic does."""
    admin = cluster.admin()
    for name in ("w-str", "w-bin", "w-map"):
        admin.create_topic(name, partitions=3)

    texts = spark.createDataFrame([(f"v{i}", None if i % 3 == 0 else f"key{i % 5}")
                                   for i in range(30)], "value string, key string")
    counts = write_topic_df(texts, cluster, "w-str")
    back = _read_back(cluster, "w-str")
    assert sum(counts.values()) == 30 == len(back)
    assert counts == dict(Counter(r["partition"] for r in back))
    assert sorted((r["value"], r["key"]) for r in back) == sorted(
        (f"v{i}".encode(), None if i % 3 == 0 else f"key{i % 5}".encode()) for i in range(30))
    by_key: dict[bytes, set] = {}
    for r in back:
        if r["key"] is not None:
            by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(parts) == 1 for parts in by_key.values())        # a key, one partition

    data = [(bytes([i, 0, 255]) + b"v", b"k%d" % i, i % 3, BASE + i,
             [("h", b"1"), ("h", bytes([i]))] if i % 2 else [])
            for i in range(24)]
    binary = spark.createDataFrame(
        data, "value binary, key binary, partition int, ts long, "
              "headers array<struct<key:string,value:binary>>"
    ).withColumn("timestamp", F.timestamp_millis("ts")).drop("ts") \
     .withColumn("topic", F.lit("ignored"))
    assert write_topic_df(binary, cluster, "w-bin") == {0: 8, 1: 8, 2: 8}
    back = sorted(_read_back(cluster, "w-bin"), key=lambda r: r["timestamp"])
    assert [(r["value"], r["key"], r["partition"], r["timestamp"], r["headers"])
            for r in back] == [(v, k, p, ts, h) for v, k, p, ts, h in data]

    mapped = spark.createDataFrame([(b"m1", {"a": b"1"}), (b"m2", None)],
                                   "value binary, headers map<string,binary>")
    assert sum(write_topic_df(mapped, cluster, "w-map", acks=1).values()) == 2
    assert sorted((r["value"], r["headers"]) for r in _read_back(cluster, "w-map")) == [
        (b"m1", [("a", b"1")]), (b"m2", [])]

    # write_topic of a mapped Dataset (what write_topic_df does with headers) checks the
    # mapped blocks, not the map's input (Ray passes on_write_start the input's schema)
    mapped_ds = ray.data.from_items([{"n": i} for i in range(5)]).map_batches(
        lambda b: pa.table({"value": [b"n%d" % n for n in b.column("n").to_pylist()]}),
        batch_format="pyarrow")
    assert sum(write_topic(mapped_ds, cluster, "w-map").values()) == 5


def test_read_topic_df_then_write_topic_df_copies_a_topic(spark, cluster):
    """write_topic_df(read_topic_df(...)) copies "plain" record for record through Spark:
    each lands on the partition it came from with its key, value, timestamp and headers; an
    empty DataFrame writes nothing."""
    cluster.admin().create_topic("copy", partitions=PARTS)
    counts = write_topic_df(read_topic_df(spark, cluster, "plain"), cluster, "copy")
    assert counts == {p: PER_PART for p in range(PARTS)}
    copied = rows(read_topic_df(spark, cluster, "copy"))

    def content(records):
        return sorted((r["partition"], r["value"], r["key"] or b"", r["ts_ms"], r["headers"])
                      for r in records)

    assert content(copied) == content(plain_record(p, i) for p in range(PARTS)
                                      for i in range(PER_PART))
    assert write_topic_df(read_topic_df(spark, cluster, "empty"), cluster, "copy") == {}
    assert write_topic_df(spark.range(0).selectExpr("CAST(id AS STRING) AS value"),
                          cluster, "copy") == {}


def test_write_topic_df_shows_no_warning_of_rays_or_sparks_own(spark, cluster):
    """write_topic_df goes through RayDP's bridge without Ray Data's "``parallelism`` is
    deprecated" (ray.data.from_spark passes a None it then takes for a value) or PySpark's
    "DataFrame.sql_ctx is an internal property" (RayDP reads it): a job's output has only
    its own lines (docs/cli.md, "Output and --verbose")."""
    import logging
    import warnings

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    keep = Keep()
    ray_data = logging.getLogger("ray.data")
    ray_data.addHandler(keep)
    cluster.admin().create_topic("quiet-copy", partitions=PARTS)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            counts = write_topic_df(read_topic_df(spark, cluster, "plain"), cluster,
                                    "quiet-copy")
    finally:
        ray_data.removeHandler(keep)
    assert counts == {p: PER_PART for p in range(PARTS)}
    assert [str(w.message) for w in caught] == []
    assert keep.lines == []


def test_bad_input_raises_typed_errors_with_clear_messages(spark, cluster):
    """Unknown topics and partitions, bad offsets (as words, JSON or past the high
    watermark), a missing or mistyped column, a bad acks, non-Spark arguments and a second
    session with other settings raise raykafka's typed errors saying what is wrong, before
    Spark computes anything."""
    with pytest.raises(UnknownTopicOrPartitionError):
        read_topic_df(spark, cluster, "no-such-topic")
    with pytest.raises(UnknownTopicOrPartitionError, match="partition"):
        read_topic_df(spark, cluster, "plain", {"plain": {9: 0}})
    with pytest.raises(IllegalArgumentError, match="starting_offsets"):
        read_topic_df(spark, cluster, "plain", '{"plain": {"0": }')
    with pytest.raises(IllegalArgumentError, match="partition 'x'"):
        read_topic_df(spark, cluster, "plain", '{"plain": {"x": 1}}')
    with pytest.raises(IllegalArgumentError, match="cannot be 'latest'"):
        read_topic_df(spark, cluster, "plain", "latest")
    with pytest.raises(IllegalArgumentError, match="start_offset"):
        read_topic_df(spark, cluster, "plain", 20, 10)
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        read_topic_df(spark, cluster, "plain", PER_PART + 1)
    with pytest.raises(IllegalArgumentError, match="SparkSession"):
        read_topic_df("not spark", cluster, "plain")
    with pytest.raises(IllegalArgumentError, match="num_cpus"):
        read_topic_df(spark, cluster, "plain", num_cpus=1)

    ok = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(IllegalArgumentError, match="'value' column"):
        write_topic_df(ok.withColumnRenamed("value", "payload"), cluster, "copy")
    with pytest.raises(IllegalArgumentError, match="'value' must be binary or string, got int"):
        write_topic_df(spark.createDataFrame([(1,)], "value int"), cluster, "copy")
    with pytest.raises(IllegalArgumentError, match="'partition' must be an integer"):
        write_topic_df(ok.withColumn("partition", F.lit("0")), cluster, "copy")
    with pytest.raises(IllegalArgumentError, match="'headers' must be"):
        write_topic_df(ok.withColumn("headers", F.lit(b"x")), cluster, "copy")
    with pytest.raises(IllegalArgumentError, match="'timestamp'"):
        write_topic_df(ok.withColumn("timestamp", F.lit("now")), cluster, "copy")
    with pytest.raises(UnknownTopicOrPartitionError):
        write_topic_df(ok, cluster, "no-such-topic",
                       producer_config={"allow_auto_create_topics": False})
    with pytest.raises(InvalidConfigurationError):
        write_topic_df(ok, cluster, "copy", acks=2)
    with pytest.raises(IllegalArgumentError, match="Spark DataFrame"):
        write_topic_df(pa.table({"value": [b"v"]}), cluster, "copy")
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 7"):
        write_topic_df(ok.withColumn("partition", F.lit(7)), cluster, "copy")

    with pytest.raises(InvalidConfigurationError, match="num_executors"):
        spark_session(num_executors=0)
    with pytest.raises(IllegalStateError, match="stop_spark"):
        spark_session(app_name="another")


# -- the word-count example ----------------------------------------------------------------

def expected_counts(lines) -> dict[str, int]:
    return dict(Counter(w for line in lines for w in re.findall(r"[^\W_]+", line.lower())))


def test_word_count_example_on_a_running_cluster_and_embedded(spark, cluster):
    """word_count.main attached to a running cluster (--namespace) counts the words of the
    input topic it fills with the sample text and writes (word, count) records to a
    compacted output topic; run with --embedded it starts its own cluster and shuts it
    down; both give the counts computed in Python."""
    want = expected_counts(word_count.SAMPLE_LINES)
    out = word_count.main(["--namespace", cluster.namespace, "--input", "wc-lines",
                           "--output", "wc-counts"])
    assert out["counts"] == want
    assert out["total"] == sum(want.values())
    back = {r["key"].decode(): int(r["value"]) for r in _read_back(cluster, "wc-counts")}
    assert back == want
    assert sum(out["written"].values()) == len(want)
    assert cluster.admin().topic_config("wc-counts")["cleanup.policy"] == "compact"

    emb = word_count.main(["--embedded", "--brokers", "1"])
    assert emb["counts"] == want and emb["namespace"] != cluster.namespace
    with pytest.raises(ClusterNotFoundError):
        Cluster.connect(emb["namespace"])          # shut down after the run
    assert active_session() is spark                # the session it reused is left running


@pytest.mark.slow
@pytest.mark.skipif(not JOB_SUBMIT, reason="set RAYKAFKA_TEST_JOB_SUBMIT=1 (starts a second "
                    "Spark: over a minute)")
def test_word_count_example_runs_under_ray_job_submit(spark, cluster):
    """`ray job submit --working-dir . -- python jobs/examples/word_count.py --namespace NS`
    against this Ray's job server runs the example as a separate driver (its own Spark
    session on RayDP) that attaches through RAY_ADDRESS, and its counts are in the output
    topic."""
    assert raycompat.wait_job_server(60), "Ray's job server is not ready"
    env = {**os.environ, "RAY_AUTH_MODE": raycompat.auth_mode(), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ray"), "job", "submit",
           "--address", raycompat.dashboard_url(), "--working-dir", ROOT, "--",
           sys.executable, "jobs/examples/word_count.py", "--namespace", cluster.namespace,
           "--input", "wcj-lines", "--output", "wcj-counts"]
    for _ in range(3):      # only Ray's transient "No available agent" refusal is retried
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                              cwd=ROOT)
        if "No available agent" not in proc.stdout + proc.stderr:
            break
    summaries = [json.loads(line) for line in proc.stdout.splitlines()
                 if line.startswith("{\"namespace\"")]
    assert proc.returncode == 0 and summaries, proc.stdout[-4000:] + proc.stderr[-4000:]
    want = expected_counts(word_count.SAMPLE_LINES)
    assert summaries[-1]["words"] == len(want)
    assert summaries[-1]["total"] == sum(want.values())
    back = {r["key"].decode(): int(r["value"]) for r in _read_back(cluster, "wcj-counts")}
    assert back == want
