"""Security on the Kafka listeners (issue 23, first half): TLS and SASL (SCRAM-SHA-256,
SCRAM-SHA-512, PLAIN) with confluent-kafka, kafka-python and raykafka's clients; SCRAM
credentials stored as Kafka stores them and managed by Admin and the CLI; each refusal
(no credentials, a wrong password, an unknown mechanism, a client without TLS on a TLS
port) with Kafka's error and nothing else changing; replication over a SASL_SSL
inter-broker listener; failed authentications slowed without slowing anyone else. One
3-broker cluster for the module (four listeners each); the SCRAM and network checks that
need no cluster run on an in-process listener."""

from __future__ import annotations

import base64
import io
import os
import sys
import threading
import time

import pytest

from actors import Cluster, raycompat
from actors.tools import cli
from actors.connection import ClientSecurity, KafkaConnection, _ScramClient
from actors.errors import (NetworkError, SaslAuthenticationError,
                           TopicAuthorizationFailedError, UnsupportedSaslMechanismError)
from actors import wire
from tests.cluster_helpers import (FAST_CONFIG, local_ray, unique_namespace,  # noqa: F401
                                   wait_until, zk_client, zk_json)
from tests.security_helpers import make_pki

ck = pytest.importorskip("confluent_kafka")
ray = raycompat.ray

BROKER_PASSWORD = base64.b64encode(os.urandom(12)).decode()
LISTENERS = ("SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,"
             "LIMITED://127.0.0.1:0")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def cluster(local_ray, pki):  # noqa: F811
    config = {**FAST_CONFIG, "offsets.topic.num.partitions": 2,
              "offsets.topic.replication.factor": 1, "group.initial.rebalance.delay.ms": 0,
              "listeners": LISTENERS,
              "listener.security.protocol.map": "SASL_SSL:SASL_SSL,"
              "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,LIMITED:SASL_PLAINTEXT",
              "listener.name.limited.sasl.enabled.mechanisms": "SCRAM-SHA-512",
              "inter.broker.listener.name": "SASL_SSL",
              "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
              "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                  f'required username="broker" password="{BROKER_PASSWORD}";',
              "ssl.certificate.location": pki["cert"], "ssl.key.location": pki["key"],
              "ssl.ca.location": pki["ca"],
              # ACLs: everyone may do what no ACL speaks of; the ACL tests deny alice
              "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
              "allow.everyone.if.no.acl.found": "true"}
    c = Cluster.start(3, namespace=unique_namespace("sec"), config=config)
    c.admin().create_user("alice", "alice-secret")
    yield c
    c.shutdown()


def _settings(cluster, pki, listener: str, mechanism: str | None = None,
              password: str = "alice-secret") -> dict:
    """confluent-kafka's settings for ``listener``."""
    protocol = {"LIMITED": "SASL_PLAINTEXT"}.get(listener, listener)
    conf = {"bootstrap.servers": cluster.bootstrap_servers_for(listener),
            "security.protocol": protocol}
    if protocol.endswith("SSL"):
        conf["ssl.ca.location"] = pki["ca"]
    if mechanism:
        conf.update({"sasl.mechanism": mechanism, "sasl.username": "alice",
                     "sasl.password": password})
    return conf


def _topic(cluster, name: str, rf: int = 3) -> str:
    cluster.admin().create_topic(name, partitions=2, replication_factor=rf,
                                 config={"min.insync.replicas": str(rf)})
    wait_until(lambda: all(p["leader"] >= 0 for p in cluster.admin().describe_topic(name)),
               timeout_s=60, what=f"leaders of {name}")
    return name


def _end_offsets(conf: dict, topic: str) -> list[int]:
    consumer = ck.Consumer({**conf, "group.id": "watermarks"})
    try:
        return [consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
                for p in range(2)]
    finally:
        consumer.close()


def _confluent_round_trip(conf: dict, topic: str, n: int = 20) -> list[bytes]:
    errors = []
    producer = ck.Producer({**conf, "linger.ms": 2, "message.timeout.ms": 30000})
    for i in range(n):
        producer.produce(topic, value=b"v%d" % i, partition=i % 2,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and errors == []
    consumer = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    consumer.subscribe([topic])
    got, deadline = [], time.monotonic() + 60
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        consumer.commit(asynchronous=False)     # the group's coordinator, on this listener
    finally:
        consumer.close()
    return sorted(got)


# -- serving ------------------------------------------------------------------------------
@pytest.mark.parametrize("listener,mechanism", [
    ("SASL_SSL", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_PLAINTEXT", "PLAIN"), ("SSL", None)])
def test_confluent_kafka_produces_and_consumes_on_each_secured_listener(cluster, pki,
                                                                        listener, mechanism):
    """confluent-kafka produces to an RF=3 topic (min.insync.replicas=3: followers
    replicate over the SASL_SSL inter-broker listener) and consumes it in a group, on
    SASL_SSL with both SCRAMs, SASL_PLAINTEXT with PLAIN, and SSL."""
    topic = _topic(cluster, f"t-{listener.lower()}-{(mechanism or 'tls').lower()}")
    got = _confluent_round_trip(_settings(cluster, pki, listener, mechanism), topic)
    assert got == sorted(b"v%d" % i for i in range(20))


def test_raykafka_clients_produce_and_consume_over_sasl(cluster, pki):
    """raykafka's Producer, Consumer and SimpleConsumer with kafka-python's setting names
    on SASL_SSL (SCRAM-SHA-512) and SASL_PLAINTEXT (PLAIN) listeners."""
    topic = _topic(cluster, "t-raykafka")
    for protocol, mechanism in (("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN")):
        sec = {"security_protocol": protocol, "sasl_mechanism": mechanism,
               "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret",
               "ssl_cafile": pki["ca"]}
        producer = cluster.producer(**sec)
        try:
            for i in range(10):
                producer.send(topic, value=f"{protocol}-{i}".encode(), partition=0).get(30)
        finally:
            producer.close()
    consumer = cluster.consumer(topic, auto_offset_reset="earliest", group_id="g-raykafka",
                                security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                                sasl_plain_username="alice",
                                sasl_plain_password="alice-secret", ssl_cafile=pki["ca"],
                                consumer_timeout_ms=5000)
    try:
        values = sorted(r.value for r in consumer)
    finally:
        consumer.close()
    assert values == sorted([f"SASL_SSL-{i}".encode() for i in range(10)] +
                            [f"SASL_PLAINTEXT-{i}".encode() for i in range(10)])


def test_kafka_python_produces_over_sasl_ssl_scram(cluster, pki):
    """kafka-python 3.0's producer and consumer on SASL_SSL with SCRAM-SHA-256."""
    kafka = pytest.importorskip("kafka")
    topic = _topic(cluster, "t-kafka-python", rf=1)
    sec = {"bootstrap_servers": cluster.bootstrap_servers_for("SASL_SSL").split(","),
           "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
           "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret",
           "ssl_cafile": pki["ca"]}
    producer = kafka.KafkaProducer(enable_idempotence=False, **sec)   # no InitProducerId here
    for i in range(5):
        producer.send(topic, value=b"kp%d" % i, partition=0).get(30)
    producer.close()
    consumer = kafka.KafkaConsumer(topic, auto_offset_reset="earliest",
                                   consumer_timeout_ms=20000, **sec)
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) == 5:
            break
    consumer.close()
    assert values == [b"kp%d" % i for i in range(5)]


def test_brokers_register_named_endpoints_and_replicate_over_sasl_ssl(cluster):
    """/brokers/ids/<id> lists every listener by name with Kafka's protocol map; the
    followers of an RF=3 topic fetch from the leaders' SASL_SSL listener and are in sync;
    the principal the listeners authenticated them as is the broker user."""
    zk = zk_client(cluster)
    try:
        info = zk_json(zk, "/brokers/ids/0")
    finally:
        zk.stop()
    assert [ep.split("://")[0] for ep in info["endpoints"]] == \
        ["SASL_SSL", "SASL_PLAINTEXT", "SSL", "LIMITED"]
    assert info["listener_security_protocol_map"]["LIMITED"] == "SASL_PLAINTEXT"
    topic = _topic(cluster, "t-replication")
    sec = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
           "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}
    producer = cluster.producer(acks="all", **sec)
    try:
        for i in range(20):
            producer.send(topic, value=b"r%d" % i, partition=i % 2).get(30)
    finally:
        producer.close()
    wait_until(lambda: all(sorted(p["isr"]) == [0, 1, 2]
                           for p in cluster.admin().describe_topic(topic)),
               timeout_s=30, what="ISR of three")
    stats = [ray.get(cluster.broker(b).listener_stats.remote()) for b in range(3)]
    assert sum(s["SASL_SSL"].get("authenticated", 0) for s in stats) >= 2
    assert all(s["SASL_SSL"].get("tls_handshakes", 0) >= 1 for s in stats)


# -- refusing -------------------------------------------------------------------------------
def _failing_confluent(conf: dict, topic: str, expect, capfd, timeout_s: float = 30.0
                       ) -> list:
    """What a confluent-kafka producer reports trying ``conf`` (its errors, and its log,
    which librdkafka writes to stderr), once a line satisfies ``expect`` (or at the
    deadline); its record must not be delivered."""
    errors, delivered, log = [], [], []
    producer = ck.Producer({**conf, "message.timeout.ms": int(timeout_s * 1000),
                            "error_cb": lambda e: errors.append(str(e))})
    producer.produce(topic, value=b"never", on_delivery=lambda err, msg: delivered.append(err))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(map(expect, errors + log)):
        producer.poll(0.2)
        log.extend(capfd.readouterr().err.splitlines())
    producer.purge()
    producer.flush(5)
    assert not delivered or delivered[0] is not None, "a record was delivered"
    return errors + log


def test_confluent_kafka_refusals_answer_kafkas_errors_and_change_nothing(cluster, pki, capfd):
    """A wrong password (SASL_AUTHENTICATION_FAILED), an unknown mechanism
    (UNSUPPORTED_SASL_MECHANISM), no credentials (the connection closed at its first
    request) and no TLS against a TLS port each fail with a clear message; the topic's
    end offsets are unchanged and a good client still produces."""
    topic = _topic(cluster, "t-refused", rf=1)
    good = _settings(cluster, pki, "SASL_SSL", "SCRAM-SHA-256")
    before = _end_offsets(good, topic)
    checks = [
        (_settings(cluster, pki, "SASL_SSL", "SCRAM-SHA-256", password="nope"),
         lambda e: "Authentication failed during authentication due to invalid credentials "
                   "with SASL mechanism SCRAM-SHA-256" in e),
        (_settings(cluster, pki, "LIMITED", "PLAIN"),
         lambda e: "PLAIN" in e and ("not supported by broker" in e or
                                     "Unsupported SASL mechanism" in e)),
        ({**_settings(cluster, pki, "SASL_PLAINTEXT"), "security.protocol": "PLAINTEXT"},
         lambda e: "Disconnected" in e or "brokers are down" in e),   # closed by the broker
        ({**_settings(cluster, pki, "SSL"), "security.protocol": "PLAINTEXT"},   # TLS alert
         lambda e: "SSL listener" in e or ("Disconnected" in e and "APIVERSION_QUERY" in e)),
    ]
    for conf, expect in checks:
        seen = _failing_confluent(conf, topic, expect, capfd)
        assert any(map(expect, seen)), seen
    assert _end_offsets(good, topic) == before
    assert _confluent_round_trip(good, topic, n=2) == [b"v0", b"v1"]
    stats = [ray.get(cluster.broker(b).listener_stats.remote()) for b in range(3)]
    assert sum(s["SASL_PLAINTEXT"].get("unauthenticated", 0) for s in stats) >= 1
    assert sum(s["SSL"].get("tls_failed", 0) for s in stats) >= 1


def _address(cluster, listener: str) -> tuple[str, int]:
    host, port = cluster.bootstrap_servers_for(listener).split(",")[0].rsplit(":", 1)
    return host, int(port)


def test_raykafka_connection_refusals_raise_typed_errors(cluster, pki):
    """raykafka's KafkaConnection: a wrong password raises SaslAuthenticationError with
    Kafka's message, an unknown mechanism UnsupportedSaslMechanismError naming the enabled
    ones, a plaintext connection to a TLS port NetworkError saying so; a Producer with a
    wrong password fails its send with SaslAuthenticationError."""
    def connect(listener, **settings):
        return KafkaConnection(*_address(cluster, listener),
                               security=ClientSecurity.from_config(settings))
    base = {"sasl_plain_username": "alice", "ssl_cafile": pki["ca"]}
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        connect("SASL_SSL", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                sasl_plain_password="nope", **base)
    with pytest.raises(UnsupportedSaslMechanismError, match="SCRAM-SHA-512"):
        connect("LIMITED", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                sasl_plain_password="alice-secret", **base)
    with pytest.raises(NetworkError, match="TLS"):
        connect("SSL", security_protocol="PLAINTEXT")
    producer = cluster.producer(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                sasl_plain_username="alice", sasl_plain_password="nope",
                                delivery_timeout_ms=5000, request_timeout_ms=2000)
    try:
        with pytest.raises(SaslAuthenticationError):
            producer.send("t-refused", value=b"never", partition=0).get(20)
    finally:
        producer.close()


# -- credentials ---------------------------------------------------------------------------
def test_users_are_stored_as_kafka_stores_them_and_deletion_reaches_the_brokers(
        cluster, monkeypatch, capsys):
    """``raykafka users add`` (password on stdin) writes /config/users/<u> in Kafka's
    format with a config_change notification; ``users list`` shows it; the user
    authenticates; after ``Admin.delete_user`` the brokers refuse it."""
    monkeypatch.setattr(cli, "connect", lambda namespace: cluster)
    monkeypatch.setattr(sys, "stdin", io.StringIO("bob-secret\n"))
    assert cli.main(["users", "add", "bob", "--mechanism", "SCRAM-SHA-256"]) == 0
    added = capsys.readouterr()
    assert "bob-secret" not in added.out + added.err
    zk = zk_client(cluster)
    try:
        body = zk_json(zk, "/config/users/bob")
        changes = [zk_json(zk, f"/config/changes/{n}")
                   for n in zk.get_children("/config/changes")]
    finally:
        zk.stop()
    assert body["version"] == 1 and list(body["config"]) == ["SCRAM-SHA-256"]
    fields = dict(f.split("=", 1) for f in body["config"]["SCRAM-SHA-256"].split(","))
    assert sorted(fields) == ["iterations", "salt", "server_key", "stored_key"]
    assert fields["iterations"] == "4096"
    assert {"version": 2, "entity_path": "users/bob"} in changes
    assert cli.main(["users", "list"]) == 0
    assert "bob\tSCRAM-SHA-256" in capsys.readouterr().out.splitlines()

    def connect():
        return KafkaConnection(*_address(cluster, "SASL_PLAINTEXT"),
                               security=ClientSecurity.from_config({
                                   "security_protocol": "SASL_PLAINTEXT",
                                   "sasl_mechanism": "SCRAM-SHA-256",
                                   "sasl_plain_username": "bob",
                                   "sasl_plain_password": "bob-secret"}))
    wait_until(lambda: connect().close() or True, timeout_s=20, what="bob authenticated")
    assert cluster.admin().delete_user("bob") is True

    def refused():
        try:
            connect().close()
        except SaslAuthenticationError:
            return True
        return False
    wait_until(refused, timeout_s=20, what="bob refused after deletion")
    assert "bob" not in cluster.admin().list_users()


def test_scram_client_matches_rfc_7677_and_the_server_proves_the_password():
    """Our SCRAM-SHA-256 client computes RFC 7677's example proof and checks its server
    signature; our server accepts our client and refuses a wrong password."""
    client = _ScramClient("SCRAM-SHA-256", "user", "pencil")
    client.nonce = "rOprNGfwEbeRWgbNEkqO"
    client.client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.next(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert client.next(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    with pytest.raises(SaslAuthenticationError):
        bad = _ScramClient("SCRAM-SHA-256", "user", "pencil")
        bad.nonce, bad.client_first_bare = client.nonce, client.client_first_bare
        bad.next(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                 b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
        bad.next(b"v=AAAA")


# -- the listener itself (in-process) ----------------------------------------------------------
class _Recorder:
    """A handler that answers ApiVersions and Metadata, recording who asked."""

    def __init__(self):
        from actors.server.handlers import KafkaApis
        from actors.server.log_backend import LogBackend
        import tempfile
        self.backend = LogBackend(tempfile.mkdtemp())
        self.apis = KafkaApis(self.backend)
        self.seen = []

    def handle(self, request):
        self.seen.append((request.header.api_key, request.principal, request.listener))
        return self.apis.handle(request)


def _sasl_server(delay_ms: int, io_threads: int = 2):
    from coordination.credentials import SCRAM_MECHANISMS, scram_credential
    from actors.server.network import ListenerSecurity, SocketServer, SocketServerConfig
    from actors.server.sasl import SaslAuthenticator
    users = {"carol": {m: scram_credential(m, "carol-secret") for m in SCRAM_MECHANISMS}}
    security = ListenerSecurity(
        name="CLIENTS", protocol="SASL_PLAINTEXT",
        authenticator=lambda: SaslAuthenticator(
            ("SCRAM-SHA-256", "PLAIN"), lambda u, m: users.get(u, {}).get(m),
            lambda u: users.get(u, {})),
        failed_authentication_delay_ms=delay_ms)
    handler = _Recorder()
    server = SocketServer(handler, SocketServerConfig(io_threads=io_threads),
                          security=security).start()
    return server, handler


def _carol(server, password="carol-secret"):
    return KafkaConnection("127.0.0.1", server.port, security=ClientSecurity.from_config({
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "carol", "sasl_plain_password": password}))


def test_requests_carry_the_authenticated_principal_and_listener_name():
    """After SCRAM, the handler sees ``User:carol`` and the listener's name on every
    request; ApiVersions before authentication is ``User:ANONYMOUS``; a Metadata request
    before authenticating closes the connection unanswered."""
    server, handler = _sasl_server(delay_ms=0)
    try:
        conn = _carol(server)
        conn.request(wire.METADATA, {"topics": [], "allow_auto_topic_creation": False}
                     ).result(5)
        conn.close()
        assert handler.seen[0] == (wire.API_VERSIONS, "User:ANONYMOUS", "CLIENTS")
        assert handler.seen[-1] == (wire.METADATA, "User:carol", "CLIENTS")
        raw = KafkaConnection("127.0.0.1", server.port)       # no SASL at all
        answer = raw.request(wire.METADATA, {"topics": [], "allow_auto_topic_creation": False})
        with pytest.raises(NetworkError):
            answer.result(5)
        assert server.stats()["unauthenticated"] == 1
        assert handler.seen[-1][0] != wire.METADATA or handler.seen[-1][1] == "User:carol"
    finally:
        server.close()


def test_wrong_passwords_are_slowed_while_others_are_served_at_once():
    """Twenty connections looping on wrong passwords each wait
    connection.failed.authentication.delay.ms (400 ms) for their refusal, while an
    authenticated client's requests on the same listener answer in well under that."""
    server, _ = _sasl_server(delay_ms=400)
    stop = threading.Event()
    refusals = []

    def attacker():
        while not stop.is_set():
            started = time.monotonic()
            try:
                _carol(server, password="guess").close()
            except SaslAuthenticationError:
                refusals.append(time.monotonic() - started)
    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(20)]
    try:
        good = _carol(server)
        for t in threads:
            t.start()
        wait_until(lambda: len(refusals) >= 20, timeout_s=20, what="refusals")
        latencies = []
        for _ in range(20):
            started = time.monotonic()
            good.request(wire.METADATA, {"topics": [], "allow_auto_topic_creation": False}
                         ).result(5)
            latencies.append(time.monotonic() - started)
        good.close()
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        server.close()
    assert min(refusals) >= 0.4
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies


# -- ACLs with authenticated principals (docs/acls.md) ---------------------------------------
def test_an_authenticated_user_is_refused_what_its_acls_deny(cluster, pki):
    """alice over SASL_SSL (SCRAM): denied Write on a topic her produce is
    TOPIC_AUTHORIZATION_FAILED and stores nothing; denied Read her consumer gets
    TOPIC_AUTHORIZATION_FAILED; denied Describe a topic is absent from her Metadata;
    another user (the broker's) still produces to the first."""
    topic, hidden = _topic(cluster, "acl-alice", rf=1), _topic(cluster, "acl-hidden", rf=1)
    admin = cluster.admin()
    conf = _settings(cluster, pki, "SASL_SSL", "SCRAM-SHA-256")
    # a resource with ACLs is refused to all they do not allow (Kafka's rule): allow
    # everyone everything on both topics, then deny alice
    for t in (topic, hidden):
        admin.create_acl("User:*", "topic", t, "all")
    for operation in ("write", "read"):
        admin.create_acl("User:alice", "topic", topic, operation, permission="deny")
    admin.create_acl("User:alice", "topic", hidden, "describe", permission="deny")
    probe = ck.Producer(conf)
    # ACL changes reach a broker in order: once the last one shows, so have the others
    wait_until(lambda: hidden not in probe.list_topics(timeout=10).topics
               and topic in probe.list_topics(timeout=10).topics, timeout_s=30,
               what="alice's ACLs applied")

    def ends():
        return [row["log_end_offset"] for row in cluster.admin().describe_topic(topic)]
    before = ends()
    errors = []
    producer = ck.Producer({**conf, "message.timeout.ms": 10000})
    producer.produce(topic, b"x", partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert [e.code() for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    consumer = ck.Consumer({**conf, "group.id": "alice-g", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        msg = wait_until(lambda: (lambda m: m is not None and m.error() is not None and m)(
            consumer.poll(0.5)), timeout_s=30, what="the consumer's error")
        assert msg.error().code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    ok = ck.Producer({**conf, "sasl.username": "broker", "sasl.password": BROKER_PASSWORD,
                      "sasl.mechanism": "SCRAM-SHA-512"})
    ok.produce(topic, b"y", partition=0)
    assert ok.flush(30) == 0
    assert ends() == [before[0] + 1, before[1]]


def test_a_user_denied_create_cannot_auto_create_a_topic(cluster, pki):
    """Topic auto-creation needs Create on the cluster or the topic (Kafka's rule): alice,
    denied both, producing to a topic nobody made gets TOPIC_AUTHORIZATION_FAILED (from
    librdkafka and from raykafka's Producer) and no topic is made; the broker's user producing there gets it created."""
    admin = cluster.admin()
    name = "alice-auto"
    bindings = [("User:*", "cluster", "kafka-cluster", "all", "allow"),
                ("User:alice", "cluster", "kafka-cluster", "create", "deny"),
                ("User:*", "topic", name, "all", "allow"),
                ("User:alice", "topic", name, "create", "deny")]
    for principal, kind, resource, operation, permission in bindings:
        admin.create_acl(principal, kind, resource, operation, permission=permission)
    try:
        conf = _settings(cluster, pki, "SASL_SSL", "SCRAM-SHA-256")
        wait_until(lambda: len(admin.list_acls()) >= len(bindings), timeout_s=30,
                   what="the ACLs stored")
        errors = []
        producer = ck.Producer({**conf, "message.timeout.ms": 8000})
        producer.produce(name, b"x", on_delivery=lambda err, msg: errors.append(err))
        producer.flush(30)
        assert [e.code() for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
        assert name not in admin.list_topics()
        # raykafka's own Producer asks as alice: the same refusal, typed
        with cluster.producer(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                              sasl_plain_username="alice", sasl_plain_password="alice-secret",
                              ssl_cafile=pki["ca"]) as own:
            with pytest.raises(TopicAuthorizationFailedError):
                own.send(name, b"z")
        assert name not in admin.list_topics()
        ok = ck.Producer({**conf, "sasl.username": "broker", "sasl.password": BROKER_PASSWORD,
                          "sasl.mechanism": "SCRAM-SHA-512"})
        ok.produce(name, b"y")
        assert ok.flush(60) == 0
        assert name in admin.list_topics()
    finally:
        for principal, kind, resource, operation, permission in bindings:
            admin.delete_acl(principal, kind, resource, operation, permission=permission)
