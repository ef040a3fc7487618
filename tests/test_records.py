"""The v2 record-batch codec (storage.records, storage.varint, storage.compression):
round trips through build and the decoders, and the header fields Kafka defines."""

import random
import struct

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import compression, varint
from storage.errors import (CorruptRecordError, InvalidRecordError, UnsupportedCodecError,
                            UnsupportedVersionError)
from storage.records import (ATTRIBUTES_POS, CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY,
                             CODEC_ZSTD, CRC_POS, HEADER_SIZE, LOG_APPEND_TIME, Record,
                             RecordBatch, assign_offsets, build, decode_columns,
                             decode_records, iter_batches, parse_header)

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]


def _random_records(rnd, n, *, headers=True, uniform=False):
    klen, vlen = rnd.randrange(0, 20), rnd.randrange(0, 300)

    def blob(size_hint):
        r = rnd.random()
        if r < 0.1:
            return None
        if uniform:
            return rnd.randbytes(size_hint)
        return b"" if r < 0.15 else rnd.randbytes(rnd.randrange(0, size_hint * 2 + 1))

    keys = [blob(klen) for _ in range(n)]
    values = [blob(vlen) for _ in range(n)]
    hdrs = None
    if headers:
        hdrs = [[(f"h{j}\u00e9", None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(5)))
                 for j in range(rnd.choice([0, 0, 1, 3]))] for _ in range(n)]
    base = rnd.randrange(0, 2**41)
    timestamps = [base + rnd.randrange(-10**6, 10**6) for _ in range(n)]
    return keys, values, hdrs, timestamps


def _expected(keys, values, hdrs, timestamps, *, base_offset=0, deltas=None, ts_type=0,
              max_ts=None):
    n = len(values)
    deltas = deltas if deltas is not None else range(n)
    return [Record(base_offset + deltas[i],
                   max_ts if ts_type == LOG_APPEND_TIME else timestamps[i], ts_type,
                   keys[i], values[i], list(hdrs[i]) if hdrs else [])
            for i in range(n)]


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_round_trip(x):
    """Every int64 encodes to at most 10 bytes and decodes back; the table agrees."""
    enc = varint.encode_varint(x)
    assert len(enc) <= 10
    assert varint.decode_varint(enc, 0) == (x, len(enc))
    assert varint.varint(x) == enc
    arr = np.frombuffer(enc + bytes(16), np.uint8)
    values, sizes = varint.decode_at(arr, np.array([0]), 10)
    assert (int(values[0]), int(sizes[0])) == (x, len(enc))
    assert int(varint.sizes_of(np.array([x]))[0]) == len(enc)
    assert varint.encode_columns(np.array([x]), len(enc)).tobytes() == enc


def test_varint_known_encodings():
    """Zig-zag maps 0,-1,1,-2,63,64 to Kafka's bytes."""
    assert [varint.encode_varint(x) for x in (0, -1, 1, -2, 63, 64, -65)] == [
        b"\x00", b"\x01", b"\x02", b"\x03", b"\x7e", b"\x80\x01", b"\x81\x01"]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_all_codecs(codec):
    """Random batches (null/empty keys and values, headers) decode to exactly what was built,
    through records(), decode_records and decode_columns, for every codec."""
    rnd = random.Random(codec)
    for trial in range(25):
        n = rnd.choice([1, 2, 7, 64, 65, 300])
        keys, values, hdrs, ts = _random_records(rnd, n, headers=trial % 2 == 0,
                                                 uniform=trial % 3 == 0)
        data = build(values, keys, ts, hdrs, base_offset=1000 + trial, compression=codec)
        batch = RecordBatch(data)
        assert batch.header.compression == codec
        want = _expected(keys, values, hdrs, ts, base_offset=1000 + trial)
        assert batch.records() == want
        assert list(batch) == want
        assert decode_records(data) == want
        cols = decode_columns(data)
        assert cols["offset"].to_pylist() == [r.offset for r in want]
        assert cols["timestamp"].to_pylist() == [r.timestamp for r in want]
        assert cols["key"].to_pylist() == keys
        assert cols["value"].to_pylist() == values
        assert cols["headers"].to_pylist() == [
            [{"key": k, "value": v} for k, v in r.headers] for r in want]


def test_header_fields_and_crc_coverage():
    """The 61-byte header carries every field given to build, the CRC32C covers attributes
    to the end, and base/max timestamps are the first and the largest."""
    data = build([b"a", b"b", b"c"], [b"k", None, b"k"], [50, 70, 60], base_offset=7,
                 producer_id=12345, producer_epoch=3, base_sequence=99,
                 partition_leader_epoch=4, is_transactional=True, compression="gzip")
    h = parse_header(data)
    assert (h.base_offset, h.partition_leader_epoch, h.magic) == (7, 4, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (12345, 3, 99)
    assert (h.base_timestamp, h.max_timestamp, h.last_offset_delta, h.records_count) == \
        (50, 70, 2, 3)
    assert h.is_transactional and not h.is_control and h.compression == CODEC_GZIP
    assert h.crc == crc32c.crc32c(data[ATTRIBUTES_POS:])
    assert h.size == len(data)


def test_control_batch_bit_carried():
    """is_control sets the control bit; control batches can be skipped when decoding."""
    control = build([b"\x00\x00\x00\x00"], [struct.pack(">hh", 0, 1)], is_control=True,
                    is_transactional=True, producer_id=5, producer_epoch=0, base_sequence=-1,
                    base_offset=10)
    data = build([b"x"], base_offset=9) + control
    assert RecordBatch(control).header.is_control
    assert [r.offset for r in decode_records(data)] == [9, 10]
    assert [r.offset for r in decode_records(data, skip_control_batches=True)] == [9]


def test_log_append_time_reads_max_timestamp():
    """With LogAppendTime every record reads the batch max_timestamp (the append time)."""
    data = build([b"a", b"b"], timestamps=[5, 6], timestamp_type=LOG_APPEND_TIME, now_ms=1000)
    h = parse_header(data)
    assert h.timestamp_type == LOG_APPEND_TIME and h.max_timestamp == 1000
    assert [(r.timestamp, r.timestamp_type) for r in decode_records(data)] == [
        (1000, 1), (1000, 1)]
    assert decode_columns(data)["timestamp_type"].to_pylist() == [1, 1]
    # The log's in-place rewrite (assign_offsets) is read the same way.
    rewritten = bytes(assign_offsets(build([b"a"], timestamps=[5]), 50,
                                     log_append_time_ms=777))
    assert decode_records(rewritten) == [Record(50, 777, 1, None, b"a", [])]


def test_offset_deltas_with_gaps_and_default_timestamps():
    """offset_deltas keep compacted offsets (gaps allowed, last_offset_delta from the last);
    missing timestamps are now_ms."""
    data = build([b"a", b"b", b"c"], offset_deltas=[0, 5, 9], base_offset=100, now_ms=42)
    assert parse_header(data).last_offset_delta == 9
    assert [(r.offset, r.timestamp) for r in decode_records(data)] == [
        (100, 42), (105, 42), (109, 42)]
    for bad in ([1, 1, 2], [-1, 0, 1], [0, 1, 2**31]):
        with pytest.raises(InvalidRecordError):
            build([b"a", b"b", b"c"], offset_deltas=bad)


def test_uniform_fast_path_matches_general_path():
    """The numpy builder (same-length keys/values, no headers) writes the same bytes as the
    general one, across varint size changes of both deltas."""
    rnd = random.Random(3)
    for n in (1, 63, 64, 65, 200, 9000):
        keys = [rnd.randbytes(8) for _ in range(n)]
        values = [rnd.randbytes(100) for _ in range(n)]
        ts = sorted(rnd.randrange(10**12, 10**12 + 10**5) for _ in range(n))
        fast = build(values, keys, ts, partition_leader_epoch=0)
        slow = build(values, keys, ts, [[] for _ in range(n)], partition_leader_epoch=0)
        assert fast == slow
        assert decode_records(fast) == _expected(keys, values, None, ts)
    values = [b"v"] * 100
    assert build(values, now_ms=1) == build(values, headers=[()] * 100, now_ms=1)


@pytest.mark.parametrize("codec", CODECS)
def test_small_batches_built_without_numpy_are_the_bytes_numpy_builds(codec, monkeypatch):
    """A batch of up to SMALL_BATCH_RECORDS records (built in plain Python, as a linger-0
    producer's are) is byte for byte the batch the numpy path builds: keys, nulls,
    headers, timestamps, offset gaps, every codec."""
    from storage import records
    rnd = random.Random(11)
    cases = []
    for _ in range(200):
        n = rnd.randint(1, records.SMALL_BATCH_RECORDS)
        keys, values, headers, stamps = _random_records(rnd, n, headers=rnd.random() < 0.3,
                                                        uniform=rnd.random() < 0.5)
        ts = rnd.choice([None, stamps])
        deltas = rnd.choice([None, sorted(rnd.sample(range(10**6), n))])
        cases.append((values, keys, ts, headers, deltas))
    small = [build(v, k, t, h, offset_deltas=d, compression=codec, now_ms=7)
             for v, k, t, h, d in cases]
    monkeypatch.setattr(records, "SMALL_BATCH_RECORDS", 0)       # numpy for all
    assert small == [build(v, k, t, h, offset_deltas=d, compression=codec, now_ms=7)
                     for v, k, t, h, d in cases]


@pytest.mark.parametrize("codec", CODECS)
def test_small_buffers_decode_record_by_record_as_large_ones_do(codec):
    """decode_records walks a buffer of 32 records or fewer in Python and a larger one with
    numpy: both give the records that were built (headers, null keys and values,
    LogAppendTime, several batches), as bytes, around the threshold."""
    rnd = random.Random(codec)
    for n in (1, 2, 31, 32, 33):
        for ts_type in (0, LOG_APPEND_TIME):
            keys, values, hdrs, ts = _random_records(rnd, n)
            cut = rnd.randrange(0, n + 1)
            buf = (build(values[:cut], keys[:cut], ts[:cut], hdrs[:cut], base_offset=7,
                         compression=codec, timestamp_type=ts_type, now_ms=5)
                   + build(values[cut:], keys[cut:], ts[cut:], hdrs[cut:],
                           base_offset=7 + cut, compression=codec,
                           timestamp_type=ts_type, now_ms=5))
            got = decode_records(buf)
            want = [Record(7 + i, 5 if ts_type == LOG_APPEND_TIME else ts[i], ts_type,
                           keys[i], values[i], list(hdrs[i])) for i in range(n)]
            assert got == want
            assert all(type(x) is bytes for r in got for x in (r.key, r.value)
                       if x is not None)
            assert all(type(v) is bytes for r in got for _, v in r.headers if v is not None)


def test_empty_batch():
    """A batch of no records (what compaction can leave) builds and decodes to nothing."""
    data = build([])
    h = parse_header(data)
    assert (h.records_count, len(data)) == (0, HEADER_SIZE)
    assert decode_records(data) == [] and RecordBatch(data).records() == []
    assert len(decode_columns(data)["offset"]) == 0


def test_multiple_batches_iter_and_decode():
    """decode_records and iter_batches walk concatenated batches of mixed codecs in order."""
    parts = [build([bytes([i]) * 10] * 5, base_offset=i * 5, compression=CODECS[i % 4])
             for i in range(8)]
    buf = b"".join(parts)
    assert [r.offset for r in decode_records(buf)] == list(range(40))
    batches = list(iter_batches(buf))
    assert [b.header.base_offset for b in batches] == [i * 5 for i in range(8)]
    assert [bytes(b) for b in batches] == parts
    table = pa.table(decode_columns(buf))
    assert table.num_rows == 40 and table.column("offset").to_pylist() == list(range(40))


@pytest.mark.parametrize("lengths", [[100] * 50, [0] * 7, [-1] * 9, [3, 40, 3, -1, 0, 40, 12, 3],
                                     list(range(-1, 30))],
                         ids=["one-length", "empty", "null", "few-lengths", "many-lengths"])
def test_columns_of_any_value_lengths_hold_the_records_bytes(lengths):
    """decode_columns' key and value columns equal decode_records' keys and values, nulls
    and empty strings included, whether the values have one length, a few or many."""
    values = [None if n < 0 else bytes((i + j) % 256 for j in range(n))
              for i, n in enumerate(lengths)]
    keys = list(reversed(values))
    buf = build(values, keys=keys) + build(values[::-1], keys=keys[::-1],
                                           base_offset=len(values))
    cols = decode_columns(buf)
    records = decode_records(buf)
    assert cols["value"].type == cols["key"].type == pa.binary()
    assert cols["value"].to_pylist() == [r.value for r in records] == values + values[::-1]
    assert cols["key"].to_pylist() == [r.key for r in records]


def test_build_argument_errors():
    """Bad arguments fail loudly with a typed error, not a corrupt batch."""
    with pytest.raises(ValueError):
        build([b"a"], keys=[b"a", b"b"])
    with pytest.raises(ValueError):
        build([b"a"], timestamps=[1, 2])
    with pytest.raises(UnsupportedCodecError):
        build([b"a"], compression="brotli")
    with pytest.raises(TypeError):
        build(["not bytes"], headers=[[("k", b"v")]])
    with pytest.raises(ValueError, match="too far apart"):
        build([b"a", b"b"], timestamps=[-(2**63), 2**63 - 1])


def test_record_batch_rejects_trailing_bytes_and_legacy():
    """RecordBatch is exactly one v2 batch: trailing bytes and legacy magic are refused."""
    data = build([b"a"])
    with pytest.raises(CorruptRecordError, match="trailing"):
        RecordBatch(data + b"\x00")
    legacy = bytearray(data)
    legacy[16] = 1
    with pytest.raises(UnsupportedVersionError):
        RecordBatch(bytes(legacy))


def test_compression_framing():
    """Snappy is xerial-framed and lz4 an LZ4 frame with independent blocks, as Kafka clients
    write them; gzip accepts concatenated members; every decompression respects its bound."""
    data = bytes(range(256)) * 1000
    snappy = compression.compress(CODEC_SNAPPY, data)
    assert snappy[:8] == b"\x82SNAPPY\x00"
    lz4 = compression.compress(CODEC_LZ4, data)
    assert lz4[:4] == b"\x04\x22\x4d\x18" and lz4[4] & 0x20  # FLG: block independence
    gz = compression.compress(CODEC_GZIP, data)
    assert compression.decompress(CODEC_GZIP, gz + gz) == data + data
    for codec in (CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4):
        packed = compression.compress(codec, data)
        assert compression.decompress(codec, packed) == data
        with pytest.raises(CorruptRecordError, match="limit"):
            compression.decompress(codec, packed, max_bytes=len(data) - 1)
    import snappy as raw_snappy
    assert compression.decompress(CODEC_SNAPPY, raw_snappy.compress(data)) == data


def test_xxh32_matches_lz4_frame_header_checksum():
    """Our xxh32 reproduces the header checksum byte lz4 writes (used to repair magic 0)."""
    frame = compression.compress(CODEC_LZ4, b"hello")
    assert frame[6] == (compression.xxh32(frame[4:6]) >> 8) & 0xFF
    assert compression.xxh32(b"") == 0x02CC5D05  # the reference value for empty input
    assert compression.xxh32(b"a" * 40) == compression.xxh32(bytearray(b"a" * 40))


def test_crc_recomputed_matches_position():
    """The CRC sits at byte 17 and changing any covered byte is detected."""
    data = bytearray(build([b"abc"]))
    assert struct.unpack_from(">I", data, CRC_POS)[0] == crc32c.crc32c(data[ATTRIBUTES_POS:])
    data[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_records(bytes(data))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=20)),
                          st.one_of(st.none(), st.binary(max_size=200)),
                          st.lists(st.tuples(st.text(max_size=5),
                                             st.one_of(st.none(), st.binary(max_size=5))),
                                   max_size=2),
                          st.integers(min_value=-(2**40), max_value=2**40)),
                max_size=40),
       st.sampled_from(CODECS))
def test_round_trip_property(rows, codec):
    """Any records round-trip through build and decode_records for any codec."""
    keys = [r[0] for r in rows]
    values = [r[1] for r in rows]
    hdrs = [r[2] for r in rows]
    ts = [r[3] for r in rows]
    data = build(values, keys, ts, hdrs, compression=codec)
    assert decode_records(data) == _expected(keys, values, hdrs, ts)


def test_validate_records_counts_records_and_null_keys_without_pyarrow():
    """validate_records walks every record (headers and codecs included) and reports the
    record and null-key counts; it never imports pyarrow (run in a fresh interpreter)."""
    import subprocess
    import sys
    code = (
        "import sys\n"
        "from storage.records import build, validate_records\n"
        "keys = [None if i % 4 == 0 else b'k%d' % i for i in range(40)]\n"
        "hdrs = [[('h', b'x')] if i % 3 == 0 else [] for i in range(40)]\n"
        "for codec in ('none', 'gzip', 'snappy', 'lz4'):\n"
        "    b = build([b'v%d' % i for i in range(40)], keys, headers=hdrs, compression=codec)\n"
        "    assert validate_records(b + b) == (80, 20), validate_records(b + b)\n"
        "assert 'pyarrow' not in sys.modules, 'validate_records imported pyarrow'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def test_records_decoded_into_poll_columns_tables_do_not_import_pandas():
    """A fetch answer becomes poll_columns' Table without importing pandas (pa.array,
    pa.scalar and to_numpy do: a third of a second or more in a fresh process, which made
    a group's members start their partitions that much apart)."""
    import pathlib
    import subprocess
    import sys
    code = (
        "import sys\n"
        "from storage.records import build\n"
        "from actors.client.consumer import _columns\n"
        "data = build([b'v%d' % i for i in range(10)], base_offset=5)\n"
        "table = _columns(('t', 1), 7, data)\n"
        "assert table.column('offset').to_pylist() == list(range(7, 15)), table\n"
        "assert set(table.column('topic').to_pylist()) == {'t'}\n"
        "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=pathlib.Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"
