"""Each client (Producer, SimpleConsumer, Consumer) retries a retriable error and gives up
at once on a non-retriable one, through the one RetryPolicy. A scripted broker (a real
Kafka listener in this process over a Backend whose answers the test scripts: an error
becomes its Kafka error code on the wire); no replica actors, Ray or ZooKeeper."""

import time

import pytest

from actors.client.consumer import Consumer
from actors.client.producer import Producer
from actors.client.simple_consumer import SimpleConsumer
from actors.errors import (CorruptRecordError, InvalidRecordError, KafkaTimeoutError,
                           LeaderNotAvailableError, NoBrokersAvailable,
                           NotLeaderForPartitionError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from actors.protocol import FetchResult, ProduceResult
from client_fakes import Script, ScriptedBackend, WireBroker, WireMetadata
from storage.records import build

FAST = dict(retry_backoff_ms=1, retry_backoff_max_ms=5)


@pytest.fixture
def brokers():
    """Start scripted brokers: ``brokers(**scripts)`` -> a WireMetadata over one broker."""
    started = []

    def start(lookup_errors=(), **scripts):
        broker = WireBroker(ScriptedBackend(**scripts))
        started.append(broker)
        return WireMetadata([broker], lookup_errors=lookup_errors)

    yield start
    for broker in started:
        broker.close()


def fetched(*values, base_offset=0) -> FetchResult:
    data = build(list(values), [None] * len(values), [1000] * len(values),
                 base_offset=base_offset)
    return FetchResult(data, base_offset + len(values), 0, base_offset + len(values))


# -- Producer ------------------------------------------------------------------------------
def test_producer_retries_a_retriable_error_onto_the_refreshed_leader(brokers):
    """A produce answered with NOT_LEADER_OR_FOLLOWER is retried after a metadata refresh
    and its future resolves with the second attempt's offset."""
    produce = Script(NotLeaderForPartitionError("moved"), ProduceResult(7, 7, -1, 0))
    md = brokers(produce=produce)
    with Producer(md, linger_ms=0, **FAST) as producer:
        meta = producer.send("t", b"v", partition=0).get(timeout=30)
    assert meta.offset == 7
    assert len(produce.calls) == 2 and md.invalidations >= 1


def test_producer_fails_at_once_on_a_non_retriable_error(brokers):
    """A produce refused with INVALID_RECORD fails the future with InvalidRecordError after
    one attempt, without refreshing the metadata."""
    produce = Script(InvalidRecordError("null key on compacted topic"))
    md = brokers(produce=produce)
    with Producer(md, linger_ms=0, **FAST) as producer:
        with pytest.raises(InvalidRecordError):
            producer.send("t", b"v", partition=0).get(timeout=30)
    assert len(produce.calls) == 1 and md.invalidations == 0


def test_producer_does_not_retry_an_unknown_partition_named_by_the_metadata(brokers):
    """UnknownTopicOrPartitionError from the client's metadata at send time (the topic
    went away after the send was accepted) fails the batch without retrying."""
    produce = Script(ProduceResult(0, 0, -1, 0))
    md = brokers(produce=produce, lookup_errors=[UnknownTopicOrPartitionError("deleted")])
    with Producer(md, linger_ms=0, **FAST) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("t", b"v", partition=0).get(timeout=30)
    assert produce.calls == []


# -- SimpleConsumer ------------------------------------------------------------------------
class FlakyTopicMetadata(WireMetadata):
    """WireMetadata whose ``partitions_for`` first raises ``errors`` in order (what
    the client's Metadata raises while every broker is down or just restarted)."""

    def __init__(self, broker, errors):
        super().__init__([broker])
        self.errors = list(errors)

    def partitions_for(self, topic):
        if self.errors:
            raise self.errors.pop(0)
        return super().partitions_for(topic)


@pytest.fixture
def broker():
    """One scripted broker; ``broker.backend`` takes the scripts."""
    b = WireBroker(ScriptedBackend())
    yield b
    b.close()


def test_producer_send_waits_for_the_metadata_of_a_topic_it_knows(broker):
    """A topic this producer sent to before, missing from the metadata (brokers restarted,
    caches empty) or with no broker answering, makes send wait and retry the lookup
    within max_block_ms instead of raising."""
    broker.backend.produce = Script(ProduceResult(3, 3, -1, 0))
    md = FlakyTopicMetadata(broker, [])
    with Producer(md, linger_ms=0, metadata_max_age_ms=1, **FAST) as producer:
        producer.send("t", b"first", partition=0).get(timeout=30)
        md.errors = [NoBrokersAvailable("all down"), UnknownTopicOrPartitionError("t")] * 2
        time.sleep(0.01)   # past metadata_max_age_ms: the next send asks again
        assert producer.send("t", b"v", partition=0).get(timeout=30).offset == 3
    assert md.errors == []


def test_producer_send_gives_up_on_missing_metadata_after_max_block_ms(broker):
    """A known topic missing for longer than max_block_ms raises KafkaTimeoutError; a
    topic never seen that the brokers do not know raises UnknownTopicOrPartitionError at
    once."""
    broker.backend.produce = Script(ProduceResult(0, 0, -1, 0))
    md = FlakyTopicMetadata(broker, [])
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


def test_simple_consumer_retries_a_retriable_error_and_a_timeout(brokers):
    """fetch retries NOT_LEADER_OR_FOLLOWER and a broker that does not answer within
    request_timeout_ms (refreshing the metadata before each retry, reconnecting after the
    timeout) and returns the records of the attempt that answers."""
    def paused(*_args):
        time.sleep(1.5)
        return fetched(b"late")
    fetch = Script(NotLeaderForPartitionError("moved"), paused, fetched(b"a", b"b"))
    md = brokers(fetch=fetch)
    consumer = SimpleConsumer(md, request_timeout_ms=500, **FAST)
    assert [r.value for r in consumer.fetch("t", 0, 0)] == [b"a", b"b"]
    assert len(fetch.calls) == 3 and md.invalidations == 2


def test_simple_consumer_raises_a_non_retriable_error_at_once(brokers):
    """fetch raises OffsetOutOfRangeError (the typed error of OFFSET_OUT_OF_RANGE) after
    one attempt."""
    fetch = Script(OffsetOutOfRangeError("past the high watermark"))
    md = brokers(fetch=fetch)
    with pytest.raises(OffsetOutOfRangeError) as info:
        SimpleConsumer(md, **FAST).fetch("t", 0, 99)
    assert type(info.value) is OffsetOutOfRangeError
    assert len(fetch.calls) == 1 and md.invalidations == 0


def test_simple_consumer_gives_up_after_its_retries(brokers):
    """A leader that never comes back: fetch makes retries + 1 attempts, then raises
    the typed retriable error."""
    md = brokers(fetch=Script(fetched(b"x")),
                 lookup_errors=[LeaderNotAvailableError("none")] * 10)
    with pytest.raises(LeaderNotAvailableError):
        SimpleConsumer(md, retries=2, **FAST).fetch("t", 0, 0)
    assert len(md.lookup_errors) == 10 - 3 and md.invalidations == 2


# -- Consumer ------------------------------------------------------------------------------
def test_consumer_retries_list_offsets_and_fetch(brokers):
    """Consumer retries a leaderless ListOffsets (position) and a NOT_LEADER_OR_FOLLOWER
    fetch, and poll returns the records."""
    fetch = Script(NotLeaderForPartitionError("moved"), fetched(b"a", b"b"),
                   fetched())
    md = brokers(fetch=fetch, list_offsets=Script(0),
                 lookup_errors=[LeaderNotAvailableError("electing")])
    consumer = Consumer(md, auto_offset_reset="earliest", **FAST)
    consumer.assign([("t", 0)])
    got = consumer.poll(timeout_ms=10_000)
    assert [r.value for r in got[("t", 0)]] == [b"a", b"b"]
    # the failed fetch and its retry at 0; then (pipelining) the next fetch, at 2, sent
    # before poll returned (the broker reads it a moment later)
    deadline = time.monotonic() + 10
    while len(fetch.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [c[1] for c in fetch.calls[:3]] == [0, 0, 2] and md.invalidations == 2


def test_consumer_raises_a_non_retriable_fetch_error(brokers):
    """poll raises CorruptRecordError from a fetch at once (no metadata refresh)."""
    fetch = Script(CorruptRecordError("bad crc"))
    md = brokers(fetch=fetch)
    consumer = Consumer(md, **FAST)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    with pytest.raises(CorruptRecordError):
        consumer.poll(timeout_ms=10_000)
    assert len(fetch.calls) == 1 and md.invalidations == 0


def test_consumer_poll_gives_up_on_a_partition_after_its_retries(brokers):
    """A partition whose fetches always fail retriably makes poll raise the typed error
    after retries + 1 attempts."""
    fetch = Script(NotLeaderForPartitionError("moved"))
    md = brokers(fetch=fetch)
    consumer = Consumer(md, retries=2, **FAST)
    consumer.assign([("t", 0)])
    consumer.seek(("t", 0), 0)
    with pytest.raises(NotLeaderForPartitionError):
        consumer.poll(timeout_ms=30_000)
    assert len(fetch.calls) == 3


# -- the idempotent producer ----------------------------------------------------------------
def test_idempotent_producer_retries_the_same_stamped_bytes_and_numbers_on(brokers):
    """With idempotence (the default) each batch carries the producer id InitProducerId
    gave and its partition's next sequence; a retry resends the very same bytes."""
    from storage.records import parse_header
    produce = Script(NotLeaderForPartitionError("moved"), ProduceResult(0, 0, -1, 0),
                     ProduceResult(1, 2, -1, 0))
    md = brokers(produce=produce)
    with Producer(md, linger_ms=0, **FAST) as producer:
        assert producer.idempotent
        producer.send("t", b"a", partition=0).get(timeout=30)
        producer.send_batch("t", [b"b", b"c"], partition=0).get(timeout=30)
    sent = [r for request in md.brokers[0].apis.produces for _, _, r in request]
    assert len(sent) == 3 and sent[0] == sent[1]
    headers = [parse_header(r) for r in sent[1:]]
    assert len({h.producer_id for h in headers}) == 1 and headers[0].producer_id >= 0
    assert [(h.producer_epoch, h.base_sequence) for h in headers] == [(0, 0), (0, 1)]


def test_idempotence_needs_acks_all(brokers):
    """enable_idempotence=True with acks=1 is a configuration error; acks=1 alone turns
    idempotence off (Kafka 3.2+), and then batches carry no producer id."""
    from actors.errors import InvalidConfigurationError
    md = brokers(produce=Script(ProduceResult(0, 0, -1, 0)))
    with pytest.raises(InvalidConfigurationError):
        Producer(md, acks=1, enable_idempotence=True)
    with Producer(md, acks=1, linger_ms=0, **FAST) as producer:
        assert not producer.idempotent
        producer.send("t", b"a", partition=0).get(timeout=30)
    from storage.records import parse_header
    [[(_, _, records)]] = md.brokers[0].apis.produces
    assert parse_header(records).producer_id == -1
