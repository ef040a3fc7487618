"""GroupMember: one consumer's side of the group protocol (Kafka's ConsumerCoordinator),
usable in a driver, a Ray task or a Ray actor. The Consumer and the member actors build on
it; it does no fetching itself.

- ``coordinator()`` finds the group's coordinator: any broker's ``find_coordinator`` names
  the broker leading the group's ``__consumer_offsets`` partition (creating the topic on
  first use), whose ``group-coordinator-<id>`` actor serves the group.
- ``join()`` runs JoinGroup then SyncGroup until it holds an assignment of the current
  generation: the leader computes the assignment with the group's assignor
  (``assignors.py``) from every member's subscription; it retries what Kafka's client
  retries (a coordinator that moved or is loading, a rebalance that restarted, an unknown
  member id: rejoin as new), within ``rebalance_timeout_ms``-bounded attempts.
- ``heartbeat()`` is one Heartbeat; it answers True while the generation is current, False
  when the member must rejoin (a rebalance started, or its generation or membership is
  gone), which the caller does after revoking what it must.
- ``release(tps)`` / ``claim(tps, wait_ms)``: the handover of cooperative assignors. The
  leader sends the assignor's target with the moves marked (``handover``: old owner ->
  partitions); an old owner releases what it gave up after committing it, and a new
  owner claims what it was given, getting each partition (with its committed offset)
  once nobody has to release it any more.
- ``commit(offsets)`` / ``committed(tps)`` / ``leave()``. Where offsets live follows
  ``offsets_storage`` (seed 000 5.6): "kafka", the coordinator's __consumer_offsets;
  "zookeeper", ``/consumers/<g>/offsets/<t>/<p>`` through the consumer's own ZooKeeper
  session (``zk``, a ``zk_consumer.ConsumerZk``), written only after the coordinator has
  accepted an empty commit from this member and generation (the same generation check as
  a real commit: an older generation is refused and nothing is written). ``dual_commit``
  writes both stores (the coordinator first: its refusal stops the ZooKeeper write) and
  ``committed`` answers the larger offset of the two (Kafka 0.8.2's
  ZookeeperConsumerConnector with ``dual.commit.enabled``: "look up the offset in
  zookeeper and take the max"), which is what a migration in either direction needs.

Subscriptions and assignments travel as Kafka's consumer protocol bytes
(``consumer_protocol.py``), opaque to the coordinator, so raykafka's members and Kafka
clients (confluent-kafka, kafka-python, aiokafka on the brokers' listeners) can share a
group and any of them can be its leader.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from ..errors import (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                      FencedInstanceIdError, IllegalArgumentError, IllegalGenerationError,
                      InconsistentGroupProtocolError,
                      KafkaTimeoutError, NoBrokersAvailable, NotCoordinatorError,
                      RebalanceInProgressError, UnknownMemberIdError)
from ..protocol import group_coordinator_actor_name, unwrap
from .assignors import EAGER, Subscription, assignor
from .consumer_protocol import (decode_assignment, decode_subscription, encode_assignment,
                                encode_subscription)
from .metadata import broker_handle, first_answer

log = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
CALL_TIMEOUT_S = 30.0
#: Errors after which the coordinator is looked up again.
_MOVED = (NotCoordinatorError, CoordinatorNotAvailableError)


def _ray():
    from .. import raycompat
    return raycompat.ray


class GroupMember:
    """See the module docstring. Thread-safe: one lock around the member's state."""

    def __init__(self, metadata, group_id: str, *, strategy: str = "range",
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 300_000,
                 group_instance_id: str | None = None, client_id: str = "raykafka",
                 retry_backoff_ms: int = 100, offsets_storage: str = "kafka",
                 dual_commit: bool = False, zk=None):
        if not isinstance(group_id, str) or not group_id:
            raise IllegalArgumentError(f"group_id must be a non-empty str, got {group_id!r}")
        assignor(strategy)                              # an unknown name raises here
        if offsets_storage not in ("kafka", "zookeeper"):
            raise IllegalArgumentError(f"offsets_storage must be 'kafka' or 'zookeeper', got "
                                       f"{offsets_storage!r}")
        if (offsets_storage == "zookeeper" or dual_commit) and zk is None:
            raise IllegalArgumentError("ZooKeeper offsets need the consumer's ZooKeeper "
                                       "session (zk)")
        self.offsets_storage = offsets_storage
        self.dual_commit = bool(dual_commit)
        self.zk = zk
        self.metadata = metadata
        self.group_id = group_id
        self.strategy = strategy
        self.eager = strategy in EAGER
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.backoff_s = retry_backoff_ms / 1000
        self.member_id = ""
        self.generation = -1
        self.assignment: list[tuple[str, int]] = []
        self.is_leader = False
        #: {topic: partition count} of the leader's last assignment (Kafka's
        #: assignmentSnapshot): a leader whose metadata later disagrees rejoins.
        self.assigned_counts: dict[str, int] | None = None
        self._handle = None
        self.coordinator_id: int | None = None      # the broker coordinator() found
        self._lock = threading.RLock()

    # -- the coordinator ---------------------------------------------------------------------------
    def coordinator(self, *, refresh: bool = False):
        with self._lock:
            if self._handle is not None and not refresh:
                return self._handle
            ray = _ray()
            ids = list((self.metadata.snapshot().get("brokers") or {}).keys())
            ids = [int(b) for b in ids] or list(self.metadata._candidate_ids())
            refs, last = {}, None
            for bid in ids:
                try:
                    handle = broker_handle(self.metadata.namespace, bid)
                except ValueError as exc:                   # not running
                    last = exc
                    continue
                refs[handle.find_coordinator.remote(self.group_id)] = bid

            def coordinator_actor(_bid, found):
                return found["broker_id"], ray.get_actor(
                    group_coordinator_actor_name(found["broker_id"]),
                    namespace=self.metadata.namespace)

            # every broker asked at once, the first good answer taken: a paused broker
            # never holds the lookup up
            bid, found = first_answer(refs, CALL_TIMEOUT_S, accept=coordinator_actor)
            if bid is not None:
                self.coordinator_id, self._handle = found
                return self._handle
            last = unwrap(found) if found is not None else last
            if isinstance(last, ValueError):                # no coordinator actor yet
                last = CoordinatorNotAvailableError(str(last))
            if isinstance(last, Exception):
                raise last
            raise NoBrokersAvailable(f"no broker answered find_coordinator ({last!r})")

    def _call(self, method: str, *args, timeout_s: float = CALL_TIMEOUT_S):
        ray = _ray()
        handle = self.coordinator()
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise KafkaTimeoutError(f"{method} of group {self.group_id!r}: no answer in "
                                    f"{timeout_s}s") from None
        except Exception as exc:  # noqa: BLE001 - the coordinator's typed error, unwrapped
            err = unwrap(exc)
            if isinstance(err, _MOVED) or isinstance(err, ray.exceptions.RayActorError):
                with self._lock:
                    self._handle = None
                if isinstance(err, ray.exceptions.RayActorError):
                    raise CoordinatorNotAvailableError(
                        f"the coordinator of {self.group_id!r} died: {err}") from None
            raise err from None

    # -- membership ------------------------------------------------------------------------------
    def join(self, topics, *, streams: dict | None = None, owned=(),
             timeout_s: float | None = None) -> list[tuple[str, int]]:
        """Join (or rejoin) subscribed to ``topics``; returns this member's assignment of
        the new generation."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else self.rebalance_timeout_ms / 1000 + 30)
        subscription = encode_subscription(sorted(set(topics)), owned=sorted(owned),
                                           generation=self.generation, streams=streams)
        while True:
            try:
                return self._join_once(subscription)
            except (CoordinatorLoadInProgressError, RebalanceInProgressError,
                    IllegalGenerationError, KafkaTimeoutError, NoBrokersAvailable,
                    *_MOVED) as exc:
                last = exc
            except UnknownMemberIdError as exc:
                last = exc
                with self._lock:
                    self.member_id, self.generation = "", -1
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"could not join group {self.group_id!r}: "
                                        f"{last}") from last
            time.sleep(self.backoff_s * (0.5 + random.random()))

    def _join_once(self, subscription: dict) -> list[tuple[str, int]]:
        joined = self._call("join_group", self.group_id, self.member_id, PROTOCOL_TYPE,
                            [(self.strategy, subscription)], self.session_timeout_ms,
                            self.rebalance_timeout_ms, self.group_instance_id,
                            self.client_id, timeout_s=self.rebalance_timeout_ms / 1000 + 30)
        with self._lock:
            self.member_id = joined["member_id"]
            self.generation = joined["generation"]
            self.is_leader = joined["leader_id"] == self.member_id
        assignments = handover = None
        if self.is_leader and joined["members"] is not None:
            assignments, handover = self._assign(joined["protocol"], joined["members"])
        mine = self._call("sync_group", self.group_id, self.member_id, joined["generation"],
                          assignments, handover)
        with self._lock:
            self.assignment = _assignment(mine)
            return list(self.assignment)

    def _assign(self, protocol: str, members: dict) -> tuple[dict, dict | None]:
        """The leader's work: every member's assignment from their subscriptions, and for
        a cooperative assignor the handovers (member -> the partitions it owns that move
        to another member: pending at the coordinator until it releases them)."""
        subs = {mid: _subscription(mid, meta) for mid, (_, meta) in members.items()}
        topics = {t for s in subs.values() for t in s.topics}
        counts = {}
        for topic in sorted(topics):
            try:
                counts[topic] = len(self.metadata.partitions_for(topic))
            except Exception:  # noqa: BLE001 - a topic that does not exist (yet): skipped
                continue
        with self._lock:
            self.assigned_counts = dict(counts)
        result = assignor(protocol)(subs, counts)
        handover = None
        if hasattr(result, "target"):                   # cooperative: moves are handed over
            handover = {mid: [list(tp) for tp in tps]
                        for mid, tps in result.pending_revocation.items()}
            result = result.target
        return {mid: encode_assignment(tps) for mid, tps in result.items()}, handover

    def heartbeat(self, wait_ms: int = 0) -> bool:
        """True while this member's generation is current; False: rejoin. An answer about
        a (member, generation) this member has left meanwhile (a join ran concurrently)
        is ignored (True). ``wait_ms``: a long poll, answered when a rebalance starts or
        after ``wait_ms`` (see GroupCoordinator.heartbeat)."""
        with self._lock:
            member_id, generation = self.member_id, self.generation
        if not member_id:
            return False
        try:
            self._call("heartbeat", self.group_id, member_id, generation, wait_ms,
                       timeout_s=10 + wait_ms / 1000)
            return True
        except (RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError,
                FencedInstanceIdError) as exc:
            with self._lock:
                if (self.member_id, self.generation) != (member_id, generation):
                    return True
                if isinstance(exc, (UnknownMemberIdError, FencedInstanceIdError)):
                    self.member_id, self.generation = "", -1
            return False

    # -- handover (cooperative assignors) -----------------------------------------------------------
    def release(self, partitions) -> "Pending | None":
        """Tell the coordinator this member gave ``partitions`` up (after committing what
        it processed of them): their new owners may fetch them. Returns at once (None
        without a membership): the caller goes on with what it kept while the release
        travels, and looks at ``Pending.error()`` once ``ready()``; a release that failed
        leaves the partitions pending at the coordinator until the group rebalances, so
        the caller rejoins (``Consumer._check_releases``)."""
        with self._lock:
            member_id, generation = self.member_id, self.generation
        if not member_id or not partitions:
            return None
        handle = self.coordinator()
        ref = handle.release_partitions.remote(self.group_id, member_id, generation,
                                               [list(tp) for tp in partitions])
        return Pending(self, ref, f"release of {[tuple(tp) for tp in partitions]}",
                       generation, timeout_s=10)

    def claim(self, partitions, wait_ms: int = 0) -> "Claim":
        """Ask the coordinator which of ``partitions`` (this member's, just assigned) no
        other member has to release any more; a long poll of up to ``wait_ms``. Returns
        at once: the answer is ``Claim.result()`` (``Claim.ref`` to wait on)."""
        with self._lock:
            member_id, generation = self.member_id, self.generation
        handle = self.coordinator()
        ref = handle.claim_partitions.remote(self.group_id, member_id, generation,
                                             [list(tp) for tp in partitions], int(wait_ms))
        tps = [tuple(tp) for tp in partitions]
        return Claim(self, ref, f"claim of {tps}", generation, timeout_s=10 + wait_ms / 1000)

    def leave(self) -> None:
        if not self.member_id:
            return
        try:
            self._call("leave_group", self.group_id, self.member_id, timeout_s=10)
        except Exception as exc:  # noqa: BLE001 - the session timeout removes it anyway
            log.info("leave_group of %r: %r", self.group_id, exc)
        with self._lock:
            self.member_id, self.generation, self.assignment = "", -1, []

    # -- offsets ----------------------------------------------------------------------------------
    def commit(self, offsets: dict) -> None:
        """Commit ``{(topic, partition): offset | (offset, metadata)}`` as this member of
        its generation (IllegalGenerationError / UnknownMemberIdError /
        RebalanceInProgressError if it is not current: nothing is committed). Without a
        member id (manual assignment) only while the group has no members. With ZooKeeper
        storage, see the module docstring."""
        offsets = dict(offsets)
        to_kafka = offsets if (self.offsets_storage == "kafka" or self.dual_commit) else {}
        self._commit_kafka(to_kafka)          # with {}: only the generation check
        if self.offsets_storage == "zookeeper" or self.dual_commit:
            self.zk.commit_offsets(offsets)

    def _commit_kafka(self, offsets: dict) -> None:
        last = None
        for _ in range(20):
            try:
                return self._call("commit_offsets", self.group_id, self.member_id,
                                  self.generation if self.member_id else -1, dict(offsets))
            except (CoordinatorLoadInProgressError, *_MOVED) as exc:
                last = exc
                time.sleep(self.backoff_s)
        raise last

    def committed(self, partitions=None) -> dict:
        """``{(topic, partition): offset}`` committed for the group (from the configured
        storage; with dual commit the larger of the two)."""
        if partitions is not None:
            partitions = [(t, int(p)) for t, p in partitions]
        if self.offsets_storage == "zookeeper" and not self.dual_commit:
            return self.zk.fetch_offsets(partitions)
        return self._from_storage(self._committed_kafka(partitions), partitions)

    def _from_storage(self, kafka: dict, partitions=None) -> dict:
        """The committed offsets of ``partitions`` by the configured storage, given the
        coordinator's (``kafka``): ZooKeeper's alone, or with dual commit the larger."""
        if self.offsets_storage == "zookeeper" and not self.dual_commit:
            return self.zk.fetch_offsets(partitions)
        got = dict(kafka)
        if self.dual_commit:
            for tp, offset in self.zk.fetch_offsets(partitions).items():
                got[tp] = max(offset, got.get(tp, offset))
        return got

    def _committed_kafka(self, partitions=None) -> dict:
        last = None
        for _ in range(20):
            try:
                got = self._call("fetch_offsets", self.group_id,
                                 None if partitions is None else [list(tp) for tp in partitions])
                return {tuple(tp): off for tp, (off, _meta) in got.items()}
            except (CoordinatorLoadInProgressError, *_MOVED) as exc:
                last = exc
                time.sleep(self.backoff_s)
        raise last


def _subscription(member_id: str, metadata) -> Subscription:
    """A member's subscription from its JoinGroup metadata: Kafka's consumer protocol
    bytes (any client's). Bytes nobody can read subscribe the member to nothing (it gets
    no partition; the others go on)."""
    try:
        sub = decode_subscription(metadata)
    except (ValueError, TypeError) as exc:
        log.warning("member %r of the group sent metadata that is not Kafka's consumer "
                    "protocol (%r): it gets no partition", member_id, exc)
        return Subscription(())
    return Subscription(tuple(sub["topics"]), streams=sub["streams"],
                        owned=tuple(sub["owned"]), generation=sub["generation"])


def _assignment(assignment) -> list[tuple[str, int]]:
    """This member's partitions from its SyncGroup answer (any leader's bytes; None or
    b"": none)."""
    if not assignment:
        return []
    try:
        return decode_assignment(assignment)
    except (ValueError, TypeError) as exc:
        raise InconsistentGroupProtocolError(
            f"the group's leader sent an assignment that is not Kafka's consumer protocol: "
            f"{exc}") from None


class Pending:
    """A call to the coordinator in flight (``GroupMember.release``, ``claim``), made as
    member of ``generation``: ``ready()`` once answered (or past its timeout), ``get()``
    its answer or the coordinator's typed error (a coordinator that moved or died is
    looked up again at the next call), ``error()`` that error or None."""

    def __init__(self, member: GroupMember, ref, what: str, generation: int,
                 timeout_s: float):
        self.member = member
        self.ref = ref
        self.what = what
        self.generation = generation
        self.expires_s = time.monotonic() + timeout_s

    def ready(self) -> bool:
        done, _ = _ray().wait([self.ref], timeout=0)
        return bool(done) or time.monotonic() >= self.expires_s

    def get(self):
        ray = _ray()
        member = self.member
        try:
            return ray.get(self.ref, timeout=max(self.expires_s - time.monotonic(), 0.001))
        except ray.exceptions.GetTimeoutError:
            raise KafkaTimeoutError(f"{self.what} in group {member.group_id!r}: "
                                    f"no answer") from None
        except Exception as exc:  # noqa: BLE001 - the coordinator's typed error
            err = unwrap(exc)
            if isinstance(err, _MOVED) or isinstance(err, ray.exceptions.RayActorError):
                with member._lock:
                    member._handle = None
            raise err from None

    def error(self) -> BaseException | None:
        try:
            self.get()
        except Exception as exc:  # noqa: BLE001 - the answer asked for
            return exc
        return None


class Claim(Pending):
    """A claim in flight (``GroupMember.claim``): ``result()`` gives ``{(topic, partition):
    committed offset or None}`` of the partitions this member may fetch now (the
    configured offsets storage's committed offset, as ``GroupMember.committed``), or
    raises the coordinator's typed error (RebalanceInProgressError and the generation
    errors: rejoin)."""

    def result(self) -> dict:
        member = self.member
        got = self.get()
        ready = [tuple(tp) for tp in got]
        if not ready:
            return {}
        stored = member._from_storage(
            {tuple(tp): v[0] for tp, v in got.items() if v is not None}, ready)
        return {tp: stored.get(tp) for tp in ready}
