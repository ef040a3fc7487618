"""Compaction (cleanup.policy=compact): last value per key, offsets kept, tombstones, bounds,
crash safety of the swap, and readers running while segments are swapped."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from log_helpers import FakeClock, kafka_records, make_batch, read_all, split_batches
from storage import Log, LogConfig
from storage import log as log_module
from storage import segment as segment_module
from storage.errors import InvalidRecordError

DAY = 24 * 3600 * 1000


def _config(**kw):
    base = dict(segment_bytes=4096, cleanup_policy="compact", file_delete_delay_ms=0,
                min_cleanable_dirty_ratio=0.0, delete_retention_ms=DAY)
    base.update(kw)
    return LogConfig(**base)


def _records(log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record in the log, decoded by kafka-python."""
    out = []
    for b in read_all(log):
        for r in kafka_records(b.data):
            out.append((r.offset, r.key, r.value))
    return [r for r in out if r[0] >= log.log_start_offset]


def _fill(log, rounds: int, keys: int, *, ts: int, tombstone_keys=()) -> dict:
    """Append ``rounds`` batches each writing every key once; returns key -> last value."""
    last = {}
    for r in range(rounds):
        ks = [b"k%03d" % k for k in range(keys)]
        vs = [None if (r == rounds - 1 and k in tombstone_keys) else b"v%d-%d" % (r, k)
              for k in range(keys)]
        log.append(make_batch(keys, keys=ks, values=vs, timestamp_ms=ts))
        last.update(zip(ks, vs))
    return last


def _latest(records):
    out = {}
    for off, k, v in records:
        out[k] = (off, v)
    return out


def test_compaction_keeps_the_last_value_of_every_key_at_its_offset(tmp_path):
    """After a round, each key in the cleaned range appears once, with its last value and the
    offset it was written at; the log end offset does not move."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), _config(), clock=clock)
    _fill(log, 30, 10, ts=clock.now_ms)
    log.roll()
    before = _records(log)
    leo = log.log_end_offset
    result = log.compact()
    after = _records(log)
    assert result.cleaned and result.records_removed > 0
    assert log.log_end_offset == leo
    assert _latest(after) == _latest(before)
    keys = [k for _, k, _ in after]
    assert len(keys) == len(set(keys)) == 10
    assert set(after) <= set(before)
    log.close()


def test_compaction_reopens_to_the_same_records(tmp_path):
    """A compacted log reopened (cleanly and after a crash) reads the same records."""
    log = Log.open(str(tmp_path), _config())
    _fill(log, 20, 8, ts=1)
    log.roll()
    log.compact()
    after = _records(log)
    log.close()
    log = Log.open(str(tmp_path), _config())
    assert _records(log) == after
    os.close(log._lock_fd)  # leave it open, as a crash would
    log._lock_fd = -1
    crashed = str(tmp_path) + "-crash"
    shutil.copytree(str(tmp_path), crashed)
    log2 = Log.open(crashed, _config())
    assert log2.recovered and _records(log2) == after
    log2.close()


def test_tombstones_survive_delete_retention_then_go(tmp_path):
    """A tombstone stays while younger than delete.retention.ms and is dropped after."""
    clock = FakeClock(now_ms=10 * DAY)
    log = Log.open(str(tmp_path), _config(), clock=clock)
    _fill(log, 5, 4, ts=clock.now_ms, tombstone_keys={1})
    log.roll()
    log.compact(force=True)
    latest = _latest(_records(log))
    assert latest[b"k001"][1] is None  # the tombstone is kept for now
    clock.advance(DAY + 1)
    # new dirty data so the round runs; the old tombstone is now past its retention
    log.append(make_batch(1, keys=[b"other"], values=[b"x"], timestamp_ms=clock.now_ms))
    log.roll()
    log.compact(force=True)
    latest = _latest(_records(log))
    assert b"k001" not in latest
    assert latest[b"k000"][1] == b"v4-0"
    log.close()


def test_dirty_ratio_below_the_minimum_skips_the_round(tmp_path):
    """min.cleanable.dirty.ratio: a log with too little dirty data is not cleaned."""
    log = Log.open(str(tmp_path), _config(min_cleanable_dirty_ratio=0.9))
    _fill(log, 20, 5, ts=1)
    log.roll()
    first = log.compact()
    assert first.cleaned  # everything is dirty at first
    log.append(make_batch(5, keys=[b"k%03d" % k for k in range(5)], timestamp_ms=1))
    log.roll()
    second = log.compact()
    assert not second.cleaned and "dirty ratio" in second.reason
    assert log.compact(force=True).cleaned
    log.close()


def test_a_small_offset_map_cleans_what_fits_and_the_rest_next_round(tmp_path):
    """With room for few keys a round stops early; more rounds reach the unbounded result."""
    log = Log.open(str(tmp_path), _config(segment_bytes=2048))
    for r in range(12):  # each segment brings new keys
        ks = [b"r%02d-%d" % (r, k) for k in range(6)] + [b"shared"]
        log.append(make_batch(7, keys=ks, timestamp_ms=1))
        log.append(make_batch(7, keys=ks, timestamp_ms=1))
    log.roll()
    before = _records(log)
    first = log.compact(max_map_entries=20)
    assert first.cleaned and first.end_offset < log.log_end_offset
    for _ in range(20):
        res = log.compact(max_map_entries=20)
        if not res.cleaned:
            break
    assert _latest(_records(log)) == _latest(before)
    keys = [k for _, k, _ in _records(log)]
    assert len(keys) == len(set(keys))
    log.close()


def test_compacted_topics_refuse_records_without_a_key(tmp_path):
    """cleanup.policy=compact: an append with a null key raises and appends nothing."""
    log = Log.open(str(tmp_path), _config())
    with pytest.raises(InvalidRecordError, match="key"):
        log.append(make_batch(3, keys=[b"a", None, b"c"]))
    assert log.log_end_offset == 0
    log.close()


class _Crash(Exception):
    pass


def test_a_crash_at_any_step_of_the_swap_reads_the_same_records(tmp_path, monkeypatch):
    """Kill the swap after each of its file operations in turn: the reopened log has every
    key's last value and only records that existed before the round."""
    src = str(tmp_path / "src")
    log = Log.open(src, _config())
    _fill(log, 25, 6, ts=1)
    log.roll()
    log.close()
    before_records = None
    step = 0
    while True:
        work = str(tmp_path / f"w{step}")
        shutil.copytree(src, work)
        log = Log.open(work, _config())
        if before_records is None:
            before_records = _records(log)
        calls = {"n": 0}
        real_replace, real_unlink = os.replace, os.unlink

        def counted(fn):
            def wrapper(*a, **kw):
                if calls["n"] == step:
                    raise _Crash()
                calls["n"] += 1
                return fn(*a, **kw)
            return wrapper

        monkeypatch.setattr(segment_module.os, "replace", counted(real_replace))
        monkeypatch.setattr(log_module.os, "unlink", counted(real_unlink))
        crashed = False
        try:
            log.compact()
        except _Crash:
            crashed = True
        monkeypatch.undo()
        os.close(log._lock_fd)
        log._lock_fd = -1
        image = work + "-img"
        shutil.copytree(work, image)
        reopened = Log.open(image, _config())
        got = _records(reopened)
        assert _latest(got) == _latest(before_records), f"step {step}"
        assert set(got) <= set(before_records), f"step {step}"
        reopened.close()
        if not crashed:
            break
        step += 1
    assert step >= 4  # the swap has several steps; every one was interrupted once


def test_readers_never_fail_while_the_cleaner_swaps_segments(tmp_path):
    """Readers scanning start..end while rounds of compaction run: no errors, offsets only
    increase within a scan, and every record that survives all rounds is seen by every
    complete scan that started after it was written."""
    log = Log.open(str(tmp_path), _config(segment_bytes=3000))
    static = [b"static-%d" % i for i in range(10)]  # never overwritten: survive every round
    log.append(make_batch(10, keys=static, timestamp_ms=1))
    _fill(log, 40, 5, ts=1)
    log.roll()
    stop = threading.Event()
    errors: list[BaseException] = []
    scans: list[list[int]] = []

    def reader():
        try:
            while not stop.is_set():
                offsets = []
                offset = log.log_start_offset
                end = log.log_end_offset
                while offset < end:
                    data = log.read(offset, 2048)
                    if not data:
                        break
                    for b in split_batches(data):
                        for r in kafka_records(b.data):
                            if r.offset >= offset:
                                offsets.append(r.offset)
                        offset = b.last_offset + 1
                assert offsets == sorted(set(offsets)), "an offset went back or repeated"
                scans.append(offsets)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for r in range(6):
            _fill(log, 8, 5, ts=1)
            log.roll()
            log.compact(force=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors[0]
    survivors = {off for off, _, _ in _records(log)}
    assert set(range(10)) <= survivors
    assert scans
    for offsets in scans:
        assert set(range(10)) <= set(offsets), "a surviving record was missed"
    log.close()


def test_count_records_of_a_compacted_log_is_what_a_read_gives(tmp_path):
    """After compaction leaves gaps in the offsets, count_records of any range is the number
    of records a read of it gives, not end - start."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), _config(), clock=clock)
    _fill(log, 30, 10, ts=clock.now_ms)
    log.roll()
    assert log.compact().cleaned
    offsets = [off for off, _, _ in _records(log)]
    leo = log.log_end_offset
    assert len(offsets) < leo - log.log_start_offset
    for start, end in ((log.log_start_offset, leo), (log.log_start_offset, leo // 2),
                       (leo // 3, leo - 1), (leo - 15, leo)):
        assert log.count_records(start, end) == sum(start <= o < end for o in offsets)
    log.close()
