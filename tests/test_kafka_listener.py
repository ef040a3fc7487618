"""Every Broker actor serves Kafka's protocol (issue 21): a 3-broker cluster answered by
unmodified clients (confluent-kafka, kafka-python, kcat) through the brokers' listeners,
their endpoints in ZooKeeper and ``cluster.bootstrap_servers``, produce and consume at
RF=1 and RF=3 acks=all, interplay with raykafka's own clients, the Fetch long poll woken by
an append, and a leader's death seen by a librdkafka producer as retriable errors."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import time

import pytest

from actors import Cluster, wire
from tests.cluster_helpers import (FAST_CONFIG, local_ray, unique_namespace,  # noqa: F401
                                   wait_until, zk_client)

ck = pytest.importorskip("confluent_kafka")

N = 400


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811
    c = Cluster.start(3, namespace=unique_namespace("listener"), config=dict(FAST_CONFIG))
    yield c
    c.shutdown()


def _topic(cluster, name: str, partitions: int, rf: int) -> str:
    cluster.admin().create_topic(name, partitions=partitions, replication_factor=rf)
    # every partition has a leader that serves it (its LeaderAndIsr applied)
    wait_until(lambda: _leaders(cluster, name, partitions), timeout_s=60,
               what=f"leaders of {name}")
    return name


def _leaders(cluster, topic: str, partitions: int) -> dict | None:
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers})
    md = producer.list_topics(topic, timeout=10).topics[topic]
    leaders = {p: m.leader for p, m in md.partitions.items()}
    ok = md.error is None and len(leaders) == partitions and all(
        m.leader >= 0 and m.error is None for m in md.partitions.values())
    return leaders if ok else None


def _produce_confluent(cluster, topic: str, n: int, **config) -> list:
    delivered, errors = [], []

    def report(err, msg):
        (errors if err else delivered).append(err or (msg.partition(), msg.offset(),
                                                       msg.key(), msg.value()))

    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 2,
                            **config})
    for i in range(n):
        producer.produce(topic, key=b"k%d" % (i % 13), value=b"v%d" % i, on_delivery=report)
    assert producer.flush(60) == 0 and errors == []
    return delivered


def _consume_confluent(cluster, topic: str, partitions: int, n: int) -> dict:
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                         for p in range(partitions)])
        got: dict = {}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < n and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.setdefault(m.partition(), []).append((m.offset(), m.key(), m.value()))
        return got
    finally:
        consumer.close()


def _check_once_in_order(delivered: list, got: dict) -> None:
    want: dict = {}
    for partition, offset, key, value in delivered:
        want.setdefault(partition, []).append((offset, key, value))
    assert {p: sorted(v) for p, v in want.items()} == got
    for records in got.values():                 # per partition: the send order
        sent = [int(v[1:]) for _, _, v in records]
        assert sent == sorted(sent)


# -- tests ------------------------------------------------------------------------------------
def test_brokers_register_their_listeners_and_metadata_lists_them(cluster):
    """/brokers/ids/<id> holds host, port and endpoints ["PLAINTEXT://host:port"];
    bootstrap_servers lists those; a Metadata request to any broker names all three by
    broker id and each partition's leader as the controller elected it."""
    zk = zk_client(cluster)
    try:
        bodies = {b: json.loads(zk.get(f"/brokers/ids/{b}")[0]) for b in range(3)}
    finally:
        zk.stop()
        zk.close()
    for body in bodies.values():
        assert body["endpoints"] == [f"PLAINTEXT://{body['host']}:{body['port']}"]
        assert body["host"] == "127.0.0.1" and body["port"] > 0
    assert cluster.bootstrap_servers == ",".join(
        f"{bodies[b]['host']}:{bodies[b]['port']}" for b in range(3))
    _topic(cluster, "meta", 3, 2)
    for address in cluster.bootstrap_servers.split(","):
        md = ck.Producer({"bootstrap.servers": address}).list_topics("meta", timeout=10)
        assert {b: (m.host, m.port) for b, m in md.brokers.items()} == {
            b: (bodies[b]["host"], bodies[b]["port"]) for b in range(3)}
        described = {d["partition"]: d for d in cluster.admin().describe_topic("meta")}
        for p, m in md.topics["meta"].partitions.items():
            assert (m.leader, sorted(m.replicas)) == (
                described[p]["leader"], sorted(described[p]["replicas"]))
            assert sorted(m.isrs) == sorted(described[p]["isr"])


@pytest.mark.parametrize("rf", [1, 3])
def test_confluent_kafka_produces_and_consumes_every_record_once_in_order(cluster, rf):
    """confluent-kafka (acks=all) produces N keyed records to 3 partitions; a Consumer with
    assigned partitions reads each exactly once, in send order per partition."""
    topic = _topic(cluster, f"ck-rf{rf}", 3, rf)
    delivered = _produce_confluent(cluster, topic, N, acks="all")
    _check_once_in_order(delivered, _consume_confluent(cluster, topic, 3, N))


def test_kafka_python_produces_and_consumes(cluster):
    """kafka-python 3.0 (idempotence off: InitProducerId is not served yet) writes N keyed
    records with acks=all to an RF=3 topic and reads them back with assigned partitions."""
    kafka = pytest.importorskip("kafka")
    topic = _topic(cluster, "kp", 3, 3)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all",
                                   enable_idempotence=False)
    futures = [producer.send(topic, key=b"k%d" % (i % 13), value=b"v%d" % i)
               for i in range(N)]
    producer.flush(60)
    delivered = [(m.partition, m.offset, b"k%d" % (i % 13), b"v%d" % i)
                 for i, m in enumerate(f.get(30) for f in futures)]
    producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers,
                                   enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.assign([kafka.TopicPartition(topic, p) for p in range(3)])
    got: dict = {}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < N and time.monotonic() < deadline:
        for tp, records in consumer.poll(1000).items():
            got.setdefault(tp.partition, []).extend((r.offset, r.key, r.value)
                                                    for r in records)
    consumer.close()
    _check_once_in_order(delivered, got)


def test_kcat_lists_produces_and_consumes(cluster):
    """kcat: -L names the three brokers, -P writes keyed lines, -C -e reads them back."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    topic = _topic(cluster, "kc", 2, 1)
    bootstrap = cluster.bootstrap_servers
    listed = subprocess.run(["kcat", "-b", bootstrap, "-L", "-t", topic],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "3 brokers:" in listed.stdout, listed.stdout
    lines = "".join(f"key{i}:value{i}\n" for i in range(N))
    produced = subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K:"],
                              input=lines, capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning",
                               "-e", "-f", "%k:%s\n"], capture_output=True, text=True,
                              timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.splitlines()) == sorted(lines.splitlines())


def test_kcat_producing_to_a_topic_nobody_created_creates_it(cluster):
    """auto.create.topics.enable (Kafka's default, on): kcat -P to a new topic gets it
    created with num.partitions and default.replication.factor (1 and 1) from its
    Metadata request, delivers every line, and kcat -C reads them back."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    bootstrap = cluster.bootstrap_servers
    lines = "".join(f"line{i}\n" for i in range(50))
    produced = subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", "auto-kcat"],
                              input=lines, capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0 and "failed" not in produced.stderr, produced.stderr
    parts = cluster.admin().describe_topic("auto-kcat")
    assert [(p["partition"], len(p["replicas"])) for p in parts] == [(0, 1)]
    consumed = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", "auto-kcat", "-o",
                               "beginning", "-e", "-q"], capture_output=True, text=True,
                              timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == lines.splitlines()


def test_metadata_creates_a_topic_only_when_asked_and_allowed(cluster):
    """A Metadata request naming an unknown topic: with allow_auto_topic_creation it is
    answered LEADER_NOT_AVAILABLE and the topic is created (its leaders follow); without
    it, UNKNOWN_TOPIC_OR_PARTITION and nothing is created; an invalid name is
    INVALID_TOPIC_EXCEPTION; the offsets topic is never made by Metadata; a listing (null
    topics) creates nothing."""
    from actors.connection import KafkaConnection
    host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    conn = KafkaConnection(host, int(port))
    admin = cluster.admin()
    before = set(admin.list_topics())

    def codes(names, allow):
        answer = conn.request(wire.METADATA, {
            "topics": [{"name": n} for n in names], "allow_auto_topic_creation": allow}
        ).result(60)
        return {t["name"]: t["error_code"] for t in answer["topics"]}

    try:
        err = wire.ERRORS_BY_NAME
        assert codes(["auto-not-asked"], False) == {
            "auto-not-asked": err["UNKNOWN_TOPIC_OR_PARTITION"].code}
        # (the offsets topic exists once a test of the module used a group)
        assert codes(["bad name!", "__consumer_offsets"], True) == {
            "bad name!": err["INVALID_TOPIC_EXCEPTION"].code,
            "__consumer_offsets": wire.NONE if "__consumer_offsets" in before
            else err["UNKNOWN_TOPIC_OR_PARTITION"].code}
        conn.request(wire.METADATA, {"topics": None, "allow_auto_topic_creation": True}
                     ).result(60)
        assert set(admin.list_topics()) == before
        assert codes(["auto-asked"], True) == {"auto-asked": err["LEADER_NOT_AVAILABLE"].code}
        cluster.metadata.wait_for_leaders("auto-asked", timeout_s=60)
        assert set(admin.list_topics()) == before | {"auto-asked"}
        wait_until(lambda: codes(["auto-asked"], True) == {"auto-asked": wire.NONE},
                   timeout_s=30, what="every broker's metadata to show auto-asked")
    finally:
        conn.close()


def test_raykafka_and_confluent_kafka_read_each_others_records(cluster):
    """Records raykafka's Producer wrote (through Ray) are read by confluent-kafka through
    the listeners, and records confluent-kafka wrote are read by raykafka's SimpleConsumer."""
    topic = _topic(cluster, "mixed", 2, 3)
    producer = cluster.producer(acks="all")
    sent = [producer.send(topic, value=b"ray%d" % i, partition=i % 2) for i in range(50)]
    producer.flush(60)
    assert all(f.get(30) for f in sent)
    got = _consume_confluent(cluster, topic, 2, 50)
    assert sorted(v for records in got.values() for _, _, v in records) == sorted(
        b"ray%d" % i for i in range(50))
    ends = {p: len(records) for p, records in got.items()}
    confluent = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(50):
        confluent.produce(topic, value=b"ck%d" % i, partition=i % 2)
    assert confluent.flush(60) == 0
    simple = cluster.simple_consumer()
    for p in (0, 1):
        records = simple.fetch(topic, p, ends[p])
        assert [r.value for r in records] == [b"ck%d" % i for i in range(p, 50, 2)]


def test_status_shows_the_listeners_and_bootstrap_prints_only_them(cluster, capsys,
                                                                   monkeypatch):
    """`raykafka status` has a kafka line with bootstrap_servers; `status --bootstrap`
    prints that string alone (for `--bootstrap-server $(raykafka status --bootstrap)`)."""
    from actors.tools import cli, daemon
    monkeypatch.setattr(daemon, "require_ready", lambda ns: {
        "pid": 0, "ray_address": "local", "started_at": time.time()})
    expected = cluster.bootstrap_servers
    capsys.readouterr()
    assert cli.main(["status", "--namespace", cluster.namespace]) == 0
    assert f"kafka       {expected}  (bootstrap.servers)" in capsys.readouterr().out
    assert cli.main(["status", "--bootstrap", "--namespace", cluster.namespace]) == 0
    assert capsys.readouterr().out == expected + "\n"


def _raw_fetch(address: str, topic: str, offset: int, max_wait_ms: int) -> tuple[float, dict]:
    """One Fetch v12 of partition 0 on a plain socket: (seconds to the answer, body)."""
    host, port = address.split(":")
    header = wire.RequestHeader(wire.FETCH, 12, 1, "longpoll")
    body = {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        start = time.monotonic()
        sock.sendall(wire.encode_request(header, body))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
        took = time.monotonic() - start
    return took, wire.decode_response(wire.FETCH, 12, frame)[1]


def test_a_long_poll_fetch_is_answered_when_data_arrives(cluster):
    """A consumer's Fetch with max_wait 10 s parked at the end of an RF=3 partition answers
    with the record produced meanwhile, in well under the wait (the replica's watch wakes
    the broker's purgatory), not at max_wait; with nothing produced it answers at max_wait."""
    import concurrent.futures
    topic = _topic(cluster, "longpoll", 1, 3)
    leader = _leaders(cluster, topic, 1)[0]
    address = cluster.bootstrap_servers.split(",")[leader]
    took, _ = _raw_fetch(address, topic, 0, 300)          # nothing there: the full wait
    assert 0.25 <= took < 5
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        parked = pool.submit(_raw_fetch, address, topic, 0, 10_000)
        time.sleep(0.5)
        sent = time.monotonic()
        producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                "acks": "all", "linger.ms": 0})
        producer.produce(topic, value=b"wake up", partition=0)
        assert producer.flush(30) == 0
        took, body = parked.result(30)
    answered_after = time.monotonic() - sent
    part = body["responses"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["high_watermark"] == 1
    assert b"wake up" in bytes(part["records"])
    assert answered_after < 3.0 and took < 6.0


def test_fuzzed_frames_at_every_broker_lose_nothing_acknowledged(cluster):
    """Thousands of random and mutated frames (oversized sizes, garbage, flipped bytes in
    valid Produce/Fetch/Metadata/ListOffsets/OffsetForLeaderEpoch requests) sent to all
    three brokers' listeners while confluent-kafka produces with acks=all to an RF=3 topic:
    every acknowledged record is read back once, in order, and every broker still answers
    Metadata afterwards."""
    import random
    import threading

    from storage.records import build
    from tests.fuzz_helpers import mutated_frames, send_round
    topic = _topic(cluster, "fuzzed", 1, 3)
    rng = random.Random(21)
    fetch = {"replica_id": -1, "max_wait_ms": 50, "min_bytes": 1, "max_bytes": 1 << 20,
             "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                 {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                  "fetch_offset": 0, "log_start_offset": -1,
                                                  "partition_max_bytes": 1 << 20}]}],
             "forgotten_topics_data": []}
    valid = [wire.encode_request(wire.RequestHeader(key, version, 5, "fuzz"), body)
             for key, version, body in (
                 (wire.PRODUCE, 9, {"acks": 1, "timeout_ms": 100, "topic_data": [
                     {"name": "fuzz-junk", "partition_data": [
                         {"index": 0, "records": bytes(build([b"junk"]))}]}]}),
                 (wire.FETCH, 12, fetch),
                 (wire.METADATA, 12, {"topics": None}),
                 (wire.LIST_OFFSETS, 7, {"topics": [{"name": topic, "partitions": [
                     {"partition_index": 0, "timestamp": -1}]}]}),
                 (wire.OFFSET_FOR_LEADER_EPOCH, 4, {"topics": [{"topic": topic, "partitions": [
                     {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]}))]
    addresses = [(h, int(p)) for h, p in
                 (a.rsplit(":", 1) for a in cluster.bootstrap_servers.split(","))]
    delivered, errors = [], []
    done = threading.Event()

    def produce():
        producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                "acks": "all", "linger.ms": 1, "message.timeout.ms": 60000})
        for i in range(2000):
            producer.produce(topic, value=b"r%d" % i, partition=0,
                             on_delivery=lambda err, msg: (errors if err else delivered)
                             .append(err or msg.value()))
            if i % 100 == 0:
                producer.poll(0.02)
        producer.flush(90)
        done.set()

    writer = threading.Thread(target=produce)
    writer.start()
    sent = 0
    while (not done.is_set() or sent < 1500) and sent < 20000:
        frames = mutated_frames(rng, valid, garbage=0.25, bad_size=0.05)
        sent += len(frames)
        send_round(rng.choice(addresses), frames)
    writer.join(120)
    assert errors == [] and len(delivered) == 2000
    got = _consume_confluent(cluster, topic, 1, 2000)
    assert [v for _, _, v in got[0]] == delivered
    assert sorted(delivered) == sorted(b"r%d" % i for i in range(2000))
    for address in addresses:
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(wire.encode_request(wire.RequestHeader(wire.METADATA, 12, 9, "after"),
                                             {"topics": None}))
            size = struct.unpack(">i", sock.recv(4))[0]
            assert size > 0


def test_a_killed_leader_gives_retriable_errors_and_the_producer_goes_on(cluster):
    """With a librdkafka producer writing acks=all to an RF=3 topic, killing the leader's
    broker makes its requests fail retriably; the producer refreshes its metadata, finds
    the new leader and every later record is delivered (none lost among the acknowledged,
    no hang). Last: it leaves broker ``leader`` down."""
    topic = _topic(cluster, "failover", 1, 3)
    leader = _leaders(cluster, topic, 1)[0]
    errors, delivered = [], []

    def report(err, msg):
        (errors if err else delivered).append(err or msg.value())

    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                            "linger.ms": 0, "message.timeout.ms": 60000,
                            "retry.backoff.ms": 100})
    for i in range(100):
        producer.produce(topic, value=b"before%d" % i, partition=0, on_delivery=report)
    assert producer.flush(30) == 0 and not errors
    cluster.kill_broker(leader)
    start = time.monotonic()
    for i in range(100):
        producer.produce(topic, value=b"after%d" % i, partition=0, on_delivery=report)
        producer.poll(0)
    assert producer.flush(90) == 0, "the producer hung on the dead leader"
    took = time.monotonic() - start
    assert not errors, errors[:3]
    new_leader = _leaders(cluster, topic, 1)[0]
    assert new_leader != leader
    got = _consume_confluent(cluster, topic, 1, 200)
    assert [v for _, _, v in got[0]] == [b"before%d" % i for i in range(100)] + [
        b"after%d" % i for i in range(100)]
    assert took < 60
