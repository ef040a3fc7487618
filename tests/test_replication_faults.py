"""Replication under faults (issue 8), against a real ZooKeeper and a local Ray: RF=3,
min.insync.replicas=2, acks=all, a producer writing sequence-numbered records the whole
time. Each test asserts the invariant (no acknowledged record lost, replicas identical
below the high watermark, nothing acknowledged by a deposed leader), not just "no error"."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from actors import Cluster
from actors.errors import NotEnoughReplicasError
from cluster_helpers import ray, unique_namespace, wait_until, zk_client
from replication_helpers import (CONFIG, LAG_MS, TOPIC_CONFIG, SequenceProducer,
                                 assert_no_acknowledged_loss, disk_bytes_below, leader_of,
                                 partition_row, partition_story, read_committed,
                                 wait_for_full_isr, wait_replicas_converged, zk_partition_state)
from replication_helpers import local_ray  # noqa: F401 - autouse: this module's Ray


@pytest.fixture
def cluster():
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("repl"), config=CONFIG)
    yield c
    c.shutdown()


def _identical_below_hw(cluster, topic, partition=0):
    """Every replica's segment files hold the same bytes below the high watermark."""
    row = partition_row(cluster, topic, partition)
    hw = wait_replicas_converged(cluster, topic, partition)[0]["high_watermark"]
    images = {b: disk_bytes_below(cluster, b, topic, partition, hw) for b in row["replicas"]}
    assert len(set(images.values())) == 1, {b: len(v) for b, v in images.items()}
    return hw


def test_killing_the_leader_five_times_loses_no_acknowledged_record(cluster):
    """The leader's broker killed 5 times in a row (chasing the current leader, restarted each
    time) under acks=all: every acknowledged record is readable afterwards at its offset, and
    the three replicas end byte-identical below the high watermark."""
    cluster.admin().create_topic("chase", partitions=1, replication_factor=3,
                                 config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "chase").start()
    longest_s = 0.0
    try:
        producer.wait_for_more(200)
        for _ in range(5):
            wait_for_full_isr(cluster, "chase")
            old = leader_of(cluster, "chase")
            killed_at = time.monotonic()
            cluster.kill_broker(old)
            wait_until(lambda: leader_of(cluster, "chase") not in (-1, old), timeout_s=30,
                       interval_s=0.02, what="a new leader",
                       detail=lambda: partition_story(cluster, "chase"))
            longest_s = max(longest_s, time.monotonic() - killed_at)
            producer.wait_for_more(100)
            cluster.start_broker(old)
        wait_for_full_isr(cluster, "chase")
        producer.wait_for_more(100)
    finally:
        acked = producer.stop()
    print(f"\nlongest time without a leader after a kill: {longest_s:.2f}s; "
          f"{len(acked)} acknowledged, {len(producer.errors)} failed sends")
    assert_no_acknowledged_loss(acked, read_committed(cluster, "chase"), cluster, "chase")
    _identical_below_hw(cluster, "chase")


def test_a_paused_follower_leaves_the_isr_and_rejoins_after_catching_up(cluster):
    """A follower whose broker is paused leaves the ISR within replica.lag.time.max.ms + 1 s
    (acks=all writes go on with 2 in sync), and rejoins once resumed and caught up."""
    cluster.admin().create_topic("lag", partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "lag").start()
    try:
        producer.wait_for_more(100)
        row = partition_row(cluster, "lag")
        # not the controller's broker: pausing that one stalls every ISR change until its
        # session expires (the controller itself is paused), a different fault
        controller = cluster.controller_id()
        follower = [b for b in row["replicas"] if b not in (row["leader"], controller)][0]
        cluster.pause_broker(follower)
        paused_at = time.monotonic()
        try:
            wait_until(lambda: follower not in partition_row(cluster, "lag")["isr"],
                       timeout_s=(LAG_MS / 1000) + 10, what="the paused follower out of the ISR")
            assert time.monotonic() - paused_at <= LAG_MS / 1000 + 1 + 1.5  # + polling slack
            producer.wait_for_more(100)
        finally:
            cluster.resume_broker(follower)
        wait_for_full_isr(cluster, "lag", timeout_s=60)
        producer.wait_for_more(50)
    finally:
        acked = producer.stop()
    assert_no_acknowledged_loss(acked, read_committed(cluster, "lag"), cluster, "lag")
    _identical_below_hw(cluster, "lag")


def test_a_leader_alone_refuses_acks_all_and_stays_offline_without_unclean_election(cluster):
    """With both followers paused the ISR shrinks to the leader: acks=all is refused with
    NotEnoughReplicasError, acks=1 succeeds; killing that leader then leaves the partition
    offline (unclean election off) even after the stale followers return."""
    admin = cluster.admin()
    admin.create_topic("alone", partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    row = partition_row(cluster, "alone")
    leader = row["leader"]
    followers = [b for b in row["replicas"] if b != leader]
    for b in followers:
        cluster.pause_broker(b)
    try:
        wait_until(lambda: partition_row(cluster, "alone")["isr"] == [leader],
                   timeout_s=LAG_MS / 1000 + 15, what="the ISR shrunk to the leader")
        strict = cluster.producer(acks="all", retries=0, linger_ms=0)
        with pytest.raises(NotEnoughReplicasError):
            strict.send("alone", b"refused", partition=0).get(timeout=30)
        strict.close(timeout=10)
        loose = cluster.producer(acks=1, linger_ms=0)
        meta = loose.send("alone", b"acks-one", partition=0).get(timeout=30)
        loose.close(timeout=10)
        assert meta.offset >= 0
        cluster.kill_broker(leader)
    finally:
        for b in followers:
            cluster.resume_broker(b)
    wait_until(lambda: partition_row(cluster, "alone")["leader"] == -1, timeout_s=30,
               what="the partition offline")
    # the stale followers are alive again, but not in sync: the controller keeps the
    # partition offline (its decision is in ZooKeeper; a resumed broker's cache may still
    # show the old leader until its UpdateMetadata arrives, so the caches are waited for)
    zk = zk_client(cluster)
    try:
        time_limit = time.monotonic() + 5
        while time.monotonic() < time_limit:
            state = zk_partition_state(zk, "alone")
            assert state.leader == -1, partition_story(cluster, "alone")
            time.sleep(0.2)
        wait_until(lambda: all(r["leader"] == -1 for r in admin.describe_topic("alone")),
                   timeout_s=15, what="the brokers' metadata showing the partition offline",
                   detail=lambda: partition_story(cluster, "alone"))
        assert zk_partition_state(zk, "alone").leader == -1
    finally:
        zk.stop()
        zk.close()


def test_unclean_election_elects_a_stale_replica_and_loses_what_it_missed(cluster):
    """With unclean.leader.election.enable=true the same scenario elects a stale follower:
    the partition is available again, and the acks=1 record the old leader alone had is
    gone (the check can see loss)."""
    admin = cluster.admin()
    admin.create_topic("unclean", partitions=1, replication_factor=3,
                       config={**TOPIC_CONFIG, "unclean.leader.election.enable": "true"})
    row = partition_row(cluster, "unclean")
    leader = row["leader"]
    followers = [b for b in row["replicas"] if b != leader]
    for b in followers:
        cluster.pause_broker(b)
    try:
        wait_until(lambda: partition_row(cluster, "unclean")["isr"] == [leader],
                   timeout_s=LAG_MS / 1000 + 15, what="the ISR shrunk to the leader")
        loose = cluster.producer(acks=1, linger_ms=0)
        # a paused follower's long poll already waiting at the leader is answered by the
        # next append (the answer waits in its socket until it resumes): spend those on a
        # first record, so that the second one reaches no follower at all
        loose.send("unclean", b"reaches-the-waiting-polls", partition=0).get(timeout=30)
        meta = loose.send("unclean", b"only-on-the-leader", partition=0).get(timeout=30)
        loose.close(timeout=10)
        cluster.kill_broker(leader)
    finally:
        for b in followers:
            cluster.resume_broker(b)
    wait_until(lambda: partition_row(cluster, "unclean")["leader"] in followers, timeout_s=30,
               what="a stale follower elected",
               detail=lambda: partition_story(cluster, "unclean"))
    values = {r.offset: r.value for r in read_committed(cluster, "unclean")}
    assert values.get(meta.offset) != b"only-on-the-leader"


def _expire_session(cluster, broker_id):
    """Kazoo's session-clone trick: a second client on the broker's session, closed."""
    broker = cluster.broker(broker_id)
    sid = ray.get(broker.session_id.remote(), timeout=30)
    password = ray.get(broker.session_password.remote(), timeout=30)
    twin = KazooClient(hosts=cluster.zk_hosts, client_id=(sid, password), timeout=10.0)
    twin.start(timeout=15)
    twin.stop()
    twin.close()


def test_a_leader_whose_session_expires_acknowledges_nothing_after_its_replacement(cluster):
    """The leader's ZooKeeper session expires: a new leader is elected, the old one is fenced
    (a produce straight to it is refused) and rejoins as a follower; no acknowledged record
    is lost and the replicas end identical."""
    cluster.admin().create_topic("expire", partitions=1, replication_factor=3,
                                 config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "expire").start()
    try:
        producer.wait_for_more(100)
        old = leader_of(cluster, "expire")
        epoch = partition_row(cluster, "expire")["leader_epoch"]
        _expire_session(cluster, old)
        wait_until(lambda: partition_row(cluster, "expire")["leader_epoch"] > epoch,
                   timeout_s=30, what="a new leader epoch")
        producer.wait_for_more(100)
        wait_for_full_isr(cluster, "expire", timeout_s=60)
    finally:
        acked = producer.stop()
    assert_no_acknowledged_loss(acked, read_committed(cluster, "expire"), cluster, "expire")
    _identical_below_hw(cluster, "expire")


def test_a_paused_leader_past_its_session_timeout_is_a_fenced_zombie(cluster):
    """The leader's broker paused longer than the ZooKeeper session timeout, then resumed: a
    replacement is elected meanwhile, the zombie acknowledges nothing afterwards, rejoins as
    a follower, and no acknowledged record is lost."""
    cluster.admin().create_topic("zombie", partitions=1, replication_factor=3,
                                 config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "zombie").start()
    try:
        producer.wait_for_more(100)
        old = leader_of(cluster, "zombie")
        cluster.pause_broker(old)
        try:
            wait_until(lambda: leader_of(cluster, "zombie") not in (-1, old), timeout_s=30,
                       what="a replacement leader")
            producer.wait_for_more(100)
        finally:
            cluster.resume_broker(old)
        wait_for_full_isr(cluster, "zombie", timeout_s=60)
        producer.wait_for_more(50)
    finally:
        acked = producer.stop()
    assert_no_acknowledged_loss(acked, read_committed(cluster, "zombie"), cluster, "zombie")
    _identical_below_hw(cluster, "zombie")
