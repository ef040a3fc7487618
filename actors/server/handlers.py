"""Request handling for the Kafka listener (Kafka's KafkaApis): one handler per API, over a
``Backend`` that holds the data and metadata.

``KafkaApis(backend).handle(request)`` decodes the body of a ``network.Request``, asks the
backend, and returns the response frame (``wire.encode_response_parts``), None (Produce
with acks=0), or a Future of either (a long-poll Fetch parked in the purgatory, a Produce
whose backend answers later). APIs: exactly those in ``KafkaApis.versions()``, which is
also what ApiVersions advertises.

Per-partition failures are the backend's typed errors (actors.errors), answered as Kafka's
error codes (``wire.error_code``); every requested partition gets an entry in the answer,
errors included (kafka-python discards a Fetch response that omits one).

The purgatory (``Purgatory``, Kafka's DelayedOperationPurgatory): a parked operation waits
on keys ((topic, partition)); ``KafkaApis.notify(topic, partition)`` (called by the backend
after an append or a high watermark move) tries the operations waiting on that key, and
one expiry thread completes the rest at their deadlines. An operation completes exactly
once, on whichever thread gets there first.

Thread-safe: KafkaApis keeps no per-request state outside the purgatory (which has its own
lock); the backend must be thread-safe when the listener runs io threads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from storage.records import iter_headers

from .. import wire
from ..errors import (ClusterAuthorizationFailedError, FencedLeaderEpochError,
                      InvalidRecordError, KafkaError, TopicAuthorizationFailedError,
                      UnknownLeaderEpochError)
from ..protocol import (OFFSETS_TOPIC, EpochEndOffset, FetchResult, ProduceResult,
                        validate_topic_name)
from .authorizer import CLUSTER, Access, principal_of
from .network import NOT_INLINE, Request

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


class NeedsReplica(Exception):
    """A read with ``cached_only`` that would have to wait for the replica."""


_INLINE = threading.local()        # a thread whose reads must not wait for a replica


@contextlib.contextmanager
def _reading_held_only(on: bool = True):
    """Within: the backend's reads answer only from what the broker holds (NeedsReplica
    otherwise): for the network thread and a replica channel's reader thread."""
    before = getattr(_INLINE, "active", False)
    _INLINE.active = on
    try:
        yield
    finally:
        _INLINE.active = before
_ERR = wire.ERRORS_BY_NAME
# internal topics are made by their own paths (the offsets topic on a group's first use),
# never by a Metadata request naming them
_NEVER_AUTO_CREATED = frozenset({OFFSETS_TOPIC, "__transaction_state"})


# -- what the handlers need of a broker -----------------------------------------------------
@dataclass(frozen=True)
class BrokerEndpoint:
    """A broker's address for clients: ``host``/``port`` (its first listener's), and per
    listener name (``listeners``: (name, host, port) triples; empty: every listener is at
    ``host``/``port``)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    listeners: tuple = ()

    def on(self, listener: str) -> tuple[str, int] | None:
        """(host, port) of this broker's ``listener``; None when it has none of that name
        (Kafka leaves such a broker out of the answers on that listener)."""
        if not self.listeners:
            return self.host, self.port
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return None


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int                             # -1: none
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error: KafkaError | None = None         # e.g. LeaderNotAvailableError


class Backend(Protocol):
    """The data and metadata the handlers serve (a Broker, or ``LogBackend`` in one
    process). Methods raise actors.errors' typed errors for a partition they cannot serve
    (UnknownTopicOrPartitionError, NotLeaderForPartitionError, OffsetOutOfRangeError...)."""

    cluster_id: str | None

    def brokers(self) -> list[BrokerEndpoint]: ...

    def controller_id(self) -> int: ...

    def topics(self) -> list[str]: ...

    def partitions(self, topic: str) -> list[PartitionMetadata] | None:
        """The topic's partitions, None when there is no such topic."""

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The epoch of the leader this broker holds for the partition (raises if it is
        not the leader)."""

    def append(self, topic: str, partition: int, records: memoryview, *, acks: int,
               timeout_ms: int) -> "ProduceResult | concurrent.futures.Future":
        """Append a client's batches as the leader; for acks=-1 the result (or its future)
        comes when the in-sync replicas have them."""

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *,
             replica_id: int, isolation_level: int,
             cached_only: bool = False) -> FetchResult:
        """Whole batches from ``offset``: up to the high watermark for consumers
        (``replica_id`` < 0), the log end for a follower broker; about ``max_bytes`` of
        them but at least one whole batch, none when ``max_bytes`` < 0 (the offsets
        only). OffsetOutOfRangeError outside [log start, log end]. ``cached_only``:
        raise NeedsReplica rather than wait for anything (``KafkaApis.handle_inline``)."""

    def linked(self, topic: str, partition: int) -> bool:
        """Can ``append`` hand the partition's batches over without waiting (no channel
        to open first)? (``KafkaApis.handle_inline``)"""

    def has_records(self, topic: str, partition: int, offset: int, *,
                    replica_id: int) -> bool | None:
        """Without reading (a parked Fetch asks at every change of a partition it waits
        on, as Kafka's DelayedFetch compares offsets): would ``read`` at ``offset`` give
        records now (True) or none (False)? None when only a read can tell (an error to
        report, a leadership or epoch that changed, state not known here); a backend
        without the method is always read."""

    def list_offset(self, topic: str, partition: int, timestamp: int, *,
                    isolation_level: int, from_follower: bool = False) -> tuple[int, int]:
        """(timestamp, offset) for ListOffsets: -1 latest (the high watermark; the log
        end offset ``from_follower``), -2 earliest, else the first record with a timestamp
        >= it ((-1, -1) when none)."""

    def end_offset_for_epoch(self, topic: str, partition: int,
                             leader_epoch: int) -> EpochEndOffset: ...


# -- the purgatory --------------------------------------------------------------------------
class DelayedOperation:
    """An answer waiting for a condition or its deadline. Subclasses give ``ready`` (is
    the condition met?) and ``complete(expired)``; ``force_complete`` runs ``complete``
    once only."""

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self.keys: tuple = ()
        self._lock = threading.Lock()
        self.done = False

    def ready(self) -> bool:
        raise NotImplementedError

    def complete(self, expired: bool) -> None:
        raise NotImplementedError

    def force_complete(self, expired: bool = False) -> bool:
        with self._lock:
            if self.done:
                return False
            self.done = True
        try:
            self.complete(expired)
        except Exception:
            log.exception("delayed operation %r failed to complete", self)
        return True

    def try_complete(self) -> bool:
        return not self.done and self.ready() and self.force_complete()


class Purgatory:
    """Parked operations by key, and one thread that expires them at their deadlines.
    ``max_operations`` bounds how many can wait (past it an operation completes at once,
    as if expired)."""

    def __init__(self, name: str = "purgatory", *, max_operations: int = 100_000,
                 clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Condition()
        self._watchers: dict[Any, set[DelayedOperation]] = {}
        self._heap: list[tuple[float, int, DelayedOperation]] = []
        self._seq = itertools.count()
        self._max = max_operations
        self._closed = False
        self._thread = threading.Thread(target=self._expire_loop, name=name, daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)

    def park(self, op: DelayedOperation, keys: Iterable) -> None:
        """Complete ``op`` now if it is ready, else watch ``keys`` for it until its
        deadline (ready is asked again after watching: a notify in between is not lost)."""
        if op.try_complete():
            return
        op.keys = tuple(keys)
        with self._lock:
            if self._closed or len(self._heap) >= self._max:
                full = True
            else:
                full = False
                for key in op.keys:
                    self._watchers.setdefault(key, set()).add(op)
                entry = (op.deadline_s, next(self._seq), op)
                heapq.heappush(self._heap, entry)
                # the expiry thread sleeps until the earliest deadline: wake it only when
                # this one is earlier (every parked Fetch woke it before, a GIL hand-off
                # per follower fetch and per consumer long poll)
                if self._heap[0] is entry:
                    self._lock.notify()
        if full:
            op.force_complete(expired=True)
            return
        if op.try_complete():
            self._forget(op)

    def notify(self, key) -> int:
        """Try the operations waiting on ``key``; how many completed."""
        with self._lock:
            ops = list(self._watchers.get(key, ()))
        completed = 0
        for op in ops:
            if op.try_complete():
                completed += 1
                self._forget(op)
        return completed

    def _forget(self, op: DelayedOperation) -> None:
        with self._lock:
            for key in op.keys:
                waiting = self._watchers.get(key)
                if waiting is not None:
                    waiting.discard(op)
                    if not waiting:
                        del self._watchers[key]

    def _expire_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed:
                    while self._heap and self._heap[0][2].done:
                        heapq.heappop(self._heap)      # completed early: drop
                    if self._heap and self._heap[0][0] <= self._clock():
                        break
                    wait = self._heap[0][0] - self._clock() if self._heap else None
                    self._lock.wait(wait)
                if self._closed:
                    ops = [op for _, _, op in self._heap]
                    self._heap.clear()
                    self._watchers.clear()
                else:
                    ops = [heapq.heappop(self._heap)[2]]
            for op in ops:
                if op.force_complete(expired=True):
                    self._forget(op)
            if self._closed:
                return

    def close(self) -> None:
        """Complete everything still waiting (as expired) and stop the thread."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(5.0)


# -- the handlers --------------------------------------------------------------------------
def _topic_results(requested, answer: Callable[[str, dict], dict], topic_key: str,
                   partitions_key: str) -> list:
    return [{topic_key: t[topic_key],
             partitions_key: [answer(t[topic_key], p) for p in t["partitions"]]}
            for t in requested]


def _check_epoch(current: int, epoch: int) -> None:
    """Fence a request carrying another leader epoch than the leader's (KIP-320)."""
    if current < 0 or current == epoch:
        return
    if current < epoch:
        raise FencedLeaderEpochError(f"request epoch {current} < leader epoch {epoch}")
    raise UnknownLeaderEpochError(f"request epoch {current} > leader epoch {epoch}")


def _code(exc: BaseException) -> int:
    if not isinstance(exc, KafkaError):
        log.error("unexpected error answering a request", exc_info=exc)
    return wire.error_code(exc)


class KafkaApis:
    """The request handler a ``network.SocketServer`` calls (see the module docstring)."""

    def __init__(self, backend: Backend, *, purgatory: Purgatory | None = None,
                 clock: Callable[[], float] = time.monotonic, groups=None, admin=None,
                 producers=None, extra: Iterable = (),
                 access: Access | None = None):
        self.backend = backend
        self.access = access or Access()    # the broker's authorizer (authorizer.py)
        self._clock = clock
        self._own_purgatory = purgatory is None
        self.fetch_purgatory = purgatory or Purgatory("fetch-purgatory", clock=clock)
        self._handlers = {
            wire.API_VERSIONS: self.api_versions,
            wire.METADATA: self.metadata,
            wire.PRODUCE: self.produce,
            wire.FETCH: self.fetch,
            wire.LIST_OFFSETS: self.list_offsets,
            wire.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            # reached only once authenticated, or on a listener without SASL (network.py
            # hands an unauthenticated connection's to its authenticator)
            wire.SASL_HANDSHAKE: self.sasl_out_of_state,
            wire.SASL_AUTHENTICATE: self.sasl_out_of_state,
        }
        if groups is not None:      # the group APIs (group_handlers.GroupApis)
            self._handlers.update(groups.handlers())
        if admin is not None:       # the admin APIs (admin_handlers.AdminApis)
            self._handlers.update(admin.handlers())
        # Metadata's topic auto-creation (auto.create.topics.enable): the admin APIs' when
        # there are any (a Broker's), none in one process (LocalBroker)
        self._admin = admin if hasattr(admin, "auto_create_topic") else None
        if producers is not None:   # InitProducerId (producer_handlers.ProducerIdApis)
            self._handlers.update(producers.handlers())
        for apis in extra:          # more APIs, each with its own handlers() (ACLs, ...)
            self._handlers.update(apis.handlers())

    def close(self) -> None:
        if self._own_purgatory:
            self.fetch_purgatory.close()

    def versions(self) -> dict[int, tuple[int, int]]:
        """The APIs and versions implemented: what ApiVersions advertises."""
        return {key: wire.SUPPORTED_VERSIONS[key] for key in sorted(self._handlers)}

    def denied_topics(self, request: Request, operation: str, names) -> set[str]:
        """Those of the topics ``names`` the request's principal may not ``operation``."""
        return self.access.denied(request, operation, "Topic", names)

    def notify(self, topic: str, partition: int) -> None:
        """The partition's data or high watermark moved: wake the fetches waiting on it."""
        self.fetch_purgatory.notify((topic, partition))

    def notify_inline(self, topic: str, partition: int) -> bool:
        """``notify`` on a thread that must not wait for a replica (a replica channel's
        reader, which delivers those answers): the woken fetches read only what the
        backend holds. False when one of them needs the replica: then ``notify`` must run
        elsewhere (the fetches not tried yet still wait)."""
        try:
            with _reading_held_only():
                self.fetch_purgatory.notify((topic, partition))
        except NeedsReplica:
            return False
        return True

    def handle(self, request: Request):
        handler = self._handlers.get(request.header.api_key)
        if handler is None:
            raise wire.InvalidRequestError(
                f"API key {request.header.api_key} is not implemented", request.header)
        return handler(request)

    def handle_inline(self, request: Request):
        """``handle`` on the network thread, for a request that can be answered without
        waiting (ApiVersions, a Metadata that creates no topic; a Produce to partitions
        whose replicas are linked; a Fetch the replicas' pushed tails answer): saves the
        two thread hand-offs of the io threads, which cost more than such a request
        itself. ``NOT_INLINE`` when it might wait (anything else): the network layer hands
        it to an io thread, and nothing of it has been done."""
        key = request.header.api_key
        if key == wire.METADATA:
            return self.metadata(request, inline=True)
        if key == wire.API_VERSIONS:
            return self.handle(request)
        if key == wire.PRODUCE:
            return self.produce(request, inline=True)
        if key == wire.FETCH:
            try:
                return self.fetch(request, inline=True)
            except NeedsReplica:
                return NOT_INLINE
        return NOT_INLINE

    @staticmethod
    def _body(request: Request) -> dict:
        return wire.decode_request_body(request.header, request.body, 0)

    # -- ApiVersions ---------------------------------------------------------------------
    def api_versions(self, request: Request):
        header = request.header
        lo, hi = wire.SUPPORTED_VERSIONS[wire.API_VERSIONS]
        if not lo <= header.api_version <= hi:
            # KIP-511: answered at v0 with our own range, the client retries within it
            return wire.encode_response_parts(header._replace(api_version=0),
                                              wire.api_versions_error_body())
        self._body(request)
        return wire.encode_response_parts(header, {
            "error_code": wire.NONE,
            "api_keys": [{"api_key": key, "min_version": lo, "max_version": hi}
                         for key, (lo, hi) in self.versions().items()],
            "throttle_time_ms": 0,
        })

    # -- Metadata --------------------------------------------------------------------------
    def metadata(self, request: Request, inline: bool = False):
        """``inline`` (on the network thread): NOT_INLINE, with nothing done, when the
        request would create a topic (ZooKeeper writes belong on an io thread)."""
        body = self._body(request)
        backend = self.backend
        requested = body["topics"]
        listing = requested is None or (request.header.api_version == 0 and not requested)
        names = sorted(backend.topics()) if listing else [t["name"] for t in requested]
        # auto.create.topics.enable, for a request that asks for it (v4+; always before)
        create = (not listing and self._admin is not None
                  and body.get("allow_auto_topic_creation", True)
                  and self._admin.auto_create_enabled())
        hidden = self.denied_topics(request, "Describe", names)
        topics = []
        for name in names:
            if name in hidden:
                # Kafka: a topic the principal may not describe is left out of a listing,
                # and answered TOPIC_AUTHORIZATION_FAILED when asked for by name
                if not listing:
                    topics.append({"error_code": _ERR["TOPIC_AUTHORIZATION_FAILED"].code,
                                   "name": name, "partitions": []})
                continue
            try:
                validate_topic_name(name)
                parts = backend.partitions(name)
            except Exception as exc:    # a bad name, or the backend could not say
                topics.append({"error_code": _code(exc), "name": name, "partitions": []})
                continue
            if parts is None:
                code = _ERR["UNKNOWN_TOPIC_OR_PARTITION"].code
                if create and name not in _NEVER_AUTO_CREATED:
                    if inline:
                        return NOT_INLINE
                    code = self._admin.auto_create_topic(name, request)
                topics.append({"error_code": code, "name": name, "partitions": []})
                continue
            topics.append({"error_code": wire.NONE, "name": name,
                           "is_internal": name.startswith("__"), "partitions": [
                {"error_code": wire.error_code(p.error) if p.error else wire.NONE,
                 "partition_index": p.partition, "leader_id": p.leader,
                 "leader_epoch": p.leader_epoch, "replica_nodes": list(p.replicas),
                 "isr_nodes": list(p.isr), "offline_replicas": list(p.offline_replicas)}
                for p in parts]})
        return wire.encode_response_parts(request.header, {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": b.node_id, "host": address[0], "port": address[1],
                         "rack": b.rack} for b in backend.brokers()
                        if (address := b.on(request.listener)) is not None],
            "cluster_id": backend.cluster_id,
            "controller_id": backend.controller_id(),
            "topics": topics,
        })

    # -- SaslHandshake, SaslAuthenticate where no SASL exchange is expected ------------------
    def sasl_out_of_state(self, request: Request):
        self._body(request)
        code = _ERR["ILLEGAL_SASL_STATE"].code
        if request.header.api_key == wire.SASL_HANDSHAKE:
            return wire.encode_response_parts(request.header,
                                              {"error_code": code, "mechanisms": []})
        return wire.encode_response_parts(request.header, {
            "error_code": code, "auth_bytes": b"", "session_lifetime_ms": 0,
            "error_message": f"no SASL exchange expected on listener {request.listener} "
                             f"(authenticated as {request.principal})"})

    # -- Produce ---------------------------------------------------------------------------
    def produce(self, request: Request, inline: bool = False):
        body = self._body(request)
        acks, timeout_ms = body["acks"], body["timeout_ms"]
        denied = self.denied_topics(request, "Write", [t["name"] for t in body["topic_data"]])
        if inline and not all(self.backend.linked(t["name"], p["index"])
                              for t in body["topic_data"] if t["name"] not in denied
                              for p in t["partition_data"]):
            return NOT_INLINE
        results: list[tuple[str, int, Any]] = []    # (topic, partition, result or error)
        for topic in body["topic_data"]:
            name = topic["name"]
            for p in topic["partition_data"]:
                if name in denied:
                    results.append((name, p["index"], TopicAuthorizationFailedError(
                        f"{principal_of(request)[0]} may not write to topic {name}")))
                    continue
                results.append((name, p["index"],
                                self._append(name, p["index"], p["records"], acks,
                                             timeout_ms)))
        if acks == 0:
            failed = [(t, p, r) for t, p, r in results if isinstance(r, BaseException)]
            if failed:
                # Kafka's way: no response to carry the error, so the connection is closed
                # and the client refreshes its metadata
                t, p, r = failed[0]
                log.info("acks=0 produce from %s to %s-%d failed (%s: %s); closing its "
                         "connection: the records of this request are lost", request.client,
                         t, p, type(r).__name__, r)
                raise wire.InvalidRequestError(
                    f"acks=0 produce to {t}-{p} failed ({type(r).__name__}: {r}); closing "
                    f"the connection so the client refreshes its metadata", request.header)
            return None
        header = request.header
        pending = [r for _, _, r in results if isinstance(r, concurrent.futures.Future)]
        if not pending:
            return wire.encode_response_parts(header, _produce_body(results))
        answer: concurrent.futures.Future = concurrent.futures.Future()
        left = [len(pending)]
        lock = threading.Lock()

        def one_done(_):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            answer.set_result(wire.encode_response_parts(header, _produce_body(results)))

        for f in pending:
            f.add_done_callback(one_done)
        return answer

    def _append(self, topic: str, partition: int, records, acks: int, timeout_ms: int):
        try:
            if acks not in (0, 1, -1):
                return _coded("INVALID_REQUIRED_ACKS")
            if records is None or len(records) < 17:
                raise InvalidRecordError("a produce request needs record batches")
            if records[16] != 2:        # the magic byte: Produce v3+ carries batch v2 only
                raise InvalidRecordError(f"record batch magic {records[16]} in a v3+ "
                                         f"produce request (only 2 is allowed)")
            return self.backend.append(topic, partition, records, acks=acks,
                                       timeout_ms=timeout_ms)
        except Exception as exc:
            return exc

    # -- Fetch -----------------------------------------------------------------------------
    def fetch(self, request: Request, inline: bool = False):
        body = self._body(request)
        header = request.header
        if body["session_id"] != 0:
            # sessionless broker (KIP-227 not implemented): a session we never gave out
            return wire.encode_response_parts(header, {
                "error_code": _ERR["FETCH_SESSION_ID_NOT_FOUND"].code, "session_id": 0,
                "responses": []})
        if body["replica_id"] >= 0:
            # a follower broker's fetch: replication is a cluster action
            if not self.access.allowed(request, "ClusterAction", "Cluster", CLUSTER):
                return wire.encode_response_parts(header, {
                    "error_code": _ERR["CLUSTER_AUTHORIZATION_FAILED"].code,
                    "session_id": 0, "responses": []})
            denied: set[str] = set()
        else:
            denied = self.denied_topics(request, "Read", [t["topic"] for t in body["topics"]])
        read = _FetchRead(self.backend, body, denied)
        with _reading_held_only(inline):      # the purgatory's re-reads may wait
            response, total, errors = read()
        if body["max_wait_ms"] <= 0 or total >= max(body["min_bytes"], 1) or errors:
            return wire.encode_response_parts(header, response)
        future: concurrent.futures.Future = concurrent.futures.Future()
        op = _DelayedFetch(self._clock() + body["max_wait_ms"] / 1000.0, read,
                           max(body["min_bytes"], 1), header, future)
        self.fetch_purgatory.park(op, read.keys())
        return future

    # -- ListOffsets ------------------------------------------------------------------------
    def list_offsets(self, request: Request):
        body = self._body(request)
        isolation = body["isolation_level"]
        # a follower broker's (replica_id >= 0, after OFFSET_OUT_OF_RANGE): latest is the
        # leader's log end offset, not its HW, as Kafka answers it; a replication request,
        # so ClusterAction, as OffsetForLeaderEpoch from a follower
        follower = body.get("replica_id", -1) >= 0
        if follower:
            cluster_ok = self.access.allowed(request, "ClusterAction", "Cluster", CLUSTER)
            denied = set() if cluster_ok else {t["name"] for t in body["topics"]}
        else:
            denied = self.denied_topics(request, "Describe",
                                        [t["name"] for t in body["topics"]])

        def answer(topic: str, p: dict) -> dict:
            index = p["partition_index"]
            try:
                if topic in denied:
                    raise (ClusterAuthorizationFailedError("replication") if follower
                           else TopicAuthorizationFailedError(topic))
                epoch = self.backend.leader_epoch(topic, index)
                _check_epoch(p["current_leader_epoch"], epoch)
                timestamp, offset = self.backend.list_offset(topic, index, p["timestamp"],
                                                             isolation_level=isolation,
                                                             from_follower=follower)
                return {"partition_index": index, "error_code": wire.NONE,
                        "timestamp": timestamp, "offset": offset, "leader_epoch": epoch}
            except Exception as exc:
                return {"partition_index": index, "error_code": _code(exc)}

        return wire.encode_response_parts(request.header, {
            "throttle_time_ms": 0,
            "topics": _topic_results(body["topics"], answer, "name", "partitions")})

    # -- OffsetForLeaderEpoch ---------------------------------------------------------------
    def offset_for_leader_epoch(self, request: Request):
        body = self._body(request)
        if body.get("replica_id", -1) >= 0:
            cluster_ok = self.access.allowed(request, "ClusterAction", "Cluster", CLUSTER)
            denied = set() if cluster_ok else {t["topic"] for t in body["topics"]}
        else:
            denied = self.denied_topics(request, "Describe",
                                        [t["topic"] for t in body["topics"]])

        def answer(topic: str, p: dict) -> dict:
            index = p["partition"]
            try:
                if topic in denied:
                    raise (TopicAuthorizationFailedError(topic) if body.get("replica_id", -1) < 0
                           else ClusterAuthorizationFailedError("replication"))
                _check_epoch(p["current_leader_epoch"], self.backend.leader_epoch(topic, index))
                found = self.backend.end_offset_for_epoch(topic, index, p["leader_epoch"])
                return {"error_code": wire.NONE, "partition": index,
                        "leader_epoch": found.leader_epoch, "end_offset": found.end_offset}
            except Exception as exc:
                return {"error_code": _code(exc), "partition": index}

        return wire.encode_response_parts(request.header, {
            "throttle_time_ms": 0,
            "topics": _topic_results(body["topics"], answer, "topic", "partitions")})


def _coded(name: str) -> wire.BrokerResponseError:
    return wire.BrokerResponseError(_ERR[name].code)


def _produce_body(results) -> dict:
    topics: dict[str, list] = {}
    for topic, partition, result in results:
        if isinstance(result, concurrent.futures.Future):
            try:
                result = result.result(timeout=0)
            except Exception as exc:
                result = exc
        if isinstance(result, BaseException):
            entry = {"index": partition, "error_code": _code(result), "base_offset": -1,
                     "error_message": str(result) or None}
        else:
            entry = {"index": partition, "error_code": wire.NONE,
                     "base_offset": result.base_offset,
                     "log_append_time_ms": result.log_append_time_ms,
                     "log_start_offset": result.log_start_offset}
        topics.setdefault(topic, []).append(entry)
    return {"responses": [{"name": t, "partition_responses": parts}
                          for t, parts in topics.items()],
            "throttle_time_ms": 0}


class _FetchRead:
    """One pass over a Fetch request's partitions: the response body, its record bytes,
    and whether any partition failed. Kafka's limits: ``partition_max_bytes`` per
    partition, ``max_bytes`` for the response, but the first batch of the first partition
    with data is returned whole however large (KIP-74), so a consumer always progresses."""

    def __init__(self, backend: Backend, body: dict, denied: set[str] = frozenset()):
        self.backend = backend
        self.body = body
        self.denied = denied            # topics the principal may not read

    def keys(self) -> list[tuple[str, int]]:
        return [(t["topic"], p["partition"]) for t in self.body["topics"]
                for p in t["partitions"]]

    def nothing_new(self) -> bool:
        """True when the backend can tell, without reading, that no partition of the
        request has records at its fetch offset and none has changed so that the read
        would answer an error: waiting on is then right. False: read to know."""
        has_records = getattr(self.backend, "has_records", None)
        if has_records is None:
            return False
        replica_id = self.body["replica_id"]
        for t in self.body["topics"]:
            topic = t["topic"]
            if topic in self.denied:
                return False
            for p in t["partitions"]:
                if has_records(topic, p["partition"], p["fetch_offset"],
                               replica_id=replica_id) is not False:
                    return False
        return True

    def __call__(self) -> tuple[dict, int, bool]:
        body, backend = self.body, self.backend
        replica_id, isolation = body["replica_id"], body["isolation_level"]
        budget = body["max_bytes"]
        total, errors, responses = 0, False, []
        for t in body["topics"]:
            topic = t["topic"]
            partitions = []
            for p in t["partitions"]:
                index = p["partition"]
                left = budget - total
                # the first partition with data gets at least one whole batch from the read
                limit = min(p["partition_max_bytes"], left)
                if not total:
                    limit = max(limit, 1)
                try:
                    if topic in self.denied:
                        raise TopicAuthorizationFailedError(topic)
                    _check_epoch(p["current_leader_epoch"],
                                 backend.leader_epoch(topic, index))
                    # limit <= 0: the response is full, the partition is listed without data
                    got = backend.read(topic, index, p["fetch_offset"], limit if limit > 0
                                       else -1, replica_id=replica_id,
                                       isolation_level=isolation,
                                       cached_only=getattr(_INLINE, "active", False))
                    data = got.data
                    if total and len(data) > left:
                        # past the first partition with data, no batch over what is left
                        # of max_bytes (KIP-74: only the first one may overrun it). A first
                        # batch over partition_max_bytes alone still comes whole, as it did
                        # before (Kafka would send a part of it, of no use to a client).
                        data = _whole_batches_within(data, left)
                    total += len(data)
                    partitions.append({
                        "partition_index": index, "error_code": wire.NONE,
                        "high_watermark": got.high_watermark,
                        "last_stable_offset": got.high_watermark,
                        "log_start_offset": got.log_start_offset,
                        "aborted_transactions": [] if isolation == READ_COMMITTED else None,
                        "records": data})
                except NeedsReplica:
                    raise
                except Exception as exc:
                    errors = True
                    # records empty, not null, as Kafka's (librdkafka refuses a null set)
                    partitions.append({"partition_index": index, "error_code": _code(exc),
                                       "high_watermark": -1, "records": b""})
            responses.append({"topic": topic, "partitions": partitions})
        return {"throttle_time_ms": 0, "error_code": wire.NONE, "session_id": 0,
                "responses": responses}, total, errors


def _whole_batches_within(data, limit: int):
    """The leading whole record batches of ``data`` (a log read: whole batches) that fit in
    ``limit`` bytes; none when the first does not fit."""
    end = 0
    for header in iter_headers(data, check_crc=False):
        if end + header.size > limit:
            break
        end += header.size
    return memoryview(data)[:end] if end else b""


class _DelayedFetch(DelayedOperation):
    """A Fetch waiting for ``min_bytes`` or its ``max_wait_ms`` (Kafka's DelayedFetch)."""

    def __init__(self, deadline_s: float, read: _FetchRead, min_bytes: int,
                 header: wire.RequestHeader, future: concurrent.futures.Future):
        super().__init__(deadline_s)
        self.read = read
        self.min_bytes = min_bytes
        self.header = header
        self.future = future
        self._last = None

    def ready(self) -> bool:
        # most wake-ups are for a change this fetch cannot use (a follower's fetch woken
        # by a HW move, a consumer's by an append the HW has not passed yet): told by the
        # offsets alone, without building the response, which cost 4-6 times more
        if self.read.nothing_new():
            return False
        response, total, errors = self._last = self.read()
        return total >= self.min_bytes or errors

    def complete(self, expired: bool) -> None:
        try:
            response = self.read()[0] if expired or self._last is None else self._last[0]
            self.future.set_result(wire.encode_response_parts(self.header, response))
        except Exception as exc:
            self.future.set_exception(exc)


__all__ = ["KafkaApis", "Backend", "BrokerEndpoint", "PartitionMetadata", "Purgatory",
           "DelayedOperation", "READ_UNCOMMITTED", "READ_COMMITTED", "NOT_INLINE",
           "NeedsReplica"]
