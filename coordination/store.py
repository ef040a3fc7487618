"""Typed reads and writes of the cluster's persistent znodes (everything but the broker
registration and the controller election, which have their own modules).

All paths and bodies come from zk_layout; this module adds the ZooKeeper semantics: which
writes are create-once, which are conditional on a zk version, which are retried. Reads and
idempotent writes are retried under `retry`; conditional writes are never blindly retried
across a VersionConflict — the caller re-reads and decides.

Errors: NodeMissingError, NodeAlreadyExistsError, VersionConflictError, ControllerMovedError,
ZkUnavailableError, ZkDataError (all from coordination.errors). Thread-safe (stateless apart
from the client).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from coordination import zk_layout as L
from coordination.errors import (ControllerMovedError, CoordinationError, NodeAlreadyExistsError,
                                 NodeMissingError, VersionConflictError, ZkDataError)
from coordination.retry import DEFAULT_RETRY, RetryPolicy
from coordination.session import ZkClient

Watch = Callable[[object], None] | None


class ConsumerOffsetStat(NamedTuple):
    """A ZooKeeper-stored consumer offset with what its znode stat says of it."""
    offset: int | None  # None when the body is not a decimal integer
    mtime_ms: int      # the server's time of the last write (the last commit), ms
    version: int       # the znode's data version (a conditional delete checks it)


class ZkStore:
    """The cluster metadata in ZooKeeper, read and written through zk_layout."""

    def __init__(self, zk: ZkClient, *, retry: RetryPolicy = DEFAULT_RETRY):
        self.zk = zk
        self.retry = retry

    # -- set-up ----------------------------------------------------------------------------

    def ensure_persistent_paths(self) -> None:
        """Create /brokers/ids, /brokers/topics, /config/..., /admin/delete_topics, ... ."""
        for path in L.PERSISTENT_PATHS:
            self.retry.run(lambda p=path: self.zk.ensure_path(p))

    def get_or_create_cluster_id(self) -> str:
        """The cluster id, created once by whoever comes first; stable afterwards."""
        def attempt() -> str:
            try:
                return L.decode_cluster_id(self.zk.get(L.CLUSTER_ID_PATH)[0])
            except NoNodeError:
                pass
            try:
                self.zk.create(L.CLUSTER_ID_PATH, L.encode_cluster_id(L.new_cluster_id()),
                               makepath=True)
            except NodeExistsError:
                pass   # somebody else (or our own ambiguous create) was first: read theirs
            return L.decode_cluster_id(self.zk.get(L.CLUSTER_ID_PATH)[0])
        return self.retry.run(attempt)

    def get_cluster_id(self) -> str | None:
        return self._get_or_none(L.CLUSTER_ID_PATH, L.decode_cluster_id)

    # -- brokers ---------------------------------------------------------------------------

    def broker_ids(self, *, watch: Watch = None) -> list[int]:
        """Registered (live) broker ids, sorted; `watch` fires once on the next change."""
        names = self._children(L.BROKER_IDS_PATH, watch)
        return sorted(int(n) for n in names if n.isdigit())

    def get_broker(self, broker_id: int) -> L.BrokerInfo | None:
        return self._get_or_none(L.broker_path(broker_id),
                                 lambda d: L.BrokerInfo.from_bytes(broker_id, d))

    def get_brokers(self) -> dict[int, L.BrokerInfo]:
        out = {}
        for broker_id in self.broker_ids():
            info = self.get_broker(broker_id)
            if info is not None:   # it may have gone between the listing and the read
                out[broker_id] = info
        return out

    # -- topics ----------------------------------------------------------------------------

    def topics(self, *, watch: Watch = None) -> list[str]:
        return sorted(self._children(L.BROKER_TOPICS_PATH, watch))

    def create_topic(self, topic: str, assignment: Mapping[int, Iterable[int]],
                     config: Mapping[str, object] | None = None) -> None:
        """Write /config/topics/<t> and /brokers/topics/<t> in one multi-op (config first, as
        Kafka does, so a controller that sees the topic also sees its config).

        Raises NodeAlreadyExistsError if the topic exists (unless a retry finds exactly what
        this call wrote: an ambiguous first attempt that did land)."""
        assignment = {int(p): tuple(r) for p, r in assignment.items()}
        config_body = L.encode_topic_config(config or {})
        topic_body = L.encode_topic_assignment(assignment)
        self.ensure_persistent_paths()
        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            txn = self.zk.transaction()
            config_path = L.topic_config_path(topic)
            if self.zk.exists(config_path) is None:
                txn.create(config_path, config_body)
            else:
                txn.set_data(config_path, config_body)   # leftover of a deleted topic
            txn.create(L.topic_path(topic), topic_body)
            results = self.zk.commit(txn)
            if not any(isinstance(r, Exception) for r in results):
                return
            if any(isinstance(r, NodeExistsError) for r in results):
                if attempts > 1 and self._topic_matches(topic, topic_body):
                    return
                raise NodeAlreadyExistsError(f"topic {topic!r} already exists")
            raise CoordinationError(f"create topic {topic!r} failed: {results}")
        self.retry.run(attempt)

    def _topic_matches(self, topic: str, body: bytes) -> bool:
        try:
            return self.zk.get(L.topic_path(topic))[0] == body
        except NoNodeError:
            return False

    def get_topic_assignment(self, topic: str, *, watch: Watch = None
                             ) -> tuple[dict[int, tuple[int, ...]], int]:
        """(partition -> replicas, zk version); NodeMissingError if no such topic."""
        data, stat = self._get(L.topic_path(topic), watch)
        return L.decode_topic_assignment(topic, data), stat.version

    def get_topic(self, topic: str, *, watch: Watch = None
                  ) -> tuple[dict[int, tuple[int, ...]], int, str]:
        """(partition -> replicas, zk version, topic id); NodeMissingError if no such topic.

        The topic id names this incarnation of the topic: the creation zxid of its
        /brokers/topics znode, unique per creation in the ensemble, so a topic deleted and
        created again under the same name has another id (the role of Kafka's topic UUID,
        without changing the seed's JSON body)."""
        data, stat = self._get(L.topic_path(topic), watch)
        return L.decode_topic_assignment(topic, data), stat.version, f"{stat.czxid:x}"

    def set_topic_assignment(self, topic: str, assignment: Mapping[int, Iterable[int]], *,
                             expected_version: int,
                             controller_epoch_zk_version: int | None = None) -> int:
        """Conditional rewrite (reassignment, added partitions); returns the new zk version.
        With ``controller_epoch_zk_version`` it is guarded by the controller epoch as
        ``update_partition_state`` is (ControllerMovedError)."""
        body = L.encode_topic_assignment({int(p): tuple(r) for p, r in assignment.items()})
        if controller_epoch_zk_version is None:
            return self._set_versioned(L.topic_path(topic), body, expected_version)
        return self._set_guarded(L.topic_path(topic), body, expected_version,
                                 controller_epoch_zk_version)

    # -- partition state -------------------------------------------------------------------

    def get_partition_state(self, topic: str, partition: int, *, watch: Watch = None
                            ) -> tuple[L.PartitionState, int]:
        """(state, zk version); NodeMissingError if the partition has no state yet."""
        data, stat = self._get(L.partition_state_path(topic, partition), watch)
        return L.PartitionState.from_bytes(topic, partition, data), stat.version

    def get_partition_states(self, topic: str, partitions: Iterable[int]
                             ) -> dict[int, tuple[L.PartitionState, int]]:
        """{partition: (state, zk version)} for each of ``partitions`` that has a state
        (the others are left out), read in one pipelined round (``ZkClient.get_many``):
        the controller's once-a-second pass reads every partition this way."""
        partitions = [int(p) for p in partitions]

        def attempt() -> dict:
            got = self.zk.get_many([L.partition_state_path(topic, p) for p in partitions])
            return {p: (L.PartitionState.from_bytes(topic, p, r[0]), r[1].version)
                    for p, r in zip(partitions, got) if r is not None}
        return self.retry.run(attempt)

    def create_partition_state(self, topic: str, partition: int, state: L.PartitionState
                               ) -> int:
        """Create the state node (and its parents); returns its zk version (0).
        NodeAlreadyExistsError if present (the controller then reads and updates instead)."""
        path = L.partition_state_path(topic, partition)
        body = state.to_bytes()

        def attempt() -> int:
            try:
                self.zk.create(path, body, makepath=True)
                return 0
            except NodeExistsError:
                data, stat = self.zk.get(path)
                if data == body and stat.version == 0:
                    return 0   # our own ambiguous create
                raise NodeAlreadyExistsError(f"{path} already exists") from None
        return self.retry.run(attempt)

    def update_partition_state(self, topic: str, partition: int, state: L.PartitionState, *,
                               expected_version: int,
                               controller_epoch_zk_version: int | None = None) -> int:
        """Conditional update of a partition's leader/ISR; returns the new zk version.

        Raises VersionConflictError if the node changed since `expected_version` was read
        (re-read and decide again), ControllerMovedError if `controller_epoch_zk_version` is
        given and /controller_epoch has moved on (we are no longer the controller)."""
        path = L.partition_state_path(topic, partition)
        if controller_epoch_zk_version is None:
            return self._set_versioned(path, state.to_bytes(), expected_version)
        return self._set_guarded(path, state.to_bytes(), expected_version,
                                 controller_epoch_zk_version)

    def _set_guarded(self, path: str, body: bytes, expected_version: int,
                     controller_epoch_zk_version: int) -> int:
        """A versioned set in one multi-op with a check of /controller_epoch's version."""
        txn = self.zk.transaction()
        txn.check(L.CONTROLLER_EPOCH_PATH, controller_epoch_zk_version)
        txn.set_data(path, body, version=expected_version)
        # One attempt (see _set_versioned): a retried multi-op could report its own success
        # as a conflict.
        results = self.zk.commit(txn)
        if not any(isinstance(r, Exception) for r in results):
            return results[1].version
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise ControllerMovedError(
                f"{path}: controller epoch moved past zk version {controller_epoch_zk_version}")
        if isinstance(results[1], BadVersionError):
            raise VersionConflictError(path, expected_version)
        if isinstance(results[1], NoNodeError):
            raise NodeMissingError(f"{path} does not exist")
        raise CoordinationError(f"{path}: multi-op failed: {results}")

    # -- topic config ----------------------------------------------------------------------

    def get_topic_config(self, topic: str) -> dict[str, str]:
        """The topic's overrides ({} when none are stored)."""
        return self._get_or_none(L.topic_config_path(topic),
                                 lambda d: L.decode_topic_config(topic, d)) or {}

    def set_topic_config(self, topic: str, config: Mapping[str, object]) -> None:
        """Replace the overrides and post a /config/changes notification (so brokers that
        watch the sequence reload it)."""
        path = L.topic_config_path(topic)
        body = L.encode_topic_config(config)

        def write() -> None:
            try:
                self.zk.set(path, body)
            except NoNodeError:
                try:
                    self.zk.create(path, body, makepath=True)
                except NodeExistsError:
                    self.zk.set(path, body)
        self.retry.run(write)
        # Not retried: a duplicate notification is harmless but so is a missing retry loop
        # here — the config itself is durable and re-read on any broker start.
        self.zk.create(f"{L.CONFIG_CHANGES_PATH}/{L.CONFIG_CHANGE_PREFIX}",
                       L.encode_config_change(topic), sequence=True, makepath=True)

    def config_changes(self, *, watch: Watch = None) -> list[str]:
        """The pending /config/changes notification names (sorted by sequence)."""
        try:
            return sorted(self._children(L.CONFIG_CHANGES_PATH, watch))
        except NodeMissingError:
            return []

    def purge_config_changes(self, older_than_ms: int, *, now_ms: int | None = None) -> int:
        """Delete notifications created more than ``older_than_ms`` ago (Kafka keeps them
        15 minutes, long enough for every broker to have seen them); returns how many."""
        now_ms = L.now_ms() if now_ms is None else now_ms
        removed = 0
        for name in self.config_changes():
            path = f"{L.CONFIG_CHANGES_PATH}/{name}"
            stat = self.retry.run(lambda p=path: self.zk.exists(p))
            if stat is not None and now_ms - stat.ctime > older_than_ms:
                self._delete_if_present(path)
                removed += 1
        return removed

    # -- topic deletion --------------------------------------------------------------------

    def request_topic_deletion(self, topic: str) -> None:
        """Create /admin/delete_topics/<t> (idempotent); NodeMissingError for an unknown topic."""
        if self.zk.exists(L.topic_path(topic)) is None:
            raise NodeMissingError(f"topic {topic!r} does not exist")

        def attempt() -> None:
            try:
                self.zk.create(L.delete_topic_path(topic), b"", makepath=True)
            except NodeExistsError:
                pass   # already requested
        self.retry.run(attempt)

    def pending_topic_deletions(self, *, watch: Watch = None) -> list[str]:
        return sorted(self._children(L.DELETE_TOPICS_PATH, watch))

    def complete_topic_deletion(self, topic: str) -> None:
        """The controller's last step: remove the topic's znodes, then the request."""
        for path in (L.topic_path(topic), L.topic_config_path(topic),
                     L.delete_topic_path(topic)):
            self.retry.run(lambda p=path: self.zk.delete_recursive(p))

    # -- admin requests: reassignment, preferred replica election, ISR changes ---------------

    def request_reassignment(self, plan: Mapping[tuple[str, int], Iterable[int]]) -> None:
        """NodeAlreadyExistsError while another reassignment is in progress (as Kafka)."""
        self._create_once(L.REASSIGN_PARTITIONS_PATH, L.encode_reassignment(
            {(t, int(p)): tuple(r) for (t, p), r in plan.items()}), "a reassignment")

    def get_reassignment(self, *, watch: Watch = None
                         ) -> dict[tuple[str, int], tuple[int, ...]] | None:
        return self._get_watched_or_none(L.REASSIGN_PARTITIONS_PATH, L.decode_reassignment,
                                         watch)

    def set_reassignment(self, plan: Mapping[tuple[str, int], Iterable[int]]) -> None:
        """Rewrite the pending reassignment (the controller drops completed partitions;
        only it writes an existing node). NodeMissingError if there is none."""
        body = L.encode_reassignment({(t, int(p)): tuple(r) for (t, p), r in plan.items()})
        try:
            self.retry.run(lambda: self.zk.set(L.REASSIGN_PARTITIONS_PATH, body))
        except NoNodeError:
            raise NodeMissingError(f"{L.REASSIGN_PARTITIONS_PATH} does not exist") from None

    def complete_reassignment(self) -> None:
        self._delete_if_present(L.REASSIGN_PARTITIONS_PATH)

    def request_preferred_replica_election(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._create_once(L.PREFERRED_REPLICA_ELECTION_PATH,
                          L.encode_partition_list(partitions), "a preferred replica election")

    def get_preferred_replica_election(self, *, watch: Watch = None
                                       ) -> list[tuple[str, int]] | None:
        return self._get_watched_or_none(
            L.PREFERRED_REPLICA_ELECTION_PATH,
            lambda d: L.decode_partition_list(L.PREFERRED_REPLICA_ELECTION_PATH, d), watch)

    def complete_preferred_replica_election(self) -> None:
        self._delete_if_present(L.PREFERRED_REPLICA_ELECTION_PATH)

    def notify_isr_change(self, partitions: Iterable[tuple[str, int]]) -> str:
        """A sequential /isr_change_notification/isr_change_<seq>; returns its path."""
        return self.zk.create(f"{L.ISR_CHANGE_NOTIFICATION_PATH}/{L.ISR_CHANGE_PREFIX}",
                              L.encode_partition_list(partitions), sequence=True,
                              makepath=True)

    # -- consumers (offsets.storage=zookeeper and the seed's registry) -----------------------

    def register_consumer(self, group: str, consumer_id: str,
                          registration: L.ConsumerRegistration) -> None:
        """Ephemeral /consumers/<g>/ids/<consumer_id>; NodeAlreadyExistsError if taken."""
        self._create_once(L.consumer_id_path(group, consumer_id), registration.to_bytes(),
                          f"consumer {consumer_id!r}", ephemeral=True)

    def consumer_groups(self) -> list[str]:
        """The groups under /consumers (the seed's registry and ZooKeeper-stored offsets)."""
        try:
            return sorted(self._children(L.CONSUMERS_PATH, None))
        except NodeMissingError:
            return []

    def consumer_ids(self, group: str, *, watch: Watch = None) -> list[str]:
        try:
            return sorted(self._children(L.consumer_ids_path(group), watch))
        except NodeMissingError:
            return []

    def claim_partition(self, group: str, topic: str, partition: int, owner: str) -> bool:
        """Ephemeral owner node; True if we own it now (also if we already did)."""
        path = L.consumer_owner_path(group, topic, partition)
        try:
            self.retry.run(lambda: self.zk.create(path, L.encode_owner(owner), ephemeral=True,
                                                  makepath=True))
            return True
        except NodeExistsError:
            data, stat = self.zk.get(path)
            return L.decode_owner(data) == owner and stat.ephemeralOwner == self.zk.session_id

    def release_partition(self, group: str, topic: str, partition: int) -> None:
        self._delete_if_present(L.consumer_owner_path(group, topic, partition))

    def commit_offset(self, group: str, topic: str, partition: int, offset: int) -> None:
        path = L.consumer_offset_path(group, topic, partition)

        def write() -> None:
            try:
                self.zk.set(path, L.encode_int(offset))
            except NoNodeError:
                try:
                    self.zk.create(path, L.encode_int(offset), makepath=True)
                except NodeExistsError:
                    self.zk.set(path, L.encode_int(offset))
        self.retry.run(write)

    def fetch_offset(self, group: str, topic: str, partition: int) -> int | None:
        path = L.consumer_offset_path(group, topic, partition)
        return self._get_or_none(path, lambda d: L.decode_int(path, d))

    def consumer_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """Every /consumers/<g>/offsets/<t>/<p> of the group: {(topic, partition): offset}
        (a child that is not a partition number is skipped)."""
        out: dict[tuple[str, int], int] = {}
        root = f"{L.consumer_group_path(group)}/offsets"
        try:
            topics = self._children(root, None)
        except NodeMissingError:
            return out
        for topic in topics:
            try:
                partitions = self._children(L.consumer_offsets_path(group, topic), None)
            except NodeMissingError:
                continue
            for name in partitions:
                if not name.isdigit():
                    continue
                offset = self.fetch_offset(group, topic, int(name))
                if offset is not None:
                    out[(topic, int(name))] = offset
        return out

    def consumer_offset_stats(self, group: str) -> dict[tuple[str, int], ConsumerOffsetStat]:
        """Every /consumers/<g>/offsets/<t>/<p> of the group with its znode stat:
        {(topic, partition): ConsumerOffsetStat(offset, mtime_ms, version)} (what offset
        expiry reads: ``mtime_ms`` is the server's time of the last commit; ``version`` makes
        a later delete conditional on no commit having landed since)."""
        out: dict[tuple[str, int], ConsumerOffsetStat] = {}
        for topic in self._consumer_offset_topics(group):
            try:
                partitions = self._children(L.consumer_offsets_path(group, topic), None)
            except NodeMissingError:
                continue
            for name in partitions:
                if not name.isdigit():
                    continue
                path = L.consumer_offset_path(group, topic, int(name))
                try:
                    data, stat = self.retry.run(lambda p=path: self.zk.get(p))
                except NoNodeError:
                    continue                     # deleted between the listing and the read
                try:
                    offset = L.decode_int(path, data)
                except ZkDataError:
                    offset = None                # still listed: it can expire or be deleted
                out[(topic, int(name))] = ConsumerOffsetStat(offset, stat.mtime, stat.version)
        return out

    def delete_consumer_offset(self, group: str, topic: str, partition: int, *,
                               version: int = -1) -> bool:
        """Delete /consumers/<g>/offsets/<t>/<p>; with ``version`` only if the node still
        has that zk version (no commit since it was read). True if this call deleted it;
        False if it was not there or has changed."""
        path = L.consumer_offset_path(group, topic, partition)
        attempts = 0

        def attempt() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                self.zk.delete(path, version=version)
                return True
            except NoNodeError:
                # an ambiguous first attempt (connection loss) may have deleted it
                return attempts > 1 and version < 0
            except BadVersionError:
                return False
        return self.retry.run(attempt)

    def delete_consumer_offsets(self, group: str, partitions: Iterable[tuple[str, int]] |
                                None = None) -> list[tuple[str, int]]:
        """Delete the group's offset nodes (all of them, or ``partitions``) and then the
        topic nodes left empty; returns the (topic, partition)s that were there, sorted."""
        stored = self.consumer_offset_stats(group)
        wanted = sorted(stored) if partitions is None else sorted(
            {(t, int(p)) for t, p in partitions} & set(stored))
        for topic, partition in wanted:
            self.delete_consumer_offset(group, topic, partition)
        self.remove_empty_consumer_offset_topics(group, {t for t, _ in wanted})
        return wanted

    def remove_empty_consumer_offset_topics(self, group: str,
                                            topics: Iterable[str] | None = None) -> None:
        """Delete /consumers/<g>/offsets/<t> of ``topics`` (default: every topic) that hold
        no offset node; a topic node that gained a child meanwhile stays."""
        names = self._consumer_offset_topics(group) if topics is None else sorted(topics)
        for topic in names:
            path = L.consumer_offsets_path(group, topic)
            try:
                self.retry.run(lambda p=path: self.zk.delete(p))
            except (NoNodeError, NotEmptyError):
                pass

    def has_live_consumer_ids(self, group: str) -> bool:
        """True while /consumers/<g>/ids has an ephemeral child, i.e. a consumer whose
        ZooKeeper session is alive is registered in the group (a persistent leftover does
        not count)."""
        for consumer_id in self.consumer_ids(group):
            path = L.consumer_id_path(group, consumer_id)
            stat = self.retry.run(lambda p=path: self.zk.exists(p))
            if stat is not None and stat.ephemeralOwner != 0:
                return True
        return False

    def _consumer_offset_topics(self, group: str) -> list[str]:
        try:
            return sorted(self._children(f"{L.consumer_group_path(group)}/offsets", None))
        except NodeMissingError:
            return []

    def put_consumer_registration(self, group: str, consumer_id: str,
                                  registration: L.ConsumerRegistration) -> None:
        """Ephemeral /consumers/<g>/ids/<consumer_id> with this body, created or replaced
        (the session's own registry entry: a later subscription rewrites it)."""
        path = L.consumer_id_path(group, consumer_id)
        body = registration.to_bytes()

        def write() -> None:
            try:
                self.zk.create(path, body, ephemeral=True, makepath=True)
            except NodeExistsError:
                self.zk.set(path, body)
        self.retry.run(write)

    def unregister_consumer(self, group: str, consumer_id: str) -> None:
        self._delete_if_present(L.consumer_id_path(group, consumer_id))

    def take_partition(self, group: str, topic: str, partition: int, owner: str) -> None:
        """Make the ephemeral owner node of (topic, partition) this session's, holding
        ``owner``: created; rewritten if it is already ours; replaced if another session
        holds it (the caller knows better, e.g. a coordinator's newer generation, than a
        node left by a consumer whose session has not expired yet)."""
        path = L.consumer_owner_path(group, topic, partition)
        body = L.encode_owner(owner)

        def attempt() -> None:
            try:
                self.zk.create(path, body, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                pass
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                raise NodeExistsError() from None       # gone meanwhile: try again
            if stat.ephemeralOwner == self.zk.session_id:
                if data != body:
                    self.zk.set(path, body, version=stat.version)
                return
            try:
                self.zk.delete(path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass
            self.zk.create(path, body, ephemeral=True, makepath=True)

        for _ in range(5):
            try:
                self.retry.run(attempt)
                return
            except (NodeExistsError, BadVersionError):
                continue    # somebody else moved at the same time: look again
        raise NodeAlreadyExistsError(f"{path}: could not take it in 5 attempts")

    def release_partition_if_ours(self, group: str, topic: str, partition: int) -> bool:
        """Delete the owner node of (topic, partition) only if this session created it;
        True if it was deleted."""
        path = L.consumer_owner_path(group, topic, partition)

        def attempt() -> bool:
            try:
                _, stat = self.zk.get(path)
            except NoNodeError:
                return False
            if stat.ephemeralOwner != self.zk.session_id:
                return False
            try:
                self.zk.delete(path, version=stat.version)
                return True
            except (NoNodeError, BadVersionError):
                return False
        return self.retry.run(attempt)

    def partition_owners(self, group: str) -> dict[tuple[str, int], str]:
        """{(topic, partition): owner} of every owner node of the group."""
        out: dict[tuple[str, int], str] = {}
        root = f"{L.consumer_group_path(group)}/owners"
        try:
            topics = self._children(root, None)
        except NodeMissingError:
            return out
        for topic in topics:
            try:
                partitions = self._children(L.consumer_owners_path(group, topic), None)
            except NodeMissingError:
                continue
            for name in partitions:
                if name.isdigit():
                    owner = self._get_or_none(L.consumer_owner_path(group, topic, int(name)),
                                              L.decode_owner)
                    if owner is not None:
                        out[(topic, int(name))] = owner
        return out

    def get_consumer_registration(self, group: str, consumer_id: str
                                  ) -> L.ConsumerRegistration | None:
        return self._get_or_none(L.consumer_id_path(group, consumer_id),
                                 lambda d: L.ConsumerRegistration.from_bytes(group,
                                                                             consumer_id, d))

    # -- helpers ---------------------------------------------------------------------------

    # -- ACLs (Kafka's ZooKeeper authorizer layout, see zk_layout) -------------------------

    def get_acls(self, resource_type: str, name: str, pattern_type: str = "LITERAL"
                 ) -> tuple[frozenset, int]:
        """A resource pattern's entries and its znode version (-1: no znode, no entries)."""
        path = L.acl_resource_path(resource_type, name, pattern_type)
        try:
            data, stat = self.retry.run(lambda: self.zk.get(path))
        except NoNodeError:
            return frozenset(), -1
        return L.decode_acls(path, data), stat.version

    def set_acls(self, resource_type: str, name: str, pattern_type: str, entries,
                 expected_version: int) -> None:
        """Replace a pattern's entries if its znode is still at ``expected_version`` (-1:
        absent), deleting the znode when none are left, then post a change notification
        (Kafka's acl_changes_<seq>) that brokers watch. VersionConflictError when another
        writer got there first: re-read and retry."""
        path = L.acl_resource_path(resource_type, name, pattern_type)
        entries = frozenset(entries)
        try:
            if expected_version < 0:
                if not entries:
                    return
                self.zk.create(path, L.encode_acls(entries), makepath=True)
            elif entries:
                self.zk.set(path, L.encode_acls(entries), version=expected_version)
            else:
                self.zk.delete(path, version=expected_version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise VersionConflictError(path, expected_version) from None
        self.retry.run(lambda: self.zk.create(
            L.acl_change_path(pattern_type),
            L.encode_acl_change(resource_type, name, pattern_type),
            sequence=True, makepath=True))

    def acl_patterns(self) -> list[tuple[str, str, str]]:
        """Every stored resource pattern: (resource type, name, pattern type)."""
        out = []
        for pattern_type in L.ACL_PATTERN_TYPES:
            for resource_type in L.ACL_RESOURCE_TYPES:
                try:
                    names = self._children(L.acl_type_path(resource_type, pattern_type), None)
                except NodeMissingError:
                    continue
                out.extend((resource_type, n, pattern_type) for n in sorted(names))
        return out

    def acl_changes(self, *, watch: Watch = None) -> list[str]:
        """The pending ACL change notifications of both stores, as paths (sorted by
        store, then sequence); ``watch`` fires once on a change to either."""
        out = []
        for pattern_type in L.ACL_PATTERN_TYPES:
            parent = L.acl_change_path(pattern_type).rsplit("/", 1)[0]
            self.retry.run(lambda p=parent: self.zk.ensure_path(p))
            out.extend(f"{parent}/{n}" for n in sorted(self._children(parent, watch)))
        return out

    def purge_acl_changes(self, older_than_ms: int, *, now_ms: int | None = None) -> int:
        """Delete ACL change notifications older than ``older_than_ms`` (Kafka: 15 min)."""
        now_ms = L.now_ms() if now_ms is None else now_ms
        removed = 0
        for path in self.acl_changes():
            stat = self.retry.run(lambda p=path: self.zk.exists(p))
            if stat is not None and now_ms - stat.ctime > older_than_ms:
                self._delete_if_present(path)
                removed += 1
        return removed

    def _get(self, path: str, watch: Watch):
        try:
            return self.retry.run(lambda: self.zk.get(path, watch=watch))
        except NoNodeError:
            raise NodeMissingError(f"{path} does not exist") from None

    def _get_or_none(self, path: str, decode):
        try:
            data, _ = self.retry.run(lambda: self.zk.get(path))
        except NoNodeError:
            return None
        return decode(data)

    def _get_watched_or_none(self, path: str, decode, watch: Watch):
        """Read with a watch that also fires when the node is created later."""
        def attempt():
            if self.zk.exists(path, watch=watch) is None:
                return None
            try:
                return decode(self.zk.get(path)[0])
            except NoNodeError:
                return None
        return self.retry.run(attempt)

    def _children(self, path: str, watch: Watch) -> list[str]:
        try:
            return self.retry.run(lambda: self.zk.get_children(path, watch=watch))
        except NoNodeError:
            raise NodeMissingError(f"{path} does not exist") from None

    def _set_versioned(self, path: str, body: bytes, expected_version: int) -> int:
        # One attempt at the conditional write; a ConnectionLoss makes the outcome unknown,
        # so it surfaces as ZkUnavailableError and the caller re-reads.
        try:
            return self.zk.set(path, body, version=expected_version).version
        except BadVersionError:
            raise VersionConflictError(path, expected_version) from None
        except NoNodeError:
            raise NodeMissingError(f"{path} does not exist") from None

    def _create_once(self, path: str, body: bytes, what: str, *, ephemeral: bool = False):
        try:
            self.retry.run(lambda: self.zk.create(path, body, ephemeral=ephemeral,
                                                  makepath=True))
        except NodeExistsError:
            raise NodeAlreadyExistsError(f"{what} is already in progress ({path})") from None

    def _delete_if_present(self, path: str) -> None:
        try:
            self.retry.run(lambda: self.zk.delete(path))
        except NoNodeError:
            pass
