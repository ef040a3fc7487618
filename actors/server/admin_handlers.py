"""The admin APIs of the Kafka listener: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeCluster, one
handler per API, served through the same paths as raykafka's own ``Admin``: the broker's
``AdminManager`` (admin_manager.py) validates a request and writes ZooKeeper, the active
controller acts on what is written. A topic created by a Kafka admin client is the same
znodes, placement and configs as one made by ``raykafka topics create``.

``AdminApis(backend, admin, broker_id=..., broker_config=...).handlers()`` gives
``{api_key: handler}`` for KafkaApis (handlers.py) to dispatch. ``backend`` is the
handlers' Backend (the broker's metadata cache; ``delete_records`` for DeleteRecords),
``admin`` an AdminManager.

Threads: every handler answers with a Future. The work (ZooKeeper reads and writes, a call
to a leader replica) runs on this module's own small pool (``ADMIN_THREADS``), never on
the network thread nor on the io threads that serve Produce and Fetch. CreateTopics,
CreatePartitions and DeleteTopics then wait, as Kafka's controller does, until the
broker's metadata shows the change (every partition with a leader; the topic gone) or the
request's ``timeout_ms`` runs out (those topics answer REQUEST_TIMED_OUT, the change still
goes ahead): the wait is parked in a purgatory that ``metadata_changed`` (called on each
UpdateMetadata) wakes, holding no thread.

Any broker takes these requests: Kafka clients send CreateTopics, DeleteTopics and
CreatePartitions to the Metadata's ``controller_id`` (kafka-python, librdkafka), but any
raykafka broker writes ZooKeeper the same way, so none answers NOT_CONTROLLER.

Not implemented: dynamic broker configs (AlterConfigs and IncrementalAlterConfigs of a
BROKER resource answer INVALID_REQUEST: broker settings are given at start), the
BROKER_LOGGER resource, topic ids (DeleteTopics v6 by id answers UNKNOWN_TOPIC_ID; ids
answered are zero), DeleteRecords waiting for the followers' log start offsets (the low
watermark answered is the leader's, which followers take on their next fetch).
Thread-safe: no state besides the pool and the purgatory.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Callable

from storage import LogConfig

from .. import wire
from ..errors import (ClusterAuthorizationFailedError, InvalidConfigurationError, KafkaError,
                      OffsetOutOfRangeError, TopicAlreadyExistsError,
                      TopicAuthorizationFailedError)
from ..protocol import OFFSETS_TOPIC, validate_topic_name
from .authorizer import CLUSTER, Access, principal_of
from .handlers import DelayedOperation, Purgatory
from .network import Request

log = logging.getLogger(__name__)

_ERR = wire.ERRORS_BY_NAME
#: Threads that run admin requests' ZooKeeper and replica calls (admin requests are rare;
#: two keep one slow request from holding up the next).
ADMIN_THREADS = 2
#: The purgatory key every metadata update wakes.
_METADATA = "metadata"

# DescribeConfigs' resource types, config sources and config types (Kafka's ids)
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST, PASSWORD = 1, 2, 3, 5, 6, 7, 9

#: Broker settings that are secrets (Kafka's PASSWORD-type configs, and ZooKeeper's digest
#: credential), by their last dotted words, so that a listener-scoped form
#: (``listener.name.<l>.<mechanism>.sasl.jaas.config``) is one too. DescribeConfigs answers
#: them as Kafka does: value null, ``is_sensitive`` true.
_SENSITIVE_SUFFIXES = ("password", "sasl.jaas.config", "auth.digest", "ssl.keystore.key",
                       "ssl.keystore.certificate.chain", "ssl.truststore.certificates")


def is_sensitive(name: str) -> bool:
    """Whether broker setting ``name`` is a secret DescribeConfigs never shows."""
    return name.endswith(_SENSITIVE_SUFFIXES)

#: Kafka's value for "never" of flush.messages and flush.ms (LogConfig's None).
_LONG_MAX = str((1 << 63) - 1)

#: The topic configs raykafka applies: name -> (type, broker setting that gives the
#: default, documentation). The defaults are LogConfig's (and Kafka's).
TOPIC_CONFIGS: dict[str, tuple[int, str | None, str]] = {
    "cleanup.policy": (LIST, "log.cleanup.policy",
                       "delete, compact or both: what happens to old segments."),
    "delete.retention.ms": (LONG, None, "How long tombstones survive compaction."),
    "file.delete.delay.ms": (LONG, None, "How long a deleted segment's files stay."),
    "flush.messages": (LONG, "log.flush.interval.messages",
                       "fsync after this many messages."),
    "flush.ms": (LONG, "log.flush.interval.ms",
                 "fsync when the oldest unflushed write is this old."),
    "index.interval.bytes": (INT, None, "Bytes between offset index entries."),
    "max.message.bytes": (INT, "message.max.bytes", "The largest record batch accepted."),
    "message.timestamp.type": (STRING, None, "CreateTime or LogAppendTime."),
    "min.cleanable.dirty.ratio": (DOUBLE, None,
                                  "The dirty share of a log that makes it compacted."),
    "min.compaction.lag.ms": (LONG, None, "How long a record stays uncompacted."),
    "min.insync.replicas": (INT, "min.insync.replicas",
                            "In-sync replicas an acks=all produce needs."),
    "retention.bytes": (LONG, "log.retention.bytes", "Size a log is cut to (-1: none)."),
    "retention.ms": (LONG, "log.retention.ms", "How long records are kept (-1: forever)."),
    "segment.bytes": (INT, "log.segment.bytes", "The size of a log segment file."),
    "segment.ms": (LONG, "log.roll.ms", "How long before a segment is rolled."),
    "unclean.leader.election.enable": (BOOLEAN, "unclean.leader.election.enable",
                                       "May a replica out of the ISR become leader?"),
}
_DEFAULTS = {**{k: v for k, v in LogConfig().to_properties().items() if k in TOPIC_CONFIGS},
             "flush.messages": _LONG_MAX, "flush.ms": _LONG_MAX,
             "min.insync.replicas": "1", "unclean.leader.election.enable": "false"}
#: Broker settings described with their defaults when not given at start (read-only).
#: Every name a topic config may have (TOPIC_CONFIGS and LogConfig's other spellings).
KNOWN_TOPIC_CONFIGS = frozenset(TOPIC_CONFIGS) | frozenset(LogConfig().to_properties())
BROKER_DEFAULTS = {"auto.create.topics.enable": "true",
                   "num.partitions": "1", "default.replication.factor": "1",
                   "min.insync.replicas": "1", "unclean.leader.election.enable": "false",
                   "offsets.topic.num.partitions": "50", "offsets.topic.replication.factor": "3"}


def _code(exc: BaseException) -> int:
    if not isinstance(exc, KafkaError):
        log.error("unexpected error answering an admin request", exc_info=exc)
    return wire.error_code(exc)


def _coded(name: str, message: str = "") -> wire.BrokerResponseError:
    return wire.BrokerResponseError(_ERR[name].code, message)


def _invalid(message: str) -> wire.BrokerResponseError:
    """INVALID_REQUEST for one entry of a request (the connection stays open)."""
    return _coded("INVALID_REQUEST", message)


def _error(exc: BaseException | None) -> dict:
    """``error_code`` and ``error_message`` of an answer entry."""
    if exc is None:
        return {"error_code": wire.NONE, "error_message": None}
    return {"error_code": _code(exc), "error_message": str(exc) or None}


class _DelayedAdmin(DelayedOperation):
    """An admin answer waiting until the metadata shows each entry's change (its
    ``ready()``) or the deadline: then entries not ready answer REQUEST_TIMED_OUT (Kafka's
    DelayedCreatePartitions / DelayedDeleteTopics)."""

    def __init__(self, deadline_s: float, waits: list[tuple[dict, Callable[[], bool]]],
                 answer: Callable[[], list], future: concurrent.futures.Future):
        super().__init__(deadline_s)
        self.waits = waits
        self.answer = answer
        self.future = future

    def ready(self) -> bool:
        return all(ready() for _, ready in self.waits)

    def complete(self, expired: bool) -> None:
        try:
            for entry, ready in self.waits:
                if not ready():
                    entry.update(_error(_coded(
                        "REQUEST_TIMED_OUT", "the change is not in the metadata yet; it "
                        "is still carried out")))
            self.future.set_result(self.answer())
        except BaseException as exc:  # noqa: BLE001 - the listener logs and closes
            self.future.set_exception(exc)


class _Wait:
    """What a handler's work returns to have its answer wait (see ``_DelayedAdmin``)."""

    def __init__(self, body: dict, waits: list, timeout_ms: int):
        self.body, self.waits, self.timeout_ms = body, waits, timeout_ms


class AdminApis:
    """The admin handlers (see the module docstring)."""

    def __init__(self, backend, admin, *, broker_id: int, broker_config: dict,
                 clock: Callable[[], float] = time.monotonic, access: Access | None = None):
        self.backend = backend
        self.access = access or Access()     # Kafka's ACLs (authorizer.py)
        self.admin = admin
        self.broker_id = broker_id
        self.broker_config = dict(broker_config or {})
        self._clock = clock
        self._pool = concurrent.futures.ThreadPoolExecutor(
            ADMIN_THREADS, thread_name_prefix=f"broker-{broker_id}-admin")
        self.purgatory = Purgatory("admin-purgatory", clock=clock)

    def handlers(self) -> dict[int, Callable[[Request], Any]]:
        return {
            wire.CREATE_TOPICS: self.create_topics,
            wire.DELETE_TOPICS: self.delete_topics,
            wire.CREATE_PARTITIONS: self.create_partitions,
            wire.DESCRIBE_CONFIGS: self.describe_configs,
            wire.ALTER_CONFIGS: self.alter_configs,
            wire.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            wire.DELETE_RECORDS: self.delete_records,
            wire.DESCRIBE_CLUSTER: self.describe_cluster,
        }

    # -- topics created by a Metadata request (auto.create.topics.enable) ------------------
    def auto_create_enabled(self) -> bool:
        return str(self.broker_config.get("auto.create.topics.enable",
                                          BROKER_DEFAULTS["auto.create.topics.enable"])
                   ).lower() == "true"

    def auto_create_topic(self, name: str, request=None) -> int:
        """Kafka's auto.create.topics.enable: a Metadata request that names a topic no one
        created creates it with ``num.partitions`` and ``default.replication.factor``
        (blocking: ZooKeeper writes; never on the network thread). Answers the error code
        for the topic's entry in the Metadata response: LEADER_NOT_AVAILABLE once it is
        being created (by this request or another: the client asks again until its
        leaders are elected), TOPIC_AUTHORIZATION_FAILED for a principal that may not
        create it, else the creation's own error (e.g. INVALID_REPLICATION_FACTOR when
        fewer brokers live than the default asks)."""
        partitions = int(self.broker_config.get("num.partitions", 1))
        rf = int(self.broker_config.get("default.replication.factor", 1))
        try:
            if not self.access.allowed(request, "Create", "Cluster", CLUSTER):
                self._check(request, "Create", "Topic", name)
            self.admin.create_topic(name, partitions, rf, {})
        except TopicAlreadyExistsError:
            pass                        # made meanwhile (another client, another broker)
        except Exception as exc:  # noqa: BLE001 - answered as its code
            return _code(exc)
        else:
            log.info("broker %d: auto-created topic %r (%d partitions, replication factor "
                     "%d) for %s", self.broker_id, name, partitions, rf,
                     principal_of(request)[0] if request is not None else "a client")
        return _ERR["LEADER_NOT_AVAILABLE"].code

    def _check(self, request, operation: str, resource_type: str, name: str) -> None:
        """Raise Kafka's authorization error unless the request's principal may."""
        if self.access.allowed(request, operation, resource_type, name):
            return
        error = {"Topic": TopicAuthorizationFailedError,
                 "Cluster": ClusterAuthorizationFailedError}[resource_type]
        raise error(f"{principal_of(request)[0]} may not {operation} "
                    f"{resource_type.lower()} {name}")

    def metadata_changed(self) -> None:
        """The broker's metadata cache was replaced: answer the admin requests it settles."""
        self.purgatory.notify(_METADATA)

    def close(self) -> None:
        self.purgatory.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- plumbing ------------------------------------------------------------------------------
    def _run(self, request: Request, work: Callable[[dict, int, Request], Any]
             ) -> concurrent.futures.Future:
        """The response frame of ``work(body, version)`` (a response body, or a ``_Wait``),
        run on the admin pool."""
        header = request.header
        out: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                body = wire.decode_request_body(header, request.body, 0)
                result = work(body, header.api_version, request)
                if isinstance(result, _Wait) and result.waits and result.timeout_ms > 0:
                    op = _DelayedAdmin(
                        self._clock() + result.timeout_ms / 1000.0, result.waits,
                        lambda: wire.encode_response_parts(header, result.body), out)
                    self.purgatory.park(op, [_METADATA])
                    return
                if isinstance(result, _Wait):
                    result = result.body
                out.set_result(wire.encode_response_parts(header, result))
            except BaseException as exc:  # noqa: BLE001 - the listener logs and closes
                out.set_exception(exc)

        try:
            self._pool.submit(run)
        except RuntimeError as exc:            # shut down: the broker is stopping
            out.set_exception(exc)
        return out

    def _leaders_in_metadata(self, topic: str, count: int | None = None
                             ) -> Callable[[], bool]:
        """A check: does the metadata show ``topic`` with (at least ``count``) partitions,
        each with a leader?"""
        def ready() -> bool:
            parts = self.backend.partitions(topic)
            return parts is not None and bool(parts) and (count is None or len(parts) >= count) \
                and all(p.leader >= 0 for p in parts)
        return ready

    def _gone_from_metadata(self, topic: str) -> Callable[[], bool]:
        return lambda: self.backend.partitions(topic) is None

    # -- CreateTopics --------------------------------------------------------------------------
    def create_topics(self, request: Request):
        return self._run(request, self._create_topics)

    def _create_topics(self, body: dict, version: int, request=None):
        names = [t["name"] for t in body["topics"]]
        duplicated = {n for n in names if names.count(n) > 1}
        validate_only = body["validate_only"]
        results, waits = [], []
        for t in body["topics"]:
            name = t["name"]
            entry = {"name": name, "num_partitions": -1, "replication_factor": -1,
                     "configs": []}
            try:
                if name in duplicated:
                    raise _invalid(f"topic {name!r} is listed more than once")
                if not self.access.allowed(request, "Create", "Cluster", CLUSTER):
                    self._check(request, "Create", "Topic", name)
                created = self._create_topic(t, validate_only)
            except Exception as exc:  # noqa: BLE001 - answered as its code
                entry.update(_error(exc))
            else:
                entry.update(_error(None))
                entry.update(num_partitions=len(created),
                             replication_factor=len(next(iter(created.values()))),
                             configs=[{"name": c["name"], "value": c["value"],
                                       "read_only": c["read_only"],
                                       "config_source": c["config_source"],
                                       "is_sensitive": False}
                                      for c in self._topic_entries(created_config(t), None,
                                                                   False, False)])
                if not validate_only:
                    waits.append((entry, self._leaders_in_metadata(name)))
            results.append(entry)
        return _Wait({"throttle_time_ms": 0, "topics": results}, waits, body["timeout_ms"])

    def _create_topic(self, t: dict, validate_only: bool) -> dict:
        partitions, rf = t["num_partitions"], t["replication_factor"]
        assignment = None
        if t["assignments"]:
            if partitions != -1 or rf != -1:
                raise _invalid(
                    "num_partitions and replication_factor must be -1 with a replica "
                    "assignment")
            assignment = {a["partition_index"]: list(a["broker_ids"])
                          for a in t["assignments"]}
        else:
            if partitions == -1:
                partitions = int(self.broker_config.get("num.partitions", 1))
            if rf == -1:
                rf = int(self.broker_config.get("default.replication.factor", 1))
        config = created_config(t)
        return self.admin.create_topic(t["name"], partitions, rf, config,
                                       assignment=assignment, validate_only=validate_only)

    # -- DeleteTopics --------------------------------------------------------------------------
    def delete_topics(self, request: Request):
        return self._run(request, self._delete_topics)

    def _delete_topics(self, body: dict, version: int, request=None):
        if version >= 6:
            asked = [(t["name"], t["topic_id"]) for t in body["topics"]]
        else:
            asked = [(n, None) for n in body["topic_names"]]
        responses, waits = [], []
        for name, topic_id in asked:
            entry = {"name": name, "topic_id": topic_id or bytes(16)}
            try:
                if name is None:
                    raise _coded("UNKNOWN_TOPIC_ID", "topics are deleted by name here")
                self._check(request, "Delete", "Topic", name)
                self.admin.delete_topic(name)
            except Exception as exc:  # noqa: BLE001 - answered as its code
                entry.update(_error(exc))
            else:
                entry.update(_error(None))
                waits.append((entry, self._gone_from_metadata(name)))
            responses.append(entry)
        return _Wait({"throttle_time_ms": 0, "responses": responses}, waits,
                     body["timeout_ms"])

    # -- CreatePartitions ----------------------------------------------------------------------
    def create_partitions(self, request: Request):
        return self._run(request, self._create_partitions)

    def _create_partitions(self, body: dict, version: int, request=None):
        names = [t["name"] for t in body["topics"]]
        results, waits = [], []
        for t in body["topics"]:
            entry = {"name": t["name"]}
            try:
                if names.count(t["name"]) > 1:
                    raise _invalid(f"topic {t['name']!r} is listed more than once")
                self._check(request, "Alter", "Topic", t["name"])
                if t["name"] == OFFSETS_TOPIC:
                    raise _invalid(f"{OFFSETS_TOPIC}'s partition count is fixed: it "
                                   f"decides which partition holds each group")
                assignment = None if t["assignments"] is None else [
                    list(a["broker_ids"]) for a in t["assignments"]]
                self.admin.create_partitions(t["name"], t["count"], assignment,
                                             validate_only=body["validate_only"])
            except Exception as exc:  # noqa: BLE001 - answered as its code
                entry.update(_error(exc))
            else:
                entry.update(_error(None))
                if not body["validate_only"]:
                    waits.append((entry, self._leaders_in_metadata(t["name"], t["count"])))
            results.append(entry)
        return _Wait({"throttle_time_ms": 0, "results": results}, waits, body["timeout_ms"])

    # -- DescribeConfigs -----------------------------------------------------------------------
    def describe_configs(self, request: Request):
        return self._run(request, self._describe_configs)

    def _describe_configs(self, body: dict, version: int, request=None):
        synonyms, docs = body["include_synonyms"], body["include_documentation"]
        results = []
        for r in body["resources"]:
            rtype, name, keys = r["resource_type"], r["resource_name"], r["configuration_keys"]
            entry = {"resource_type": rtype, "resource_name": name, "configs": []}
            try:
                if rtype == TOPIC:
                    validate_topic_name(name)
                    self._check(request, "DescribeConfigs", "Topic", name)
                    configs = self._topic_entries(self.admin.topic_config(name), keys,
                                                  synonyms, docs)
                elif rtype == BROKER:
                    self._check_broker(name)
                    self._check(request, "DescribeConfigs", "Cluster", CLUSTER)
                    configs = self._broker_entries(keys, synonyms, docs)
                else:
                    raise _invalid(f"resource type {rtype} is not supported "
                                              f"(topics: 2, brokers: 4)")
            except Exception as exc:  # noqa: BLE001 - answered as its code
                entry.update(_error(exc))
            else:
                entry.update(_error(None), configs=configs)
            results.append(entry)
        return {"throttle_time_ms": 0, "results": results}

    def _check_broker(self, name: str) -> None:
        if name not in ("", str(self.broker_id)):
            raise _invalid(f"broker {self.broker_id} describes its own configs "
                                      f"only, not those of broker {name!r}")

    def _topic_entries(self, overrides: dict, keys, synonyms: bool, docs: bool) -> list:
        """DescribeConfigs' entries of a topic with ``overrides``: each applied config, its
        value from the topic (DYNAMIC_TOPIC_CONFIG), else the broker's setting
        (STATIC_BROKER_CONFIG), else the default (DEFAULT_CONFIG)."""
        out = []
        for name, (ctype, broker_name, doc) in sorted(TOPIC_CONFIGS.items()):
            if keys is not None and name not in keys:
                continue
            chain = []                       # (source, name, value), the one used first
            if name in overrides:
                chain.append((DYNAMIC_TOPIC_CONFIG, name, str(overrides[name])))
            if broker_name is not None and broker_name in self.broker_config:
                chain.append((STATIC_BROKER_CONFIG, broker_name,
                              str(self.broker_config[broker_name])))
            chain.append((DEFAULT_CONFIG, name, _DEFAULTS[name]))
            source, _, value = chain[0]
            out.append({"name": name, "value": value, "read_only": False,
                        "config_source": source, "is_default": source == DEFAULT_CONFIG,
                        "is_sensitive": False,
                        "synonyms": [{"name": n, "value": v, "source": s}
                                     for s, n, v in chain] if synonyms else [],
                        "config_type": ctype, "documentation": doc if docs else None})
        for name in sorted(set(overrides) - set(TOPIC_CONFIGS)):     # another spelling
            if keys is None or name in keys:
                value = str(overrides[name])
                out.append({"name": name, "value": value, "read_only": False,
                            "config_source": DYNAMIC_TOPIC_CONFIG, "is_default": False,
                            "is_sensitive": False,
                            "synonyms": [{"name": name, "value": value,
                                          "source": DYNAMIC_TOPIC_CONFIG}] if synonyms else [],
                            "config_type": STRING, "documentation": None})
        return out

    def _broker_entries(self, keys, synonyms: bool, docs: bool) -> list:
        """This broker's settings as given at start (STATIC_BROKER_CONFIG), and the
        defaults of the ones it applies when not given: all read-only."""
        given = {k: str(v) for k, v in self.broker_config.items()}
        values = {"broker.id": (STATIC_BROKER_CONFIG, str(self.broker_id))}
        values.update({k: (DEFAULT_CONFIG, v) for k, v in BROKER_DEFAULTS.items()})
        for topic_name, (_, broker_name, _) in TOPIC_CONFIGS.items():
            if broker_name is not None:
                values.setdefault(broker_name, (DEFAULT_CONFIG, _DEFAULTS[topic_name]))
        values.update({k: (STATIC_BROKER_CONFIG, v) for k, v in given.items()})
        out = []
        for name, (source, value) in sorted(values.items()):
            if keys is not None and name not in keys:
                continue
            secret = is_sensitive(name)
            if secret:
                value = None
            out.append({"name": name, "value": value, "read_only": True,
                        "config_source": source, "is_default": source == DEFAULT_CONFIG,
                        "is_sensitive": secret,
                        "synonyms": [{"name": name, "value": value, "source": source}]
                        if synonyms else [],
                        "config_type": PASSWORD if secret else STRING,
                        "documentation": "A broker setting, given at start." if docs
                        else None})
        return out

    # -- AlterConfigs and IncrementalAlterConfigs ----------------------------------------------
    def alter_configs(self, request: Request):
        return self._run(request, self._alter_configs)

    def _alter_configs(self, body: dict, version: int, request=None):
        def alter(r):
            config = {}
            for c in r["configs"]:
                if c["value"] is None:
                    raise InvalidConfigurationError(f"config {c['name']!r} has a null value")
                config[c["name"]] = c["value"]
            self.admin.alter_topic_config(r["resource_name"], config, replace=True,
                                          validate_only=body["validate_only"])
        return self._alter(body, alter, request)

    def incremental_alter_configs(self, request: Request):
        return self._run(request, self._incremental_alter_configs)

    def _incremental_alter_configs(self, body: dict, version: int, request=None):
        def alter(r):
            ops = [(c["name"], c["config_operation"], c["value"]) for c in r["configs"]]
            for name, _, _ in ops:          # a DELETE of an unknown name too
                if name not in KNOWN_TOPIC_CONFIGS:
                    raise InvalidConfigurationError(f"unknown topic config {name!r}")
            self.admin.incremental_alter_topic_config(r["resource_name"], ops,
                                                      validate_only=body["validate_only"])
        return self._alter(body, alter, request)

    def _alter(self, body: dict, alter: Callable[[dict], None], request) -> dict:
        responses = []
        for r in body["resources"]:
            entry = {"resource_type": r["resource_type"], "resource_name": r["resource_name"]}
            try:
                if r["resource_type"] == TOPIC:
                    self._check(request, "AlterConfigs", "Topic", r["resource_name"])
                    alter(r)
                elif r["resource_type"] == BROKER:
                    raise _invalid("broker configs are static here: they are "
                                              "given when the broker starts")
                else:
                    raise _invalid(f"resource type {r['resource_type']} is not "
                                              f"supported (topics: 2)")
            except Exception as exc:  # noqa: BLE001 - answered as its code
                entry.update(_error(exc))
            else:
                entry.update(_error(None))
            responses.append(entry)
        return {"throttle_time_ms": 0, "responses": responses}

    # -- DeleteRecords -------------------------------------------------------------------------
    def delete_records(self, request: Request):
        return self._run(request, self._delete_records)

    def _delete_records(self, body: dict, version: int, request=None):
        topics = []
        for t in body["topics"]:
            partitions = []
            for p in t["partitions"]:
                index = p["partition_index"]
                try:
                    self._check(request, "Delete", "Topic", t["name"])
                    if p["offset"] < -1:
                        raise OffsetOutOfRangeError(f"cannot delete records before offset "
                                                    f"{p['offset']}")
                    low = self.backend.delete_records(t["name"], index, p["offset"])
                    partitions.append({"partition_index": index, "low_watermark": low,
                                       "error_code": wire.NONE})
                except Exception as exc:  # noqa: BLE001 - answered as its code
                    partitions.append({"partition_index": index, "low_watermark": -1,
                                       "error_code": _code(exc)})
            topics.append({"name": t["name"], "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    # -- DescribeCluster -----------------------------------------------------------------------
    def describe_cluster(self, request: Request):
        return self._run(request, self._describe_cluster)

    def _describe_cluster(self, body: dict, version: int, request=None):
        if body["endpoint_type"] != 1:          # 2: the controllers (KRaft only)
            return {"throttle_time_ms": 0, **_error(_coded(
                "UNSUPPORTED_ENDPOINT_TYPE", "brokers (1) only")),
                "endpoint_type": body["endpoint_type"], "cluster_id": "",
                "controller_id": -1, "brokers": []}
        return {"throttle_time_ms": 0, **_error(None), "endpoint_type": 1,
                "cluster_id": self.backend.cluster_id or "",
                "controller_id": self.backend.controller_id(),
                "brokers": [{"broker_id": b.node_id, "host": b.host, "port": b.port,
                             "rack": b.rack, "is_fenced": False}
                            for b in self.backend.brokers()]}


def created_config(t: dict) -> dict:
    """A CreateTopics topic's configs as a dict; InvalidConfigurationError for a null
    value (Kafka refuses those) or a name given twice."""
    config = {}
    for c in t["configs"]:
        if c["value"] is None:
            raise InvalidConfigurationError(f"config {c['name']!r} has a null value")
        if c["name"] in config:
            raise InvalidConfigurationError(f"config {c['name']!r} is given twice")
        config[c["name"]] = c["value"]
    return config


__all__ = ["AdminApis", "TOPIC_CONFIGS", "BROKER_DEFAULTS", "ADMIN_THREADS"]
