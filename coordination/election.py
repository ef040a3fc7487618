"""Controller election on the ephemeral /controller znode, with /controller_epoch.

Every broker runs one ControllerCandidate. Winning is one ZooKeeper multi-op (as Kafka's
KafkaZkClient.registerControllerAndIncrementControllerEpoch does): create the ephemeral
/controller *and* set /controller_epoch to epoch+1 conditional on the epoch's zk version.
Either both happen or neither, so two controllers can never hold the same epoch, and the
first controller of a cluster has epoch 1 (/controller_epoch is created as 0 when absent).

The epoch's zk version after winning (`epoch_zk_version`) lets the controller guard its own
writes: ZkStore.update_partition_state(..., controller_epoch_zk_version=...) fails with
ControllerMovedError once somebody else has won.

Connection states, handled in one place (`_reconcile`):
  CONNECTED  re-read /controller (and re-set the watch kazoo dropped on disconnect); become
             active if it is ours, follower otherwise, run if it is absent.
  SUSPENDED  role -> SUSPENDED: the session may still hold /controller, but nothing we write
             would land, so callers must not act as controller (`is_active` is False). If the
             session survives, CONNECTED restores ACTIVE with the same epoch.
  LOST       the session and its /controller are gone: resign (on_resigned), then run again
             in the new session, which gives a new epoch.
Watches and the listener only set `_wake`; the loop thread re-reads and decides, and it is
the only thread that calls on_elected / on_resigned.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordination.errors import CoordinationError
from coordination.session import ZkClient
from coordination.zk_layout import (CONTROLLER_EPOCH_PATH, CONTROLLER_PATH, ControllerInfo,
                                    decode_int, encode_int, now_ms)

log = logging.getLogger(__name__)

#: Bound on multi-op attempts in one election round (each lost attempt means somebody else
#: changed /controller_epoch; the next round starts when the loop wakes again).
MAX_ELECTION_ATTEMPTS = 5
#: Epoch value written when /controller_epoch is absent; the first winner makes it 1.
INITIAL_CONTROLLER_EPOCH = 0


class ControllerRole(enum.Enum):
    FOLLOWER = "follower"     # someone else (or nobody yet) is the controller
    ACTIVE = "active"         # we hold /controller in our live, connected session
    SUSPENDED = "suspended"   # we held it, the connection dropped, the session may survive
    CLOSED = "closed"


@dataclass(frozen=True)
class ControllerStatus:
    """A consistent snapshot of a candidate's view."""
    role: ControllerRole
    epoch: int | None              # our controller epoch while ACTIVE/SUSPENDED
    epoch_zk_version: int | None   # zk version of /controller_epoch when we won
    controller_id: int | None      # broker id in /controller as last read (ours if active)


def read_controller(zk: ZkClient) -> ControllerInfo | None:
    """Who is controller now, or None."""
    try:
        data, _ = zk.get(CONTROLLER_PATH)
    except NoNodeError:
        return None
    return ControllerInfo.from_bytes(data)


def read_controller_epoch(zk: ZkClient) -> tuple[int, int] | None:
    """(epoch, zk version) of /controller_epoch, or None before the first election."""
    try:
        data, stat = zk.get(CONTROLLER_EPOCH_PATH)
    except NoNodeError:
        return None
    return decode_int(CONTROLLER_EPOCH_PATH, data), stat.version


class ControllerCandidate:
    """Runs for controller on behalf of `broker_id` for as long as it is open.

    Callbacks run on the candidate's loop thread: `on_elected(epoch)` when this candidate
    becomes active, `on_resigned()` when it stops being active for good (session lost, node
    taken, close). They must not block for long; the loop waits for them.
    """

    def __init__(self, zk: ZkClient, *, broker_id: int,
                 on_elected: Callable[[int], None] | None = None,
                 on_resigned: Callable[[], None] | None = None,
                 check_interval_s: float = 1.0):
        self.zk = zk
        self.broker_id = broker_id
        self.on_elected = on_elected
        self.on_resigned = on_resigned
        self.check_interval_s = check_interval_s
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._active = threading.Event()
        self._lock = threading.Lock()   # guards the status fields below for readers
        self._role = ControllerRole.FOLLOWER
        self._epoch: int | None = None
        self._epoch_zk_version: int | None = None
        self._controller_id: int | None = None
        self._session_lost = False      # set by the listener, consumed by the loop
        self._thread: threading.Thread | None = None
        #: The last operating error the loop met (None when healthy).
        self.error: CoordinationError | None = None

    # -- public ----------------------------------------------------------------------------

    def status(self) -> ControllerStatus:
        with self._lock:
            return ControllerStatus(self._role, self._epoch, self._epoch_zk_version,
                                    self._controller_id)

    @property
    def is_active(self) -> bool:
        return self._active.is_set()

    @property
    def epoch(self) -> int | None:
        return self.status().epoch

    @property
    def epoch_zk_version(self) -> int | None:
        return self.status().epoch_zk_version

    def wait_active(self, *, timeout_s: float) -> bool:
        return self._active.wait(timeout=timeout_s)

    def start(self) -> ControllerCandidate:
        if self._thread is not None:
            raise RuntimeError("ControllerCandidate already started")
        self.zk.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"controller-candidate-{self.broker_id}")
        self._wake.set()   # run the first round at once
        self._thread.start()
        return self

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop running; if active, delete /controller so another broker takes over now."""
        self._closed.set()
        self._wake.set()
        self.zk.remove_listener(self._on_state)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        was_active = self.status().role in (ControllerRole.ACTIVE, ControllerRole.SUSPENDED)
        self._set(ControllerRole.CLOSED, None, None, self._controller_id)
        if was_active:
            self._delete_own_node(timeout_s)
            self._call(self.on_resigned)

    # -- the loop --------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: flags only.
        if state == KazooState.LOST:
            self._session_lost = True
        if state != KazooState.CONNECTED:
            self._active.clear()
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
                self._reconcile()
                self.error = None
            except CoordinationError as exc:
                self.error = exc   # ZooKeeper unreachable: the next wake or tick retries
            except Exception:   # noqa: BLE001 - a bug must not end the candidacy silently
                log.exception("controller candidate %s: loop error", self.broker_id)
                time.sleep(0.1)   # bounded spin on a persistent bug

    def _reconcile(self) -> None:
        """One round: observe the connection and /controller, then decide."""
        role = self.status().role
        if self._session_lost:
            # The old session's /controller is gone; whatever we were, we are not any more.
            self._session_lost = False
            if role in (ControllerRole.ACTIVE, ControllerRole.SUSPENDED):
                self._resign("session lost")
                role = ControllerRole.FOLLOWER
        state = self.zk.state
        if state != KazooState.CONNECTED:
            if role == ControllerRole.ACTIVE:
                self._set(ControllerRole.SUSPENDED, self._epoch, self._epoch_zk_version,
                          self.broker_id)
            return
        stat = self.zk.exists(CONTROLLER_PATH, watch=self._on_watch)
        if stat is None:
            self._run_for_controller()
            return
        try:
            data, stat = self.zk.get(CONTROLLER_PATH)
        except NoNodeError:
            self._wake.set()   # vanished between exists and get: next round runs
            return
        info = ControllerInfo.from_bytes(data)
        if stat.ephemeralOwner == self.zk.session_id:
            if role == ControllerRole.FOLLOWER:
                self._become_active_from_zk()
            else:
                # Resumed after SUSPENDED in the same session: same epoch, no new election.
                self._set(ControllerRole.ACTIVE, self._epoch, self._epoch_zk_version,
                          self.broker_id)
            return
        if role in (ControllerRole.ACTIVE, ControllerRole.SUSPENDED):
            self._resign(f"/controller now held by broker {info.broker_id}")
        self._set(ControllerRole.FOLLOWER, None, None, info.broker_id)

    def _run_for_controller(self) -> None:
        """Up to MAX_ELECTION_ATTEMPTS multi-ops: create /controller + bump the epoch."""
        body = ControllerInfo(broker_id=self.broker_id, timestamp_ms=now_ms()).to_bytes()
        for _ in range(MAX_ELECTION_ATTEMPTS):
            current = read_controller_epoch(self.zk)
            if current is None:
                try:
                    self.zk.create(CONTROLLER_EPOCH_PATH, encode_int(INITIAL_CONTROLLER_EPOCH))
                except NodeExistsError:
                    pass   # another candidate created it first: read it again
                continue
            epoch, version = current
            txn = self.zk.transaction()
            txn.create(CONTROLLER_PATH, body, ephemeral=True)
            txn.set_data(CONTROLLER_EPOCH_PATH, encode_int(epoch + 1), version=version)
            results = self.zk.commit(txn)
            if not any(isinstance(r, Exception) for r in results):
                self._set(ControllerRole.ACTIVE, epoch + 1, version + 1, self.broker_id)
                log.info("broker %s elected controller, epoch %s", self.broker_id, epoch + 1)
                self._call(self.on_elected, epoch + 1)
                return
            if isinstance(results[0], NodeExistsError):
                self._wake.set()   # somebody else won: the next round reads who
                return
            if isinstance(results[1], BadVersionError):
                continue   # the epoch moved under us: read it again
            raise CoordinationError(f"controller election multi-op failed: {results}")
        self._wake.set()

    def _become_active_from_zk(self) -> None:
        """/controller is ours but we did not record winning (an ambiguous multi-op that did
        land): the epoch in ZooKeeper is the one it wrote."""
        current = read_controller_epoch(self.zk)
        if current is None:
            raise CoordinationError("/controller is ours but /controller_epoch is missing")
        epoch, version = current
        self._set(ControllerRole.ACTIVE, epoch, version, self.broker_id)
        self._call(self.on_elected, epoch)

    def _resign(self, why: str) -> None:
        log.info("broker %s resigns as controller: %s", self.broker_id, why)
        self._set(ControllerRole.FOLLOWER, None, None, None)
        self._call(self.on_resigned)

    def _set(self, role: ControllerRole, epoch, epoch_zk_version, controller_id) -> None:
        with self._lock:
            self._role, self._epoch = role, epoch
            self._epoch_zk_version, self._controller_id = epoch_zk_version, controller_id
        if role == ControllerRole.ACTIVE:
            self._active.set()
        else:
            self._active.clear()

    def _delete_own_node(self, timeout_s: float) -> None:
        try:
            stat = self.zk.exists(CONTROLLER_PATH, timeout_s=timeout_s)
            if stat is not None and stat.ephemeralOwner == self.zk.session_id:
                self.zk.delete(CONTROLLER_PATH, version=stat.version, timeout_s=timeout_s)
        except (CoordinationError, NoNodeError, BadVersionError) as exc:
            log.info("/controller not deleted on close (%r); it goes with the session", exc)

    def _call(self, callback, *args) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:   # noqa: BLE001 - the candidate outlives a faulty callback
            log.exception("controller candidate %s: callback failed", self.broker_id)
