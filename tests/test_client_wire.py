"""raykafka's own Producer, Consumer and SimpleConsumer on a real 3-broker cluster speak
Kafka's protocol to the brokers' listeners: a steady produce and consume makes no Ray call,
one request goes to each leader broker, and a dead leader broker is met with retriable
errors and a metadata refresh, not a hang."""

from __future__ import annotations

import collections
import socket
import time

import pytest

from actors import Cluster
from cluster_helpers import FAST_CONFIG, local_ray, ray, unique_namespace, wait_until


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811 - the module's Ray first
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("cw"), config=FAST_CONFIG)
    yield c
    c.shutdown()


class RayCalls:
    """Counts, in this process, the Ray calls a client could make: actor method calls
    (``ActorMethod._remote``, what ``.remote()`` runs), ``ray.get``, ``ray.wait``,
    ``ray.put`` and ``ray.get_actor``."""

    def __init__(self, monkeypatch):
        import ray.actor
        self.counts: collections.Counter = collections.Counter()
        self.counting = False
        self._wrap(monkeypatch, ray.actor.ActorMethod, "_remote", "actor call")
        for name in ("get", "wait", "put", "get_actor"):
            self._wrap(monkeypatch, ray, name, f"ray.{name}")

    def _wrap(self, monkeypatch, owner, name, label):
        original = getattr(owner, name)
        counter = self

        def counted(*args, **kwargs):
            if counter.counting:
                counter.counts[label] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)


def test_a_steady_produce_and_consume_makes_no_ray_call(cluster, monkeypatch):
    """After a warm-up (metadata read, connections opened, positions known), 20 rounds of
    producing 100 records (acks=all, flushed) and polling them back with a Consumer and a
    SimpleConsumer make no Ray call at all in the client process; every record arrives."""
    topic = "steady"
    cluster.admin().create_topic(topic, partitions=6, replication_factor=3)
    calls = RayCalls(monkeypatch)
    producer = cluster.producer(linger_ms=1)
    consumer = cluster.consumer(auto_offset_reset="earliest", fetch_max_wait_ms=200)
    consumer.assign([(topic, p) for p in range(6)])
    simple = cluster.simple_consumer()
    try:
        def round_trip(n_round: int) -> int:
            futures = [producer.send(topic, b"r%d-%d" % (n_round, i)) for i in range(100)]
            producer.flush(timeout=60)
            for f in futures:
                f.get(timeout=0)
            got = 0
            deadline = time.monotonic() + 30
            while got < 100 and time.monotonic() < deadline:
                got += sum(len(rs) for rs in consumer.poll(timeout_ms=1000).values())
            simple.multifetch([(topic, p, 0, 1 << 20) for p in range(6)])
            return got

        assert round_trip(0) == 100          # warm-up: metadata, connections, positions
        calls.counting = True
        received = sum(round_trip(n) for n in range(1, 21))
        calls.counting = False
        assert received == 2000
        assert dict(calls.counts) == {}, f"Ray calls in a steady produce/consume: {calls.counts}"
    finally:
        calls.counting = False
        producer.close()
        consumer.close()
        simple.close()


def test_a_leader_change_is_learnt_over_the_wire_without_a_ray_call(cluster, monkeypatch):
    """After a partition's leader moves (reassigned to a new replica order, the preferred
    leader elected), a Producer, a Consumer and a SimpleConsumer that knew the old leader
    are answered NOT_LEADER_OR_FOLLOWER, read the metadata again with a Metadata request
    to the brokers, and go on at the new leader: no Ray call in the client process, and
    every record arrives."""
    topic = "moved"
    admin = cluster.admin()
    admin.create_topic(topic, partitions=1, replication_factor=3)
    producer = cluster.producer(linger_ms=0)
    consumer = cluster.consumer(auto_offset_reset="earliest", fetch_max_wait_ms=100)
    consumer.assign([(topic, 0)])
    simple = cluster.simple_consumer()
    calls = RayCalls(monkeypatch)
    try:
        producer.send(topic, b"first").get(timeout=30)
        assert sum(len(rs) for rs in consumer.poll(timeout_ms=5000).values()) == 1
        assert [r.value for r in simple.fetch(topic, 0, 0)] == [b"first"]
        old = admin.describe_topic(topic)[0]
        new_order = old["replicas"][1:] + old["replicas"][:1]
        admin.reassign_partitions({(topic, 0): new_order})
        admin.elect_preferred_leaders(topic)
        wait_until(lambda: admin.describe_topic(topic)[0]["leader"] == new_order[0],
                   timeout_s=60, what="the new leader elected")
        before = [c.metadata.wire_refreshes for c in (producer, consumer, simple)]
        calls.counting = True
        for f in [producer.send(topic, b"after-%d" % i) for i in range(20)]:
            f.get(timeout=60)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            got += [r.value for rs in consumer.poll(timeout_ms=1000).values() for r in rs]
        fetched = simple.fetch(topic, 0, 1)
        calls.counting = False
        assert got == [b"after-%d" % i for i in range(20)]
        assert [r.value for r in fetched] == got
        assert dict(calls.counts) == {}, f"Ray calls after a leader change: {calls.counts}"
        after = [c.metadata.wire_refreshes for c in (producer, consumer, simple)]
        assert all(a > b for a, b in zip(after, before)), (before, after)
    finally:
        calls.counting = False
        producer.close()
        consumer.close()
        simple.close()


def test_a_metadata_refresh_no_listener_answers_is_read_through_ray(cluster):
    """A client whose cached metadata names only listeners that do not answer (every
    broker it knew restarted on other ports) reads the metadata through Ray, and its next
    refresh goes over the wire again."""
    from actors.client.metadata import WireMetadata
    from actors.client.network import BrokerConnections

    def free_port() -> int:                   # a port nothing listens on
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    metadata = WireMetadata(cluster.metadata)
    metadata.attach(BrokerConnections(metadata))
    stale = dict(metadata.snapshot())
    stale["brokers"] = {b: {"host": "127.0.0.1", "port": free_port()}
                        for b in stale["brokers"]}
    metadata._snapshot = stale
    try:
        fresh = metadata.refresh()
        assert (metadata.ray_refreshes, metadata.wire_refreshes) == (1, 0)
        assert {int(b) for b in fresh["brokers"]} == set(cluster.broker_ids())
        metadata.refresh()
        assert (metadata.ray_refreshes, metadata.wire_refreshes) == (1, 1)
    finally:
        metadata.network.close()


def test_consumer_offsets_come_from_list_offsets_requests(cluster):
    """beginning_offsets, end_offsets and offsets_for_times (ListOffsets -2, -1 and times)
    answer the log start, the high watermark and the first record at or after each time
    (None past the last one), for partitions led by different brokers."""
    topic = "times"
    cluster.admin().create_topic(topic, partitions=3, replication_factor=1)
    with cluster.producer(linger_ms=0) as producer:
        for p in range(3):
            for i, ts in enumerate((1000, 2000, 3000)):
                producer.send(topic, b"v%d" % i, partition=p, timestamp_ms=ts + p)
        producer.flush(timeout=60)
    consumer = cluster.consumer()
    try:
        tps = [(topic, p) for p in range(3)]
        assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, 3)
        found = consumer.offsets_for_times({tp: 1500 for tp in tps})
        assert {tp: (o.offset, o.timestamp) for tp, o in found.items()} == \
            {(topic, p): (1, 2000 + p) for p in range(3)}
        assert consumer.offsets_for_times({(topic, 0): 9999}) == {(topic, 0): None}
    finally:
        consumer.close()


def test_a_killed_leader_broker_is_retried_onto_the_new_leader(cluster):
    """Producing to a partition (RF=3, acks=all) whose leader broker is killed: the
    in-flight sends fail over to the new leader (NetworkError / NOT_LEADER_OR_FOLLOWER,
    a metadata refresh, a retry) within seconds, and a consumer reads every acknowledged
    record."""
    topic = "failover"
    cluster.admin().create_topic(topic, partitions=1, replication_factor=3)
    producer = cluster.producer(linger_ms=0, request_timeout_ms=5000)
    try:
        acked = [producer.send(topic, b"before-%d" % i).get(timeout=30).offset
                 for i in range(20)]
        leader = cluster.admin().describe_topic(topic)[0]["leader"]
        cluster.kill_broker(leader)
        started = time.monotonic()
        futures = [producer.send(topic, b"after-%d" % i) for i in range(20)]
        acked += [f.get(timeout=60).offset for f in futures]
        assert time.monotonic() - started < 45
    finally:
        producer.close()
    new_leader = cluster.admin().describe_topic(topic)[0]["leader"]
    assert new_leader not in (leader, -1)
    simple = cluster.simple_consumer()
    try:
        end = simple.offsets_before(topic, 0, -1)[0]
        values = []
        offset = 0
        while offset < end:
            got = simple.fetch(topic, 0, offset)
            values += [r.value for r in got]
            offset = got[-1].offset + 1
    finally:
        simple.close()
    expected = [b"before-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(20)]
    assert all(v in values for v in expected), "an acknowledged record is missing"
    cluster.start_broker(leader)
    wait_until(lambda: leader in cluster.broker_ids(), timeout_s=60, what="broker back")


def test_calls_a_lookup_moved_on_without_are_read_so_ray_logs_no_unhandled_error(cluster):
    """first_answer takes the first good answer of calls sent together; one that fails
    after it (a broker not ready yet) is still read, so Ray logs no "Unhandled error"
    traceback in the caller's process (a CLI command printed one in a fresh-clone run)."""
    import gc
    import logging
    from actors.client.metadata import first_answer

    @ray.remote
    class Answers:
        def fast(self):
            return 1

        def late_failure(self):
            time.sleep(0.3)
            raise ValueError("late failure")

    logged: list = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    worker_log = logging.getLogger("ray._private.worker")
    worker_log.addHandler(handler)
    actor = Answers.remote()
    try:
        ray.get(actor.fast.remote(), timeout=30)
        refs = {actor.fast.remote(): "fast", actor.late_failure.remote(): "late"}
        assert first_answer(refs, 10) == ("fast", 1)
        del refs
        time.sleep(1.5)                         # the late call fails meanwhile
        gc.collect()
        time.sleep(1.0)
        assert not [m for m in logged if "Unhandled error" in m], logged
    finally:
        worker_log.removeHandler(handler)
        ray.kill(actor)
