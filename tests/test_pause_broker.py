"""Cluster.pause_broker / resume_broker against a real cluster (local Ray, embedded
ZooKeeper): every process of the broker is stopped (state 'T') and answers nothing until it
is continued; the record of what was paused drives resume, kill and shutdown."""

from __future__ import annotations

import psutil
import pytest

from actors import Cluster
from actors.errors import BrokerNotAvailableError, IllegalStateError
from actors.protocol import replica_actor_name
from cluster_helpers import local_ray, ray, unique_namespace, wait_until

# a session long enough that a pause of a few seconds does not expire it
CONFIG = {"zookeeper.session.timeout.ms": 20000}
SHORT_S = 1.0


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811 - the module's Ray first
    c = Cluster.start(num_brokers=2, namespace=unique_namespace("pause"), config=CONFIG)
    c.admin().create_topic("paused", partitions=2, replication_factor=2)
    yield c
    c.shutdown()


def _stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def _answers(handle, method: str = "ping") -> bool:
    """Does the actor answer a call within SHORT_S?"""
    try:
        ray.get(getattr(handle, method).remote(), timeout=SHORT_S)
        return True
    except ray.exceptions.GetTimeoutError:
        return False


def test_a_paused_broker_stops_answering_and_answers_again_after_resume(cluster):
    """pause_broker stops the Broker, its controller and its replicas (state 'T', calls
    time out); resume_broker continues exactly those and they answer again."""
    procs = cluster.pause_broker(1)
    try:
        roles = sorted(p["role"] for p in procs)
        assert roles == ["broker", "controller", "replica", "replica"], procs
        assert all(_stopped(p["pid"]) for p in procs)
        assert cluster.paused_brokers() == [1]
        assert not _answers(cluster.broker(1))
        replica = ray.get_actor(replica_actor_name("paused", 0, 1), namespace=cluster.namespace)
        assert not _answers(replica, "ready")
        assert _answers(cluster.broker(0)), "the other broker runs on"
    finally:
        resumed = cluster.resume_broker(1)
    assert resumed == procs
    assert not any(_stopped(p["pid"]) for p in procs)
    assert wait_until(lambda: _answers(cluster.broker(1)), what="broker 1 answers")
    assert _answers(replica, "ready")
    assert cluster.paused_brokers() == []


def test_pausing_twice_or_resuming_a_running_broker_is_a_typed_error(cluster):
    """A second pause_broker of a paused broker, and resume_broker of one that is not
    paused, raise IllegalStateError; an unknown broker raises BrokerNotAvailableError."""
    with pytest.raises(IllegalStateError):
        cluster.resume_broker(0)
    cluster.pause_broker(0)
    try:
        with pytest.raises(IllegalStateError):
            cluster.pause_broker(0)
    finally:
        cluster.resume_broker(0)
    with pytest.raises(IllegalStateError):
        cluster.resume_broker(0)
    with pytest.raises(BrokerNotAvailableError):
        cluster.pause_broker(7)


def test_a_handle_from_connect_can_resume_what_another_paused(cluster):
    """What was paused is recorded with the cluster, not in one handle: a handle from
    Cluster.connect sees the paused broker and resumes it."""
    procs = cluster.pause_broker(1)
    other = Cluster.connect(cluster.namespace)
    try:
        assert other.paused_brokers() == [1]
    finally:
        other.resume_broker(1)
    assert not any(_stopped(p["pid"]) for p in procs)
    assert cluster.paused_brokers() == []


def test_shutdown_continues_paused_brokers_and_kill_ends_a_paused_one():
    """kill_broker of a paused broker ends its stopped processes; shutdown with a broker
    still paused continues it first and stops the cluster within its usual time."""
    c = Cluster.start(num_brokers=2, namespace=unique_namespace("pause-end"), config=CONFIG)
    try:
        c.admin().create_topic("p-end", partitions=2, replication_factor=1)
        killed = c.pause_broker(1)
        c.kill_broker(1)
        assert c.paused_brokers() == []
        wait_until(lambda: not any(psutil.pid_exists(p["pid"]) and not _zombie(p["pid"])
                                   for p in killed), timeout_s=30,
                   what="the paused broker's processes ended")
        paused = c.pause_broker(0)
    finally:
        c.shutdown()
    wait_until(lambda: not any(psutil.pid_exists(p["pid"]) and _stopped(p["pid"])
                               for p in paused), timeout_s=30,
               what="no process of the paused broker left stopped")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_every_process_of_a_broker_runs_at_the_priority_of_its_clients(cluster):
    """The Broker, controller and replica actors of a cluster on the Ray raykafka starts
    run at nice 0, not Ray's worker default of 15 (under which any busy client process
    took the CPU from them: acks=all latency grew twentyfold)."""
    procs = ray.get(cluster.broker(0).pids.remote(), timeout=60)
    assert sorted({p["role"] for p in procs}) == ["broker", "controller", "replica"]
    assert {p["name"]: psutil.Process(p["pid"]).nice() for p in procs} == \
        {p["name"]: 0 for p in procs}
