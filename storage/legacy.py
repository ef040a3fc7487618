"""The seed's v0/v1 messages (magic 0 and 1), read and up-converted to one v2 batch.

A legacy *message set* is a sequence of entries (big-endian)::

    offset       int64
    size         int32    bytes of the message that follows
    crc          uint32   CRC32 (zlib's, IEEE) of magic .. end of the message
    magic        int8     0 or 1
    attributes   int8     bits 0-2 codec (none, gzip, snappy, lz4), bit 3 timestamp type
    timestamp    int64    magic 1 only (ms; magic 0 has none: -1 after up-conversion)
    key_length   int32    -1: null
    key          bytes
    value_length int32    -1: null
    value        bytes

A compressed entry is a *wrapper*: its value is a whole inner message set compressed with
the codec of its attributes (magic 0 LZ4 with Kafka 0.8's broken frame header checksum).
Inner messages are never compressed again. In magic 1 inner offsets are relative
(0..n-1) and the wrapper carries the absolute offset of the *last* inner message (a
producer's wrapper carries 0: inner offsets are then used as they are); in magic 0 inner
offsets are absolute. With timestamp type LogAppendTime (magic 1) the wrapper's
timestamp is every inner message's timestamp.

Every entry's CRC (wrappers and inner messages) is checked; every length is bounded by the
bytes present; decompression is bounded by ``max_decompressed_bytes``. Pure functions.
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterator, NamedTuple

from . import compression
from .compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from .errors import CorruptRecordError, InvalidRecordError, UnsupportedVersionError
from .records import (CREATE_TIME, CURRENT_MAGIC, LOG_APPEND_TIME, MAGIC_POS, RecordBatch,
                      parse_header)

# offset, size, crc, magic, attributes: common to both versions
ENTRY_V0 = struct.Struct(">qiIbb")
TIMESTAMP = struct.Struct(">q")
LENGTH = struct.Struct(">i")
LOG_OVERHEAD = struct.calcsize(">qi")  # 12
CRC_START = LOG_OVERHEAD + 4  # 16: the CRC covers magic .. end of message
KEY_LENGTH_POS = {0: ENTRY_V0.size, 1: ENTRY_V0.size + TIMESTAMP.size}  # 18, 26
MIN_MESSAGE_SIZE = {0: 4 + 1 + 1 + 4 + 4, 1: 4 + 1 + 1 + 8 + 4 + 4}  # size field values

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
NO_TIMESTAMP = -1


class LegacyRecord(NamedTuple):
    """One message of a legacy message set, after unwrapping compression."""

    offset: int
    timestamp: int  # -1 for magic 0
    timestamp_type: int  # LOG_APPEND_TIME only for magic 1 messages that say so
    key: bytes | None
    value: bytes | None
    codec: int  # of the wrapper it came in (0: not compressed)
    magic: int


class _Entry(NamedTuple):
    offset: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    position: int


def _entries(buf, *, where: str) -> Iterator[_Entry]:
    """Validated entries of one message set, without unwrapping."""
    end = len(buf)
    pos = 0
    while pos < end:
        if pos + ENTRY_V0.size > end:
            raise CorruptRecordError(
                f"truncated legacy message at position {pos}{where}: {end - pos} bytes")
        offset, size, crc, magic, attributes = ENTRY_V0.unpack_from(buf, pos)
        if magic not in (0, 1):
            raise UnsupportedVersionError(
                f"message at position {pos}{where} has magic {magic}, not 0 or 1")
        if size < MIN_MESSAGE_SIZE[magic]:
            raise CorruptRecordError(
                f"legacy message at position {pos}{where}: size {size} is below the "
                f"minimum {MIN_MESSAGE_SIZE[magic]} for magic {magic}")
        stop = pos + LOG_OVERHEAD + size
        if stop > end:
            raise CorruptRecordError(
                f"truncated legacy message at position {pos}{where}: size {size} points past "
                f"the end ({end - pos - LOG_OVERHEAD} bytes follow the size field)")
        actual = zlib.crc32(memoryview(buf)[pos + CRC_START:stop])
        if actual != crc:
            raise CorruptRecordError(
                f"legacy message at position {pos}{where} (offset {offset}): CRC32 "
                f"mismatch, stored {crc:#010x}, computed {actual:#010x}")
        p = pos + KEY_LENGTH_POS[magic]
        timestamp = TIMESTAMP.unpack_from(buf, pos + ENTRY_V0.size)[0] if magic else \
            NO_TIMESTAMP
        key, p = _bytes_field(buf, p, stop, "key", pos, where)
        value, p = _bytes_field(buf, p, stop, "value", pos, where)
        if p != stop:
            raise CorruptRecordError(
                f"legacy message at position {pos}{where}: {stop - p} bytes after its value")
        yield _Entry(offset, magic, attributes, timestamp, key, value, pos)
        pos = stop


def _bytes_field(buf, p: int, stop: int, what: str, pos: int, where: str):
    if p + LENGTH.size > stop:
        raise CorruptRecordError(
            f"legacy message at position {pos}{where}: no room for its {what} length")
    (n,) = LENGTH.unpack_from(buf, p)
    p += LENGTH.size
    if n == -1:
        return None, p
    if n < 0 or p + n > stop:
        raise CorruptRecordError(
            f"legacy message at position {pos}{where}: {what} length {n} out of bounds")
    return bytes(buf[p:p + n]), p + n


def iter_legacy(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                ) -> Iterator[LegacyRecord]:
    """Every message of legacy message set ``buf``, wrappers unwrapped, absolute offsets."""
    for entry in _entries(buf, where=""):
        codec = entry.attributes & CODEC_MASK
        ts_type = (LOG_APPEND_TIME if entry.magic == 1 and entry.attributes & TIMESTAMP_TYPE_MASK
                   else CREATE_TIME)
        if codec == compression.CODEC_NONE:
            yield LegacyRecord(entry.offset, entry.timestamp, ts_type, entry.key, entry.value,
                               codec, entry.magic)
            continue
        if entry.value is None:
            raise CorruptRecordError(
                f"compressed legacy message at position {entry.position} has a null value")
        if codec not in (compression.CODEC_GZIP, compression.CODEC_SNAPPY,
                         compression.CODEC_LZ4):
            raise compression.UnsupportedCodecError(
                f"legacy message at position {entry.position}: unknown codec {codec}")
        inner_set = compression.decompress(codec, entry.value,
                                           max_bytes=max_decompressed_bytes,
                                           legacy_lz4=entry.magic == 0)
        where = f" inside the wrapper at position {entry.position}"
        inner = list(_entries(inner_set, where=where))
        if not inner:
            raise CorruptRecordError(f"empty compressed message set{where}")
        # Magic 1 inner offsets are relative; the wrapper holds the last one's absolute.
        # A producer's wrapper (offset 0, before the broker assigned any) makes the shift
        # negative: then the inner offsets are taken as they are, as Kafka's clients do.
        shift = entry.offset - inner[-1].offset if entry.magic == 1 else 0
        if shift < 0:
            shift = 0
        for m in inner:
            if m.attributes & CODEC_MASK:
                raise CorruptRecordError(
                    f"double-compressed message at position {m.position}{where}")
            if m.magic != entry.magic:
                raise CorruptRecordError(
                    f"message of magic {m.magic} at position {m.position}{where} of magic "
                    f"{entry.magic}")
            timestamp = entry.timestamp if ts_type == LOG_APPEND_TIME else m.timestamp
            yield LegacyRecord(m.offset + shift, timestamp, ts_type, m.key, m.value, codec,
                               m.magic)


def upconvert(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
              partition_leader_epoch: int = -1) -> bytes:
    """One v2 batch holding every message of legacy message set ``buf``.

    Keeps offsets (base_offset = the first; the others as deltas), keys, values, timestamps
    (-1 for magic 0) and the codec (of the first compressed wrapper; none if none is). The
    batch is LogAppendTime only when every message is magic 1 LogAppendTime with a single
    timestamp, so that decoding gives each record back its own timestamp; otherwise
    CreateTime with each message's effective timestamp. Raises CorruptRecordError for bad
    bytes, InvalidRecordError when offsets are not strictly increasing (or span more than
    an int32) and so cannot be v2 deltas.
    """
    records = list(iter_legacy(buf, max_decompressed_bytes=max_decompressed_bytes))
    if not records:
        raise CorruptRecordError("empty legacy message set")
    base = records[0].offset
    deltas = [r.offset - base for r in records]
    if any(b <= a for a, b in zip(deltas, deltas[1:])) or deltas[-1] > 2**31 - 1:
        raise InvalidRecordError(
            f"legacy offsets {[r.offset for r in records][:8]}... are not strictly "
            f"increasing within an int32 range; they cannot be v2 offset deltas")
    codec = next((r.codec for r in records if r.codec), compression.CODEC_NONE)
    timestamps = [r.timestamp for r in records]
    log_append = (all(r.timestamp_type == LOG_APPEND_TIME for r in records)
                  and len(set(timestamps)) == 1)
    return RecordBatch.build(
        [r.value for r in records], keys=[r.key for r in records], timestamps=timestamps,
        offset_deltas=deltas, base_offset=base, compression=codec,
        timestamp_type=LOG_APPEND_TIME if log_append else CREATE_TIME,
        now_ms=timestamps[0], partition_leader_epoch=partition_leader_epoch)


def to_v2(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """``buf`` itself when it is one valid v2 batch; its up-conversion when its magic (byte
    16) is 0 or 1; UnsupportedVersionError for another magic, CorruptRecordError for bad
    bytes or bytes after the one v2 batch."""
    if len(buf) <= MAGIC_POS:
        raise CorruptRecordError(f"{len(buf)} bytes are too few for a batch or message")
    magic = buf[MAGIC_POS]
    if magic in (0, 1):
        return upconvert(buf, max_decompressed_bytes=max_decompressed_bytes)
    if magic != CURRENT_MAGIC:
        raise UnsupportedVersionError(f"unknown magic {magic} at position {MAGIC_POS}")
    header = parse_header(buf, 0)
    if header.size != len(buf):
        raise CorruptRecordError(
            f"{len(buf) - header.size} bytes after the v2 batch of {header.size} bytes")
    return buf


def build_legacy(records, *, magic: int, codec: int = 0, base_offset: int = 0,
                 log_append_time_ms: int | None = None) -> bytes:
    """A legacy message set of (key, value, timestamp) tuples, compressed into one wrapper
    when ``codec`` is set, as seed-era producers wrote it. For tests and tools."""
    if magic not in (0, 1):
        raise ValueError("magic must be 0 or 1")
    attributes = TIMESTAMP_TYPE_MASK if log_append_time_ms is not None and magic == 1 else 0
    if codec == compression.CODEC_NONE:
        return b"".join(_message(base_offset + i, magic, attributes, ts, key, value)
                        for i, (key, value, ts) in enumerate(records))
    inner_base = 0 if magic == 1 else base_offset  # magic 1: relative inner offsets
    inner = b"".join(_message(inner_base + i, magic, 0, ts, key, value)
                     for i, (key, value, ts) in enumerate(records))
    if codec == compression.CODEC_LZ4 and magic == 0:
        payload = compression.legacy_lz4_compress(inner)
    else:
        payload = compression.compress(codec, inner)
    wrapper_ts = log_append_time_ms if log_append_time_ms is not None else \
        max((ts for _, _, ts in records), default=NO_TIMESTAMP)
    return _message(base_offset + len(records) - 1, magic, attributes | codec, wrapper_ts,
                    None, payload)


def _message(offset: int, magic: int, attributes: int, timestamp, key, value) -> bytes:
    body = bytearray()
    body += struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += TIMESTAMP.pack(NO_TIMESTAMP if timestamp is None else timestamp)
    for field in (key, value):
        if field is None:
            body += LENGTH.pack(-1)
        else:
            body += LENGTH.pack(len(field)) + bytes(field)
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + bytes(body)


__all__ = ["LegacyRecord", "iter_legacy", "upconvert", "to_v2", "build_legacy"]
