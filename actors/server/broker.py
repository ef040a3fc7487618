"""The Broker actor: one per broker id, pinned to a node, owning ``<data_dir>/broker-<id>``.

It holds the broker's ZooKeeper session and its ephemeral ``/brokers/ids/<id>``
registration, supervises its Controller candidate, keeps the metadata cache clients read,
and composes two plain parts:

- ``ReplicaManager`` (replica_manager.py): the PartitionReplica actors it hosts (all owned
  by the broker, so they die with it, as the threads of a Kafka broker process would), and
  the controller's LeaderAndIsr / StopReplica requests, fenced by controller epoch;
- ``AdminManager`` (admin_manager.py): admin requests, validated and written to ZooKeeper.

Locking: the broker's ``_lock`` guards only the metadata cache and its stamp; no lock of the
broker or its parts is held across a call to another actor (``ray.get``).
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
from coordination.credentials import (SCRAM_MECHANISMS, CredentialCache, CredentialStore,
                                      ScramCredential, scram_credential)
from coordination.election import read_controller
from coordination.errors import BrokerIdInUseError as ZkBrokerIdInUseError
from coordination.errors import (CoordinationError, NodeMissingError, ZkDataError,
                                 ZkUnavailableError)
from coordination.producer_ids import ProducerIdManager
from coordination.registry import BrokerRegistration
from coordination.session import ZkSettings, connect, digest_from_config
from coordination.store import ZkStore
from storage.checkpoint import write_atomic

from .. import raycompat
from ..errors import (BrokerIdInUseError, CoordinatorNotAvailableError, IllegalArgumentError,
                      InconsistentClusterIdError, NotControllerError, RequestTimedOutError,
                      SecurityDisabledError, TopicAlreadyExistsError,
                      ZooKeeperUnavailableError)
from ..protocol import (OFFSETS_TOPIC, broker_actor_name, controller_actor_name,
                        group_coordinator_actor_name, unwrap)
from .admin_handlers import AdminApis
from .admin_manager import AdminManager
from .broker_backend import BrokerBackend, RayReplicaLookup
from .broker_fetcher import BrokerFetcherManager, RayLocalReplicas
from .fetcher import FetcherSettings
from .controller import Controller
from .group_coordinator import GroupCoordinator
from .acl_handlers import AclApis
from .authorizer import Access, AclAdmin, AclFilter, AclWatcher, Authorizer, binding
from .group_handlers import BrokerGroups, GroupApis
from .group_offsets import offsets_partition
from .handlers import BrokerEndpoint, KafkaApis
from .producer_handlers import ProducerIdApis
from .gcpause import freeze_startup_heap
from .threadnames import name_native_threads
from .listeners import (ListenerSpec, inter_broker_listener, inter_broker_security,
                        jaas_credentials, listener_security, listener_specs)
from .network import SocketServer, SocketServerConfig
from .replica import read_partition_topic_id
from .sasl import SaslAuthenticator
from .replica_manager import RayReplicaActors, ReplicaManager, topic_log_defaults  # noqa: F401

log = logging.getLogger(__name__)

#: __consumer_offsets defaults. Kafka's are 50 partitions and replication factor 3; here a
#: partition replica is a process, so fewer partitions (still spreading the coordinators).
DEFAULT_OFFSETS_PARTITIONS = 6
DEFAULT_OFFSETS_REPLICATION = 3

#: How long a forwarded ISR change waits for the controller. Short: a paused controller
#: must not hold a leader's proposal long after another controller took over (the replica
#: proposes again 1 s later; a retry of a change that did land is answered as written).
ALTER_PARTITION_TIMEOUT_S = 5.0
#: How long fencing the replicas may hold up registering again after a session loss.
FENCE_TIMEOUT_S = 10.0
#: Request handler threads of the Kafka listener (Kafka's num.io.threads): a handler waits
#: on a replica's channel (tens of microseconds) or, for ListOffsets, a Ray call.
DEFAULT_IO_THREADS = 4
_LISTENER_SETTINGS = ("socket.request.max.bytes", "connections.max.idle.ms",
                      "max.connections", "queued.max.request.bytes")


def server_config(spec: ListenerSpec, config: dict) -> SocketServerConfig:
    """The socket settings of listener ``spec`` (Kafka's names from the cluster config)."""
    props = {k: config[k] for k in _LISTENER_SETTINGS if k in config}
    return SocketServerConfig.from_properties(
        props, host=spec.host, port=spec.port,
        io_threads=int(config.get("num.io.threads", DEFAULT_IO_THREADS)))


def listener_settings(broker_id: int, config: dict, node_host: str | None
                      ) -> tuple[SocketServerConfig, str | None, int | None]:
    """(the first listener's settings, the host and port to advertise (None: the bound
    ones)) of broker ``broker_id`` from the cluster's config (pure; every listener:
    listeners.listener_specs). ``listeners`` is Kafka's; by default the node's address and
    port 0 (a free port): ``PLAINTEXT://127.0.0.1:0`` on the embedded default's local Ray,
    the worker's IP on a multi-node Ray. A fixed port P puts broker i on P+i, so one
    cluster config serves every broker of a machine (what ``raykafka start --port P`` is
    to set). A wildcard host (0.0.0.0, ::, empty) binds every address and advertises the
    node's; ``advertised.listeners`` overrides (its port, when not 0, offset the same
    way)."""
    spec = listener_specs(broker_id, config, node_host)[0]
    return server_config(spec, config), spec.adv_host, spec.adv_port


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


def _own_process(_actor) -> tuple[int, str]:
    """(pid, Ray node id) of the actor it runs in (through ``__ray_call__``)."""
    return os.getpid(), ray.get_runtime_context().get_node_id()


class Broker:
    """One broker (see the module docstring). A threaded actor: requests run concurrently."""

    def __init__(self, broker_id: int, conf: dict):
        name_native_threads()       # its threads named in top -H, /proc (threadnames.py)
        self.broker_id = broker_id
        self.conf = conf
        self.namespace = conf["namespace"]
        self.config = dict(conf.get("config") or {})
        self.data_dir = os.path.join(conf["data_dir"], f"broker-{broker_id}")
        self.ran_here_before = os.path.isdir(self.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.replica_manager = ReplicaManager(
            broker_id, self.data_dir, self.config,
            RayReplicaActors(self.namespace, broker_id, self.data_dir))
        # replication over Kafka's Fetch: one thread per leader broker (broker_fetcher.py)
        self.fetchers = BrokerFetcherManager(
            broker_id, FetcherSettings.from_config(self.config), self._endpoint,
            RayLocalReplicas())
        self.replica_manager.fetchers = self.fetchers
        self.admin: AdminManager | None = None          # once ZooKeeper is connected
        self._lock = threading.Lock()                   # guards metadata and its stamp
        self.metadata: dict = {"topics": {}, "brokers": {}, "controller_id": -1,
                               "controller_epoch": 0}
        self._metadata_stamp = (0, -1)                  # (controller_epoch, request_id)
        self.zk = None
        self.store = None
        self._producer_ids: ProducerIdManager | None = None
        self._producer_ids_lock = threading.Lock()
        self.registration = None
        self.controller = None
        self._stopping = threading.Event()
        self._controller_cache = None                   # (broker id, Controller handle)
        self.coordinator = None                         # created on first offsets partition
        # partitions this broker leads -> leader epoch, by the LeaderAndIsr it applied
        # (replaced, never mutated: the Kafka listener's threads read it without a lock)
        self.leading: dict[tuple[str, int], int] = {}
        self.server: SocketServer | None = None         # the first Kafka listener
        self.servers: list[SocketServer] = []           # every listener, in config order
        self.credentials: CredentialCache | None = None  # SCRAM credentials, for SASL
        self.apis: KafkaApis | None = None
        self.admin_apis: AdminApis | None = None        # the listener's admin APIs
        self.backend: BrokerBackend | None = None
        self.cluster_id = None
        self._coordinator_lock = threading.Lock()
        self.authorizer: Authorizer | None = None       # when authorizer.class.name is set
        self.acl_admin: AclAdmin | None = None
        self._acl_watcher: AclWatcher | None = None
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
        niceness = os.nice(0)
        if niceness > 0:
            log.warning("broker %d runs at nice %d (Ray's default for workers): any busy "
                        "process on the node takes the CPU from it and its latency suffers; "
                        "start Ray with RAY_worker_niceness=0 (docs/dataplane.md, "
                        "\"Niceness\")", self.broker_id, niceness)
        try:
            digest = digest_from_config(self.config)
        except ValueError as exc:
            raise IllegalArgumentError(str(exc)) from None
        settings = ZkSettings(hosts=self.conf["zk_hosts"], namespace=self.namespace,
                              session_timeout_s=session_s, digest=digest)
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
        self.admin = AdminManager(self.store, wake_controller=self._wake_controller,
                                  live_brokers=self._live_brokers)
        try:
            self._start_authorizer()
        except Exception:
            self.zk.close()
            raise
        try:
            node_host = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - outside a Ray worker
            node_host = socket.gethostbyname(socket.gethostname())
        try:
            listeners = self._start_listener(node_host)
        except Exception:
            self._stop_listener()
            self.zk.close()
            raise
        _, _, host, port = listeners[0]
        # node ids on the wire are broker ids; host/port are the first listener's
        info = L.BrokerInfo(broker_id=self.broker_id, host=host, port=port,
                            rack=self.config.get("broker.rack"),
                            endpoints=tuple(f"{name}://{h}:{p}"
                                            for name, _, h, p in listeners),
                            protocols=tuple((name, proto) for name, proto, _, _ in listeners))
        deadline = time.monotonic() + wait_for_stale_s
        while True:
            self.registration = BrokerRegistration(self.zk, info,
                                                   before_reregister=self._fence_replicas)
            try:
                self.registration.start(timeout_s=10.0)
                break
            except ZkBrokerIdInUseError as exc:
                if time.monotonic() >= deadline:
                    self._stop_listener()
                    self.zk.close()
                    raise BrokerIdInUseError(
                        f"broker id {self.broker_id} is already registered in ZooKeeper by "
                        f"another live broker ({exc})") from None
                time.sleep(0.2)
        self._remove_stale_partition_dirs()
        self.controller = self._start_controller()
        self._supervisor = threading.Thread(target=self._supervise_controller, daemon=True,
                                            name=f"broker-{self.broker_id}-supervisor")
        self._supervisor.start()
        self.started = True
        freeze_startup_heap()       # its pauses were the listener's p99 (gcpause.py)
        return {"broker_id": self.broker_id, "data_dir": self.data_dir, "host": host,
                "port": port, "cluster_id": self.cluster_id}

    def _start_authorizer(self) -> None:
        """With ``authorizer.class.name`` set: the ACLs from ZooKeeper, kept in step by a
        watcher, before the listener serves anything (authorizer.py)."""
        self.authorizer = Authorizer.from_config(self.config)
        if self.authorizer is not None:
            self.acl_admin = AclAdmin(self.store)
            self._acl_watcher = AclWatcher(
                self.store, self.authorizer,
                name=f"broker-{self.broker_id}-acls").start()

    # -- ACLs (Admin.create_acl / delete_acl / list_acls) --------------------------------
    def _acls(self) -> AclAdmin:
        if self.acl_admin is None:
            raise SecurityDisabledError(
                "no authorizer is configured on this cluster: start it with "
                "authorizer.class.name set (or secure=True) to use ACLs")
        return self.acl_admin

    def create_acls(self, bindings: list[dict]) -> None:
        """Store the bindings (dicts of ``authorizer.binding``'s arguments)."""
        made = [binding(**b) for b in bindings]
        self._acls().create(made)

    def delete_acls(self, bindings: list[dict]) -> list[dict]:
        """Delete exactly the bindings given; answers those that existed."""
        filters = []
        for b in bindings:
            x = binding(**b)
            filters.append(AclFilter(x.resource_type, x.name, x.pattern_type, x.principal,
                                     x.host, x.operation, x.permission))
        return [b.as_dict() for gone in self._acls().delete(filters) for b in gone]

    def list_acls(self) -> list[dict]:
        return [b.as_dict() for b in self._acls().describe()]

    def _start_security(self, specs: list[ListenerSpec]) -> None:
        """What the SASL listeners and the fetchers need: the credential cache, this
        broker's inter-broker credential (created when missing, never overwritten: the
        brokers of one cluster share it), the fetchers' ClientSecurity."""
        inter = inter_broker_listener(self.config, specs)
        self.fetchers.security = inter_broker_security(self.config, inter)
        if not any(s.protocol.startswith("SASL") for s in specs):
            return
        self.credentials = CredentialCache(self.zk).start()
        creds = jaas_credentials(self.config, inter.name,
                                 self.fetchers.security.mechanism)
        if creds is not None and inter.protocol.startswith("SASL"):
            user, password = creds
            if CredentialStore(self.zk).set(user, {
                    m: scram_credential(m, password) for m in SCRAM_MECHANISMS},
                    create_only=True):
                log.info("broker %d: created the inter-broker credential of %r",
                         self.broker_id, user)

    def _authenticator(self, mechanisms):
        cache = self.credentials
        return SaslAuthenticator(mechanisms, cache.get, cache.mechanisms)

    def _start_listener(self, node_host: str) -> list[tuple[str, str, str, int]]:
        """Serve Kafka's protocol (handlers.KafkaApis over a BrokerBackend) on this
        process's own threads, on every listener; (name, protocol, host, port) of each,
        as advertised."""
        specs = listener_specs(self.broker_id, self.config, node_host)
        self._start_security(specs)
        settings = server_config(specs[0], self.config)
        self.backend = BrokerBackend(
            self.broker_id, metadata=lambda: self.metadata,
            leader_epochs=lambda: self.leading,
            replicas=RayReplicaLookup(self.replica_manager),
            endpoint=BrokerEndpoint(self.broker_id, settings.host, settings.port),
            cluster_id=self.cluster_id)
        access = Access(lambda: self.authorizer)
        self.admin_apis = AdminApis(self.backend, self.admin, broker_id=self.broker_id,
                                    broker_config=self.config, access=access)
        self.apis = KafkaApis(self.backend, groups=GroupApis(self.backend, BrokerGroups(
            self.find_coordinator, lambda: self.coordinator, self.broker_id,
            leads=self._leads_group), access),
            admin=self.admin_apis,
            producers=ProducerIdApis(self._generate_producer_id, access),
            extra=[AclApis(lambda: self.authorizer, lambda: self.acl_admin)], access=access)
        self.backend.on_change = self.apis.notify
        self.backend.on_change_inline = self.apis.notify_inline
        out = []
        for spec in specs:
            settings = server_config(spec, self.config)
            server = SocketServer(self.apis, settings, security=listener_security(
                spec, self.config, self._authenticator))
            self.servers.append(server)
            try:
                server.start()
            except OSError as exc:
                raise IllegalArgumentError(f"broker {self.broker_id}: cannot listen on "
                                           f"{settings.host}:{settings.port} ({spec.name}): "
                                           f"{exc}") from None
            out.append((spec.name, spec.protocol, spec.adv_host or settings.host,
                        spec.adv_port or server.port))
        self.server = self.servers[0]
        # the replica channels are read on the first listener's network thread, so the
        # answers and pushes they bring complete Kafka requests without a thread hand-over;
        # not with num.io.threads=0, where handlers that wait for a replica run on that
        # thread (it could not read their answers)
        if self.server.config.io_threads > 0:
            self.backend.loop = self.server
        self.backend.endpoint = BrokerEndpoint(
            self.broker_id, out[0][2], out[0][3], self.config.get("broker.rack"),
            listeners=tuple((name, h, p) for name, _, h, p in out))
        return out

    def _stop_listener(self) -> None:
        """Close the listener (clients see their connections end), then the handlers and
        the replica channels."""
        for part in (*self.servers, self.apis, self.admin_apis, self.backend,
                     self.credentials):
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    log.exception("broker %d: closing %r", self.broker_id, part)

    def _endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """A broker's inter-broker listener (host, port), from the controller's metadata
        (its first listener when it lists none by name)."""
        brokers = self.metadata.get("brokers") or {}
        info = brokers.get(broker_id) or brokers.get(str(broker_id))
        if not info or not int(info.get("port") or 0):
            return None
        name = self.config.get("inter.broker.listener.name")
        for listener, _, host, port in info.get("listeners") or ():
            if name is None or listener == str(name).upper():
                return host, int(port)
        return info["host"], int(info["port"])

    def fetcher_status(self) -> list[dict]:
        """This broker's fetcher threads: per leader broker, the partitions it follows
        there and where each stands (tests, tools)."""
        return self.fetchers.status()

    def listener(self) -> dict:
        """This broker's first Kafka listener: ``{"host", "port"}`` as registered, and
        ``listeners``: every one's ``{"name", "host", "port"}``."""
        endpoint = self.backend.endpoint if self.backend is not None else None
        return {"host": endpoint.host if endpoint else None,
                "port": endpoint.port if endpoint else None,
                "listeners": [{"name": n, "host": h, "port": p}
                              for n, h, p in (endpoint.listeners if endpoint else ())]}

    # -- SCRAM credentials (computed by the caller: no password reaches a broker) -----------
    def set_user_credentials(self, user: str, credentials: dict[str, str]) -> None:
        """Store ``user``'s credentials (mechanism -> Kafka's credential string) in
        /config/users/<user> and notify the brokers."""
        try:
            parsed = {m: ScramCredential.from_string(c) for m, c in credentials.items()
                      if m in SCRAM_MECHANISMS}
            if len(parsed) != len(credentials) or not parsed:
                raise ValueError(f"mechanisms must be some of {', '.join(SCRAM_MECHANISMS)}")
            CredentialStore(self.zk).set(user, parsed)
        except (ValueError, ZkDataError) as exc:
            raise IllegalArgumentError(f"user {user!r}: {exc}") from None
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(str(exc)) from None

    def delete_user(self, user: str) -> bool:
        try:
            return CredentialStore(self.zk).delete(user)
        except ValueError as exc:
            raise IllegalArgumentError(str(exc)) from None
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(str(exc)) from None

    def list_users(self) -> dict[str, list[str]]:
        """Every user with SCRAM credentials -> the mechanisms it has."""
        store = CredentialStore(self.zk)
        try:
            return {u: sorted(store.get(u)) for u in store.users()}
        except ZkUnavailableError as exc:
            raise ZooKeeperUnavailableError(str(exc)) from None

    def listener_stats(self) -> dict:
        """Each listener's SocketServer counters, by listener name (tests, tools)."""
        return {s.security.name: s.stats() for s in self.servers}

    def _remove_stale_partition_dirs(self) -> None:
        """Directories of topics deleted while this broker was down go now: those of topics
        that no longer exist, those whose partition.metadata names an earlier incarnation
        of a topic that was deleted and created again meanwhile, and those of partitions a
        reassignment moved off this broker while it was down (it got no StopReplica)."""
        dirs = [(name, m.group(1), int(m.group(2))) for name in os.listdir(self.data_dir)
                if (m := re.match(r"^(.+)-(\d+)$", name))]
        try:
            existing = set(self.store.topics())
            current = {}                     # (assignment, topic id) of topics with a dir here
            for topic in {t for _, t, _ in dirs} & existing:
                try:
                    assignment, _, topic_id = self.store.get_topic(topic)
                    current[topic] = (assignment, topic_id)
                except NodeMissingError:
                    pass                     # deleted meanwhile: its dirs are stale
        except CoordinationError:
            return
        for name, topic, partition in dirs:
            path = os.path.join(self.data_dir, name)
            if topic not in current:
                stale, why = True, "its topic was deleted"
            else:
                assignment, topic_id = current[topic]
                found = read_partition_topic_id(path)
                stale, why = found is not None and found != topic_id, "its topic was deleted"
                if not stale and self.broker_id not in assignment.get(partition, ()):
                    stale, why = True, "it was reassigned to other brokers"
            if stale:
                log.info("broker %d: removing %s (%s)", self.broker_id, path, why)
                shutil.rmtree(path, ignore_errors=True)

    def _start_controller(self):
        deadline = time.monotonic() + 30
        while True:
            try:
                return ray.remote(Controller).options(
                    name=controller_actor_name(self.broker_id), namespace=self.namespace, num_cpus=0,
                    # alter_partition calls wait on the loop thread: room for many leaders
                    max_concurrency=32, scheduling_strategy=raycompat.this_node(),
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
                # Cluster.kill_broker kills this actor first and its candidate a moment
                # later; this process can outlive both. A candidate started now would
                # outlive it too, holding an election won in a dead broker's name.
                try:
                    alive = raycompat.holds_own_name(broker_actor_name(self.broker_id),
                                                     self.namespace)
                except Exception as exc:  # noqa: BLE001 - the GCS did not answer: next round
                    log.warning("broker %d: controller actor died; cannot tell whether this "
                                "broker lives (%r): asking again", self.broker_id, exc)
                    continue
                if not alive:
                    log.warning("broker %d: controller actor died, and so did this broker "
                                "(its name is released): no new candidate", self.broker_id)
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

    def _fence_replicas(self) -> None:
        """The ZooKeeper session this broker registered with is gone (expired): whatever
        it led may have a new leader by now, so every hosted replica stops acknowledging
        until the controller's next LeaderAndIsr (sent once we are registered again; the
        registration waits for this)."""
        log.warning("broker %d: ZooKeeper session lost; fencing its replicas", self.broker_id)
        self.replica_manager.fence_replicas(FENCE_TIMEOUT_S)

    def await_stop(self, broker_epoch: int | None = None,
                   timeout_s: float = 30.0) -> str:
        """The controller's watch on this broker (one pending call per live broker; Ray
        fails it with RayActorError the moment this actor dies). Answers "stopped" once
        the broker shuts down, "gone" at once when ``broker_epoch`` (a registration czxid)
        is not this broker's current registration (a previous incarnation's, or one its
        session lost), else "running" after ``timeout_s`` (the controller asks again)."""
        if self._stopping.is_set():
            return "stopped"
        if broker_epoch is not None and not self._owns_registration(broker_epoch):
            return "gone"
        return "stopped" if self._stopping.wait(min(float(timeout_s), 300.0)) else "running"

    def _owns_registration(self, czxid: int) -> bool:
        """Is /brokers/ids/<id> with this czxid held by this broker's current session?"""
        if self.zk is None:
            return False
        stat = self.zk.exists(L.broker_path(self.broker_id))
        return (stat is not None and stat.czxid == czxid
                and stat.ephemeralOwner == self.zk.session_id)

    def ping(self) -> int:
        return self.broker_id

    def node_id(self) -> str:
        """The Ray node this broker (and its data) is on."""
        return ray.get_runtime_context().get_node_id()

    def replica_nodes(self) -> dict[str, str]:
        """``"<topic>-<p>"`` -> the Ray node each hosted replica actor runs on."""
        items = list(self.replica_manager.handles().items())
        answers = self.replica_manager.actors.node_ids([h for _, h in items])
        return {f"{t}-{p}": node for ((t, p), _), (ok, node) in zip(items, answers) if ok}

    def pids(self, timeout_s: float = 30.0) -> list[dict]:
        """Every process of this broker, for ``Cluster.pause_broker`` (SIGSTOP/SIGCONT):
        ``{"role": "broker"|"controller"|"replica", "name", "pid", "node_id"}`` for this
        actor, its controller candidate and each hosted replica. An actor that does not
        answer within ``timeout_s`` (dead, or being replaced) is left out."""
        here = ray.get_runtime_context().get_node_id()
        out = [{"role": "broker", "name": broker_actor_name(self.broker_id),
                "pid": os.getpid(), "node_id": here}]
        asked = []
        if self.controller is not None:
            asked.append(("controller", controller_actor_name(self.broker_id), self.controller))
        if self.coordinator is not None:
            asked.append(("coordinator", group_coordinator_actor_name(self.broker_id),
                          self.coordinator))
        for (topic, p), handle in self.replica_manager.handles().items():
            asked.append(("replica", f"{topic}-{p}", handle))
        refs = [h.__ray_call__.remote(_own_process) for _, _, h in asked]
        deadline = time.monotonic() + timeout_s
        for (role, name, _), ref in zip(asked, refs):
            try:
                pid, node = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001))
            except Exception:  # noqa: BLE001 - a dead or stuck actor has no process to pause
                continue
            out.append({"role": role, "name": name, "pid": pid, "node_id": node})
        return out

    def shutdown(self) -> None:
        """A clean stop: controller role handed over, logs closed, registration removed."""
        self._stopping.set()
        self.fetchers.close()
        self._stop_listener()
        if self._acl_watcher is not None:
            self._acl_watcher.close()
        if self.controller is not None:
            try:
                ray.get(self.controller.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        if self.coordinator is not None:
            try:
                ray.kill(self.coordinator, no_restart=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        self.replica_manager.shutdown()
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

    # -- controller requests (stamped: controller epoch, request id) ----------------------------
    @property
    def max_controller_epoch(self) -> int:
        return self.replica_manager.max_controller_epoch

    def leader_and_isr(self, controller_epoch: int, partitions: list[dict],
                       request_id: int = 0) -> list[dict]:
        """One row per partition: ``{"topic", "partition", "error"}`` (None on success)."""
        rows = self.replica_manager.leader_and_isr(controller_epoch, partitions, request_id)
        self._note_leadership(partitions, rows)
        offsets = [(p["partition"], p["leader"] == self.broker_id, p.get("leader_epoch", -1))
                   for p, row in zip(partitions, rows)
                   if p["topic"] == OFFSETS_TOPIC and row["error"] is None]
        if offsets:
            self._tell_coordinator(offsets, (controller_epoch, request_id))
        return rows

    def stop_replicas(self, controller_epoch: int, partitions: list, delete: bool,
                      request_id: int = 0) -> None:
        self.replica_manager.stop_replicas(controller_epoch, partitions, delete, request_id)
        self._note_leadership([], [], stopped=[tuple(tp) for tp in partitions])
        gone = [(int(p), False, -1) for t, p in (tuple(tp) for tp in partitions)
                if t == OFFSETS_TOPIC]
        if gone and self.coordinator is not None:
            self._tell_coordinator(gone, (controller_epoch, request_id))

    def _note_leadership(self, partitions: list[dict], rows: list[dict], *,
                         stopped=()) -> None:
        """The Kafka listener's view of what this broker leads: a partition applied as
        leader (with its epoch), one applied as follower or stopped is no longer led."""
        with self._lock:
            leading = dict(self.leading)
            for p, row in zip(partitions, rows):
                if row["error"] is not None:
                    continue
                key = (p["topic"], p["partition"])
                if p["leader"] == self.broker_id:
                    leading[key] = p.get("leader_epoch", -1)
                else:
                    leading.pop(key, None)
            for topic, partition in stopped:
                if self.replica_manager.get(topic, int(partition)) is None:
                    leading.pop((topic, int(partition)), None)
            self.leading = leading

    # -- consumer groups ---------------------------------------------------------------------------
    def _leads_group(self, group_id) -> bool:
        """Whether this broker leads ``group_id``'s offsets partition (as applied from the
        controller's LeaderAndIsr, before its coordinator hears of it)."""
        count = self._offsets_partition_count()
        if not count or not isinstance(group_id, str) or not group_id:
            return False
        with self._lock:
            return (OFFSETS_TOPIC, offsets_partition(group_id, count)) in self.leading

    def _offsets_partition_count(self) -> int | None:
        with self._lock:
            parts = (self.metadata.get("topics") or {}).get(OFFSETS_TOPIC)
        return len(parts) if parts else None

    def _tell_coordinator(self, changes: list, stamp: tuple) -> None:
        """Role changes of __consumer_offsets partitions here, to this broker's
        GroupCoordinator (created on the first one), stamped with the controller request
        that made them: requests run in parallel threads, so their notices can arrive out
        of order, and the coordinator keeps the newest per partition."""
        count = self._offsets_partition_count() or int(
            self.config.get("offsets.topic.num.partitions", DEFAULT_OFFSETS_PARTITIONS))
        with self._coordinator_lock:
            if self.coordinator is None:
                self.coordinator = ray.remote(GroupCoordinator).options(
                    name=group_coordinator_actor_name(self.broker_id),
                    namespace=self.namespace, num_cpus=0, get_if_exists=True,
                    scheduling_strategy=raycompat.this_node(),
                ).remote(self.broker_id, self.conf)
            self.coordinator.partitions_changed.remote(count, changes, list(stamp))

    def _generate_producer_id(self) -> int:
        """A cluster-unique producer id for InitProducerId, from this broker's block of
        ``/latest_producer_id_block`` (coordination.producer_ids); ZooKeeper's failures
        are answered as CoordinatorNotAvailableError (the client retries)."""
        with self._producer_ids_lock:
            if self._producer_ids is None:
                if self.zk is None:
                    raise CoordinatorNotAvailableError(
                        f"broker {self.broker_id} has no ZooKeeper session yet")
                self._producer_ids = ProducerIdManager(self.zk, self.broker_id)
        try:
            return self._producer_ids.generate()
        except CoordinationError as exc:
            raise CoordinatorNotAvailableError(
                f"broker {self.broker_id}: cannot reserve producer ids: {exc}") from None

    def find_coordinator(self, group_id: str) -> dict:
        """Where group ``group_id``'s coordinator is: ``{"broker_id", "partition"}``. The
        offsets topic is created on first use (compacted, ``offsets.topic.num.partitions``
        partitions, replication factor ``offsets.topic.replication.factor`` capped by the
        live brokers); CoordinatorNotAvailableError until its partition has a leader."""
        if not isinstance(group_id, str) or not group_id:
            raise IllegalArgumentError(f"group_id must be a non-empty str, got {group_id!r}")
        count = self._offsets_partition_count()
        if count is None:
            if self._create_offsets_topic():
                raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} is being created")
            raise CoordinatorNotAvailableError(
                f"broker {self.broker_id} has no metadata of {OFFSETS_TOPIC} yet (just "
                f"started?): retry, or ask another broker")
        partition = offsets_partition(group_id, count)
        with self._lock:
            state = self.metadata["topics"][OFFSETS_TOPIC].get(partition) or {}
        leader = state.get("leader", -1)
        if leader is None or leader < 0:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition} (group {group_id!r}) has no leader")
        return {"broker_id": leader, "partition": partition}

    def _create_offsets_topic(self) -> bool:
        """Create the offsets topic; False when it exists already."""
        live = self._live_brokers() or {self.broker_id}
        rf = min(int(self.config.get("offsets.topic.replication.factor",
                                     DEFAULT_OFFSETS_REPLICATION)), len(live))
        count = int(self.config.get("offsets.topic.num.partitions",
                                    DEFAULT_OFFSETS_PARTITIONS))
        config = {"cleanup.policy": "compact", "segment.bytes": str(100 << 20),
                  "min.insync.replicas": str(min(rf, int(self.config.get(
                      "min.insync.replicas", 1))))}
        try:
            self.admin.create_topic(OFFSETS_TOPIC, count, rf, config)
        except TopicAlreadyExistsError:
            return False
        return True

    def update_metadata(self, controller_epoch: int, metadata: dict,
                        request_id: int = 0) -> bool:
        """Replace the metadata cache; False (ignored) for a snapshot older than the one
        held (a late request the controller had given up on)."""
        stamp = (controller_epoch, request_id)
        with self._lock:
            self.replica_manager.fence(controller_epoch)
            if stamp < self._metadata_stamp:
                return False
            self._metadata_stamp = stamp
            # clients keep the newest of several brokers' snapshots by this stamp
            self.metadata = {**metadata, "stamp": list(stamp)}
        if self.admin_apis is not None:
            self.admin_apis.metadata_changed()     # admin requests waiting for this
        return True

    def get_metadata(self) -> dict:
        return self.metadata

    def metadata_summary(self) -> dict:
        """For status displays, from this broker's metadata cache: the controller, live
        brokers, counts (partitions, offline, under-replicated, preferred-replica
        imbalance) and which partitions are offline or under-replicated."""
        with self._lock:
            metadata = self.metadata
        offline, under = [], []
        for topic, parts in sorted(metadata.get("topics", {}).items()):
            for p, part in sorted(parts.items(), key=lambda kv: int(kv[0])):
                if part["leader"] < 0:
                    offline.append((topic, int(p)))
                if len(part["isr"]) < len(part["replicas"]):
                    under.append((topic, int(p)))
        return {"controller_id": metadata.get("controller_id", -1),
                "controller_epoch": metadata.get("controller_epoch", 0),
                "brokers": sorted(metadata.get("brokers", {})),
                **metadata.get("summary", {}),
                "offline": offline, "under_replicated": under}

    # -- AlterPartition: a hosted leader's ISR change, forwarded to the active controller -------
    def alter_partition(self, topic: str, partition: int, leader_id: int, leader_epoch: int,
                        new_isr: list[int], zk_version: int) -> dict:
        """Forward to the active controller (found from the metadata cache, else from
        ZooKeeper's /controller) and answer its ``{leader, leader_epoch, isr, zk_version}``.
        Raises what it raises (FencedLeaderEpochError, InvalidUpdateVersionError), or
        NotControllerError (retriable) when no controller is active."""
        last: BaseException | None = None
        for fresh in (False, True):
            handle = self._active_controller(fresh)
            if handle is None:
                last = NotControllerError("no active controller")
                continue
            try:
                return ray.get(handle.alter_partition.remote(
                    topic, partition, leader_id, leader_epoch, list(new_isr), zk_version),
                    timeout=ALTER_PARTITION_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise RequestTimedOutError(
                    f"broker {self.broker_id}: the controller did not answer the ISR change "
                    f"of {topic}-{partition} within {ALTER_PARTITION_TIMEOUT_S}s") from None
            except Exception as exc:  # noqa: BLE001 - typed refusals pass through unwrapped
                error = unwrap(exc)
                if not isinstance(error, (NotControllerError, ray.exceptions.RayActorError)):
                    raise error from None
                last = error
                with self._lock:
                    self._controller_cache = None
        raise NotControllerError(f"broker {self.broker_id}: no active controller ({last})")

    def _active_controller(self, fresh: bool):
        """The active controller's actor handle (cached until it fails), or None."""
        with self._lock:
            cached = self._controller_cache
            cid = self.metadata.get("controller_id", -1)
        if cached is not None and not fresh and cached[0] == cid:
            return cached[1]
        if fresh or cid < 0:
            try:
                info = read_controller(self.zk) if self.zk is not None else None
            except Exception:  # noqa: BLE001 - ZooKeeper trouble: no controller known
                return None
            cid = info.broker_id if info is not None else -1
        if cid < 0:
            return None
        try:
            handle = ray.get_actor(controller_actor_name(cid), namespace=self.namespace)
        except ValueError:
            return None
        with self._lock:
            self._controller_cache = (cid, handle)
        return handle

    # -- admin requests (written to ZooKeeper; the controller acts on them) ----------------------
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict | None) -> dict:
        return self.admin.create_topic(name, partitions, replication_factor, config)

    def create_partitions(self, name: str, count: int, assignment: list | None = None) -> dict:
        return self.admin.create_partitions(name, count, assignment)

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topic(name)

    def list_topics(self) -> list[str]:
        return self.admin.list_topics()

    def topic_exists(self, name: str) -> bool:
        return self.admin.topic_exists(name)

    def topic_config(self, name: str) -> dict:
        return self.admin.topic_config(name)

    def alter_topic_config(self, name: str, config: dict) -> dict:
        return self.admin.alter_topic_config(name, config)

    def elect_preferred_leaders(self, partitions: list) -> None:
        self.admin.elect_preferred_leaders(partitions)

    def reassign_partitions(self, plan) -> dict:
        """Start a partition reassignment (see ``AdminManager.reassign_partitions`` for the
        plan's accepted forms and the errors); returns the plan as written."""
        return self.admin.reassign_partitions(plan)

    def reassignment_in_progress(self) -> dict:
        """The pending /admin/reassign_partitions plan (``{"version": 1, "partitions":
        [...]}``, empty when none)."""
        return self.admin.reassignment_in_progress()

    def _live_brokers(self) -> set[int] | None:
        """Live brokers as the controller last told this broker (None before it did)."""
        with self._lock:
            brokers = self.metadata.get("brokers") or {}
        return {int(b) for b in brokers} or None

    def _wake_controller(self) -> None:
        """Nudge the active controller (fire and forget; its watches would wake it too)."""
        try:
            cid = self.metadata.get("controller_id", -1)
            if cid >= 0:
                handle = ray.get_actor(controller_actor_name(cid), namespace=self.namespace)
                handle.wake.remote()
        except Exception:  # noqa: BLE001 - the watch wakes it anyway
            pass
