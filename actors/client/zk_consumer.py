"""A consumer's own ZooKeeper session: offsets in ZooKeeper (``offsets_storage="zookeeper"``,
``dual_commit``) and the seed's consumer registry, kept observable.

One ``ConsumerZk`` per Consumer of a group, holding one kazoo session of the consumer's
process (``coordination.session.connect`` on ``cluster.zk_hosts``, chroot included; session
timeout = the consumer's ``session_timeout_ms``). Everything it writes goes through
``coordination.store.ZkStore`` and ``coordination.zk_layout`` (the seed's paths and bodies):

- offsets (synchronous, the commit returns once ZooKeeper has it):
  ``/consumers/<g>/offsets/<t>/<p>`` -> the offset as a decimal string (persistent);
- the registry (asynchronous, best effort, never in the way of consuming): the ephemeral
  ``/consumers/<g>/ids/<consumer_id>`` -> ``{"version":1,"subscription":{..:n},
  "pattern":"static"|"white_list"|"black_list","timestamp":"<ms>"}`` and, for every
  partition the group assigned to this consumer, the ephemeral
  ``/consumers/<g>/owners/<t>/<p>`` -> ``<consumer_id>-<thread>`` (the seed's consumer
  thread id: the stream the partition feeds, 0 for a polling consumer).

The registry is a mirror: the GroupCoordinator decides who owns what; the Consumer tells
this object what it owns after every assignment (``set_owners``) and a worker thread makes
ZooKeeper say so. An owner node held by another session (a consumer whose ZooKeeper session
has not expired yet although the group already moved its partitions) is replaced; a node is
only ever released by the session that created it. After a session expiry (kazoo opens a
new one) everything is written again; every ``VERIFY_S`` the worker re-checks it all. When
the process dies its session ends and every ephemeral node goes with it (after the session
timeout; at once on ``close``).

Thread-safe.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid

from ..errors import IllegalArgumentError, ZooKeeperUnavailableError

log = logging.getLogger(__name__)

#: The worker re-checks every node it is responsible for this often (seconds).
VERIFY_S = 10.0
#: Backoff after a failed registry pass.
RETRY_S = 0.5


def new_consumer_id(group: str) -> str:
    """The seed's consumer id: ``<group>_<hostname>-<ms>-<8 hex>`` (seed 001, 2.8)."""
    host = socket.gethostname() or "localhost"
    return f"{group}_{host}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"


def owner_id(consumer_id: str, thread: int) -> str:
    """The seed's consumer thread id, written in an owner node."""
    return f"{consumer_id}-{int(thread)}"


def open_store(zk_hosts: str, session_timeout_s: float, what: str):
    """A new kazoo session on ``zk_hosts`` and a ZkStore on it: ``(client, store)``;
    ZooKeeperUnavailableError (naming ``what``) when no session can be had."""
    from coordination.errors import CoordinationError
    from coordination.retry import RetryPolicy
    from coordination.session import ZkSettings, connect
    from coordination.store import ZkStore
    settings = ZkSettings(hosts=zk_hosts, session_timeout_s=session_timeout_s,
                          connect_timeout_s=15.0, op_timeout_s=10.0)
    try:
        client = connect(settings)
    except CoordinationError as exc:
        raise ZooKeeperUnavailableError(f"{what}: no ZooKeeper session at {zk_hosts}: "
                                        f"{exc}") from exc
    return client, ZkStore(client, retry=RetryPolicy(deadline_s=10.0))


def read_groups(zk_hosts: str, groups=None, timeout_s: float = 10.0) -> dict:
    """What ZooKeeper holds of consumer groups, read on a short session of its own:
    ``{group: {(topic, partition): offset}}`` for ``groups`` (default: every group under
    /consumers; a group there with no offsets maps to {}). ZooKeeperUnavailableError when
    ZooKeeper cannot be read."""
    from coordination.errors import CoordinationError
    client, store = open_store(zk_hosts, timeout_s, "reading /consumers")
    try:
        names = store.consumer_groups() if groups is None else list(groups)
        return {g: store.consumer_offsets(g) for g in names}
    except CoordinationError as exc:
        raise ZooKeeperUnavailableError(f"reading /consumers in ZooKeeper: {exc}") from exc
    finally:
        client.close()


class ConsumerZk:
    """See the module docstring."""

    def __init__(self, zk_hosts: str, group: str, consumer_id: str, *,
                 session_timeout_ms: int = 10_000):
        if not zk_hosts:
            raise IllegalArgumentError("ConsumerZk needs the cluster's zk_hosts")
        self.zk_hosts = zk_hosts
        self.group = group
        self.consumer_id = consumer_id
        self.session_timeout_s = max(session_timeout_ms / 1000, 1.0)
        self.started_ms = int(time.time() * 1000)
        self._lock = threading.RLock()            # the state below, never held over I/O
        self._connect_lock = threading.Lock()     # one connect at a time
        self._client = None            # coordination.session.ZkClient
        self._store = None
        self._closed = False
        # the registry: what ZooKeeper should say, and what this session wrote
        self._want_registration = None          # zk_layout.ConsumerRegistration | None
        self._want_owners: dict[tuple[str, int], str] = {}
        self._written_session = None
        self._written_registration = None
        self._written_owners: dict[tuple[str, int], str] = {}
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self.registry_errors = 0

    # -- the session ------------------------------------------------------------------------
    def store(self):
        """The ZkStore on this consumer's session, connecting on first use;
        ZooKeeperUnavailableError when no session can be had."""
        with self._connect_lock:
            if self._closed:
                raise ZooKeeperUnavailableError("the consumer's ZooKeeper session is closed")
            if self._store is not None:
                return self._store
            client, store = open_store(self.zk_hosts, self.session_timeout_s,
                                       f"consumer {self.consumer_id}")
            client.add_listener(self._on_state)
            with self._lock:
                if self._closed:          # closed while connecting
                    client.close()
                    raise ZooKeeperUnavailableError("the consumer's ZooKeeper session is "
                                                    "closed")
                self._client = client
                self._store = store
            return self._store

    def _on_state(self, _state) -> None:
        # kazoo's thread: only wake the worker (it re-checks the session id itself)
        self._wake.set()

    def _zk_call(self, what: str, fn):
        from coordination.errors import CoordinationError
        store = self.store()
        try:
            return fn(store)
        except CoordinationError as exc:
            raise ZooKeeperUnavailableError(f"{what} in ZooKeeper: {exc}") from exc

    # -- offsets (offsets_storage="zookeeper", dual_commit) ------------------------------------------
    def commit_offsets(self, offsets: dict) -> None:
        """Write ``{(topic, partition): offset | (offset, metadata)}`` to
        /consumers/<g>/offsets/<t>/<p> (the metadata has no place there)."""
        for (_topic, _partition), value in offsets.items():
            offset = value[0] if isinstance(value, (tuple, list)) else value
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise IllegalArgumentError(f"committed offset for {_topic}-{_partition} must "
                                           f"be an int >= 0, got {offset!r}")
        for (topic, partition), value in sorted(offsets.items()):
            offset = value[0] if isinstance(value, (tuple, list)) else value
            self._zk_call(f"commit {topic}-{partition}",
                          lambda s, t=topic, p=int(partition), o=int(offset):
                          s.commit_offset(self.group, t, p, o))

    def fetch_offsets(self, partitions=None) -> dict:
        """``{(topic, partition): offset}`` from ZooKeeper (all of the group's with None)."""
        if partitions is None:
            return self._zk_call("fetch offsets", lambda s: s.consumer_offsets(self.group))
        out = {}
        for topic, partition in partitions:
            got = self._zk_call(f"fetch {topic}-{partition}",
                                lambda s, t=topic, p=int(partition):
                                s.fetch_offset(self.group, t, p))
            if got is not None:
                out[(topic, int(partition))] = got
        return out

    # -- the registry (asynchronous) ---------------------------------------------------------------
    def register(self, subscription: dict, pattern: str = "static") -> None:
        """/consumers/<g>/ids/<consumer_id> should hold this subscription ({topic or regex:
        number of streams}) and pattern."""
        from coordination.zk_layout import ConsumerRegistration
        reg = ConsumerRegistration(subscription={str(k): int(v) for k, v in
                                                 subscription.items()},
                                   pattern=pattern, timestamp_ms=self.started_ms)
        with self._lock:
            if reg == self._want_registration:
                return
            self._want_registration = reg
        self._kick()

    def set_owners(self, owners: dict) -> None:
        """This consumer owns exactly ``{(topic, partition): owner string}`` now."""
        owners = {(t, int(p)): str(o) for (t, p), o in owners.items()}
        with self._lock:
            if owners == self._want_owners:
                return
            self._want_owners = owners
        self._kick()

    def unregister(self) -> None:
        """Neither the id node nor any owner node (an unsubscribed consumer)."""
        with self._lock:
            if self._want_registration is None and not self._want_owners:
                return
            self._want_registration = None
            self._want_owners = {}
        self._kick()

    def wait_synced(self, timeout_s: float = 10.0) -> bool:
        """True once ZooKeeper says what was asked (for tests and close)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if (self._written_session is not None
                        and self._written_registration == self._want_registration
                        and self._written_owners == self._want_owners):
                    return True
            self._wake.set()
            time.sleep(0.02)
        return False

    def _kick(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, daemon=True,
                    name=f"raykafka-zk-registry-{self.consumer_id}")
                self._worker.start()
        self._wake.set()

    def _run(self) -> None:
        next_verify = time.monotonic() + VERIFY_S
        while not self._closed:
            try:
                if time.monotonic() >= next_verify:
                    with self._lock:         # re-check everything against ZooKeeper
                        self._written_session = None
                    next_verify = time.monotonic() + VERIFY_S
                self._sync_once()
                ok = True
            except Exception as exc:  # noqa: BLE001 - a mirror: log, retry soon
                self.registry_errors += 1
                log.info("consumer %s: ZooKeeper registry: %r", self.consumer_id, exc)
                ok = False
            if self._closed:
                return
            self._wake.wait(timeout=(min(VERIFY_S, 1.0) if ok else RETRY_S))
            self._wake.clear()

    def _sync_once(self) -> None:
        store = self.store()
        session = store.zk.session_id
        if session is None:
            return                       # not connected: the state listener wakes us
        with self._lock:
            fresh = session != self._written_session
            if fresh:
                self._written_session = session
                self._written_registration = None
                self._written_owners = {}
            want_reg = self._want_registration
            want_owners = dict(self._want_owners)
            written_reg = self._written_registration
            written_owners = dict(self._written_owners)
        if want_reg != written_reg:
            if want_reg is None:
                store.unregister_consumer(self.group, self.consumer_id)
            else:
                store.put_consumer_registration(self.group, self.consumer_id, want_reg)
            self._record(session, registration=want_reg)
        for tp in written_owners:
            if tp not in want_owners:
                store.release_partition_if_ours(self.group, tp[0], tp[1])
                self._record(session, release=tp)
        if fresh:
            # a new session or a verify pass: what this session wrote is not known any
            # more; owner nodes of ours that are not wanted are found by listing
            for tp in self._stale_owned(store):
                if tp not in want_owners:
                    store.release_partition_if_ours(self.group, tp[0], tp[1])
        for tp, owner in sorted(want_owners.items()):
            if written_owners.get(tp) != owner:
                store.take_partition(self.group, tp[0], tp[1], owner)
                self._record(session, take=(tp, owner))

    def _stale_owned(self, store) -> list:
        prefix = f"{self.consumer_id}-"
        return [tp for tp, owner in store.partition_owners(self.group).items()
                if owner.startswith(prefix)]

    def _record(self, session, *, registration=False, release=None, take=None) -> None:
        with self._lock:
            if session != self._written_session:
                return
            if registration is not False:
                self._written_registration = registration
            if release is not None:
                self._written_owners.pop(release, None)
            if take is not None:
                self._written_owners[take[0]] = take[1]

    # -- closing -----------------------------------------------------------------------------------
    def close(self) -> None:
        """End the session: the id and owner nodes go at once (offsets stay)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            client, self._client, self._store = self._client, None, None
        self._wake.set()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=5)
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing anyway
                log.info("consumer %s: closing its ZooKeeper session: %r",
                         self.consumer_id, exc)
