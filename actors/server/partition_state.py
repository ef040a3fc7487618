"""The leader's replication bookkeeping for one partition: pure logic, no Ray, no threads.

``LeaderState`` is what a leading PartitionReplica knows about its followers (Kafka's
Partition + Replica state, ZooKeeper mode) and the decisions it takes from that:

- per follower: log end offset (the ``fetch_offset`` of its last fetch), last fetch time,
  last caught-up time;
- the high watermark: min log end offset over the *maximal* ISR (the committed ISR plus a
  pending expansion, KIP-497), the leader's own LEO included; it never moves backwards;
- ISR shrink: a follower of the ISR that is not caught up (its LEO differs from the leader's
  and it last caught up more than ``lag_time_max_ms`` ago) leaves;
- ISR expand: an assigned follower outside the ISR whose LEO reaches both the HW and the
  start offset of the leader's current epoch joins;
- at most one ISR change in flight: ``propose`` marks it pending until ``committed`` (the
  controller's answer) or ``abandoned``.

Caught-up rule (Kafka's Replica.updateFetchState, a superset of "fetch_offset >= the
leader's LEO"): a fetch at or past the leader's LEO at that moment makes the follower
caught up *now*; a fetch at or past the LEO the leader had at the follower's *previous*
fetch makes it caught up as of that previous fetch. Under steady produce load the first
case rarely holds, the second does for any follower keeping up.

Times are milliseconds of an injected clock, passed to each call (``now_ms``), so every
rule is testable without sleeping. Not thread-safe: the replica calls it under its lock.

Invariants: ``leader_id in isr``; ``high_watermark`` never decreases;
``high_watermark <= min LEO over the maximal ISR`` once every member's LEO is known.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass
class FollowerState:
    """What the leader knows of one follower."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_ms: int = -1
    last_fetch_leader_leo: int = UNKNOWN_OFFSET   # the leader's LEO at that fetch
    last_caught_up_ms: int = -1


class LeaderState:
    """One leader's view of its followers (see the module docstring)."""

    def __init__(self, *, leader_id: int, replicas: list[int], isr: list[int],
                 high_watermark: int, epoch_start_offset: int, lag_time_max_ms: int,
                 now_ms: int):
        self.leader_id = leader_id
        self.replicas = list(replicas) if replicas else [leader_id]
        self.isr = _with_leader(list(isr), leader_id)
        self.high_watermark = high_watermark
        self.epoch_start_offset = epoch_start_offset
        self.lag_time_max_ms = lag_time_max_ms
        self.pending_isr: list[int] | None = None
        # Kafka resets followers on a leadership change: ISR members count as caught up now
        # (so they are not dropped at once), everyone's LEO is unknown until it fetches.
        self.followers: dict[int, FollowerState] = {
            r: FollowerState(last_caught_up_ms=now_ms if r in self.isr else -1)
            for r in self.replicas if r != leader_id}

    # -- views --------------------------------------------------------------------------
    @property
    def maximal_isr(self) -> list[int]:
        """The committed ISR, plus the members of a pending expansion (KIP-497): the HW
        waits for them already, acks do not count on them yet."""
        if self.pending_isr is None:
            return list(self.isr)
        return self.isr + [r for r in self.pending_isr if r not in self.isr]

    @property
    def single_replica(self) -> bool:
        """RF=1: no followers, nothing to time or propose."""
        return not self.followers

    def adopt_followers(self, previous: "LeaderState") -> None:
        """Keep what ``previous`` (the same leader epoch, a repeated LeaderAndIsr) knew of
        the followers both have, so their LEOs need not be learnt again."""
        for r, f in previous.followers.items():
            if r in self.followers:
                self.followers[r] = FollowerState(**vars(f))

    # -- events -------------------------------------------------------------------------
    def record_fetch(self, follower_id: int, fetch_offset: int, leader_leo: int,
                     now_ms: int) -> None:
        """A follower fetched from ``fetch_offset`` (= its LEO) while the leader's LEO was
        ``leader_leo``. Unknown ids (not assigned) are ignored."""
        f = self.followers.get(follower_id)
        if f is None:
            return
        if fetch_offset >= leader_leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)
        elif f.last_fetch_leader_leo != UNKNOWN_OFFSET and fetch_offset >= f.last_fetch_leader_leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.log_end_offset = fetch_offset
        f.last_fetch_ms = now_ms
        f.last_fetch_leader_leo = leader_leo

    def update_high_watermark(self, leader_leo: int) -> bool:
        """Move the HW to min LEO over the maximal ISR (never back); True when it moved."""
        candidate = leader_leo
        for r in self.maximal_isr:
            if r == self.leader_id:
                continue
            f = self.followers.get(r)
            leo = f.log_end_offset if f is not None else UNKNOWN_OFFSET
            if leo == UNKNOWN_OFFSET:
                return False                     # a member we have not heard from yet
            candidate = min(candidate, leo)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # -- ISR decisions ------------------------------------------------------------------
    def is_caught_up(self, follower_id: int, leader_leo: int, now_ms: int) -> bool:
        f = self.followers[follower_id]
        return (f.log_end_offset == leader_leo
                or (f.last_caught_up_ms >= 0
                    and now_ms - f.last_caught_up_ms <= self.lag_time_max_ms))

    def out_of_sync(self, leader_leo: int, now_ms: int) -> list[int]:
        """ISR followers that have not caught up within the lag time."""
        return [r for r in self.isr if r != self.leader_id and r in self.followers
                and not self.is_caught_up(r, leader_leo, now_ms)]

    def can_join(self, follower_id: int) -> bool:
        """Kafka's isFollowerInSync: LEO at or past the HW and the current epoch's start."""
        f = self.followers.get(follower_id)
        return (f is not None and f.log_end_offset != UNKNOWN_OFFSET
                and f.log_end_offset >= self.high_watermark
                and f.log_end_offset >= self.epoch_start_offset)

    def isr_change(self, leader_leo: int, now_ms: int) -> list[int] | None:
        """The ISR to propose now, or None (no change, or one is already in flight).
        Shrinks win over expansions: a lagging member holds back the HW for everyone."""
        if self.pending_isr is not None or self.single_replica:
            return None
        gone = set(self.out_of_sync(leader_leo, now_ms))
        if gone:
            return [r for r in self.isr if r not in gone]
        joining = [r for r in self.replicas if r not in self.isr and self.can_join(r)]
        if joining:
            return self.isr + joining
        return None

    def next_check_in_ms(self, leader_leo: int, now_ms: int) -> int:
        """How long until some ISR follower could fall out of sync (what the ISR timer
        sleeps); ``lag_time_max_ms`` when none is close (an idle, caught-up partition)."""
        wait = self.lag_time_max_ms
        for r in self.isr:
            f = self.followers.get(r)
            if f is None or f.log_end_offset == leader_leo:
                continue
            wait = min(wait, max(f.last_caught_up_ms + self.lag_time_max_ms + 1 - now_ms, 0))
        return wait

    def propose(self, new_isr: list[int]) -> list[int]:
        """Mark ``new_isr`` as in flight; returns it (with the leader)."""
        self.pending_isr = _with_leader(list(new_isr), self.leader_id)
        return list(self.pending_isr)

    def committed(self, isr: list[int], now_ms: int) -> None:
        """The controller wrote ``isr``: it is the ISR now; nothing is pending."""
        joined = [r for r in isr if r not in self.isr]
        self.isr = _with_leader(list(isr), self.leader_id)
        self.pending_isr = None
        for r in joined:                    # a new member starts its lag clock now
            f = self.followers.get(r)
            if f is not None:
                f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)

    def abandoned(self) -> None:
        """The proposal failed (refused or unanswered): the ISR stays as it was."""
        self.pending_isr = None


def _with_leader(isr: list[int], leader_id: int) -> list[int]:
    out = [r for r in dict.fromkeys(isr)]
    if leader_id not in out:
        out.insert(0, leader_id)
    return out
