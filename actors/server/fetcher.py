"""ReplicaFetcher: a follower replica's fetch thread (Kafka's ReplicaFetcherThread, one per
follower partition here, since one actor owns one replica).

What one fetcher does, for one (leader, leader epoch) target:

1. finds the leader's replica actor by name (``protocol.replica_actor_name``);
2. truncates the local log by leader epoch (KIP-101 with KIP-279's repeat): it asks the
   leader ``offsets_for_leader_epoch(own latest epoch)``; when the answer names another
   epoch it asks again for the largest own epoch <= that one, until both agree; then it
   truncates to min(leader end offset, own end offset of that epoch, own LEO). Never to the
   own HW, except when the leader knows no epoch at all (-1), the pre-KIP-101 fallback;
3. loops ``replica_fetch(own LEO, ...)`` with ``replica.fetch.wait.max.ms`` as the long poll
   and hands every answer to the replica (``FollowerSide.apply_fetch``: append with the
   leader's offsets and epochs, learn the HW);
4. on a fenced or unknown epoch, a leader that is not (yet) the leader, a dead or missing
   leader actor, or any other failure, backs off ``replica.fetch.backoff.ms`` and retries
   (re-resolving the actor after a failure), until ``stop``; a new LeaderAndIsr replaces
   the fetcher (the replica stops this one and starts another).

Every change to the local log goes through the replica with this fetcher's ``generation``:
once the replica has moved on (new leader, became leader, stopped) the answer is False and
the thread ends, so a late fetch answer can never touch the log.

The leader is reached through a ``LeaderLink`` (Ray in production: ``RayLeaderLink``), so
the algorithm above is testable with fakes.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import (FencedLeaderEpochError, InvalidRecordError, KafkaStorageError,
                      LeaderNotAvailableError, NotLeaderForPartitionError,
                      OffsetOutOfRangeError, UnknownLeaderEpochError)
from ..protocol import EpochEndOffset, ReplicaFetchResult, replica_actor_name, unwrap

log = logging.getLogger(__name__)

MAX_TRUNCATION_ROUNDS = 64          # KIP-279 rounds: one per epoch the two logs disagree on
REQUEST_TIMEOUT_S = 30.0            # beyond the long poll itself
LOG_EVERY_S = 30.0                  # the same failure is logged at most this often


@dataclass(frozen=True)
class FetcherSettings:
    """The broker's replica.fetch.* settings (Kafka's names; backoff shorter than Kafka's
    1000 ms, since a Ray call is cheap)."""

    wait_max_ms: int = 500          # replica.fetch.wait.max.ms
    backoff_ms: int = 100           # replica.fetch.backoff.ms
    max_bytes: int = 1 << 20        # replica.fetch.max.bytes
    response_max_bytes: int = 10 << 20   # replica.fetch.response.max.bytes

    @classmethod
    def from_config(cls, conf: dict | None) -> "FetcherSettings":
        conf = conf or {}
        return cls(int(conf.get("replica.fetch.wait.max.ms", cls.wait_max_ms)),
                   int(conf.get("replica.fetch.backoff.ms", cls.backoff_ms)),
                   int(conf.get("replica.fetch.max.bytes", cls.max_bytes)),
                   int(conf.get("replica.fetch.response.max.bytes", cls.response_max_bytes)))


class LeaderLink(Protocol):
    """The calls a fetcher makes to its leader; each raises the leader's typed error."""

    def offsets_for_leader_epoch(self, leader_epoch: int) -> EpochEndOffset: ...

    def replica_fetch(self, follower_id: int, fetch_offset: int, leader_epoch: int,
                      max_bytes: int, max_wait_ms: int) -> ReplicaFetchResult: ...

    def log_offsets(self) -> tuple[int, int]: ...   # (log_start_offset, log_end_offset)

    def reset(self) -> None: ...                    # forget a cached handle after a failure


class FollowerSide(Protocol):
    """What the fetcher asks of its replica. Every call takes the fetcher's generation and
    answers None/False once the replica has moved on."""

    def follower_position(self, generation: int) -> tuple[int, int] | None: ...
    # -> (log end offset, high watermark)

    def epoch_end_offset(self, generation: int, epoch: int) -> tuple[int, int] | None: ...
    # -> own (largest epoch <= epoch, its end offset); None when stale

    def latest_epoch(self, generation: int) -> int | None: ...

    def truncate(self, generation: int, offset: int) -> bool: ...

    def truncate_fully(self, generation: int, offset: int) -> bool: ...

    def apply_fetch(self, generation: int, fetch_offset: int,
                    result: ReplicaFetchResult) -> bool: ...


def truncation_offset(side: FollowerSide, link, generation: int, name: str) -> int | None:
    """Where a follower's log must be cut to agree with its leader (KIP-101 with KIP-279's
    repeat, step 2 of the module docstring); None when the replica moved on from
    ``generation``. ``link.offsets_for_leader_epoch(epoch)`` asks the leader (over Ray here,
    over Kafka's OffsetForLeaderEpoch in a broker's fetcher)."""
    position = side.follower_position(generation)
    asked = side.latest_epoch(generation)
    if position is None or asked is None:
        return None
    leo, hw = position
    if asked < 0:
        # no epochs here: an empty log needs nothing; data without epochs (written before
        # epochs existed) can only be trusted up to the HW
        return leo if leo == 0 else min(hw, leo)
    for _ in range(MAX_TRUNCATION_ROUNDS):
        answer = link.offsets_for_leader_epoch(asked)
        if answer.leader_epoch < 0 or answer.end_offset < 0:
            return min(hw, leo)                     # the leader knows no epoch: old rule
        own = side.epoch_end_offset(generation, answer.leader_epoch)
        if own is None:
            return None
        own_epoch, own_end = own
        if own_epoch == answer.leader_epoch:
            return min(answer.end_offset, own_end, leo)
        if own_epoch < 0 or own_epoch >= asked:
            # nothing here at or below the leader's epoch: keep what the leader has
            return min(answer.end_offset, leo)
        asked = own_epoch                           # KIP-279: ask again for our older epoch
    raise RuntimeError(f"{name}: epochs still disagree after {MAX_TRUNCATION_ROUNDS} rounds")


class ReplicaFetcher:
    """The fetch thread of one follower replica for one leader epoch (module docstring)."""

    def __init__(self, side: FollowerSide, link: LeaderLink, *, follower_id: int,
                 leader_id: int, leader_epoch: int, generation: int,
                 settings: FetcherSettings, name: str):
        self.side = side
        self.link = link
        self.follower_id = follower_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.generation = generation
        self.settings = settings
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"fetcher-{name}")
        self.truncated_to: int | None = None       # where the epoch truncation cut (tests)
        self.fetches = 0
        self._logged: dict[str, float] = {}

    def start(self) -> "ReplicaFetcher":
        self._thread.start()
        return self

    def stop(self, join_timeout_s: float = 0.0) -> None:
        """Ask the thread to end; it does once its call in flight answers (at most the long
        poll plus the request timeout), and never touches the log after this."""
        self._stop.set()
        if join_timeout_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def targets(self, leader_id: int, leader_epoch: int) -> bool:
        return self.alive and (self.leader_id, self.leader_epoch) == (leader_id, leader_epoch)

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        truncated = False
        while not self._stop.is_set():
            try:
                if not truncated:
                    if not self._truncate_by_epoch():
                        return
                    truncated = True
                if not self._fetch_once():
                    return
            except OffsetOutOfRangeError as exc:
                if not self._handle_out_of_range(exc):
                    return
            except (FencedLeaderEpochError, UnknownLeaderEpochError,
                    NotLeaderForPartitionError, LeaderNotAvailableError) as exc:
                self._note("leader", f"{self.name}: leader {self.leader_id} answered {exc!r}; "
                           f"retrying", level=logging.DEBUG)
                self._backoff()
            except InvalidRecordError as exc:
                # batches that do not follow our LEO: our log and the leader's disagree where
                # we thought they agreed; truncate by epoch again before fetching
                self._note("invalid", f"{self.name}: leader {self.leader_id}'s batches do not "
                           f"fit our log ({exc}); truncating by epoch again")
                truncated = False
                self._backoff()
            except KafkaStorageError as exc:   # our own log is closing: the replica stops us
                self._note("storage", f"{self.name}: {exc}")
                self._backoff()
            except Exception as exc:  # noqa: BLE001 - a dead leader, a timeout: retry, bounded
                self.link.reset()
                self._note(type(exc).__name__,
                           f"{self.name}: fetch from broker {self.leader_id} failed: {exc!r}")
                self._backoff()

    def _backoff(self) -> None:
        self._stop.wait(self.settings.backoff_ms / 1000)

    def _note(self, key: str, message: str, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        if now - self._logged.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[key] = now
            log.log(level, message)

    def _fetch_once(self) -> bool:
        position = self.side.follower_position(self.generation)
        if position is None:
            return False
        fetch_offset, _ = position
        s = self.settings
        result = self.link.replica_fetch(self.follower_id, fetch_offset, self.leader_epoch,
                                         s.max_bytes, s.wait_max_ms)
        if self._stop.is_set():
            return False
        self.fetches += 1
        return self.side.apply_fetch(self.generation, fetch_offset, result)

    # -- truncation (KIP-101, KIP-279) --------------------------------------------------------
    def truncation_offset(self) -> int | None:
        """Where this follower's log must be cut to agree with the leader (None: moved on)."""
        return truncation_offset(self.side, self.link, self.generation, self.name)

    def _truncate_by_epoch(self) -> bool:
        target = self.truncation_offset()
        if target is None:
            return False
        if not self.side.truncate(self.generation, target):
            return False
        self.truncated_to = target
        return True

    def _handle_out_of_range(self, exc: Exception) -> bool:
        """The leader refused our fetch offset: below its log start -> start over at its log
        start; past its LEO (an unclean election lost records) -> cut to its LEO."""
        position = self.side.follower_position(self.generation)
        if position is None:
            return False
        leo, _ = position
        try:
            leader_start, leader_end = self.link.log_offsets()
        except Exception as err:  # noqa: BLE001 - retried after the backoff
            self._note("offsets", f"{self.name}: leader offsets unavailable: {err!r}")
            self._backoff()
            return True
        if leo > leader_end:
            log.warning("%s: LEO %d is past leader %d's LEO %d: truncating to it",
                        self.name, leo, self.leader_id, leader_end)
            return self.side.truncate(self.generation, leader_end)
        if leo < leader_start:
            log.info("%s: LEO %d is below leader %d's log start %d: starting over there",
                     self.name, leo, self.leader_id, leader_start)
            return self.side.truncate_fully(self.generation, leader_start)
        self._note("range", f"{self.name}: fetch out of range ({exc}); retrying")
        self._backoff()
        return True


class RayLeaderLink:
    """LeaderLink through Ray: the leader's replica actor, found by name in ``namespace``.
    Without a running Ray (in-process tests) every call raises LeaderNotAvailableError."""

    def __init__(self, namespace: str | None, topic: str, partition: int, leader_id: int):
        self.namespace = namespace
        self.name = replica_actor_name(topic, partition, leader_id)
        self._handle = None

    def _leader(self):
        if self._handle is None:
            ray = sys.modules.get("ray")
            if ray is None or not ray.is_initialized():
                raise LeaderNotAvailableError("no Ray here: the leader cannot be reached")
            try:
                self._handle = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                raise LeaderNotAvailableError(f"no actor {self.name!r} (yet)") from None
        return self._handle

    def _call(self, method: str, *args, timeout_s: float):
        import ray
        handle = self._leader()
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - the leader's typed error, unwrapped
            raise unwrap(exc) from None

    def offsets_for_leader_epoch(self, leader_epoch):
        return self._call("offsets_for_leader_epoch", leader_epoch,
                          timeout_s=REQUEST_TIMEOUT_S)

    def replica_fetch(self, follower_id, fetch_offset, leader_epoch, max_bytes, max_wait_ms):
        return self._call("replica_fetch", follower_id, fetch_offset, leader_epoch, max_bytes,
                          max_wait_ms, timeout_s=max_wait_ms / 1000 + REQUEST_TIMEOUT_S)

    def log_offsets(self):
        state = self._call("state", timeout_s=REQUEST_TIMEOUT_S)
        return state["log_start_offset"], state["log_end_offset"]

    def reset(self):
        self._handle = None
