"""jobs.streaming against the real thing (local Ray, embedded ZooKeeper, 2 brokers, RayDP 1.6.5
on Java 17): batches cover every record once, the cap is split over the partitions, the
offsets/commits logs make a failed or killed batch run again with exactly its range, the
Parquet sink is idempotent per batch, records lost to retention are a typed error, and the
streaming example killed (SIGKILL) mid-batch and restarted writes every view exactly once.
One cluster and one Spark session for the module (Spark is slow to start); the pure parts
(the cap's split, the checkpoint files) need neither."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pyarrow.dataset as pads
import pytest

from actors import Cluster, raycompat
from actors.errors import (IllegalArgumentError, InvalidCheckpointError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from cluster_helpers import ray, unique_namespace, wait_until
from jobs.examples import streaming as example
from jobs.spark import held_dfs
from jobs.streaming import BatchPlan, Checkpoint, MicroBatchStream, ParquetSink, split_cap
from spark_helpers import spark_ray  # noqa: F401 - the shared Ray and Spark (fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = {"zookeeper.session.timeout.ms": 20000}


# -- pure: the cap's split and the checkpoint files --------------------------------------------

def test_split_cap_is_proportional_never_over_the_cap_and_starves_no_partition():
    """split_cap gives everything under the cap; over it, exactly the cap in all, never more
    than a partition has waiting, at least one to each partition with records (when the cap
    allows), and shares within one record of proportional."""
    assert split_cap({0: 5, 1: 7}, None) == {0: 5, 1: 7}
    assert split_cap({0: 5, 1: 7}, 12) == {0: 5, 1: 7}
    assert split_cap({0: 900, 1: 100, 2: 0}, 100) == {0: 90, 1: 10, 2: 0}
    assert split_cap({0: 10_000, 1: 1}, 10) == {0: 9, 1: 1}       # the small one not starved
    assert sum(split_cap({0: 5, 1: 5, 2: 5}, 2).values()) == 2     # cap below the partitions
    rng = random.Random(7)
    for _ in range(500):
        waiting = {p: rng.choice([0, 1, 2, rng.randrange(1000)])
                   for p in range(rng.randrange(1, 9))}
        cap = rng.randrange(1, 1500)
        take = split_cap(waiting, cap)
        total = sum(waiting.values())
        assert sum(take.values()) == min(cap, total)
        assert all(0 <= take[p] <= waiting[p] for p in waiting)
        busy = [p for p in waiting if waiting[p]]
        if cap >= len(busy):
            assert all(take[p] >= 1 for p in busy)
        if cap < total and cap >= len(busy):
            # within a record of its proportional share, plus the records given to
            # partitions whose share is below one
            bumped = sum(1 for p in busy if cap * waiting[p] / total < 1)
            for p in busy:
                share = cap * waiting[p] / total
                assert abs(take[p] - share) < 1 + bumped + 1e-9, (waiting, cap, take)


def test_checkpoint_logs_are_written_once_and_survive_a_reopen(tmp_path):
    """A plan and a commit are written once (a second write of the same batch is refused
    with InvalidCheckpointError), read back equal after the checkpoint is reopened, carry
    a running total, and only the last min_batches_to_retain batches are kept."""
    cp = Checkpoint(tmp_path / "ck", ["t"], min_batches_to_retain=2)
    plans = [BatchPlan(n, {"t": {0: 10 * n}}, {"t": {0: 10 * n + 10}}, 1) for n in range(4)]
    cp.write_plan(plans[0])
    with pytest.raises(InvalidCheckpointError, match="another query planned batch 0"):
        cp.write_plan(plans[0])
    cp.write_commit(0, {"num_records": 10, "total_records": 10})
    with pytest.raises(InvalidCheckpointError, match="committed by another query"):
        cp.write_commit(0, {})
    for n in (1, 2, 3):
        cp.write_plan(plans[n])
        cp.write_commit(n, {"num_records": 10, "total_records": 10 * (n + 1)})
    query_id = cp.query_id
    cp.close()
    again = Checkpoint(tmp_path / "ck", ["t"], min_batches_to_retain=2)
    try:
        assert again.query_id == query_id
        assert again.latest_plan() == plans[3]
        assert again.batch_ids("offsets") == again.batch_ids("commits") == [2, 3]
        assert again.total_records() == 40
        assert not [n for n in os.listdir(tmp_path / "ck" / "offsets") if n.endswith(".tmp")]
    finally:
        again.close()


def test_a_checkpoint_in_use_of_other_topics_or_damaged_is_a_typed_error(tmp_path):
    """Opening a checkpoint another query holds, one made for other topics, a damaged log
    file or a path that is a file raises InvalidCheckpointError naming the problem."""
    cp = Checkpoint(tmp_path / "ck", ["a", "b"])
    with pytest.raises(InvalidCheckpointError, match="in use by another running query"):
        Checkpoint(tmp_path / "ck", ["a", "b"])
    cp.write_plan(BatchPlan(0, {"a": {0: 0}}, {"a": {0: 5}}, 1))
    cp.close()
    with pytest.raises(InvalidCheckpointError, match=r"topics \['a', 'b'\], not \['a'\]"):
        Checkpoint(tmp_path / "ck", ["a"])
    (tmp_path / "ck" / "offsets" / "1").write_text('{"version": 1, "batch_id": 1, "sta')
    cp = Checkpoint(tmp_path / "ck", ["b", "a"])          # the order of topics does not matter
    try:
        with pytest.raises(InvalidCheckpointError, match="offsets/1 is damaged"):
            cp.latest_plan()
        (tmp_path / "ck" / "offsets" / "1").write_text(json.dumps(
            {"version": 1, "batch_id": 1, "timestamp_ms": 1, "start": {"a": {"0": 9}},
             "end": {"a": {"0": 5}}}))
        with pytest.raises(InvalidCheckpointError, match="a-0 has start 9, end 5"):
            cp.latest_plan()
    finally:
        cp.close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidCheckpointError, match="is not a directory"):
        Checkpoint(tmp_path / "file", ["a"])
    with pytest.raises(IllegalArgumentError):
        Checkpoint(None, ["a"])


# -- against the cluster -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def started(spark_ray):  # noqa: F811
    """The cluster, started while the shared Spark session starts (spark_helpers: its Ray
    has the 4 logical CPUs this module's Spark executor, Ray Data's read tasks and the
    killed example's own Spark executor need): (cluster, spark)."""
    c = None
    try:
        c = Cluster.start(num_brokers=2, namespace=unique_namespace("st"), config=CONFIG)
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


def _produce(cluster, topic: str, counts: dict[int, int], tag: str = "r") -> None:
    """``counts[p]`` records to partition p, values ``<tag><p>-<i>``."""
    with cluster.producer(acks="all") as producer:
        for p, n in counts.items():
            if n:
                producer.send_batch(topic, [b"%s%d-%d" % (tag.encode(), p, i) for i in range(n)],
                                    partition=p).wait(timeout=60)


def _ray_rows(ds) -> list[tuple[int, int, bytes]]:
    tables = list(ds.iter_batches(batch_format="pyarrow", batch_size=None))
    return sorted((p, o, v) for tb in tables for p, o, v in zip(
        tb.column("partition").to_pylist(), tb.column("offset").to_pylist(),
        tb.column("value").to_pylist()))


def test_batches_read_every_record_once_in_contiguous_capped_ranges(cluster, tmp_path):
    """With max_offsets_per_trigger 250 over 3 partitions holding 600, 300 and 7 records,
    available_now runs ceil(907/250) batches, each at most 250 records, whose ranges follow
    each other per partition with no gap or overlap; the Ray Datasets they hand over hold
    exactly those records, each once; with nothing new a batch is not planned."""
    cluster.admin().create_topic("capped", partitions=3)
    _produce(cluster, "capped", {0: 600, 1: 300, 2: 7})
    seen = []
    with MicroBatchStream(cluster, "capped", tmp_path / "ck",
                          max_offsets_per_trigger=250) as stream:
        infos = stream.run(lambda ds, n: seen.extend(_ray_rows(ds)), available_now=True)
        assert [i.batch_id for i in infos] == [0, 1, 2, 3]
        assert all(0 < i.num_records <= 250 for i in infos)
        assert not any(i.rerun for i in infos)
        for p in range(3):
            ends = [0] + [i.end["capped"][p] for i in infos]
            assert [i.start["capped"][p] for i in infos] == ends[:-1]
        assert infos[0].end["capped"][2] >= 1          # the small partition is not starved
        assert stream.run_batch(lambda ds, n: None) is None
        assert stream.checkpoint.total_records() == 907
    want = sorted((p, i, b"r%d-%d" % (p, i)) for p, n in ((0, 600), (1, 300), (2, 7))
                  for i in range(n))
    assert sorted(seen) == want


def test_each_batch_reports_its_latency_and_throughput(cluster, tmp_path):
    """A batch's BatchInfo gives its latency (plan to commit, at least its read plus its
    foreach_batch, which sleeps 0.2 s here) and its records per second over that latency,
    in as_dict too."""
    cluster.admin().create_topic("timed", partitions=1)
    _produce(cluster, "timed", {0: 50})
    with MicroBatchStream(cluster, "timed", tmp_path / "ck") as stream:
        info = stream.run_batch(lambda ds, n: time.sleep(0.2))
    assert info.num_records == 50
    assert info.latency_s >= info.read_s + info.process_s >= 0.2
    assert info.records_per_s == pytest.approx(50 / info.latency_s)
    d = info.as_dict()
    assert d["latency_s"] == round(info.latency_s, 3)
    assert d["records_per_s"] == round(50 / info.latency_s)


def test_a_failed_batch_runs_again_with_exactly_its_recorded_range(cluster, tmp_path):
    """A batch whose foreach_batch raised is planned but not committed: a new stream on the
    same checkpoint (after more records arrived) runs that batch again with the same
    offsets and records, flagged as a re-run, then goes on from its end."""
    cluster.admin().create_topic("rerun", partitions=2)
    _produce(cluster, "rerun", {0: 40, 1: 40})
    attempts: dict[int, list] = {}

    def fail_batch_1(ds, n):
        attempts.setdefault(n, []).append(_ray_rows(ds))
        if n == 1 and len(attempts[n]) == 1:
            raise RuntimeError("the sink is down")

    with MicroBatchStream(cluster, "rerun", tmp_path / "ck", max_offsets_per_trigger=30) as s:
        with pytest.raises(RuntimeError, match="the sink is down"):
            s.run(fail_batch_1)
        first = s.checkpoint.read_plan(1)
        assert not s.checkpoint.is_committed(1)
    _produce(cluster, "rerun", {0: 50, 1: 50}, tag="late")
    with MicroBatchStream(cluster, "rerun", tmp_path / "ck", max_offsets_per_trigger=30) as s:
        again = s.run_batch(fail_batch_1)
        assert (again.batch_id, again.rerun) == (1, True)
        assert (again.start, again.end) == (first.start, first.end)
        assert attempts[1][0] == attempts[1][1]
        rest = s.run(fail_batch_1, available_now=True)
        assert rest[0].start == first.end
    rows = [r for n in sorted(attempts) for r in attempts[n][-1]]
    assert len(rows) == len(set(rows)) == 180


def test_starting_offsets_latest_and_per_partition_and_no_empty_batches(cluster, tmp_path):
    """starting_offsets="latest" skips what is there (no batch until something new comes);
    a dict starts each named partition at its offset (-2 earliest) and the others at
    their earliest; a checkpoint with batches ignores starting_offsets."""
    cluster.admin().create_topic("starts", partitions=2)
    _produce(cluster, "starts", {0: 10, 1: 10})
    with MicroBatchStream(cluster, "starts", tmp_path / "latest",
                          starting_offsets="latest") as s:
        assert s.run_batch(lambda ds, n: None) is None
        _produce(cluster, "starts", {0: 3})
        info = s.run_batch(lambda ds, n: None)
        assert (info.start, info.end) == ({"starts": {0: 10, 1: 10}}, {"starts": {0: 13, 1: 10}})
    with MicroBatchStream(cluster, "starts", tmp_path / "dict",
                          starting_offsets={"starts": {0: 12}}) as s:
        info = s.run_batch(lambda ds, n: None)
        assert info.start == {"starts": {0: 12, 1: 0}} and info.num_records == 11
    with MicroBatchStream(cluster, "starts", tmp_path / "dict", starting_offsets="latest") as s:
        _produce(cluster, "starts", {1: 2})
        assert s.run_batch(lambda ds, n: None).start == {"starts": {0: 13, 1: 10}}


def test_records_deleted_by_retention_fail_the_stream_unless_told_to_skip(cluster, tmp_path):
    """A batch whose start is below the log start offset (retention deleted the records)
    raises OffsetOutOfRangeError naming them, and plans nothing; with
    fail_on_data_loss=False it warns and reads from the log start."""
    cluster.admin().create_topic("retained", partitions=1,
                                 config={"retention.ms": "200", "segment.bytes": "1024"})
    with cluster.producer(acks="all") as producer:
        for _ in range(6):          # batches of ~800 bytes: one per 1024-byte segment
            producer.send_batch("retained", [b"x" * 60] * 10).wait(timeout=60)
    consumer = cluster.simple_consumer()
    try:
        wait_until(lambda: consumer.offsets_before("retained", 0, -2)[0] > 0, timeout_s=60,
                   what="retention to delete the first segments")
        low = consumer.offsets_before("retained", 0, -2)[0]
    finally:
        consumer.close()
    with MicroBatchStream(cluster, "retained", tmp_path / "strict",
                          starting_offsets={"retained": {0: 0}}) as s:
        with pytest.raises(OffsetOutOfRangeError, match=r"records 0\.\.\d+ of retained-0 were "
                                                         r"deleted"):
            s.run_batch(lambda ds, n: None)
        assert s.checkpoint.latest_plan() is None
    with MicroBatchStream(cluster, "retained", tmp_path / "lenient", fail_on_data_loss=False,
                          starting_offsets={"retained": {0: 0}}) as s:
        info = s.run_batch(lambda ds, n: None)
        assert info.start["retained"][0] >= low and info.end["retained"][0] == 60


def test_bad_stream_arguments_raise_typed_errors(cluster, tmp_path):
    """Bad topics, caps, starting offsets, options and run arguments raise typed errors
    with clear messages before anything is planned."""
    ck = tmp_path / "ck"
    with pytest.raises(UnknownTopicOrPartitionError):
        MicroBatchStream(cluster, "no-such-topic", ck)
    cluster.admin().create_topic("argued", partitions=1)
    bad = [dict(max_offsets_per_trigger=0), dict(max_offsets_per_trigger=True),
           dict(starting_offsets="middle"), dict(starting_offsets={"other": {0: 1}}),
           dict(starting_offsets={"argued": {0: -3}}), dict(fail_on_data_loss="no"),
           dict(spark="spark"), dict(read_options=[1])]
    for kwargs in bad:
        with pytest.raises(IllegalArgumentError):
            MicroBatchStream(cluster, "argued", ck, **kwargs)
    with pytest.raises(IllegalArgumentError):
        MicroBatchStream(cluster, [], ck)
    with MicroBatchStream(cluster, "argued", ck) as s:
        for kwargs in (dict(trigger_interval_s=-1), dict(max_batches=0), dict(timeout_s=0)):
            with pytest.raises(IllegalArgumentError):
                s.run(lambda ds, n: None, **kwargs)
        with pytest.raises(IllegalArgumentError, match="foreach_batch must be callable"):
            s.run_batch("print")
    with pytest.raises(IllegalArgumentError):
        ParquetSink("")
    with pytest.raises(IllegalArgumentError):
        ParquetSink(tmp_path / "out", transform=3)


# -- with Spark ---------------------------------------------------------------------------------

def _sink_rows(path) -> dict[str, int]:
    table = pads.dataset(str(path), format="parquet", partitioning="hive").to_table()
    out: dict[str, int] = {}
    for k, n in zip(table.column("k").to_pylist(), table.column("n").to_pylist()):
        out[k] = out.get(k, 0) + n
    return out


def test_a_spark_stream_into_the_parquet_sink_counts_every_record_once(spark, cluster, tmp_path):
    """Spark batches (read_topic_df) through a ParquetSink: a batch whose commit failed
    after its directory was written is re-run and skipped by the sink, a temporary
    directory a killed writer left is removed, every record is counted exactly once, and
    no batch's Ray objects are held once it is committed."""
    from pyspark.sql import functions as F
    cluster.admin().create_topic("sparked", partitions=2)
    _produce(cluster, "sparked", {0: 120, 1: 80})
    sink = ParquetSink(tmp_path / "out", transform=lambda df: df.groupBy(
        F.substring(F.col("value").cast("string"), 1, 2).alias("k")).agg(F.count("*").alias("n")))
    os.makedirs(tmp_path / "out" / "_tmp-batch=1-0123")      # as a killed writer leaves it
    calls: list[tuple[int, int | None]] = []

    def write_then_fail_once(df, n):
        calls.append((n, sink(df, n)))
        if n == 1 and len(calls) == 2:
            raise RuntimeError("killed before the commit")

    held_before = held_dfs()
    with MicroBatchStream(cluster, "sparked", tmp_path / "ck", spark=spark,
                          max_offsets_per_trigger=80) as s:
        with pytest.raises(RuntimeError, match="killed before the commit"):
            s.run(write_then_fail_once)
        assert sink.batches() == [0, 1] and not s.checkpoint.is_committed(1)
        s.run(write_then_fail_once, available_now=True)
    assert [n for n, _ in calls] == [0, 1, 1, 2]
    assert calls[2][1] is None                                 # skipped: written already
    assert sink.batches() == [0, 1, 2]
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith("_tmp-")]
    assert _sink_rows(tmp_path / "out") == {"r0": 120, "r1": 80}
    assert held_dfs() == held_before


def test_the_streaming_example_killed_mid_batch_and_restarted_writes_every_view_once(
        spark, cluster, tmp_path):
    """jobs/examples/streaming.py as its own process (its own Spark, attached through
    RAY_ADDRESS) is SIGKILLed while batch 0's result is written and not committed; run
    again on the same checkpoint it re-runs batch 0 with the same offsets (the sink skips
    it), goes on to the end, and the sink holds every view exactly once, per user."""
    topic, views = "views-killed", 3_000
    cluster.admin().create_topic(topic, partitions=3)
    example.produce_views(cluster, topic, 0, views)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    args = ["--namespace", cluster.namespace, "--topic", topic, "--checkpoint", ck,
            "--output", out, "--max-offsets-per-trigger", "1000"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "RAY_AUTH_MODE": raycompat.auth_mode(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "jobs/examples/streaming.py", *args,
                             "--pause-before-commit", "600"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("batch 0: written") for line in lines)
                   or proc.poll() is not None, timeout_s=300, interval_s=0.2,
                   what="the job to write batch 0 and pause before its commit")
        assert proc.poll() is None, "".join(lines)[-4000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    assert os.path.isdir(os.path.join(out, "batch=0"))
    assert not os.path.exists(os.path.join(ck, "commits", "0"))
    with open(os.path.join(ck, "offsets", "0")) as f:
        batch0 = BatchPlan.from_json(json.load(f), "offsets/0")

    summary = example.main(args)                     # in this process, with this Spark
    assert summary["ok"], summary
    assert summary["batches"] == [0, 1, 2] and summary["reruns"] == 1
    assert summary["committed_records"] == views == summary["sink"]["views"]
    assert summary["sink"]["batches"] == 3
    with open(os.path.join(ck, "offsets", "0")) as f:
        assert BatchPlan.from_json(json.load(f), "offsets/0") == batch0
    table = pads.dataset(out, format="parquet", partitioning="hive").to_table()
    per_user: dict[str, int] = {}
    for user, n in zip(table.column("user").to_pylist(), table.column("views").to_pylist()):
        per_user[user] = per_user.get(user, 0) + n
    want: dict[str, int] = {}
    for i in range(views):
        user = example.view(i)[0].decode()
        want[user] = want.get(user, 0) + 1
    assert per_user == want


def test_the_streaming_example_rejects_bad_arguments():
    """The example's command line refuses bad numbers and exclusive options (argparse exit
    2 with the option named), before it starts anything."""
    for argv, needle in ((["--max-offsets-per-trigger", "-1"], "--max-offsets-per-trigger"),
                         (["--max-batches", "0"], "--max-batches"),
                         (["--timeout", "0"], "--timeout"),
                         (["--embedded", "--namespace", "x"], "exclude each other")):
        proc = subprocess.run([sys.executable, "jobs/examples/streaming.py", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and needle in proc.stderr, (argv, proc.stderr)
