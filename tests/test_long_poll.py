"""Long poll from the client side: SimpleConsumer.fetch / multifetch and Consumer.poll hand
max_wait_ms / min_bytes to the leader's fetch and wait for its answer instead of polling.
The leader is a small fake actor with the replica's fetch signature (a Condition woken on
append); no brokers, ZooKeeper or real replicas."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from actors.client.consumer import Consumer
from actors.client.metadata import LeaderRef
from actors.client.simple_consumer import SimpleConsumer
from actors.errors import IllegalArgumentError, UnknownTopicOrPartitionError
from actors.protocol import FetchResult
from client_fakes import ray, start_ray, stop_ray
from storage.records import build


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # the fake leaders below are shipped by value: Ray's workers cannot import this module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    start_ray()
    yield
    stop_ray()


class LongPollLeader:
    """A partition leader with Kafka's long poll: ``fetch`` waits up to ``max_wait_ms``
    until ``min_bytes`` are readable past ``offset``; ``append`` wakes waiters. Counts its
    fetches and records the long-poll arguments each carried."""

    def __init__(self):
        self.batches: list[tuple[int, bytes]] = []   # (base_offset, batch bytes)
        self.end = 0
        self.cond = threading.Condition()
        self.calls: list[tuple[int, int]] = []

    def append(self, values: list) -> int:
        with self.cond:
            data = build(values, [None] * len(values), [1000] * len(values),
                         base_offset=self.end)
            self.batches.append((self.end, data))
            self.end += len(values)
            self.cond.notify_all()
            return self.end

    def _readable(self, offset: int) -> bytes:
        return b"".join(d for base, d in self.batches if base >= offset)

    def fetch(self, offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
              min_bytes: int = 1) -> FetchResult:
        deadline = time.monotonic() + max_wait_ms / 1000
        with self.cond:
            self.calls.append((max_wait_ms, min_bytes))
            while len(self._readable(offset)) < min_bytes and time.monotonic() < deadline:
                self.cond.wait(max(deadline - time.monotonic(), 0))
            return FetchResult(self._readable(offset), self.end, 0, self.end)

    def list_offsets(self, time_ms: int, max_offsets: int = 1) -> list:
        with self.cond:
            return [0 if time_ms == -2 else self.end]

    def fetch_calls(self) -> list:
        with self.cond:
            return list(self.calls)


class ShortPollLeader:
    """A leader that predates long poll: ``fetch(offset, max_bytes)`` answers at once."""

    def __init__(self):
        self.n = 0

    def fetch(self, offset: int, max_bytes: int = 1 << 20) -> FetchResult:
        self.n += 1
        data = build([b"old"], [None], [1000], base_offset=0) if offset == 0 else b""
        return FetchResult(data, 1, 0, 1)

    def list_offsets(self, time_ms: int, max_offsets: int = 1) -> list:
        return [0 if time_ms == -2 else 1]

    def count(self) -> int:
        return self.n


class OnePartition:
    """Metadata for topic "t" with partitions whose leaders are the given actors."""

    def __init__(self, *handles):
        self.handles = list(handles)
        self.metadata = self                  # a Consumer takes a cluster: this is both

    def partitions_for(self, topic):
        if topic != "t":
            raise UnknownTopicOrPartitionError(topic)
        return list(range(len(self.handles)))

    def leader(self, topic, partition):
        return LeaderRef(self.handles[partition], 0, 0)

    def invalidate(self, topic=None):
        pass


def leader_actor(cls=LongPollLeader):
    handle = ray.remote(cls).options(max_concurrency=8).remote()
    ray.get(handle.list_offsets.remote(-1), timeout=60)
    return handle


def append_later(handle, values, delay_s: float) -> threading.Thread:
    def run():
        time.sleep(delay_s)
        ray.get(handle.append.remote(values), timeout=30)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_fetch_with_max_wait_returns_when_a_record_arrives():
    """SimpleConsumer.fetch(max_wait_ms=5000) on an empty partition is answered as soon as
    a record is appended (well before the wait is over), and the leader got the wait and
    min_bytes; without max_wait_ms the request carries no long-poll arguments."""
    leader = leader_actor()
    consumer = SimpleConsumer(OnePartition(leader))
    assert consumer.fetch("t", 0, 0) == []
    writer = append_later(leader, [b"hello"], 0.3)
    t0 = time.monotonic()
    got = consumer.fetch("t", 0, 0, max_wait_ms=5000, min_bytes=1)
    elapsed = time.monotonic() - t0
    writer.join()
    assert [r.value for r in got] == [b"hello"]
    assert 0.25 <= elapsed < 3.0, elapsed
    assert ray.get(leader.fetch_calls.remote()) == [(0, 1), (5000, 1)]


def test_the_ray_timeout_covers_the_leaders_wait():
    """A long poll that the leader holds longer than request_timeout_ms is not cut short by
    the client: the call's timeout is request_timeout_ms plus max_wait_ms."""
    leader = leader_actor()
    consumer = SimpleConsumer(OnePartition(leader), request_timeout_ms=200, retries=0)
    t0 = time.monotonic()
    assert consumer.fetch("t", 0, 0, max_wait_ms=800) == []
    assert time.monotonic() - t0 >= 0.75


def test_multifetch_passes_the_wait_to_every_leader():
    """multifetch(max_wait_ms=...) long-polls each partition's leader; a partition that
    receives a record answers with it."""
    a, b = leader_actor(), leader_actor()
    consumer = SimpleConsumer(OnePartition(a, b))
    writer = append_later(b, [b"x", b"y"], 0.2)
    got = consumer.multifetch([("t", 0, 0, 1 << 20), ("t", 1, 0, 1 << 20)], max_wait_ms=1500)
    writer.join()
    assert got[("t", 0)] == [] and [r.value for r in got[("t", 1)]] == [b"x", b"y"]
    assert ray.get(a.fetch_calls.remote()) == [(1500, 1)]


def test_bad_wait_arguments_are_typed_errors():
    """A negative max_wait_ms or min_bytes, or a non-int, raises IllegalArgumentError."""
    consumer = SimpleConsumer(OnePartition(leader_actor()))
    for kwargs in ({"max_wait_ms": -1}, {"min_bytes": -1}, {"max_wait_ms": 1.5}):
        with pytest.raises(IllegalArgumentError):
            consumer.fetch("t", 0, 0, **kwargs)


def test_consumer_poll_waits_at_the_leader_not_in_a_client_loop():
    """poll(timeout_ms=6000) on an idle partition sends about one fetch per
    fetch_max_wait_ms (not one every few ms) and returns the record soon after its append
    (at 1.5 s), long before its own timeout."""
    leader = leader_actor()
    consumer = Consumer(OnePartition(leader), fetch_max_wait_ms=1000)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    writer = append_later(leader, [b"late"], 1.5)
    t0 = time.monotonic()
    got = consumer.poll(timeout_ms=6000)
    elapsed = time.monotonic() - t0
    writer.join()
    assert [r.value for r in got[("t", 0)]] == [b"late"]
    assert 1.4 <= elapsed < 5.0, elapsed
    calls = ray.get(leader.fetch_calls.remote())
    # one long poll per fetch_max_wait_ms that passed (a client loop would make dozens)
    assert 2 <= len(calls) <= int(elapsed) + 2 and calls[0] == (1000, 1), (elapsed, calls)


def test_consumer_poll_with_nothing_to_read_waits_at_most_its_timeout():
    """An idle poll(timeout_ms=300) returns {} after about 300 ms, its fetch asked to wait
    min(timeout_ms, fetch_max_wait_ms)."""
    leader = leader_actor()
    consumer = Consumer(OnePartition(leader))
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    t0 = time.monotonic()
    assert consumer.poll(timeout_ms=300) == {}
    assert 0.25 <= time.monotonic() - t0 < 1.5
    assert ray.get(leader.fetch_calls.remote())[0][0] <= 300


def test_consumer_returns_as_soon_as_one_partition_has_records():
    """With two partitions, a record on one ends the poll at once; the other's waiting
    fetch stays in flight (it is not sent again by the next poll while it waits)."""
    a, b = leader_actor(), leader_actor()
    consumer = Consumer(OnePartition(a, b), fetch_max_wait_ms=2000)
    consumer.assign([("t", 0), ("t", 1)])
    consumer.seek(("t", 0), 0)
    consumer.seek(("t", 1), 0)
    writer = append_later(b, [b"b0"], 0.2)
    t0 = time.monotonic()
    got = consumer.poll(timeout_ms=5000)
    writer.join()
    assert list(got) == [("t", 1)] and time.monotonic() - t0 < 1.5
    writer = append_later(b, [b"b1"], 0.2)
    got = consumer.poll(timeout_ms=5000)
    writer.join()
    assert [r.value for r in got[("t", 1)]] == [b"b1"]
    assert len(ray.get(a.fetch_calls.remote())) == 1, "partition 0's fetch was still waiting"


def test_consumer_works_with_a_leader_without_long_poll():
    """A leader whose fetch takes no max_wait_ms is asked without it; poll still returns
    its records and does not spin while idle."""
    leader = leader_actor(ShortPollLeader)
    consumer = Consumer(OnePartition(leader))
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    assert [r.value for r in consumer.poll(timeout_ms=2000)[("t", 0)]] == [b"old"]
    assert consumer.poll(timeout_ms=500) == {}
    assert ray.get(leader.count.remote()) <= 15


def test_consumer_rejects_a_negative_fetch_max_wait_ms():
    """fetch_max_wait_ms and fetch_min_bytes must be ints >= 0."""
    from actors.errors import InvalidConfigurationError
    with pytest.raises(InvalidConfigurationError):
        Consumer(OnePartition(), fetch_max_wait_ms=-5)
    with pytest.raises(InvalidConfigurationError):
        Consumer(OnePartition(), fetch_min_bytes="1")


def test_a_real_replica_answers_a_long_poll_when_a_record_is_committed(tmp_path):
    """Against a real PartitionReplica (the leader of a one-replica ISR), a fetch with
    max_wait_ms=5000 returns the record a producer appends meanwhile, well before the wait
    is over."""
    from actors.client.producer import Producer
    from client_fakes import FakeMetadata
    md = FakeMetadata(str(tmp_path))
    try:
        md.create_topic("real", 1)
        consumer = SimpleConsumer(md)

        def produce_later():
            time.sleep(0.3)
            with Producer(md) as producer:
                producer.send("real", b"committed", partition=0).get(timeout=30)

        writer = threading.Thread(target=produce_later, daemon=True)
        writer.start()
        t0 = time.monotonic()
        got = consumer.fetch("real", 0, 0, max_wait_ms=5000)
        elapsed = time.monotonic() - t0
        writer.join()
        assert [r.value for r in got] == [b"committed"]
        assert elapsed < 4.0, elapsed
    finally:
        md.shutdown()
