"""PartitionReplica: the Ray actor that owns one replica of one partition (a storage Log).

A thin shell: byte-level work is the Log's; this actor adds the leader/follower role, the
leader epoch and controller-epoch fencing, record validation of client batches, the high
watermark, and upkeep (flush.ms, retention, compaction) run only when due (server/upkeep.py).

Requests (all return plain data; errors are raised as actors.errors classes):
    produce(batch, acks, timeout_ms)        leader only -> ProduceResult
    fetch(offset, max_bytes, ...)           leader only -> FetchResult (up to the HW)
    list_offsets(time_ms, max_offsets)      leader only -> [offsets] (the seed's API)
    become_leader / become_follower         from the broker, for the controller
    state()                                 a dict for describe/tests

Concurrency: a threaded actor (max_concurrency > 1) so slow fetches never block produces;
the Log serialises writers and lets readers run lock-free.
"""

from __future__ import annotations

import logging
import os
import shutil

from storage import Log, LogConfig
from storage.checkpoint import write_atomic

from ..errors import (FencedLeaderEpochError, IllegalArgumentError, NotEnoughReplicasError,
                      NotLeaderForPartitionError, OffsetOutOfRangeError)
from ..protocol import FetchResult, ProduceResult, ReplicaRole
from .upkeep import Upkeep

log = logging.getLogger(__name__)


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    """``<broker data dir>/<topic>-<partition>``, as Kafka names partition directories."""
    return os.path.join(data_dir, f"{topic}-{partition}")


PARTITION_METADATA = "partition.metadata"


def read_partition_topic_id(path: str) -> str | None:
    """The topic id recorded in ``<path>/partition.metadata`` (None when absent or unreadable)."""
    try:
        with open(os.path.join(path, PARTITION_METADATA)) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "topic_id":
                    return value.strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def claim_partition_dir(path: str, topic_id: str) -> bool:
    """Make ``path`` belong to the topic incarnation ``topic_id`` (Kafka's partition.metadata).

    A directory left by an earlier topic of the same name (deleted while this broker was
    down, then created again) carries another id: its data is not this topic's, so it is
    removed before the log opens. A directory without the file (or a new one) is claimed.
    Returns True when stale data was removed.
    """
    found = read_partition_topic_id(path) if os.path.isdir(path) else None
    removed = False
    if found is not None and found != topic_id:
        log.warning("%s holds data of an earlier topic incarnation (topic id %s, now %s): "
                    "removing it", path, found, topic_id)
        shutil.rmtree(path)
        removed = True
    if found != topic_id:
        os.makedirs(path, exist_ok=True)
        write_atomic(os.path.join(path, PARTITION_METADATA),
                     f"version: 0\ntopic_id: {topic_id}\n")
    return removed


class PartitionReplica:
    """One replica of (topic, partition) on one broker. See the module docstring."""

    def __init__(self, topic: str, partition: int, broker_id: int, data_dir: str,
                 log_config: dict | None = None, min_insync_replicas: int = 1,
                 topic_id: str | None = None):
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.path = partition_dir(data_dir, topic, partition)
        self.topic_id = topic_id
        self.min_insync_replicas = min_insync_replicas
        if topic_id is not None:
            claim_partition_dir(self.path, topic_id)
        self.log = Log.open(self.path, LogConfig.from_properties(log_config or {}))
        self.role = ReplicaRole.NONE
        self.leader_epoch = -1
        self.leader_id = -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        # flush.ms, retention, compaction: a thread that sleeps until something is due
        self.upkeep = Upkeep(self.log, f"{topic}-{partition}")

    def ready(self) -> bool:
        return True

    def node_id(self) -> str:
        """The Ray node this replica (and its log) is on."""
        import ray
        return ray.get_runtime_context().get_node_id()

    # -- role changes (from the broker, on the controller's LeaderAndIsr) ------------------
    def become_leader(self, leader_epoch: int, isr: list[int], replicas: list[int]) -> dict:
        self._check_epoch(leader_epoch)
        self.role = ReplicaRole.LEADER
        self.leader_epoch = leader_epoch
        self.leader_id = self.broker_id
        self.isr = list(isr)
        self.replicas = list(replicas)
        return self.state()

    def become_follower(self, leader_id: int, leader_epoch: int, isr: list[int],
                        replicas: list[int]) -> dict:
        self._check_epoch(leader_epoch)
        self.role = ReplicaRole.FOLLOWER
        self.leader_epoch = leader_epoch
        self.leader_id = leader_id
        self.isr = list(isr)
        self.replicas = list(replicas)
        return self.state()

    @property
    def is_leader(self) -> bool:
        return self.role == ReplicaRole.LEADER

    def _check_epoch(self, leader_epoch: int) -> None:
        if leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic}-{self.partition}: leader epoch {leader_epoch} is older than "
                f"{self.leader_epoch}")

    @property
    def config(self) -> LogConfig:
        return self.log.config

    def update_config(self, log_config: dict, min_insync_replicas: int | None = None) -> None:
        """Apply new topic settings in place: requests in flight carry on, later ones (and
        the upkeep thread) see the new values."""
        config = LogConfig.from_properties(log_config or {})
        if config != self.log.config:
            self.log.update_config(config)
            self.upkeep.wake()
        if min_insync_replicas is not None:
            self.min_insync_replicas = int(min_insync_replicas)

    # -- client requests ------------------------------------------------------------------
    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderForPartitionError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
                f"(leader {self.leader_id}, epoch {self.leader_epoch})")

    @property
    def high_watermark(self) -> int:
        # Replication (the next layer) moves the HW with the ISR; a lone leader's HW is its end.
        return self.log.log_end_offset

    def produce(self, batch, acks: int = -1, timeout_ms: int = 30000) -> ProduceResult:
        self._require_leader()
        if acks not in (0, 1, -1):
            raise IllegalArgumentError(f"acks must be 0, 1 or -1 (all), got {acks!r}")
        if acks == -1 and len(self.isr) < self.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{self.topic}-{self.partition}: ISR {self.isr} is smaller than "
                f"min.insync.replicas={self.min_insync_replicas}")
        appended = self.log.append(batch, leader_epoch=self.leader_epoch,
                                   validate_records=True)
        self.upkeep.after_append()
        # the timestamp the log stamped (LogAppendTime), never a second clock reading
        return ProduceResult(appended.base_offset, appended.last_offset,
                             appended.log_append_time_ms, self.log.log_start_offset)

    def fetch(self, offset: int, max_bytes: int = 1 << 20, *,
              isolation: str = "high_watermark") -> FetchResult:
        self._require_leader()
        hw = self.high_watermark
        max_offset = hw if isolation == "high_watermark" else None
        if offset > hw and isolation == "high_watermark":
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the high watermark {hw} of "
                f"{self.topic}-{self.partition}")
        data = self.log.read(offset, max_bytes, max_offset=max_offset)
        return FetchResult(data, hw, self.log.log_start_offset, self.log.log_end_offset)

    def list_offsets(self, time_ms: int, max_offsets: int = 1) -> list[int]:
        self._require_leader()
        if time_ms == -1:
            # "latest" for a consumer is the high watermark, not records it may not read
            rest = self.log.offsets_before(-1, max_offsets)
            return [self.high_watermark] + [o for o in rest if o < self.high_watermark][
                :max_offsets - 1]
        return self.log.offsets_before(time_ms, max_offsets)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        self._require_leader()
        return self.log.offset_for_time(timestamp_ms)

    def delete_records_before(self, offset: int) -> int:
        self._require_leader()
        try:
            return self.log.delete_records_before(offset)
        finally:
            self.upkeep.wake()       # deleted segments are unlinked after file.delete.delay.ms

    def state(self) -> dict:
        return {
            "topic": self.topic, "partition": self.partition, "broker_id": self.broker_id,
            "role": self.role.value, "is_leader": self.is_leader, "leader": self.leader_id,
            "leader_epoch": self.leader_epoch, "isr": list(self.isr),
            "replicas": list(self.replicas),
            "log_start_offset": self.log.log_start_offset,
            "log_end_offset": self.log.log_end_offset,
            "high_watermark": self.high_watermark,
            "size_bytes": self.log.size_bytes, "topic_id": self.topic_id,
            "min_insync_replicas": self.min_insync_replicas,
        }

    # -- lifecycle --------------------------------------------------------------------------
    def upkeep_stats(self) -> dict:
        """How often the upkeep thread woke and ran (tests, benchmarks)."""
        return self.upkeep.stats()

    def stop(self, delete: bool = False) -> None:
        """Close the log (and delete its directory when the topic is being deleted)."""
        self.upkeep.close()
        self.log.close()
        if delete:
            shutil.rmtree(self.path, ignore_errors=True)
