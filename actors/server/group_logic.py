"""The group membership protocol of a coordinator, as pure logic (Kafka's GroupCoordinator
and GroupMetadata): JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the offset-commit check,
and the timers (session expiry, the rebalance deadline, the initial rebalance delay). No Ray,
no I/O: the actor around it (the coordinator) turns requests into calls here, waits on the
futures it returns, and persists what it is told to; the clock is injected, so every rule
has a table test (tests/test_group_logic.py).

States (Kafka's):

    EMPTY ──join──► PREPARING_REBALANCE ──all known members joined, or the rebalance
      ▲                 ▲        │        deadline passed (the missing are removed)──►
      │                 │        ▼
      │           (join of a new member, a member's metadata changed, leave,
      │            session expiry)
      │                 │
      └─ last member ── STABLE ◄──leader's SyncGroup── COMPLETING_REBALANCE
         leaves                                         (a member leaving or expiring
                                                         here also goes back to PREPARING)
    DEAD: the group was deleted or its partition moved away (everything is refused).

- JoinGroup answers when the join phase completes: everyone gets the new generation, the
  chosen protocol (the assignor every member supports, by preference vote) and the leader's
  id; the leader also gets every member's metadata and computes the assignment.
  A member without an id gets one (``<client_id>-<uuid>``). A known member of a STABLE
  group rejoining with the same metadata while not the leader gets the current generation
  back without a rebalance. A *static* member (``group_instance_id``, KIP-345) rejoining
  under a new member id replaces its old id and keeps its assignment: no rebalance; the old
  id is fenced (FencedInstanceIdError).
- SyncGroup in COMPLETING_REBALANCE waits for the leader's assignment; once it comes the
  group is STABLE and every waiting SyncGroup gets its member's assignment.
- Every request but JoinGroup carries (member id, generation): an unknown member gets
  UnknownMemberIdError, another generation IllegalGenerationError, and a rebalancing group
  RebalanceInProgressError (commits are still taken while the group prepares a rebalance:
  that is when members commit what they give up, as in Kafka); so a member of an older
  generation can neither commit nor keep partitions (the seed's split brain).
- Handover (cooperative assignors; KIP-848's reconciliation, inside one generation): the
  leader's SyncGroup may name partitions that move from a member that still owns them
  (``handover``: releasing member -> partitions). They are in their new owner's
  assignment but *pending*: ``claim`` answers a partition only once it is not pending,
  i.e. after its old owner's ``release`` (which it sends after committing what it gives
  up). A new generation (a rebalance starting) drops whatever is still pending: the
  members rejoin with what they really own. So a partition is fetched by one member at a
  time, and a move costs one JoinGroup round, not KIP-429's two.
- ``tick(now)`` expires members whose heartbeat is older than their session timeout (in
  every state with members: during a rebalance a member that has not rejoined yet keeps
  its session by heartbeating, as in Kafka, so a dead one does not hold the rebalance up
  until its deadline), completes a join phase at its deadline, and is what the actor calls
  on a timer.
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable

from ..errors import (CoordinatorNotAvailableError, FencedInstanceIdError,
                      IllegalGenerationError, InconsistentGroupProtocolError,
                      InvalidSessionTimeoutError, KafkaError, RebalanceInProgressError,
                      UnknownMemberIdError)

#: Kafka's group.min/max.session.timeout.ms defaults.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
#: Kafka's group.initial.rebalance.delay.ms: a new group waits this long for more members.
INITIAL_REBALANCE_DELAY_MS = 3_000


class GroupState(str, enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class JoinResult:
    member_id: str
    generation: int
    protocol: str | None
    leader_id: str | None
    #: the leader only: member id -> (group_instance_id, metadata) of every member
    members: dict | None = None


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list                           # [(name, metadata)] in preference order
    last_heartbeat_ms: float = 0.0
    assignment: object = None
    join_future: concurrent.futures.Future | None = None
    sync_future: concurrent.futures.Future | None = None

    def metadata_for(self, protocol: str):
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return None


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader_id: str | None = None
    members: dict = field(default_factory=dict)          # member id -> Member
    static: dict = field(default_factory=dict)           # group_instance_id -> member id
    join_deadline_ms: float | None = None
    #: a new member's join in a group with an initial delay: when the delay ends
    initial_delay_until_ms: float | None = None
    #: this generation's handovers not released yet: partition -> the member releasing it
    pending: dict = field(default_factory=dict)

    def supported_protocols(self) -> set:
        names = None
        for m in self.members.values():
            own = {n for n, _ in m.protocols}
            names = own if names is None else names & own
        return names or set()


def _done(future: concurrent.futures.Future | None, value=None, error=None) -> None:
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class GroupLogic:
    """Every group of one coordinator. Thread-safe (one lock); futures are completed
    outside no lock of the caller's, their callbacks must be quick."""

    def __init__(self, clock: Callable[[], float], *,
                 min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS,
                 max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS,
                 initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
                 on_stable: Callable[[Group], None] | None = None,
                 on_empty: Callable[[Group], None] | None = None,
                 on_rebalance: Callable[[Group], None] | None = None):
        self.clock = clock                         # ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.on_stable = on_stable                 # a new generation is stable (stored)
        self.on_empty = on_empty                   # the last member went (stored)
        self.on_rebalance = on_rebalance           # a rebalance starts (waiting beats)
        self.groups: dict[str, Group] = {}
        self.lock = threading.RLock()

    # -- JoinGroup ----------------------------------------------------------------------------
    def join(self, group_id: str, member_id: str, *, protocol_type: str, protocols: list,
             session_timeout_ms: int, rebalance_timeout_ms: int,
             group_instance_id: str | None = None, client_id: str = "consumer"
             ) -> concurrent.futures.Future:
        """A JoinGroup: its future answers a JoinResult (or raises the typed error)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not (self.min_session_timeout_ms <= session_timeout_ms
                <= self.max_session_timeout_ms):
            future.set_exception(InvalidSessionTimeoutError(
                f"session_timeout_ms={session_timeout_ms} is outside the coordinator's "
                f"[{self.min_session_timeout_ms}, {self.max_session_timeout_ms}]"))
            return future
        if not protocols:
            future.set_exception(InconsistentGroupProtocolError(
                f"member of {group_id!r} offers no assignor"))
            return future
        with self.lock:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = Group(group_id)
            try:
                self._join_locked(group, future, member_id, protocol_type, list(protocols),
                                  session_timeout_ms, rebalance_timeout_ms,
                                  group_instance_id, client_id)
            except KafkaError as exc:
                _done(future, error=exc)
        return future

    def _join_locked(self, group: Group, future, member_id, protocol_type, protocols,
                     session_timeout_ms, rebalance_timeout_ms, instance_id, client_id):
        now = self.clock()
        if group.state == GroupState.DEAD:
            raise CoordinatorNotAvailableError(f"group {group.group_id!r} is being unloaded")
        if group.members:
            if protocol_type != group.protocol_type or not (
                    {n for n, _ in protocols} & group.supported_protocols()):
                raise InconsistentGroupProtocolError(
                    f"group {group.group_id!r} uses {group.protocol_type!r} with "
                    f"{sorted(group.supported_protocols())}; the member offers "
                    f"{protocol_type!r} with {[n for n, _ in protocols]}")
        if member_id and member_id not in group.members:
            if instance_id is None or group.static.get(instance_id) is None:
                raise UnknownMemberIdError(
                    f"member {member_id!r} is not in group {group.group_id!r}: rejoin "
                    f"without a member id")
        if instance_id is not None and instance_id in group.static:
            old_id = group.static[instance_id]
            if member_id != old_id:
                return self._replace_static(group, future, old_id, protocols,
                                            session_timeout_ms, rebalance_timeout_ms,
                                            client_id, now)
        if not member_id:
            member_id = f"{client_id}-{uuid.uuid4()}"
            member = Member(member_id, instance_id, client_id, session_timeout_ms,
                            rebalance_timeout_ms, protocols, last_heartbeat_ms=now)
            group.members[member_id] = member
            if instance_id is not None:
                group.static[instance_id] = member_id
            if not group.protocol_type:
                group.protocol_type = protocol_type
            member.join_future = future
            self._prepare_rebalance(group, now, new_member=True)
            self._maybe_complete_join(group, now)
            return
        member = group.members[member_id]
        member.last_heartbeat_ms = now
        changed = member.protocols != protocols
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        if (group.state == GroupState.STABLE and not changed
                and member_id != group.leader_id):
            # a follower that lost its response: the current generation, no rebalance
            _done(future, JoinResult(member_id, group.generation, group.protocol,
                                     group.leader_id))
            return
        if group.state == GroupState.COMPLETING_REBALANCE and not changed:
            _done(future, self._join_result(group, member_id))
            return
        _done(member.join_future, error=RebalanceInProgressError(
            f"member {member_id!r} joined again"))
        member.join_future = future
        self._prepare_rebalance(group, now)
        self._maybe_complete_join(group, now)

    def _replace_static(self, group: Group, future, old_id, protocols, session_timeout_ms,
                        rebalance_timeout_ms, client_id, now):
        """KIP-345: a static member back under a new member id takes its old place (same
        assignment, no rebalance while the group is stable); the old id is fenced."""
        old = group.members.pop(old_id)
        # what the old instance was to hand over is free: it is fenced (it can commit
        # nothing more) and its restart owns only its assignment
        for tp in [tp for tp, mid in group.pending.items() if mid == old_id]:
            del group.pending[tp]
        new_id = f"{client_id}-{uuid.uuid4()}"
        member = Member(new_id, old.group_instance_id, client_id, session_timeout_ms,
                        rebalance_timeout_ms, protocols, last_heartbeat_ms=now,
                        assignment=old.assignment)
        group.members[new_id] = member
        group.static[old.group_instance_id] = new_id
        fenced = FencedInstanceIdError(
            f"group.instance.id {old.group_instance_id!r} was taken by a newer member")
        _done(old.join_future, error=fenced)
        _done(old.sync_future, error=fenced)
        if group.leader_id == old_id:
            group.leader_id = new_id
        if group.state == GroupState.STABLE and protocols == old.protocols:
            _done(future, JoinResult(new_id, group.generation, group.protocol,
                                     group.leader_id))
            return
        member.join_future = future
        self._prepare_rebalance(group, now)
        self._maybe_complete_join(group, now)

    def _prepare_rebalance(self, group: Group, now: float, new_member: bool = False) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            # the assignment being computed is void: the waiting syncs must rejoin
            for m in group.members.values():
                _done(m.sync_future, error=RebalanceInProgressError(
                    f"group {group.group_id!r} is rebalancing again"))
                m.sync_future = None
        group.pending = {}            # the rejoins say what each member really owns
        if group.state != GroupState.PREPARING_REBALANCE:
            empty_before = group.state == GroupState.EMPTY
            group.state = GroupState.PREPARING_REBALANCE
            if self.on_rebalance is not None:
                self.on_rebalance(group)
            timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
            group.join_deadline_ms = now + timeout
            if empty_before and new_member and self.initial_rebalance_delay_ms > 0:
                group.initial_delay_until_ms = now + self.initial_rebalance_delay_ms

    def _maybe_complete_join(self, group: Group, now: float, deadline_passed: bool = False
                             ) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        if group.initial_delay_until_ms is not None and now < group.initial_delay_until_ms \
                and not deadline_passed:
            return
        waiting = [m for m in group.members.values() if m.join_future is None]
        if waiting and not deadline_passed:
            return
        for m in waiting:          # did not rejoin within the rebalance timeout
            self._remove(group, m.member_id)
        group.initial_delay_until_ms = None
        group.join_deadline_ms = None
        group.generation += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol = group.leader_id = None
            group.protocol_type = None
            if self.on_empty is not None:
                self.on_empty(group)
            return
        group.protocol = self._vote(group)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        for m in group.members.values():
            m.assignment = None
            future, m.join_future = m.join_future, None
            m.last_heartbeat_ms = now
            _done(future, self._join_result(group, m.member_id))

    def _join_result(self, group: Group, member_id: str) -> JoinResult:
        members = None
        if member_id == group.leader_id:
            members = {mid: (m.group_instance_id, m.metadata_for(group.protocol))
                       for mid, m in group.members.items()}
        return JoinResult(member_id, group.generation, group.protocol, group.leader_id,
                          members)

    @staticmethod
    def _vote(group: Group) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote: each
        member votes for its first supported candidate; ties by name)."""
        candidates = group.supported_protocols()
        votes: dict[str, int] = {}
        for m in group.members.values():
            choice = next(n for n, _ in m.protocols if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda n: votes[n])

    def _remove(self, group: Group, member_id: str) -> Member | None:
        member = group.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None \
                and group.static.get(member.group_instance_id) == member_id:
            del group.static[member.group_instance_id]
        gone = UnknownMemberIdError(f"member {member_id!r} left group {group.group_id!r}")
        _done(member.join_future, error=gone)
        _done(member.sync_future, error=gone)
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)
        return member

    # -- SyncGroup ----------------------------------------------------------------------------
    def sync(self, group_id: str, member_id: str, generation: int,
             assignments: dict | None = None,
             handover: dict | None = None) -> concurrent.futures.Future:
        """A SyncGroup (the leader sends ``assignments``: member id -> assignment, and
        ``handover``: member id -> the partitions of others' assignments it still owns and
        must release first): its future answers this member's assignment."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            try:
                group, member = self._check_member(group_id, member_id, generation)
                now = self.clock()
                member.last_heartbeat_ms = now
                if group.state == GroupState.PREPARING_REBALANCE:
                    raise RebalanceInProgressError(f"group {group_id!r} is rebalancing")
                if group.state == GroupState.STABLE:
                    future.set_result(member.assignment)
                    return future
                _done(member.sync_future, error=RebalanceInProgressError("synced again"))
                member.sync_future = future
                if member_id == group.leader_id and assignments is not None:
                    for mid, m in group.members.items():
                        m.assignment = assignments.get(mid)
                    group.pending = {tp: mid for mid, tps in (handover or {}).items()
                                     if mid in group.members for tp in tps}
                    group.state = GroupState.STABLE
                    for m in group.members.values():
                        f, m.sync_future = m.sync_future, None
                        _done(f, m.assignment)
                    if self.on_stable is not None:
                        self.on_stable(group)
            except KafkaError as exc:
                _done(future, error=exc)
        return future

    # -- handover (see the module docstring) ---------------------------------------------------
    def release(self, group_id: str, member_id: str, generation: int, partitions) -> list:
        """``member_id`` gave ``partitions`` up (after committing them): those it was to
        hand over are no longer pending. Returns them (what waiting claims may now get)."""
        with self.lock:
            group, _member = self._check_member(group_id, member_id, generation)
            released = [tp for tp in partitions if group.pending.get(tp) == member_id]
            for tp in released:
                del group.pending[tp]
            if released and not group.pending and self.on_stable is not None:
                self.on_stable(group)          # the generation can be stored now
            return released

    def claim(self, group_id: str, member_id: str, generation: int, partitions) -> list:
        """Which of ``partitions`` (of this member's assignment) it may fetch now: those
        no other member still has to release. RebalanceInProgressError while the group
        rebalances (the member rejoins; its claims are void)."""
        with self.lock:
            group, _member = self._check_member(group_id, member_id, generation)
            if group.state != GroupState.STABLE:
                raise RebalanceInProgressError(f"group {group_id!r} is rebalancing: rejoin")
            return [tp for tp in partitions if tp not in group.pending]

    def pending(self, group_id: str) -> dict:
        """This generation's handovers still pending: partition -> releasing member."""
        with self.lock:
            group = self.groups.get(group_id)
            return dict(group.pending) if group is not None else {}

    # -- Heartbeat, LeaveGroup ----------------------------------------------------------------------
    def heartbeat(self, group_id: str, member_id: str, generation: int, *,
                  refresh: bool = True) -> int:
        """Raises the typed error the member must act on (RebalanceInProgressError: rejoin);
        else refreshes the member's session (unless ``refresh`` is False: a check only) and
        returns its session timeout (ms)."""
        with self.lock:
            group, member = self._check_member(group_id, member_id, generation)
            if refresh:
                member.last_heartbeat_ms = self.clock()
            if group.state == GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {group_id!r} is rebalancing: rejoin")
            return member.session_timeout_ms

    def leave(self, group_id: str, member_id: str) -> None:
        with self.lock:
            group = self.groups.get(group_id)
            if group is None or member_id not in group.members:
                raise UnknownMemberIdError(f"member {member_id!r} is not in group "
                                           f"{group_id!r}")
            self._remove(group, member_id)
            self._membership_changed(group, self.clock())

    def _membership_changed(self, group: Group, now: float) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group, now)
            else:
                group.state = GroupState.EMPTY
                group.pending = {}
                group.generation += 1
                group.protocol = group.leader_id = group.protocol_type = None
                if self.on_empty is not None:
                    self.on_empty(group)
        self._maybe_complete_join(group, now)

    # -- commits ------------------------------------------------------------------------------
    def check_commit(self, group_id: str, member_id: str, generation: int) -> None:
        """May this member commit offsets now? Raises the typed error if not. A commit with
        no member id and generation -1 (manual assignment) is allowed while the group has
        no members."""
        with self.lock:
            group = self.groups.get(group_id)
            if not member_id and generation < 0:
                if group is not None and group.members:
                    raise UnknownMemberIdError(
                        f"group {group_id!r} has members: a commit needs a member id and "
                        f"generation")
                return
            group, member = self._check_member(group_id, member_id, generation)
            # as Kafka: a member may still commit while the group prepares a rebalance (its
            # generation is current until the join completes): that is when it commits
            # what it gives up. Once the join completed, its old generation is gone.
            if group.state == GroupState.COMPLETING_REBALANCE:
                raise RebalanceInProgressError(f"group {group_id!r} is rebalancing")
            member.last_heartbeat_ms = self.clock()

    def _check_member(self, group_id, member_id, generation):
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r}")
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"member {member_id!r} is not in group {group_id!r}")
        if generation != group.generation:
            raise IllegalGenerationError(
                f"member {member_id!r} of group {group_id!r} is in generation {generation}, "
                f"the group in {group.generation}")
        return group, member

    # -- timers -------------------------------------------------------------------------------------
    def tick(self) -> float | None:
        """Expire members past their session timeout, complete joins whose deadline or
        initial delay passed. Returns the ms until the next deadline (None: none)."""
        with self.lock:
            now = self.clock()
            soonest = None
            for group in list(self.groups.values()):
                if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE,
                                   GroupState.PREPARING_REBALANCE):
                    expired = [m.member_id for m in group.members.values()
                               if m.join_future is None
                               and now - m.last_heartbeat_ms > m.session_timeout_ms]
                    # while the group prepares a rebalance too (Kafka): a member that has
                    # not rejoined yet keeps its session with heartbeats (answered
                    # RebalanceInProgress); one that died is dropped at its session
                    # timeout, not kept until the rebalance deadline (max_poll_interval)
                    for mid in expired:
                        self._remove(group, mid)
                    if expired:
                        self._membership_changed(group, now)
                if group.state == GroupState.PREPARING_REBALANCE:
                    passed = group.join_deadline_ms is not None \
                        and now >= group.join_deadline_ms
                    self._maybe_complete_join(group, now, deadline_passed=passed)
                for deadline in self._deadlines(group):
                    soonest = deadline if soonest is None else min(soonest, deadline)
            return None if soonest is None else max(soonest - now, 0.0)

    @staticmethod
    def _deadlines(group: Group):
        if group.state == GroupState.PREPARING_REBALANCE:
            if group.join_deadline_ms is not None:
                yield group.join_deadline_ms
            if group.initial_delay_until_ms is not None:
                yield group.initial_delay_until_ms
            for m in group.members.values():
                if m.join_future is None:
                    yield m.last_heartbeat_ms + m.session_timeout_ms
        elif group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            for m in group.members.values():
                yield m.last_heartbeat_ms + m.session_timeout_ms

    # -- stored form (the coordinator persists it; a new coordinator restores it) ----------------
    def snapshot(self, group_id: str) -> dict | None:
        """What a new coordinator needs to resume the group: its generation, protocol,
        leader, and each member's settings, chosen protocol metadata and assignment. Only a
        Stable or Empty group has one (None otherwise: a rebalance in flight is not
        stored; its members rejoin the next coordinator), and a Stable one only once its
        handovers are released (a new coordinator could not know which partitions are
        still pending: until then the previous generation stays the stored one, and its
        members, of a newer generation, rejoin a new coordinator)."""
        with self.lock:
            group = self.groups.get(group_id)
            if group is None or group.state not in (GroupState.STABLE, GroupState.EMPTY) \
                    or group.pending:
                return None
            return {"protocol_type": group.protocol_type, "generation": group.generation,
                    "protocol": group.protocol, "leader_id": group.leader_id,
                    "members": [{"member_id": m.member_id,
                                 "group_instance_id": m.group_instance_id,
                                 "client_id": m.client_id,
                                 "rebalance_timeout_ms": m.rebalance_timeout_ms,
                                 "session_timeout_ms": m.session_timeout_ms,
                                 "metadata": m.metadata_for(group.protocol),
                                 "assignment": m.assignment}
                                for m in group.members.values()]}

    def restore(self, group_id: str, snapshot: dict) -> bool:
        """Take a group over from its stored form (Kafka's loadGroup): Stable with its
        members (their sessions start now, so members that are gone expire after their
        session timeout) or Empty. A group this logic already has is left alone (False)."""
        with self.lock:
            if group_id in self.groups:
                return False
            now = self.clock()
            members = {}
            for m in snapshot["members"]:
                protocols = [(snapshot["protocol"], m["metadata"])]
                members[m["member_id"]] = Member(
                    m["member_id"], m["group_instance_id"], m["client_id"],
                    m["session_timeout_ms"], m["rebalance_timeout_ms"], protocols,
                    last_heartbeat_ms=now, assignment=m["assignment"])
            group = Group(group_id, generation=snapshot["generation"])
            if members:
                group.state = GroupState.STABLE
                group.protocol_type = snapshot["protocol_type"]
                group.protocol = snapshot["protocol"]
                group.members = members
                group.leader_id = snapshot["leader_id"] if snapshot["leader_id"] in members \
                    else next(iter(members))
                group.static = {m.group_instance_id: mid for mid, m in members.items()
                                if m.group_instance_id is not None}
            self.groups[group_id] = group
            return True

    # -- reading ------------------------------------------------------------------------------------
    def describe(self, group_id: str) -> dict | None:
        with self.lock:
            group = self.groups.get(group_id)
            if group is None:
                return None
            return {"group_id": group_id, "state": group.state.value,
                    "generation": group.generation, "protocol_type": group.protocol_type,
                    "protocol": group.protocol, "leader": group.leader_id,
                    "members": {mid: {"group_instance_id": m.group_instance_id,
                                      "client_id": m.client_id, "assignment": m.assignment,
                                      "metadata": m.metadata_for(group.protocol)}
                                for mid, m in group.members.items()}}

    def static_member(self, group_id: str, group_instance_id: str) -> str | None:
        """The member id of the static member ``group_instance_id`` (KIP-345), if any."""
        with self.lock:
            group = self.groups.get(group_id)
            return None if group is None else group.static.get(group_instance_id)

    def forget(self, group_id: str) -> bool:
        """Drop an Empty group (DeleteGroups); False when it has members (kept)."""
        with self.lock:
            group = self.groups.get(group_id)
            if group is None:
                return True
            if group.members:
                return False
            del self.groups[group_id]
            return True

    def unload(self, group_id: str) -> None:
        """The offsets partition moved away: the group is DEAD here; every waiter is told
        to find the new coordinator."""
        with self.lock:
            group = self.groups.pop(group_id, None)
            if group is None:
                return
            group.state = GroupState.DEAD
            moved = CoordinatorNotAvailableError(f"group {group_id!r} moved")
            for m in group.members.values():
                _done(m.join_future, error=moved)
                _done(m.sync_future, error=moved)
