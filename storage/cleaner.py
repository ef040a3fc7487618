"""Log compaction: keep the last record of every key, preserving offsets.

The algorithm (Kafka's Cleaner), for one Log and one round:

1. The dirty section starts at the cleaner checkpoint (``cleaner-offset-checkpoint`` in the
   log directory; the log start when absent) and ends before the active segment and before
   any segment with records newer than ``min.compaction.lag.ms``. The round runs only when
   dirty bytes / (clean + dirty bytes) >= ``min.cleanable.dirty.ratio`` (or when forced).
2. An OffsetMap (key → last offset) is filled from the dirty section, one whole segment at a
   time, until the next segment would not fit its entry bound
   (``log.cleaner.dedupe.buffer.size`` / 24 entries, Kafka's per-entry cost); the map's end
   offset is where this round stops: what did not fit is cleaned next round.
3. Every segment below the map's end is rewritten, in groups that fit one segment: a record
   survives when no later record of its key is in the map; a tombstone (null value) survives
   until its timestamp is older than ``delete.retention.ms`` (then it is dropped, too). Each
   surviving batch keeps its base offset and codec, and records keep their offsets, so gaps
   appear but no offset moves. A batch whose records all survive is copied byte for byte.
4. The cleaned group, written as ``.cleaned`` files and fsynced, is swapped in through
   ``Log.replace_segments`` (``.cleaned`` → ``.swap`` → final name; see storage.loader for
   how start-up completes an interrupted swap). A crash at any point leaves a log that reads
   the same records.
5. The checkpoint moves to the map's end.

Not thread-safe against itself: run one cleaner per log at a time (the Log's writers and
readers may go on meanwhile; a truncation or retention that removes a segment being cleaned
makes the swap fail and the round is abandoned).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from . import records as records_mod
from .checkpoint import read_offset, write_offset
from .errors import CorruptRecordError, KafkaStorageError
from .records import TIMESTAMP_TYPE_MASK, BatchHeader, assign_offsets, parse_header
from .segment import INT32_MAX, BatchInfo, LogSegment, segment_name

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
BYTES_PER_MAP_ENTRY = 24  # Kafka's SkimpyOffsetMap: 16-byte hash + 8-byte offset


@dataclass(frozen=True)
class CleanResult:
    cleaned: bool
    first_dirty_offset: int
    end_offset: int           # the next round starts here
    dirty_ratio: float
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0
    reason: str = ""


class OffsetMap:
    """key → last offset seen, bounded in entries (a stand-in for a fixed memory budget)."""

    def __init__(self, *, max_entries: int):
        if max_entries < 1:
            raise ValueError("an offset map needs room for at least one entry")
        self.max_entries = max_entries
        self._map: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._map)

    def put(self, key: bytes, offset: int) -> None:
        self._map[key] = offset

    def get(self, key: bytes) -> int:
        return self._map.get(key, -1)

    def room(self) -> int:
        return self.max_entries - len(self._map)


def _checkpoint_path(the_log) -> str:
    return os.path.join(the_log.path, CLEANER_CHECKPOINT)


def first_dirty_offset(the_log) -> int:
    cp = read_offset(_checkpoint_path(the_log))
    start = the_log.log_start_offset
    return start if cp is None or cp < start or cp > the_log.log_end_offset else cp


def _cleanable_segments(the_log, now_ms: int) -> list[LogSegment]:
    """Segments that may be cleaned: all but the active one, stopping before the first that
    holds records newer than min.compaction.lag.ms."""
    lag = the_log.config.min_compaction_lag_ms
    out = []
    for seg in the_log.segments[:-1]:
        if lag and seg.max_timestamp > now_ms - lag:
            break
        out.append(seg)
    return out


def dirty_ratio(the_log, now_ms: int) -> tuple[float, int]:
    segs = _cleanable_segments(the_log, now_ms)
    first_dirty = first_dirty_offset(the_log)
    clean = sum(s.size for s in segs if s.next_offset <= first_dirty)
    dirty = sum(s.size for s in segs if s.next_offset > first_dirty)
    total = clean + dirty
    return (dirty / total if total else 0.0), first_dirty


def clean(the_log, *, now_ms: int, force: bool = False,
          max_map_entries: int | None = None) -> CleanResult:
    """One cleaning round of ``the_log`` (see the module docstring)."""
    config = the_log.config
    ratio, first_dirty = dirty_ratio(the_log, now_ms)
    segs = _cleanable_segments(the_log, now_ms)
    dirty = [s for s in segs if s.next_offset > first_dirty]
    if not dirty:
        return CleanResult(False, first_dirty, first_dirty, ratio, reason="nothing dirty")
    if not force and ratio < config.min_cleanable_dirty_ratio:
        return CleanResult(False, first_dirty, first_dirty, ratio,
                           reason=f"dirty ratio {ratio:.2f} below "
                                  f"{config.min_cleanable_dirty_ratio}")
    entries = max_map_entries or max(config.cleaner_dedupe_buffer_size // BYTES_PER_MAP_ENTRY, 1)
    offset_map = OffsetMap(max_entries=entries)
    end_offset = _build_offset_map(dirty, first_dirty, offset_map)
    if end_offset <= first_dirty:
        return CleanResult(False, first_dirty, first_dirty, ratio,
                           reason="the first dirty segment does not fit the offset map")
    to_clean = [s for s in segs if s.base_offset < end_offset]
    before = sum(s.size for s in to_clean)
    horizon = now_ms - config.delete_retention_ms
    after = 0
    removed = 0
    for group in _group_segments(to_clean, config.segment_bytes):
        try:
            size, dropped = _clean_group(the_log, group, offset_map, horizon)
        except KafkaStorageError as exc:
            log.info("cleaning of %s abandoned: %s", the_log.path, exc)
            return CleanResult(False, first_dirty, first_dirty, ratio, reason=str(exc))
        after += size
        removed += dropped
    write_offset(_checkpoint_path(the_log), end_offset)
    return CleanResult(True, first_dirty, end_offset, ratio, before, after, removed)


def _build_offset_map(dirty: list[LogSegment], first_dirty: int, offset_map: OffsetMap) -> int:
    """Fill the map from whole segments while they fit; returns the offset after the last
    segment taken."""
    end = first_dirty
    for seg in dirty:
        keys: dict[bytes, int] = {}
        for header, recs in _segment_records(seg):
            for rec in recs:
                if rec.offset >= first_dirty and rec.key is not None:
                    keys[rec.key] = rec.offset
        new_keys = sum(1 for k in keys if offset_map.get(k) < 0)
        if new_keys > offset_map.room():
            break
        for k, off in keys.items():
            offset_map.put(k, off)
        end = seg.next_offset
    return end


def _segment_records(seg: LogSegment):
    for header in seg.scan_headers(0):
        data = seg.pread(header.size, header.position)
        batch = records_mod.RecordBatch(data)
        yield header, batch.records()


def _group_segments(segs: list[LogSegment], max_bytes: int) -> list[list[LogSegment]]:
    groups: list[list[LogSegment]] = []
    for seg in segs:
        if groups:
            g = groups[-1]
            if sum(s.size for s in g) + seg.size <= max_bytes and \
                    seg.next_offset - 1 - g[0].base_offset <= INT32_MAX:
                g.append(seg)
                continue
        groups.append([seg])
    return groups


def _clean_group(the_log, group: list[LogSegment], offset_map: OffsetMap,
                 horizon_ms: int) -> tuple[int, int]:
    base = group[0].base_offset
    stem = os.path.join(the_log.path, segment_name(base))
    for ext in ("log", "index", "timeindex"):
        leftover = f"{stem}.{ext}.cleaned"
        if os.path.exists(leftover):
            os.unlink(leftover)
    cleaned = LogSegment(the_log.path, base, suffix=".cleaned", create=True,
                         index_interval_bytes=the_log.config.index_interval_bytes)
    removed = 0
    try:
        for seg in group:
            for header, recs in _segment_records(seg):
                keep = [r for r in recs if _retain(r, offset_map, horizon_ms)]
                removed += len(recs) - len(keep)
                if not keep:
                    continue
                if len(keep) == len(recs):
                    data = seg.pread(header.size, header.position)
                    new = header
                else:
                    data = _rebuild(header, keep)
                    new = parse_header(data)
                cleaned.append([data], [BatchInfo(new.base_offset, new.last_offset,
                                                  new.max_timestamp, len(data))])
        cleaned.seal()
        the_log.replace_segments(group, cleaned)
    except BaseException:
        cleaned.delete()
        raise
    return cleaned.size, removed


def _retain(rec, offset_map: OffsetMap, horizon_ms: int) -> bool:
    if rec.key is None:
        return True  # compacted topics refuse keyless records; keep anything older as is
    if offset_map.get(rec.key) > rec.offset:
        return False
    if rec.value is None and rec.timestamp < horizon_ms:
        return False  # a tombstone past delete.retention.ms
    return True


def _rebuild(header: BatchHeader, keep) -> bytes:
    """A batch of the surviving records with the original base offset, offsets, timestamps,
    codec and producer fields."""
    log_append = bool(header.attributes & TIMESTAMP_TYPE_MASK)
    data = records_mod.RecordBatch.build(
        [r.value for r in keep],
        keys=[r.key for r in keep],
        timestamps=[r.timestamp for r in keep],
        headers=[r.headers for r in keep],
        offset_deltas=[r.offset - header.base_offset for r in keep],
        base_offset=header.base_offset,
        compression=header.compression,
        timestamp_type=0,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
    )
    if log_append:
        data = bytes(assign_offsets(data, header.base_offset,
                                    log_append_time_ms=header.max_timestamp))
    return data


__all__ = ["clean", "CleanResult", "OffsetMap", "dirty_ratio", "first_dirty_offset",
           "CorruptRecordError"]
