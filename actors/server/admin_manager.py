"""AdminManager: a broker's answers to admin requests (Kafka's ZkAdminManager).

Validates a request (topic name, partition count, replication factor, configs, Kafka's
'.'/'_' collision rule) and writes it to ZooKeeper; the controller acts on what is written
(new topics get leaders, deletions and preferred elections are carried out) and the broker
only wakes it (``wake_controller``) so that happens at once rather than on its next tick.

No Ray: testable with a fake store. A ZooKeeper outage surfaces as the public, retriable
ZooKeeperUnavailableError naming the request.
"""

from __future__ import annotations

import functools
from typing import Callable

from coordination.errors import (NodeAlreadyExistsError, NodeMissingError, VersionConflictError,
                                 PlacementError)
from coordination.errors import ZkUnavailableError
from coordination.placement import assign_replicas_to_brokers
from coordination.store import ZkStore
from storage import LogConfig

from ..errors import (InvalidConfigurationError, InvalidPartitionsError,
                      InvalidReplicaAssignmentError, InvalidReplicationFactorError,
                      InvalidTopicError, ReassignmentInProgressError, TopicAlreadyExistsError,
                      UnknownTopicOrPartitionError, ZooKeeperUnavailableError)
from ..protocol import validate_topic_name

# Topic settings that are not log settings (the replica applies min.insync.replicas itself;
# the controller reads unclean.leader.election.enable).
NON_LOG_TOPIC_CONFIGS = {"min.insync.replicas", "unclean.leader.election.enable"}


def _zk_errors(method):
    """Admin requests answer a ZooKeeper outage with the public ZooKeeperUnavailableError
    (retriable), not coordination's internal error."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(
                f"{method.__name__}: ZooKeeper is unavailable: {exc}") from None
    return wrapper


#: Topic configs whose value is a comma-separated list (Kafka's ConfigDef.Type.LIST): the
#: only ones IncrementalAlterConfigs may APPEND to or SUBTRACT from.
LIST_TOPIC_CONFIGS = {"cleanup.policy"}
#: IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType ids).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _validate_log_config(config: dict) -> None:
    """InvalidConfigurationError for an unknown name or a bad value."""
    known = set(LogConfig().to_properties()) | NON_LOG_TOPIC_CONFIGS
    unknown = sorted(set(config) - known)
    if unknown:     # the whole list, min.insync.replicas included (LogConfig's lacks it)
        raise InvalidConfigurationError(
            f"unknown topic config {unknown[0]!r}; known: {', '.join(sorted(known))}")
    LogConfig.from_properties({k: v for k, v in config.items()
                               if k not in NON_LOG_TOPIC_CONFIGS})
    if "min.insync.replicas" in config:
        value = str(config["min.insync.replicas"]).strip()
        if not value.isdigit() or int(value) < 1:
            raise InvalidConfigurationError(
                f"min.insync.replicas must be an integer >= 1, got {value!r}")
    if "unclean.leader.election.enable" in config:
        value = str(config["unclean.leader.election.enable"]).strip().lower()
        if value not in ("true", "false"):
            raise InvalidConfigurationError(
                f"unclean.leader.election.enable must be true or false, got {value!r}")


def apply_config_ops(config: dict, ops) -> dict:
    """``config`` after IncrementalAlterConfigs' ``ops`` ([(name, op, value)], op SET,
    DELETE, APPEND or SUBTRACT), as Kafka applies them: APPEND adds list items not yet
    there, SUBTRACT removes them, both only for list configs (InvalidConfigurationError
    otherwise, and for an unknown op or a name given twice). Pure; not validated."""
    out = dict(config)
    seen = set()
    for name, op, value in ops:
        if name in seen:
            raise InvalidConfigurationError(f"config {name!r} is given more than once")
        seen.add(name)
        if op == SET:
            out[name] = "" if value is None else str(value)
        elif op == DELETE:
            out.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if name not in LIST_TOPIC_CONFIGS:
                raise InvalidConfigurationError(
                    f"config {name!r} is not a list: it takes no "
                    f"{'APPEND' if op == APPEND else 'SUBTRACT'}")
            items = [v for v in str(out.get(name, "")).replace(" ", "").split(",") if v]
            given = [v for v in str(value or "").replace(" ", "").split(",") if v]
            if op == APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            out[name] = ",".join(items)
        else:
            raise InvalidConfigurationError(f"unknown config operation {op!r} for {name!r}")
    return out


class AdminManager:
    """Admin requests of one broker, written to ZooKeeper. Thread-safe (ZooKeeper orders
    concurrent writers; creation is one multi-op)."""

    def __init__(self, store: ZkStore, wake_controller: Callable[[], None] = lambda: None,
                 live_brokers: Callable[[], set[int] | None] = lambda: None):
        self.store = store
        self.wake_controller = wake_controller
        # the controller's view of live brokers (the broker's metadata cache), None before it
        # has one: a broker killed outright stays registered until its session expires, but
        # is dead to the controller at once, and nothing new is placed on it (Kafka places
        # on the metadata cache's alive brokers)
        self.live_brokers = live_brokers

    def _alive(self, registered):
        """The registered brokers the controller also counts as live."""
        live = self.live_brokers()
        if not live:
            return registered
        if isinstance(registered, dict):
            return {b: v for b, v in registered.items() if b in live}
        return [b for b in registered if b in live]

    @_zk_errors
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict | None, *, assignment: dict | None = None,
                     validate_only: bool = False) -> dict:
        """Place the replicas (seed 003's placement over the live brokers, or the given
        ``assignment`` {partition: [broker ids]}, then ``partitions`` and
        ``replication_factor`` are ignored) and write the topic; returns partition ->
        replicas. ``validate_only``: every check, nothing written."""
        validate_topic_name(name)
        if assignment is None:
            if not isinstance(partitions, int) or isinstance(partitions, bool) \
                    or partitions < 1:
                raise InvalidPartitionsError(
                    f"partitions must be an integer >= 1, got {partitions!r}")
            if not isinstance(replication_factor, int) or isinstance(replication_factor, bool) \
                    or replication_factor < 1:
                raise InvalidReplicationFactorError(
                    f"replication factor must be an integer >= 1, got {replication_factor!r}")
        config = {str(k): str(v) for k, v in (config or {}).items()}
        _validate_log_config(config)
        existing = self.store.topics()
        if name in existing:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        collide = name.replace(".", "_")
        for other in existing:
            if other.replace(".", "_") == collide:
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {other!r} ('.' and '_' "
                    f"map to the same metric names in Kafka)")
        brokers = self._alive(self.store.get_brokers())
        if assignment is not None:
            assignment = _checked_assignment(assignment, set(brokers), first=0)
        else:
            if replication_factor > len(brokers):
                raise InvalidReplicationFactorError(
                    f"replication factor {replication_factor} is larger than the "
                    f"{len(brokers)} live brokers")
            try:
                assignment = assign_replicas_to_brokers(
                    {b: info.rack for b, info in brokers.items()}, partitions=partitions,
                    replication_factor=replication_factor)
            except PlacementError as exc:
                raise InvalidReplicationFactorError(str(exc)) from None
        if validate_only:
            return {p: list(r) for p, r in assignment.items()}
        try:
            self.store.create_topic(name, assignment, config)
        except NodeAlreadyExistsError:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists") from None
        self.wake_controller()
        return {p: list(r) for p, r in assignment.items()}

    @_zk_errors
    def create_partitions(self, name: str, count: int, assignment: list | None = None, *,
                          validate_only: bool = False) -> dict:
        """Grow topic ``name`` to ``count`` partitions (Kafka's CreatePartitions): the new
        ones placed over the live brokers with the topic's replication factor, or on
        ``assignment`` (one broker list per new partition); the controller gives them
        leaders. InvalidPartitionsError unless ``count`` exceeds the current count;
        returns the new partitions' replicas. A conditional write: a concurrent change of
        the topic's assignment (a reassignment) makes it fail with
        ReassignmentInProgressError rather than overwrite it."""
        validate_topic_name(name)
        try:
            current, version, _ = self.store.get_topic(name)
        except NodeMissingError:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None
        if name in self.store.pending_topic_deletions():
            raise InvalidTopicError(f"topic {name!r} is being deleted")
        if not isinstance(count, int) or isinstance(count, bool) or count <= len(current):
            raise InvalidPartitionsError(
                f"topic {name!r} has {len(current)} partitions; the new count must be "
                f"larger, got {count!r}")
        if self.store.get_reassignment():
            raise ReassignmentInProgressError(
                f"a partition reassignment is in progress; {name!r} is not grown meanwhile")
        brokers = self._alive(self.store.get_brokers())
        if assignment is not None:
            if len(assignment) != count - len(current):
                raise InvalidReplicaAssignmentError(
                    f"{count - len(current)} new partitions but {len(assignment)} replica "
                    f"lists in the assignment")
            added = _checked_assignment(
                {len(current) + i: r for i, r in enumerate(assignment)}, set(brokers),
                first=len(current))
        else:
            rf = len(next(iter(current.values())))
            try:
                added = assign_replicas_to_brokers(
                    {b: info.rack for b, info in brokers.items()},
                    partitions=count - len(current), replication_factor=rf,
                    start_partition_id=len(current))
            except PlacementError as exc:
                raise InvalidReplicationFactorError(str(exc)) from None
        if validate_only:
            return {p: list(r) for p, r in added.items()}
        try:
            self.store.set_topic_assignment(name, {**current, **added},
                                            expected_version=version)
        except (NodeMissingError, VersionConflictError):
            raise ReassignmentInProgressError(
                f"the assignment of {name!r} changed meanwhile; ask again") from None
        self.wake_controller()
        return {p: list(r) for p, r in added.items()}

    @_zk_errors
    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        try:
            self.store.request_topic_deletion(name)
        except NodeMissingError:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None
        self.wake_controller()

    @_zk_errors
    def list_topics(self) -> list[str]:
        return self.store.topics()

    @_zk_errors
    def topic_exists(self, name: str) -> bool:
        return name in self.store.topics()

    @_zk_errors
    def topic_config(self, name: str) -> dict:
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return self.store.get_topic_config(name)

    @_zk_errors
    def alter_topic_config(self, name: str, config: dict, *, replace: bool = False,
                           validate_only: bool = False) -> dict:
        """Merge ``config`` into the topic's overrides (``replace``: make it the whole set
        of overrides, as Kafka's legacy AlterConfigs does); returns the overrides."""
        validate_topic_name(name)
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        given = {str(k): str(v) for k, v in (config or {}).items()}
        merged = given if replace else {**self.store.get_topic_config(name), **given}
        return self._set_topic_config(name, merged, validate_only)

    @_zk_errors
    def incremental_alter_topic_config(self, name: str, ops, *,
                                       validate_only: bool = False) -> dict:
        """Apply IncrementalAlterConfigs' ``ops`` ([(name, op, value)]: ``apply_config_ops``)
        to the topic's overrides; returns the overrides."""
        validate_topic_name(name)
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        merged = apply_config_ops(self.store.get_topic_config(name), ops)
        return self._set_topic_config(name, merged, validate_only)

    def _set_topic_config(self, name: str, config: dict, validate_only: bool) -> dict:
        _validate_log_config(config)
        if not validate_only:
            self.store.set_topic_config(name, config)
            self.wake_controller()
        return config

    @_zk_errors
    def elect_preferred_leaders(self, partitions: list) -> None:
        try:
            self.store.request_preferred_replica_election([tuple(p) for p in partitions])
        except NodeAlreadyExistsError:
            pass  # one is in progress; the caller waits and asks again if needed
        self.wake_controller()

    @_zk_errors
    def reassign_partitions(self, plan) -> dict:
        """Validate a reassignment and write /admin/reassign_partitions (the controller
        carries it out). ``plan`` is Kafka's JSON shape ``{"partitions": [{"topic",
        "partition", "replicas"}, ...]}`` (``"version"`` optional), or a list of
        ``(topic, partition, replicas)``, or a mapping ``{(topic, partition): replicas}``.

        UnknownTopicOrPartitionError for a partition that does not exist;
        InvalidReplicaAssignmentError for an empty plan, a partition listed twice, an empty
        or duplicated replica list, or a broker that is not registered;
        ReassignmentInProgressError while another reassignment runs (one at a time, as in
        Kafka's ZooKeeper mode). Returns the plan as written (Kafka's JSON shape)."""
        entries = _plan_entries(plan)
        if not entries:
            raise InvalidReplicaAssignmentError("the reassignment plan lists no partition")
        brokers = set(self._alive(self.store.broker_ids()))
        assignments: dict[str, dict] = {}
        out: dict[tuple[str, int], tuple[int, ...]] = {}
        for topic, partition, replicas in entries:
            validate_topic_name(topic)
            if (topic, partition) in out:
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition} is listed twice in the reassignment plan")
            if topic not in assignments:
                try:
                    assignments[topic] = self.store.get_topic_assignment(topic)[0]
                except NodeMissingError:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic!r} does not exist") from None
            if partition not in assignments[topic]:
                raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
            if len(replicas) < 1:
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition}: the replica list is empty")
            if len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition}: duplicate brokers in {list(replicas)}")
            unknown = sorted(set(replicas) - brokers)
            if unknown:
                raise InvalidReplicaAssignmentError(
                    f"{topic}-{partition}: brokers {unknown} are not registered (live "
                    f"brokers: {sorted(brokers)})")
            out[(topic, partition)] = tuple(replicas)
        try:
            self.store.request_reassignment(out)
        except NodeAlreadyExistsError:
            raise ReassignmentInProgressError(
                "a partition reassignment is already in progress; wait for it to finish"
            ) from None
        self.wake_controller()
        return _plan_json(out)

    @_zk_errors
    def reassignment_in_progress(self) -> dict:
        """The pending plan in Kafka's JSON shape (``"partitions"`` empty when none)."""
        return _plan_json(self.store.get_reassignment() or {})


def _checked_assignment(assignment: dict, brokers: set[int], *, first: int) -> dict:
    """A replica assignment given by a client ({partition: [broker ids]}, partitions
    ``first``, ``first`` + 1, ... without a gap), as tuples;
    InvalidReplicaAssignmentError for a gap, an empty or duplicated replica list, lists of
    different lengths or a broker that is not live."""
    if not assignment:
        raise InvalidReplicaAssignmentError("the replica assignment lists no partition")
    if sorted(assignment) != list(range(first, first + len(assignment))):
        raise InvalidReplicaAssignmentError(
            f"the assignment's partitions must be {first}..{first + len(assignment) - 1} "
            f"without a gap, got {sorted(assignment)}")
    for p, replicas in assignment.items():
        if (not isinstance(replicas, (list, tuple))
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in replicas)):
            raise InvalidReplicaAssignmentError(
                f"partition {p}: the replicas must be a list of broker ids, got {replicas!r}")
    sizes = {len(r) for r in assignment.values()}
    if len(sizes) != 1:
        raise InvalidReplicaAssignmentError("every partition must have as many replicas")
    out = {}
    for p, replicas in sorted(assignment.items()):
        replicas = tuple(replicas)
        if not replicas:
            raise InvalidReplicaAssignmentError(f"partition {p}: the replica list is empty")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"partition {p}: duplicate brokers in {list(replicas)}")
        unknown = sorted(set(replicas) - brokers)
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"partition {p}: brokers {unknown} are not live (live brokers: "
                f"{sorted(brokers)})")
        out[p] = replicas
    return out


def _plan_json(plan: dict) -> dict:
    return {"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(plan.items())]}


def _plan_entries(plan) -> list[tuple[str, int, tuple[int, ...]]]:
    """(topic, partition, replicas) of each entry of a plan in any accepted shape
    (see ``AdminManager.reassign_partitions``); InvalidReplicaAssignmentError otherwise."""
    try:
        if isinstance(plan, dict) and "partitions" in plan:
            raw = [(e["topic"], e["partition"], e["replicas"]) for e in plan["partitions"]]
        elif isinstance(plan, dict):
            raw = [(t, p, r) for (t, p), r in plan.items()]
        else:
            raw = [tuple(e) for e in plan]
        out = []
        for topic, partition, replicas in raw:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise ValueError(f"partition {partition!r}")
            if isinstance(replicas, (str, bytes)) or any(
                    isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in replicas):
                raise ValueError(f"replicas {replicas!r}")
            out.append((topic, partition, tuple(replicas)))
        return out
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidReplicaAssignmentError(
            f"a reassignment plan is {{'partitions': [{{'topic', 'partition', 'replicas'}}]}}, "
            f"[(topic, partition, replicas)] or {{(topic, partition): replicas}}: {exc}"
        ) from None
