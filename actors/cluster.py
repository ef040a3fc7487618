"""Cluster: start or attach to a raykafka cluster (Ray + ZooKeeper + brokers).

``Cluster.start`` (the embedded default) starts or reuses a local Ray, starts an embedded
ZooKeeper unless ``zk`` names one, and creates the Broker actors (each with
``<data_dir>/broker-<id>``, each pinned to a node chosen by ``actors.server.nodes``: on one machine
all on it, on a multi-node Ray one per worker, a broker whose data a node holds back on that
node); it returns when a controller is active and every broker is registered. A small named
``ClusterInfo`` actor records what a later ``Cluster.connect(namespace)`` needs (from any
driver, task or actor on the Ray cluster).

Namespaces keep clusters apart: Ray actor names live in the Ray namespace ``namespace``, the
ZooKeeper tree under the chroot ``/raykafka-<namespace>`` (or the one ``zk`` names: Kafka's
``host:port/chroot``), data under its own ``data_dir``. ``cluster.zk_hosts`` is that full
connect string, chroot included.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

from coordination.zk_layout import split_connect, zookeeper_connect

from . import raycompat
from .errors import (ClusterNotFoundError, InvalidConfigurationError, KafkaError,
                     KafkaTimeoutError)
from .protocol import CLUSTER_INFO_ACTOR, broker_actor_name
from .server.nodes import place_brokers

ray = raycompat.ray

START_TIMEOUT_S = 120.0
INFO_ACTOR = CLUSTER_INFO_ACTOR

DEFAULT_BROKER_CONFIG = {
    "default.replication.factor": "1",
    "num.partitions": "1",
    "min.insync.replicas": "1",
    "replica.lag.time.max.ms": "30000",
    "unclean.leader.election.enable": "false",
    "zookeeper.session.timeout.ms": "6000",
}


class ClusterInfo:
    """What ``Cluster.connect`` needs; a named actor in the cluster's namespace."""

    def __init__(self, info: dict):
        self.info = dict(info)

    def get(self) -> dict:
        return dict(self.info)

    def update(self, **changes) -> None:
        self.info.update(changes)


def _validate_config(config) -> dict:
    if config is None:
        return dict(DEFAULT_BROKER_CONFIG)
    if not isinstance(config, dict):
        raise InvalidConfigurationError(f"config must be a dict of Kafka settings, got "
                                        f"{type(config).__name__}")
    out = dict(DEFAULT_BROKER_CONFIG)
    for key, value in config.items():
        if not isinstance(key, str):
            raise InvalidConfigurationError(f"config keys are Kafka's dotted names, got {key!r}")
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    for key in ("default.replication.factor", "num.partitions", "min.insync.replicas",
                "replica.lag.time.max.ms", "zookeeper.session.timeout.ms"):
        try:
            if int(out[key]) < 1:
                raise ValueError
        except ValueError:
            raise InvalidConfigurationError(f"{key} must be a positive integer, got "
                                            f"{out[key]!r}") from None
    return out


class Cluster:
    """A handle on a running raykafka cluster. See the module docstring."""

    def __init__(self, info: dict, *, owned: bool = False, zk_server=None, info_actor=None):
        self.namespace: str = info["namespace"]
        self.zk_hosts: str = info["zk_hosts"]
        self.data_dir: str = info["data_dir"]
        self.config: dict = info["config"]
        self._info = info
        self._owned = owned
        self._zk_server = zk_server
        self._info_actor = info_actor
        self._metadata = None
        self._closed = False
        # the owner must hold its actors' handles: Ray collects a non-detached actor, named or
        # not, once no handle to it is left
        self._brokers: dict[int, object] = {}

    # -- starting and attaching -------------------------------------------------------------------
    @classmethod
    def start(cls, num_brokers: int = 3, data_dir: str | None = None, zk: str | None = None,
              namespace: str = "raykafka", config: dict | None = None) -> "Cluster":
        if not isinstance(num_brokers, int) or isinstance(num_brokers, bool) or num_brokers < 1:
            raise InvalidConfigurationError(f"num_brokers must be an integer >= 1, got "
                                            f"{num_brokers!r}")
        if not isinstance(namespace, str) or not namespace or \
                not all(c.isalnum() or c in "-_." for c in namespace):
            raise InvalidConfigurationError(f"namespace must be letters, digits, '-', '_' or "
                                            f"'.', got {namespace!r}")
        broker_config = _validate_config(config)
        if zk is not None:
            try:
                split_connect(zk)
            except ValueError as exc:
                raise InvalidConfigurationError(str(exc)) from None
        raycompat.init_local(namespace)
        try:
            ray.get_actor(INFO_ACTOR, namespace=namespace)
            raise KafkaError(f"a raykafka cluster already runs in namespace {namespace!r}; "
                             f"use Cluster.connect({namespace!r}) or another namespace")
        except ValueError:
            pass
        own_dir = data_dir is None
        data_dir = os.path.abspath(data_dir or tempfile.mkdtemp(prefix=f"raykafka-{namespace}-"))
        os.makedirs(data_dir, exist_ok=True)
        zk_server = None
        if zk is None:
            from coordination.zk_server import EmbeddedZooKeeper
            zk_server = EmbeddedZooKeeper(os.path.join(data_dir, "zookeeper")).start()
            zk = zk_server.hosts
        # Kafka's zookeeper.connect: servers and chroot, what every broker, tool and
        # KazooClient(hosts=cluster.zk_hosts) uses
        info = {"namespace": namespace, "zk_hosts": zookeeper_connect(zk, namespace),
                "data_dir": data_dir,
                "config": broker_config, "broker_ids": list(range(num_brokers)),
                "own_data_dir": own_dir, "embedded_zk": zk_server is not None}
        info_actor = ray.remote(ClusterInfo).options(
            name=INFO_ACTOR, namespace=namespace, num_cpus=0).remote(info)
        cluster = cls(info, owned=True, zk_server=zk_server, info_actor=info_actor)
        atexit.register(cluster._atexit)
        try:
            placement = place_brokers(list(range(num_brokers)), data_dir)
            cluster._set_broker_nodes(placement)
            handles = [cluster._create_broker(b) for b in range(num_brokers)]
            # A broker whose data dir was used before waits (inside start) for its previous
            # incarnation's registration to expire instead of failing.
            session_s = int(broker_config["zookeeper.session.timeout.ms"]) / 1000
            ray.get([h.start.remote() for h in handles],
                    timeout=START_TIMEOUT_S + session_s * 3 + 10)
            cluster.wait_ready(timeout_s=START_TIMEOUT_S)
        except BaseException:
            cluster.shutdown()
            raise
        return cluster

    @classmethod
    def connect(cls, namespace: str = "raykafka") -> "Cluster":
        raycompat.init_attach(namespace)
        try:
            info_actor = ray.get_actor(INFO_ACTOR, namespace=namespace)
        except ValueError:
            raise ClusterNotFoundError(
                f"no raykafka cluster runs in namespace {namespace!r} (start one with "
                f"`raykafka start` or Cluster.start)") from None
        info = ray.get(info_actor.get.remote(), timeout=30)
        return cls(info, owned=False, info_actor=info_actor)

    def _conf(self) -> dict:
        return {"namespace": self.namespace, "zk_hosts": self.zk_hosts,
                "data_dir": self.data_dir, "config": self.config,
                "zk_session_timeout_s": int(self.config["zookeeper.session.timeout.ms"]) / 1000}

    def _set_broker_nodes(self, placement: dict[int, str]) -> None:
        nodes = {**self._info.get("broker_nodes", {}),
                 **{str(b): n for b, n in placement.items()}}
        self._info["broker_nodes"] = nodes
        if self._info_actor is not None:
            ray.get(self._info_actor.update.remote(broker_nodes=nodes), timeout=30)

    def broker_node(self, broker_id: int) -> str | None:
        """The Ray node id broker ``broker_id`` is pinned to."""
        return self._info.get("broker_nodes", {}).get(str(broker_id))

    def _create_broker(self, broker_id: int):
        from .server.broker import Broker
        node = self.broker_node(broker_id)
        handle = ray.remote(Broker).options(
            name=broker_actor_name(broker_id), namespace=self.namespace, num_cpus=0,
            max_concurrency=32,
            scheduling_strategy=raycompat.on_node(node) if node else raycompat.this_node(),
        ).remote(broker_id, self._conf())
        self._brokers[broker_id] = handle
        return handle

    def wait_ready(self, *, timeout_s: float = 60.0) -> None:
        """Until a controller is active and its metadata lists every live broker."""
        deadline = time.monotonic() + timeout_s
        want = set(self.broker_ids())
        while True:
            try:
                snap = self.metadata.refresh()
                if snap.get("controller_epoch", 0) > 0 and set(snap["brokers"]) >= want:
                    return
            except KafkaError:
                pass
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"cluster {self.namespace!r} not ready after "
                                        f"{timeout_s}s")
            time.sleep(0.1)

    # -- facts ---------------------------------------------------------------------------------------
    @property
    def metadata(self):
        if self._metadata is None:
            from .client.metadata import Metadata
            self._metadata = Metadata(self.namespace, self.broker_ids())
        return self._metadata

    def broker_ids(self) -> list[int]:
        if self._info_actor is not None:
            try:
                self._info = ray.get(self._info_actor.get.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - fall back to what we knew
                pass
        return list(self._info["broker_ids"])

    def broker(self, broker_id: int):
        return ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)

    def controller_id(self) -> int:
        return self.metadata.refresh().get("controller_id", -1)

    # -- clients ---------------------------------------------------------------------------------------
    def admin(self):
        from .client.admin import Admin
        return Admin(self)

    def producer(self, **config):
        from .client.producer import Producer
        return Producer(self.metadata, **config)

    def simple_consumer(self, **config):
        from .client.simple_consumer import SimpleConsumer
        return SimpleConsumer(self.metadata, **config)

    def consumer(self, *topics, **config):
        from .client.consumer import Consumer
        return Consumer(self, *topics, **config)

    # -- faults and restarts ---------------------------------------------------------------------------
    def kill_broker(self, broker_id: int) -> None:
        """Kill the broker actor abruptly: its replicas and controller die with it, its
        ZooKeeper session is not closed (it expires after the session timeout)."""
        handle = self.broker(broker_id)
        ray.kill(handle, no_restart=True)
        self._brokers.pop(broker_id, None)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)
            except ValueError:
                return
            time.sleep(0.05)

    def start_broker(self, broker_id: int) -> None:
        """Start broker ``broker_id`` again on its old data dir (waiting out the session of
        a killed predecessor)."""
        if broker_id not in self._info["broker_ids"] and self._info_actor is not None:
            ids = sorted(set(self._info["broker_ids"]) | {broker_id})
            ray.get(self._info_actor.update.remote(broker_ids=ids), timeout=30)
            self._info["broker_ids"] = ids
        session_s = int(self.config["zookeeper.session.timeout.ms"]) / 1000
        node = self.broker_node(broker_id)
        if node is None or node not in {n["NodeID"] for n in ray.nodes() if n.get("Alive")}:
            self._set_broker_nodes(place_brokers([broker_id], self.data_dir))
        deadline = time.monotonic() + 30
        while True:
            try:
                handle = self._create_broker(broker_id)
                break
            except ValueError:  # the old actor's name is not released yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ray.get(handle.start.remote(wait_for_stale_s=session_s * 3 + 10),
                timeout=session_s * 3 + 60)
        self.metadata.invalidate()

    # -- shutting down ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the brokers cleanly, then ZooKeeper (when embedded) and the info actor."""
        if self._closed:
            return
        self._closed = True
        handles = []
        for bid in self._info.get("broker_ids", []):
            try:
                handles.append(self.broker(bid))
            except ValueError:
                pass
        refs = [h.shutdown.remote() for h in handles]
        try:
            ray.get(refs, timeout=60)
        except Exception:  # noqa: BLE001 - kill whatever did not stop
            pass
        for h in handles:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if self._info_actor is not None:
            try:
                ray.kill(self._info_actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self._brokers.clear()
        if self._zk_server is not None:
            self._zk_server.stop()
        if self._owned and self._info.get("own_data_dir"):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _atexit(self) -> None:
        if not self._closed and self._zk_server is not None:
            try:
                self._zk_server.stop()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"Cluster(namespace={self.namespace!r}, zk_hosts={self.zk_hosts!r}, "
                f"data_dir={self.data_dir!r}, brokers={self._info.get('broker_ids')})")
