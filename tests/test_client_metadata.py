"""The data clients' metadata over Kafka's Metadata request (actors/client/metadata.py
WireMetadata), with a fake network: how an answer becomes the cache, how the brokers'
answers merge, and that refreshes neither recurse nor pile up. The real cluster's side is
in test_client_wire.py."""

from __future__ import annotations

import concurrent.futures
import threading
import time

from actors.client.metadata import Metadata, WireMetadata, newest_of, snapshot_of


def _answer(epochs: dict, brokers=(0, 1, 2), controller_id: int = 0, errors=()) -> dict:
    """A Metadata response body: ``epochs`` {topic: [leader epoch per partition]}, each
    partition led by broker (partition % 3)."""
    topics = [{"error_code": 0, "name": t, "is_internal": False, "partitions": [
        {"error_code": 0, "partition_index": p, "leader_id": p % 3, "leader_epoch": e,
         "replica_nodes": [0, 1, 2], "isr_nodes": [p % 3], "offline_replicas": []}
        for p, e in enumerate(es)]} for t, es in epochs.items()]
    topics += [{"error_code": 3, "name": t, "is_internal": False, "partitions": []}
               for t in errors]
    return {"throttle_time_ms": 0, "cluster_id": "c", "controller_id": controller_id,
            "brokers": [{"node_id": b, "host": "127.0.0.1", "port": 9000 + b, "rack": None}
                        for b in brokers],
            "topics": topics}


def test_an_answer_becomes_the_cache_without_the_topics_answered_with_an_error():
    """snapshot_of keeps each partition's leader, epoch, replicas and ISR, each broker's
    listener, the controller; a topic answered with an error code is left out."""
    snap = snapshot_of(_answer({"a": [4, 7]}, errors=["gone"]))
    assert snap["topics"] == {"a": {
        0: {"leader": 0, "leader_epoch": 4, "replicas": [0, 1, 2], "isr": [0], "offline": []},
        1: {"leader": 1, "leader_epoch": 7, "replicas": [0, 1, 2], "isr": [1], "offline": []}}}
    assert snap["brokers"][2] == {"host": "127.0.0.1", "port": 9002, "rack": None}
    assert snap["controller_id"] == 0


def test_answers_merge_by_leader_epoch_per_partition_and_keep_topics_only_one_knows():
    """newest_of starts from the answer newest as a whole, takes every partition another
    answer shows in a later leader epoch from that one, and adds a topic only another
    answer lists (just made)."""
    older = snapshot_of(_answer({"a": [5, 1]}, brokers=(0, 1)))
    newer = snapshot_of(_answer({"a": [3, 9], "new": [0]}, brokers=(1, 2)))
    merged = newest_of([older, newer])
    assert {p: s["leader_epoch"] for p, s in merged["topics"]["a"].items()} == {0: 5, 1: 9}
    assert set(merged["topics"]) == {"a", "new"}
    assert set(merged["brokers"]) == {1, 2}            # the newest answer's brokers


class _FakeNetwork:
    """BrokerConnections' ``send`` as a client sees it: the address is looked up in the
    metadata first (as opening a connection does), then the canned answer comes back."""

    def __init__(self, metadata, answer: dict, delay_s: float = 0.0):
        self.metadata, self.answer, self.delay_s = metadata, answer, delay_s
        self.sent = 0
        self._lock = threading.Lock()

    def send(self, broker_id, api_key, body, *, purpose="data", expect_response=True):
        self.metadata.broker_address(broker_id)
        with self._lock:
            self.sent += 1
        time.sleep(self.delay_s)
        future = concurrent.futures.Future()
        future.set_result(self.answer)
        return future

    def drop(self, broker_id, purpose=None):
        pass


def _wire_metadata(answer: dict, delay_s: float = 0.0) -> tuple[WireMetadata, _FakeNetwork]:
    base = Metadata("ns", [0, 1, 2])
    base._snapshot, base._fetched_at = snapshot_of(answer), time.monotonic()
    metadata = WireMetadata(base)
    network = _FakeNetwork(metadata, answer, delay_s)
    metadata.attach(network)
    return metadata, network


def test_a_refresh_after_an_invalidation_asks_each_broker_once_and_never_recursively():
    """An invalidated cache refreshed: the address lookups of the refresh's own requests
    use the cached snapshot instead of starting another refresh (which once started
    threads without end), and the answer is the new cache."""
    metadata, network = _wire_metadata(_answer({"a": [1]}))
    metadata.invalidate()
    assert metadata.leader_broker("a", 0) == (0, 1)
    assert network.sent <= 3
    assert (metadata.wire_refreshes, metadata.ray_refreshes) == (1, 0)


def test_callers_that_come_during_a_refresh_take_its_answer():
    """Eight threads that find the cache invalidated at once make one refresh between
    them, not eight."""
    metadata, network = _wire_metadata(_answer({"a": [1]}), delay_s=0.2)
    metadata.invalidate()
    threads = [threading.Thread(target=metadata.partitions_for, args=("a",))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert metadata.wire_refreshes == 1
    assert network.sent <= 3


def test_a_broker_that_does_not_answer_is_not_asked_again_by_later_refreshes():
    """A paused broker (its request never answered) is asked by the first refresh only:
    the refreshes after it, answered by the other brokers, start no new thread for it
    while the first one still waits."""
    metadata, network = _wire_metadata(_answer({"a": [1]}))
    paused = threading.Event()
    asked_paused = []
    send = network.send

    def send_or_hang(broker_id, api_key, body, **kwargs):
        if broker_id == 1:
            asked_paused.append(1)
            paused.wait(10)
        return send(broker_id, api_key, body, **kwargs)

    network.send = send_or_hang
    try:
        for _ in range(5):
            metadata.refresh()
        assert metadata.wire_refreshes == 5
        assert asked_paused == [1]
    finally:
        paused.set()
