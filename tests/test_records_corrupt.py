"""Hostile bytes: every malformed batch raises CorruptRecordError (or its typed subclass)
saying what and where; nothing crashes, hangs or allocates without bound."""

import struct
import zlib

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import compression
from storage.errors import (CorruptRecordError, InvalidRecordError, UnsupportedCodecError,
                            UnsupportedVersionError)
from storage.legacy import build_legacy, to_v2, upconvert
from storage.records import (ATTRIBUTES_POS, CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY,
                             CRC_POS, HEADER, HEADER_SIZE, LOG_OVERHEAD, RECORDS_COUNT_POS,
                             RecordBatch, build, decode_columns, decode_records,
                             validate_records)
from storage import records as records_mod
from storage.records import SMALL_REQUEST_RECORDS
from storage.varint import encode_varint as vi

CORRUPT = (CorruptRecordError,)  # UnsupportedCodecError/VersionError are subclasses


def _batch(records: bytes, count: int, *, codec: int = CODEC_NONE, magic: int = 2) -> bytes:
    """A batch around raw ``records`` bytes with a correct header and CRC."""
    body = compression.compress(codec, records) if codec in (1, 2, 3) else records
    out = bytearray(HEADER_SIZE) + body
    HEADER.pack_into(out, 0, 0, len(out) - LOG_OVERHEAD, -1, magic, 0, codec, max(count - 1, 0),
                     0, 0, -1, -1, -1, count)
    return _fix_crc(out)


def _fix_crc(data) -> bytes:
    data = bytearray(data)
    struct.pack_into(">I", data, CRC_POS, crc32c.crc32c(bytes(data[ATTRIBUTES_POS:])))
    return bytes(data)


def _record(body: bytes) -> bytes:
    return vi(len(body)) + body


GOOD_BODY = b"\x00" + vi(0) + vi(0) + vi(1) + b"k" + vi(1) + b"v" + vi(0)


def _decoders():
    """Every reader of record bytes, the produce path's validate_records included: each
    defect below must be refused by all of them."""
    return (decode_records, decode_columns, lambda b: RecordBatch(b).records(),
            validate_records)


def _raises(data, match=None, exc=CorruptRecordError):
    for decode in _decoders():
        with pytest.raises(exc, match=match):
            decode(data)


def test_hand_made_batch_is_valid():
    """The helper's batch decodes, so each case below tests only its one defect."""
    assert decode_records(_batch(_record(GOOD_BODY), 1))[0].value == b"v"


def test_truncated_anywhere():
    """Every proper prefix of a valid batch (and of two batches) is refused."""
    first = build([b"value"] * 3, [b"k"] * 3, compression="gzip")
    data = first + build([b"x"])
    for cut in range(1, len(data)):
        if cut == len(first):
            continue  # a whole first batch: valid
        with pytest.raises(CorruptRecordError):
            decode_records(data[:cut])


def test_wrong_crc_names_the_batch():
    """A flipped byte under the CRC is reported as a CRC mismatch with the position."""
    data = bytearray(build([b"abc"], base_offset=7))
    data[-2] ^= 0x40
    _raises(bytes(data), match="position 0 .*CRC32C mismatch")


def test_length_past_end_and_too_small():
    """A batch_length pointing past the data, or below the header, is refused."""
    data = bytearray(build([b"abc"]))
    struct.pack_into(">i", data, 8, 10**6)
    _raises(bytes(data), match="past")
    struct.pack_into(">i", data, 8, 10)
    _raises(bytes(data), match="smaller than the minimum")


def test_overlong_varints():
    """An 11-byte varlong timestamp delta and 6-byte int32 varints are refused."""
    long10 = b"\x80" * 10 + b"\x00"
    _raises(_batch(_record(b"\x00" + long10 + vi(0) + vi(-1) + vi(-1) + vi(0)), 1),
            match="timestamp delta .* longer than 10")
    long5 = b"\x80" * 5 + b"\x00"
    _raises(_batch(_record(b"\x00" + vi(0) + long5 + vi(-1) + vi(-1) + vi(0)), 1),
            match="offset delta .* longer than 5")
    _raises(_batch(_record(b"\x00" + vi(0) + vi(0) + long5 + vi(-1) + vi(0)), 1),
            match="longer than 5")
    _raises(_batch(b"\x80" * 6 + GOOD_BODY, 1), match="longer than 5")  # record length


@pytest.mark.parametrize("walked", [True, False], ids=["walked", "vectorised"])
def test_varints_cut_off_by_the_end_of_the_request(walked, monkeypatch):
    """A field whose varint still continues at the last byte of the request is refused with
    CorruptRecordError by every reader, validate_records too (it reads a request in place,
    bytes or a view, unpadded: its vectorised reads past the end must clip, not raise
    IndexError). Small requests are walked record by record, larger ones vectorised: both."""
    monkeypatch.setattr(records_mod, "SMALL_REQUEST_RECORDS", 1000 if walked else 0)
    fields = [b"\x00", vi(0), vi(0), vi(1) + b"k", vi(1) + b"v", vi(0)]
    for cut in range(1, len(fields)):
        for tail in (b"\x80", b"\xff\xff", b"\x80" * 4):
            body = b"".join(fields[:cut]) + tail
            data = _batch(_record(body), 1)
            assert type(data) is bytes and data.endswith(tail)
            _raises(data)
            _raises(build([b"ok"] * 3) + data)  # the cut-off record in a later batch
            for view in (bytearray(data), memoryview(data)):
                with pytest.raises(CorruptRecordError):
                    validate_records(view)


def test_unknown_magic_and_codec():
    """Unknown magic raises UnsupportedVersionError; codec 5-7 UnsupportedCodecError."""
    _raises(_batch(_record(GOOD_BODY), 1, magic=3), exc=UnsupportedVersionError)
    for codec in (5, 6, 7):
        _raises(_batch(_record(GOOD_BODY), 1, codec=codec), exc=UnsupportedCodecError)


def test_trailing_bytes():
    """Bytes after the last batch, or after a batch's records, are refused."""
    good = build([b"a"])
    with pytest.raises(CorruptRecordError):
        decode_records(good + b"\x00" * 5)
    with pytest.raises(CorruptRecordError):
        decode_records(good + good[:20])
    _raises(_batch(_record(GOOD_BODY) + b"\x00", 1), match="bytes after")
    _raises(_batch(_record(GOOD_BODY) + b"\x00", 1, codec=CODEC_GZIP), match="bytes after")


def test_record_count_mismatch():
    """records_count larger or smaller than the records present is refused; an absurd
    count is refused before anything is allocated."""
    two = _record(GOOD_BODY) * 2
    _raises(_batch(two, 3))
    _raises(_batch(two, 1), match="bytes after")
    _raises(_batch(two, 2**31 - 1), match="claims")
    data = bytearray(build([b"a"] * 10, compression="lz4"))
    struct.pack_into(">i", data, RECORDS_COUNT_POS, 2**31 - 1)
    _raises(_fix_crc(data), match="claims")


def test_record_length_mismatches():
    """A record length longer or shorter than its fields is refused."""
    _raises(_batch(vi(len(GOOD_BODY) + 1) + GOOD_BODY + b"\x00", 1), match="mismatch")
    _raises(_batch(vi(len(GOOD_BODY) - 1) + GOOD_BODY, 1))
    _raises(_batch(vi(-5) + GOOD_BODY, 1), match="negative")


def test_field_lengths_out_of_bounds():
    """Key/value lengths below -1 or past the record, bad header counts and non-UTF-8
    header keys are refused."""
    for body in (b"\x00" + vi(0) + vi(0) + vi(-2) + vi(-1) + vi(0),
                 b"\x00" + vi(0) + vi(0) + vi(50) + b"kk" + vi(-1) + vi(0),
                 b"\x00" + vi(0) + vi(0) + vi(-1) + vi(9) + b"v" + vi(0),
                 b"\x00" + vi(0) + vi(0) + vi(-1) + vi(-1) + vi(-1),
                 b"\x00" + vi(0) + vi(0) + vi(-1) + vi(-1) + vi(1) + vi(2) + b"\xff\xfe"
                 + vi(-1),
                 b"\x00" + vi(0) + vi(0) + vi(-1) + vi(-1) + vi(1000) + b"\x00\x00"):
        _raises(_batch(_record(body), 1))


def test_decompression_bomb_is_bounded():
    """A batch inflating past the limit is refused (default limit 64 MiB, configurable), and
    a snappy block declaring a huge size is refused before allocating it."""
    bomb = _batch(_record(b"\x00" + vi(0) + vi(0) + vi(-1) + vi(1 << 20) + bytes(1 << 20)
                          + vi(0)), 1, codec=CODEC_GZIP)
    assert len(decode_records(bomb)[0].value) == 1 << 20
    with pytest.raises(CorruptRecordError, match="limit"):
        decode_records(bomb, max_decompressed_bytes=100_000)
    zeros = zlib.compressobj(1, zlib.DEFLATED, 31)
    huge = zeros.compress(bytes(65 << 20)) + zeros.flush()
    data = bytearray(_batch(b"", 0, codec=CODEC_GZIP))[:HEADER_SIZE] + huge
    struct.pack_into(">i", data, 8, len(data) - LOG_OVERHEAD)
    with pytest.raises(CorruptRecordError, match="limit"):
        decode_records(_fix_crc(data))
    fake = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", 6) + \
        b"\xff\xff\xff\xff\x0f\x00"
    with pytest.raises(CorruptRecordError, match="limit"):
        compression.decompress(CODEC_SNAPPY, fake)
    for codec in (CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, compression.CODEC_ZSTD):
        with pytest.raises(CorruptRecordError):
            compression.decompress(codec, b"\x00garbage" * 3)


def test_zstd_bomb_truncation_and_trailing_bytes_are_refused():
    """zstd: a frame inflating past the limit is refused without trusting its declared
    size (and without allocating it), a frame cut short or followed by bytes that are no
    frame is corrupt; concatenated frames and frames without a content size are read."""
    import zstandard
    bomb = compression.compress(compression.CODEC_ZSTD, bytes(200 << 20))
    assert len(bomb) < 10_000
    with pytest.raises(CorruptRecordError, match="limit"):
        compression.decompress(compression.CODEC_ZSTD, bomb)
    frame = compression.compress(compression.CODEC_ZSTD, b"abc" * 50_000)
    with pytest.raises(CorruptRecordError, match="limit"):
        compression.decompress(compression.CODEC_ZSTD, frame, max_bytes=149_999)
    assert compression.decompress(compression.CODEC_ZSTD, frame,
                                  max_bytes=150_000) == b"abc" * 50_000
    for bad in (frame[:-1], frame[:5], frame + b"junk", b""):
        with pytest.raises(CorruptRecordError):
            compression.decompress(compression.CODEC_ZSTD, bad)
    assert compression.decompress(compression.CODEC_ZSTD, frame + frame) == b"abc" * 100_000
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"xyz" * 1000)
    assert compression.decompress(compression.CODEC_ZSTD, unsized) == b"xyz" * 1000


def test_legacy_corruption():
    """Legacy sets with a bad CRC, a truncated message, bad lengths, double compression or
    decreasing offsets are refused with typed errors."""
    good = build_legacy([(b"k", b"v", 5), (None, b"w", 6)], magic=1)
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC32 mismatch"):
        upconvert(bytes(bad))
    with pytest.raises(CorruptRecordError):
        upconvert(good[:-3])
    with pytest.raises(CorruptRecordError):
        to_v2(good[:10])
    inner = build_legacy([(None, b"v", 1)], magic=1, codec=CODEC_GZIP)
    double = build_legacy([(None, inner, 1)], magic=1)  # hand-made: value is a set...
    double = bytearray(double)
    double[17] |= CODEC_GZIP  # ...whose wrapper says gzip but holds a compressed wrapper
    with pytest.raises(CorruptRecordError):
        upconvert(_fix_legacy_crc(double))
    backwards = build_legacy([(None, b"a", 1)], magic=1, base_offset=5) + \
        build_legacy([(None, b"b", 1)], magic=1, base_offset=3)
    with pytest.raises(InvalidRecordError):
        upconvert(backwards)
    with pytest.raises(UnsupportedVersionError):
        to_v2(b"\x00" * 16 + b"\x07" + b"\x00" * 20)


def _fix_legacy_crc(data):
    data = bytearray(data)
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    return bytes(data)


def _check_decoders(data):
    """Either every decoder agrees on the records, or each raises a typed error
    (validate_records both walking small requests record by record and vectorised)."""
    for walk in (1000, 0):
        records_mod.SMALL_REQUEST_RECORDS = walk
        try:
            _check_decoders_once(data)
        finally:
            records_mod.SMALL_REQUEST_RECORDS = SMALL_REQUEST_RECORDS


def _check_decoders_once(data):
    try:
        records = decode_records(data, max_decompressed_bytes=1 << 20)
    except CORRUPT:
        with pytest.raises(CORRUPT):
            decode_columns(data, max_decompressed_bytes=1 << 20)
        for form in (data, memoryview(bytearray(data))):  # read in place, bytes or a view
            with pytest.raises(CORRUPT):
                validate_records(form, max_decompressed_bytes=1 << 20)
        return
    for form in (data, memoryview(bytearray(data))):
        summary = validate_records(form, max_decompressed_bytes=1 << 20)
        assert summary == (len(records), sum(r.key is None for r in records))
    cols = decode_columns(data, max_decompressed_bytes=1 << 20)
    assert cols["value"].to_pylist() == [r.value for r in records]
    assert cols["offset"].to_pylist() == [r.offset for r in records]


SEEDS = [build([b"value-%d" % i for i in range(20)], [b"k%d" % i for i in range(20)],
               headers=[[("h", b"x")] if i % 3 == 0 else [] for i in range(20)],
               compression=codec) for codec in (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY,
                                                CODEC_LZ4)]
SEEDS.append(build([b"v" * 100] * 100, [b"k" * 8] * 100))


@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(SEEDS))),
       st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1,
                max_size=6),
       st.sampled_from(["flip", "truncate", "insert", "delete"]), st.booleans())
def test_fuzz_mutated_batches(seed, edits, how, fix_crc):
    """Mutated valid batches (with the CRC re-fixed half the time, so the record parser is
    reached) decode consistently or raise a typed error; never crash or hang."""
    data = bytearray(SEEDS[seed])
    for pos, byte in edits:
        pos %= len(data)
        if how == "flip":
            data[pos] = byte
        elif how == "truncate":
            del data[pos:]
            break
        elif how == "insert":
            data[pos:pos] = bytes([byte])
        else:
            del data[pos]
        if not data:
            break
    if fix_crc and len(data) >= HEADER_SIZE:
        data = bytearray(_fix_crc(data))
    _check_decoders(bytes(data))


@settings(max_examples=200, deadline=2000)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(blob):
    """Random bytes, raw or behind a valid header and CRC, never crash the decoders, nor
    up-conversion."""
    _check_decoders(blob)
    for codec in (CODEC_NONE, CODEC_GZIP, CODEC_LZ4):
        _check_decoders(_batch(blob, max(1, len(blob) // 20), codec=codec))
    try:
        to_v2(blob)
    except (CorruptRecordError, InvalidRecordError):
        pass


@settings(max_examples=200, deadline=2000)
@given(st.integers(0, 2), st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)),
                                   min_size=1, max_size=4), st.booleans())
def test_fuzz_legacy(which, edits, fix_crc):
    """Mutated legacy message sets up-convert to a valid batch or raise a typed error."""
    legacy = [build_legacy([(b"k", b"v" * 30, 5)] * 4, magic=1, codec=CODEC_GZIP),
              build_legacy([(None, b"v" * 30, 5)] * 4, magic=0, codec=CODEC_LZ4),
              build_legacy([(b"k", None, 5)] * 4, magic=1)][which]
    data = bytearray(legacy)
    for pos, byte in edits:
        data[pos % len(data)] = byte
    if fix_crc:
        data = bytearray(_fix_legacy_crc(data)) if len(data) > 16 else data
    try:
        v2 = to_v2(bytes(data))
    except (CorruptRecordError, InvalidRecordError):
        return
    decode_records(v2)
