"""Attack the bytes of a log directory and check that recovery keeps exactly the valid prefix
and that nothing invalid is ever served.

Seeded random loops (modest example counts): each example builds a small multi-segment log,
takes a crash image of it, damages the image, reopens it and compares with a model of what was
written.
"""

from __future__ import annotations

import os
import random
import struct

import pytest

from storage import CorruptRecordError, Log, LogConfig
from storage.records import HEADER_SIZE
from tests.log_helpers import (assert_contiguous, crash_image, kafka_records, make_batch,
                               read_all, split_batches, with_base_offset)

EXAMPLES = 25
CONFIG = LogConfig(segment_bytes=3000, index_interval_bytes=300)


class Written:
    """The model: every batch as written, and where it sits."""

    def __init__(self):
        self.batches = []   # (base, last, stored bytes, segment base, position in segment)

    def upto(self, end_offset):
        return [b for b in self.batches if b[1] < end_offset]

    def in_segment(self, seg_base):
        return [b for b in self.batches if b[3] == seg_base]


def _build(path, rng, *, flush_at=None):
    """A log of 5-40 random batches; flushed after ``flush_at`` batches when given. Returns
    (the open log, the model)."""
    log = Log.open(path, CONFIG)
    model = Written()
    n = rng.randint(5, 40)
    for i in range(n):
        b = make_batch(rng.randint(1, 6), value_size=rng.randint(1, 250))
        base, last = log.append(b)
        seg = log.active_segment
        stored = with_base_offset(b, base)
        model.batches.append((base, last, stored, seg.base_offset, seg.size - len(stored)))
        if flush_at is not None and i + 1 == flush_at:
            log.flush()
    return log, model


def _active_log_file(path, seg_base):
    return os.path.join(path, f"{seg_base:020d}.log")


def _check_log_is(log, expected):
    """The log holds exactly ``expected`` (a list of model batches), all CRC-valid."""
    batches = read_all(log)
    assert [(b.base_offset, b.last_offset) for b in batches] == \
        [(e[0], e[1]) for e in expected]
    for b, e in zip(batches, expected):
        assert b.data == e[2]
        kafka_records(b.data)
    end = expected[-1][1] + 1 if expected else log.log_start_offset
    assert log.log_end_offset == end
    assert_contiguous(batches, log.log_start_offset, end)


def _reopen_and_continue(path, expected):
    """Reopen (unclean), check the survivors, append one more batch, reopen clean, check."""
    with Log.open(path, CONFIG) as log:
        assert log.recovered
        _check_log_is(log, expected)
        extra = make_batch(2)
        base, last = log.append(extra)
        assert base == log.log_end_offset - 2
        kept = expected + [(base, last, with_base_offset(extra, base), None, None)]
    with Log.open(path, CONFIG) as log:
        assert not log.recovered
        _check_log_is(log, kept)


def test_garbage_from_a_random_position_keeps_exactly_the_valid_prefix(tmp_path):
    """Random bytes written from a random position of the active segment onward (to past its
    end): after an unclean reopen exactly the batches before that position survive."""
    rng = random.Random(11)
    for ex in range(EXAMPLES):
        src = str(tmp_path / f"src{ex}")
        log, model = _build(src, rng, flush_at=rng.choice([None, rng.randint(1, 5)]))
        image = crash_image(src, str(tmp_path / f"img{ex}"))
        log.close()
        active = model.batches[-1][3]
        seg_batches = model.in_segment(active)
        seg_size = sum(len(b[2]) for b in seg_batches)
        position = rng.randrange(0, seg_size)
        garbage = rng.randbytes(seg_size - position + rng.randint(1, 500))
        with open(_active_log_file(image, active), "r+b") as f:
            f.seek(position)
            f.write(garbage)
        survivors = [b for b in model.batches
                     if b[3] < active or b[4] + len(b[2]) <= position]
        with Log.open(image, CONFIG) as log:
            assert log.truncated_bytes == position + len(garbage) - (
                sum(len(b[2]) for b in survivors if b[3] == active))
        # the open above already recovered and closed cleanly: check again from scratch
        _check_after_recovery(image, survivors)


def _check_after_recovery(path, survivors):
    with Log.open(path, CONFIG) as log:
        _check_log_is(log, survivors)
        extra = make_batch(1)
        base, _ = log.append(extra)
        assert log.read(base) == with_base_offset(extra, base)


def test_random_truncation_of_the_last_segment(tmp_path):
    """The last segment cut at a random length (a lost tail): the whole batches before the
    cut survive, the torn one goes, and appends continue from there."""
    rng = random.Random(12)
    for ex in range(EXAMPLES):
        src = str(tmp_path / f"src{ex}")
        log, model = _build(src, rng, flush_at=rng.choice([None, 3]))
        image = crash_image(src, str(tmp_path / f"img{ex}"))
        log.close()
        active = model.batches[-1][3]
        seg_size = sum(len(b[2]) for b in model.in_segment(active))
        cut = rng.randint(0, seg_size)
        os.truncate(_active_log_file(image, active), cut)
        survivors = [b for b in model.batches if b[3] < active or b[4] + len(b[2]) <= cut]
        _reopen_and_continue(image, survivors)


@pytest.mark.parametrize("nonsense", ["random", "zeros", "huge_length", "replayed_batch",
                                      "bad_crc_batch", "half_header"])
def test_nonsense_block_added_after_a_crash(tmp_path, nonsense):
    """The seed's "nonsense block added": bytes appended after the last batch by a crash (random,
    zero-filled, an impossible length, a batch replayed with an old offset, a batch with a bad
    CRC, half a header) are cut at the next open; every written batch survives."""
    rng = random.Random(nonsense)
    for ex in range(5):
        src = str(tmp_path / f"src{ex}")
        log, model = _build(src, rng)
        image = crash_image(src, str(tmp_path / f"img{ex}"))
        log.close()
        last_last = model.batches[-1][1]
        if nonsense == "random":
            block = rng.randbytes(rng.randint(1, 4000))
        elif nonsense == "zeros":
            block = bytes(rng.randint(1, 4000))
        elif nonsense == "huge_length":
            block = struct.pack(">qi", last_last + 1, 1 << 30) + rng.randbytes(100)
        elif nonsense == "replayed_batch":
            block = model.batches[-1][2]   # same offsets again: they do not increase
        elif nonsense == "bad_crc_batch":
            b = bytearray(with_base_offset(make_batch(2), last_last + 1))
            b[-1] ^= 0x40
            block = bytes(b)
        else:
            block = with_base_offset(make_batch(2), last_last + 1)[:HEADER_SIZE // 2]
        with open(_active_log_file(image, model.batches[-1][3]), "ab") as f:
            f.write(block)
        with Log.open(image, CONFIG) as log:
            assert log.truncated_bytes == len(block)
        _check_after_recovery(image, model.batches)


def test_clean_marker_over_a_bad_tail_is_not_trusted(tmp_path):
    """A clean-shutdown marker with garbage after the last batch (written after the close) does
    not make the log serve it: the open falls back to recovery and cuts it."""
    rng = random.Random(13)
    log, model = _build(str(tmp_path), rng)
    log.close()
    with open(_active_log_file(str(tmp_path), model.batches[-1][3]), "ab") as f:
        f.write(rng.randbytes(777))
    with Log.open(str(tmp_path), CONFIG) as log:
        assert log.recovered and log.truncated_bytes == 777
        _check_log_is(log, model.batches)


def test_bad_crc_batch_after_clean_close_is_never_served(tmp_path):
    """A well-framed batch with a bad CRC after a clean close is never served: reading it raises
    CorruptRecordError and every earlier batch still reads."""
    rng = random.Random(14)
    log, model = _build(str(tmp_path), rng)
    log.close()
    bad = bytearray(with_base_offset(make_batch(3), model.batches[-1][1] + 1))
    bad[-2] ^= 0x01
    with open(_active_log_file(str(tmp_path), model.batches[-1][3]), "ab") as f:
        f.write(bad)
    with Log.open(str(tmp_path), CONFIG) as log:
        end = model.batches[-1][1] + 1
        # either recovery cut the batch, or the open trusted the marker and kept it: then
        # reading it must raise, never serve it
        assert log.log_end_offset in (end, end + 3)
        if log.log_end_offset > end:
            with pytest.raises(CorruptRecordError):
                log.read(end)
        for base, last, stored, _, _ in model.batches:
            assert split_batches(log.read(base, 1))[0].data == stored


@pytest.mark.parametrize("clean", [True, False], ids=["clean_open", "unclean_open"])
def test_flipped_byte_below_recovery_point_is_never_served(tmp_path, clean):
    """A byte flipped inside a batch of an old, flushed segment (below the recovery point, so
    not rescanned): reading that batch raises CorruptRecordError, it is never served in any
    read, and every other batch reads back exactly as written."""
    rng = random.Random(15 + clean)
    for ex in range(15):
        path = str(tmp_path / f"log{ex}")
        log, model = _build(path, rng)
        while len(log.segments) < 3:
            b = make_batch(3, value_size=200)
            base, last = log.append(b)
            seg = log.active_segment
            stored = with_base_offset(b, base)
            model.batches.append((base, last, stored, seg.base_offset, seg.size - len(stored)))
        log.flush()
        if clean:
            log.close()
        else:
            path = crash_image(path, str(tmp_path / f"img{ex}"))
            log.close()
        old_segments = sorted({b[3] for b in model.batches})[:-1]
        victim = rng.choice([b for b in model.batches if b[3] in old_segments])
        # a byte of the records or of the CRC field itself: covered by the CRC, and not one
        # of the header fields a scan navigates by (length, offsets), which recovery validates
        span = [17, 18, 19, 20] + list(range(HEADER_SIZE, len(victim[2])))
        position = victim[4] + rng.choice(span)
        with open(_active_log_file(path, victim[3]), "r+b") as f:
            f.seek(position)
            byte = f.read(1)[0]
            f.seek(position)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        with Log.open(path, CONFIG) as log:
            assert log.log_end_offset == model.batches[-1][1] + 1
            for o in range(victim[0], victim[1] + 1):
                with pytest.raises(CorruptRecordError):
                    log.read(o, rng.choice([1, 1 << 20]))
            for base, last, stored, seg_base, _ in model.batches:
                if base == victim[0]:
                    continue
                for o in (base, last):
                    try:
                        data = log.read(o, rng.choice([1, 500, 1 << 20]))
                    except CorruptRecordError:
                        pytest.fail(f"offset {o} of an intact batch is unreadable")
                    served = split_batches(data)
                    assert served[0].data == stored
                    assert all(s.base_offset != victim[0] for s in served)
                    by_base = {b[0]: b[2] for b in model.batches}
                    assert all(by_base[s.base_offset] == s.data for s in served)
