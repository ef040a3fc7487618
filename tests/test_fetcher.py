"""ReplicaFetcher's truncation by leader epoch (KIP-101, KIP-279) with a fake leader and a
fake follower side: where a follower cuts its log, without Ray."""

from __future__ import annotations

from actors.protocol import EpochEndOffset
from actors.server.epoch_cache import LeaderEpochCache
from actors.server.fetcher import FetcherSettings, ReplicaFetcher


class FakeLeader:
    """Answers offsets_for_leader_epoch from its own epoch cache and LEO; records asks."""

    def __init__(self, tmp_path, entries, leo):
        (tmp_path / "leader").mkdir()
        self.cache = LeaderEpochCache(str(tmp_path / "leader"))
        for e, o in entries:
            self.cache.assign(e, o)
        self.leo = leo
        self.asked = []

    def offsets_for_leader_epoch(self, epoch):
        self.asked.append(epoch)
        return EpochEndOffset(*self.cache.end_offset_for(epoch, self.leo))


class FakeFollower:
    def __init__(self, tmp_path, entries, leo, hw):
        (tmp_path / "follower").mkdir()
        self.cache = LeaderEpochCache(str(tmp_path / "follower"))
        for e, o in entries:
            self.cache.assign(e, o)
        self.leo, self.hw = leo, hw

    def follower_position(self, generation):
        return self.leo, self.hw

    def latest_epoch(self, generation):
        return self.cache.latest_epoch

    def epoch_end_offset(self, generation, epoch):
        return self.cache.end_offset_for(epoch, self.leo)


def fetcher(side, link):
    return ReplicaFetcher(side, link, follower_id=1, leader_id=0, leader_epoch=5,
                          generation=1, settings=FetcherSettings(), name="t-0")


def test_same_latest_epoch_truncates_to_the_smaller_end(tmp_path):
    """Both know the follower's latest epoch: cut at min(leader's end for it, own LEO)."""
    leader = FakeLeader(tmp_path, [(0, 0), (1, 10)], leo=14)
    follower = FakeFollower(tmp_path, [(0, 0), (1, 10)], leo=18, hw=12)
    assert fetcher(follower, leader).truncation_offset() == 14


def test_kip_279_asks_again_until_the_epochs_agree(tmp_path):
    """Follower epochs 0,1,3 and leader epochs 0,2,5: the leader answers epoch 2 for 3, the
    follower has no epoch 2 so it asks for its epoch 1, the leader answers 0 (ending at 15),
    and the follower cuts where its own epoch 0 ended (10): its epoch-1 records never
    existed on the leader."""
    leader = FakeLeader(tmp_path, [(0, 0), (2, 15), (5, 30)], leo=34)
    follower = FakeFollower(tmp_path, [(0, 0), (1, 10), (3, 20)], leo=25, hw=22)
    f = fetcher(follower, leader)
    assert f.truncation_offset() == 10
    assert leader.asked == [3, 1]


def test_the_own_high_watermark_is_not_the_truncation_point(tmp_path):
    """A follower whose whole log is of an epoch the leader also has keeps everything up to
    its LEO even above its HW (KIP-101: truncating to the HW loses acknowledged records)."""
    leader = FakeLeader(tmp_path, [(0, 0), (4, 40)], leo=60)
    follower = FakeFollower(tmp_path, [(0, 0)], leo=40, hw=25)
    assert fetcher(follower, leader).truncation_offset() == 40


def test_a_leader_without_epochs_falls_back_to_the_high_watermark(tmp_path):
    """The leader answers (-1, -1): the follower keeps only what it knows committed."""
    leader = FakeLeader(tmp_path, [], leo=60)
    follower = FakeFollower(tmp_path, [(0, 0)], leo=40, hw=25)
    assert fetcher(follower, leader).truncation_offset() == 25
