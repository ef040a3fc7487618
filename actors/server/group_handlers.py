"""The consumer-group APIs of the Kafka listener: FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups,
one handler per API, served by the broker's GroupCoordinator actor (group_coordinator.py),
the same one raykafka's own members reach through Ray: one group protocol for every client.

``GroupApis(backend, groups).handlers()`` gives ``{api_key: handler}`` for KafkaApis
(handlers.py) to dispatch; a handler returns the response frame or a Future of it.
``GroupBackend`` is what the handlers need of the broker: where a group's coordinator is
(``find_coordinator``: the broker leading the group's ``__consumer_offsets`` partition) and
a call to this broker's own coordinator that answers with a Future (``call``). A JoinGroup
or SyncGroup waits at the coordinator until the group's join (or the leader's assignment)
completes, so every coordinator answer is deferred: no network or io thread ever waits on
it. Requests for a group this broker does not coordinate answer NOT_COORDINATOR, as the
coordinator says, and the client looks the coordinator up again.

The group's protocol metadata and assignments are opaque bytes here, as in Kafka: Kafka
clients send ConsumerProtocolSubscription / ConsumerProtocolAssignment bytes, and so do
raykafka's members (actors/client/consumer_protocol.py), so a leader of any client reads
every member's subscription and every member reads its assignment.

Not implemented: the KIP-848 protocol (ConsumerGroupHeartbeat), batched FindCoordinator
(v4+) and OffsetFetch (v8+), JoinGroup's MEMBER_ID_REQUIRED round (v4+ lets the broker
skip it), transactional offsets (FindCoordinator of a transaction: UNSUPPORTED_VERSION).
Thread-safe: no state of its own.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Protocol

from .. import wire
from ..errors import (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                      KafkaError, NotCoordinatorError)
from .authorizer import CLUSTER, Access
from .network import Request

log = logging.getLogger(__name__)

_ERR = wire.ERRORS_BY_NAME
#: Kafka's offset.metadata.max.bytes default: a longer commit metadata is refused.
OFFSET_METADATA_MAX_BYTES = 4096
#: Errors about the coordinator itself, answered for the whole request (the client
#: looks the coordinator up again or retries).
_COORDINATOR_ERRORS = (NotCoordinatorError, CoordinatorNotAvailableError,
                       CoordinatorLoadInProgressError)
_GROUP_TYPE = "classic"


class GroupBackend(Protocol):
    def find_coordinator(self, group_id: str) -> int:
        """The node id of the group's coordinator; raises a typed error
        (CoordinatorNotAvailableError while the offsets topic is created or leaderless)."""

    def call(self, method: str, *args) -> concurrent.futures.Future:
        """This broker's GroupCoordinator's ``method(*args)``; the Future fails with the
        coordinator's typed error (NotCoordinatorError when this broker has none)."""


def _typed(exc: BaseException) -> BaseException:
    """The coordinator's typed error behind Ray's wrappers (a dead or unreachable actor:
    CoordinatorNotAvailableError, which clients retry after a new lookup)."""
    try:
        import ray.exceptions
        from ..protocol import unwrap
        exc = unwrap(exc)
        if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)):
            return CoordinatorNotAvailableError(f"the group coordinator is unavailable: {exc}")
    except ImportError:                  # no Ray (a test's backend)
        pass
    return exc


def _code(exc: BaseException) -> int:
    if not isinstance(exc, KafkaError):
        log.error("unexpected error from the group coordinator", exc_info=exc)
    return wire.error_code(exc)


def _failed(exc: BaseException) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(exc)
    return future


def _gather(futures: list) -> concurrent.futures.Future:
    """A Future of ``[value or typed exception, ...]`` once every one of ``futures`` is
    done (it never fails itself)."""
    out: concurrent.futures.Future = concurrent.futures.Future()
    results: list = [None] * len(futures)
    left = [len(futures)]
    lock = threading.Lock()
    if not futures:
        out.set_result([])
        return out

    def one(i, f):
        try:
            results[i] = f.result()
        except BaseException as exc:  # noqa: BLE001 - carried to the answer as its code
            results[i] = _typed(exc)
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(results)

    for i, f in enumerate(futures):
        f.add_done_callback(lambda f, i=i: one(i, f))
    return out


def _opaque(value) -> bytes:
    """Protocol metadata or an assignment as bytes on the wire (b"" for none, or for the
    dict form a coordinator may hold from a member that predates the byte form)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return b""


class GroupApis:
    """The group handlers (see the module docstring) over ``backend`` (handlers.Backend:
    the brokers' endpoints and topics) and ``groups`` (GroupBackend)."""

    def __init__(self, backend, groups: GroupBackend, access: Access | None = None):
        self.backend = backend
        self.groups = groups
        self.access = access or Access()     # Kafka's ACLs on groups and their topics

    def _group_denied(self, request: Request, operation: str, group: str) -> bool:
        return bool(group) and not self.access.allowed(request, operation, "Group", group)

    def handlers(self) -> dict[int, Callable[[Request], Any]]:
        return {
            wire.FIND_COORDINATOR: self.find_coordinator,
            wire.JOIN_GROUP: self.join_group,
            wire.SYNC_GROUP: self.sync_group,
            wire.HEARTBEAT: self.heartbeat,
            wire.LEAVE_GROUP: self.leave_group,
            wire.OFFSET_COMMIT: self.offset_commit,
            wire.OFFSET_FETCH: self.offset_fetch,
            wire.LIST_GROUPS: self.list_groups,
            wire.DESCRIBE_GROUPS: self.describe_groups,
            wire.DELETE_GROUPS: self.delete_groups,
        }

    @staticmethod
    def _body(request: Request) -> dict:
        return wire.decode_request_body(request.header, request.body, 0)

    def _call(self, method: str, *args) -> concurrent.futures.Future:
        try:
            return self.groups.call(method, *args)
        except Exception as exc:  # noqa: BLE001 - answered as the request's error code
            return _failed(exc)

    @staticmethod
    def _then(header: wire.RequestHeader, future: concurrent.futures.Future,
              answer: Callable[[Any, BaseException | None], dict]
              ) -> concurrent.futures.Future:
        """The response frame built by ``answer(value, error)`` once ``future`` is done."""
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f):
            try:
                try:
                    value, error = f.result(), None
                except BaseException as exc:  # noqa: BLE001 - answered as its code
                    value, error = None, _typed(exc)
                out.set_result(wire.encode_response_parts(header, answer(value, error)))
            except BaseException as exc:  # noqa: BLE001 - the listener logs and closes
                out.set_exception(exc)

        future.add_done_callback(done)
        return out

    # -- FindCoordinator ---------------------------------------------------------------------
    def find_coordinator(self, request: Request):
        body = self._body(request)
        header = request.header
        key = body["key"]
        none = {"throttle_time_ms": 0, "node_id": -1, "host": "", "port": -1}
        if body["key_type"] != 0:
            # no transactions: answered as a Kafka-compatible broker with transactions
            # disabled does (non-retriable), not as a coordinator to wait for
            return wire.encode_response_parts(header, {
                **none, "error_code": _ERR["UNSUPPORTED_VERSION"].code,
                "error_message": "transactions are not supported"})
        if not key:
            return wire.encode_response_parts(header, {
                **none, "error_code": _ERR["INVALID_GROUP_ID"].code,
                "error_message": "the group id is empty"})
        if self._group_denied(request, "Describe", key):
            return wire.encode_response_parts(header, {
                **none, "error_code": _ERR["GROUP_AUTHORIZATION_FAILED"].code,
                "error_message": f"may not describe group {key!r}"})
        try:
            node_id = self.groups.find_coordinator(key)
            endpoint = next((b for b in self.backend.brokers() if b.node_id == node_id), None)
            address = endpoint.on(request.listener) if endpoint is not None else None
            if address is None:
                raise CoordinatorNotAvailableError(
                    f"the coordinator of {key!r} (broker {node_id}) has no listener known here")
        except Exception as exc:  # noqa: BLE001 - answered as its code
            exc = _typed(exc)
            return wire.encode_response_parts(header, {
                **none, "error_code": _code(exc), "error_message": str(exc) or None})
        return wire.encode_response_parts(header, {
            "throttle_time_ms": 0, "error_code": wire.NONE, "error_message": None,
            "node_id": endpoint.node_id, "host": address[0], "port": address[1]})

    # -- JoinGroup ---------------------------------------------------------------------------
    def join_group(self, request: Request):
        body = self._body(request)
        header = request.header
        version = header.api_version
        flexible_names = version >= 7          # protocol_name nullable from v7

        def answer(result, error):
            if error is not None:
                return {"throttle_time_ms": 0, "error_code": _code(error),
                        "generation_id": -1, "protocol_type": None,
                        "protocol_name": None if flexible_names else "", "leader": "",
                        "member_id": "", "members": []}
            members = [{"member_id": mid, "group_instance_id": instance,
                        "metadata": _opaque(metadata)}
                       for mid, (instance, metadata) in (result["members"] or {}).items()]
            return {"throttle_time_ms": 0, "error_code": wire.NONE,
                    "generation_id": result["generation"],
                    "protocol_type": body["protocol_type"],
                    "protocol_name": result["protocol"] or ("" if not flexible_names
                                                            else None),
                    "leader": result["leader_id"] or "", "member_id": result["member_id"],
                    "members": members}

        if not body["group_id"]:
            return wire.encode_response_parts(header, answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Read", body["group_id"]):
            return wire.encode_response_parts(header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        rebalance_timeout_ms = body["rebalance_timeout_ms"]
        if version == 0 or rebalance_timeout_ms < 0:
            rebalance_timeout_ms = body["session_timeout_ms"]     # v0: Kafka's rule
        protocols = [(p["name"], bytes(p["metadata"])) for p in body["protocols"]]
        future = self._call("join_group", body["group_id"], body["member_id"],
                            body["protocol_type"], protocols, body["session_timeout_ms"],
                            rebalance_timeout_ms, body["group_instance_id"],
                            header.client_id or "consumer")
        return self._then(header, future, answer)

    # -- SyncGroup ---------------------------------------------------------------------------
    def sync_group(self, request: Request):
        body = self._body(request)

        def answer(assignment, error):
            return {"throttle_time_ms": 0,
                    "error_code": wire.NONE if error is None else _code(error),
                    "protocol_type": body["protocol_type"],
                    "protocol_name": body["protocol_name"],
                    "assignment": b"" if error is not None else _opaque(assignment)}

        if not body["group_id"]:
            return wire.encode_response_parts(request.header,
                                              answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Read", body["group_id"]):
            return wire.encode_response_parts(request.header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        assignments = {a["member_id"]: bytes(a["assignment"]) for a in body["assignments"]}
        future = self._call("sync_group", body["group_id"], body["member_id"],
                            body["generation_id"], assignments or None, None)
        return self._then(request.header, future, answer)

    # -- Heartbeat ---------------------------------------------------------------------------
    def heartbeat(self, request: Request):
        body = self._body(request)

        def answer(_, error):
            if isinstance(error, CoordinatorLoadInProgressError):
                error = None      # Kafka: "the group is still loading, respond blindly"
            return {"throttle_time_ms": 0,
                    "error_code": wire.NONE if error is None else _code(error)}

        if not body["group_id"]:
            return wire.encode_response_parts(request.header,
                                              answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Read", body["group_id"]):
            return wire.encode_response_parts(request.header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        future = self._call("heartbeat", body["group_id"], body["member_id"],
                            body["generation_id"], 0)
        return self._then(request.header, future, answer)

    # -- LeaveGroup --------------------------------------------------------------------------
    def leave_group(self, request: Request):
        body = self._body(request)
        header = request.header
        group_id = body["group_id"]
        if header.api_version < 3:
            leaving = [{"member_id": body["member_id"], "group_instance_id": None}]
        else:
            leaving = [{"member_id": m["member_id"], "group_instance_id":
                        m["group_instance_id"]} for m in body["members"]]

        def answer(results, error):
            if error is None:
                error = next((r for r in results if isinstance(r, _COORDINATOR_ERRORS)),
                             None)
            if error is not None:                 # the whole request failed
                return {"throttle_time_ms": 0, "error_code": _code(error), "members": []}
            codes = [_code(r) if isinstance(r, BaseException) else wire.NONE
                     for r in results]
            top = codes[0] if header.api_version < 3 else wire.NONE
            return {"throttle_time_ms": 0, "error_code": top, "members": [
                {**m, "error_code": c} for m, c in zip(leaving, codes)]}

        if not group_id:
            return wire.encode_response_parts(header, answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Read", group_id):
            return wire.encode_response_parts(header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        futures = [self._call("leave_group", group_id, m["member_id"], m["group_instance_id"])
                   for m in leaving]
        return self._then(header, _gather(futures), answer)

    # -- OffsetCommit ------------------------------------------------------------------------
    def offset_commit(self, request: Request):
        body = self._body(request)
        header = request.header
        codes: dict[tuple[str, int], int] = {}
        offsets: dict[tuple[str, int], tuple[int, str]] = {}
        known: dict[str, set | None] = {}
        unreadable = self.access.denied(request, "Read", "Topic",
                                        {t["name"] for t in body["topics"]})
        for topic in body["topics"]:
            name = topic["name"]
            if name not in known:
                parts = self._partitions(name)
                known[name] = parts
            for p in topic["partitions"]:
                tp = (name, p["partition_index"])
                metadata = p["committed_metadata"] or ""
                if name in unreadable:
                    codes[tp] = _ERR["TOPIC_AUTHORIZATION_FAILED"].code
                elif known[name] is None or tp[1] not in known[name]:
                    codes[tp] = _ERR["UNKNOWN_TOPIC_OR_PARTITION"].code
                elif len(metadata.encode("utf-8")) > OFFSET_METADATA_MAX_BYTES:
                    codes[tp] = _ERR["OFFSET_METADATA_TOO_LARGE"].code
                else:
                    offsets[tp] = (p["committed_offset"], metadata)

        def answer(_, error):
            code = wire.NONE if error is None else _code(error)
            topics: dict[str, list] = {}
            for t in body["topics"]:
                for p in t["partitions"]:
                    tp = (t["name"], p["partition_index"])
                    topics.setdefault(tp[0], []).append(
                        {"partition_index": tp[1], "error_code": codes.get(tp, code)})
            return {"throttle_time_ms": 0, "topics": [
                {"name": name, "partitions": parts} for name, parts in topics.items()]}

        if not body["group_id"]:
            return wire.encode_response_parts(header, answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Read", body["group_id"]):
            codes.clear()
            return wire.encode_response_parts(header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        if not offsets:
            return wire.encode_response_parts(header, answer(None, None))
        future = self._call("commit_offsets", body["group_id"], body["member_id"],
                            body["generation_id_or_member_epoch"], offsets)
        return self._then(header, future, answer)

    def _partitions(self, topic: str) -> set | None:
        try:
            parts = self.backend.partitions(topic)
        except Exception:  # noqa: BLE001 - a bad name: an unknown topic
            return None
        return None if parts is None else {p.partition for p in parts}

    # -- OffsetFetch -------------------------------------------------------------------------
    def offset_fetch(self, request: Request):
        body = self._body(request)
        header = request.header
        version = header.api_version
        requested = body["topics"]
        hidden = self.access.denied(request, "Describe", "Topic",
                                    {t["name"] for t in requested or ()})

        def answer(committed, error):
            if error is not None:
                code = _code(error)
                if version >= 2:
                    return {"throttle_time_ms": 0, "topics": [], "error_code": code}
                return {"throttle_time_ms": 0, "topics": [
                    {"name": t["name"], "partitions": [
                        {"partition_index": p, "committed_offset": -1, "metadata": "",
                         "error_code": code} for p in t["partition_indexes"]]}
                    for t in requested]}
            if requested is None:
                # all the group's offsets: those of topics the principal may not describe
                # are left out (Kafka's filter)
                wanted: dict[str, list] = {}
                for topic, partition in sorted(committed):
                    if self.access.allowed(request, "Describe", "Topic", topic):
                        wanted.setdefault(topic, []).append(partition)
            else:
                wanted = {}
                for t in requested:
                    wanted.setdefault(t["name"], []).extend(t["partition_indexes"])
            topics = []
            for name, partitions in wanted.items():
                entries = []
                for p in partitions:
                    if name in hidden:
                        entries.append({"partition_index": p, "committed_offset": -1,
                                        "metadata": "", "error_code":
                                        _ERR["TOPIC_AUTHORIZATION_FAILED"].code})
                        continue
                    offset, metadata = committed.get((name, p), (-1, ""))
                    entries.append({"partition_index": p, "committed_offset": offset,
                                    "metadata": metadata or "", "error_code": wire.NONE})
                topics.append({"name": name, "partitions": entries})
            return {"throttle_time_ms": 0, "topics": topics, "error_code": wire.NONE}

        if not body["group_id"]:
            return wire.encode_response_parts(header, answer(None, _coded("INVALID_GROUP_ID")))
        if self._group_denied(request, "Describe", body["group_id"]):
            return wire.encode_response_parts(header, answer(
                None, _coded("GROUP_AUTHORIZATION_FAILED")))
        partitions = None if requested is None else [
            [t["name"], p] for t in requested for p in t["partition_indexes"]]
        future = self._call("fetch_offsets", body["group_id"], partitions)
        return self._then(header, future, answer)

    # -- ListGroups ---------------------------------------------------------------------------
    def list_groups(self, request: Request):
        body = self._body(request)
        states = {s.lower() for s in body["states_filter"]}
        types = {t.lower() for t in body["types_filter"]}
        # Describe on the cluster lists every group; otherwise those the principal may
        # describe (Kafka's rule)
        every = self.access.allowed(request, "Describe", "Cluster", CLUSTER)

        def answer(listed, error):
            if error is not None and not isinstance(error, NotCoordinatorError):
                return {"throttle_time_ms": 0, "error_code": _code(error), "groups": []}
            groups = [{"group_id": g, "protocol_type": protocol_type or "",
                       "group_state": state, "group_type": _GROUP_TYPE}
                      for g, protocol_type, state in (listed or [])
                      if (not states or state.lower() in states)
                      and (not types or _GROUP_TYPE in types)
                      and (every or self.access.allowed(request, "Describe", "Group", g))]
            return {"throttle_time_ms": 0, "error_code": wire.NONE, "groups": groups}

        # a broker that coordinates nothing (NOT_COORDINATOR) lists no group, as in Kafka
        return self._then(request.header, self._call("list_groups_detail"), answer)

    # -- DescribeGroups -----------------------------------------------------------------------
    def describe_groups(self, request: Request):
        body = self._body(request)
        names = list(body["groups"])

        def one(name: str, desc) -> dict:
            if isinstance(desc, BaseException):
                return {"error_code": _code(desc), "group_id": name, "group_state": "",
                        "protocol_type": "", "protocol_data": "", "members": []}
            stable = desc["state"] == "Stable"
            return {"error_code": wire.NONE, "group_id": name, "group_state": desc["state"],
                    "protocol_type": desc.get("protocol_type") or "",
                    "protocol_data": desc.get("protocol") or "",
                    "members": [{"member_id": mid,
                                 "group_instance_id": m.get("group_instance_id"),
                                 "client_id": m.get("client_id") or "",
                                 "client_host": m.get("client_host") or "",
                                 # Kafka: metadata and assignment only of a Stable group
                                 "member_metadata": _opaque(m.get("metadata")) if stable
                                 else b"",
                                 "member_assignment": _opaque(m.get("assignment")) if stable
                                 else b""}
                                for mid, m in sorted(desc.get("members", {}).items())]}

        def answer(results, _error):
            return {"throttle_time_ms": 0,
                    "groups": [one(n, r) for n, r in zip(names, results)]}

        futures = [_failed(_coded("INVALID_GROUP_ID")) if not n
                   else _failed(_coded("GROUP_AUTHORIZATION_FAILED"))
                   if self._group_denied(request, "Describe", n)
                   else self._call("describe_group", n) for n in names]
        return self._then(request.header, _gather(futures), answer)

    # -- DeleteGroups -------------------------------------------------------------------------
    def delete_groups(self, request: Request):
        body = self._body(request)
        names = list(body["groups_names"])

        def answer(results, _error):
            return {"throttle_time_ms": 0, "results": [
                {"group_id": n, "error_code": _code(r) if isinstance(r, BaseException)
                 else wire.NONE} for n, r in zip(names, results)]}

        futures = [_failed(_coded("INVALID_GROUP_ID")) if not n
                   else _failed(_coded("GROUP_AUTHORIZATION_FAILED"))
                   if self._group_denied(request, "Delete", n)
                   else self._call("delete_group", n) for n in names]
        return self._then(request.header, _gather(futures), answer)


def _coded(name: str) -> wire.BrokerResponseError:
    return wire.BrokerResponseError(_ERR[name].code)


# -- the Broker's side --------------------------------------------------------------------------
#: The coordinator's methods whose first argument is a group id.
_GROUP_METHODS = frozenset({"join_group", "sync_group", "heartbeat", "leave_group",
                            "commit_offsets", "fetch_offsets", "describe_group",
                            "delete_group"})


class BrokerGroups:
    """GroupBackend of a Broker actor: ``find`` is ``Broker.find_coordinator`` (creates the
    offsets topic on first use), ``coordinator()`` the broker's GroupCoordinator actor
    handle (None until the broker first hosts an offsets partition). A call is one Ray
    actor call whose ObjectRef's Future is the answer (completed on Ray's thread).

    ``leads(group_id)``: whether the broker leads the group's offsets partition. The
    broker applies a LeaderAndIsr before its coordinator hears of it (a Ray call), so a
    client that looked the coordinator up in between would be told NOT_COORDINATOR by
    the very broker Metadata names (and confluent-kafka's ``committed()`` once failed on
    it). Kafka marks the partition loading as it becomes leader; here such an answer is
    COORDINATOR_LOAD_IN_PROGRESS, which every client retries on the same broker."""

    def __init__(self, find: Callable[[str], dict], coordinator: Callable[[], Any],
                 broker_id: int, *, leads: Callable[[str], bool] | None = None):
        self._find = find
        self._coordinator = coordinator
        self._leads = leads or (lambda _group: False)
        self.broker_id = broker_id

    def find_coordinator(self, group_id: str) -> int:
        return int(self._find(group_id)["broker_id"])

    def call(self, method: str, *args) -> concurrent.futures.Future:
        group = args[0] if method in _GROUP_METHODS and args else None
        handle = self._coordinator()
        if handle is None:
            return _failed(self._loading(group, NotCoordinatorError(
                f"broker {self.broker_id} coordinates no group (it hosts no offsets "
                f"partition)")))
        future = getattr(handle, method).remote(*args).future()
        if group is None:
            return future
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f):
            try:
                out.set_result(f.result())
            except BaseException as exc:  # noqa: BLE001 - carried to the answer
                out.set_exception(self._loading(group, _typed(exc)))

        future.add_done_callback(done)
        return out

    def _loading(self, group, exc: BaseException) -> BaseException:
        if group is not None and isinstance(exc, NotCoordinatorError) and self._leads(group):
            return CoordinatorLoadInProgressError(
                f"broker {self.broker_id} leads the offsets partition of group {group!r}; "
                f"its coordinator is taking it over ({exc})")
        return exc


__all__ = ["GroupApis", "GroupBackend", "BrokerGroups", "OFFSET_METADATA_MAX_BYTES"]
