"""Opening a log directory: crash-safe file states resolved, segments loaded, tail recovered.

One place for everything start-up does, in numbered passes:

1. Leftovers of interrupted work are resolved: ``*.tmp`` and ``*.cleaned`` (a cleaner swap
   that never committed) are deleted; a ``*.log.swap`` (a committed cleaner swap) replaces
   every segment whose base offset falls inside its offset range and takes its final name;
   ``*.deleted`` files are deleted.
2. Every ``<20 digits>.log`` becomes a LogSegment; index files without a .log are deleted.
3. After a clean shutdown (the marker file exists) indexes are loaded and sanity-checked
   (rebuilt when missing or corrupt) and only the tail after the last index entry is scanned.
   After an unclean shutdown every segment from the one holding the recovery point on is
   recovered batch by batch (bounds, magic, CRC32C, increasing offsets); the first invalid
   byte and every later segment are cut. Segments below the recovery point were flushed:
   they are not rescanned, and a corrupt byte in them is reported when read, never served.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass

from .checkpoint import read_offset
from .errors import CorruptRecordError
from .segment import INT32_MAX, LogSegment, segment_name

log = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex)((?:\.(?:swap|cleaned|deleted))?)$")


@dataclass
class LoadResult:
    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    recovered: bool           # True when the tail was rescanned (no clean-shutdown marker)
    truncated_bytes: int      # bytes cut by recovery


def load(directory: str, *, config, clean_marker: str, recovery_point_file: str,
         log_start_file: str) -> LoadResult:
    _resolve_leftovers(directory, config)
    segments = _open_segments(directory, config)
    log_start = read_offset(log_start_file) or 0
    recovery_point = read_offset(recovery_point_file) or 0
    clean = os.path.exists(clean_marker)
    truncated = 0
    if clean:
        if not _load_clean(segments):
            clean = False  # a clean marker over a bad tail: fall back to recovery
    if not clean:
        truncated = _recover(directory, segments, recovery_point, config)
    if not segments:
        base = max(log_start, 0)
        segments.append(LogSegment(directory, base, create=True,
                                   index_interval_bytes=config.index_interval_bytes))
    log_start = max(log_start, segments[0].base_offset)
    return LoadResult(segments, log_start, recovery_point, not clean, truncated)


def _resolve_leftovers(directory: str, config) -> None:
    for path in glob.glob(os.path.join(directory, "*.tmp")) + \
            glob.glob(os.path.join(directory, "*.cleaned")):
        os.unlink(path)
    for swap in sorted(glob.glob(os.path.join(directory, "*.log.swap"))):
        base = int(os.path.basename(swap)[:20])
        seg = LogSegment(directory, base, suffix=".swap",
                         index_interval_bytes=config.index_interval_bytes)
        last = read_offset(swap_range_path(directory, base))
        if last is None:  # no range file: fall back to the swap's own last offset
            last = base
            try:
                for header in seg.scan_headers(0):
                    last = header.last_offset
            except CorruptRecordError:
                pass  # a swap file is fsynced before it is committed; be defensive anyway
        del seg
        for path in glob.glob(os.path.join(directory, "*.log")):
            other = _base_of(path)
            if other is not None and base <= other <= last:
                _unlink_segment_files(directory, other, "")
        _unlink_segment_files(directory, base, "", logs=False)
        os.replace(swap, os.path.join(directory, segment_name(base) + ".log"))
        for ext in ("index", "timeindex"):
            leftover = os.path.join(directory, f"{segment_name(base)}.{ext}.swap")
            if os.path.exists(leftover):
                os.unlink(leftover)  # indexes of a swapped segment are rebuilt
        if os.path.exists(swap_range_path(directory, base)):
            os.unlink(swap_range_path(directory, base))
        log.info("completed an interrupted cleaner swap of segment %d", base)
    for path in glob.glob(os.path.join(directory, "*.deleted")) + \
            glob.glob(os.path.join(directory, "*.swaprange")):
        os.unlink(path)


def swap_range_path(directory: str, base_offset: int) -> str:
    """The file naming the last offset a committed cleaner swap replaces."""
    return os.path.join(directory, segment_name(base_offset) + ".swaprange")


def _base_of(path: str) -> int | None:
    m = _SEGMENT_FILE.match(os.path.basename(path))
    return int(m.group(1)) if m else None


def _unlink_segment_files(directory: str, base: int, suffix: str, *, logs: bool = True) -> None:
    exts = ("log", "index", "timeindex") if logs else ("index", "timeindex")
    for ext in exts:
        path = os.path.join(directory, f"{segment_name(base)}.{ext}{suffix}")
        if os.path.exists(path):
            os.unlink(path)


def _open_segments(directory: str, config) -> list[LogSegment]:
    bases = []
    for name in os.listdir(directory):
        m = _SEGMENT_FILE.match(name)
        if m and m.group(2) == "log" and not m.group(3):
            bases.append(int(m.group(1)))
    bases.sort()
    known = set(bases)
    for name in os.listdir(directory):
        m = _SEGMENT_FILE.match(name)
        if m and m.group(2) != "log" and not m.group(3) and int(m.group(1)) not in known:
            os.unlink(os.path.join(directory, name))  # an index whose .log is gone
    return [LogSegment(directory, base, index_interval_bytes=config.index_interval_bytes)
            for base in bases]


def _load_clean(segments: list[LogSegment]) -> bool:
    for seg in segments:
        if not seg.load_indexes():
            seg.rebuild_indexes()
        try:
            seg.scan_tail()
        except CorruptRecordError:
            if seg is segments[-1]:
                return False
            log.warning("segment %s has a bad batch after its last index entry; reads "
                        "there will report it", seg.log_path)
    return True


def _recover(directory: str, segments: list[LogSegment], recovery_point: int, config) -> int:
    """Recover every segment from the one holding ``recovery_point``; returns bytes cut."""
    first_unflushed = 0
    for i, seg in enumerate(segments):
        if seg.base_offset <= recovery_point:
            first_unflushed = i
    for seg in segments[:first_unflushed]:
        if not seg.load_indexes():
            seg.rebuild_indexes()
        try:
            seg.scan_tail()
        except CorruptRecordError:
            pass
    cut = 0
    expected = segments[first_unflushed - 1].next_offset if first_unflushed else 0
    for i in range(first_unflushed, len(segments)):
        seg = segments[i]
        # any length up to the file's size is plausible: a batch stored under an older, larger
        # max.message.bytes must not be cut; the CRC decides
        cut += seg.recover(max_batch_bytes=INT32_MAX, min_base_offset=expected)
        expected = seg.next_offset
        if cut:
            # everything after the first invalid byte is suspect: drop later segments
            for later in segments[i + 1:]:
                cut += later.size
                later.delete()
            del segments[i + 1:]
            break
    # a trailing empty segment after a shorter predecessor would break base <= offsets
    while len(segments) > 1 and segments[-1].size == 0 and \
            segments[-2].next_offset < segments[-1].base_offset:
        segments.pop().delete()
    for seg in segments[first_unflushed:]:
        seg.flush()
    return cut
