"""ACLs on a running cluster: raykafka's Admin and the Kafka admin clients (kafka-python,
confluent-kafka) create, list and delete the same bindings, stored in ZooKeeper as Kafka's
ZooKeeper authorizer stored them; the ACL APIs without an authorizer; ZooKeeper ACLs
(zookeeper.set.acl). One 1-broker cluster with an authorizer and ZooKeeper ACLs for the
module."""

from __future__ import annotations

import itertools
import types

import pytest

from actors import Cluster, wire
from actors.errors import IllegalArgumentError
from actors.server.acl_handlers import AclApis
from tests.cluster_helpers import (FAST_CONFIG, local_ray, unique_namespace,  # noqa: F401
                                   wait_until, zk_client, zk_json)

ck = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402  (ck.admin)
kafka = pytest.importorskip("kafka")

CONFIG = {**FAST_CONFIG, "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
          "allow.everyone.if.no.acl.found": "true",
          "zookeeper.set.acl": "true", "zookeeper.auth.digest": "raykafka:s3cret"}
_names = (f"acl-t{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def cluster(local_ray):  # noqa: F811
    c = Cluster.start(1, namespace=unique_namespace("acls"), config=dict(CONFIG))
    yield c
    c.shutdown()


def test_admin_creates_lists_and_deletes_acls_in_kafkas_layout(cluster):
    """Admin.create_acl stores the binding at /kafka-acl/Topic/<t> in Kafka's JSON;
    list_acls shows it in the API's words; delete_acl removes exactly it."""
    admin, topic = cluster.admin(), next(_names)
    admin.create_acl("User:alice", "topic", topic, "read")
    admin.create_acl("User:bob", "topic", topic, "write", permission="deny")
    zk = zk_client(cluster)
    try:
        body = zk_json(zk, f"/kafka-acl/Topic/{topic}")
        assert {(a["principal"], a["operation"], a["permissionType"]) for a in body["acls"]} \
            == {("User:alice", "Read", "Allow"), ("User:bob", "Write", "Deny")}
    finally:
        zk.stop()
        zk.close()
    mine = [a for a in admin.list_acls() if a["resource_name"] == topic]
    assert {"principal": "User:alice", "host": "*", "resource_type": "topic",
            "resource_name": topic, "pattern_type": "literal", "operation": "read",
            "permission": "allow"} in mine
    assert admin.delete_acl("User:bob", "topic", topic, "write", permission="deny")
    assert not admin.delete_acl("User:bob", "topic", topic, "write", permission="deny")
    assert [a["principal"] for a in admin.list_acls() if a["resource_name"] == topic] == \
        ["User:alice"]


def test_admin_refuses_bad_words_with_a_typed_error(cluster):
    """A bad resource type, operation, permission or principal is IllegalArgumentError."""
    admin = cluster.admin()
    for args in [("User:a", "table", "t", "read"), ("User:a", "topic", "t", "fly"),
                 ("alice", "topic", "t", "read")]:
        with pytest.raises(IllegalArgumentError):
            admin.create_acl(*args)
    with pytest.raises(IllegalArgumentError):
        admin.create_acl("User:a", "topic", "t", "read", permission="maybe")


def test_kafka_python_and_confluent_admin_clients_manage_the_same_acls(cluster):
    """kafka-python's create_acls and confluent-kafka's create_acls write bindings that
    Admin.list_acls and the other client's describe_acls see; delete_acls answers the
    bindings it removed."""
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType,
                             ACLResourcePatternType, KafkaAdminClient, ResourcePattern,
                             ResourcePatternFilter, ResourceType)
    topic = next(_names)
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        made = kp.create_acls([ACL("User:kp", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                                   ResourcePattern(ResourceType.TOPIC, topic,
                                                   ACLResourcePatternType.PREFIXED))])
        assert made["failed"] == [] and len(made["succeeded"]) == 1

        cadmin = ck.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        binding = ck.admin.AclBinding(ck.admin.ResourceType.GROUP, "g-" + topic,
                                      ck.admin.ResourcePatternType.LITERAL, "User:ck", "*",
                                      ck.admin.AclOperation.READ,
                                      ck.admin.AclPermissionType.ALLOW)
        for f in cadmin.create_acls([binding]).values():
            assert f.result(timeout=30) is None
        found = cadmin.describe_acls(ck.admin.AclBindingFilter(
            ck.admin.ResourceType.TOPIC, topic, ck.admin.ResourcePatternType.MATCH, None,
            None, ck.admin.AclOperation.ANY, ck.admin.AclPermissionType.ANY)).result(30)
        assert [(b.principal, b.name, b.resource_pattern_type) for b in found] == \
            [("User:kp", topic, ck.admin.ResourcePatternType.PREFIXED)]

        acls, err = kp.describe_acls(ACLFilter(
            None, None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.GROUP, "g-" + topic,
                                  ACLResourcePatternType.ANY)))
        assert err is kafka.errors.NoError
        assert [(a.principal, a.operation) for a in acls] == [("User:ck", ACLOperation.READ)]
        listed = {(a["principal"], a["resource_type"], a["pattern_type"])
                  for a in cluster.admin().list_acls()}
        assert {("User:kp", "topic", "prefixed"), ("User:ck", "group", "literal")} <= listed

        (result,) = kp.delete_acls([ACLFilter(
            "User:ck", None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY))])
        _filter, matched, err = result
        assert err is kafka.errors.NoError
        assert [(acl.principal, acl.resource_pattern.resource_name) for acl in matched] \
            == [("User:ck", "g-" + topic)]
    finally:
        kp.close()


def test_an_invalid_binding_fails_alone(cluster):
    """A prefixed '*' in one creation answers INVALID_REQUEST for it while the other
    creation of the same request is stored (confluent-kafka)."""
    topic = next(_names)
    cadmin = ck.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    good = ck.admin.AclBinding(ck.admin.ResourceType.TOPIC, topic,
                               ck.admin.ResourcePatternType.LITERAL, "User:x", "*",
                               ck.admin.AclOperation.READ, ck.admin.AclPermissionType.ALLOW)
    bad = ck.admin.AclBinding(ck.admin.ResourceType.TOPIC, "*",
                              ck.admin.ResourcePatternType.PREFIXED, "User:x", "*",
                              ck.admin.AclOperation.READ, ck.admin.AclPermissionType.ALLOW)
    futures = cadmin.create_acls([good, bad])
    assert futures[good].result(timeout=30) is None
    with pytest.raises(ck.KafkaException) as info:
        futures[bad].result(timeout=30)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_REQUEST
    assert any(a["resource_name"] == topic for a in cluster.admin().list_acls())


def test_without_an_authorizer_the_acl_apis_answer_security_disabled():
    """No authorizer configured: every ACL API answers SECURITY_DISABLED."""
    apis = AclApis(lambda: None, lambda: None)
    header = wire.RequestHeader(wire.CREATE_ACLS, 3, 7, "t")
    body = {"creations": [{"resource_type": 2, "resource_name": "t",
                           "resource_pattern_type": 3, "principal": "User:a", "host": "*",
                           "operation": 3, "permission_type": 3}]}
    frame = wire.encode_request(header, body)
    h, pos = wire.decode_request_header(memoryview(frame)[4:])
    request = types.SimpleNamespace(header=h, body=memoryview(frame)[4:][pos:],
                                    client=("127.0.0.1", 1))
    parts = apis.create_acls(request)
    _, answer = wire.decode_response(wire.CREATE_ACLS, 3, b"".join(bytes(p) for p in parts)[4:])
    assert answer["results"][0]["error_code"] == wire.ERRORS_BY_NAME["SECURITY_DISABLED"].code


def test_with_zookeeper_acls_only_the_cluster_changes_its_registry(cluster):
    """zookeeper.set.acl: the cluster works (a topic created, produced to and read back)
    while a ZooKeeper client without the cluster's credential reads the registry but
    cannot change /brokers or /controller, and cannot write the chroot; the old
    consumers' /consumers stays open."""
    from kazoo.exceptions import NoAuthError
    topic = next(_names)
    cluster.admin().create_topic(topic, partitions=1, replication_factor=1)
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers})
    producer.produce(topic, b"v")
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": "g-" + topic, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        msg = wait_until(lambda: consumer.poll(1.0), timeout_s=60, what="the record")
        assert msg.value() == b"v"
    finally:
        consumer.close()
    zk = zk_client(cluster)
    try:
        assert zk_json(zk, f"/brokers/topics/{topic}")["partitions"] == {"0": [0]}
        for attempt in (lambda: zk.set(f"/brokers/topics/{topic}", b"{}"),
                        lambda: zk.delete("/controller"),
                        lambda: zk.create("/brokers/ids/99", b"{}"),
                        lambda: zk.create("/admin/delete_topics/" + topic)):
            with pytest.raises(NoAuthError):
                attempt()
        zk.create(f"/consumers/old-{topic}", b"", makepath=True)
    finally:
        zk.stop()
        zk.close()
    authed = zk_client(cluster)
    try:
        authed.add_auth("digest", CONFIG["zookeeper.auth.digest"])
        authed.set(f"/brokers/topics/{topic}", authed.get(f"/brokers/topics/{topic}")[0])
    finally:
        authed.stop()
        authed.close()


def _deny_and_wait(cluster, resource_type, name, operation, probe):
    """Deny User:ANONYMOUS (every unauthenticated client) ``operation`` on the resource
    and wait until ``probe()`` (True once refused) sees the broker apply it."""
    cluster.admin().create_acl("User:ANONYMOUS", resource_type, name, operation,
                               permission="deny")
    wait_until(probe, timeout_s=30, what=f"the deny of {operation} on {name} applied")


def test_a_denied_write_is_topic_authorization_failed_and_stores_nothing(cluster):
    """Once denied, producing to a topic the principal may not write fails with
    TOPIC_AUTHORIZATION_FAILED (confluent-kafka) and appends nothing, while the same
    producer's record to another topic is stored."""
    topic, other = next(_names), next(_names)
    for t in (topic, other):
        cluster.admin().create_topic(t, partitions=1, replication_factor=1)

    def refused():
        errors = []
        p = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                         "message.timeout.ms": 5000})
        p.produce(topic, b"x", on_delivery=lambda err, msg: errors.append(err))
        p.produce(other, b"y", on_delivery=lambda err, msg: errors.append(err))
        p.flush(10)
        codes = {e.code() if e else None for e in errors}
        return ck.KafkaError.TOPIC_AUTHORIZATION_FAILED in codes and None in codes

    _deny_and_wait(cluster, "topic", topic, "write", refused)
    before = cluster.admin().describe_topics([topic, other])
    assert refused()
    after = cluster.admin().describe_topics([topic, other])
    assert after[topic][0]["log_end_offset"] == before[topic][0]["log_end_offset"]
    assert after[other][0]["log_end_offset"] == before[other][0]["log_end_offset"] + 1


def test_a_topic_without_describe_is_absent_from_metadata(cluster):
    """Metadata leaves a topic the principal may not describe out of a listing and answers
    TOPIC_AUTHORIZATION_FAILED when it is asked for by name (kafka-python)."""
    topic = next(_names)
    cluster.admin().create_topic(topic, partitions=1, replication_factor=1)
    probe = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers})
    _deny_and_wait(cluster, "topic", topic, "describe",
                   lambda: topic not in probe.list_topics(timeout=10).topics)
    md = probe.list_topics(topic, timeout=10).topics[topic]
    assert md.error is not None and md.error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_group_without_read_is_group_authorization_failed(cluster):
    """A consumer joining a group it may not read gets GROUP_AUTHORIZATION_FAILED."""
    topic, group = next(_names), "denied-" + next(_names)
    cluster.admin().create_topic(topic, partitions=1, replication_factor=1)

    def refused():
        c = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                         "session.timeout.ms": 6000})
        try:
            c.subscribe([topic])
            for _ in range(10):
                msg = c.poll(0.5)
                if msg is not None and msg.error() is not None:
                    return msg.error().code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED
            return False
        except ck.KafkaException as exc:
            return exc.args[0].code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED
        finally:
            c.close()

    _deny_and_wait(cluster, "group", group, "read", refused)


def test_admin_requests_need_their_acls(cluster):
    """DeleteTopics of a topic the principal may not delete, and CreateTopics when it may
    create neither on the cluster nor that topic, answer TOPIC_AUTHORIZATION_FAILED
    (confluent-kafka); nothing changes."""
    keep, banned = next(_names), "banned-" + next(_names)
    admin = cluster.admin()
    admin.create_topic(keep, partitions=1, replication_factor=1)
    cadmin = ck.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_acl("User:ANONYMOUS", "topic", keep, "delete", permission="deny")
    # ACL changes reach a broker in order: once a later one (Describe) shows, so has this
    admin.create_acl("User:ANONYMOUS", "topic", keep, "describe", permission="deny")
    probe = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers})
    wait_until(lambda: keep not in probe.list_topics(timeout=10).topics, timeout_s=30,
               what="the ACLs applied")

    def code(future):
        try:
            future.result(timeout=30)
            return None
        except ck.KafkaException as exc:
            return exc.args[0].code()

    assert code(cadmin.delete_topics([keep])[keep]) == \
        ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Create on the cluster allows any topic (Kafka's rule): deny it there and on the name
    admin.create_acl("User:ANONYMOUS", "topic", banned, "create", permission="deny")
    admin.create_acl("User:ANONYMOUS", "cluster", "kafka-cluster", "create",
                     permission="deny")
    try:
        wait_until(lambda: code(cadmin.create_topics(
            [ck.admin.NewTopic(banned, 1, 1)], validate_only=True)[banned])
            == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, timeout_s=30,
            what="the create refused")
        assert code(cadmin.create_topics([ck.admin.NewTopic(banned, 1, 1)])[banned]) == \
            ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        admin.delete_acl("User:ANONYMOUS", "cluster", "kafka-cluster", "create",
                         permission="deny")
    assert keep in admin.list_topics()
    assert banned not in admin.list_topics()
