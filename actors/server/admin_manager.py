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

from coordination.errors import NodeAlreadyExistsError, NodeMissingError, PlacementError
from coordination.errors import ZkUnavailableError
from coordination.placement import assign_replicas_to_brokers
from coordination.store import ZkStore
from storage import LogConfig

from ..errors import (InvalidPartitionsError, InvalidReplicationFactorError, InvalidTopicError,
                      TopicAlreadyExistsError, UnknownTopicOrPartitionError,
                      ZooKeeperUnavailableError)
from ..protocol import validate_topic_name

# Topic settings that are not log settings (the replica applies them itself).
NON_LOG_TOPIC_CONFIGS = {"min.insync.replicas"}


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


def _validate_log_config(config: dict) -> None:
    """InvalidConfigurationError for an unknown name or a bad value."""
    LogConfig.from_properties({k: v for k, v in config.items()
                               if k not in NON_LOG_TOPIC_CONFIGS})


class AdminManager:
    """Admin requests of one broker, written to ZooKeeper. Thread-safe (ZooKeeper orders
    concurrent writers; creation is one multi-op)."""

    def __init__(self, store: ZkStore, wake_controller: Callable[[], None] = lambda: None):
        self.store = store
        self.wake_controller = wake_controller

    @_zk_errors
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict | None) -> dict:
        """Place the replicas (seed 003's placement over the live brokers) and write the
        topic; returns partition -> replicas."""
        validate_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise InvalidPartitionsError(f"partitions must be an integer >= 1, got {partitions!r}")
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
        brokers = self.store.get_brokers()
        if replication_factor > len(brokers):
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} is larger than the {len(brokers)} "
                f"live brokers")
        try:
            assignment = assign_replicas_to_brokers(
                {b: info.rack for b, info in brokers.items()}, partitions=partitions,
                replication_factor=replication_factor)
        except PlacementError as exc:
            raise InvalidReplicationFactorError(str(exc)) from None
        try:
            self.store.create_topic(name, assignment, config)
        except NodeAlreadyExistsError:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists") from None
        self.wake_controller()
        return {p: list(r) for p, r in assignment.items()}

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
    def alter_topic_config(self, name: str, config: dict) -> dict:
        validate_topic_name(name)
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        merged = {**self.store.get_topic_config(name),
                  **{str(k): str(v) for k, v in (config or {}).items()}}
        _validate_log_config(merged)
        self.store.set_topic_config(name, merged)
        self.wake_controller()
        return merged

    @_zk_errors
    def elect_preferred_leaders(self, partitions: list) -> None:
        try:
            self.store.request_preferred_replica_election([tuple(p) for p in partitions])
        except NodeAlreadyExistsError:
            pass  # one is in progress; the caller waits and asks again if needed
        self.wake_controller()
