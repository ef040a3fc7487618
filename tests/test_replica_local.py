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
