"""Each client (Producer, SimpleConsumer, Consumer) retries a retriable error and gives up
at once on a non-retriable one, through the one RetryPolicy. Scripted fake leaders (their
answers are put in a local Ray's object store; their errors are raised as ``ray.get`` would
raise an actor's error); no replica actors, brokers or ZooKeeper."""

import threading
import time

import pytest
import ray
import ray.exceptions

from actors.client.consumer import Consumer
from actors.client.metadata import LeaderRef
from actors.client.producer import Producer
from actors.client.simple_consumer import SimpleConsumer
from actors.errors import (CorruptRecordError, InvalidRecordError, KafkaTimeoutError,
                           LeaderNotAvailableError, NoBrokersAvailable,
                           NotLeaderForPartitionError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from actors.protocol import FetchResult, ProduceResult
from client_fakes import start_ray, stop_ray
from storage.records import build

FAST = dict(retry_backoff_ms=1, retry_backoff_max_ms=5)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    start_ray()
    yield
    stop_ray()


def from_actor(error: BaseException) -> BaseException:
    """``error`` as ``ray.get`` raises it when an actor raised it."""
    return ray.exceptions.RayTaskError("call", "traceback", error).as_instanceof_cause()


class ScriptedMethod:
    """An actor method whose calls answer from a script, in order (the last answer
    repeats): an exception is raised, anything else is returned through the object
    store."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []
        self._lock = threading.Lock()

    def remote(self, *args):
        with self._lock:
            self.calls.append(args)
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return ray.put(answer)


class ScriptedLeader:
    def __init__(self, **methods):
        for name, method in methods.items():
            setattr(self, name, method)


class ScriptedMetadata:
    """One topic "t" with one partition whose leader is ``leader``; ``lookup_errors`` are
    raised by the first ``leader()`` calls (as the client's Metadata raises them)."""

    def __init__(self, leader, lookup_errors=()):
        self.handle = leader
        self.lookup_errors = list(lookup_errors)
        self.invalidations = 0

    def partitions_for(self, topic):
        if topic != "t":
            raise UnknownTopicOrPartitionError(topic)
        return [0]

    def leader(self, topic, partition):
        if self.lookup_errors:
            raise self.lookup_errors.pop(0)
        return LeaderRef(self.handle, 0, 0)

    def invalidate(self, topic=None):
        self.invalidations += 1


class FakeCluster:
    def __init__(self, metadata):
        self.metadata = metadata


def fetched(*values, base_offset=0) -> FetchResult:
    data = build(list(values), [None] * len(values), [1000] * len(values),
                 base_offset=base_offset)
    return FetchResult(data, base_offset + len(values), 0, base_offset + len(values))


# -- Producer ------------------------------------------------------------------------------
def test_producer_retries_a_retriable_error_onto_the_refreshed_leader():
    """A produce answered with NotLeaderForPartition is retried after a metadata refresh
    and its future resolves with the second attempt's offset."""
    produce = ScriptedMethod(from_actor(NotLeaderForPartitionError("moved")),
                             ProduceResult(7, 7, -1, 0))
    md = ScriptedMetadata(ScriptedLeader(produce=produce))
    with Producer(md, linger_ms=0, **FAST) as producer:
        meta = producer.send("t", b"v", partition=0).get(timeout=30)
    assert meta.offset == 7
    assert len(produce.calls) == 2 and md.invalidations >= 1


def test_producer_fails_at_once_on_a_non_retriable_error():
    """A produce refused with InvalidRecordError fails the future with that error after one
    attempt, without refreshing the metadata."""
    produce = ScriptedMethod(from_actor(InvalidRecordError("null key on compacted topic")))
    md = ScriptedMetadata(ScriptedLeader(produce=produce))
    with Producer(md, linger_ms=0, **FAST) as producer:
        with pytest.raises(InvalidRecordError):
            producer.send("t", b"v", partition=0).get(timeout=30)
    assert len(produce.calls) == 1 and md.invalidations == 0


def test_producer_does_not_retry_an_unknown_partition_named_by_the_metadata():
    """UnknownTopicOrPartitionError from the client's metadata at send time (the topic
    went away after the send was accepted) fails the batch without retrying."""
    produce = ScriptedMethod(ProduceResult(0, 0, -1, 0))
    md = ScriptedMetadata(ScriptedLeader(produce=produce),
                          lookup_errors=[UnknownTopicOrPartitionError("deleted")])
    with Producer(md, linger_ms=0, **FAST) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("t", b"v", partition=0).get(timeout=30)
    assert produce.calls == []


# -- SimpleConsumer ------------------------------------------------------------------------
class FlakyTopicMetadata(ScriptedMetadata):
    """ScriptedMetadata whose ``partitions_for`` first raises ``errors`` in order (what
    the client's Metadata raises while every broker is down or just restarted)."""

    def __init__(self, leader, errors):
        super().__init__(leader)
        self.errors = list(errors)

    def partitions_for(self, topic):
        if self.errors:
            raise self.errors.pop(0)
        return super().partitions_for(topic)


def test_producer_send_waits_for_the_metadata_of_a_topic_it_knows():
    """A topic this producer sent to before, missing from the metadata (brokers restarted,
    caches empty) or with no broker answering, makes send wait and retry the lookup
    within max_block_ms instead of raising."""
    produce = ScriptedMethod(ProduceResult(3, 3, -1, 0))
    md = FlakyTopicMetadata(ScriptedLeader(produce=produce), [])
    with Producer(md, linger_ms=0, metadata_max_age_ms=1, **FAST) as producer:
        producer.send("t", b"first", partition=0).get(timeout=30)
        md.errors = [NoBrokersAvailable("all down"), UnknownTopicOrPartitionError("t")] * 2
        time.sleep(0.01)   # past metadata_max_age_ms: the next send asks again
        assert producer.send("t", b"v", partition=0).get(timeout=30).offset == 3
    assert md.errors == []


def test_producer_send_gives_up_on_missing_metadata_after_max_block_ms():
    """A known topic missing for longer than max_block_ms raises KafkaTimeoutError; a
    topic never seen that the brokers do not know raises UnknownTopicOrPartitionError at
    once."""
    produce = ScriptedMethod(ProduceResult(0, 0, -1, 0))
    md = FlakyTopicMetadata(ScriptedLeader(produce=produce), [])
    with Producer(md, linger_ms=0, metadata_max_age_ms=1, max_block_ms=300,
                  **FAST) as producer:
        producer.send("t", b"first", partition=0).get(timeout=30)
        md.errors = [UnknownTopicOrPartitionError("t")] * 10_000
        time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError):
            producer.send("t", b"v", partition=0)
        assert 0.2 <= time.monotonic() - started < 5
        md.errors = [UnknownTopicOrPartitionError("typo")]
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("typo", b"v")


def test_simple_consumer_retries_a_retriable_error_and_a_timeout():
    """fetch retries NotLeaderForPartition and a request timeout (refreshing the metadata
    before each retry) and returns the records of the attempt that answers."""
    fetch = ScriptedMethod(from_actor(NotLeaderForPartitionError("moved")),
                           ray.exceptions.GetTimeoutError("paused leader"),
                           fetched(b"a", b"b"))
    md = ScriptedMetadata(ScriptedLeader(fetch=fetch))
    consumer = SimpleConsumer(md, **FAST)
    assert [r.value for r in consumer.fetch("t", 0, 0)] == [b"a", b"b"]
    assert len(fetch.calls) == 3 and md.invalidations == 2


def test_simple_consumer_raises_a_non_retriable_error_at_once():
    """fetch raises OffsetOutOfRangeError (the actor's own class) after one attempt."""
    fetch = ScriptedMethod(from_actor(OffsetOutOfRangeError("past the high watermark")))
    md = ScriptedMetadata(ScriptedLeader(fetch=fetch))
    with pytest.raises(OffsetOutOfRangeError) as info:
        SimpleConsumer(md, **FAST).fetch("t", 0, 99)
    assert type(info.value) is OffsetOutOfRangeError
    assert len(fetch.calls) == 1 and md.invalidations == 0


def test_simple_consumer_gives_up_after_its_retries():
    """A leader that never comes back: fetch makes retries + 1 attempts, then raises
    the typed retriable error."""
    md = ScriptedMetadata(ScriptedLeader(fetch=ScriptedMethod(fetched(b"x"))),
                          lookup_errors=[LeaderNotAvailableError("none")] * 10)
    with pytest.raises(LeaderNotAvailableError):
        SimpleConsumer(md, retries=2, **FAST).fetch("t", 0, 0)
    assert len(md.lookup_errors) == 10 - 3 and md.invalidations == 2


# -- Consumer ------------------------------------------------------------------------------
def test_consumer_retries_list_offsets_and_fetch():
    """Consumer retries a leaderless list_offsets (position) and a NotLeaderForPartition
    fetch, and poll returns the records."""
    fetch = ScriptedMethod(from_actor(NotLeaderForPartitionError("moved")),
                           fetched(b"a", b"b"))
    list_offsets = ScriptedMethod([0])
    md = ScriptedMetadata(ScriptedLeader(fetch=fetch, list_offsets=list_offsets),
                          lookup_errors=[LeaderNotAvailableError("electing")])
    consumer = Consumer(FakeCluster(md), auto_offset_reset="earliest", **FAST)
    consumer.assign([("t", 0)])
    got = consumer.poll(timeout_ms=10_000)
    assert [r.value for r in got[("t", 0)]] == [b"a", b"b"]
    # the failed fetch and its retry at 0; then (pipelining) the next fetch, at 2
    assert [c[0] for c in fetch.calls] == [0, 0, 2] and md.invalidations == 2


def test_consumer_raises_a_non_retriable_fetch_error():
    """poll raises CorruptRecordError from a fetch at once (no metadata refresh)."""
    fetch = ScriptedMethod(from_actor(CorruptRecordError("bad crc")))
    md = ScriptedMetadata(ScriptedLeader(fetch=fetch))
    consumer = Consumer(FakeCluster(md), **FAST)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    with pytest.raises(CorruptRecordError):
        consumer.poll(timeout_ms=10_000)
    assert len(fetch.calls) == 1 and md.invalidations == 0


def test_consumer_poll_gives_up_on_a_partition_after_its_retries():
    """A partition whose fetches always fail retriably makes poll raise the typed error
    after retries + 1 attempts."""
    fetch = ScriptedMethod(from_actor(NotLeaderForPartitionError("moved")))
    md = ScriptedMetadata(ScriptedLeader(fetch=fetch))
    consumer = Consumer(FakeCluster(md), retries=2, **FAST)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    with pytest.raises(NotLeaderForPartitionError):
        consumer.poll(timeout_ms=30_000)
    assert len(fetch.calls) == 3
