"""The seed's stream API (create_message_streams, create_message_streams_by_filter): pure
tests of the partition -> stream mapping and of topic filters, then a real cluster
(ZooKeeper, local Ray, RF=3 __consumer_offsets), one for the whole module."""

from __future__ import annotations

import random
import threading
import time

import pytest

from actors import Cluster
from actors.client.assignors import Subscription, range_threads
from actors.client.streams import TopicFilter, stream_mapping
from actors.errors import IllegalArgumentError, IllegalStateError
from cluster_helpers import FAST_CONFIG, unique_namespace, wait_until, zk_client, zk_json
from cluster_helpers import local_ray  # noqa: F401 - autouse: this module's Ray

CONFIG = {**FAST_CONFIG, "offsets.topic.num.partitions": 2,
          "offsets.topic.replication.factor": 3, "group.initial.rebalance.delay.ms": 0,
          "group.min.session.timeout.ms": 1000}
SESSION_MS = 3000


# -- pure: the mapping and the filters ----------------------------------------------------------

def test_two_streams_over_five_partitions_is_the_seeds_range_split():
    """5 partitions over 2 streams: stream 0 takes 0-2 and stream 1 takes 3-4 (seed 004's
    range split, the first stream takes the extra partition), per topic."""
    tps = [("a", p) for p in range(5)] + [("b", p) for p in (4, 7)]
    got = stream_mapping(tps, {"a": 2, "b": 3})
    assert [got[("a", p)] for p in range(5)] == [0, 0, 0, 1, 1]
    assert got[("b", 4)] == 0 and got[("b", 7)] == 1     # 2 partitions over 3 streams


def test_every_partition_feeds_exactly_one_stream_in_balanced_contiguous_ranges():
    """Random assignments: every partition maps to one stream in range, stream sizes of a
    topic differ by at most one, and each stream holds a contiguous run of the sorted
    partitions."""
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 6)
        tps = {(t, p) for t in "xyz" for p in rng.sample(range(40), rng.randint(0, 12))}
        mapping = stream_mapping(sorted(tps, key=lambda _: rng.random()), n)
        assert set(mapping) == tps
        for t in "xyz":
            parts = sorted(p for (tt, p) in tps if tt == t)
            streams = [mapping[(t, p)] for p in parts]
            assert streams == sorted(streams)                  # contiguous, in order
            sizes = [streams.count(s) for s in range(n)]
            assert all(0 <= s < n for s in streams)
            assert max(sizes) - min(sizes) <= 1


def test_the_mapping_is_the_range_assignors_consumer_thread():
    """With the range assignor, a member's local mapping names exactly the consumer thread
    the group assigned each partition to (range_threads), for random groups."""
    rng = random.Random(11)
    for _ in range(200):
        members = {f"m{i}": Subscription(("t",), streams={"t": rng.randint(1, 4)})
                   for i in range(rng.randint(1, 4))}
        threads = range_threads(members, {"t": rng.randint(0, 20)})
        for member, sub in members.items():
            mine = [tp for (m, _), tps in threads.items() if m == member for tp in tps]
            mapping = stream_mapping(mine, sub.streams["t"])
            for (m, i), tps in threads.items():
                if m == member:
                    assert all(mapping[tp] == i for tp in tps)


def test_topic_filters_follow_kafkas_rules():
    """Whitelist: commas mean "or", spaces and quotes dropped, the whole name must match;
    blacklist: everything else; internal topics never match; a bad regex is refused."""
    white = TopicFilter(whitelist=" 'logs-.*, metrics' ")
    assert white.matches("logs-a") and white.matches("metrics")
    assert not white.matches("xlogs-a") and not white.matches("metrics2")
    assert (white.pattern, white.regex) == ("white_list", "logs-.*|metrics")
    black = TopicFilter(blacklist="tmp.*")
    assert black.matches("orders") and not black.matches("tmp1")
    assert not black.matches("__consumer_offsets")
    assert (black.pattern, black.regex) == ("black_list", "tmp.*")
    assert not TopicFilter().matches("__consumer_offsets") and TopicFilter().matches("x")
    with pytest.raises(IllegalArgumentError):
        TopicFilter(whitelist="(")


class _FakeConsumer:
    config = {"max_poll_records": 2, "consumer_timeout_ms": 0}


def _rec(topic, partition, offset):
    from actors.types import Record
    return Record(topic, partition, offset, 0, 0, None, b"v", [])


def test_a_remap_drops_what_left_and_rereads_what_changed_stream():
    """StreamFeeder.remap (no cluster): queued records of a partition that leaves are
    dropped, a partition that moves to another stream is re-read from its first queued
    offset, the rest stay queued; handed-out marks survive only for assigned partitions;
    an empty stream with consumer_timeout_ms=0 stops at once."""
    from actors.client.streams import StreamFeeder
    feeder = StreamFeeder(_FakeConsumer(), {"t": 2})
    assert feeder.remap([("t", p) for p in range(4)]) == {}       # 0,1 -> s0; 2,3 -> s1
    feeder._distribute({("t", p): [_rec("t", p, o) for o in range(10, 13)] for p in range(4)})
    [s0, s1] = feeder.streams
    assert next(s0).offset == 10 and next(s1).offset == 10        # t-0@10, t-2@10 out
    assert feeder.take_marks() == {("t", 0): 11, ("t", 2): 11}
    # t-0 leaves: 1 stays in s0, 2 moves to s0 (1,2 -> s0; 3 -> s1), 3 stays in s1
    rewind = feeder.remap([("t", 1), ("t", 2), ("t", 3)])
    assert rewind == {("t", 2): 11}
    assert feeder.take_marks() == {("t", 2): 11}
    assert [(r.partition, r.offset) for r in iter(s0)] == [(1, 10), (1, 11), (1, 12)]
    assert [(r.partition, r.offset) for r in iter(s1)] == [(3, 10), (3, 11), (3, 12)]
    assert [s.partitions() for s in feeder.streams] == [[("t", 1), ("t", 2)], [("t", 3)]]


# -- the real cluster -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("strm"), config=CONFIG)
    yield c
    c.shutdown()


def group_consumer(cluster, group, **kw):
    conf = dict(group_id=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=300, max_poll_records=20)
    conf.update(kw)
    return cluster.consumer(**conf)


def produce(cluster, topic, partitions, per_partition, prefix=b"r"):
    with cluster.producer() as producer:
        futures = [producer.send(topic, b"%s-%d-%d" % (prefix, p, i), partition=p)
                   for p in partitions for i in range(per_partition)]
        for f in futures:
            f.get(timeout=60)


def drain(streams, want: int, *, timeout_s: float = 60.0, until=None) -> list[list]:
    """Read every stream on its own thread until ``want`` records arrived in all (or,
    with ``until``, until ``until(records so far)`` is true)."""
    until = until or (lambda recs: len(recs) >= want)
    got = [[] for _ in streams]
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + timeout_s

    def run(i, stream):
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                rec = next(stream)
            except StopIteration:
                continue                      # consumer_timeout_ms: look again
            with lock:
                got[i].append(rec)
                if until([r for recs in got for r in recs]):
                    stop.set()

    threads = [threading.Thread(target=run, args=(i, s), daemon=True)
               for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s + 5)
    assert until([r for recs in got for r in recs]), f"only {sum(map(len, got))} records"
    return got


def test_create_message_streams_splits_five_partitions_three_and_two(cluster):
    """The issue's stream test: 2 streams over 5 partitions give 3 + 2 (stream 0 reads
    partitions 0-2, stream 1 reads 3-4, each record once and in order per partition),
    and ZooKeeper shows the seed's registry: subscription {topic: 2}, pattern "static",
    owners "<consumer_id>-<thread>"."""
    cluster.admin().create_topic("five", partitions=5, replication_factor=1)
    produce(cluster, "five", range(5), 8)
    consumer = group_consumer(cluster, "five-g", consumer_timeout_ms=200)
    try:
        streams = consumer.create_message_streams({"five": 2})
        assert list(streams) == ["five"] and len(streams["five"]) == 2
        got = drain(streams["five"], 40)
        assert {r.partition for r in got[0]} == {0, 1, 2}
        assert {r.partition for r in got[1]} == {3, 4}
        for recs in got:
            for p in {r.partition for r in recs}:
                offsets = [r.offset for r in recs if r.partition == p]
                assert offsets == list(range(8))
        assert [s.partitions() for s in streams["five"]] == [
            [("five", 0), ("five", 1), ("five", 2)], [("five", 3), ("five", 4)]]
        zk = zk_client(cluster)
        try:
            cid = consumer.consumer_id
            reg = wait_until(lambda: zk_json(zk, f"/consumers/five-g/ids/{cid}"),
                             what="the consumer's registration")
            assert reg["version"] == 1 and reg["subscription"] == {"five": 2}
            assert reg["pattern"] == "static" and reg["timestamp"].isdigit()

            def owners():
                return {p: zk.get(f"/consumers/five-g/owners/five/{p}")[0].decode()
                        for p in range(5)}
            want = {0: f"{cid}-0", 1: f"{cid}-0", 2: f"{cid}-0", 3: f"{cid}-1", 4: f"{cid}-1"}
            wait_until(lambda: owners() == want, what="owner nodes with thread ids")
        finally:
            zk.stop()
            zk.close()
    finally:
        consumer.close()


def test_consumer_timeout_ends_an_idle_stream(cluster):
    """With consumer_timeout_ms, a stream with nothing to read raises StopIteration after
    that long (not before), and can be iterated again once records arrive."""
    cluster.admin().create_topic("idle", partitions=1, replication_factor=1)
    consumer = group_consumer(cluster, "idle-g", consumer_timeout_ms=700)
    try:
        [stream] = consumer.create_message_streams({"idle": 1})["idle"]
        started = time.monotonic()
        assert list(stream) == []
        assert 0.7 <= time.monotonic() - started < 15
        produce(cluster, "idle", [0], 3)
        seen = wait_until(lambda: list(stream), timeout_s=30, what="records after the timeout")
        assert [r.value for r in seen] == [b"r-0-0", b"r-0-1", b"r-0-2"]
    finally:
        consumer.close()


def test_streams_and_subscribe_poll_assign_exclude_each_other(cluster):
    """A consumer either subscribes/polls or feeds streams: each mix is refused with
    IllegalStateError, and streams are created once per consumer."""
    cluster.admin().create_topic("excl", partitions=1, replication_factor=1)
    sub = group_consumer(cluster, "excl-g")
    streams = group_consumer(cluster, "excl-h")
    try:
        sub.subscribe(["excl"])
        with pytest.raises(IllegalStateError, match="subscription"):
            sub.create_message_streams({"excl": 1})
        streams.create_message_streams({"excl": 1})
        for call in (lambda: streams.subscribe(["excl"]), lambda: streams.poll(),
                     lambda: streams.assign([("excl", 0)]), lambda: next(iter(streams)),
                     lambda: streams.create_message_streams_by_filter("excl")):
            with pytest.raises(IllegalStateError):
                call()
        with pytest.raises(IllegalArgumentError):
            group_consumer(cluster, "excl-i").create_message_streams({"excl": 0})
    finally:
        sub.close()
        streams.close()


def test_commits_count_what_the_streams_handed_out(cluster):
    """commit() writes the offset after the last record a stream returned, not what the
    feeder queued ahead; a new consumer of the group resumes right there."""
    cluster.admin().create_topic("handed", partitions=1, replication_factor=1)
    produce(cluster, "handed", [0], 60)
    consumer = group_consumer(cluster, "handed-g", enable_auto_commit=False,
                              max_poll_records=100)
    try:
        [stream] = consumer.create_message_streams({"handed": 1})["handed"]
        first = [next(stream) for _ in range(10)]
        assert [r.offset for r in first] == list(range(10))
        # the feeder has fetched (far) beyond what was handed out
        wait_until(lambda: consumer.position(("handed", 0)) == 60, what="the feeder's fetch")
        consumer.commit()
        assert consumer.committed(("handed", 0)) == 10
    finally:
        consumer.close()
    again = group_consumer(cluster, "handed-g", enable_auto_commit=False)
    try:
        [stream] = again.create_message_streams({"handed": 1})["handed"]
        assert next(stream).offset == 10
    finally:
        again.close()


def test_filter_streams_pick_up_new_topics_and_honour_the_blacklist(cluster):
    """create_message_streams_by_filter: a whitelist's streams read a matching topic
    created after the call (and none of the others), registered as pattern "white_list";
    a blacklist's streams read every other topic, registered as "black_list"."""
    admin = cluster.admin()
    admin.create_topic("flt-a", partitions=2, replication_factor=1)
    admin.create_topic("other-x", partitions=1, replication_factor=1)
    produce(cluster, "flt-a", range(2), 5)
    produce(cluster, "other-x", [0], 5)
    white = group_consumer(cluster, "flt-w", consumer_timeout_ms=200)
    black = group_consumer(cluster, "flt-b", consumer_timeout_ms=200)
    try:
        ws = white.create_message_streams_by_filter(whitelist="flt-.*", n_streams=2)
        bs = black.create_message_streams_by_filter(blacklist="flt-.*")
        got = drain(ws, 10)
        assert {r.topic for s in got for r in s} == {"flt-a"}
        assert [{r.partition for r in s} for s in got] == [{0}, {1}]
        admin.create_topic("flt-b", partitions=1, replication_factor=1)
        produce(cluster, "flt-b", [0], 4)
        later = drain(ws, 4)
        assert sorted(r.value for s in later for r in s) == [b"r-0-%d" % i for i in range(4)]
        assert {r.topic for s in later for r in s} == {"flt-b"}
        # the blacklist reads every other topic (this module's earlier ones too)
        seen = drain(bs, 0, until=lambda recs: sum(r.topic == "other-x" for r in recs) == 5)
        topics = {r.topic for s in seen for r in s}
        assert "other-x" in topics and not any(t.startswith("flt-") for t in topics)
        zk = zk_client(cluster)
        try:
            regs = {g: wait_until(lambda g=g, c=c: zk_json(
                zk, f"/consumers/{g}/ids/{c.consumer_id}"), what=f"{g}'s registration")
                for g, c in (("flt-w", white), ("flt-b", black))}
        finally:
            zk.stop()
            zk.close()
        assert (regs["flt-w"]["pattern"], regs["flt-w"]["subscription"]) == (
            "white_list", {"flt-.*": 2})
        assert (regs["flt-b"]["pattern"], regs["flt-b"]["subscription"]) == (
            "black_list", {"flt-.*": 1})
    finally:
        white.close()
        black.close()


def test_a_rebalance_remaps_the_streams(cluster):
    """One consumer with 2 streams owns 4 partitions (2 per stream); when a second joins
    the range assignor gives each of the 4 consumer threads one partition: the streams
    are remapped, disjoint across the consumers, and every record produced afterwards
    arrives on the stream that owns its partition."""
    cluster.admin().create_topic("remap", partitions=4, replication_factor=1)
    a = group_consumer(cluster, "remap-g", consumer_timeout_ms=200)
    b = group_consumer(cluster, "remap-g", consumer_timeout_ms=200)
    try:
        sa = a.create_message_streams({"remap": 2})["remap"]
        wait_until(lambda: [s.partitions() for s in sa] == [
            [("remap", 0), ("remap", 1)], [("remap", 2), ("remap", 3)]],
            what="a alone: two partitions per stream")
        sb = b.create_message_streams({"remap": 2})["remap"]
        # the range assignor over the sorted member ids decides which consumer comes first
        wait_until(lambda: sorted(tuple(s.partitions()) for s in sa + sb) == [
            (("remap", p),) for p in range(4)], timeout_s=60,
            what="one partition per consumer thread")
        owner = {s.partitions()[0][1]: i for i, s in enumerate(sa + sb)}
        produce(cluster, "remap", range(4), 5, prefix=b"after")
        got = drain(sa + sb, 20)
        after = [[r for r in recs if r.value.startswith(b"after")] for recs in got]
        assert sum(map(len, after)) == 20
        for i, recs in enumerate(after):
            assert all(owner[r.partition] == i for r in recs)
    finally:
        a.close()
        b.close()
