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

from actors.server.channel import (MAX_ATTEMPTS, PARKED_RETRY_S, REQUEST_TIMEOUT_S,
                                   ControllerChannel, RequestKind, RequestStatus, backoff_s)
from actors.errors import (FencedLeaderEpochError, InvalidReplicaAssignmentError,
                           InvalidReplicationFactorError,
                           InvalidUpdateVersionError, NotControllerError,
                           ReassignmentInProgressError, UnknownTopicOrPartitionError)
from actors.server.controller import WATCH_RETRY_S, ControllerLogic
from coordination import zk_layout as L
from coordination.errors import (ControllerMovedError, NodeAlreadyExistsError, NodeMissingError,
                                 VersionConflictError)

LAI, UM, SR = RequestKind.LEADER_AND_ISR, RequestKind.UPDATE_METADATA, RequestKind.STOP_REPLICA


# -- fakes ------------------------------------------------------------------------------------
class FakeStore:
    """The ZkStore methods ControllerLogic uses, in memory, with ZooKeeper's versioning."""

    def __init__(self):
        self.zxid = 0
        self.brokers: dict[int, int] = {}                  # id -> czxid
        self.assignments: dict[str, tuple[dict, int]] = {}  # topic -> (assignment, czxid)
        self.topic_versions: dict[str, int] = {}
        self.reassignment: dict | None = None
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
        self.topic_versions[topic] = 0
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
        return SimpleNamespace(host="127.0.0.1", port=0, rack=None, listeners=lambda: ())

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
        return dict(assignment), self.topic_versions[topic], f"{czxid:x}"

    def set_topic_assignment(self, topic, assignment, *, expected_version,
                             controller_epoch_zk_version=None):
        if topic not in self.assignments:
            raise NodeMissingError(topic)
        if self.topic_versions[topic] != expected_version:
            raise VersionConflictError(L.topic_path(topic), expected_version)
        self.assignments[topic] = ({p: tuple(r) for p, r in assignment.items()},
                                   self.assignments[topic][1])
        self.topic_versions[topic] += 1
        return self.topic_versions[topic]

    def replicas(self, topic, p=0):
        return list(self.assignments[topic][0][p])

    def get_reassignment(self, *, watch=None):
        return None if self.reassignment is None else dict(self.reassignment)

    def set_reassignment(self, plan):
        if self.reassignment is None:
            raise NodeMissingError("reassign_partitions")
        self.reassignment = {tp: tuple(r) for tp, r in plan.items()}

    def complete_reassignment(self):
        self.reassignment = None

    def get_topic_config(self, topic):
        return dict(self.configs.get(topic, {}))

    def get_partition_state(self, topic, partition, *, watch=None):
        if (topic, partition) not in self.states:
            raise NodeMissingError(f"{topic}-{partition}")
        return self.states[(topic, partition)]

    def get_partition_states(self, topic, partitions):
        return {p: self.states[(topic, p)] for p in partitions if (topic, p) in self.states}

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
        self.watches: list[SimpleNamespace] = []     # await_stop calls, kept pending
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

    def watch(self, broker_id, broker_epoch):
        token = ("watch", len(self.watches))
        self.watches.append(SimpleNamespace(broker=broker_id, czxid=broker_epoch, token=token))
        return token

    def kill(self, broker_id, verdict="dead"):
        """The broker's actor dies: its pending watches answer ``verdict``."""
        for w in self.watches:
            if w.broker == broker_id and w.token not in self.answers:
                self.answers[w.token] = (True, verdict)

    def pending_watches(self):
        return sorted((w.broker, w.czxid) for w in self.watches if w.token not in self.answers)

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


def tick_for(logic, clock, ticks: int, step_s: float = 0.5) -> None:
    """``ticks`` controller ticks, the clock moving ``step_s`` after each."""
    for _ in range(ticks):
        logic.tick()
        clock.now += step_s


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
    tick_for(logic, clock, 60)
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS
    assert logic.status()["pending"] == {"in_flight": [],
                                         "failing": [(0, "LEADER_AND_ISR", MAX_ATTEMPTS, True),
                                                     (0, "UPDATE_METADATA", MAX_ATTEMPTS, True)]}
    transport.failing = set()
    store.register(0)                 # a new incarnation
    logic.tick()
    logic.tick()
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS + 1
    assert transport.sent("update_metadata")


def test_a_parked_request_is_sent_again_every_parked_retry_s_until_the_live_broker_takes_it():
    """A live broker whose first requests all failed (a restart on a busy machine) is not
    left without its partitions: the parked payload goes again every PARKED_RETRY_S, and
    once the broker answers it is delivered and the metadata follows."""
    logic, store, transport, clock = make(brokers=(0,))
    transport.failing = {0}
    store.add_topic("t", {0: [0]})
    tick_for(logic, clock, 20)
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS
    clock.now += PARKED_RETRY_S
    logic.tick()
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS + 1, "sent again once"
    logic.tick()
    assert len(transport.sent("leader_and_isr")) == MAX_ATTEMPTS + 1, "then parked again"
    transport.failing = set()
    clock.now += PARKED_RETRY_S
    tick_for(logic, clock, 20)
    assert logic.status()["pending"]["failing"] == []
    assert logic._delivered.get((0, "t", 0)) is not None
    assert transport.sent("update_metadata")[-1].args[1]["topics"]["t"][0]["leader"] == 0


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
    clock.now += 2.5
    assert channel.describe()["in_flight"] == [(0, "UPDATE_METADATA", 2.5)]
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


# -- unclean.leader.election.enable per topic --------------------------------------------------
@pytest.mark.parametrize("broker_default,topic_setting,expected_leader", [
    (False, None, -1), (False, "true", 1), (True, None, 1), (True, "false", -1)])
def test_the_topic_setting_of_unclean_election_wins_over_the_broker_default(
        broker_default, topic_setting, expected_leader):
    """unclean.leader.election.enable in the topic config decides whether an out-of-sync
    replica may lead; without it, the broker default does."""
    logic, store, _, _ = make(brokers=(1, 2), unclean=broker_default)
    config = {} if topic_setting is None else {"unclean.leader.election.enable": topic_setting}
    store.add_topic("t", {0: [0, 1, 2]}, config=config)
    store.put_state("t", 0, 0, 3, [0])
    logic.tick()
    assert store.state("t")[0] == expected_leader


def test_a_replica_outside_the_assignment_leaves_the_isr():
    """The ISR only holds assigned replicas (after a reassignment a removed replica the
    leader re-added goes); leader and epoch stay."""
    logic, store, _, _ = make(brokers=(0, 1, 2, 3))
    store.add_topic("t", {0: [0, 1, 2]})
    store.put_state("t", 0, 0, 3, [0, 1, 2, 3])
    logic.tick()
    assert store.state("t") == (0, 3, [0, 1, 2])


# -- AlterPartition -------------------------------------------------------------------------------
# (id, ISR before (leader 0, epoch 5, version 2), live brokers, request (leader, epoch, new ISR,
#  zk version), expected: an error class, or (ISR after, written?))
ALTER_ROWS = [
    ("a caught-up live follower joins: written with a new zk version",
     [0, 1], {0, 1, 2}, (0, 5, [0, 1, 2], 2), ([0, 1, 2], True)),
    ("a lagging follower leaves: written",
     [0, 1, 2], {0, 1, 2}, (0, 5, [0, 2], 2), ([0, 2], True)),
    ("an older leader epoch is fenced",
     [0, 1], {0, 1, 2}, (0, 4, [0, 1, 2], 2), FencedLeaderEpochError),
    ("a replica that is not the leader is fenced",
     [0, 1], {0, 1, 2}, (1, 5, [0, 1, 2], 2), FencedLeaderEpochError),
    ("a stale zk version is refused",
     [0, 1], {0, 1, 2}, (0, 5, [0, 1, 2], 1), InvalidUpdateVersionError),
    ("a stale zk version proposing what is already there answers the state (a retry)",
     [0, 1, 2], {0, 1, 2}, (0, 5, [0, 1, 2], 1), ([0, 1, 2], False)),
    ("a dead replica is not added",
     [0, 1], {0, 1}, (0, 5, [0, 1, 2], 2), ([0, 1], False)),
    ("the leader stays in the ISR even when the proposal leaves it out",
     [0, 1, 2], {0, 1, 2}, (0, 5, [1], 2), ([0, 1], True)),
    ("a replica outside the assignment is not added",
     [0, 1], {0, 1, 2, 3}, (0, 5, [0, 1, 3], 2), ([0, 1], False)),
    ("the same ISR again writes nothing",
     [0, 1], {0, 1, 2}, (0, 5, [0, 1], 2), ([0, 1], False)),
]


@pytest.mark.parametrize("row", ALTER_ROWS, ids=[r[0] for r in ALTER_ROWS])
def test_alter_partition_rules(row):
    """Each row: how the controller answers a leader's ISR change (refusal, or the state it
    writes and answers) for a given ISR, set of live brokers and request."""
    _, isr, live, request, expected = row
    logic, store, _, _ = make(brokers=sorted(live))
    store.add_topic("t", {0: [0, 1, 2]})
    store.states[("t", 0)] = (L.PartitionState(0, 5, tuple(isr), 1), 2)
    logic.tick()                               # observes the live brokers
    store.state_writes.clear()
    if isinstance(expected, type):
        with pytest.raises(expected):
            logic.alter_partition("t", 0, *request)
        assert store.state_writes == []
        return
    after, written = expected
    answer = logic.alter_partition("t", 0, *request)
    assert answer == {"leader": 0, "leader_epoch": 5, "isr": after,
                      "zk_version": 3 if written else 2}
    assert store.state("t") == (0, 5, after)
    assert len(store.state_writes) == (1 if written else 0)


def test_an_alter_partition_queued_from_another_thread_is_answered_by_the_loop():
    """AlterPartition reaches the single-threaded logic through its queue: the submitter's
    future is answered by handle_requests (the loop thread), a refusal as its error, and
    requests left when the candidate stops being active answer NotControllerError."""
    import threading
    logic, store, _, _ = make()
    store.add_topic("t", {0: [0, 1, 2]})
    store.put_state("t", 0, 0, 5, [0, 1])
    logic.tick()
    futures = []
    t = threading.Thread(target=lambda: futures.extend([
        logic.submit_alter_partition("t", 0, 0, 5, [0, 1, 2], 0),
        logic.submit_alter_partition("t", 0, 0, 4, [0], 0)]))
    t.start()
    t.join(5)
    assert logic.wake.is_set() and not futures[0].done()
    assert logic.handle_requests() == 2
    assert futures[0].result(0)["isr"] == [0, 1, 2]
    with pytest.raises(FencedLeaderEpochError):
        futures[1].result(0)
    late = logic.submit_alter_partition("t", 0, 0, 5, [0, 1], 1)
    logic.fail_requests(NotControllerError("not active"))
    with pytest.raises(NotControllerError):
        late.result(0)


def test_a_deposed_controller_answers_not_controller_and_steps_down():
    """A write that finds the controller epoch moved answers NotControllerError to the
    leader and raises ControllerMovedError so the loop steps down."""
    logic, store, _, _ = make()
    store.add_topic("t", {0: [0, 1, 2]})
    store.put_state("t", 0, 0, 5, [0, 1])
    logic.tick()

    def moved(*_a, **_k):
        raise ControllerMovedError("epoch moved")
    store.update_partition_state = moved
    future = logic.submit_alter_partition("t", 0, 0, 5, [0, 1, 2], 0)
    with pytest.raises(ControllerMovedError):
        logic.handle_requests()
    with pytest.raises(NotControllerError):
        future.result(0)


def test_leader_and_isr_carries_the_zk_version_and_follows_an_isr_change():
    """LeaderAndIsr entries carry the state's zk version; after an ISR change the replicas
    get the new ISR and version (so the leader can propose again)."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [0, 1, 2]})
    logic.tick()
    logic.tick()
    assert {e["zk_version"] for c in transport.sent("leader_and_isr") for e in c.args[1]} == {0}
    logic.alter_partition("t", 0, 0, 0, [0, 1], 0)
    logic.tick()
    latest = [c.args[1][0] for c in transport.sent("leader_and_isr")[-3:]]
    assert [(e["isr"], e["zk_version"]) for e in latest] == [([0, 1], 1)] * 3


# -- broker liveness from Ray --------------------------------------------------------------------
def test_each_registered_broker_has_one_pending_watch():
    """One await_stop watch per registered broker incarnation, not re-sent while pending."""
    logic, store, transport, _ = make()
    logic.tick()
    logic.tick()
    assert transport.pending_watches() == sorted(store.brokers.items())
    assert len(transport.watches) == 3


def test_a_killed_broker_loses_its_leaderships_while_its_znode_lingers():
    """When a broker's actor dies (its watch fails), the next tick treats it as dead even
    though its ephemeral registration is still there: its partitions get leaders from the
    ISR, it leaves the ISRs and the metadata, and gets no requests."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [1, 2, 0], 1: [2, 1, 0]})
    logic.tick()
    logic.tick()
    transport.kill(1)
    logic.tick()
    assert 1 in store.brokers, "still registered in ZooKeeper"
    assert store.state("t", 0) == (2, 1, [2, 0])
    assert store.state("t", 1) == (2, 0, [2, 0])
    n = len(transport.sent(broker=1))
    logic.tick()
    metadata = transport.sent("update_metadata")[-1].args[1]
    assert set(metadata["brokers"]) == {0, 2}
    assert len(transport.sent(broker=1)) == n
    assert 1 not in [b for b, _ in transport.pending_watches()]


@pytest.mark.parametrize("verdict", ["dead", "stopped", "gone"])
def test_every_verdict_that_proves_an_incarnation_gone_marks_it_dead(verdict):
    """A watch that answers dead (actor died), stopped (clean shutdown) or gone (another
    incarnation answered) makes that incarnation dead."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [1, 0]})
    logic.tick()
    transport.kill(1, verdict)
    logic.tick()
    assert store.state("t")[0] == 0


def test_a_watch_that_runs_out_is_sent_again_and_the_broker_stays_live():
    """A watch answering "running" (its timeout passed) is re-sent; nothing changes."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [1, 0]})
    logic.tick()
    transport.kill(1, "running")
    logic.tick()
    assert store.state("t")[0] == 1
    assert len([w for w in transport.watches if w.broker == 1]) == 2
    assert (1, store.brokers[1]) in transport.pending_watches()


def test_a_failed_watch_proves_nothing_and_is_retried_after_a_pause():
    """A watch that fails without proving death (e.g. the GCS did not answer) leaves the
    broker live and is sent again after WATCH_RETRY_S."""
    logic, store, transport, clock = make()
    store.add_topic("t", {0: [1, 0]})
    logic.tick()
    (w,) = [w for w in transport.watches if w.broker == 1]
    transport.answers[w.token] = (False, TimeoutError("gcs"))
    logic.tick()
    assert store.state("t")[0] == 1
    assert (1, store.brokers[1]) not in transport.pending_watches()
    clock.now += WATCH_RETRY_S
    logic.tick()
    assert (1, store.brokers[1]) in transport.pending_watches()


def test_a_dead_broker_that_registers_again_is_live_again():
    """A new registration (new czxid) of a broker known dead makes it live: it is watched
    again, rejoins as its partitions' ISR allows, and an offline partition it held in its
    ISR comes back with it."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [1]})
    logic.tick()
    transport.kill(1)
    logic.tick()
    assert store.state("t") == (-1, 1, [1])
    store.register(1)
    logic.tick()
    assert store.state("t") == (1, 2, [1])
    assert (1, store.brokers[1]) in transport.pending_watches()


def test_the_metadata_summary_counts_offline_and_under_replicated_partitions():
    """The metadata snapshot carries counts of partitions, offline ones (1: its only
    replica is down), under-replicated ones (2: one replica down) and ones not led by their
    preferred replica (3)."""
    logic, store, transport, _ = make(brokers=(0, 1))
    store.add_topic("t", {0: [0, 1], 1: [2], 2: [1, 2], 3: [0, 1]})
    store.put_state("t", 1, 2, 0, [2])
    store.put_state("t", 3, 1, 0, [0, 1])
    logic.tick()
    logic.tick()
    metadata = transport.sent("update_metadata")[-1].args[1]
    assert metadata["summary"] == {"partitions": 4, "offline_partitions": 1,
                                   "under_replicated_partitions": 1,
                                   "preferred_replica_imbalance": 1}


# -- auto.leader.rebalance.enable ----------------------------------------------------------------
def make_rebalancing(pct=10.0, enabled=True):
    logic, store, transport, clock = make()
    logic.auto_leader_rebalance = enabled
    logic.imbalance_pct = pct
    logic.imbalance_check_interval_s = 300.0
    logic.activate(1, 7)
    return logic, store, transport, clock


# (id, states (leader, isr) of 4 partitions preferring broker 0, pct, enabled,
#  leaders after the check)
REBALANCE_ROWS = [
    ("imbalance above the percentage: in-sync preferred replicas lead again",
     [(1, [1, 0]), (1, [1, 0]), (0, [0, 1]), (0, [0, 1])], 10.0, True, [0, 0, 0, 0]),
    ("imbalance at or below the percentage: nothing moves",
     [(1, [1, 0]), (0, [0, 1]), (0, [0, 1]), (0, [0, 1])], 25.0, True, [1, 0, 0, 0]),
    ("a preferred replica out of the ISR is not made leader",
     [(1, [1]), (1, [1, 0]), (0, [0, 1]), (0, [0, 1])], 10.0, True, [1, 0, 0, 0]),
    ("disabled: nothing moves",
     [(1, [1, 0]), (1, [1, 0]), (0, [0, 1]), (0, [0, 1])], 10.0, False, [1, 1, 0, 0]),
]


@pytest.mark.parametrize("row", REBALANCE_ROWS, ids=[r[0] for r in REBALANCE_ROWS])
def test_auto_leader_rebalance_rules(row):
    """Each row: which partitions the periodic imbalance check hands back to their
    preferred replica (none before the check interval has passed)."""
    _, states, pct, enabled, after = row
    logic, store, _, clock = make_rebalancing(pct, enabled)
    store.add_topic("t", {p: [0, 1] for p in range(4)})
    for p, (leader, isr) in enumerate(states):
        store.put_state("t", p, leader, 1, isr)
    logic.tick()
    assert [store.state("t", p)[0] for p in range(4)] == [s[0] for s in states]
    clock.now += 300.0
    logic.tick()
    assert [store.state("t", p)[0] for p in range(4)] == after
    for p in range(4):
        moved = after[p] != states[p][0]
        assert store.state("t", p)[1] == (2 if moved else 1), "a move bumps the epoch"


# -- reassignment -----------------------------------------------------------------------------------
def start_reassignment(replicas=(0, 1), target=(2, 3), brokers=(0, 1, 2, 3)):
    logic, store, transport, clock = make(brokers=brokers)
    store.add_topic("t", {0: list(replicas), 1: [0, 1]})
    logic.tick()
    logic.tick()
    store.reassignment = {("t", 0): tuple(target)}
    return logic, store, transport, clock


def test_reassignment_first_adds_the_new_replicas_as_followers():
    """Step 1: the assignment becomes target + old (so the new replicas start, as
    followers, through LeaderAndIsr); leader and ISR are unchanged."""
    logic, store, transport, _ = start_reassignment()
    logic.tick()
    assert store.replicas("t") == [2, 3, 0, 1]
    assert store.state("t") == (0, 0, [0, 1])
    for b in (2, 3):
        (entry,) = [e for c in transport.sent("leader_and_isr", broker=b) for e in c.args[1]]
        assert entry["leader"] == 0 and entry["replicas"] == [2, 3, 0, 1]
    assert store.reassignment == {("t", 0): (2, 3)}


def test_reassignment_waits_until_every_new_replica_is_in_the_isr():
    """Step 2: while a target replica is not in the ISR nothing else happens."""
    logic, store, transport, _ = start_reassignment()
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1, 2], 0)
    logic.tick()
    logic.tick()
    assert store.replicas("t") == [2, 3, 0, 1]
    assert store.state("t") == (0, 0, [0, 1, 2])
    assert transport.sent("stop_replicas") == []


def test_reassignment_moves_leadership_into_the_target_set():
    """Step 3: once all target replicas are in the ISR, a leader outside the target set
    hands over to the first target replica (epoch + 1)."""
    logic, store, _, _ = start_reassignment()
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1, 2, 3], 0)
    logic.tick()
    assert store.state("t") == (2, 1, [0, 1, 2, 3])


def test_reassignment_shrinks_the_isr_and_stops_the_removed_replicas_before_the_assignment():
    """Step 4: the removed replicas leave the ISR, get StopReplica (delete) and no further
    LeaderAndIsr; the assignment keeps them until their brokers answered."""
    logic, store, transport, _ = start_reassignment()
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1, 2, 3], 0)
    transport.silent = {0, 1}
    logic.tick()                    # leader -> 2
    logic.tick()                    # ISR -> [2, 3], StopReplica goes out once 0, 1 are free
    for c in transport.sent(broker=0) + transport.sent(broker=1):
        if c.token not in transport.answers:
            transport.answer(c.token, True, transport._ok(c.broker, c.method, c.args))
    logic.tick()
    assert store.state("t") == (2, 1, [2, 3])
    stops = transport.sent("stop_replicas")
    assert sorted(c.broker for c in stops) == [0, 1]
    assert all(c.args[1:3] == ([("t", 0)], True) for c in stops)
    assert store.replicas("t") == [2, 3, 0, 1], "not before the removed replicas answered"
    n0 = len(transport.sent("leader_and_isr", broker=0))
    for c in stops:
        transport.answer(c.token)
    logic.tick()
    assert store.replicas("t") == [2, 3]
    assert store.reassignment is None, "the request is deleted once empty"
    logic.tick()
    lai0 = [e for c in transport.sent("leader_and_isr", broker=0)[n0:] for e in c.args[1]]
    assert ("t", 0) not in [(e["topic"], e["partition"]) for e in lai0]


def test_reassignment_keeps_the_entries_not_yet_done():
    """A finished partition's entry leaves /admin/reassign_partitions; the others stay."""
    logic, store, transport, _ = start_reassignment()
    store.reassignment = {("t", 0): (2, 3), ("t", 1): (1, 0)}
    logic.tick()
    assert store.replicas("t", 1) == [1, 0]
    assert store.reassignment == {("t", 0): (2, 3)}


def test_reassignment_does_not_wait_for_a_dead_removed_broker():
    """A removed replica on a broker that is not live gets no StopReplica and does not
    hold the reassignment up."""
    logic, store, transport, _ = start_reassignment(replicas=(0, 1), target=(0, 2))
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1, 2], 0)
    store.unregister(1)
    for _ in range(3):
        logic.tick()
    assert store.replicas("t") == [0, 2]
    assert store.state("t") == (0, 0, [0, 2])
    assert transport.sent("stop_replicas", broker=1) == []
    assert store.reassignment is None


def test_reassignment_of_a_deleted_topic_is_dropped():
    """An entry whose partition no longer exists is removed without effect."""
    logic, store, _, _ = start_reassignment()
    store.reassignment = {("gone", 0): (1,)}
    logic.tick()
    assert store.reassignment is None


def test_a_new_controller_resumes_a_reassignment_from_zookeeper():
    """Each step is persisted before the next: a controller elected mid-way (a new term
    that remembers nothing) carries on from the assignment and state it reads."""
    logic, store, transport, _ = start_reassignment()
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1, 2, 3], 0)
    logic.activate(2, 8)
    for _ in range(4):
        logic.tick()
    assert store.replicas("t") == [2, 3]
    assert store.state("t") == (2, 1, [2, 3])
    assert store.reassignment is None


# -- AdminManager.reassign_partitions ------------------------------------------------------------
class AdminStore(FakeStore):
    def get_topic_assignment(self, topic, *, watch=None):
        if topic not in self.assignments:
            raise NodeMissingError(topic)
        return dict(self.assignments[topic][0]), 0

    def request_reassignment(self, plan):
        if self.reassignment is not None:
            raise NodeAlreadyExistsError("reassign_partitions")
        self.reassignment = dict(plan)


PLAN_ROWS = [
    ("Kafka's JSON shape", {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, 2]}]}, None),
    ("a list of (topic, partition, replicas)", [("t", 0, [1, 2])], None),
    ("a mapping (topic, partition) -> replicas", {("t", 0): [1, 2]}, None),
    ("an unknown topic", [("u", 0, [1])], UnknownTopicOrPartitionError),
    ("an unknown partition", [("t", 5, [1])], UnknownTopicOrPartitionError),
    ("an unregistered broker", [("t", 0, [1, 9])], InvalidReplicaAssignmentError),
    ("a duplicate broker", [("t", 0, [1, 1])], InvalidReplicaAssignmentError),
    ("an empty replica list", [("t", 0, [])], InvalidReplicaAssignmentError),
    ("a partition listed twice", [("t", 0, [1]), ("t", 0, [2])],
     InvalidReplicaAssignmentError),
    ("an empty plan", {"partitions": []}, InvalidReplicaAssignmentError),
    ("a malformed entry", {"partitions": [{"topic": "t"}]}, InvalidReplicaAssignmentError),
]


@pytest.mark.parametrize("row", PLAN_ROWS, ids=[r[0] for r in PLAN_ROWS])
def test_reassign_partitions_validation(row):
    """Each row: a plan AdminManager.reassign_partitions writes, or the typed error it
    refuses it with (nothing written)."""
    from actors.server.admin_manager import AdminManager
    _, plan, error = row
    store = AdminStore()
    store.register(0, 1, 2)
    store.add_topic("t", {0: [0, 1]})
    admin = AdminManager(store)
    if error is not None:
        with pytest.raises(error):
            admin.reassign_partitions(plan)
        assert store.reassignment is None
        return
    written = admin.reassign_partitions(plan)
    assert store.reassignment == {("t", 0): (1, 2)}
    assert written == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, 2]}]}


def test_a_second_reassignment_while_one_runs_is_refused():
    """One reassignment at a time: ReassignmentInProgressError while the znode exists."""
    from actors.server.admin_manager import AdminManager
    store = AdminStore()
    store.register(0, 1, 2)
    store.add_topic("t", {0: [0, 1]})
    admin = AdminManager(store)
    admin.reassign_partitions([("t", 0, [1, 2])])
    with pytest.raises(ReassignmentInProgressError):
        admin.reassign_partitions([("t", 0, [2, 0])])
    assert store.reassignment == {("t", 0): (1, 2)}


# -- AdminManager.create_partitions and create_topic's replica assignments ----------------------
class GrowStore(AdminStore):
    def get_brokers(self):
        return {b: SimpleNamespace(rack=None) for b in self.brokers}

    def create_topic(self, topic, assignment, config):
        self.add_topic(topic, assignment, config)


GROW_ROWS = [
    ("placed with the topic's RF", 3, None, None),
    ("on the assignment given", 3, [[1, 2], [2, 0]], None),
    ("a count not above the current one", 1, None, "InvalidPartitionsError"),
    ("an assignment of another length", 3, [[1, 2]], "InvalidReplicaAssignmentError"),
    ("a broker not live", 2, [[9, 1]], "InvalidReplicaAssignmentError"),
    ("a duplicate broker", 2, [[1, 1]], "InvalidReplicaAssignmentError"),
    ("replica lists of different sizes", 3, [[1, 2], [0]], "InvalidReplicaAssignmentError"),
]


@pytest.mark.parametrize("row", GROW_ROWS, ids=[r[0] for r in GROW_ROWS])
def test_create_partitions_validation(row):
    """Each row: AdminManager.create_partitions grows topic t (1 partition, RF 2) to the
    count asked, the new partitions on the assignment given or placed with RF 2 on
    distinct live brokers, the old ones untouched; or the typed error it refuses with
    (nothing written). validate_only checks the same and writes nothing."""
    from actors import errors
    from actors.server.admin_manager import AdminManager
    _, count, assignment, error = row
    store = GrowStore()
    store.register(0, 1, 2)
    store.add_topic("t", {0: [0, 1]})
    admin = AdminManager(store)
    if error is not None:
        with pytest.raises(getattr(errors, error)):
            admin.create_partitions("t", count, assignment)
        assert store.assignments["t"][0] == {0: (0, 1)}
        return
    admin.create_partitions("t", count, assignment, validate_only=True)
    assert store.assignments["t"][0] == {0: (0, 1)}
    added = admin.create_partitions("t", count, assignment)
    written = store.assignments["t"][0]
    assert sorted(written) == list(range(count)) and written[0] == (0, 1)
    assert {p: list(r) for p, r in written.items() if p > 0} == added
    if assignment is not None:
        assert list(added.values()) == assignment
    assert all(len(set(r)) == 2 and set(r) <= {0, 1, 2} for r in added.values())


def test_create_partitions_of_an_unknown_topic_and_topic_assignments_are_checked():
    """create_partitions of a topic that does not exist is UnknownTopicOrPartitionError;
    create_topic with a replica assignment takes it as given (validate_only writes
    nothing) and refuses a gap in its partitions (InvalidReplicaAssignmentError)."""
    from actors.server.admin_manager import AdminManager
    store = GrowStore()
    store.register(0, 1, 2)
    admin = AdminManager(store)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.create_partitions("nope", 2)
    admin.create_topic("a", -1, -1, None, assignment={0: [2, 0], 1: [0, 1]},
                       validate_only=True)
    assert "a" not in store.assignments
    admin.create_topic("a", -1, -1, None, assignment={0: [2, 0], 1: [0, 1]})
    assert store.assignments["a"][0] == {0: (2, 0), 1: (0, 1)}
    with pytest.raises(InvalidReplicaAssignmentError):
        admin.create_topic("b", -1, -1, None, assignment={0: [0], 2: [1]})
    assert "b" not in store.assignments


def test_a_second_reassignment_stops_a_replica_removed_before_again():
    """What a finished reassignment recorded as stopped does not count for a later one:
    removing the same replica again sends StopReplica again."""
    logic, store, transport, _ = start_reassignment(replicas=(0, 1), target=(0,))
    for _ in range(3):
        logic.tick()
    assert store.replicas("t") == [0] and len(transport.sent("stop_replicas", broker=1)) == 1
    store.reassignment = {("t", 0): (0, 1)}
    logic.tick()
    logic.alter_partition("t", 0, 0, 0, [0, 1], store.states[("t", 0)][1])
    logic.tick()
    assert store.replicas("t") == [0, 1] and store.reassignment is None
    store.reassignment = {("t", 0): (0,)}
    for _ in range(3):
        logic.tick()
    assert store.replicas("t") == [0]
    assert len(transport.sent("stop_replicas", broker=1)) == 2


def test_a_broker_starting_removes_directories_of_partitions_moved_off_it(tmp_path):
    """At start-up a broker removes the directory of a partition no longer assigned to it
    (a reassignment finished while it was down) and keeps the ones it hosts."""
    from actors.server.broker import Broker
    store = FakeStore()
    store.add_topic("t", {0: [1, 2], 1: [0, 1]})
    for name in ("t-0", "t-1", "gone-0"):
        (tmp_path / name).mkdir()
    broker = Broker.__new__(Broker)
    broker.broker_id, broker.data_dir, broker.store = 0, str(tmp_path), store
    broker._remove_stale_partition_dirs()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-1"]


def test_new_topics_and_reassignments_use_only_brokers_the_controller_counts_live():
    """A broker that is still registered but dead to the controller (absent from the
    metadata cache's brokers) gets no replica of a new topic and is refused as a
    reassignment target; without a metadata cache yet, every registered broker counts."""
    from actors.server.admin_manager import AdminManager

    class Store(AdminStore):
        created = None

        def get_brokers(self):
            return {b: SimpleNamespace(rack=None) for b in self.brokers}

        def create_topic(self, name, assignment, config):
            self.created = assignment
    store = Store()
    store.register(0, 1, 2)
    store.add_topic("t", {0: [0]})
    admin = AdminManager(store, live_brokers=lambda: {0, 1})
    placed = admin.create_topic("n", 6, 2, None)
    assert {b for r in placed.values() for b in r} == {0, 1}
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topic("m", 1, 3, None)
    with pytest.raises(InvalidReplicaAssignmentError):
        admin.reassign_partitions([("t", 0, [2])])
    assert AdminManager(store, live_brokers=lambda: None).create_topic("k", 1, 3, None)


def test_an_isr_only_change_does_not_wait_for_a_silent_follower_to_reach_clients():
    """Metadata waits for LeaderAndIsr answers only when they move a leader or epoch: a
    follower leaving the ISR reaches clients while that (paused) follower's LeaderAndIsr
    is still unanswered."""
    logic, store, transport, _ = make()
    store.add_topic("t", {0: [0, 1, 2]})
    logic.tick()
    logic.tick()
    transport.silent = {2}
    logic.alter_partition("t", 0, 0, 0, [0, 1], 0)
    logic.tick()
    assert transport.sent("leader_and_isr", broker=2)[-1].token not in transport.answers
    logic.tick()
    metadata = transport.sent("update_metadata")[-1].args[1]
    assert metadata["topics"]["t"][0]["isr"] == [0, 1]
