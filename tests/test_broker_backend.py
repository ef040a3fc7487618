"""The Broker's request-handler backend (actors/server/broker_backend.py) without Ray:
metadata from the broker's snapshot, produce and fetch over cached replica channels to
in-process PartitionReplicas, NOT_LEADER_OR_FOLLOWER for what it does not lead, a new
channel after the replica or its leadership changes, and the watch waking the purgatory."""

from __future__ import annotations

import threading
import time

import pytest

from actors.errors import (LeaderNotAvailableError, NotLeaderForPartitionError,
                           UnknownTopicOrPartitionError)
from actors.server.broker_backend import BrokerBackend
from actors.server.handlers import BrokerEndpoint
from actors.server.replica import PartitionReplica
from actors.server.replica_channel import wait
from storage.records import build, decode_records


class _Lookup:
    """ReplicaLookup over in-process replicas (what Ray calls would reach)."""

    def __init__(self):
        self.replicas: dict = {}
        self.addresses_asked = 0

    def handle(self, topic, partition):
        return self.replicas.get((topic, partition))

    def channel_address(self, handle):
        self.addresses_asked += 1
        return handle.channel_address()


@pytest.fixture
def setup(tmp_path):
    lookup = _Lookup()
    leader = PartitionReplica("t", 0, 0, str(tmp_path), {})
    leader.become_leader(3, [0], [0])
    lookup.replicas[("t", 0)] = leader
    metadata = {"controller_id": 1, "brokers": {
        0: {"host": "127.0.0.1", "port": 9092, "rack": None},
        1: {"host": "127.0.0.1", "port": 9093, "rack": "r1"}},
        "topics": {"t": {0: {"leader": 0, "leader_epoch": 3, "isr": [0], "replicas": [0]},
                         1: {"leader": 1, "leader_epoch": 0, "isr": [1], "replicas": [1, 2]},
                         2: {"leader": -1, "leader_epoch": 1, "isr": [], "replicas": [2]}}}}
    state = {"metadata": metadata, "leading": {("t", 0): 3}}
    notified = []
    backend = BrokerBackend(0, metadata=lambda: state["metadata"],
                            leader_epochs=lambda: state["leading"], replicas=lookup,
                            endpoint=BrokerEndpoint(0, "127.0.0.1", 9092),
                            on_change=lambda t, p: notified.append((t, p)))
    yield backend, lookup, leader, state, notified
    backend.close()
    for replica in lookup.replicas.values():
        replica.stop()


def test_metadata_comes_from_the_brokers_snapshot(setup):
    """Brokers with their listeners by broker id, the controller, each partition's leader,
    epoch, replicas, ISR, offline replicas (not among the live brokers) and a partition
    without a leader flagged LEADER_NOT_AVAILABLE."""
    backend, *_ = setup
    assert backend.brokers() == [BrokerEndpoint(0, "127.0.0.1", 9092),
                                 BrokerEndpoint(1, "127.0.0.1", 9093, "r1")]
    assert backend.controller_id() == 1 and backend.topics() == ["t"]
    parts = backend.partitions("t")
    assert [(p.partition, p.leader, p.leader_epoch, p.replicas, p.isr, p.offline_replicas)
            for p in parts] == [(0, 0, 3, (0,), (0,), ()), (1, 1, 0, (1, 2), (1,), (2,)),
                                (2, -1, 1, (2,), (), (2,))]
    assert isinstance(parts[2].error, LeaderNotAvailableError)
    assert backend.partitions("nope") is None


def test_own_endpoint_is_listed_before_the_controller_says_so(setup):
    """A broker the controller's metadata does not list yet still names itself."""
    backend, _, _, state, _ = setup
    state["metadata"] = {"brokers": {}, "topics": {}}
    assert backend.brokers() == [BrokerEndpoint(0, "127.0.0.1", 9092)]
    assert backend.controller_id() == -1


def test_produce_and_fetch_go_over_one_cached_channel(setup):
    """Appends, reads, ListOffsets and OffsetForLeaderEpoch reach the leader replica
    through its channel, opened once (the lookup has no Ray-call way for the last two)."""
    backend, lookup, leader, _, _ = setup
    for i in range(3):
        result = wait(backend.append("t", 0, memoryview(build([b"r%d" % i])), acks=-1,
                                     timeout_ms=5000), 5)
        assert result.base_offset == i
    got = backend.read("t", 0, 0, 1 << 20, replica_id=-1, isolation_level=0)
    assert [r.value for r in decode_records(got.data)] == [b"r0", b"r1", b"r2"]
    assert (got.high_watermark, got.log_start_offset) == (3, 0)
    assert backend.leader_epoch("t", 0) == 3
    assert backend.end_offset_for_epoch("t", 0, 3).end_offset == 3
    assert backend.list_offset("t", 0, -1, isolation_level=0) == (-1, 3)
    assert backend.list_offset("t", 0, -2, isolation_level=0) == (-1, 0)
    assert lookup.addresses_asked == 1      # ListOffsets, OffsetForLeaderEpoch: same channel


def test_partitions_not_led_here_answer_not_leader_or_unknown(setup):
    """A partition another broker leads is NOT_LEADER_OR_FOLLOWER (clients refresh their
    metadata); one nobody knows is UNKNOWN_TOPIC_OR_PARTITION; nothing is sent."""
    backend, lookup, *_ = setup
    with pytest.raises(NotLeaderForPartitionError):
        backend.append("t", 1, memoryview(build([b"x"])), acks=1, timeout_ms=1000)
    with pytest.raises(NotLeaderForPartitionError):
        backend.read("t", 1, 0, 100, replica_id=-1, isolation_level=0)
    with pytest.raises(UnknownTopicOrPartitionError):
        backend.leader_epoch("other", 0)
    assert lookup.addresses_asked == 0


def test_a_new_replica_or_leader_epoch_gets_a_new_channel(setup, tmp_path):
    """The channel is reopened when the leader epoch changes, and when the replica actor
    was replaced or its channel died (the next request works, it is not refused)."""
    backend, lookup, leader, state, _ = setup
    wait(backend.append("t", 0, memoryview(build([b"a"])), acks=1, timeout_ms=1000), 5)
    leader.become_leader(4, [0], [0])
    state["leading"] = {("t", 0): 4}
    wait(backend.append("t", 0, memoryview(build([b"b"])), acks=1, timeout_ms=1000), 5)
    assert lookup.addresses_asked == 2
    leader.stop()                                   # its channel dies with it
    replacement = PartitionReplica("t", 0, 0, str(tmp_path / "again"), {})
    replacement.become_leader(4, [0], [0])
    lookup.replicas[("t", 0)] = replacement
    result = wait(backend.append("t", 0, memoryview(build([b"c"])), acks=1,
                                 timeout_ms=1000), 5)
    assert result.base_offset == 0 and lookup.addresses_asked == 3


def test_the_replicas_watch_wakes_the_purgatory_off_the_channel_thread(setup):
    """An append made directly on the replica (another channel, a Ray call) reaches
    ``on_change`` through the watch; a consumer read at the high watermark answers empty
    from what the watch said, without asking the replica."""
    backend, _, leader, _, notified = setup
    backend.read("t", 0, 0, 100, replica_id=-1, isolation_level=0)   # opens the link
    link = backend._links[("t", 0)]
    notified.clear()
    leader.produce(build([b"direct"]), acks=1)
    # the watch's first push (of the empty log) may land after the produce: wait for the
    # push that carries the record, not just any notification
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with link.lock:
            if link.tail_end >= 1 and link.high_watermark == 1:
                break
        time.sleep(0.01)
    assert link.tail_end >= 1
    deadline = time.monotonic() + 5
    while ("t", 0) not in notified and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("t", 0) in notified
    backend.read("t", 0, 0, 100, replica_id=-1, isolation_level=0)   # learns log start
    link.channel.fetch = None                        # any channel fetch would fail now
    empty = backend.read("t", 0, 1, 100, replica_id=-1, isolation_level=0)
    assert (empty.data, empty.high_watermark, empty.log_end_offset) == (b"", 1, 1)


def test_close_ends_the_notifier_and_the_channels(setup):
    """close() stops the notifier thread and closes every channel."""
    backend, *_ = setup
    backend.read("t", 0, 0, 100, replica_id=-1, isolation_level=0)
    link = backend._links[("t", 0)]
    backend.close()
    assert not link.channel.alive
    assert not any(t.name == "broker-0-notifier" and t.is_alive()
                   for t in threading.enumerate())


def test_listener_settings_follow_kafkas_listeners_config():
    """Default: the node's address on a free port; a fixed port P puts broker i on P+i; a
    wildcard binds everything and advertises the node; advertised.listeners wins; Kafka's
    socket settings pass through; a listener name without a security protocol is
    refused."""
    from actors.errors import IllegalArgumentError
    from actors.server.broker import listener_settings
    server, host, port = listener_settings(2, {}, "10.0.0.5")
    assert (server.host, server.port, host, port) == ("10.0.0.5", 0, None, None)
    server, host, port = listener_settings(
        2, {"listeners": "PLAINTEXT://127.0.0.1:9092", "socket.request.max.bytes": "1024",
            "queued.max.request.bytes": "4096", "num.io.threads": "0"}, "10.0.0.5")
    assert (server.host, server.port, host, port) == ("127.0.0.1", 9094, None, None)
    assert (server.socket_request_max_bytes, server.io_threads) == (1024, 0)
    server, host, port = listener_settings(1, {"listeners": "PLAINTEXT://0.0.0.0:0"},
                                           "10.0.0.5")
    assert (server.host, server.port, host, port) == ("0.0.0.0", 0, "10.0.0.5", None)
    server, host, port = listener_settings(1, {
        "listeners": "PLAINTEXT://0.0.0.0:9000",
        "advertised.listeners": "PLAINTEXT://kafka.example:19000"}, "10.0.0.5")
    assert (server.port, host, port) == (9001, "kafka.example", 19001)
    with pytest.raises(IllegalArgumentError, match="listener.security.protocol.map"):
        listener_settings(0, {"listeners": "CLIENTS://127.0.0.1:9093"}, None)


def test_a_replica_that_does_not_answer_times_the_read_out(setup, monkeypatch):
    """A channel fetch that gets no answer fails the read with KafkaTimeoutError after
    READ_TIMEOUT_S (REQUEST_TIMED_OUT on the wire) instead of holding the handler."""
    import concurrent.futures

    from actors.errors import KafkaTimeoutError
    from actors.server import broker_backend
    backend, _, leader, _, _ = setup
    leader.produce(build([b"x"]), acks=1)                # offset 0 is below the HW
    backend.read("t", 0, 0, 100, replica_id=-1, isolation_level=0)
    link = backend._links[("t", 0)]
    monkeypatch.setattr(broker_backend, "READ_TIMEOUT_S", 0.2)
    link.channel.fetch = lambda *a, **k: concurrent.futures.Future()   # never answered
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError):
        backend.read("t", 0, 0, 100, replica_id=-1, isolation_level=0)
    assert time.monotonic() - started < 2
    assert backend._links[("t", 0)] is link          # the channel itself still works


def test_follower_and_consumer_fetches_at_the_tail_are_answered_from_the_pushed_batches(
        tmp_path):
    """With a follower: after an append, a follower fetch and then a consumer fetch get the
    batch from the tail the watch pushed (no channel read or replica fetch), and the
    follower's position still reaches the leader replica (the HW moves past the batch)."""
    lookup = _Lookup()
    leader = PartitionReplica("t", 0, 0, str(tmp_path), {})
    leader.become_leader(3, [0, 1], [0, 1])
    lookup.replicas[("t", 0)] = leader
    metadata = {"controller_id": 0, "brokers": {0: {"host": "127.0.0.1", "port": 9092}},
                "topics": {"t": {0: {"leader": 0, "leader_epoch": 3, "isr": [0, 1],
                                     "replicas": [0, 1]}}}}
    backend = BrokerBackend(0, metadata=lambda: metadata,
                            leader_epochs=lambda: {("t", 0): 3}, replicas=lookup,
                            endpoint=BrokerEndpoint(0, "127.0.0.1", 9092))
    try:
        batch = build([b"r0", b"r1"])
        wait(backend.append("t", 0, memoryview(batch), acks=1, timeout_ms=5000), 5)
        link = backend._links[("t", 0)]
        deadline = time.monotonic() + 5
        while link.tail_end != 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        link.channel.fetch = link.channel.replica_fetch = None   # a read would fail now
        got = backend.read("t", 0, 0, 1 << 20, replica_id=1, isolation_level=0)
        assert bytes(got.data) == leader.log.read(0, 1 << 20)
        # the follower now has both records: its next fetch says so, the HW moves
        backend.read("t", 0, 2, 1 << 20, replica_id=1, isolation_level=0)
        while link.high_watermark != 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert leader.high_watermark == 2 and link.high_watermark == 2
        seen = backend.read("t", 0, 0, 1 << 20, replica_id=-1, isolation_level=0)
        assert [r.value for r in decode_records(bytes(seen.data))] == [b"r0", b"r1"]
    finally:
        backend.close()
        leader.stop()
