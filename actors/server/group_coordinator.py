"""GroupCoordinator: one async actor per broker (``group-coordinator-<id>``), coordinator of
every group whose ``__consumer_offsets`` partition this broker leads (seed 002; Kafka's
GroupCoordinator + GroupMetadataManager).

- The Broker creates it when it first leads or follows an offsets partition (a cluster
  that never uses groups pays nothing) and tells it of every role change of those
  partitions (``partitions_changed``). Becoming leader of partition p starts loading p: the
  local leader replica is read from its log start to its log end (the new leader's log is
  the truth from now on) into the OffsetCache; until that is done, requests for p's groups
  answer CoordinatorLoadInProgressError (the client retries). Losing p unloads its groups:
  their members' pending requests answer CoordinatorNotAvailableError and they look the
  coordinator up again.
- A group's membership is stored too (a group-metadata record, ``group_offsets``) each
  time a generation becomes stable or the group empty, appended with acks=all after the
  SyncGroup answers; loading a partition resumes its groups from their newest record
  (Stable with their members and assignments, sessions starting at the load), so members
  that heartbeat the new coordinator in time go on without a rebalance (Kafka's
  GroupMetadataManager.storeGroup/loadGroup). A generation whose record was not written
  before its coordinator died is not resumed: its members' heartbeats are answered
  IllegalGeneration and they rejoin.
- Handover of a partition that moves between cooperative members inside one generation
  (``GroupLogic``'s module docstring): the leader's SyncGroup names what its old owners
  must release; ``release_partitions`` (the old owner, after its revoke commit) frees
  them and ``claim_partitions`` (the new owner, a long poll like the heartbeat's) answers
  the partitions it may fetch with their committed offsets. A generation is stored once
  its handovers are released.
- Membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) is ``GroupLogic`` (pure); this
  actor only awaits its futures, so thousands of members can wait in a JoinGroup at once
  (an async actor: a waiting request costs no thread), and runs its timer.
- OffsetCommit: the generation check (``GroupLogic.check_commit``), then the records are
  appended to the offsets partition through the local leader replica with acks=all, and
  only then applied to the cache: an acknowledged commit is replicated. OffsetFetch answers
  from the cache.
- Every ``offsets.retention.check.interval.ms`` the offsets of Empty groups older than
  ``offsets.retention.minutes`` are deleted with tombstones. Offsets stored in ZooKeeper
  (``offsets_storage="zookeeper"``, ``dual_commit``: ``/consumers/<g>/offsets/<t>/<p>``)
  expire by the same rule, judged by the znode's mtime, for the groups this coordinator
  serves (so each group by one broker) that have no member here and no live
  ``/consumers/<g>/ids`` registration; ``delete_group_offsets`` deletes both stores.
  ZooKeeper is used on a session of this actor's own, opened on first use, and only from
  worker threads (``asyncio.to_thread``): the event loop never waits on ZooKeeper, and a
  ZooKeeper outage only postpones the ZooKeeper part of expiry to the next check.

Requests for a group whose partition is not led here answer NotCoordinatorError.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from coordination import zk_layout
from coordination.errors import CoordinationError
from coordination.retry import RetryPolicy
from coordination.session import ZkSettings, connect, digest_from_config
from coordination.store import ZkStore
from storage.records import build, decode_records

from ..errors import (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                      GroupIdNotFoundError, IllegalArgumentError, KafkaError,
                      NonEmptyGroupError,
                      NotCoordinatorError, NotLeaderForPartitionError,
                      ZooKeeperUnavailableError)
from ..protocol import replica_actor_name, unwrap
from .group_logic import GroupLogic, GroupState
from .group_offsets import (OFFSETS_TOPIC, OffsetCache, decode_group, decode_group_key,
                            decode_key, encode_group, encode_group_key, offsets_partition)

log = logging.getLogger(__name__)

#: Kafka's defaults.
OFFSETS_RETENTION_MINUTES = 7 * 24 * 60
OFFSETS_RETENTION_CHECK_MS = 600_000
COMMIT_TIMEOUT_MS = 5_000
#: The longest a heartbeat waits at the coordinator for a rebalance (its long poll).
MAX_HEARTBEAT_WAIT_MS = 10_000
LOAD_READ_BYTES = 4 << 20
#: The coordinator's ZooKeeper session: how long one operation may take, retries included.
ZK_OP_DEADLINE_S = 5.0
ZK_CONNECT_TIMEOUT_S = 10.0


def _ms() -> float:
    return time.monotonic() * 1000


def _partitions(value, what: str) -> list:
    """``[[topic, partition], ...]`` from a client, as (topic, partition) tuples."""
    try:
        out = [(t, int(p)) for t, p in value]
    except (TypeError, ValueError):
        raise IllegalArgumentError(f"{what} must be (topic, partition) pairs, got "
                                   f"{value!r}") from None
    if not all(isinstance(t, str) for t, _ in out):
        raise IllegalArgumentError(f"{what}: topics must be str, got {value!r}")
    return out


class GroupCoordinator:
    """See the module docstring. All methods run on the actor's event loop."""

    def __init__(self, broker_id: int, conf: dict):
        import ray
        self._ray = ray
        self.broker_id = broker_id
        self.namespace = conf["namespace"]
        config = conf.get("config") or {}
        self.logic = GroupLogic(
            _ms,
            min_session_timeout_ms=int(config.get("group.min.session.timeout.ms", 6000)),
            max_session_timeout_ms=int(config.get("group.max.session.timeout.ms", 1_800_000)),
            initial_rebalance_delay_ms=int(config.get("group.initial.rebalance.delay.ms",
                                                      3000)),
            on_stable=self._group_changed, on_empty=self._group_changed,
            on_rebalance=self._rebalance_started)
        self.cache = OffsetCache()
        # minutes as Kafka has it; a fraction is taken (tests expire offsets in seconds)
        self.retention_ms = int(float(config.get("offsets.retention.minutes",
                                                 OFFSETS_RETENTION_MINUTES)) * 60_000)
        self.retention_check_ms = int(config.get("offsets.retention.check.interval.ms",
                                                 OFFSETS_RETENTION_CHECK_MS))
        self.num_partitions: int | None = None
        self.partitions: dict[int, str] = {}            # offsets partition -> loading|loaded
        self._leader_epochs: dict[int, int] = {}
        self._stamps: dict[int, tuple] = {}             # partition -> newest notice applied
        self._wake: asyncio.Event | None = None
        self._timer: asyncio.Task | None = None
        # ZooKeeper-stored offsets: a session of our own, opened on first use (worker thread)
        self._zk_hosts = conf.get("zk_hosts")
        self._zk_session_s = float(conf.get("zk_session_timeout_s", 6.0))
        self._zk_digest = digest_from_config(config)
        self._zk_lock = threading.Lock()
        self._zk_client = None
        self._zk_store: ZkStore | None = None
        self._zk_expiry: asyncio.Task | None = None
        self.zk_expiry_failures = 0
        self.zk_offsets_expired = 0
        # group metadata records: one writer per offsets partition, the newest state last
        self._store_locks: dict[int, asyncio.Lock] = {}
        # heartbeats waiting (long poll) for their group's next rebalance
        self._rebalancing: dict[str, asyncio.Event] = {}
        # claims waiting (long poll) for a handover's release
        self._claims: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.groups_stored = 0
        self.groups_restored = 0
        self.group_store_failures = 0

    async def ready(self) -> bool:
        self._ensure_timer()
        return True

    # -- partitions of __consumer_offsets ----------------------------------------------------------
    async def partitions_changed(self, num_partitions: int, changes: list,
                                 stamp: list | None = None) -> None:
        """``changes``: [(partition, leads_here, leader_epoch)] from a LeaderAndIsr or a
        StopReplica (leads_here False) of ``__consumer_offsets``, stamped (controller
        epoch, request id): a notice older than the last one applied to a partition is
        stale (the broker handles requests in parallel) and ignored."""
        self._ensure_timer()
        self.num_partitions = num_partitions
        stamp = tuple(stamp) if stamp is not None else (-1, -1)
        for partition, leads, epoch in changes:
            if stamp < self._stamps.get(partition, (-1, -1)):
                continue
            self._stamps[partition] = stamp
            if leads:
                if self.partitions.get(partition) and \
                        self._leader_epochs.get(partition) == epoch:
                    continue
                self._unload(partition)
                self.partitions[partition] = "loading"
                self._leader_epochs[partition] = epoch
                asyncio.get_running_loop().create_task(self._load(partition, epoch))
            else:
                self._unload(partition)

    def _unload(self, partition: int) -> None:
        # the waiting beats of the partition's groups answer (they look for the new
        # coordinator); those of other groups wait on: a LeaderAndIsr naming this broker a
        # follower of another offsets partition (an ISR change) says nothing about them
        for waiting in (self._rebalancing, self._claims):
            for group_id in [g for g in waiting if not self.num_partitions
                             or offsets_partition(g, self.num_partitions) == partition]:
                self._answer(waiting, group_id)
        self.partitions.pop(partition, None)
        self._leader_epochs.pop(partition, None)
        self.cache.unload(partition)
        if self.num_partitions:
            for group in list(self.logic.groups):
                if offsets_partition(group, self.num_partitions) == partition:
                    self.logic.unload(group)

    async def _load(self, partition: int, epoch: int) -> None:
        """Read the offsets partition from the local leader replica into the cache."""
        attempt = 0
        while self._leader_epochs.get(partition) == epoch:
            try:
                handle = self._replica(partition)
                offset = 0
                applied = 0
                groups: dict[str, bytes | None] = {}     # group metadata: the newest wins
                while True:
                    result = await handle.fetch.remote(offset, LOAD_READ_BYTES,
                                                       isolation="log_end")
                    records = [r for r in decode_records(result.data) if r.offset >= offset]
                    if not records:
                        break
                    applied += self.cache.load(partition, records)
                    for r in records:
                        group = decode_group_key(r.key) if r.key is not None else None
                        if group is not None:
                            groups[group] = r.value
                    offset = records[-1].offset + 1
                if self._leader_epochs.get(partition) == epoch:
                    restored = self._restore_groups(partition, groups)
                    self.partitions[partition] = "loaded"
                    log.info("coordinator %d: loaded %s-%d (%d offset records, %d groups "
                             "resumed)", self.broker_id, OFFSETS_TOPIC, partition, applied,
                             restored)
                return
            except Exception as exc:  # noqa: BLE001 - the replica may not be ready yet
                attempt += 1
                if attempt % 50 == 1:
                    log.warning("coordinator %d: loading %s-%d: %r", self.broker_id,
                                OFFSETS_TOPIC, partition, unwrap(exc))
                await asyncio.sleep(0.1)

    def _restore_groups(self, partition: int, groups: dict) -> int:
        """Resume the groups stored in ``partition`` (their newest metadata record; a
        tombstone or an unreadable record: nothing to resume, the members rejoin)."""
        restored = 0
        for group_id, value in groups.items():
            if value is None or offsets_partition(group_id, self.num_partitions) != partition:
                continue
            try:
                snapshot = decode_group(value)
            except Exception as exc:  # noqa: BLE001 - the members rejoin instead
                log.warning("coordinator %d: group %r: unreadable metadata record: %r",
                            self.broker_id, group_id, exc)
                continue
            if self.logic.restore(group_id, snapshot):
                restored += 1
        self.groups_restored += restored
        if restored:
            self._poke()                  # the restored members' session timers
        return restored

    def _group_changed(self, group) -> None:
        """GroupLogic's hook (under its lock, on this actor's event loop): a generation
        became stable or the group empty; store it (in the background: a store that does
        not happen only means the next coordinator rebuilds the group from rejoins)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.create_task(self._store_group(group.group_id))

    async def _store_group(self, group_id: str) -> None:
        """Append the group's current stored form (``GroupLogic.snapshot``) to its offsets
        partition with acks=all. One store per partition at a time, each taking the
        snapshot when its turn comes, so the newest state is the last record."""
        if not self.num_partitions:
            return
        partition = offsets_partition(group_id, self.num_partitions)
        lock = self._store_locks.setdefault(partition, asyncio.Lock())
        async with lock:
            if self.partitions.get(partition) != "loaded":
                return
            snapshot = self.logic.snapshot(group_id)
            if snapshot is None:
                return                    # rebalancing again: its next state is stored
            try:
                await self._append(partition, [encode_group_key(group_id)],
                                   [encode_group(snapshot, int(time.time() * 1000))])
                self.groups_stored += 1
            except Exception as exc:  # noqa: BLE001 - see _group_changed
                self.group_store_failures += 1
                log.info("coordinator %d: storing group %r: %r", self.broker_id, group_id,
                         exc)

    def _replica(self, partition: int):
        return self._ray.get_actor(replica_actor_name(OFFSETS_TOPIC, partition, self.broker_id),
                                   namespace=self.namespace)

    def _owner(self, group_id: str) -> int:
        """The offsets partition of ``group_id`` if this coordinator serves it, else the
        error the client must act on."""
        if not isinstance(group_id, str) or not group_id:
            raise IllegalArgumentError(f"group_id must be a non-empty str, got {group_id!r}")
        if not self.num_partitions:
            raise NotCoordinatorError(f"broker {self.broker_id} leads no offsets partition")
        partition = offsets_partition(group_id, self.num_partitions)
        state = self.partitions.get(partition)
        if state is None:
            raise NotCoordinatorError(f"broker {self.broker_id} is not the coordinator of "
                                      f"group {group_id!r} ({OFFSETS_TOPIC}-{partition})")
        if state == "loading":
            raise CoordinatorLoadInProgressError(
                f"coordinator {self.broker_id} is loading {OFFSETS_TOPIC}-{partition}")
        return partition

    # -- membership -------------------------------------------------------------------------------
    async def join_group(self, group_id: str, member_id: str, protocol_type: str,
                         protocols: list, session_timeout_ms: int, rebalance_timeout_ms: int,
                         group_instance_id: str | None = None,
                         client_id: str = "consumer") -> dict:
        self._owner(group_id)
        future = self.logic.join(group_id, member_id or "", protocol_type=protocol_type,
                                 protocols=protocols, session_timeout_ms=session_timeout_ms,
                                 rebalance_timeout_ms=rebalance_timeout_ms,
                                 group_instance_id=group_instance_id, client_id=client_id)
        self._poke()
        self._answer(self._claims, group_id)    # a static restart frees its handovers
        result = await asyncio.wrap_future(future)
        return {"member_id": result.member_id, "generation": result.generation,
                "protocol": result.protocol, "leader_id": result.leader_id,
                "members": result.members}

    async def sync_group(self, group_id: str, member_id: str, generation: int,
                         assignments: dict | None = None, handover: dict | None = None):
        """SyncGroup. The leader's ``handover`` (cooperative assignors): member id -> the
        partitions it owns that ``assignments`` give to another member; they stay
        pending until that member releases them (``release_partitions``), and their new
        owner's ``claim_partitions`` waits until then."""
        self._owner(group_id)
        if handover is not None:
            if not isinstance(handover, dict):
                raise IllegalArgumentError(f"handover must be a dict of member id -> "
                                           f"partitions, got {type(handover).__name__}")
            handover = {mid: _partitions(tps, "handover") for mid, tps in handover.items()}
        future = self.logic.sync(group_id, member_id, generation, assignments, handover)
        self._poke()
        return await asyncio.wrap_future(future)

    async def release_partitions(self, group_id: str, member_id: str, generation: int,
                                 partitions: list) -> int:
        """The member gave ``partitions`` up (it committed them first): the ones it was to
        hand over go to their new owners, whose waiting claims answer now. Returns how
        many were pending."""
        self._owner(group_id)
        released = self.logic.release(group_id, member_id, generation,
                                      _partitions(partitions, "partitions"))
        if released:
            self._answer(self._claims, group_id)
        return len(released)

    async def claim_partitions(self, group_id: str, member_id: str, generation: int,
                               partitions: list, wait_ms: int = 0) -> dict:
        """Of ``partitions`` (of the member's assignment), the ones it may fetch now, each
        with the group's committed (offset, metadata) or None: ``{(topic, partition):
        ...}``. A partition another member still has to release is left out; with
        ``wait_ms`` this is a long poll that answers as soon as one is released (or the
        wait ends: an empty answer). RebalanceInProgressError once the group rebalances
        (the member rejoins; the claim is void)."""
        self._owner(group_id)
        tps = _partitions(partitions, "partitions")
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or wait_ms < 0:
            raise IllegalArgumentError(f"wait_ms must be an int >= 0, got {wait_ms!r}")
        deadline = time.monotonic() + min(wait_ms, MAX_HEARTBEAT_WAIT_MS) / 1000
        while True:
            ready = self.logic.claim(group_id, member_id, generation, tps)
            left = deadline - time.monotonic()
            if ready or left <= 0:
                break
            self._loop = asyncio.get_running_loop()
            event = self._claims.setdefault(group_id, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), left)
            except asyncio.TimeoutError:
                pass
            self._owner(group_id)
        committed = self.cache.fetch(group_id, ready)
        return {tp: ((committed[tp].offset, committed[tp].metadata) if tp in committed
                     else None) for tp in ready}

    def _answer(self, waiting: dict, group_id: str) -> None:
        """Answer the long polls (``waiting``: group -> event) of ``group_id``; from the
        event loop or another thread (GroupLogic's hooks run under its lock)."""
        event = waiting.pop(group_id, None)
        if event is None:
            return
        try:
            asyncio.get_running_loop()
            event.set()
        except RuntimeError:              # not on the event loop's thread
            if self._loop is not None:
                self._loop.call_soon_threadsafe(event.set)

    async def heartbeat(self, group_id: str, member_id: str, generation: int,
                        wait_ms: int = 0) -> None:
        """A heartbeat (RebalanceInProgressError: rejoin). With ``wait_ms`` it is also a
        long poll, as fetches are: while the group stays Stable the answer waits up to
        ``wait_ms`` (at most MAX_HEARTBEAT_WAIT_MS), and comes at once when a rebalance
        starts, so members learn of it in a round trip instead of at their next beat.
        The member's session is refreshed when the heartbeat arrives, not when it answers:
        a member that died while its beat waited gains nothing from the wait (its
        partitions move one session after its last beat arrived). The wait is at most half
        the member's session, so a live member's next beat comes well within it."""
        self._owner(group_id)
        session_ms = self.logic.heartbeat(group_id, member_id, generation)
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or wait_ms <= 0:
            return
        self._loop = asyncio.get_running_loop()
        event = self._rebalancing.setdefault(group_id, asyncio.Event())
        try:
            await asyncio.wait_for(
                event.wait(), min(wait_ms, MAX_HEARTBEAT_WAIT_MS, session_ms // 2) / 1000)
        except asyncio.TimeoutError:
            pass
        self._owner(group_id)
        self.logic.heartbeat(group_id, member_id, generation, refresh=False)

    def _rebalance_started(self, group) -> None:
        """GroupLogic's hook: wake the heartbeats and claims waiting on the group."""
        self._answer(self._claims, group.group_id)
        self._answer(self._rebalancing, group.group_id)

    async def leave_group(self, group_id: str, member_id: str,
                          group_instance_id: str | None = None) -> None:
        """LeaveGroup; a static member may be named by its ``group_instance_id`` alone
        (LeaveGroup v3+, an admin client's removal)."""
        self._owner(group_id)
        if not member_id and group_instance_id is not None:
            member_id = self.logic.static_member(group_id, group_instance_id) or ""
        self.logic.leave(group_id, member_id)
        # the leaver's own waiting heartbeat answers now (the last member's leave starts
        # no rebalance to wake it), so a closing consumer is not held up by it
        self._answer(self._rebalancing, group_id)
        self._answer(self._claims, group_id)
        self._poke()

    # -- offsets ----------------------------------------------------------------------------------
    async def commit_offsets(self, group_id: str, member_id: str, generation: int,
                             offsets: dict) -> None:
        """Commit ``{(topic, partition): offset | (offset, metadata)}`` for the group (a
        member of its current generation, or no member and generation -1 while the group
        has none); returns once the records are replicated (acks=all)."""
        partition = self._owner(group_id)
        self.logic.check_commit(group_id, member_id, generation)
        now = int(time.time() * 1000)
        records = self.cache.commit_records(group_id, offsets, now)
        if not records:
            return
        await self._append(partition, [k for k, _ in records], [v for _, v in records])
        self.cache.apply(partition, group_id, offsets, now)

    async def _append(self, partition: int, keys: list, values: list) -> None:
        batch = build(values, keys)
        try:
            await self._replica(partition).produce.remote(batch, -1, COMMIT_TIMEOUT_MS)
        except Exception as exc:  # noqa: BLE001 - translated for the client
            err = unwrap(exc)
            if isinstance(err, NotLeaderForPartitionError):
                self._unload(partition)
                raise NotCoordinatorError(
                    f"{OFFSETS_TOPIC}-{partition} is no longer led by broker "
                    f"{self.broker_id}") from None
            if isinstance(err, KafkaError):
                raise err from None
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition}: {err!r}") from None

    async def fetch_offsets(self, group_id: str, partitions: list | None = None) -> dict:
        """``{(topic, partition): (offset, metadata)}`` of what the group committed."""
        self._owner(group_id)
        tps = None if partitions is None else _partitions(partitions, "partitions")
        return {tp: (c.offset, c.metadata) for tp, c in self.cache.fetch(group_id, tps).items()}

    async def delete_group_offsets(self, group_id: str, partitions: list | None = None) -> int:
        """Delete the group's committed offsets (all, or ``partitions``) from both stores:
        tombstones in ``__consumer_offsets`` and the ``/consumers/<g>/offsets/<t>/<p>``
        znodes (topic znodes left empty go too). Only while the group has no members
        (NonEmptyGroupError): none here, and no live ``/consumers/<g>/ids`` registration
        in ZooKeeper. Returns how many (topic, partition)s were deleted, each once even
        when both stores held it. ZooKeeperUnavailableError when ZooKeeper cannot be
        read or written (nothing is deleted when it cannot be read)."""
        self._owner(group_id)
        self._check_no_members(group_id)
        tps = None if partitions is None else _partitions(partitions, "partitions")
        in_zk = self._zk_group_ok(group_id)
        if in_zk:
            if await self._zk(f"reading /consumers/{group_id}/ids",
                              lambda s: s.has_live_consumer_ids(group_id)):
                raise NonEmptyGroupError(
                    f"group {group_id!r} has consumers registered in ZooKeeper "
                    f"(/consumers/{group_id}/ids): stop them first")
            self._check_no_members(group_id)     # a member may have joined meanwhile
        partition = self._owner(group_id)
        keys = self.cache.delete_records(group_id, tps)
        if keys:
            await self._append(partition, keys, [None] * len(keys))
            self.cache.remove(group_id, tps)
        deleted = {decode_key(k)[1:] for k in keys}
        if in_zk:
            deleted.update(await self._zk(f"deleting /consumers/{group_id}/offsets",
                                          lambda s: s.delete_consumer_offsets(group_id, tps)))
        return len(deleted)

    def _members(self, group_id: str) -> dict:
        return (self.logic.describe(group_id) or {}).get("members") or {}

    def _check_no_members(self, group_id: str) -> None:
        if self._members(group_id):
            raise NonEmptyGroupError(f"group {group_id!r} has members: stop them first")

    # -- ZooKeeper (offsets_storage="zookeeper", dual_commit) ----------------------------------------
    def _zk_group_ok(self, group_id: str) -> bool:
        """Whether ZooKeeper can hold anything of ``group_id``: the cluster has a
        ZooKeeper address and the group id is a valid znode name."""
        if not self._zk_hosts:
            return False
        try:
            zk_layout.consumer_group_path(group_id)
        except ValueError:
            return False
        return True

    def _zk_store_blocking(self) -> ZkStore:
        """This actor's ZkStore, connecting on first use. Blocking: worker threads only."""
        with self._zk_lock:
            if self._zk_store is None:
                settings = ZkSettings(hosts=self._zk_hosts, namespace=self.namespace,
                                      session_timeout_s=self._zk_session_s,
                                      connect_timeout_s=ZK_CONNECT_TIMEOUT_S,
                                      op_timeout_s=ZK_OP_DEADLINE_S,
                                      digest=self._zk_digest)
                self._zk_client = connect(settings)
                self._zk_store = ZkStore(self._zk_client,
                                         retry=RetryPolicy(deadline_s=ZK_OP_DEADLINE_S))
            return self._zk_store

    async def _zk(self, what: str, fn):
        """``fn(store)`` on a worker thread (the event loop keeps serving); a ZooKeeper
        failure is raised as ZooKeeperUnavailableError naming ``what``."""
        def run():
            return fn(self._zk_store_blocking())
        try:
            return await asyncio.to_thread(run)
        except CoordinationError as exc:
            raise ZooKeeperUnavailableError(
                f"coordinator {self.broker_id}: {what} in ZooKeeper: {exc}") from None

    def _start_zk_expiry(self) -> None:
        """One ZooKeeper expiry pass in the background (never two at once): it may wait
        on ZooKeeper, and the timer must keep expiring sessions meanwhile."""
        if not self._zk_hosts or (self._zk_expiry is not None and not self._zk_expiry.done()):
            return
        self._zk_expiry = asyncio.get_running_loop().create_task(self._zk_expiry_pass())

    async def _zk_expiry_pass(self) -> None:
        try:
            expired = await self._expire_zk_offsets()
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down or slow: the next check
            self.zk_expiry_failures += 1
            log.warning("coordinator %d: expiring ZooKeeper-stored offsets failed, tried again "
                        "in %d ms: %r", self.broker_id, self.retention_check_ms, exc)
            return
        if expired:
            self.zk_offsets_expired += expired
            log.info("coordinator %d: expired %d ZooKeeper-stored offsets", self.broker_id,
                     expired)

    def _serves(self, group_id: str, num_partitions: int) -> bool:
        return (self.num_partitions == num_partitions and self.partitions.get(
            offsets_partition(group_id, num_partitions)) == "loaded")

    async def _expire_zk_offsets(self) -> int:
        """Delete the ``/consumers/<g>/offsets/<t>/<p>`` znodes not written for longer
        than the retention, of the groups whose offsets partition this coordinator leads
        (loaded) that have no member here and no live ``/consumers/<g>/ids``
        registration. Each delete is conditional on the znode's version, so a commit that
        lands meanwhile survives. Returns how many were deleted."""
        num = self.num_partitions
        if not num or not any(s == "loaded" for s in self.partitions.values()):
            return 0
        retention_ms = self.retention_ms
        served = {p for p, s in self.partitions.items() if s == "loaded"}

        def find(store: ZkStore) -> dict:
            now = int(time.time() * 1000)
            out = {}
            for group in store.consumer_groups():
                if offsets_partition(group, num) not in served:
                    continue                      # another coordinator's group
                stale = {tp: st.version for tp, st in store.consumer_offset_stats(group).items()
                         if now - st.mtime_ms > retention_ms}
                if stale and not store.has_live_consumer_ids(group):
                    out[group] = stale
            return out
        found = await self._zk("finding expired offsets under /consumers", find)
        # back on the loop: only groups still served here and still without members
        found = {g: stale for g, stale in found.items()
                 if self._serves(g, num) and not self._members(g)}
        if not found:
            return 0

        def delete(store: ZkStore) -> int:
            deleted = 0
            for group, stale in sorted(found.items()):
                if store.has_live_consumer_ids(group):
                    continue                      # a consumer registered meanwhile
                for (topic, partition), version in sorted(stale.items()):
                    deleted += store.delete_consumer_offset(group, topic, partition,
                                                            version=version)
                store.remove_empty_consumer_offset_topics(group, {t for t, _ in stale})
            return deleted
        return await self._zk("deleting expired offsets under /consumers", delete)

    # -- reading ----------------------------------------------------------------------------------
    async def describe_group(self, group_id: str) -> dict:
        self._owner(group_id)
        offsets = self.cache.fetch(group_id)
        # a group known only by its committed offsets is Empty; one unknown here is Dead
        desc = self.logic.describe(group_id) or {
            "group_id": group_id,
            "state": (GroupState.EMPTY if offsets else GroupState.DEAD).value,
            "generation": 0, "protocol_type": None, "protocol": None, "leader": None,
            "members": {}}
        desc["offsets"] = {tp: c.offset for tp, c in offsets.items()}
        return desc

    async def list_groups_detail(self) -> list[tuple]:
        """``[(group_id, protocol_type, state)]`` of the groups ``list_groups`` names
        (ListGroups on the wire); a group known only by its offsets is Empty."""
        out = []
        for group_id in await self.list_groups():
            desc = self.logic.describe(group_id)
            if desc is None:
                out.append((group_id, "consumer", GroupState.EMPTY.value))
            else:
                out.append((group_id, desc["protocol_type"] or "consumer", desc["state"]))
        return out

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups: an Empty group's committed offsets (both stores) and its
        membership record go. GroupIdNotFoundError for a group unknown here,
        NonEmptyGroupError while it has members."""
        partition = self._owner(group_id)
        known = self.logic.describe(group_id) is not None or self.cache.fetch(group_id)
        if not known:
            raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
        await self.delete_group_offsets(group_id)
        if not self.logic.forget(group_id):
            raise NonEmptyGroupError(f"group {group_id!r} has members: stop them first")
        try:
            await self._append(partition, [encode_group_key(group_id)], [None])
        except Exception as exc:  # noqa: BLE001 - the offsets went; a stale record only
            log.info("coordinator %d: group %r: tombstone of its membership record: %r",
                     self.broker_id, group_id, exc)  # restores an Empty group, unlisted

    async def list_groups(self) -> list[str]:
        names = set(self.cache.groups())
        names |= {g for g, grp in self.logic.groups.items()
                  if grp.members or grp.state != GroupState.EMPTY}
        return sorted(names)

    async def status(self) -> dict:
        return {"broker_id": self.broker_id, "partitions": dict(self.partitions),
                "groups": sorted(self.logic.groups),
                "zk_offsets_expired": self.zk_offsets_expired,
                "zk_expiry_failures": self.zk_expiry_failures,
                "groups_stored": self.groups_stored, "groups_restored": self.groups_restored,
                "group_store_failures": self.group_store_failures}

    # -- the timer --------------------------------------------------------------------------------
    def _ensure_timer(self) -> None:
        if self._timer is None:
            self._wake = asyncio.Event()
            self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    def _poke(self) -> None:
        self._ensure_timer()
        self._wake.set()

    async def _run_timer(self) -> None:
        next_retention = _ms() + self.retention_check_ms
        while True:
            delay = self.logic.tick()
            if _ms() >= next_retention:
                next_retention = _ms() + self.retention_check_ms
                try:
                    await self._expire_offsets()
                except Exception:  # noqa: BLE001 - tried again at the next check
                    log.exception("coordinator %d: offset expiry failed", self.broker_id)
                self._start_zk_expiry()
            wait_s = 1.0 if delay is None else min(max(delay / 1000, 0.005), 1.0)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _expire_offsets(self) -> None:
        empty = {g for g in self.cache.groups()
                 if not (self.logic.describe(g) or {}).get("members")}
        now = int(time.time() * 1000)
        by_group: dict[str, tuple[int, list]] = {}
        for group, partition, key in self.cache.expired_records(now, self.retention_ms, empty):
            by_group.setdefault(group, (partition, []))[1].append(key)
        for group, (partition, keys) in by_group.items():
            if self.partitions.get(partition) != "loaded":
                continue
            await self._append(partition, keys, [None] * len(keys))
            self.cache.remove(group, [decode_key(k)[1:] for k in keys])
