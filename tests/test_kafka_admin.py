"""The admin APIs on the brokers' Kafka listeners (issue 22): unmodified kafka-python 3.0,
confluent-kafka and aiokafka admin clients create topics that are the same znodes as
raykafka's own Admin makes (and work for produce and consume), create them with configs,
describe, alter (incremental and legacy) and validate configs, add partitions, delete
records and topics, describe the cluster, and get Kafka's error codes for the bad cases;
ListOffsets answers latest, earliest, a time and the max timestamp. One 3-broker cluster
for the module."""

from __future__ import annotations

import asyncio
import itertools
import time
import types

import pytest

from actors import Cluster, wire
from tests import cluster_helpers
from tests.cluster_helpers import FAST_CONFIG, unique_namespace, wait_until, zk_client, zk_json

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka.admin import (AdminClient, AlterConfigOpType,  # noqa: E402
                                   ConfigEntry, ConfigResource, NewPartitions, NewTopic)
from kafka.admin import KafkaAdminClient  # noqa: E402

_names = (f"adm-{i}" for i in itertools.count())
local_ray = cluster_helpers.local_ray          # the module's private Ray (a fixture)


#: A consumer given a group id (for watermarks and offsets_for_times) makes the brokers
#: create __consumer_offsets; at the default 6 partitions x 3 replicas that is 18 replica
#: actors starting (about 15 s of this machine's 2 cores), and the controller's requests to
#: each broker wait behind that LeaderAndIsr (one in flight per broker, as Kafka's): a topic
#: deletion asked meanwhile took 15-19 s (the 30 s operation timeout was passed on a slow
#: machine). One replica is what these tests need of it.
CONFIG = {**FAST_CONFIG, "offsets.topic.num.partitions": 1,
          "offsets.topic.replication.factor": 1}


@pytest.fixture(scope="module")
def cluster(local_ray):
    c = Cluster.start(3, namespace=unique_namespace("kadmin"), config=dict(CONFIG))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def cadmin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


@pytest.fixture(scope="module")
def kadmin(cluster):
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    yield client
    client.close()


@pytest.fixture(scope="module")
def zk(cluster):
    client = zk_client(cluster)
    yield client
    client.stop()
    client.close()


def _raw_call(cluster, api_key: int, version: int, body: dict, broker: int = 0) -> dict:
    """One request on a connection of its own to the ``broker``-th listener; the decoded
    answer."""
    import socket
    import struct
    host, port = cluster.bootstrap_servers.split(",")[broker].rsplit(":", 1)
    header = wire.RequestHeader(api_key, version, 7, "raw")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(wire.encode_request(header, body))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    return wire.decode_response(api_key, version, frame)[1]


def _ck_error(future) -> str:
    """The Kafka error name a confluent-kafka admin future failed with."""
    with pytest.raises(ck.KafkaException) as info:
        future.result(60)
    return info.value.args[0].name()


def _produce(cluster, topic: str, n: int, **extra) -> None:
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 2})
    errors = []
    for i in range(n):
        producer.produce(topic, value=b"v%d" % i, on_delivery=lambda err, msg: err and
                         errors.append(err), **extra)
    assert producer.flush(60) == 0 and errors == []


# -- tests ----------------------------------------------------------------------------------
def test_a_topic_from_kafka_python_is_the_one_raykafka_topics_create_makes(cluster, kadmin,
                                                                           zk):
    """A topic kafka-python's admin creates (3 partitions, RF 2, a config) has the znodes
    raykafka's Admin writes for the same request (assignment layout, config node), RF 2
    placement over 3 brokers, leaders when the answer comes, and raykafka's producer and
    consumer use it."""
    ours, theirs = next(_names), next(_names)
    cluster.admin().create_topic(ours, partitions=3, replication_factor=2,
                                 config={"retention.ms": "3600000"})
    result = kadmin.create_topics([kafka.admin.NewTopic(theirs, 3, 2, topic_configs={
        "retention.ms": "3600000"})])
    assert result["topics"][0]["error_code"] == 0
    mine, made = (zk_json(zk, f"/brokers/topics/{t}") for t in (ours, theirs))
    assert set(made) == set(mine) and made["version"] == mine["version"]
    assert sorted(made["partitions"]) == ["0", "1", "2"]
    assert all(len(set(r)) == 2 for r in made["partitions"].values())
    assert zk_json(zk, f"/config/topics/{theirs}") == zk_json(zk, f"/config/topics/{ours}")
    assert cluster.admin().topic_config(theirs) == {"retention.ms": "3600000"}
    rows = cluster.admin().describe_topic(theirs)
    assert [r["leader"] >= 0 for r in rows] == [True] * 3
    assert theirs in cluster.admin().list_topics()

    producer = cluster.producer(linger_ms=1)
    consumer = cluster.consumer(auto_offset_reset="earliest", fetch_max_wait_ms=200)
    try:
        for i in range(30):
            producer.send(theirs, b"r%d" % i)
        producer.flush(timeout=60)
        consumer.assign([(theirs, p) for p in range(3)])
        got, deadline = [], time.monotonic() + 30
        while len(got) < 30 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(r.value for r in records)
        assert sorted(got) == sorted(b"r%d" % i for i in range(30))
    finally:
        producer.close()
        consumer.close()


def test_create_topics_answers_once_the_leaders_exist_on_any_broker(cluster):
    """CreateTopics sent to each broker (not only the Metadata's controller) creates the
    topic, and a Metadata request to the same broker right after the answer lists a
    leader for every partition; -1 takes the broker defaults (1 partition, RF 1)."""
    controller = _raw_call(cluster, wire.METADATA, 12, {"topics": []})["controller_id"]
    for broker in range(3):
        name = next(_names)
        topics = [{"name": name, "num_partitions": 2, "replication_factor": 2,
                   "assignments": [], "configs": []}]
        if broker == 0:
            topics.append({"name": name + "-d", "num_partitions": -1,
                           "replication_factor": -1, "assignments": [], "configs": []})
        answer = _raw_call(cluster, wire.CREATE_TOPICS, 7, {"topics": topics,
                                                            "timeout_ms": 30000}, broker)
        assert [(t["error_code"], t["num_partitions"], t["replication_factor"])
                for t in answer["topics"]] == [(0, 2, 2), (0, 1, 1)][:len(topics)], \
            (broker, controller)
        md = _raw_call(cluster, wire.METADATA, 12, {"topics": [{"name": t["name"]}
                                                              for t in topics]}, broker)
        assert [[p["leader_id"] >= 0 for p in t["partitions"]] for t in md["topics"]] == \
            [[True] * 2, [True]][:len(topics)]


def test_create_topics_past_its_timeout_answers_request_timed_out_and_still_creates(
        cluster):
    """timeout_ms 1 (no controller gives leaders that fast) answers REQUEST_TIMED_OUT for
    the topic, which is created all the same; timeout_ms 0 answers at once without error,
    as Kafka does."""
    late, at_once = next(_names), next(_names)
    answer = _raw_call(cluster, wire.CREATE_TOPICS, 4, {"topics": [
        {"name": late, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}], "timeout_ms": 1})
    assert answer["topics"][0]["error_code"] == \
        wire.ERRORS_BY_NAME["REQUEST_TIMED_OUT"].code
    answer = _raw_call(cluster, wire.CREATE_TOPICS, 4, {"topics": [
        {"name": at_once, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}], "timeout_ms": 0})
    assert answer["topics"][0]["error_code"] == 0
    for name in (late, at_once):
        wait_until(lambda: cluster.admin().describe_topic(name)[0]["leader"] >= 0,
                   timeout_s=30, what=f"a leader of {name}")


def test_confluent_creates_with_configs_describes_and_alters_them(cluster, cadmin):
    """confluent-kafka: create with configs; describe shows them as DYNAMIC_TOPIC_CONFIG
    and the rest with their defaults; incremental SET, DELETE and APPEND
    change only what they name; the legacy AlterConfigs replaces the whole set; a bad
    name, value or operation is INVALID_CONFIG and changes nothing."""
    name = next(_names)
    cadmin.create_topics([NewTopic(name, 2, 3, config={
        "cleanup.policy": "compact", "min.insync.replicas": "2"})])[name].result(60)
    resource = ConfigResource("topic", name)
    described = cadmin.describe_configs([resource])[resource]
    entries = described.result(60)
    assert (entries["cleanup.policy"].value, entries["cleanup.policy"].source) == \
        ("compact", ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert entries["min.insync.replicas"].value == "2"
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == \
        ("604800000", ck.admin.ConfigSource.DEFAULT_CONFIG.value)
    assert [s.name for s in entries["cleanup.policy"].synonyms.values()] == \
        ["cleanup.policy"]                  # librdkafka asks for synonyms (v1)

    def incremental(*ops):
        res = ConfigResource("topic", name, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=op) for k, op, v in ops])
        return cadmin.incremental_alter_configs([res])[res]

    incremental(("retention.ms", AlterConfigOpType.SET, "1000"),
                ("min.insync.replicas", AlterConfigOpType.DELETE, None),
                ("cleanup.policy", AlterConfigOpType.APPEND, "delete")).result(60)
    assert cluster.admin().topic_config(name) == {"cleanup.policy": "compact,delete",
                                                  "retention.ms": "1000"}
    assert _ck_error(incremental(("no.such.config", AlterConfigOpType.SET, "1"))) == \
        "INVALID_CONFIG"
    assert _ck_error(incremental(("retention.ms", AlterConfigOpType.SET, "soon"))) == \
        "INVALID_CONFIG"
    assert _ck_error(incremental(("retention.ms", AlterConfigOpType.APPEND, "1"))) == \
        "INVALID_CONFIG"
    assert cluster.admin().topic_config(name) == {"cleanup.policy": "compact,delete",
                                                  "retention.ms": "1000"}
    legacy = ConfigResource("topic", name, set_config={"segment.bytes": "1048576"})
    with pytest.warns(DeprecationWarning):        # confluent-kafka's word on the legacy API
        cadmin.alter_configs([legacy])[legacy].result(60)
    assert cluster.admin().topic_config(name) == {"segment.bytes": "1048576"}


def test_kafka_python_alters_configs_both_ways_and_describes_a_broker(cluster, kadmin):
    """kafka-python: incremental and legacy AlterConfigs reach the topic's config node;
    validate_only changes nothing; DescribeConfigs of a broker lists its settings
    read-only; altering a broker's config is refused (INVALID_REQUEST)."""
    from kafka.admin import ConfigResource as KResource
    name = next(_names)
    kadmin.create_topics([kafka.admin.NewTopic(name, 1, 1)])
    out = kadmin.alter_configs([KResource("TOPIC", name, {"retention.ms": "5000"})],
                               incremental=True)
    assert out == {"topic": {name: "OK"}}
    kadmin.alter_configs([KResource("TOPIC", name, {"retention.bytes": "100000"})],
                         incremental=True, validate_only=True)
    assert cluster.admin().topic_config(name) == {"retention.ms": "5000"}
    kadmin.alter_configs([KResource("TOPIC", name, {"retention.bytes": "100000"})],
                         incremental=False)
    assert cluster.admin().topic_config(name) == {"retention.ms": "5000",
                                                  "retention.bytes": "100000"}
    described = kadmin.describe_configs([KResource("BROKER", "1")], config_filter="all")
    broker = described["broker"]["1"]
    assert broker["broker.id"]["value"] == "1" and broker["broker.id"]["read_only"]
    assert broker["zookeeper.session.timeout.ms"]["value"] == "3000"
    refused = kadmin.alter_configs([KResource("BROKER", "1", {"num.partitions": "3"})],
                                   raise_on_unknown=False, incremental=True)
    assert "InvalidRequest" in refused["broker"]["1"]


def test_create_partitions_then_delete_records_then_delete_topic(cluster, kadmin, cadmin,
                                                                 zk):
    """kafka-python grows a topic from 1 to 2 partitions (the new one gets a leader and
    shows in raykafka's Admin; a count not above the current one is INVALID_PARTITIONS,
    growing __consumer_offsets INVALID_REQUEST);
    confluent-kafka's DeleteRecords moves a partition's log start to the offset asked
    (the low watermark answered; the leader replica's state shows it; past the high
    watermark is OFFSET_OUT_OF_RANGE); then confluent-kafka deletes the topic: gone from
    the metadata and ZooKeeper."""
    name = next(_names)
    cadmin.create_topics([NewTopic(name, 1, 3)])[name].result(60)
    result = kadmin.create_partitions({name: kafka.admin.NewPartitions(2)})
    assert [r.error_code for r in result.results] == [0]
    # answered once the broker that took it lists a leader for each new partition (as
    # Kafka's DelayedCreatePartitions); the other brokers learn it from the controller
    # moments later, and raykafka's Admin may ask any of them
    def grown():
        rows = cluster.admin().describe_topic(name)
        return rows if len(rows) == 2 else None
    rows = wait_until(grown, timeout_s=30, what="the new partition in raykafka's Admin")
    assert [(r["leader"] >= 0, len(r["replicas"])) for r in rows] == [(True, 3)] * 2
    assert _ck_error(cadmin.create_partitions([NewPartitions(name, 1)])[name]) == \
        "INVALID_PARTITIONS"
    offsets = "__consumer_offsets"          # its count decides each group's partition
    assert _ck_error(cadmin.create_partitions([NewPartitions(offsets, 99)])[offsets]) == \
        "INVALID_REQUEST"

    _produce(cluster, name, 10, partition=1)
    tp = ck.TopicPartition(name, 1, 4)
    deleted = cadmin.delete_records([tp])[tp].result(60)
    assert deleted.low_watermark == 4
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": "unused"})
    try:
        assert consumer.get_watermark_offsets(ck.TopicPartition(name, 1), timeout=30) == \
            (4, 10)
    finally:
        consumer.close()
    row = cluster.admin().describe_topic(name)[1]
    assert (row["log_start_offset"], row["high_watermark"]) == (4, 10)
    past = ck.TopicPartition(name, 1, 11)
    assert _ck_error(cadmin.delete_records([past])[past]) == "OFFSET_OUT_OF_RANGE"

    cadmin.delete_topics([name], operation_timeout=30)[name].result(60)
    # answered once the metadata no longer lists it; its znodes go once every replica
    # is stopped (what raykafka's Admin.delete_topic waits for)
    wait_until(lambda: name not in cluster.admin().list_topics() and
               zk.exists(f"/brokers/topics/{name}") is None, timeout_s=30,
               what="the topic's znode gone")


def test_aiokafka_creates_describes_grows_and_deletes(cluster):
    """aiokafka's AIOKafkaAdminClient: create (CreateTopics v3), describe its configs,
    add a partition, delete; raykafka's Admin sees each step."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions as ANew, NewTopic as ATopic
    from aiokafka.admin.config_resource import ConfigResource as AResource
    from aiokafka.admin.config_resource import ConfigResourceType
    name = next(_names)

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([ATopic(name, 1, 2, topic_configs={
                "retention.ms": "7200000"})])
            seen = {"created": cluster.admin().topic_config(name)}
            described = await admin.describe_configs(
                [AResource(ConfigResourceType.TOPIC, name)])
            seen["described"] = {c[0]: c[1] for c in described[0].resources[0][4]}
            await admin.create_partitions({name: ANew(2)})
            # answered once the answering broker's metadata shows it; the Admin may ask
            # another broker, whose UpdateMetadata can come a moment later (as in Kafka)
            deadline = time.monotonic() + 30
            while len(cluster.admin().describe_topic(name)) < 2 and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            seen["grown"] = len(cluster.admin().describe_topic(name))
            await admin.delete_topics([name])
            return seen
        finally:
            await admin.close()

    seen = asyncio.run(run())
    assert seen["created"] == {"retention.ms": "7200000"}
    assert seen["described"]["retention.ms"] == "7200000"
    assert seen["grown"] == 2
    wait_until(lambda: name not in cluster.admin().list_topics(), timeout_s=30,
               what="the topic deleted")


def test_describe_cluster_from_both_clients(cluster, kadmin, cadmin):
    """DescribeCluster answers the cluster id, the controller and every broker's listener,
    as kafka-python and confluent-kafka read them."""
    md = _raw_call(cluster, wire.METADATA, 12, {"topics": []})
    brokers = sorted((b["node_id"], b["host"], b["port"]) for b in md["brokers"])
    kp = kadmin.describe_cluster()
    assert (kp["cluster_id"], kp["controller_id"]) == (md["cluster_id"], md["controller_id"])
    assert sorted((b["broker_id"], b["host"], b["port"]) for b in kp["brokers"]) == brokers
    cd = cadmin.describe_cluster().result(30)
    assert cd.cluster_id == md["cluster_id"] and cd.controller.id == md["controller_id"]
    assert sorted((n.id, n.host, n.port) for n in cd.nodes) == brokers
    raw = _raw_call(cluster, wire.DESCRIBE_CLUSTER, 2, {"endpoint_type": 2})
    assert raw["error_code"] == wire.ERRORS_BY_NAME["UNSUPPORTED_ENDPOINT_TYPE"].code


def test_bad_creates_answer_kafkas_error_codes_and_create_nothing(cluster, cadmin, kadmin):
    """An existing topic is TOPIC_ALREADY_EXISTS, a bad name INVALID_TOPIC_EXCEPTION, RF
    above the live brokers INVALID_REPLICATION_FACTOR, 0 partitions INVALID_PARTITIONS, an
    unknown config or bad value INVALID_CONFIG, a replica assignment naming a broker that
    does not exist INVALID_REPLICA_ASSIGNMENT; validate_only creates nothing. None of
    them is left in ZooKeeper."""
    taken = next(_names)
    cadmin.create_topics([NewTopic(taken, 1, 1)])[taken].result(60)
    cases = {
        taken: NewTopic(taken, 1, 1),
        "bad/name": NewTopic("bad/name", 1, 1),
        "rf-too-big": NewTopic("rf-too-big", 1, 4),
        "bad-config": NewTopic("bad-config", 1, 1, config={"no.such": "1"}),
        "bad-value": NewTopic("bad-value", 1, 1, config={"retention.ms": "x"}),
        "bad-assignment": NewTopic("bad-assignment", 1, replica_assignment=[[0, 7]]),
    }
    futures = cadmin.create_topics(list(cases.values()))
    got = {n: _ck_error(f) for n, f in futures.items()}
    # librdkafka names INVALID_TOPIC_EXCEPTION (17) TOPIC_EXCEPTION
    assert got == {taken: "TOPIC_ALREADY_EXISTS", "bad/name": "TOPIC_EXCEPTION",
                   "rf-too-big": "INVALID_REPLICATION_FACTOR", "bad-config": "INVALID_CONFIG",
                   "bad-value": "INVALID_CONFIG",
                   "bad-assignment": "INVALID_REPLICA_ASSIGNMENT"}
    answer = _raw_call(cluster, wire.CREATE_TOPICS, 4, {"topics": [
        {"name": "zero-parts", "num_partitions": 0, "replication_factor": 1,
         "assignments": [], "configs": []}], "timeout_ms": 5000})
    assert answer["topics"][0]["error_code"] == wire.ERRORS_BY_NAME["INVALID_PARTITIONS"].code
    checked = kadmin.create_topics([kafka.admin.NewTopic("only-checked", 2, 2)],
                                   validate_only=True)
    assert checked["topics"][0]["error_code"] == 0
    left = set(cluster.admin().list_topics())
    assert left.isdisjoint(set(cases) - {taken} | {"zero-parts", "only-checked"})


def test_list_offsets_by_time_latest_earliest_and_max_timestamp(cluster, cadmin):
    """ListOffsets v7 answers -1 (the high watermark), -2 (the log start), a time (the
    first record at or after it) and -3 (the record with the largest timestamp, KIP-734);
    confluent-kafka's offsets_for_times agrees."""
    name = next(_names)
    cadmin.create_topics([NewTopic(name, 1, 3)])[name].result(60)
    base = 1_700_000_000_000
    stamps = [base + 10 * i for i in range(5)] + [base + 1000, base + 500]
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0})
    for i, ts in enumerate(stamps):
        producer.produce(name, value=b"%d" % i, partition=0, timestamp=ts)
        producer.flush(30)                    # one batch per record: exact timestamps

    def offset_for(timestamp: int) -> tuple[int, int]:
        body = _raw_call(cluster, wire.LIST_OFFSETS, 7, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": name, "partitions": [
                {"partition_index": 0, "current_leader_epoch": -1,
                 "timestamp": timestamp}]}]}, broker=_leader(cluster, name))
        p = body["topics"][0]["partitions"][0]
        assert p["error_code"] == 0
        return p["timestamp"], p["offset"]

    assert offset_for(-1)[1] == 7
    assert offset_for(-2)[1] == 0
    assert offset_for(base + 15) == (base + 20, 2)
    assert offset_for(-3) == (base + 1000, 5)
    assert offset_for(base + 5000) == (-1, -1)
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": "unused"})
    try:
        found = consumer.offsets_for_times([ck.TopicPartition(name, 0, base + 15)],
                                           timeout=30)
        assert found[0].offset == 2
    finally:
        consumer.close()


def _leader(cluster, topic: str) -> int:
    """The index in ``bootstrap_servers`` of partition 0's leader broker."""
    leader = cluster.admin().describe_topic(topic)[0]["leader"]
    md = _raw_call(cluster, wire.METADATA, 12, {"topics": []})
    by_id = {b["node_id"]: f"{b['host']}:{b['port']}" for b in md["brokers"]}
    return cluster.bootstrap_servers.split(",").index(by_id[leader])


def test_incremental_config_ops_follow_kafkas_rules():
    """apply_config_ops (no cluster): SET and DELETE replace and remove, APPEND adds only
    list items not there yet, SUBTRACT removes them, both only for list configs; a name
    given twice or an unknown operation is InvalidConfigurationError."""
    from actors.errors import InvalidConfigurationError
    from actors.server.admin_manager import APPEND, DELETE, SET, SUBTRACT, apply_config_ops
    config = {"cleanup.policy": "compact", "retention.ms": "1"}
    assert apply_config_ops(config, [("cleanup.policy", APPEND, "delete,compact"),
                                     ("retention.ms", DELETE, None),
                                     ("segment.ms", SET, "10")]) == \
        {"cleanup.policy": "compact,delete", "segment.ms": "10"}
    assert apply_config_ops(config, [("cleanup.policy", SUBTRACT, "compact")]) == \
        {"cleanup.policy": "", "retention.ms": "1"}
    assert config == {"cleanup.policy": "compact", "retention.ms": "1"}     # not changed
    for ops in ([("retention.ms", APPEND, "2")], [("retention.ms", SUBTRACT, "1")],
                [("retention.ms", SET, "2"), ("retention.ms", DELETE, None)],
                [("retention.ms", 9, "2")]):
        with pytest.raises(InvalidConfigurationError):
            apply_config_ops(config, ops)


def test_an_unknown_topic_config_is_refused_with_every_accepted_name():
    """An unknown topic config name is InvalidConfigurationError listing every name a topic
    accepts, min.insync.replicas and unclean.leader.election.enable included (no cluster)."""
    from actors.errors import InvalidConfigurationError
    from actors.server.admin_manager import _validate_log_config
    _validate_log_config({"min.insync.replicas": "2", "retention.ms": "1"})
    with pytest.raises(InvalidConfigurationError) as info:
        _validate_log_config({"retention.ms": "1", "no.such.config": "1"})
    known = str(info.value).split("known: ")[1].split(", ")
    assert "'no.such.config'" in str(info.value)
    assert {"min.insync.replicas", "unclean.leader.election.enable", "retention.ms"} <= \
        set(known)


def test_describe_configs_never_shows_the_brokers_secrets():
    """A broker's secrets (sasl.jaas.config, also listener-scoped, ssl.key.password,
    zookeeper.auth.digest) are described as Kafka describes PASSWORD configs: value null,
    is_sensitive, in synonyms too; an ordinary setting keeps its value."""
    from actors.server.admin_handlers import PASSWORD, AdminApis
    fake = types.SimpleNamespace(broker_id=0, broker_config={
        "sasl.jaas.config": 'x required username="broker" password="p";',
        "listener.name.internal.scram-sha-512.sasl.jaas.config": "secret",
        "ssl.key.password": "k", "zookeeper.auth.digest": "raykafka:z",
        "num.partitions": "3"})
    entries = {e["name"]: e for e in AdminApis._broker_entries(fake, None, True, False)}
    for name in ("sasl.jaas.config", "listener.name.internal.scram-sha-512.sasl.jaas.config",
                 "ssl.key.password", "zookeeper.auth.digest"):
        e = entries[name]
        assert (e["value"], e["is_sensitive"], e["config_type"]) == (None, True, PASSWORD)
        assert [s["value"] for s in e["synonyms"]] == [None]
    assert (entries["num.partitions"]["value"], entries["num.partitions"]["is_sensitive"]) \
        == ("3", False)
