"""Producer under leader failures: killed leader actors and demoted leaders, with the
metadata moving to a new leader, as the controller would. Real replica actors."""

import shutil
import tempfile
import threading

import pytest

from actors.errors import LeaderNotAvailableError
from actors.client.producer import Producer
from actors.client.simple_consumer import SimpleConsumer
from client_fakes import FakeMetadata, client_ray, wait_until  # noqa: F401 - client_ray: fixture

KEYS = [b"k%d" % i for i in range(12)]
RETRYING = dict(retries=60, retry_backoff_ms=20, retry_backoff_max_ms=200,
                request_timeout_ms=10_000, linger_ms=2, batch_size=4096)


@pytest.fixture(scope="module")
def data_dir(client_ray):  # noqa: F811
    path = tempfile.mkdtemp(prefix="rk-producer-faults-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def md(data_dir):
    fake = FakeMetadata(data_dir)
    yield fake
    fake.shutdown()


def stream_and_fail_over(md, topic, fail, total=6000):
    """Send ``total`` keyed records (value = sequence number) from a background thread;
    once a third are acknowledged, ``fail`` partition 0's leader, then elect a new one.
    The last third is sent only after the fault (so it cannot come after everything).
    Returns [(seq, key, future)]."""
    sent = []
    acked = [0]
    done = threading.Event()
    faulted = threading.Event()
    producer = Producer(md, **RETRYING)

    def count(_meta):
        acked[0] += 1

    def run():
        try:
            for seq in range(total):
                if seq == 2 * total // 3:
                    faulted.wait(60)
                key = KEYS[seq % len(KEYS)]
                future = producer.send(topic, b"%d" % seq, key=key)
                future.add_callback(count)
                sent.append((seq, key, future))
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: acked[0] >= total // 3, what="first acknowledgements")
    fail(topic, 0)
    faulted.set()
    acked_at_fault = acked[0]
    wait_until(lambda: md.invalidations > 0 or done.is_set(), what="a retry")
    md.elect(topic, 0)
    thread.join(timeout=60)
    producer.flush(timeout=60)
    producer.close()
    assert acked_at_fault < total, "the fault came after everything was acknowledged"
    return sent


def check_at_least_once(md, topic, sent):
    """Every future succeeded and its record is where its metadata says; every record is
    in the log; per key, the first occurrences of its records are in send order."""
    consumer = SimpleConsumer(md)
    stored = {}
    for p in md.partitions_for(topic):
        offset, end = 0, md.end_offset(topic, p)
        while offset < end:
            recs = consumer.fetch(topic, p, offset)
            for r in recs:
                stored[(p, r.offset)] = r
            offset = recs[-1].offset + 1
    for seq, key, future in sent:
        meta = future.get(timeout=0)
        rec = stored[(meta.partition, meta.offset)]
        assert (rec.key, rec.value) == (key, b"%d" % seq)
    first_seen: dict = {}
    for (p, offset) in sorted(stored):
        rec = stored[(p, offset)]
        first_seen.setdefault(rec.key, [])
        seq = int(rec.value)
        if seq not in first_seen[rec.key]:
            first_seen[rec.key].append(seq)
    for key, seqs in first_seen.items():
        assert seqs == sorted(seqs), f"order of {key!r} broken"
    assert sum(len(s) for s in first_seen.values()) == len(sent)
    duplicates = len(stored) - len(sent)
    assert duplicates >= 0
    return duplicates


def test_killed_leader_loses_no_acknowledged_record(md):
    """The leader actor of partition 0 is killed mid-stream and a new leader recovers its
    log: the producer retries (RayActorError, then LeaderNotAvailable) onto the new leader,
    every future succeeds, nothing acknowledged is lost, and key order holds."""
    topic = "killed"
    md.create_topic(topic, 2)
    sent = stream_and_fail_over(md, topic, md.kill_leader)
    check_at_least_once(md, topic, sent)
    assert md.invalidations > 0


def test_demoted_leader_redirects_to_new_leader(md):
    """The leader of partition 0 becomes a follower mid-stream (NotLeaderForPartition) and
    a new leader is elected: the producer refreshes metadata, retries there, and delivers
    everything at least once, in key order."""
    topic = "demoted"
    md.create_topic(topic, 2)
    sent = stream_and_fail_over(md, topic, md.demote_leader)
    check_at_least_once(md, topic, sent)
    assert md.invalidations > 0


def test_retries_are_bounded_and_fail_with_the_typed_error(md):
    """With no leader ever coming back, a batch fails after ``retries`` attempts with the
    typed retriable error (LeaderNotAvailableError), other partitions are unaffected, and
    nothing blocks."""
    topic = "leaderless"
    md.create_topic(topic, 2)
    md.kill_leader(topic, 0)
    with Producer(md, retries=3, retry_backoff_ms=10, retry_backoff_max_ms=20) as producer:
        lost = producer.send(topic, b"x", partition=0)
        fine = producer.send(topic, b"y", partition=1)
        errors = []
        lost.add_errback(errors.append)
        with pytest.raises(LeaderNotAvailableError):
            lost.get(timeout=30)
        assert fine.get(timeout=30).offset == 0
    assert len(errors) == 1 and isinstance(errors[0], LeaderNotAvailableError)
    assert md.invalidations >= 3


def test_unbounded_retries_stop_at_the_delivery_timeout(md):
    """With Kafka's default of unbounded retries, a batch whose leader never returns fails
    with the retriable error once delivery_timeout_ms has passed, not before and not never."""
    import time
    topic = "leaderless-timeout"
    md.create_topic(topic, 1)
    md.kill_leader(topic, 0)
    with Producer(md, delivery_timeout_ms=1500, retry_backoff_ms=20,
                  retry_backoff_max_ms=100) as producer:
        assert producer.config["retries"] == 2147483647
        started = time.monotonic()
        lost = producer.send(topic, b"x", partition=0)
        with pytest.raises(LeaderNotAvailableError):
            lost.get(timeout=30)
        elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 10.0, elapsed
    assert md.invalidations >= 5
