"""SIGKILL a process that appends to a Log at random moments, reopen, and check what survived.

One log directory lives through every round of a test. Each round spawns a child that opens
the log (recovering it from the previous kill), appends batches from a pool built here with
kafka-python, rolls segments, applies retention, and reports every acknowledged append on
stdout. The parent kills it after a random number of acknowledgements or a random delay
(sometimes while it is still recovering), then opens a copy of the directory as the crash left
it and checks: every acknowledged batch (not yet removed by retention) is present with
identical bytes, the log is contiguous and ends on a batch boundary, every batch passes its CRC
(ours and kafka-python's), and whatever recovery kept is still there in every later round.
"""

from __future__ import annotations

import os
import pathlib
import random
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from storage import Log, LogConfig
from tests.log_helpers import (assert_contiguous, crash_image, kafka_records, make_batch,
                               read_all, with_base_offset)

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROUNDS = 30          # per mode; two modes: 60 kills in all
POOL_SIZE = 512
CONFIG = dict(segment_bytes=8192, retention_bytes=32768, retention_ms=-1,
              file_delete_delay_ms=0, index_interval_bytes=512)

CHILD = r"""
import struct, sys
from storage import Log, LogConfig
path, pool_path, cursor, flush = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
config = dict(__CONFIG__)
data = open(pool_path, "rb").read()
pool, pos = [], 0
while pos < len(data):
    (n,) = struct.unpack_from(">i", data, pos)
    pool.append(data[pos + 4:pos + 4 + n])
    pos += 4 + n
log = Log.open(path, LogConfig(flush_messages=1 if flush else None, **config))
out = sys.stdout
out.write(f"open {log.log_start_offset} {log.log_end_offset}\n")
out.flush()
i = 0
while True:
    k = (cursor + i) % len(pool)
    base, last = log.append(pool[k])   # with flush.messages=1 this returns after the fsync
    out.write(f"ack {base} {last} {k}\n")
    out.flush()
    i += 1
    if i % 16 == 0:
        log.delete_old_segments()
""".replace("__CONFIG__", repr(CONFIG))


def _write_pool(path, rng):
    pool = [make_batch(rng.randint(1, 5), value_size=rng.randint(20, 300),
                       timestamp_ms=1_700_000_000_000 + i) for i in range(POOL_SIZE)]
    with open(path, "wb") as f:
        for b in pool:
            f.write(struct.pack(">i", len(b)) + b)
    return pool


def _run_child_and_kill(log_dir, pool_path, cursor, flush, rng):
    """Spawn a child, kill it with SIGKILL at a random moment; return its acks [(base, last, k)]
    (complete lines only: a line is written after the append it reports has returned)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, log_dir, pool_path, str(cursor),
                             "1" if flush else "0"],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buf = b""
    try:
        by_time = rng.random() < 0.25
        # by time: anywhere from during start-up/recovery to well into the appends
        # by acks: a slow (loaded) machine just gets killed at the 20 s bound instead
        deadline = time.monotonic() + (rng.uniform(0.0, 0.4) if by_time else 20.0)
        target_acks = None if by_time else rng.randint(0, 300)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        fd = proc.stdout.fileno()
        while True:
            if target_acks is not None and buf.count(b"\nack ") >= target_acks:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if sel.select(timeout=remaining):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break  # the child exited by itself: reported below
                buf += chunk
        sel.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        buf += proc.stdout.read()
        stderr = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"child died by itself:\n{stderr}"
    acks = []
    for line in buf.split(b"\n")[:-1]:  # the last piece has no newline: not a whole report
        if line.startswith(b"ack "):
            _, base, last, k = line.split()
            acks.append((int(base), int(last), int(k)))
    return acks


def _verify(image_dir, pool, known, acked_end):
    """Open a crash image and check it against what was acknowledged or already recovered;
    returns the batches it holds."""
    config = LogConfig(**CONFIG)
    with Log.open(image_dir, config) as log:
        assert log.recovered, "no clean-shutdown marker, so the log must be recovered"
        start, end = log.log_start_offset, log.log_end_offset
        # a kill between the log-start checkpoint and the .deleted rename leaves segments
        # wholly below the log start: unreadable, and gone at the next retention pass
        assert log.segments[0].base_offset <= start
        assert end >= acked_end, f"acknowledged up to {acked_end - 1}, log ends at {end}"
        batches = read_all(log)
        assert_contiguous(batches, start, end)  # also: the log ends on a batch boundary
        stored = {b.base_offset: b for b in batches}
        for b in batches:
            kafka_records(b.data)
        for base, (last, k) in known.items():
            if base < start:
                continue  # removed by retention (whole segments only)
            assert base in stored, f"batch {base}..{last} was acknowledged or recovered, " \
                                   f"now gone (log {start}..{end})"
            assert stored[base].last_offset == last
            assert stored[base].data == with_base_offset(pool[k], base), f"batch {base} differs"
        log.delete_old_segments()
        assert log.segments[0].base_offset <= log.log_start_offset
        assert len(log.segments) == 1 or log.segments[1].base_offset > log.log_start_offset
        return batches


@pytest.mark.parametrize("flush", [True, False], ids=["flush_per_batch", "no_flush"])
def test_sigkill_while_appending_loses_nothing_acknowledged(tmp_path, flush):
    """Across 30 SIGKILLs at random moments, every acknowledged batch (flushed per batch, or
    only in the page cache) survives with identical bytes, and the log is always contiguous,
    CRC-valid and cut on a batch boundary."""
    rng = random.Random(1234 + flush)
    pool_path = str(tmp_path / "pool.bin")
    pool = _write_pool(pool_path, rng)
    payload_to_k = {p[8:]: k for k, p in enumerate(pool)}
    log_dir = str(tmp_path / "log")
    known: dict[int, tuple[int, int]] = {}  # base offset -> (last offset, pool index)
    acked_end = 0
    cursor = 0
    total_acks = 0
    for round_no in range(ROUNDS):
        acks = _run_child_and_kill(log_dir, pool_path, cursor, flush, rng)
        total_acks += len(acks)
        for base, last, k in acks:
            known[base] = (last, k)
            acked_end = max(acked_end, last + 1)
        cursor += len(acks) + 1
        if not os.path.isdir(log_dir):
            continue  # killed before the child created the directory
        image = crash_image(log_dir, str(tmp_path / f"image{round_no}"))
        batches = _verify(image, pool, known, acked_end)
        shutil.rmtree(image)
        # what recovery kept (acknowledged or not) must survive every later round too
        for b in batches:
            known[b.base_offset] = (b.last_offset, payload_to_k[b.data[8:]])
    assert total_acks > ROUNDS, "the children barely appended: the test proved little"
