"""The local channel to a partition replica (actors/server/replica_channel.py): produce and
fetch over a Unix socket, with the replica's answers and errors, its ordering and bounds."""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import threading
import time

import pytest

from actors.errors import (CorruptRecordError, IllegalArgumentError, KafkaTimeoutError,
                           NotEnoughReplicasError, NotLeaderForPartitionError,
                           RequestTimedOutError)
from actors.server import replica_channel
from actors.server.network import SocketServer
from actors.server.replica import PartitionReplica
from actors.server.replica_channel import ReplicaChannel as _ReplicaChannel
from actors.server.replica_channel import wait
from storage.records import build, decode_records

_LOOP: list = []        # the listener serving the channels, in the "listener loop" runs


@pytest.fixture(autouse=True, params=["own reader thread", "listener loop"])
def channel_mode(request):
    """Every test runs twice: with the channel's own reader thread, and served by a
    listener's network thread (a broker's channels, ``loop=``)."""
    if request.param == "own reader thread":
        yield request.param
        return
    server = SocketServer(lambda request: None).start()
    _LOOP.append(server)
    try:
        yield request.param
    finally:
        _LOOP.clear()
        server.close()


def ReplicaChannel(address, **kwargs):  # noqa: N802 - stands in for the class
    """The channel in this run's mode (a channel without a reader thread is its own)."""
    if _LOOP and kwargs.get("reader_thread", True):
        kwargs["loop"] = _LOOP[0]
    return _ReplicaChannel(address, **kwargs)


@pytest.fixture
def leader(tmp_path):
    replica = PartitionReplica("chan", 0, 0, str(tmp_path), {})
    replica.become_leader(0, [0], [0])
    yield replica
    replica.stop()


def _values(data) -> list:
    return [r.value for r in decode_records(data)]


def test_produce_and_fetch_through_the_channel_answer_what_the_replica_answers(leader):
    """Batches produced over the channel get the replica's offsets and are read back by a
    fetch over the channel with the HW, log start and log end the replica reports."""
    chan = ReplicaChannel(leader.channel_address())
    try:
        first = wait(chan.produce(build([b"a", b"b", b"c"]), acks=1), 5)
        second = wait(chan.produce(build([b"d"]), acks=-1), 5)
        assert (first.base_offset, first.last_offset) == (0, 2)
        assert (second.base_offset, second.last_offset) == (3, 3)
        got = wait(chan.fetch(0, 1 << 20), 5)
        assert _values(got.data) == [b"a", b"b", b"c", b"d"]
        assert (got.high_watermark, got.log_start_offset, got.log_end_offset) == (4, 0, 4)
        assert got == leader.fetch(0, 1 << 20)
    finally:
        chan.close()


def test_list_offsets_and_epoch_end_offsets_over_the_channel_answer_as_the_replica(tmp_path):
    """ListOffsets (latest is the HW, earliest the log start, a timestamp its first
    record) and OffsetForLeaderEpoch go over the channel with the replica's answers; a
    replica that leads no more answers NotLeaderForPartitionError."""
    replica = PartitionReplica("chan", 0, 0, str(tmp_path), {})
    replica.become_leader(0, [0, 1], [0, 1])
    chan = ReplicaChannel(replica.channel_address())
    try:
        wait(chan.produce(build([b"a", b"b"], timestamps=[1000, 1000]), acks=1), 5)
        replica.become_leader(2, [0, 1], [0, 1])
        wait(chan.produce(build([b"c"], timestamps=[2000]), acks=1), 5)
        replica.follower_fetched(1, 2, 2)                 # the HW moves to 2, not 3
        assert wait(chan.list_offset(-1), 5) == (-1, 2)
        assert wait(chan.list_offset(-2), 5) == (-1, 0)
        assert wait(chan.list_offset(1000), 5) == (1000, 0)
        assert wait(chan.list_offset(5000), 5) == (-1, -1)
        assert wait(chan.list_offset(-1), 5) == replica.list_offset(-1)
        found = wait(chan.end_offset_for_epoch(0), 5)
        assert (found.leader_epoch, found.end_offset) == (0, 2)
        found = wait(chan.end_offset_for_epoch(2), 5)
        assert (found.leader_epoch, found.end_offset) == (2, 3)
        replica.become_follower(1, 3, [0, 1], [0, 1], fetch=False)
        with pytest.raises(NotLeaderForPartitionError):
            wait(chan.list_offset(-1), 5)
        with pytest.raises(NotLeaderForPartitionError):
            wait(chan.end_offset_for_epoch(2), 5)
    finally:
        chan.close()
        replica.stop()


def test_a_connections_produce_requests_are_appended_in_the_order_sent(leader):
    """Two hundred requests sent back to back without waiting are appended in send order
    (the append runs on the connection's reader thread, in arrival order)."""
    chan = ReplicaChannel(leader.channel_address())
    try:
        futures = [chan.produce(build([b"%d" % i]), acks=1) for i in range(200)]
        offsets = [wait(f, 10).base_offset for f in futures]
        assert offsets == list(range(200))
        assert _values(leader.fetch(0, 1 << 20).data) == [b"%d" % i for i in range(200)]
    finally:
        chan.close()


def test_the_replicas_typed_errors_come_back_as_the_same_classes(leader, tmp_path):
    """A corrupt batch, bad acks, too small an ISR and a follower's refusal reach the
    caller as the actors.errors classes the replica raised, with their messages."""
    chan = ReplicaChannel(leader.channel_address())
    try:
        bad = bytearray(build([b"x"]))
        bad[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError, match="CRC"):
            wait(chan.produce(bytes(bad), acks=1), 5)
        with pytest.raises(IllegalArgumentError, match="acks"):
            wait(chan.produce(build([b"x"]), acks=2), 5)
        leader.update_config({}, min_insync_replicas=2)
        with pytest.raises(NotEnoughReplicasError, match="min.insync.replicas=2"):
            wait(chan.produce(build([b"x"]), acks=-1), 5)
        assert leader.log.log_end_offset == 0          # nothing refused was written
    finally:
        chan.close()
    follower = PartitionReplica("chan", 1, 1, str(tmp_path), {})
    try:
        follower.become_follower(0, 0, [0, 1], [0, 1])
        chan = ReplicaChannel(follower.channel_address())
        with pytest.raises(NotLeaderForPartitionError, match="not the leader"):
            wait(chan.produce(build([b"x"]), acks=1), 5)
        chan.close()
    finally:
        follower.stop()


def test_a_long_poll_waits_for_data_without_holding_up_produce(leader):
    """A fetch with max_wait_ms parks on a worker thread: a produce on the same connection
    is answered meanwhile, and the parked fetch answers with its records."""
    chan = ReplicaChannel(leader.channel_address())
    try:
        parked = chan.fetch(0, 1 << 20, max_wait_ms=10_000, min_bytes=1)
        time.sleep(0.05)                 # let it park (the assertions hold either way)
        assert not parked.done()
        wait(chan.produce(build([b"late"]), acks=1), 5)
        assert _values(wait(parked, 5).data) == [b"late"]
    finally:
        chan.close()


def test_an_acks_all_wait_does_not_block_the_connection(tmp_path):
    """A leader with a follower: an acks=-1 produce waits for the ISR on a worker thread
    while acks=1 produces behind it on the same connection are answered; it answers once
    the follower's fetch moves the HW past it."""
    replica = PartitionReplica("wait", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0, 1], [0, 1])
        chan = ReplicaChannel(replica.channel_address())
        waiting = chan.produce(build([b"all"]), acks=-1, timeout_ms=10_000)
        assert wait(chan.produce(build([b"one"]), acks=1), 5).base_offset == 1
        assert not waiting.done()
        replica.replica_fetch(1, 2, 0, 1 << 20, 0)    # the follower has both records
        assert wait(waiting, 5).base_offset == 0
        chan.close()
    finally:
        replica.stop()


def test_stopping_the_replica_fails_requests_in_flight_at_once(tmp_path):
    """The replica stops while a long poll is parked on its channel: the poll fails with
    NotLeaderForPartitionError at once (not at its max_wait_ms), and so does every later
    request on that channel."""
    replica = PartitionReplica("stop", 0, 0, str(tmp_path), {})
    replica.become_leader(0, [0], [0])
    chan = ReplicaChannel(replica.channel_address())
    parked = chan.fetch(0, 1 << 20, max_wait_ms=60_000)
    started = time.monotonic()
    replica.stop()
    with pytest.raises(NotLeaderForPartitionError):
        wait(parked, 10)
    assert time.monotonic() - started < 10
    with pytest.raises(NotLeaderForPartitionError):
        wait(chan.produce(build([b"x"]), acks=1), 5)
    assert not chan.alive
    with pytest.raises(NotLeaderForPartitionError):
        replica.channel_address()                  # a stopped replica has none
    with pytest.raises(NotLeaderForPartitionError, match="refused"):
        ReplicaChannel(chan.address)               # nobody listens there any more


def test_closing_the_listener_fails_the_channels_it_serves_at_once(leader, channel_mode):
    """A channel read by a listener's network thread: when the listener closes (its
    broker shuts down), a long poll parked on the channel fails with
    NotLeaderForPartitionError at once, later requests too, and a new channel on the
    closed listener is refused the same way; the other channel of the same listener that
    was closed earlier left the listener serving."""
    if channel_mode != "listener loop":
        pytest.skip("only a channel served by a listener has one to lose")
    server = _LOOP[0]
    try:
        first = _ReplicaChannel(leader.channel_address(), loop=server)
        first.close()
        chan = _ReplicaChannel(leader.channel_address(), loop=server)
        assert wait(chan.produce(build([b"a"]), acks=1), 5).base_offset == 0
        parked = chan.fetch(1, 1 << 20, max_wait_ms=60_000)
        started = time.monotonic()
    finally:
        server.close()
    with pytest.raises(NotLeaderForPartitionError):
        wait(parked, 10)
    assert time.monotonic() - started < 10 and not chan.alive
    with pytest.raises(NotLeaderForPartitionError):
        wait(chan.produce(build([b"b"]), acks=1), 5)
    with pytest.raises(NotLeaderForPartitionError, match="not running"):
        _ReplicaChannel(leader.channel_address(), loop=server)


def test_an_oversized_or_garbage_frame_closes_only_that_connection(leader):
    """A frame header claiming more than max_frame_bytes, and a frame of an unknown op, do
    not crash the server: the first connection is closed before anything is allocated, the
    second gets an error answer, and a new connection is served normally."""
    address = leader.channel_address()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(address)
    raw.sendall(struct.pack("<I", replica_channel.DEFAULT_MAX_FRAME_BYTES + 1))
    raw.settimeout(5)
    assert raw.recv(16) == b""                      # closed by the server
    raw.close()
    chan = ReplicaChannel(address)
    try:
        with pytest.raises(Exception, match="unknown channel op 200"):
            wait(chan._request(200, [b"junk"], None), 5)
        assert wait(chan.produce(build([b"ok"]), acks=1), 5).base_offset == 0
    finally:
        chan.close()


def test_many_threads_share_one_channel(leader):
    """Eight threads producing and fetching on one channel each get their own answers."""
    chan = ReplicaChannel(leader.channel_address())
    errors = []

    def work(k):
        try:
            for i in range(50):
                wait(chan.produce(build([b"%d-%d" % (k, i)]), acks=1), 10)
                wait(chan.fetch(0, 1024), 10)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    chan.close()
    assert errors == []
    assert leader.log.log_end_offset == 400


def test_wait_gives_up_with_kafka_timeout_error():
    """``wait`` on a request nobody answers raises KafkaTimeoutError after its timeout."""
    with pytest.raises(KafkaTimeoutError):
        wait(concurrent.futures.Future(), 0.05)


def _watched(chan, events=None):
    """Start a watch; returns (list of (hw, leo) seen, a condition signalled per event);
    every WatchEvent also goes to ``events`` when given."""
    seen, cond = [], threading.Condition()

    def on_change(ev):
        with cond:
            seen.append((ev.high_watermark, ev.log_end_offset))
            if events is not None:
                events.append(ev._replace(data=bytes(ev.data)))
            cond.notify_all()
    wait(chan.watch(on_change), 5)
    return seen, cond


def _until(cond, predicate, timeout_s=5.0):
    with cond:
        assert cond.wait_for(predicate, timeout_s), "no such watch event in time"


def test_a_watch_reports_the_high_watermark_and_log_end_as_they_move(tmp_path):
    """A watch answers the current (HW, LEO) at once, then the new values after an append
    (the LEO first, at a leader with a follower) and after the follower's fetch moves the HW."""
    replica = PartitionReplica("watch", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0, 1], [0, 1])
        chan = ReplicaChannel(replica.channel_address())
        seen, cond = _watched(chan)
        assert seen == [(0, 0)]
        wait(chan.produce(build([b"a", b"b"]), acks=1), 5)
        _until(cond, lambda: seen[-1] == (0, 2))
        replica.replica_fetch(1, 2, 0, 1 << 20, 0)     # the follower has both records
        _until(cond, lambda: seen[-1] == (2, 2))
        chan.close()
    finally:
        replica.stop()


def test_closing_a_watched_channel_ends_its_watch_thread(leader):
    """The replica's thread parked for a watch ends when the broker's channel closes (it
    is woken by the connection's end, not by a timer): no thread is left behind."""
    def watch_threads():
        return [t for t in threading.enumerate() if t.name == "channel-watch"]
    chan = ReplicaChannel(leader.channel_address())
    _watched(chan)
    assert len(watch_threads()) == 1
    chan.close()
    deadline = time.monotonic() + 5
    while watch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch_threads() == []


def test_a_watch_ends_with_an_error_when_the_replica_stops(tmp_path):
    """Stopping the replica ends its watches: the channel fails, later requests too."""
    replica = PartitionReplica("wstop", 0, 0, str(tmp_path), {})
    replica.become_leader(0, [0], [0])
    chan = ReplicaChannel(replica.channel_address())
    _watched(chan)
    replica.stop()
    deadline = time.monotonic() + 5
    while chan.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not chan.alive
    with pytest.raises(NotLeaderForPartitionError):
        wait(chan.fetch(0, 1024), 5)


def test_a_watch_pushes_the_appended_batches_in_order_without_gaps(tmp_path):
    """Each push carries the batches appended since the previous one ([base, end), whole
    batches, the bytes the log holds): together they are the log from the watch's start."""
    replica = PartitionReplica("tail", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0], [0])
        replica.produce(build([b"before"]), 1, 1000)          # not pushed: before the watch
        chan = ReplicaChannel(replica.channel_address())
        events = []
        seen, cond = _watched(chan, events)
        for i in range(30):
            wait(chan.produce(build([b"v%d-%d" % (i, j) for j in range(3)]), acks=1), 5)
        _until(cond, lambda: seen[-1][1] == 91)
        first = events[0]
        assert (first.base, first.end, first.data) == (1, 1, b"")
        end = 1
        for ev in events:
            assert ev.base == end
            end = ev.end
        assert end == 91
        pushed = b"".join(ev.data for ev in events)
        assert pushed == replica.log.read(1, 1 << 20)
        chan.close()
    finally:
        replica.stop()


def test_appends_over_the_watched_connection_never_wake_the_watch_thread(tmp_path,
                                                                        monkeypatch):
    """An append made on the watched connection is pushed by that connection's reader
    thread, without waking the watch's own thread (a thread switch per append); an append
    made elsewhere (a Ray call's thread) is pushed by the watch's thread."""
    pushers = []
    push = replica_channel._Watch.push_locked

    def recorded(watch, replica):
        pushers.append(threading.current_thread().name)
        push(watch, replica)
    monkeypatch.setattr(replica_channel._Watch, "push_locked", recorded)
    replica = PartitionReplica("quiet", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0], [0])
        chan = ReplicaChannel(replica.channel_address())
        seen, cond = _watched(chan)
        for i in range(20):
            wait(chan.produce(build([b"%d" % i]), acks=1), 5)
        _until(cond, lambda: seen[-1] == (20, 20))
        assert pushers.count("channel-watch") == 1          # the first state only
        assert pushers.count("channel-conn") == 20
        replica.produce(build([b"elsewhere"]), 1, 1000)
        _until(cond, lambda: seen[-1] == (21, 21))
        assert pushers.count("channel-watch") == 2
        chan.close()
    finally:
        replica.stop()


def test_a_push_cut_at_its_size_bound_is_finished_by_the_watch_thread(tmp_path,
                                                                     monkeypatch):
    """When the reader's push stops at TAIL_PUSH_BYTES with batches left, the watch's
    thread pushes the rest, though nothing wakes it for them: the broker gets every batch."""
    monkeypatch.setattr(replica_channel, "TAIL_PUSH_BYTES", 1)          # a batch per push
    monkeypatch.setattr(replica_channel._Watch, "changed_by", lambda watch: None)
    replica = PartitionReplica("cut", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0], [0])
        chan = ReplicaChannel(replica.channel_address())
        events = []
        seen, cond = _watched(chan, events)
        for i in range(3):                  # appended elsewhere: no one is woken for them
            replica.produce(build([b"quiet-%d" % i]), 1, 1000)
        wait(chan.produce(build([b"last"]), acks=1), 5)
        _until(cond, lambda: events[-1].end == 4)
        assert [(ev.base, ev.end) for ev in events if ev.data] == [(0, 1), (1, 2), (2, 3),
                                                                   (3, 4)]
        chan.close()
    finally:
        replica.stop()


def test_a_watch_push_tells_the_broker_the_replica_was_demoted(tmp_path):
    """Becoming a follower changes the pushed leadership: the broker's cue that this link
    (and the tail it cached) no longer speaks for a leader."""
    replica = PartitionReplica("demote", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0], [0])
        chan = ReplicaChannel(replica.channel_address())
        events = []
        _, cond = _watched(chan, events)
        replica.become_follower(1, 1, [1], [0, 1], fetch=False)
        _until(cond, lambda: len({ev.leadership for ev in events}) == 2)
        chan.close()
    finally:
        replica.stop()


def test_a_position_moves_the_high_watermark_without_an_answer(tmp_path):
    """POSITION (a follower fetch the broker answered from its cache) records the
    follower's offset at the leader: the HW passes what both replicas have."""
    replica = PartitionReplica("pos", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0, 1], [0, 1])
        chan = ReplicaChannel(replica.channel_address())
        wait(chan.produce(build([b"a", b"b", b"c"]), acks=1), 5)
        assert replica.high_watermark == 0
        assert chan.position(1, 0, 3) is None
        deadline = time.monotonic() + 5
        while replica.high_watermark != 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert replica.high_watermark == 3
        chan.close()
    finally:
        replica.stop()


def test_apply_appends_as_the_follower_and_refuses_another_generation(tmp_path):
    """APPLY appends the leader's batches with their offsets at the follower and answers
    its new (LEO, HW); with a stale generation it appends nothing and answers None."""
    leader = PartitionReplica("apply", 0, 0, str(tmp_path / "l"), {})
    follower = PartitionReplica("apply", 0, 1, str(tmp_path / "f"), {})
    try:
        leader.become_leader(0, [0, 1], [0, 1])
        leader.produce(build([b"x", b"y"]), 1, 1000)
        state = follower.become_follower(0, 0, [0, 1], [0, 1], fetch=False)
        assert state["fetcher_alive"] is False
        chan = ReplicaChannel(follower.channel_address())
        batches = leader.log.read(0, 1 << 20)
        assert wait(chan.apply(state["generation"], 0, 1, 0, batches), 5) == (2, 1)
        assert follower.log.read(0, 1 << 20) == batches
        assert wait(chan.apply(state["generation"] + 1, 2, 2, 0, batches), 5) is None
        assert follower.log.log_end_offset == 2
        chan.close()
    finally:
        leader.stop()


def test_a_followers_truncation_calls_over_the_channel_answer_as_the_replica(tmp_path):
    """FOLLOWER: the follower's (LEO, HW), latest epoch and an epoch's end offset answer
    what the replica answers; truncate and truncate-fully cut its log; every call in a
    generation it moved on from answers None and changes nothing."""
    from actors.server.replica_channel import (F_EPOCH_END, F_LATEST_EPOCH, F_POSITION,
                                               F_TRUNCATE, F_TRUNCATE_FULLY)
    leader = PartitionReplica("trunc", 0, 0, str(tmp_path / "l"), {})
    follower = PartitionReplica("trunc", 0, 1, str(tmp_path / "f"), {})
    try:
        leader.become_leader(2, [0, 1], [0, 1])
        for i in range(3):
            leader.produce(build([b"a%d" % i, b"b%d" % i]), 1, 1000)
        gen = follower.become_follower(0, 2, [0, 1], [0, 1], fetch=False)["generation"]
        chan = ReplicaChannel(follower.channel_address())
        assert wait(chan.apply(gen, 0, 2, 0, leader.log.read(0, 1 << 20)), 5) == (6, 2)
        assert wait(chan.follower_call(F_POSITION, gen), 5) == (6, 2)
        assert wait(chan.follower_call(F_LATEST_EPOCH, gen), 5) == (2, 0)
        assert wait(chan.follower_call(F_EPOCH_END, gen, 2), 5) == \
            tuple(follower.epoch_end_offset(gen, 2))
        assert wait(chan.follower_call(F_TRUNCATE, gen, 4), 5) == (1, 0)
        assert follower.log.log_end_offset == 4
        for call, argument in ((F_POSITION, 0), (F_LATEST_EPOCH, 0), (F_EPOCH_END, 2),
                               (F_TRUNCATE, 0), (F_TRUNCATE_FULLY, 10)):
            assert wait(chan.follower_call(call, gen + 1, argument), 5) is None
        assert follower.log.log_end_offset == 4
        assert wait(chan.follower_call(F_TRUNCATE_FULLY, gen, 10), 5) == (1, 0)
        assert (follower.log.log_start_offset, follower.log.log_end_offset) == (10, 10)
        chan.close()
    finally:
        leader.stop()
        follower.stop()


def test_hw_moves_the_followers_high_watermark_without_an_answer(tmp_path):
    """HW (no answer) sets the follower's HW, never past its log end; with a stale
    generation it changes nothing, and the channel's next APPLY is answered as usual."""
    leader = PartitionReplica("hwop", 0, 0, str(tmp_path / "l"), {})
    follower = PartitionReplica("hwop", 0, 1, str(tmp_path / "f"), {})
    try:
        leader.become_leader(0, [0, 1], [0, 1])
        leader.produce(build([b"x", b"y"]), 1, 1000)
        state = follower.become_follower(0, 0, [0, 1], [0, 1], fetch=False)
        gen = state["generation"]
        chan = ReplicaChannel(follower.channel_address())
        assert wait(chan.apply(gen, 0, 0, 0, leader.log.read(0, 1 << 20)), 5) == (2, 0)
        assert chan.high_watermark(gen, 2, 1, 0) is None
        deadline = time.monotonic() + 5
        while follower.high_watermark != 1:
            assert time.monotonic() < deadline, "the HW never reached the follower"
            time.sleep(0.005)
        chan.high_watermark(gen, 2, 9, 0)            # beyond its log end: its LEO
        while follower.high_watermark == 1:
            assert time.monotonic() < deadline, "the second HW never reached the follower"
            time.sleep(0.005)
        assert follower.high_watermark == 2
        chan.high_watermark(gen + 1, 2, 0, 0)        # another generation: ignored
        # a refused APPLY, answered after it (one connection, in order), changes nothing
        assert wait(chan.apply(gen + 1, 2, 0, 0, b""), 5) is None
        assert follower.high_watermark == 2
        assert wait(chan.apply(gen, 2, 2, 0, b""), 5) == (2, 2)
        chan.close()
    finally:
        follower.stop()
        leader.stop()
        follower.stop()


def test_acks_all_waits_end_at_their_timeout_or_at_a_demotion_without_a_thread_each(tmp_path):
    """Fifty acks=all produces whose follower never fetches: no thread is parked for any
    of them; a 300 ms one answers REQUEST_TIMED_OUT about then (the acks thread expires
    it), the others NOT_LEADER_OR_FOLLOWER as soon as the replica is demoted."""
    replica = PartitionReplica("acks", 0, 0, str(tmp_path), {})
    try:
        replica.become_leader(0, [0, 1], [0, 1])
        chan = ReplicaChannel(replica.channel_address())
        threads_before = threading.active_count()
        started = time.monotonic()
        short = chan.produce(build([b"short"]), acks=-1, timeout_ms=300)
        waiting = [chan.produce(build([b"w%d" % i]), acks=-1, timeout_ms=60000)
                   for i in range(50)]
        with pytest.raises(RequestTimedOutError):
            wait(short, 10)
        assert 0.25 <= time.monotonic() - started < 5
        assert threading.active_count() <= threads_before + 2
        assert not any(f.done() for f in waiting)
        replica.become_follower(1, 1, [1], [0, 1], fetch=False)
        for f in waiting:
            with pytest.raises(NotLeaderForPartitionError):
                wait(f, 5)
        chan.close()
    finally:
        replica.stop()


PUSHES, PUSH_BYTES = 32, 1 << 20


def _pushy_replica():
    """A fake replica on an abstract socket that, after the WATCH, writes PUSHES pushes of
    PUSH_BYTES before it reads anything more (as a replica whose watch thread is blocked
    sending holds up its connection's reader); then answers the PRODUCE and records the
    POSITION reports until the channel closes. Returns (address, thread, positions,
    failures)."""
    import uuid
    address = f"\0rk-test-{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)
    positions, failed = [], []

    def replica():
        conn, _ = server.accept()
        server.close()
        try:
            def frame():
                head = conn.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return None
                return conn.recv(struct.unpack("<I", head)[0], socket.MSG_WAITALL)
            watch_id, op = struct.unpack_from("<IB", frame())
            assert op == replica_channel.WATCH
            head = replica_channel._WATCHED.pack(0, 0, 0, 0, 0, 0)
            body = b"\0" * PUSH_BYTES
            for _ in range(PUSHES):                     # read nothing meanwhile
                conn.sendall(replica_channel._RESP.pack(5 + len(head) + len(body), watch_id,
                                                        replica_channel.OK) + head + body)
            while (got := frame()) is not None:
                request_id, op = struct.unpack_from("<IB", got)
                if op == replica_channel.POSITION:
                    positions.append(replica_channel._POSITION.unpack_from(got, 5)[2])
                    continue
                assert op == replica_channel.PRODUCE
                answer = replica_channel._PRODUCED.pack(0, 0, -1, 0)
                conn.sendall(replica_channel._RESP.pack(5 + len(answer), request_id,
                                                        replica_channel.OK) + answer)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=replica, daemon=True)
    thread.start()
    return address, thread, positions, failed


def test_a_send_blocked_on_the_replica_never_stops_the_channel_reading_its_pushes():
    """While the fake replica pushes 32 MiB before it reads, the broker's 8 MiB produce
    blocks in its send, yet the channel keeps reading the pushes, so both ends move on and
    the produce is answered. (The channel once sent under the lock its reader takes for
    every answer: both ends then waited forever.)"""
    address, thread, _, failed = _pushy_replica()
    chan = ReplicaChannel(address)
    try:
        pushed = []
        wait(chan.watch(lambda ev: pushed.append(len(ev.data))), 5)
        result = wait(chan.produce(b"\0" * (8 << 20), acks=1), 30)
        assert result.base_offset == 0
        assert len(pushed) == PUSHES and failed == []
    finally:
        chan.close()
        thread.join(10)


def test_positions_reported_from_the_reader_thread_never_block_it():
    """A watch callback (the channel's reader thread) reports a follower position on every
    push while an 8 MiB produce blocks the socket: the reader never waits for the send
    (position queues what the socket does not take at once), the produce is answered, and
    the replica receives every report, in order."""
    address, thread, positions, failed = _pushy_replica()
    chan = ReplicaChannel(address)
    try:
        pushed = []

        def on_push(ev):
            pushed.append(len(ev.data))
            chan.position(1, 0, len(pushed))
        wait(chan.watch(on_push), 5)
        result = wait(chan.produce(b"\0" * (8 << 20), acks=1), 30)
        assert result.base_offset == 0 and len(pushed) == PUSHES
        deadline = time.monotonic() + 10
        while len(positions) < PUSHES and time.monotonic() < deadline:
            time.sleep(0.01)
        assert positions == list(range(1, PUSHES + 1)) and failed == []
    finally:
        chan.close()
        thread.join(10)


def test_a_channel_without_a_reader_thread_answers_through_result(tmp_path):
    """reader_thread=False (a fetcher's channel): APPLYs sent back to back are answered
    in order through ``result`` on the calling thread, errors raised as their classes;
    the channel starts no thread and refuses a watch."""
    leader = PartitionReplica("inline", 0, 0, str(tmp_path / "l"), {})
    follower = PartitionReplica("inline", 0, 1, str(tmp_path / "f"), {})
    try:
        leader.become_leader(0, [0, 1], [0, 1])
        leader.produce(build([b"x", b"y"]), 1, 1000)
        leader.produce(build([b"z"]), 1, 1000)
        state = follower.become_follower(0, 0, [0, 1], [0, 1], fetch=False)
        readers = sum(t.name == "channel-read" for t in threading.enumerate())
        chan = ReplicaChannel(follower.channel_address(), reader_thread=False)
        assert sum(t.name == "channel-read" for t in threading.enumerate()) == readers
        gen = state["generation"]
        first = chan.apply(gen, 0, 0, 0, leader.log.read(0, 1 << 20, max_offset=2))
        second = chan.apply(gen, 2, 3, 0, leader.log.read(2, 1 << 20))
        assert not first.done()                 # nobody reads until the owner asks
        assert chan.result(first, 5) == (2, 0)
        assert chan.result(second, 5) == (3, 3)
        with pytest.raises(IllegalArgumentError, match="acks"):
            chan.result(chan.produce(build([b"w"]), acks=2), 5)
        with pytest.raises(ValueError, match="no watch"):
            chan.watch(lambda _ev: None)
        assert chan.alive
        chan.close()
    finally:
        leader.stop()
        follower.stop()


def test_a_channel_without_a_reader_thread_fails_when_an_answer_is_late():
    """reader_thread=False: ``result`` gives up after its timeout with KafkaTimeoutError
    and the channel is failed (a later request fails at once, no stream left half read)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = "\0raykafka-test-silent-%d" % time.monotonic_ns()
    server.bind(address)
    server.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]),
                     daemon=True).start()
    chan = ReplicaChannel(address, reader_thread=False)
    try:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="no answer in 0.2s"):
            chan.result(chan.fetch(0), 0.2)
        assert 0.15 <= time.monotonic() - started < 5
        assert not chan.alive
        with pytest.raises(KafkaTimeoutError):
            chan.result(chan.fetch(0), 0.2)
    finally:
        chan.close()
        for c in accepted:
            c.close()
        server.close()


def test_the_answers_and_push_of_one_read_leave_the_replica_in_one_send(tmp_path,
                                                                         monkeypatch):
    """Two produces that arrive in one read are answered, together with the watch's push of
    both appends, by ONE send: the broker is woken once, not three times."""
    sends = []
    monkeypatch.setattr(replica_channel.hoptrace, "DIR", "counting")
    monkeypatch.setattr(replica_channel.hoptrace, "hop",
                        lambda label: sends.append(label) if label == "S>" else None)
    replica = PartitionReplica("corked", 0, 0, str(tmp_path), {})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        replica.become_leader(0, [0], [0])
        sock.connect(replica.channel_address())
        sock.settimeout(5)
        frames = bytearray()

        def read_until(done):
            got = []
            while not done(got):
                chunk = sock.recv(65536)
                assert chunk, "the replica closed the channel"
                frames.extend(chunk)
                while len(frames) >= 4 and len(frames) >= 4 + struct.unpack_from(
                        "<I", frames)[0]:
                    size = struct.unpack_from("<I", frames)[0]
                    got.append(bytes(frames[4:4 + size]))
                    del frames[:4 + size]
            return got

        sock.sendall(replica_channel._REQ.pack(5, 1, replica_channel.WATCH))
        read_until(lambda got: got)                          # the first state
        sends.clear()
        batch = build([b"a"])
        produce = [replica_channel._REQ.pack(5 + replica_channel._PRODUCE.size + len(batch),
                                             rid, replica_channel.PRODUCE)
                   + replica_channel._PRODUCE.pack(1, 1000) + batch for rid in (2, 3)]
        sock.sendall(b"".join(produce))                       # one write: read at once
        got = read_until(lambda got: {2, 3} <= {struct.unpack_from("<I", f)[0] for f in got}
                         and any(struct.unpack_from("<I", f)[0] == 1
                                 and replica_channel._WATCHED.unpack_from(f, 5)[5] == 2
                                 for f in got))
        assert [struct.unpack_from("<I", f)[0] for f in got] == [2, 3, 1]
        assert sends == ["S>"]
    finally:
        sock.close()
        replica.stop()
