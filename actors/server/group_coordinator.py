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
- Membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) is ``GroupLogic`` (pure); this
  actor only awaits its futures, so thousands of members can wait in a JoinGroup at once
  (an async actor: a waiting request costs no thread), and runs its timer.
- OffsetCommit: the generation check (``GroupLogic.check_commit``), then the records are
  appended to the offsets partition through the local leader replica with acks=all, and
  only then applied to the cache: an acknowledged commit is replicated. OffsetFetch answers
  from the cache.
- Every ``offsets.retention.check.interval.ms`` the offsets of Empty groups older than
  ``offsets.retention.minutes`` are deleted with tombstones.

Requests for a group whose partition is not led here answer NotCoordinatorError.
"""

from __future__ import annotations

import asyncio
import logging
import time

from storage.records import build, decode_records

from ..errors import (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                      IllegalArgumentError, KafkaError, NonEmptyGroupError,
                      NotCoordinatorError, NotLeaderForPartitionError)
from ..protocol import replica_actor_name, unwrap
from .group_logic import GroupLogic, GroupState
from .group_offsets import OFFSETS_TOPIC, OffsetCache, decode_key, offsets_partition

log = logging.getLogger(__name__)

#: Kafka's defaults.
OFFSETS_RETENTION_MINUTES = 7 * 24 * 60
OFFSETS_RETENTION_CHECK_MS = 600_000
COMMIT_TIMEOUT_MS = 5_000
LOAD_READ_BYTES = 4 << 20


def _ms() -> float:
    return time.monotonic() * 1000


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
                                                      3000)))
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
                while True:
                    result = await handle.fetch.remote(offset, LOAD_READ_BYTES,
                                                       isolation="log_end")
                    records = [r for r in decode_records(result.data) if r.offset >= offset]
                    if not records:
                        break
                    applied += self.cache.load(partition, records)
                    offset = records[-1].offset + 1
                if self._leader_epochs.get(partition) == epoch:
                    self.partitions[partition] = "loaded"
                    log.info("coordinator %d: loaded %s-%d (%d offset records)",
                             self.broker_id, OFFSETS_TOPIC, partition, applied)
                return
            except Exception as exc:  # noqa: BLE001 - the replica may not be ready yet
                attempt += 1
                if attempt % 50 == 1:
                    log.warning("coordinator %d: loading %s-%d: %r", self.broker_id,
                                OFFSETS_TOPIC, partition, unwrap(exc))
                await asyncio.sleep(0.1)

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
        result = await asyncio.wrap_future(future)
        return {"member_id": result.member_id, "generation": result.generation,
                "protocol": result.protocol, "leader_id": result.leader_id,
                "members": result.members}

    async def sync_group(self, group_id: str, member_id: str, generation: int,
                         assignments: dict | None = None):
        self._owner(group_id)
        future = self.logic.sync(group_id, member_id, generation, assignments)
        self._poke()
        return await asyncio.wrap_future(future)

    async def heartbeat(self, group_id: str, member_id: str, generation: int) -> None:
        self._owner(group_id)
        self.logic.heartbeat(group_id, member_id, generation)

    async def leave_group(self, group_id: str, member_id: str) -> None:
        self._owner(group_id)
        self.logic.leave(group_id, member_id)
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
        tps = None if partitions is None else [(t, int(p)) for t, p in partitions]
        return {tp: (c.offset, c.metadata) for tp, c in self.cache.fetch(group_id, tps).items()}

    async def delete_group_offsets(self, group_id: str, partitions: list | None = None) -> int:
        """Tombstones for the group's offsets (all, or ``partitions``); only while the
        group has no members (NonEmptyGroupError)."""
        partition = self._owner(group_id)
        desc = self.logic.describe(group_id)
        if desc is not None and desc["members"]:
            raise NonEmptyGroupError(f"group {group_id!r} has members: stop them first")
        tps = None if partitions is None else [(t, int(p)) for t, p in partitions]
        keys = self.cache.delete_records(group_id, tps)
        if keys:
            await self._append(partition, keys, [None] * len(keys))
            self.cache.remove(group_id, tps)
        return len(keys)

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

    async def list_groups(self) -> list[str]:
        names = set(self.cache.groups())
        names |= {g for g, grp in self.logic.groups.items()
                  if grp.members or grp.state != GroupState.EMPTY}
        return sorted(names)

    async def status(self) -> dict:
        return {"broker_id": self.broker_id, "partitions": dict(self.partitions),
                "groups": sorted(self.logic.groups)}

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
