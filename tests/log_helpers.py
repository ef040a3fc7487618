"""Helpers for the tests that attack the partition Log (tests/test_log*.py).

Batches are built with kafka-python's ``DefaultRecordBatchBuilder``: a test-only oracle that is
independent of our own builder, so a bug in storage.records cannot hide itself in both the
bytes we append and the bytes we expect back.
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
import time
from typing import Iterable, NamedTuple

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from storage.records import iter_headers

_BASE_OFFSET = struct.Struct(">q")
_tags = itertools.count()


def make_batch(n_records: int, *, value_size: int = 100, keys=None, values=None,
               timestamp_ms: int | None = None, timestamps=None, base_offset: int = 0,
               tag: str | None = None, compression: int = 0) -> bytes:
    """One v2 batch of ``n_records`` records at ``base_offset``.

    Values are ``value_size`` bytes that name a unique tag and the record's index, so two
    batches built by this function never have the same bytes (a record served twice or at the
    wrong offset shows up as a byte mismatch). ``timestamp_ms`` stamps every record (default:
    now); ``timestamps`` gives one per record. ``keys``/``values`` give one per record
    (None entries allowed: a null key / a tombstone).
    """
    if n_records < 1:
        raise ValueError("a batch needs at least one record")
    tag = f"b{next(_tags)}" if tag is None else tag
    if timestamps is None:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        timestamps = [ts] * n_records
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 30)
    for i in range(n_records):
        if values is not None:
            value = values[i]
        else:
            value = f"{tag}:{i}:".encode().ljust(value_size, b".")[:max(value_size, 1)]
        key = keys[i] if keys is not None else None
        builder.append(i, timestamp=timestamps[i], key=key, value=value, headers=[])
    data = bytes(builder.build())
    if base_offset:
        data = with_base_offset(data, base_offset)
    return data


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """``batch`` with its base offset rewritten (the field is outside the CRC)."""
    return _BASE_OFFSET.pack(base_offset) + bytes(batch[8:])


class StoredBatch(NamedTuple):
    base_offset: int
    last_offset: int
    data: bytes


def split_batches(data: bytes) -> list[StoredBatch]:
    """Split what Log.read returned into its batches (CRC-checked by storage.records)."""
    out = []
    mv = memoryview(data)
    for h in iter_headers(data):
        out.append(StoredBatch(h.base_offset, h.last_offset,
                               bytes(mv[h.position:h.position + h.size])))
    return out


def kafka_records(batch: bytes) -> list:
    """Decode one stored batch with kafka-python (the oracle); asserts its CRC is valid."""
    b = DefaultRecordBatch(bytes(batch))
    assert b.validate_crc(), "kafka-python rejects the CRC of a stored batch"
    return list(b)


def read_all(log, start: int | None = None, *, max_bytes: int = 1 << 16) -> list[StoredBatch]:
    """Every batch from ``start`` (default: log start) to the log end, read sequentially;
    asserts reads make progress and stay on batch boundaries."""
    offset = log.log_start_offset if start is None else start
    out: list[StoredBatch] = []
    end = log.log_end_offset
    for _ in range(10_000_000):
        if offset >= end:
            break
        data = log.read(offset, max_bytes)
        assert data, f"read at {offset} < log end {end} returned nothing"
        batches = split_batches(data)
        assert batches[0].last_offset >= offset, f"read at {offset} served {batches[0][:2]}"
        out.extend(batches)
        offset = batches[-1].last_offset + 1
    return out


def assert_contiguous(batches: Iterable[StoredBatch], start: int, end: int) -> None:
    """Batches cover exactly [start, end) without gaps or overlaps."""
    expected = start
    for b in batches:
        assert b.base_offset == expected, f"gap or overlap: batch {b[:2]} where {expected} was due"
        assert b.last_offset >= b.base_offset
        expected = b.last_offset + 1
    assert expected == end, f"batches end at {expected}, log end offset is {end}"


def crash_image(src: str, dst: str) -> str:
    """Copy a log directory as it is on disk now, as a crash would leave it (no clean-shutdown
    marker, whatever the OS has of the files, the in-memory index entries lost)."""
    shutil.copytree(src, dst)
    return dst


class FakeClock:
    """A settable millisecond clock to inject with ``Log.open(..., clock=clock)``."""

    def __init__(self, now_ms: int = 1_000_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def segment_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path)
                  if n.endswith((".log", ".index", ".timeindex")) and n[:20].isdigit())
