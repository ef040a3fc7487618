"""One segment of a partition log: a .log file of whole v2 batches plus its two indexes.

Files: ``<dir>/<20-digit base offset>.log``, ``.index``, ``.timeindex`` (see storage.index),
optionally carrying a state suffix (``.cleaned``, ``.swap``, ``.deleted``) while a cleaner
swap or a deletion is in flight.

Invariants (checked by recovery, not assumed by readers):
    base_offset <= base offset of every batch in this segment
    base offsets of successive batches strictly increase
    last offset of every batch - base_offset <= 2**31 - 1  (relative offsets are int32)
    size <= 2**31 - 1                                      (positions are int32)

Thread safety: one writer (the Log, under its lock) and any number of concurrent readers.
``size`` is published after the bytes are written, so a reader bounded by the ``size`` it saw
never reads a partial batch. The file descriptor is closed only when the last reference to the
segment goes away (or at ``close``), so a reader holding an old snapshot of the segment list
keeps reading after the segment was renamed to ``.deleted`` or swapped out by the cleaner.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Iterator, NamedTuple

from .errors import CorruptRecordError
from .index import IndexCorruptError, OffsetIndex, TimeIndex
from .records import (HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC_POS,
                      MIN_BATCH_LENGTH, BatchHeader, parse_header)

INT32_MAX = 2**31 - 1
_SCAN_BLOCK = 1 << 16
_RECOVER_BLOCK = 8 << 20
# buffers per pwritev call: the system's IOV_MAX (1024 on Linux; more is EINVAL)
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):
    _IOV_MAX = 1024
_LENGTH = struct.Struct(">qi")


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


#: How many of the newest batches' positions a segment remembers (``_recent``).
RECENT_BATCHES = 256


class BatchInfo(NamedTuple):
    """What a segment needs to know of a batch it appends (after offsets are assigned)."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int


class _Fd:
    """An fd closed when the last reference to it goes (CPython frees promptly)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


class LogSegment:
    """A .log file with its offset and time indexes. See the module docstring."""

    def __init__(self, directory: str, base_offset: int, *, suffix: str = "",
                 index_interval_bytes: int = 4096, create: bool = False):
        self.directory = directory
        self.base_offset = base_offset
        self.suffix = suffix
        # where the newest batches start (base offset -> position): a read at the tail (a
        # follower's fetch, a consumer's, the leader's push to its broker) starts there
        # instead of scanning headers from the index entry before it
        self._recent: dict[int, int] = {}
        self.index_interval_bytes = index_interval_bytes
        stem = os.path.join(directory, segment_name(base_offset))
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        self._fd = _Fd(os.open(stem + ".log" + suffix, flags, 0o644))
        self.offset_index = OffsetIndex(stem + ".index" + suffix)
        self.time_index = TimeIndex(stem + ".timeindex" + suffix)
        self.size = os.fstat(self._fd.fd).st_size
        self.next_offset = base_offset       # last offset + 1 (exact after load/recover)
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.created_ms = int(time.time() * 1000)
        self._bytes_since_index = 0
        if create:
            self.offset_index.rewrite()
            self.time_index.rewrite()

    # -- names ------------------------------------------------------------------------
    @property
    def log_path(self) -> str:
        cached = self.__dict__.get("_log_path")
        if cached is None or cached[0] != self.suffix:
            cached = self._log_path = (self.suffix, os.path.join(
                self.directory, segment_name(self.base_offset) + ".log" + self.suffix))
        return cached[1]

    def paths(self) -> list[str]:
        return [self.log_path, self.offset_index.path, self.time_index.path]

    def rename_suffix(self, suffix: str) -> None:
        """Rename the three files to carry ``suffix`` (the fd stays valid on POSIX)."""
        stem = os.path.join(self.directory, segment_name(self.base_offset))
        os.replace(self.log_path, stem + ".log" + suffix)
        self.offset_index.rename(stem + ".index" + suffix)
        self.time_index.rename(stem + ".timeindex" + suffix)
        self.suffix = suffix
        # where the newest batches start (base offset -> position): a read at the tail (a
        # follower's fetch, a consumer's, the leader's push to its broker) starts there
        # instead of scanning headers from the index entry before it
        self._recent: dict[int, int] = {}

    def __repr__(self) -> str:
        return (f"LogSegment(base_offset={self.base_offset}, size={self.size}, "
                f"next_offset={self.next_offset}, suffix={self.suffix!r})")

    # -- writing ----------------------------------------------------------------------
    def append(self, chunks: list, infos: list[BatchInfo], verify=None) -> None:
        """Write ``chunks`` (the batches' bytes, in order) at the end and index them.

        ``verify``, when given, is called after the bytes are written and before anything is
        indexed or published; if it raises, the bytes are cut off again and the segment is as
        before (readers, bounded by ``size``, never saw them).
        """
        position = self.size
        # at most IOV_MAX buffers per pwritev (Linux: 1024; more is EINVAL): a follower's
        # append of a catch-up fetch holds one buffer per batch, often thousands
        at = position
        for i in range(0, len(chunks), _IOV_MAX):
            group = chunks[i:i + _IOV_MAX]
            total = 0
            for chunk in group:
                total += len(chunk)
            written = os.pwritev(self._fd.fd, group, at)
            if written != total:  # pwritev may be short on some filesystems; finish it
                self._write_rest(group, written, at)
            at += total
        if verify is not None:
            try:
                verify()
            except BaseException:
                os.ftruncate(self._fd.fd, position)
                raise
        for info in infos:
            if self._bytes_since_index > self.index_interval_bytes:
                self.offset_index.append(info.base_offset - self.base_offset, position)
                self.time_index.append(self.max_timestamp,
                                       self.offset_of_max_timestamp - self.base_offset)
                self._bytes_since_index = 0
            if info.max_timestamp > self.max_timestamp:
                self.max_timestamp = info.max_timestamp
                self.offset_of_max_timestamp = info.last_offset
            self._note_recent(info.base_offset, position)
            position += info.size
            self._bytes_since_index += info.size
        if infos:
            self.next_offset = infos[-1].last_offset + 1
        self.size = position  # publish last: readers bounded by size never see a partial batch

    def _write_rest(self, chunks: list, written: int, position: int) -> None:
        data = b"".join(bytes(c) for c in chunks)[written:]
        pos = position + written
        while data:
            n = os.pwrite(self._fd.fd, data, pos)
            data = data[n:]
            pos += n

    def flush(self) -> None:
        os.fsync(self._fd.fd)
        self.offset_index.flush(fsync=True)
        self.time_index.flush(fsync=True)

    def seal(self) -> None:
        """The segment stops being active: index its final max timestamp, write indexes."""
        if self.max_timestamp >= 0:
            self.time_index.append(self.max_timestamp,
                                   self.offset_of_max_timestamp - self.base_offset)
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self.seal()
        self._fd.close()

    def delete(self) -> None:
        self._fd.close()
        for path in self.paths():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- reading ----------------------------------------------------------------------
    def pread(self, n: int, position: int) -> bytes:
        return os.pread(self._fd.fd, n, position)

    def scan_headers(self, position: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
        """Headers of the batches from ``position`` up to ``end`` (default: size), without
        CRC checks; raises CorruptRecordError at the first impossible length or magic."""
        end = self.size if end is None else end
        while position < end:
            head = self.pread(HEADER_SIZE, position)
            if len(head) < HEADER_SIZE or position + HEADER_SIZE > end:
                raise CorruptRecordError(
                    f"{self.log_path}: truncated batch header at position {position}")
            fields = HEADER.unpack(head)
            length = fields[1]
            if fields[3] != 2 or length < MIN_BATCH_LENGTH or position + length + LOG_OVERHEAD > end:
                raise CorruptRecordError(
                    f"{self.log_path}: invalid batch at position {position} "
                    f"(magic {fields[3]}, batch_length {length}, segment size {end})")
            yield BatchHeader(*fields, position)
            position += length + LOG_OVERHEAD

    def translate_offset(self, offset: int, *, end: int | None = None) -> BatchHeader | None:
        """Header of the first batch whose last offset is >= ``offset`` (None when there is
        none before ``end``). Starts from the index; a stale index entry that does not point
        at a batch starting at or before ``offset`` falls back to a scan from the start."""
        end = self.size if end is None else end
        start = self._recent.get(offset)
        if start is None:
            start = self.offset_index.lookup(offset - self.base_offset)
        if start >= end:
            start = 0
        try:
            return self._first_reaching(offset, start, end)
        except CorruptRecordError:
            if start == 0:
                raise
            return self._first_reaching(offset, 0, end)

    def _first_reaching(self, offset: int, start: int, end: int) -> BatchHeader | None:
        for header in self.scan_headers(start, end):
            if header.base_offset > offset and header.position == start and start:
                raise CorruptRecordError("index entry past the offset")  # stale index
            if header.last_offset >= offset:
                return header
        return None

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None,
             check_crc: bool = True) -> bytes:
        """Whole batches starting with the one holding ``offset``, at most ``max_bytes`` of
        them unless the first alone is larger (it is then returned whole), and none whose last
        offset is >= ``max_offset``. Every batch is CRC-checked before it is returned."""
        end = self.size
        first = self.translate_offset(offset, end=end)
        if first is None:
            return b""
        if max_offset is not None and first.last_offset >= max_offset:
            return b""
        want = max(first.size, min(max_bytes, end - first.position))
        data = self.pread(want, first.position)
        if len(data) < first.size:
            raise CorruptRecordError(
                f"{self.log_path}: batch at position {first.position} is cut short")
        return _whole_batches(data, first.position, max_offset, check_crc, self.log_path)

    # -- recovery and truncation --------------------------------------------------------
    def load_indexes(self) -> bool:
        """Load both indexes and sanity-check them; False (and empty indexes) when either is
        missing or corrupt, so the caller rebuilds."""
        try:
            self.offset_index.load()
            self.time_index.load()
            self.offset_index.sanity_check(self.size)
            self.time_index.sanity_check(INT32_MAX)
            return True
        except IndexCorruptError:
            self.offset_index.reset()
            self.time_index.reset()
            return False

    def scan_tail(self) -> None:
        """Set next_offset / max_timestamp by scanning headers after the last index entries
        (a clean open of the active segment). Raises CorruptRecordError on bad data."""
        if self.time_index.keys:
            self.max_timestamp = self.time_index.keys[-1]
            self.offset_of_max_timestamp = self.base_offset + self.time_index.values[-1]
        start = self.offset_index.values[-1] if self.offset_index.values else 0
        for header in self.scan_headers(start):
            self.next_offset = header.last_offset + 1
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.last_offset
        self._bytes_since_index = self.size - start

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from batch headers (no CRC checks): for segments below the
        recovery point, whose bytes were flushed. Stops quietly at the first bad header;
        reads past it report CorruptRecordError."""
        size = self.size  # _reset_state zeroes it; the file keeps every byte it has
        self._reset_state()
        try:
            for header in self.scan_headers(0, size):
                self._index_batch(header)
        except CorruptRecordError:
            pass
        self.size = size  # reads past a bad header must report it, not see an end
        self.offset_index.rewrite()
        self.time_index.rewrite()

    def recover(self, *, max_batch_bytes: int, min_base_offset: int) -> int:
        """Validate every batch (bounds, magic, CRC32C, increasing offsets), rebuild the
        indexes, and truncate the file at the first invalid byte. Returns bytes cut."""
        self._reset_state()
        fd = self._fd.fd
        size = os.fstat(fd).st_size
        position = 0
        expected = max(min_base_offset, self.base_offset)
        buf = b""
        buf_start = 0
        while position < size:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(fd, _RECOVER_BLOCK, position)
                buf_start, rel = position, 0
                if len(buf) < HEADER_SIZE:
                    break  # a torn header at the end
            (_, length) = _LENGTH.unpack_from(buf, rel)
            need = length + LOG_OVERHEAD
            if need < HEADER_SIZE or need > max_batch_bytes or position + need > size:
                break  # an impossible length: garbage, or a batch the crash cut short
            if rel + need > len(buf):
                buf = os.pread(fd, max(need, _RECOVER_BLOCK), position)
                buf_start, rel = position, 0
            try:
                header = parse_header(buf, rel, max_batch_bytes=max_batch_bytes)
            except CorruptRecordError:
                break
            if header.base_offset < expected or \
                    header.last_offset - self.base_offset > INT32_MAX:
                break
            header = header._replace(position=position)
            self._index_batch(header)
            expected = header.next_offset
            position += header.size
        cut = size - position
        if cut:
            os.ftruncate(fd, position)
        self.size = position
        self.offset_index.rewrite()
        self.time_index.rewrite()
        return cut

    def _note_recent(self, base_offset: int, position: int) -> None:
        recent = self._recent
        recent[base_offset] = position
        if len(recent) > RECENT_BATCHES:
            del recent[next(iter(recent))]           # the oldest (insertion order)

    def _reset_state(self) -> None:
        self._recent = {}
        self.offset_index.reset()
        self.time_index.reset()
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self._bytes_since_index = 0

    def _index_batch(self, header: BatchHeader) -> None:
        self.append_index_only(BatchInfo(header.base_offset, header.last_offset,
                                         header.max_timestamp, header.size), header.position)

    def append_index_only(self, info: BatchInfo, position: int) -> None:
        if self._bytes_since_index > self.index_interval_bytes:
            self.offset_index.append(info.base_offset - self.base_offset, position)
            self.time_index.append(self.max_timestamp,
                                   self.offset_of_max_timestamp - self.base_offset)
            self._bytes_since_index = 0
        if info.max_timestamp > self.max_timestamp:
            self.max_timestamp = info.max_timestamp
            self.offset_of_max_timestamp = info.last_offset
        self._bytes_since_index += info.size
        self.next_offset = info.last_offset + 1
        self.size = position + info.size

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed.
        A batch holding ``offset`` goes whole: the segment then ends on a batch boundary."""
        header = self.translate_offset(offset)
        if header is None:
            return 0
        old = self.size
        self._recent = {}
        os.ftruncate(self._fd.fd, header.position)
        self.size = header.position
        self.offset_index.truncate_to_position(header.position)
        self.time_index.truncate_to_offset(header.base_offset - self.base_offset)
        # recompute the running state from the headers that remain
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        for h in self.scan_headers(0):
            self.next_offset = h.last_offset + 1
            if h.max_timestamp > self.max_timestamp:
                self.max_timestamp = h.max_timestamp
                self.offset_of_max_timestamp = h.last_offset
        self._bytes_since_index = self.size - (self.offset_index.values[-1]
                                               if self.offset_index.values else 0)
        return old - self.size

    # -- time ---------------------------------------------------------------------------
    def find_offset_by_timestamp(self, timestamp: int) -> BatchHeader | None:
        """First batch (header) whose max timestamp is >= ``timestamp``, or None."""
        rel = self.time_index.lookup(timestamp)
        header = self.translate_offset(self.base_offset + rel)
        start = header.position if header is not None else 0
        for h in self.scan_headers(start):
            if h.max_timestamp >= timestamp:
                return h
        return None

    def first_batch_timestamp(self) -> int:
        if self.size < HEADER_SIZE:
            return -1
        head = self.pread(HEADER_SIZE, 0)
        return HEADER.unpack(head)[7] if head[MAGIC_POS] == 2 else -1


def _whole_batches(data: bytes, base_position: int, max_offset: int | None,
                   check_crc: bool, path: str) -> bytes:
    """The longest prefix of ``data`` made of whole, valid batches (at least one: the first
    must be whole and valid, or CorruptRecordError names the file and position)."""
    pos = 0
    n = len(data)
    mv = memoryview(data)
    while pos + LOG_OVERHEAD <= n:
        (_, length) = _LENGTH.unpack_from(data, pos)
        if pos + length + LOG_OVERHEAD > n and pos:
            break
        try:
            header = parse_header(mv, pos, check_crc=check_crc)
        except CorruptRecordError as exc:
            if pos:
                break  # serve the valid batches first; the next read reports this one
            raise CorruptRecordError(f"{path} at position {base_position + pos}: {exc}") from None
        if max_offset is not None and header.last_offset >= max_offset:
            break
        pos += header.size
    if pos == n:
        return data
    return data[:pos]
