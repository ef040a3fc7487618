"""The cluster against a real ZooKeeper and a local Ray: znodes and their JSON, topics,
typed errors for bad requests, leadership checks, and two clusters side by side."""

from __future__ import annotations

import base64
import os
import re
import time

import pytest

from actors import Cluster
from actors.errors import (InvalidConfigurationError, InvalidPartitionsError,
                           InvalidReplicationFactorError, InvalidTopicError,
                           NotLeaderForPartitionError, StaleControllerEpochError,
                           TopicAlreadyExistsError, UnknownTopicOrPartitionError)
from cluster_helpers import (FAST_CONFIG, local_ray, ray, unique_namespace,
                             wait_until, zk_client, zk_json)
from storage.records import build, decode_records


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811 - the module's Ray first
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("cl"), config=FAST_CONFIG)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def zk(cluster):
    client = zk_client(cluster)
    yield client
    client.stop()
    client.close()


def test_cluster_id_controller_and_broker_znodes_have_the_seed_schemas(cluster, zk):
    """/cluster/id, /controller, /controller_epoch and /brokers/ids/<id> hold Kafka's JSON."""
    cid = zk_json(zk, "/cluster/id")
    assert cid["version"] == "1"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid["id"])
    base64.urlsafe_b64decode(cid["id"] + "==")
    controller = zk_json(zk, "/controller")
    assert controller["version"] == 1 and controller["brokerid"] in (0, 1, 2)
    assert controller["timestamp"].isdigit()
    epoch = int(zk.get("/controller_epoch")[0])
    assert epoch >= 1
    assert sorted(zk.get_children("/brokers/ids")) == ["0", "1", "2"]
    for bid in range(3):
        data, stat = zk.get(f"/brokers/ids/{bid}")
        body = __import__("json").loads(data)
        assert stat.ephemeralOwner != 0, "broker registrations are ephemeral"
        assert {"host", "port", "endpoints", "rack", "timestamp", "version"} <= set(body)
        assert body["timestamp"].isdigit() and body["endpoints"]


def test_zk_hosts_is_the_connect_string_with_its_chroot(cluster):
    """cluster.zk_hosts is Kafka's zookeeper.connect (host:port/chroot): a plain
    KazooClient(hosts=cluster.zk_hosts) sees the seeds' layout, /brokers/ids included."""
    from kazoo.client import KazooClient
    assert cluster.zk_hosts.endswith(f"/raykafka-{cluster.namespace}")
    client = KazooClient(hosts=cluster.zk_hosts, timeout=10.0)
    client.start(timeout=15)
    try:
        assert sorted(client.get_children("/brokers/ids")) == ["0", "1", "2"]
        assert client.exists("/controller") is not None
    finally:
        client.stop()
        client.close()


def test_a_zk_connect_string_with_its_own_chroot_is_used_as_given(cluster):
    """Cluster.start(zk="host:port/chroot") keeps that chroot (Kafka's zookeeper.connect),
    and the cluster's znodes are under it, not under /raykafka-<namespace>."""
    from kazoo.client import KazooClient
    servers = cluster.zk_hosts.split("/")[0]
    ns = unique_namespace("chr")
    other = Cluster.start(num_brokers=1, namespace=ns, zk=f"{servers}/teams/a-{ns}",
                          config=FAST_CONFIG)
    try:
        assert other.zk_hosts == f"{servers}/teams/a-{ns}"
        root = KazooClient(hosts=servers, timeout=10.0)
        root.start(timeout=15)
        try:
            assert root.get_children(f"/teams/a-{ns}/brokers/ids") == ["0"]
            assert root.exists(f"/raykafka-{ns}") is None
        finally:
            root.stop()
            root.close()
    finally:
        other.shutdown()


def test_a_malformed_zk_connect_string_is_a_typed_error():
    """A zk string with an empty server list or a bad chroot raises InvalidConfigurationError
    before anything starts."""
    for bad in ("", "/only-a-chroot", "127.0.0.1:1/a//b", "127.0.0.1:1/a/", "127.0.0.1:1/./x"):
        with pytest.raises(InvalidConfigurationError):
            Cluster.start(num_brokers=1, namespace=unique_namespace("bad"), zk=bad)


def test_auto_create_topics_enable_takes_only_true_or_false():
    """auto.create.topics.enable is true or false (any case); anything else is a typed
    error before anything starts."""
    for bad in ("maybe", "1", ""):
        with pytest.raises(InvalidConfigurationError, match="auto.create.topics.enable"):
            Cluster.start(num_brokers=1, namespace=unique_namespace("bad"),
                          config={"auto.create.topics.enable": bad})


def test_topic_znodes_have_the_seed_schemas(cluster, zk):
    """A created topic writes its assignment, per-partition state and config as the seeds."""
    admin = cluster.admin()
    admin.create_topic("zschema", partitions=3, replication_factor=2,
                       config={"retention.ms": "60000"})
    assignment = zk_json(zk, "/brokers/topics/zschema")
    assert assignment["version"] == 1
    assert sorted(assignment["partitions"]) == ["0", "1", "2"]
    for p, replicas in assignment["partitions"].items():
        assert len(replicas) == 2 and len(set(replicas)) == 2
        state = zk_json(zk, f"/brokers/topics/zschema/partitions/{p}/state")
        assert set(state) == {"controller_epoch", "leader", "version", "leader_epoch", "isr"}
        assert state["version"] == 1 and state["leader"] == replicas[0]
        assert state["isr"] == replicas and state["leader_epoch"] == 0
    config = zk_json(zk, "/config/topics/zschema")
    assert config["version"] == 1 and config["config"]["retention.ms"] == "60000"
    admin.delete_topic("zschema")


def test_after_create_topic_every_broker_knows_the_topic_and_its_leaders(cluster):
    """create_topic returns only once every live broker's metadata cache lists the topic with
    leaders, so a client in another process finds it whichever broker it asks; a fresh
    Metadata on a lagging cache asks every broker for the newest snapshot before it says
    "unknown"."""
    from actors.client.metadata import Metadata
    admin = cluster.admin()
    for i in range(3):
        admin.create_topic(f"everywhere-{i}", partitions=4)
        for bid in cluster.broker_ids():
            snap = ray.get(cluster.broker(bid).get_metadata.remote(), timeout=30)
            parts = snap["topics"].get(f"everywhere-{i}")
            assert parts is not None and all(st["leader"] >= 0 for st in parts.values()), bid
        fresh = Metadata(cluster.namespace, cluster.broker_ids())
        fresh._snapshot, fresh._fetched_at = {"topics": {}, "brokers": {}}, 1.0  # stale cache
        assert fresh.partitions_for(f"everywhere-{i}") == [0, 1, 2, 3]
        admin.delete_topic(f"everywhere-{i}")


def test_create_describe_and_delete_a_topic(cluster, zk):
    """describe_topic reports leaders and offsets; delete removes znodes and partition data."""
    admin = cluster.admin()
    admin.create_topic("lifecycle", partitions=4)
    assert "lifecycle" in admin.list_topics()
    rows = admin.describe_topic("lifecycle")
    assert [r["partition"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["leader"] in r["replicas"] and r["isr"] == r["replicas"]
        assert r["log_start_offset"] == 0 and r["high_watermark"] == 0
    leaders = {r["leader"] for r in rows}
    assert len(leaders) == 3, "leaders are spread over the brokers"
    dirs = [os.path.join(cluster.data_dir, f"broker-{r['leader']}", f"lifecycle-{r['partition']}")
            for r in rows]
    assert all(os.path.isdir(d) for d in dirs)
    admin.delete_topic("lifecycle")
    assert "lifecycle" not in admin.list_topics()
    assert zk.exists("/brokers/topics/lifecycle") is None
    assert zk.exists("/config/topics/lifecycle") is None
    assert zk.exists("/admin/delete_topics/lifecycle") is None
    wait_until(lambda: not any(os.path.exists(d) for d in dirs), what="partition dirs removed")
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topic("lifecycle")


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "tab\t", "slash/x", "ü"])
def test_invalid_topic_names_raise_invalid_topic_error(cluster, name):
    """Kafka's naming rule is enforced with InvalidTopicError; nothing is created."""
    with pytest.raises(InvalidTopicError):
        cluster.admin().create_topic(name)
    assert name not in cluster.admin().list_topics()


def test_bad_topic_requests_raise_typed_errors_and_create_nothing(cluster):
    """Existing name, partitions < 1, RF > live brokers, bad config: each has its error."""
    admin = cluster.admin()
    admin.create_topic("taken")
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic("taken")
    with pytest.raises(InvalidPartitionsError):
        admin.create_topic("zero-parts", partitions=0)
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topic("too-many-replicas", replication_factor=4)
    with pytest.raises(InvalidConfigurationError):
        admin.create_topic("bad-config", config={"segment.bytes": "lots"})
    with pytest.raises(InvalidConfigurationError):
        admin.create_topic("bad-config", config={"no.such.setting": "1"})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topic("never-created")
    assert set(admin.list_topics()) & {"zero-parts", "too-many-replicas", "bad-config"} == set()
    admin.delete_topic("taken")


def test_admin_errors_arrive_as_the_typed_error_itself_not_rays_wrapper(cluster):
    """Admin raises the broker's typed error itself: its class name and a one-line message,
    not Ray's RayTaskError with the broker's remote traceback."""
    admin = cluster.admin()
    admin.create_topic("taken-twice")
    with pytest.raises(TopicAlreadyExistsError) as caught:
        admin.create_topic("taken-twice")
    assert type(caught.value) is TopicAlreadyExistsError
    assert str(caught.value) == "topic 'taken-twice' already exists"
    with pytest.raises(InvalidReplicationFactorError) as caught:
        admin.create_topic("too-wide", replication_factor=4)
    assert type(caught.value) is InvalidReplicationFactorError
    assert "Traceback" not in str(caught.value) and "ray::" not in str(caught.value)
    admin.delete_topic("taken-twice")


def test_a_request_to_a_non_leader_replica_raises_not_leader(cluster):
    """Produce and fetch to a follower replica raise NotLeaderForPartitionError."""
    admin = cluster.admin()
    admin.create_topic("followers", partitions=1, replication_factor=2)
    row = admin.describe_topic("followers")[0]
    follower = [b for b in row["replicas"] if b != row["leader"]][0]
    handle = ray.get_actor(f"replica-followers-0-b{follower}", namespace=cluster.namespace)
    with pytest.raises(NotLeaderForPartitionError):
        ray.get(handle.produce.remote(build([b"x"]), -1, 1000))
    with pytest.raises(NotLeaderForPartitionError):
        ray.get(handle.fetch.remote(0, 1024))
    leader = cluster.metadata.leader("followers", 0)
    ray.get(leader.handle.produce.remote(build([b"x"]), 1, 1000))
    admin.delete_topic("followers")


def test_brokers_reject_requests_from_an_older_controller_epoch(cluster, zk):
    """LeaderAndIsr / UpdateMetadata stamped with a stale controller epoch are refused."""
    epoch = int(zk.get("/controller_epoch")[0])
    broker = cluster.broker(0)
    with pytest.raises(StaleControllerEpochError):
        ray.get(broker.leader_and_isr.remote(epoch - 1, []))
    with pytest.raises(StaleControllerEpochError):
        ray.get(broker.update_metadata.remote(epoch - 1, {}))


def test_produce_and_fetch_through_the_leader_round_trip(cluster):
    """Batches produced to a leader come back whole and in order from fetch."""
    admin = cluster.admin()
    admin.create_topic("roundtrip", partitions=2)
    leader = cluster.metadata.leader("roundtrip", 1)
    for i in range(5):
        values = [b"%d-%d" % (i, j) for j in range(100)]
        res = ray.get(leader.handle.produce.remote(build(values), -1, 1000))
        assert (res.base_offset, res.last_offset) == (i * 100, i * 100 + 99)
    fetched = ray.get(leader.handle.fetch.remote(0, 1 << 20))
    recs = decode_records(fetched.data)
    assert [r.offset for r in recs] == list(range(500))
    assert recs[250].value == b"2-50"
    assert fetched.high_watermark == 500
    admin.delete_topic("roundtrip")


def test_a_replica_actors_local_channel_serves_its_log_and_fails_fast_when_it_dies(cluster):
    """A leader replica actor's channel (address asked once through Ray) produces and
    fetches the same log as its Ray methods; killing the actor fails a long poll parked on
    the channel at once, not at its max_wait_ms."""
    import time

    from actors.server.replica_channel import ReplicaChannel, wait
    admin = cluster.admin()
    admin.create_topic("channel", partitions=1)
    leader = cluster.metadata.leader("channel", 0)
    chan = ReplicaChannel(ray.get(leader.handle.channel_address.remote(), timeout=60))
    try:
        assert wait(chan.produce(build([b"a", b"b"]), acks=-1), 10).last_offset == 1
        ray.get(leader.handle.produce.remote(build([b"c"]), -1, 1000))
        assert [r.value for r in decode_records(wait(chan.fetch(0, 1 << 20), 10).data)] == \
            [b"a", b"b", b"c"]
        parked = chan.fetch(3, 1 << 20, max_wait_ms=120_000)
        started = time.monotonic()
        ray.kill(leader.handle)
        with pytest.raises(NotLeaderForPartitionError):
            wait(parked, 60)
        assert time.monotonic() - started < 60
    finally:
        chan.close()
        admin.delete_topic("channel")


def test_two_clusters_in_one_ray_do_not_interfere(cluster):
    """A second Cluster.start (another namespace) has its own ZooKeeper, data and topics."""
    other = Cluster.start(num_brokers=1, namespace=unique_namespace("other"),
                          config=FAST_CONFIG)
    try:
        assert other.zk_hosts != cluster.zk_hosts
        assert other.data_dir != cluster.data_dir
        other.admin().create_topic("only-in-other")
        cluster.admin().create_topic("only-in-first")
        assert "only-in-other" not in cluster.admin().list_topics()
        assert "only-in-first" not in other.admin().list_topics()
        assert other.broker_ids() == [0]
        cluster.admin().delete_topic("only-in-first")
    finally:
        other.shutdown()
    assert not os.path.exists(other.data_dir)
    assert cluster.admin().list_topics() is not None


def test_a_cluster_stopped_cleanly_and_started_on_its_data_dir_serves_its_records(
        cluster, tmp_path):
    """`shutdown` and a new `Cluster.start` on the same data dir (what `raykafka stop` and
    `start` do; test_cli covers the killed daemon's restart): the topic is there and every
    acknowledged record is read back at its offset."""
    data_dir, ns = str(tmp_path / "again"), unique_namespace("again")
    first = Cluster.start(num_brokers=1, data_dir=data_dir, namespace=ns, config=FAST_CONFIG)
    try:
        first.admin().create_topic("kept", partitions=1, replication_factor=1)
        with first.producer(acks="all") as producer:
            for i in range(100):
                producer.send("kept", b"r%d" % i, partition=0)
            producer.flush()
    finally:
        first.shutdown()
    # the same namespace: its ZooKeeper chroot holds the cluster id the data dir belongs to
    again = Cluster.start(num_brokers=1, data_dir=data_dir, namespace=ns, config=FAST_CONFIG)
    try:
        assert "kept" in again.admin().list_topics()
        records = again.simple_consumer().fetch("kept", 0, 0)
        assert [(r.offset, r.value) for r in records] == [(i, b"r%d" % i) for i in range(100)]
    finally:
        again.shutdown()


def test_a_data_dir_of_another_cluster_is_refused_with_a_typed_error(cluster, tmp_path):
    """A kept data dir started against a fresh ZooKeeper (another cluster id) fails with
    InconsistentClusterIdError naming both ids, and its data is left untouched."""
    import shutil
    from actors.errors import InconsistentClusterIdError
    data_dir = str(tmp_path / "kept")
    first = Cluster.start(num_brokers=1, data_dir=data_dir, namespace=unique_namespace("kept"),
                          config=FAST_CONFIG)
    first.admin().create_topic("kept-topic")
    first.shutdown()
    meta = (tmp_path / "kept" / "broker-0" / "meta.properties").read_text()
    shutil.rmtree(tmp_path / "kept" / "zookeeper")      # a new ZooKeeper: a new cluster id
    with pytest.raises(InconsistentClusterIdError, match="belongs to cluster"):
        Cluster.start(num_brokers=1, data_dir=data_dir, namespace=unique_namespace("kept"),
                      config=FAST_CONFIG)
    assert (tmp_path / "kept" / "broker-0" / "meta.properties").read_text() == meta
    assert os.path.isdir(tmp_path / "kept" / "broker-0" / "kept-topic-0")


def test_100k_keyed_records_over_6_partitions_keep_their_order_per_key(cluster):
    """100,000 keyed records sent through cluster.producer() come back through the
    SimpleConsumer exactly once, each key on its murmur2 partition, in send order per key."""
    from actors.client.murmur2 import partition_for_key
    admin = cluster.admin()
    admin.create_topic("keyed100k", partitions=6)
    n, keys = 100_000, 997
    with cluster.producer(linger_ms=5) as producer:
        futures = [producer.send("keyed100k", b"%d" % i, key=b"user-%d" % (i % keys))
                   for i in range(n)]
        producer.flush(timeout=120)
    assert futures[-1].get(timeout=10).topic == "keyed100k"
    consumer = cluster.simple_consumer()
    seen: dict = {}
    total = 0
    for p in range(6):
        offset = 0
        while True:
            records = consumer.fetch("keyed100k", p, offset)
            if not records:
                break
            for r in records:
                assert partition_for_key(r.key, 6) == p
                seen.setdefault(r.key, []).append(int(r.value))
            total += len(records)
            offset = records[-1].offset + 1
    assert total == n
    assert len(seen) == keys
    for key, values in seen.items():
        k = int(key.split(b"-")[1])
        assert values == list(range(k, n, keys)), f"order or count broken for {key!r}"
    admin.delete_topic("keyed100k")


def test_altered_topic_config_reaches_zookeeper_and_the_partition_logs(cluster, zk):
    """alter_topic_config merges into /config/topics/<t>, topic_config reports it, the
    leaders apply it (a lowered max.message.bytes refuses a record that fitted before),
    and a bad value is refused with the config unchanged."""
    from actors.errors import RecordTooLargeError
    admin = cluster.admin()
    admin.create_topic("altered", partitions=2, config={"retention.ms": "600000"})
    leader = cluster.metadata.leader("altered", 0)
    ray.get(leader.handle.produce.remote(build([b"x" * 5000]), 1, 1000))
    merged = admin.alter_topic_config("altered", {"max.message.bytes": "2000"})
    assert merged == {"retention.ms": "600000", "max.message.bytes": "2000"}
    assert zk_json(zk, "/config/topics/altered")["config"] == merged
    assert admin.topic_config("altered") == merged

    def refused():
        ref = cluster.metadata.leader("altered", 0)
        try:
            ray.get(ref.handle.produce.remote(build([b"x" * 5000]), 1, 1000))
        except RecordTooLargeError:
            return True
        return False
    wait_until(refused, what="the leader applying max.message.bytes=2000")
    with pytest.raises(InvalidConfigurationError):
        admin.alter_topic_config("altered", {"retention.ms": "soon"})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.alter_topic_config("never-created", {"retention.ms": "1"})
    assert admin.topic_config("altered") == merged
    admin.delete_topic("altered")


def test_an_altered_min_insync_replicas_reaches_the_running_leaders(cluster, zk):
    """Raising min.insync.replicas above the ISR (RF=1) makes the leaders refuse acks=all
    with NotEnoughReplicasError while acks=1 still appends; the log is not reopened."""
    from actors.errors import NotEnoughReplicasError
    admin = cluster.admin()
    admin.create_topic("minisr", partitions=1)
    leader = cluster.metadata.leader("minisr", 0)
    ray.get(leader.handle.produce.remote(build([b"a"]), -1, 1000))
    admin.alter_topic_config("minisr", {"min.insync.replicas": "2"})

    def refused():
        try:
            ray.get(cluster.metadata.leader("minisr", 0).handle.produce.remote(
                build([b"b"]), -1, 1000))
        except NotEnoughReplicasError:
            return True
        return False
    wait_until(refused, what="the leader applying min.insync.replicas=2")
    res = ray.get(leader.handle.produce.remote(build([b"c"]), 1, 1000))
    state = ray.get(leader.handle.state.remote())
    assert state["min_insync_replicas"] == 2
    assert state["topic_id"] == f"{zk.exists('/brokers/topics/minisr').czxid:x}"
    data = ray.get(leader.handle.fetch.remote(0, 1 << 20)).data
    assert [r.value for r in decode_records(data)][0] == b"a"
    assert res.last_offset == state["log_end_offset"] - 1
    admin.delete_topic("minisr")


def test_public_clients_refuse_bad_input_and_read_offsets_on_a_real_cluster(cluster):
    """Through Cluster.producer()/simple_consumer(): wrong types, unknown topics and
    partitions, oversized records and out-of-range offsets raise their typed errors, nothing
    is appended, and offsets_before/multifetch answer as the seed's low-level API."""
    from actors.errors import IllegalArgumentError, OffsetOutOfRangeError, RecordTooLargeError
    admin = cluster.admin()
    admin.create_topic("clients", partitions=2, config={"max.message.bytes": "20000"})
    consumer = cluster.simple_consumer()
    with cluster.producer(max_request_size=10_000) as producer:
        for error, call in [
                (IllegalArgumentError, lambda: producer.send("clients", "not bytes")),
                (IllegalArgumentError, lambda: producer.send("clients", b"v", key=7)),
                (UnknownTopicOrPartitionError, lambda: producer.send("clients", b"v",
                                                                     partition=2)),
                (RecordTooLargeError, lambda: producer.send("clients", b"x" * 10_000))]:
            with pytest.raises(error):
                call()
        assert [consumer.offsets_before("clients", p, -1) for p in (0, 1)] == [[0], [0]]
        for i in range(3):
            producer.send_batch("clients", [b"%d-%d" % (i, j) for j in range(50)],
                                partition=0).wait(timeout=30)
    assert consumer.offsets_before("clients", 0, -2) == [0]
    assert consumer.offsets_before("clients", 0, -1) == [150]
    assert consumer.offsets_before("clients", 0, -1, max_offsets=10)[0] == 150
    with pytest.raises(OffsetOutOfRangeError):
        consumer.fetch("clients", 0, 151)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.fetch("clients", 5, 0)
    got = consumer.multifetch([("clients", 0, 120, 1 << 20), ("clients", 1, 0, 1 << 20)])
    assert [r.offset for r in got[("clients", 0)]] == list(range(120, 150))
    assert got[("clients", 1)] == []
    assert got[("clients", 0)][0].value == b"2-20"
    admin.delete_topic("clients")


def test_the_producer_makes_an_unknown_topic_on_first_send_unless_told_not_to(cluster, zk):
    """raykafka's Producer asks the brokers to create a topic it sends to first (Kafka's
    auto.create.topics.enable, kafka-python's allow_auto_create_topics): the record lands
    at offset 0 of a topic with the brokers' num.partitions; with the setting off, an
    unknown topic is UnknownTopicOrPartitionError at once and nothing is made; a bad name
    is the brokers' InvalidTopicError."""
    admin = cluster.admin()
    with cluster.producer(allow_auto_create_topics=False, max_block_ms=60_000) as producer:
        started = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("not-made", b"v")
        assert time.monotonic() - started < 10, "refused at once"
    assert "not-made" not in admin.list_topics()
    assert zk.exists("/brokers/topics/not-made") is None
    with cluster.producer() as producer:
        meta = producer.send("made-on-send", b"first").get(timeout=60)
        assert (meta.topic, meta.partition, meta.offset) == ("made-on-send", 0, 0)
        with pytest.raises(InvalidTopicError):
            producer.send("bad name", b"v")
    assert len(admin.describe_topic("made-on-send")) == 1       # num.partitions (1)
    assert [r.value for r in cluster.simple_consumer().fetch("made-on-send", 0, 0)] == [b"first"]
    assert "bad name" not in admin.list_topics()
    with pytest.raises(InvalidConfigurationError, match="allow_auto_create_topics"):
        cluster.producer(allow_auto_create_topics="yes")
    admin.delete_topic("made-on-send")


def test_a_subscribing_consumer_makes_an_unknown_topic_unless_told_not_to(cluster, zk):
    """raykafka's Consumer asks the brokers to create a subscribed topic nobody made
    (Kafka's consumer, allow.auto.create.topics; kafka-python's allow_auto_create_topics
    name): its poll makes the topic, which then takes records the consumer reads; with the
    setting off nothing is made; a bad name is the brokers' InvalidTopicError."""
    admin = cluster.admin()
    with cluster.consumer(allow_auto_create_topics=False) as consumer:
        consumer.subscribe(["not-made-by-poll"])
        consumer.poll(timeout_ms=1500)
    assert "not-made-by-poll" not in admin.list_topics()
    assert zk.exists("/brokers/topics/not-made-by-poll") is None
    with cluster.consumer(auto_offset_reset="earliest") as consumer:
        consumer.subscribe(["made-on-poll"])
        deadline = time.monotonic() + 60
        while "made-on-poll" not in admin.list_topics():
            assert time.monotonic() < deadline, "the subscription's poll made no topic"
            consumer.poll(timeout_ms=200)
        with cluster.producer() as producer:   # the topic is made: the brokers may lag
            producer.send("made-on-poll", b"after").get(timeout=60)
        got = []
        while not got:
            assert time.monotonic() < deadline, "the made topic's record never came"
            got = [r.value for rs in consumer.poll(timeout_ms=500).values() for r in rs]
        assert got == [b"after"]
    assert len(admin.describe_topic("made-on-poll")) == 1       # num.partitions (1)
    with cluster.consumer() as consumer:
        with pytest.raises(InvalidTopicError):          # group-less: subscribe assigns
            consumer.subscribe(["bad name"])
        with pytest.raises(InvalidTopicError):          # and every poll says it again
            consumer.poll(timeout_ms=500)
    with pytest.raises(InvalidConfigurationError, match="allow_auto_create_topics"):
        cluster.consumer(allow_auto_create_topics=1)
    admin.delete_topic("made-on-poll")


def test_create_partitions_grows_a_topic_whose_new_partitions_take_records(cluster, zk):
    """Admin.create_partitions: the topic's assignment in ZooKeeper grows with the topic's
    replication factor, every broker's metadata shows the new partitions with leaders when
    it returns, a producer writes to them and a consumer reads back; the old partitions keep
    their records."""
    admin = cluster.admin()
    admin.create_topic("grown", partitions=2, replication_factor=2)
    producer = cluster.producer(acks="all")
    producer.send("grown", b"old", partition=1).get(timeout=30)
    added = admin.create_partitions("grown", 5)
    assert sorted(added) == [2, 3, 4] and all(len(r) == 2 for r in added.values())
    assert sorted(zk_json(zk, "/brokers/topics/grown")["partitions"]) == ["0", "1", "2", "3", "4"]
    assert [r["partition"] for r in admin.describe_topic("grown")] == [0, 1, 2, 3, 4]
    for p in (2, 3, 4):
        producer.send("grown", b"new-%d" % p, partition=p).get(timeout=30)
    producer.close()
    consumer = cluster.consumer()
    consumer.assign([("grown", p) for p in range(5)])
    consumer.seek_to_beginning()
    got = {}
    wait_until(lambda: got.update({tp: [r.value for r in rs] for tp, rs in
                                   consumer.poll(timeout_ms=500).items()}) or len(got) == 4,
               what="records from partitions 1-4")
    consumer.close()
    assert got == {("grown", 1): [b"old"], ("grown", 2): [b"new-2"],
                   ("grown", 3): [b"new-3"], ("grown", 4): [b"new-4"]}
    admin.delete_topic("grown")


def test_create_partitions_refuses_what_would_not_grow_the_topic(cluster):
    """A count not above the current one, an unknown topic and an assignment of the wrong
    shape are typed errors, and the topic keeps its partitions."""
    from actors.errors import InvalidReplicaAssignmentError
    admin = cluster.admin()
    admin.create_topic("fixed", partitions=3)
    for count in (3, 2, 0, "4"):
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions("fixed", count)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.create_partitions("never-created", 4)
    with pytest.raises(InvalidReplicaAssignmentError):
        admin.create_partitions("fixed", 5, [[0]])            # 2 new partitions, 1 list
    with pytest.raises(InvalidReplicaAssignmentError):
        admin.create_partitions("fixed", 4, [["zero"]])
    with pytest.raises(InvalidReplicaAssignmentError):
        admin.create_partitions("fixed", 4, [[42]])           # no such broker
    assert len(admin.describe_topic("fixed")) == 3
    assert admin.create_partitions("fixed", 4, [[1]]) == {3: [1]}
    admin.delete_topic("fixed")


def _thread_names(pid: int) -> set[str]:
    names = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.add(f.read().strip())
        except OSError:
            pass                                    # a thread that ended meanwhile
    return names


def test_server_processes_name_their_threads_in_the_kernel(cluster):
    """A broker's and its replicas' threads carry their Python names in /proc (what top -H
    and ps -L show; the kernel keeps 15 bytes): the broker's listener thread, a follower
    broker's fetcher, a replica's channel threads."""
    admin = cluster.admin()
    admin.create_topic("named-threads", partitions=1, replication_factor=3)
    try:
        cluster.metadata.wait_for_leaders("named-threads", timeout_s=60)
        procs = [p for b in range(3)
                 for p in ray.get(cluster.broker(b).pids.remote(), timeout=60)]
        brokers = [p["pid"] for p in procs if p["role"] == "broker"]
        replicas = [p["pid"] for p in procs if p["role"] == "replica"
                    and p["name"] == "named-threads-0"]
        assert len(brokers) == 3 and len(replicas) == 3
        for pid in brokers:
            assert any(n.startswith("kafka-network-") for n in _thread_names(pid)), \
                _thread_names(pid)
        for pid in replicas:
            wait_until(lambda: "channel-accept" in _thread_names(pid), timeout_s=30,
                       what=f"replica process {pid}'s threads named",
                       detail=lambda: _thread_names(pid))
        # the two followers' brokers fetch from the leader's: "broker-<id>-fetcher-<n>"
        wait_until(lambda: sum(any(re.fullmatch(r"broker-\d+-fetche", n)
                                   for n in _thread_names(pid)) for pid in brokers) >= 2,
                   timeout_s=30, what="two brokers' fetcher threads named",
                   detail=lambda: [_thread_names(pid) for pid in brokers])
    finally:
        admin.delete_topic("named-threads")
