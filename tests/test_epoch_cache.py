"""LeaderEpochCache: the epoch -> start offset map a replica keeps for KIP-101 truncation."""

from __future__ import annotations

import os

from actors.server.epoch_cache import CHECKPOINT_FILE, LeaderEpochCache
from storage import Log, LogConfig
from storage.records import build


def test_assign_ignores_epochs_that_are_not_newer(tmp_path):
    """Only a newer epoch is recorded, so a follower may assign for every batch it appends."""
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.assign(0, 0) and cache.assign(2, 10)
    assert not cache.assign(2, 15) and not cache.assign(1, 20)
    assert cache.entries == [(0, 0), (2, 10)]
    assert cache.latest_epoch == 2


def test_end_offset_for_follows_kafkas_rules(tmp_path):
    """OffsetsForLeaderEpoch answers: the latest epoch ends at the log end; an older one where
    the next starts (the largest known epoch <= the one asked); unknown ones are undefined."""
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, start in [(1, 0), (3, 100), (4, 250)]:
        cache.assign(epoch, start)
    assert cache.end_offset_for(4, 300) == (4, 300)     # latest: the log end
    assert cache.end_offset_for(3, 300) == (3, 250)
    assert cache.end_offset_for(2, 300) == (1, 100)     # 2 unknown: largest below is 1
    assert cache.end_offset_for(0, 300) == (0, 0)       # older than all: first start
    assert cache.end_offset_for(5, 300) == (-1, -1)     # newer than any known
    assert cache.end_offset_for(-1, 300) == (-1, -1)
    assert LeaderEpochCache(str(tmp_path / "empty")).end_offset_for(3, 9) == (-1, -1)


def test_truncation_from_both_ends(tmp_path):
    """truncate_from_end drops epochs starting at or after the cut; truncate_from_start moves
    the epoch holding the new log start to it and drops older ones."""
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, start in [(1, 0), (3, 100), (4, 250)]:
        cache.assign(epoch, start)
    cache.truncate_from_end(250)
    assert cache.entries == [(1, 0), (3, 100)]
    cache.truncate_from_start(120)
    assert cache.entries == [(3, 120)]
    cache.truncate_from_start(50)                     # below every start: nothing to do
    assert cache.entries == [(3, 120)]


def test_the_checkpoint_survives_a_restart_in_kafkas_format(tmp_path):
    """Entries are written to leader-epoch-checkpoint as Kafka writes it and read back."""
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(0, 0)
    cache.assign(7, 42)
    text = (tmp_path / CHECKPOINT_FILE).read_text()
    assert text == "0\n2\n0 0\n7 42\n"
    assert LeaderEpochCache(str(tmp_path)).entries == [(0, 0), (7, 42)]


def test_a_missing_or_corrupt_checkpoint_is_rebuilt_from_the_log(tmp_path):
    """Without a readable file the cache is rebuilt from the partition leader epochs stamped in
    the log's batches (epochs 0, 0, 2, 5 at offsets 0, 3, 6, 9 -> (0,0) (2,6) (5,9))."""
    with Log.open(str(tmp_path), LogConfig()) as log:
        for epoch in (0, 0, 2, 5):
            log.append(build([b"a", b"b", b"c"]), leader_epoch=epoch)
        assert LeaderEpochCache(str(tmp_path), log).entries == [(0, 0), (2, 6), (5, 9)]
        for garbage in ("0\n3\n0 0\n", "1\n0\n", "0\n2\n5 0\n2 6\n", "\xff\xfe"):
            (tmp_path / CHECKPOINT_FILE).write_text(garbage)
            assert LeaderEpochCache(str(tmp_path), log).entries == [(0, 0), (2, 6), (5, 9)]
        os.unlink(tmp_path / CHECKPOINT_FILE)
        assert LeaderEpochCache(str(tmp_path), log).entries == [(0, 0), (2, 6), (5, 9)]
