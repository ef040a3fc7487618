"""The storage demo: write a log from a child process, kill it mid-write, recover, read back.

What it shows: every batch the child acknowledged (after an fsync) survives a SIGKILL; the
log recovers to a batch boundary with every CRC valid; and reads give back exactly the
records written, in order. Run by ``raykafka demo --storage``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from storage import Log, LogConfig
from storage.errors import KafkaStorageError
from storage.records import RecordBatch, decode_records

RECORDS_PER_BATCH = 500
VALUE_SIZE = 100


def _value(seq: int) -> bytes:
    head = b"%012d|" % seq
    return head + b"." * (VALUE_SIZE - len(head))


def _child(path: str, total: int, flush_every: int) -> None:
    """Append batches forever-ish; print the last offset of each flushed batch."""
    config = LogConfig(segment_bytes=8 << 20, flush_messages=None)
    log = Log.open(path, config)
    seq = log.log_end_offset
    batches = 0
    out = sys.stdout
    while seq < total * 4:
        keys = [b"key-%d" % (i % 1000) for i in range(seq, seq + RECORDS_PER_BATCH)]
        values = [_value(i) for i in range(seq, seq + RECORDS_PER_BATCH)]
        _, last = log.append(RecordBatch.build(values, keys=keys))
        seq = last + 1
        batches += 1
        if batches % flush_every == 0:
            log.flush()
            out.write(f"{last}\n")
            out.flush()


def run(*, data_dir: str | None = None, records: int = 300_000, quiet: bool = False) -> dict:
    """Run the demo; returns its summary (also printed)."""
    from tqdm import tqdm

    own_dir = data_dir is None
    root = data_dir or tempfile.mkdtemp(prefix="raykafka-demo-")
    path = os.path.join(root, "demo-0")
    if os.path.exists(path):
        shutil.rmtree(path)
    say = (lambda *a: None) if quiet else print
    say(f"raykafka storage demo: log at {path}")
    t0 = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "actors.tools.storage_demo", "--child", path, str(records)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    acked = -1
    bar = tqdm(total=records, unit="rec", desc="write (child)",
               disable=True if quiet else None)
    assert child.stdout is not None
    for line in child.stdout:
        acked = int(line)
        bar.update(acked + 1 - bar.n)
        if acked + 1 >= records:
            break
    child.send_signal(signal.SIGKILL)  # abrupt: no close, no clean-shutdown marker
    child.wait(timeout=30)
    bar.close()
    write_s = time.perf_counter() - t0
    say(f"child killed with SIGKILL after {acked + 1:,} acknowledged records")

    t1 = time.perf_counter()
    log = Log.open(path, LogConfig(segment_bytes=8 << 20))
    recover_s = time.perf_counter() - t1
    size = log.size_bytes
    say(f"recovered in {recover_s * 1000:.0f} ms: log end offset {log.log_end_offset:,}, "
        f"{log.truncated_bytes} torn bytes cut, {len(log.segments)} segments")

    t2 = time.perf_counter()
    offset = log.log_start_offset
    checked = 0
    bar = tqdm(total=log.log_end_offset, unit="rec", desc="read back",
               disable=True if quiet else None)
    while offset < log.log_end_offset:
        data = log.read(offset, 4 << 20)
        for rec in decode_records(data):
            if rec.offset >= offset:
                if rec.offset != checked or rec.value != _value(rec.offset):
                    raise KafkaStorageError(f"demo failed: record {rec.offset} is wrong")
                checked += 1
        offset = checked
        bar.update(checked - bar.n)
    bar.close()
    read_s = time.perf_counter() - t2
    log.close()
    if checked < acked + 1:
        raise KafkaStorageError(f"demo failed: {acked + 1} acknowledged, only {checked} read back")
    summary = {
        "acknowledged_records": acked + 1,
        "records_after_recovery": checked,
        "torn_bytes_cut": log.truncated_bytes,
        "log_MB": round(size / 1e6, 1),
        "write_s": round(write_s, 2),
        "recovery_ms": round(recover_s * 1000, 1),
        "read_records_per_s": round(checked / read_s) if read_s else None,
    }
    say("")
    say("summary")
    for k, v in summary.items():
        say(f"  {k:<24} {v:>14,}" if isinstance(v, int) else f"  {k:<24} {v!s:>14}")
    say("every acknowledged record survived the crash and read back intact")
    if own_dir:
        shutil.rmtree(root, ignore_errors=True)
    return summary


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), flush_every=4)
    else:
        run()
