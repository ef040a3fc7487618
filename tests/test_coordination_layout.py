"""Pure tests of coordination/: znode paths and JSON bodies, replica placement, the retry
policy. No ZooKeeper needed."""

import collections
import json
import random
import re

import pytest
from kazoo.exceptions import ConnectionLoss, NoNodeError

from coordination import zk_layout as L
from coordination.errors import (InvalidPartitionsError, InvalidReplicaAssignmentError,
                                 InvalidReplicationFactorError, ZkDataError,
                                 ZkUnavailableError)
from coordination.placement import (assign_replicas_to_brokers, rack_alternated_brokers,
                                    replica_index)
from coordination.retry import RetryPolicy


# -- layout -------------------------------------------------------------------------------

def test_paths_are_the_seeds_paths():
    """Every path builder yields the seed's path."""
    assert L.broker_path(3) == "/brokers/ids/3"
    assert L.topic_path("t") == "/brokers/topics/t"
    assert L.partition_state_path("t", 2) == "/brokers/topics/t/partitions/2/state"
    assert L.topic_config_path("t") == "/config/topics/t"
    assert L.delete_topic_path("t") == "/admin/delete_topics/t"
    assert L.consumer_id_path("g", "g_h-1-ab") == "/consumers/g/ids/g_h-1-ab"
    assert L.consumer_owner_path("g", "t", 1) == "/consumers/g/owners/t/1"
    assert L.consumer_offset_path("g", "t", 1) == "/consumers/g/offsets/t/1"
    assert L.chroot_for("dev") == "/raykafka-dev"
    for bad in ("a/b", "", ".", ".."):
        with pytest.raises(ValueError):
            L.topic_path(bad)
    with pytest.raises(ValueError):
        L.broker_path(-1)


def test_bodies_match_the_seed_schemas_exactly():
    """Each encoder writes the keys and value types of seeds 000/001 (Kafka's formats)."""
    assert json.loads(L.ControllerInfo(broker_id=0, timestamp_ms=1525741822769).to_bytes()) == \
        {"version": 1, "brokerid": 0, "timestamp": "1525741822769"}
    assert json.loads(L.encode_topic_assignment({2: [1, 2, 3], 0: (3, 0, 1)})) == \
        {"version": 1, "partitions": {"0": [3, 0, 1], "2": [1, 2, 3]}}
    assert json.loads(L.PartitionState(leader=3, leader_epoch=0, isr=(3, 0, 1),
                                       controller_epoch=1).to_bytes()) == \
        {"controller_epoch": 1, "leader": 3, "version": 1, "leader_epoch": 0, "isr": [3, 0, 1]}
    assert json.loads(L.encode_topic_config({"retention.ms": 1000})) == \
        {"version": 1, "config": {"retention.ms": "1000"}}
    assert L.encode_int(7) == b"7" and L.decode_int("/controller_epoch", b"7") == 7
    assert json.loads(L.encode_reassignment({("Foo", 1): [0, 1, 3]})) == \
        {"version": 1, "partitions": [{"topic": "Foo", "partition": 1, "replicas": [0, 1, 3]}]}
    assert json.loads(L.encode_partition_list([("Foo", 1), ("Bar", 0)])) == \
        {"version": 1, "partitions": [{"topic": "Bar", "partition": 0},
                                      {"topic": "Foo", "partition": 1}]}
    reg = L.ConsumerRegistration(subscription={"topic2": 1}, pattern="white_list",
                                 timestamp_ms=1525747915336)
    assert json.loads(reg.to_bytes()) == {"version": 1, "subscription": {"topic2": 1},
                                          "pattern": "white_list", "timestamp": "1525747915336"}
    broker = json.loads(L.BrokerInfo(broker_id=1, host="hadoop1", port=9092, rack="r1",
                                     timestamp_ms=1525741823119).to_bytes())
    assert broker == {"version": 4, "host": "hadoop1", "port": 9092,
                      "endpoints": ["PLAINTEXT://hadoop1:9092"],
                      "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
                      "rack": "r1", "jmx_port": -1, "timestamp": "1525741823119"}


def test_bodies_round_trip_and_read_the_seed_examples():
    """Decoders read back what encoders write and the seeds' own example bodies."""
    seed_state = b'{"controller_epoch": 1,"leader": 3,"version": 1,"leader_epoch": 0,"isr": [3, 0, 1]}'
    assert L.PartitionState.from_bytes("t", 0, seed_state) == L.PartitionState(
        leader=3, leader_epoch=0, isr=(3, 0, 1), controller_epoch=1)
    seed_broker = b'{"jmx_port": -1,"timestamp":"1525741823119","version": 1,"host": "hadoop1","port": 9092}'
    info = L.BrokerInfo.from_bytes(1, seed_broker)
    assert (info.host, info.port, info.rack, info.endpoints) == \
        ("hadoop1", 9092, None, ("PLAINTEXT://hadoop1:9092",))
    assert L.ControllerInfo.from_bytes(b'{"version": 1,"brokerid": 0,"timestamp": "1525741822769"}') \
        == L.ControllerInfo(broker_id=0, timestamp_ms=1525741822769)
    assert L.decode_topic_assignment("t", b'{"version": 1,"partitions": {"2": [1, 2, 3],"1": [0, 1, 2],"0": [3, 0, 1]}}') \
        == {0: (3, 0, 1), 1: (0, 1, 2), 2: (1, 2, 3)}
    b = L.BrokerInfo(broker_id=2, host="h", port=1, rack=None, timestamp_ms=5)
    assert L.BrokerInfo.from_bytes(2, b.to_bytes()) == b
    assert L.decode_topic_config("t", L.encode_topic_config({"a": "b"})) == {"a": "b"}
    assert L.decode_reassignment(L.encode_reassignment({("t", 0): [1, 2]})) == {("t", 0): (1, 2)}
    assert L.decode_config_change(L.encode_config_change("t")) == "t"


def test_bad_bodies_raise_zk_data_error():
    """Malformed znode bodies fail with ZkDataError, never a KeyError or silent default."""
    for data in (b"", b"not json", b"[1]", b'{"leader": 1}', b'{"leader":"x","leader_epoch":0,"isr":[],"controller_epoch":1}'):
        with pytest.raises(ZkDataError):
            L.PartitionState.from_bytes("t", 0, data)
    with pytest.raises(ZkDataError):
        L.decode_int("/controller_epoch", b"abc")


def test_cluster_id_is_22_url_safe_base64_chars():
    """new_cluster_id gives Kafka's 22-char URL-safe base64 id; the body is Kafka's."""
    ids = {L.new_cluster_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{22}", i) for i in ids)
    cid = ids.pop()
    assert json.loads(L.encode_cluster_id(cid)) == {"version": "1", "id": cid}
    assert L.decode_cluster_id(L.encode_cluster_id(cid)) == cid


# -- placement ----------------------------------------------------------------------------

def test_placement_matches_kafkas_table_for_5_brokers_10_partitions_rf3():
    """start index 0 reproduces AdminUtils' documented assignment (Kafka's AdminTest)."""
    assert assign_replicas_to_brokers({b: None for b in range(5)}, partitions=10,
                                      replication_factor=3, start_index=0) == {
        0: (0, 1, 2), 1: (1, 2, 3), 2: (2, 3, 4), 3: (3, 4, 0), 4: (4, 0, 1),
        5: (0, 2, 3), 6: (1, 3, 4), 7: (2, 4, 0), 8: (3, 0, 1), 9: (4, 1, 2)}


def test_rack_alternation_and_rack_aware_placement_match_kafkas_test():
    """Kafka's AdminRackAwareTest: the alternated list and the 7-partition assignment."""
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated_brokers(racks) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated_brokers({k: v for k, v in racks.items() if k != 5}) == [0, 3, 1, 4, 2]
    assert assign_replicas_to_brokers(racks, partitions=7, replication_factor=3,
                                      start_index=0, replica_shift=0) == {
        0: (0, 3, 1), 1: (3, 1, 5), 2: (1, 5, 4), 3: (5, 4, 2), 4: (4, 2, 0), 5: (2, 0, 3),
        6: (0, 4, 2)}


def test_seed_003_order_for_two_racks_of_three():
    """Seed 003: racks {0,1,2} and {3,4,5} are walked as 0,3,1,4,2,5."""
    assert rack_alternated_brokers({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}) == \
        [0, 3, 1, 4, 2, 5]


@pytest.mark.parametrize("seed", range(20))
def test_placement_spreads_leaders_and_never_doubles_a_replica(seed):
    """For random sizes and starts: leaders differ by <= 1 per broker, replica counts by a
    small bound, and no partition has a broker twice."""
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    rf = rng.randint(1, n)
    parts = rng.randint(1, 40)
    a = assign_replicas_to_brokers({b * 10: None for b in range(n)}, partitions=parts,
                                   replication_factor=rf, rng=rng)
    assert sorted(a) == list(range(parts))
    leaders = collections.Counter(r[0] for r in a.values())
    counts = [leaders.get(b * 10, 0) for b in range(n)]
    assert max(counts) - min(counts) <= 1
    for replicas in a.values():
        assert len(replicas) == rf == len(set(replicas))
    replicas = collections.Counter(b for r in a.values() for b in r)
    if parts % n == 0:
        assert max(replicas.values()) - min(replicas.get(b * 10, 0) for b in range(n)) <= rf


@pytest.mark.parametrize("seed", range(20))
def test_rack_aware_placement_spans_min_rf_racks(seed):
    """With racks, every partition uses min(RF, #racks) racks and no broker twice."""
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    nracks = rng.randint(1, n)
    brokers = {b: f"r{rng.randrange(nracks)}" for b in range(n)}
    num_racks = len(set(brokers.values()))
    rf = rng.randint(1, n)
    a = assign_replicas_to_brokers(brokers, partitions=rng.randint(1, 30),
                                   replication_factor=rf, rng=rng)
    for replicas in a.values():
        assert len(set(replicas)) == rf
        assert len({brokers[b] for b in replicas}) == min(rf, num_racks)


def test_placement_errors_are_typed_and_clear():
    """RF > brokers, RF < 1, partitions < 1 and mixed rack info raise typed errors."""
    with pytest.raises(InvalidReplicationFactorError, match="larger than available brokers: 2"):
        assign_replicas_to_brokers({0: None, 1: None}, partitions=1, replication_factor=3)
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas_to_brokers({0: None}, partitions=1, replication_factor=0)
    with pytest.raises(InvalidPartitionsError):
        assign_replicas_to_brokers({0: None}, partitions=0, replication_factor=1)
    with pytest.raises(InvalidReplicaAssignmentError, match="rack"):
        assign_replicas_to_brokers({0: "a", 1: None}, partitions=1, replication_factor=1)


def test_replica_index_never_hits_the_leader():
    """Kafka's replicaIndex shift lies in 1..n-1."""
    for n in range(2, 8):
        for first in range(n):
            for shift in range(3 * n):
                for j in range(n - 1):
                    assert replica_index(first, shift, j, n) != first


def test_added_partitions_continue_the_round_robin():
    """start_partition_id continues leaders where the first call stopped (addPartitions)."""
    whole = assign_replicas_to_brokers({b: None for b in range(4)}, partitions=8,
                                       replication_factor=2, start_index=1)
    tail = assign_replicas_to_brokers({b: None for b in range(4)}, partitions=4,
                                      replication_factor=2, start_index=1, start_partition_id=4,
                                      replica_shift=1)
    assert {p: whole[p] for p in range(4, 8)} == tail


# -- retry --------------------------------------------------------------------------------

def test_retry_retries_only_listed_errors_within_bounds():
    """Retryable errors are retried up to max_attempts; others pass through at once."""
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionLoss()
        return "ok"
    policy = RetryPolicy(max_attempts=5, deadline_s=5, base_delay_s=0.001)
    assert policy.run(flaky) == "ok" and len(calls) == 3
    calls.clear()

    def missing():
        calls.append(1)
        raise NoNodeError()
    with pytest.raises(NoNodeError):
        policy.run(missing)
    assert len(calls) == 1

    def down():
        raise ConnectionLoss()
    with pytest.raises(ZkUnavailableError, match="gave up after 5 attempts"):
        policy.run(down)


def test_retry_respects_its_deadline():
    """The deadline stops retrying even with attempts left (fake clock, no sleeping)."""
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += 1.0

    def down():
        raise ConnectionLoss()
    with pytest.raises(ZkUnavailableError):
        RetryPolicy(max_attempts=1000, deadline_s=3.0, base_delay_s=10, max_delay_s=10).run(
            down, sleep=sleep, clock=lambda: now[0])
    assert len(slept) <= 3


def test_connect_strings_split_into_servers_and_chroot_as_kafka_reads_them():
    """split_connect/zookeeper_connect read Kafka's zookeeper.connect: a given chroot is kept,
    a missing one becomes the namespace's, and malformed ones raise ValueError."""
    assert L.split_connect("h1:1,h2:2") == ("h1:1,h2:2", "")
    assert L.split_connect("h1:1,h2:2/kafka/prod") == ("h1:1,h2:2", "/kafka/prod")
    assert L.zookeeper_connect("127.0.0.1:2181", "dev") == "127.0.0.1:2181/raykafka-dev"
    assert L.zookeeper_connect("127.0.0.1:2181/mine", "dev") == "127.0.0.1:2181/mine"
    for bad in ("", "  ", "/chroot-only", "h:1/", "h:1/a//b", "h:1/a/..", None):
        with pytest.raises(ValueError):
            L.split_connect(bad)


def test_zk_settings_take_the_chroot_from_the_connect_string_first():
    """ZkSettings: a chroot in hosts wins over the namespace's; no chroot and no namespace
    means the server's root."""
    from coordination.session import ZkSettings
    assert ZkSettings("h:1/x", namespace="dev").connection_string == "h:1/x"
    assert ZkSettings("h:1", namespace="dev").connection_string == "h:1/raykafka-dev"
    assert ZkSettings("h:1").connection_string == "h:1"
    assert ZkSettings("h:1/x/y", namespace="dev").servers == "h:1"
