"""Broker registration: the ephemeral /brokers/ids/<id> znode, kept present across session
expiry.

How: one loop thread owns every decision. kazoo's state listener and the node's watch only
set `_wake`; the loop then re-reads ZooKeeper and reconciles (create the node if it is
missing, check it belongs to our session if it is there). After a session expiry kazoo
opens a new session on its own (LOST -> CONNECTED); the loop sees the node gone (the server
deleted it with the old session) and creates it again.

A node that exists but belongs to another live session means another broker uses this id:
the first registration raises BrokerIdInUseError; later (after a re-registration race) the
loop records the same error in `error` and keeps waiting for the node to go away.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

from coordination.errors import BrokerIdInUseError, CoordinationError, ZkUnavailableError
from coordination.retry import RetryPolicy
from coordination.session import ZkClient
from coordination.zk_layout import BrokerInfo, broker_path, now_ms

log = logging.getLogger(__name__)


class BrokerRegistration:
    """Keeps /brokers/ids/<broker_id> registered for one broker while open.

    `registered` is True when the node was last seen present and owned by our current,
    connected session; it drops to False on SUSPENDED/LOST and comes back once the loop has
    checked (or re-created) the node. Thread-safe for readers; start/close from one owner.
    """

    def __init__(self, zk: ZkClient, info: BrokerInfo, *, check_interval_s: float = 1.0,
                 before_reregister: Callable[[], object] | None = None):
        if info.timestamp_ms == 0:
            # The seed's "timestamp": when the broker first started, kept across re-registrations.
            info = BrokerInfo(broker_id=info.broker_id, host=info.host, port=info.port,
                              rack=info.rack, endpoints=info.endpoints, jmx_port=info.jmx_port,
                              timestamp_ms=now_ms(), protocols=info.protocols)
        self.zk = zk
        self.info = info
        self.path = broker_path(info.broker_id)
        self.check_interval_s = check_interval_s
        #: Runs (on the registration thread) before the node is created again after it was
        #: lost (session expiry): the broker fences its replicas there, so nothing it led
        #: under the old session acknowledges anything once it is registered anew.
        self.before_reregister = before_reregister
        #: czxid of the node while it is ours (the broker epoch the controller sees).
        self.czxid: int | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None
        #: Number of times this object created the node (1 + re-registrations).
        self.registrations = 0
        #: The last operating error the loop met (None when healthy).
        self.error: CoordinationError | None = None

    # -- public ----------------------------------------------------------------------------

    @property
    def broker_id(self) -> int:
        return self.info.broker_id

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    def wait_registered(self, *, timeout_s: float) -> bool:
        return self._registered.wait(timeout=timeout_s)

    def start(self, *, timeout_s: float = 10.0) -> None:
        """Register now (blocking up to `timeout_s`), then keep the registration alive.

        Raises BrokerIdInUseError if another live session holds the id, ZkUnavailableError
        if ZooKeeper does not answer in time."""
        if self._thread is not None:
            raise RuntimeError("BrokerRegistration already started")
        retry = RetryPolicy(max_attempts=50, deadline_s=timeout_s, base_delay_s=0.05,
                            max_delay_s=0.5)
        retry.run(self._register_once)
        self.zk.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"broker-registration-{self.broker_id}")
        self._thread.start()

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop the loop and delete the node if it is ours (a clean shutdown: the controller
        sees the broker leave at once rather than after the session timeout)."""
        self._closed.set()
        self._wake.set()
        self.zk.remove_listener(self._on_state)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        self._registered.clear()
        try:
            stat = self.zk.exists(self.path, timeout_s=timeout_s)
            if stat is not None and stat.ephemeralOwner == self.zk.session_id:
                self.zk.delete(self.path, version=stat.version, timeout_s=timeout_s)
        except (CoordinationError, NoNodeError) as exc:
            log.info("%s: not deleted on close (%s); it goes with the session", self.path, exc)
        except Exception as exc:   # noqa: BLE001 - e.g. BadVersion: not ours to delete
            log.info("%s: not deleted on close (%r)", self.path, exc)

    def _register_once(self) -> None:
        self._reconcile(raise_conflict=True, require_connected=False)
        if not self.registered:
            # Lost a create race that the re-check could not settle yet: retryable.
            raise ZkUnavailableError(f"{self.path}: registration not settled yet")

    # -- the loop --------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: flags only.
        if state != KazooState.CONNECTED:
            self._registered.clear()
        self._wake.set()

    def _on_watch(self, _event) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(timeout=self.check_interval_s)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self._reconcile(raise_conflict=False, require_connected=True)
            except (ZkUnavailableError, CoordinationError) as exc:
                self.error = exc
                self._registered.clear()
            except Exception:   # noqa: BLE001 - a bug must not kill the registration loop
                log.exception("%s: registration loop error", self.path)
                self._registered.clear()
                time.sleep(0.1)   # bounded spin on a persistent bug

    def _reconcile(self, *, raise_conflict: bool, require_connected: bool) -> None:
        """Make the node exist and be ours. One pass; the caller decides when to run again."""
        if require_connected and not self.zk.connected:
            self._registered.clear()
            return
        session_id = self.zk.session_id
        stat = self.zk.exists(self.path, watch=self._on_watch)
        if stat is None:
            self.czxid = None
            if self.registrations > 0 and self.before_reregister is not None:
                try:
                    self.before_reregister()
                except Exception:   # noqa: BLE001 - registering again matters more
                    log.exception("%s: before_reregister failed", self.path)
            try:
                self.zk.create(self.path, self.info.to_bytes(), ephemeral=True, makepath=True)
                self.registrations += 1
                log.info("registered %s (session 0x%x)", self.path, session_id or 0)
            except NodeExistsError:
                # Another broker won the race, or our own ambiguous create landed: re-check.
                self._wake.set()
                return
            stat = self.zk.exists(self.path, watch=self._on_watch)
            if stat is None:
                self._wake.set()
                return
        if stat.ephemeralOwner == self.zk.session_id:
            self.error = None
            self.czxid = stat.czxid
            self._registered.set()
            return
        self._registered.clear()
        conflict = BrokerIdInUseError(self.broker_id, stat.ephemeralOwner)
        self.error = conflict
        if raise_conflict:
            raise conflict
