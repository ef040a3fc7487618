"""The seed's v0/v1 messages (storage.legacy): read exactly as the seed lays them out and
up-converted to one v2 batch keeping offsets, keys, values, timestamps and codec."""

import struct
import zlib

import pytest

from storage import compression
from storage.legacy import build_legacy, iter_legacy, to_v2, upconvert
from storage.log import Log
from storage.records import (CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CREATE_TIME,
                             LOG_APPEND_TIME, Record, build, decode_records, parse_header)

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4]
ROWS = [(b"k1", b"v1", 1000), (None, b"v2", 1003), (b"k3", None, 1001), (b"", b"", 1002)]


def _seed_message(offset, magic, attributes, timestamp, key, value):
    """One on-disk message exactly as the seed's section 5.5 table lays it out."""
    body = struct.pack(">bb", magic, attributes)
    if magic > 0:
        body += struct.pack(">q", timestamp)
    body += struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body)
    # message length = 4 (crc) + 1 + 1 + 8 (if magic > 0) + 4 + K + 4 + V
    return struct.pack(">qiI", offset, 4 + len(body), crc) + body


def test_builder_writes_the_seed_layout():
    """build_legacy writes byte for byte the seed's on-disk message format (both magics)."""
    for magic in (0, 1):
        want = b"".join(_seed_message(10 + i, magic, 0, ts if magic else None, k, v)
                        for i, (k, v, ts) in enumerate(ROWS))
        assert build_legacy(ROWS, magic=magic, base_offset=10) == want


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
def test_upconvert_keeps_everything(magic, codec):
    """Up-conversion keeps offsets (as deltas from the first), keys, values, timestamps
    (-1 for magic 0) and the codec; magic 0 lz4 with Kafka 0.8's bad header checksum too."""
    legacy = build_legacy(ROWS, magic=magic, codec=codec, base_offset=500)
    v2 = upconvert(legacy)
    h = parse_header(v2)
    assert (h.base_offset, h.last_offset_delta, h.compression, h.magic) == (500, 3, codec, 2)
    assert decode_records(v2) == [
        Record(500 + i, ts if magic else -1, CREATE_TIME, k, v, [])
        for i, (k, v, ts) in enumerate(ROWS)]
    assert to_v2(legacy) == v2


def test_magic0_lz4_header_checksum_is_kafka08s():
    """Magic 0 lz4 wrappers carry the checksum Kafka 0.8 computed (over the magic too), which
    a standard LZ4 decoder refuses; we repair it only for magic 0."""
    payload = compression.legacy_lz4_compress(b"x" * 100)
    with pytest.raises(compression.CorruptRecordError):
        compression.decompress(CODEC_LZ4, payload)
    assert compression.decompress(CODEC_LZ4, payload, legacy_lz4=True) == b"x" * 100


def test_magic1_relative_offsets_and_log_append_time():
    """A broker-written magic 1 wrapper (absolute last offset, relative inner offsets) and
    LogAppendTime (the wrapper's timestamp is every record's) convert to the same records."""
    legacy = build_legacy(ROWS, magic=1, codec=CODEC_GZIP, base_offset=70,
                          log_append_time_ms=9999)
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in iter_legacy(legacy)] == [
        (70 + i, 9999, LOG_APPEND_TIME) for i in range(4)]
    v2 = upconvert(legacy)
    assert parse_header(v2).timestamp_type == LOG_APPEND_TIME
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in decode_records(v2)] == [
        (70 + i, 9999, LOG_APPEND_TIME) for i in range(4)]


def test_several_wrappers_and_plain_messages_make_one_batch():
    """A set mixing wrappers and plain messages becomes one batch in offset order, with the
    first wrapper's codec."""
    legacy = (build_legacy(ROWS[:2], magic=1, base_offset=0)
              + build_legacy(ROWS[2:], magic=1, codec=CODEC_SNAPPY, base_offset=2)
              + build_legacy([(b"z", b"z", 5)], magic=1, codec=CODEC_GZIP, base_offset=4))
    v2 = upconvert(legacy)
    assert parse_header(v2).compression == CODEC_SNAPPY
    assert [(r.offset, r.key) for r in decode_records(v2)] == [
        (0, b"k1"), (1, None), (2, b"k3"), (3, b""), (4, b"z")]


def test_to_v2_passes_v2_through():
    """A v2 batch comes back as the very same object; bytes after it are refused."""
    v2 = build([b"a"])
    assert to_v2(v2) is v2
    with pytest.raises(compression.CorruptRecordError):
        to_v2(v2 + b"\x00")


def test_a_log_appends_a_legacy_message_set_as_one_v2_batch(tmp_path):
    """Log.append up-converts a v0/v1 message set (storage.legacy, which the log imports
    itself: storage.records does not) and stores the v2 batch with its records."""
    with Log.open(str(tmp_path)) as log:
        assert log.append(build_legacy(ROWS, magic=1, codec=CODEC_GZIP)) == (0, 3)
        assert [(r.offset, r.key, r.value) for r in decode_records(log.read(0))] == [
            (i, k, v) for i, (k, v, _) in enumerate(ROWS)]
