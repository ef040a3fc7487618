"""Kafka's v2 record batch (magic 2): the unit that is appended, stored, replicated and fetched.

Byte layout of one batch (big-endian; positions from the start of the batch)::

    pos  size  field
      0     8  base_offset              not covered by the CRC: the leader rewrites it
      8     4  batch_length             bytes after this field (= total size - 12)
     12     4  partition_leader_epoch   not covered by the CRC: the leader rewrites it
     16     1  magic                    2 (0 and 1 are the seed's legacy messages)
     17     4  crc                      CRC32C (Castagnoli) of bytes 21 .. end
     21     2  attributes               bits 0-2 codec, 3 timestamp type, 4 transactional,
                                        5 control, 6 has-delete-horizon
     23     4  last_offset_delta
     27     8  base_timestamp           (Kafka: firstTimestamp)
     35     8  max_timestamp
     43     8  producer_id
     51     2  producer_epoch
     53     4  base_sequence
     57     4  records_count
     61     -  records (compressed as a whole when the codec is not none)

The CRC starts at ``attributes`` so that the leader can rewrite ``base_offset`` and
``partition_leader_epoch`` without recomputing it; ``max_timestamp`` *is* covered, so a
LogAppendTime rewrite re-checksums.

This module holds the batch-level framing used by the log (header parse, bounds and CRC
validation, offset assignment). The per-record codec lives below it in this module too.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import crc32c as _crc32c

from .errors import CorruptRecordError, UnsupportedVersionError

# One struct for the whole 61-byte header; every position below is derived from it.
HEADER = struct.Struct(
    ">q"  # base_offset
    "i"  # batch_length
    "i"  # partition_leader_epoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # last_offset_delta
    "q"  # base_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # records_count
)
HEADER_SIZE = HEADER.size  # 61
assert HEADER_SIZE == 61

BASE_OFFSET_POS = 0
LENGTH_POS = struct.calcsize(">q")  # 8
LOG_OVERHEAD = struct.calcsize(">qi")  # 12: base_offset + batch_length precede every batch
PARTITION_LEADER_EPOCH_POS = LOG_OVERHEAD  # 12
MAGIC_POS = struct.calcsize(">qii")  # 16 (also the magic position of a legacy message)
CRC_POS = MAGIC_POS + 1  # 17
ATTRIBUTES_POS = CRC_POS + 4  # 21: the CRC covers from here to the end of the batch
LAST_OFFSET_DELTA_POS = ATTRIBUTES_POS + 2  # 23
BASE_TIMESTAMP_POS = LAST_OFFSET_DELTA_POS + 4  # 27
MAX_TIMESTAMP_POS = BASE_TIMESTAMP_POS + 8  # 35
RECORDS_COUNT_POS = HEADER_SIZE - 4  # 57

MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: a batch of zero records

CURRENT_MAGIC = 2

# attributes bits
CODEC_MASK = 0x07
CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")


def crc32c(data) -> int:
    return _crc32c.crc32c(data)


class BatchHeader(NamedTuple):
    """The 61-byte header of one v2 batch, plus where it sits in the buffer it came from."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int  # byte position of the batch in the buffer/file it was read from

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def parse_header(buf, position: int = 0, *, check_crc: bool = True,
                 max_batch_bytes: int | None = None) -> BatchHeader:
    """Parse and validate the batch that starts at ``position`` of ``buf``.

    Checks, in order: the 12-byte log overhead fits, the magic is 2, the length is at least a
    header and does not run past the end of ``buf`` (nor past ``max_batch_bytes``), the fields
    are consistent, and (unless ``check_crc`` is False) the CRC32C matches. Raises
    CorruptRecordError (UnsupportedVersionError for a magic that is not 2) naming the position.
    """
    end = len(buf)
    if position + HEADER_SIZE > end:
        if position + LOG_OVERHEAD <= end:
            (length,) = _I32.unpack_from(buf, position + LENGTH_POS)
            raise CorruptRecordError(
                f"truncated batch at position {position}: batch_length {length} but only "
                f"{end - position - LOG_OVERHEAD} bytes follow the length field")
        raise CorruptRecordError(
            f"truncated batch at position {position}: {end - position} bytes, "
            f"a batch header needs {HEADER_SIZE}")
    fields = HEADER.unpack_from(buf, position)
    length = fields[1]
    magic = fields[3]
    if magic != CURRENT_MAGIC:
        if magic in (0, 1):
            raise UnsupportedVersionError(
                f"legacy message (magic {magic}) at position {position} where a v2 batch was "
                f"expected; up-convert it first")
        raise UnsupportedVersionError(f"unknown magic {magic} at position {position}")
    if length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at position {position}: batch_length {length} is smaller than the "
            f"minimum {MIN_BATCH_LENGTH}")
    size = length + LOG_OVERHEAD
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise CorruptRecordError(
            f"batch at position {position}: size {size} exceeds the limit {max_batch_bytes}")
    if position + size > end:
        raise CorruptRecordError(
            f"truncated batch at position {position}: batch_length {length} points past the "
            f"end of the data ({end - position - LOG_OVERHEAD} bytes follow the length field)")
    last_offset_delta = fields[6]
    records_count = fields[12]
    if last_offset_delta < 0 or records_count < 0:
        raise CorruptRecordError(
            f"batch at position {position}: negative last_offset_delta ({last_offset_delta}) "
            f"or records_count ({records_count})")
    if check_crc:
        actual = _crc32c.crc32c(memoryview(buf)[position + ATTRIBUTES_POS:position + size])
        if actual != fields[4]:
            raise CorruptRecordError(
                f"batch at position {position} (base offset {fields[0]}): CRC32C mismatch, "
                f"stored {fields[4]:#010x}, computed {actual:#010x}")
    return BatchHeader(*fields, position)


def iter_headers(buf, position: int = 0, *, check_crc: bool = True) -> Iterator[BatchHeader]:
    """Every batch header in ``buf`` from ``position`` to the end; raises on the first bad one,
    including trailing bytes that do not form a whole batch."""
    end = len(buf)
    while position < end:
        header = parse_header(buf, position, check_crc=check_crc)
        yield header
        position += header.size


def valid_prefix(buf, position: int = 0) -> tuple[int, list[BatchHeader], str | None]:
    """Scan ``buf`` from ``position``; return (bytes of whole valid batches, their headers,
    why the scan stopped or None at a clean end). Never raises for bad data: recovery uses it
    to find the first invalid byte."""
    end = len(buf)
    headers: list[BatchHeader] = []
    start = position
    while position < end:
        try:
            header = parse_header(buf, position)
        except CorruptRecordError as exc:
            return position - start, headers, str(exc)
        headers.append(header)
        position += header.size
    return position - start, headers, None


def assign_offsets(batch, base_offset: int, *, log_append_time_ms: int | None = None,
                   partition_leader_epoch: int | None = None) -> bytearray:
    """A copy of one v2 batch with its base offset (and optionally leader epoch) rewritten.

    With ``log_append_time_ms`` the timestamp-type bit is set and max_timestamp becomes that
    time, as a leader does for LogAppendTime topics; the CRC is then recomputed.
    """
    out = bytearray(batch)
    _I64.pack_into(out, BASE_OFFSET_POS, base_offset)
    if partition_leader_epoch is not None:
        _I32.pack_into(out, PARTITION_LEADER_EPOCH_POS, partition_leader_epoch)
    if log_append_time_ms is not None:
        (attributes,) = _I16.unpack_from(out, ATTRIBUTES_POS)
        _I16.pack_into(out, ATTRIBUTES_POS, attributes | TIMESTAMP_TYPE_MASK)
        _I64.pack_into(out, MAX_TIMESTAMP_POS, log_append_time_ms)
        _U32.pack_into(out, CRC_POS, _crc32c.crc32c(memoryview(out)[ATTRIBUTES_POS:]))
    return out
