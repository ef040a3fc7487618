#!/usr/bin/env python3
"""A leader's append of a client's request (``Log.append(validate_records=True)``: every
record checked, as a PartitionReplica does for each produce), next to a raw sequential file
append of the same bytes and to a follower-style append without record validation, in the
same run. About 20 seconds.

Batches: 16 KiB and 1 MiB of 8-byte keys + 100-byte values, uncompressed, and 1 MiB lz4.
Prints a table, then one JSON object as its last line. MB/s means 10**6 bytes per second.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from storage import Log, LogConfig  # noqa: E402
from storage.records import RecordBatch  # noqa: E402

MiB = 1 << 20


def batch(nbytes: int, compression=None) -> bytes:
    n = max(nbytes // 120, 1)
    values = [os.urandom(100) for _ in range(n)]
    keys = [os.urandom(8) for _ in range(n)]
    return RecordBatch.build(values, keys=keys, compression=compression)


def raw_MBps(path: str, data: bytes, n: int) -> float:
    t0 = time.perf_counter()
    with open(path, "ab", buffering=0) as f:
        for _ in range(n):
            f.write(data)
    dt = time.perf_counter() - t0
    os.unlink(path)
    return n * len(data) / dt / 1e6


def log_MBps(path: str, data: bytes, n: int, validate: bool) -> float:
    log = Log.open(path, LogConfig(segment_bytes=1 << 30, max_message_bytes=4 * MiB))
    t0 = time.perf_counter()
    for _ in range(n):
        log.append(data, validate_records=validate)
    dt = time.perf_counter() - t0
    log.close()
    shutil.rmtree(path)
    return n * len(data) / dt / 1e6


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="leader-append-")
    out = {}
    try:
        cases = [("16k", batch(16 * 1024), 4000), ("1m", batch(MiB), 200),
                 ("1m_lz4", batch(MiB, "lz4"), 200)]
        print(f"{'batch':8} {'raw MB/s':>10} {'plain MB/s':>11} {'validated MB/s':>15} "
              f"{'validated/raw':>14} {'records/s':>12}")
        for name, data, n in cases:
            log_MBps(os.path.join(tmp, "warm"), data, max(n // 10, 1), True)
            raw = raw_MBps(os.path.join(tmp, "raw"), data, n)
            plain = log_MBps(os.path.join(tmp, "plain"), data, n, False)
            validated = log_MBps(os.path.join(tmp, "val"), data, n, True)
            per_batch = (16 * 1024 if name == "16k" else MiB) // 120
            rps = validated * 1e6 / len(data) * per_batch
            print(f"{name:8} {raw:10.0f} {plain:11.0f} {validated:15.0f} "
                  f"{validated / raw:14.2f} {rps:12.0f}")
            out[f"{name}_raw_MBps"] = round(raw, 1)
            out[f"{name}_plain_append_MBps"] = round(plain, 1)
            out[f"{name}_validated_append_MBps"] = round(validated, 1)
            out[f"{name}_validated_vs_raw"] = round(validated / raw, 3)
            out[f"{name}_validated_records_per_s"] = round(rps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
