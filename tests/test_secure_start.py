"""A secured cluster in one command (issue 23): ``Cluster.start(secure=True)`` makes a CA,
a broker certificate, an admin user and a ZooKeeper credential under
``<data_dir>/security``; Kafka clients connect with ``cluster.client_config()``, anyone
else is refused (no credentials, a wrong password, a user without ACLs, a plain ZooKeeper
client); raykafka's own clients need no security arguments; DescribeConfigs never shows a
secret; ``raykafka start --secure`` prints the client settings kcat then uses. One 2-broker
secured cluster for the module (replication between them runs over SASL_SSL), and one
1-broker daemon for the CLI test."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import time

import pytest

from actors import Cluster
from actors.errors import IllegalArgumentError, SecurityDisabledError
from actors.server import pki, secure
from tests.cluster_helpers import (FAST_CONFIG, local_ray, unique_namespace,  # noqa: F401
                                   wait_until, zk_client)

ck = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402  (ck.admin)

_names = (f"sec-t{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def cluster(local_ray, tmp_path_factory):  # noqa: F811
    data_dir = str(tmp_path_factory.mktemp("secure-data"))
    c = Cluster.start(2, data_dir=data_dir, namespace=unique_namespace("secure"),
                      config={**FAST_CONFIG, "offsets.topic.num.partitions": 1,
                              "offsets.topic.replication.factor": 1,
                              "group.initial.rebalance.delay.ms": 0}, secure=True)
    yield c
    c.shutdown()


def _topic(cluster, rf: int = 2) -> str:
    name = next(_names)
    cluster.admin().create_topic(name, partitions=1, replication_factor=rf)
    wait_until(lambda: cluster.admin().describe_topic(name)[0]["leader"] >= 0,
               timeout_s=60, what=f"a leader of {name}")
    return name


def _produce(conf: dict, topic: str, values) -> list:
    """Deliver ``values`` with a confluent producer; the delivery errors (empty: all in)."""
    errors = []
    producer = ck.Producer({**conf, "linger.ms": 0, "message.timeout.ms": 20000})
    for v in values:
        producer.produce(topic, value=v,
                         on_delivery=lambda err, msg: err and errors.append(err))
    producer.flush(30)
    return errors


def _auth_errors(conf: dict) -> list:
    """The errors a confluent admin client reports trying to list the topics with ``conf``
    (it must fail: a listing that succeeds fails the test)."""
    seen = []
    admin = ck.admin.AdminClient({**conf, "error_cb": seen.append})
    with pytest.raises(ck.KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(0.5)            # serves the error callbacks
    return seen


def test_confluent_kafka_with_client_config_produces_and_consumes(cluster):
    """confluent-kafka with nothing but cluster.client_config() produces to an RF=2 topic
    and consumes it back in a group, over SASL_SSL as the admin user."""
    conf = cluster.client_config()
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.username"] == "admin"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and os.path.exists(conf["ssl.ca.location"])
    topic = _topic(cluster)
    assert _produce(conf, topic, [b"v%d" % i for i in range(10)]) == []
    consumer = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got, deadline = [], time.monotonic() + 60
    try:
        while len(got) < 10 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    assert got == [b"v%d" % i for i in range(10)]


def test_no_credentials_or_a_wrong_password_is_refused(cluster):
    """A client with TLS but no SASL gets no metadata (the broker closes the connection),
    one with the admin's name and a wrong password gets SASL_AUTHENTICATION_FAILED."""
    conf = cluster.client_config()
    tls_only = {"bootstrap.servers": conf["bootstrap.servers"], "security.protocol": "SSL",
                "ssl.ca.location": conf["ssl.ca.location"]}
    assert not any(e.code() == ck.KafkaError._AUTHENTICATION for e in _auth_errors(tls_only))
    wrong = _auth_errors({**conf, "sasl.password": conf["sasl.password"] + "x"})
    assert any(e.code() == ck.KafkaError._AUTHENTICATION and "invalid credentials" in e.str()
               for e in wrong), wrong


def test_a_user_without_acls_is_refused_until_an_acl_allows_it(cluster):
    """A new user authenticates but producing is TOPIC_AUTHORIZATION_FAILED (no ACL: refused,
    allow.everyone.if.no.acl.found is false); after Admin.create_acl(write) it produces."""
    topic = _topic(cluster, rf=1)
    admin = cluster.admin()
    admin.create_user("bob", "bob-secret")
    bob = cluster.client_config(user="bob", password="bob-secret")
    assert bob["sasl.username"] == "bob" and bob["sasl.password"] == "bob-secret"
    errors = _produce(bob, topic, [b"x"])
    assert [e.code() for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    admin.create_acl("User:bob", "topic", topic, "write")
    assert wait_until(lambda: _produce(bob, topic, [b"y"]) == [], timeout_s=30,
                      what="bob allowed to write")


def test_raykafka_clients_need_no_security_arguments(cluster):
    """cluster.producer() and a consumer_group's member actors (which attach with
    Cluster.connect in their own processes) talk SASL_SSL as the admin user by default; a
    wrong sasl_plain_password given explicitly is used, and refused."""
    from actors.errors import SaslAuthenticationError
    topic = _topic(cluster)
    with cluster.producer() as producer:
        for i in range(5):
            producer.send(topic, b"r%d" % i).get(timeout=30)
    group = cluster.consumer_group(f"g-{topic}", [topic], 1, len,
                                   auto_offset_reset="earliest")
    try:
        wait_until(lambda: group.stats()["processed"] >= 5, timeout_s=60,
                   what="the member actor consumed the records")
    finally:
        group.stop()
    with pytest.raises(SaslAuthenticationError):
        bad = cluster.simple_consumer(sasl_plain_username="admin", sasl_plain_password="no")
        try:
            bad.fetch(topic, 0, 0)
        finally:
            bad.close()


def test_a_plain_zookeeper_client_cannot_change_the_registry(cluster):
    """ZooKeeper ACLs are on: a kazoo client without the digest reads /brokers but cannot
    write under it, nor read the SCRAM credentials in /config/users."""
    from kazoo.exceptions import NoAuthError
    zk = zk_client(cluster)
    try:
        assert set(zk.get_children("/brokers/ids")) == {"0", "1"}
        with pytest.raises(NoAuthError):
            zk.create("/brokers/topics/intruder", b"{}")
        with pytest.raises(NoAuthError):
            zk.get("/config/users/admin")
    finally:
        zk.stop()
        zk.close()


def test_the_security_directory_is_private(cluster):
    """<data_dir>/security is 0700; the keys, passwords and admin.properties are 0600; the
    password file holds what client_config answers."""
    directory = os.path.join(cluster.data_dir, "security")
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for name in ("ca.key", "broker.key", "admin.password", "broker.password",
                 "zookeeper.digest", "admin.properties"):
        assert stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) == 0o600, name
    with open(os.path.join(directory, "admin.password")) as f:
        assert f.read().strip() == cluster.client_config()["sasl.password"]
    assert cluster.security_files["password_file"] == os.path.join(directory, "admin.password")


def test_connect_from_the_namespace_gets_the_same_client_config(cluster):
    """Cluster.connect(namespace) knows the cluster is secure: the same client_config, and
    its producer authenticates as the admin."""
    other = Cluster.connect(cluster.namespace)
    assert other.secure and other.client_config() == cluster.client_config()
    topic = _topic(cluster, rf=1)
    with other.producer() as producer:
        assert producer.send(topic, b"via connect").get(timeout=30).offset == 0


def test_client_config_refuses_a_user_without_its_password(cluster):
    """client_config(user="bob") without a password is IllegalArgumentError; a user on a
    cluster without security is SecurityDisabledError; without security only
    bootstrap.servers is answered."""
    with pytest.raises(IllegalArgumentError):
        cluster.client_config(user="bob")
    with pytest.raises(IllegalArgumentError):
        cluster.client_config(user="")
    plain = Cluster({"namespace": "plain", "zk_hosts": "127.0.0.1:1/x", "data_dir": "/x",
                     "config": {}, "broker_ids": []})
    plain._metadata = type("M", (), {"refresh": staticmethod(lambda: {"brokers": {
        0: {"host": "h", "port": 9}}})})()
    assert plain.client_config() == {"bootstrap.servers": "h:9"} and not plain.secure
    with pytest.raises(SecurityDisabledError):
        plain.client_config(user="bob", password="pw")


def test_describe_configs_answers_secrets_as_null_and_sensitive(cluster):
    """On a secured cluster a broker's DescribeConfigs answers the secrets secure=True set
    (sasl.jaas.config, zookeeper.auth.digest, the PEM key) with a null value and
    is_sensitive (Kafka's PASSWORD type), other settings as given."""
    admin = ck.admin.AdminClient(cluster.client_config())
    (future,) = admin.describe_configs(
        [ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, "0")]).values()
    entries = future.result(timeout=30)
    for name in ("sasl.jaas.config", "zookeeper.auth.digest", "ssl.keystore.key"):
        assert entries[name].value is None and entries[name].is_sensitive, name
    assert entries["super.users"].value == "User:admin;User:raykafka-broker"
    assert not entries["super.users"].is_sensitive


def test_a_restart_reuses_the_ca_and_secrets_and_renews_the_broker_certificate(cluster,
                                                                                tmp_path):
    """secure.prepare on an existing security directory makes nothing (the CA, keys and
    passwords are kept); on a directory whose broker certificate lacks a host it makes a
    new certificate from the same CA that names the old hosts and the new one."""
    again = secure.prepare(cluster.data_dir, secure.node_hosts())
    assert again.made == ()
    assert again.admin_password == cluster.client_config()["sasl.password"]
    with open(os.path.join(cluster.data_dir, "security", "ca.pem")) as f:
        assert f.read() == again.ca_pem
    first = secure.prepare(str(tmp_path), ["localhost"])
    assert set(first.made) >= {"ca.pem", "ca.key", "broker.pem", "admin.password"}
    second = secure.prepare(str(tmp_path), ["localhost", "10.1.2.3"])
    assert second.made == ("broker.pem", "broker.key") and second.ca_pem == first.ca_pem
    assert pki.certificate_hosts(second.broker_pem.encode()) == {"localhost", "10.1.2.3"}
    assert pki.needs_new_certificate(second.broker_pem.encode(), second.ca_pem.encode(),
                                     ["localhost"]) is None
    path = secure.ca_file({"ca_file": "/nonexistent/ca.pem", "ca_pem": first.ca_pem})
    with open(path) as f:     # another node: a local copy of the CA the info holds
        assert f.read() == first.ca_pem


def test_settings_given_win_over_what_secure_sets(cluster, tmp_path):
    """secure=True's settings are defaults: a key the caller gave keeps its value, the others
    are filled in."""
    from actors.cluster import _secure_defaults
    config = {"super.users": "User:ops", "listeners": "SASL_SSL://127.0.0.1:9999"}
    info = _secure_defaults(str(tmp_path), config)
    assert config["super.users"] == "User:ops"
    assert config["listeners"] == "SASL_SSL://127.0.0.1:9999"
    assert config["zookeeper.set.acl"] == "true" and config["authorizer.class.name"]
    assert info["user"] == "admin" and info["protocol"] == "SASL_SSL"


def test_an_open_start_on_a_secured_data_dir_is_refused(cluster):
    """Cluster.start without secure=True on a data dir with a security directory (its
    ZooKeeper's znodes carry the digest ACLs) is InvalidConfigurationError at once."""
    from actors.errors import InvalidConfigurationError
    with pytest.raises(InvalidConfigurationError, match="secure=True"):
        Cluster.start(1, data_dir=cluster.data_dir, namespace=unique_namespace("open"))


def test_raykafka_start_secure_prints_settings_kcat_can_use(tmp_path):
    """`raykafka start --secure` prints the client settings with the password's file (never
    the password); kcat -F with the admin.properties it names produces and consumes;
    `status` says secure; CLI produce works as the admin; `stop` ends it."""
    from test_cli import run_cli
    state_dir, ns, data = str(tmp_path / "state"), unique_namespace("clisec"), \
        str(tmp_path / "data")
    out = run_cli(state_dir, "start", "--secure", "--namespace", ns, "--brokers", "1",
                  "--data-dir", data, timeout=240)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    try:
        text = out.stdout.decode()
        with open(os.path.join(data, "security", "admin.password")) as f:
            password = f.read().strip()
        assert password not in text
        assert "security.protocol=SASL_SSL" in text and "sasl.username=admin" in text
        props = os.path.join(data, "security", "admin.properties")
        assert f"kcat -F {props}" in text
        status = run_cli(state_dir, "status", "--namespace", ns).stdout.decode()
        assert "security    secure: SASL_SSL" in status
        assert run_cli(state_dir, "topics", "create", "k", "--partitions", "1",
                       "--replication-factor", "1", "--namespace", ns).returncode == 0
        assert run_cli(state_dir, "produce", "k", "--namespace", ns,
                       stdin=b"from-cli\n").returncode == 0
        kcat = subprocess.run(["kcat", "-F", props, "-P", "-t", "k"], input=b"from-kcat\n",
                              capture_output=True, timeout=60)
        assert kcat.returncode == 0, kcat.stderr.decode()
        read = subprocess.run(["kcat", "-F", props, "-C", "-t", "k", "-o", "beginning", "-e",
                               "-q"], capture_output=True, timeout=60)
        assert read.stdout.decode().split() == ["from-cli", "from-kcat"], read.stderr
    finally:
        assert run_cli(state_dir, "stop", "--namespace", ns, timeout=120).returncode == 0
