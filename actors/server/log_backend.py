"""LogBackend: the handlers' ``Backend`` over storage Logs in this process, one node leading
every partition; and ``serve``, a single-process Kafka broker (a listener, KafkaApis and
LogBackend) that unmodified Kafka clients can produce to and consume from.

It is the data plane without Ray: tests use it, and it shows what a Broker must provide.
Each partition is a ``storage.Log`` in ``<data_dir>/<topic>-<partition>`` with a leader
epoch cache beside it; the node is the leader at ``leader_epoch`` (assigned at its log end
when the partition is opened), the only replica and the whole ISR, so the high watermark
is the log end and acks=all is acks=1. Topics are created by ``create_topic`` (no
auto-creation). Thread-safe: the topic table has a lock; a Log has its own.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

from storage import Log, LogConfig
from storage.checkpoint import read_offset, write_offset

from ..errors import KafkaError, UnknownTopicOrPartitionError
from ..protocol import EpochEndOffset, FetchResult, ProduceResult, validate_topic_name
from .epoch_cache import LeaderEpochCache
from .handlers import BrokerEndpoint, KafkaApis, PartitionMetadata
from .list_offsets import list_offset_in_log
from .network import ListenerSecurity, SocketServer, SocketServerConfig
from .producer_handlers import ProducerIdApis


@dataclass
class _Partition:
    log: Log
    epochs: LeaderEpochCache


class LogBackend:
    """One node's partitions as local Logs (see the module docstring)."""

    def __init__(self, data_dir: str, *, node_id: int = 0, cluster_id: str = "raykafka-local",
                 leader_epoch: int = 0, config: LogConfig | None = None,
                 on_append: Callable[[str, int], None] | None = None):
        self.data_dir = data_dir
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.epoch = leader_epoch
        self.config = config or LogConfig()
        self.on_append = on_append
        self.endpoint = BrokerEndpoint(node_id, "127.0.0.1", 0)
        self._lock = threading.Lock()
        self._topics: dict[str, list[_Partition]] = {}
        os.makedirs(data_dir, exist_ok=True)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        validate_topic_name(name)
        with self._lock:
            if name in self._topics:
                return
            parts = []
            for i in range(partitions):
                log = Log.open(os.path.join(self.data_dir, f"{name}-{i}"), self.config)
                epochs = LeaderEpochCache(log.path, log)
                epochs.assign(self.epoch, log.log_end_offset)
                parts.append(_Partition(log, epochs))
            self._topics[name] = parts

    def close(self) -> None:
        with self._lock:
            for parts in self._topics.values():
                for p in parts:
                    p.log.close()
            self._topics.clear()

    def _partition(self, topic: str, partition: int) -> _Partition:
        parts = self._topics.get(topic)
        if parts is None or not 0 <= partition < len(parts):
            raise UnknownTopicOrPartitionError(f"{topic}-{partition} is not on node "
                                               f"{self.node_id}")
        return parts[partition]

    def log(self, topic: str, partition: int) -> Log:
        return self._partition(topic, partition).log

    # -- metadata ---------------------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        return [self.endpoint]

    def controller_id(self) -> int:
        return self.node_id

    def topics(self) -> list[str]:
        return list(self._topics)

    def partitions(self, topic: str) -> list[PartitionMetadata] | None:
        parts = self._topics.get(topic)
        if parts is None:
            return None
        me = (self.node_id,)
        return [PartitionMetadata(i, self.node_id, self.epoch, me, me) for i in range(len(parts))]

    def leader_epoch(self, topic: str, partition: int) -> int:
        self._partition(topic, partition)
        return self.epoch

    # -- data -------------------------------------------------------------------------------
    def append(self, topic: str, partition: int, records, *, acks: int,
               timeout_ms: int) -> ProduceResult:
        log = self._partition(topic, partition).log
        result = log.append(records, leader_epoch=self.epoch, validate_records=True)
        if self.on_append is not None:
            self.on_append(topic, partition)
        return ProduceResult(result.base_offset, result.last_offset,
                             result.log_append_time_ms, log.log_start_offset)

    def linked(self, topic: str, partition: int) -> bool:
        return True                      # appends are to a Log in this process

    def has_records(self, topic: str, partition: int, offset: int, *,
                    replica_id: int) -> bool | None:
        try:
            log = self._partition(topic, partition).log
        except KafkaError:
            return None                  # the read answers the error
        end = log.log_end_offset
        return end > offset if log.log_start_offset <= offset <= end else None

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *,
             replica_id: int, isolation_level: int,
             cached_only: bool = False) -> FetchResult:
        log = self._partition(topic, partition).log
        end = log.log_end_offset        # the high watermark: this node is the whole ISR
        data = log.read(offset, max_bytes, max_offset=end)
        return FetchResult(data, end, log.log_start_offset, end)

    def list_offset(self, topic: str, partition: int, timestamp: int, *,
                    isolation_level: int, from_follower: bool = False) -> tuple[int, int]:
        log = self._partition(topic, partition).log
        return list_offset_in_log(log, timestamp, log.log_end_offset)

    def end_offset_for_epoch(self, topic: str, partition: int,
                             leader_epoch: int) -> EpochEndOffset:
        p = self._partition(topic, partition)
        epoch, end = p.epochs.end_offset_for(leader_epoch, p.log.log_end_offset)
        return EpochEndOffset(epoch, end)


class FileProducerIds:
    """Producer ids for InitProducerId without ZooKeeper: blocks of ``block_size`` reserved
    in the file ``path`` (the last id of the last block, written atomically before any id
    of the block is handed out), so a restart never hands an id out twice. Thread-safe."""

    def __init__(self, path: str, block_size: int = 1000):
        self.path = path
        self.block_size = block_size
        self._lock = threading.Lock()
        self._next, self._end = 0, -1

    def generate(self) -> int:
        with self._lock:
            if self._next > self._end:
                last = read_offset(self.path)
                start = 0 if last is None else last + 1
                write_offset(self.path, start + self.block_size - 1)
                self._next, self._end = start, start + self.block_size - 1
            pid = self._next
            self._next += 1
            return pid


class LocalBroker:
    """A single-process broker: ``LocalBroker(data_dir).start()``, then ``bootstrap``
    (``host:port``) for any Kafka client; ``close()`` stops it. InitProducerId hands out
    ids reserved in ``<data_dir>/latest-producer-id-block`` (FileProducerIds)."""

    def __init__(self, data_dir: str, *, config: SocketServerConfig | None = None,
                 node_id: int = 0, log_config: LogConfig | None = None,
                 security: ListenerSecurity | None = None):
        self.backend = LogBackend(data_dir, node_id=node_id, config=log_config)
        ids = FileProducerIds(os.path.join(data_dir, "latest-producer-id-block"))
        self.apis = KafkaApis(self.backend, producers=ProducerIdApis(ids.generate))
        self.backend.on_append = self.apis.notify
        self.server = SocketServer(self.apis, config, security=security)

    def start(self) -> "LocalBroker":
        self.server.start()
        self.backend.endpoint = BrokerEndpoint(self.backend.node_id, self.server.host,
                                               self.server.port)
        return self

    @property
    def bootstrap(self) -> str:
        return f"{self.server.host}:{self.server.port}"

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.backend.create_topic(name, partitions)

    def close(self) -> None:
        self.server.close()
        self.apis.close()
        self.backend.close()

    def __enter__(self) -> "LocalBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["LogBackend", "LocalBroker", "FileProducerIds", "list_offset_in_log"]
