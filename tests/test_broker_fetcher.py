"""Replication over Kafka's protocol (issue 21): a follower broker runs one fetcher thread
per leader broker, sending one Fetch for all the partitions it follows there, and hands the
bytes to its local follower replicas; the replicas do not fetch for themselves."""

from __future__ import annotations

import pytest

from actors import Cluster
from tests.cluster_helpers import (FAST_CONFIG, local_ray, ray, unique_namespace,  # noqa: F401
                                   wait_until)
from tests.replication_helpers import (disk_bytes_below, partition_row, replica_state,
                                       wait_for_full_isr, wait_replicas_converged)

ck = pytest.importorskip("confluent_kafka")

PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811
    c = Cluster.start(3, namespace=unique_namespace("bfetch"),
                      config={**FAST_CONFIG, "min.insync.replicas": 2})
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def topic(cluster):
    name = "fetched"
    cluster.admin().create_topic(name, partitions=PARTITIONS, replication_factor=3,
                                 config={"min.insync.replicas": "2"})
    for p in range(PARTITIONS):
        wait_for_full_isr(cluster, name, p)
    return name


def _fetchers(cluster, broker_id: int) -> list[dict]:
    return ray.get(cluster.broker(broker_id).fetcher_status.remote(), timeout=30)


def test_one_fetcher_thread_per_leader_broker_carries_every_followed_partition(cluster, topic):
    """Each broker has one fetcher per other leader broker, and its partitions are exactly
    the ones led there that this broker follows; no replica runs a fetcher of its own."""
    rows = {p: partition_row(cluster, topic, p) for p in range(PARTITIONS)}
    for b in cluster.broker_ids():
        want: dict[int, set] = {}
        for p, row in rows.items():
            if row["leader"] != b and b in row["replicas"]:
                want.setdefault(row["leader"], set()).add(f"{topic}-{p}")
        got = {}
        for f in _fetchers(cluster, b):
            mine = {k for k in f["partitions"] if k.startswith(f"{topic}-")}
            if mine:
                got[f["leader"]] = mine
        assert got == want, f"broker {b}"
        for p in range(PARTITIONS):
            assert replica_state(cluster, b, topic, p)["fetcher_alive"] is False


def test_acks_all_from_a_kafka_client_is_replicated_byte_identically(cluster, topic):
    """confluent-kafka produces with acks=all to every partition; every acknowledged record
    is on every replica's disk, the same bytes on all three."""
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                            "linger.ms": 1})
    errors = []
    for i in range(600):
        producer.produce(topic, value=b"r%d" % i, partition=i % PARTITIONS,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0
    assert errors == []
    for p in range(PARTITIONS):
        wait_replicas_converged(cluster, topic, p)
        row = partition_row(cluster, topic, p)
        end = replica_state(cluster, row["leader"], topic, p)["high_watermark"]
        assert end >= 100
        copies = {b: disk_bytes_below(cluster, b, topic, p, end) for b in row["replicas"]}
        assert len(set(copies.values())) == 1, f"partition {p} differs between replicas"


def test_a_new_leader_moves_the_partition_to_the_fetcher_toward_it(cluster, topic):
    """After a preferred-leader change (leadership moved by a reassignment of the order),
    the followers fetch the partition from the new leader's broker, and acks=all works."""
    p = 0
    row = partition_row(cluster, topic, p)
    old, new = row["leader"], [b for b in row["replicas"] if b != row["leader"]][0]
    order = [new] + [b for b in row["replicas"] if b != new]
    admin = cluster.admin()
    admin.reassign_partitions({(topic, p): order})
    admin.elect_preferred_leaders(topic)
    wait_until(lambda: partition_row(cluster, topic, p)["leader"] == new, timeout_s=60,
               what="the new leader")
    key = f"{topic}-{p}"

    def followed_from_new():
        for b in (x for x in order if x != new):
            homes = [f["leader"] for f in _fetchers(cluster, b) if key in f["partitions"]]
            if homes != [new]:
                return False
        return True

    wait_until(followed_from_new, timeout_s=60, what="followers fetching from the new leader")
    assert not any(key in f["partitions"] for f in _fetchers(cluster, new))
    producer = cluster.producer(acks="all", linger_ms=0)
    try:
        meta = producer.send(topic, b"after-move", partition=p).get(30)
    finally:
        producer.close()
    wait_replicas_converged(cluster, topic, p)
    assert meta.offset >= 0 and old in partition_row(cluster, topic, p)["isr"]
