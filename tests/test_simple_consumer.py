"""SimpleConsumer against real PartitionReplica actors (FakeMetadata, one local Ray)."""

import shutil
import tempfile

import pytest

from actors.errors import (IllegalArgumentError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from actors.client.producer import Producer
from actors.client.simple_consumer import SimpleConsumer
from actors.types import Record
from client_fakes import FakeMetadata, client_ray  # noqa: F401 - client_ray: fixture


@pytest.fixture(scope="module")
def data_dir(client_ray):  # noqa: F811
    path = tempfile.mkdtemp(prefix="rk-simple-consumer-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def md(data_dir):
    fake = FakeMetadata(data_dir)
    yield fake
    fake.shutdown()


def fill(md, topic, partitions=2, n=300, log_config=None):
    """``n`` records per partition (values b"p<partition>-<i>", timestamps 1000 + i), sent
    in batches of 100."""
    md.create_topic(topic, partitions, log_config)
    with Producer(md) as producer:
        for p in range(partitions):
            for start in range(0, n, 100):
                producer.send_batch(topic, [b"p%d-%d" % (p, i) for i in range(start, start + 100)],
                                    partition=p,
                                    timestamps=list(range(1000 + start, 1100 + start))
                                    ).wait(timeout=30)


def test_fetch_returns_records_from_the_offset(md):
    """fetch returns Records (topic, partition set) starting exactly at the offset, even in
    the middle of a batch; at the high watermark it returns []; past it, or for an unknown
    topic or partition, a typed error."""
    fill(md, "f")
    consumer = SimpleConsumer(md)
    recs = consumer.fetch("f", 1, 150)
    assert recs and all(isinstance(r, Record) for r in recs)
    assert [r.offset for r in recs] == list(range(150, 300))
    assert recs[0] == Record("f", 1, 150, 1150, 0, None, b"p1-150", [])
    assert consumer.fetch("f", 1, 300) == []
    small = consumer.fetch("f", 0, 0, max_bytes=100)
    assert small and small[0].offset == 0 and len(small) <= 100  # one whole batch
    with pytest.raises(OffsetOutOfRangeError):
        consumer.fetch("f", 0, 301)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.fetch("nope", 0, 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.fetch("f", 5, 0)
    with pytest.raises(IllegalArgumentError):
        consumer.fetch("f", 0, -1)


def test_multifetch_reads_partitions_together(md):
    """multifetch answers every (topic, partition) request in one dict, each from its
    offset."""
    fill(md, "m", partitions=3, n=200)
    consumer = SimpleConsumer(md, value_deserializer=bytes.decode)
    got = consumer.multifetch([("m", 0, 0, 1 << 20), ("m", 1, 120, 1 << 20),
                               ("m", 2, 199, 1 << 20)])
    assert set(got) == {("m", 0), ("m", 1), ("m", 2)}
    assert [r.value for r in got[("m", 0)]] == ["p0-%d" % i for i in range(200)]
    assert [r.offset for r in got[("m", 1)]] == list(range(120, 200))
    assert [r.value for r in got[("m", 2)]] == ["p2-199"]
    with pytest.raises(OffsetOutOfRangeError):
        consumer.multifetch([("m", 0, 0, 1 << 20), ("m", 1, 999, 1 << 20)])


def test_offsets_before(md):
    """offsets_before: -1 is the high watermark, -2 the log start, a time gives segment
    start offsets at or before it, descending, at most max_offsets."""
    # the records carry 1970 timestamps (1000 + i): retention.ms=-1 keeps them from being
    # deleted as expired while the test reads them
    fill(md, "o", partitions=1, n=300, log_config={"segment.bytes": 2000, "retention.ms": -1})
    consumer = SimpleConsumer(md)
    assert consumer.offsets_before("o", 0, -1) == [300]
    assert consumer.offsets_before("o", 0, -2) == [0]
    many = consumer.offsets_before("o", 0, -1, max_offsets=100)
    assert many == sorted(many, reverse=True) and many[0] == 300 and many[-1] == 0
    assert len(many) >= 3
    mid = consumer.offsets_before("o", 0, 1150, max_offsets=100)
    assert mid == sorted(mid, reverse=True) and all(o <= 150 for o in mid) and mid[-1] == 0
    assert consumer.offsets_before("o", 0, 500) == []
    assert len(consumer.offsets_before("o", 0, -1, max_offsets=2)) == 2
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.offsets_before("nope", 0, -1)


def test_fetch_follows_a_new_leader(md):
    """After the leader is demoted and a new one elected, fetch gets NotLeaderForPartition,
    refreshes the metadata, and reads the same records from the new leader."""
    fill(md, "l", partitions=1, n=100)
    consumer = SimpleConsumer(md, retry_backoff_ms=10)
    before = consumer.fetch("l", 0, 0)
    md.demote_leader("l", 0, stale=True)    # the metadata still names the old leader
    md.elect("l", 0, deferred=True)          # ... until the client invalidates it
    invalidations = md.invalidations
    assert consumer.fetch("l", 0, 0) == before
    assert md.invalidations == invalidations + 1


def test_columns_match_records(md):
    """fetch_columns, multifetch_columns and iter_columns return the same records as fetch,
    as pyarrow tables starting at the offset."""
    fill(md, "c", partitions=2, n=300)
    consumer = SimpleConsumer(md)
    table = consumer.fetch_columns("c", 0, 42)
    recs = consumer.fetch("c", 0, 42)
    assert table.column("offset").to_pylist() == [r.offset for r in recs]
    assert table.column("value").to_pylist() == [r.value for r in recs]
    tables = consumer.multifetch_columns([("c", 1, 7, 1 << 20)])
    assert tables[("c", 1)].column("offset").to_pylist() == list(range(7, 300))
    seen = {0: [], 1: []}
    for p, t in consumer.iter_columns("c", max_bytes=1000, start_offsets={1: 250},
                                      end_offsets={0: 120}):
        seen[p] += t.column("value").to_pylist()
    assert seen[0] == [b"p0-%d" % i for i in range(120)]
    assert seen[1] == [b"p1-%d" % i for i in range(250, 300)]


def test_count_records_asks_the_leader_replica_without_reading(md):
    """count_records(topic, partition, start, end) is the number of records fetching that
    range gives (ranges cut mid-batch included); None past max_batches; an end past the
    high watermark or a bad argument is a typed error."""
    fill(md, "counted", partitions=2, n=300)
    consumer = SimpleConsumer(md)
    assert consumer.count_records("counted", 0, 0, 300) == 300
    assert consumer.count_records("counted", 1, 150, 251) == 101
    assert consumer.count_records("counted", 1, 7, 7) == 0
    assert consumer.count_records("counted", 0, 0, 300, max_batches=2) is None
    with pytest.raises(OffsetOutOfRangeError):
        consumer.count_records("counted", 0, 0, 301)
    with pytest.raises(IllegalArgumentError):
        consumer.count_records("counted", 0, 5, 4)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.count_records("counted", 9, 0, 1)


def _local(consumer, *args, **kwargs):
    """(values read, the offset iter_local_columns returned)."""
    gen = consumer.iter_local_columns(*args, **kwargs)
    values = []
    while True:
        try:
            values += next(gen).column("value").to_pylist()
        except StopIteration as done:
            return values, done.value


def test_iter_local_columns_reads_the_leaders_segment_files_as_a_fetch_would(md):
    """On the leader replica's node, iter_local_columns gives the records of [start, end)
    from the replica's files (cut mid-batch at both ends, across segments, with reads
    smaller than a batch) and returns end; a range past the high watermark stops at it."""
    fill(md, "local", partitions=2, n=300, log_config={"segment.bytes": 2048,
                                                       "retention.ms": -1})
    consumer = SimpleConsumer(md)
    assert len(consumer._call_replica("local", 0, "file_ranges", 0, 300)["ranges"]) > 1
    assert _local(consumer, "local", 1, 150, 251) == ([b"p1-%d" % i for i in range(150, 251)],
                                                      251)
    for max_bytes in (10, 700, 1 << 20):
        assert _local(consumer, "local", 0, 0, 300, max_bytes=max_bytes) == \
            ([b"p0-%d" % i for i in range(300)], 300)
    assert _local(consumer, "local", 0, 290, 10_000) == ([b"p0-%d" % i for i in range(290, 300)],
                                                         300)
    assert _local(consumer, "local", 0, 7, 7) == ([], 7)


def test_iter_local_columns_stops_where_the_files_do_not_hold_what_the_replica_said(md):
    """Without an error, iter_local_columns reads nothing and returns its start when the
    leader is on another node, the file is gone, or the batch is not where the replica
    said (a segment compacted or deleted since): the caller fetches instead."""
    fill(md, "moved", partitions=1, n=300)
    consumer = SimpleConsumer(md)
    real = consumer._call_replica("moved", 0, "file_ranges", 100, 200)
    path, position, size, base = real["ranges"][0]

    def answering(**change):
        def call(topic, partition, method, *args):
            answer = dict(real)
            ranges = [list(r) for r in real["ranges"]]
            for i, value in change.pop("range", {}).items():
                ranges[0][i] = value
            answer.update(change, ranges=[tuple(r) for r in ranges])
            return answer
        return call

    for change in ({"node_id": "another node"}, {"range": {0: path + ".deleted"}},
                   {"range": {1: position + 1}}, {"range": {3: base + 100}}):
        consumer._call_replica = answering(**change)
        assert _local(consumer, "moved", 0, 100, 200) == ([], 100), change
    with pytest.raises(IllegalArgumentError):
        next(consumer.iter_local_columns("moved", 0, -1, 5))
