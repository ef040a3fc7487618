"""Partition health (under-replicated, offline) and reassignment from the client side:
the pure pieces (markers, counts, plan parsing, the CLI's rendering) without a cluster,
then Admin against a real cluster (local Ray, embedded ZooKeeper)."""

from __future__ import annotations

import pytest

from actors import Cluster
from actors.client.admin import (health_summary, parse_reassignment, partition_health,
                                 reassignment_json)
from actors.errors import (IllegalArgumentError, InvalidReplicaAssignmentError,
                           InvalidTopicError, UnknownTopicOrPartitionError)
from actors.tools.cli import describe_lines, status_topic_lines
from cluster_helpers import (FAST_CONFIG, local_ray, unique_namespace,  # noqa: F401
                             wait_until)


def st(leader, isr, replicas, epoch=0):
    return {"leader": leader, "isr": isr, "replicas": replicas, "leader_epoch": epoch}


# -- pure ------------------------------------------------------------------------------------
def test_partition_health_from_leader_isr_and_replicas():
    """No leader is offline (not also under-replicated); a leader with an ISR smaller than
    the replicas is under-replicated; a full ISR is neither."""
    assert partition_health(st(-1, [1], [1, 2])) == {"offline": True,
                                                     "under_replicated": False}
    assert partition_health(st(1, [1], [1, 2])) == {"offline": False,
                                                    "under_replicated": True}
    assert partition_health(st(1, [2, 1], [1, 2])) == {"offline": False,
                                                       "under_replicated": False}


def test_health_summary_counts_over_topics():
    """health_summary counts partitions, under-replicated and offline over every topic."""
    topics = {"a": {0: st(1, [1], [1, 2]), 1: st(-1, [2], [2])},
              "b": {0: st(0, [0, 1, 2], [0, 1, 2])}}
    assert health_summary(topics) == {"partitions": 3, "under_replicated": 1, "offline": 1}


def test_status_and_describe_lines_mark_partitions_at_risk():
    """`status` prints the counts and lists each partition at risk with its marker;
    `topics describe` counts them in the header and marks each line; the filters keep only
    the marked partitions."""
    topics = {"a": {0: st(1, [1], [1, 2]), 1: st(-1, [2], [2]), 2: st(0, [0, 1], [0, 1])}}
    text = "\n".join(status_topic_lines(topics))
    assert "partitions  3 (1 under-replicated, 1 offline)" in text
    assert "under-replicated 1  OFFLINE 1" in text
    assert "UNDER-REPLICATED  a-0  leader 1" in text and "OFFLINE           a-1" in text
    rows = [{"partition": p, **s, **partition_health(s), "log_start_offset": 0,
             "high_watermark": 5} for p, s in topics["a"].items()]
    lines = describe_lines("a", rows, {})
    assert "UnderReplicated: 1\tOffline: 1" in lines[0]
    assert lines[1].endswith("\tUNDER-REPLICATED") and lines[2].endswith("\tOFFLINE")
    assert "Leader: none" in lines[2] and not lines[3].endswith("REPLICATED")
    only = describe_lines("a", rows, {}, only={"under_replicated"})
    assert len(only) == 1 and "Partition: 0" in only[0]


def test_parse_reassignment_takes_both_shapes():
    """A {(topic, partition): replicas} dict and Kafka's JSON shape parse to the same
    plan, which reassignment_json turns back into Kafka's shape."""
    kafka = {"version": 1, "partitions": [
        {"topic": "t", "partition": 1, "replicas": [2, 0], "log_dirs": ["any", "any"]},
        {"topic": "t", "partition": 0, "replicas": [1]}]}
    plan = parse_reassignment(kafka)
    assert plan == parse_reassignment({("t", 1): [2, 0], ("t", 0): [1]})
    assert reassignment_json(plan) == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [1]},
        {"topic": "t", "partition": 1, "replicas": [2, 0]}]}


@pytest.mark.parametrize("plan, error", [
    ({}, InvalidReplicaAssignmentError),
    ({("t", 0): []}, InvalidReplicaAssignmentError),
    ({("t", 0): [1, 1]}, InvalidReplicaAssignmentError),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1]},
                                   {"topic": "t", "partition": 0, "replicas": [2]}]},
     InvalidReplicaAssignmentError),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1],
                                    "log_dirs": ["/data"]}]}, InvalidReplicaAssignmentError),
    ({("bad name", 0): [1]}, InvalidTopicError),
    ({("t", -1): [1]}, IllegalArgumentError),
    ({("t", True): [1]}, IllegalArgumentError),
    ({("t", 0): [1, "2"]}, IllegalArgumentError),
    ({("t", 0): 1}, IllegalArgumentError),
    ({"t": [1]}, IllegalArgumentError),
    ([("t", 0, [1])], IllegalArgumentError),
    ({"version": 2, "partitions": []}, IllegalArgumentError),
    ({"version": 1, "partitions": [{"topic": "t", "replicas": [1]}]}, IllegalArgumentError),
])
def test_parse_reassignment_refuses_bad_plans_with_typed_errors(plan, error):
    """Each malformed plan raises its typed error before any request is sent."""
    with pytest.raises(error):
        parse_reassignment(plan)


# -- against a real cluster --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(local_ray):
    """One 3-broker cluster for the module (the test that kills a broker starts it again)."""
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("health"), config=FAST_CONFIG)
    yield c
    c.shutdown()


def test_a_killed_broker_shows_under_replicated_and_offline_partitions(cluster):
    """With broker 2 killed, describe_topic marks the RF=2 partitions it held as
    under-replicated (the controller drops it from their ISR) and the RF=1 partitions it
    led as offline; cluster_health counts them."""
    admin = cluster.admin()
    admin.create_topic("urp", partitions=3, replication_factor=2)
    admin.create_topic("solo", partitions=3, replication_factor=1)
    assert admin.cluster_health()["under_replicated"] == 0
    held = {p for p, s in cluster.metadata.refresh()["topics"]["urp"].items()
            if 2 in s["replicas"]}
    led = {p for p, s in cluster.metadata.refresh()["topics"]["solo"].items()
           if s["replicas"] == [2]}
    assert held and led, "placement spreads over all three brokers"
    cluster.kill_broker(2)
    try:
        def settled():
            urp = {r["partition"]: r for r in admin.describe_topic("urp")}
            solo = {r["partition"]: r for r in admin.describe_topic("solo")}
            return ({p for p, r in urp.items() if r["under_replicated"]} == held
                    and {p for p, r in solo.items() if r["offline"]} == led)

        wait_until(settled, timeout_s=60, what="describe_topic shows the lost broker")
        health = admin.cluster_health()
        assert health["under_replicated"] == len(held) and health["offline"] == len(led)
        assert {(t, p) for t, p, _ in health["partitions_at_risk"]} == \
            {("urp", p) for p in held} | {("solo", p) for p in led}
    finally:
        cluster.start_broker(2)


def test_reassign_partitions_moves_a_partition_and_keeps_its_records(cluster):
    """Admin.reassign_partitions returns once the metadata shows the new replica set; the
    records written before are still read from the new leader; an unknown partition is
    refused before any request."""
    admin = cluster.admin()
    admin.create_topic("moved", partitions=1, replication_factor=1)
    old = cluster.metadata.refresh()["topics"]["moved"][0]["replicas"]
    with cluster.producer(acks="all") as producer:
        producer.send_batch("moved", [b"r%d" % i for i in range(100)]).wait(timeout=60)
    target = [b for b in (0, 1, 2) if b not in old][:2]
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.reassign_partitions({("moved", 5): target})
    admin.reassign_partitions({("moved", 0): target}, timeout_s=120)
    state = cluster.metadata.refresh(newest=True)["topics"]["moved"][0]
    assert state["replicas"] == target and state["leader"] in target
    consumer = cluster.simple_consumer()
    got = wait_until(lambda: consumer.fetch("moved", 0, 0), timeout_s=60,
                     what="records served by the new leader")
    assert [r.value for r in got][:3] == [b"r0", b"r1", b"r2"]
