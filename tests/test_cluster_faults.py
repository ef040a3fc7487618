"""Faults against a real ZooKeeper and a local Ray: controller failover, a broker killed and
restarted, an expired ZooKeeper session, and ZooKeeper stopped for 10 s."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from actors import Cluster
from actors.errors import StaleControllerEpochError
from cluster_helpers import (FAST_CONFIG, local_ray, ray, unique_namespace,  # noqa: F401
                             wait_registered_with_controller, wait_until, zk_client, zk_json)
from storage.records import build, decode_records


@pytest.fixture
def cluster():
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("fault"), config=FAST_CONFIG)
    yield c
    c.shutdown()


def _produce(cluster, topic, partition, n, tag):
    """Produce ``n`` records through the leader; returns the acknowledged offsets."""
    leader = cluster.metadata.leader(topic, partition)
    res = ray.get(leader.handle.produce.remote(
        build([b"%s-%d" % (tag, i) for i in range(n)]), -1, 5000), timeout=30)
    return list(range(res.base_offset, res.last_offset + 1))


def _read_all(cluster, topic, partition):
    cluster.metadata.invalidate()
    leader = cluster.metadata.leader(topic, partition)
    out, offset = [], 0
    while True:
        res = ray.get(leader.handle.fetch.remote(offset, 1 << 20), timeout=30)
        recs = [r for r in decode_records(res.data) if r.offset >= offset]
        if not recs:
            return out
        out.extend(recs)
        offset = recs[-1].offset + 1


def test_killing_the_controller_broker_elects_a_standby_with_the_next_epoch(cluster):
    """The broker holding the controller role dies: another takes over with epoch + 1, the old
    epoch is fenced, the dead broker's partitions go offline and return with their data."""
    zk = zk_client(cluster)
    try:
        cluster.admin().create_topic("fo", partitions=3)
        old = zk_json(zk, "/controller")["brokerid"]
        epoch = int(zk.get("/controller_epoch")[0])
        led = [r["partition"] for r in cluster.admin().describe_topic("fo") if r["leader"] == old]
        acked = {p: _produce(cluster, "fo", p, 50, b"before") for p in led}
        cluster.kill_broker(old)
        def new_controller():
            if zk.exists("/controller") is None:
                return None
            bid = zk_json(zk, "/controller")["brokerid"]
            return (bid,) if bid != old else None  # a tuple: broker 0 must count as found
        (new,) = wait_until(new_controller, timeout_s=30, what="a new controller")
        assert int(zk.get("/controller_epoch")[0]) == epoch + 1
        assert new != old
        wait_until(lambda: all(cluster.metadata.refresh()["topics"]["fo"][p]["leader"] == -1
                               for p in led), what="partitions of the dead broker offline")
        survivor = [b for b in cluster.broker_ids() if b != old][0]
        wait_until(lambda: ray.get(cluster.broker(survivor).get_metadata.remote())
                   ["controller_epoch"] == epoch + 1, what="brokers learn the new epoch")
        with pytest.raises(StaleControllerEpochError):
            ray.get(cluster.broker(survivor).leader_and_isr.remote(epoch, []))
        cluster.start_broker(old)
        wait_until(lambda: all(cluster.metadata.refresh()["topics"]["fo"][p]["leader"] == old
                               for p in led), what="partitions back on the restarted broker")
        for p in led:
            got = _read_all(cluster, "fo", p)
            assert [r.offset for r in got] == acked[p]
            assert got[-1].value == b"before-49"
    finally:
        zk.stop()
        zk.close()


def test_killing_the_controller_actor_alone_moves_the_role_and_restarts_the_candidate(cluster):
    """ray.kill of the active Controller actor (its broker lives on): a standby becomes
    controller with epoch + 1 and the broker starts a fresh candidate of its own."""
    zk = zk_client(cluster)
    try:
        old = zk_json(zk, "/controller")["brokerid"]
        epoch = int(zk.get("/controller_epoch")[0])
        ray.kill(ray.get_actor(f"controller-{old}", namespace=cluster.namespace),
                 no_restart=True)
        wait_until(lambda: int(zk.get("/controller_epoch")[0]) == epoch + 1, timeout_s=30,
                   what="the next controller epoch")
        assert zk_json(zk, "/controller")["brokerid"] in cluster.broker_ids()
        wait_until(lambda: ray.get(ray.get_actor(f"controller-{old}",
                                                 namespace=cluster.namespace).status.remote(),
                                   timeout=10)["broker_id"] == old,
                   timeout_s=30, what="a new candidate on the old controller's broker")
        cluster.admin().create_topic("after-controller-kill", partitions=2)
    finally:
        zk.stop()
        zk.close()


def test_a_candidate_ray_does_not_know_by_its_name_leaves_the_election(cluster):
    """A Controller candidate Ray does not know by its broker's controller name (what a
    killed candidate whose process lives on is: Ray marks it dead and gives the name to the
    restarted broker's candidate; ray-project/ray#52322) closes its candidacy and its
    ZooKeeper session within seconds, so it can never keep /controller from the live
    candidates: its process ends; the cluster's controller stays as it was."""
    from actors.server.controller import ALIVE_CHECK_S, Controller
    zk = zk_client(cluster)
    try:
        holder = zk_json(zk, "/controller")["brokerid"]
        stray = ray.remote(Controller).options(num_cpus=0, max_concurrency=4).remote(
            holder, cluster._conf())

        def gone():
            try:
                ray.get(stray.status.remote(), timeout=10)
            except ray.exceptions.RayActorError as exc:
                assert "creation task" not in str(exc), exc    # it did start as a candidate
                return True
            return False
        wait_until(gone, timeout_s=ALIVE_CHECK_S * 5 + 10,
                   what="the stray candidate out of the election and gone")
        assert zk_json(zk, "/controller")["brokerid"] == holder
        live = ray.get(ray.get_actor(f"controller-{holder}",
                                     namespace=cluster.namespace).status.remote(), timeout=10)
        assert live["candidate_role"] == "active", live
    finally:
        zk.stop()
        zk.close()


def test_an_actor_holds_its_name_only_while_ray_gives_it_that_name():
    """raycompat.holds_own_name, which keeps a killed broker's supervisor from starting a
    controller candidate: True in the actor Ray knows by the name; False in another actor
    asking for that name, and for a name nobody holds (the one a ray.kill released)."""
    class Named:  # defined here: pickled by value, as no worker can import this module
        def holds(self, name, namespace):
            from actors import raycompat
            return raycompat.holds_own_name(name, namespace)

    ns = unique_namespace("named")
    owner = ray.remote(Named).options(name="owner", namespace=ns).remote()
    other = ray.remote(Named).options(namespace=ns).remote()
    try:
        assert ray.get(owner.holds.remote("owner", ns), timeout=30) is True
        assert ray.get(other.holds.remote("owner", ns), timeout=30) is False
        assert ray.get(owner.holds.remote("released", ns), timeout=30) is False
    finally:
        ray.kill(owner)
        ray.kill(other)


def test_an_expired_session_makes_the_broker_register_again(cluster):
    """Expire a broker's ZooKeeper session: its /brokers/ids node comes back under a new
    session, its partitions get a new leader epoch, and the broker keeps serving."""
    zk = zk_client(cluster)
    try:
        cluster.admin().create_topic("exp", partitions=3)
        p = [r["partition"] for r in cluster.admin().describe_topic("exp") if r["leader"] == 1][0]
        broker = cluster.broker(1)
        epoch_before = cluster.metadata.refresh()["topics"]["exp"][p]["leader_epoch"]
        sid = ray.get(broker.session_id.remote())
        password = ray.get(broker.session_password.remote())
        before = zk.exists("/brokers/ids/1")
        assert before.ephemeralOwner == sid
        twin = KazooClient(hosts=cluster.zk_hosts,
                           client_id=(sid, password), timeout=10.0)
        twin.start(timeout=15)
        twin.stop()  # closing the twin ends the shared session on the server
        twin.close()
        wait_until(lambda: (st := zk.exists("/brokers/ids/1")) is not None and
                   st.ephemeralOwner != sid, timeout_s=30, what="re-registration")
        wait_until(lambda: ray.get(broker.registered.remote()), what="registered flag")
        assert ray.get(broker.session_id.remote()) != sid
        # seen leaving or not, the new session means broker 1 leads again under a new
        # leader epoch (as in Kafka); both read from one snapshot
        def led_again_with_a_new_epoch():
            state = cluster.metadata.refresh()["topics"]["exp"][p]
            return state["leader"] == 1 and state["leader_epoch"] > epoch_before
        wait_until(led_again_with_a_new_epoch, what="broker 1 leading with a new epoch")
        assert wait_until(lambda: _produce(cluster, "exp", p, 10, b"after"),
                          what="produce after re-registration") == list(range(10))
    finally:
        zk.stop()
        zk.close()


def test_zookeeper_down_for_ten_seconds_loses_no_acknowledged_record(cluster):
    """Stop ZooKeeper for 10 s while producing: every acknowledged record is still there
    after it comes back, the brokers are registered again and topics can be created."""
    cluster.admin().create_topic("zkdown", partitions=3)
    acked = {p: _produce(cluster, "zkdown", p, 100, b"pre") for p in range(3)}
    server = cluster._zk_server
    server.stop()
    stopped_at = time.monotonic()
    while time.monotonic() - stopped_at < 10:  # produce all through the outage
        for p in range(3):
            acked[p] += _produce(cluster, "zkdown", p, 20, b"during")
    server.restart()
    for p in range(3):
        acked[p] += _produce(cluster, "zkdown", p, 10, b"post")
    wait_registered_with_controller(cluster, [0, 1, 2])
    for p in range(3):
        got = [r.offset for r in _read_all(cluster, "zkdown", p)]
        assert got == acked[p], f"partition {p} lost acknowledged records"
    cluster.admin().create_topic("after-outage", partitions=2)
    assert "after-outage" in cluster.admin().list_topics()


def test_a_topic_deleted_while_a_broker_is_down_and_recreated_does_not_reopen_old_data(cluster):
    """Delete a topic while one of its brokers is down and create it again: the returning
    broker drops its directory of the earlier incarnation (another topic id), so the new
    topic starts empty everywhere."""
    import os
    admin = cluster.admin()
    admin.create_topic("reborn", partitions=3)
    rows = admin.describe_topic("reborn")
    victim = rows[0]["leader"]
    mine = [r["partition"] for r in rows if r["leader"] == victim]
    for p in mine:
        _produce(cluster, "reborn", p, 20, b"old")
    old_dirs = [os.path.join(cluster.data_dir, f"broker-{victim}", f"reborn-{p}") for p in mine]
    assert all(os.path.isdir(d) for d in old_dirs)
    cluster.kill_broker(victim)
    wait_until(lambda: victim not in cluster.metadata.refresh()["brokers"], timeout_s=30,
               what="the killed broker's session to expire")
    admin.delete_topic("reborn")
    wait_until(lambda: "reborn" not in admin.list_topics(), what="the deletion to complete")
    assert all(os.path.isdir(d) for d in old_dirs), "a down broker cannot remove its data"
    admin.create_topic("reborn", partitions=3)
    cluster.start_broker(victim)
    wait_until(lambda: not any(os.path.isdir(d) and os.listdir(d) and
                               _topic_id_of(d) != _current_topic_id(cluster, "reborn")
                               for d in old_dirs), what="stale directories removed")
    for p in range(3):
        wait_until(lambda: cluster.metadata.refresh()["topics"]["reborn"][p]["leader"] >= 0,
                   what="the new topic online")
        assert _read_all(cluster, "reborn", p) == [], "the new incarnation starts empty"


def _topic_id_of(path):
    from actors.server.replica import read_partition_topic_id
    return read_partition_topic_id(path)


def _current_topic_id(cluster, topic):
    zk = zk_client(cluster)
    try:
        return f"{zk.exists(f'/brokers/topics/{topic}').czxid:x}"
    finally:
        zk.stop()
        zk.close()
