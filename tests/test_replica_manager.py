"""ReplicaManager with in-process PartitionReplicas (no Ray): how a broker applies the
controller's LeaderAndIsr and StopReplica requests, and what its lock guards."""

from __future__ import annotations

import os
import threading

import pytest

from actors.errors import StaleControllerEpochError
from actors.protocol import ReplicaRole
from actors.server.replica import PartitionReplica
from actors.server.replica_manager import ReplicaManager


class InProcessActors:
    """ReplicaActors with plain PartitionReplica objects; ``gate[(topic, p)]`` (an Event)
    holds that replica's role change until set."""

    def __init__(self, broker_id: int, data_dir: str):
        self.broker_id, self.data_dir = broker_id, data_dir
        self.created, self.stopped, self.reconfigured = [], [], []
        self.gate: dict[tuple[str, int], threading.Event] = {}

    def create(self, topic, partition, log_config, min_isr, topic_id):
        self.created.append((topic, partition, topic_id))
        return PartitionReplica(topic, partition, self.broker_id, self.data_dir, log_config,
                                min_isr, topic_id)

    def wait_ready(self, handles, timeout_s):
        return [(True, h.ready()) for h in handles]

    def become(self, calls, timeout_s):
        out = []
        for h, p, leader in calls:
            gate = self.gate.get((h.topic, h.partition))
            if gate is not None:
                assert gate.wait(10), "test gate never opened"
            try:
                if leader:
                    out.append((True, h.become_leader(p["leader_epoch"], p["isr"], p["replicas"])))
                else:
                    out.append((True, h.become_follower(p["leader"], p["leader_epoch"], p["isr"],
                                                        p["replicas"])))
            except Exception as exc:  # noqa: BLE001
                out.append((False, exc))
        return out

    def update_config(self, calls, timeout_s):
        self.reconfigured += [(h.topic, h.partition) for h, _, _ in calls]
        return [(True, h.update_config(c, m)) for h, c, m in calls]

    def stop(self, topic, partition, handle, delete):
        self.stopped.append((topic, partition, delete))
        handle.stop(delete)


def entry(topic, p, leader, epoch, isr, replicas=None, config=None, topic_id="a1"):
    return {"topic": topic, "partition": p, "leader": leader, "leader_epoch": epoch,
            "isr": list(isr), "replicas": list(replicas or isr), "config": config or {},
            "topic_id": topic_id}


@pytest.fixture
def manager(tmp_path):
    actors = InProcessActors(0, str(tmp_path))
    rm = ReplicaManager(0, str(tmp_path), {"min.insync.replicas": "1"}, actors)
    yield rm
    rm.shutdown()


def test_leader_and_isr_creates_replicas_and_sets_their_roles(manager):
    """Missing replicas are created; the one this broker leads becomes LEADER, the other
    FOLLOWER (of broker 1); every row answers without error."""
    rows = manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0, 1]), entry("t", 1, 1, 0, [1, 0])], 1)
    assert rows == [{"topic": "t", "partition": 0, "error": None},
                    {"topic": "t", "partition": 1, "error": None}]
    h = manager.handles()
    assert h[("t", 0)].role == ReplicaRole.LEADER and h[("t", 0)].state()["is_leader"]
    assert h[("t", 1)].role == ReplicaRole.FOLLOWER and h[("t", 1)].state()["role"] == "follower"
    assert h[("t", 1)].leader_id == 1


def test_an_older_controller_epoch_is_refused(manager):
    """A request from a controller older than the newest seen raises
    StaleControllerEpochError and changes nothing."""
    manager.leader_and_isr(5, [entry("t", 0, 0, 0, [0])], 1)
    with pytest.raises(StaleControllerEpochError):
        manager.leader_and_isr(4, [entry("t", 0, 0, 1, [0])], 9)
    with pytest.raises(StaleControllerEpochError):
        manager.stop_replicas(4, [("t", 0)], True, 9)
    assert manager.handles()[("t", 0)].leader_epoch == 0


def test_a_late_older_request_does_not_undo_a_newer_one(manager):
    """A LeaderAndIsr with an older request id than the last one applied to a partition (a
    request the controller abandoned that runs late) is refused for that partition only."""
    manager.leader_and_isr(1, [entry("t", 0, 0, 3, [0, 1])], 7)
    rows = manager.leader_and_isr(1, [entry("t", 0, 0, 3, [0, 1, 2]), entry("t", 1, 0, 0, [0])], 6)
    assert rows[0]["error"].startswith("StaleRequest") and rows[1]["error"] is None
    assert manager.handles()[("t", 0)].isr == [0, 1]


def test_a_stopped_partition_is_not_brought_back_by_a_late_leader_and_isr(manager, tmp_path):
    """StopReplica (delete) stops the replica and removes its directory; a LeaderAndIsr sent
    before it that arrives after it does not recreate the replica."""
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0])], 1)
    assert os.path.isdir(tmp_path / "t-0")
    manager.stop_replicas(1, [("t", 0)], True, 3)
    assert not os.path.exists(tmp_path / "t-0") and manager.handles() == {}
    rows = manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0])], 2)
    assert rows[0]["error"].startswith("StaleRequest") and manager.handles() == {}


def test_a_changed_topic_config_is_applied_in_place(manager):
    """A new topic config (min.insync.replicas included) reconfigures the running replica;
    the same config again does nothing."""
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0])], 1)
    first = manager.handles()[("t", 0)]
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0], config={"min.insync.replicas": "2",
                                                                 "retention.ms": "5000"})], 2)
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0], config={"min.insync.replicas": "2",
                                                                 "retention.ms": "5000"})], 3)
    assert manager.handles()[("t", 0)] is first
    assert first.min_insync_replicas == 2 and first.config.retention_ms == 5000
    assert manager.actors.reconfigured == [("t", 0)]


def test_a_replica_of_an_earlier_topic_incarnation_is_replaced_with_its_data(manager):
    """A LeaderAndIsr naming another topic id stops the old replica with delete=True before
    starting the new one."""
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0], topic_id="a1")], 1)
    manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0], topic_id="b2")], 2)
    assert manager.actors.stopped == [("t", 0, True)]
    assert manager.handles()[("t", 0)].topic_id == "b2"


def test_a_replica_that_cannot_start_fails_its_row_only(manager):
    """A replica whose creation fails answers an error in its own row; the others apply."""
    real = manager.actors.create

    def create(topic, partition, *args):
        if partition == 1:
            raise ValueError("actor name still taken")
        return real(topic, partition, *args)
    manager.actors.create = create
    rows = manager.leader_and_isr(1, [entry("t", 0, 0, 0, [0]), entry("t", 1, 0, 0, [0])], 1)
    assert rows[0]["error"] is None and "ValueError" in rows[1]["error"]


def test_the_map_lock_is_never_held_while_a_replica_is_called(manager):
    """While one partition's role change is stuck in its replica, the broker still lists its
    replicas, applies LeaderAndIsr for another partition and stops a third: only requests
    for the same partition wait."""
    manager.leader_and_isr(1, [entry("t", 2, 0, 0, [0])], 1)
    manager.actors.gate[("t", 0)] = gate = threading.Event()
    stuck = threading.Thread(target=manager.leader_and_isr,
                             args=(1, [entry("t", 0, 0, 0, [0])], 2))
    stuck.start()
    try:
        rows = manager.leader_and_isr(1, [entry("t", 1, 0, 0, [0])], 3)
        assert rows[0]["error"] is None
        manager.stop_replicas(1, [("t", 2)], False, 4)
        assert set(manager.handles()) == {("t", 0), ("t", 1)}
        assert stuck.is_alive()
    finally:
        gate.set()
        stuck.join(10)
    assert manager.handles()[("t", 0)].role == ReplicaRole.LEADER
