"""ReplicaManager: the partition replicas one broker hosts (Kafka's ReplicaManager).

It owns the map (topic, partition) -> replica actor, creates, reconfigures and stops replicas,
and applies the controller's LeaderAndIsr and StopReplica requests:

- Controller fencing: a request whose controller epoch is older than the newest seen is
  refused (StaleControllerEpochError). Within an epoch, each partition remembers the stamp
  ``(controller_epoch, request_id)`` of the last request applied to it and skips an older one
  (a request the controller abandoned after a timeout that runs late must not undo a newer
  one, nor bring back a replica a newer StopReplica stopped).
- LeaderAndIsr answers per partition (``{"topic", "partition", "error"}``, error None on
  success) so the controller retries only what failed.
- A replica of an earlier topic of the same name (another topic id) is stopped with its data
  before the new one starts; a changed topic config (min.insync.replicas included) is applied
  to a running replica in place.

Locking: ``_lock`` guards the maps and nothing else: it is never held while a replica is
called (every call to a replica goes through ``actors``, outside it). Requests that touch the
same partition are serialised by that partition's own lock (taken in sorted order, so two
requests cannot deadlock), which is held across the calls to that partition's replica; a
request for other partitions, a metadata read or an admin request never waits on it.

Ray stays behind ``actors`` (RayReplicaActors in production), so the rules above are tested
with in-process replicas (tests/test_replica_manager.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import StaleControllerEpochError
from ..protocol import replica_actor_name
from .replica import partition_dir

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0        # a new replica opens (recovers) its log before it answers
ROLE_CHANGE_TIMEOUT_S = 60.0
CONFIG_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

_LOG_PREFIXED = {"log.segment.bytes": "segment.bytes", "log.retention.ms": "retention.ms",
                 "log.retention.bytes": "retention.bytes", "log.cleanup.policy": "cleanup.policy",
                 "log.flush.interval.messages": "flush.messages",
                 "log.flush.interval.ms": "flush.ms", "log.roll.ms": "segment.ms",
                 "message.max.bytes": "max.message.bytes"}


def topic_log_defaults(broker_config: dict) -> dict:
    """The broker's log.* defaults as topic config names."""
    return {_LOG_PREFIXED[k]: v for k, v in broker_config.items() if k in _LOG_PREFIXED}


def replica_settings(broker_config: dict, topic_config: dict) -> tuple[dict, int]:
    """(log config, min.insync.replicas) of a replica: the topic's overrides on the broker's
    defaults (pure)."""
    log_config = {**topic_log_defaults(broker_config), **(topic_config or {})}
    min_isr = int((topic_config or {}).get("min.insync.replicas",
                                           broker_config.get("min.insync.replicas", 1)))
    log_config.pop("min.insync.replicas", None)
    log_config.pop("unclean.leader.election.enable", None)   # the controller's, not the log's
    return log_config, min_isr


def replication_settings(broker_config: dict) -> dict:
    """The broker's replica.* settings (Kafka's names) that its replicas run with (pure)."""
    return {k: v for k, v in (broker_config or {}).items() if k.startswith("replica.")}


class ReplicaActors(Protocol):
    """How the ReplicaManager reaches replica actors (RayReplicaActors; a fake in tests).
    Each call that waits takes a timeout and answers per replica ``(ok, value or error)``."""

    def create(self, topic: str, partition: int, log_config: dict, min_isr: int,
               topic_id: str | None) -> Any: ...

    def wait_ready(self, handles: list, timeout_s: float) -> list[tuple[bool, Any]]: ...

    def become(self, calls: list[tuple[Any, dict, bool]], timeout_s: float
               ) -> list[tuple[bool, Any]]: ...

    def update_config(self, calls: list[tuple[Any, dict, int]], timeout_s: float
                      ) -> list[tuple[bool, Any]]: ...

    def stop(self, topic: str, partition: int, handle, delete: bool) -> None: ...

    def fence(self, handles: list, timeout_s: float) -> list[tuple[bool, Any]]: ...


@dataclass
class _Hosted:
    handle: Any
    settings: tuple[dict, int]        # (log config, min.insync.replicas) it runs with
    topic_id: str | None


Stamp = tuple[int, int]               # (controller_epoch, request_id)


class ReplicaManager:
    """The replicas of one broker (see the module docstring). Thread-safe."""

    def __init__(self, broker_id: int, data_dir: str, broker_config: dict,
                 actors: ReplicaActors):
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.broker_config = dict(broker_config or {})
        self.actors = actors
        self._lock = threading.Lock()     # guards the fields below; never held across a call
        self._replicas: dict[tuple[str, int], _Hosted] = {}
        self._stamps: dict[tuple[str, int], Stamp] = {}
        self._partition_locks: dict[tuple[str, int], threading.Lock] = {}
        # the broker's fetcher threads (broker_fetcher.BrokerFetcherManager), told of every
        # role change; None: each follower replica fetches for itself (actors.become says)
        self.fetchers = None
        self.max_controller_epoch = 0
        # the broker's replica.* settings reach the replicas it creates (lag time, fetch wait)
        configure = getattr(actors, "configure_replication", None)
        if configure is not None:
            configure(replication_settings(self.broker_config))

    # -- fencing ---------------------------------------------------------------------------
    def fence(self, controller_epoch: int) -> None:
        """Refuse a controller older than the newest seen; remember a newer one."""
        with self._lock:
            self._fence_locked(controller_epoch)

    def _fence_locked(self, controller_epoch: int) -> None:
        if controller_epoch < self.max_controller_epoch:
            raise StaleControllerEpochError(
                f"broker {self.broker_id}: controller epoch {controller_epoch} is older than "
                f"{self.max_controller_epoch}")
        self.max_controller_epoch = controller_epoch

    @contextlib.contextmanager
    def _partitions_locked(self, keys):
        with self._lock:
            locks = [self._partition_locks.setdefault(k, threading.Lock())
                     for k in sorted(set(keys))]
        for lock in locks:
            lock.acquire()
        try:
            yield
        finally:
            for lock in reversed(locks):
                lock.release()

    # -- reading ---------------------------------------------------------------------------
    def handles(self) -> dict[tuple[str, int], Any]:
        with self._lock:
            return {k: h.handle for k, h in self._replicas.items()}

    def get(self, topic: str, partition: int):
        with self._lock:
            hosted = self._replicas.get((topic, partition))
        return hosted.handle if hosted else None

    # -- LeaderAndIsr ---------------------------------------------------------------------
    def leader_and_isr(self, controller_epoch: int, partitions: list[dict],
                       request_id: int = 0) -> list[dict]:
        """Make each listed replica leader or follower as the controller says, creating
        missing replicas (all started in parallel). One answer row per partition, in order."""
        stamp = (controller_epoch, request_id)
        rows = {(p["topic"], p["partition"]): {"topic": p["topic"], "partition": p["partition"],
                                                "error": None} for p in partitions}
        with self._lock:
            self._fence_locked(controller_epoch)
        with self._partitions_locked(rows):
            todo = []
            with self._lock:
                for p in partitions:
                    key = (p["topic"], p["partition"])
                    if self._stamps.get(key, (-1, -1)) > stamp:
                        rows[key]["error"] = (f"StaleRequest: {key} already has a request "
                                              f"newer than {stamp}")
                    else:
                        todo.append(p)
            handles = self._ensure_replicas(todo, rows)
            live = [(p, handles[(p["topic"], p["partition"])]) for p in todo
                    if rows[(p["topic"], p["partition"])]["error"] is None]
            ready = self.actors.wait_ready([h for _, h in live], READY_TIMEOUT_S)
            calls = []
            for (p, handle), (ok, err) in zip(live, ready):
                if ok:
                    calls.append((handle, p, p["leader"] == self.broker_id))
                else:
                    rows[(p["topic"], p["partition"])]["error"] = _describe(err)
            results = self.actors.become(calls, ROLE_CHANGE_TIMEOUT_S)
            with self._lock:
                for (_, p, _), (ok, value) in zip(calls, results):
                    key = (p["topic"], p["partition"])
                    if ok:
                        self._stamps[key] = max(self._stamps.get(key, stamp), stamp)
                    else:
                        rows[key]["error"] = _describe(value)
            if self.fetchers is not None:
                for (handle, p, leader), (ok, value) in zip(calls, results):
                    self._tell_fetchers(p, leader, handle, value if ok else None)
        return [rows[(p["topic"], p["partition"])] for p in partitions]

    def _tell_fetchers(self, p: dict, leader: bool, handle, state: dict | None) -> None:
        """After a role change: a follower (of another broker) is fetched for by the
        broker's fetcher thread toward its leader, anything else is not. Caller holds the
        partition's lock."""
        topic, partition = p["topic"], p["partition"]
        if (state is None or leader or p["leader"] < 0 or p["leader"] == self.broker_id
                or "generation" not in state):
            self.fetchers.unfollow(topic, partition)
        else:
            self.fetchers.follow(topic, partition, p["leader"], p["leader_epoch"],
                                 state["generation"], handle)

    def _ensure_replicas(self, partitions: list[dict], rows: dict) -> dict:
        """The handle of each partition's replica: created when missing (not awaited),
        reconfigured when its settings changed, replaced when it is of another topic id.
        Caller holds the partitions' locks."""
        stale, reconfigure, create, out = [], [], [], {}
        with self._lock:
            for p in partitions:
                key = (p["topic"], p["partition"])
                settings = replica_settings(self.broker_config, p.get("config") or {})
                topic_id = p.get("topic_id")
                hosted = self._replicas.get(key)
                if hosted is not None and topic_id is not None \
                        and hosted.topic_id not in (None, topic_id):
                    log.warning("broker %d: %s-%d belongs to an earlier topic incarnation (id "
                                "%s, now %s): removing it", self.broker_id, *key,
                                hosted.topic_id, topic_id)
                    stale.append((key, self._replicas.pop(key).handle))
                    hosted = None
                if hosted is None:
                    create.append((key, settings, topic_id))
                elif hosted.settings != settings:
                    reconfigure.append((key, hosted.handle, settings))
                    out[key] = hosted.handle
                else:
                    out[key] = hosted.handle
        for key, handle in stale:
            self.actors.stop(key[0], key[1], handle, delete=True)
        results = self.actors.update_config([(h, s[0], s[1]) for _, h, s in reconfigure],
                                            CONFIG_TIMEOUT_S)
        for (key, _, settings), (ok, err) in zip(reconfigure, results):
            if ok:
                with self._lock:
                    if key in self._replicas:
                        self._replicas[key].settings = settings
            else:
                rows[key]["error"] = _describe(err)
        for key, settings, topic_id in create:
            try:
                handle = self.actors.create(key[0], key[1], settings[0], settings[1], topic_id)
            except Exception as exc:  # noqa: BLE001 - e.g. a dead predecessor's name: retried
                rows[key]["error"] = _describe(exc)
                continue
            with self._lock:
                self._replicas[key] = _Hosted(handle, settings, topic_id)
            out[key] = handle
        return out

    # -- StopReplica ----------------------------------------------------------------------
    def stop_replicas(self, controller_epoch: int, partitions: list, delete: bool,
                      request_id: int = 0) -> None:
        """Stop the listed replicas (and delete their data when ``delete``); a partition
        stopped here refuses LeaderAndIsr requests older than this one."""
        stamp = (controller_epoch, request_id)
        keys = [tuple(tp) for tp in partitions]
        with self._lock:
            self._fence_locked(controller_epoch)
        with self._partitions_locked(keys):
            stopping = []
            with self._lock:
                for key in keys:
                    if self._stamps.get(key, (-1, -1)) > stamp:
                        continue
                    self._stamps[key] = stamp
                    hosted = self._replicas.pop(key, None)
                    stopping.append((key, hosted.handle if hosted else None))
            for (topic, partition), handle in stopping:
                if self.fetchers is not None:
                    self.fetchers.unfollow(topic, partition)
                if handle is not None:
                    self.actors.stop(topic, partition, handle, delete)
                if delete:
                    shutil.rmtree(partition_dir(self.data_dir, topic, partition),
                                  ignore_errors=True)

    def fence_replicas(self, timeout_s: float) -> list[tuple[bool, Any]]:
        """The broker's ZooKeeper session is gone: every hosted replica stops acknowledging
        until its next LeaderAndIsr (``PartitionReplica.fence``). Answers per replica."""
        handles = list(self.handles().values())
        return self.actors.fence(handles, timeout_s) if handles else []

    def shutdown(self) -> None:
        """Stop every replica (logs closed, data kept)."""
        with self._lock:
            hosted = list(self._replicas.items())
            self._replicas.clear()
        for (topic, partition), h in hosted:
            try:
                self.actors.stop(topic, partition, h.handle, False)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _describe(exc) -> str:
    """A one-line error for an answer row (it travels back to the controller)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    return f"{type(exc).__name__}: {exc}"


class RayReplicaActors:
    """ReplicaActors through Ray: replica actors named by protocol.replica_actor_name,
    owned by (and pinned to the node of) the calling Broker actor."""

    def __init__(self, namespace: str, broker_id: int, data_dir: str):
        self.namespace = namespace
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.replication_config: dict = {}
        self.broker_fetches = True      # followers are fetched for by the broker's threads

    def configure_replication(self, replication_config: dict) -> None:
        self.replication_config = dict(replication_config)

    def create(self, topic, partition, log_config, min_isr, topic_id):
        from .. import raycompat
        from .replica import ray_actor_class
        # produce and admin calls in the default group (max_concurrency threads); follower
        # and consumer fetches in groups of their own (replica.CONCURRENCY_GROUPS, declared
        # by the class)
        return ray_actor_class().options(
            name=replica_actor_name(topic, partition, self.broker_id),
            namespace=self.namespace, num_cpus=0, max_concurrency=8,
            scheduling_strategy=raycompat.this_node(),
        ).remote(topic, partition, self.broker_id, self.data_dir, log_config, min_isr,
                 topic_id, namespace=self.namespace,
                 replication_config=self.replication_config)

    def wait_ready(self, handles, timeout_s):
        return _gather([h.ready.remote() for h in handles], timeout_s)

    def become(self, calls, timeout_s):
        refs = []
        for handle, p, leader in calls:
            if leader:
                refs.append(handle.become_leader.remote(
                    p["leader_epoch"], p["isr"], p["replicas"],
                    zk_version=p.get("zk_version", -1)))
            else:
                refs.append(handle.become_follower.remote(
                    p["leader"], p["leader_epoch"], p["isr"], p["replicas"],
                    zk_version=p.get("zk_version", -1), fetch=not self.broker_fetches))
        return _gather(refs, timeout_s)

    def update_config(self, calls, timeout_s):
        return _gather([h.update_config.remote(c, m) for h, c, m in calls], timeout_s)

    def stop(self, topic, partition, handle, delete):
        import ray
        try:
            ray.get(handle.stop.remote(delete), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a dead or stuck replica: kill it anyway
            pass
        ray.kill(handle, no_restart=True)
        self._await_name_released(replica_actor_name(topic, partition, self.broker_id))

    def node_ids(self, handles, timeout_s=60.0):
        return _gather([h.node_id.remote() for h in handles], timeout_s)

    def fence(self, handles, timeout_s):
        return _gather([h.fence.remote() for h in handles], timeout_s)

    def _await_name_released(self, name: str, timeout_s: float = 30.0) -> None:
        import ray
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                return
            time.sleep(0.05)


def _gather(refs: list, timeout_s: float) -> list[tuple[bool, Any]]:
    """Wait (up to ``timeout_s`` in all) for every ref; (ok, value or error) per ref."""
    import ray
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    ready = set(ready)
    out = []
    for ref in refs:
        if ref not in ready:
            out.append((False, TimeoutError(f"no answer within {timeout_s}s")))
            continue
        try:
            out.append((True, ray.get(ref, timeout=0)))
        except Exception as exc:  # noqa: BLE001 - the replica's error is its answer
            out.append((False, exc))
    return out
