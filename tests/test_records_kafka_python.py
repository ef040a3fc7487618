"""Cross-checks with kafka-python's record code (the reference client): what we write it
reads identically, what it writes we read identically, and uncompressed batches are
byte-identical."""

import random
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from storage.legacy import iter_legacy, upconvert
from storage.records import (CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD,
                             LOG_APPEND_TIME, RecordBatch, build, decode_columns,
                             decode_records, parse_header)

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4]    # legacy message sets' codecs
V2_CODECS = CODECS + [CODEC_ZSTD]      # zstd exists from magic 2 on (Kafka 2.1)
TRIALS = 1200  # per direction; each a random batch


def _random_batch(rnd):
    n = rnd.choice([1, 1, 2, 3, 5, 10, 30, 70, 130])
    shape = rnd.random()

    def blob(limit):
        r = rnd.random()
        if r < 0.1:
            return None
        if r < 0.15:
            return b""
        return rnd.randbytes(rnd.randrange(limit))

    if shape < 0.3:  # uniform: the builder's numpy path
        klen, vlen = rnd.randrange(0, 16), rnd.randrange(1, 200)
        keys = None if rnd.random() < 0.3 else [rnd.randbytes(klen) for _ in range(n)]
        values = [rnd.randbytes(vlen) for _ in range(n)]
        headers = [[] for _ in range(n)]
    else:
        keys = [blob(30) for _ in range(n)]
        values = [blob(400) for _ in range(n)]
        headers = [[(rnd.choice(["a", "trace-id", "é", ""]),
                     None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(20)))
                    for _ in range(rnd.choice([0, 0, 1, 2]))] for _ in range(n)]
    base_ts = rnd.randrange(0, 2**42)
    timestamps = [base_ts + rnd.randrange(-(2**20), 2**20) for _ in range(n)]
    deltas = list(range(n))
    if rnd.random() < 0.3:  # compacted: gaps
        deltas = sorted(rnd.sample(range(n * 3), n))
    producer = (-1, -1, -1) if rnd.random() < 0.5 else (
        rnd.randrange(2**40), rnd.randrange(2**15), rnd.randrange(2**31 - 1000))
    return dict(keys=keys if keys is not None else [None] * n, values=values,
                headers=headers, timestamps=timestamps, deltas=deltas, producer=producer,
                codec=rnd.choice(V2_CODECS), transactional=producer[0] >= 0 and rnd.random() < .5)


def _kp_view(rec):
    return (rec.offset, rec.timestamp, rec.timestamp_type, rec.key, rec.value,
            [tuple(h) for h in rec.headers])


def _our_view(rec):
    return (rec.offset, rec.timestamp, rec.timestamp_type, rec.key, rec.value,
            [tuple(h) for h in rec.headers])


def _kp_build(b):
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=b["codec"], is_transactional=b["transactional"],
        producer_id=b["producer"][0], producer_epoch=b["producer"][1],
        base_sequence=b["producer"][2], batch_size=1 << 30)
    for d, k, v, h, t in zip(b["deltas"], b["keys"], b["values"], b["headers"],
                             b["timestamps"]):
        assert builder.append(d, timestamp=t, key=k, value=v, headers=h) is not None
    return bytes(builder.build())


def _our_build(b, **kwargs):
    pid, epoch, seq = b["producer"]
    return build(b["values"], b["keys"], b["timestamps"], b["headers"],
                 offset_deltas=b["deltas"], compression=b["codec"], producer_id=pid,
                 producer_epoch=epoch, base_sequence=seq, is_transactional=b["transactional"],
                 **kwargs)


def _kp_read(buf):
    out = []
    records = MemoryRecords(buf)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        out.extend(_kp_view(r) for r in batch)
    return out


def test_ours_read_by_kafka_python():
    """Random batches we build (all codecs, nulls, empties, headers, gaps, producer fields)
    are read by kafka-python as the same records and header fields."""
    rnd = random.Random(1)
    for _ in range(TRIALS):
        b = _random_batch(rnd)
        data = _our_build(b, base_offset=rnd.randrange(2**40))
        ours = [_our_view(r) for r in decode_records(data)]
        assert _kp_read(data) == ours
        kb = DefaultRecordBatch(data)
        h = parse_header(data)
        assert (kb.producer_id, kb.producer_epoch, kb.base_sequence, kb.is_transactional,
                kb.compression_type, kb.first_timestamp, kb.max_timestamp,
                kb.last_offset_delta) == (
            h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional,
            h.compression, h.base_timestamp, h.max_timestamp, h.last_offset_delta)


def test_kafka_python_read_by_ours():
    """Random batches kafka-python builds are read by us (records, columns, header fields)
    exactly as kafka-python reads them."""
    rnd = random.Random(2)
    for _ in range(TRIALS):
        b = _random_batch(rnd)
        data = _kp_build(b)
        theirs = _kp_read(data)
        assert [_our_view(r) for r in RecordBatch(data).records()] == theirs
        cols = decode_columns(data)
        assert cols["value"].to_pylist() == [t[4] for t in theirs]
        assert cols["key"].to_pylist() == [t[3] for t in theirs]
        assert cols["offset"].to_pylist() == [t[0] for t in theirs]


def test_uncompressed_batches_byte_identical():
    """With the same inputs (and kafka-python's leader epoch 0), uncompressed batches are
    byte for byte what kafka-python writes."""
    rnd = random.Random(3)
    for _ in range(TRIALS):
        b = _random_batch(rnd)
        b["codec"] = CODEC_NONE
        assert _our_build(b, partition_leader_epoch=0) == _kp_build(b)


def test_log_append_time_and_control_read_by_kafka_python():
    """kafka-python reads our LogAppendTime batch timestamps as max_timestamp and our
    control batch as a commit marker."""
    data = build([b"a", b"b"], timestamps=[1, 2], timestamp_type=LOG_APPEND_TIME, now_ms=99)
    assert [(r[1], r[2]) for r in _kp_read(data)] == [(99, 1), (99, 1)]
    control = build([b"\x00" * 6], [struct.pack(">hh", 0, 1)], is_control=True,
                    is_transactional=True, producer_id=7, producer_epoch=1, base_sequence=-1)
    (rec,) = list(DefaultRecordBatch(control))
    assert DefaultRecordBatch(control).is_control_batch and rec.commit


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_legacy_message_sets_upconvert(magic, codec):
    """Legacy message sets kafka-python writes (magic 0/1, every codec; magic 0 lz4 with its
    broken-framing checksum needs xxhash) up-convert to a v2 batch holding what kafka-python
    reads from them."""
    rnd = random.Random(magic * 10 + codec)
    for _ in range(30):
        n = rnd.randrange(1, 40)
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec,
                                           batch_size=1 << 30)
        for i in range(n):
            builder.append(i, timestamp=rnd.randrange(2**41),
                           key=None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(9)),
                           value=None if rnd.random() < 0.1 else rnd.randbytes(rnd.randrange(99)))
        legacy = bytes(builder.build())
        theirs = []
        for batch in MemoryRecords(legacy):
            theirs.extend((r.offset, r.timestamp if magic else -1, r.key, r.value)
                          for r in batch)
        assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_legacy(legacy)] == theirs
        v2 = upconvert(legacy)
        assert parse_header(v2).compression == codec
        assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(v2)] == theirs
        assert [(r[0], r[3], r[4]) for r in _kp_read(v2)] == [(t[0], t[2], t[3])
                                                              for t in theirs]
