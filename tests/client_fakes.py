"""Test doubles for the clients' seam to the cluster: ``FakeMetadata`` implements the
``Metadata`` interface (partitions_for / leader_broker / broker_address / leader /
invalidate) over real PartitionReplica actors that the test creates itself, with no Broker
actor, controller or ZooKeeper. Each broker id it names has a real Kafka listener in the
test's process (``FakeBroker``: the broker's own SocketServer, KafkaApis and BrokerBackend,
reaching the replica actors over their local channels), so the clients run on the wire
path they use in a cluster.

A test can move leadership the way the cluster would: ``kill_leader`` (the actor dies
abruptly, as with a lost broker) and ``demote_leader`` (it becomes a follower and answers
NotLeaderForPartition), then ``elect`` a new leader replica on the same partition directory
(so it recovers the old leader's log from disk, as a restarted broker would) with a higher
leader epoch. While no leader is set, ``leader()`` raises LeaderNotAvailableError.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from actors import raycompat
from actors.client.metadata import LeaderRef
from actors.errors import (BrokerNotAvailableError, LeaderNotAvailableError,
                           UnknownTopicOrPartitionError)
from actors.server.broker_backend import BrokerBackend, RayReplicaLookup
from actors.server.handlers import BrokerEndpoint, KafkaApis
from actors.server.network import SocketServer, SocketServerConfig
from actors.server.replica import PartitionReplica

ray = raycompat.ray

Replica = ray.remote(PartitionReplica)


def start_ray() -> None:
    raycompat.init_local("raykafka-client-tests", num_cpus=4)


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def client_ray(request):
    """The client modules' private local Ray (4 logical CPUs), started for the first of a run
    of consecutive modules that use this fixture and kept for the next (conftest groups
    them), as cluster_helpers.local_ray."""
    from cluster_helpers import next_module_uses
    start_ray()
    yield
    if not next_module_uses(request, "client_ray"):
        stop_ray()


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


_PRODUCER_IDS = itertools.count(1000)


def fake_producer_ids():
    """InitProducerId for a fake broker: ids unique in this process (idempotent producers
    are the default)."""
    from actors.server.producer_handlers import ProducerIdApis
    return ProducerIdApis(lambda: next(_PRODUCER_IDS))


class FakeBroker:
    """A broker's Kafka listener on 127.0.0.1 (a free port) in this process, in front of
    the replica actors ``leads()`` names: ``{(topic, partition): (leader_epoch, handle)}``
    of the partitions this broker leads now. ``snapshot()`` is the metadata it answers."""

    def __init__(self, broker_id: int, *, snapshot, leads):
        self.broker_id = broker_id
        self._leads = leads

        class Replicas:
            @staticmethod
            def get(topic, partition):
                hit = leads().get((topic, partition))
                return None if hit is None else hit[1]

        self.backend = BrokerBackend(
            broker_id, metadata=snapshot,
            leader_epochs=lambda: {tp: e for tp, (e, _) in leads().items()},
            replicas=RayReplicaLookup(Replicas()),
            endpoint=BrokerEndpoint(broker_id, "127.0.0.1", 0))
        self.apis = KafkaApis(self.backend, producers=fake_producer_ids())
        self.backend.on_change = self.apis.notify
        self.backend.on_change_inline = self.apis.notify_inline
        self.server = SocketServer(self.apis, SocketServerConfig(io_threads=4)).start()
        self.backend.loop = self.server         # as a Broker's: channels on its thread
        self.address = ("127.0.0.1", self.server.port)
        self.backend.endpoint = BrokerEndpoint(broker_id, *self.address)

    def close(self) -> None:
        self.server.close()
        self.apis.close()
        self.backend.close()


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
        # what the brokers know (a deferred election is here at once): (t, p) -> LeaderRef
        self._leading: dict[tuple, LeaderRef] = {}
        self._brokers: dict[int, FakeBroker] = {}

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

    def leader_broker(self, topic: str, partition: int) -> tuple[int, int]:
        ref = self.leader(topic, partition)
        return ref.broker_id, ref.leader_epoch

    def broker_address(self, broker_id: int) -> tuple[str, int]:
        with self._lock:
            broker = self._brokers.get(broker_id)
        if broker is None:
            raise BrokerNotAvailableError(f"no broker {broker_id}")
        return broker.address

    def broker(self, broker_id: int) -> FakeBroker:
        """Broker ``broker_id``'s listener (started on first use)."""
        with self._lock:
            broker = self._brokers.get(broker_id)
            if broker is None:
                broker = self._brokers[broker_id] = FakeBroker(
                    broker_id, snapshot=self._snapshot,
                    leads=lambda: self._leads(broker_id))
            return broker

    def _leads(self, broker_id: int) -> dict:
        with self._lock:
            return {tp: (ref.leader_epoch, ref.handle) for tp, ref in self._leading.items()
                    if ref is not None and ref.broker_id == broker_id}

    def _snapshot(self) -> dict:
        with self._lock:
            topics: dict = {}
            for (t, p), ref in self._leading.items():
                leader = -1 if ref is None else ref.broker_id
                topics.setdefault(t, {})[p] = {
                    "leader": leader, "leader_epoch": self._epochs.get((t, p), 0),
                    "replicas": [max(leader, 0)], "isr": [max(leader, 0)]}
            brokers = {bid: {"host": b.address[0], "port": b.address[1]}
                       for bid, b in self._brokers.items()}
        return {"topics": topics, "brokers": brokers, "controller_id": -1}

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
        self.broker(0)
        with self._lock:
            self._topics[topic] = refs
            for p, ref in refs.items():
                self._leading[(topic, p)] = ref

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
            self._leading.clear()
            brokers, self._brokers = list(self._brokers.values()), {}
        for broker in brokers:
            broker.close()

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
            self._leading[(topic, partition)] = None
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
        self.broker(broker_id)
        with self._lock:
            self._leading[key] = LeaderRef(handle, broker_id, epoch)
            if deferred:
                self._pending[key] = LeaderRef(handle, broker_id, epoch)
            else:
                self._topics[topic][partition] = LeaderRef(handle, broker_id, epoch)

    def end_offset(self, topic: str, partition: int) -> int:
        state = ray.get(self.handle(topic, partition).state.remote(), timeout=30)
        return state["log_end_offset"]

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: self.end_offset(topic, p) for p in self.partitions_for(topic)}


# -- scripted brokers: a real listener over a Backend the test scripts ----------------------
class Script:
    """Answers calls from a script, in order (the last answer repeats): an exception is
    raised, a callable is called with the call's arguments, anything else is returned.
    ``calls`` records the arguments."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list = []
        self._lock = threading.Lock()

    def __call__(self, *args):
        with self._lock:
            self.calls.append(args)
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(*args)
        return answer


class ScriptedBackend:
    """A handlers Backend (what a broker serves) for topic ``topic`` whose data calls go
    to scripts: ``produce(records bytes, acks, timeout_ms)`` -> ProduceResult,
    ``fetch(partition, offset, max_bytes)`` -> FetchResult, ``list_offsets(partition,
    timestamp)`` -> offset. Unscripted calls raise NotLeaderForPartitionError."""

    cluster_id = None

    def __init__(self, partitions: int = 1, *, topic: str = "t", produce=None, fetch=None,
                 list_offsets=None):
        from actors.errors import NotLeaderForPartitionError
        refuse = Script(NotLeaderForPartitionError("not scripted"))
        self.topic, self.n = topic, partitions
        self.produce = produce or refuse
        self.fetch = fetch or refuse
        self.list_offsets = list_offsets or refuse
        self.endpoint = None

    def brokers(self):
        return [self.endpoint] if self.endpoint else []

    def controller_id(self) -> int:
        return -1

    def topics(self):
        return [self.topic]

    def partitions(self, topic):
        from actors.server.handlers import PartitionMetadata
        if topic != self.topic:
            return None
        return [PartitionMetadata(p, 0, 0, (0,), (0,)) for p in range(self.n)]

    def leader_epoch(self, topic, partition) -> int:
        if topic != self.topic or not 0 <= partition < self.n:
            raise UnknownTopicOrPartitionError(f"{topic}-{partition}")
        return 0

    def append(self, topic, partition, records, *, acks, timeout_ms):
        return self.produce(bytes(records), acks, timeout_ms)

    def read(self, topic, partition, offset, max_bytes, *, replica_id, isolation_level,
             cached_only=False):
        if cached_only:          # a script may block: never on the network thread
            from actors.server.handlers import NeedsReplica
            raise NeedsReplica()
        return self.fetch(partition, offset, max_bytes)

    def linked(self, topic, partition) -> bool:
        return False             # produces go to the io threads (a script may block)

    def list_offset(self, topic, partition, timestamp, *, isolation_level,
                    from_follower=False):
        return -1, self.list_offsets(partition, timestamp)

    def end_offset_for_epoch(self, topic, partition, leader_epoch):
        raise UnknownTopicOrPartitionError("not scripted")


class RecordingApis(KafkaApis):
    """KafkaApis that records what each Fetch asked (``fetches``: (max_wait_ms,
    min_bytes, [(topic, partition, fetch_offset)])) and each Produce carried
    (``produces``: [(topic, partition, records bytes)]); ``long_poll=False`` answers every
    Fetch at once, whatever its wait."""

    def __init__(self, backend, *, long_poll: bool = True):
        super().__init__(backend, producers=fake_producer_ids())
        self.fetches: list = []
        self.produces: list = []
        self.long_poll = long_poll
        self._record_lock = threading.Lock()

    def fetch(self, request, inline: bool = False):
        from actors import wire
        from actors.server.handlers import NeedsReplica, _FetchRead
        if inline:                # recorded once, on the io thread
            raise NeedsReplica()
        body = self._body(request)
        with self._record_lock:
            self.fetches.append((body["max_wait_ms"], body["min_bytes"],
                                 [(t["topic"], p["partition"], p["fetch_offset"])
                                  for t in body["topics"] for p in t["partitions"]]))
        if not self.long_poll:
            return wire.encode_response_parts(request.header,
                                              _FetchRead(self.backend, body)()[0])
        return super().fetch(request)

    def produce(self, request, inline: bool = False):
        from actors.server.handlers import NOT_INLINE
        if inline:                # recorded once, on the io thread
            return NOT_INLINE
        body = self._body(request)
        with self._record_lock:
            self.produces.append([(t["name"], p["index"], bytes(p["records"]))
                                  for t in body["topic_data"] for p in t["partition_data"]])
        return super().produce(request)


class WireBroker:
    """A broker's Kafka listener on 127.0.0.1 in this process over ``backend`` (its
    ``notify(topic, partition)`` is set to wake parked fetches, if it has the attribute
    ``notify``); ``apis`` records the requests (RecordingApis)."""

    def __init__(self, backend, broker_id: int = 0, *, long_poll: bool = True):
        self.backend = backend
        self.apis = RecordingApis(backend, long_poll=long_poll)
        if hasattr(backend, "notify"):
            backend.notify = self.apis.notify
        self.server = SocketServer(self.apis, SocketServerConfig(io_threads=4)).start()
        self.address = ("127.0.0.1", self.server.port)
        backend.endpoint = BrokerEndpoint(broker_id, *self.address)

    def close(self) -> None:
        self.server.close()
        self.apis.close()


class WireMetadata:
    """Client metadata over WireBrokers: topic ``topic``'s partition ``p`` is led by
    ``brokers[leaders[p]]`` (default: all by broker 0); ``lookup_errors`` are raised by
    the first ``leader_broker`` calls (as the client's Metadata raises them);
    ``invalidations`` counts ``invalidate``. It is its own cluster (``.metadata``)."""

    def __init__(self, brokers, *, partitions: int = 1, leaders=None, lookup_errors=(),
                 topic: str = "t"):
        self.brokers = list(brokers)
        self.topic = topic
        self.leaders = list(leaders) if leaders is not None else [0] * partitions
        self.lookup_errors = list(lookup_errors)
        self.invalidations = 0
        self.metadata = self

    def partitions_for(self, topic):
        if topic != self.topic:
            raise UnknownTopicOrPartitionError(topic)
        return list(range(len(self.leaders)))

    def leader_broker(self, topic, partition):
        if self.lookup_errors:
            raise self.lookup_errors.pop(0)
        if topic != self.topic or not 0 <= partition < len(self.leaders):
            raise UnknownTopicOrPartitionError(f"{topic}-{partition}")
        return self.leaders[partition], 0

    def broker_address(self, broker_id):
        return self.brokers[broker_id].address

    def invalidate(self, topic=None):
        self.invalidations += 1
