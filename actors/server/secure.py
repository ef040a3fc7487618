"""What ``Cluster.start(secure=True)`` (``raykafka start --secure``) makes and sets: the
security directory, the brokers' settings, and what a client needs to know.

``<data_dir>/security/`` (0700)::

    ca.pem              the cluster's CA certificate: what clients trust (ssl.ca.location)
    ca.key        0600  its private key (signs the broker certificate)
    broker.pem          the brokers' certificate (every broker shares it), signed by the CA
    broker.key    0600  its private key
    admin.password 0600 the admin user's password (a super user, SCRAM-SHA-256 and -512)
    broker.password 0600 the brokers' own SCRAM credential (inter-broker, a super user)
    zookeeper.digest 0600 ``raykafka:<password>``: the cluster's ZooKeeper digest credential
    admin.properties 0600 librdkafka settings of the admin user (``kcat -F``), rewritten at
                        each start with the brokers' current addresses

A directory that exists is reused (a restart on the same data dir): the CA, keys and
passwords in it are kept (the embedded ZooKeeper's znodes carry ACLs of the digest
credential, and clients trust the CA); only what is missing is made, and the broker
certificate is made again (from the same CA) when it does not name a host the cluster
needs now or expires within ``pki.RENEW_DAYS``.

The brokers get the certificate, key and CA as PEM text (Kafka's KIP-651 settings
``ssl.keystore.type=PEM``, ``ssl.keystore.certificate.chain``, ``ssl.keystore.key``,
``ssl.truststore.certificates``), not as paths: a broker on another node of a Ray cluster
has no access to the head's files. Those settings travel in the cluster config, inside
Ray's trust boundary as ``sasl.jaas.config`` does, and DescribeConfigs never answers them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass

from . import pki

SECURITY_DIR = "security"
ADMIN_USER = "admin"
BROKER_USER = "raykafka-broker"
ZK_USER = "raykafka"
PROTOCOL = "SASL_SSL"
MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
         'username="{user}" password="{password}";')


@dataclass
class SecurityFiles:
    """The security directory of one data dir, its contents read or made."""

    directory: str
    ca_pem: str
    broker_pem: str
    broker_key: str
    admin_password: str
    broker_password: str
    zk_digest: str
    made: tuple[str, ...]          # the files made by this start (the others were reused)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def broker_config(self, listeners: str) -> dict:
        """The brokers' settings of a secured cluster (the caller's own win: setdefault)."""
        return {
            "listeners": listeners,
            "inter.broker.listener.name": PROTOCOL,
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "sasl.jaas.config": _JAAS.format(user=BROKER_USER, password=self.broker_password),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": self.broker_pem,
            "ssl.keystore.key": self.broker_key,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": self.ca_pem,
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN_USER};User:{BROKER_USER}",
            "allow.everyone.if.no.acl.found": "false",
            "zookeeper.set.acl": "true",
            "zookeeper.auth.digest": self.zk_digest,
        }

    def info(self) -> dict:
        """What ``Cluster.connect`` needs (kept in the ClusterInfo actor, inside Ray's trust
        boundary): the clients' settings, the admin's credential, the CA itself (a process on
        another node has no access to ``ca_file``)."""
        return {"protocol": PROTOCOL, "mechanism": MECHANISM, "user": ADMIN_USER,
                "password": self.admin_password, "ca_pem": self.ca_pem,
                "ca_file": self.path("ca.pem"), "password_file": self.path("admin.password"),
                "properties_file": self.path("admin.properties"), "directory": self.directory}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _secret() -> str:
    return secrets.token_urlsafe(24)


def node_hosts() -> list[str]:
    """The names a broker certificate must carry on this machine: localhost, 127.0.0.1, the
    host name and its address."""
    hosts = ["localhost", "127.0.0.1", socket.gethostname()]
    try:
        hosts.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return hosts


def prepare(data_dir: str, hosts) -> SecurityFiles:
    """Read ``<data_dir>/security`` or make what it lacks (see the module docstring);
    ``hosts``: the names and addresses the broker certificate must carry."""
    directory = os.path.join(data_dir, SECURITY_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    made = []

    def path(name):
        return os.path.join(directory, name)

    ca_pem, ca_key = _read(path("ca.pem")), _read(path("ca.key"))
    if ca_pem is None or ca_key is None:
        cert, key = pki.make_ca(f"raykafka CA {os.path.basename(data_dir.rstrip('/'))}")
        pki.write_private(path("ca.key"), key)
        pki.write_public(path("ca.pem"), cert)
        ca_pem, ca_key = cert.decode(), key.decode()
        made += ["ca.pem", "ca.key"]
        for stale in ("broker.pem", "broker.key"):      # signed by a CA that is gone
            if os.path.exists(path(stale)):
                os.unlink(path(stale))
    hosts = list(dict.fromkeys(h for h in hosts if h))
    broker_pem, broker_key = _read(path("broker.pem")), _read(path("broker.key"))
    if broker_pem is None or broker_key is None or pki.needs_new_certificate(
            broker_pem.encode(), ca_pem.encode(), hosts):
        if broker_pem is not None and broker_key is not None:   # keep what it named before
            hosts += sorted(pki.certificate_hosts(broker_pem.encode()) - set(hosts))
        cert, key = pki.make_certificate(ca_pem.encode(), ca_key.encode(), hosts)
        pki.write_private(path("broker.key"), key)
        pki.write_public(path("broker.pem"), cert)
        broker_pem, broker_key = cert.decode(), key.decode()
        made += ["broker.pem", "broker.key"]
    secrets_ = {}
    for name, make in (("admin.password", _secret), ("broker.password", _secret),
                       ("zookeeper.digest", lambda: f"{ZK_USER}:{_secret()}")):
        value = (_read(path(name)) or "").strip()
        if not value:
            value = make()
            pki.write_private(path(name), (value + "\n").encode())
            made.append(name)
        secrets_[name] = value
    return SecurityFiles(directory, ca_pem, broker_pem, broker_key,
                         secrets_["admin.password"], secrets_["broker.password"],
                         secrets_["zookeeper.digest"], tuple(made))


def write_properties(security: dict, bootstrap: str) -> None:
    """``admin.properties``: the admin's librdkafka settings (``kcat -F FILE``), 0600."""
    lines = [f"{k}={v}" for k, v in client_settings(security, bootstrap).items()]
    pki.write_private(security["properties_file"], ("\n".join(lines) + "\n").encode())


def ca_file(security: dict) -> str:
    """A path of the cluster's CA certificate on this machine: the security directory's
    when it is here, else a copy of the PEM the cluster info holds (in the temp dir, named
    by the user and the PEM's hash, so every process of this user shares one; a file of
    that name is used only when it is ours and holds exactly that PEM)."""
    path = security.get("ca_file")
    if path and os.path.exists(path):
        return path
    pem = security["ca_pem"].encode()
    path = os.path.join(tempfile.gettempdir(), f"raykafka-ca-{os.getuid()}-"
                        f"{hashlib.sha256(pem).hexdigest()[:16]}.pem")
    try:
        with open(path, "rb") as f:
            if f.read() == pem and os.fstat(f.fileno()).st_uid == os.getuid():
                return path
    except FileNotFoundError:
        pass
    try:
        pki.write_public(path, pem)
        return path
    except OSError:
        # a file of that name we may not replace (another user's, in a sticky /tmp): never
        # trust it; a file of our own instead
        fd, path = tempfile.mkstemp(prefix="raykafka-ca-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return path


def client_settings(security: dict, bootstrap: str, user: str | None = None,
                    password: str | None = None) -> dict:
    """librdkafka / confluent-kafka settings for ``user`` (None: the admin user)."""
    if user is None:
        user = security["user"]
        password = security["password"] if password is None else password
    return {"bootstrap.servers": bootstrap, "security.protocol": security["protocol"],
            "sasl.mechanism": security["mechanism"], "sasl.username": user,
            "sasl.password": password, "ssl.ca.location": ca_file(security)}


def client_kwargs(security: dict, config: dict) -> dict:
    """raykafka client settings (kafka-python's names) with the secured cluster's defaults:
    SASL_SSL, SCRAM-SHA-512, the CA, and the admin user unless ``config`` names a user."""
    out = dict(config)
    out.setdefault("security_protocol", security["protocol"])
    if str(out["security_protocol"]).upper().startswith("SASL"):
        out.setdefault("sasl_mechanism", security["mechanism"])
        if "sasl_plain_username" not in out:
            out["sasl_plain_username"] = security["user"]
            out.setdefault("sasl_plain_password", security["password"])
    if str(out["security_protocol"]).upper().endswith("SSL"):
        out.setdefault("ssl_cafile", ca_file(security))
    return out


__all__ = ["SecurityFiles", "prepare", "node_hosts", "write_properties", "ca_file",
           "client_settings", "client_kwargs", "ADMIN_USER", "BROKER_USER", "SECURITY_DIR"]
