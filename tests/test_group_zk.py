"""Consumer groups and ZooKeeper (seed 000 5.6, seed 001 2.6-2.10) against a real cluster
(ZooKeeper, local Ray, RF=3 __consumer_offsets), one for the whole module:
offsets_storage="zookeeper", dual_commit, and the seed's registry of consumer ids and
partition owners, read back with a plain kazoo client; deleting and expiring
ZooKeeper-stored offsets (issue 9, test 5)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors import Cluster
from actors.client.group import GroupMember
from actors.client.zk_consumer import ConsumerZk, new_consumer_id
from actors.errors import (IllegalGenerationError, InvalidConfigurationError,
                           NonEmptyGroupError, ZooKeeperUnavailableError)
from cluster_helpers import FAST_CONFIG, ray, unique_namespace, wait_until, zk_client, zk_json
from cluster_helpers import local_ray  # noqa: F401 - autouse: this module's Ray

CONFIG = {**FAST_CONFIG, "offsets.topic.num.partitions": 2,
          "offsets.topic.replication.factor": 3, "group.initial.rebalance.delay.ms": 0,
          "group.min.session.timeout.ms": 1000}
SESSION_MS = 3000


@pytest.fixture(scope="module")
def cluster():
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("gzk"), config=CONFIG)
    c.admin().create_topic("ev", partitions=4, replication_factor=1)
    with c.producer() as producer:
        for f in [producer.send("ev", b"e-%d-%d" % (p, i), partition=p)
                  for p in range(4) for i in range(10)]:
            f.get(timeout=60)
    yield c
    c.shutdown()


@pytest.fixture
def zk(cluster):
    client = zk_client(cluster)
    yield client
    client.stop()
    client.close()


def consumer(cluster, group, **kw):
    conf = dict(group_id=group, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=300)
    conf.update(kw)
    return cluster.consumer(**conf)


def read_all(c, n, timeout_s=60.0) -> list:
    out = []
    wait_until(lambda: out.extend(r for recs in c.poll(timeout_ms=200).values()
                                  for r in recs) or len(out) >= n,
               timeout_s=timeout_s, what=f"{n} records")
    return out


def kafka_committed(cluster, group) -> dict:
    """What the coordinator (__consumer_offsets) holds for ``group``."""
    return GroupMember(cluster.metadata, group).committed()


def test_zookeeper_storage_writes_the_seeds_offset_nodes_and_resumes_from_them(cluster, zk):
    """offsets_storage="zookeeper": commit writes /consumers/<g>/offsets/<t>/<p> as a
    decimal string, __consumer_offsets gets nothing, committed() reads ZooKeeper, and a
    new consumer of the group starts at those offsets."""
    c = consumer(cluster, "zk-store", offsets_storage="zookeeper", enable_auto_commit=False)
    try:
        c.subscribe(["ev"])
        assert len(read_all(c, 40)) == 40
        c.commit({("ev", p): 3 + p for p in range(4)})
        for p in range(4):
            data, stat = zk.get(f"/consumers/zk-store/offsets/ev/{p}")
            assert data == str(3 + p).encode() and stat.ephemeralOwner == 0
        assert {p: c.committed(("ev", p)) for p in range(4)} == {p: 3 + p for p in range(4)}
        assert kafka_committed(cluster, "zk-store") == {}
    finally:
        c.close()
    zk.set("/consumers/zk-store/offsets/ev/0", b"8")        # e.g. an old consumer's commit
    again = consumer(cluster, "zk-store", offsets_storage="zookeeper", enable_auto_commit=False)
    try:
        again.subscribe(["ev"])
        first = {}
        for r in read_all(again, (10 - 8) + (10 - 4) + (10 - 5) + (10 - 6)):
            first.setdefault(r.partition, r.offset)
        assert first == {0: 8, 1: 4, 2: 5, 3: 6}
    finally:
        again.close()


def test_an_older_generation_cannot_commit_to_zookeeper(cluster, zk):
    """With ZooKeeper storage the coordinator still fences: a member of an older
    generation is refused (IllegalGenerationError) and the offset node keeps the current
    generation's value."""
    store = ConsumerZk(cluster.zk_hosts, "zk-fence", new_consumer_id("zk-fence"))

    def member():
        return GroupMember(cluster.metadata, "zk-fence", session_timeout_ms=SESSION_MS,
                           rebalance_timeout_ms=10_000, offsets_storage="zookeeper", zk=store)
    try:
        a = member()
        a.join(["ev"])
        old_generation = a.generation
        a.commit({("ev", 0): 5})
        b = member()
        joined = threading.Thread(target=b.join, args=(["ev"],))
        joined.start()
        wait_until(lambda: not a.heartbeat(), what="a rebalance")
        a.join(["ev"])
        joined.join(timeout=60)
        assert a.generation > old_generation
        stale = GroupMember(cluster.metadata, "zk-fence", offsets_storage="zookeeper", zk=store)
        stale.member_id, stale.generation = a.member_id, old_generation
        with pytest.raises(IllegalGenerationError):
            stale.commit({("ev", 0): 1})
        assert zk.get("/consumers/zk-fence/offsets/ev/0")[0] == b"5"
        owner = a if ("ev", 0) in a.assignment else b
        owner.commit({("ev", 0): 7})
        assert zk.get("/consumers/zk-fence/offsets/ev/0")[0] == b"7"
    finally:
        store.close()


def test_dual_commit_writes_both_and_reads_the_larger(cluster, zk):
    """dual_commit=True with kafka storage: a commit lands in __consumer_offsets and in
    ZooKeeper; committed() answers the larger of the two, whichever store has it (seed
    000's migration)."""
    c = consumer(cluster, "zk-dual", dual_commit=True, enable_auto_commit=False)
    try:
        c.subscribe(["ev"])
        read_all(c, 40)
        c.commit({("ev", p): 2 for p in range(4)})
        assert kafka_committed(cluster, "zk-dual") == {("ev", p): 2 for p in range(4)}
        assert [zk.get(f"/consumers/zk-dual/offsets/ev/{p}")[0] for p in range(4)] == [b"2"] * 4
        zk.set("/consumers/zk-dual/offsets/ev/1", b"9")           # ZooKeeper ahead
        assert c.committed(("ev", 1)) == 9
        c.commit({("ev", 2): 6})
        zk.set("/consumers/zk-dual/offsets/ev/2", b"4")           # Kafka ahead
        assert c.committed(("ev", 2)) == 6
        assert c.committed(("ev", 3)) == 2
    finally:
        c.close()
    with pytest.raises(InvalidConfigurationError):
        consumer(cluster, "zk-bad", offsets_storage="s3")


def test_describe_and_list_show_zookeeper_stored_offsets(cluster, zk):
    """Admin.list_groups names a group whose offsets live only in ZooKeeper, and
    describe_group shows them (kafka None, zookeeper set, committed the larger of the two,
    lag from the log end); a dual-commit group shows both stores."""
    c = consumer(cluster, "zk-desc", offsets_storage="zookeeper", enable_auto_commit=False)
    try:
        c.subscribe(["ev"])
        read_all(c, 40)
        c.commit({("ev", p): 4 for p in range(4)})
    finally:
        c.close()
    admin = cluster.admin()
    assert "zk-desc" in admin.list_groups()
    desc = admin.describe_group("zk-desc")
    assert desc["zookeeper_error"] is None and desc["members"] == {}
    assert desc["offsets"] == {("ev", p): {"committed": 4, "kafka": None, "zookeeper": 4,
                                           "log_end": 10, "lag": 6} for p in range(4)}
    zk.set("/consumers/zk-dual/offsets/ev/1", b"9")
    both = admin.describe_group("zk-dual")["offsets"][("ev", 1)]
    assert (both["zookeeper"], both["committed"]) == (9, max(9, both["kafka"]))


def owners(zk, group, topic="ev", partitions=range(4)) -> dict:
    out = {}
    for p in partitions:
        path = f"/consumers/{group}/owners/{topic}/{p}"
        if zk.exists(path):
            out[p] = zk.get(path)[0].decode()
    return out


def test_the_registry_shows_members_and_owners_as_ephemeral_nodes(cluster, zk):
    """Two consumers of a group: each registers /consumers/<g>/ids/<id> (ephemeral, the
    seed's JSON) and owns its assigned partitions as ephemeral owner nodes; when one
    closes, its id node goes and the survivor owns every partition in ZooKeeper."""
    a, b = consumer(cluster, "zk-reg"), consumer(cluster, "zk-reg")
    stop = threading.Event()

    def run(c):
        while not stop.is_set():
            c.poll(timeout_ms=100)
    tb = threading.Thread(target=run, args=(b,), daemon=True)
    try:
        a.subscribe(["ev"])
        b.subscribe(["ev"])
        tb.start()

        def split():
            a.poll(timeout_ms=100)
            mine = {cid: {p for (_, p) in c.assignment()}
                    for cid, c in ((a.consumer_id, a), (b.consumer_id, b))}
            want = {p: f"{cid}-0" for cid, ps in mine.items() for p in ps}
            return (all(mine.values()) and len(want) == 4 and owners(zk, "zk-reg") == want)
        wait_until(split, timeout_s=60, what="owner nodes matching both assignments")
        for c in (a, b):
            path = f"/consumers/zk-reg/ids/{c.consumer_id}"
            reg = zk_json(zk, path)
            assert reg["version"] == 1 and reg["subscription"] == {"ev": 1}
            assert reg["pattern"] == "static" and reg["timestamp"].isdigit()
            assert zk.exists(path).ephemeralOwner != 0
        assert all(zk.exists(f"/consumers/zk-reg/owners/ev/{p}").ephemeralOwner != 0
                   for p in range(4))
        stop.set()
        tb.join(timeout=30)
        b.close()
        assert not zk.exists(f"/consumers/zk-reg/ids/{b.consumer_id}")
        wait_until(lambda: a.poll(timeout_ms=100) is not None and owners(zk, "zk-reg") ==
                   {p: f"{a.consumer_id}-0" for p in range(4)}, timeout_s=60,
                   what="the survivor owning every partition in ZooKeeper")
        assert zk.get_children("/consumers/zk-reg/ids") == [a.consumer_id]
    finally:
        stop.set()
        a.close()
        b.close()
    assert owners(zk, "zk-reg") == {}
    assert zk.get_children("/consumers/zk-reg/ids") == []


def test_a_pattern_subscription_registers_as_a_white_list(cluster, zk):
    """subscribe(pattern=...) registers the regex with pattern "white_list"."""
    c = consumer(cluster, "zk-pat")
    try:
        c.subscribe(pattern="e.*")
        c.poll(timeout_ms=100)
        reg = wait_until(lambda: zk_json(zk, f"/consumers/zk-pat/ids/{c.consumer_id}"),
                         what="the registration")
        assert (reg["pattern"], reg["subscription"]) == ("white_list", {"e.*": 1})
    finally:
        c.close()


@ray.remote(num_cpus=0)
class Member:
    """A consumer of group zk-kill in its own process, polling on its own thread (killed
    by the test)."""

    def __init__(self, namespace):
        self.cluster = Cluster.connect(namespace=namespace)
        self.c = self.cluster.consumer(group_id="zk-kill", auto_offset_reset="earliest",
                                       session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
        self.c.subscribe(["ev"])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            self.c.poll(timeout_ms=100)

    def state(self):
        return self.c.consumer_id, sorted(p for _, p in self.c.assignment())


def test_a_killed_members_nodes_expire_and_its_partitions_change_owner(cluster, zk):
    """A member actor killed abruptly: its ZooKeeper session expires, so its ephemeral id
    node goes, and the survivor's owner nodes cover every partition."""
    actor = Member.remote(cluster.namespace)
    survivor = consumer(cluster, "zk-kill")
    stop = threading.Event()

    def run():
        while not stop.is_set():
            survivor.poll(timeout_ms=100)
    poller = threading.Thread(target=run, daemon=True)
    try:
        survivor.subscribe(["ev"])
        poller.start()
        state = {}

        def both_own():
            state["actor"] = ray.get(actor.state.remote(), timeout=30)
            return state["actor"][1] and survivor.assignment() and set(
                owners(zk, "zk-kill").values()) == {f"{state['actor'][0]}-0",
                                                    f"{survivor.consumer_id}-0"}
        wait_until(both_own, timeout_s=60, what="both members owning partitions in ZooKeeper")
        victim = state["actor"][0]
        assert zk.exists(f"/consumers/zk-kill/ids/{victim}")
        ray.kill(actor, no_restart=True)
        wait_until(lambda: not zk.exists(f"/consumers/zk-kill/ids/{victim}")
                   and owners(zk, "zk-kill") == {p: f"{survivor.consumer_id}-0"
                                                 for p in range(4)},
                   timeout_s=60, what="the victim's nodes gone, the survivor owning all")
    finally:
        stop.set()
        poller.join(timeout=30)
        survivor.close()


# -- deleting and expiring ZooKeeper-stored offsets (issue 9, test 5) ---------------------------

def zk_offsets(zk, group, topic="ev") -> dict:
    """{partition: offset} of /consumers/<group>/offsets/<topic> as ZooKeeper holds it."""
    path = f"/consumers/{group}/offsets/{topic}"
    if not zk.exists(path):
        return {}
    return {int(p): int(zk.get(f"{path}/{p}")[0]) for p in zk.get_children(path)}


def zk_member(cluster, group, store, **kw) -> GroupMember:
    return GroupMember(cluster.metadata, group, session_timeout_ms=SESSION_MS,
                       rebalance_timeout_ms=10_000, zk=store, **kw)


def commit_and_leave(cluster, group, offsets, **kw) -> None:
    """A member of ``group`` (own ZooKeeper session) joins, commits ``offsets``, leaves."""
    store = ConsumerZk(cluster.zk_hosts, group, new_consumer_id(group))
    try:
        m = zk_member(cluster, group, store, **kw)
        m.join(["ev"])
        m.commit(offsets)
        m.leave()
    finally:
        store.close()


def test_delete_group_offsets_deletes_zookeeper_stored_and_dual_committed_offsets(cluster, zk):
    """Admin.delete_group_offsets deletes ZooKeeper-stored offsets and both copies of
    dual-committed ones, a subset and then all, counting each (topic, partition) once;
    the emptied topic znodes go."""
    admin = cluster.admin()
    four = {("ev", p): 3 for p in range(4)}
    commit_and_leave(cluster, "zk-del", four, offsets_storage="zookeeper")
    commit_and_leave(cluster, "zk-del-dual", four, dual_commit=True)
    zk.create("/consumers/zk-del-dual/offsets/legacy/0", b"11", makepath=True)  # ZooKeeper only
    assert zk_offsets(zk, "zk-del") == zk_offsets(zk, "zk-del-dual") == {p: 3 for p in range(4)}

    assert admin.delete_group_offsets("zk-del", [("ev", 0), ("ev", 1), ("ev", 9)]) == 2
    assert zk_offsets(zk, "zk-del") == {2: 3, 3: 3}
    assert admin.delete_group_offsets("zk-del-dual", [("ev", 0)]) == 1     # in both stores
    assert zk_offsets(zk, "zk-del-dual") == {1: 3, 2: 3, 3: 3}
    assert kafka_committed(cluster, "zk-del-dual") == {("ev", p): 3 for p in (1, 2, 3)}

    assert admin.delete_group_offsets("zk-del") == 2
    assert admin.delete_group_offsets("zk-del-dual") == 4       # ev 1-3 in both, legacy 0
    assert kafka_committed(cluster, "zk-del-dual") == {}
    for group in ("zk-del", "zk-del-dual"):
        assert zk.get_children(f"/consumers/{group}/offsets") == []
    assert admin.delete_group_offsets("zk-del") == 0


def test_delete_group_offsets_is_refused_while_a_member_or_a_zookeeper_registration_lives(
        cluster, zk):
    """Admin.delete_group_offsets raises NonEmptyGroupError and deletes nothing while the
    group has a member at the coordinator, or only a live ephemeral /consumers/<g>/ids
    registration; once both are gone it deletes the ZooKeeper-stored offsets."""
    admin, group = cluster.admin(), "zk-del-live"
    store = ConsumerZk(cluster.zk_hosts, group, new_consumer_id(group))
    try:
        m = zk_member(cluster, group, store, offsets_storage="zookeeper")
        m.join(["ev"])
        m.commit({("ev", p): 5 for p in range(4)})
        assert not zk.exists(f"/consumers/{group}/ids/{store.consumer_id}")
        with pytest.raises(NonEmptyGroupError):
            admin.delete_group_offsets(group)
        m.leave()
        store.register({"ev": 1})                   # the seed's registry, no coordinator member
        assert store.wait_synced()
        assert zk.exists(f"/consumers/{group}/ids/{store.consumer_id}").ephemeralOwner != 0
        with pytest.raises(NonEmptyGroupError, match="ZooKeeper"):
            admin.delete_group_offsets(group, [("ev", 0)])
        assert zk_offsets(zk, group) == {p: 5 for p in range(4)}
    finally:
        store.close()
    assert zk.get_children(f"/consumers/{group}/ids") == []
    assert admin.delete_group_offsets(group) == 4
    assert zk_offsets(zk, group) == {}


def test_zookeeper_stored_offsets_of_a_memberless_group_expire_and_live_groups_keep_theirs():
    """offsets.retention.minutes covers ZooKeeper: the offset znodes of a group with no
    member and no live registration are deleted once their mtime is older than the
    retention (a dual-committed group loses both copies), while a group with a member at
    the coordinator, or with a live /consumers/<g>/ids registration, keeps its older ones."""
    config = {**CONFIG, "offsets.retention.minutes": 0.02,            # 1.2 s
              "offsets.retention.check.interval.ms": 300, "offsets.topic.replication.factor": 1}
    c = Cluster.start(num_brokers=1, namespace=unique_namespace("zkexp"), config=config)
    zk = zk_client(c)
    stores = []

    def new_store(group):
        stores.append(ConsumerZk(c.zk_hosts, group, new_consumer_id(group)))
        return stores[-1]
    stop = threading.Event()
    try:
        c.admin().create_topic("ev", partitions=2, replication_factor=1)
        # the groups that keep their offsets commit first: were they expired, they would go
        # in the same pass as (or before) the memberless groups' younger offsets
        member = zk_member(c, "zk-keeps-member", new_store("zk-keeps-member"),
                           offsets_storage="zookeeper")
        member.join(["ev"])
        member.commit({("ev", 0): 9})

        def beat():
            while not stop.wait(0.3):
                member.heartbeat()
        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        registered = new_store("zk-keeps-registered")
        registered.register({"ev": 1})
        registered.commit_offsets({("ev", 0): 8})
        assert registered.wait_synced()

        commit_and_leave(c, "zk-expires", {("ev", 0): 7, ("ev", 1): 6},
                         offsets_storage="zookeeper")
        commit_and_leave(c, "zk-expires-dual", {("ev", 1): 5}, dual_commit=True)
        assert zk_offsets(zk, "zk-expires") == {0: 7, 1: 6}
        assert zk_offsets(zk, "zk-expires-dual") == {1: 5}
        wait_until(lambda: zk_offsets(zk, "zk-expires") == {}
                   and zk_offsets(zk, "zk-expires-dual") == {}
                   and kafka_committed(c, "zk-expires-dual") == {},
                   timeout_s=30, what="the memberless groups' ZooKeeper offsets expired")
        assert not zk.exists("/consumers/zk-expires/offsets/ev")
        now_ms = time.time() * 1000
        for group, want in (("zk-keeps-member", {0: 9}), ("zk-keeps-registered", {0: 8})):
            assert zk_offsets(zk, group) == want
            assert now_ms - zk.exists(f"/consumers/{group}/offsets/ev/0").mtime > 1200
        assert member.committed() == {("ev", 0): 9}
    finally:
        stop.set()
        for store in stores:
            store.close()
        zk.stop()
        zk.close()
        c.shutdown()


def test_the_coordinator_survives_zookeeper_being_unreachable(monkeypatch):
    """Without ZooKeeper the coordinator's ZooKeeper expiry pass logs and counts a failure
    (retried at the next check) instead of raising, and delete_group_offsets answers
    ZooKeeperUnavailableError before deleting anything."""
    from actors.server import group_coordinator as gc
    monkeypatch.setattr(gc, "ZK_CONNECT_TIMEOUT_S", 0.5)
    coord = gc.GroupCoordinator(0, {"namespace": unique_namespace("nozk"),
                                    "zk_hosts": "127.0.0.1:1/raykafka-nozk",
                                    "config": {"offsets.retention.minutes": 0.001}})
    coord.num_partitions, coord.partitions = 1, {0: "loaded"}

    async def run():
        await coord._zk_expiry_pass()
        await coord._zk_expiry_pass()
        with pytest.raises(ZooKeeperUnavailableError):
            await coord.delete_group_offsets("g")
    asyncio.run(run())
    assert coord.zk_expiry_failures == 2 and coord.zk_offsets_expired == 0
