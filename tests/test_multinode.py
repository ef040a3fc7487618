"""Placement on a multi-node Ray: a head and two worker nodes started on this machine with
``ray.cluster_utils.Cluster`` (real raylets, all on 127.0.0.1), as ``ray up`` gives a job."""

from __future__ import annotations

import pytest

from actors import Cluster
from cluster_helpers import FAST_CONFIG, ray, unique_namespace
from storage.records import build


@pytest.fixture(scope="module")
def ray_nodes():
    """(head node id, [worker node ids]) of a three-node Ray this test process is attached to."""
    from ray.cluster_utils import Cluster as RayCluster
    if ray.is_initialized():
        ray.shutdown()
    nodes = RayCluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": 256 << 20})
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1",
                           object_store_memory=256 << 20)
        ray.init(address=nodes.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 namespace="raykafka-multinode")
        nodes.wait_for_nodes()
        alive = [n for n in ray.nodes() if n["Alive"]]
        head = [n["NodeID"] for n in alive if "node:__internal_head__" in n["Resources"]]
        workers = sorted(n["NodeID"] for n in alive if n["NodeID"] not in head)
        assert len(head) == 1 and len(workers) == 2
        yield head[0], workers
    finally:
        ray.shutdown()
        nodes.shutdown()


def test_brokers_go_one_per_worker_node_with_their_replicas_and_controllers(ray_nodes, tmp_path):
    """Cluster.start on a multi-node Ray puts one broker on each worker node (none on the
    head); each broker's replicas and controller run on its node; a restarted broker goes
    back to its recorded node; records round-trip."""
    head, workers = ray_nodes
    cluster = Cluster.start(num_brokers=2, data_dir=str(tmp_path / "data"),
                            namespace=unique_namespace("mn"), config=FAST_CONFIG)
    try:
        placed = {b: ray.get(cluster.broker(b).node_id.remote()) for b in (0, 1)}
        assert sorted(placed.values()) == workers, "one broker per worker, none on the head"
        assert placed == {b: cluster.broker_node(b) for b in (0, 1)}
        assert Cluster.connect(cluster.namespace).broker_node(0) == placed[0]
        cluster.admin().create_topic("spread", partitions=4)
        for b in (0, 1):
            replica_nodes = ray.get(cluster.broker(b).replica_nodes.remote())
            assert replica_nodes and set(replica_nodes.values()) == {placed[b]}
            controller = ray.get_actor(f"controller-{b}", namespace=cluster.namespace)
            assert ray.get(controller.status.remote())["broker_id"] == b
        for p in range(4):
            leader = cluster.metadata.leader("spread", p)
            ray.get(leader.handle.produce.remote(build([b"v%d" % p]), -1, 5000))
        cluster.kill_broker(1)
        cluster.start_broker(1)
        assert ray.get(cluster.broker(1).node_id.remote()) == placed[1]
        # broker 1's partitions (RF 1) are offline until it is back and leads them again
        cluster.metadata.wait_for_leaders("spread", timeout_s=60)
        consumer = cluster.simple_consumer()
        for p in range(4):
            assert [r.value for r in consumer.fetch("spread", p, 0)] == [b"v%d" % p]
    finally:
        cluster.shutdown()


def test_pause_signals_a_broker_on_another_node_through_a_task_pinned_there(ray_nodes,
                                                                            tmp_path):
    """The driver is on the head node and the brokers on workers: pause_broker stops the
    broker's processes (state 'T') through a task on the broker's node, resume_broker
    continues them, and the broker answers again."""
    import psutil
    head, workers = ray_nodes
    cluster = Cluster.start(num_brokers=2, data_dir=str(tmp_path / "data"),
                            namespace=unique_namespace("mnp"),
                            config={"zookeeper.session.timeout.ms": 20000})
    try:
        assert ray.get_runtime_context().get_node_id() == head
        procs = cluster.pause_broker(0)
        try:
            assert {p["node_id"] for p in procs} == {cluster.broker_node(0)} != {head}
            assert all(psutil.Process(p["pid"]).status() == psutil.STATUS_STOPPED
                       for p in procs)
        finally:
            cluster.resume_broker(0)
        assert not any(psutil.Process(p["pid"]).status() == psutil.STATUS_STOPPED
                       for p in procs)
        assert ray.get(cluster.broker(0).ping.remote(), timeout=30) == 0
    finally:
        cluster.shutdown()
