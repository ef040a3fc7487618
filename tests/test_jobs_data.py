"""jobs.data against a real cluster (local Ray, embedded ZooKeeper, 2 brokers): read_topic's
Dataset (schema, values, offsets, tasks, committed data only) and write_topic (round trips,
typed errors)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from actors import Cluster
from actors.errors import (BrokerNotAvailableError, IllegalArgumentError,
                           InvalidConfigurationError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from cluster_helpers import local_ray, ray, unique_namespace, wait_until  # noqa: F401
from jobs.data import (SCHEMA, TopicDatasource, iter_range, read_topic, resolve_ranges,
                       write_topic)

# a session long enough that pausing a broker for a few seconds does not expire it
CONFIG = {"zookeeper.session.timeout.ms": 20000}
PARTS = 3
PER_PART = 60
# record i of every partition of "plain" is stamped BASE + i seconds (an hour ago: well
# inside retention)
BASE = (int(time.time()) - 3600) * 1000


def plain_record(p: int, i: int) -> dict:
    """What "plain" holds at (p, i): null keys every 4th record, headers on even ones (the
    key "h" twice)."""
    return {"offset": i, "key": None if i % 4 == 0 else b"k%d-%d" % (p, i),
            "value": b"p%d-%d" % (p, i), "topic": "plain", "partition": p,
            "timestamp": BASE + i * 1000, "timestamp_type": 1,
            "headers": [("h", b"a"), ("h", b"b"), ("n", b"%d" % i)] if i % 2 == 0 else []}


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811
    ray.data.DataContext.get_current().enable_progress_bars = False
    c = Cluster.start(num_brokers=2, namespace=unique_namespace("jd"), config=CONFIG)
    admin = c.admin()
    admin.create_topic("plain", partitions=PARTS)
    admin.create_topic("empty", partitions=1)
    with c.producer() as producer:
        for p in range(PARTS):
            for lo, hi in ((0, 25), (25, PER_PART)):       # two batches per partition
                recs = [plain_record(p, i) for i in range(lo, hi)]
                producer.send_batch("plain", [r["value"] for r in recs],
                                    keys=[r["key"] for r in recs], partition=p,
                                    timestamps=[r["timestamp"] for r in recs],
                                    headers=[r["headers"] for r in recs]).wait(timeout=60)
    yield c
    c.shutdown()


def read_all(ds) -> pa.Table:
    """Every block of ``ds`` (each checked to have exactly SCHEMA), concatenated. Read with
    iter_batches: to_arrow_refs/materialize end with Ray Data asking every worker process
    for memory stats, which waits 60 s while a broker's processes are paused."""
    blocks = list(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    for block in blocks:
        assert block.schema == SCHEMA, block.schema
    return pa.concat_tables(blocks) if blocks else SCHEMA.empty_table()


def by_partition(table: pa.Table) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in table.to_pylist():
        out.setdefault(row["partition"], []).append(row)
    return {p: sorted(rows, key=lambda r: r["offset"]) for p, rows in sorted(out.items())}


def offsets(table: pa.Table) -> dict[int, list[int]]:
    return {p: [r["offset"] for r in rows] for p, rows in by_partition(table).items()}


# -- read_topic ---------------------------------------------------------------------------

def test_read_topic_gives_every_record_with_read_kafkas_schema_and_values(cluster):
    """read_topic(cluster, "plain") reads every committed record once, in blocks of exactly
    read_kafka's schema, with the keys (nulls too), values, timestamps, CreateTime as the
    confluent client numbers it (1), and headers with a repeated key kept in order."""
    ds = read_topic(cluster, "plain")
    assert ds.schema().base_schema == SCHEMA
    assert ds.count() == PARTS * PER_PART
    # topics as a list, as read_kafka takes them ("empty" adds nothing)
    got = by_partition(read_all(read_topic(cluster, ["plain", "empty"])))
    assert got == {p: [plain_record(p, i) for i in range(PER_PART)] for p in range(PARTS)}


def test_the_schema_is_exactly_read_kafkas_declared_one_even_when_empty(cluster):
    """SCHEMA equals Ray 2.60's KAFKA_MSG_SCHEMA; an empty topic and an empty range give a
    Dataset of that schema with no rows, and their read tasks still yield one block of
    exactly that schema."""
    kafka = pytest.importorskip("ray.data._internal.datasource.kafka_datasource")
    assert SCHEMA == kafka.KAFKA_MSG_SCHEMA
    assert [f.type for f in SCHEMA] == [
        pa.int64(), pa.binary(), pa.binary(), pa.string(), pa.int32(), pa.int64(),
        pa.int32(), pa.map_(pa.string(), pa.binary())]
    for ds in (read_topic(cluster, "empty"), read_topic(cluster, "plain", 7, 7)):
        assert ds.schema().base_schema == SCHEMA
        assert ds.count() == 0
    for ranges in (resolve_ranges(cluster, ["empty"], "earliest", "latest"),
                   [("plain", 1, 7, 7)]):
        source = TopicDatasource(cluster.namespace, ranges)
        for task in source.get_read_tasks(1):
            blocks = list(task())
            assert [(b.num_rows, b.schema == SCHEMA) for b in blocks] == [(0, True)]


def test_int_dict_and_datetime_offsets_are_resolved_and_the_end_is_exclusive(cluster):
    """start/end as ints, per-partition dicts (unlisted partitions: earliest/latest) and
    datetimes (the first record at or after them; naive is UTC) select exactly
    [start, end); an end past the high watermark is cut to it."""
    got = offsets(read_all(read_topic(cluster, "plain", 10, 25)))
    assert got == {p: list(range(10, 25)) for p in range(PARTS)}

    got = offsets(read_all(read_topic(cluster, "plain", {"plain": {0: 5, 2: "earliest"}},
                                      {"plain": {0: 7, 1: 50}})))
    assert got == {0: [5, 6], 1: list(range(50)), 2: list(range(PER_PART))}

    start = datetime.fromtimestamp((BASE + 9_500) / 1000, tz=timezone.utc)   # -> offset 10
    end = (start + timedelta(milliseconds=10_500)).replace(tzinfo=None)      # -> 20, naive
    ds = read_topic(cluster, "plain", start, end)
    got = by_partition(read_all(ds))
    assert {p: [r["offset"] for r in rows] for p, rows in got.items()} == {
        p: list(range(10, 20)) for p in range(PARTS)}
    assert all(r["timestamp"] >= BASE + 9_500 for rows in got.values() for r in rows)

    future = datetime.now(timezone.utc) + timedelta(days=1)
    assert read_topic(cluster, "plain", future).count() == 0            # nothing that new
    got = offsets(read_all(read_topic(cluster, "plain", {"plain": {1: 58}}, 10_000)))
    assert got == {0: list(range(PER_PART)), 1: [58, 59], 2: list(range(PER_PART))}


def test_a_partition_split_into_several_tasks_reads_each_record_once(cluster):
    """With max_records_per_task=7 each partition's 0..59 becomes 9 tasks of contiguous,
    non-overlapping ranges of at most 7 offsets; the Dataset holds every record exactly
    once."""
    ranges = resolve_ranges(cluster, ["plain"], "earliest", "latest")
    source = TopicDatasource(cluster.namespace, ranges, max_records_per_task=7)
    pieces = source.task_ranges()
    assert len(source.get_read_tasks(1)) == len(pieces) == PARTS * 9
    for p in range(PARTS):
        mine = [(s, e) for t, q, s, e in pieces if q == p]
        assert mine[0][0] == 0 and mine[-1][1] == PER_PART
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert all(0 < e - s <= 7 for s, e in mine)
    ds = read_topic(cluster, "plain", max_records_per_task=7)
    assert len(ds.input_files()) == PARTS * 9
    assert offsets(read_all(ds)) == {p: list(range(PER_PART)) for p in range(PARTS)}


def test_compressed_batches_and_log_append_time_are_read(cluster):
    """Batches produced with lz4, gzip and no compression decode to the values sent; a
    LogAppendTime topic reports timestamp_type 2 and the broker's timestamps."""
    admin = cluster.admin()
    admin.create_topic("comp", partitions=1)
    admin.create_topic("appended", partitions=1,
                       config={"message.timestamp.type": "LogAppendTime"})
    sent = []
    for codec in ("lz4", "gzip", None):
        values = [b"%s-%d-" % (str(codec).encode(), i) + b"x" * (i % 50) for i in range(80)]
        with cluster.producer(compression_type=codec) as producer:
            producer.send_batch("comp", values, keys=[b"k%d" % i for i in range(80)]
                                ).wait(timeout=60)
        sent += values
    table = read_all(read_topic(cluster, "comp"))
    assert [r["value"] for r in by_partition(table)[0]] == sent

    before = int(time.time() * 1000)
    with cluster.producer() as producer:
        producer.send_batch("appended", [b"a", b"b"], timestamps=[5, 6]).wait(timeout=60)
    rows = read_all(read_topic(cluster, "appended")).to_pylist()
    assert [r["timestamp_type"] for r in rows] == [2, 2]
    assert all(r["timestamp"] >= before for r in rows)


def test_partitions_restricts_the_read_to_the_partitions_named(cluster):
    """read_topic(partitions={topic: [p, ...]}) reads only those partitions of that topic,
    with their offset ranges; an unknown partition is UnknownTopicOrPartitionError and a
    malformed one IllegalArgumentError."""
    got = offsets(read_all(read_topic(cluster, "plain", {"plain": {1: 3}}, {"plain": {1: 9}},
                                      partitions={"plain": [1]})))
    assert got == {1: list(range(3, 9))}
    got = offsets(read_all(read_topic(cluster, ["plain", "empty"],
                                      partitions={"plain": [0, 2]})))
    assert got == {0: list(range(PER_PART)), 2: list(range(PER_PART))}
    with pytest.raises(UnknownTopicOrPartitionError, match=r"partition\(s\) \[7\]"):
        read_topic(cluster, "plain", partitions={"plain": [7]})
    for bad in ({"other": [0]}, {"plain": 0}, {"plain": ["0"]}, {"plain": [-1]}, [0]):
        with pytest.raises(IllegalArgumentError):
            read_topic(cluster, "plain", partitions=bad)


def test_read_topic_raises_typed_errors_for_bad_arguments(cluster):
    """Unknown topics or partitions, 'latest' as a start, a start after the end or past the
    high watermark, and bad options raise raykafka's typed errors on the driver."""
    with pytest.raises(UnknownTopicOrPartitionError):
        read_topic(cluster, "no-such-topic")
    with pytest.raises(UnknownTopicOrPartitionError):
        read_topic(cluster, "plain", {"plain": {9: 0}})
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", "latest")
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", end_offset="earliest")
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", 20, 10)
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", {"other": {0: 1}})
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", max_records_per_task=0)
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", trigger="continuous")
    with pytest.raises(OffsetOutOfRangeError):
        read_topic(cluster, "plain", PER_PART + 1)
    with pytest.raises(InvalidConfigurationError):
        read_topic(cluster, "plain", consumer_config={"fetch.max.bytes": 1})


# -- committed data only -------------------------------------------------------------------

def _hw_and_leo(cluster, topic):
    row = cluster.admin().describe_topic(topic)[0]
    return row["high_watermark"], row["log_end_offset"]


def test_reads_during_concurrent_produce_see_a_fixed_committed_prefix(cluster):
    """While a producer appends (acks=1, a replicated topic), each Dataset reads exactly
    offsets [0, end) with end between the leader's high watermark before and after the
    Dataset was created, and reading it again later gives the same records."""
    cluster.admin().create_topic("live", partitions=1, replication_factor=2)
    stop = threading.Event()

    def produce():
        with cluster.producer(acks=1, linger_ms=1) as producer:
            n = 0
            while not stop.is_set():
                values = [b"live-%d" % i for i in range(n, n + 50)]
                producer.send_batch("live", values).wait(timeout=60)
                n += 50

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        wait_until(lambda: _hw_and_leo(cluster, "live")[0] >= 200, timeout_s=60,
                   what="records in 'live'")
        for _ in range(2):
            hw_before, _ = _hw_and_leo(cluster, "live")
            ds = read_topic(cluster, "live")
            hw_after, _ = _hw_and_leo(cluster, "live")
            first = read_all(ds)
            end = first.num_rows
            assert hw_before <= end <= hw_after
            assert first.column("offset").to_pylist() == list(range(end))
            # one producer, no retries: offset i holds live-i
            assert first.column("value").to_pylist() == [b"live-%d" % i for i in range(end)]
            assert read_all(ds).to_pylist() == first.to_pylist()      # a fixed snapshot
    finally:
        stop.set()
        thread.join(timeout=60)


def test_records_above_the_high_watermark_are_not_read(cluster):
    """With the follower paused, records the leader took with acks=1 sit above the high
    watermark (log end > high watermark): read_topic reads exactly up to the high
    watermark and none of them; once the follower catches up, they are read."""
    row = cluster.admin().describe_topic("live")[0]
    follower = next(b for b in row["replicas"] if b != row["leader"])
    wait_until(lambda: len(cluster.admin().describe_topic("live")[0]["isr"]) == 2,
               timeout_s=60, what="both replicas in sync")
    hw0, leo0 = _hw_and_leo(cluster, "live")
    assert hw0 == leo0
    cluster.pause_broker(follower)
    try:
        uncommitted = [b"pending-%d" % i for i in range(20)]
        with cluster.producer(acks=1) as producer:
            producer.send_batch("live", uncommitted).wait(timeout=60)
        hw, leo = _hw_and_leo(cluster, "live")
        assert (hw, leo) == (hw0, leo0 + 20)
        table = read_all(read_topic(cluster, "live"))
        assert table.column("offset").to_pylist() == list(range(hw))
        assert not set(uncommitted) & set(table.column("value").to_pylist())
    finally:
        cluster.resume_broker(follower)
    wait_until(lambda: _hw_and_leo(cluster, "live")[0] == leo0 + 20, timeout_s=60,
               what="the high watermark to reach the log end")
    values = read_all(read_topic(cluster, "live", hw0)).column("value").to_pylist()
    assert values == uncommitted


# -- write_topic ---------------------------------------------------------------------------

def test_write_topic_round_trip_keeps_keys_values_headers_timestamps_and_partitions(cluster):
    """Rows written by write_topic (several blocks, so several tasks and producers) are read
    back by read_topic with their keys (null ones too), values, headers (a repeated key),
    timestamps, and explicit partitions; the returned counts are per partition."""
    cluster.admin().create_topic("out", partitions=3)
    n = 90
    table = pa.table({
        "value": [b"w%d" % i for i in range(n)],
        "key": [None if i % 3 == 0 else b"key%d" % (i % 10) for i in range(n)],
        "partition": pa.array([2 if i % 5 == 0 else None for i in range(n)], pa.int32()),
        "timestamp": [BASE + i for i in range(n)],
        "headers": pa.array([[("h", b"1"), ("h", b"2")] if i % 2 else [] for i in range(n)],
                            pa.map_(pa.string(), pa.binary())),
    })
    ds = ray.data.from_arrow([table.slice(0, 30), table.slice(30, 30), table.slice(60)])
    counts = write_topic(ds, cluster, "out")
    back = read_all(read_topic(cluster, "out"))
    assert sum(counts.values()) == n == back.num_rows
    assert counts == {p: len(rows) for p, rows in by_partition(back).items()}
    got = {r["value"]: r for r in back.to_pylist()}
    key_partition = {}
    for i, want in enumerate(table.to_pylist()):
        row = got[want["value"]]
        assert (row["key"], row["timestamp"], row["headers"]) == (
            want["key"], want["timestamp"], want["headers"])
        if want["partition"] is not None:
            assert row["partition"] == want["partition"]
        elif want["key"] is not None:
            assert key_partition.setdefault(want["key"], row["partition"]) == row["partition"]

    # strings are taken as UTF-8, and acks=0 still counts what was sent
    counts = write_topic(ray.data.from_items([{"value": "s%d" % i} for i in range(10)]),
                         cluster, "out", acks=0)
    assert sum(counts.values()) == 10
    wait_until(lambda: read_topic(cluster, "out").count() == n + 10, timeout_s=30,
               what="the acks=0 records")


def test_read_then_write_copies_a_topic(cluster):
    """write_topic(read_topic(...)) copies "plain" record for record: each lands on the
    partition it came from (the partition column), with its key, value, timestamp and
    headers."""
    cluster.admin().create_topic("copy", partitions=PARTS)
    counts = write_topic(read_topic(cluster, "plain"), cluster, "copy")
    assert counts == {p: PER_PART for p in range(PARTS)}
    copied = by_partition(read_all(read_topic(cluster, "copy")))

    def content(rows):
        return sorted((r["key"] or b"", r["value"], r["timestamp"], r["headers"])
                      for r in rows)

    for p in range(PARTS):
        assert content(copied[p]) == content(plain_record(p, i) for i in range(PER_PART))


def test_write_topic_raises_typed_errors(cluster):
    """A missing value column, columns of the wrong type, a negative partition, an unknown
    topic or partition, a bad acks and a non-Dataset raise raykafka's typed errors with
    messages that say what is wrong."""
    def ds(**columns):
        return ray.data.from_arrow(pa.table(columns))

    with pytest.raises(IllegalArgumentError, match="'value' column"):
        write_topic(ds(key=[b"k"]), cluster, "out")
    with pytest.raises(IllegalArgumentError, match="'value' must be binary or string"):
        write_topic(ds(value=[1, 2]), cluster, "out")
    with pytest.raises(IllegalArgumentError, match="'headers'"):
        write_topic(ds(value=[b"v"], headers=[b"x"]), cluster, "out")
    with pytest.raises(IllegalArgumentError, match="'partition' must be an integer"):
        write_topic(ds(value=[b"v"], partition=["0"]), cluster, "out")
    with pytest.raises(IllegalArgumentError, match="partition must be >= 0"):
        write_topic(ds(value=[b"v"], partition=[-1]), cluster, "out")
    with pytest.raises(UnknownTopicOrPartitionError):
        write_topic(ds(value=[b"v"]), cluster, "no-such-topic",
                    producer_config={"allow_auto_create_topics": False})
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 7"):
        write_topic(ds(value=[b"v"], partition=[7]), cluster, "out")
    with pytest.raises(InvalidConfigurationError):
        write_topic(ds(value=[b"v"]), cluster, "out", acks=2)
    with pytest.raises(IllegalArgumentError):
        write_topic(pa.table({"value": [b"v"]}), cluster, "out")


# -- Ray Data's own Kafka connector (confluent-kafka) on the brokers' listeners -------------

def _comparable(rows) -> list[dict]:
    """Rows by (topic, partition, offset), headers as a dict of their non-null values.
    read_kafka builds each record's headers with ``dict(msg.headers())`` (a repeated key
    keeps only its last value; read_topic keeps every one, in order) and its blocks with
    ``pa.Table.from_pylist``, which makes those dicts a struct of every key in the block
    (a record without a header gets it as None)."""
    return sorted(({**r, "headers": {k: v for k, v in dict(r["headers"] or {}).items()
                                     if v is not None}} for r in rows),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))


def test_ray_data_read_kafka_gives_the_same_rows_as_read_topic(cluster):
    """ray.data.read_kafka through cluster.bootstrap_servers reads exactly the rows that
    read_topic reads: the whole topic, an int range and a datetime start (keys, null keys,
    values, timestamps, CreateTime, headers)."""
    start = datetime.fromtimestamp((BASE + 9_500) / 1000, tz=timezone.utc)   # -> offset 10
    # (an int start past the empty topic's end is refused by both: not asked here)
    for topics, first, end, per_part in ((["plain", "empty"], "earliest", "latest", PER_PART),
                                         ("plain", 10, 25, 15),
                                         (["plain", "empty"], start, "latest", PER_PART - 10)):
        theirs = ray.data.read_kafka(topics, bootstrap_servers=cluster.bootstrap_servers,
                                     start_offset=first, end_offset=end)
        ours = read_all(read_topic(cluster, topics, first, end)).to_pylist()
        got = _comparable(theirs.take_all())
        assert len(got) == PARTS * per_part, (first, end)
        assert got == _comparable(ours), (first, end)


def test_dataset_write_kafka_rows_are_read_back_by_read_topic(cluster):
    """Dataset.write_kafka (confluent-kafka's producer) writes every row once to a
    2-partition topic, keyed by a column, values as JSON: read_topic reads each row once
    with its key, spread over both partitions."""
    import json

    admin = cluster.admin()
    admin.create_topic("from-ray", partitions=2)
    rows = [{"id": i, "name": f"n{i}"} for i in range(200)]
    ray.data.from_items(rows).write_kafka("from-ray", cluster.bootstrap_servers,
                                          key_field="name")
    got = read_all(read_topic(cluster, "from-ray")).to_pylist()
    assert sorted(json.loads(r["value"])["id"] for r in got) == list(range(200))
    assert all(r["key"] == b"n%d" % json.loads(r["value"])["id"] for r in got)
    assert {r["partition"] for r in got} == {0, 1}


# -- Ray Data's start (jobs/raydata_fix.py) -------------------------------------------------

def _limits_owner(answers):
    """What ResourceManager.get_global_limits reads of its instance, with a coordinator whose
    successive answers are ``answers``."""
    import types

    from ray.data._internal.execution.interfaces import ExecutionOptions
    from ray.data._internal.execution.resource_manager import ResourceManager
    answers = iter(answers)
    return types.SimpleNamespace(
        GLOBAL_LIMITS_UPDATE_INTERVAL_S=ResourceManager.GLOBAL_LIMITS_UPDATE_INTERVAL_S,
        _global_limits_last_update_time=0, _options=ExecutionOptions(),
        _get_total_resources=lambda: next(answers), _object_store_memory_limit_fraction=0.5)


def test_ray_data_asks_again_at_once_while_its_resource_limits_are_zero():
    """Ray Data's executor takes the cluster's resources as soon as its coordinator has
    answered: a limit of zero (no answer yet) is not kept for a second."""
    from ray.data._internal.execution.interfaces import ExecutionResources
    from ray.data._internal.execution.resource_manager import ResourceManager

    from jobs import raydata_fix
    assert raydata_fix.fix() and raydata_fix.fix()          # idempotent
    two = ExecutionResources(cpu=2, gpu=0, object_store_memory=1 << 30)
    owner = _limits_owner([ExecutionResources.zero(), two, ExecutionResources.zero()])
    assert ResourceManager.get_global_limits(owner).cpu == 0
    assert ResourceManager.get_global_limits(owner).cpu == 2       # asked again at once
    # once answered, the limits are kept for Ray Data's interval as before
    assert ResourceManager.get_global_limits(owner).cpu == 2


def test_reads_on_the_leaders_node_take_the_segment_files_not_a_broker(cluster):
    """On the leaders' node iter_range (what read_topic's tasks run) reads the segment
    files, so a reader whose consumer cannot reach any broker (an SSL listener asked for,
    none there) still gets every record of the range; with local_reads=False it fetches,
    and the same read fails typed. read_topic gives the same rows either way; a non-bool
    local_reads is an IllegalArgumentError."""
    no_broker = {"security_protocol": "SSL", "retries": 0, "default_api_timeout_ms": 5000}
    for p in range(PARTS):
        tables = list(iter_range(cluster.namespace, "plain", p, 3, PER_PART - 2,
                                 consumer_config=no_broker))
        values = [v for t in tables for v in t.column("value").to_pylist()]
        assert values == [b"p%d-%d" % (p, i) for i in range(3, PER_PART - 2)]
    with pytest.raises(BrokerNotAvailableError, match="SSL"):
        list(iter_range(cluster.namespace, "plain", 0, 0, PER_PART, consumer_config=no_broker,
                        local_reads=False))
    fetched = read_all(read_topic(cluster, "plain", local_reads=False))
    assert offsets(fetched) == {p: list(range(PER_PART)) for p in range(PARTS)}
    assert by_partition(read_all(read_topic(cluster, "plain"))) == by_partition(fetched)
    with pytest.raises(IllegalArgumentError):
        read_topic(cluster, "plain", local_reads="yes")


def test_a_read_past_its_timeout_returns_what_it_read(cluster, caplog):
    """timeout_ms=0: iter_range stops after its first table, from the files or fetched,
    with a warning naming the offset it reached."""
    for local in (True, False):
        caplog.clear()
        tables = list(iter_range(cluster.namespace, "plain", 0, 0, PER_PART, timeout_ms=0,
                                 fetch_max_bytes=64, local_reads=local))
        assert len(tables) == 1 and tables[0].num_rows < PER_PART, local
        assert "timed out" in caplog.text, local
