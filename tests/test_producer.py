"""Producer against real PartitionReplica actors through real Kafka listeners in this
process (FakeMetadata, one local Ray per module), and against scripted brokers."""

import itertools
import json
import shutil
import tempfile

import numpy as np
import pytest
import ray

from actors.errors import (IllegalArgumentError, IllegalStateError, InvalidConfigurationError,
                           InvalidRecordError, KafkaTimeoutError, RecordTooLargeError,
                           UnknownTopicOrPartitionError)
from actors.client.murmur2 import partition_for_key
from actors.client.producer import Producer
from actors.client.simple_consumer import SimpleConsumer
from actors.types import RecordMetadata
from client_fakes import FakeMetadata, client_ray, wait_until  # noqa: F401 - client_ray: fixture
from storage.records import (CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD,
                             parse_header)

_names = (f"topic{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def data_dir(client_ray):  # noqa: F811
    path = tempfile.mkdtemp(prefix="rk-producer-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def md(data_dir):
    fake = FakeMetadata(data_dir)
    yield fake
    fake.shutdown()


def new_topic(md, partitions=3, log_config=None) -> str:
    name = next(_names)
    md.create_topic(name, partitions, log_config)
    return name


def read_all(md, topic, **config) -> dict:
    """{partition: [Record]} of everything in the topic."""
    consumer = SimpleConsumer(md, **config)
    out = {}
    for p in md.partitions_for(topic):
        recs, offset = [], 0
        while offset < md.end_offset(topic, p):
            got = consumer.fetch(topic, p, offset)
            recs += got
            offset = got[-1].offset + 1
        out[p] = recs
    return out


def test_keyed_records_land_on_murmur2_partitions_in_order(md):
    """Keyed records go to toPositive(murmur2(key)) % partitions, each key's records keep
    their send order, and every future's metadata points at its record."""
    topic = new_topic(md, 4)
    with Producer(md, linger_ms=1, batch_size=2048) as producer:
        futures = [(i, producer.send(topic, b"%d" % i, key=b"key-%d" % (i % 25)))
                   for i in range(3000)]
        producer.flush(timeout=30)
        metas = {i: f.get(timeout=1) for i, f in futures}
    stored = read_all(md, topic)
    by_key: dict = {}
    for p, recs in stored.items():
        for r in recs:
            assert p == partition_for_key(r.key, 4)
            by_key.setdefault(r.key, []).append(int(r.value))
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), f"order broken for {key!r}"
    assert sum(len(s) for s in by_key.values()) == 3000
    for i, meta in metas.items():
        assert isinstance(meta, RecordMetadata) and meta.topic == topic
        rec = stored[meta.partition][meta.offset]
        assert (rec.offset, rec.value, rec.timestamp) == (meta.offset, b"%d" % i, meta.timestamp)


def test_null_keys_spread_over_all_partitions(md):
    """Records without a key fill sticky batches that rotate over every partition."""
    topic = new_topic(md, 3)
    with Producer(md, batch_size=1024, linger_ms=1) as producer:
        futures = [producer.send(topic, b"v" * 100) for _ in range(600)]
        producer.flush(timeout=30)
    counts = md.end_offsets(topic)
    assert sum(counts.values()) == 600
    assert all(c >= 100 for c in counts.values()), counts
    # sticky per batch: consecutive records share a partition in runs
    partitions = [f.get().partition for f in futures]
    runs = sum(1 for a, b in zip(partitions, partitions[1:]) if a != b) + 1
    assert runs < 200


def test_custom_partitioner_and_explicit_partition(md):
    """A configured partitioner gets (key bytes, all partitions, available) and decides;
    an explicit partition overrides it."""
    topic = new_topic(md, 3)
    calls = []

    def last(key, all_partitions, available):
        calls.append((key, list(all_partitions), list(available)))
        return all_partitions[-1]

    with Producer(md, partitioner=last, key_serializer=str.encode) as producer:
        producer.send(topic, b"a", key="k1")
        producer.send(topic, b"b")
        producer.send(topic, b"c", key="k2", partition=0)
        producer.send_batch(topic, [b"d", b"e"], keys=["k3", "k4"]).wait(timeout=30)
        producer.flush(timeout=30)
    assert calls[:2] == [(b"k1", [0, 1, 2], [0, 1, 2]), (None, [0, 1, 2], [0, 1, 2])]
    assert md.end_offsets(topic) == {0: 1, 1: 0, 2: 4}


def test_serializers_round_trip(md):
    """key/value serializers are applied before sending; deserializers undo them."""
    topic = new_topic(md, 1)
    with Producer(md, key_serializer=str.encode,
                  value_serializer=lambda v: json.dumps(v).encode()) as producer:
        producer.send(topic, {"n": 1}, key="alpha").get(timeout=30)
        producer.send_batch(topic, [{"n": 2}, [3]], keys=["beta", "gamma"]).wait(timeout=30)
    recs = read_all(md, topic, key_deserializer=bytes.decode, value_deserializer=json.loads)[0]
    assert [(r.key, r.value) for r in recs] == [("alpha", {"n": 1}), ("beta", {"n": 2}),
                                                ("gamma", [3])]


@pytest.mark.parametrize("codec,codec_id", [(None, CODEC_NONE), ("gzip", CODEC_GZIP),
                                            ("snappy", CODEC_SNAPPY), ("lz4", CODEC_LZ4),
                                            ("zstd", CODEC_ZSTD)])
def test_compression_types_round_trip(md, codec, codec_id):
    """Each compression_type writes batches with that codec, and records (keys, values,
    nulls, headers, timestamps) read back unchanged, through send and send_batch."""
    topic = new_topic(md, 1)
    sent = [(b"k%d" % i if i % 3 else None, b"value-%d" % i * (i % 7 + 1),
             [("h", b"%d" % i)] if i % 2 else [], 1_700_000_000_000 + i) for i in range(200)]
    with Producer(md, compression_type=codec, linger_ms=2) as producer:
        for k, v, h, ts in sent[:100]:
            producer.send(topic, v, key=k, headers=h, timestamp_ms=ts)
        producer.flush(timeout=30)
        rest = sent[100:]
        producer.send_batch(topic, [v for _, v, _, _ in rest], keys=[k for k, _, _, _ in rest],
                            headers=[h for _, _, h, _ in rest],
                            timestamps=[t for _, _, _, t in rest]).wait(timeout=30)
    recs = read_all(md, topic)[0]
    assert [(r.key, r.value, r.headers, r.timestamp) for r in recs] == sent
    raw = ray.get(md.handle(topic, 0).fetch.remote(0, 1 << 20)).data
    assert parse_header(raw).compression == codec_id


def test_callbacks_and_errbacks_fire(md):
    """add_callback gets the RecordMetadata on success; add_errback gets the typed error
    (here a compacted topic refusing a null key: not retriable) and get() raises it."""
    topic = new_topic(md, 1)
    compacted = new_topic(md, 1, {"cleanup.policy": "compact"})
    ok, failed, extra = [], [], []
    with Producer(md, retries=2) as producer:
        good = producer.send(topic, b"x", key=b"k")
        good.add_callback(ok.append).add_errback(failed.append)
        good.add_callback(lambda tag, meta: extra.append((tag, meta.offset)), "tag")
        bad = producer.send(compacted, b"no key")
        bad.add_callback(ok.append).add_errback(failed.append)
        producer.flush(timeout=30)
        with pytest.raises(InvalidRecordError):
            bad.get(timeout=5)
        late = []
        good.add_callback(late.append)    # on a finished future: runs at once
    assert ok == [good.get()] and late == [good.get()]
    assert extra == [("tag", 0)]
    assert len(failed) == 1 and type(failed[0]) is InvalidRecordError
    assert bad.is_done and not bad.succeeded() and bad.exception is failed[0]
    assert md.end_offset(compacted, 0) == 0


def test_future_get_timeout_raises_kafka_timeout(md):
    """get(timeout) on a record still lingering raises KafkaTimeoutError; flush then
    delivers it."""
    topic = new_topic(md, 1)
    with Producer(md, linger_ms=60_000) as producer:
        future = producer.send(topic, b"slow")
        with pytest.raises(KafkaTimeoutError):
            future.get(timeout=0.05)
        assert not future.is_done
        producer.flush(timeout=30)
        assert future.get(timeout=0).offset == 0


def test_bad_input_is_refused_with_typed_errors_and_nothing_appended(md):
    """Every bad send raises its typed error at once and appends nothing."""
    topic = new_topic(md, 2)
    producer = Producer(md, max_request_size=10_000)
    cases = [
        (IllegalArgumentError, lambda: producer.send(topic, "text")),
        (IllegalArgumentError, lambda: producer.send(topic, b"v", key=42)),
        (IllegalArgumentError, lambda: producer.send(topic, None)),
        (IllegalArgumentError, lambda: producer.send(topic, b"v", headers=[(b"k", b"v")])),
        (IllegalArgumentError, lambda: producer.send(topic, b"v", headers=[("k", "v")])),
        (IllegalArgumentError, lambda: producer.send(topic, b"v", timestamp_ms="now")),
        (IllegalArgumentError, lambda: producer.send(topic, b"v", partition=-1)),
        (UnknownTopicOrPartitionError, lambda: producer.send(topic, b"v", partition=2)),
        (UnknownTopicOrPartitionError, lambda: producer.send("no-such-topic", b"v")),
        (RecordTooLargeError, lambda: producer.send(topic, b"x" * 10_000)),
        (IllegalArgumentError, lambda: producer.send_batch(topic, [b"a", "b"])),
        (IllegalArgumentError, lambda: producer.send_batch(topic, [b"a"], keys=[b"k", b"l"])),
        (RecordTooLargeError, lambda: producer.send_batch(topic, [b"a", b"x" * 10_000])),
        (UnknownTopicOrPartitionError, lambda: producer.send_batch(topic, [b"a"], partition=9)),
    ]
    for error, call in cases:
        with pytest.raises(error) as info:
            call()
        assert type(info.value) is error
    assert "bytes" in str(pytest.raises(IllegalArgumentError,
                                        producer.send, topic, "text").value)
    producer.flush(timeout=30)
    assert producer.metrics()["incomplete_batches"] == 0
    producer.close()
    with pytest.raises(IllegalStateError):
        producer.send(topic, b"late")
    with pytest.raises(IllegalStateError):
        producer.send_batch(topic, [b"late"])
    assert md.end_offsets(topic) == {0: 0, 1: 0}
    with pytest.raises(InvalidConfigurationError):
        Producer(md, lingerms=5)
    with pytest.raises(InvalidConfigurationError):
        Producer(md, acks=2)
    with pytest.raises(InvalidConfigurationError):
        Producer(md, compression_type="brotli")


def test_full_buffer_blocks_then_times_out(md):
    """With buffer_memory full, send blocks max_block_ms then raises KafkaTimeoutError,
    and the refused record is not appended."""
    topic = new_topic(md, 1)
    with Producer(md, buffer_memory=500, linger_ms=60_000, max_block_ms=200) as producer:
        first = producer.send(topic, b"a" * 300)
        with pytest.raises(KafkaTimeoutError):
            producer.send(topic, b"b" * 300)
        with pytest.raises(RecordTooLargeError):
            producer.send(topic, b"c" * 600)
        producer.flush(timeout=30)
        assert first.get(timeout=0).offset == 0
        again = producer.send(topic, b"d" * 300)   # space again
        producer.flush(timeout=30)
        assert again.get(timeout=0).offset == 1
    recs = read_all(md, topic)[0]
    assert [r.value[:1] for r in recs] == [b"a", b"d"]


def test_acks_zero_resolves_without_offsets(md):
    """acks=0 futures resolve with offset -1 without waiting, and the records arrive."""
    topic = new_topic(md, 2)
    with Producer(md, acks=0) as producer:
        futures = [producer.send(topic, b"%d" % i, key=b"%d" % i) for i in range(200)]
        batch = producer.send_batch(topic, [b"b"] * 100)
        producer.flush(timeout=30)
        assert {f.get(timeout=5).offset for f in futures} == {-1}
        assert set(batch.offsets(timeout=5)[1].tolist()) == {-1}
    wait_until(lambda: sum(md.end_offsets(topic).values()) == 300, what="acks=0 records")


def test_send_batch_partitions_like_send_and_reports_offsets(md):
    """send_batch puts keyed records on the same partitions as send, keeps input order per
    partition behind earlier sends, and its get()/offsets() match what was stored."""
    topic = new_topic(md, 3)
    keys = [b"user-%d" % (i % 50) for i in range(5000)]
    values = [b"%d" % i for i in range(5000)]
    with Producer(md, linger_ms=1000) as producer:
        first = producer.send(topic, b"first", key=b"user-7")
        batch = producer.send_batch(topic, values, keys=keys)
        metas = batch.get(timeout=30)
        partitions, offsets = batch.offsets()
        assert first.get(timeout=30).offset == 0
        spread = producer.send_batch(topic, [b"n"] * 900)
        spread.wait(timeout=30)
        assert batch.succeeded() and len(batch) == 5000
    stored = read_all(md, topic)
    assert len(metas) == 5000
    for i, m in enumerate(metas):
        assert m.partition == partition_for_key(keys[i], 3) == partitions[i]
        assert m.offset == offsets[i]
        r = stored[m.partition][m.offset]
        assert (r.key, r.value) == (keys[i], values[i])
    assert stored[partition_for_key(b"user-7", 3)][0].value == b"first"
    counts = np.bincount(spread.offsets()[0], minlength=3)
    assert counts.tolist() == [300, 300, 300]


def test_large_send_batch_is_cut_into_requests_within_max_request_size(md):
    """A send_batch larger than max_request_size is split into several batches, each
    within the limit, and all records arrive in order."""
    topic = new_topic(md, 1)
    with Producer(md, max_request_size=64 * 1024) as producer:
        values = [b"%06d" % i + b"x" * 94 for i in range(3000)]
        producer.send_batch(topic, values, partition=0).wait(timeout=30)
    raw = ray.get(md.handle(topic, 0).fetch.remote(0, 1 << 30)).data
    from storage.records import iter_headers
    sizes = [h.size for h in iter_headers(raw)]
    assert len(sizes) >= 5 and max(sizes) <= 64 * 1024
    assert [r.value for r in read_all(md, topic)[0]] == values


def test_close_delivers_pending_and_is_idempotent(md):
    """close() sends what lingers, then the producer refuses sends; closing twice is fine."""
    topic = new_topic(md, 1)
    producer = Producer(md, linger_ms=60_000)
    future = producer.send(topic, b"pending")
    producer.close(timeout=30)
    producer.close()
    assert future.get(timeout=0).offset == 0
    assert producer.closed


class SlowLog:
    """A scripted broker's produce that answers ``delay_s`` after each request (so
    requests stay in flight), assigning offsets like a log; ``requests`` has the number of
    batches each request carried for the partition."""

    def __init__(self, delay_s):
        self.delay_s = delay_s
        self.requests = []
        self.next_offset = 0

    def __call__(self, payload, acks, timeout_ms):
        import concurrent.futures
        import threading
        from actors.protocol import ProduceResult
        from storage.records import iter_headers
        headers = list(iter_headers(payload))
        self.requests.append(len(headers))
        n = sum(h.records_count for h in headers)
        base, self.next_offset = self.next_offset, self.next_offset + n
        future = concurrent.futures.Future()
        threading.Timer(self.delay_s, future.set_result,
                        [ProduceResult(base, base + n - 1, -1, 0)]).start()
        return future


def test_batches_queued_behind_a_request_in_flight_go_together_in_the_next():
    """While a partition's request is in flight, the small batches queued behind it go out
    together in the next request (up to max_request_size), and each record's future gets
    its own offset, in send order."""
    from client_fakes import ScriptedBackend, WireBroker, WireMetadata
    log = SlowLog(delay_s=0.05)
    broker = WireBroker(ScriptedBackend(produce=log))
    try:
        with Producer(WireMetadata([broker]), linger_ms=0, batch_size=300) as producer:
            futures = [producer.send("t", b"v%04d" % i) for i in range(400)]
            producer.flush(timeout=60)
            offsets = [f.get(timeout=10).offset for f in futures]
    finally:
        broker.close()
    assert offsets == list(range(400))
    assert sum(log.requests) > len(log.requests), "no request carried two batches"
    assert max(log.requests) > 2


def test_one_produce_request_per_broker_carries_all_its_partitions():
    """Records for four partitions led by two brokers, ready together (one linger), reach
    each broker in ONE Produce request carrying both of its partitions (one request per
    broker, not one per partition)."""
    from client_fakes import ScriptedBackend, WireBroker, WireMetadata
    logs = [SlowLog(delay_s=0.2), SlowLog(delay_s=0.2)]
    brokers = [WireBroker(ScriptedBackend(4, produce=log), i) for i, log in enumerate(logs)]
    try:
        md = WireMetadata(brokers, leaders=[0, 1, 0, 1])
        with Producer(md, linger_ms=50) as producer:
            futures = [producer.send("t", b"x", partition=p) for p in range(4)]
            producer.flush(timeout=60)
            assert all(f.get(timeout=10).offset >= 0 for f in futures)
        for b, broker in enumerate(brokers):
            requests = [sorted(p for _, p, _ in r) for r in broker.apis.produces]
            assert requests == [[b, b + 2]], requests
    finally:
        for broker in brokers:
            broker.close()
