"""The ZooKeeper layout: every znode path and JSON body raykafka reads or writes.

This is the only module that knows paths and byte formats; everything else calls these
builders and (de)serialisers. The layout is the seeds' own (Kafka 0.8 - 2.x), so a user of
the old design finds what they expect with `zkCli.sh`:

  /cluster/id                               {"version":"1","id":"<22 url-safe base64 chars>"}
  /controller                  (ephemeral)  {"version":1,"brokerid":N,"timestamp":"<ms>"}
  /controller_epoch                         N   (plain decimal integer; first controller: 1)
  /brokers/ids/<id>            (ephemeral)  {"version":4,"host":..,"port":..,
                                             "endpoints":["PLAINTEXT://host:port"],
                                             "listener_security_protocol_map":{..},
                                             "rack":..|null,"jmx_port":-1,"timestamp":"<ms>"}
  /brokers/topics/<t>                       {"version":1,"partitions":{"0":[1,2],..}}
  /brokers/topics/<t>/partitions/<p>/state  {"controller_epoch":E,"leader":L,"version":1,
                                             "leader_epoch":LE,"isr":[..]}
  /config/topics/<t>                        {"version":1,"config":{"k":"v",..}}
  /config/changes/config_change_<seq>       {"version":2,"entity_path":"topics/<t>"}
  /admin/delete_topics/<t>                  (empty body: the child's name is the request)
  /admin/reassign_partitions                {"version":1,"partitions":[{"topic","partition",
                                             "replicas"}]}
  /admin/preferred_replica_election         {"version":1,"partitions":[{"topic","partition"}]}
  /isr_change_notification/isr_change_<seq> {"version":1,"partitions":[{"topic","partition"}]}
  /consumers/<g>/ids/<consumer_id> (ephem.) {"version":1,"subscription":{"t":n},
                                             "pattern":"static"|"white_list"|"black_list",
                                             "timestamp":"<ms>"}
  /consumers/<g>/owners/<t>/<p>    (ephem.) <consumer thread id> (plain UTF-8 string)
  /consumers/<g>/offsets/<t>/<p>            <offset> (plain decimal integer)

Namespaces: two clusters share one ZooKeeper through a *chroot* in the connection string
(`127.0.0.1:2181/raykafka-<namespace>`, see `chroot_for` / `session.connect`), not through a
prefix here, so every path above is exactly the seed's path as the cluster sees it.

Deviations from the seeds, and why: `/brokers/ids/<id>` uses Kafka's version-4 body (the seed
shows version 1), because DESIGN.md asks for endpoints and rack; the fields of version 1
(host, port, jmx_port, timestamp) are all still present. `/admin/delete_topics` holds one
child per topic (Kafka >= 0.8.2) rather than the seed's {"topics":[..]} body.

Not guaranteed: decoders ignore unknown keys (forward compatibility, as Kafka does) but
reject a body missing a required key with ZkDataError.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from coordination.errors import ZkDataError

# ---------------------------------------------------------------------------------------------
# Paths

CLUSTER_ID_PATH = "/cluster/id"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
BROKERS_PATH = "/brokers"
BROKER_IDS_PATH = "/brokers/ids"
BROKER_TOPICS_PATH = "/brokers/topics"
CONFIG_PATH = "/config"
CONFIG_TOPICS_PATH = "/config/topics"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
ADMIN_PATH = "/admin"
DELETE_TOPICS_PATH = "/admin/delete_topics"
REASSIGN_PARTITIONS_PATH = "/admin/reassign_partitions"
PREFERRED_REPLICA_ELECTION_PATH = "/admin/preferred_replica_election"
ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
CONSUMERS_PATH = "/consumers"

#: Persistent parents a fresh cluster creates up front (Kafka's ZkUtils.persistentZkPaths), so
#: watches on them can be set before anything is written below.
PERSISTENT_PATHS: tuple[str, ...] = (
    BROKER_IDS_PATH, BROKER_TOPICS_PATH, CONFIG_TOPICS_PATH, CONFIG_CHANGES_PATH,
    DELETE_TOPICS_PATH, ISR_CHANGE_NOTIFICATION_PATH, CONSUMERS_PATH,
)

_NAMESPACE_RE = re.compile(r"^[a-zA-Z0-9._-]{1,200}$")
# ZooKeeper forbids "/" in a node name and "." / ".." as names; Kafka's topic rule is stricter.
_NODE_NAME_RE = re.compile(r"^[^/\x00]{1,255}$")


def chroot_for(namespace: str) -> str:
    """The chroot that isolates one cluster: "/raykafka-<namespace>"."""
    if not _NAMESPACE_RE.match(namespace):
        raise ValueError(f"invalid namespace {namespace!r}: use [a-zA-Z0-9._-], 1..200 chars")
    return f"/raykafka-{namespace}"


def split_connect(connect: str) -> tuple[str, str]:
    """Kafka's ``zookeeper.connect`` ("h1:p1,h2:p2/chroot") -> ("h1:p1,h2:p2", "/chroot").

    The chroot is "" when the string has none. Raises ValueError for an empty server list
    or a malformed chroot (ZooKeeper's rule: absolute, no empty, "." or ".." segment, no
    trailing "/")."""
    if not isinstance(connect, str) or not connect.strip():
        raise ValueError(f"a ZooKeeper connect string is 'host:port[,host:port...][/chroot]', "
                         f"got {connect!r}")
    servers, slash, rest = connect.strip().partition("/")
    if not servers:
        raise ValueError(f"ZooKeeper connect string {connect!r} names no server")
    if not slash:
        return servers, ""
    chroot = "/" + rest
    segments = rest.split("/")
    if not rest or any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"ZooKeeper chroot {chroot!r} in {connect!r} is not a valid path")
    return servers, chroot


def zookeeper_connect(zk: str, namespace: str) -> str:
    """The full connect string a cluster uses, chroot included, as Kafka's
    ``zookeeper.connect``: ``zk`` as given when it has a chroot, else ``zk`` plus the
    namespace's chroot ("127.0.0.1:2181" -> "127.0.0.1:2181/raykafka-<namespace>")."""
    servers, chroot = split_connect(zk)
    return servers + (chroot or chroot_for(namespace))


def _name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NODE_NAME_RE.match(value) or value in (".", ".."):
        raise ValueError(f"invalid {kind} for a znode name: {value!r}")
    return value


def _int_name(kind: str, value: int) -> str:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"invalid {kind}: {value!r} (a non-negative int)")
    return str(value)


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{_int_name('broker id', broker_id)}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS_PATH}/{_name('topic', topic)}"


def topic_partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{topic_partitions_path(topic)}/{_int_name('partition', partition)}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS_PATH}/{_name('topic', topic)}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{_name('topic', topic)}"


def consumer_group_path(group: str) -> str:
    return f"{CONSUMERS_PATH}/{_name('group', group)}"


def consumer_ids_path(group: str) -> str:
    return f"{consumer_group_path(group)}/ids"


def consumer_id_path(group: str, consumer_id: str) -> str:
    return f"{consumer_ids_path(group)}/{_name('consumer id', consumer_id)}"


def consumer_owners_path(group: str, topic: str) -> str:
    return f"{consumer_group_path(group)}/owners/{_name('topic', topic)}"


def consumer_owner_path(group: str, topic: str, partition: int) -> str:
    return f"{consumer_owners_path(group, topic)}/{_int_name('partition', partition)}"


def consumer_offsets_path(group: str, topic: str) -> str:
    return f"{consumer_group_path(group)}/offsets/{_name('topic', topic)}"


def consumer_offset_path(group: str, topic: str, partition: int) -> str:
    return f"{consumer_offsets_path(group, topic)}/{_int_name('partition', partition)}"


# ---------------------------------------------------------------------------------------------
# JSON helpers


def now_ms() -> int:
    return int(time.time() * 1000)


def _dump(obj: Mapping[str, Any]) -> bytes:
    # Compact separators: what Kafka's Json.encodeAsBytes writes.
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _load(path: str, data: bytes | None) -> dict:
    if not data:
        raise ZkDataError(f"{path}: empty znode, expected a JSON object")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ZkDataError(f"{path}: not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise ZkDataError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _req(path: str, obj: dict, key: str, kind: type | tuple[type, ...]):
    if key not in obj:
        raise ZkDataError(f"{path}: missing key {key!r} in {obj}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ZkDataError(f"{path}: key {key!r} has {type(value).__name__}, expected {kind}")
    return value


def _int_list(path: str, value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ZkDataError(f"{path}: {what} must be a list of ints, got {value!r}")
    return tuple(value)


def _ts(path: str, obj: dict, key: str = "timestamp") -> int:
    # Kafka writes timestamps as strings of milliseconds; accept a number too.
    value = obj.get(key)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ZkDataError(f"{path}: bad {key} {value!r}") from exc


def encode_int(value: int) -> bytes:
    """Plain decimal integer body (/controller_epoch, consumer offsets)."""
    return str(int(value)).encode("ascii")


def decode_int(path: str, data: bytes | None) -> int:
    try:
        return int((data or b"").decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ZkDataError(f"{path}: expected a decimal integer, got {data!r}") from exc


# ---------------------------------------------------------------------------------------------
# /cluster/id


def new_cluster_id() -> str:
    """22 URL-safe base64 chars of a random UUID, no padding (Kafka's CoreUtils.generateUuidAsBase64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


_CLUSTER_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,22}$")


def encode_cluster_id(cluster_id: str) -> bytes:
    if not _CLUSTER_ID_RE.match(cluster_id):
        raise ValueError(f"invalid cluster id {cluster_id!r}")
    return _dump({"version": "1", "id": cluster_id})   # Kafka writes the version as a string


def decode_cluster_id(data: bytes | None) -> str:
    return _req(CLUSTER_ID_PATH, _load(CLUSTER_ID_PATH, data), "id", str)


# ---------------------------------------------------------------------------------------------
# /controller and /controller_epoch


@dataclass(frozen=True)
class ControllerInfo:
    """Body of the ephemeral /controller znode: who is the active controller since when."""
    broker_id: int
    timestamp_ms: int

    def to_bytes(self) -> bytes:
        return _dump({"version": 1, "brokerid": self.broker_id,
                      "timestamp": str(self.timestamp_ms)})

    @classmethod
    def from_bytes(cls, data: bytes | None) -> ControllerInfo:
        path = CONTROLLER_PATH
        if data and data.strip().isdigit():
            # Kafka 0.8.0 wrote the bare broker id; still accepted by every later Kafka.
            return cls(broker_id=int(data), timestamp_ms=0)
        obj = _load(path, data)
        return cls(broker_id=_req(path, obj, "brokerid", int), timestamp_ms=_ts(path, obj))


# ---------------------------------------------------------------------------------------------
# /brokers/ids/<id>

BROKER_INFO_VERSION = 4


@dataclass(frozen=True)
class BrokerInfo:
    """Body of /brokers/ids/<id>. `endpoints` are listener URLs, "NAME://host:port";
    when empty, one PLAINTEXT endpoint is derived from host and port. `protocols` maps a
    listener name to its security protocol (Kafka's listener_security_protocol_map;
    empty: each name is its own protocol)."""
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    endpoints: tuple[str, ...] = ()
    jmx_port: int = -1
    timestamp_ms: int = 0
    protocols: tuple[tuple[str, str], ...] = ()

    def listeners(self) -> list[tuple[str, str, str, int]]:
        """(name, security protocol, host, port) per endpoint, in order."""
        protocols = dict(self.protocols)
        out = []
        for ep in self.endpoints:
            name, _, address = ep.partition("://")
            host, _, port = address.rpartition(":")
            out.append((name, protocols.get(name, name), host.strip("[]"), int(port)))
        return out

    def __post_init__(self):
        _int_name("broker id", self.broker_id)
        if not self.endpoints:
            object.__setattr__(self, "endpoints", (f"PLAINTEXT://{self.host}:{self.port}",))
        else:
            object.__setattr__(self, "endpoints", tuple(self.endpoints))

    def to_bytes(self) -> bytes:
        protocols = {ep.split("://", 1)[0]: ep.split("://", 1)[0] for ep in self.endpoints}
        protocols.update(dict(self.protocols))
        return _dump({
            "version": BROKER_INFO_VERSION,
            "host": self.host,
            "port": self.port,
            "endpoints": list(self.endpoints),
            "listener_security_protocol_map": protocols,
            "rack": self.rack,
            "jmx_port": self.jmx_port,
            "timestamp": str(self.timestamp_ms),
        })

    @classmethod
    def from_bytes(cls, broker_id: int, data: bytes | None) -> BrokerInfo:
        path = broker_path(broker_id)
        obj = _load(path, data)
        rack = obj.get("rack")
        endpoints = obj.get("endpoints") or ()
        if rack is not None and not isinstance(rack, str):
            raise ZkDataError(f"{path}: rack must be a string or null, got {rack!r}")
        protocols = obj.get("listener_security_protocol_map") or {}
        if not isinstance(protocols, dict):
            raise ZkDataError(f"{path}: listener_security_protocol_map must be an object")
        return cls(broker_id=broker_id, host=_req(path, obj, "host", str),
                   port=_req(path, obj, "port", int), rack=rack, endpoints=tuple(endpoints),
                   jmx_port=int(obj.get("jmx_port", -1)), timestamp_ms=_ts(path, obj),
                   protocols=tuple(sorted((str(k), str(v)) for k, v in protocols.items()
                                          if k != v)))     # a name that is its protocol: implied


# ---------------------------------------------------------------------------------------------
# /brokers/topics/<t> and .../partitions/<p>/state


def encode_topic_assignment(assignment: Mapping[int, tuple[int, ...] | list[int]]) -> bytes:
    """{"version":1,"partitions":{"0":[1,2],..}}: partition -> replica list, preferred leader first."""
    return _dump({"version": 1,
                  "partitions": {str(p): list(r) for p, r in sorted(assignment.items())}})


def decode_topic_assignment(topic: str, data: bytes | None) -> dict[int, tuple[int, ...]]:
    path = topic_path(topic)
    parts = _req(path, _load(path, data), "partitions", dict)
    try:
        return {int(p): _int_list(path, r, f"partition {p}") for p, r in
                sorted(parts.items(), key=lambda kv: int(kv[0]))}
    except ValueError as exc:
        raise ZkDataError(f"{path}: partition keys must be integers: {list(parts)}") from exc


@dataclass(frozen=True)
class PartitionState:
    """Body of .../partitions/<p>/state: the leader and ISR, stamped with the epochs that
    fence stale writers (`controller_epoch` of the controller that wrote it)."""
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self):
        object.__setattr__(self, "isr", tuple(self.isr))

    def to_bytes(self) -> bytes:
        return _dump({"controller_epoch": self.controller_epoch, "leader": self.leader,
                      "version": 1, "leader_epoch": self.leader_epoch, "isr": list(self.isr)})

    @classmethod
    def from_bytes(cls, topic: str, partition: int, data: bytes | None) -> PartitionState:
        path = partition_state_path(topic, partition)
        obj = _load(path, data)
        return cls(leader=_req(path, obj, "leader", int),
                   leader_epoch=_req(path, obj, "leader_epoch", int),
                   isr=_int_list(path, _req(path, obj, "isr", list), "isr"),
                   controller_epoch=_req(path, obj, "controller_epoch", int))


# ---------------------------------------------------------------------------------------------
# /config/topics/<t> and /config/changes


def encode_topic_config(config: Mapping[str, Any]) -> bytes:
    """{"version":1,"config":{..}}; values are stored as strings, as Kafka does."""
    return _dump({"version": 1, "config": {str(k): str(v) for k, v in sorted(config.items())}})


def decode_topic_config(topic: str, data: bytes | None) -> dict[str, str]:
    path = topic_config_path(topic)
    return dict(_req(path, _load(path, data), "config", dict))


def encode_config_change(topic: str) -> bytes:
    """Body of a sequential /config/changes/config_change_<seq> (Kafka's version 2)."""
    return _dump({"version": 2, "entity_path": f"topics/{_name('topic', topic)}"})


def decode_config_change(data: bytes | None) -> str:
    """The topic whose config changed."""
    entity = _req(CONFIG_CHANGES_PATH, _load(CONFIG_CHANGES_PATH, data), "entity_path", str)
    kind, _, name = entity.partition("/")
    if kind != "topics" or not name:
        raise ZkDataError(f"{CONFIG_CHANGES_PATH}: unsupported entity_path {entity!r}")
    return name


# ---------------------------------------------------------------------------------------------
# /admin/*, /isr_change_notification


def encode_reassignment(plan: Mapping[tuple[str, int], tuple[int, ...] | list[int]]) -> bytes:
    return _dump({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(plan.items())]})


def decode_reassignment(data: bytes | None) -> dict[tuple[str, int], tuple[int, ...]]:
    path = REASSIGN_PARTITIONS_PATH
    out = {}
    for entry in _req(path, _load(path, data), "partitions", list):
        out[(_req(path, entry, "topic", str), _req(path, entry, "partition", int))] = \
            _int_list(path, _req(path, entry, "replicas", list), "replicas")
    return out


def encode_partition_list(partitions) -> bytes:
    """{"version":1,"partitions":[{"topic","partition"}]}: preferred replica election and ISR
    change notifications."""
    return _dump({"version": 1, "partitions": [
        {"topic": t, "partition": p} for t, p in sorted(set(partitions))]})


def decode_partition_list(path: str, data: bytes | None) -> list[tuple[str, int]]:
    return [(_req(path, e, "topic", str), _req(path, e, "partition", int))
            for e in _req(path, _load(path, data), "partitions", list)]


# ---------------------------------------------------------------------------------------------
# /consumers/<group>/...


@dataclass(frozen=True)
class ConsumerRegistration:
    """Body of /consumers/<g>/ids/<consumer_id>: topic -> number of streams."""
    subscription: Mapping[str, int] = field(default_factory=dict)
    pattern: str = "static"   # "static", "white_list" or "black_list", as the seed shows
    timestamp_ms: int = 0

    def to_bytes(self) -> bytes:
        return _dump({"version": 1, "subscription": dict(self.subscription),
                      "pattern": self.pattern, "timestamp": str(self.timestamp_ms)})

    @classmethod
    def from_bytes(cls, group: str, consumer_id: str, data: bytes | None) -> ConsumerRegistration:
        path = consumer_id_path(group, consumer_id)
        obj = _load(path, data)
        return cls(subscription=dict(_req(path, obj, "subscription", dict)),
                   pattern=_req(path, obj, "pattern", str), timestamp_ms=_ts(path, obj))


def encode_owner(consumer_thread_id: str) -> bytes:
    return consumer_thread_id.encode("utf-8")


def decode_owner(data: bytes | None) -> str:
    return (data or b"").decode("utf-8")


# ---------------------------------------------------------------------------------------------
# ACLs (Kafka's ZooKeeper authorizer layout, AclAuthorizer / ZkData.scala):
#
#   /kafka-acl/<Type>/<name>                     literal patterns (name "*": every resource)
#   /kafka-acl-extended/prefixed/<Type>/<name>   prefixed patterns
#       {"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",
#                             "operation":"Read","host":"*"}]}
#   /kafka-acl-changes/acl_changes_<seq>         "<Type>:<name>" (a literal pattern changed)
#   /kafka-acl-extended-changes/acl_changes_<seq>
#       {"version":1,"resourceType":"<Type>","name":"<name>","patternType":"PREFIXED"}
#
# Words are Kafka's (its enums' toString): resource types Topic, Group, Cluster,
# TransactionalId, DelegationToken, User; operations as ACL_OPERATIONS; Allow / Deny.

ACL_PATH = "/kafka-acl"
ACL_EXTENDED_PATH = "/kafka-acl-extended"
ACL_CHANGES_PATH = "/kafka-acl-changes"
ACL_EXTENDED_CHANGES_PATH = "/kafka-acl-extended-changes"
ACL_CHANGE_PREFIX = "acl_changes_"
ACL_RESOURCE_TYPES = ("Topic", "Group", "Cluster", "TransactionalId", "DelegationToken",
                      "User")
ACL_PATTERN_TYPES = ("LITERAL", "PREFIXED")
ACL_OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe",
                  "ClusterAction", "DescribeConfigs", "AlterConfigs", "IdempotentWrite",
                  "CreateTokens", "DescribeTokens")
ACL_PERMISSIONS = ("Allow", "Deny")
CLUSTER_RESOURCE_NAME = "kafka-cluster"


@dataclass(frozen=True)
class AclEntry:
    """One access control entry of a resource pattern's znode."""
    principal: str      # "User:alice", "User:*"
    host: str           # "*" or an address
    operation: str      # one of ACL_OPERATIONS
    permission: str     # "Allow" or "Deny"

    def __post_init__(self):
        if self.operation not in ACL_OPERATIONS:
            raise ValueError(f"unknown ACL operation {self.operation!r}")
        if self.permission not in ACL_PERMISSIONS:
            raise ValueError(f"unknown ACL permission type {self.permission!r}")
        kind, sep, name = self.principal.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"a principal is TYPE:NAME (User:alice), got {self.principal!r}")


def _acl_kind(resource_type: str, pattern_type: str) -> None:
    if resource_type not in ACL_RESOURCE_TYPES:
        raise ValueError(f"unknown ACL resource type {resource_type!r}")
    if pattern_type not in ACL_PATTERN_TYPES:
        raise ValueError(f"unknown ACL pattern type {pattern_type!r}")


def acl_type_path(resource_type: str, pattern_type: str) -> str:
    """The parent of every pattern of one resource and pattern type."""
    _acl_kind(resource_type, pattern_type)
    root = ACL_PATH if pattern_type == "LITERAL" else f"{ACL_EXTENDED_PATH}/prefixed"
    return f"{root}/{resource_type}"


def acl_resource_path(resource_type: str, name: str, pattern_type: str = "LITERAL") -> str:
    return f"{acl_type_path(resource_type, pattern_type)}/{_name('resource name', name)}"


def acl_change_path(pattern_type: str) -> str:
    """The sequential node prefix of a change notification for a pattern type."""
    changes = ACL_CHANGES_PATH if pattern_type == "LITERAL" else ACL_EXTENDED_CHANGES_PATH
    return f"{changes}/{ACL_CHANGE_PREFIX}"


def encode_acls(entries) -> bytes:
    return _dump({"version": 1, "acls": [
        {"principal": e.principal, "permissionType": e.permission, "operation": e.operation,
         "host": e.host} for e in sorted(entries, key=lambda e: (e.principal, e.host,
                                                                  e.operation, e.permission))]})


def decode_acls(path: str, data: bytes | None) -> frozenset[AclEntry]:
    obj = _load(path, data)
    out = set()
    for item in _req(path, obj, "acls", list):
        if not isinstance(item, dict):
            raise ZkDataError(f"{path}: an ACL entry must be an object, got {item!r}")
        try:
            out.add(AclEntry(_req(path, item, "principal", str), _req(path, item, "host", str),
                             _req(path, item, "operation", str),
                             _req(path, item, "permissionType", str)))
        except ValueError as exc:
            raise ZkDataError(f"{path}: {exc}") from None
    return frozenset(out)


def encode_acl_change(resource_type: str, name: str, pattern_type: str) -> bytes:
    _acl_kind(resource_type, pattern_type)
    if pattern_type == "LITERAL":
        return f"{resource_type}:{name}".encode("utf-8")
    return _dump({"version": 1, "resourceType": resource_type, "name": name,
                  "patternType": pattern_type})


def decode_acl_change(pattern_type: str, data: bytes | None) -> tuple[str, str, str]:
    """(resource type, name, pattern type) of a change notification."""
    path = acl_change_path(pattern_type)
    if pattern_type == "LITERAL":
        kind, sep, name = (data or b"").decode("utf-8", "replace").partition(":")
        if not sep or kind not in ACL_RESOURCE_TYPES:
            raise ZkDataError(f"{path}: bad ACL change {data!r}")
        return kind, name, "LITERAL"
    obj = _load(path, data)
    kind, name = _req(path, obj, "resourceType", str), _req(path, obj, "name", str)
    pattern = _req(path, obj, "patternType", str)
    if kind not in ACL_RESOURCE_TYPES or pattern not in ACL_PATTERN_TYPES:
        raise ZkDataError(f"{path}: bad ACL change {obj}")
    return kind, name, pattern
# /latest_producer_id_block (the idempotent producer's ids, Kafka's ProducerIdBlockZNode)

PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"


@dataclass(frozen=True)
class ProducerIdBlock:
    """Body of /latest_producer_id_block: the last block of producer ids reserved, by which
    broker. ``block_start <= block_end``; the next block starts at ``block_end + 1``.
    Kafka writes the two bounds as JSON strings (``"block_start":"0"``); numbers are read
    too."""
    broker: int
    block_start: int
    block_end: int

    def to_bytes(self) -> bytes:
        return _dump({"version": 1, "broker": self.broker,
                      "block_start": str(self.block_start), "block_end": str(self.block_end)})

    @classmethod
    def from_bytes(cls, data: bytes | None) -> "ProducerIdBlock":
        path = PRODUCER_ID_BLOCK_PATH
        obj = _load(path, data)
        bounds = []
        for key in ("block_start", "block_end"):
            value = _req(path, obj, key, (str, int))
            try:
                bounds.append(int(value))
            except ValueError:
                raise ZkDataError(f"{path}: {key} {value!r} is not an integer") from None
        if bounds[0] < 0 or bounds[1] < bounds[0]:
            raise ZkDataError(f"{path}: block [{bounds[0]}, {bounds[1]}] is not a block")
        return cls(broker=_req(path, obj, "broker", int), block_start=bounds[0],
                   block_end=bounds[1])
