"""Producer state: what a partition's log remembers of each idempotent producer (KIP-98).

Kafka's ProducerStateManager without transactions. For every producer id seen in the log
it keeps the producer epoch and the metadata of its last ``BATCHES_PER_PRODUCER`` (5)
batches: first and last sequence, first and last offset, timestamp. A leader checks each
client batch against it before the batch is written:

- same epoch, same (first, last) sequence as one of the 5 kept: a **duplicate**; the
  batch is not written and the producer is answered with the original offsets (success,
  as Kafka >= 2.x answers, not DUPLICATE_SEQUENCE_NUMBER);
- an epoch below the producer's: InvalidProducerEpochError (INVALID_PRODUCER_EPOCH);
- same epoch, first sequence not last + 1 (2**31 - 1 wraps to 0): OutOfOrderSequenceError;
- a new (higher) epoch must start at sequence 0 (OutOfOrderSequenceError otherwise);
- an unknown producer (never seen, or every batch of it gone by retention or
  DeleteRecords) may start at any sequence (Kafka 2.5+, KIP-360: the broker no longer
  answers UNKNOWN_PRODUCER_ID).

A follower applies the same updates without the checks, so it holds the same state when
it becomes the leader.

Snapshot files (Kafka's ``<offset>.snapshot``, format version 1, byte for byte)::

    version int16 (1) | crc uint32 | count int32 | count x entry
    entry: producer_id int64 | epoch int16 | last_sequence int32 | last_offset int64 |
           offset_delta int32 | timestamp int64 | coordinator_epoch int32 (-1) |
           current_txn_first_offset int64 (-1)

The CRC32C covers the bytes after the CRC (count and entries). A snapshot named N holds
the state of every batch below offset N; like Kafka's it keeps only the last batch of each
producer (the other 4 of the window come back from the log replayed after it). Written to
``.tmp``, fsynced and renamed, so a crash leaves the old file or the new one; a file that
does not parse or whose CRC does not match raises CorruptSnapshotError, and the loader
deletes it and falls back to an older snapshot or the log start (as Kafka does).

Not thread-safe: the Log calls it under its own lock.
"""

from __future__ import annotations

import glob
import logging
import os
import struct
from typing import Callable, Iterable, NamedTuple

import crc32c as _crc32c

from .checkpoint import write_atomic
from .errors import (CorruptSnapshotError, InvalidProducerEpochError, InvalidRecordError,
                     OutOfOrderSequenceError)

log = logging.getLogger(__name__)

BATCHES_PER_PRODUCER = 5          # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
INT32_MAX = (1 << 31) - 1

_HEAD = struct.Struct(">hIi")                 # version, crc, entry count
_ENTRY = struct.Struct(">qhiqiqiq")           # one producer (see the module docstring)
_CRC_START = struct.calcsize(">hI")           # the CRC covers everything after it


class ProducerBatch(NamedTuple):
    """One batch of an idempotent producer, as placed in the log."""

    producer_id: int
    producer_epoch: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class ProducerEntry(NamedTuple):
    """A producer's epoch and its last batches, oldest first (at most 5, never empty)."""

    producer_id: int
    producer_epoch: int
    batches: tuple[ProducerBatch, ...]

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset

    def find_duplicate(self, batch: ProducerBatch) -> ProducerBatch | None:
        """The kept batch ``batch`` repeats (same epoch and sequence range), if any."""
        if batch.producer_epoch != self.producer_epoch:
            return None
        for kept in self.batches:
            if kept.first_seq == batch.first_seq and kept.last_seq == batch.last_seq:
                return kept
        return None

    def with_batch(self, batch: ProducerBatch) -> "ProducerEntry":
        """This entry after ``batch``: a new epoch forgets the old epoch's batches."""
        if batch.producer_epoch != self.producer_epoch:
            return ProducerEntry(self.producer_id, batch.producer_epoch, (batch,))
        return ProducerEntry(self.producer_id, self.producer_epoch,
                             (self.batches + (batch,))[-BATCHES_PER_PRODUCER:])


def last_sequence(first_seq: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record: sequences wrap from 2**31 - 1 to 0."""
    return (first_seq + last_offset_delta) % (INT32_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def check_batch(entry: ProducerEntry | None, batch: ProducerBatch) -> None:
    """Kafka's ProducerAppendInfo checks of a client batch against the producer's state
    (``entry``, None for an unknown producer): raises InvalidProducerEpochError or
    OutOfOrderSequenceError. Duplicates are found before (``find_duplicate``)."""
    if entry is None:
        return                                     # unknown producer: any sequence (KIP-360)
    pid = batch.producer_id
    if batch.producer_epoch < entry.producer_epoch:
        raise InvalidProducerEpochError(
            f"producer {pid}: epoch {batch.producer_epoch} is older than the last seen "
            f"epoch {entry.producer_epoch}")
    if batch.producer_epoch != entry.producer_epoch:
        if batch.first_seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {pid}: new epoch {batch.producer_epoch} must start at sequence 0, "
                f"not {batch.first_seq}")
    elif not _in_sequence(entry.last_seq, batch.first_seq):
        raise OutOfOrderSequenceError(
            f"producer {pid}: out of order sequence number {batch.first_seq} (the last "
            f"sequence written is {entry.last_seq}) at offset {batch.first_offset}")


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def snapshot_offsets(directory: str) -> list[int]:
    """The offsets of the snapshot files in ``directory``, ascending."""
    out = []
    for path in glob.glob(os.path.join(directory, "*" + SNAPSHOT_SUFFIX)):
        name = os.path.basename(path)[:-len(SNAPSHOT_SUFFIX)]
        if len(name) == 20 and name.isdigit():
            out.append(int(name))
    return sorted(out)


def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    body = bytearray()
    n = 0
    for e in entries:
        last = e.batches[-1]
        body += _ENTRY.pack(e.producer_id, e.producer_epoch, last.last_seq, last.last_offset,
                            last.last_offset - last.first_offset, last.timestamp, -1, -1)
        n += 1
    count = struct.pack(">i", n)
    crc = _crc32c.crc32c(count + body)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc) + count + bytes(body)


def decode_snapshot(data: bytes, path: str = "snapshot") -> dict[int, ProducerEntry]:
    """The producers of a snapshot file's bytes; CorruptSnapshotError when they are not
    one (short, a bad version, a CRC mismatch, a count that does not fit, trailing bytes)."""
    if len(data) < _HEAD.size:
        raise CorruptSnapshotError(f"{path}: {len(data)} bytes, shorter than a header")
    version, crc, count = _HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"{path}: snapshot version {version}, expected "
                                   f"{SNAPSHOT_VERSION}")
    actual = _crc32c.crc32c(memoryview(data)[_CRC_START:])
    if actual != crc:
        raise CorruptSnapshotError(f"{path}: CRC {actual:#010x} does not match the stored "
                                   f"{crc:#010x}")
    if count < 0 or _HEAD.size + count * _ENTRY.size != len(data):
        raise CorruptSnapshotError(f"{path}: {count} entries do not fill {len(data)} bytes")
    out = {}
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, ts, _, _ = _ENTRY.unpack_from(
            data, _HEAD.size + i * _ENTRY.size)
        if pid < 0 or delta < 0:
            raise CorruptSnapshotError(f"{path}: entry {i} has producer id {pid}, offset "
                                       f"delta {delta}")
        first_seq = (last_seq - delta) % (INT32_MAX + 1) if last_seq >= 0 else last_seq
        batch = ProducerBatch(pid, epoch, first_seq, last_seq, last_offset - delta,
                              last_offset, ts)
        out[pid] = ProducerEntry(pid, epoch, (batch,))
    return out


class ProducerStateManager:
    """The producers of one partition log, and its ``.snapshot`` files (see the module
    docstring). Invariant: every entry's batches lie below ``map_end_offset`` (the log
    end offset of the Log that owns it) and at or above the log start offset."""

    def __init__(self, directory: str):
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    # -- appends ------------------------------------------------------------------------
    def prepare(self, batches: list[ProducerBatch], *, validate: bool, total_batches: int
                ) -> tuple[dict[int, ProducerEntry], tuple[ProducerBatch, ProducerBatch] | None]:
        """The entries ``batches`` would leave (nothing is changed until ``commit``), or
        the (first, last) original batches when the append repeats batches already written
        (then nothing of it may be written). With ``validate`` (a leader taking a client's
        batches) duplicates are looked for and epochs and sequences checked, raising as
        ``check_batch``; a follower's batches are applied as they are.

        Kafka takes one batch per partition in a produce request; raykafka's own producer
        sends up to 5 (one partition's batches in flight, all retried together), so an
        append of ``total_batches`` is a duplicate when every batch of it is one, and one
        that mixes repeated and new batches is refused (InvalidRecordError: the client
        broke the rule)."""
        updates: dict[int, ProducerEntry] = {}
        if validate:
            duplicates = self._duplicates(batches)
            if duplicates:
                if len(duplicates) != total_batches:
                    raise InvalidRecordError(
                        f"an append of {total_batches} batches repeats {len(duplicates)} "
                        f"already written: an idempotent producer retries whole requests")
                return {}, (duplicates[0], duplicates[-1])
        for b in batches:
            entry = updates.get(b.producer_id, self.producers.get(b.producer_id))
            if validate:
                check_batch(entry, b)
            updates[b.producer_id] = (entry.with_batch(b) if entry is not None
                                      else ProducerEntry(b.producer_id, b.producer_epoch, (b,)))
        return updates, None

    def _duplicates(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        out = []
        for b in batches:
            entry = self.producers.get(b.producer_id)
            duplicate = entry.find_duplicate(b) if entry is not None else None
            if duplicate is not None:
                out.append(duplicate)
        return out

    def commit(self, updates: dict[int, ProducerEntry]) -> None:
        self.producers.update(updates)

    def apply(self, batches: Iterable[ProducerBatch]) -> None:
        """Replay batches already in the log (recovery, a follower's append)."""
        for b in batches:
            entry = self.producers.get(b.producer_id)
            self.producers[b.producer_id] = (
                entry.with_batch(b) if entry is not None
                else ProducerEntry(b.producer_id, b.producer_epoch, (b,)))

    # -- the log start moving, truncation ------------------------------------------------
    def evict_below(self, log_start_offset: int, first_segment_base: int) -> None:
        """Retention or DeleteRecords moved the log start: forget producers whose last batch
        is gone (they become unknown producers) and batches below it; delete the snapshots
        of deleted segments (those below ``first_segment_base``)."""
        for pid, e in list(self.producers.items()):
            kept = tuple(b for b in e.batches if b.last_offset >= log_start_offset)
            if not kept:
                del self.producers[pid]
            elif len(kept) != len(e.batches):
                self.producers[pid] = e._replace(batches=kept)
        for offset in snapshot_offsets(self.directory):
            if offset < first_segment_base:
                self._unlink(offset)

    def clear(self) -> None:
        """Forget everything, snapshots included (the log restarts empty)."""
        self.producers = {}
        for offset in snapshot_offsets(self.directory):
            self._unlink(offset)

    def _unlink(self, offset: int) -> None:
        try:
            os.unlink(snapshot_path(self.directory, offset))
        except FileNotFoundError:
            pass

    # -- snapshots ----------------------------------------------------------------------
    def take_snapshot(self, offset: int, pending: Iterable[ProducerBatch] = ()) -> None:
        """Write ``<offset>.snapshot``: the committed state plus the ``pending`` batches
        below ``offset`` (an append that rolls a segment between its batches)."""
        producers = self.producers
        extra = [b for b in pending if b.last_offset < offset]
        if extra:
            producers = dict(producers)
            for b in extra:
                e = producers.get(b.producer_id)
                producers[b.producer_id] = (e.with_batch(b) if e is not None else
                                            ProducerEntry(b.producer_id, b.producer_epoch, (b,)))
        write_atomic(snapshot_path(self.directory, offset),
                     encode_snapshot(producers.values()))

    def load(self, log_start_offset: int, log_end_offset: int,
             replay: Callable[[int], Iterable[ProducerBatch]]) -> int:
        """Rebuild the state of a log holding [log_start_offset, log_end_offset): the
        newest readable snapshot at or below the log end, then the producer batches of the
        log after it (``replay(from_offset)``). Snapshots above the log end are deleted
        (their batches were truncated), and so is every corrupt one. Returns the offset
        replay started at."""
        offsets = snapshot_offsets(self.directory)
        for offset in offsets:
            if offset > log_end_offset:
                self._unlink(offset)
        self.producers = {}
        start = log_start_offset
        for offset in reversed([o for o in offsets if o <= log_end_offset]):
            path = snapshot_path(self.directory, offset)
            try:
                with open(path, "rb") as f:
                    self.producers = decode_snapshot(f.read(), path)
            except CorruptSnapshotError as exc:
                log.warning("deleting a corrupt producer snapshot: %s", exc)
                self._unlink(offset)
                continue
            start = max(offset, log_start_offset)
            break
        self.producers = {pid: e for pid, e in self.producers.items()
                          if e.last_offset >= log_start_offset}
        if start < log_end_offset:
            self.apply(replay(start))
        return start


__all__ = ["ProducerStateManager", "ProducerBatch", "ProducerEntry", "BATCHES_PER_PRODUCER",
           "check_batch", "last_sequence", "encode_snapshot", "decode_snapshot",
           "snapshot_path", "snapshot_offsets", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH"]
