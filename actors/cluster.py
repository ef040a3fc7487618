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

Fault injection (tests, drills): ``kill_broker`` / ``start_broker``, and ``pause_broker`` /
``resume_broker``, Jepsen's pause: SIGSTOP / SIGCONT of every process of a broker (its Broker
actor, controller candidate and replica actors, as ``Broker.pids`` names them), sent with
``os.kill`` on this node and by a zero-CPU task pinned to the broker's node elsewhere. What
was paused is recorded in the ClusterInfo actor, so exactly those processes are continued,
by any handle on the cluster; ``shutdown`` continues paused brokers first, and
``kill_broker`` SIGKILLs a paused broker's processes as they are.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import tempfile
import time

from coordination.zk_layout import split_connect, zookeeper_connect

from . import raycompat
from .errors import (BrokerNotAvailableError, ClusterNotFoundError, IllegalArgumentError,
                     IllegalStateError, InvalidConfigurationError, KafkaError,
                     KafkaTimeoutError, SecurityDisabledError)
from .protocol import (CLUSTER_INFO_ACTOR, broker_actor_name, controller_actor_name,
                       group_coordinator_actor_name, replica_actor_name)
from .server.nodes import place_brokers

ray = raycompat.ray

START_TIMEOUT_S = 120.0
PAUSE_TIMEOUT_S = 30.0
INFO_ACTOR = CLUSTER_INFO_ACTOR

DEFAULT_BROKER_CONFIG = {
    "auto.create.topics.enable": "true",     # Kafka's default: Metadata creates topics
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


def validate_config(config) -> dict:
    """The broker settings ``Cluster.start(config=...)`` would run with (defaults filled
    in); InvalidConfigurationError for one it would refuse."""
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
    auto = out["auto.create.topics.enable"].strip().lower()
    if auto not in ("true", "false"):
        raise InvalidConfigurationError(f"auto.create.topics.enable must be true or false, "
                                        f"got {out['auto.create.topics.enable']!r}")
    out["auto.create.topics.enable"] = auto
    for key in ("default.replication.factor", "num.partitions", "min.insync.replicas",
                "replica.lag.time.max.ms", "zookeeper.session.timeout.ms"):
        try:
            if int(out[key]) < 1:
                raise ValueError
        except ValueError:
            raise InvalidConfigurationError(f"{key} must be a positive integer, got "
                                            f"{out[key]!r}") from None
    return out


def _secure_defaults(data_dir: str, broker_config: dict) -> dict:
    """``secure=True``: make or reuse ``<data_dir>/security`` (server/secure.py), put its
    settings into ``broker_config`` where the caller set none, and answer what the cluster
    info keeps. The broker certificate names this machine and every Ray node's address.
    Listeners: SASL_SSL on 127.0.0.1 on a one-node Ray, on every address (advertising the
    node's) on a multi-node one."""
    from .server import secure
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    hosts = secure.node_hosts() + [n.get("NodeManagerAddress") for n in nodes]
    hosts += [n.get("NodeManagerHostname") for n in nodes]
    files = secure.prepare(data_dir, hosts)
    listeners = f"SASL_SSL://{'127.0.0.1' if len(nodes) <= 1 else ''}:0"
    for key, value in files.broker_config(listeners).items():
        broker_config.setdefault(key, value)
    return files.info()


def signal_pids(pids: list[int], signum: int, *, settle_s: float = 5.0) -> list[int]:
    """Send ``signum`` to each of ``pids`` on this machine; the pids that got it (a process
    that is gone is skipped). A signal is delivered asynchronously: for SIGSTOP this waits
    (at most ``settle_s``) until each process shows as stopped, so that a paused broker is
    paused when ``pause_broker`` returns."""
    done = []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        done.append(pid)
    if signum == signal.SIGSTOP:
        deadline = time.monotonic() + settle_s
        waiting = list(done)
        while waiting and time.monotonic() < deadline:
            waiting = [pid for pid in waiting if _proc_state(pid) not in ("T", "t", None)]
            if waiting:
                time.sleep(0.005)
    return done


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat ('T' stopped); None when gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def signal_processes(procs: list[dict], signum: int, *,
                     timeout_s: float = PAUSE_TIMEOUT_S) -> list[int]:
    """Send ``signum`` to processes ``{"pid", "node_id"}`` (what ``Broker.pids`` answers):
    with ``os.kill`` on this node, through a zero-CPU task pinned to the node elsewhere (a
    pid means something only on its own machine). Returns the pids that got it."""
    here = ray.get_runtime_context().get_node_id()
    by_node: dict[str, list[int]] = {}
    for proc in procs:
        by_node.setdefault(proc["node_id"], []).append(int(proc["pid"]))
    done = signal_pids(by_node.pop(here, []), signum)
    remote = ray.remote(num_cpus=0)(signal_pids)
    refs = [remote.options(scheduling_strategy=raycompat.on_node(node)).remote(pids, signum)
            for node, pids in by_node.items()]
    for answer in ray.get(refs, timeout=timeout_s):
        done += answer
    return done


def bootstrap_servers_of(metadata: dict, listener: str | None = None) -> str:
    """``"host:port,..."`` of the brokers a metadata snapshot lists, by broker id: their
    first listener, or the one named ``listener``."""
    brokers = metadata.get("brokers") or {}
    out = []
    for _, b in sorted(brokers.items(), key=lambda kv: int(kv[0])):
        if not b.get("port"):
            continue
        if listener is None:
            out.append(f"{b['host']}:{b['port']}")
            continue
        out.extend(f"{host}:{port}" for name, _, host, port in b.get("listeners") or ()
                   if name == listener.upper())
    return ",".join(out)


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
              namespace: str = "raykafka", config: dict | None = None,
              secure: bool = False) -> "Cluster":
        """Start a cluster (see the module docstring). ``secure=True``: SASL_SSL listeners
        with SCRAM, a CA and broker certificate made (or reused) under
        ``<data_dir>/security``, an ACL authorizer, ZooKeeper digest ACLs and an admin user
        (a super user) whose password is in ``<data_dir>/security/admin.password``; every
        setting it makes is a default the ``config`` given overrides (actors/server/
        secure.py, docs/security.md)."""
        if not isinstance(secure, bool):
            raise InvalidConfigurationError(f"secure must be True or False, got {secure!r}")
        if not isinstance(num_brokers, int) or isinstance(num_brokers, bool) or num_brokers < 1:
            raise InvalidConfigurationError(f"num_brokers must be an integer >= 1, got "
                                            f"{num_brokers!r}")
        if not isinstance(namespace, str) or not namespace or \
                not all(c.isalnum() or c in "-_." for c in namespace):
            raise InvalidConfigurationError(f"namespace must be letters, digits, '-', '_' or "
                                            f"'.', got {namespace!r}")
        broker_config = validate_config(config)
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
        if not secure and zk is None and "zookeeper.auth.digest" not in broker_config and \
                os.path.isdir(os.path.join(data_dir, "security")):
            # its embedded ZooKeeper's znodes carry the secured cluster's digest ACLs: an
            # open start could not change them (NoAuth deep inside a broker's start)
            raise InvalidConfigurationError(
                f"{data_dir} holds a secured cluster (its security directory is there): "
                f"start it with secure=True (raykafka start --secure)")
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
        if secure:
            info["security"] = _secure_defaults(data_dir, broker_config)
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
            if secure:
                cluster._create_admin_user()
        except BaseException:
            cluster.shutdown()
            raise
        return cluster

    def _create_admin_user(self) -> None:
        """The secured cluster's admin user (both SCRAM mechanisms; a restart sets the same
        password again), and admin.properties with the brokers' addresses of this start."""
        from .server.secure import write_properties
        security = self._info["security"]
        self.admin().create_user(security["user"], security["password"])
        write_properties(security, self._secure_bootstrap())

    @classmethod
    def connect(cls, namespace: str = "raykafka") -> "Cluster":
        """Attach to the cluster running in ``namespace``, from any driver, task or actor.

        Which Ray: the one this process is attached to already (it called ``ray.init``
        itself, or it is a Ray task or actor); else the one ``raykafka start`` recorded in
        the state file ``~/.raykafka/<namespace>.json``; else ``RAY_ADDRESS`` (``ray job
        submit`` sets it). With none of these it raises ClusterNotFoundError at once,
        saying how to start or find one: it never tries Ray's "auto", which on a shared
        machine finds whichever Ray started there last, maybe another user's. The head node
        of a ``ray up`` cluster (cluster.yaml) has the state file its daemon wrote; set
        ``RAY_ADDRESS=auto`` to ask for Ray's "auto" explicitly."""
        raycompat.init_attach(namespace)
        try:
            info_actor = ray.get_actor(INFO_ACTOR, namespace=namespace)
        except ValueError:
            raise ClusterNotFoundError(
                f"no raykafka cluster runs in namespace {namespace!r} on the Ray at "
                f"{ray.get_runtime_context().gcs_address} (start one with `raykafka start` "
                f"or Cluster.start)") from None
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

    @property
    def bootstrap_servers(self) -> str:
        """Every live broker's Kafka listener, ``"host:port,host:port"`` (by broker id),
        as the controller's latest metadata lists them: Kafka's ``bootstrap.servers``."""
        return bootstrap_servers_of(self.metadata.refresh())

    def bootstrap_servers_for(self, listener: str) -> str:
        """``bootstrap_servers`` of the listener named ``listener`` (e.g. ``SASL_SSL``)."""
        return bootstrap_servers_of(self.metadata.refresh(), listener)

    @property
    def secure(self) -> bool:
        """Whether the cluster was started with ``secure=True``."""
        return bool(self._info.get("security"))

    @property
    def security_files(self) -> dict | None:
        """None without ``secure=True``; else what a user needs to find the secrets, never
        the secrets: ``protocol``, ``mechanism``, ``user`` (the admin), ``ca_file``,
        ``password_file`` (the admin's, 0600), ``properties_file`` (librdkafka settings of
        the admin, for ``kcat -F``, 0600), ``directory``."""
        security = self._info.get("security")
        if not security:
            return None
        return {k: security[k] for k in ("protocol", "mechanism", "user", "ca_file",
                                         "password_file", "properties_file", "directory")}

    def client_config(self, user: str | None = None, password: str | None = None) -> dict:
        """librdkafka / confluent-kafka settings for this cluster: ``bootstrap.servers``,
        and on a secured cluster ``security.protocol``, ``sasl.mechanism``,
        ``sasl.username``, ``sasl.password`` and ``ssl.ca.location`` of the admin user, or
        of ``user`` (whose ``password`` must then be given: IllegalArgumentError). A user on
        a cluster without security is SecurityDisabledError."""
        from .server.secure import client_settings
        security = self._info.get("security")
        if user is not None and (not isinstance(user, str) or not user):
            raise IllegalArgumentError(f"user must be a non-empty str, got {user!r}")
        if password is not None and not isinstance(password, str):
            raise IllegalArgumentError("password must be a str")
        if not security:
            if user is not None or password is not None:
                raise SecurityDisabledError(f"cluster {self.namespace!r} was not started with "
                                            f"secure=True: it has no users")
            return {"bootstrap.servers": self.bootstrap_servers}
        if user is not None and user != security["user"] and password is None:
            raise IllegalArgumentError(f"client_config(user={user!r}) needs that user's "
                                       f"password (only the admin's is known to the cluster)")
        return client_settings(security, self._secure_bootstrap(), user, password)

    def _secure_bootstrap(self) -> str:
        """The secured listener's addresses (the first listener's when it was renamed)."""
        return self.bootstrap_servers_for(self._info["security"]["protocol"]) or \
            self.bootstrap_servers

    def _client_kwargs(self, config: dict) -> dict:
        """A raykafka client's settings: on a secured cluster SASL_SSL as the admin user
        unless ``config`` says otherwise (server/secure.py ``client_kwargs``)."""
        if not self._info.get("security"):
            return config
        from .server.secure import client_kwargs
        return client_kwargs(self._info["security"], config)

    # -- clients ---------------------------------------------------------------------------------------
    def admin(self):
        from .client.admin import Admin
        return Admin(self)

    def producer(self, **config):
        from .client.producer import Producer
        return Producer(self.metadata, **self._client_kwargs(config))

    def simple_consumer(self, **config):
        from .client.simple_consumer import SimpleConsumer
        return SimpleConsumer(self.metadata, **self._client_kwargs(config))

    def consumer(self, *topics, **config):
        from .client.consumer import Consumer
        return Consumer(self, *topics, **self._client_kwargs(config))

    def consumer_group(self, group_id: str, topics=(), num_members: int = 1,
                       process_fn=None, *, pattern: str | None = None,
                       actor_options: dict | None = None, **consumer_config):
        """``num_members`` member actors of consumer group ``group_id``, each calling
        ``process_fn(records)`` on its partitions' records and committing after it
        (at least once); ``.scale(n)``, ``.stats()``, ``.stop()``. Keywords besides the
        Consumer's: ``commit_interval_ms`` (0: commit after every poll) and
        ``batch_format`` ("records", "pyarrow": a Table per partition and poll, the fast
        path, or "pandas"). See actors/client/consumer_group.py."""
        from .client.consumer_group import ConsumerGroup
        # the members attach with Cluster.connect, handed to them: client/ never imports
        # this module (the composition root), so the import graph has no cycle
        return ConsumerGroup(self, group_id, topics, num_members, process_fn,
                             connect=Cluster.connect, pattern=pattern,
                             consumer_config=consumer_config, actor_options=actor_options)

    # -- faults and restarts ---------------------------------------------------------------------------
    def kill_broker(self, broker_id: int) -> None:
        """Kill the broker actor abruptly: its replicas and controller die with it, its
        ZooKeeper session is not closed (it expires after the session timeout). A paused
        broker's processes are SIGKILLed as they are (never continued first)."""
        handle = self.broker(broker_id)
        listener = self._listener_of(broker_id)
        paused = self._paused()
        procs = paused.pop(str(broker_id), None)
        if procs is not None:
            signal_processes(procs, signal.SIGKILL)
            self._set_paused(paused)
        # Ray ends a dead owner's actors asynchronously: a replica could outlive its broker
        # for a moment and keep serving. Kill them together, as one process would die.
        names = [broker_actor_name(broker_id), controller_actor_name(broker_id),
                 group_coordinator_actor_name(broker_id)]
        names += self._replica_names_of(broker_id)
        handles = []
        for name in names[1:]:
            try:
                handles.append(ray.get_actor(name, namespace=self.namespace))
            except ValueError:
                pass
        ray.kill(handle, no_restart=True)
        for h in handles:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._brokers.pop(broker_id, None)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and names:
            for name in list(names):
                try:
                    ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    names.remove(name)
            if names:
                time.sleep(0.05)
        # a released name is not an ended process: until its Kafka listener refuses
        # connections the dead broker could still answer a fetch from what it holds
        while listener is not None and time.monotonic() < deadline:
            try:
                socket.create_connection(listener, timeout=0.5).close()
            except OSError:
                break
            time.sleep(0.05)

    def _listener_of(self, broker_id: int) -> tuple[str, int] | None:
        """The broker's Kafka listener as the cached metadata lists it (no call)."""
        brokers = self.metadata.snapshot().get("brokers") or {}
        info = brokers.get(broker_id) or brokers.get(str(broker_id))
        if not info or not info.get("port"):
            return None
        return info["host"], int(info["port"])

    def _replica_names_of(self, broker_id: int) -> list[str]:
        """The replica actor names broker ``broker_id`` hosts, by the metadata's assignment."""
        try:
            topics = self.metadata.refresh().get("topics", {})
        except KafkaError:
            topics = self.metadata.snapshot().get("topics", {}) if self._metadata else {}
        return [replica_actor_name(t, int(p), broker_id) for t, parts in topics.items()
                for p, st in parts.items() if broker_id in st.get("replicas", ())]

    def pause_broker(self, broker_id: int) -> list[dict]:
        """SIGSTOP every process of broker ``broker_id`` (Jepsen's pause): its Broker actor,
        its controller candidate and its replica actors, which stop answering (and stop
        heart-beating ZooKeeper) until ``resume_broker``. Returns the processes paused
        (``{"role", "name", "pid", "node_id"}``), as recorded for ``resume_broker``.
        IllegalStateError if it is already paused; BrokerNotAvailableError if it is not
        running."""
        paused = self._paused()
        if str(broker_id) in paused:
            raise IllegalStateError(f"broker {broker_id} is already paused "
                                    f"(resume_broker({broker_id}) first)")
        try:
            handle = self.broker(broker_id)
            procs = ray.get(handle.pids.remote(), timeout=PAUSE_TIMEOUT_S * 2)
        except (ValueError, ray.exceptions.RayActorError,
                ray.exceptions.GetTimeoutError) as exc:
            raise BrokerNotAvailableError(f"broker {broker_id} is not running or does not "
                                          f"answer ({type(exc).__name__})") from None
        # recorded before the signal: whatever happens next, resume knows what to continue
        self._set_paused({**paused, str(broker_id): procs})
        signal_processes(procs, signal.SIGSTOP)
        return procs

    def resume_broker(self, broker_id: int) -> list[dict]:
        """SIGCONT exactly the processes ``pause_broker(broker_id)`` stopped; returns them.
        IllegalStateError if the broker is not paused."""
        paused = self._paused()
        procs = paused.get(str(broker_id))
        if procs is None:
            raise IllegalStateError(f"broker {broker_id} is not paused")
        signal_processes(procs, signal.SIGCONT)
        self._set_paused({k: v for k, v in paused.items() if k != str(broker_id)})
        return procs

    def paused_brokers(self) -> list[int]:
        """The brokers ``pause_broker`` stopped and nobody resumed yet."""
        return sorted(int(b) for b in self._paused())

    def _paused(self) -> dict[str, list[dict]]:
        """broker id (str) -> its paused processes, as the ClusterInfo actor records them
        (so any handle on the cluster, a ``Cluster.connect`` one too, can resume)."""
        self.broker_ids()                      # re-reads the info actor
        return dict(self._info.get("paused") or {})

    def _set_paused(self, paused: dict) -> None:
        self._info["paused"] = paused
        if self._info_actor is not None:
            ray.get(self._info_actor.update.remote(paused=paused), timeout=30)

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
        self._resume_all()
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

    def _resume_all(self) -> None:
        """Continue every paused broker (a stopped process cannot shut down cleanly)."""
        try:
            paused = self._paused()
        except Exception:  # noqa: BLE001 - the info actor is gone: use what we knew
            paused = dict(self._info.get("paused") or {})
        for procs in paused.values():
            try:
                signal_processes(procs, signal.SIGCONT)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        if paused:
            try:
                self._set_paused({})
            except Exception:  # noqa: BLE001
                pass

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
