"""Throughput of the record-batch codec (storage.records) against kafka-python's.

Each function returns records per second for the same workload: records of an 8-byte key
and a 100-byte value, no headers, uncompressed, in batches of ``batch_records`` records
(1000 by default: ~120 KB, a producer's batch under load). Decoding reads a buffer of 10
such batches, as a log read returns them. Each function runs for about ``seconds`` and
reports the best of its short trials, so that other processes sharing the CPU distort the
figure as little as possible; the kafka-python figures are measured the same way.
"""

from __future__ import annotations

import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from storage.records import RecordBatch, decode_columns, decode_records  # noqa: E402

KEY_BYTES = 8
VALUE_BYTES = 100
BATCHES_PER_READ = 10


def _workload(batch_records: int):
    rnd = __import__("random").Random(42)
    keys = [rnd.randbytes(KEY_BYTES) for _ in range(batch_records)]
    values = [rnd.randbytes(VALUE_BYTES) for _ in range(batch_records)]
    return keys, values


def _rate(fn, records_per_call: int, seconds: float) -> float:
    """Best records/s over trials of ~0.1 s each within ``seconds``."""
    fn()  # warm up (imports, caches)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= 0.1:
                break
        best = max(best, calls * records_per_call / elapsed)
    return best


def build_records_per_s(seconds: float = 5.0, batch_records: int = 1000) -> float:
    """Records/s of RecordBatch.build (uncompressed)."""
    keys, values = _workload(batch_records)
    return _rate(lambda: RecordBatch.build(values, keys), batch_records, seconds)


def kafka_python_build_records_per_s(seconds: float = 5.0, batch_records: int = 1000) -> float:
    """Records/s of kafka-python's DefaultRecordBatchBuilder on the same records."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    keys, values = _workload(batch_records)

    def build():
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0,
                                            is_transactional=False, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1,
                                            batch_size=1 << 30)
        for i in range(batch_records):
            builder.append(i, timestamp=None, key=keys[i], value=values[i], headers=[])
        return builder.build()

    return _rate(build, batch_records, seconds)


def _read_buffer(batch_records: int) -> bytes:
    keys, values = _workload(batch_records)
    now = int(time.time() * 1000)
    return b"".join(RecordBatch.build(values, keys, base_offset=i * batch_records, now_ms=now)
                    for i in range(BATCHES_PER_READ))


def decode_records_per_s(seconds: float = 5.0, batch_records: int = 1000) -> float:
    """Records/s of decode_records (to Record objects) over a 10-batch read."""
    buf = _read_buffer(batch_records)
    return _rate(lambda: decode_records(buf), batch_records * BATCHES_PER_READ, seconds)


def kafka_python_decode_records_per_s(seconds: float = 5.0, batch_records: int = 1000) -> float:
    """Records/s of kafka-python's MemoryRecords/DefaultRecordBatch (CRC checked, records
    materialised in a list) over the same read."""
    from kafka.record.memory_records import MemoryRecords
    buf = _read_buffer(batch_records)

    def decode():
        out = []
        records = MemoryRecords(buf)
        while records.has_next():
            batch = records.next_batch()
            if not batch.validate_crc():
                raise ValueError("bad CRC")
            out.extend(batch)
        return out

    return _rate(decode, batch_records * BATCHES_PER_READ, seconds)


def decode_columns_records_per_s(seconds: float = 5.0, batch_records: int = 1000) -> float:
    """Records/s of decode_columns (to pyarrow columns) over the same read."""
    buf = _read_buffer(batch_records)
    return _rate(lambda: decode_columns(buf), batch_records * BATCHES_PER_READ, seconds)


ALL = (build_records_per_s, kafka_python_build_records_per_s, decode_records_per_s,
       kafka_python_decode_records_per_s, decode_columns_records_per_s)

if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    batch_records = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    for fn in ALL:
        rate = fn(seconds, batch_records)
        print(f"{fn.__name__:40s} {rate:14,.0f} records/s")
