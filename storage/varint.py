"""Zig-zag varints as Kafka's v2 records use them (protobuf's encoding).

A signed value ``x`` is first zig-zag mapped to an unsigned one (0, -1, 1, -2 ... become
0, 1, 2, 3 ...) so that small magnitudes of either sign stay short, then written 7 bits per
byte, least significant group first, the high bit of each byte saying "more follows".
Kafka bounds the length: 5 bytes for a varint (int32 fields: lengths, offset deltas, header
counts) and 10 for a varlong (the timestamp delta). A longer encoding is corrupt, never read
on: that bound is what keeps a decoder of hostile bytes from looping or growing integers.

Three flavours live here, all encoding the same bytes:

* scalar ``encode_varint`` / ``decode_varint`` for the odd field;
* ``ZZ_TABLE``: the encodings of every value in ``[-TABLE_LIMIT, TABLE_LIMIT)``, so that the
  builder's per-record work is a list lookup instead of a loop;
* numpy ``encode_array`` / ``decode_at``: many varints at once, for the columnar paths.

Pure functions, no state; thread-safe.
"""

from __future__ import annotations

from .errors import CorruptRecordError
from .lazy import lazy_module

np = lazy_module(globals(), "np", "numpy")   # imported on first use (storage/lazy.py)

MAX_VARINT_BYTES = 5  # int32 fields
MAX_VARLONG_BYTES = 10  # int64 fields

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def zigzag(x: int) -> int:
    """The unsigned zig-zag image of a signed 64-bit ``x``."""
    return (x << 1) ^ (x >> 63)


def unzigzag(u: int) -> int:
    return (u >> 1) ^ -(u & 1)


def encode_varint(x: int) -> bytes:
    """The bytes of signed ``x`` (any int64) as a zig-zag varint."""
    if not INT64_MIN <= x <= INT64_MAX:
        raise ValueError(f"{x} does not fit a varlong")
    u = zigzag(x)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def size_of_varint(x: int) -> int:
    return len(encode_varint(x))


def decode_varint(buf, pos: int, *, end: int | None = None,
                  max_bytes: int = MAX_VARLONG_BYTES) -> tuple[int, int]:
    """(value, position after it) of the zig-zag varint at ``buf[pos]``.

    Raises CorruptRecordError if the varint runs past ``end`` (default: the end of ``buf``)
    or is longer than ``max_bytes``.
    """
    if end is None:
        end = len(buf)
    u = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise CorruptRecordError(f"varint at position {start} runs past the end ({end})")
        b = buf[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if pos - start >= max_bytes:
            raise CorruptRecordError(
                f"varint at position {start} is longer than {max_bytes} bytes")
    return (u >> 1) ^ -(u & 1), pos


# Encodings of every value in [-TABLE_LIMIT, TABLE_LIMIT): index with ``x + TABLE_LIMIT``.
# 8192 covers one- and two-byte varints, i.e. every record length, key/value length and
# offset delta of an ordinary batch.
TABLE_LIMIT = 8192
ZZ_TABLE: list[bytes] = [encode_varint(x) for x in range(-TABLE_LIMIT, TABLE_LIMIT)]


def varint(x: int, _table=ZZ_TABLE, _limit=TABLE_LIMIT) -> bytes:
    """``encode_varint`` through the table when ``x`` is small (the common case)."""
    if -_limit <= x < _limit:
        return _table[x + _limit]
    return encode_varint(x)


# ---- numpy flavours ---------------------------------------------------------------------

# Smallest unsigned value needing k+1 bytes, for k = 1..9 (made on first use: numpy is).
_SIZE_THRESHOLDS = None


def sizes_of(values: np.ndarray) -> np.ndarray:
    """Encoded size (1..10) of every signed int64 in ``values``, as int64."""
    global _SIZE_THRESHOLDS
    if _SIZE_THRESHOLDS is None:
        _SIZE_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, MAX_VARLONG_BYTES)],
                                    np.uint64)
    return np.searchsorted(_SIZE_THRESHOLDS, zigzag_array(values), side="right") + 1


def zigzag_array(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def encode_columns(values: np.ndarray, size: int) -> np.ndarray:
    """A (len(values), size) uint8 array: row i is the varint of ``values[i]``, every one of
    which must have exactly ``size`` bytes (see ``sizes_of``)."""
    u = zigzag_array(values)
    out = np.empty((u.shape[0], size), np.uint8)
    for k in range(size):
        byte = (u >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k < size - 1:
            byte |= np.uint64(0x80)
        out[:, k] = byte
    return out


def decode_at(data: np.ndarray, positions: np.ndarray, max_bytes: int,
              what: str = "varint") -> tuple[np.ndarray, np.ndarray]:
    """Decode the zig-zag varint at each of ``positions`` of uint8 ``data``.

    Returns (values int64, sizes int64). Reads may run past a record's end (callers then
    check that each field ends inside its record) and past the end of ``data``: there they
    clip, reading its last byte again, so a varint cut off by the end of ``data`` either
    grows longer than ``max_bytes`` or ends past every record (never an IndexError).
    Raises CorruptRecordError for a varint longer than ``max_bytes``.
    """
    byte = data.take(positions)
    cont = byte >= 0x80
    if not cont.any():  # all one byte: the common case for lengths and deltas
        b = byte.astype(np.int64)
        return (b >> 1) ^ -(b & 1), np.ones(positions.shape, np.int64)
    u = (byte & 0x7F).astype(np.uint64)
    size = np.ones(positions.shape, np.int64)
    k = 1
    while True:
        active = int(np.count_nonzero(cont))
        if not active:
            break
        if k >= max_bytes:
            bad = int(positions[np.flatnonzero(cont)[0]])
            raise CorruptRecordError(
                f"{what} at position {bad} is longer than {max_bytes} bytes")
        shift = np.uint64(7 * k)
        if active * 4 >= len(positions):  # most continue: whole-array steps are cheaper
            byte = data.take(positions + k, mode="clip")
            u |= ((byte & 0x7F).astype(np.uint64) << shift) * cont
            size += cont
            cont &= byte >= 0x80
        else:  # a few long ones: touch only those
            idx = np.flatnonzero(cont)
            byte = data.take(positions[idx] + k, mode="clip")
            u[idx] |= (byte & 0x7F).astype(np.uint64) << shift
            size[idx] += 1
            cont[idx] = byte >= 0x80
        k += 1
    signed = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
    return signed, size


__all__ = ["MAX_VARINT_BYTES", "MAX_VARLONG_BYTES", "ZZ_TABLE", "TABLE_LIMIT", "zigzag",
           "unzigzag", "encode_varint", "decode_varint", "size_of_varint", "varint",
           "sizes_of", "zigzag_array", "encode_columns", "decode_at"]
