"""Every error a raykafka user can catch, under one base class ``KafkaError``.

Names follow Kafka's (kafka-python's spelling). The storage layer's errors are defined in
``storage.errors`` (it imports nothing of ours) and re-exported here as the very same
classes; coordination's failures are translated into these by the actors that call it.
``retriable`` says whether the same request may succeed later (clients retry those).
Errors raised inside an actor reach the caller as the same class (Ray re-raises a subclass
of both RayTaskError and the original), so ``except NotLeaderForPartitionError`` works.
"""

from storage.errors import (CorruptRecordError, InvalidConfigurationError, InvalidRecordError,
                            KafkaError, KafkaStorageError, OffsetOutOfRangeError,
                            RecordTooLargeError, UnsupportedCodecError, UnsupportedVersionError)
# the idempotent producer's (KIP-98): raised by the log's producer state
from storage.errors import (CorruptSnapshotError, InvalidProducerEpochError,
                            OutOfOrderSequenceError, UnknownProducerIdError)


class RetriableError(KafkaError):
    retriable = True


# -- topics and partitions ---------------------------------------------------------------
class InvalidTopicError(KafkaError):
    """A topic name outside Kafka's rule: [a-zA-Z0-9._-], 1..249 chars, not '.' or '..'."""


class TopicAlreadyExistsError(KafkaError):
    pass


class UnknownTopicOrPartitionError(RetriableError):
    """No such topic or partition (retriable: it may be being created)."""


class InvalidPartitionsError(KafkaError):
    pass


class InvalidReplicationFactorError(KafkaError):
    pass


class InvalidReplicaAssignmentError(KafkaError):
    pass


class ReassignmentInProgressError(KafkaError):
    """A partition reassignment is already running (/admin/reassign_partitions exists):
    wait for it to finish, then ask again."""


# -- leadership and replication ---------------------------------------------------------
class NotLeaderForPartitionError(RetriableError):
    """The replica asked is not the partition's leader: refresh metadata and retry."""


class LeaderNotAvailableError(RetriableError):
    """The partition has no live leader right now."""


class NotEnoughReplicasError(RetriableError):
    """acks=all while the ISR is smaller than min.insync.replicas."""


class NotEnoughReplicasAfterAppendError(RetriableError):
    pass


class FencedLeaderEpochError(RetriableError):
    """A request carrying an older leader epoch than the replica's."""


class UnknownLeaderEpochError(RetriableError):
    """A request carrying a newer leader epoch than the replica knows (it has not heard of
    the new epoch yet): retry after a backoff."""


class InvalidUpdateVersionError(KafkaError):
    """An ISR change proposed against a stale partition state version (zk_version); the
    leader waits for the controller's next LeaderAndIsr instead of retrying."""


class StaleControllerEpochError(KafkaError):
    """A request from a controller older than the newest one the broker has seen."""


class NotControllerError(RetriableError):
    pass


class BrokerNotAvailableError(RetriableError):
    pass


class BrokerIdInUseError(KafkaError):
    """Another live broker is registered with this broker id."""


class InconsistentClusterIdError(KafkaError):
    """A broker's data dir (its meta.properties) belongs to another cluster or broker id
    than the one starting on it; Kafka refuses to start such a broker, so do we."""


class NoBrokersAvailable(RetriableError):
    pass


# -- requests --------------------------------------------------------------------------
class KafkaTimeoutError(RetriableError):
    """An operation did not complete within its timeout."""


class RequestTimedOutError(RetriableError):
    pass


class NetworkError(RetriableError):
    """The connection to a broker broke or could not be made (Kafka's NETWORK_EXCEPTION):
    the request may or may not have been applied; clients refresh metadata and retry."""


class IllegalStateError(KafkaError):
    """An operation on a closed client, or in a state that does not allow it."""


class IllegalArgumentError(KafkaError):
    """An argument of the wrong type or value (a key that is not bytes without a
    serializer, a negative partition, ...)."""


class ClusterNotFoundError(KafkaError):
    """``Cluster.connect`` found no running cluster in that namespace."""


class ZooKeeperUnavailableError(RetriableError):
    """ZooKeeper could not be reached within the timeout."""


# -- consumer groups (Kafka's error names) -----------------------------------------------------
class CoordinatorNotAvailableError(RetriableError):
    """The group's coordinator is not available (no leader for its offsets partition, or the
    group is being unloaded)."""


class NotCoordinatorError(RetriableError):
    """This broker is not the group's coordinator (look it up again)."""


class CoordinatorLoadInProgressError(RetriableError):
    """The coordinator is loading the group's offsets partition: retry shortly."""


class UnknownMemberIdError(KafkaError):
    """The member is not in the group (expired, removed, or never joined): rejoin."""


class IllegalGenerationError(KafkaError):
    """The request carries another generation than the group's: a stale member, rejoin."""


class RebalanceInProgressError(KafkaError):
    """The group is rebalancing: rejoin before committing or syncing."""


class InconsistentGroupProtocolError(KafkaError):
    """The member's protocol type or assignors share nothing with the group's."""


class FencedInstanceIdError(KafkaError):
    """A newer member took this static member's group.instance.id (KIP-345)."""


class InvalidSessionTimeoutError(KafkaError):
    """session_timeout_ms outside the coordinator's allowed range."""


class GroupIdNotFoundError(KafkaError):
    """No such group."""


# -- security ---------------------------------------------------------------------------
class SaslAuthenticationError(KafkaError):
    """SASL authentication failed: unknown user, wrong password, a broken exchange
    (Kafka's SASL_AUTHENTICATION_FAILED). Not retriable: the same credentials fail again."""


class UnsupportedSaslMechanismError(KafkaError):
    """The broker's listener does not enable the SASL mechanism asked for (Kafka's
    UNSUPPORTED_SASL_MECHANISM); the message lists the ones it enables."""


class IllegalSaslStateError(KafkaError):
    """A SASL request out of order: SaslAuthenticate before SaslHandshake, a handshake on
    a listener without SASL or after authenticating (Kafka's ILLEGAL_SASL_STATE)."""


class NonEmptyGroupError(KafkaError):
    """The group has members: it cannot be deleted, nor its offsets deleted."""


class TopicAuthorizationFailedError(KafkaError):
    """The principal may not do this to the topic (an ACL of the authorizer)."""


class GroupAuthorizationFailedError(KafkaError):
    """The principal may not do this to the consumer group (an ACL of the authorizer)."""


class ClusterAuthorizationFailedError(KafkaError):
    """The principal may not do this to the cluster (an ACL of the authorizer)."""


class SecurityDisabledError(KafkaError):
    """The cluster has no authorizer: there are no ACLs to create, delete or list."""


class InvalidCheckpointError(KafkaError):
    """A streaming job's checkpoint directory cannot be used: a log file in it is damaged,
    it was made for other topics, or another query is running on it."""


__all__ = [
    "KafkaError", "RetriableError", "CorruptRecordError", "InvalidConfigurationError",
    "InvalidRecordError", "KafkaStorageError", "OffsetOutOfRangeError", "RecordTooLargeError",
    "UnsupportedCodecError", "UnsupportedVersionError", "InvalidTopicError",
    "TopicAlreadyExistsError", "UnknownTopicOrPartitionError", "InvalidPartitionsError",
    "NetworkError",
    "InvalidReplicationFactorError", "InvalidReplicaAssignmentError",
    "ReassignmentInProgressError",
    "NotLeaderForPartitionError", "LeaderNotAvailableError", "NotEnoughReplicasError",
    "NotEnoughReplicasAfterAppendError", "FencedLeaderEpochError", "UnknownLeaderEpochError",
    "InvalidUpdateVersionError",
    "StaleControllerEpochError", "NotControllerError", "BrokerNotAvailableError",
    "BrokerIdInUseError", "InconsistentClusterIdError", "NoBrokersAvailable",
    "KafkaTimeoutError", "RequestTimedOutError",
    "IllegalStateError", "IllegalArgumentError", "ClusterNotFoundError",
    "ZooKeeperUnavailableError", "CoordinatorNotAvailableError", "NotCoordinatorError",
    "CoordinatorLoadInProgressError", "UnknownMemberIdError", "IllegalGenerationError",
    "RebalanceInProgressError", "InconsistentGroupProtocolError", "FencedInstanceIdError",
    "InvalidSessionTimeoutError", "GroupIdNotFoundError", "NonEmptyGroupError",
    "InvalidCheckpointError", "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError", "ClusterAuthorizationFailedError",
    "SecurityDisabledError",
    "OutOfOrderSequenceError", "InvalidProducerEpochError", "UnknownProducerIdError",
    "CorruptSnapshotError",
    "SaslAuthenticationError", "UnsupportedSaslMechanismError", "IllegalSaslStateError",
]
