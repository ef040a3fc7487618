"""Partition assignors of a consumer group: pure functions the group leader runs after
JoinGroup (Kafka's client-side assignment), with no Ray and no I/O.

Each takes ``members`` (member id -> ``Subscription``) and ``partitions`` (topic -> number
of partitions) and returns member id -> sorted list of ``(topic, partition)``, with every
member present (an empty list when it gets nothing). Only topics that exist are assigned;
a partition goes to at most one member, and only to a member subscribed to its topic.

- ``range``: seed 004's RangeAssignor, per topic: the topic's partitions in order, the
  consumer *threads* subscribed to it sorted (a member with ``streams[topic] = n`` has n
  threads, ``(member, 0..n-1)``), ``len(partitions) // len(threads)`` each and the first
  ``len(partitions) % len(threads)`` threads one more, in contiguous ranges.
- ``roundrobin``: Kafka's RoundRobinAssignor: every partition of every subscribed topic,
  sorted by (topic, partition), dealt to the sorted members in turn, skipping members not
  subscribed to the partition's topic.
- ``cooperative-sticky``: Kafka's CooperativeStickyAssignor (KIP-429 over KIP-54's sticky
  goals): as balanced as the subscriptions allow (partition counts differ by at most one
  between members that could take each other's partitions), keeping every partition a
  member owns where balance allows; then a partition that moves from one member to another
  is *left out* of this round (``pending_revocation``): its owner revokes it, rejoins, and
  the next round hands it to its new owner. Partitions that stay are never revoked. The
  result also carries the ``target`` (moves included): raykafka's members use it with a
  handover inside the same generation instead of the second round (docs/groups.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import IllegalArgumentError

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Subscription:
    """What a member sent in JoinGroup: its topics, for ``range`` its stream count per
    topic (seed 004's consumer threads; 1 when not named), and for ``cooperative-sticky``
    the partitions it owns now and the generation it owned them in."""

    topics: tuple[str, ...]
    streams: Mapping[str, int] = field(default_factory=dict)
    owned: tuple[TopicPartition, ...] = ()
    generation: int = -1


Assignment = dict[str, list[TopicPartition]]


def _check(members: Mapping[str, Subscription], partitions: Mapping[str, int]) -> None:
    for member, sub in members.items():
        if not isinstance(sub, Subscription):
            raise IllegalArgumentError(f"member {member!r}: not a Subscription: {sub!r}")
        for topic, n in sub.streams.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise IllegalArgumentError(
                    f"member {member!r}: streams for {topic!r} must be an int >= 1, got {n!r}")
    for topic, n in partitions.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise IllegalArgumentError(f"topic {topic!r}: partition count {n!r}")


def _topics(members: Mapping[str, Subscription], partitions: Mapping[str, int]) -> list[str]:
    return sorted({t for s in members.values() for t in s.topics if t in partitions})


def range_assign(members: Mapping[str, Subscription],
                 partitions: Mapping[str, int]) -> Assignment:
    """Seed 004's range assignment over consumer threads (see the module docstring)."""
    _check(members, partitions)
    out: Assignment = {m: [] for m in members}
    for topic in _topics(members, partitions):
        threads = sorted((m, i) for m, s in members.items() if topic in s.topics
                         for i in range(s.streams.get(topic, 1)))
        count = partitions[topic]
        per, extra = divmod(count, len(threads))
        for position, (member, _) in enumerate(threads):
            start = per * position + min(position, extra)
            n = per + (1 if position < extra else 0)
            out[member].extend((topic, p) for p in range(start, start + n))
    return {m: sorted(tps) for m, tps in out.items()}


def range_threads(members: Mapping[str, Subscription], partitions: Mapping[str, int]
                  ) -> dict[tuple[str, int], list[TopicPartition]]:
    """The same assignment per consumer thread ``(member, i)``: which stream of a member
    each partition feeds (each partition feeds exactly one stream)."""
    _check(members, partitions)
    out: dict[tuple[str, int], list[TopicPartition]] = {}
    for topic in _topics(members, partitions):
        threads = sorted((m, i) for m, s in members.items() if topic in s.topics
                         for i in range(s.streams.get(topic, 1)))
        per, extra = divmod(partitions[topic], len(threads))
        for position, thread in enumerate(threads):
            start = per * position + min(position, extra)
            n = per + (1 if position < extra else 0)
            out.setdefault(thread, []).extend((topic, p) for p in range(start, start + n))
    return out


def roundrobin_assign(members: Mapping[str, Subscription],
                      partitions: Mapping[str, int]) -> Assignment:
    """Kafka's round-robin assignment (see the module docstring)."""
    _check(members, partitions)
    out: Assignment = {m: [] for m in members}
    order = sorted(members)
    if not order:
        return out
    turn = 0
    for topic in _topics(members, partitions):
        for p in range(partitions[topic]):
            for _ in range(len(order)):
                member = order[turn % len(order)]
                turn += 1
                if topic in members[member].topics:
                    out[member].append((topic, p))
                    break
    return {m: sorted(tps) for m, tps in out.items()}


@dataclass
class CooperativeResult:
    """``assignment`` for this round in KIP-429's terms; ``pending_revocation`` the
    partitions left out of it because their owner must revoke them first (member -> what
    it gives up); ``target`` the assignment with those given to their new owners. KIP-429
    runs another round while ``pending_revocation`` is not empty; raykafka's members hand
    the ``target`` out at once, the moves pending at the coordinator until released
    (``GroupMember._assign``)."""

    assignment: Assignment
    pending_revocation: dict[str, list[TopicPartition]]
    target: Assignment


def sticky_assign(members: Mapping[str, Subscription],
                  partitions: Mapping[str, int]) -> Assignment:
    """The balanced assignment that keeps as many owned partitions as balance allows (the
    target the cooperative protocol reaches in at most two rounds)."""
    _check(members, partitions)
    eligible: dict[TopicPartition, list[str]] = {}
    for topic in _topics(members, partitions):
        subscribers = sorted(m for m, s in members.items() if topic in s.topics)
        for p in range(partitions[topic]):
            eligible[(topic, p)] = subscribers
    # who owns what now: a partition claimed by two members (one of an older generation)
    # stays with the newest generation's claim; a tie drops both claims
    claims: dict[TopicPartition, tuple[int, str | None]] = {}
    for member in sorted(members):
        sub = members[member]
        for tp in sub.owned:
            tp = (tp[0], int(tp[1]))
            if tp not in eligible or member not in eligible[tp]:
                continue
            prev = claims.get(tp)
            if prev is None or sub.generation > prev[0]:
                claims[tp] = (sub.generation, member)
            elif sub.generation == prev[0]:
                claims[tp] = (prev[0], None)
    owner = {tp: m for tp, (_, m) in claims.items() if m is not None}
    load: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for tp in sorted(owner):
        load[owner[tp]].append(tp)
    # quotas: with P partitions over the members able to hold them, nobody keeps more than
    # ceil(P / N) (N = members subscribed to anything that exists)
    able = [m for m in sorted(members) if any(m in e for e in eligible.values())]
    total = len(eligible)
    if able:
        ceiling = -(-total // len(able))
        floor_ = total // len(able)
        extra = total - floor_ * len(able)    # members that may hold ceiling
        # those owning the most keep the ceiling slots, so the fewest partitions move
        ranked = sorted(able, key=lambda m: (-len(load[m]), m))
        keep_at_most = {m: (ceiling if i < extra else floor_) for i, m in enumerate(ranked)}
        for m in able:
            surplus = load[m][keep_at_most[m]:]
            for tp in surplus:
                del owner[tp]
            load[m] = load[m][:keep_at_most[m]]
    for tp in sorted(eligible):
        if tp in owner:
            continue
        candidates = eligible[tp]
        if not candidates:
            continue
        best = min(candidates, key=lambda m: (len(load[m]), m))
        owner[tp] = best
        load[best].append(tp)
    _rebalance(load, owner, eligible)
    return {m: sorted(tps) for m, tps in load.items()}


def _rebalance(load: dict[str, list], owner: dict, eligible: dict) -> None:
    """Move partitions from the most to the least loaded member that may take them until no
    such move narrows the spread (different subscriptions can leave the greedy fill
    unbalanced). Bounded: each move lowers the sum of squared loads."""
    moved = True
    while moved:
        moved = False
        for src in sorted(load, key=lambda m: (-len(load[m]), m)):
            for tp in sorted(load[src], reverse=True):
                dst = min((m for m in eligible[tp] if m != src),
                          key=lambda m: (len(load[m]), m), default=None)
                if dst is not None and len(load[dst]) + 1 < len(load[src]):
                    load[src].remove(tp)
                    load[dst].append(tp)
                    owner[tp] = dst
                    moved = True
                    break
            if moved:
                break


def cooperative_sticky_assign(members: Mapping[str, Subscription],
                              partitions: Mapping[str, int]) -> CooperativeResult:
    """KIP-429: the sticky target, minus every partition that changes owner this round
    (see the module docstring)."""
    target = sticky_assign(members, partitions)
    owned_by: dict[TopicPartition, str] = {}
    for member, sub in members.items():
        for tp in sub.owned:
            owned_by.setdefault((tp[0], int(tp[1])), member)
    assignment: Assignment = {}
    pending: dict[str, list[TopicPartition]] = {}
    for member, tps in target.items():
        keep = []
        for tp in tps:
            prev = owned_by.get(tp)
            if prev is not None and prev != member and prev in members:
                pending.setdefault(prev, []).append(tp)
            else:
                keep.append(tp)
        assignment[member] = keep
    return CooperativeResult(assignment, {m: sorted(v) for m, v in pending.items()}, target)


#: partition_assignment_strategy -> the assignor (range and roundrobin are eager: every
#: member revokes everything before it rejoins; cooperative-sticky is incremental).
ASSIGNORS: dict[str, Callable] = {
    "range": range_assign,
    "roundrobin": roundrobin_assign,
    "cooperative-sticky": cooperative_sticky_assign,
}
EAGER = frozenset({"range", "roundrobin"})


def assignor(name: str) -> Callable:
    try:
        return ASSIGNORS[name]
    except (KeyError, TypeError):
        raise IllegalArgumentError(
            f"partition_assignment_strategy must be one of {sorted(ASSIGNORS)}, got "
            f"{name!r}") from None
