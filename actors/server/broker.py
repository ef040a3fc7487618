"""The Broker actor: one per broker id, pinned to a node, owning ``<data_dir>/broker-<id>``.

It holds the broker's ZooKeeper session and its ephemeral ``/brokers/ids/<id>``
registration, creates its Controller candidate and one PartitionReplica actor per hosted
partition (all owned by the broker, so they die with it, as the threads of a Kafka broker
process would), applies the controller's LeaderAndIsr / StopReplica / UpdateMetadata
requests (rejecting any whose controller epoch is older than the newest seen), keeps the
metadata cache clients read, and answers admin requests by writing ZooKeeper.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
import time

import ray

from coordination import zk_layout as L
from coordination.errors import BrokerIdInUseError as ZkBrokerIdInUseError
from coordination.errors import (CoordinationError, NodeAlreadyExistsError, NodeMissingError,
                                 PlacementError, ZkUnavailableError)
from coordination.placement import assign_replicas_to_brokers
from coordination.registry import BrokerRegistration
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore
from storage import LogConfig
from storage.checkpoint import write_atomic

from .. import raycompat
from ..protocol import (broker_actor_name, controller_actor_name, replica_actor_name,
                        validate_topic_name)
from .controller import Controller
from ..errors import (BrokerIdInUseError, InconsistentClusterIdError, InvalidPartitionsError,
                     InvalidReplicationFactorError, InvalidTopicError, KafkaTimeoutError,
                     StaleControllerEpochError, TopicAlreadyExistsError,
                     UnknownTopicOrPartitionError, ZooKeeperUnavailableError)
from .replica import PartitionReplica, partition_dir, read_partition_topic_id

log = logging.getLogger(__name__)

# Broker-level settings that are not topic (log) settings.
_BROKER_ONLY = {"default.replication.factor", "num.partitions", "min.insync.replicas",
                "replica.lag.time.max.ms", "unclean.leader.election.enable",
                "zookeeper.session.timeout.ms", "offsets.topic.num.partitions",
                "offsets.topic.replication.factor", "offsets.retention.minutes",
                "auto.create.topics.enable"}
_LOG_PREFIXED = {"log.segment.bytes": "segment.bytes", "log.retention.ms": "retention.ms",
                 "log.retention.bytes": "retention.bytes", "log.cleanup.policy": "cleanup.policy",
                 "log.flush.interval.messages": "flush.messages",
                 "log.flush.interval.ms": "flush.ms", "log.roll.ms": "segment.ms",
                 "message.max.bytes": "max.message.bytes"}


def topic_log_defaults(broker_config: dict) -> dict:
    """The broker's log.* defaults as topic config names."""
    out = {}
    for key, value in broker_config.items():
        if key in _LOG_PREFIXED:
            out[_LOG_PREFIXED[key]] = value
    return out


def check_meta_properties(broker_dir: str, broker_id: int, cluster_id: str) -> None:
    """Kafka's meta.properties: written on a broker's first start, checked on every later
    one. A data dir of another cluster (a new ZooKeeper, another namespace) or of another
    broker id raises InconsistentClusterIdError instead of serving foreign data."""
    path = os.path.join(broker_dir, "meta.properties")
    try:
        with open(path) as f:
            props = dict(line.strip().split("=", 1) for line in f
                         if "=" in line and not line.startswith("#"))
    except FileNotFoundError:
        props = None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InconsistentClusterIdError(f"{path} is unreadable: {exc}") from None
    if props is not None:
        if props.get("cluster.id") != cluster_id:
            raise InconsistentClusterIdError(
                f"{broker_dir} belongs to cluster {props.get('cluster.id')!r}, but ZooKeeper "
                f"holds cluster {cluster_id!r}: refusing to start broker {broker_id} on it "
                f"(use another data dir, or the ZooKeeper that cluster used)")
        if props.get("broker.id") != str(broker_id):
            raise InconsistentClusterIdError(
                f"{broker_dir} belongs to broker {props.get('broker.id')!r}, not {broker_id}")
        return
    write_atomic(path, f"#raykafka broker metadata\nversion=0\nbroker.id={broker_id}\n"
                       f"cluster.id={cluster_id}\n")


def _zk_errors(method):
    """Admin requests answer a ZooKeeper outage with the public ZooKeeperUnavailableError
    (retriable), not coordination's internal error."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(
                f"{method.__name__}: ZooKeeper is unavailable: {exc}") from None
    return wrapper


class Broker:
    """One broker (see the module docstring). A threaded actor: requests run concurrently."""

    def __init__(self, broker_id: int, conf: dict):
        self.broker_id = broker_id
        self.conf = conf
        self.namespace = conf["namespace"]
        self.config = dict(conf.get("config") or {})
        self.data_dir = os.path.join(conf["data_dir"], f"broker-{broker_id}")
        self.ran_here_before = os.path.isdir(self.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock = threading.RLock()
        self.replicas: dict[tuple[str, int], object] = {}
        self.replica_configs: dict[tuple[str, int], tuple[dict, int]] = {}
        self.replica_ids: dict[tuple[str, int], str | None] = {}   # the topic id each serves
        self.max_controller_epoch = 0
        self.metadata: dict = {"topics": {}, "brokers": {}, "controller_id": -1,
                               "controller_epoch": 0}
        self.zk = None
        self.store = None
        self.registration = None
        self.controller = None
        self.started = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, wait_for_stale_s: float | None = None) -> dict:
        """Connect to ZooKeeper, check meta.properties, register (waiting up to
        ``wait_for_stale_s`` for the registration of a previous incarnation to expire: by
        default three session timeouts when this data dir was used before, else none), start
        the controller candidate."""
        session_s = float(self.config.get("zookeeper.session.timeout.ms", 6000)) / 1000
        if wait_for_stale_s is None:
            wait_for_stale_s = session_s * 3 + 10 if self.ran_here_before else 0.0
        settings = ZkSettings(hosts=self.conf["zk_hosts"], namespace=self.namespace,
                              session_timeout_s=session_s)
        try:
            self.zk = connect(settings)
            self.store = ZkStore(self.zk)
            self.store.ensure_persistent_paths()
            self.cluster_id = self.store.get_or_create_cluster_id()
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(str(exc)) from None
        try:
            check_meta_properties(self.data_dir, self.broker_id, self.cluster_id)
        except InconsistentClusterIdError:
            self.zk.close()
            raise
        host = "127.0.0.1"
        try:
            host = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - outside a Ray worker
            host = socket.gethostbyname(socket.gethostname())
        info = L.BrokerInfo(broker_id=self.broker_id, host=host, port=0,
                            rack=self.config.get("broker.rack"),
                            endpoints=(f"RAY://{host}/{self.namespace}/{broker_actor_name(self.broker_id)}",))
        deadline = time.monotonic() + wait_for_stale_s
        while True:
            self.registration = BrokerRegistration(self.zk, info)
            try:
                self.registration.start(timeout_s=10.0)
                break
            except ZkBrokerIdInUseError as exc:
                if time.monotonic() >= deadline:
                    self.zk.close()
                    raise BrokerIdInUseError(
                        f"broker id {self.broker_id} is already registered in ZooKeeper by "
                        f"another live broker ({exc})") from None
                time.sleep(0.2)
        self._remove_stale_partition_dirs()
        self.controller = self._start_controller()
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise_controller, daemon=True,
                                            name=f"broker-{self.broker_id}-supervisor")
        self._supervisor.start()
        self.started = True
        return {"broker_id": self.broker_id, "data_dir": self.data_dir, "host": host,
                "cluster_id": self.cluster_id}

    def _remove_stale_partition_dirs(self) -> None:
        """Directories of topics deleted while this broker was down go now: those of topics
        that no longer exist, and those whose partition.metadata names an earlier
        incarnation of a topic that was deleted and created again meanwhile."""
        dirs = [(name, m.group(1)) for name in os.listdir(self.data_dir)
                if (m := re.match(r"^(.+)-(\d+)$", name))]
        try:
            existing = set(self.store.topics())
            current = {}                     # topic id of each topic that has a dir here
            for topic in {t for _, t in dirs} & existing:
                try:
                    current[topic] = self.store.get_topic(topic)[2]
                except NodeMissingError:
                    pass                     # deleted meanwhile: its dirs are stale
        except CoordinationError:
            return
        for name, topic in dirs:
            path = os.path.join(self.data_dir, name)
            if topic not in current:
                stale = True
            else:
                found = read_partition_topic_id(path)
                stale = found is not None and found != current[topic]
            if stale:
                log.info("broker %d: removing %s (its topic was deleted)", self.broker_id, path)
                shutil.rmtree(path, ignore_errors=True)

    def _start_controller(self):
        deadline = time.monotonic() + 30
        while True:
            try:
                return ray.remote(Controller).options(
                    name=controller_actor_name(self.broker_id), namespace=self.namespace, num_cpus=0,
                    max_concurrency=4, scheduling_strategy=raycompat.this_node(),
                ).remote(self.broker_id, self.conf)
            except ValueError:  # the dead predecessor's name is not released yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _supervise_controller(self) -> None:
        """A broker always runs a controller candidate: if the Controller actor dies alone,
        start a new one (the old one's session expires and the election moves on)."""
        while not self._stopping.wait(1.0):
            try:
                ray.get(self.controller.status.remote(), timeout=30)
            except ray.exceptions.GetTimeoutError:
                continue  # slow, not dead
            except ray.exceptions.RayActorError:
                if self._stopping.is_set():
                    return
                log.warning("broker %d: controller actor died; starting a new candidate",
                            self.broker_id)
                try:
                    self.controller = self._start_controller()
                except Exception:  # noqa: BLE001 - try again on the next round
                    log.exception("broker %d: restarting the controller failed",
                                  self.broker_id)
            except Exception:  # noqa: BLE001 - keep supervising
                log.exception("broker %d: controller supervision", self.broker_id)

    def controller_handle(self):
        return self.controller

    def ping(self) -> int:
        return self.broker_id

    def node_id(self) -> str:
        """The Ray node this broker (and its data) is on."""
        return ray.get_runtime_context().get_node_id()

    def replica_nodes(self) -> dict[str, str]:
        """``"<topic>-<p>"`` -> the Ray node each hosted replica actor runs on."""
        with self._lock:
            items = list(self.replicas.items())
        nodes = ray.get([h.node_id.remote() for _, h in items], timeout=60)
        return {f"{t}-{p}": n for ((t, p), _), n in zip(items, nodes)}

    def shutdown(self) -> None:
        """A clean stop: controller role handed over, logs closed, registration removed."""
        if getattr(self, "_stopping", None) is not None:
            self._stopping.set()
        if self.controller is not None:
            try:
                ray.get(self.controller.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        with self._lock:
            for handle in self.replicas.values():
                try:
                    ray.get(handle.stop.remote(False), timeout=30)
                except Exception:  # noqa: BLE001
                    pass
            self.replicas.clear()
        if self.registration is not None:
            self.registration.close()
        if self.zk is not None:
            self.zk.close()

    def controller_status(self) -> dict | None:
        if self.controller is None:
            return None
        return ray.get(self.controller.status.remote(), timeout=10)

    def registered(self) -> bool:
        return bool(self.registration and self.registration.registered)

    def session_id(self) -> int | None:
        return self.zk.session_id if self.zk else None

    def session_password(self) -> bytes | None:
        """For fault tests that expire this broker's session with a second client."""
        return self.zk.kazoo.client_id[1] if self.zk and self.zk.kazoo.client_id else None

    # -- controller requests -------------------------------------------------------------------
    def _fence(self, controller_epoch: int) -> None:
        if controller_epoch < self.max_controller_epoch:
            raise StaleControllerEpochError(
                f"broker {self.broker_id}: controller epoch {controller_epoch} is older than "
                f"{self.max_controller_epoch}")
        self.max_controller_epoch = controller_epoch

    def leader_and_isr(self, controller_epoch: int, partitions: list[dict]) -> list[dict]:
        with self._lock:
            self._fence(controller_epoch)
        # start every missing replica first, then wait for all: actors start in parallel
        handles = [self._replica(p["topic"], p["partition"], p.get("config") or {},
                                 p.get("topic_id"))
                   for p in partitions]
        ray.get([h.ready.remote() for h in handles], timeout=120)
        refs = []
        for p, handle in zip(partitions, handles):
            if p["leader"] == self.broker_id:
                refs.append(handle.become_leader.remote(p["leader_epoch"], p["isr"],
                                                        p["replicas"]))
            else:
                refs.append(handle.become_follower.remote(p["leader"], p["leader_epoch"],
                                                          p["isr"], p["replicas"]))
        return ray.get(refs, timeout=60)

    def _replica(self, topic: str, partition: int, topic_config: dict,
                 topic_id: str | None = None):
        """The replica actor of (topic, partition), created (not awaited) when missing; a
        changed topic config (min.insync.replicas included) is applied to an existing one in
        place. A replica of an earlier topic of the same name (another topic id) is stopped
        with its data first."""
        log_config = {**topic_log_defaults(self.config), **topic_config}
        min_isr = int(topic_config.get("min.insync.replicas",
                                       self.config.get("min.insync.replicas", 1)))
        log_config.pop("min.insync.replicas", None)
        wanted = (log_config, min_isr)
        key = (topic, partition)
        with self._lock:
            handle = self.replicas.get(key)
            if handle is not None and topic_id is not None \
                    and self.replica_ids.get(key) not in (None, topic_id):
                log.warning("broker %d: %s-%d belongs to an earlier topic incarnation (id %s, "
                            "now %s): removing it", self.broker_id, topic, partition,
                            self.replica_ids.get(key), topic_id)
                self._stop_replica(topic, partition, self.replicas.pop(key), delete=True)
                handle = None
            if handle is not None:
                if self.replica_configs.get(key) != wanted:
                    ray.get(handle.update_config.remote(log_config, min_isr), timeout=60)
                    self.replica_configs[key] = wanted
                return handle
            handle = ray.remote(PartitionReplica).options(
                name=replica_actor_name(topic, partition, self.broker_id),
                namespace=self.namespace, num_cpus=0, max_concurrency=8,
                scheduling_strategy=raycompat.this_node(),
            ).remote(topic, partition, self.broker_id, self.data_dir, log_config, min_isr,
                     topic_id)
            self.replicas[key] = handle
            self.replica_configs[key] = wanted
            self.replica_ids[key] = topic_id
            return handle

    def _stop_replica(self, topic: str, partition: int, handle, delete: bool) -> None:
        if handle is not None:
            try:
                ray.get(handle.stop.remote(delete), timeout=30)
            except Exception:  # noqa: BLE001 - a dead replica: just remove its data
                pass
            ray.kill(handle, no_restart=True)
            self._await_name_released(replica_actor_name(topic, partition, self.broker_id))
        if delete:
            shutil.rmtree(partition_dir(self.data_dir, topic, partition), ignore_errors=True)

    def _await_name_released(self, name: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                return
            time.sleep(0.05)

    def stop_replicas(self, controller_epoch: int, partitions: list, delete: bool) -> None:
        with self._lock:
            self._fence(controller_epoch)
            handles = []
            for tp in partitions:
                key = tuple(tp)
                handles.append((key, self.replicas.pop(key, None)))
                self.replica_configs.pop(key, None)
                self.replica_ids.pop(key, None)
        for (topic, partition), handle in handles:
            self._stop_replica(topic, partition, handle, delete)

    def update_metadata(self, controller_epoch: int, metadata: dict) -> None:
        with self._lock:
            self._fence(controller_epoch)
            self.metadata = metadata

    def get_metadata(self) -> dict:
        return self.metadata

    # -- admin requests (written to ZooKeeper; the controller acts on them) ----------------------
    @_zk_errors
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict | None) -> dict:
        validate_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise InvalidPartitionsError(f"partitions must be an integer >= 1, got {partitions!r}")
        if not isinstance(replication_factor, int) or isinstance(replication_factor, bool) \
                or replication_factor < 1:
            raise InvalidReplicationFactorError(
                f"replication factor must be an integer >= 1, got {replication_factor!r}")
        config = {str(k): str(v) for k, v in (config or {}).items()}
        topic_props = {k: v for k, v in config.items() if k != "min.insync.replicas"}
        LogConfig.from_properties(topic_props)  # InvalidConfigurationError for bad values
        existing = self.store.topics()
        if name in existing:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        collide = name.replace(".", "_")
        for other in existing:
            if other.replace(".", "_") == collide:
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {other!r} ('.' and '_' "
                    f"map to the same metric names in Kafka)")
        brokers = self.store.get_brokers()
        if replication_factor > len(brokers):
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} is larger than the {len(brokers)} "
                f"live brokers")
        try:
            assignment = assign_replicas_to_brokers(
                {b: info.rack for b, info in brokers.items()}, partitions=partitions,
                replication_factor=replication_factor)
        except PlacementError as exc:
            raise InvalidReplicationFactorError(str(exc)) from None
        try:
            self.store.create_topic(name, assignment, config)
        except NodeAlreadyExistsError:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists") from None
        self._wake_controller()
        return {p: list(r) for p, r in assignment.items()}

    @_zk_errors
    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        try:
            self.store.request_topic_deletion(name)
        except NodeMissingError:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None
        self._wake_controller()

    @_zk_errors
    def list_topics(self) -> list[str]:
        return self.store.topics()

    @_zk_errors
    def topic_exists(self, name: str) -> bool:
        return name in self.store.topics()

    @_zk_errors
    def topic_config(self, name: str) -> dict:
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return self.store.get_topic_config(name)

    @_zk_errors
    def alter_topic_config(self, name: str, config: dict) -> dict:
        validate_topic_name(name)
        if name not in self.store.topics():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        merged = {**self.store.get_topic_config(name),
                  **{str(k): str(v) for k, v in (config or {}).items()}}
        LogConfig.from_properties({k: v for k, v in merged.items()
                                   if k != "min.insync.replicas"})
        self.store.set_topic_config(name, merged)
        self._wake_controller()
        return merged

    @_zk_errors
    def elect_preferred_leaders(self, partitions: list) -> None:
        try:
            self.store.request_preferred_replica_election([tuple(p) for p in partitions])
        except NodeAlreadyExistsError:
            pass  # one is in progress; it will be retried by the caller if needed
        self._wake_controller()

    def _wake_controller(self) -> None:
        try:
            snapshot = self.metadata
            cid = snapshot.get("controller_id", -1)
            if cid >= 0:
                handle = ray.get_actor(controller_actor_name(cid), namespace=self.namespace)
                handle.wake.remote()
        except Exception:  # noqa: BLE001 - the watch wakes it anyway
            pass
