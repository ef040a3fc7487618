"""The coordinator's group membership protocol as pure logic (GroupLogic) with a fake
clock: joins, syncs, heartbeats, leaves, session expiry, the rebalance deadline, the
initial delay, generation fencing of commits, and static membership (KIP-345)."""

from __future__ import annotations

import pytest

from actors.errors import (FencedInstanceIdError, IllegalGenerationError,
                           InconsistentGroupProtocolError, InvalidSessionTimeoutError,
                           RebalanceInProgressError, UnknownMemberIdError)
from actors.server.group_logic import GroupLogic, GroupState

SESSION = 10_000
REBALANCE = 30_000


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def logic(clock):
    return GroupLogic(clock, initial_rebalance_delay_ms=0)


def join(logic, member_id="", protocols=(("range", b"m"),), instance=None, group="g"):
    return logic.join(group, member_id, protocol_type="consumer", protocols=list(protocols),
                      session_timeout_ms=SESSION, rebalance_timeout_ms=REBALANCE,
                      group_instance_id=instance, client_id="c")


def stable_pair(logic):
    """Two members, stable in generation 2; returns (leader id, follower id)."""
    a = join(logic).result(0)
    logic.sync("g", a.member_id, a.generation, {a.member_id: "A"}).result(0)
    fb = join(logic)
    with pytest.raises(RebalanceInProgressError):
        logic.heartbeat("g", a.member_id, a.generation)
    a2 = join(logic, a.member_id).result(0)
    b2 = fb.result(0)
    assert a2.generation == b2.generation == 2 and a2.leader_id == a.member_id
    fs = logic.sync("g", b2.member_id, 2)
    logic.sync("g", a.member_id, 2, {a.member_id: "A2", b2.member_id: "B2"}).result(0)
    assert fs.result(0) == "B2"
    return a.member_id, b2.member_id


def test_a_lone_member_becomes_leader_and_the_group_stable_after_its_sync(logic):
    """The first member's join completes at once (no initial delay): generation 1, it is
    the leader and gets every member's metadata; its SyncGroup makes the group Stable."""
    res = join(logic).result(0)
    assert (res.generation, res.leader_id, res.protocol) == (1, res.member_id, "range")
    assert res.members == {res.member_id: (None, b"m")}
    assert logic.describe("g")["state"] == "CompletingRebalance"
    assert logic.sync("g", res.member_id, 1, {res.member_id: "all"}).result(0) == "all"
    assert logic.describe("g")["state"] == "Stable"


def test_a_second_member_makes_the_first_rejoin_into_a_new_generation(logic):
    """A join into a Stable group starts a rebalance: the first member's heartbeat answers
    RebalanceInProgress, both get generation 2 once it rejoins, and each gets the
    assignment the leader sent."""
    stable_pair(logic)
    assert logic.describe("g")["state"] == "Stable"


def test_joins_wait_for_the_initial_rebalance_delay(clock):
    """With group.initial.rebalance.delay.ms, members joining a new group within the delay
    all land in generation 1 together."""
    logic = GroupLogic(clock, initial_rebalance_delay_ms=3000)
    fa, fb = join(logic), join(logic)
    logic.tick()
    assert not fa.done() and not fb.done()
    clock.now += 3000
    logic.tick()
    assert fa.result(0).generation == fb.result(0).generation == 1


def test_a_member_that_stops_heartbeating_is_expired_after_its_session_timeout(logic, clock):
    """In a Stable pair, the member that stops heartbeating is removed once its session
    timeout passes; the other rejoins alone into the next generation."""
    a, b = stable_pair(logic)
    clock.now += SESSION - 1000
    logic.heartbeat("g", a, 2)
    clock.now += 1001
    logic.tick()
    assert b not in logic.describe("g")["members"]
    with pytest.raises(RebalanceInProgressError):
        logic.heartbeat("g", a, 2)
    assert join(logic, a).result(0).generation == 3


def test_a_member_that_does_not_rejoin_by_the_rebalance_deadline_is_dropped(logic, clock):
    """During a rebalance, a member that never rejoins is removed at the rebalance timeout
    and the join completes for the others."""
    a, b = stable_pair(logic)
    fc = join(logic)                      # a third member starts a rebalance; b never rejoins
    fa = join(logic, a)
    clock.now += REBALANCE
    logic.tick()
    assert fa.result(0).generation == fc.result(0).generation == 3
    assert set(logic.describe("g")["members"]) == {a, fc.result(0).member_id}


def test_a_member_silent_during_a_rebalance_is_dropped_at_its_session_timeout(logic, clock):
    """While the group prepares a rebalance, a member that has not rejoined keeps its
    session by heartbeating; one that is silent is removed when its session timeout passes
    (before the rebalance deadline) and the join completes for the others."""
    a, b = stable_pair(logic)
    fc = join(logic)                      # a third member starts a rebalance
    fa = join(logic, a)
    clock.now += SESSION - 1000
    with pytest.raises(RebalanceInProgressError):
        logic.heartbeat("g", b, 2)        # b is slow to rejoin, but alive
    clock.now += 1001
    logic.tick()
    assert b in logic.describe("g")["members"] and not fa.done()
    clock.now += SESSION                  # b goes silent: gone, well before REBALANCE
    assert SESSION * 2 + 1 < REBALANCE
    logic.tick()
    assert fa.result(0).generation == fc.result(0).generation == 3
    assert set(logic.describe("g")["members"]) == {a, fc.result(0).member_id}


def test_commits_are_fenced_by_member_and_generation(logic):
    """check_commit refuses an unknown member, an older generation, and a commit once the
    join of a rebalance completed; it takes one while the group prepares the rebalance
    (members commit what they give up then); a manual-assignment commit (no member,
    generation -1) is allowed only while the group has no members."""
    logic.check_commit("g", "", -1)
    a, b = stable_pair(logic)
    logic.check_commit("g", a, 2)
    with pytest.raises(IllegalGenerationError):
        logic.check_commit("g", a, 1)
    with pytest.raises(UnknownMemberIdError):
        logic.check_commit("g", "stranger", 2)
    with pytest.raises(UnknownMemberIdError):
        logic.check_commit("g", "", -1)
    fc = join(logic)                                   # PreparingRebalance
    logic.check_commit("g", a, 2)
    join(logic, a), join(logic, b)                     # the join completes: generation 3
    assert fc.result(0).generation == 3
    with pytest.raises(IllegalGenerationError):
        logic.check_commit("g", a, 2)
    with pytest.raises(RebalanceInProgressError):
        logic.check_commit("g", a, 3)                  # CompletingRebalance


def test_a_static_member_restarting_keeps_its_assignment_without_a_rebalance(logic):
    """KIP-345: a member with a group.instance.id rejoining under a new member id while the
    group is Stable takes its old place (same generation, same assignment, still Stable);
    its old member id is unknown from then on."""
    first = join(logic, instance="i1").result(0)
    logic.sync("g", first.member_id, 1, {first.member_id: "mine"}).result(0)
    again = join(logic, instance="i1").result(0)
    assert again.member_id != first.member_id and again.generation == 1
    assert logic.describe("g")["state"] == "Stable"
    assert logic.sync("g", again.member_id, 1).result(0) == "mine"
    with pytest.raises(UnknownMemberIdError):
        logic.heartbeat("g", first.member_id, 1)


def test_a_replaced_static_member_waiting_in_a_join_is_fenced(logic):
    """A static member's pending join is answered FencedInstanceIdError when a newer
    member with the same group.instance.id takes its place."""
    a, b = stable_pair(logic)
    fs = join(logic, instance="s")            # starts a rebalance, waits for a and b
    with pytest.raises(RebalanceInProgressError):
        logic.heartbeat("g", a, 2)
    newer = join(logic, instance="s")
    with pytest.raises(FencedInstanceIdError):
        fs.result(0)
    join(logic, a), join(logic, b)
    assert newer.result(0).generation == 3


def test_leaving_rebalances_the_rest_and_the_last_leave_empties_the_group(logic):
    """LeaveGroup of one member makes the other rejoin; the last member leaving leaves the
    group Empty with a new generation."""
    a, b = stable_pair(logic)
    logic.leave("g", b)
    assert join(logic, a).result(0).generation == 3
    logic.sync("g", a, 3, {a: "x"}).result(0)
    logic.leave("g", a)
    desc = logic.describe("g")
    assert desc["state"] == GroupState.EMPTY.value and desc["generation"] == 4


def test_protocol_vote_and_incompatible_members(logic):
    """The assignor is the one every member supports that most prefer; a member sharing no
    assignor with the group, or with a session timeout out of range, is refused."""
    fa = join(logic, protocols=[("range", b""), ("roundrobin", b"")])
    assert fa.result(0).protocol == "range"
    fb = join(logic, protocols=[("roundrobin", b""), ("range", b"")])
    fc = join(logic, protocols=[("roundrobin", b"")])
    join(logic, fa.result(0).member_id, protocols=[("range", b""), ("roundrobin", b"")])
    assert fb.result(0).protocol == fc.result(0).protocol == "roundrobin"
    with pytest.raises(InconsistentGroupProtocolError):
        join(logic, protocols=[("sticky", b"")]).result(0)
    with pytest.raises(InvalidSessionTimeoutError):
        logic.join("g", "", protocol_type="consumer", protocols=[("range", b"")],
                   session_timeout_ms=10, rebalance_timeout_ms=1000).result(0)


def test_a_stored_stable_group_is_resumed_by_a_new_coordinator_without_a_rebalance(clock):
    """A Stable group's snapshot restored into a fresh GroupLogic (a new coordinator) is
    Stable in the same generation: its members' heartbeats and syncs are answered as before
    (no rebalance, the stored assignments), and a member that never shows up is expired
    after its session timeout."""
    old = GroupLogic(clock, initial_rebalance_delay_ms=0)
    a, b = stable_pair(old)
    snap = old.snapshot("g")
    assert old.snapshot("nope") is None
    new = GroupLogic(clock, initial_rebalance_delay_ms=0)
    assert new.restore("g", snap) and not new.restore("g", snap)
    assert new.describe("g")["state"] == "Stable" and new.describe("g")["generation"] == 2
    new.heartbeat("g", a, 2)
    assert new.sync("g", b, 2).result(0) == "B2"
    new.check_commit("g", a, 2)
    clock.now += SESSION - 1000
    new.heartbeat("g", a, 2)
    clock.now += 1001
    new.tick()
    assert set(new.describe("g")["members"]) == {a}
    with pytest.raises(RebalanceInProgressError):
        new.heartbeat("g", a, 2)


def test_a_group_reports_becoming_stable_and_becoming_empty(clock):
    """GroupLogic tells its owner when a generation becomes stable and when the last
    member goes (the coordinator stores the group then); an Empty group's snapshot has no
    members and restores as Empty."""
    seen = []
    logic = GroupLogic(clock, initial_rebalance_delay_ms=0,
                       on_stable=lambda g: seen.append(("stable", g.generation)),
                       on_empty=lambda g: seen.append(("empty", g.generation)))
    a = join(logic).result(0)
    logic.sync("g", a.member_id, 1, {a.member_id: "A"}).result(0)
    logic.leave("g", a.member_id)
    assert seen == [("stable", 1), ("empty", 2)]
    snap = logic.snapshot("g")
    assert snap["members"] == [] and snap["generation"] == 2
    other = GroupLogic(clock)
    other.restore("g", snap)
    assert other.describe("g")["state"] == "Empty"


def handover_pair(logic):
    """Two members of a stable generation in which the leader hands ("t", 1) over to the
    follower: (leader id, follower id, generation)."""
    a, b = stable_pair(logic)
    join_a = join(logic, a)             # the leader rejoins: a rebalance
    join(logic, b).result(0)
    a3 = join_a.result(0)
    fb = logic.sync("g", b, a3.generation)
    logic.sync("g", a, a3.generation, {a: [("t", 0)], b: [("t", 1)]},
               handover={a: [("t", 1)]}).result(0)
    assert fb.result(0) == [("t", 1)]
    return a, b, a3.generation


def test_a_handed_over_partition_is_claimed_only_after_its_old_owner_releases_it(logic):
    """Handover: the follower's claim of a partition the leader still has to release
    answers nothing, another member's release changes nothing, and the old owner's
    release makes the claim answer it; the generation can be stored only then (on_stable
    is called again)."""
    stored = []
    logic.on_stable = lambda g: stored.append(g.generation)
    a, b, gen = handover_pair(logic)
    assert logic.snapshot("g") is None           # on_stable's store has nothing to write
    stored.clear()
    assert logic.claim("g", b, gen, [("t", 1)]) == []
    assert logic.release("g", b, gen, [("t", 1)]) == []
    assert logic.claim("g", b, gen, [("t", 1)]) == []
    assert logic.release("g", a, gen, [("t", 1)]) == [("t", 1)]
    assert logic.claim("g", b, gen, [("t", 1)]) == [("t", 1)]
    assert stored == [gen] and logic.snapshot("g")["generation"] == gen


def test_a_rebalance_voids_pending_handovers_and_their_claims(logic):
    """A rebalance starting (here a third member) drops what is pending: a claim answers
    RebalanceInProgress (its member rejoins) and a late release frees nothing."""
    a, b, gen = handover_pair(logic)
    join(logic)
    with pytest.raises(RebalanceInProgressError):
        logic.claim("g", b, gen, [("t", 1)])
    assert logic.pending("g") == {}
    assert logic.release("g", a, gen, [("t", 1)]) == []


def test_a_claim_or_release_of_an_older_generation_is_refused(logic):
    """Claims and releases carry the generation: one of another generation is refused."""
    a, b, gen = handover_pair(logic)
    with pytest.raises(IllegalGenerationError):
        logic.claim("g", b, gen - 1, [("t", 1)])
    with pytest.raises(IllegalGenerationError):
        logic.release("g", a, gen - 1, [("t", 1)])
    assert logic.pending("g") == {("t", 1): a}


def test_a_static_member_restarting_frees_what_its_old_instance_had_to_hand_over(logic):
    """KIP-345 meets the handover: a static member that restarts (a new member id, no
    rebalance) before releasing a partition will never release it; its restart frees
    it, so the new owner's claim gets it."""
    first = join(logic, instance="i1").result(0)
    logic.sync("g", first.member_id, 1, {first.member_id: [("t", 0), ("t", 1)]}).result(0)
    other_join = join(logic)
    again = join(logic, first.member_id, protocols=(("range", b"m2"),), instance="i1")
    other, mine = other_join.result(0), again.result(0)
    gen = mine.generation
    fo = logic.sync("g", other.member_id, gen)
    logic.sync("g", first.member_id, gen,
               {first.member_id: [("t", 0)], other.member_id: [("t", 1)]},
               handover={first.member_id: [("t", 1)]}).result(0)
    assert fo.result(0) == [("t", 1)]
    assert logic.claim("g", other.member_id, gen, [("t", 1)]) == []
    restarted = join(logic, instance="i1", protocols=(("range", b"m2"),)).result(0)
    assert restarted.generation == gen and logic.describe("g")["state"] == "Stable"
    assert logic.claim("g", other.member_id, gen, [("t", 1)]) == [("t", 1)]
