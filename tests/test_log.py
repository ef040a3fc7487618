"""Behaviour of the partition Log (storage.Log): appends, reads, rolling, flushing, retention,
truncation, offsets by time, recovery markers and rebuilt indexes."""

from __future__ import annotations

import os
import random
import struct

import pytest

from storage import (CorruptRecordError, KafkaStorageError, Log, LogConfig,
                     OffsetOutOfRangeError, RecordTooLargeError)
from storage.checkpoint import read_offset
from storage.errors import InvalidRecordError
from storage.records import LOG_APPEND_TIME, iter_headers
from tests.log_helpers import (FakeClock, assert_contiguous, crash_image, kafka_records,
                               make_batch, read_all, segment_files, split_batches,
                               with_base_offset)

T0 = 1_700_000_000_000


def _fill(log, n_batches, records=3, **kw):
    """Append ``n_batches`` fresh batches; returns [(base, last, original bytes)]."""
    out = []
    for _ in range(n_batches):
        b = make_batch(records, **kw)
        base, last = log.append(b)
        out.append((base, last, b))
    return out


def _stored_matches(stored, written):
    """Each stored batch is the written one at its assigned offsets (payload untouched)."""
    assert [(s.base_offset, s.last_offset) for s in stored] == [(b, l) for b, l, _ in written]
    for s, (base, _, original) in zip(stored, written):
        assert s.data == with_base_offset(original, base)


# -- append and read --------------------------------------------------------------------
def test_append_assigns_consecutive_offsets(tmp_path):
    """Leader appends get consecutive offsets from the log end, across batches and calls."""
    with Log.open(str(tmp_path)) as log:
        assert (log.log_start_offset, log.log_end_offset) == (0, 0)
        assert log.append(make_batch(1)) == (0, 0)
        assert log.append(make_batch(5)) == (1, 5)
        # two batches in one append: offsets run on from one to the next
        assert log.append(make_batch(2) + make_batch(3)) == (6, 10)
        assert log.log_end_offset == 11
        stored = read_all(log)
        assert [(s.base_offset, s.last_offset) for s in stored] == [(0, 0), (1, 5), (6, 7),
                                                                   (8, 10)]
        for s in stored:
            recs = kafka_records(s.data)
            assert [r.offset for r in recs] == list(range(s.base_offset, s.last_offset + 1))


def test_one_append_of_thousands_of_batches_is_stored_whole(tmp_path):
    """A follower's append of a catch-up fetch (thousands of small batches, one write
    buffer each: more than the system's IOV_MAX) and a leader's of many batches are
    stored whole, byte for byte (pwritev refused more than IOV_MAX buffers with EINVAL,
    which left a restarted follower failing the same append for ever)."""
    batches = [make_batch(1, value_size=10, base_offset=i) for i in range(2500)]
    with Log.open(str(tmp_path / "f")) as log:
        assert log.append(b"".join(batches), assign_offsets=False) == (0, 2499)
        assert [s.data for s in read_all(log)] == batches
    with Log.open(str(tmp_path / "l")) as log:
        assert log.append(b"".join(batches[:1500])) == (0, 1499)
        assert log.log_end_offset == 1500 and len(read_all(log)) == 1500


def test_read_returns_whole_batches_within_max_bytes(tmp_path):
    """A read from inside a batch starts at that batch's first byte, returns only whole
    batches, and stays within max_bytes when the first batch fits."""
    with Log.open(str(tmp_path)) as log:
        written = _fill(log, 10, records=4)
        size = len(written[0][2])
        data = log.read(6, max_bytes=3 * size + size // 2)
        stored = split_batches(data)
        assert [(s.base_offset, s.last_offset) for s in stored] == [(4, 7), (8, 11), (12, 15)]
        assert len(data) <= 3 * size + size // 2
        _stored_matches(stored, written[1:4])


def test_reads_at_the_newest_batches_are_right_after_a_truncation_and_new_appends(tmp_path):
    """The segment remembers where its newest batches start (reads at the tail skip the
    header scan): after a truncation into them and different appends, every read still
    returns the batch that holds its offset now."""
    with Log.open(str(tmp_path), LogConfig(index_interval_bytes=4096)) as log:
        written = _fill(log, 300)
        for base, _, _ in written[-50:]:
            assert next(iter_headers(log.read(base, 1))).base_offset == base
        log.truncate_to(written[280][0] + 1)          # cuts inside batch 280: it goes
        again = _fill(log, 30, records=2)
        assert again[0][0] == written[280][0]
        for base, last, _ in again:
            for offset in (base, last):
                first = next(iter_headers(log.read(offset, 1)))
                assert (first.base_offset, first.last_offset) == (base, last)
        assert_contiguous(read_all(log), 0, log.log_end_offset)


def test_the_last_append_is_handed_out_as_written_while_it_ends_the_log(tmp_path):
    """last_appended gives the bytes of the last append, as the file holds them, for its
    base offset only, and only until anything else (another append, a truncation, a roll,
    a deletion) changes the log; a large append is not kept."""
    from storage.log import LAST_APPEND_KEEP_BYTES
    with Log.open(str(tmp_path)) as log:
        assert log.last_appended(0) is None
        log.append(make_batch(3))
        assert log.last_appended(0) == (log.read(0, 1 << 20), 3)
        assert log.last_appended(1) is None
        log.append(make_batch(2) + make_batch(1))             # two batches in one append
        assert log.last_appended(0) is None
        assert log.last_appended(3) == (log.read(3, 1 << 20), 6)
        log.truncate_to(5)
        assert log.last_appended(3) is None
        log.append(make_batch(1))
        log.roll()
        assert log.last_appended(5) is None
        log.append(make_batch(1, value_size=LAST_APPEND_KEEP_BYTES))
        assert log.last_appended(6) is None and log.log_end_offset == 7
        log.append(make_batch(2))
        log.delete_records_before(8)
        assert log.last_appended(7) is None


def test_first_batch_larger_than_max_bytes_is_returned_whole(tmp_path):
    """A first batch larger than max_bytes still comes back whole (and alone), so a reader
    always makes progress."""
    with Log.open(str(tmp_path)) as log:
        written = _fill(log, 2, records=20, value_size=500)
        data = log.read(3, max_bytes=10)
        stored = split_batches(data)
        assert len(stored) == 1
        _stored_matches(stored, written[:1])
        assert log.read(0, max_bytes=0) == stored[0].data


def test_read_out_of_range(tmp_path):
    """Reading below the log start or past the log end raises OffsetOutOfRangeError;
    reading exactly at the log end returns b""."""
    with Log.open(str(tmp_path), LogConfig(segment_bytes=1024)) as log:
        _fill(log, 20)
        end = log.log_end_offset
        assert log.read(end) == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(end + 1)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(-1)
        log.delete_records_before(10)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(9)
        assert split_batches(log.read(10))[0].base_offset <= 10


def test_max_message_bytes_enforced_and_nothing_appended(tmp_path):
    """A batch over max.message.bytes raises RecordTooLargeError; an append carrying it
    among good batches writes none of them."""
    big = make_batch(10, value_size=200)
    with Log.open(str(tmp_path), LogConfig(max_message_bytes=len(big) - 1)) as log:
        log.append(make_batch(1))
        before = (log.log_end_offset, log.size_bytes)
        with pytest.raises(RecordTooLargeError):
            log.append(big)
        with pytest.raises(RecordTooLargeError):
            log.append(make_batch(1) + big)
        assert (log.log_end_offset, log.size_bytes) == before
        small = make_batch(1)
        assert log.append(small) == (1, 1)


@pytest.mark.parametrize("damage", ["crc", "truncated", "trailing", "bad_length", "magic"])
def test_bad_batches_raise_corrupt_and_append_nothing(tmp_path, damage):
    """A batch with a wrong CRC, cut short, followed by stray bytes, with an impossible
    length or magic raises CorruptRecordError and nothing of the append is written."""
    good = make_batch(2)
    bad = bytearray(make_batch(3))
    if damage == "crc":
        bad[-1] ^= 0x01
    elif damage == "truncated":
        bad = bad[:-5]
    elif damage == "trailing":
        bad = bad + b"\x00\x01\x02"
    elif damage == "bad_length":
        struct.pack_into(">i", bad, 8, 10)
    elif damage == "magic":
        bad[16] = 7
    with Log.open(str(tmp_path)) as log:
        log.append(make_batch(1))
        before = (log.log_end_offset, log.size_bytes)
        with pytest.raises(CorruptRecordError):
            log.append(good + bytes(bad))
        assert (log.log_end_offset, log.size_bytes) == before
        assert log.append(good) == (1, 2)

@pytest.mark.parametrize("roll", [False, True])
def test_large_append_with_a_bad_crc_leaves_no_bytes_behind(tmp_path, roll):
    """A large append (its CRCs checked while its bytes are written) with one bad CRC is
    refused with CorruptRecordError; the segment files keep their size, the log its end, a
    reader never sees the bytes, and a crash image of the directory recovers without them.
    With ``roll`` the batches need a new segment: nothing is written and no segment added."""
    from storage.log import OVERLAPPED_CRC_MIN_BYTES
    big = make_batch(400, value_size=1000)
    assert len(big) >= OVERLAPPED_CRC_MIN_BYTES // 2
    bad = bytearray(make_batch(400, value_size=1000))
    bad[len(bad) // 2] ^= 0x40
    config = LogConfig(segment_bytes=len(big) + 2000 if roll else 64 << 20,
                       max_message_bytes=1 << 20)
    with Log.open(str(tmp_path / "log"), config) as log:
        log.append(make_batch(1))
        before = (log.log_end_offset, log.size_bytes, [s.base_offset for s in log.segments])
        files = {f: os.path.getsize(tmp_path / "log" / f) for f in segment_files(str(tmp_path / "log"))
                 if f.endswith(".log")}
        with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
            log.append(big + bytes(bad))
        assert (log.log_end_offset, log.size_bytes,
                [s.base_offset for s in log.segments]) == before
        assert {f: os.path.getsize(tmp_path / "log" / f) for f in segment_files(str(tmp_path / "log"))
                if f.endswith(".log")} == files
        assert log.read(1) == b""
        crash_image(str(tmp_path / "log"), str(tmp_path / "image"))
        assert log.append(big) == (1, 400)
    with Log.open(str(tmp_path / "image"), config) as image:
        assert image.log_end_offset == 1


def test_empty_append_rejected(tmp_path):
    """An append of zero bytes is refused and writes nothing."""
    with Log.open(str(tmp_path)) as log:
        with pytest.raises(InvalidRecordError):
            log.append(b"")
        assert log.log_end_offset == 0 and log.size_bytes == 0


# -- segments and rolling ---------------------------------------------------------------
def test_roll_by_segment_bytes_and_file_names(tmp_path):
    """Segments roll before a batch would push them past segment.bytes; each segment is
    named by its 20-digit base offset with .log, .index and .timeindex files."""
    batch_size = len(make_batch(2))
    config = LogConfig(segment_bytes=3 * batch_size)
    with Log.open(str(tmp_path), config) as log:
        written = _fill(log, 10, records=2)
        bases = [s.base_offset for s in log.segments]
        assert bases == [0, 6, 12, 18]
        assert all(s.size <= config.segment_bytes for s in log.segments)
        _stored_matches(read_all(log), written)
    expected = sorted(f"{b:020d}.{ext}" for b in bases for ext in ("log", "index", "timeindex"))
    assert segment_files(str(tmp_path)) == expected


def test_update_config_applies_in_place_to_later_appends(tmp_path):
    """update_config changes an open log's settings without closing it: a reader's view
    stays valid, later rolls follow the new segment.bytes and a lowered max.message.bytes
    refuses a batch that fitted before."""
    batch = make_batch(2)
    with Log.open(str(tmp_path), LogConfig(segment_bytes=100 * len(batch))) as log:
        written = _fill(log, 4, records=2)
        before = log.segments
        log.update_config(LogConfig(segment_bytes=2 * len(batch),
                                    max_message_bytes=len(batch) - 1))
        assert log.segments == before, "no reopen: the same segment objects"
        with pytest.raises(RecordTooLargeError):
            log.append(batch)
        log.update_config({"segment.bytes": str(2 * len(batch))})
        written += _fill(log, 4, records=2)
        assert len(log.segments) >= 3, "later appends rolled at the new segment.bytes"
        _stored_matches(read_all(log), written)


def test_roll_by_segment_ms(tmp_path):
    """The active segment rolls at the first append once segment.ms has passed since it was
    created, by the clock the log was given."""
    clock = FakeClock(T0)
    with Log.open(str(tmp_path), LogConfig(segment_ms=1000), clock=clock) as log:
        log.append(make_batch(1, timestamp_ms=clock()))
        clock.advance(999)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert len(log.segments) == 1
        clock.advance(1)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [0, 2]
        clock.advance(500)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [0, 2]
        clock.advance(500)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [0, 2, 4]
        # a segment made by truncate_fully_and_start_at ages by the same clock
        log.truncate_fully_and_start_at(10)
        log.append(make_batch(1, timestamp_ms=clock()))
        clock.advance(1000)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [10, 11]
    with Log.open(str(tmp_path), LogConfig(segment_ms=1000), clock=clock) as log:
        # reopened: the active segment's age restarts at the open, by the log's clock
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [10, 11]
        clock.advance(1000)
        log.append(make_batch(1, timestamp_ms=clock()))
        assert [s.base_offset for s in log.segments] == [10, 11, 13]


def test_explicit_roll(tmp_path):
    """roll() starts a new segment at the log end and is a no-op on an empty segment."""
    with Log.open(str(tmp_path)) as log:
        log.roll()
        assert len(log.segments) == 1
        _fill(log, 2)
        log.roll()
        log.roll()
        assert [s.base_offset for s in log.segments] == [0, 6]
        _fill(log, 1)
        assert log.segments[-1].size > 0
        assert_contiguous(read_all(log), 0, 9)


# -- timestamps and epochs --------------------------------------------------------------
def test_append_returns_the_log_append_time_it_stamped(tmp_path):
    """On a LogAppendTime topic append() returns the very timestamp stored in the batch, even
    with a clock that moves on every reading; CreateTime appends return -1."""
    class Ticking(FakeClock):
        def __call__(self):
            self.now_ms += 7
            return self.now_ms
    clock = Ticking(T0)
    config = LogConfig(message_timestamp_type="LogAppendTime")
    with Log.open(str(tmp_path / "lat"), config, clock=clock) as log:
        for _ in range(3):
            appended = log.append(make_batch(2, timestamp_ms=5))
            stored = split_batches(log.read(appended.base_offset))[0].data
            (h,) = iter_headers(stored)
            assert appended.log_append_time_ms == h.max_timestamp
            assert tuple(appended) == (appended.base_offset, appended.last_offset)
    with Log.open(str(tmp_path / "ct"), LogConfig(), clock=clock) as log:
        assert log.append(make_batch(2, timestamp_ms=5)).log_append_time_ms == -1


def test_log_append_time_sets_max_timestamp_with_valid_crc(tmp_path):
    """On a LogAppendTime topic the stored batch carries the append time as its max
    timestamp and the LogAppendTime bit, and its CRC is valid (checked by kafka-python)."""
    clock = FakeClock(T0)
    config = LogConfig(message_timestamp_type="LogAppendTime")
    with Log.open(str(tmp_path), config, clock=clock) as log:
        log.append(make_batch(3, timestamp_ms=5))
        stored = split_batches(log.read(0))
        (h,) = iter_headers(stored[0].data)
        assert h.max_timestamp == T0
        assert h.timestamp_type == LOG_APPEND_TIME
        recs = kafka_records(stored[0].data)
        assert [r.timestamp for r in recs] == [T0] * 3
        assert log.offset_for_time(T0) == 0


def test_leader_epoch_is_stamped(tmp_path):
    """A leader append with leader_epoch stamps partition_leader_epoch on every batch and
    keeps the CRC valid; without it the producer's value is kept."""
    with Log.open(str(tmp_path)) as log:
        log.append(make_batch(2) + make_batch(1), leader_epoch=7)
        producers = bytearray(make_batch(1))
        struct.pack_into(">i", producers, 12, 3)  # the epoch field is outside the CRC
        log.append(bytes(producers))
        heads = list(iter_headers(log.read(0)))
        assert [h.partition_leader_epoch for h in heads] == [7, 7, 3]
        for s in read_all(log):
            kafka_records(s.data)


def test_follower_append_keeps_offsets(tmp_path):
    """A follower append (assign_offsets=False) keeps the leader's offsets (gaps allowed)
    and bytes, and refuses batches below the log end, writing nothing."""
    with Log.open(str(tmp_path)) as log:
        a = make_batch(3, base_offset=0)
        b = make_batch(2, base_offset=10)
        assert log.append(a + b, assign_offsets=False) == (0, 11)
        assert log.log_end_offset == 12
        assert [s.data for s in read_all(log)] == [a, b]
        before = log.size_bytes
        with pytest.raises(InvalidRecordError):
            log.append(make_batch(1, base_offset=11), assign_offsets=False)
        with pytest.raises(InvalidRecordError):
            log.append(make_batch(1, base_offset=12) + make_batch(1, base_offset=12),
                       assign_offsets=False)
        assert (log.log_end_offset, log.size_bytes) == (12, before)
        assert log.read(10)[:len(b)] == b


# -- truncation and log start -----------------------------------------------------------
def test_truncate_to(tmp_path):
    """truncate_to removes every batch at or after the offset (a batch holding it goes whole),
    across segments, and appends continue from the new end."""
    batch_size = len(make_batch(2))
    with Log.open(str(tmp_path), LogConfig(segment_bytes=3 * batch_size)) as log:
        written = _fill(log, 10, records=2)
        assert log.truncate_to(25) == 20          # past the end: nothing happens
        assert log.truncate_to(9) == 8           # batch 8..9 holds 9: it goes whole
        assert log.log_end_offset == 8
        assert [s.base_offset for s in log.segments] == [0, 6]
        _stored_matches(read_all(log), written[:4])
        more = _fill(log, 2, records=2)
        assert [m[:2] for m in more] == [(8, 9), (10, 11)]
        _stored_matches(read_all(log), written[:4] + more)
        assert log.recovery_point <= log.log_end_offset
    with Log.open(str(tmp_path), LogConfig(segment_bytes=3 * batch_size)) as log:
        _stored_matches(read_all(log), written[:4] + more)


def test_truncation_below_the_log_start_lowers_it_durably(tmp_path):
    """A truncation whose whole-batch cut ends below the log start lowers the log start, and
    the lowered value survives a reopen (records appended after it stay readable)."""
    with Log.open(str(tmp_path)) as log:
        log.append(make_batch(1))
        log.append(make_batch(2))                 # offsets 1..2
        log.delete_records_before(2)
        assert log.truncate_to(2) == 1            # batch 1..2 holds 2: it goes whole
        assert log.log_start_offset == 1
        log.append(make_batch(1))                 # offset 1
    with Log.open(str(tmp_path)) as log:
        assert (log.log_start_offset, log.log_end_offset) == (1, 2)
        assert split_batches(log.read(1))[0].base_offset == 1


def test_truncate_fully_and_start_at(tmp_path):
    """truncate_fully_and_start_at empties the log and restarts it at the offset; it survives
    a reopen."""
    with Log.open(str(tmp_path)) as log:
        _fill(log, 5)
        log.truncate_fully_and_start_at(100)
        assert (log.log_start_offset, log.log_end_offset) == (100, 100)
        assert log.read(100) == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(0)
        assert log.append(make_batch(2)) == (100, 101)
    with Log.open(str(tmp_path)) as log:
        assert (log.log_start_offset, log.log_end_offset) == (100, 102)
        assert [s.base_offset for s in log.segments] == [100]


def test_delete_records_before_advances_log_start(tmp_path):
    """delete_records_before moves the log start (persisted), deletes whole segments below
    it, and reads below it fail while reads from it succeed."""
    batch_size = len(make_batch(2))
    with Log.open(str(tmp_path), LogConfig(segment_bytes=3 * batch_size)) as log:
        _fill(log, 10, records=2)
        assert log.delete_records_before(7) == 7
        assert log.log_start_offset == 7
        assert [s.base_offset for s in log.segments] == [6, 12, 18]
        assert log.delete_records_before(3) == 7  # never moves back
        with pytest.raises(OffsetOutOfRangeError):
            log.read(6)
        first = split_batches(log.read(7))[0]
        assert (first.base_offset, first.last_offset) == (6, 7)  # the batch holding 7
        with pytest.raises(OffsetOutOfRangeError):
            log.delete_records_before(21)
        assert log.delete_records_before(20) == 20
        assert log.read(20) == b""
    with Log.open(str(tmp_path), LogConfig(segment_bytes=3 * batch_size)) as log:
        assert (log.log_start_offset, log.log_end_offset) == (20, 20)
        assert log.append(make_batch(1)) == (20, 20)


# -- flushing ---------------------------------------------------------------------------
def test_flush_messages_moves_recovery_point(tmp_path):
    """With flush.messages=N the recovery-point checkpoint moves to the log end once N
    messages are unflushed, not before."""
    checkpoint = str(tmp_path / "recovery-point-offset-checkpoint")
    with Log.open(str(tmp_path), LogConfig(flush_messages=5)) as log:
        log.append(make_batch(2))
        log.append(make_batch(2))
        assert log.recovery_point == 0 and (read_offset(checkpoint) or 0) == 0
        log.append(make_batch(1))
        assert log.recovery_point == 5 and read_offset(checkpoint) == 5
        log.append(make_batch(4))
        assert read_offset(checkpoint) == 5
        log.append(make_batch(3))
        assert read_offset(checkpoint) == 12


def test_flush_ms_moves_recovery_point(tmp_path):
    """With flush.ms=T an append (or maybe_flush) once T ms have passed since the last flush
    moves the recovery point to the log end."""
    clock = FakeClock(T0)
    checkpoint = str(tmp_path / "recovery-point-offset-checkpoint")
    with Log.open(str(tmp_path), LogConfig(flush_ms=1000), clock=clock) as log:
        log.append(make_batch(2))
        clock.advance(999)
        log.maybe_flush()
        assert (read_offset(checkpoint) or 0) == 0
        log.append(make_batch(1))
        assert (read_offset(checkpoint) or 0) == 0
        clock.advance(1)
        log.maybe_flush()
        assert read_offset(checkpoint) == 3 == log.recovery_point
        log.append(make_batch(1))
        clock.advance(1000)
        log.append(make_batch(1))
        assert read_offset(checkpoint) == 5


# -- offsets by time --------------------------------------------------------------------
def _timed_log(tmp_path, clock):
    """Three segments of batches stamped 1000, 2000, ... (one batch of 2 records each)."""
    batch_size = len(make_batch(2, timestamp_ms=1000))
    log = Log.open(str(tmp_path), LogConfig(segment_bytes=3 * batch_size, retention_ms=-1),
                   clock=clock)
    for i in range(8):
        log.append(make_batch(2, timestamps=[1000 * (i + 1), 1000 * (i + 1) + 1]))
    return log


def test_offset_for_time(tmp_path):
    """offset_for_time gives the first offset whose record timestamp is >= T, including
    records inside a batch, across segments; None past the newest timestamp."""
    with _timed_log(tmp_path, FakeClock(T0)) as log:
        assert [s.base_offset for s in log.segments] == [0, 6, 12]
        assert log.offset_for_time(0) == 0
        assert log.offset_for_time(1000) == 0
        assert log.offset_for_time(1001) == 1
        assert log.offset_for_time(1002) == 2
        assert log.offset_for_time(3001) == 5
        assert log.offset_for_time(3002) == 6     # the first record of the next segment
        assert log.offset_for_time(6500) == 12
        assert log.offset_for_time(8001) == 15
        assert log.offset_for_time(8002) is None
        log.delete_records_before(3)
        assert log.offset_for_time(0) == 3


def test_offsets_before(tmp_path):
    """The seed's getOffsetsBefore: -1 gives the log end, -2 the log start; a time T gives
    segment start offsets (descending) from the newest segment whose records are all <= T."""
    clock = FakeClock(T0)
    with _timed_log(tmp_path, clock) as log:
        # segments: [0..5] max ts 3001, [6..11] max ts 6001, [12..15] (active) max ts 8001
        assert log.offsets_before(-1) == [16]
        assert log.offsets_before(-1, 10) == [16, 12, 6, 0]
        assert log.offsets_before(-2) == [0]
        assert log.offsets_before(-2, 5) == [0]
        assert log.offsets_before(6001, 10) == [6, 0]
        assert log.offsets_before(6000, 10) == [0]
        assert log.offsets_before(9000, 2) == [12, 6]
        assert log.offsets_before(T0, 10) == [16, 12, 6, 0]
        assert log.offsets_before(500, 10) == []
        log.delete_records_before(2)
        assert log.offsets_before(-2) == [2]
        assert log.offsets_before(6001, 10) == [6, 2]
        log.roll()  # an empty active segment adds no boundary older than its records
        assert log.offsets_before(500, 10) == []
        assert log.offsets_before(-1) == [16]


# -- retention --------------------------------------------------------------------------
def test_retention_ms_deletes_whole_old_segments(tmp_path):
    """retention.ms deletes whole segments whose newest record is older than the limit, never
    the active one; files are renamed .deleted and unlinked after file.delete.delay.ms."""
    clock = FakeClock(T0)
    batch_size = len(make_batch(2))
    config = LogConfig(segment_bytes=2 * batch_size, retention_ms=10_000,
                       file_delete_delay_ms=5_000)
    with Log.open(str(tmp_path), config, clock=clock) as log:
        for i in range(6):  # segments [0..3] ts T0, [4..7] ts T0+1000, [8..11] ts T0+2000
            log.append(make_batch(2, timestamp_ms=T0 + 1000 * (i // 2)))
        assert [s.base_offset for s in log.segments] == [0, 4, 8]
        clock.now_ms = T0 + 10_000
        assert log.delete_old_segments() == 0
        clock.now_ms = T0 + 10_001  # the first segment is now 10_001 ms old, the next 9_001
        assert log.delete_old_segments() == 1
        assert log.log_start_offset == 4
        names = os.listdir(tmp_path)
        assert f"{0:020d}.log.deleted" in names and f"{0:020d}.log" not in names
        assert f"{0:020d}.index.deleted" in names and f"{0:020d}.timeindex.deleted" in names
        clock.now_ms = T0 + 100_000  # every segment is old, but the active one stays
        assert log.delete_old_segments() == 1
        assert [s.base_offset for s in log.segments] == [8]
        assert log.log_start_offset == 8
        names = os.listdir(tmp_path)
        assert not any(n.startswith(f"{0:020d}") for n in names)  # its delay has passed
        assert f"{4:020d}.log.deleted" in names                    # its delay has not
        clock.advance(5_000)
        log.delete_old_segments()
        assert not any(n.endswith(".deleted") for n in os.listdir(tmp_path))
        with pytest.raises(OffsetOutOfRangeError):
            log.read(7)
        assert split_batches(log.read(8))[0].base_offset == 8


def test_retention_bytes_deletes_oldest_segments(tmp_path):
    """retention.bytes deletes the oldest whole segments while the rest still meets the limit,
    never the active segment."""
    batch_size = len(make_batch(2))
    config = LogConfig(segment_bytes=2 * batch_size, retention_bytes=3 * batch_size,
                       retention_ms=-1, file_delete_delay_ms=0)
    with Log.open(str(tmp_path), config) as log:
        written = _fill(log, 9, records=2)   # segments of 2 batches: 0, 4, 8, 12, 16 (1 batch)
        assert [s.base_offset for s in log.segments] == [0, 4, 8, 12, 16]
        assert log.delete_old_segments() == 3
        # 9 batches - 3 segments of 2 = 3 batches = retention.bytes
        assert [s.base_offset for s in log.segments] == [12, 16]
        assert log.size_bytes == 3 * batch_size
        _stored_matches(read_all(log), written[6:])
        assert segment_files(str(tmp_path)) == sorted(
            f"{b:020d}.{e}" for b in (12, 16) for e in ("log", "index", "timeindex"))
    config = LogConfig(segment_bytes=2 * batch_size, retention_bytes=0, retention_ms=-1)
    with Log.open(str(tmp_path), config) as log:
        log.delete_old_segments()
        assert len(log.segments) == 1 and log.segments[0].base_offset == 16
        assert log.log_start_offset == 16


# -- open, close and recovery -----------------------------------------------------------
def test_clean_shutdown_skips_recovery(tmp_path):
    """After close() the next open does not rescan (recovered is False); after a crash image
    (no clean-shutdown marker) it does, and both see the same batches."""
    path = str(tmp_path / "log")
    with Log.open(path, LogConfig(segment_bytes=2048)) as log:
        written = _fill(log, 30)
        image = crash_image(path, str(tmp_path / "crashed"))
    assert os.path.exists(os.path.join(path, ".clean_shutdown"))
    with Log.open(path, LogConfig(segment_bytes=2048)) as log:
        assert log.recovered is False
        assert not os.path.exists(os.path.join(path, ".clean_shutdown"))
        _stored_matches(read_all(log), written)
    with Log.open(image, LogConfig(segment_bytes=2048)) as log:
        assert log.recovered is True
        assert log.truncated_bytes == 0
        _stored_matches(read_all(log), written)


def test_second_open_of_an_open_directory_fails(tmp_path):
    """A second Log.open on a directory already open raises KafkaStorageError; after close it
    opens."""
    log = Log.open(str(tmp_path))
    try:
        with pytest.raises(KafkaStorageError):
            Log.open(str(tmp_path))
        log.append(make_batch(1))
    finally:
        log.close()
    with pytest.raises(KafkaStorageError):
        log.append(make_batch(1))
    with Log.open(str(tmp_path)) as again:
        assert again.log_end_offset == 1


def _many_segments(path, *, clean):
    """A log of several segments, small index interval; returns (written batches, config)."""
    config = LogConfig(segment_bytes=4096, index_interval_bytes=200)
    log = Log.open(path, config)
    written = []
    rng = random.Random(7)
    for i in range(60):
        b = make_batch(rng.randint(1, 4), value_size=rng.randint(10, 150), timestamp_ms=T0 + i)
        base, last = log.append(b)
        written.append((base, last, b))
    if clean:
        log.close()
        return written, config, None
    log.flush()  # old segments sit below the recovery point: their indexes are loaded, not rebuilt
    return written, config, log


def _assert_every_offset_readable(log, written):
    by_offset = {}
    for base, last, original in written:
        for o in range(base, last + 1):
            by_offset[o] = with_base_offset(original, base)
    for o, expected in by_offset.items():
        first = split_batches(log.read(o, max_bytes=1))[0]
        assert first.data == expected, f"offset {o}"


@pytest.mark.parametrize("clean", [True, False])
def test_deleted_index_files_are_rebuilt(tmp_path, clean):
    """With every .index and .timeindex deleted, open rebuilds them (clean or unclean) and every
    offset reads its own batch; offset_for_time still answers."""
    path = str(tmp_path / "log")
    written, config, log = _many_segments(path, clean=clean)
    if log is not None:
        path = crash_image(path, str(tmp_path / "crashed"))
        log.close()
    for name in os.listdir(path):
        if name.endswith((".index", ".timeindex")):
            os.unlink(os.path.join(path, name))
    with Log.open(path, config) as log:
        assert len(log.segments) > 3
        _assert_every_offset_readable(log, written)
        assert all(len(s.offset_index) > 0 for s in log.segments[:-1])
        for seg in log.segments:  # the time index is rebuilt too
            newest = max(r.timestamp for base, _, b in written
                         if seg.base_offset <= base < seg.next_offset for r in kafka_records(b))
            assert seg.max_timestamp == newest
        assert log.offsets_before(T0 + 59, 100) == [s.base_offset for s in log.segments][::-1]
    for name in segment_files(path):
        if name.endswith(".log"):
            for ext in (".index", ".timeindex"):
                assert os.path.exists(os.path.join(path, name[:-4] + ext))


@pytest.mark.parametrize("damage", ["random_bytes", "truncated", "plausible_wrong", "empty",
                                    "shifted"])
@pytest.mark.parametrize("clean", [True, False])
def test_corrupt_index_files_never_misread(tmp_path, damage, clean):
    """An index file overwritten with random bytes, truncated mid-entry, emptied, or filled
    with plausible but wrong entries: every offset still reads its own correct batch."""
    path = str(tmp_path / "log")
    written, config, log = _many_segments(path, clean=clean)
    if log is not None:
        path = crash_image(path, str(tmp_path / "crashed"))
        log.close()
    rng = random.Random(hash((damage, clean)) & 0xffff)
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if not name.endswith((".index", ".timeindex")):
            continue
        data = open(full, "rb").read()
        entry = 8 if name.endswith(".index") else 12
        if damage == "random_bytes":
            data = rng.randbytes(max(len(data), 4 * entry))
        elif damage == "truncated":
            data = data[:max(len(data) - entry // 2, 0)]
        elif damage == "empty":
            data = b""
        elif damage == "plausible_wrong":
            # increasing, in-range entries that point at the wrong places
            n = max(len(data) // entry, 3)
            if entry == 8:
                rel = sorted(rng.sample(range(1, 200), n))
                pos = sorted(rng.sample(range(1, 3000), n))
                data = b"".join(struct.pack(">ii", r, p) for r, p in zip(rel, pos))
            else:
                tss = sorted(rng.sample(range(1, 1 << 40), n))
                rel = sorted(rng.sample(range(0, 200), n))
                data = b"".join(struct.pack(">qi", t, r) for t, r in zip(tss, rel))
        elif damage == "shifted":
            # real entries with offsets one too low: each points at a batch boundary, but at a
            # batch that starts after the offset the entry claims
            pairs = [struct.unpack_from(">ii" if entry == 8 else ">qi", data, i)
                     for i in range(0, len(data) - len(data) % entry, entry)]
            if entry == 8:
                data = b"".join(struct.pack(">ii", r - 1, p) for r, p in pairs)
            else:
                data = b"".join(struct.pack(">qi", t, r - 1) for t, r in pairs)
        with open(full, "wb") as f:
            f.write(data)
    with Log.open(path, config) as log:
        _assert_every_offset_readable(log, written)
        assert_contiguous(read_all(log), 0, written[-1][1] + 1)


def test_a_validated_leader_append_builds_no_columns(tmp_path):
    """Log.append(validate_records=True), the produce path, checks every record without
    materialising Arrow columns: pyarrow is never imported (a fresh interpreter)."""
    import subprocess
    import sys
    code = (
        "import sys\n"
        "from storage import Log, LogConfig\n"
        "from storage.records import build\n"
        f"log = Log.open({str(tmp_path / 'p')!r}, LogConfig(cleanup_policy='compact'))\n"
        "log.append(build([b'v'] * 100, [b'k%d' % i for i in range(100)]),\n"
        "           validate_records=True)\n"
        "log.close()\n"
        "assert 'pyarrow' not in sys.modules, 'the produce path imported pyarrow'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


# -- counting records from batch headers ---------------------------------------------------
def test_count_records_matches_what_a_read_of_the_range_gives(tmp_path):
    """count_records(start, end) equals the number of records with offsets in [start, end)
    that reading gives, for ranges cut mid-batch, across segments, compressed batches
    included, and at the empty and whole-log ranges."""
    from storage.records import CODEC_LZ4
    with Log.open(str(tmp_path), LogConfig(segment_bytes=4096)) as log:
        for i in range(40):
            log.append(make_batch(1 + i % 7, compression=CODEC_LZ4 if i % 3 == 0 else 0))
        assert len(log.segments) > 3
        offsets = [r.offset for b in read_all(log) for r in kafka_records(b.data)]
        leo = log.log_end_offset
        rng = random.Random(7)
        bounds = [(0, leo), (0, 0), (leo, leo), (5, 6)] + \
            [tuple(sorted((rng.randrange(leo + 1), rng.randrange(leo + 1)))) for _ in range(40)]
        for start, end in bounds:
            want = sum(start <= o < end for o in offsets)
            assert log.count_records(start, end) == want, (start, end)


def test_count_records_leaves_control_batches_out_and_stops_at_max_batches(tmp_path):
    """Records of a control batch are not counted (readers skip them); more batches than
    max_batches gives None; bounds outside the log are OffsetOutOfRangeError."""
    from storage.records import build
    with Log.open(str(tmp_path)) as log:
        log.append(make_batch(3))
        log.append(build([b"\x00\x00\x00\x00"], keys=[b"\x00\x00\x00\x00"], is_control=True,
                         is_transactional=True, producer_id=1, producer_epoch=0))
        log.append(make_batch(2))
        assert log.count_records(0, 6) == 5
        assert log.count_records(0, 6, max_batches=3) == 5
        assert log.count_records(0, 6, max_batches=2) is None
        for start, end in ((-1, 3), (0, 7), (4, 2)):
            with pytest.raises(OffsetOutOfRangeError):
                log.count_records(start, end)


# -- where a range is in the files (a local reader's pread) --------------------------------
def test_file_ranges_locate_whole_batches_holding_exactly_the_range(tmp_path):
    """file_ranges(start, end) gives, segment by segment, file spans of whole batches: read
    with pread and decoded, they hold every record of [start, end) and only the batches
    holding some of them (cut mid-batch, across segments, compressed batches included);
    an empty range gives []; bounds outside the log are OffsetOutOfRangeError."""
    from storage.records import CODEC_LZ4
    with Log.open(str(tmp_path), LogConfig(segment_bytes=4096)) as log:
        for i in range(40):
            log.append(make_batch(1 + i % 7, compression=CODEC_LZ4 if i % 3 == 0 else 0))
        assert len(log.segments) > 3
        leo = log.log_end_offset
        rng = random.Random(11)
        bounds = [(0, leo), (5, 6), (leo - 1, leo)] + \
            [tuple(sorted((rng.randrange(leo + 1), rng.randrange(leo + 1)))) for _ in range(40)]
        for start, end in bounds:
            spans = log.file_ranges(start, end)
            if start == end:
                assert spans == [], (start, end)
                continue
            got = []
            for path, position, size, first_base in spans:
                with open(path, "rb") as f:
                    f.seek(position)
                    data = f.read(size)
                assert len(data) == size
                batches = list(iter_headers(data))
                assert batches[0].base_offset == first_base
                assert sum(b.size for b in batches) == size         # whole batches only
                for b in batches:
                    assert b.last_offset >= start and b.base_offset < end, (start, end)
                    got += [r.offset for r in kafka_records(data[b.position:b.position + b.size])]
            assert [o for o in got if start <= o < end] == list(range(start, end))
        for start, end in ((-1, 3), (0, leo + 1), (4, 2), (0, "1")):
            with pytest.raises(OffsetOutOfRangeError):
                log.file_ranges(start, end)
