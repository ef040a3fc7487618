"""Coordination-level errors. The actors layer translates these into the Kafka-named errors
of `actors.errors`; nothing here is part of the user-facing contract.

Operating errors (ZooKeeper down, a node already taken, a lost race) are typed so callers can
handle them; programmer errors (bad arguments) are ValueError/TypeError as usual.
"""


class CoordinationError(Exception):
    """Base of every error this package raises on purpose."""


class ZkUnavailableError(CoordinationError):
    """ZooKeeper did not answer within the deadline (connection loss, timeout, closed client)."""


class ZkSessionExpiredError(ZkUnavailableError):
    """The ZooKeeper session ended; ephemeral nodes of that session are gone."""


class ZkDataError(CoordinationError):
    """A znode body is not the JSON schema this layout expects (or not JSON at all)."""


class NodeMissingError(CoordinationError):
    """A znode that must exist does not (e.g. a topic's assignment or a partition's state)."""


class NodeAlreadyExistsError(CoordinationError):
    """A znode that must be created only once already exists (e.g. a topic's assignment)."""


class VersionConflictError(CoordinationError):
    """A conditional (versioned) update lost a race: the znode changed since it was read."""

    def __init__(self, path: str, expected_version: int):
        super().__init__(f"{path}: expected zk version {expected_version}, node has changed")
        self.path = path
        self.expected_version = expected_version


class ControllerMovedError(CoordinationError):
    """A write guarded by the controller epoch failed: another controller has been elected."""


class BrokerIdInUseError(CoordinationError):
    """Another live ZooKeeper session already holds /brokers/ids/<id>."""

    def __init__(self, broker_id: int, owner_session_id: int):
        super().__init__(
            f"broker id {broker_id} is already registered by another live ZooKeeper session "
            f"(0x{owner_session_id:x}); two brokers are configured with the same broker id")
        self.broker_id = broker_id
        self.owner_session_id = owner_session_id


class PlacementError(CoordinationError):
    """Base of replica placement errors."""


class InvalidReplicationFactorError(PlacementError):
    """Replication factor < 1 or larger than the number of available brokers (Kafka's
    InvalidReplicationFactorException)."""


class InvalidPartitionsError(PlacementError):
    """Number of partitions < 1 (Kafka's InvalidPartitionsException)."""


class InvalidReplicaAssignmentError(PlacementError):
    """Rack-aware placement asked for, but only some brokers have a rack (Kafka's
    AdminOperationException for mixed rack information)."""


class ZooKeeperServerError(CoordinationError):
    """The embedded ZooKeeper server could not be started, found, or stopped."""
