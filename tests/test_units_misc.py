"""Small pure unit tests of cluster-side helpers (fakes, no Ray, no ZooKeeper)."""

import json

import pytest

from actors.tools import perf
from actors.server.admin_manager import AdminManager
from actors.errors import ZooKeeperUnavailableError
from coordination.errors import ZkUnavailableError


class _DownStore:
    """A ZkStore whose every call finds ZooKeeper unreachable."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise ZkUnavailableError(f"{name}: connection loss")
        return fail


def test_admin_requests_during_a_zookeeper_outage_raise_the_public_typed_error():
    """Every admin request a broker answers (its AdminManager) turns coordination's
    ZkUnavailableError into actors.errors.ZooKeeperUnavailableError (retriable), naming the
    request."""
    admin = AdminManager(_DownStore())
    calls = [("create_topic", ("t", 1, 1, None)), ("delete_topic", ("t",)),
             ("list_topics", ()), ("topic_exists", ("t",)), ("topic_config", ("t",)),
             ("alter_topic_config", ("t", {"retention.ms": "1"})),
             ("elect_preferred_leaders", ([("t", 0)],))]
    for name, args in calls:
        with pytest.raises(ZooKeeperUnavailableError, match=name) as info:
            getattr(admin, name)(*args)
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
    from actors.server.replica import claim_partition_dir, read_partition_topic_id
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


def test_brokers_go_back_to_the_node_holding_their_data_and_spread_over_the_rest():
    """choose_broker_nodes: data held by one node pins its broker there; data seen from
    several nodes (shared disk) pins nothing; the others go to the least-loaded node."""
    from actors.server.nodes import choose_broker_nodes
    nodes = ["n1", "n2", "n3"]
    assert choose_broker_nodes([0, 1, 2], nodes, {}) == {0: "n1", 1: "n2", 2: "n3"}
    assert choose_broker_nodes([0, 1, 2], nodes, {2: ["n1"], 0: ["n3"]}) == \
        {0: "n3", 2: "n1", 1: "n2"}
    assert choose_broker_nodes([0, 1], nodes, {0: ["n1", "n2", "n3"]}) == {0: "n1", 1: "n2"}
    assert choose_broker_nodes([0, 1, 2, 3], ["a", "b"], {}) == {0: "a", 1: "b", 2: "a", 3: "b"}
    assert choose_broker_nodes([0], ["a"], {0: ["gone"]}) == {0: "a"}
    with pytest.raises(ValueError):
        choose_broker_nodes([0], [], {})


def test_meta_properties_is_written_once_and_refuses_another_cluster_or_broker(tmp_path):
    """check_meta_properties writes broker.id and cluster.id on a first start, accepts the
    same pair later, and raises InconsistentClusterIdError for another cluster or broker."""
    from actors.server.broker import check_meta_properties
    from actors.errors import InconsistentClusterIdError
    check_meta_properties(str(tmp_path), 2, "clusterAAAAAAAAAAAAAAA")
    text = (tmp_path / "meta.properties").read_text()
    assert "broker.id=2\n" in text and "cluster.id=clusterAAAAAAAAAAAAAAA\n" in text
    check_meta_properties(str(tmp_path), 2, "clusterAAAAAAAAAAAAAAA")
    with pytest.raises(InconsistentClusterIdError, match="clusterAAAAAAAAAAAAAAA"):
        check_meta_properties(str(tmp_path), 2, "clusterBBBBBBBBBBBBBBB")
    with pytest.raises(InconsistentClusterIdError, match="broker '2', not 3"):
        check_meta_properties(str(tmp_path), 3, "clusterAAAAAAAAAAAAAAA")
    assert (tmp_path / "meta.properties").read_text() == text


def test_cluster_yaml_is_a_ray_up_config_that_installs_raykafka_and_zookeeper():
    """cluster.yaml parses, uses Ray's local provider, runs scripts/install.sh on every node,
    starts ZooKeeper and the daemon on the head, and no command of it runs `ray stop`."""
    import os

    import yaml
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "cluster.yaml")) as f:
        conf = yaml.safe_load(f)
    assert conf["provider"]["type"] == "local"
    assert any("scripts/install.sh" in c for c in conf["setup_commands"])
    assert os.path.exists(os.path.join(root, "scripts", "install.sh"))
    head = conf["head_start_ray_commands"]
    assert any("ray start --head" in c for c in head)
    assert any("scripts/head_zookeeper.py start" in c for c in head)
    assert any("raykafka start --ray-address auto" in c for c in head)
    assert any("ray start --address" in c for c in conf["worker_start_ray_commands"])
    commands = [c for key, value in conf.items() if key.endswith("_commands")
                for c in value]
    assert not any("ray stop" in c for c in commands)


def test_metadata_forgets_a_cached_no_leader_answer_and_dropped_handles():
    """Metadata.leader raising LeaderNotAvailableError marks the snapshot stale, so the next
    call asks the brokers again; invalidate(topic) drops that topic's cached handles only."""
    import time

    from actors.errors import LeaderNotAvailableError
    from actors.client.metadata import Metadata
    md = Metadata("unit", [0])
    md._snapshot = {"topics": {"t": {0: {"leader": -1, "leader_epoch": 3}}}, "brokers": {}}
    md._fetched_at = time.monotonic()
    with pytest.raises(LeaderNotAvailableError):
        md.leader("t", 0)
    assert md._fetched_at == 0.0, "the next use refreshes"
    md._handles = {("t", 0, 1, 3): "old", ("u", 0, 1, 3): "other"}
    md.invalidate("t")
    assert md._handles == {("u", 0, 1, 3): "other"}
    md.invalidate()
    assert md._handles == {}


def test_ray_messages_go_to_stderr_once_redirected(capsys):
    """After raycompat.ray_messages_to_stderr, what Ray pushes to a driver (the raylet's
    warnings) is printed on stderr, not in the command's stdout data."""
    import ray._private.worker as worker

    from actors import raycompat
    original = worker.print_to_stdstream
    try:
        raycompat.ray_messages_to_stderr()
        worker.print_to_stdstream({"lines": ["raylet says hi"], "pid": "raylet",
                                   "is_err": False}, ignore_prefix=False)
        out, err = capsys.readouterr()
        assert "raylet says hi" not in out and "raylet says hi" in err
    finally:
        worker.print_to_stdstream = original


def test_a_ray_we_start_finds_this_interpreter_first_on_path(monkeypatch):
    """for_ray_we_start puts this interpreter's bin dir first on PATH (once), so that `ray
    job submit -- python ...` on a cluster started as .venv/bin/raykafka runs this venv's
    python, not the system's."""
    import os
    import sys

    from actors import _rayenv
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _rayenv.for_ray_we_start()
    _rayenv.for_ray_we_start()
    assert os.environ["PATH"] == os.pathsep.join([bin_dir, "/usr/bin", "/bin"])
