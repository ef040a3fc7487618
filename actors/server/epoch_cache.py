"""LeaderEpochCache: which leader epoch started at which offset of one partition replica's log
(Kafka's LeaderEpochFileCache, KIP-101).

Contract:
- ``entries`` is a list of ``(epoch, start_offset)`` with strictly increasing epochs and
  non-decreasing start offsets: epoch ``e`` wrote the offsets ``[start_e, start_next)``.
- A leader calls ``assign(epoch, its log end offset)`` when it takes leadership; a follower
  calls ``assign(batch.partition_leader_epoch, batch.base_offset)`` for the batches it
  appends. An assign whose epoch is not newer than the latest is ignored (a batch of the
  current epoch adds nothing), so appends can call it for every batch.
- ``end_offset_for(epoch, log_end_offset)`` answers OffsetsForLeaderEpoch: the largest epoch
  <= ``epoch`` this cache knows and the offset where the next epoch starts (the log end for
  the latest epoch): a follower truncates to that (KIP-101, KIP-279).
- Truncating the log truncates the cache with it: ``truncate_from_end(offset)`` after
  ``Log.truncate_to(offset)``; ``truncate_from_start(offset)`` when the log start moves.

File ``<partition dir>/leader-epoch-checkpoint``, Kafka's text format::

    0                 <- version
    2                 <- number of entries
    0 0               <- "epoch start_offset", one line each
    3 1200

rewritten atomically (temp file, fsync, rename) on every change. It is derived data: when it
is missing or unreadable, it is rebuilt from the partition leader epochs stamped in the log's
batch headers (``rebuild``). Thread-safe (one lock around the list and the file).
"""

from __future__ import annotations

import bisect
import logging
import os
import threading

from storage.checkpoint import write_atomic
from storage.records import iter_headers

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0
_REBUILD_READ_BYTES = 16 << 20


class LeaderEpochCache:
    """The epoch -> start offset map of one replica (see the module docstring)."""

    def __init__(self, partition_dir: str, log=None):
        self.path = os.path.join(partition_dir, CHECKPOINT_FILE)
        self._lock = threading.Lock()
        self._epochs: list[int] = []
        self._starts: list[int] = []
        loaded = self._read()
        if loaded is None and log is not None:
            self.rebuild(log)
        elif loaded is not None:
            self._epochs = [e for e, _ in loaded]
            self._starts = [o for _, o in loaded]

    # -- reading ------------------------------------------------------------------------------
    @property
    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int:
        with self._lock:
            return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, where the epoch after it starts); the log end
        for the latest epoch; (UNDEFINED, UNDEFINED) for an undefined epoch or one newer
        than any known. An epoch older than every known one answers (epoch, the first
        known start offset): nothing before it can be trusted (Kafka's rule)."""
        with self._lock:
            if epoch == UNDEFINED_EPOCH or not self._epochs:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if epoch == self._epochs[-1]:
                return epoch, log_end_offset
            higher = bisect.bisect_right(self._epochs, epoch)
            if higher >= len(self._epochs):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if higher == 0:
                return epoch, self._starts[0]
            return self._epochs[higher - 1], self._starts[higher]

    # -- changing -----------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; False (ignored) unless the epoch
        is newer than the latest. A start offset below the latest one's is a bug upstream
        (the log would have been truncated first): refused loudly."""
        if epoch < 0 or start_offset < 0:
            return False
        with self._lock:
            if self._epochs and epoch <= self._epochs[-1]:
                return False
            if self._starts and start_offset < self._starts[-1]:
                raise ValueError(f"{self.path}: epoch {epoch} cannot start at {start_offset}, "
                                 f"before epoch {self._epochs[-1]} at {self._starts[-1]}")
            self._epochs.append(epoch)
            self._starts.append(start_offset)
            self._write_locked()
            return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was cut there)."""
        with self._lock:
            keep = bisect.bisect_left(self._starts, end_offset)
            if keep < len(self._starts):
                del self._epochs[keep:], self._starts[keep:]
                self._write_locked()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: the epoch holding it starts there, and
        older epochs go."""
        with self._lock:
            i = bisect.bisect_right(self._starts, start_offset) - 1
            if i < 0:
                return
            changed = i > 0 or self._starts[i] != start_offset
            del self._epochs[:i], self._starts[:i]
            self._starts[0] = start_offset
            if changed:
                self._write_locked()

    def clear(self) -> None:
        with self._lock:
            self._epochs.clear()
            self._starts.clear()
            self._write_locked()

    def rebuild(self, log) -> None:
        """Rebuild from the partition leader epochs in ``log``'s batch headers (the file was
        missing or unreadable), then write the file."""
        epochs: list[int] = []
        starts: list[int] = []
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            data = log.read(offset, _REBUILD_READ_BYTES, check_crc=False)
            if not data:
                break
            for h in iter_headers(data, check_crc=False):
                epoch = h.partition_leader_epoch
                if epoch >= 0 and (not epochs or epoch > epochs[-1]):
                    epochs.append(epoch)
                    starts.append(h.base_offset)
                offset = h.next_offset
        with self._lock:
            self._epochs, self._starts = epochs, starts
            self._write_locked()

    # -- the file -----------------------------------------------------------------------------
    def _read(self) -> list[tuple[int, int]] | None:
        try:
            with open(self.path) as f:
                lines = [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s unreadable (%s): rebuilding it from the log", self.path, exc)
            return None
        try:
            if int(lines[0]) != _VERSION or int(lines[1]) != len(lines) - 2:
                raise ValueError("bad version or count")
            out = [tuple(int(x) for x in line.split()) for line in lines[2:]]
            if any(len(e) != 2 for e in out):
                raise ValueError("an entry is not 'epoch offset'")
            for (e0, o0), (e1, o1) in zip(out, out[1:]):
                if e1 <= e0 or o1 < o0:
                    raise ValueError("entries out of order")
            return [(e, o) for e, o in out]
        except (ValueError, IndexError) as exc:
            log.warning("%s is corrupt (%s): rebuilding it from the log", self.path, exc)
            return None

    def _write_locked(self) -> None:
        body = "".join(f"{e} {o}\n" for e, o in zip(self._epochs, self._starts))
        write_atomic(self.path, f"{_VERSION}\n{len(self._epochs)}\n{body}")

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.path!r}, {self.entries})"
