"""Client-side metadata: which partitions a topic has, which broker leads each, and where
each broker's Kafka listener is.

Read from any live broker's metadata cache (the controller keeps those current) with a Ray
call, cached here, and refreshed when a caller reports a stale answer (``invalidate``):
a refresh is not the steady state. The data path (Producer, Consumer, SimpleConsumer)
needs only ``leader_broker`` and ``broker_address``, both answered from the cache without a
call. ``leader`` gives the leader replica's Ray actor handle (looked up by name, cached per
(topic, partition, leader, leader_epoch), so a new leader or a restarted broker is never
served from a stale handle) for the control plane and the jobs' bulk reads.
"""

from __future__ import annotations

import random
import threading
import time
from typing import NamedTuple

import ray

from ..protocol import broker_actor_name, replica_actor_name
from ..errors import (BrokerNotAvailableError, LeaderNotAvailableError, NoBrokersAvailable,
                      UnknownTopicOrPartitionError)

METADATA_CALL_TIMEOUT_S = 10.0
# how long a newest-refresh waits for other brokers once one has answered
NEWEST_GRACE_S = 0.5


class LeaderRef(NamedTuple):
    handle: object
    broker_id: int
    leader_epoch: int


def broker_handle(namespace: str, broker_id: int):
    return ray.get_actor(broker_actor_name(broker_id), namespace=namespace)


def answers_within(refs: dict, timeout_s: float) -> tuple[dict, list]:
    """The answers to Ray calls ``refs`` ({object ref: key}) that arrive within one deadline
    of ``timeout_s``, all awaited together (one ray.wait): ``({key: value}, [keys with no
    answer])``. A call that failed (a dead actor, a typed refusal) has no answer either; a
    paused actor costs the deadline once, however many calls it has."""
    if not refs:
        return {}, []
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    answers = {}
    for ref in ready:
        try:
            answers[refs[ref]] = ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - no figure from this one
            continue
    return answers, [key for key in refs.values() if key not in answers]


def first_answer(refs: dict, timeout_s: float, *, accept=None) -> tuple:
    """The first good answer among Ray calls ``refs`` ({object ref: key}) sent together:
    ``(key, value)`` as soon as one arrives, so a paused actor never holds it up and a dead
    one's error is skipped. ``accept(key, value)`` may turn an answer down by raising.
    ``(None, the last error)`` when none answered well within ``timeout_s``."""
    pending, last = list(refs), None
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            break
        try:
            value = ray.get(ready[0], timeout=0)
            if accept is not None:
                value = accept(refs[ready[0]], value)
            return refs[ready[0]], value
        except Exception as exc:  # noqa: BLE001 - another may answer
            last = exc
    return None, last


def _stamp(snapshot: dict) -> tuple:
    """How new a broker's metadata snapshot is: (controller epoch, request id) of the
    UpdateMetadata that brought it."""
    return tuple(snapshot.get("stamp") or (snapshot.get("controller_epoch", 0), 0))


class Metadata:
    """Topic → partition → leader, from the brokers' caches. Thread-safe."""

    def __init__(self, namespace: str, broker_ids):
        self.namespace = namespace
        self._broker_ids = list(broker_ids)
        self._lock = threading.Lock()
        self._snapshot: dict = {"topics": {}, "brokers": {}}
        self._fetched_at = 0.0
        self._handles: dict[tuple, object] = {}

    # -- reading the cluster -----------------------------------------------------------------
    def refresh(self, *, newest: bool = False) -> dict:
        """Ask every candidate broker at once and keep the first snapshot with a controller
        (a paused or dead broker never holds a refresh up); with ``newest``, keep the newest
        (highest controller stamp) of the answers that arrive within a short grace after
        the first. Brokers receive UpdateMetadata one by one, so right after a change one
        cache can lag another: a lookup that misses asks for the newest before it says
        "unknown"."""
        ids = self._candidate_ids()
        random.shuffle(ids)
        pending, last_exc = self._ask_all(ids)
        best = None
        deadline = time.monotonic() + METADATA_CALL_TIMEOUT_S
        while pending:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                break
            pending.pop(ready[0])
            try:
                snap = ray.get(ready[0], timeout=0)
            except Exception as exc:  # noqa: BLE001 - the others may answer
                last_exc = exc
                continue
            if best is None or _stamp(snap) > _stamp(best):
                best = snap
            if best.get("controller_epoch", 0) > 0:
                if not newest:
                    break
                # the newest of what the others answer within a short grace
                deadline = min(deadline, time.monotonic() + NEWEST_GRACE_S)
        if best is None:
            raise NoBrokersAvailable(f"no broker of namespace {self.namespace!r} answered "
                                     f"({last_exc!r})")
        with self._lock:
            self._snapshot = best
            self._fetched_at = time.monotonic()
        return best

    def _candidate_ids(self) -> list[int]:
        """Brokers to ask: the live ones of the last snapshot, then every broker id the
        cluster was started with (the last snapshot's brokers may all be dead now)."""
        live = [int(i) for i in (self._snapshot.get("brokers") or {})]
        return live + [b for b in self._broker_ids if b not in live]

    def snapshot(self) -> dict:
        with self._lock:
            snap = self._snapshot
        return snap if self._fetched_at else self.refresh()

    def invalidate(self, topic: str | None = None) -> None:
        """Re-read the metadata on next use, and look the leader replicas of ``topic`` (all
        topics when None) up again by name: a broker that restarted before the controller
        noticed serves the same (leader, epoch) from new replica actors."""
        with self._lock:
            self._fetched_at = 0.0
            for key in list(self._handles):       # list(): atomic against inserts
                if topic is None or key[0] == topic:
                    self._handles.pop(key, None)

    # -- the interface clients use -----------------------------------------------------------
    def topics(self) -> dict:
        return self.snapshot().get("topics", {})

    def partitions_for(self, topic: str) -> list[int]:
        parts = self.snapshot().get("topics", {}).get(topic)
        if parts is None:
            parts = self.refresh(newest=True).get("topics", {}).get(topic)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return sorted(int(p) for p in parts)

    def partition_state(self, topic: str, partition: int) -> dict:
        parts = self.snapshot().get("topics", {}).get(topic)
        if parts is None or partition not in parts:
            parts = self.refresh(newest=True).get("topics", {}).get(topic)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        if partition not in parts:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} (partitions 0..{len(parts) - 1})")
        return parts[partition]

    def leader_broker(self, topic: str, partition: int) -> tuple[int, int]:
        """(broker id, leader epoch) of the partition's leader, from the cached metadata
        (LeaderNotAvailableError while it has none: the next lookup re-reads)."""
        state = self.partition_state(topic, partition)
        if state["leader"] < 0:
            self.invalidate(topic)
            raise LeaderNotAvailableError(f"{topic}-{partition} has no live leader")
        return int(state["leader"]), int(state["leader_epoch"])

    def broker_address(self, broker_id: int, protocol: str = "PLAINTEXT") -> tuple[str, int]:
        """(host, port) of ``broker_id``'s first listener of security ``protocol`` (its
        only listener when it registered no names), from the cached metadata, re-read once
        when it does not list the broker (BrokerNotAvailableError, retriable, when it
        still does not)."""
        for fresh in (False, True):
            brokers = (self.refresh() if fresh else self.snapshot()).get("brokers") or {}
            info = brokers.get(broker_id) or brokers.get(str(broker_id))
            if not info or not info.get("port"):
                continue
            listeners = info.get("listeners")
            if not listeners:
                return info["host"], int(info["port"])
            for _, listener_protocol, host, port in listeners:
                if listener_protocol == protocol:
                    return host, int(port)
            raise BrokerNotAvailableError(
                f"broker {broker_id} has no {protocol} listener (it has "
                f"{', '.join(f'{n} ({p})' for n, p, _, _ in listeners)}): check "
                f"security_protocol")
        raise BrokerNotAvailableError(f"broker {broker_id} has no live Kafka listener in "
                                      f"the metadata")

    def leader(self, topic: str, partition: int) -> LeaderRef:
        state = self.partition_state(topic, partition)
        leader, epoch = state["leader"], state["leader_epoch"]
        if leader < 0:
            self.invalidate(topic)   # "no leader" is transient: ask the brokers next time
            raise LeaderNotAvailableError(f"{topic}-{partition} has no live leader")
        key = (topic, partition, leader, epoch)
        handle = self._handles.get(key)
        if handle is None:
            try:
                handle = ray.get_actor(replica_actor_name(topic, partition, leader),
                                       namespace=self.namespace)
            except ValueError:
                self.invalidate(topic)
                raise LeaderNotAvailableError(
                    f"{topic}-{partition}: leader replica on broker {leader} is not up yet"
                ) from None
            self._handles[key] = handle
        return LeaderRef(handle, leader, epoch)

    def wait_for_leaders(self, topic: str, *, timeout_s: float, exists: bool = True,
                         partitions: int = 1) -> None:
        """Block until every live broker's metadata shows at least ``partitions`` partitions
        of ``topic``, every one with a leader, and each leader replica answers to its name
        (or, with ``exists=False``, until no broker's metadata lists the topic): after it
        returns, a client in any process, whichever broker it asks, finds the topic as it
        now is."""
        from ..errors import KafkaTimeoutError
        deadline = time.monotonic() + timeout_s
        while True:
            snaps = self._live_snapshots()
            done = bool(snaps)
            for snap in snaps:
                parts = snap.get("topics", {}).get(topic)
                if exists:
                    done &= (bool(parts) and len(parts) >= partitions
                             and all(s["leader"] >= 0 for s in parts.values()))
                else:
                    done &= parts is None
            if done and exists:
                self.refresh(newest=True)
                try:
                    found = self.partitions_for(topic)
                    done = len(found) >= partitions
                    for p in found:
                        self.leader(topic, p)
                except (LeaderNotAvailableError, UnknownTopicOrPartitionError):
                    done = False
            if done:
                return
            if time.monotonic() > deadline:
                what = "leaders" if exists else "deletion"
                raise KafkaTimeoutError(f"timed out after {timeout_s}s waiting for {what} of "
                                        f"topic {topic!r}")
            time.sleep(0.05)

    def _ask_all(self, ids: list[int]) -> tuple[dict, BaseException | None]:
        """get_metadata sent to every broker in ``ids`` at once: ({ref: broker id}, the error
        of the last broker that could not be asked)."""
        refs, last_exc = {}, None
        for bid in ids:
            try:
                refs[broker_handle(self.namespace, bid).get_metadata.remote()] = bid
            except Exception as exc:  # noqa: BLE001 - a broker that is not there
                last_exc = exc
        return refs, last_exc

    def _live_snapshots(self) -> list[dict]:
        """The metadata of every broker that answers and that the newest answer lists as
        live (a broker that is not registered any more keeps an old cache: it is skipped)."""
        refs, _ = self._ask_all(self._candidate_ids())
        answers = []
        for ref, bid in refs.items():
            try:
                answers.append((bid, ray.get(ref, timeout=METADATA_CALL_TIMEOUT_S)))
            except Exception:  # noqa: BLE001 - a dead or slow broker knows nothing
                continue
        if not answers:
            return []
        newest = max((snap for _, snap in answers), key=_stamp)
        live = {int(b) for b in newest.get("brokers", {})}
        return [snap for bid, snap in answers if bid in live]
