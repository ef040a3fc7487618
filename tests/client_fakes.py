"""Test doubles for the clients' seam to the cluster: ``FakeMetadata`` implements the
``Metadata`` interface (partitions_for / leader / invalidate) over real PartitionReplica
actors that the test creates itself, with no broker, controller or ZooKeeper.

A test can move leadership the way the cluster would: ``kill_leader`` (the actor dies
abruptly, as with a lost broker) and ``demote_leader`` (it becomes a follower and answers
NotLeaderForPartition), then ``elect`` a new leader replica on the same partition directory
(so it recovers the old leader's log from disk, as a restarted broker would) with a higher
leader epoch. While no leader is set, ``leader()`` raises LeaderNotAvailableError.
"""

from __future__ import annotations

import threading
import time

from actors import raycompat
from actors.client.metadata import LeaderRef
from actors.errors import LeaderNotAvailableError, UnknownTopicOrPartitionError
from actors.server.replica import PartitionReplica

ray = raycompat.ray

Replica = ray.remote(PartitionReplica)


def start_ray() -> None:
    raycompat.init_local("raykafka-client-tests", num_cpus=4)


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


def wait_until(predicate, *, timeout_s: float = 30.0, interval_s: float = 0.02,
               what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned); fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class FakeMetadata:
    """Topic → partition → leader replica actor, set by the test. Thread-safe.

    ``refreshes`` counts the re-reads a client caused (``invalidate`` then a lookup), and
    ``invalidations`` the ``invalidate`` calls.
    """

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._topics: dict[str, dict[int, LeaderRef | None]] = {}
        self._epochs: dict[tuple, int] = {}
        self._broker_ids: dict[tuple, int] = {}
        self.invalidations = 0
        self.leader_lookups = 0
        self._actors: list = []
        self._pending: dict[tuple, LeaderRef] = {}

    # -- the Metadata interface ----------------------------------------------------------
    def partitions_for(self, topic: str) -> list[int]:
        with self._lock:
            parts = self._topics.get(topic)
            if parts is None:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
            return sorted(parts)

    def leader(self, topic: str, partition: int) -> LeaderRef:
        with self._lock:
            self.leader_lookups += 1
            parts = self._topics.get(topic)
            if parts is None or partition not in parts:
                raise UnknownTopicOrPartitionError(f"unknown {topic}-{partition}")
            ref = parts[partition]
            if ref is None:
                raise LeaderNotAvailableError(f"{topic}-{partition} has no leader")
            return ref

    def invalidate(self, topic: str | None = None) -> None:
        with self._lock:
            self.invalidations += 1
            for (t, p), ref in list(self._pending.items()):
                if topic is None or t == topic:
                    self._topics[t][p] = ref
                    del self._pending[(t, p)]

    # -- what tests use --------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, log_config: dict | None = None
                     ) -> None:
        handles = [self._start_replica(topic, p, broker_id=0, log_config=log_config,
                                       wait=False) for p in range(partitions)]
        ray.get([h.become_leader.remote(0, [0], [0]) for h in handles], timeout=60)
        refs = {}
        for p, handle in enumerate(handles):
            refs[p] = LeaderRef(handle, 0, 0)
            self._epochs[(topic, p)] = 0
            self._broker_ids[(topic, p)] = 0
        self._actors.extend(handles)
        with self._lock:
            self._topics[topic] = refs

    def _start_replica(self, topic: str, partition: int, broker_id: int,
                       log_config: dict | None = None, wait: bool = True):
        handle = Replica.options(max_concurrency=8).remote(
            topic, partition, broker_id=broker_id, data_dir=self.data_dir,
            log_config=log_config)
        if wait:
            ray.get(handle.ready.remote(), timeout=60)
            self._actors.append(handle)
        return handle

    def shutdown(self) -> None:
        """Kill every replica actor this fake started (their processes go back to Ray)."""
        for handle in self._actors:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors.clear()
        with self._lock:
            self._topics.clear()

    def handle(self, topic: str, partition: int):
        with self._lock:
            ref = self._topics[topic][partition]
        assert ref is not None, f"{topic}-{partition} has no leader"
        return ref.handle

    def unset_leader(self, topic: str, partition: int):
        """Forget the leader (clients now see LeaderNotAvailable); returns its handle."""
        with self._lock:
            ref = self._topics[topic][partition]
            self._topics[topic][partition] = None
        return ref.handle if ref is not None else None

    def kill_leader(self, topic: str, partition: int) -> None:
        """The leader actor dies abruptly (its process is killed, nothing is closed)."""
        handle = self.unset_leader(topic, partition)
        ray.kill(handle, no_restart=True)

    def demote_leader(self, topic: str, partition: int, *, stale: bool = False) -> None:
        """The leader becomes a follower (answers NotLeaderForPartition), then closes its
        log so that another replica may open the directory. ``stale=True``: the metadata
        keeps naming it (as a client's cache would) until the next ``elect``."""
        with self._lock:
            ref = self._topics[topic][partition]
        epoch = self._epochs[(topic, partition)] + 1
        ray.get(ref.handle.become_follower.remote(ref.broker_id + 1, epoch, [0], [0]),
                timeout=30)
        if not stale:
            self.unset_leader(topic, partition)
        ray.get(ref.handle.stop.remote(), timeout=30)

    def elect(self, topic: str, partition: int, *, deferred: bool = False) -> None:
        """Start a new leader replica on the partition's directory with a higher epoch.
        ``deferred=True``: clients see it only after their next ``invalidate``."""
        key = (topic, partition)
        broker_id = self._broker_ids[key] + 1
        epoch = self._epochs[key] + 1
        handle = self._start_replica(topic, partition, broker_id=broker_id)
        ray.get(handle.become_leader.remote(epoch, [broker_id], [broker_id]), timeout=30)
        self._epochs[key] = epoch
        self._broker_ids[key] = broker_id
        with self._lock:
            if deferred:
                self._pending[key] = LeaderRef(handle, broker_id, epoch)
            else:
                self._topics[topic][partition] = LeaderRef(handle, broker_id, epoch)

    def end_offset(self, topic: str, partition: int) -> int:
        state = ray.get(self.handle(topic, partition).state.remote(), timeout=30)
        return state["log_end_offset"]

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: self.end_offset(topic, p) for p in self.partitions_for(topic)}
