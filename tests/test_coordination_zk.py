"""coordination/ against a real ZooKeeper (Debian's jar via EmbeddedZooKeeper): the server
launcher, every znode and body as a plain kazoo client sees it, broker registration,
controller election and failover, conditional partition-state updates."""

import itertools
import json
import re
import threading

import pytest

from coordination import zk_layout as L
from coordination.election import ControllerCandidate, ControllerRole
from coordination.errors import (BrokerIdInUseError, ControllerMovedError,
                                 NodeAlreadyExistsError, NodeMissingError, VersionConflictError,
                                 ZkUnavailableError, ZooKeeperServerError)
from coordination.registry import BrokerRegistration
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore
from coordination.zk_server import EmbeddedZooKeeper
from zk_helpers import plain_client, start_zookeeper, wait_until

_ns = itertools.count()


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    server = start_zookeeper(tmp_path_factory.mktemp("zk"))
    yield server
    server.stop()


@pytest.fixture
def namespace():
    """A fresh chroot per test, so tests sharing the module's server never see each other."""
    return f"t{next(_ns)}"


@pytest.fixture
def clients(zk_server, namespace):
    """Factory of ZkClients in this test's namespace, all closed at teardown."""
    made = []

    def make(**kw):
        settings = ZkSettings(hosts=zk_server.hosts, namespace=namespace,
                              session_timeout_s=kw.pop("session_timeout_s", 6.0), **kw)
        client = connect(settings)
        made.append(client)
        return client
    yield make
    for client in made:
        client.close()


@pytest.fixture
def raw(zk_server, namespace):
    """A plain kazoo client and a reader of this namespace's nodes (path -> (bytes, stat))."""
    client = plain_client(zk_server.hosts)
    root = L.chroot_for(namespace)

    def read(path):
        return client.get(root + path)
    read.client = client
    read.root = root
    yield read
    client.stop()
    client.close()


# -- the server ---------------------------------------------------------------------------

def test_embedded_zookeeper_serves_on_loopback_and_restarts_on_same_port(tmp_path):
    """The server binds 127.0.0.1 on a free port, answers srvr, keeps data across restart,
    and a detached server can be found and stopped by its pid file."""
    zk = EmbeddedZooKeeper(tmp_path / "zk").start(timeout_s=30)
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", zk.hosts)
        assert "Mode: standalone" in zk.server_info()
        assert "3.8" in zk.server_info()
        client = plain_client(zk.hosts)
        client.create("/keep", b"v")
        client.stop()
        client.close()
        port, pid = zk.port, zk.pid
        zk.restart(timeout_s=30)
        assert zk.port == port and zk.pid != pid
        client = plain_client(zk.hosts)
        assert client.get("/keep")[0] == b"v"
        client.stop()
        client.close()
        with pytest.raises(ZooKeeperServerError, match="already runs"):
            EmbeddedZooKeeper(tmp_path / "zk").start(timeout_s=5)
    finally:
        zk.stop()
    assert not zk.is_running()
    assert EmbeddedZooKeeper.attach(tmp_path / "zk") is None

    detached = EmbeddedZooKeeper(tmp_path / "zk").start(timeout_s=30, detached=True)
    found = EmbeddedZooKeeper.attach(tmp_path / "zk")
    assert found is not None and (found.pid, found.port) == (detached.pid, detached.port)
    found.stop()
    assert not detached.is_running()
    assert not (tmp_path / "zk" / "zookeeper.pid").exists()
    assert (tmp_path / "zk" / "zookeeper.log").stat().st_size > 0


def test_unreachable_zookeeper_is_a_typed_error(tmp_path):
    """Connecting to a port nobody serves raises ZkUnavailableError within the deadline."""
    from coordination.zk_server import free_port
    with pytest.raises(ZkUnavailableError):
        connect(ZkSettings(hosts=f"127.0.0.1:{free_port()}", connect_timeout_s=1.0))


# -- layout as written --------------------------------------------------------------------

def test_cluster_id_is_created_once_and_stable(clients, raw):
    """/cluster/id is created by the first caller, as {"version":"1","id":<22 chars>}, and
    every later or concurrent caller gets the same id."""
    stores = [ZkStore(clients()) for _ in range(4)]
    ids = []
    threads = [threading.Thread(target=lambda s=s: ids.append(s.get_or_create_cluster_id()))
               for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(ids) == 4 and len(set(ids)) == 1
    body = json.loads(raw(L.CLUSTER_ID_PATH)[0])
    assert body == {"version": "1", "id": ids[0]}
    assert re.fullmatch(r"[a-zA-Z0-9_-]{22}", ids[0])
    assert raw(L.CLUSTER_ID_PATH)[1].version == 0
    assert ZkStore(clients()).get_or_create_cluster_id() == ids[0]


def test_topic_nodes_and_bodies_as_kafka_writes_them(clients, raw):
    """create_topic writes /brokers/topics/<t> and /config/topics/<t>; partition state,
    admin requests and consumer nodes land at the seed's paths with the seed's bodies."""
    store = ZkStore(clients())
    store.create_topic("events", {0: [1, 2], 1: [2, 1]}, {"retention.ms": 1000})
    assert json.loads(raw("/brokers/topics/events")[0]) == \
        {"version": 1, "partitions": {"0": [1, 2], "1": [2, 1]}}
    assert json.loads(raw("/config/topics/events")[0]) == \
        {"version": 1, "config": {"retention.ms": "1000"}}
    with pytest.raises(NodeAlreadyExistsError):
        store.create_topic("events", {0: [1]})
    assert store.topics() == ["events"]
    assert store.get_topic_assignment("events")[0] == {0: (1, 2), 1: (2, 1)}

    state = L.PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1)
    store.create_partition_state("events", 0, state)
    assert json.loads(raw("/brokers/topics/events/partitions/0/state")[0]) == \
        {"controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0, "isr": [1, 2]}

    store.set_topic_config("events", {"retention.ms": 5})
    changes = raw.client.get_children(raw.root + "/config/changes")
    assert len(changes) == 1 and changes[0].startswith("config_change_")
    assert json.loads(raw("/config/changes/" + changes[0])[0]) == \
        {"version": 2, "entity_path": "topics/events"}

    store.request_reassignment({("events", 1): [1, 2]})
    assert json.loads(raw("/admin/reassign_partitions")[0]) == \
        {"version": 1, "partitions": [{"topic": "events", "partition": 1, "replicas": [1, 2]}]}
    with pytest.raises(NodeAlreadyExistsError):
        store.request_reassignment({("events", 0): [2, 1]})
    store.complete_reassignment()
    store.request_preferred_replica_election([("events", 0)])
    assert json.loads(raw("/admin/preferred_replica_election")[0]) == \
        {"version": 1, "partitions": [{"topic": "events", "partition": 0}]}
    path = store.notify_isr_change([("events", 0)])
    assert path.startswith("/isr_change_notification/isr_change_")

    store.register_consumer("g", "g_host-1-abcd", L.ConsumerRegistration(
        subscription={"events": 1}, timestamp_ms=7))
    data, stat = raw("/consumers/g/ids/g_host-1-abcd")
    assert json.loads(data) == {"version": 1, "subscription": {"events": 1},
                                "pattern": "static", "timestamp": "7"}
    assert stat.ephemeralOwner != 0
    assert store.claim_partition("g", "events", 0, "g_host-1-abcd-0")
    assert raw("/consumers/g/owners/events/0")[0] == b"g_host-1-abcd-0"
    assert not ZkStore(clients()).claim_partition("g", "events", 0, "other-0")
    store.commit_offset("g", "events", 0, 42)
    store.commit_offset("g", "events", 0, 43)
    assert raw("/consumers/g/offsets/events/0")[0] == b"43"
    assert store.fetch_offset("g", "events", 0) == 43

    store.request_topic_deletion("events")
    assert raw("/admin/delete_topics/events")[0] == b""
    assert store.pending_topic_deletions() == ["events"]
    store.complete_topic_deletion("events")
    assert store.topics() == [] and store.pending_topic_deletions() == []
    with pytest.raises(NodeMissingError):
        store.request_topic_deletion("events")


def test_a_recreated_topic_has_another_topic_id(clients):
    """get_topic's topic id (the topic znode's creation zxid) is stable while the topic
    lives and differs for a topic deleted and created again under the same name."""
    store = ZkStore(clients())
    store.create_topic("again", {0: [1]})
    first = store.get_topic("again")
    assert first[0] == {0: (1,)} and store.get_topic("again")[2] == first[2]
    store.request_topic_deletion("again")
    store.complete_topic_deletion("again")
    store.create_topic("again", {0: [1]})
    assert store.get_topic("again")[2] != first[2]


def test_config_change_notifications_are_purged_when_expired(clients):
    """purge_config_changes deletes the /config/changes notifications older than the given
    age and keeps the younger ones."""
    store = ZkStore(clients())
    store.create_topic("cfg", {0: [1]})
    for i in range(3):
        store.set_topic_config("cfg", {"retention.ms": i + 1})
    assert len(store.config_changes()) == 3
    assert store.purge_config_changes(15 * 60 * 1000) == 0, "young ones stay"
    assert len(store.config_changes()) == 3
    later = L.now_ms() + 16 * 60 * 1000
    assert store.purge_config_changes(15 * 60 * 1000, now_ms=later) == 3
    assert store.config_changes() == []


def test_namespaces_do_not_see_each_other(zk_server, raw):
    """Two namespaces on one server: same paths, separate data (chroot /raykafka-<ns>)."""
    a = connect(ZkSettings(hosts=zk_server.hosts, namespace="iso-a"))
    b = connect(ZkSettings(hosts=zk_server.hosts, namespace="iso-b"))
    try:
        ZkStore(a).create_topic("same", {0: [1]})
        ZkStore(b).create_topic("same", {0: [2], 1: [2]})
        assert ZkStore(a).get_topic_assignment("same")[0] == {0: (1,)}
        assert ZkStore(b).get_topic_assignment("same")[0] == {0: (2,), 1: (2,)}
        assert raw.client.exists("/raykafka-iso-a/brokers/topics/same")
        assert raw.client.exists("/brokers") is None   # nothing leaks to the server's root
    finally:
        a.close()
        b.close()


# -- conditional partition-state updates ----------------------------------------------------

def test_partition_state_update_is_conditional_on_zk_version(clients):
    """update_partition_state returns the new version; a stale version raises
    VersionConflictError and leaves the node unchanged."""
    store = ZkStore(clients())
    s0 = L.PartitionState(leader=1, leader_epoch=0, isr=(1, 2, 3), controller_epoch=1)
    store.create_partition_state("t", 0, s0)
    state, version = store.get_partition_state("t", 0)
    assert (state, version) == (s0, 0)
    s1 = L.PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1)
    assert store.update_partition_state("t", 0, s1, expected_version=0) == 1
    with pytest.raises(VersionConflictError):
        store.update_partition_state("t", 0, s0, expected_version=0)
    assert store.get_partition_state("t", 0) == (s1, 1)
    with pytest.raises(NodeMissingError):
        store.get_partition_state("t", 9)


def test_partition_states_read_together_are_each_partitions_state(clients):
    """get_partition_states (one pipelined round of reads) gives what get_partition_state
    gives for each partition, versions included, and leaves out partitions without one."""
    store = ZkStore(clients())
    for p in range(40):
        store.create_partition_state("many", p, L.PartitionState(
            leader=p % 3, leader_epoch=p, isr=(p % 3,), controller_epoch=1))
    store.update_partition_state("many", 7, L.PartitionState(
        leader=2, leader_epoch=8, isr=(2,), controller_epoch=1), expected_version=0)
    got = store.get_partition_states("many", range(45))
    assert sorted(got) == list(range(40))
    assert got == {p: store.get_partition_state("many", p) for p in range(40)}
    assert got[7][1] == 1
    assert store.get_partition_states("none-such", [0, 1]) == {}


def test_partition_state_write_is_fenced_by_controller_epoch(clients):
    """A write guarded by the epoch's zk version fails with ControllerMovedError once another
    controller has been elected; the new controller's write succeeds."""
    c1, c2 = clients(), clients()
    first = ControllerCandidate(c1, broker_id=1).start()
    assert first.wait_active(timeout_s=10)
    store = ZkStore(c1)
    state = L.PartitionState(leader=1, leader_epoch=0, isr=(1,), controller_epoch=first.epoch)
    store.create_partition_state("t", 0, state)
    old_epoch_version = first.epoch_zk_version
    second = ControllerCandidate(c2, broker_id=2).start()
    first.close()
    assert second.wait_active(timeout_s=10)
    with pytest.raises(ControllerMovedError):
        store.update_partition_state("t", 0, state, expected_version=0,
                                     controller_epoch_zk_version=old_epoch_version)
    new_state = L.PartitionState(leader=1, leader_epoch=1, isr=(1,), controller_epoch=second.epoch)
    assert ZkStore(c2).update_partition_state(
        "t", 0, new_state, expected_version=0,
        controller_epoch_zk_version=second.epoch_zk_version) == 1
    second.close()


# -- broker registration --------------------------------------------------------------------

def test_broker_registers_ephemeral_node_with_endpoints_and_rack(clients, raw):
    """/brokers/ids/<id> is ephemeral, owned by the broker's session, with the v4 body; a
    clean close removes it."""
    zk = clients()
    reg = BrokerRegistration(zk, L.BrokerInfo(broker_id=7, host="127.0.0.1", port=9092,
                                              rack="r1"))
    reg.start(timeout_s=10)
    data, stat = raw("/brokers/ids/7")
    body = json.loads(data)
    assert stat.ephemeralOwner == zk.session_id
    assert body["version"] == 4 and body["host"] == "127.0.0.1" and body["port"] == 9092
    assert body["endpoints"] == ["PLAINTEXT://127.0.0.1:9092"] and body["rack"] == "r1"
    assert body["jmx_port"] == -1 and body["timestamp"].isdigit()
    assert ZkStore(zk).broker_ids() == [7]
    assert ZkStore(zk).get_brokers()[7].rack == "r1"
    reg.close()
    assert raw.client.exists(raw.root + "/brokers/ids/7") is None


def test_duplicate_broker_id_fails_with_a_typed_error(clients, raw):
    """A second session registering an id in use gets BrokerIdInUseError; the first keeps
    its node."""
    first_zk, second_zk = clients(), clients()
    first = BrokerRegistration(first_zk, L.BrokerInfo(broker_id=1, host="a", port=1))
    first.start(timeout_s=10)
    with pytest.raises(BrokerIdInUseError, match="broker id 1 is already registered"):
        BrokerRegistration(second_zk, L.BrokerInfo(broker_id=1, host="b", port=2)).start(
            timeout_s=10)
    data, stat = raw("/brokers/ids/1")
    assert json.loads(data)["host"] == "a" and stat.ephemeralOwner == first_zk.session_id
    first.close()


def test_broker_node_vanishes_when_its_session_closes(clients, raw):
    """Closing the broker's session (no clean deregistration) removes its node."""
    zk = clients()
    BrokerRegistration(zk, L.BrokerInfo(broker_id=3, host="a", port=1)).start(timeout_s=10)
    zk.close()
    assert raw.client.exists(raw.root + "/brokers/ids/3") is None


# -- controller election ---------------------------------------------------------------------

def test_first_controller_gets_epoch_1_and_writes_seed_body(clients, raw):
    """One of three candidates becomes active with epoch 1; /controller names it with the
    seed's body; the others are followers that know who leads."""
    candidates = [ControllerCandidate(clients(), broker_id=b).start() for b in (1, 2, 3)]
    wait_until(lambda: sum(c.is_active for c in candidates) == 1, timeout_s=10,
               what="one active controller")
    active = next(c for c in candidates if c.is_active)
    assert active.epoch == 1
    body = json.loads(raw("/controller")[0])
    assert set(body) == {"version", "brokerid", "timestamp"}
    assert body["version"] == 1 and body["brokerid"] == active.broker_id
    assert body["timestamp"].isdigit()
    assert raw("/controller")[1].ephemeralOwner == active.zk.session_id
    assert raw("/controller_epoch")[0] == b"1"
    wait_until(lambda: all(c.status().controller_id == active.broker_id for c in candidates),
               timeout_s=10, what="followers know the controller")
    assert [c.status().role for c in candidates].count(ControllerRole.FOLLOWER) == 2
    for c in candidates:
        c.close()


def test_failover_when_the_active_controllers_session_closes(clients, raw):
    """Closing the active candidate's client makes another active with epoch+1, each
    failover exactly once, with callbacks on the candidate's thread."""
    events = []
    zks = {b: clients() for b in (1, 2, 3)}
    candidates = {b: ControllerCandidate(
        zks[b], broker_id=b, on_elected=lambda e, b=b: events.append(("elected", b, e)),
        on_resigned=lambda b=b: events.append(("resigned", b))).start() for b in zks}
    epochs = []
    for _ in range(2):
        wait_until(lambda: sum(c.is_active for c in candidates.values()) == 1, timeout_s=10,
                   what="one active controller")
        active = next(b for b, c in candidates.items() if c.is_active)
        epochs.append(candidates[active].epoch)
        zks[active].close()   # abrupt: the session ends, /controller goes with it
        del candidates[active]
    wait_until(lambda: sum(c.is_active for c in candidates.values()) == 1, timeout_s=10,
               what="third controller")
    last = next(c for c in candidates.values() if c.is_active)
    epochs.append(last.epoch)
    assert epochs == [1, 2, 3]
    assert raw("/controller_epoch")[0] == b"3"
    assert json.loads(raw("/controller")[0])["brokerid"] == last.broker_id
    assert [e for e in events if e[0] == "elected"] == [
        ("elected", b, e) for b, e in zip([x[1] for x in events if x[0] == "elected"], [1, 2, 3])]
    last.close()
    assert ("resigned", last.broker_id) in events
