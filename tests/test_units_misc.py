"""Small pure unit tests of cluster-side helpers (fakes, no Ray, no ZooKeeper)."""

import json

import pytest

from actors import perf
from actors.broker import Broker
from actors.errors import ZooKeeperUnavailableError
from coordination.errors import ZkUnavailableError


class _DownStore:
    """A ZkStore whose every call finds ZooKeeper unreachable."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise ZkUnavailableError(f"{name}: connection loss")
        return fail


def test_admin_requests_during_a_zookeeper_outage_raise_the_public_typed_error():
    """Every admin request a broker answers turns coordination's ZkUnavailableError into
    actors.errors.ZooKeeperUnavailableError (retriable), naming the request."""
    broker = Broker.__new__(Broker)
    broker.store = _DownStore()
    broker.metadata = {}
    broker.namespace = "unit"
    calls = [("create_topic", ("t", 1, 1, None)), ("delete_topic", ("t",)),
             ("list_topics", ()), ("topic_exists", ("t",)), ("topic_config", ("t",)),
             ("alter_topic_config", ("t", {"retention.ms": "1"})),
             ("elect_preferred_leaders", ([("t", 0)],))]
    for name, args in calls:
        with pytest.raises(ZooKeeperUnavailableError, match=name) as info:
            getattr(broker, name)(*args)
        assert info.value.retriable


def test_perf_json_line_has_null_percentiles_without_samples(capsys):
    """A perf result without latency samples prints null percentiles: the last line is
    strict JSON (no NaN)."""
    p50, p99 = perf._percentiles([])
    perf.print_result({"tool": "perf consume", "records": 0, "elapsed_s": 0.0,
                       "records_per_s": 0, "MB_per_s": 0, "p50_ms": perf._ms(p50),
                       "p99_ms": perf._ms(p99), "latency": "per fetched batch"})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    parsed = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert parsed["p50_ms"] is None and parsed["p99_ms"] is None


def test_a_partition_dir_of_an_earlier_topic_incarnation_is_removed_before_use(tmp_path):
    """claim_partition_dir keeps data of the same topic id, claims a directory without
    partition.metadata, and removes one that names another topic id (a topic deleted while
    the broker was down and created again)."""
    from actors.replica import claim_partition_dir, read_partition_topic_id
    path = tmp_path / "t-0"
    path.mkdir()
    (path / "00000000000000000000.log").write_bytes(b"old")
    assert claim_partition_dir(str(path), "a1") is False
    assert read_partition_topic_id(str(path)) == "a1"
    assert (path / "00000000000000000000.log").exists(), "unlabelled data is adopted"
    assert claim_partition_dir(str(path), "a1") is False
    assert (path / "00000000000000000000.log").exists(), "same id: data kept"
    assert claim_partition_dir(str(path), "b2") is True
    assert not (path / "00000000000000000000.log").exists(), "another id: data removed"
    assert read_partition_topic_id(str(path)) == "b2"
    assert (path / "partition.metadata").read_text() == "version: 0\ntopic_id: b2\n"
