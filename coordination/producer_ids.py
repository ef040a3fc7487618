"""Producer ids for idempotent producers, handed out from blocks reserved in ZooKeeper.

Kafka's ZkProducerIdManager: ``/latest_producer_id_block`` holds the last block reserved
(zk_layout.ProducerIdBlock). A broker reserves the next ``block_size`` (1000) ids by a
conditional set of that znode at the version it read (creating it for the first block);
a conflict means another broker reserved one meanwhile, so it reads again. Ids of a block
are handed out by this broker only, so every id is unique across the cluster and across
restarts (a restarted broker reserves a new block; the rest of its old one is skipped).

Errors: ZkUnavailableError when ZooKeeper does not answer (its reads are retried under
``retry``), VersionConflictError after ``max_attempts`` lost races, ZkDataError when the
znode holds something else. Thread-safe (one lock around the block).
"""

from __future__ import annotations

import threading

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordination import zk_layout as L
from coordination.errors import VersionConflictError, ZkDataError
from coordination.retry import DEFAULT_RETRY, RetryPolicy

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = (1 << 63) - 1


class ProducerIdManager:
    """Hands out producer ids of this broker's current block; reserves the next block when
    it is used up (see the module docstring)."""

    def __init__(self, zk, broker_id: int, *, block_size: int = BLOCK_SIZE,
                 max_attempts: int = 20, retry: RetryPolicy = DEFAULT_RETRY):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.zk = zk
        self.broker_id = broker_id
        self.block_size = block_size
        self.max_attempts = max_attempts
        self.retry = retry
        self._lock = threading.Lock()
        self._next = 0
        self._end = -1                       # the current block is [.., _end]; none yet

    def generate(self) -> int:
        """The next unused producer id (a ZooKeeper round trip once per block)."""
        with self._lock:
            if self._next > self._end:
                block = self._reserve()
                self._next, self._end = block.block_start, block.block_end
            pid = self._next
            self._next += 1
            return pid

    def _reserve(self) -> L.ProducerIdBlock:
        path = L.PRODUCER_ID_BLOCK_PATH
        for _ in range(self.max_attempts):
            try:
                data, stat = self.retry.run(lambda: self.zk.get(path))
            except NoNodeError:
                data, stat = None, None
            start = 0
            if data:
                last = L.ProducerIdBlock.from_bytes(data)
                start = last.block_end + 1
            end = start + self.block_size - 1
            if end > MAX_PRODUCER_ID:
                raise ZkDataError(f"{path}: producer ids are exhausted (next block would "
                                  f"end at {end})")
            block = L.ProducerIdBlock(self.broker_id, start, end)
            try:
                if stat is None:
                    self.zk.create(path, block.to_bytes(), makepath=True)
                else:
                    self.zk.set(path, block.to_bytes(), version=stat.version)
                return block
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue                  # another broker won the race: read again
        raise VersionConflictError(path, -1)


__all__ = ["ProducerIdManager", "BLOCK_SIZE"]
