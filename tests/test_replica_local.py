"""PartitionReplica used in-process (a plain class, no Ray): what it answers a producer."""

from __future__ import annotations

from actors.server.replica import PartitionReplica
from storage.records import build, iter_headers


def test_produce_on_a_log_append_time_topic_returns_the_stored_timestamp(tmp_path):
    """A leader's ProduceResult.log_append_time_ms is the timestamp the log stamped into the
    batch (read back from the stored bytes), not a second reading of the clock."""
    replica = PartitionReplica("lat", 0, 0, str(tmp_path),
                               {"message.timestamp.type": "LogAppendTime"})
    try:
        replica.become_leader(0, [0], [0])
        ticks = iter(range(1_000_000, 2_000_000, 13))
        replica.log._clock = lambda: next(ticks)   # a clock that never reads the same twice
        for _ in range(3):
            result = replica.produce(build([b"a", b"b"]), 1, 1000)
            stored = replica.fetch(result.base_offset, 1 << 20).data
            headers = list(iter_headers(stored))
            assert result.log_append_time_ms == headers[0].max_timestamp
    finally:
        replica.stop()


def test_epochs_past_the_recovered_log_end_are_forgotten_at_open(tmp_path):
    """A leader-epoch-checkpoint naming an epoch that starts past the log end (the log lost
    its tail in a crash, the checkpoint did not) is cut at open: the replica can then lead
    a new epoch from its log end."""
    replica = PartitionReplica("cut", 0, 0, str(tmp_path), {})
    replica.become_leader(0, [0], [0])
    replica.produce(build([b"r%d" % i for i in range(5)]), 1, 1000)
    path = replica.path
    replica.stop()
    with open(f"{path}/leader-epoch-checkpoint", "w") as f:
        f.write("0\n2\n0 0\n1 10\n")      # epoch 1 began at 10, past the log end (5)
    replica = PartitionReplica("cut", 0, 0, str(tmp_path), {})
    try:
        assert replica.epoch_entries() == [(0, 0)]
        replica.become_leader(2, [0], [0])
        assert replica.produce(build([b"next"]), 1, 1000).base_offset == 5
        assert replica.epoch_entries() == [(0, 0), (2, 5)]
    finally:
        replica.stop()
