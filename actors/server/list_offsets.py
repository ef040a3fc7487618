"""ListOffsets over one partition's Log, as its leader answers it: shared by the
single-process LogBackend and the PartitionReplica (which answers it over its channel), and
light enough for a replica's process to import (storage only)."""

from __future__ import annotations

from storage import Log
from storage.records import decode_records


def list_offset_in_log(log: Log, timestamp: int, high_watermark: int) -> tuple[int, int]:
    """ListOffsets over one partition's Log, as its leader answers it: (timestamp, offset)
    for -1 (latest: the high watermark), -2 (earliest), -3 (the record with the largest
    timestamp, KIP-734) or a timestamp (the first record at or after it below the high
    watermark); (-1, -1) when there is none."""
    if timestamp == -1:
        return -1, high_watermark
    if timestamp == -2:
        return -1, log.log_start_offset
    if timestamp == -3:
        segments = [s for s in log.segments if s.max_timestamp >= 0]
        if not segments:
            return -1, -1
        newest = max(segments, key=lambda s: s.max_timestamp)
        return newest.max_timestamp, newest.offset_of_max_timestamp
    offset = log.offset_for_time(timestamp)
    if offset is None or offset >= high_watermark:
        return -1, -1
    for record in decode_records(log.read(offset, 1)):
        if record.offset >= offset:
            return record.timestamp, record.offset
    return -1, offset


__all__ = ["list_offset_in_log"]
