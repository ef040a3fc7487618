"""Sparse indexes of one segment: offset → file position, and timestamp → offset.

Files (owned by one LogSegment, named after its base offset)::

    <base>.index      entries of 8 bytes:  relative_offset int32, position int32
    <base>.timeindex  entries of 12 bytes: timestamp int64, relative_offset int32

Both big-endian, append-only, no header. Invariants, checked by ``sanity_check``:
``0 <= relative_offset`` and relative offsets strictly increase; positions (offset index)
and timestamps (time index) increase. Indexes are derived data: nothing is checksummed, and
after an unclean shutdown or a failed sanity check they are rebuilt from the .log file.

Entries are kept in memory (lists, bisected) and written to the file in ``flush``; an index
never answers with a position past what its segment has, because the segment checks.
Not thread-safe for writers; readers see a consistent prefix (lists only grow by append
under the GIL, and ``truncate`` replaces them).
"""

from __future__ import annotations

import bisect
import os
import struct

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


class IndexCorruptError(Exception):
    """An index file that fails its sanity check; the caller rebuilds it. Internal."""


class _Index:
    entry: struct.Struct

    def __init__(self, path: str):
        self.path = path
        self.keys: list[int] = []      # relative offsets (offset index) or timestamps
        self.values: list[int] = []    # positions (offset index) or relative offsets
        self._unwritten = 0            # entries at the tail not yet written to the file

    # -- file I/O ---------------------------------------------------------------------
    def load(self) -> None:
        """Read the whole file; raises IndexCorruptError when its size is not whole entries."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise IndexCorruptError(f"{self.path} is missing") from None
        size = self.entry.size
        if len(data) % size:
            raise IndexCorruptError(f"{self.path}: {len(data)} bytes is not a whole number "
                                    f"of {size}-byte entries")
        pairs = list(self.entry.iter_unpack(data))
        self.keys = [p[0] for p in pairs]
        self.values = [p[1] for p in pairs]
        self._unwritten = 0

    def flush(self, *, fsync: bool = False) -> None:
        if self._unwritten:
            n = len(self.keys)
            start = n - self._unwritten
            pack = self.entry.pack
            data = b"".join(pack(self.keys[i], self.values[i]) for i in range(start, n))
            with open(self.path, "ab") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            self._unwritten = 0
        elif fsync and os.path.exists(self.path):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def rewrite(self) -> None:
        """Write every entry anew (after truncation or a rebuild)."""
        pack = self.entry.pack
        data = b"".join(pack(k, v) for k, v in zip(self.keys, self.values))
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path)
        self._unwritten = 0

    def reset(self) -> None:
        self.keys = []
        self.values = []
        self._unwritten = 0

    def _append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)
        self._unwritten += 1

    def __len__(self) -> int:
        return len(self.keys)

    def rename(self, path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class OffsetIndex(_Index):
    """relative offset → byte position of a batch whose base offset is that offset."""

    entry = OFFSET_ENTRY

    def append(self, relative_offset: int, position: int) -> None:
        if self.keys and relative_offset <= self.keys[-1]:
            return  # only strictly increasing offsets are indexed
        self._append(relative_offset, position)

    def lookup(self, relative_offset: int) -> int:
        """Position of the last indexed batch starting at or before ``relative_offset``
        (0 when none is)."""
        i = bisect.bisect_right(self.keys, relative_offset) - 1
        return self.values[i] if i >= 0 else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop entries whose position is at or past ``position``."""
        i = bisect.bisect_left(self.values, position)
        if i < len(self.keys):
            del self.keys[i:], self.values[i:]
            self.rewrite()

    def sanity_check(self, segment_size: int) -> None:
        keys, values = self.keys, self.values
        for i in range(len(keys)):
            if keys[i] < 0 or values[i] < 0 or values[i] >= max(segment_size, 1):
                raise IndexCorruptError(f"{self.path}: entry {i} ({keys[i]}, {values[i]}) "
                                        f"out of range for a segment of {segment_size} bytes")
            if i and (keys[i] <= keys[i - 1] or values[i] <= values[i - 1]):
                raise IndexCorruptError(f"{self.path}: entry {i} does not increase")


class TimeIndex(_Index):
    """timestamp → relative offset of the first batch whose max timestamp reached it.

    An entry (T, r) says: no record before relative offset r has a timestamp greater than T
    ... and the batch at r is where the segment's running max timestamp became T.
    """

    entry = TIME_ENTRY

    def append(self, timestamp: int, relative_offset: int) -> None:
        if self.keys and timestamp <= self.keys[-1]:
            return
        self._append(timestamp, relative_offset)

    def lookup(self, timestamp: int) -> int:
        """Relative offset from which a scan for the first timestamp >= ``timestamp`` may
        start: the entry before the first one whose timestamp reaches it (0 when none)."""
        i = bisect.bisect_left(self.keys, timestamp) - 1
        return self.values[i] if i >= 0 else 0

    @property
    def max_timestamp(self) -> int:
        return self.keys[-1] if self.keys else -1

    def truncate_to_offset(self, relative_offset: int) -> None:
        """Drop entries at or past ``relative_offset``."""
        i = bisect.bisect_left(self.values, relative_offset)
        if i < len(self.keys):
            del self.keys[i:], self.values[i:]
            self.rewrite()

    def sanity_check(self, max_relative_offset: int) -> None:
        keys, values = self.keys, self.values
        for i in range(len(keys)):
            if values[i] < 0 or values[i] > max_relative_offset:
                raise IndexCorruptError(f"{self.path}: entry {i} offset {values[i]} out of "
                                        f"range 0..{max_relative_offset}")
            if i and (keys[i] <= keys[i - 1] or values[i] < values[i - 1]):
                raise IndexCorruptError(f"{self.path}: entry {i} does not increase")
