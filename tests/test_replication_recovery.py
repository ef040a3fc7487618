"""Replication through cluster-level faults (issue 8, fault tests 4, 7, 8 and 9), against a
real ZooKeeper and a local Ray: the controller's broker killed during a leader election,
the ZooKeeper server stopped for 10 s under load, the two KIP-101 scenarios, and a
reassignment under load. RF=3, min.insync.replicas=2, acks=all, a producer writing
sequence-numbered records the whole time; each test asserts the invariant (nothing
acknowledged lost, one value per offset, replicas byte-identical below the high watermark).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from actors import Cluster
from cluster_helpers import (unique_namespace, wait_registered_with_controller, wait_until,
                             zk_client)
from replication_helpers import (CONFIG, TOPIC_CONFIG, SequenceProducer,
                                 assert_no_acknowledged_loss, disk_bytes_below, leader_of,
                                 partition_row, partition_story, read_committed,
                                 wait_for_full_isr, wait_replicas_converged)
from replication_helpers import local_ray  # noqa: F401 - autouse: this module's Ray


def _start(num_brokers: int) -> Cluster:
    return Cluster.start(num_brokers=num_brokers, namespace=unique_namespace("recover"),
                         config=CONFIG)


@pytest.fixture
def cluster():
    c = _start(3)
    yield c
    c.shutdown()


@pytest.fixture
def cluster4():
    c = _start(4)
    yield c
    c.shutdown()


def _check(cluster, topic, acked, partition=0):
    """No acknowledged loss, and every replica byte-identical below the high watermark."""
    assert_no_acknowledged_loss(acked, read_committed(cluster, topic, partition), cluster,
                                topic, partition)
    row = partition_row(cluster, topic, partition)
    hw = wait_replicas_converged(cluster, topic, partition)[0]["high_watermark"]
    images = {b: disk_bytes_below(cluster, b, topic, partition, hw) for b in row["replicas"]}
    assert len(set(images.values())) == 1, {b: len(v) for b, v in images.items()}


def _kill_together(cluster, broker_ids):
    """Kill several brokers at the same moment (one thread each), as a shared fault would."""
    threads = [threading.Thread(target=cluster.kill_broker, args=(b,)) for b in broker_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def test_the_controllers_broker_killed_during_an_election(cluster4):
    """Kill a partition's leader, and at once the broker of the controller that is electing
    its replacement: a new controller (higher epoch) finishes the election from ZooKeeper's
    state, every partition gets a live leader, and nothing acknowledged is lost."""
    admin = cluster4.admin()
    admin.create_topic("elect", partitions=4, replication_factor=3, config=TOPIC_CONFIG)
    controller = cluster4.controller_id()
    rows = cluster4.metadata.refresh()["topics"]["elect"]
    # a partition without a replica on the controller's broker keeps two in-sync replicas
    # after both kills, so its producer can go on
    p = next(p for p, r in sorted(rows.items()) if controller not in r["replicas"])
    epoch_before = zk_controller_epoch(cluster4)
    producer = SequenceProducer(cluster4, "elect", partition=p).start()
    try:
        producer.wait_for_more(200)
        leader = leader_of(cluster4, "elect", p)
        cluster4.kill_broker(leader)
        cluster4.kill_broker(controller)
        def story():
            return partition_story(cluster4, "elect", p)
        wait_until(lambda: cluster4.controller_id() not in (-1, controller, leader),
                   timeout_s=30, what="a new controller", detail=story)
        assert zk_controller_epoch(cluster4) > epoch_before
        wait_until(lambda: leader_of(cluster4, "elect", p) not in (-1, leader, controller),
                   timeout_s=30, what="a new leader", detail=story)
        producer.wait_for_more(200)

        def all_led():
            live = set(cluster4.broker_ids()) - {leader, controller}
            now = cluster4.metadata.refresh()["topics"]["elect"]
            return all(r["leader"] in live for r in now.values())
        wait_until(all_led, timeout_s=30, what="every partition led by a live broker")
        cluster4.start_broker(leader)
        cluster4.start_broker(controller)
        wait_for_full_isr(cluster4, "elect", p, timeout_s=60)
        producer.wait_for_more(100)
    finally:
        acked = producer.stop()
    _check(cluster4, "elect", acked, p)


def zk_controller_epoch(cluster) -> int:
    zk = zk_client(cluster)
    try:
        return int(zk.get("/controller_epoch")[0])
    finally:
        zk.stop()
        zk.close()


@pytest.fixture
def patient_cluster():
    """Kafka's default 18 s sessions: a ZooKeeper server that returns gives each session
    a fresh timeout, and every broker must reconnect within it (with 3 s a session
    expired at load average ~30)."""
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("zkout"),
                      config={**CONFIG, "zookeeper.session.timeout.ms": 18000})
    yield c
    c.shutdown()


def _sessions(cluster) -> dict:
    from cluster_helpers import ray
    return {b: ray.get(cluster.broker(b).session_id.remote(), timeout=30)
            for b in cluster.broker_ids()}


def test_zookeeper_stopped_for_ten_seconds_under_load_elects_nobody(patient_cluster):
    """The ZooKeeper server stopped for 10 s while acks=all writes go on: when it returns,
    every broker keeps its session, every partition keeps its leader and leader epoch (no
    spurious election), the writes go on, and nothing acknowledged is lost."""
    cluster = patient_cluster
    admin = cluster.admin()
    admin.create_topic("outage", partitions=3, replication_factor=3, config=TOPIC_CONFIG)
    producers = [SequenceProducer(cluster, "outage", partition=p, tag=f"p{p}").start()
                 for p in range(3)]
    acked = {}
    try:
        for prod in producers:
            prod.wait_for_more(100)
        for p in range(3):
            wait_for_full_isr(cluster, "outage", p)
        before = {p: (r["leader"], r["leader_epoch"])
                  for p, r in cluster.metadata.refresh()["topics"]["outage"].items()}
        sessions = _sessions(cluster)
        server = cluster._zk_server
        server.stop()
        try:
            stopped_at = time.monotonic()
            # the fault lasts 10 s; meanwhile the writes are carried by Ray alone
            while time.monotonic() - stopped_at < 10:
                time.sleep(0.5)
        finally:
            server.restart()
        wait_registered_with_controller(cluster, [0, 1, 2])
        for prod in producers:
            prod.wait_for_more(100)
        # kazoo names its session only while connected: wait until every broker is
        # connected again, then the ids say whether the sessions survived
        after_sessions = wait_until(
            lambda: (lambda got: got if None not in got.values() else None)(_sessions(cluster)),
            timeout_s=60, what="every broker connected to ZooKeeper again")
        assert after_sessions == sessions, "a broker's session expired"
        after = {p: (r["leader"], r["leader_epoch"])
                 for p, r in cluster.metadata.refresh(newest=True)["topics"]["outage"].items()}
        assert after == before, "an election happened although no broker was lost"
    finally:
        for p, prod in enumerate(producers):
            acked[p] = prod.stop()
    for p in range(3):
        _check(cluster, "outage", acked[p], p)


def test_kip101_a_restarted_follower_becomes_leader_without_losing_records(cluster):
    """KIP-101 scenario 1: a follower restarts (it must not truncate to its possibly stale
    high watermark) and, as soon as it is back in the ISR, the leader dies, so the
    restarted follower is elected: nothing acknowledged is lost, no replica diverges."""
    cluster.admin().create_topic("kip101a", partitions=1, replication_factor=3,
                                 config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "kip101a").start()
    try:
        producer.wait_for_more(200)
        wait_for_full_isr(cluster, "kip101a")
        row = partition_row(cluster, "kip101a")
        leader = row["leader"]
        # the follower that comes first in assignment order is the one elected next
        follower = [b for b in row["replicas"] if b != leader][0]
        cluster.kill_broker(follower)
        wait_until(lambda: follower not in partition_row(cluster, "kip101a")["isr"],
                   timeout_s=30, what="the killed follower out of the ISR")
        producer.wait_for_more(100)
        cluster.start_broker(follower)
        wait_until(lambda: follower in partition_row(cluster, "kip101a")["isr"],
                   timeout_s=60, interval_s=0.02, what="the restarted follower in the ISR")
        cluster.kill_broker(leader)
        wait_until(lambda: leader_of(cluster, "kip101a") not in (-1, leader), timeout_s=30,
                   what="a new leader", detail=lambda: partition_story(cluster, "kip101a"))
        assert leader_of(cluster, "kip101a") == follower
        producer.wait_for_more(100)
        cluster.start_broker(leader)
        wait_for_full_isr(cluster, "kip101a", timeout_s=60)
        producer.wait_for_more(50)
    finally:
        acked = producer.stop()
    _check(cluster, "kip101a", acked)


def test_kip101_leader_and_follower_crash_together_and_return_in_the_other_order(cluster):
    """KIP-101 scenario 2: with the third replica down, the leader and its follower crash at
    the same moment; the follower returns first (then the third replica), the old leader
    last. Whatever is elected meanwhile, the old leader truncates its divergent tail by
    leader epoch: nothing acknowledged is lost and the replicas end identical."""
    cluster.admin().create_topic("kip101b", partitions=1, replication_factor=3,
                                 config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster, "kip101b").start()
    try:
        producer.wait_for_more(200)
        wait_for_full_isr(cluster, "kip101b")
        row = partition_row(cluster, "kip101b")
        leader = row["leader"]
        follower, third = [b for b in row["replicas"] if b != leader]
        cluster.kill_broker(third)
        wait_until(lambda: third not in partition_row(cluster, "kip101b")["isr"],
                   timeout_s=30, what="the third replica out of the ISR")
        producer.wait_for_more(100)
        _kill_together(cluster, [leader, follower])
        cluster.start_broker(follower)
        cluster.start_broker(third)
        # the old leader's records may still be the only copy of the last acknowledged ones:
        # the partition either is led by the returned follower (it had them all) or waits
        # offline for the old leader; both are allowed, losing them is not
        cluster.start_broker(leader)
        wait_for_full_isr(cluster, "kip101b", timeout_s=90)
        producer.wait_for_more(100)
    finally:
        acked = producer.stop()
    _check(cluster, "kip101b", acked)


def test_reassignment_under_load_moves_the_partition_without_loss(cluster4):
    """A partition reassigned to a replica set that adds the fourth broker and drops the
    leader, while acks=all writes go on: leadership moves into the new set, the removed
    replica's directory is deleted, nothing acknowledged is lost and the new replicas are
    identical."""
    admin = cluster4.admin()
    admin.create_topic("moving", partitions=1, replication_factor=3, config=TOPIC_CONFIG)
    producer = SequenceProducer(cluster4, "moving").start()
    try:
        producer.wait_for_more(200)
        row = partition_row(cluster4, "moving")
        leader = row["leader"]
        newcomer = next(b for b in cluster4.broker_ids() if b not in row["replicas"])
        target = [newcomer] + [b for b in row["replicas"] if b != leader]
        admin.reassign_partitions({("moving", 0): target}, timeout_s=120)
        # every broker's metadata cache catches up (the call returned on the newest one)
        now = wait_until(lambda: (lambda r: r if r["replicas"] == target else None)(
            partition_row(cluster4, "moving")), timeout_s=30, what="metadata of the move")
        assert now["leader"] in target
        producer.wait_for_more(200)
    finally:
        acked = producer.stop()
    gone = os.path.join(cluster4.data_dir, f"broker-{leader}", "moving-0")
    wait_until(lambda: not os.path.exists(gone), timeout_s=30,
               what="the removed replica's directory deleted")
    _check(cluster4, "moving", acked)


def test_killing_the_controllers_broker_does_not_wait_for_its_session_timeout():
    """With a 20 s ZooKeeper session timeout, the controller's broker is killed: a standby
    sees the controller's actor die (Ray) and ends its session, so a new controller is
    elected and the partitions the dead broker led have new leaders within seconds, far
    below the session timeout."""
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("ctl"),
                      config={**CONFIG, "zookeeper.session.timeout.ms": 20000})
    try:
        c.admin().create_topic("fast", partitions=3, replication_factor=3,
                               config=TOPIC_CONFIG)
        controller = c.controller_id()
        led = [p for p, r in c.metadata.refresh()["topics"]["fast"].items()
               if r["leader"] == controller]
        assert led, "each broker leads one of the three partitions"
        killed_at = time.monotonic()
        c.kill_broker(controller)

        def all_led_elsewhere():
            rows = c.metadata.refresh()["topics"]["fast"]
            return all(rows[p]["leader"] not in (-1, controller) for p in led)
        wait_until(all_led_elsewhere, timeout_s=15, interval_s=0.02,
                   what="new leaders before the 20 s session timeout")
        took = time.monotonic() - killed_at
        print(f"\nthe controller's broker killed: partitions led again after {took:.2f}s")
        # every broker's metadata names the new controller soon (caches lag one another)
        wait_until(lambda: c.controller_id() not in (-1, controller), timeout_s=15,
                   what="the new controller in the metadata")
    finally:
        c.shutdown()
