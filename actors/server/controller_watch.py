"""ActiveControllerWatch: a standby controller sees the active controller's actor die from
Ray, and ends that controller's ZooKeeper session so that a new one is elected at once.

Without it, a killed active controller (its broker killed, or the actor alone) keeps
/controller until its session times out (zookeeper.session.timeout.ms, 6 s by default):
for that long nobody elects leaders for the partitions the dead broker led, although the
brokers' deaths themselves are seen from Ray within milliseconds.

How, on each standby candidate (the thread runs in every Controller actor, and acts only
while another broker holds /controller):

1. read /controller's owner session (``ephemeralOwner``) and ask the holder's Controller
   actor for its session credentials (``Controller.session_credentials``); the watch is
   armed only when they name that very session (a restarted Controller of the same broker
   has another one);
2. keep one pending ``Controller.await_stop`` call on it: Ray fails it the moment the
   actor dies (ActorDiedError: dead, not merely unreachable);
3. then, if /controller is still owned by that session, end the session with its
   credentials (``coordination.session.end_session``): /controller goes, and every
   candidate's watch fires an election.

Only Ray's word that the process is dead ends a session: a paused or partitioned
controller is left to its session timeout, as before, and if Ray wrongly declared a live
controller dead (its node cut off), ending its session is exactly the fencing it needs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from coordination.election import ControllerRole as CandidateRole
from coordination.session import ZkSettings, end_session
from coordination.zk_layout import CONTROLLER_PATH

from ..protocol import controller_actor_name
from .channel import _actor_died

log = logging.getLogger(__name__)

#: How long one ``await_stop`` call waits before it answers "running" (asked again).
WATCH_CALL_S = 30.0
#: How often the watch re-checks who holds /controller (and retries a failed arming).
RECHECK_S = 0.5


@dataclass
class _Armed:
    owner: int                    # the session that holds /controller
    credentials: tuple[int, bytes]
    handle: Any
    ref: Any


class ActiveControllerWatch:
    """``ActiveControllerWatch(zk, candidate, settings, namespace=, broker_id=)``;
    ``start()`` runs its thread, ``stop()`` ends it. ``sessions_ended`` counts the dead
    controllers' sessions it ended."""

    def __init__(self, zk, candidate, settings: ZkSettings, *, namespace: str,
                 broker_id: int):
        self.zk = zk
        self.candidate = candidate
        self.settings = settings
        self.namespace = namespace
        self.broker_id = broker_id
        self.sessions_ended = 0
        self._armed: _Armed | None = None
        self._unwatchable: int | None = None     # an owner we could not arm for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"active-controller-watch-{broker_id}")

    def start(self) -> "ActiveControllerWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a standby's helper must not die
                log.debug("controller watch %d: %r", self.broker_id, exc)
                self._armed = None
                self._stop.wait(RECHECK_S)

    def step(self) -> None:
        """Arm on the current holder of /controller, wait up to RECHECK_S for its death."""
        import ray
        status = self.candidate.status()
        holder = status.controller_id
        if (status.role != CandidateRole.FOLLOWER or holder is None
                or holder == self.broker_id):
            self._armed = None
            self._stop.wait(RECHECK_S)
            return
        owner = self._owner()
        if owner is None:
            self._armed = None
            self._stop.wait(RECHECK_S)
            return
        if self._armed is None or self._armed.owner != owner:
            self._armed = self._arm(holder, owner)
            if self._armed is None:
                self._stop.wait(RECHECK_S)
                return
        ready, _ = ray.wait([self._armed.ref], timeout=RECHECK_S)
        if not ready:
            return
        armed = self._armed
        try:
            ray.get(armed.ref, timeout=0)
        except Exception as exc:  # noqa: BLE001 - only a proven death acts
            if _actor_died(exc):
                self._end(armed)
                self._armed = None
                return
            self._stop.wait(RECHECK_S)
        # "running" (ask again) or "stopped" (a clean close deletes /controller itself)
        armed.ref = armed.handle.await_stop.remote(WATCH_CALL_S)

    def _owner(self) -> int | None:
        stat = self.zk.exists(CONTROLLER_PATH)
        return stat.ephemeralOwner if stat is not None and stat.ephemeralOwner else None

    def _arm(self, holder: int, owner: int) -> _Armed | None:
        import ray
        if self._unwatchable == owner:
            return None
        try:
            handle = ray.get_actor(controller_actor_name(holder), namespace=self.namespace)
            credentials = ray.get(handle.session_credentials.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - no such actor (any more): the timeout decides
            self._unwatchable = owner
            return None
        if not credentials or credentials[0] != owner:
            # the actor of that name holds another session (a restarted Controller): the
            # owner's process is gone or unknown here; its session times out by itself
            self._unwatchable = owner
            return None
        return _Armed(owner, tuple(credentials), handle,
                      handle.await_stop.remote(WATCH_CALL_S))

    def _end(self, armed: _Armed) -> None:
        if self._owner() != armed.owner:
            return
        started = time.monotonic()
        if end_session(self.settings, armed.credentials):
            self.sessions_ended += 1
            log.warning("controller watch %d: the active controller's actor died; ended its "
                        "ZooKeeper session 0x%x in %.2fs", self.broker_id, armed.owner,
                        time.monotonic() - started)
