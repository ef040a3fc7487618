"""The partition Log: an ordered list of segments, appended at the end, read anywhere.

Directory layout (one directory per partition replica)::

    00000000000000000000.log / .index / .timeindex     one segment per base offset
    00000000000000000000.snapshot                     producer state below that offset
                                                      (storage/producer_state.py), written
                                                      at each roll and at close
    recovery-point-offset-checkpoint                  offsets below are known flushed
    log-start-offset-checkpoint                       first offset a reader may ask for
    .clean_shutdown                                   written by close(), removed by open()
    .lock                                             flock held while the log is open

Invariants:
    log_start_offset <= log_end_offset
    segments[i].base_offset < segments[i+1].base_offset
    recovery_point <= log_end_offset

Thread safety: appends, truncation, retention and compaction swaps serialise on one lock;
reads take no lock. A read works on an immutable snapshot of the segment list (copy on write)
and each segment bounds its reads by the size it had published, so a reader never sees a
partial batch, and never fails because retention or the cleaner removed a segment meanwhile.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import fcntl
import os
import struct
import threading
import time
from typing import Callable, NamedTuple

from . import records as records_mod
from .checkpoint import fsync_dir, write_offset
from .config import LogConfig
from .errors import (CorruptRecordError, InvalidRecordError, KafkaStorageError,
                     OffsetOutOfRangeError, RecordTooLargeError)
from .cleaner import CleanResult, clean
from .legacy import to_v2
from .loader import load, swap_range_path
from .producer_state import ProducerBatch, ProducerStateManager, last_sequence
from .records import (MAGIC_POS, BatchHeader, assign_offsets, check_batch_crc,
                      iter_headers)
from .segment import INT32_MAX, BatchInfo, LogSegment

CLEAN_SHUTDOWN = ".clean_shutdown"
# Leader appends at least this large check CRCs in a helper thread, overlapped with the write.
OVERLAPPED_CRC_MIN_BYTES = 256 * 1024
_crc_pool = None
_crc_pool_lock = threading.Lock()


def _start_crc_check(buf, headers: list[BatchHeader]):
    """Start checking the CRCs of ``headers`` in ``buf``; returns a callable that waits for
    the result (raising CorruptRecordError on a mismatch)."""
    global _crc_pool
    if _crc_pool is None:
        with _crc_pool_lock:
            if _crc_pool is None:
                _crc_pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="log-crc")

    def check():
        for h in headers:
            check_batch_crc(buf, h)
    return _crc_pool.submit(check).result


RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START = "log-start-offset-checkpoint"
LOCK = ".lock"

_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch


class _View(NamedTuple):
    """What a reader needs, swapped in as one object so it is always self-consistent."""

    segments: tuple[LogSegment, ...]
    bases: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    # the last append's batches as written, (their base offset, bytes), while they end the
    # log: last_appended() hands them out without reading the file back
    last: tuple[int, bytes] | None = None


LAST_APPEND_KEEP_BYTES = 64 * 1024     # a larger append is read back from the file


def _now_ms() -> int:
    return int(time.time() * 1000)


class AppendResult(tuple):
    """What ``Log.append`` returns: ``(base_offset, last_offset)`` as a plain 2-tuple, plus
    ``log_append_time_ms``, the timestamp the log stamped into the batches of a LogAppendTime
    topic (-1 for CreateTime), so a leader answers the producer with the stored value."""

    def __new__(cls, base_offset: int, last_offset: int, log_append_time_ms: int = -1,
                duplicate: bool = False):
        self = super().__new__(cls, (base_offset, last_offset))
        self.log_append_time_ms = log_append_time_ms
        self.duplicate = duplicate     # an idempotent producer's retry: nothing was written
        return self

    def __getnewargs__(self):
        return (self[0], self[1], self.log_append_time_ms, self.duplicate)

    @property
    def base_offset(self) -> int:
        return self[0]

    @property
    def last_offset(self) -> int:
        return self[1]


class Log:
    """A partition's log on local disk. Open with ``Log.open(path, config)``."""

    def __init__(self, path: str, config: LogConfig, *, clock: Callable[[], int] = _now_ms):
        self.path = path
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._lock_fd = -1
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._unflushed_segments: list[LogSegment] = []
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self.recovered = False
        self.truncated_bytes = 0
        self._view = _View((), (), 0, 0)
        self.recovery_point = 0
        self.producer_state = ProducerStateManager(path)
        self._pending_producer_batches: list[ProducerBatch] = []

    # -- opening and closing ------------------------------------------------------------
    @classmethod
    def open(cls, path: str, config: LogConfig | None = None, *,
             clock: Callable[[], int] = _now_ms) -> "Log":
        """Open (creating if needed) the log in ``path``, recovering after a crash."""
        config = config or LogConfig()
        if not isinstance(config, LogConfig):
            config = LogConfig.from_properties(config)
        os.makedirs(path, exist_ok=True)
        log = cls(path, config, clock=clock)
        log._take_dir_lock()
        try:
            log._load()
        except BaseException:
            log._release_dir_lock()
            raise
        return log

    def _take_dir_lock(self) -> None:
        fd = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise KafkaStorageError(f"log directory {self.path} is in use by another Log") from None
        self._lock_fd = fd

    def _release_dir_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _load(self) -> None:
        result = load(self.path, config=self.config,
                      clean_marker=self._file(CLEAN_SHUTDOWN),
                      recovery_point_file=self._file(RECOVERY_POINT),
                      log_start_file=self._file(LOG_START))
        self.recovered = result.recovered
        self.truncated_bytes = result.truncated_bytes
        segments = result.segments
        segments[-1].created_ms = self._clock()  # segment.ms counts by the log's clock
        leo = segments[-1].next_offset
        log_start = min(result.log_start_offset, leo)
        self._publish(segments, log_start, leo)
        self.recovery_point = leo if result.recovered else min(result.recovery_point, leo)
        if result.recovered:
            write_offset(self._file(RECOVERY_POINT), self.recovery_point)
        write_offset(self._file(LOG_START), log_start)
        self.producer_state.load(log_start, leo, self._producer_batches_from)
        marker = self._file(CLEAN_SHUTDOWN)
        if os.path.exists(marker):
            os.unlink(marker)  # from now on a crash must trigger recovery
            fsync_dir(self.path)

    def close(self) -> None:
        """Flush everything, leave the clean-shutdown marker, release the directory."""
        with self._lock:
            if self._closed:
                return
            self.flush()
            self.producer_state.take_snapshot(self.log_end_offset)
            for seg in self._view.segments:
                seg.close()
            for _, seg in self._pending_deletes:
                seg.delete()
            self._pending_deletes.clear()
            with open(self._file(CLEAN_SHUTDOWN), "w"):
                pass
            fsync_dir(self.path)
            self._closed = True
            self._release_dir_lock()

    def update_config(self, config: LogConfig) -> None:
        """Apply new settings in place, without closing: later appends, rolls, flushes and
        upkeep use them; segments already written keep their index interval (as Kafka's)."""
        if not isinstance(config, LogConfig):
            config = LogConfig.from_properties(config)
        with self._lock:
            self._check_open()
            self.config = config

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.path} is closed")

    def _producer_batches_from(self, offset: int):
        """The idempotent producers' batches of the log from ``offset`` on (state rebuilt
        after a snapshot); a bad batch ends the replay (recovery has cut the tail)."""
        for seg in self._view.segments:
            if seg.next_offset <= offset:
                continue
            try:
                first = seg.translate_offset(offset) if seg.base_offset < offset else None
                start = first.position if first is not None else 0
                for h in seg.scan_headers(start):
                    if h.producer_id >= 0 and h.last_offset >= offset:
                        yield ProducerBatch(
                            h.producer_id, h.producer_epoch, h.base_sequence,
                            last_sequence(h.base_sequence, h.last_offset_delta),
                            h.base_offset, h.last_offset, h.max_timestamp)
            except CorruptRecordError:
                return

    def _publish(self, segments, log_start: int, leo: int) -> None:
        segs = tuple(segments)
        self._view = _View(segs, tuple(s.base_offset for s in segs), log_start, leo)

    # -- state --------------------------------------------------------------------------
    def last_appended(self, offset: int) -> tuple[bytes, int] | None:
        """(the bytes, the offset after them) of the last append when it starts at
        ``offset`` and still ends the log, else None: the batches just written, as they
        are in the file, without reading them back (the local channel pushes each append
        to the broker). Lock-free, like every read."""
        v = self._view
        if v.last is None or v.last[0] != offset:
            return None
        return v.last[1], v.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._view.log_end_offset

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._view.segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._view.segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._view.segments)

    def __repr__(self) -> str:
        v = self._view
        return (f"Log({self.path!r}, log_start_offset={v.log_start_offset}, "
                f"log_end_offset={v.log_end_offset}, segments={len(v.segments)})")

    # -- appending ------------------------------------------------------------------------
    def append(self, records, *, assign_offsets: bool = True, leader_epoch: int | None = None,
               validate_records: bool = False) -> AppendResult:
        """Append one or more whole batches; returns (base_offset, last_offset) of them, an
        AppendResult that also carries the LogAppendTime it stamped (-1 for CreateTime).

        As a leader (``assign_offsets=True``) the log gives the batches consecutive offsets
        from its end, stamps ``leader_epoch`` when given, and for LogAppendTime topics sets
        the max timestamp to now (re-checksumming). As a follower (False) the batches keep
        their offsets, which must start at or after the log end and increase.
        Legacy v0/v1 message sets are up-converted to v2 first. Nothing is written unless
        every batch is valid: framing and CRC always; every record too with
        ``validate_records`` (a leader taking a client's request) and on compacted topics,
        which refuse records without a key.
        """
        buf = records if isinstance(records, (bytes, bytearray, memoryview)) else None
        if buf is None:
            raise InvalidRecordError(f"records must be bytes-like, not {type(records).__name__}")
        if len(buf) > MAGIC_POS and buf[MAGIC_POS] in (0, 1):
            buf = to_v2(bytes(buf))
        if len(buf) == 0:
            raise InvalidRecordError("an append needs at least one record batch")
        config = self.config
        overlap_crc = False
        if validate_records or (assign_offsets and config.compact):
            # every record walked and checked in place, CRCs included: no records or columns
            # are built, and the batches are not walked or checksummed a second time
            headers, found = records_mod.checked_batches(buf)
            if assign_offsets and config.compact and found.null_keys:
                raise InvalidRecordError(
                    f"compacted topic cannot accept a record without a key "
                    f"({found.null_keys} of {found.records} records have none)")
        else:
            # A large leader append checks its CRCs in another thread while its bytes are
            # written (see _write): the check costs about a quarter of the append otherwise.
            overlap_crc = (assign_offsets and not config.log_append_time
                           and len(buf) >= OVERLAPPED_CRC_MIN_BYTES)
            headers = list(iter_headers(buf, check_crc=not overlap_crc))
        with self._lock:
            self._check_open()
            for h in headers:
                if h.size > config.max_message_bytes:
                    raise RecordTooLargeError(
                        f"batch of {h.size} bytes at offset position {h.position} exceeds "
                        f"max.message.bytes={config.max_message_bytes}")
                if h.size > config.segment_bytes:
                    raise RecordTooLargeError(
                        f"batch of {h.size} bytes exceeds segment.bytes={config.segment_bytes}")
            now = self._clock()
            if assign_offsets:
                chunks, infos = self._assign(buf, headers, leader_epoch, now,
                                             config.log_append_time)
            else:
                chunks, infos = self._keep(buf, headers, leader_epoch)
            batches = _producer_batches(headers, infos, now if assign_offsets
                                        and config.log_append_time else None)
            updates = None
            if batches:
                # a leader checks a client's batches (KIP-98); a follower's are applied
                updates, duplicate = self.producer_state.prepare(
                    batches, validate=assign_offsets, total_batches=len(headers))
                if duplicate is not None:       # a retry: the original offsets, no write
                    first, last = duplicate
                    return AppendResult(first.first_offset, last.last_offset,
                                        first.timestamp if config.log_append_time else -1,
                                        duplicate=True)
                self._pending_producer_batches = batches
            verify = _start_crc_check(buf, headers) if overlap_crc else None
            try:
                self._write(chunks, infos, now, verify)
            finally:
                self._pending_producer_batches = []
            if updates:
                self.producer_state.commit(updates)
            self._unflushed_messages += sum(h.records_count for h in headers)
            self._maybe_flush(now)
            return AppendResult(infos[0].base_offset, infos[-1].last_offset,
                                now if assign_offsets and config.log_append_time else -1)

    def _assign(self, buf, headers: list[BatchHeader], leader_epoch, now, log_append_time):
        mv = memoryview(buf)
        next_offset = self.log_end_offset
        chunks, infos = [], []
        for h in headers:
            if h.records_count <= 0 or h.records_count != h.last_offset_delta + 1:
                raise InvalidRecordError(
                    f"batch at position {h.position}: records_count {h.records_count} does not "
                    f"match last_offset_delta {h.last_offset_delta} + 1")
            batch = mv[h.position:h.position + h.size]
            if log_append_time:
                chunks.append(assign_offsets(batch, next_offset, log_append_time_ms=now,
                                             partition_leader_epoch=leader_epoch))
                max_ts = now
            else:
                epoch = h.partition_leader_epoch if leader_epoch is None else leader_epoch
                # base offset and leader epoch sit before the CRC'd range: rewrite in place
                chunks.append(_PREFIX.pack(next_offset, h.batch_length, epoch))
                chunks.append(batch[_PREFIX.size:])
                max_ts = h.max_timestamp
            last = next_offset + h.last_offset_delta
            infos.append(BatchInfo(next_offset, last, max_ts, h.size))
            next_offset = last + 1
        return chunks, infos

    def _keep(self, buf, headers: list[BatchHeader], leader_epoch):
        mv = memoryview(buf)
        expected = self.log_end_offset
        chunks, infos = [], []
        for h in headers:
            if h.base_offset < expected:
                raise InvalidRecordError(
                    f"batch with base offset {h.base_offset} does not follow offset "
                    f"{expected - 1} (log end offset {self.log_end_offset})")
            batch = mv[h.position:h.position + h.size]
            if leader_epoch is not None:
                chunks.append(_PREFIX.pack(h.base_offset, h.batch_length, leader_epoch))
                chunks.append(batch[_PREFIX.size:])
            else:
                chunks.append(batch)
            infos.append(BatchInfo(h.base_offset, h.last_offset, h.max_timestamp, h.size))
            expected = h.next_offset
        return chunks, infos

    def _write(self, chunks: list, infos: list[BatchInfo], now: int, verify=None) -> None:
        """Write batches to the active segment, rolling first whenever the next batch would
        not fit (size, age or the int32 relative-offset range).

        ``verify`` (the pending CRC check of an overlapped append) must pass before anything
        becomes visible: it goes with the write when the batches fit in the active segment,
        and is waited for before any byte is written when they need a roll.
        """
        # chunks hold one or two pieces per batch; walk them alongside infos
        per_batch = len(chunks) // len(infos)
        start = 0
        group_chunks: list = []
        group_infos: list[BatchInfo] = []
        pending = 0
        for i, info in enumerate(infos):
            pieces = chunks[start:start + per_batch]
            start += per_batch
            active = self.active_segment
            if self._should_roll(active, pending, info, now):
                if verify is not None:
                    verify()
                    verify = None
                if group_infos:
                    active.append(group_chunks, group_infos)
                    group_chunks, group_infos, pending = [], [], 0
                if active.size > 0:
                    self._roll(info.base_offset)
            group_chunks.extend(pieces)
            group_infos.append(info)
            pending += info.size
        self.active_segment.append(group_chunks, group_infos, verify)
        size = sum(len(c) for c in chunks)
        last = (infos[0].base_offset, b"".join(chunks)) \
            if size <= LAST_APPEND_KEEP_BYTES else None
        self._view = self._view._replace(log_end_offset=infos[-1].last_offset + 1, last=last)

    def _should_roll(self, active: LogSegment, pending: int, info: BatchInfo, now: int) -> bool:
        size = active.size + pending
        if size == 0:
            return False
        return (size + info.size > self.config.segment_bytes
                or now - active.created_ms >= self.config.segment_ms
                or info.last_offset - active.base_offset > INT32_MAX)

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end (no-op when the active one is empty)."""
        with self._lock:
            self._check_open()
            if self.active_segment.size == 0:
                return self.active_segment
            return self._roll(self.log_end_offset)

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.active_segment
        old.seal()
        # the producer state below the new segment, as Kafka snapshots it at every roll
        self.producer_state.take_snapshot(base_offset, self._pending_producer_batches)
        self._unflushed_segments.append(old)
        new = LogSegment(self.path, base_offset, create=True,
                         index_interval_bytes=self.config.index_interval_bytes)
        new.created_ms = self._clock()
        v = self._view
        self._publish(v.segments + (new,), v.log_start_offset, v.log_end_offset)
        return new

    # -- flushing -------------------------------------------------------------------------
    def _maybe_flush(self, now: int) -> None:
        c = self.config
        if (c.flush_messages is not None and self._unflushed_messages >= c.flush_messages) or \
                (c.flush_ms is not None and now - self._last_flush_ms >= c.flush_ms):
            self.flush()

    def maybe_flush(self) -> None:
        """Flush if flush.ms has passed since the last flush (call periodically)."""
        with self._lock:
            if not self._closed and self._unflushed_messages:
                self._maybe_flush(self._clock())

    def flush(self) -> None:
        """fsync every unflushed segment and move the recovery point to the log end."""
        with self._lock:
            self._check_open()
            for seg in self._unflushed_segments:
                if seg in self._view.segments:
                    seg.flush()
            self._unflushed_segments.clear()
            self.active_segment.flush()
            self.recovery_point = self.log_end_offset
            write_offset(self._file(RECOVERY_POINT), self.recovery_point)
            self._unflushed_messages = 0
            self._last_flush_ms = self._clock()

    # -- reading --------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int = 1 << 20, *, max_offset: int | None = None,
             check_crc: bool = True) -> bytes:
        """Whole batches from the one holding ``offset``: about ``max_bytes`` of them, but at
        least one whole batch however large; none whose last offset reaches ``max_offset``
        (a high watermark). ``offset == log_end_offset`` gives b"". Every batch returned has
        passed its CRC check; a corrupt one raises CorruptRecordError, never is served."""
        v = self._view
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise OffsetOutOfRangeError(f"offset must be an integer, got {offset!r}")
        if offset < v.log_start_offset or offset > v.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range [{v.log_start_offset}, {v.log_end_offset}] "
                f"of {self.path}")
        if offset == v.log_end_offset or max_bytes < 0:
            return b""
        i = max(bisect.bisect_right(v.bases, offset) - 1, 0)
        for seg in v.segments[i:]:
            data = seg.read(max(offset, seg.base_offset), max_bytes, max_offset=max_offset,
                            check_crc=check_crc)
            if data:
                return data
            if max_offset is not None and seg.next_offset >= max_offset:
                break
        return b""

    def _checked_range(self, start, end) -> _View:
        """The current view, once [start, end) is checked to be a range of offsets within
        it (OffsetOutOfRangeError otherwise)."""
        v = self._view
        for name, value in (("start", start), ("end", end)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise OffsetOutOfRangeError(f"{name} must be an integer, got {value!r}")
        if not v.log_start_offset <= start <= end <= v.log_end_offset:
            raise OffsetOutOfRangeError(
                f"[{start}, {end}) is not a range within [{v.log_start_offset}, "
                f"{v.log_end_offset}] of {self.path}")
        return v

    def count_records(self, start: int, end: int, *, max_batches: int | None = None
                      ) -> int | None:
        """How many records have offsets in [start, end), control batches left out (what
        a reader of that range gets): from the batch headers, without reading the
        records, except in the (at most two) batches the bounds cut, which are decoded.
        None when that takes more than ``max_batches`` headers. Exact on compacted logs
        too (a cleaned batch's records_count is what it kept). OffsetOutOfRangeError for
        bounds outside the log."""
        v = self._checked_range(start, end)
        total = seen = 0
        i = max(bisect.bisect_right(v.bases, start) - 1, 0)
        for seg in v.segments[i:]:
            if seg.base_offset >= end:
                break
            first = seg.translate_offset(max(start, seg.base_offset))
            if first is None:
                continue
            for h in seg.scan_headers(first.position):
                if h.base_offset >= end:
                    break
                seen += 1
                if max_batches is not None and seen > max_batches:
                    return None
                if h.last_offset < start or h.attributes & records_mod.CONTROL_MASK:
                    continue
                if start <= h.base_offset and h.last_offset < end:
                    total += h.records_count
                else:                   # cut by a bound: which of its records are inside
                    offsets = records_mod.numbers_view(records_mod.decode_columns(
                        seg.pread(h.size, h.position))["offset"])
                    total += int(((offsets >= start) & (offsets < end)).sum())
        return total

    def file_ranges(self, start: int, end: int) -> list[tuple[str, int, int, int]]:
        """Where the whole batches holding offsets [start, end) are in the segment files,
        one ``(log file path, position, size, base offset of its first batch)`` per
        segment: what a reader on this machine may ``pread`` instead of fetching. The
        first batch may begin before ``start`` and the last end after ``end`` (a reader
        drops those records). ``end`` must not pass what may be read (a leader's high
        watermark: every batch below it is whole on disk and never truncated). The
        positions are those at the call: a segment deleted or compacted since is gone
        from its path or rewritten, which a reader detects (file missing, base offset or
        framing wrong) and then fetches instead. OffsetOutOfRangeError for bounds
        outside the log."""
        v = self._checked_range(start, end)
        out = []
        i = max(bisect.bisect_right(v.bases, start) - 1, 0)
        for seg in v.segments[i:]:
            if seg.base_offset >= end:
                break
            size = seg.size                     # appends past it are not ours to read
            first = seg.translate_offset(max(start, seg.base_offset), end=size)
            if first is None or first.base_offset >= end:
                continue
            after = seg.translate_offset(end, end=size)   # first batch reaching ``end``
            if after is None:
                stop = size
            elif after.base_offset < end:       # holds end - 1 too: read it whole
                stop = after.position + after.size
            else:
                stop = after.position
            out.append((seg.log_path, first.position, stop - first.position,
                        first.base_offset))
        return out

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms`` (None if none)."""
        v = self._view
        for seg in v.segments:
            if seg.max_timestamp < timestamp_ms:
                continue
            header = seg.find_offset_by_timestamp(timestamp_ms)
            if header is None:
                continue
            offset = _first_record_at_or_after(seg, header, timestamp_ms)
            return max(offset, v.log_start_offset)
        return None

    def offsets_before(self, time_ms: int, max_offsets: int = 1) -> list[int]:
        """The seed's getOffsetsBefore: up to ``max_offsets`` segment start offsets (descending)
        of segments whose newest record is at or before ``time_ms``; the log end offset counts
        as a segment boundary stamped now. ``-1`` means latest, ``-2`` earliest."""
        if max_offsets < 1:
            raise OffsetOutOfRangeError(f"max_offsets must be at least 1, got {max_offsets}")
        v = self._view
        # an empty segment has no newest record: stamp it with its creation (the seed's mtime)
        pairs = [(max(s.base_offset, v.log_start_offset),
                  s.max_timestamp if s.size else s.created_ms) for s in v.segments]
        if v.segments[-1].size > 0:
            pairs.append((v.log_end_offset, self._clock()))
        if time_ms == -1:
            start = len(pairs) - 1
        elif time_ms == -2:
            start = 0
        else:
            start = len(pairs) - 1
            while start >= 0 and pairs[start][1] > time_ms:
                start -= 1
        out = []
        while start >= 0 and len(out) < max_offsets:
            if not out or pairs[start][0] < out[-1]:
                out.append(pairs[start][0])
            start -= 1
        return out

    # -- truncation and deletion ----------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or after ``offset`` (a batch holding it goes whole); returns
        the new log end offset. Used by a follower that diverged from its leader."""
        with self._lock:
            self._check_open()
            v = self._view
            if offset >= v.log_end_offset:
                return v.log_end_offset
            if offset <= v.segments[0].base_offset or offset < v.log_start_offset:
                self.truncate_fully_and_start_at(offset)
                return offset
            keep = [s for s in v.segments if s.base_offset < offset]
            for seg in v.segments[len(keep):]:
                self._schedule_delete(seg)
            keep[-1].truncate_to(offset)
            leo = keep[-1].next_offset
            log_start = min(v.log_start_offset, leo)
            self._publish(keep, log_start, leo)
            if log_start != v.log_start_offset:
                write_offset(self._file(LOG_START), log_start)
            if self.recovery_point > leo:
                self.recovery_point = leo
                write_offset(self._file(RECOVERY_POINT), leo)
            self._unflushed_segments = [s for s in self._unflushed_segments if s in keep]
            # the truncated batches' producer state goes: reload below the new end
            self.producer_state.load(log_start, leo, self._producer_batches_from)
            return leo

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log empty at ``offset``."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot start a log at negative offset {offset}")
        with self._lock:
            self._check_open()
            for seg in self._view.segments:
                self._schedule_delete(seg)
            new = LogSegment(self.path, offset, create=True,
                             index_interval_bytes=self.config.index_interval_bytes)
            new.created_ms = self._clock()
            self._publish([new], offset, offset)
            self.producer_state.clear()
            self._unflushed_segments.clear()
            self.recovery_point = offset
            write_offset(self._file(RECOVERY_POINT), offset)
            write_offset(self._file(LOG_START), offset)

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (records below become unreadable and
        whole segments below it are deleted); returns the new log start offset."""
        with self._lock:
            self._check_open()
            v = self._view
            if offset > v.log_end_offset or offset < 0:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {offset}: log end offset is "
                    f"{v.log_end_offset}")
            if offset <= v.log_start_offset:
                return v.log_start_offset
            self._publish(v.segments, offset, v.log_end_offset)
            write_offset(self._file(LOG_START), offset)
            self._delete_segments_below_start()
            self.producer_state.evict_below(offset, self._view.bases[0])
            return offset

    def delete_old_segments(self) -> int:
        """Apply retention (retention.ms, retention.bytes, and the log start offset): delete
        whole non-active segments, oldest first. Returns how many were deleted."""
        with self._lock:
            self._check_open()
            deleted = self._delete_segments_below_start()
            if self.config.delete:
                deleted += self._delete_by_retention(self._clock())
            self._purge_deleted(self._clock())
            return deleted

    def _delete_segments_below_start(self) -> int:
        v = self._view
        segs = v.segments
        n = 0
        while n + 1 < len(segs) and segs[n + 1].base_offset <= v.log_start_offset:
            n += 1
        if n:
            self._drop_oldest(n)
        return n

    def _delete_by_retention(self, now: int) -> int:
        c = self.config
        segs = self._view.segments
        n = 0
        if c.retention_ms >= 0:
            while n + 1 < len(segs):
                ts = segs[n].max_timestamp
                if ts < 0:
                    ts = int(os.stat(segs[n].log_path).st_mtime * 1000)
                if now - ts <= c.retention_ms:
                    break
                n += 1
        if c.retention_bytes >= 0:
            total = sum(s.size for s in segs[n:])
            while n + 1 < len(segs) and total - segs[n].size >= c.retention_bytes:
                total -= segs[n].size
                n += 1
        if n:
            self._drop_oldest(n)
        return n

    def _drop_oldest(self, n: int) -> None:
        v = self._view
        gone, keep = v.segments[:n], v.segments[n:]
        log_start = max(v.log_start_offset, keep[0].base_offset)
        # publish first: a new reader never sees a segment that is about to be renamed
        self._publish(keep, log_start, v.log_end_offset)
        if log_start != v.log_start_offset:
            write_offset(self._file(LOG_START), log_start)
        for seg in gone:
            self._schedule_delete(seg)
        self.producer_state.evict_below(log_start, keep[0].base_offset)

    def _schedule_delete(self, seg: LogSegment) -> None:
        """Rename to .deleted now (a crash then finishes the job at open); unlink the files
        after file.delete.delay.ms. Readers holding the segment keep its fd until done."""
        seg.rename_suffix(".deleted")
        self._pending_deletes.append((self._clock() + self.config.file_delete_delay_ms, seg))
        if seg in self._unflushed_segments:
            self._unflushed_segments.remove(seg)

    def _purge_deleted(self, now: int) -> None:
        due = [(t, s) for t, s in self._pending_deletes if t <= now]
        if due:
            self._pending_deletes = [(t, s) for t, s in self._pending_deletes if t > now]
            for _, seg in due:
                for path in seg.paths():
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass

    # -- compaction -----------------------------------------------------------------------
    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> None:
        """Swap the cleaned segment ``new`` (files suffixed ``.cleaned``) in for the
        consecutive segments ``old``.

        Crash-safe order: the replaced offset range is written to ``<base>.swaprange``;
        ``.cleaned`` → ``.swap`` (the commit point); old → ``.deleted``; ``.swap`` → final
        names. storage.loader finishes a swap interrupted after the commit point and drops
        one interrupted before it. Raises KafkaStorageError (changing nothing) when a
        segment of ``old`` left the log meanwhile (retention or truncation won the race)."""
        with self._lock:
            self._check_open()
            v = self._view
            segs = list(v.segments)
            if any(s not in segs for s in old) or old[-1] is segs[-1]:
                raise KafkaStorageError("segments to replace are no longer in the log")
            i = segs.index(old[0])
            range_end = segs[i + len(old)].base_offset - 1
            new.flush()
            write_offset(swap_range_path(self.path, new.base_offset), range_end)
            new.rename_suffix(".swap")
            fsync_dir(self.path)
            segs[i:i + len(old)] = [new]
            for seg in old:
                seg.rename_suffix(".deleted")
            new.rename_suffix("")
            os.unlink(swap_range_path(self.path, new.base_offset))
            fsync_dir(self.path)
            self._publish(segs, v.log_start_offset, v.log_end_offset)
            for seg in old:
                self._pending_deletes.append(
                    (self._clock() + self.config.file_delete_delay_ms, seg))

    def compact(self, *, force: bool = False, max_map_entries: int | None = None):
        """One compaction round (storage.cleaner) when cleanup.policy includes compact."""
        self._check_open()
        if not self.config.compact:
            return CleanResult(False, self.log_start_offset, self.log_start_offset, 0.0,
                               reason="cleanup.policy does not include compact")
        return clean(self, now_ms=self._clock(), force=force, max_map_entries=max_map_entries)

    def maintain(self) -> None:
        """Periodic upkeep: flush.ms, retention, compaction. Call from one thread."""
        self.maybe_flush()
        with self._lock:
            if self._closed:
                return
        self.delete_old_segments()
        if self.config.compact:
            self.compact()

    def next_maintenance_in_ms(self, *, include_compaction: bool = True) -> int | None:
        """How long until ``maintain`` has something to do, in ms of the log's clock: 0 when
        something is due already, None when nothing will fall due however long the log is
        left alone (only a change can make work: an append or roll, a truncation or deletion,
        a config change). A caller sleeps this long and is woken early by such changes.

        What time alone makes due: flush.ms after the first unflushed append; the oldest
        non-active segment passing retention.ms; a segment renamed ``.deleted`` passing
        file.delete.delay.ms; on compacted topics, non-active segments passing
        min.compaction.lag.ms. Due at once: segments wholly below the log start,
        retention.bytes exceeded, a compaction round the cleaner would run now. (segment.ms
        sets no deadline: rolls happen in ``append``.) ``include_compaction=False`` skips the
        compaction part, which reads the cleaner checkpoint (for a cheap check after an
        append: only a roll changes what compaction may do)."""
        with self._lock:
            if self._closed:
                return None
            now = self._clock()
            c = self.config
            v = self._view
            segs = v.segments
            due = []
            if c.flush_ms is not None and self._unflushed_messages:
                due.append(self._last_flush_ms + c.flush_ms)
            if self._pending_deletes:
                due.append(min(t for t, _ in self._pending_deletes))
            if len(segs) > 1:
                if segs[1].base_offset <= v.log_start_offset:
                    due.append(now)
                if c.delete and c.retention_ms >= 0:
                    ts = segs[0].max_timestamp
                    if ts < 0:
                        try:
                            ts = int(os.stat(segs[0].log_path).st_mtime * 1000)
                        except OSError:
                            ts = now
                    due.append(ts + c.retention_ms + 1)  # deleted once now - ts > retention
                if c.delete and c.retention_bytes >= 0 and \
                        sum(s.size for s in segs) - segs[0].size >= c.retention_bytes:
                    due.append(now)
        if include_compaction and c.compact and len(segs) > 1:
            compaction = self._next_compaction_at(now)
            if compaction is not None:
                due.append(compaction)
        if not due:
            return None
        return max(min(due) - now, 0)

    def _next_compaction_at(self, now: int) -> int | None:
        """When a cleaner round (storage.cleaner.clean) would next do work: now when it
        would now, the time the next held-back segment passes min.compaction.lag.ms when
        that may change the answer, else None (nothing until the log changes)."""
        from .cleaner import _cleanable_segments, dirty_ratio
        ratio, first_dirty = dirty_ratio(self, now)
        cleanable = _cleanable_segments(self, now)
        if any(s.next_offset > first_dirty for s in cleanable) and \
                ratio >= self.config.min_cleanable_dirty_ratio:
            return now
        held_back = self.segments[len(cleanable):-1]
        if held_back and held_back[0].next_offset > first_dirty:
            return held_back[0].max_timestamp + self.config.min_compaction_lag_ms
        return None


def _producer_batches(headers: list[BatchHeader], infos: list[BatchInfo],
                      log_append_time_ms: int | None) -> list[ProducerBatch]:
    """The idempotent producers' batches of an append, at the offsets they were given."""
    out = []
    for h, info in zip(headers, infos):
        if h.producer_id >= 0:
            out.append(ProducerBatch(
                h.producer_id, h.producer_epoch, h.base_sequence,
                last_sequence(h.base_sequence, h.last_offset_delta), info.base_offset,
                info.last_offset,
                info.max_timestamp if log_append_time_ms is None else log_append_time_ms))
    return out


def _first_record_at_or_after(seg: LogSegment, header: BatchHeader, timestamp_ms: int) -> int:
    """Refine a batch whose max timestamp reaches ``timestamp_ms`` to the first record that
    does (LogAppendTime batches: every record has the batch's max timestamp)."""
    if header.timestamp_type == 1:
        return header.base_offset
    data = seg.pread(header.size, header.position)
    try:
        for rec in records_mod.decode_records(data):
            if rec.timestamp >= timestamp_ms:
                return rec.offset
    except CorruptRecordError:
        pass
    return header.base_offset
