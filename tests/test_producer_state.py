"""The idempotent producer's state in the partition Log (storage/producer_state.py, KIP-98):
duplicates, gaps, epochs, the 5-batch window, snapshots, recovery and truncation."""

from __future__ import annotations

import os
import struct

import crc32c
import pytest

from storage import Log, LogConfig
from storage.errors import (InvalidProducerEpochError, InvalidRecordError,
                            OutOfOrderSequenceError)
from storage.producer_state import (INT32_MAX, decode_snapshot, snapshot_offsets,
                                    snapshot_path)
from storage.records import build, iter_headers
from tests.log_helpers import crash_image, read_all

PID = 4000


def batch(seq: int, n: int = 3, *, pid: int = PID, epoch: int = 0, tag: str = "") -> bytes:
    """One idempotent batch of ``n`` records starting at sequence ``seq``."""
    values = [f"{tag}{pid}:{epoch}:{seq + i}".encode() for i in range(n)]
    return build(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def stored_values(log) -> list[bytes]:
    from storage.records import decode_records
    out = []
    for b in read_all(log):
        out.extend(r.value for r in decode_records(b.data))
    return out


def test_a_duplicate_batch_answers_its_original_offsets_and_is_stored_once(tmp_path):
    """A retried batch (same producer, epoch, sequences) is not written again: the append
    returns the offsets the first one got, flagged as a duplicate."""
    with Log.open(str(tmp_path)) as log:
        first = log.append(batch(0))
        log.append(batch(3))
        again = log.append(batch(0))
        assert (again.base_offset, again.last_offset) == (0, 2) == tuple(first)
        assert again.duplicate and not first.duplicate
        assert log.log_end_offset == 6
        assert len(stored_values(log)) == 6


def test_a_sequence_gap_is_refused_and_nothing_is_written(tmp_path):
    """A batch whose first sequence skips ahead raises OutOfOrderSequenceError."""
    with Log.open(str(tmp_path)) as log:
        log.append(batch(0))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(4))
        assert log.log_end_offset == 3
        log.append(batch(3))                          # the next one in sequence still goes
        assert log.log_end_offset == 6


def test_epochs_an_old_one_is_fenced_a_new_one_starts_at_zero(tmp_path):
    """An older epoch raises InvalidProducerEpochError; a newer one must start at sequence
    0 (OutOfOrderSequenceError otherwise) and then replaces the old one."""
    with Log.open(str(tmp_path)) as log:
        log.append(batch(0, epoch=1))
        with pytest.raises(InvalidProducerEpochError):
            log.append(batch(3, epoch=0))
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(3, epoch=2))
        log.append(batch(0, epoch=2))
        with pytest.raises(InvalidProducerEpochError):
            log.append(batch(3, epoch=1))
        assert log.log_end_offset == 6


def test_an_unknown_producer_may_start_at_any_sequence_and_sequences_wrap(tmp_path):
    """Kafka 2.5+ rules: no state of a producer means any first sequence is taken; after
    2**31 - 1 the sequence wraps to 0."""
    with Log.open(str(tmp_path)) as log:
        log.append(batch(INT32_MAX - 1, n=2))
        log.append(batch(0, n=1))
        assert log.log_end_offset == 3


def test_the_last_five_batches_are_recognised_an_older_one_is_out_of_order(tmp_path):
    """Kafka keeps 5 batches per producer: each of the last 5 is a duplicate; the one
    before them is no longer known and is an out-of-order sequence."""
    with Log.open(str(tmp_path)) as log:
        for i in range(6):
            log.append(batch(3 * i))
        for i in range(1, 6):
            dup = log.append(batch(3 * i))
            assert dup.duplicate and dup.base_offset == 3 * i
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(0))
        assert log.log_end_offset == 18


def test_a_repeated_request_of_several_batches_is_one_duplicate_a_mixed_one_refused(tmp_path):
    """raykafka's producer retries up to 5 batches of a partition together: all repeated
    answers the whole range; repeated and new mixed is refused (InvalidRecordError)."""
    with Log.open(str(tmp_path)) as log:
        two = batch(0) + batch(3)
        log.append(two)
        again = log.append(two)
        assert again.duplicate and tuple(again) == (0, 5)
        with pytest.raises(InvalidRecordError):
            log.append(batch(3) + batch(6))
        assert log.log_end_offset == 6


def test_a_follower_append_builds_the_state_a_leader_then_checks(tmp_path):
    """Batches appended as a follower (their offsets kept) teach the state: the same
    batch then offered as a leader is a duplicate."""
    with Log.open(str(tmp_path / "leader")) as leader, \
            Log.open(str(tmp_path / "follower")) as follower:
        leader.append(batch(0))
        leader.append(batch(3))
        follower.append(leader.read(0, 1 << 20), assign_offsets=False)
        dup = follower.append(batch(3))
        assert dup.duplicate and dup.base_offset == 3
        with pytest.raises(OutOfOrderSequenceError):
            follower.append(batch(9))


def test_snapshots_are_kafkas_format_at_roll_and_close_and_survive_a_restart(tmp_path):
    """A roll writes ``<base>.snapshot`` with the state below it and close writes one at
    the log end, in Kafka's format (version 1, CRC32C of the rest, 46-byte entries); the
    reopened log recognises the last batch of each producer."""
    path = str(tmp_path)
    one = len(batch(0))
    with Log.open(path, LogConfig(segment_bytes=2 * one + 10)) as log:
        for i in range(3):
            log.append(batch(3 * i))
        log.append(batch(0, pid=7))
        assert snapshot_offsets(path) == [6]
    assert snapshot_offsets(path) == [6, 12]
    data = open(snapshot_path(path, 12), "rb").read()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, len(data)) == (1, 2, 10 + 2 * 46)
    assert crc == crc32c.crc32c(data[6:])
    entries = decode_snapshot(data)
    assert entries[PID].last_seq == 8 and entries[PID].last_offset == 8
    assert decode_snapshot(open(snapshot_path(path, 6), "rb").read())[PID].last_seq == 5
    with Log.open(path) as log:
        assert log.append(batch(6)).duplicate
        assert log.append(batch(0, pid=7)).duplicate
        log.append(batch(9))
        assert log.log_end_offset == 15


def test_after_a_crash_the_state_is_the_last_snapshot_plus_the_log_after_it(tmp_path):
    """No clean shutdown: the state is the newest snapshot (the last batch of each producer
    below it, as Kafka's) plus every batch after it, replayed from the log."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    one = len(batch(0))
    log = Log.open(src, LogConfig(segment_bytes=4 * one + 10))
    for i in range(7):
        log.append(batch(3 * i))
    log.flush()
    assert snapshot_offsets(src) == [12]
    crash_image(src, dst)
    log.close()
    with Log.open(dst) as crashed:
        assert crashed.recovered
        for i in range(3, 7):                          # 9 from the snapshot, 12.. replayed
            assert crashed.append(batch(3 * i)).duplicate
        with pytest.raises(OutOfOrderSequenceError):
            crashed.append(batch(6))                   # not in a snapshot: forgotten
        crashed.append(batch(21))
        assert crashed.log_end_offset == 24


def test_truncation_forgets_the_truncated_batches(tmp_path):
    """After truncate_to the state is the log's below the new end: the truncated batch's
    sequence is taken again (written), the one after it is a gap; snapshots above the new
    end are deleted."""
    path = str(tmp_path)
    one = len(batch(0))
    with Log.open(path, LogConfig(segment_bytes=2 * one + 10)) as log:
        for i in range(5):
            log.append(batch(3 * i))
        assert snapshot_offsets(path) == [6, 12]
        log.truncate_to(9)
        assert snapshot_offsets(path) == [6]
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(12))
        again = log.append(batch(9))
        assert not again.duplicate and again.base_offset == 9
        assert log.append(batch(6)).duplicate


def test_a_corrupt_snapshot_is_deleted_and_the_state_rebuilt_from_the_log(tmp_path):
    """A snapshot whose bytes were damaged fails its CRC: the loader deletes it and rebuilds
    the state from the log (an older snapshot, or the log start)."""
    path = str(tmp_path)
    with Log.open(path) as log:
        log.append(batch(0))
        log.append(batch(3))
    [offset] = snapshot_offsets(path)
    with open(snapshot_path(path, offset), "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    with Log.open(path) as log:
        assert not os.path.exists(snapshot_path(path, offset))
        assert log.append(batch(0)).duplicate and log.append(batch(3)).duplicate
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(9))
    with open(snapshot_path(path, 6), "wb") as f:
        f.write(b"\x00\x01")                           # too short to be a snapshot
    with Log.open(path) as log:
        assert log.append(batch(3)).duplicate


def test_records_deleted_below_a_producer_make_it_unknown(tmp_path):
    """DeleteRecords past a producer's last batch forgets it: any sequence is taken."""
    with Log.open(str(tmp_path)) as log:
        log.append(batch(0))
        log.append(batch(0, pid=9))
        log.delete_records_before(3)
        log.append(batch(50))                         # PID forgotten: no gap
        with pytest.raises(OutOfOrderSequenceError):
            log.append(batch(50, pid=9))              # 9 is still known
        assert len(log.producer_state) == 2


def test_plain_batches_have_no_producer_state(tmp_path):
    """Batches without a producer id (-1) are never checked or remembered."""
    with Log.open(str(tmp_path)) as log:
        plain = build([b"a", b"b"])
        log.append(plain)
        assert not log.append(plain).duplicate
        assert log.log_end_offset == 4 and len(log.producer_state) == 0
        assert [h.producer_id for h in iter_headers(log.read(0, 1 << 20))] == [-1, -1]
