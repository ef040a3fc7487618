"""Consumer groups on the brokers' Kafka listeners (issue 22): unmodified confluent-kafka,
kafka-python 3.0 and aiokafka consumers and raykafka's own Consumer in the same groups,
served by one group coordinator: partitions shared (each owned by exactly one member, as
the coordinator says), committed offsets shared and resumed after a restart, range,
roundrobin and cooperative-sticky with any client leading, static membership, the admin
clients' list/describe/delete of groups, and zstd from raykafka's producer read by
confluent-kafka. One 3-broker cluster for the module."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time

import pytest

from actors import Cluster, wire
from actors.errors import IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError
from tests.cluster_helpers import (FAST_CONFIG, kafka_python_subscribe,  # noqa: F401
                                   local_ray, unique_namespace, wait_topic_on_every_broker,
                                   wait_until)

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

PARTITIONS = 4
CONFIG = {**FAST_CONFIG, "group.initial.rebalance.delay.ms": 0,
          "offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 1,
          "group.min.session.timeout.ms": 3000}
_names = (f"g{i}" for i in itertools.count())
#: confluent-kafka's answers to a commit that a rebalance refused.
_CONFLUENT_REBALANCE_CODES = {ck.KafkaError.REBALANCE_IN_PROGRESS,
                              ck.KafkaError.ILLEGAL_GENERATION,
                              ck.KafkaError.UNKNOWN_MEMBER_ID}


class _ConfluentRefused(Exception):
    """A confluent-kafka commit that a rebalance refused (one of the codes above)."""


def _confluent_commit(consumer) -> None:
    """confluent-kafka's synchronous commit, its refusals by a rebalance raised as
    ``_ConfluentRefused``; nothing new to commit is not an error."""
    try:
        consumer.commit(asynchronous=False)
    except ck.KafkaException as exc:
        code = exc.args[0].code()
        if code == ck.KafkaError._NO_OFFSET:
            return
        if code in _CONFLUENT_REBALANCE_CODES:
            raise _ConfluentRefused(code) from exc
        raise


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811
    c = Cluster.start(3, namespace=unique_namespace("kgroups"), config=dict(CONFIG))
    yield c
    c.shutdown()


@pytest.fixture(scope="module", autouse=True)
def kafka_python_coordinator_debug():
    """kafka-python's group coordination logged at DEBUG, which pytest shows only for a
    failed case: a kafka-python member that never joined its group (seen in full-suite
    runs, never alone) left nothing to read."""
    logger = logging.getLogger("kafka.coordinator")
    before = logger.level
    logger.setLevel(logging.DEBUG)
    yield
    logger.setLevel(before)


def _topic(cluster, partitions: int = PARTITIONS, rf: int = 1) -> str:
    name = f"t-{next(_names)}"
    cluster.admin().create_topic(name, partitions=partitions, replication_factor=rf)
    wait_topic_on_every_broker(cluster, name, partitions)
    return name


def _produce(cluster, topic: str, n: int, start: int = 0) -> None:
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 2})
    errors = []
    for i in range(start, start + n):
        producer.produce(topic, value=b"v%d" % i, partition=i % PARTITIONS,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and errors == []


class Member:
    """One consumer of one client polling in a thread of its own (a rebalance needs every
    member to poll): ``records`` [(partition, offset, value)], ``owned`` its assignment
    after its last poll; ``commit=True`` commits synchronously after every poll with
    records. A commit the group refuses because it rebalances (the client may refuse it
    itself, as kafka-python does once a heartbeat has said so) is what Kafka's consumer
    docs tell an application to retry: poll again (that rejoins), then commit again; so
    it is retried after every poll until one is taken."""

    def __init__(self, kind: str, cluster, group: str, topic: str, *,
                 strategy: str = "range", commit: bool = False, instance_id: str | None = None,
                 session_timeout_ms: int = 30_000):
        self.kind, self.cluster, self.group, self.topic = kind, cluster, group, topic
        self.strategy, self.commit, self.instance_id = strategy, commit, instance_id
        self.session_timeout_ms = session_timeout_ms
        self.records: list = []
        self.owned: set = set()
        self.refused_commits = 0                 # commits a rebalance refused, retried
        self._commit_due = False
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=kind)

    def start(self) -> "Member":
        self._thread.start()
        assert self._started.wait(60), f"{self.kind} did not start"
        return self

    def stop(self) -> None:
        """Stop polling and close the consumer; raises what its thread met."""
        self._stop.set()
        if not self._thread.ident:
            return                                 # never started
        self._thread.join(60)
        assert not self._thread.is_alive(), f"{self.kind} did not stop"
        assert self.error is None, self.error

    def _should_commit(self, got) -> bool:
        self._commit_due = self.commit and (self._commit_due or bool(got))
        return self._commit_due

    def _committed(self, refused: bool) -> None:
        """After a commit: taken, or refused by a rebalance (then due after the next
        poll)."""
        self._commit_due = refused
        self.refused_commits += refused

    def _commit_sync(self, commit, refused: tuple) -> None:
        """One synchronous ``commit()``: taken, or refused by a rebalance (an instance of
        ``refused``: due again after the next poll); any other error is raised."""
        try:
            commit()
        except refused:
            self._committed(True)
        else:
            self._committed(False)

    def _run(self) -> None:
        try:
            getattr(self, "_run_" + self.kind.replace("-", "_"))()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
            self._started.set()

    def _run_confluent(self) -> None:
        conf = {"bootstrap.servers": self.cluster.bootstrap_servers, "group.id": self.group,
                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                "partition.assignment.strategy": self.strategy,
                "session.timeout.ms": self.session_timeout_ms}
        if self.instance_id:
            conf["group.instance.id"] = self.instance_id
        consumer = ck.Consumer(conf)
        consumer.subscribe([self.topic])
        self._started.set()
        try:
            while not self._stop.is_set():
                got = [m for m in consumer.consume(500, 0.2) if m.error() is None]
                self.records += [(m.partition(), m.offset(), m.value()) for m in got]
                self.owned = {tp.partition for tp in consumer.assignment()}
                if self._should_commit(got):
                    self._commit_sync(lambda: _confluent_commit(consumer), (_ConfluentRefused,))
        finally:
            consumer.close()

    def _run_kafka_python(self) -> None:
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        assignor = {"range": RangePartitionAssignor,
                    "roundrobin": RoundRobinPartitionAssignor,
                    "cooperative-sticky": CooperativeStickyAssignor}[self.strategy]
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=self.cluster.bootstrap_servers,
            group_id=self.group, auto_offset_reset="earliest", enable_auto_commit=False,
            partition_assignment_strategy=[assignor], group_instance_id=self.instance_id,
            session_timeout_ms=self.session_timeout_ms)
        try:
            kafka_python_subscribe(consumer, self.topic)
            self._started.set()
            while not self._stop.is_set():
                got = consumer.poll(200)
                for tp, msgs in got.items():
                    self.records += [(tp.partition, m.offset, m.value) for m in msgs]
                self.owned = {tp.partition for tp in consumer.assignment()}
                if self._should_commit(got):
                    self._commit_sync(consumer.commit, (
                        kafka.errors.CommitFailedError, kafka.errors.RebalanceInProgressError,
                        kafka.errors.IllegalGenerationError, kafka.errors.UnknownMemberIdError))
        finally:
            consumer.close()

    def _run_aiokafka(self) -> None:
        asyncio.run(self._aiokafka())

    async def _aiokafka(self) -> None:
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        assignor = {"range": RangePartitionAssignor,            # aiokafka has no
                    "roundrobin": RoundRobinPartitionAssignor}[self.strategy]  # cooperative
        consumer = aiokafka.AIOKafkaConsumer(
            self.topic, bootstrap_servers=self.cluster.bootstrap_servers,
            group_id=self.group, auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=self.session_timeout_ms,
            partition_assignment_strategy=(assignor,))
        await consumer.start()
        self._started.set()
        try:
            while not self._stop.is_set():
                got = await consumer.getmany(timeout_ms=200)
                for tp, msgs in got.items():
                    self.records += [(tp.partition, m.offset, m.value) for m in msgs]
                self.owned = {tp.partition for tp in consumer.assignment()}
                if self._should_commit(got):
                    try:
                        await consumer.commit()
                        self._committed(False)
                    except (aiokafka.errors.CommitFailedError,
                            aiokafka.errors.RebalanceInProgressError,
                            aiokafka.errors.IllegalGenerationError,
                            aiokafka.errors.UnknownMemberIdError):
                        self._committed(True)
        finally:
            await consumer.stop()

    def _run_raykafka(self) -> None:
        consumer = self.cluster.consumer(
            self.topic, group_id=self.group, auto_offset_reset="earliest",
            enable_auto_commit=False, partition_assignment_strategy=self.strategy,
            session_timeout_ms=self.session_timeout_ms, group_instance_id=self.instance_id)
        self._started.set()
        try:
            while not self._stop.is_set():
                got = consumer.poll(200)
                for (_, p), recs in got.items():
                    self.records += [(p, r.offset, r.value) for r in recs]
                self.owned = {p for _, p in consumer.assignment()}
                if self._should_commit(got):
                    self._commit_sync(consumer.commit, (
                        RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError))
        finally:
            consumer.close()


def _stop_all(*members) -> None:
    """Stop every member (each closes its consumer), then raise the first failure."""
    failures = []
    for m in members:
        if m is None:
            continue
        try:
            m.stop()
        except AssertionError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


def _stable(cluster, group: str, members: list[Member], topic: str) -> dict:
    """Wait until the coordinator has a Stable generation of exactly these members whose
    assignments partition the topic, and each member holds what the coordinator gave it;
    the coordinator's description."""
    def check():
        for m in members:                     # a member whose thread died never joins
            if m.error is not None:
                raise AssertionError(f"{m.kind} member of {group} failed: {m.error!r}")
        d = cluster.admin().describe_group(group)
        if d["state"] != "Stable" or len(d["members"]) != len(members):
            return None
        given = [{p for t, p in tps if t == topic} for tps in d["members"].values()]
        if sorted(p for g in given for p in g) != list(range(PARTITIONS)):
            return None
        if sorted(map(sorted, given)) != sorted(sorted(m.owned) for m in members):
            return None
        return d
    def state():
        d = cluster.admin().describe_group(group)
        return (f"coordinator: {d['state']} generation {d.get('generation')}, members "
                f"{ {m: sorted(p for t, p in tps) for m, tps in d['members'].items()} }; "
                f"the members hold {[(m.kind, sorted(m.owned)) for m in members]}")
    return wait_until(check, timeout_s=120, interval_s=0.2, what=f"group {group} stable",
                      detail=state)


def _committed(cluster, group: str, topic: str) -> dict:
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([ck.TopicPartition(topic, p) for p in range(PARTITIONS)],
                                 timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def _raw_call(cluster, api_key: int, version: int, body: dict, broker: int = 0, *,
              address: tuple | None = None) -> dict:
    """One request on a connection of its own to the ``broker``-th listener (or
    ``address``); the decoded answer."""
    import socket
    import struct
    host, port = address or cluster.bootstrap_servers.split(",")[broker].rsplit(":", 1)
    header = wire.RequestHeader(api_key, version, 7, "raw")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(wire.encode_request(header, body))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    return wire.decode_response(api_key, version, frame)[1]


# -- tests ----------------------------------------------------------------------------------
def test_every_broker_advertises_the_group_apis_it_serves(cluster):
    """A Broker's ApiVersions lists the data-plane and the group APIs, each at exactly the
    codec's range (what is implemented, nothing more)."""
    for broker in range(3):
        body = _raw_call(cluster, wire.API_VERSIONS, 3, {"client_software_name": "t",
                                                         "client_software_version": "1"},
                         broker)
        assert {k["api_key"]: (k["min_version"], k["max_version"])
                for k in body["api_keys"]} == wire.SUPPORTED_VERSIONS


def test_find_coordinator_answers_every_version_from_every_broker(cluster):
    """FindCoordinator v0-3 asked of any broker names the same node, the broker leading
    the group's __consumer_offsets partition, with its listener; a transaction key and an
    empty group id get Kafka's errors."""
    answers = set()
    for broker in range(3):
        for version in range(4):
            def found():
                a = _raw_call(cluster, wire.FIND_COORDINATOR, version,
                              {"key": "find-me", "key_type": 0}, broker)
                return a if a["error_code"] == 0 else None
            a = wait_until(found, timeout_s=60, what="a coordinator")
            answers.add((a["node_id"], a["host"], a["port"]))
    assert len(answers) == 1
    (node, host, port), = answers
    assert f"{host}:{port}" in cluster.bootstrap_servers.split(",")
    from actors.client.group import GroupMember
    member = GroupMember(cluster.metadata, "find-me")
    member.coordinator()
    assert member.coordinator_id == node         # the coordinator raykafka's members use
    txn = _raw_call(cluster, wire.FIND_COORDINATOR, 1, {"key": "tx", "key_type": 1})
    assert txn["error_code"] == wire.ERRORS_BY_NAME["UNSUPPORTED_VERSION"].code
    empty = _raw_call(cluster, wire.FIND_COORDINATOR, 3, {"key": "", "key_type": 0})
    assert empty["error_code"] == wire.ERRORS_BY_NAME["INVALID_GROUP_ID"].code


@pytest.mark.parametrize("first,second", [("confluent", "kafka-python"),
                                          ("aiokafka", "confluent"),
                                          ("kafka-python", "aiokafka"),
                                          ("raykafka", "confluent")])
def test_two_clients_share_a_group_and_a_restart_resumes_from_their_commits(cluster, first,
                                                                           second):
    """Two consumers of different clients in one group own disjoint partitions covering
    the topic, read every record and commit; after both stop and more records come, the
    first client restarted alone (auto_offset_reset=earliest) reads exactly the new ones."""
    topic, group = _topic(cluster), next(_names)
    _produce(cluster, topic, 200)
    a = Member(first, cluster, group, topic, commit=True)
    b = Member(second, cluster, group, topic, commit=True)
    try:
        a.start()
        b.start()
        _stable(cluster, group, [a, b], topic)
        assert a.owned and b.owned and not a.owned & b.owned
        wait_until(lambda: _committed(cluster, group, topic) == {p: 50 for p in
                                                                  range(PARTITIONS)},
                   timeout_s=90, interval_s=0.5, what="every record committed",
                   detail=lambda: f"commits a rebalance refused: {a.kind} "
                                  f"{a.refused_commits}, {b.kind} {b.refused_commits}")
        seen = {(p, o) for p, o, _ in a.records + b.records}
        assert seen == {(p, o) for p in range(PARTITIONS) for o in range(50)}
    finally:
        _stop_all(a, b)
    _produce(cluster, topic, 40, start=200)
    again = Member(first, cluster, group, topic, commit=True).start()
    try:
        wait_until(lambda: len(again.records) >= 40, timeout_s=90, what="the new records")
        assert sorted(o for _, o, _ in again.records) == sorted(
            [o for o in range(50, 60)] * PARTITIONS)
        assert {v for _, _, v in again.records} == {b"v%d" % i for i in range(200, 240)}
    finally:
        _stop_all(again)


@pytest.mark.parametrize("strategy,kinds", [
    ("range", ("raykafka", "confluent", "kafka-python")),
    ("roundrobin", ("confluent", "raykafka", "kafka-python")),
    ("cooperative-sticky", ("raykafka", "confluent", "kafka-python")),
    ("cooperative-sticky", ("kafka-python", "raykafka", "confluent")),
])
def test_raykafka_and_kafka_clients_share_one_group_with_each_assignor(cluster, strategy,
                                                                       kinds):
    """A raykafka Consumer, a confluent-kafka and a kafka-python consumer in one group
    (joined in the order given: the first leads and computes every assignment) agree with
    the coordinator: each partition owned by exactly one member, each member holding what
    the coordinator gave it, and between them every record is read."""
    topic, group = _topic(cluster), next(_names)
    _produce(cluster, topic, 80)
    members = []
    try:
        for i, kind in enumerate(kinds):
            members.append(Member(kind, cluster, group, topic, strategy=strategy).start())
            if i == 0:                         # the first member alone: it leads
                _stable(cluster, group, members, topic)
        d = _stable(cluster, group, members, topic)
        assert d["protocol"] == strategy
        leader_prefix = {"raykafka": "raykafka", "confluent": "rdkafka",
                         "kafka-python": "kafka-python"}[kinds[0]]
        assert d["leader"].startswith(leader_prefix), d["leader"]
        assert all(m.owned for m in members)
        wait_until(lambda: {(p, o) for m in members for p, o, _ in m.records}
                   >= {(p, o) for p in range(PARTITIONS) for o in range(20)},
                   timeout_s=60, what="every record read")
    finally:
        _stop_all(*members)


def test_offsets_committed_by_raykafka_and_by_kafka_clients_are_one_store(cluster):
    """What raykafka's Consumer commits, confluent-kafka and kafka-python read as the
    group's committed offsets, and what they commit raykafka reads (manual assignment,
    no members: the simple commits of Kafka's clients)."""
    topic, group = _topic(cluster), next(_names)
    _produce(cluster, topic, 40)
    rk = cluster.consumer(group_id=group, enable_auto_commit=False)
    rk.assign([(topic, p) for p in range(PARTITIONS)])
    rk.commit({(topic, 0): 3, (topic, 1): 4})
    assert _committed(cluster, group, topic) == {0: 3, 1: 4, 2: -1001, 3: -1001}
    kp = kafka.KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group,
                             enable_auto_commit=False)
    from kafka import OffsetAndMetadata, TopicPartition
    assert kp.committed(TopicPartition(topic, 1)) == 4
    kp.commit({TopicPartition(topic, 2): OffsetAndMetadata(7, "from kafka-python", -1)})
    kp.close()
    cc = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                      "enable.auto.commit": False})
    cc.commit(offsets=[ck.TopicPartition(topic, 3, 9)], asynchronous=False)
    cc.close()
    assert {tp: rk.committed(tp) for tp in [(topic, p) for p in range(PARTITIONS)]} == {
        (topic, 0): 3, (topic, 1): 4, (topic, 2): 7, (topic, 3): 9}
    rk.close()


def test_a_static_member_restarted_within_its_session_keeps_its_partitions(cluster):
    """A confluent-kafka consumer with group.instance.id, closed (a static member sends
    no LeaveGroup) and restarted under the same instance id within its session, gets its
    old partitions back in the same generation: no rebalance, the other member untouched."""
    topic, group = _topic(cluster), next(_names)
    static = Member("confluent", cluster, group, topic, instance_id="static-1",
                    session_timeout_ms=30_000)
    other = Member("kafka-python", cluster, group, topic)
    restarted = None
    try:
        static.start()
        other.start()
        before = _stable(cluster, group, [static, other], topic)
        owned, other_owned = set(static.owned), set(other.owned)
        static.stop()
        restarted = Member("confluent", cluster, group, topic, instance_id="static-1",
                           session_timeout_ms=30_000).start()
        after = _stable(cluster, group, [restarted, other], topic)
        assert after["generation"] == before["generation"]
        assert restarted.owned == owned and other.owned == other_owned
    finally:
        _stop_all(other, restarted)


def test_admin_clients_list_describe_and_delete_groups(cluster, request):
    """confluent-kafka's, kafka-python's and aiokafka's admin clients list a live group
    with its state, describe its members and their assignments as the coordinator has
    them, refuse to delete it while it has members (NON_EMPTY_GROUP), delete it once it is
    empty (its offsets gone), and an unknown group is GROUP_ID_NOT_FOUND."""
    from confluent_kafka.admin import AdminClient
    topic, group = _topic(cluster), next(_names)
    _produce(cluster, topic, 20)
    a = Member("confluent", cluster, group, topic, commit=True)
    b = Member("kafka-python", cluster, group, topic, commit=True)
    try:
        a.start()
        b.start()
        desc = _stable(cluster, group, [a, b], topic)
        want = {mid: sorted(p for _, p in tps) for mid, tps in desc["members"].items()}
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(30).valid}
        assert listed[group].state.name == "STABLE"
        cd = admin.describe_consumer_groups([group])[group].result(30)
        assert cd.partition_assignor == "range"
        assert {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
                for m in cd.members} == want
        kadmin = kafka.KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        request.addfinalizer(kadmin.close)
        kp_listed = {g["group_id"]: g for g in kadmin.list_groups()}
        assert kp_listed[group]["protocol_type"] == "consumer"
        kd = kadmin.describe_groups([group])[group]
        assert kd["group_state"] == "Stable" and kd["protocol_data"] == "range"
        assert {m["member_id"]: sorted(p for a in m["member_assignment"]["assigned_partitions"]
                                       for p in a["partitions"])
                for m in kd["members"]} == want

        async def aio_describe():
            from aiokafka.admin import AIOKafkaAdminClient
            aadmin = AIOKafkaAdminClient(
                bootstrap_servers=cluster.bootstrap_servers)
            await aadmin.start()
            try:
                groups = await aadmin.list_consumer_groups()
                described = await aadmin.describe_consumer_groups([group])
                return groups, described
            finally:
                await aadmin.close()
        groups, described = asyncio.run(aio_describe())
        assert (group, "consumer") in [tuple(g) for g in groups]
        _, name, state, _, protocol, members = described[0].groups[0]   # DescribeGroups v2
        assert (name, state, protocol) == (group, "Stable", "range")
        assert {m[0] for m in members} == set(want)
        with pytest.raises(ck.KafkaException, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups([group])[group].result(30)
        # each member commits right after the poll that read its records: all read, all
        # committed once the members stop
        wait_until(lambda: {(p, o) for m in (a, b) for p, o, _ in m.records}
                   >= {(p, o) for p in range(PARTITIONS) for o in range(5)},
                   timeout_s=60, what="every record read")
    finally:
        _stop_all(a, b)
    wait_until(lambda: cluster.admin().describe_group(group)["state"] == "Empty",
               timeout_s=30, what="the group empty")
    assert _committed(cluster, group, topic) == {p: 5 for p in range(PARTITIONS)}
    admin.delete_consumer_groups([group])[group].result(30)
    assert _committed(cluster, group, topic) == {p: -1001 for p in range(PARTITIONS)}
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert group not in {g["group_id"] for g in kadmin.list_groups()}
    assert kadmin.delete_groups([group]) == {group: "GroupIdNotFoundError"}


def test_zstd_from_raykafkas_producer_is_read_by_confluent_kafka(cluster):
    """raykafka's Producer with compression_type='zstd' writes codec-4 batches that a
    confluent-kafka consumer reads back through the listener, every record in order."""
    from storage.records import CODEC_ZSTD, iter_headers
    topic = _topic(cluster, partitions=1)
    with cluster.producer(compression_type="zstd", linger_ms=5) as producer:
        for i in range(300):
            producer.send(topic, value=b"z%d" % i, partition=0)
        producer.flush()
    md = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(
        topic, timeout=10)
    leader = md.brokers[md.topics[topic].partitions[0].leader]
    fetched = _raw_call(cluster, wire.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 24,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
            {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                             "partition_max_bytes": 1 << 24}]}]},
        address=(leader.host, leader.port))
    batches = bytes(fetched["responses"][0]["partitions"][0]["records"])
    assert {h.compression for h in iter_headers(batches)} == {CODEC_ZSTD}
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": next(_names), "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got, deadline = [], time.monotonic() + 60
    while len(got) < 300 and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(500, 0.5) if m.error() is None]
    consumer.close()
    assert got == [b"z%d" % i for i in range(300)]
