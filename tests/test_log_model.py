"""A hypothesis state machine drives a Log and a simple in-memory model side by side.

The model is a list of segments, each a base offset and a list of batches (base offset, last
offset, bytes), with Kafka's rules written plainly: roll before a batch that would overflow
segment.bytes, truncate whole batches, advance the log start and drop segments below it,
retention by bytes drops whole non-active segments oldest first. After every step the log's
log_start_offset, log_end_offset and segment bases match the model; every read returns exactly
the model's batches; closing (cleanly, or by crash image) and reopening changes nothing.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from storage import Log, LogConfig, OffsetOutOfRangeError
from tests.log_helpers import crash_image, make_batch, split_batches, with_base_offset

SEGMENT_BYTES = 1000
RETENTION_BYTES = 1800


def _config():
    return LogConfig(segment_bytes=SEGMENT_BYTES, retention_bytes=RETENTION_BYTES,
                     retention_ms=-1, index_interval_bytes=150, file_delete_delay_ms=0)


class _Segment:
    def __init__(self, base):
        self.base = base
        self.batches: list[tuple[int, int, bytes]] = []

    @property
    def size(self):
        return sum(len(b[2]) for b in self.batches)

    @property
    def next_offset(self):
        return self.batches[-1][1] + 1 if self.batches else self.base


class LogMachine(RuleBasedStateMachine):
    """Drives a Log and the model; the directory comes from the pytest test's tmp_path."""

    tmp_path = None
    _dirs = itertools.count()

    def __init__(self):
        super().__init__()
        self.path = str(self.tmp_path / f"log{next(self._dirs)}")
        self.log = Log.open(self.path, _config())
        self.segments = [_Segment(0)]
        self.log_start = 0
        self.leo = 0

    def teardown(self):
        self.log.close()

    # -- helpers ---------------------------------------------------------------------------
    def _offset(self, k, *, upto_end=True):
        span = self.leo - self.log_start + (1 if upto_end else 0)
        return self.log_start + k % span

    def _drop_below_start(self):
        while len(self.segments) > 1 and self.segments[1].base <= self.log_start:
            self.segments.pop(0)

    # -- rules -----------------------------------------------------------------------------
    @rule(sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 150)), min_size=1,
                         max_size=3))
    def append(self, sizes):
        """Leader append of 1-3 batches: consecutive offsets, roll before overflow."""
        batches = [make_batch(n, value_size=v) for n, v in sizes]
        base, last = self.log.append(b"".join(batches))
        assert base == self.leo
        for b, (n, _) in zip(batches, sizes):
            active = self.segments[-1]
            if active.size and active.size + len(b) > SEGMENT_BYTES:
                active = _Segment(self.leo)
                self.segments.append(active)
            active.batches.append((self.leo, self.leo + n - 1, with_base_offset(b, self.leo)))
            self.leo += n
        assert last == self.leo - 1

    @rule(k=st.integers(0, 10_000), max_bytes=st.sampled_from([0, 1, 200, 700, 5000]))
    def read(self, k, max_bytes):
        """A read returns, from the batch holding the offset, whole batches of one segment:
        the first always, the next ones while they fit in max_bytes."""
        offset = self._offset(k)
        data = self.log.read(offset, max_bytes)
        if offset == self.leo:
            assert data == b""
            return
        expected = []
        for seg in self.segments:
            for i, b in enumerate(seg.batches):
                if b[1] >= offset:
                    expected = [b]
                    total = len(b[2])
                    for nxt in seg.batches[i + 1:]:
                        if total + len(nxt[2]) > max(max_bytes, len(b[2])):
                            break
                        expected.append(nxt)
                        total += len(nxt[2])
                    break
            if expected:
                break
        assert [(s.base_offset, s.last_offset, s.data) for s in split_batches(data)] == expected

    @rule(k=st.integers(1, 5))
    def read_out_of_range(self, k):
        """Below the log start and past the log end reads raise OffsetOutOfRangeError."""
        for offset in (self.log_start - k, self.leo + k):
            try:
                self.log.read(offset)
            except OffsetOutOfRangeError:
                continue
            raise AssertionError(f"read at {offset} outside [{self.log_start}, {self.leo}]")

    @precondition(lambda self: self.leo > self.log_start)
    @rule(k=st.integers(0, 10_000))
    def truncate_to(self, k):
        """Truncation removes every batch reaching the offset (whole) and later segments."""
        offset = self._offset(k, upto_end=False)
        new_end = self.log.truncate_to(offset)
        if offset <= self.segments[0].base or offset < self.log_start:
            self.segments = [_Segment(offset)]
            self.log_start = self.leo = offset
        else:
            self.segments = [s for s in self.segments if s.base < offset]
            last = self.segments[-1]
            last.batches = [b for b in last.batches if b[1] < offset]
            self.leo = last.next_offset
            self.log_start = min(self.log_start, self.leo)
        assert new_end == self.leo

    @rule(k=st.integers(0, 10_000))
    def delete_records_before(self, k):
        """The log start only moves forward; segments wholly below it go."""
        offset = self._offset(k)
        assert self.log.delete_records_before(offset) == max(offset, self.log_start)
        if offset > self.log_start:
            self.log_start = offset
            self._drop_below_start()

    @rule()
    def retention_by_bytes(self):
        """Whole non-active segments go, oldest first, while the rest still has
        retention.bytes."""
        self.log.delete_old_segments()
        self._drop_below_start()
        total = sum(s.size for s in self.segments)
        while len(self.segments) > 1 and total - self.segments[0].size >= RETENTION_BYTES:
            total -= self.segments.pop(0).size
        self.log_start = max(self.log_start, self.segments[0].base)

    @rule()
    def roll(self):
        """An explicit roll starts a segment at the log end unless the active one is empty."""
        self.log.roll()
        if self.segments[-1].batches:
            self.segments.append(_Segment(self.leo))

    @rule()
    def close_and_reopen(self):
        """A clean close and reopen changes nothing the model can see."""
        self.log.close()
        self.log = Log.open(self.path, _config())
        assert not self.log.recovered

    @rule()
    def crash_and_reopen(self):
        """Reopening a crash image of the directory (recovery) changes nothing either."""
        image = str(self.tmp_path / f"crash{next(self._dirs)}")
        crash_image(self.path, image)
        self.log.close()
        self.path = image
        self.log = Log.open(self.path, _config())
        assert self.log.recovered

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def offsets_match(self):
        assert self.log.log_start_offset == self.log_start
        assert self.log.log_end_offset == self.leo
        assert [s.base_offset for s in self.log.segments] == [s.base for s in self.segments]
        assert self.log.size_bytes == sum(s.size for s in self.segments)


def test_log_matches_model(tmp_path):
    """Random sequences of appends, reads, truncations, log-start moves, retention, rolls and
    reopens keep the log's offsets, segments and read contents equal to the model's."""
    LogMachine.tmp_path = tmp_path
    run_state_machine_as_test(
        LogMachine,
        settings=settings(max_examples=50, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))
