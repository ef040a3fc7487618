"""ControllerLogic and its ControllerChannel as tables, with a fake store and a fake transport
(no Ray, no ZooKeeper).

FakeStore holds what ZkStore would: registered brokers with their registration czxid,
topic assignments, versioned partition states (a stale expected version raises
VersionConflictError), topic configs, deletion and preferred-election requests. FakeTransport
records every request and answers as each test tells it to.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors.server.channel import (MAX_ATTEMPTS, REQUEST_TIMEOUT_S, ControllerChannel,
                                   RequestKind, RequestStatus, backoff_s)
from actors.server.controller import ControllerLogic
from coordination import zk_layout as L
from coordination.errors import NodeAlreadyExistsError, NodeMissingError, VersionConflictError

LAI, UM, SR = RequestKind.LEADER_AND_ISR, RequestKind.UPDATE_METADATA, RequestKind.STOP_REPLICA


# -- fakes ------------------------------------------------------------------------------------
class FakeStore:
    """The ZkStore methods ControllerLogic uses, in memory, with ZooKeeper's versioning."""

    def __init__(self):
        self.zxid = 0
        self.brokers: dict[int, int] = {}                  # id -> czxid
        self.assignments: dict[str, tuple[dict, int]] = {}  # topic -> (assignment, czxid)
        self.states: dict[tuple[str, int], tuple[L.PartitionState, int]] = {}
        self.configs: dict[str, dict] = {}
        self.deleting: set[str] = set()
        self.preferred: list | None = None
        self.state_writes: list[tuple[str, int, L.PartitionState]] = []
        self.before_update = None       # hook(topic, p): a concurrent writer, run once
        self.zk = self                  # ControllerLogic reads registration czxids via zk

    def _next_zxid(self) -> int:
        self.zxid += 1
        return self.zxid

    # test set-up
    def register(self, *broker_ids: int) -> None:
        for b in broker_ids:
            self.brokers[b] = self._next_zxid()

    def unregister(self, *broker_ids: int) -> None:
        for b in broker_ids:
            self.brokers.pop(b, None)

    def add_topic(self, topic: str, assignment: dict[int, list[int]], config=None) -> None:
        self.assignments[topic] = ({p: tuple(r) for p, r in assignment.items()},
                                   self._next_zxid())
        self.configs[topic] = dict(config or {})

    def put_state(self, topic: str, p: int, leader: int, epoch: int, isr) -> None:
        old = self.states.get((topic, p))
        self.states[(topic, p)] = (L.PartitionState(leader, epoch, tuple(isr), 1),
                                   old[1] + 1 if old else 0)

    def state(self, topic: str, p: int = 0):
        st, _ = self.states[(topic, p)]
        return st.leader, st.leader_epoch, list(st.isr)

    # zk
    def exists(self, path: str):
        for b, czxid in self.brokers.items():
            if path == L.broker_path(b):
                return SimpleNamespace(czxid=czxid)
        return None

    # ZkStore
    def broker_ids(self, *, watch=None):
        return sorted(self.brokers)

    def get_broker(self, broker_id):
        if broker_id not in self.brokers:
            return None
        return SimpleNamespace(host="127.0.0.1", port=0, rack=None)

    def pending_topic_deletions(self, *, watch=None):
        return sorted(self.deleting)

    def config_changes(self, *, watch=None):
        return []

    def purge_config_changes(self, older_than_ms):
        return 0

    def topics(self, *, watch=None):
        return sorted(self.assignments)

    def get_topic(self, topic, *, watch=None):
        if topic not in self.assignments:
            raise NodeMissingError(topic)
        assignment, czxid = self.assignments[topic]
        return dict(assignment), 0, f"{czxid:x}"

    def get_topic_config(self, topic):
        return dict(self.configs.get(topic, {}))

    def get_partition_state(self, topic, partition, *, watch=None):
        if (topic, partition) not in self.states:
            raise NodeMissingError(f"{topic}-{partition}")
        return self.states[(topic, partition)]

    def create_partition_state(self, topic, partition, state):
        if (topic, partition) in self.states:
            raise NodeAlreadyExistsError(f"{topic}-{partition}")
        self.states[(topic, partition)] = (state, 0)
        self.state_writes.append((topic, partition, state))
        return 0

    def update_partition_state(self, topic, partition, state, *, expected_version,
                               controller_epoch_zk_version=None):
        hook, self.before_update = self.before_update, None
        if hook is not None:
            hook(topic, partition)
        _, version = self.states[(topic, partition)]
        if version != expected_version:
            raise VersionConflictError(L.partition_state_path(topic, partition), expected_version)
        self.states[(topic, partition)] = (state, version + 1)
        self.state_writes.append((topic, partition, state))
        return version + 1

    def complete_topic_deletion(self, topic):
        self.assignments.pop(topic, None)
        self.configs.pop(topic, None)
        for key in [k for k in self.states if k[0] == topic]:
            del self.states[key]
        self.deleting.discard(topic)

    def get_preferred_replica_election(self, *, watch=None):
        return self.preferred

    def complete_preferred_replica_election(self):
        self.preferred = None


class FakeTransport:
    """Records requests; answers them at once (``auto``) unless the broker is ``silent``
    (never answers) or ``failing`` (raises), or a test answers a token by hand."""

    def __init__(self):
        self.calls: list[SimpleNamespace] = []
        self.answers: dict[int, tuple[bool, object]] = {}
        self.silent: set[int] = set()
        self.failing: set[int] = set()
        self.refuse: dict[tuple[int, str, int], str] = {}   # (broker, t, p) -> error

    def send(self, broker_id, method, args):
        token = len(self.calls)
        self.calls.append(SimpleNamespace(broker=broker_id, method=method, args=args,
                                          token=token))
        if broker_id in self.failing:
            self.answers[token] = (False, ConnectionError(f"broker {broker_id} is down"))
        elif broker_id not in self.silent:
            self.answers[token] = (True, self._ok(broker_id, method, args))
        return token

    def _ok(self, broker_id, method, args):
        if method == "leader_and_isr":
            return [{"topic": e["topic"], "partition": e["partition"],
                     "error": self.refuse.get((broker_id, e["topic"], e["partition"]))}
                    for e in args[1]]
        return None

    def answer(self, token, ok=True, value=None):
        self.answers[token] = (ok, value)

    def poll(self, tokens):
        return {t: self.answers[t] for t in tokens if t in self.answers}

    def forget(self, token):
        pass

    def sent(self, method=None, broker=None):
        return [c for c in self.calls if (method is None or c.method == method)
                and (broker is None or c.broker == broker)]

    def clear(self):
        self.calls_before = len(self.calls)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(*, brokers=(0, 1, 2), unclean=False, epoch=1):
    store, transport, clock = FakeStore(), FakeTransport(), Clock()
    store.register(*brokers)
    logic = ControllerLogic(store, broker_id=0, namespace="unit", transport=transport,
                            unclean_leader_election=unclean, clock=clock)
    logic.activate(epoch, 7)
    return logic, store, transport, clock


def lai_entries(call):
    """(topic, partition, leader, leader_epoch) of a LeaderAndIsr call."""
    return [(e["topic"], e["partition"], e["leader"], e["leader_epoch"]) for e in call.args[1]]


# -- election: one row per rule ------------------------------------------------------------------
# (id, replicas, state before (leader, epoch, isr) or None, live brokers, unclean, preferred,
#  state after (leader, epoch, isr), or None when the state must not be written)
ELECTION_ROWS = [
    ("new partition: first live replica leads, live replicas form the ISR",
     [1, 2, 0], None, {0, 1, 2}, False, False, (1, 0, [1, 2, 0])),
    ("new partition whose first replica is down: the first live one leads",
     [1, 2, 0], None, {0, 2}, False, False, (2, 0, [2, 0])),
    ("new partition with no live replica: no state until one is alive",
     [1, 2], None, {0}, False, False, None),
    ("all alive and in sync: nothing written",
     [0, 1, 2], (0, 3, [0, 1, 2]), {0, 1, 2}, False, False, None),
    ("leader lost: first live ISR member in assignment order leads, epoch + 1",
     [0, 1, 2], (0, 3, [2, 1, 0]), {1, 2}, False, False, (1, 4, [2, 1])),
    ("leader lost, its next replica out of sync: the live ISR member leads",
     [0, 1, 2], (0, 3, [0, 2]), {1, 2}, False, False, (2, 4, [2])),
    ("a dead follower leaves the ISR; leader and epoch unchanged",
     [0, 1, 2], (0, 3, [0, 1, 2]), {0, 2}, False, False, (0, 3, [0, 2])),
    ("no live ISR member, unclean off: offline (leader -1), the last ISR kept",
     [0, 1, 2], (0, 3, [0]), {1, 2}, False, False, (-1, 4, [0])),
    ("already offline, an out-of-sync replica alive, unclean off: stays offline",
     [0, 1, 2], (-1, 4, [0]), {1, 2}, False, False, None),
    ("no live ISR member, unclean on: an out-of-sync live replica leads alone",
     [0, 1, 2], (0, 3, [0]), {1, 2}, True, False, (1, 4, [1])),
    ("offline, unclean on: an out-of-sync replica that is alive is elected",
     [0, 1, 2], (-1, 4, [0]), {2}, True, False, (2, 5, [2])),
    ("offline partition comes back when an ISR member returns",
     [0, 1, 2], (-1, 4, [0]), {0, 1}, False, False, (0, 5, [0])),
    ("preferred election moves leadership to the first replica in the ISR, epoch + 1",
     [0, 1, 2], (1, 4, [1, 2, 0]), {0, 1, 2}, False, True, (0, 5, [1, 2, 0])),
    ("preferred election does nothing when the preferred replica is out of sync",
     [0, 1, 2], (1, 4, [1, 2]), {0, 1, 2}, False, True, None),
    ("preferred election does nothing when the preferred replica already leads",
     [0, 1, 2], (0, 4, [0, 1, 2]), {0, 1, 2}, False, True, None),
]


@pytest.mark.parametrize("row", ELECTION_ROWS, ids=[r[0] for r in ELECTION_ROWS])
def test_election_rules(row):
    """Each row: the partition state one controller tick writes (or leaves alone) for a given
    assignment, previous state, set of live brokers, unclean setting and preferred request."""
    _, replicas, before, live, unclean, preferred, after = row
    logic, store, _, _ = make(brokers=sorted(live), unclean=unclean)
    store.add_topic("t", {0: replicas})
    if before is not None:
        store.put_state("t", 0, *before)
    if preferred:
        store.preferred = [("t", 0)]
    logic.tick()
    if after is None:
        assert store.state_writes == []
        if before is None:
            assert ("t", 0) not in store.states
    else:
        assert store.state("t") == (after[0], after[1], after[2])
        assert len(store.state_writes) == 1
        assert store.state_writes[0][2].controller_epoch == 1
    if preferred:
        assert store.preferred is None, "the preferred election request is completed"


def test_a_restarted_leader_gets_one_new_leader_epoch_even_when_a_write_loses_a_race():
    """A broker that registers again (new czxid) between two ticks gets exactly one new
    leader epoch for each partition it leads, even when another partition's write loses a
    race and the tick is repeated (before the fix, the repeated tick bumped again)."""
    logic, store, _, _ = make()
    store.add_topic("t", {0: [0, 1], 1: [0, 2], 2: [1, 0]})
    logic.tick()
    assert [store.state("t", p)[:2] for p in range(3)] == [(0, 0), (0, 0), (1, 0)]
    store.register(0)   # broker 0 restarted faster than its session expired

    def lose_every_race(topic, p):      # partition 1 keeps changing under the controller
        store.put_state("t", 1, 0, store.state("t", 1)[1], [0, 2])
        store.before_update = lose_every_race if p == 1 else None
    store.before_update = lambda t, p: (setattr(store, "before_update", lose_every_race)
                                        if p == 0 else None)
    logic.tick()
    assert store.state("t", 0)[:2] == (0, 1)
    assert store.state("t", 2)[:2] == (1, 0), "broker 0 follows there: no new epoch"
    store.before_update = None
    logic.tick()
    assert store.state("t", 0)[:2] == (0, 1), "bumped once, not again on the repeated tick"
    assert store.state("t", 1)[:2] == (0, 1)
    logic.tick()
    assert [store.state("t", p)[:2] for p in range(3)] == [(0, 1), (0, 1), (1, 0)]


def test_a_version_conflict_re_reads_the_state_instead_of_overwriting_it():
    """When the state changed after the controller read it (here: the leader's ISR change
    dropped follower 2), the controller's conditional write fails; it re-reads and decides
    from the new state (leader 0 died: 1 leads, ISR without 2), not from the stale one."""
    logic, store, _, _ = make(brokers=(1, 2))
    store.add_topic("t", {0: [0, 1, 2]})
    store.put_state("t", 0, 0, 3, [0, 1, 2])
    store.before_update = lambda t, p: store.put_state("t", 0, 0, 3, [0, 1])
    logic.tick()
    assert store.state("t") == (1, 4, [1])
    assert [w[2].isr for w in store.state_writes] == [(1,)]


def test_a_preferred_election_whose_write_keeps_losing_is_kept_for_the_next_tick():
    """The /admin/preferred_replica_election request is completed only once the new leader
    is written; a write that loses every re-read attempt leaves it for the next tick (before
    the fix it was deleted, and the election silently never happened)."""
    logic, store, _, _ = make()
    store.add_topic("t", {0: [0, 1, 2]})
    store.put_state("t", 0, 1, 4, [1, 2, 0])
    store.preferred = [("t", 0)]

    def concurrent_isr_write(topic, p):
        store.put_state("t", 0, 1, 4, [1, 2, 0])
        store.before_update = concurrent_isr_write
    store.before_update = concurrent_isr_write
    logic.tick()
    assert store.state("t")[0] == 1 and store.preferred == [("t", 0)]
    assert logic.wake.is_set()
    store.before_update = None
    logic.tick()
    assert store.state("t")[:2] == (0, 5) and store.preferred is None


def test_a_new_partition_created_meanwhile_is_read_back_not_overwritten():
    """Creating a partition state that appeared meanwhile (NodeAlreadyExists) re-reads it and
    keeps what is there when it is already valid."""
    logic, store, _, _ = make()
    store.add_topic("t", {0: [0, 1]})
    real_create = store.create_partition_state

    def create_raced(topic, p, state):
        store.put_state(topic, p, 1, 0, [1, 0])
        return real_create(topic, p, state)
    store.create_partition_state = create_raced
    logic.tick()
    assert store.state("t") == (1, 0, [1, 0])


# -- requests to brokers: all at once, checked on the next tick ----------------------------------
def test_leader_and_isr_goes_to_every_broker_at_once_and_metadata_follows_the_answers():
    """One tick sends LeaderAndIsr to every hosting broker without waiting; UpdateMetadata
    waits until those are answered (clients must not learn of a leader before it knows),
    then goes to every live broker; a further tick sends nothing."""
    logic, store, transport, _ = make()
    transport.silent = {0, 1, 2}
    store.add_topic("t", {0: [0, 1], 1: [1, 2], 2: [2, 0]})
    logic.tick()
    assert sorted(c.broker for c in transport.sent("leader_and_isr")) == [0, 1, 2]
    assert transport.sent("update_metadata") == []
    for c in transport.sent("leader_and_isr"):
        assert c.args[0] == 1 and isinstance(c.args[-1], int)   # stamped: epoch, request id
        transport.answer(c.token, True, transport._ok(c.broker, c.method, c.args))
    logic.tick()
    assert sorted(c.broker for c in transport.sent("update_metadata")) == [0, 1, 2]
    for c in transport.sent("update_metadata"):
        transport.answer(c.token)
    n = len(transport.calls)
    logic.tick()
    assert len(transport.calls) == n


def test_a_silent_broker_blocks_neither_the_loop_nor_the_others():
    """A broker that never answers holds only its own requests: the other brokers get their
    LeaderAndIsr at once, and the metadata once its first attempt timed out (a retry holds
    nobody's metadata); its request is sent again and its metadata follows its answer."""
    logic, store, transport, clock = make()
    transport.silent = {2}
    store.add_topic("t", {0: [0, 2], 1: [1, 2]})
    logic.tick()
    assert sorted(c.broker for c in transport.sent("leader_and_isr")) == [0, 1, 2]
    logic.tick()
    assert len(transport.sent("leader_and_isr", broker=2)) == 1, "one in flight per broker"
    assert transport.sent("update_metadata") == [], "held while broker 2 has not answered"
    clock.now += REQUEST_TIMEOUT_S[LAI] + 0.1
    logic.tick()                      # times out; backoff before the retry
    assert {c.broker for c in transport.sent("update_metadata")} == {0, 1}, "held no longer"
    clock.now += backoff_s(1)
    logic.tick()
    assert len(transport.sent("leader_and_isr", broker=2)) == 2
    logic.tick()
    assert {c.broker for c in transport.sent("update_metadata")} == {0, 1}
    retry = transport.sent("leader_and_isr", broker=2)[-1]
    transport.answer(retry.token, True, transport._ok(2, retry.method, retry.args))
    logic.tick()
    assert {c.broker for c in transport.sent("update_metadata")} == {0, 1, 2}


def test_a_late_answer_to_an_abandoned_request_is_stale_and_records_nothing():
    """An answer that arrives after its request timed out (and a newer one was sent) is
    recognised as stale by its request id and does not mark the newer state delivered."""
    logic, store, transport, clock = make(brokers=(0,))
    transport.silent = {0}
    store.add_topic("t", {0: [0]})
    logic.tick()
    (first,) = transport.sent("leader_and_isr")
    clock.now += REQUEST_TIMEOUT_S[LAI] + backoff_s(1) + 0.1
    logic.tick()                      # abandoned
    clock.now += backoff_s(1)
    logic.tick()                      # sent again
    second = transport.sent("leader_and_isr")[-1]
    assert second.args[-1] > first.args[-1]
    transport.answer(first.token, True, transport._ok(0, first.method, first.args))
    settled = logic.channel.collect(store.brokers)
    assert [(r.request_id, r.status) for r in settled] == [(first.args[-1], RequestStatus.STALE)]
    assert logic._delivered == {}
    transport.answer(second.token, True, transport._ok(0, second.method, second.args))
    logic.tick()
    assert ("t", 0) in {k[1:] for k in logic._delivered}


def test_failed_requests_are_retried_with_backoff_and_parked_after_the_bound():
    """A broker that refuses every request gets it again after a growing backoff, at most
    MAX_ATTEMPTS times for the same payload; a re-registered broker starts afresh."""
    logic, store, transport, clock = make(brokers=(0,))
    transport.failing = {0}
    store.add_topic("t", {0: [0]})
    for _ in range(60):
        logic.tick()
        clock.now += 0.5
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS
    transport.failing = set()
    store.register(0)                 # a new incarnation
    logic.tick()
    logic.tick()
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS + 1
    assert transport.sent("update_metadata")


def test_a_partition_a_broker_refuses_is_sent_again_and_the_rest_is_not():
    """A LeaderAndIsr answer that refuses one partition marks the others delivered; only
    the refused one is in the next request."""
    logic, store, transport, clock = make(brokers=(0,))
    transport.refuse[(0, "t", 1)] = "FencedLeaderEpochError"
    store.add_topic("t", {0: [0], 1: [0]})
    logic.tick()
    del transport.refuse[(0, "t", 1)]
    clock.now += backoff_s(1)
    logic.tick()
    assert [lai_entries(c) for c in transport.sent("leader_and_isr")] == [
        [("t", 0, 0, 0), ("t", 1, 0, 0)], [("t", 1, 0, 0)]]


def test_a_restarted_broker_gets_its_partitions_again_and_in_flight_answers_go_stale():
    """A broker that registers again gets LeaderAndIsr for all its partitions (with the new
    leader epoch where it leads), and an answer from its previous incarnation is stale."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [0, 1], 1: [1, 0]})
    logic.tick()
    logic.tick()
    transport.silent = {0}
    store.put_state("t", 1, 1, 0, [1])          # a change to send to broker 0
    store.states[("t", 1)] = (store.states[("t", 1)][0], 1)
    logic.tick()
    pending = transport.sent("leader_and_isr", broker=0)[-1]
    store.register(0)
    transport.silent = set()
    transport.answer(pending.token, True, transport._ok(0, pending.method, pending.args))
    logic.tick()
    assert logic.channel.stats.stale == 1
    logic.tick()
    last = transport.sent("leader_and_isr", broker=0)[-1]
    assert sorted(lai_entries(last)) == [("t", 0, 0, 1), ("t", 1, 1, 0)]


# -- topic deletion -----------------------------------------------------------------------------
def test_topic_deletion_stops_replicas_on_live_hosts_then_removes_the_znodes():
    """A topic marked for deletion leaves the metadata at once, gets StopReplica (delete) on
    every live hosting broker, and its znodes go only when all of them have answered; a
    dead host does not hold the deletion up."""
    logic, store, transport, _ = make(brokers=(0, 1, 2, 3))
    store.add_topic("gone", {0: [0, 1], 1: [1, 3]})
    store.add_topic("kept", {0: [2]})
    logic.tick()
    logic.tick()
    store.unregister(3)
    store.deleting.add("gone")
    transport.silent = {1}
    logic.tick()
    stops = transport.sent("stop_replicas")
    assert sorted(c.broker for c in stops) == [0, 1]
    assert stops[0].args[1:3] == ([("gone", 0), ("gone", 1)], True)
    assert "gone" in store.assignments, "broker 1 has not answered yet"
    metadata = transport.sent("update_metadata")[-1].args[1]
    assert set(metadata["topics"]) == {"kept"}
    for c in transport.sent("stop_replicas", broker=1):
        transport.answer(c.token)
    logic.tick()
    assert "gone" not in store.assignments and not store.deleting
    assert not [k for k in logic._delivered if k[1] == "gone"]


def test_a_deleted_and_recreated_topic_is_sent_to_brokers_as_new():
    """After deletion, a topic of the same name (another topic id) is sent again to every
    hosting broker: nothing delivered for the old incarnation counts for the new one."""
    logic, store, transport, _ = make(brokers=(0,))
    store.add_topic("t", {0: [0]})
    logic.tick()
    logic.tick()
    store.deleting.add("t")
    logic.tick()
    logic.tick()
    assert "t" not in store.assignments
    store.add_topic("t", {0: [0]})
    logic.tick()
    first, second = transport.sent("leader_and_isr")
    assert first.args[1][0]["topic_id"] != second.args[1][0]["topic_id"]


# -- the channel alone ------------------------------------------------------------------------
def test_the_channel_refuses_a_second_request_in_flight_to_one_broker():
    """At most one request is in flight per broker, so a broker runs them in the order sent."""
    transport, clock = FakeTransport(), Clock()
    transport.silent = {0}
    channel = ControllerChannel(transport, clock=clock)
    channel.reset(3)
    channel.send(0, 11, UM, ({},), payload_key=1)
    assert not channel.can_send(0, SR, ("x",))
    with pytest.raises(RuntimeError):
        channel.send(0, 11, SR, ([], True))
    assert channel.can_send(1, SR, ("x",))


def test_a_new_controller_term_forgets_the_old_terms_requests():
    """After reset (a new controller epoch) nothing of the old term is waited for, and new
    requests carry the new epoch."""
    transport, clock = FakeTransport(), Clock()
    transport.silent = {0}
    channel = ControllerChannel(transport, clock=clock)
    channel.reset(3)
    channel.send(0, 11, UM, ({},), payload_key=1)
    channel.reset(4)
    assert channel.in_flight() == [] and channel.can_send(0, UM, 1)
    req = channel.send(0, 11, UM, ({},), payload_key=1)
    assert transport.calls[-1].args[0] == 4 and req.controller_epoch == 4
