"""Client-side metadata: which partitions a topic has, which broker leads each, and where
each broker's Kafka listener is.

``Metadata`` reads any live broker's metadata cache (the controller keeps those current)
with a Ray call, caches it, and reads it again when a caller reports a stale answer
(``invalidate``): a refresh is not the steady state. The Cluster, Admin and the jobs use
it. ``leader`` gives the leader replica's Ray actor handle (looked up by name, cached per
(topic, partition, leader, leader_epoch), so a new leader or a restarted broker is never
served from a stale handle) for the control plane and the jobs' bulk reads.

``WireMetadata`` is the data clients' (Producer, Consumer, SimpleConsumer: each makes its
own with ``client_metadata``): the same cache, refreshed as Kafka's clients refresh it,
with a Metadata request over the client's own connections (``attach``) to every broker
it knows at once, the first answer taken (a paused or dead broker never holds a refresh
up). Ray is asked only when no listener answers (every broker it knew restarted on new
ports, say). The data path needs only ``leader_broker`` and ``broker_address``, both
answered from the cache without a request.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from typing import NamedTuple

import ray

from .. import wire
from ..protocol import broker_actor_name, replica_actor_name
from ..errors import (BrokerNotAvailableError, LeaderNotAvailableError, NoBrokersAvailable,
                      UnknownTopicOrPartitionError)

log = logging.getLogger(__name__)

METADATA_CALL_TIMEOUT_S = 10.0
#: how long a refresh over the wire waits for a broker's answer (its connection's opening
#: included: a paused broker accepts in its kernel and never answers)
WIRE_REFRESH_TIMEOUT_S = 5.0
# how long a newest-refresh waits for other brokers once one has answered
NEWEST_GRACE_S = 0.5


class LeaderRef(NamedTuple):
    handle: object
    broker_id: int
    leader_epoch: int


def broker_handle(namespace: str, broker_id: int):
    return ray.get_actor(broker_actor_name(broker_id), namespace=namespace)


#: how long the answers a caller moved on without are still waited for, to be read
LEFTOVER_WAIT_S = 60.0


def settle_later(refs) -> None:
    """Read, on a daemon thread, the answers to Ray calls ``refs`` that the caller moved on
    without (a paused broker's, one that lost the race to another): a failed call whose
    reference is dropped unread makes Ray log an "Unhandled error" with its traceback in
    the caller's process, in the middle of a CLI command's output or a user's script."""
    refs = list(refs)
    if not refs:
        return

    def settle():
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=LEFTOVER_WAIT_S)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - read so that Ray does not report it
                pass

    threading.Thread(target=settle, daemon=True, name="settle-ray-answers").start()


def answers_within(refs: dict, timeout_s: float) -> tuple[dict, list]:
    """The answers to Ray calls ``refs`` ({object ref: key}) that arrive within one deadline
    of ``timeout_s``, all awaited together (one ray.wait): ``({key: value}, [keys with no
    answer])``. A call that failed (a dead actor, a typed refusal) has no answer either; a
    paused actor costs the deadline once, however many calls it has."""
    if not refs:
        return {}, []
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    settle_later(late)
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
            settle_later(pending)
            return refs[ready[0]], value
        except Exception as exc:  # noqa: BLE001 - another may answer
            last = exc
    settle_later(pending)
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
        settle_later(pending)
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
        answers, late = [], []
        for ref, bid in refs.items():
            try:
                answers.append((bid, ray.get(ref, timeout=METADATA_CALL_TIMEOUT_S)))
            except ray.exceptions.GetTimeoutError:
                late.append(ref)
            except Exception:  # noqa: BLE001 - a dead or slow broker knows nothing
                continue
        settle_later(late)
        if not answers:
            return []
        newest = max((snap for _, snap in answers), key=_stamp)
        live = {int(b) for b in newest.get("brokers", {})}
        return [snap for bid, snap in answers if bid in live]


# -- the data clients' metadata: Kafka's Metadata request -------------------------------------

_LISTING = {"topics": None, "allow_auto_topic_creation": False}


def snapshot_of(answer: dict) -> dict:
    """A Metadata response body as the cache keeps a broker's snapshot: ``topics`` (name ->
    partition -> ``leader``, ``leader_epoch``, ``replicas``, ``isr``, ``offline``) and
    ``brokers`` (node id -> ``host``, ``port``, ``rack``: the listener the request came
    through, so the client's own security protocol), ``controller_id``. A topic answered
    with an error is left out, as a broker that does not know it."""
    topics = {}
    for t in answer["topics"]:
        if t["error_code"] or not t["name"]:
            continue
        topics[t["name"]] = {p["partition_index"]: {
            "leader": p["leader_id"], "leader_epoch": p["leader_epoch"],
            "replicas": list(p["replica_nodes"]), "isr": list(p["isr_nodes"]),
            "offline": list(p.get("offline_replicas") or ())} for p in t["partitions"]}
    brokers = {b["node_id"]: {"host": b["host"], "port": b["port"], "rack": b.get("rack")}
               for b in answer["brokers"]}
    return {"topics": topics, "brokers": brokers,
            "controller_id": answer.get("controller_id", -1), "source": "wire"}


def _epochs(snapshot: dict) -> tuple[int, int]:
    """How new a snapshot from the wire is, as a whole: (the sum of its partitions' leader
    epochs, its partition count). A broker's cache only ever moves forward in both while
    topics are not deleted."""
    total = count = 0
    for parts in snapshot["topics"].values():
        for state in parts.values():
            total += state["leader_epoch"]
            count += 1
    return total, count


def newest_of(snapshots: list[dict]) -> dict:
    """The brokers' answers merged as Kafka's clients merge metadata (KIP-232): the answer
    newest as a whole, with every partition another answer shows in a later leader epoch
    taken from that one, and the topics only others know added (one just made that the
    first broker has not heard of yet)."""
    best = max(snapshots, key=_epochs)
    topics = {t: dict(parts) for t, parts in best["topics"].items()}
    for snap in snapshots:
        if snap is best:
            continue
        for topic, parts in snap["topics"].items():
            have = topics.setdefault(topic, {})
            for p, state in parts.items():
                if p not in have or state["leader_epoch"] > have[p]["leader_epoch"]:
                    have[p] = state
    return {**best, "topics": topics}


class WireMetadata(Metadata):
    """A data client's metadata (see the module docstring): ``Metadata``'s interface, its
    refreshes a Metadata request over ``attach``-ed connections (purpose ``"metadata"``,
    so an answer never queues behind produces or a long poll), Ray when none answers.
    ``base``: the Cluster's metadata, whose cached snapshot is the starting point (no call
    at construction). ``wire_refreshes`` / ``ray_refreshes`` count what answered."""

    def __init__(self, base: Metadata):
        super().__init__(base.namespace, base._broker_ids)
        with base._lock:
            if base._fetched_at:
                self._snapshot, self._fetched_at = base._snapshot, time.monotonic()
        self.network = None
        self.wire_refreshes = 0
        self.ray_refreshes = 0
        self._refreshing = threading.Lock()     # one refresh at a time (Kafka's clients too)
        self._newest = False                    # whether the last refresh merged them all
        self._asking = threading.local()        # set on the threads that ask the brokers
        self._waiting_on: set[int] = set()      # brokers an earlier refresh still asks

    def attach(self, network) -> None:
        """The client's BrokerConnections, which the refreshes use from now on."""
        self.network = network

    def snapshot(self) -> dict:
        if getattr(self._asking, "on", False):
            with self._lock:                    # a refresh's own connection opening: the
                return self._snapshot           # addresses it has, never another refresh
        return super().snapshot()

    def refresh(self, *, newest: bool = False) -> dict:
        """As ``Metadata.refresh``, over the wire. Callers that come while a refresh is
        under way wait for it and take its answer (a lookup after a stale answer from many
        threads at once asks the brokers once)."""
        if getattr(self._asking, "on", False):
            return self.snapshot()
        asked_at = time.monotonic()
        with self._refreshing:
            with self._lock:
                if self._fetched_at > asked_at and (self._newest or not newest):
                    return self._snapshot                # another caller's, just now
            snap = self._refresh_over_wire(newest) if self.network is not None else None
            if snap is None:
                snap = super().refresh(newest=newest)
                self._newest = newest
                self.ray_refreshes += 1
                return snap
            with self._lock:
                self._snapshot, self._newest = snap, newest
                self._fetched_at = time.monotonic()
            self.wire_refreshes += 1
            return snap

    def _refresh_over_wire(self, newest: bool) -> dict | None:
        """Every broker of the cached snapshot asked at once (each on a thread of its own:
        opening a connection to a paused broker blocks); the first answer with a
        controller, or with ``newest`` the merge of those that come within a short grace
        after it (all of them, usually, in a millisecond); None when none answered. A
        broker an earlier refresh is still waiting for (paused) is not asked again, so
        refreshes retried against a paused broker do not pile threads up."""
        with self._lock:
            ids = [int(b) for b in (self._snapshot.get("brokers") or {})
                   if int(b) not in self._waiting_on]
            self._waiting_on.update(ids)
        if not ids:
            return None
        random.shuffle(ids)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        for broker_id in ids:
            threading.Thread(target=self._ask, args=(broker_id, answers), daemon=True,
                             name="metadata-refresh").start()
        got: list[dict] = []
        pending = len(ids)
        deadline = time.monotonic() + WIRE_REFRESH_TIMEOUT_S
        while pending:
            try:
                snap = answers.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            pending -= 1
            if snap is None or snap["controller_id"] < 0:
                continue                   # a dead broker, or one no controller updated
            got.append(snap)
            if not newest:
                break
            deadline = min(deadline, time.monotonic() + NEWEST_GRACE_S)
        if not got:
            return None
        return newest_of(got) if newest else got[0]

    def _ask(self, broker_id: int, answers: queue.SimpleQueue) -> None:
        from .network import wait_answer
        self._asking.on = True
        try:
            future = self.network.send(broker_id, wire.METADATA, _LISTING, purpose="metadata")
            body = wait_answer(self.network, broker_id, future, WIRE_REFRESH_TIMEOUT_S,
                               "metadata", purpose="metadata")
            answers.put(snapshot_of(body))
        except Exception as exc:  # noqa: BLE001 - another broker, or Ray, answers
            log.debug("metadata from broker %d: %r", broker_id, exc)
            answers.put(None)
        finally:
            with self._lock:
                self._waiting_on.discard(broker_id)


def client_metadata(metadata):
    """A data client's own metadata over ``metadata`` (a WireMetadata for a Ray-backed
    Metadata; anything else, as the unit tests' fakes, unchanged)."""
    if isinstance(metadata, Metadata) and not isinstance(metadata, WireMetadata):
        return WireMetadata(metadata)
    return metadata


def attach_network(metadata, network) -> None:
    """Let ``metadata`` refresh over the client's ``network`` when it can."""
    attach = getattr(metadata, "attach", None)
    if attach is not None:
        attach(network)
