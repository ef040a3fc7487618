"""The follower broker's fetcher (actors/server/broker_fetcher.py) without Ray: a leader
"broker" (a real listener: SocketServer + KafkaApis + BrokerBackend over in-process leader
replicas) and a BrokerFetcherManager feeding in-process follower replicas over their
channels. One Fetch per round for every followed partition; acks=all completes once the
followers' next fetch reports the batch; truncation by epoch; a stale generation leaves
the thread."""

from __future__ import annotations

import time

import pytest

from actors.server.broker_backend import BrokerBackend
from actors.server.broker_fetcher import BrokerFetcherManager
from actors.server.fetcher import FetcherSettings
from actors.server.handlers import BrokerEndpoint, KafkaApis
from actors.server.network import SocketServer, SocketServerConfig
from actors.server.replica import PartitionReplica
from actors import wire
from actors.connection import KafkaConnection
from actors.server.replica_channel import ReplicaChannel, wait
from storage.records import build, decode_records

LEADER, FOLLOWER = 0, 1


class _Lookup:
    """The leader broker's ReplicaLookup over in-process replicas."""

    def __init__(self, replicas):
        self.replicas = replicas

    def handle(self, topic, partition):
        return self.replicas.get((topic, partition))

    def channel_address(self, handle):
        return handle.channel_address()


class _Local:
    """The follower broker's LocalReplicas over in-process replicas."""

    def __init__(self, leaders):
        self.leaders = leaders

    def channel(self, handle):
        return ReplicaChannel(handle.channel_address(), reader_thread=False)


class Pair:
    """Two partitions led on broker 0 and followed on broker 1."""

    def __init__(self, tmp_path, partitions=2, settings=None):
        self.keys = [("t", p) for p in range(partitions)]
        self.leaders = {k: PartitionReplica(*k, LEADER, str(tmp_path / "l"), {})
                        for k in self.keys}
        self.followers = {k: PartitionReplica(*k, FOLLOWER, str(tmp_path / "f"), {})
                          for k in self.keys}
        self.epochs = {k: 0 for k in self.keys}
        for k in self.keys:
            self.leaders[k].become_leader(0, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
        metadata = {"controller_id": 0, "brokers": {}, "topics": {"t": {
            p: {"leader": LEADER, "leader_epoch": 0, "isr": [0, 1], "replicas": [0, 1]}
            for _, p in self.keys}}}
        self.backend = BrokerBackend(LEADER, metadata=lambda: metadata,
                                     leader_epochs=lambda: dict(self.epochs),
                                     replicas=_Lookup(self.leaders),
                                     endpoint=BrokerEndpoint(LEADER, "127.0.0.1", 0))
        self.apis = KafkaApis(self.backend)
        self.backend.on_change = self.apis.notify
        self.backend.on_change_inline = self.apis.notify_inline
        self.server = SocketServer(self.apis, SocketServerConfig(host="127.0.0.1", port=0,
                                                                 io_threads=2))
        self.server.start()
        port = self.server.port
        self.manager = BrokerFetcherManager(
            FOLLOWER, settings or FetcherSettings(wait_max_ms=500, backoff_ms=50),
            lambda b: ("127.0.0.1", port) if b == LEADER else None, _Local(self.leaders))

    def follow_all(self, epoch=0):
        for k, f in self.followers.items():
            state = f.become_follower(LEADER, epoch, [0, 1], [0, 1], fetch=False)
            self.manager.follow(*k, LEADER, epoch, state["generation"], f)

    def close(self):
        self.manager.close()
        self.server.close()
        self.apis.close()
        self.backend.close()
        for r in [*self.leaders.values(), *self.followers.values()]:
            r.stop()


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


def _until(predicate, timeout_s=10.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_acks_all_completes_once_the_follower_fetched_the_batch(pair):
    """A produce with acks=all through the leader's listener path (its replica channel)
    answers once the follower's fetcher applied the batch and its next fetch told the
    leader: both logs then hold the same bytes."""
    pair.follow_all()
    chan = ReplicaChannel(pair.leaders[("t", 0)].channel_address())
    for i in range(20):
        wait(chan.produce(build([b"r%d" % i]), acks=-1, timeout_ms=10000), 15)
    chan.close()
    leader, follower = pair.leaders[("t", 0)], pair.followers[("t", 0)]
    assert leader.high_watermark == 20
    assert follower.log.read(0, 1 << 20) == leader.log.read(0, 1 << 20)
    _until(lambda: follower.high_watermark >= 19, what="the follower's HW")


def test_the_follower_replica_learns_the_leaders_last_high_watermark(pair):
    """A new HW that comes with no records (the last produce's, learnt after the fetch that
    carried it) still reaches the follower replica, with the next fetch answer (the long
    poll's end at the latest), as a HW message without an APPLY."""
    pair.follow_all()
    chan = ReplicaChannel(pair.leaders[("t", 1)].channel_address())
    for i in range(5):
        wait(chan.produce(build([b"r%d" % i]), acks=-1, timeout_ms=10000), 15)
    chan.close()
    follower = pair.followers[("t", 1)]
    _until(lambda: follower.high_watermark == 5, timeout_s=5, what="the follower's HW of 5")


def test_one_fetch_per_round_carries_every_followed_partition(pair):
    """Both partitions ride in the same Fetch: the fetcher's request count stays about the
    number of rounds, not rounds x partitions, and each follower gets its partition's
    records."""
    pair.follow_all()
    for k, leader in pair.leaders.items():
        leader.produce(build([b"%s-%d" % (k[0].encode(), k[1])] * 50), 1, 1000)
    _until(lambda: all(f.log.log_end_offset == 50 for f in pair.followers.values()),
           what="both followers caught up")
    status = pair.manager.status()
    assert len(status) == 1 and set(status[0]["partitions"]) == {"t-0", "t-1"}
    fetches = status[0]["fetches"]
    for k, f in pair.followers.items():
        values = [r.value for r in decode_records(f.log.read(0, 1 << 20))]
        assert values == [b"t-%d" % k[1]] * 50
    # two partitions with data in one answer: far fewer fetches than 2 per produce round
    assert fetches <= 10


def test_partitions_share_a_small_response_budget_instead_of_the_first_starving_the_rest(
        tmp_path):
    """With replica.fetch.response.max.bytes below what both partitions have to send, the
    leader fills each answer from the first partition with data; the fetcher puts the
    partitions that brought records at the end of its next Fetch, so both catch up
    together: the second is well under way by the time the first is half done."""
    batch = build([b"v" * 3000])
    pair = Pair(tmp_path, settings=FetcherSettings(wait_max_ms=500, backoff_ms=50,
                                                   response_max_bytes=2 * len(batch) + 100))
    try:
        total = 150
        for leader in pair.leaders.values():
            for _ in range(total):
                leader.produce(batch, 1, 1000)
        first, second = (pair.followers[k] for k in pair.keys)
        pair.follow_all()
        _until(lambda: first.log.log_end_offset >= total // 2
               or second.log.log_end_offset >= total // 2, timeout_s=30, what="half of one")
        behind = min(first.log.log_end_offset, second.log.log_end_offset)
        assert behind >= total // 4, (first.log.log_end_offset, second.log.log_end_offset)
        _until(lambda: all(f.log.log_end_offset == total for f in pair.followers.values()),
               timeout_s=30, what="both followers caught up")
    finally:
        pair.close()


def test_a_follower_with_a_divergent_tail_truncates_by_epoch_before_fetching(pair):
    """The follower's log has records of an epoch the leader never had past the leader's
    end of that epoch (KIP-101): they are cut before the leader's records are appended."""
    key = ("t", 0)
    leader, follower = pair.leaders[key], pair.followers[key]
    leader.produce(build([b"common"]), 1, 1000)
    # the follower once led epoch 0 too, and wrote two records the leader never had
    follower.become_leader(0, [FOLLOWER], [LEADER, FOLLOWER])
    follower.produce(build([b"common"]), 1, 1000)
    follower.produce(build([b"lost-a", b"lost-b"]), 1, 1000)
    assert follower.log.log_end_offset == 3
    pair.epochs[key] = 1
    leader.become_leader(1, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
    leader.produce(build([b"new"]), 1, 1000)
    state = follower.become_follower(LEADER, 1, [0, 1], [0, 1], fetch=False)
    pair.manager.follow(*key, LEADER, 1, state["generation"], follower)
    _until(lambda: follower.log.log_end_offset == 2, what="truncated and caught up")
    values = [r.value for r in decode_records(follower.log.read(0, 1 << 20))]
    assert values == [b"common", b"new"]


def test_a_replica_that_moved_on_leaves_the_fetcher_and_is_not_written(pair):
    """Once the follower replica becomes leader (a new generation), an answer for its old
    generation appends nothing and the partition leaves the fetcher thread."""
    pair.follow_all()
    key = ("t", 1)
    follower = pair.followers[key]
    follower.become_leader(1, [FOLLOWER], [LEADER, FOLLOWER])
    pair.leaders[key].produce(build([b"late"] * 5), 1, 1000)
    _until(lambda: "t-1" not in pair.manager.status()[0]["partitions"],
           what="the partition leaving the thread")
    assert follower.log.log_end_offset == 0


def test_appends_that_keep_failing_are_logged_at_warning_and_the_follower_recovers(
        pair, caplog, monkeypatch):
    """A follower replica whose appends fail round after round is reported at WARNING
    (with the error) once the failures repeat, not only at DEBUG; the partition stays in
    the fetcher, truncates by epoch again, and catches up once appends work again."""
    key = ("t", 0)
    leader, follower = pair.leaders[key], pair.followers[key]
    real = follower.apply_fetch
    failures = []

    def failing(generation, fetch_offset, result):
        if len(failures) < 8 and result.data:
            failures.append(fetch_offset)
            raise RuntimeError(f"disk says no at {fetch_offset}")
        return real(generation, fetch_offset, result)
    monkeypatch.setattr(follower, "apply_fetch", failing)
    caplog.set_level("WARNING", logger="actors.server.broker_fetcher")
    pair.follow_all()
    leader.produce(build([b"r%d" % i for i in range(10)]), 1, 1000)
    _until(lambda: follower.log.log_end_offset == 10, timeout_s=20,
           what="the follower caught up after the failures")
    assert len(failures) == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
                and "t-0: append failed" in r.getMessage()]
    assert len(warnings) == 1, warnings      # rate-limited: one per LOG_EVERY_S
    assert "5 times in a row at offset 0" in warnings[0] and "disk says no" in warnings[0]
    assert follower.log.read(0, 1 << 20) == leader.log.read(0, 1 << 20)


def test_a_follower_far_behind_catches_up_on_thousands_of_small_batches(pair):
    """A follower that starts (or restarts) behind gets one Fetch answer of thousands of
    small batches (more than IOV_MAX write buffers in one append): it applies them and
    catches up byte-identically (the append used to fail with EINVAL for ever)."""
    key = ("t", 0)
    leader, follower = pair.leaders[key], pair.followers[key]
    for i in range(1500):
        leader.produce(build([b"%d" % i]), 1, 1000)
    pair.follow_all()
    _until(lambda: follower.log.log_end_offset == 1500, timeout_s=20,
           what="the follower caught up")
    assert follower.log.read(0, 1 << 22) == leader.log.read(0, 1 << 22)


def test_a_follower_below_the_leaders_log_start_starts_over_there_asking_over_the_wire(pair):
    """A follower whose fetch offset is below the leader's log start (records deleted while
    it was away) gets OFFSET_OUT_OF_RANGE, asks the leader's offsets with ListOffsets on
    its fetch connection (no Ray here to ask), starts over at the log start and catches
    up byte-identically from there."""
    key = ("t", 0)
    leader, follower = pair.leaders[key], pair.followers[key]
    pair.epochs[key] = 1
    leader.become_leader(1, [LEADER, FOLLOWER], [LEADER])    # alone in the ISR: HW = LEO
    for i in range(20):
        leader.produce(build([b"r%d" % i]), 1, 1000)
    assert leader.delete_records_before(10) == 10
    state = follower.become_follower(LEADER, 1, [0, 1], [0], fetch=False)
    pair.manager.follow(*key, LEADER, 1, state["generation"], follower)
    _until(lambda: follower.log.log_end_offset == 20, what="the follower caught up")
    assert follower.log.log_start_offset == 10
    assert [r.value for r in decode_records(follower.log.read(10, 1 << 20))] == \
        [b"r%d" % i for i in range(10, 20)]
    assert follower.log.read(10, 1 << 20) == leader.log.read(10, 1 << 20)


def test_list_offsets_from_a_follower_broker_answers_the_log_end_not_the_hw(pair):
    """ListOffsets latest with a broker id as replica_id is answered the leader's log end
    offset (what a follower needs after OFFSET_OUT_OF_RANGE, as Kafka answers it); a
    consumer's (replica_id -1) the high watermark, which the unreplicated records are past."""
    key = ("t", 0)
    leader = pair.leaders[key]
    leader.produce(build([b"a", b"b", b"c"]), 1, 1000)      # nobody fetched: HW 0, LEO 3
    assert (leader.high_watermark, leader.log.log_end_offset) == (0, 3)
    conn = KafkaConnection("127.0.0.1", pair.server.port)
    try:
        def latest(replica_id):
            body = {"replica_id": replica_id, "isolation_level": 0, "topics": [
                {"name": "t", "partitions": [{"partition_index": 0,
                                              "current_leader_epoch": 0, "timestamp": -1}]}]}
            part = conn.request(wire.LIST_OFFSETS, body).result(10)["topics"][0][
                "partitions"][0]
            assert part["error_code"] == wire.NONE
            return part["offset"]
        assert latest(-1) == 0
        assert latest(FOLLOWER) == 3
    finally:
        conn.close()
