"""Readers against a Log that is being appended to and shrunk by retention at the same time.

Reads take no lock: they work on an immutable snapshot of the segment list, and each segment
bounds a read by the size it had published. These tests run reader threads flat out while one
writer appends and applies retention, and check what every reader was served.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from storage import Log, LogConfig, OffsetOutOfRangeError
from tests.log_helpers import make_batch, split_batches, with_base_offset

N_BATCHES = 2500
N_READERS = 4
LAGS = (0, 80, 0, 110)   # offsets behind the writer; retention keeps roughly 100
DEADLINE_S = 60.0


@dataclass
class ReaderReport:
    start: int
    end: int
    lag: int = 0       # stay this many offsets behind the log end: near the log start, where
                       # retention deletes segments under the reader
    served: list = field(default_factory=list)     # (base, last) in the order served
    skipped: list = field(default_factory=list)    # (from, to, log start seen) jumps
    errors: list = field(default_factory=list)


class _Progress:
    """The writer's progress, for readers to wait on (a condition, never a bare sleep)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.done = False

    def notify(self, *, done=False):
        with self.cond:
            self.done = self.done or done
            self.cond.notify_all()

    def wait_past(self, log, offset, deadline):
        with self.cond:
            return self.cond.wait_for(lambda: log.log_end_offset > offset or self.done,
                                      timeout=max(deadline - time.monotonic(), 0))


def _reader(log, progress, expected, report, seed, deadline):
    """Scan [start, end) sequentially, checking every batch served against ``expected``."""
    rng = random.Random(seed)
    pos = report.start
    try:
        while pos < report.end:
            if time.monotonic() > deadline:
                report.errors.append(f"deadline passed at offset {pos}")
                return
            if pos > log.log_end_offset:  # a start the writer has not reached yet
                progress.wait_past(log, pos - 1, deadline)
                continue
            if report.lag and not progress.done:
                progress.wait_past(log, min(pos + report.lag, report.end - 1), deadline)
            try:
                data = log.read(pos, rng.choice([1, 300, 4000, 1 << 16]))
            except OffsetOutOfRangeError as exc:
                start = log.log_start_offset   # it only grows: if pos is below it now, it was
                if pos >= start:               # below it at the read too
                    report.errors.append(f"OffsetOutOfRange at {pos} >= log start {start}: "
                                         f"{exc}")
                    return
                report.skipped.append((pos, start, start))
                pos = start
                continue
            if not data:
                if not progress.wait_past(log, pos, deadline) and not progress.done:
                    report.errors.append(f"no progress past {pos}")
                    return
                if progress.done and log.log_end_offset <= pos:
                    report.errors.append(f"log ended at {log.log_end_offset} before {pos}")
                    return
                continue
            for b in split_batches(data):
                if b.base_offset != pos:
                    report.errors.append(f"at {pos} served batch {b.base_offset}..{b.last_offset}")
                    return
                if b.data != expected.get(b.base_offset):
                    report.errors.append(f"batch {b.base_offset} bytes differ from written")
                    return
                report.served.append((b.base_offset, b.last_offset))
                pos = b.last_offset + 1
    except Exception as exc:  # noqa: BLE001 - any other error is what this test looks for
        report.errors.append(f"{type(exc).__name__} at offset {pos}: {exc}")


def _check_report(report):
    """No errors; every offset of the range served exactly once, or skipped because it fell
    below the log start."""
    assert report.errors == [], report.errors
    covered = []
    for base, last in report.served:
        covered.append((base, last))
    for frm, to, _ in report.skipped:
        covered.append((frm, to - 1))
    covered.sort()
    pos = report.start
    for frm, to in covered:
        assert frm == pos, f"offset {pos} was missed or served twice (next piece {frm}..{to})"
        pos = to + 1
    assert pos >= report.end


def _run(log, write_step, n_batches, seed):
    """Run N_READERS readers while ``write_step(i)`` appends batch i (and whatever else the
    variant does to the log); return their reports."""
    rng = random.Random(seed)
    batches = [make_batch(rng.randint(1, 4), value_size=rng.randint(10, 200))
               for _ in range(n_batches)]
    expected, base = {}, log.log_end_offset
    for b in batches:
        expected[base] = with_base_offset(b, base)
        (h,) = split_batches(b)
        base += h.last_offset - h.base_offset + 1
    end = base
    progress = _Progress()
    deadline = time.monotonic() + DEADLINE_S
    starts = sorted(expected)[:len(expected) // 4]   # batch boundaries: reads start whole
    reports = [ReaderReport(start=rng.choice(starts) if i else starts[0], end=end,
                            lag=LAGS[i % len(LAGS)])
               for i in range(N_READERS)]
    threads = [threading.Thread(target=_reader, args=(log, progress, expected, r, seed + i,
                                                      deadline), daemon=True)
               for i, r in enumerate(reports)]
    for t in threads:
        t.start()
    try:
        for i, b in enumerate(batches):
            write_step(i, b)
            progress.notify()
    finally:
        progress.notify(done=True)
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 1))
    assert not any(t.is_alive() for t in threads), "a reader did not finish by the deadline"
    assert log.log_end_offset == end
    return reports


def test_readers_see_every_record_once_while_retention_deletes(tmp_path):
    """Reader threads scanning while the writer appends and retention deletes segments: no
    error but OffsetOutOfRange below the log start (then the reader jumps there), every batch
    served is the one written at its offset, and none is served twice or missed."""
    config = LogConfig(segment_bytes=4096, retention_bytes=12_000, retention_ms=-1,
                       file_delete_delay_ms=0, index_interval_bytes=256)
    with Log.open(str(tmp_path), config) as log:
        def write_step(i, batch):
            log.append(batch)
            if i % 10 == 0:
                log.delete_old_segments()

        reports = _run(log, write_step, N_BATCHES, seed=21)
        assert log.log_start_offset > 0, "retention never ran: the test proved little"
    for r in reports:
        _check_report(r)
    assert any(r.skipped for r in reports), "no reader fell below the log start: proved little"
    assert all(r.served for r in reports)


def test_readers_with_delayed_file_deletion(tmp_path):
    """The same with file.delete.delay.ms > 0: segments renamed .deleted (not yet unlinked) stay
    readable by readers holding an old snapshot, and nothing is served twice or missed."""
    config = LogConfig(segment_bytes=4096, retention_bytes=12_000, retention_ms=-1,
                       file_delete_delay_ms=5, index_interval_bytes=256)
    with Log.open(str(tmp_path), config) as log:
        def write_step(i, batch):
            log.append(batch)
            if i % 7 == 0:
                log.delete_old_segments()
            if i % 50 == 0:
                log.roll()

        reports = _run(log, write_step, N_BATCHES // 2, seed=22)
    for r in reports:
        _check_report(r)


# -- compaction variant ------------------------------------------------------------------
# The lead adds it here once storage/cleaner.py exists: the same readers (_run, _reader,
# _check_report) while the cleaner swaps compacted segments in. Compaction leaves offset gaps,
# so that variant's reader must accept a batch whose base offset is above ``pos`` when the
# offsets between were removed by the cleaner (check them against the keys' latest values).
