"""Where the client and server sides meet: what travels between them, and how it is named.

- Actor names. Every actor is found by name in the cluster's Ray namespace; these functions
  are the only place the names are spelled.
- Request and result types: what a PartitionReplica answers to produce and fetch.
- The topic-name rule (Kafka's), checked by clients before a request and by brokers again.
- Which errors a client may retry (``is_retriable``), and ``unwrap`` for errors that crossed
  Ray (an actor's typed error arrives wrapped in Ray's RayTaskError).
- Replica and controller roles.

Imports nothing of ``actors.server`` or ``actors.client``; both import this.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .errors import InvalidTopicError, KafkaError, KafkaStorageError

# -- actor names ---------------------------------------------------------------------------
CLUSTER_INFO_ACTOR = "cluster-info"


def broker_actor_name(broker_id: int) -> str:
    return f"broker-{broker_id}"


def controller_actor_name(broker_id: int) -> str:
    return f"controller-{broker_id}"


def replica_actor_name(topic: str, partition: int, broker_id: int) -> str:
    return f"replica-{topic}-{partition}-b{broker_id}"


def group_coordinator_actor_name(broker_id: int) -> str:
    return f"group-coordinator-{broker_id}"


#: The internal topic of committed offsets (seed 002), compacted.
OFFSETS_TOPIC = "__consumer_offsets"


# -- roles ------------------------------------------------------------------------------------
class ReplicaRole(str, enum.Enum):
    """What a PartitionReplica is for its partition right now (a str, so it pickles and
    prints as its value)."""

    NONE = "none"            # started, no LeaderAndIsr applied yet
    LEADER = "leader"
    FOLLOWER = "follower"


class ControllerRole(str, enum.Enum):
    """A broker's controller candidate: the one holding ``/controller`` is ACTIVE."""

    STANDBY = "standby"
    ACTIVE = "active"


# -- results ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProduceResult:
    """The answer to ``PartitionReplica.produce``."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int        # the timestamp the log stamped; -1 for CreateTime topics
    log_start_offset: int


@dataclass(frozen=True)
class FetchResult:
    """The answer to ``PartitionReplica.fetch``."""

    data: bytes                    # whole batches, CRC-checked by the log
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True)
class ReplicaFetchResult:
    """The answer to ``PartitionReplica.replica_fetch`` (a follower fetching from its
    leader): batches from the fetch offset to the leader's log end, not just the HW."""

    data: bytes                    # whole batches, offsets and leader epochs as stored
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True)
class EpochEndOffset:
    """The answer to ``PartitionReplica.offsets_for_leader_epoch`` (KIP-101): the largest
    epoch <= the one asked that the leader knows, and where the epoch after it starts
    (the leader's LEO for its latest epoch); (-1, -1) when unknown."""

    leader_epoch: int
    end_offset: int


# -- topic names ------------------------------------------------------------------------------
TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249


def validate_topic_name(name) -> None:
    """Kafka's rule: [a-zA-Z0-9._-], 1..249 characters, not '.' or '..'."""
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, got {type(name).__name__}")
    if name in ("", ".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic name is {len(name)} characters, the limit is "
                                f"{MAX_TOPIC_LENGTH}")
    if not TOPIC_NAME_RE.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


# -- errors across Ray ------------------------------------------------------------------------
def unwrap(exc: BaseException) -> BaseException:
    """The typed error an actor raised, without Ray's RayTaskError wrapper."""
    import ray.exceptions
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


def is_retriable(exc: BaseException) -> bool:
    """May the same request succeed if sent again (after a metadata refresh)?

    Kafka's retriable errors (``KafkaError.retriable``), plus KafkaStorageError (Kafka's
    KafkaStorageException is an InvalidMetadataException: the replica's log is offline or
    closing, e.g. a leader being demoted), plus Ray's own: a dead actor (the broker moved or
    restarted) and a call that did not answer in time.
    """
    import ray.exceptions
    exc = unwrap(exc)
    if isinstance(exc, KafkaStorageError):
        return True
    if isinstance(exc, KafkaError):
        return bool(exc.retriable)
    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))
