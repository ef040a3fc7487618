"""Upkeep (flush.ms, retention, compaction) runs when due, never on a polling timer.

Two levels: ``Log.next_maintenance_in_ms`` under a fake clock (what is due when), and a
PartitionReplica used in-process (no Ray) with its real upkeep thread (that it sleeps when
nothing is due and still flushes and deletes on time).
"""

from __future__ import annotations

import os
import threading
import time

from actors.server.replica import PartitionReplica
from log_helpers import make_batch
from storage import Log, LogConfig
from storage.records import build


class FakeClock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.01)


# -- Log.next_maintenance_in_ms (fake clock) -----------------------------------------------------
def test_an_idle_log_has_nothing_due_however_much_time_passes(tmp_path):
    """A flushed log with one segment and nothing deleted answers None (no deadline), at
    any time, with every time-driven setting on."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), LogConfig(flush_ms=1000, retention_ms=5000,
                                            file_delete_delay_ms=100), clock=clock)
    try:
        log.append(make_batch(3, timestamp_ms=clock.now))
        log.flush()
        for step in (0, 10_000, 10 ** 9):
            clock.now += step
            assert log.next_maintenance_in_ms() is None
    finally:
        log.close()


def test_flush_ms_is_due_flush_ms_after_the_last_flush(tmp_path):
    """An unflushed append makes upkeep due at last flush + flush.ms; a maintain() then
    flushes (recovery point reaches the log end) and nothing is due any more."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), LogConfig(flush_ms=1000), clock=clock)
    try:
        clock.now += 200
        log.append(make_batch(2))
        assert log.next_maintenance_in_ms() == 800
        clock.now += 799
        assert log.next_maintenance_in_ms() == 1
        clock.now += 1
        assert log.next_maintenance_in_ms() == 0
        log.maintain()
        assert log.recovery_point == log.log_end_offset
        assert log.next_maintenance_in_ms() is None
    finally:
        log.close()


def test_retention_ms_and_file_delete_delay_set_the_deadlines(tmp_path):
    """The oldest non-active segment is due retention.ms after its newest record; once
    deleted, its renamed files are due file.delete.delay.ms later; then nothing is due."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), LogConfig(retention_ms=5000, file_delete_delay_ms=300),
                   clock=clock)
    try:
        log.append(make_batch(2, timestamp_ms=clock.now - 1000))
        assert log.next_maintenance_in_ms() is None          # only the active segment
        log.roll()
        log.append(make_batch(2, timestamp_ms=clock.now))
        assert log.next_maintenance_in_ms() == 4001           # deleted once age > 5000
        clock.now += 4001
        assert log.next_maintenance_in_ms() == 0
        log.maintain()
        assert log.log_start_offset == 2
        assert log.next_maintenance_in_ms() == 300
        assert any(name.endswith(".deleted") for name in os.listdir(tmp_path))
        clock.now += 300
        log.maintain()
        assert not any(name.endswith(".deleted") for name in os.listdir(tmp_path))
        assert log.next_maintenance_in_ms() is None
    finally:
        log.close()


def test_compaction_is_due_when_held_back_segments_pass_the_compaction_lag(tmp_path):
    """On a compacted topic, a dirty segment held back by min.compaction.lag.ms makes
    compaction due when its newest record passes the lag; after the round nothing is due."""
    clock = FakeClock()
    log = Log.open(str(tmp_path), LogConfig(cleanup_policy="compact",
                                            min_compaction_lag_ms=2000,
                                            file_delete_delay_ms=0), clock=clock)
    try:
        keys = [b"k1", b"k1", b"k2"]
        log.append(make_batch(3, keys=keys, timestamp_ms=clock.now))
        log.roll()
        log.append(make_batch(1, keys=[b"k3"], timestamp_ms=clock.now))
        assert log.next_maintenance_in_ms() == 2000
        clock.now += 2000
        assert log.next_maintenance_in_ms() == 0
        log.maintain()      # cleans, then purges the replaced files (delay 0)
        log.maintain()
        assert log.next_maintenance_in_ms() is None
    finally:
        log.close()


# -- a PartitionReplica's upkeep thread (real clock, no Ray) --------------------------------------
def _replica(tmp_path, config: dict) -> PartitionReplica:
    replica = PartitionReplica("upkeep", 0, 0, str(tmp_path), config)
    replica.become_leader(0, [0], [0])
    return replica


def test_a_replica_with_nothing_due_starts_no_upkeep_thread(tmp_path):
    """With the default settings (no flush.ms, week-long retention of a one-segment log) a
    replica that took produce requests has no upkeep thread at all."""
    replica = _replica(tmp_path, {})
    try:
        for _ in range(3):
            replica.produce(build([b"v"] * 10), 1, 1000)
        stats = replica.upkeep_stats()
        assert stats["thread"] is False and stats["wakeups"] == 0
        assert not any(t.name.startswith("upkeep-") for t in threading.enumerate())
    finally:
        replica.stop()


def test_an_upkeep_thread_with_nothing_left_to_do_does_not_wake(tmp_path):
    """Once its work is done (here a flush.ms flush) the upkeep thread sleeps without a
    timer: its wake-up count stays put over a window longer than the old 1 s poll."""
    replica = _replica(tmp_path, {"flush.ms": "100"})
    try:
        replica.produce(build([b"a"]), 1, 1000)     # unflushed: due flush.ms after the
        replica.produce(build([b"b"]), 1, 1000)     # last flush (or the log's opening)
        log = replica.log
        wait_until(lambda: log.recovery_point == log.log_end_offset
                   and replica.upkeep_stats()["next_in_s"] is None, what="the flush")
        before = replica.upkeep_stats()
        assert before["thread"] is True
        threading.Event().wait(2.5)                 # an observation window, not a wait for a state
        after = replica.upkeep_stats()
        assert after["wakeups"] == before["wakeups"]
        assert after["runs"] == before["runs"]
    finally:
        replica.stop()


def test_flush_ms_still_flushes_on_time(tmp_path):
    """A write left unflushed by the append path is fsynced by upkeep once flush.ms has
    passed (the recovery point reaches the log end), in one upkeep run, not a poll loop."""
    replica = _replica(tmp_path, {"flush.ms": "300"})
    try:
        log = replica.log
        replica.produce(build([b"a"]), 1, 1000)
        log.flush()                                 # the flush.ms clock starts here
        t0 = time.monotonic()
        replica.produce(build([b"b"]), 1, 1000)
        assert log.recovery_point < log.log_end_offset
        wait_until(lambda: log.recovery_point == log.log_end_offset, what="the flush")
        assert time.monotonic() - t0 >= 0.25          # not before flush.ms (minus clock slack)
        # the run that flushed counts itself once it returns: wait for that, then exactly one
        wait_until(lambda: replica.upkeep_stats()["runs"] >= 1, what="the run to be counted")
        assert replica.upkeep_stats()["runs"] == 1
    finally:
        replica.stop()


def test_retention_ms_still_deletes_on_time(tmp_path):
    """A rolled segment older than retention.ms is deleted (log start moves past it) and
    its files unlinked after file.delete.delay.ms, with no further produce to trigger it."""
    replica = _replica(tmp_path, {"retention.ms": "300", "segment.bytes": "1024",
                                  "file.delete.delay.ms": "200"})
    try:
        for _ in range(3):                      # ~600-byte batches: each rolls a segment
            replica.produce(build([os.urandom(500)]), 1, 1000)
        assert len(replica.log.segments) == 3
        log = replica.log
        wait_until(lambda: log.log_start_offset == 2, what="retention")
        wait_until(lambda: not any(n.endswith(".deleted") for n in os.listdir(log.path)),
                   what="the deleted files to be unlinked")
        assert len(log.segments) == 1
        wait_until(lambda: replica.upkeep_stats()["next_in_s"] is None,
                   what="nothing left due once the files are gone")
    finally:
        replica.stop()


def test_a_config_change_wakes_upkeep(tmp_path):
    """Lowering retention.ms on a replica whose upkeep sleeps toward a week-long deadline
    applies the new deadline at once (update_config wakes the thread)."""
    replica = _replica(tmp_path, {"segment.bytes": "1024", "file.delete.delay.ms": "0"})
    try:
        for _ in range(2):
            replica.produce(build([os.urandom(500)]), 1, 1000)
        wait_until(lambda: (replica.upkeep_stats()["next_in_s"] or 0) > 3600,
                   what="upkeep to sleep toward the default retention")
        replica.update_config({"segment.bytes": "1024", "file.delete.delay.ms": "0",
                               "retention.ms": "1"})
        wait_until(lambda: replica.log.log_start_offset == 1, what="retention")
    finally:
        replica.stop()
