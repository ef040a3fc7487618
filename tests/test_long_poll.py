"""Long poll from the client side: SimpleConsumer.fetch / multifetch and Consumer.poll send
max_wait_ms / min_bytes in their Fetch requests and wait for the broker's answer instead of
polling. Each leader is a broker's real Kafka listener (KafkaApis and its purgatory) in this
process over a small in-memory partition log that wakes parked fetches on append; no Ray,
ZooKeeper or replicas (but the last test, against a real replica actor)."""

from __future__ import annotations

import threading
import time

import pytest

from actors.client.consumer import Consumer
from actors.client.simple_consumer import SimpleConsumer
from actors.errors import IllegalArgumentError
from actors.protocol import FetchResult
from client_fakes import ScriptedBackend, WireBroker, WireMetadata
from client_fakes import client_ray  # noqa: F401 - fixture (one test uses Ray)
from storage.records import build


class LogBackend(ScriptedBackend):
    """Topic "t"'s partitions as in-memory logs (what one broker leads): ``fetch`` answers
    what is readable past the offset; ``append`` adds a batch and wakes the fetches parked
    on the partition (``notify``, set by WireBroker)."""

    def __init__(self, partitions: int = 2):
        super().__init__(partitions, fetch=self._read, list_offsets=self._offset)
        self.logs = {p: [] for p in range(partitions)}     # [(base_offset, batch bytes)]
        self.ends = dict.fromkeys(range(partitions), 0)
        self.lock = threading.Lock()
        self.notify = None

    def append_records(self, partition: int, values: list) -> None:
        with self.lock:
            end = self.ends[partition]
            data = build(values, [None] * len(values), [1000] * len(values), base_offset=end)
            self.logs[partition].append((end, data))
            self.ends[partition] = end + len(values)
        self.notify("t", partition)

    def _read(self, partition, offset, max_bytes):
        with self.lock:
            data = b"".join(d for base, d in self.logs[partition] if base >= offset)
            end = self.ends[partition]
        return FetchResult(data, end, 0, end)

    def _offset(self, partition, timestamp):
        with self.lock:
            return 0 if timestamp == -2 else self.ends[partition]


class OldStyleBackend(LogBackend):
    """Partition 0 holds one record, b"old"."""

    def __init__(self):
        super().__init__(1)
        self.logs[0].append((0, build([b"old"], [None], [1000], base_offset=0)))
        self.ends[0] = 1


@pytest.fixture
def cluster():
    """``cluster(n_brokers, partitions, long_poll=True)``: WireMetadata whose partition p
    is led by broker p % n_brokers; ``md.brokers[i].backend`` is broker i's LogBackend."""
    started = []

    def start(n_brokers: int = 1, partitions: int = 1, long_poll: bool = True,
              backend=LogBackend):
        brokers = [WireBroker(backend() if backend is not LogBackend else
                              LogBackend(partitions), i, long_poll=long_poll)
                   for i in range(n_brokers)]
        started.extend(brokers)
        return WireMetadata(brokers, leaders=[p % n_brokers for p in range(partitions)])

    yield start
    for broker in started:
        broker.close()


def append_later(md, partition: int, values, delay_s: float) -> threading.Thread:
    backend = md.brokers[md.leaders[partition]].backend

    def run():
        time.sleep(delay_s)
        backend.append_records(partition, values)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def poll_after_append(md, consumer, partition: int, values, delay_s: float,
                      timeout_ms: int) -> tuple[dict, float]:
    """``consumer.poll(timeout_ms)`` while ``values`` are appended to ``partition`` after
    ``delay_s``: (what it returned, seconds it took)."""
    writer = append_later(md, partition, values, delay_s)
    t0 = time.monotonic()
    got = consumer.poll(timeout_ms=timeout_ms)
    elapsed = time.monotonic() - t0
    writer.join()
    return got, elapsed


def waits(md, broker: int = 0) -> list:
    """(max_wait_ms, min_bytes) of each Fetch broker ``broker`` received."""
    return [(w, m) for w, m, _ in md.brokers[broker].apis.fetches]


def test_fetch_with_max_wait_returns_when_a_record_arrives(cluster):
    """SimpleConsumer.fetch(max_wait_ms=5000) on an empty partition is answered as soon as
    a record is appended (well before the wait is over), and the broker got the wait and
    min_bytes; without max_wait_ms the request asks for no wait."""
    md = cluster()
    consumer = SimpleConsumer(md)
    assert consumer.fetch("t", 0, 0) == []
    writer = append_later(md, 0, [b"hello"], 0.3)
    t0 = time.monotonic()
    got = consumer.fetch("t", 0, 0, max_wait_ms=5000, min_bytes=1)
    elapsed = time.monotonic() - t0
    writer.join()
    assert [r.value for r in got] == [b"hello"]
    assert 0.25 <= elapsed < 3.0, elapsed
    assert waits(md) == [(0, 1), (5000, 1)]


def test_the_request_timeout_covers_the_brokers_wait(cluster):
    """A long poll that the broker holds longer than request_timeout_ms is not cut short
    by the client: the request's timeout is request_timeout_ms plus max_wait_ms."""
    consumer = SimpleConsumer(cluster(), request_timeout_ms=200, retries=0)
    t0 = time.monotonic()
    assert consumer.fetch("t", 0, 0, max_wait_ms=800) == []
    assert time.monotonic() - t0 >= 0.75


def test_multifetch_passes_the_wait_to_every_leader(cluster):
    """multifetch(max_wait_ms=...) long-polls each partition's leader broker; a partition
    that receives a record answers with it."""
    md = cluster(n_brokers=2, partitions=2)
    consumer = SimpleConsumer(md)
    writer = append_later(md, 1, [b"x", b"y"], 0.2)
    got = consumer.multifetch([("t", 0, 0, 1 << 20), ("t", 1, 0, 1 << 20)], max_wait_ms=1500)
    writer.join()
    assert got[("t", 0)] == [] and [r.value for r in got[("t", 1)]] == [b"x", b"y"]
    assert waits(md, 0) == [(1500, 1)] and waits(md, 1) == [(1500, 1)]


def test_multifetch_sends_one_request_per_broker(cluster):
    """multifetch of four partitions led by two brokers sends each broker ONE Fetch
    carrying its two partitions."""
    md = cluster(n_brokers=2, partitions=4)
    for p in range(4):
        md.brokers[p % 2].backend.append_records(p, [b"r%d" % p])
    got = SimpleConsumer(md).multifetch([("t", p, 0, 1 << 20) for p in range(4)])
    assert {tp: [r.value for r in rs] for tp, rs in got.items()} == \
        {("t", p): [b"r%d" % p] for p in range(4)}
    for b in range(2):
        assert [sorted(ps) for _, _, ps in md.brokers[b].apis.fetches] == \
            [[("t", b, 0), ("t", b + 2, 0)]]


def test_bad_wait_arguments_are_typed_errors(cluster):
    """A negative max_wait_ms or min_bytes, or a non-int, raises IllegalArgumentError."""
    consumer = SimpleConsumer(cluster())
    for kwargs in ({"max_wait_ms": -1}, {"min_bytes": -1}, {"max_wait_ms": 1.5}):
        with pytest.raises(IllegalArgumentError):
            consumer.fetch("t", 0, 0, **kwargs)


def test_consumer_poll_waits_at_the_leader_not_in_a_client_loop(cluster):
    """poll(timeout_ms=6000) on an idle partition sends about one fetch per
    fetch_max_wait_ms (not one every few ms) and returns the record soon after its append
    (at 1.5 s), long before its own timeout."""
    md = cluster()
    consumer = Consumer(md, fetch_max_wait_ms=1000)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    got, elapsed = poll_after_append(md, consumer, 0, [b"late"], 1.5, 6000)
    assert [r.value for r in got[("t", 0)]] == [b"late"]
    assert 1.4 <= elapsed < 5.0, elapsed
    calls = waits(md)
    # one long poll per fetch_max_wait_ms that passed (a client loop would make dozens)
    assert 2 <= len(calls) <= int(elapsed) + 2 and calls[0] == (1000, 1), (elapsed, calls)


def test_consumer_poll_with_nothing_to_read_waits_at_most_its_timeout(cluster):
    """An idle poll(timeout_ms=300) returns {} after about 300 ms, its fetch asked to wait
    min(timeout_ms, fetch_max_wait_ms)."""
    md = cluster()
    consumer = Consumer(md)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    t0 = time.monotonic()
    assert consumer.poll(timeout_ms=300) == {}
    assert 0.25 <= time.monotonic() - t0 < 1.5
    assert waits(md)[0][0] <= 300


def test_consumer_returns_as_soon_as_one_partition_has_records(cluster):
    """With two partitions on two brokers, a record on one ends the poll at once; the
    other broker's waiting fetch stays in flight (it is not sent again by the next poll
    while it waits)."""
    md = cluster(n_brokers=2, partitions=2)
    consumer = Consumer(md, fetch_max_wait_ms=2000)
    consumer.assign([("t", 0), ("t", 1)])
    consumer.seek(("t", 0), 0)
    consumer.seek(("t", 1), 0)
    writer = append_later(md, 1, [b"b0"], 0.2)
    t0 = time.monotonic()
    got = consumer.poll(timeout_ms=5000)
    writer.join()
    assert list(got) == [("t", 1)] and time.monotonic() - t0 < 1.5
    writer = append_later(md, 1, [b"b1"], 0.2)
    got = consumer.poll(timeout_ms=5000)
    writer.join()
    assert [r.value for r in got[("t", 1)]] == [b"b1"]
    assert len(waits(md, 0)) == 1, "partition 0's fetch was still waiting"


def test_a_record_does_not_wait_out_another_partitions_long_poll_at_its_broker(cluster):
    """Two partitions on one broker: after a poll that brought records of partition 0
    only, a record appended to partition 1 reaches the next poll at once. A broker answers
    a connection's requests in order, so a second Fetch (for partition 1) behind the first
    one's long poll (partition 0, nothing new) waited out fetch_max_wait_ms: the last
    records of replication_bench's e2e run arrived 500 ms late. One Fetch in flight per
    broker, carrying all its partitions, as Kafka's consumer sends."""
    md = cluster(n_brokers=1, partitions=2)
    consumer = Consumer(md, fetch_max_wait_ms=8000)
    consumer.assign([("t", 0), ("t", 1)])
    consumer.seek(("t", 0), 0)
    consumer.seek(("t", 1), 0)
    md.brokers[0].backend.append_records(0, [b"a0"])
    got = consumer.poll(timeout_ms=5000)
    assert [r.value for r in got[("t", 0)]] == [b"a0"]
    got, elapsed = poll_after_append(md, consumer, 1, [b"b0"], 0.2, 12000)
    assert [r.value for r in got[("t", 1)]] == [b"b0"]
    assert elapsed < 4.0, f"partition 1's record waited {elapsed:.2f}s (the long poll: 8 s)"


def test_consumer_sends_one_fetch_per_broker_for_all_its_partitions(cluster):
    """A consumer assigned four partitions led by two brokers sends each broker ONE Fetch
    carrying both of its partitions, and gets every partition's records."""
    md = cluster(n_brokers=2, partitions=4)
    for p in range(4):
        md.brokers[p % 2].backend.append_records(p, [b"r%d" % p])
    consumer = Consumer(md, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    consumer.assign([("t", p) for p in range(4)])
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 4 and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            got.setdefault(tp, []).extend(r.value for r in records)
    assert got == {("t", p): [b"r%d" % p] for p in range(4)}
    for b in range(2):
        first = md.brokers[b].apis.fetches[0][2]
        assert sorted(first) == [("t", b, 0), ("t", b + 2, 0)]


def test_consumer_works_with_a_broker_that_answers_at_once(cluster):
    """A broker that answers every Fetch at once (no long poll): poll still returns its
    records and does not spin while idle."""
    md = cluster(long_poll=False, backend=OldStyleBackend)
    consumer = Consumer(md)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    assert [r.value for r in consumer.poll(timeout_ms=2000)[("t", 0)]] == [b"old"]
    assert consumer.poll(timeout_ms=500) == {}
    assert len(waits(md)) <= 15


def test_consumer_rejects_a_negative_fetch_max_wait_ms():
    """fetch_max_wait_ms and fetch_min_bytes must be ints >= 0."""
    from actors.errors import InvalidConfigurationError
    with pytest.raises(InvalidConfigurationError):
        Consumer(WireMetadata([]), fetch_max_wait_ms=-5)
    with pytest.raises(InvalidConfigurationError):
        Consumer(WireMetadata([]), fetch_min_bytes="1")


def test_a_real_replica_answers_a_long_poll_when_a_record_is_committed(tmp_path, client_ray):
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
