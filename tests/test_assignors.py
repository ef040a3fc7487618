"""The consumer-group assignors (pure functions): seed 004's range over consumer threads,
Kafka's round robin, and the cooperative-sticky protocol's two rounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.client.assignors import (Subscription, assignor, cooperative_sticky_assign,
                                     range_assign, range_threads, roundrobin_assign,
                                     sticky_assign)
from actors.errors import IllegalArgumentError


def test_range_follows_the_seeds_example_of_five_partitions_over_four_threads():
    """Seed 004: two consumers with two threads each and partitions p0-p4 give
    p0, p1 -> C1-0, p2 -> C1-1, p3 -> C2-0, p4 -> C2-1."""
    members = {"C1": Subscription(("t",), streams={"t": 2}),
               "C2": Subscription(("t",), streams={"t": 2})}
    assert range_threads(members, {"t": 5}) == {
        ("C1", 0): [("t", 0), ("t", 1)], ("C1", 1): [("t", 2)],
        ("C2", 0): [("t", 3)], ("C2", 1): [("t", 4)]}
    assert range_assign(members, {"t": 5}) == {"C1": [("t", 0), ("t", 1), ("t", 2)],
                                               "C2": [("t", 3), ("t", 4)]}


def test_range_assigns_each_topic_among_its_own_subscribers_only():
    """A topic is split among the members subscribed to it; a member subscribed to nothing
    that exists gets an empty list."""
    members = {"a": Subscription(("x", "y")), "b": Subscription(("y",)),
               "c": Subscription(("missing",))}
    assert range_assign(members, {"x": 2, "y": 3}) == {
        "a": [("x", 0), ("x", 1), ("y", 0), ("y", 1)], "b": [("y", 2)], "c": []}


def test_roundrobin_deals_sorted_partitions_to_sorted_members():
    """Kafka's documented example: C0 and C1 on t0 and t1 (3 partitions each) get
    C0: t0p0, t0p2, t1p1 and C1: t0p1, t1p0, t1p2."""
    members = {"C1": Subscription(("t0", "t1")), "C0": Subscription(("t0", "t1"))}
    assert roundrobin_assign(members, {"t0": 3, "t1": 3}) == {
        "C0": [("t0", 0), ("t0", 2), ("t1", 1)], "C1": [("t0", 1), ("t1", 0), ("t1", 2)]}


def _group(owned_by: dict[str, list], topics=("t",), generation=1):
    return {m: Subscription(tuple(topics), owned=tuple(tps), generation=generation)
            for m, tps in owned_by.items()}


def test_cooperative_sticky_revokes_only_what_moves_when_a_member_joins():
    """KIP-429: a third member joins two members owning 6 partitions each of 12. Round 1
    revokes exactly the partitions that move (2 from each) and assigns them to nobody;
    nothing else changes owner. Round 2 gives them to the newcomer: 4 each, and the two
    old members kept everything they did not give up."""
    a = [("t", p) for p in range(6)]
    b = [("t", p) for p in range(6, 12)]
    first = cooperative_sticky_assign(_group({"a": a, "b": b, "c": []}), {"t": 12})
    assert set(first.assignment["a"]) <= set(a) and set(first.assignment["b"]) <= set(b)
    assert first.assignment["c"] == []
    revoked = {m: set(v) for m, v in first.pending_revocation.items()}
    assert {m: len(v) for m, v in revoked.items()} == {"a": 2, "b": 2}
    assert set(a) - set(first.assignment["a"]) == revoked["a"]
    second = cooperative_sticky_assign(
        _group({m: first.assignment[m] for m in "abc"}, generation=2), {"t": 12})
    assert second.pending_revocation == {}
    assert {m: len(v) for m, v in second.assignment.items()} == {"a": 4, "b": 4, "c": 4}
    assert second.assignment["a"] == first.assignment["a"]
    assert second.assignment["b"] == first.assignment["b"]
    assert set(second.assignment["c"]) == revoked["a"] | revoked["b"]


def test_cooperative_sticky_keeps_everything_when_nothing_changes():
    """A stable, balanced group rejoining with what it owns gets exactly that back."""
    owned = {"a": [("t", 0), ("t", 1)], "b": [("t", 2), ("t", 3)]}
    result = cooperative_sticky_assign(_group(owned), {"t": 4})
    assert result.assignment == owned and result.pending_revocation == {}


def test_sticky_gives_a_doubly_claimed_partition_to_the_newest_generation():
    """Two members both claim t-0 (one from an older generation, a zombie's view): the
    claim of the newer generation wins."""
    members = {"old": Subscription(("t",), owned=(("t", 0),), generation=3),
               "new": Subscription(("t",), owned=(("t", 0),), generation=4)}
    assert ("t", 0) in sticky_assign(members, {"t": 2})["new"]


subscriptions = st.dictionaries(
    st.sampled_from(["m0", "m1", "m2", "m3", "m4"]),
    st.tuples(st.sets(st.sampled_from(["x", "y", "z"]), min_size=1),
              st.sets(st.tuples(st.sampled_from(["x", "y", "z"]),
                                st.integers(0, 7)), max_size=6)),
    min_size=1)
topic_sizes = st.fixed_dictionaries({"x": st.integers(0, 8), "y": st.integers(0, 8),
                                     "z": st.integers(0, 3)})


@settings(max_examples=300, deadline=None)
@given(subscriptions, topic_sizes)
def test_every_assignor_gives_each_partition_to_exactly_one_subscriber(subs, sizes):
    """For any subscriptions, every assignor gives every partition of a subscribed topic to
    exactly one member subscribed to that topic, and nothing else; the sticky target is
    balanced (counts differ by at most one) when every member has the same topics."""
    members = {m: Subscription(tuple(sorted(topics)), owned=tuple(sorted(owned)),
                               generation=1)
               for m, (topics, owned) in subs.items()}
    wanted = {(t, p) for s in members.values() for t in s.topics for p in range(sizes[t])}
    for name in ("range", "roundrobin", "sticky"):
        out = sticky_assign(members, sizes) if name == "sticky" else \
            assignor(name)(members, sizes)
        assert set(out) == set(members)
        flat = [tp for tps in out.values() for tp in tps]
        assert len(flat) == len(set(flat)) and set(flat) == wanted, name
        for m, tps in out.items():
            assert all(t in members[m].topics for t, _ in tps), name
        if name == "sticky" and len({s.topics for s in members.values()}) == 1:
            counts = [len(v) for v in out.values()]
            assert max(counts) - min(counts) <= 1
    coop = cooperative_sticky_assign(members, sizes)
    flat = [tp for tps in coop.assignment.values() for tp in tps]
    pending = [tp for tps in coop.pending_revocation.values() for tp in tps]
    assert len(flat) == len(set(flat)) and not set(flat) & set(pending)
    for m, tps in coop.pending_revocation.items():
        assert set(tps) <= set(members[m].owned)


@pytest.mark.parametrize("bad", [{"t": 0}, {"t": -1}, {"t": "2"}, {"t": True}])
def test_bad_stream_counts_and_strategies_are_refused(bad):
    """A stream count that is not an int >= 1, or an unknown strategy name, raises
    IllegalArgumentError."""
    with pytest.raises(IllegalArgumentError):
        range_assign({"a": Subscription(("t",), streams=bad)}, {"t": 2})
    with pytest.raises(IllegalArgumentError):
        assignor("sticky-ish")
