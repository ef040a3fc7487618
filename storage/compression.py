"""The compression codecs of record batches, framed exactly as Kafka clients frame them.

=======  ====  ==========================================================================
codec    id    bytes on the wire
=======  ====  ==========================================================================
none     0     the records as they are
gzip     1     a gzip stream (RFC 1952); several concatenated members are accepted
snappy   2     written in xerial's block framing (16-byte header ``\\x82SNAPPY\\0`` + version
               + compat, then [int32 length, raw snappy block]...), which Java's
               SnappyOutputStream and kafka-python both write; a bare raw snappy block is
               also read, as kafka-python does
lz4      3     the LZ4 *frame* format with independent blocks (Java's KafkaLZ4BlockOutputStream
               refuses linked blocks) and no content size or checksum, as Java writes it.
               Magic 0 messages carry Kafka 0.8's broken frame header checksum (computed
               over the magic number too); ``decompress(..., legacy_lz4=True)`` repairs it.
zstd     4     one or more Zstandard frames (RFC 8878), as Java's ZstdOutputStream and
               librdkafka write them; written as one frame at level 3 (Kafka's default,
               ``compression.zstd.level``) with the content size in its header. Magic 0/1
               messages cannot carry zstd (Kafka 2.1 added it with magic 2 only).
=======  ====  ==========================================================================

Every decompression is bounded by ``max_bytes`` (default ``DEFAULT_MAX_DECOMPRESSED_BYTES``):
a decompression bomb raises CorruptRecordError after producing at most that many bytes, and
the declared sizes inside snappy blocks are checked before anything is allocated. A zstd
frame's declared content size is not trusted: its input is fed in steps small enough that
one step cannot produce more than the bytes left under the limit (a zstd block expands at
most 32768-fold), so the output stays under twice ``max_bytes``.
Pure functions; thread-safe.
"""

from __future__ import annotations

import struct
import zlib

import lz4.frame as _lz4f
import snappy as _snappy
import zstandard as _zstd

from .errors import CorruptRecordError, UnsupportedCodecError

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy",
               CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
CODEC_IDS = {name: codec for codec, name in CODEC_NAMES.items()}

DEFAULT_MAX_DECOMPRESSED_BYTES = 64 << 20

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible with 1
_XERIAL_BLOCK_BYTES = 32 * 1024  # xerial's default block size (uncompressed)
_I32 = struct.Struct(">i")

_GZIP_LEVEL = 6  # zlib's default: Java's GZIPOutputStream default too; 9 costs 3x for ~1%
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_LEVEL = 3   # Kafka's compression.zstd.level default (and librdkafka's)
#: the most a zstd block's input byte can expand to: a 4-byte RLE block gives 128 KiB
_ZSTD_MAX_RATIO = 32768
_ZSTD_MIN_STEP = 64


def codec_id(compression) -> int:
    """The codec id of ``compression`` given as an id (0-4), a name ("gzip"...) or None
    (no compression, as kafka-python's ``compression_type=None``)."""
    if compression is None:
        return CODEC_IDS["none"]
    if isinstance(compression, str):
        try:
            return CODEC_IDS[compression.lower()]
        except KeyError:
            raise UnsupportedCodecError(f"unknown compression codec {compression!r}") from None
    if isinstance(compression, int) and compression in CODEC_NAMES:
        return compression
    raise UnsupportedCodecError(f"unknown compression codec {compression!r}")


def compress(codec: int, data) -> bytes:
    """``data`` compressed with ``codec`` (an id), framed as Kafka expects."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        c = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == CODEC_SNAPPY:
        return _xerial_compress(data)
    if codec == CODEC_LZ4:
        return _lz4f.compress(data, block_size=_lz4f.BLOCKSIZE_MAX64KB, block_linked=False,
                              content_checksum=False, store_size=False)
    if codec == CODEC_ZSTD:
        # a compressor per call: ZstdCompressor objects are not thread-safe
        return _zstd.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
    raise UnsupportedCodecError(f"compression codec {CODEC_NAMES.get(codec, codec)} is not "
                                f"supported")


def decompress(codec: int, data, *, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
               legacy_lz4: bool = False) -> bytes:
    """``data`` decompressed; CorruptRecordError if it is not a valid stream of ``codec``
    or would decompress to more than ``max_bytes``."""
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, max_bytes)
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(bytes(data), max_bytes)
        if codec == CODEC_LZ4:
            data = bytes(data)
            if legacy_lz4:
                data = _repair_legacy_lz4_header(data)
            return _lz4_decompress(data, max_bytes)
        if codec == CODEC_ZSTD:
            return _zstd_decompress(data, max_bytes)
        if codec == CODEC_NONE:
            return bytes(data)
    except CorruptRecordError:
        raise
    except Exception as exc:  # the codec libraries raise assorted types for bad input
        raise CorruptRecordError(
            f"invalid {CODEC_NAMES.get(codec, codec)} data: {type(exc).__name__}: {exc}"
        ) from exc
    raise UnsupportedCodecError(f"compression codec {CODEC_NAMES.get(codec, codec)} is not "
                                f"supported")


def _too_big(codec: str, max_bytes: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"{codec} data decompresses to more than the limit of {max_bytes} bytes")


def _gunzip(data, max_bytes: int) -> bytes:
    out = []
    total = 0
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = d.decompress(rest, max_bytes - total + 1)
        total += len(chunk)
        if total > max_bytes:
            raise _too_big("gzip", max_bytes)
        out.append(chunk)
        if not d.eof:
            if d.unconsumed_tail:  # stopped at max_length with input left: over the limit
                raise _too_big("gzip", max_bytes)
            raise CorruptRecordError("truncated gzip data")
        rest = d.unused_data
        if not rest:
            return b"".join(out)


def _xerial_compress(data) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for i in range(0, len(view), _XERIAL_BLOCK_BYTES):
        block = _snappy.compress(bytes(view[i:i + _XERIAL_BLOCK_BYTES]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block declares (its uvarint preamble)."""
    u = shift = 0
    for i in range(5):
        if i >= len(block):
            break
        b = block[i]
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u
        shift += 7
    raise CorruptRecordError("invalid snappy block: bad length preamble")


def _snappy_block(block: bytes, budget: int, max_bytes: int) -> bytes:
    if _snappy_length(block) > budget:
        raise _too_big("snappy", max_bytes)
    return _snappy.decompress(block)


def _snappy_decompress(data: bytes, max_bytes: int) -> bytes:
    if not (len(data) >= 16 and data[:8] == _XERIAL_MAGIC):
        return _snappy_block(data, max_bytes, max_bytes)
    out = []
    total = 0
    pos = 16  # the version and compat fields are ignored, as kafka-python does
    end = len(data)
    while pos < end:
        if pos + 4 > end:
            raise CorruptRecordError(f"truncated xerial snappy block length at byte {pos}")
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError(
                f"xerial snappy block of {n} bytes at byte {pos} runs past the end ({end})")
        chunk = _snappy_block(data[pos:pos + n], max_bytes - total, max_bytes)
        total += len(chunk)
        out.append(chunk)
        pos += n
    return b"".join(out)


def _lz4_decompress(data: bytes, max_bytes: int) -> bytes:
    d = _lz4f.LZ4FrameDecompressor()
    out = d.decompress(data, max_length=max_bytes + 1)
    if len(out) > max_bytes:
        raise _too_big("lz4", max_bytes)
    if not d.eof:
        raise CorruptRecordError("truncated lz4 frame")
    if d.unused_data:
        raise CorruptRecordError(f"{len(d.unused_data)} bytes after the lz4 frame")
    return out


def _zstd_decompress(data, max_bytes: int) -> bytes:
    """Every zstd frame of ``data``, decompressed; bounded as the module docstring says.
    A frame cut short, or bytes after the last frame that are not one, are corrupt."""
    view = memoryview(data)
    out = []
    total = 0
    pos, end = 0, len(view)
    if end == 0:
        raise CorruptRecordError("empty zstd data")
    dctx = _zstd.ZstdDecompressor()       # not thread-safe: one per call
    while pos < end:
        frame = dctx.decompressobj()
        while pos < end and not frame.eof:
            step = max((max_bytes - total) // _ZSTD_MAX_RATIO, _ZSTD_MIN_STEP)
            chunk = frame.decompress(view[pos:pos + step])
            pos += min(step, end - pos)
            total += len(chunk)
            if total > max_bytes:
                raise _too_big("zstd", max_bytes)
            out.append(chunk)
        if not frame.eof:
            raise CorruptRecordError("truncated zstd frame")
        pos -= len(frame.unused_data)     # the next frame's first bytes
    return b"".join(out)


# ---- Kafka 0.8's LZ4 header checksum (magic 0) -------------------------------------------

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of short ``data`` (used only for the few bytes of an LZ4 frame descriptor)."""
    n = len(data)
    pos = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while pos + 16 <= n:
            for i in range(4):
                (lane,) = struct.unpack_from("<I", data, pos)
                v[i] = (_rotl((v[i] + lane * _P2) & _M32, 13) * _P1) & _M32
                pos += 4
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while pos + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + lane * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    while pos < n:
        h = (_rotl((h + data[pos] * _P5) & _M32, 11) * _P1) & _M32
        pos += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _repair_legacy_lz4_header(data: bytes) -> bytes:
    """Kafka 0.8 (magic 0) wrote the LZ4 frame header checksum over the magic number too;
    replace it with the correct one so a standard decoder accepts the frame."""
    if len(data) < 7 or data[:4] != _LZ4_MAGIC:
        raise CorruptRecordError("invalid lz4 data: no LZ4 frame magic")
    flg = data[4]
    header_end = 7 + (8 if flg & 0x08 else 0)  # FLG, BD, [content size], HC
    if len(data) < header_end:
        raise CorruptRecordError("invalid lz4 data: truncated frame header")
    hc = (xxh32(data[4:header_end - 1]) >> 8) & 0xFF
    return data[:header_end - 1] + bytes([hc]) + data[header_end:]


def legacy_lz4_compress(data) -> bytes:
    """LZ4 as Kafka 0.8 wrote it for magic 0 (wrong header checksum, no content size); used by
    tests to produce seed-era input."""
    frame = _lz4f.compress(data, block_size=_lz4f.BLOCKSIZE_MAX64KB, block_linked=False,
                           content_checksum=False, store_size=False)
    hc = (xxh32(frame[0:6]) >> 8) & 0xFF
    return frame[:6] + bytes([hc]) + frame[7:]


__all__ = ["CODEC_NONE", "CODEC_GZIP", "CODEC_SNAPPY", "CODEC_LZ4", "CODEC_ZSTD",
           "CODEC_NAMES", "DEFAULT_MAX_DECOMPRESSED_BYTES", "codec_id", "compress",
           "decompress", "xxh32", "legacy_lz4_compress"]
