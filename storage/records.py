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
validation, offset assignment) and, below it, the record codec:

- ``build(values, keys=None, timestamps=None, headers=None, *, offset_deltas=None,
  base_offset=0, compression=CODEC_NONE, timestamp_type=CREATE_TIME, producer_id=-1,
  producer_epoch=-1, base_sequence=-1, partition_leader_epoch=-1, is_transactional=False,
  is_control=False, now_ms=None) -> bytes`` (also ``RecordBatch.build``): one batch.
- ``RecordBatch(buf)``: one batch, validated; ``.header``, ``.records()``, iteration,
  ``.columns()``.
- ``decode_records(buf)`` / ``decode_columns(buf)`` / ``iter_batches(buf)``: every batch of a
  buffer of concatenated batches (a log read); ``Record`` is (offset, timestamp,
  timestamp_type, key, value, headers).
- The seed's v0/v1 messages (``upconvert(buf)`` / ``to_v2(buf)``) are ``storage.legacy``'s,
  which builds on this module; this module does not import it (one direction only).

Decoding always checks the CRC and every length, and bounds decompression
(``max_decompressed_bytes``, default 64 MiB per batch); bad bytes raise CorruptRecordError
(UnsupportedCodecError / UnsupportedVersionError for an unknown codec / magic). Everything
here is a pure function of its arguments and thread-safe.

Performance note: the vectorised decoders allocate and free many ~100 KB numpy temporaries;
glibc's default heap trimming then returns and page-faults that memory on every call, which
costs 30-40% of decoding throughput. Processes that decode a lot (brokers, readers) gain it
back with ``MALLOC_TRIM_THRESHOLD_=1000000000 MALLOC_MMAP_THRESHOLD_=1000000000`` in their
environment (for Ray actors: ``runtime_env={"env_vars": {...}}``).
"""

from __future__ import annotations

import gc as _gc
import itertools as _itertools
import struct
import time as _time
from typing import Iterator, NamedTuple

import crc32c as _crc32c

from . import compression as _compression
from . import varint as _varint
from .compression import DEFAULT_MAX_DECOMPRESSED_BYTES, codec_id
from .errors import CorruptRecordError, InvalidRecordError, UnsupportedVersionError
from .lazy import lazy_module

_np = lazy_module(globals(), "_np", "numpy")   # imported on first use (storage/lazy.py)

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
PRODUCER_ID_POS = MAX_TIMESTAMP_POS + 8  # 43: producer_id, producer_epoch, base_sequence
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
    header = BatchHeader(*fields, position)
    if check_crc:
        check_batch_crc(buf, header)
    return header


def check_batch_crc(buf, header: BatchHeader) -> None:
    """Raise CorruptRecordError unless the CRC32C of the batch ``header`` describes (at its
    position in ``buf``) matches. The crc32c package releases the GIL for large inputs, so
    this may run in another thread while the caller writes."""
    position = header.position
    actual = _crc32c.crc32c(memoryview(buf)[position + ATTRIBUTES_POS:position + header.size])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at position {position} (base offset {header.base_offset}): CRC32C "
            f"mismatch, stored {header.crc:#010x}, computed {actual:#010x}")


def iter_headers(buf, position: int = 0, *, check_crc: bool = True) -> Iterator[BatchHeader]:
    """Every batch header in ``buf`` from ``position`` to the end; raises on the first bad one,
    including trailing bytes that do not form a whole batch."""
    end = len(buf)
    while position < end:
        header = parse_header(buf, position, check_crc=check_crc)
        yield header
        position += header.size


def valid_prefix(buf, position: int = 0, *, check_crc: bool = True
                 ) -> tuple[int, list[BatchHeader], str | None]:
    """Scan ``buf`` from ``position``; return (bytes of whole valid batches, their headers,
    why the scan stopped or None at a clean end). Never raises for bad data: recovery uses it
    to find the first invalid byte. ``check_crc=False`` checks framing only (for a reader
    whose decode checks the CRCs anyway)."""
    end = len(buf)
    headers: list[BatchHeader] = []
    start = position
    while position < end:
        try:
            header = parse_header(buf, position, check_crc=check_crc)
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


# =========================================================================================
# The record codec.
#
# Inside a batch, after the 61-byte header (compressed as a whole when the codec is not
# none), come ``records_count`` records, each::
#
#     length          varint   bytes of the record after this field
#     attributes      int8     unused, written 0
#     timestamp_delta varlong  timestamp - base_timestamp
#     offset_delta    varint   offset - base_offset
#     key_length      varint   -1 for a null key
#     key             bytes
#     value_length    varint   -1 for a null value
#     value           bytes
#     header_count    varint
#     headers         [key_length varint, key utf-8, value_length varint (-1 null), value]
#
# Speed comes from doing per-record work in C: the builder writes uniform records (same key
# and value lengths, no headers: what producers mostly send) as 2-D numpy copies and falls
# back to a tight list-join loop otherwise; the decoder finds record boundaries by
# "galloping" (guess that the next records have the same length bytes as this one, verify
# the guess for a whole window at once with numpy) and then decodes every field of every
# record of every batch of a fetch with vectorised varint reads.
# =========================================================================================


NO_TIMESTAMP = -1
# The smallest record: length, attributes, timestamp delta, offset delta, key length,
# value length and header count, one byte each. Bounds what a records_count may claim.
MIN_RECORD_BYTES = 7
_PAD = b"\x00" * 32  # lets vectorised varint reads run past a record end without IndexError
_INT32_MAX = 2**31 - 1


def headers_type():
    """The pyarrow type of the ``headers`` column: list<struct<key: string, value: binary>>.
    (pyarrow is imported only by the columnar path: the log does not need it.)"""
    import pyarrow as pa
    return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class Record(NamedTuple):
    """One decoded record. ``headers`` is a list of (key str, value bytes or None)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list


# ---- building ---------------------------------------------------------------------------

def build(values, keys=None, timestamps=None, headers=None, *, offset_deltas=None,
          base_offset: int = 0, compression=CODEC_NONE, timestamp_type: int = CREATE_TIME,
          producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
          base_sequence: int = NO_SEQUENCE,
          partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
          is_transactional: bool = False, is_control: bool = False,
          now_ms: int | None = None) -> bytes:
    """One v2 batch holding ``values[i]`` with ``keys[i]``, ``timestamps[i]``, ``headers[i]``.

    - ``values``/``keys``: sequences of bytes-like or None (null); ``keys=None``: all null.
    - ``timestamps``: ms since the epoch; None: every record gets ``now_ms`` (default: now).
    - ``headers``: None, or per record a list of (str key, bytes-or-None value).
    - ``offset_deltas``: strictly increasing ints >= 0 (the compactor keeps original offsets,
      gaps allowed); default 0..n-1. ``last_offset_delta`` is the last one.
    - ``compression``: codec id (``CODEC_*``) or name ("none", "gzip", "snappy", "lz4", "zstd").
    - ``timestamp_type=LOG_APPEND_TIME`` sets the attribute bit and ``max_timestamp`` to
      ``now_ms`` (the log append time); records keep their own deltas, and readers see
      ``max_timestamp`` as every record's timestamp, as Kafka specifies.

    The base timestamp is the first record's, as Kafka's producer writes it. Raises TypeError
    or ValueError for malformed arguments, InvalidRecordError for offset deltas that are not
    strictly increasing within int32, UnsupportedCodecError for an unknown codec.
    """
    n = len(values)
    codec = codec_id(compression)
    if keys is not None and len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} values")
    if headers is not None and len(headers) != n:
        raise ValueError(f"{len(headers)} header lists for {n} values")
    if now_ms is None:
        now_ms = int(_time.time() * 1000)
    reserve = HEADER_SIZE if codec == CODEC_NONE else 0
    small = _small_fields(n, timestamps, offset_deltas, now_ms)
    if small is not None:
        # a few records (a producer at linger 0): plain Python, no numpy call at all
        # (numpy's per-call cost is most of a one-record batch's time)
        td, od, base_timestamp, max_timestamp = small
        last_offset_delta = od[-1]
        records = _build_general(values, keys, td, od, headers, reserve)
    else:
        records, base_timestamp, max_timestamp, last_offset_delta = _numpy_records(
            values, keys, timestamps, headers, offset_deltas, now_ms, reserve)
    if timestamp_type == LOG_APPEND_TIME:
        max_timestamp = now_ms
    elif timestamp_type != CREATE_TIME:
        raise ValueError(f"timestamp_type must be CREATE_TIME (0) or LOG_APPEND_TIME (1), "
                         f"not {timestamp_type!r}")
    attributes = (codec | (TIMESTAMP_TYPE_MASK if timestamp_type == LOG_APPEND_TIME else 0)
                  | (TRANSACTIONAL_MASK if is_transactional else 0)
                  | (CONTROL_MASK if is_control else 0))
    if codec == CODEC_NONE:
        out = records  # a writable buffer with HEADER_SIZE bytes reserved in front
    else:
        out = bytearray(HEADER_SIZE)
        out += _compression.compress(codec, memoryview(records))
    HEADER.pack_into(out, 0, base_offset, len(out) - LOG_OVERHEAD, partition_leader_epoch,
                     CURRENT_MAGIC, 0, attributes, last_offset_delta, base_timestamp,
                     max_timestamp, producer_id, producer_epoch, base_sequence, n)
    _U32.pack_into(out, CRC_POS, _crc32c.crc32c(memoryview(out)[ATTRIBUTES_POS:]))
    return out if isinstance(out, bytes) else bytes(out)


def _numpy_records(values, keys, timestamps, headers, offset_deltas, now_ms: int,
                   reserve: int):
    """``build``'s records (``reserve`` bytes in front) with its fields computed by
    numpy: (records, base timestamp, max timestamp, last offset delta)."""
    n = len(values)
    if timestamps is None:
        ts = _np.full(n, now_ms, _np.int64)
    else:
        if len(timestamps) != n:
            raise ValueError(f"{len(timestamps)} timestamps for {n} values")
        ts = _np.asarray(timestamps, dtype=_np.int64)
    if offset_deltas is None:
        od = _np.arange(n, dtype=_np.int64)
    else:
        if len(offset_deltas) != n:
            raise ValueError(f"{len(offset_deltas)} offset deltas for {n} values")
        od = _np.asarray(offset_deltas, dtype=_np.int64)
        if n and (od[0] < 0 or od[-1] > _INT32_MAX or (n > 1 and (_np.diff(od) <= 0).any())):
            raise InvalidRecordError(
                "offset_deltas must be strictly increasing integers in [0, 2**31-1]")
    if n:
        base_timestamp = int(ts[0])
        max_timestamp = int(ts.max())
        if (max_timestamp - base_timestamp > _varint.INT64_MAX
                or int(ts.min()) - base_timestamp < _varint.INT64_MIN):
            raise ValueError("timestamps too far apart for int64 timestamp deltas")
        td = ts - ts[0]
        last_offset_delta = int(od[-1])
    else:
        base_timestamp = max_timestamp = NO_TIMESTAMP
        td = ts
        last_offset_delta = 0
    records = None
    if headers is None or not any(headers):
        records = _build_uniform(values, keys, td, od, reserve)
    if records is None:
        records = _build_general(values, keys, td.tolist(), od.tolist(), headers, reserve)
    return records, base_timestamp, max_timestamp, last_offset_delta


#: batches of at most this many records are built without numpy (measured in a hot loop:
#: one 100-byte record 6-9.5 us against 41 us through numpy, 24 records 26-42 us
#: against about 57)
SMALL_BATCH_RECORDS = 24


def _small_fields(n: int, timestamps, offset_deltas, now_ms: int):
    """For a batch of 1..SMALL_BATCH_RECORDS records whose timestamps and offset deltas
    are None or Python ints: (timestamp deltas, offset deltas, base timestamp, max
    timestamp) as lists. None when the numpy path must decide (more records, other
    types, values out of int64: it raises what it raises for them). InvalidRecordError
    and ValueError as ``build`` for bad deltas and timestamps."""
    if not 0 < n <= SMALL_BATCH_RECORDS:
        return None
    ts = [now_ms] * n if timestamps is None else _int64s(timestamps, n, "timestamps")
    od = list(range(n)) if offset_deltas is None else \
        _int64s(offset_deltas, n, "offset deltas")
    if ts is None or od is None:
        return None
    if offset_deltas is not None and (od[0] < 0 or od[-1] > _INT32_MAX
                                      or any(b <= a for a, b in zip(od, od[1:]))):
        raise InvalidRecordError(
            "offset_deltas must be strictly increasing integers in [0, 2**31-1]")
    base = ts[0]
    td = [t - base for t in ts]
    if max(td) > _varint.INT64_MAX or min(td) < _varint.INT64_MIN:
        raise ValueError("timestamps too far apart for int64 timestamp deltas")
    return td, od, base, max(ts)


def _int64s(items, n: int, what: str) -> list | None:
    """``items`` as a list when they are ``n`` Python ints within int64; None when not
    (the numpy path decides); ValueError for a count other than ``n``."""
    if len(items) != n:
        raise ValueError(f"{len(items)} {what} for {n} values")
    out = list(items)
    if not all(type(v) is int and _varint.INT64_MIN <= v <= _varint.INT64_MAX for v in out):
        return None
    return out


def _lengths(items):
    """(common length, joined bytes) when every item of ``items`` is bytes-like of one
    length; (-1, b"") when all are None; None otherwise (the general path handles it)."""
    if items is None:
        return -1, b""
    try:
        lengths = set(map(len, items))
    except TypeError:  # a None among them, or a wrong type that the general path reports
        if all(item is None for item in items):
            return -1, b""
        return None
    if len(lengths) > 1:
        return None
    try:
        return (lengths.pop() if lengths else 0), b"".join(items)
    except TypeError:
        return None


def _build_uniform(values, keys, td, od, reserve: int):
    """The records of a batch whose keys all have one length (or are all null), whose values
    all have one length, and that has no headers, as a writable buffer with ``reserve``
    bytes in front; None when the batch is not like that.

    The records then differ only in their timestamp and offset delta varints, so a run of
    records whose two varints have the same sizes has one record size R: the run is an
    (m, R) uint8 matrix, set to a template row and then overwritten column block by column
    block (keys, values, varying deltas) with numpy copies.
    """
    n = len(values)
    vk = _lengths(keys)
    vv = _lengths(values) if vk is not None else None
    if vv is None or n == 0:
        return None
    key_len, key_bytes = vk
    value_len, value_bytes = vv
    key_varint = _varint.varint(key_len)
    value_varint = _varint.varint(value_len)
    fields = [_Field.of(td), _Field.of(od)]
    if fields[0].sizes is None and fields[1].sizes is None:
        bounds = [0, n]
    else:
        code = fields[0].size_array(n) * 16 + fields[1].size_array(n)
        cuts = _np.flatnonzero(code[1:] != code[:-1]) + 1
        if len(cuts) > n // 16 + 4:  # many short runs: numpy's per-call cost would dominate
            return None
        bounds = [0, *cuts.tolist(), n]
    fixed = (1 + len(key_varint) + max(key_len, 0) + len(value_varint) + max(value_len, 0)
             + 1)
    plan = []
    total = reserve
    for a, b in zip(bounds, bounds[1:]):
        widths = [f.width(a) for f in fields]
        body = fixed + sum(widths)
        size = len(_varint.varint(body)) + body
        plan.append((a, b, body, size, widths))
        total += size * (b - a)
    out = _np.empty(total, _np.uint8)
    keys2d = (_np.frombuffer(key_bytes, _np.uint8).reshape(n, key_len) if key_len > 0
              else None)
    values2d = (_np.frombuffer(value_bytes, _np.uint8).reshape(n, value_len)
                if value_len > 0 else None)
    pos = reserve
    for a, b, body, size, widths in plan:
        m = b - a
        rows = out[pos:pos + m * size].reshape(m, size)
        # One template row holds every byte common to the run (lengths, constant deltas,
        # zero header count); only keys, values and varying deltas are then copied over it.
        template = bytearray(size)
        varying = []  # (column, width, numpy rows or _Field)
        layout = [_varint.varint(body) + b"\x00", *zip(fields, widths), key_varint,
                  (keys2d, max(key_len, 0)), value_varint, (values2d, max(value_len, 0)),
                  b"\x00"]
        c = 0
        for part in layout:
            if isinstance(part, bytes):
                template[c:c + len(part)] = part
                c += len(part)
                continue
            src, width = part
            if isinstance(src, _Field) and src.constant is not None:
                template[c:c + width] = src.constant.tobytes()
            elif width:
                varying.append((c, width, src))
            c += width
        rows[:] = _np.frombuffer(template, _np.uint8)
        for c, width, src in varying:
            if isinstance(src, _Field):
                rows[:, c:c + width] = src.encode(a, b, width)
            else:
                rows[:, c:c + width] = src[a:b]
        pos += m * size
    return out


class _Field:
    """A per-record varint field of the uniform builder; a constant field (all timestamps
    equal, say) is encoded once and broadcast."""

    __slots__ = ("values", "sizes", "constant")

    def __init__(self, values, sizes, constant):
        self.values = values
        self.sizes = sizes
        self.constant = constant

    @classmethod
    def of(cls, values) -> "_Field":
        lo, hi = int(values.min()), int(values.max())
        if lo == hi:
            return cls(values, None, _np.frombuffer(_varint.varint(lo), _np.uint8))
        if -64 <= lo and hi < 64:  # all one byte
            return cls(values, None, None)
        return cls(values, _varint.sizes_of(values), None)

    def size_array(self, n: int):
        return self.sizes if self.sizes is not None else self.width(0)

    def width(self, i: int) -> int:
        if self.constant is not None:
            return len(self.constant)
        return 1 if self.sizes is None else int(self.sizes[i])

    def encode(self, a: int, b: int, width: int):
        if self.constant is not None:
            return self.constant
        return _varint.encode_columns(self.values[a:b], width)


def _build_general(values, keys, td, od, headers, reserve: int) -> bytearray:
    """The records of any batch (``reserve`` bytes in front), one join; per record only
    table lookups and a few appends."""
    table = _varint.ZZ_TABLE
    limit = _varint.TABLE_LIMIT
    varint = _varint.varint
    parts: list = [bytes(reserve)]
    append = parts.append
    if keys is None:
        keys = _itertools.repeat(None)
    if headers is None:
        headers = _itertools.repeat(())
    for value, key, t, o, hdrs in zip(values, keys, td, od, headers):
        # Key and value are handled inline, not by a helper: a call per field would
        # cost more than the rest of the loop body.
        t_b = table[t + limit] if -limit <= t < limit else varint(t)
        o_b = table[o + limit] if o < limit else varint(o)
        if key is None:
            k_b = b"\x01"
            k_n = 0
        else:
            k_n = len(key)
            k_b = table[k_n + limit] if k_n < limit else varint(k_n)
        if value is None:
            v_b = b"\x01"
            v_n = 0
        else:
            v_n = len(value)
            v_b = table[v_n + limit] if v_n < limit else varint(v_n)
        if hdrs:
            h_b = _encode_headers(hdrs)
        else:
            h_b = b"\x00"
        body = 1 + len(t_b) + len(o_b) + len(k_b) + k_n + len(v_b) + v_n + len(h_b)
        append((table[body + limit] if body < limit else varint(body)) + b"\x00" + t_b
               + o_b + k_b)
        if key is not None:
            append(key)
        append(v_b)
        if value is not None:
            append(value)
        append(h_b)
    try:
        return bytearray().join(parts)
    except TypeError as exc:
        raise TypeError(f"keys and values must be bytes-like or None: {exc}") from None


def _encode_headers(hdrs) -> bytes:
    varint = _varint.varint
    out = [varint(len(hdrs))]
    for h_key, h_value in hdrs:
        if isinstance(h_key, str):
            h_key = h_key.encode("utf-8")
        out.append(varint(len(h_key)))
        out.append(bytes(h_key))
        if h_value is None:
            out.append(b"\x01")
        else:
            out.append(varint(len(h_value)))
            out.append(bytes(h_value))
    return b"".join(out)


# ---- decoding -----------------------------------------------------------------------------

class _Decoded(NamedTuple):
    """Every record of some batches, as arrays (one entry per record) over ``data``: the
    records of all the batches (decompressed), one after the other, padded with zeros."""

    data: bytes
    headers_of_batches: list  # BatchHeader per batch
    counts: _np.ndarray  # records per batch
    offset: _np.ndarray
    timestamp: _np.ndarray
    timestamp_type: _np.ndarray
    key_start: _np.ndarray
    key_len: _np.ndarray  # -1: null
    value_start: _np.ndarray
    value_len: _np.ndarray
    headers: list | None  # per-record header lists; None when no record has any


def _gather(buf, *, max_decompressed_bytes: int, skip_control_batches: bool,
            in_place: bool = False):
    """(batch headers, records data, start and end of each batch's records in it).
    Validates framing and CRC of every batch (trailing bytes included) and decompresses.

    The data is the batches' record regions joined and padded with ``_PAD``; with
    ``in_place``, when no batch is compressed, it is ``buf`` itself (bytes, or a byte view of
    it: no copy and no padding; vectorised reads past its end clip, see ``varint.decode_at``)."""
    mv = memoryview(buf)
    batches: list[BatchHeader] = []
    parts: list = []
    firsts: list[int] = []  # where each region starts in buf
    compressed = False
    for header in iter_headers(buf):
        if skip_control_batches and header.is_control:
            continue
        first = header.position + HEADER_SIZE
        region = mv[first:header.position + header.size]
        codec = header.compression
        if codec != CODEC_NONE:
            compressed = True
            region = _compression.decompress(codec, region, max_bytes=max_decompressed_bytes)
        count = header.records_count
        if count * MIN_RECORD_BYTES > len(region):
            raise CorruptRecordError(
                f"batch at position {header.position} (base offset {header.base_offset}) "
                f"claims {count} records but has only {len(region)} bytes of records")
        batches.append(header)
        parts.append(region)
        firsts.append(first)
    if in_place and not compressed and mv.c_contiguous:
        data = buf if type(buf) is bytes else mv if mv.format == "B" else mv.cast("B")
        return batches, data, firsts, [f + len(r) for f, r in zip(firsts, parts)]
    ends = list(_itertools.accumulate(len(r) for r in parts))
    parts.append(_PAD)
    return batches, b"".join(parts), [e - len(r) for e, r in zip(ends, parts)], ends


class _Runs:
    """Record boundaries found so far, as runs of equally long consecutive records."""

    __slots__ = ("pos", "stride", "count", "length", "size")

    def __init__(self):
        self.pos: list[int] = []
        self.stride: list[int] = []
        self.count: list[int] = []
        self.length: list[int] = []  # value of the record length varint
        self.size: list[int] = []  # bytes of the record length varint

    def add(self, pos: int, stride: int, count: int, length: int, size: int) -> None:
        self.pos.append(pos)
        self.stride.append(stride)
        self.count.append(count)
        self.length.append(length)
        self.size.append(size)

    def arrays(self, total: int):
        """(start, length, length-varint size) of every record, numpy int64."""
        counts = _np.array(self.count, _np.int64)
        first = _np.cumsum(counts) - counts
        stride = _np.array(self.stride, _np.int64)
        starts = (_np.repeat(_np.array(self.pos, _np.int64) - stride * first, counts)
                  + _np.repeat(stride, counts) * _np.arange(total, dtype=_np.int64))
        return (starts, _np.repeat(_np.array(self.length, _np.int64), counts),
                _np.repeat(_np.array(self.size, _np.int64), counts))


def _chain(data: bytes, arr, start: int, end: int, count: int, runs: _Runs,
           header: BatchHeader) -> None:
    """Find the ``count`` records laid end to end in ``data[start:end]`` (one batch) and add
    them to ``runs``; they must fill the region exactly.

    Galloping: after decoding one record length in Python, guess that the next ``window``
    records carry the same length bytes and verify the guess with one numpy comparison;
    the longest verified prefix becomes a run. When guesses keep failing (records of
    varied sizes) a few records are walked one by one before guessing again. Bounded: every
    step consumes at least one record.
    """
    decode = _varint.decode_varint
    i = 0
    pos = start
    window = count
    plain = 0  # records left to walk one by one before the next guess
    while i < count:
        if pos >= end:
            raise CorruptRecordError(
                f"batch at position {header.position} (base offset {header.base_offset}): "
                f"records_count is {count} but its records end after {i}")
        length, after = decode(data, pos, end=end, max_bytes=_varint.MAX_VARINT_BYTES)
        size = after - pos
        stride = size + length
        if length < 0 or pos + stride > end:
            raise CorruptRecordError(
                f"batch at position {header.position} (base offset {header.base_offset}): "
                f"record {i} has length {length}, "
                f"{'negative' if length < 0 else 'past the end of the batch'}")
        run = 1
        if plain:
            plain -= 1
        else:
            m = min(count - i, window, (end - pos) // stride)
            if m >= 8:
                cand = _np.arange(pos, pos + m * stride, stride)
                ok = arr[cand] == data[pos]
                for k in range(1, size):
                    ok &= arr[cand + k] == data[pos + k]
                run = m if ok.all() else int(ok.argmin())
            # Grow the window while guesses hold; keep failed guesses cheap (a bounded
            # multiple of the run they found); walk irregular records one by one for a bit.
            if run < 8:
                plain, window = 16, 64
            elif run == m:
                window = m * 4
            else:
                window = max(64, run * 4)
        runs.add(pos, stride, run, length, size)
        i += run
        pos += run * stride
    if pos != end:
        raise CorruptRecordError(
            f"batch at position {header.position} (base offset {header.base_offset}): "
            f"{end - pos} bytes after its {count} records (records_count mismatch or "
            f"trailing bytes)")


def _first_bad(mask, what: str, starts, batch_of, batches) -> CorruptRecordError:
    i = int(_np.flatnonzero(mask)[0])
    header = batches[int(batch_of[i])]
    return CorruptRecordError(
        f"batch at position {header.position} (base offset {header.base_offset}): {what} "
        f"in the record at byte {int(starts[i])} of the decompressed records")


class _Scan(NamedTuple):
    """The record structure of some batches, checked: every field of every record found and
    inside its record (see ``_scan_gathered``). Arrays have one entry per record."""

    data: bytes
    batches: list  # BatchHeader per batch
    counts: _np.ndarray  # records per batch
    batch_of: _np.ndarray  # index into ``batches`` of each record
    ts_delta: _np.ndarray
    off_delta: _np.ndarray
    key_start: _np.ndarray
    key_len: _np.ndarray  # -1: null
    value_start: _np.ndarray
    value_len: _np.ndarray
    headers_pos: _np.ndarray  # where each record's headers start (after the count)
    header_count: _np.ndarray
    ends: _np.ndarray  # end of each record


def _scan_gathered(batches: list, data, region_starts: list, region_ends: list) -> _Scan:
    """Walk every record of the v2 batches ``_gather`` returned and check its structure:
    framing and CRC of each batch (done by ``_gather``), records filling their batch
    exactly, each record's varints bounded, key and value inside the record, a
    non-negative header count, and the record ending where its length says (checked here
    for records without headers; ``_parse_headers`` does it for the others). Builds no
    per-record Python objects."""
    arr = _np.frombuffer(data, _np.uint8)
    counts = _np.array([h.records_count for h in batches], _np.int64)
    n = int(counts.sum())
    runs = _Runs()
    for header, start, end in zip(batches, region_starts, region_ends):
        _chain(data, arr, start, end, header.records_count, runs, header)
    starts, lens, lsz = runs.arrays(n)
    batch_of = _np.repeat(_np.arange(len(batches)), counts)
    ends = starts + lsz + lens

    def check(mask, what):
        if mask.any():
            raise _first_bad(mask, what, starts, batch_of, batches)

    decode_at = _varint.decode_at
    p = starts + lsz + 1  # skip the record attributes
    ts_delta, s = decode_at(arr, p, _varint.MAX_VARLONG_BYTES, "timestamp delta")
    p += s
    off_delta, s = decode_at(arr, p, _varint.MAX_VARINT_BYTES, "offset delta")
    p += s
    key_len, s = decode_at(arr, p, _varint.MAX_VARINT_BYTES, "key length")
    key_start = p + s
    check((key_len < -1) | (key_start + _np.maximum(key_len, 0) > ends),
          "key length out of bounds")
    p = key_start + _np.maximum(key_len, 0)
    value_len, s = decode_at(arr, p, _varint.MAX_VARINT_BYTES, "value length")
    value_start = p + s
    check((value_len < -1) | (value_start + _np.maximum(value_len, 0) > ends),
          "value length out of bounds")
    p = value_start + _np.maximum(value_len, 0)
    header_count, s = decode_at(arr, p, _varint.MAX_VARINT_BYTES, "header count")
    p += s
    check(header_count < 0, "negative header count")
    check((p != ends) & (header_count == 0), "record length mismatch")
    return _Scan(data, batches, counts, batch_of, ts_delta, off_delta, key_start, key_len,
                 value_start, value_len, p, header_count, ends)


class RecordsSummary(NamedTuple):
    """What ``validate_records`` found: how many records, and how many have a null key."""

    records: int
    null_keys: int


def validate_records(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                     ) -> RecordsSummary:
    """Check every record of the v2 batches in ``buf`` as ``decode_records`` would (framing,
    CRC32C, varints, lengths, counts, headers; trailing bytes are corrupt) without building
    records or columns: what a leader does with a client's produce request. Raises
    CorruptRecordError (or UnsupportedCodecError / UnsupportedVersionError)."""
    return checked_batches(buf, max_decompressed_bytes=max_decompressed_bytes)[1]


def checked_batches(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                    ) -> tuple[list[BatchHeader], RecordsSummary]:
    """``validate_records`` that also returns the header of every batch it checked (CRC
    included), so a leader's append need not walk and checksum the batches again. A
    request of uncompressed batches is read in place, without a copy."""
    gathered = _gather(buf, max_decompressed_bytes=max_decompressed_bytes,
                       skip_control_batches=False, in_place=True)
    batches = gathered[0]
    if sum(h.records_count for h in batches) <= SMALL_REQUEST_RECORDS:
        return batches, _walk_records(*gathered)
    sc = _scan_gathered(*gathered)
    for i in _np.flatnonzero(sc.header_count).tolist():
        _parse_headers(sc.data, int(sc.headers_pos[i]), int(sc.ends[i]),
                       int(sc.header_count[i]))
    return batches, RecordsSummary(len(sc.key_len), int(_np.count_nonzero(sc.key_len < 0)))


# Up to this many records a request is checked (and ``decode_records`` decodes) record by
# record in Python: numpy's fixed cost per call (about 75 us for the vectorised walk of one
# record, measured) is more than the plain walk's few microseconds per record (32 records:
# 64 us walked, 87 us vectorised; decoded into Records, one record: 11 us walked, 150 us
# vectorised; 32: 167 against 290; the two meet near 40).
SMALL_REQUEST_RECORDS = 32


def _walk_records(batches: list, data, starts: list, ends: list,
                  out: list | None = None) -> RecordsSummary:
    """``_scan_gathered``'s checks, one record at a time (for small requests): every
    record inside its batch and the batch filled exactly, every varint bounded and inside
    its record, key, value and headers inside the record, and the record ending where its
    length says. With ``out``, each record is appended to it as a ``Record`` (what
    ``decode_records`` answers; keys, values and header values as bytes)."""
    decode = _varint.decode_varint
    int_bytes = _varint.MAX_VARINT_BYTES
    records = null_keys = 0
    for header, pos, end in zip(batches, starts, ends):
        def corrupt(what: str) -> CorruptRecordError:
            return CorruptRecordError(
                f"batch at position {header.position} (base offset {header.base_offset}): "
                f"{what}")

        def field(what: str, at: int, limit: int, max_bytes: int = int_bytes):
            try:
                return decode(data, at, end=limit, max_bytes=max_bytes)
            except CorruptRecordError as exc:
                raise corrupt(f"{what} in record {i}: {exc}") from None

        def sized(what: str, at: int, limit: int) -> tuple[int, int]:
            size, at = field(f"{what} length", at, limit)
            if size < -1 or at + max(size, 0) > limit:
                raise corrupt(f"{what} length out of bounds in record {i}")
            return size, at

        log_append = header.timestamp_type == 1
        for i in range(header.records_count):
            if pos >= end:
                raise corrupt(f"records_count is {header.records_count} but its records "
                              f"end after {i}")
            length, pos = field("record length", pos, end)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise corrupt(f"record {i} has length {length}, "
                              f"{'negative' if length < 0 else 'past the end of the batch'}")
            pos += 1                                                  # attributes
            ts_delta, pos = field("timestamp delta", pos, record_end,
                                  _varint.MAX_VARLONG_BYTES)
            off_delta, pos = field("offset delta", pos, record_end)
            key_len, key_at = sized("key", pos, record_end)
            if key_len < 0:
                null_keys += 1
            value_len, value_at = sized("value", key_at + max(key_len, 0), record_end)
            count, pos = field("header count", value_at + max(value_len, 0), record_end)
            if count < 0:
                raise corrupt(f"negative header count in record {i}")
            if count:
                headers = _parse_headers(data, pos, record_end, count)
            elif pos != record_end:
                raise corrupt(f"record length mismatch in record {i}")
            else:
                headers = []
            if out is not None:
                out.append(Record(
                    header.base_offset + off_delta,
                    header.max_timestamp if log_append else header.base_timestamp + ts_delta,
                    header.timestamp_type,
                    None if key_len < 0 else bytes(data[key_at:key_at + key_len]),
                    None if value_len < 0 else bytes(data[value_at:value_at + value_len]),
                    headers))
            pos = record_end
        if pos != end:
            raise corrupt(f"{end - pos} bytes after its {header.records_count} records "
                          f"(records_count mismatch or trailing bytes)")
        records += header.records_count
    return RecordsSummary(records, null_keys)


def _decode(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
            skip_control_batches: bool = False) -> _Decoded:
    return _decode_gathered(_gather(buf, max_decompressed_bytes=max_decompressed_bytes,
                                    skip_control_batches=skip_control_batches))


def _decode_gathered(gathered) -> _Decoded:
    """``_decode`` of what ``_gather`` returned."""
    sc = _scan_gathered(*gathered)
    batches, batch_of = sc.batches, sc.batch_of
    headers = None
    with_headers = _np.flatnonzero(sc.header_count)
    if len(with_headers):
        headers = [[] for _ in range(len(batch_of))]
        for i in with_headers.tolist():
            headers[i] = _parse_headers(sc.data, int(sc.headers_pos[i]), int(sc.ends[i]),
                                        int(sc.header_count[i]))
    base_offset = _np.array([h.base_offset for h in batches], _np.int64)
    log_append = _np.array([h.timestamp_type for h in batches], _np.int32)
    base_ts = _np.array([h.base_timestamp for h in batches], _np.int64)
    max_ts = _np.array([h.max_timestamp for h in batches], _np.int64)
    timestamp = _np.where(log_append[batch_of] == 1, max_ts[batch_of],
                          base_ts[batch_of] + sc.ts_delta)
    return _Decoded(sc.data, batches, sc.counts, base_offset[batch_of] + sc.off_delta,
                    timestamp, log_append[batch_of], sc.key_start, sc.key_len,
                    sc.value_start, sc.value_len, headers)


def _parse_headers(data: bytes, pos: int, end: int, count: int) -> list:
    decode = _varint.decode_varint
    out = []
    if count > (end - pos) // 2:  # each header takes at least two bytes
        raise CorruptRecordError(f"header count {count} at byte {pos} exceeds the record")
    for _ in range(count):
        k_len, pos = decode(data, pos, end=end, max_bytes=_varint.MAX_VARINT_BYTES)
        if k_len < 0 or pos + k_len > end:
            raise CorruptRecordError(f"header key length {k_len} at byte {pos} out of bounds")
        try:
            h_key = str(data[pos:pos + k_len], "utf-8")  # data may be a memoryview
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"header key at byte {pos} is not UTF-8: {exc}") from None
        pos += k_len
        v_len, pos = decode(data, pos, end=end, max_bytes=_varint.MAX_VARINT_BYTES)
        if v_len < -1 or pos + max(v_len, 0) > end:
            raise CorruptRecordError(
                f"header value length {v_len} at byte {pos} out of bounds")
        if v_len < 0:
            out.append((h_key, None))
        else:
            out.append((h_key, data[pos:pos + v_len]))
            pos += v_len
    if pos != end:
        raise CorruptRecordError(f"record length mismatch: headers end at byte {pos}, the "
                                 f"record at byte {end}")
    return out


def _slices(data: bytes, arr, start, length) -> list:
    """data[start[i]:start[i]+length[i]] for each i as bytes, None where length is -1.

    Strings of one length L are gathered as rows of an (m, L) array and turned into bytes
    objects by numpy's void-dtype ``tolist`` (C speed); many distinct lengths fall back to
    slicing one by one.
    """
    n = len(start)
    if n == 0:
        return []
    lo = int(length.min())
    hi = int(length.max())
    if lo == hi:
        return _rows(arr, start, lo)
    distinct = _np.unique(length)
    if len(distinct) > 16:
        ends = start + _np.maximum(length, 0)
        out = list(map(data.__getitem__, map(slice, start.tolist(), ends.tolist())))
        for i in _np.flatnonzero(length < 0).tolist():
            out[i] = None
        return out
    out = _np.empty(n, object)
    for size in distinct.tolist():
        idx = _np.flatnonzero(length == size)
        out[idx] = _rows(arr, start[idx], size)
    return out.tolist()


def _rows(arr, start, size: int) -> list:
    """[bytes(arr[s:s+size]) for s in start]; ``size`` -1 gives Nones."""
    if size < 0:
        return [None] * len(start)
    if size == 0:
        return [b""] * len(start)
    return _windows(arr, size)[start].view(f"V{size}").ravel().tolist()


class _GcPaused:
    """Pause the cyclic garbage collector while building many small containers that cannot
    form cycles (records, header lists): its passes over them cost ~30% of decoding."""

    __slots__ = ("_was_enabled",)

    def __enter__(self):
        self._was_enabled = _gc.isenabled()
        _gc.disable()

    def __exit__(self, *exc):
        if self._was_enabled:
            _gc.enable()


def _to_records(d: _Decoded) -> list[Record]:
    n = len(d.offset)
    arr = _np.frombuffer(d.data, _np.uint8)
    tt = d.timestamp_type
    types = (_itertools.repeat(int(tt[0])) if n and (tt == tt[0]).all() else tt.tolist())
    with _GcPaused():
        keys = _slices(d.data, arr, d.key_start, d.key_len)
        values = _slices(d.data, arr, d.value_start, d.value_len)
        headers = d.headers if d.headers is not None else [[] for _ in range(n)]
        rows = zip(d.offset.tolist(), d.timestamp.tolist(), types, keys, values, headers)
        return list(map(tuple.__new__, _itertools.repeat(Record), rows))


def _binary_column(data_buffer, arr, start, length):
    """A pyarrow binary column of data[start[i]:start[i]+length[i]] (null where -1).

    Strings of a few distinct lengths (the usual case: fixed-size values, null or fixed
    keys) are gathered by numpy straight into the column's data buffer, a row gather per
    length; many distinct lengths go through a binary_view over ``data`` cast to binary
    (three times slower on 100-byte values, measured)."""
    n = len(start)
    nonneg = _np.maximum(length, 0)
    lo = int(nonneg.min()) if n else 0
    hi = int(nonneg.max()) if n else 0
    sizes = _np.array([lo]) if lo == hi else _np.unique(nonneg)
    total = int(nonneg.sum())
    if len(sizes) > _GATHER_MAX_LENGTHS or total >= 1 << 31:
        return _binary_column_by_views(data_buffer, arr, start, length)
    import pyarrow as pa
    offsets = _np.zeros(n + 1, _np.int32)
    _np.cumsum(nonneg, out=offsets[1:])
    if len(sizes) == 1 and total:
        data = _windows(arr, int(sizes[0]))[start]
    else:
        data = _np.empty(total, _np.uint8)
        for size in sizes.tolist():
            if size:
                idx = _np.flatnonzero(nonneg == size)
                _windows(data, size, writeable=True)[offsets[idx]] = \
                    _windows(arr, size)[start[idx]]
    validity, null_count = _validity(length < 0)
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)], null_count=null_count)


def _windows(arr, size: int, *, writeable: bool = False):
    """``arr`` (uint8) as overlapping rows: row ``p`` is arr[p:p+size] (a view, no copy)."""
    return _np.lib.stride_tricks.as_strided(arr, (len(arr) - size + 1, size), (1, 1),
                                            writeable=writeable)


def _validity(nulls) -> tuple:
    """(the Arrow validity buffer of a column whose ``nulls`` mask is given, or None
    without nulls; the null count)."""
    import pyarrow as pa
    null_count = int(nulls.sum())
    if not null_count:
        return None, 0
    return pa.py_buffer(_np.packbits(~nulls, bitorder="little")), null_count


#: ``_binary_column`` gathers by length up to this many distinct lengths.
_GATHER_MAX_LENGTHS = 8


def _binary_column_by_views(data_buffer, arr, start, length):
    """``_binary_column`` as a zero-copy binary_view over ``data`` cast (one C++ gather) to
    binary."""
    n = len(start)
    views = _np.zeros((n, 16), _np.uint8)
    views32 = views.view(_np.int32)
    nonneg = _np.maximum(length, 0)
    views32[:, 0] = nonneg
    # Strings of <= 12 bytes are stored inline; longer ones keep a 4-byte prefix inline.
    # ``windows[p]`` is data[p:p+12] (a strided view, no copy): one row gather per string.
    windows = _windows(arr, 12)
    lo = int(nonneg.min()) if n else 0
    hi = int(nonneg.max()) if n else 0
    if lo > 12:  # all long: only the prefix
        views[:, 4:8] = windows[start, :4]
    elif lo == hi:  # all of one short length: no masking needed
        views[:, 4:4 + lo] = windows[start, :lo]
    else:
        inline = windows[start]
        inline *= _np.arange(12, dtype=_np.int64)[None, :] < nonneg[:, None]
        views[:, 4:16] = inline
    long_ = nonneg > 12
    views32[long_, 2] = 0  # data buffer index
    views32[long_, 3] = start[long_]
    import pyarrow as pa
    validity, null_count = _validity(length < 0)
    view = pa.Array.from_buffers(pa.binary_view(), n,
                                  [validity, pa.py_buffer(views), data_buffer],
                                  null_count=null_count)
    return view.cast(pa.binary())


def arrow_numbers(values):
    """A numpy array of numbers as the pyarrow array of its dtype, sharing its memory.
    (``pa.array`` and ``pa.scalar`` import pandas where it is installed: a third of a second
    or more in a fresh process, paid by a consumer's first decode.)"""
    import pyarrow as pa
    values = _np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [None, pa.py_buffer(values)])


def numbers_view(array, dtype="int64"):
    """The values of a pyarrow array of numbers without nulls (``dtype`` its numpy type) as
    a numpy view: ``to_numpy`` without its pandas import (see arrow_numbers)."""
    dtype = _np.dtype(dtype)
    return _np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)


def _to_columns(d: _Decoded) -> dict:
    import pyarrow as pa
    n = len(d.offset)
    headers_t = headers_type()
    arr = _np.frombuffer(d.data, _np.uint8)
    data_buffer = pa.py_buffer(d.data)
    if d.headers is None:
        headers = pa.ListArray.from_arrays(arrow_numbers(_np.zeros(n + 1, _np.int32)),
                                           pa.nulls(0, headers_t.value_type), type=headers_t)
    else:
        headers = pa.array([[{"key": k, "value": v} for k, v in h] for h in d.headers],
                            type=headers_t)
    return {
        "offset": arrow_numbers(d.offset),
        "timestamp": arrow_numbers(d.timestamp),
        "timestamp_type": arrow_numbers(d.timestamp_type),
        "key": _binary_column(data_buffer, arr, d.key_start, d.key_len),
        "value": _binary_column(data_buffer, arr, d.value_start, d.value_len),
        "headers": headers,
    }


def decode_records(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
                   skip_control_batches: bool = False) -> list[Record]:
    """Every record of the v2 batches concatenated in ``buf`` (what a log read returns).

    Validates each batch (framing, CRC32C, varints, lengths, counts; trailing bytes are
    corrupt) and raises CorruptRecordError, or its subclasses UnsupportedCodecError and
    UnsupportedVersionError, saying what is wrong and where.
    """
    gathered = _gather(buf, max_decompressed_bytes=max_decompressed_bytes,
                       skip_control_batches=skip_control_batches)
    if sum(h.records_count for h in gathered[0]) <= SMALL_REQUEST_RECORDS:
        out: list[Record] = []          # a consumer's long poll at the tail: a few records
        _walk_records(*gathered, out)
        return out
    return _to_records(_decode_gathered(gathered))


def decode_columns(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
                   skip_control_batches: bool = False) -> dict:
    """The records of the v2 batches in ``buf`` as pyarrow arrays: ``offset`` int64,
    ``timestamp`` int64 (ms), ``timestamp_type`` int32, ``key`` and ``value`` binary (null
    for null), ``headers`` list<struct<key: string, value: binary>>. ``pa.table(result)``
    makes a table. Validates as ``decode_records`` does."""
    return _to_columns(_decode(buf, max_decompressed_bytes=max_decompressed_bytes,
                               skip_control_batches=skip_control_batches))


def iter_batches(buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                 ) -> Iterator["RecordBatch"]:
    """A RecordBatch for each batch in ``buf``; raises on the first bad one."""
    mv = memoryview(buf)
    for header in iter_headers(buf):
        yield RecordBatch(mv[header.position:header.position + header.size],
                          max_decompressed_bytes=max_decompressed_bytes, _header=header)


class RecordBatch:
    """One v2 batch: ``RecordBatch(buf)`` validates the header and CRC (``buf`` must be
    exactly one batch); ``.header`` is its BatchHeader; ``.records()`` decodes it (cached),
    iteration yields its records, ``len()`` is its records_count and ``.columns()`` gives
    pyarrow columns as ``decode_columns`` does. ``RecordBatch.build(...)`` is ``build``.
    Immutable after construction apart from the decode cache; not thread-safe to share while
    first decoding (decode twice at worst)."""

    __slots__ = ("header", "_buf", "_max_decompressed_bytes", "_decoded")

    build = staticmethod(build)

    def __init__(self, buf, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
                 _header: BatchHeader | None = None):
        header = _header if _header is not None else parse_header(buf, 0)
        if header.size != len(buf):
            raise CorruptRecordError(
                f"{len(buf) - header.size} trailing bytes after the batch of {header.size} "
                f"bytes")
        self.header = header
        self._buf = buf
        self._max_decompressed_bytes = max_decompressed_bytes
        self._decoded = None

    @classmethod
    def from_bytes(cls, buf, **kwargs) -> "RecordBatch":
        return cls(buf, **kwargs)

    def _decode(self) -> _Decoded:
        if self._decoded is None:
            self._decoded = _decode(self._buf,
                                    max_decompressed_bytes=self._max_decompressed_bytes)
        return self._decoded

    def records(self) -> list[Record]:
        return _to_records(self._decode())

    def columns(self) -> dict:
        return _to_columns(self._decode())

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __len__(self) -> int:
        return self.header.records_count

    def __bytes__(self) -> bytes:
        return bytes(self._buf)

    def __repr__(self) -> str:
        h = self.header
        return (f"RecordBatch(base_offset={h.base_offset}, records={h.records_count}, "
                f"codec={_compression.CODEC_NAMES.get(h.compression, h.compression)}, "
                f"size={h.size})")
