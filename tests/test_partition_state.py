"""LeaderState (actors/server/partition_state.py) alone: the leader's HW and ISR rules with
an injected clock, no Ray, no threads."""

from __future__ import annotations

from actors.server.partition_state import LeaderState

LAG_MS = 1000


def leader(isr=(0, 1, 2), replicas=(0, 1, 2), hw=0, epoch_start=0, now_ms=0) -> LeaderState:
    return LeaderState(leader_id=0, replicas=list(replicas), isr=list(isr), high_watermark=hw,
                       epoch_start_offset=epoch_start, lag_time_max_ms=LAG_MS, now_ms=now_ms)


def test_high_watermark_is_the_smallest_log_end_offset_of_the_isr():
    """HW = min LEO over the ISR, the leader's own LEO included."""
    s = leader()
    s.record_fetch(1, 7, leader_leo=10, now_ms=1)
    s.record_fetch(2, 5, leader_leo=10, now_ms=1)
    assert s.update_high_watermark(10) and s.high_watermark == 5
    s.record_fetch(2, 10, leader_leo=10, now_ms=2)
    assert s.update_high_watermark(10) and s.high_watermark == 7
    s.record_fetch(1, 10, leader_leo=12, now_ms=3)
    assert s.update_high_watermark(12) and s.high_watermark == 10


def test_high_watermark_waits_for_members_not_heard_from():
    """An ISR member whose LEO is unknown (no fetch since this leader took over) holds it."""
    s = leader(hw=3)
    s.record_fetch(1, 10, leader_leo=10, now_ms=1)
    assert not s.update_high_watermark(10) and s.high_watermark == 3


def test_high_watermark_only_moves_forward():
    """A lower min LEO (a follower that truncated, a new member) never moves the HW back."""
    s = leader(isr=(0, 1), replicas=(0, 1), hw=8)
    s.record_fetch(1, 4, leader_leo=10, now_ms=1)
    assert not s.update_high_watermark(10)
    assert s.high_watermark == 8


def test_a_lone_leader_has_hw_equal_to_its_log_end():
    """RF=1: no followers, HW = LEO right after each append, and never a proposal."""
    s = leader(isr=(0,), replicas=(0,))
    assert s.single_replica
    assert s.update_high_watermark(42) and s.high_watermark == 42
    assert s.isr_change(42, now_ms=10 ** 9) is None


def test_fetch_at_the_leader_log_end_is_caught_up_now():
    """A fetch at or past the leader's LEO stamps last-caught-up with the fetch time."""
    s = leader()
    s.record_fetch(1, 10, leader_leo=10, now_ms=500)
    assert s.followers[1].last_caught_up_ms == 500


def test_fetch_reaching_the_previous_fetch_leader_end_is_caught_up_as_of_then():
    """Under steady load a follower never reaches the current LEO; reaching the LEO the
    leader had at its previous fetch counts as caught up at that previous fetch (Kafka)."""
    s = leader(now_ms=0)
    s.record_fetch(1, 5, leader_leo=10, now_ms=100)      # behind: not caught up
    assert s.followers[1].last_caught_up_ms == 0         # the reset value (ISR member)
    s.record_fetch(1, 10, leader_leo=15, now_ms=200)     # reached 10 = LEO at the last fetch
    assert s.followers[1].last_caught_up_ms == 100
    s.record_fetch(1, 12, leader_leo=20, now_ms=300)     # not at 15: unchanged
    assert s.followers[1].last_caught_up_ms == 100


def test_a_follower_is_dropped_after_the_lag_time_without_catching_up():
    """Shrink: an ISR follower not caught up for longer than replica.lag.time.max.ms."""
    s = leader(now_ms=0)
    s.record_fetch(1, 10, leader_leo=10, now_ms=0)
    s.record_fetch(2, 10, leader_leo=10, now_ms=0)
    s.record_fetch(1, 20, leader_leo=20, now_ms=LAG_MS)  # 1 keeps up, 2 stops fetching
    assert s.isr_change(20, now_ms=LAG_MS) is None        # exactly the lag: still in
    assert s.isr_change(20, now_ms=LAG_MS + 1) == [0, 1]


def test_a_follower_at_the_leader_log_end_is_never_out_of_sync():
    """An idle partition: a follower whose LEO equals the leader's stays however long."""
    s = leader(now_ms=0)
    for r in (1, 2):
        s.record_fetch(r, 10, leader_leo=10, now_ms=0)
    assert s.out_of_sync(10, now_ms=100 * LAG_MS) == []
    assert s.next_check_in_ms(10, now_ms=5) == LAG_MS


def test_next_check_is_when_the_first_follower_could_fall_out():
    """The ISR timer sleeps until a lagging follower's lag time runs out, not a fixed tick."""
    s = leader(now_ms=0)
    s.record_fetch(1, 10, leader_leo=10, now_ms=0)
    s.record_fetch(2, 10, leader_leo=10, now_ms=300)
    assert s.next_check_in_ms(12, now_ms=400) == LAG_MS + 1 - 400


def test_a_follower_rejoins_when_it_reaches_the_hw_and_the_epoch_start():
    """Expand: LEO >= HW and >= the start offset of the leader's current epoch."""
    s = leader(isr=(0, 1), hw=10, epoch_start=12)
    s.record_fetch(1, 12, leader_leo=12, now_ms=1)
    s.update_high_watermark(12)
    s.record_fetch(2, 11, leader_leo=12, now_ms=1)       # past the old HW, before the epoch
    assert s.isr_change(12, now_ms=1) is None
    s.record_fetch(2, 12, leader_leo=12, now_ms=2)
    assert s.isr_change(12, now_ms=2) == [0, 1, 2]


def test_one_proposal_in_flight_and_the_maximal_isr_counts_for_the_hw():
    """While an expansion is pending, no second proposal, and the HW waits for the joining
    follower too (maximal ISR, KIP-497); the committed ISR is what acks count on."""
    s = leader(isr=(0, 1), hw=10)
    s.record_fetch(1, 10, leader_leo=10, now_ms=1)
    s.record_fetch(2, 10, leader_leo=10, now_ms=1)
    proposal = s.isr_change(10, now_ms=1)
    assert proposal == [0, 1, 2]
    s.propose(proposal)
    assert s.isr == [0, 1] and s.maximal_isr == [0, 1, 2]
    assert s.isr_change(10, now_ms=10 * LAG_MS) is None   # in flight: nothing else
    s.record_fetch(1, 15, leader_leo=15, now_ms=2)         # 1 is ahead, 2 is not
    s.update_high_watermark(15)
    assert s.high_watermark == 10                          # held by the joining member
    s.committed([0, 1, 2], now_ms=3)
    assert s.isr == [0, 1, 2] and s.pending_isr is None


def test_an_abandoned_proposal_leaves_the_isr_and_allows_another():
    """A refused or unanswered proposal: ISR unchanged, the next decision can be made."""
    s = leader(now_ms=0)
    s.record_fetch(1, 10, leader_leo=10, now_ms=0)
    s.propose([0, 1])
    s.abandoned()
    assert s.isr == [0, 1, 2] and s.pending_isr is None
    assert s.isr_change(20, now_ms=LAG_MS + 1) == [0]      # both lag: both leave


def test_the_isr_never_loses_the_leader():
    """A proposal or an answer without the leader still keeps it."""
    s = leader()
    assert s.propose([1, 2])[0] == 0
    s.committed([1], now_ms=0)
    assert 0 in s.isr
