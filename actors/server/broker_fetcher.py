"""The follower broker's replication over Kafka's protocol (Kafka's ReplicaFetcherManager
and ReplicaFetcherThread).

A broker that follows partitions led elsewhere runs ONE fetcher thread per leader broker.
The thread holds one Kafka connection (actors.connection) to that broker's listener and
sends one Fetch for every partition it follows there (``replica_id`` = this broker's id,
``current_leader_epoch`` = the epoch it follows in, long-polled up to
``replica.fetch.wait.max.ms`` in the leader's purgatory). The leader's broker relays each
partition to its leader replica (replica_channel REPLICA_FETCH: the follower's position is
recorded, which moves the high watermark and the ISR), and this thread hands each
partition's bytes, untouched, to the local follower replica over its channel (APPLY: the
replica appends with the leader's offsets and epochs, learns the high watermark). The
appends of one round go out together and are awaited together; the next Fetch carries the
new log end offsets, which is how the leader learns them (as in Kafka).

Per partition, the algorithm is fetcher.py's (the single-replica fetcher), moved here:

1. on joining the thread (a new leader or epoch) the partition first truncates by leader
   epoch (KIP-101/279): ``fetcher.truncation_offset`` with the leader asked through
   OffsetForLeaderEpoch on the same connection and the local replica over its channel
   (replica_channel FOLLOWER; rare: once per leader change);
2. then it is fetched every round; an answer with records goes to the replica (APPLY,
   awaited: the next Fetch carries the new log end), one with only a new high watermark
   too, but without an answer to wait for (HW: a message instead of a round trip);
3. errors per partition: OFFSET_OUT_OF_RANGE cuts to the leader's log end or starts over at
   its log start (both asked with ListOffsets on the same connection, our broker id as
   ``replica_id``, so latest is the leader's log end offset); a fenced or unknown epoch,
   a leader that is not (yet) the leader, a failed append or a dead replica channel
   delays the partition ``replica.fetch.backoff.ms`` (it leaves the Fetch until then, so
   one bad partition never turns the long poll into a busy loop); batches that do not
   follow the replica's log end make it truncate again.
   A partition whose appends keep failing is logged at WARNING with the error (after
   ``FAILURES_BEFORE_WARNING`` in a row, then at most every ``LOG_EVERY_S``; truncations
   that keep failing after ``TRUNCATION_FAILURES_BEFORE_WARNING``, as a new leader may
   take a while to be ready), and after every that many failed appends in a row it
   truncates by epoch again (its position asked from the replica afresh) rather than
   only retrying the same append.

Every change to a replica's log carries the ``generation`` that replica answered when it
became a follower (``PartitionReplica.become_follower(fetch=False)``); once it has moved on
(leader, another leader or epoch, stopped) the replica refuses, and the partition leaves
the thread. ``follow``/``unfollow`` come from the broker's ReplicaManager after each
LeaderAndIsr and StopReplica.

The local replicas are reached through ``LocalReplicas`` (Ray for a channel's address,
then the replica channels, in production), the leader brokers' addresses through
``endpoint(broker_id)``, so the rules above are tested with in-process replicas and
listeners.

Thread-safety: ``follow``/``unfollow``/``status``/``close`` from any thread; each fetcher
thread owns its connection; its partition table is guarded by its condition.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .. import wire
from ..connection import PLAINTEXT, ClientSecurity, KafkaConnection
from ..errors import (FencedLeaderEpochError, InvalidRecordError, NetworkError,
                      NotLeaderForPartitionError)
from ..protocol import EpochEndOffset
from .fetcher import FetcherSettings, truncation_offset
from .replica_channel import (F_EPOCH_END, F_LATEST_EPOCH, F_POSITION, F_TRUNCATE,
                              F_TRUNCATE_FULLY)

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0            # beyond the long poll itself
APPLY_TIMEOUT_S = 30.0
LOG_EVERY_S = 30.0
FAILURES_BEFORE_WARNING = 5         # failed appends in a row before a WARNING
TRUNCATION_FAILURES_BEFORE_WARNING = 50   # (about 5 s of replica.fetch.backoff.ms)
_OUT_OF_RANGE = wire.ERRORS_BY_NAME["OFFSET_OUT_OF_RANGE"].code
LATEST, EARLIEST = -1, -2           # ListOffsets timestamps


class LocalReplicas(Protocol):
    """How a fetcher reaches this broker's follower replicas and, rarely, a leader's."""

    def channel(self, handle) -> Any:
        """An open ReplicaChannel to the replica (a new one after the last died), for the
        fetcher thread alone: without a reader thread, answers read with ``result``. It
        carries the appends (APPLY, HW) and the truncation calls (FOLLOWER)."""


@dataclass
class _Followed:
    """One partition a fetcher thread fetches, and where it stands."""

    topic: str
    partition: int
    leader_id: int
    leader_epoch: int
    generation: int
    handle: Any
    fetch_offset: int = -1
    high_watermark: int = -1
    truncating: bool = True
    delayed_until: float = 0.0
    channel: Any = None
    failures: int = 0               # failed appends or truncations in a row

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def same(self, leader_id: int, leader_epoch: int, generation: int, handle) -> bool:
        return (self.leader_id, self.leader_epoch, self.generation) == \
            (leader_id, leader_epoch, generation) and self.handle is handle


class _WireLeader:
    """fetcher.LeaderLink's ``offsets_for_leader_epoch`` over the fetcher's connection."""

    def __init__(self, conn: KafkaConnection, broker_id: int, p: _Followed):
        self.conn, self.broker_id, self.p = conn, broker_id, p

    def offsets_for_leader_epoch(self, leader_epoch: int) -> EpochEndOffset:
        body = {"replica_id": self.broker_id, "topics": [{"topic": self.p.topic, "partitions": [
            {"partition": self.p.partition, "current_leader_epoch": self.p.leader_epoch,
             "leader_epoch": leader_epoch}]}]}
        part = self._ask(wire.OFFSET_FOR_LEADER_EPOCH, body, "OffsetForLeaderEpoch")
        return EpochEndOffset(part["leader_epoch"], part["end_offset"])

    def log_offset(self, timestamp: int) -> int:
        """The leader's log end (LATEST: a ListOffsets with our broker id as replica_id
        is answered the LEO, not the HW) or log start (EARLIEST) offset."""
        body = {"replica_id": self.broker_id, "isolation_level": 0, "topics": [
            {"name": self.p.topic, "partitions": [
                {"partition_index": self.p.partition,
                 "current_leader_epoch": self.p.leader_epoch, "timestamp": timestamp}]}]}
        return self._ask(wire.LIST_OFFSETS, body, "ListOffsets")["offset"]

    def _ask(self, api: int, body: dict, name: str) -> dict:
        """The one partition's answer to a request about it; its error code raised."""
        answer = self.conn.request(api, body).result(REQUEST_TIMEOUT_S)
        part = answer["topics"][0]["partitions"][0]
        error = wire.error_for_code(part["error_code"], f"{self.p.topic}-{self.p.partition}: "
                                    f"{name} from broker {self.p.leader_id}")
        if error is not None:
            raise error
        return part


class _ChannelSide:
    """FollowerSide's truncation calls (all but ``apply_fetch``) over the follower
    replica's channel (replica_channel FOLLOWER), answered in order with its appends."""

    def __init__(self, channel):
        self.channel = channel

    def _call(self, call: int, generation: int, argument: int = 0):
        return self.channel.result(self.channel.follower_call(call, generation, argument),
                                   REQUEST_TIMEOUT_S)

    def follower_position(self, generation):
        return self._call(F_POSITION, generation)

    def latest_epoch(self, generation):
        found = self._call(F_LATEST_EPOCH, generation)
        return None if found is None else found[0]

    def epoch_end_offset(self, generation, epoch):
        return self._call(F_EPOCH_END, generation, epoch)

    def truncate(self, generation, offset):
        return self._call(F_TRUNCATE, generation, offset) is not None

    def truncate_fully(self, generation, offset):
        return self._call(F_TRUNCATE_FULLY, generation, offset) is not None


class BrokerFetcherThread:
    """The fetch loop toward one leader broker (see the module docstring)."""

    def __init__(self, manager: "BrokerFetcherManager", leader_id: int):
        self.manager = manager
        self.leader_id = leader_id
        self.settings = manager.settings
        self.name = f"broker-{manager.broker_id}-fetcher-{leader_id}"
        self._cond = threading.Condition()
        self._partitions: dict[tuple[str, int], _Followed] = {}
        self._stop = False
        self._conn: KafkaConnection | None = None
        self._logged: dict[str, float] = {}
        self.fetches = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
        self._thread.start()

    # -- the table (any thread) -------------------------------------------------------------
    def add(self, p: _Followed) -> None:
        with self._cond:
            self._partitions[p.key] = p
            self._cond.notify_all()

    def remove(self, key: tuple[str, int]) -> _Followed | None:
        with self._cond:
            return self._partitions.pop(key, None)

    def get(self, key: tuple[str, int]) -> _Followed | None:
        with self._cond:
            return self._partitions.get(key)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        conn = self._conn
        if conn is not None:
            conn.close()                 # a long poll in flight ends now

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def status(self) -> dict:
        with self._cond:
            parts = {f"{t}-{p}": {"fetch_offset": f.fetch_offset, "truncating": f.truncating,
                                  "leader_epoch": f.leader_epoch}
                     for (t, p), f in self._partitions.items()}
        conn = self._conn
        return {"leader": self.leader_id, "partitions": parts, "fetches": self.fetches,
                "connected": conn is not None and conn.alive}

    def _current(self, p: _Followed) -> bool:
        with self._cond:
            return self._partitions.get(p.key) is p and not self._stop

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    break
                now = time.monotonic()
                ready = [p for p in self._partitions.values() if p.delayed_until <= now]
                if not ready:
                    waits = [p.delayed_until - now for p in self._partitions.values()]
                    self._cond.wait(min(waits) if waits else None)
                    continue
            try:
                conn = self._connection()
                for p in ready:
                    if p.truncating and self._current(p):
                        self._truncate(conn, p)
                fetching = [p for p in ready if not p.truncating and self._current(p)
                            and p.delayed_until <= time.monotonic()]
                if fetching:
                    self._fetch(conn, fetching)
            except Exception as exc:  # noqa: BLE001 - a dead leader broker, a timeout
                self._drop_connection()
                self._note(type(exc).__name__, f"{self.name}: fetch from broker "
                           f"{self.leader_id} failed: {exc!r}; retrying")
                self._delay(ready)
        self._drop_connection()

    def _connection(self) -> KafkaConnection:
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        address = self.manager.endpoint(self.leader_id)
        if address is None:
            raise NetworkError(f"no listener known for broker {self.leader_id} (yet)")
        # read on this thread (no reader thread to hand each response over): a read
        # waits at most a long poll plus the request timeout
        conn = KafkaConnection(address[0], address[1],
                               client_id=f"broker-{self.manager.broker_id}-fetcher",
                               security=self.manager.security, reader_thread=False,
                               read_timeout_s=self.settings.wait_max_ms / 1000
                               + REQUEST_TIMEOUT_S)
        with self._cond:
            if self._stop:
                conn.close()
                raise NetworkError("stopping")
            self._conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _delay(self, partitions) -> None:
        until = time.monotonic() + self.settings.backoff_ms / 1000
        for p in partitions:
            p.delayed_until = until

    def _note(self, key: str, message: str, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        if now - self._logged.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[key] = now
            log.log(level, message)

    def _channel(self, p: _Followed):
        if p.channel is None or not p.channel.alive:
            p.channel = self.manager.local.channel(p.handle)
        return p.channel

    def _drop_channel(self, p: _Followed) -> None:
        """Close the partition's channel (the next round opens a new one): an abandoned
        channel would keep its socket and a reader thread on both ends."""
        channel, p.channel = p.channel, None
        if channel is not None:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - already failed
                pass

    def _failed(self, p: _Followed, what: str, exc: BaseException,
                warn_after: int = FAILURES_BEFORE_WARNING) -> None:
        """One more failed append or truncation of ``p`` in a row: DEBUG at first (a
        replica stopping, a leader not ready yet are routine), WARNING once ``warn_after``
        of them came in a row (rate-limited per partition), with the error."""
        p.failures += 1
        if p.failures < warn_after:
            log.debug("%s: %s-%d: %s failed (%r)", self.name, p.topic, p.partition, what, exc)
            return
        self._note(f"failing-{p.key}", f"{self.name}: {p.topic}-{p.partition}: {what} "
                   f"failed {p.failures} times in a row at offset {p.fetch_offset} "
                   f"(leader {p.leader_id}, epoch {p.leader_epoch}, generation "
                   f"{p.generation}): {exc!r}")

    # -- truncation (step 1) ----------------------------------------------------------------
    def _truncate(self, conn: KafkaConnection, p: _Followed) -> None:
        try:
            side = _ChannelSide(self._channel(p))
            target = truncation_offset(side, _WireLeader(conn, self.manager.broker_id, p),
                                       p.generation, f"{p.topic}-{p.partition}")
            if target is None or not side.truncate(p.generation, target):
                self._forget(p)
                return
            position = side.follower_position(p.generation)
        except NetworkError:
            raise
        except Exception as exc:  # noqa: BLE001 - leader not ready, replica busy: later
            self._failed(p, "truncation by epoch", exc, TRUNCATION_FAILURES_BEFORE_WARNING)
            self._delay([p])
            return
        if self._moved_to(p, position):
            p.truncating = False

    def _forget(self, p: _Followed) -> None:
        """The replica moved on from this generation: it leaves the thread."""
        with self._cond:
            if self._partitions.get(p.key) is p:
                del self._partitions[p.key]

    # -- fetching (step 2) ------------------------------------------------------------------
    def _fetch(self, conn: KafkaConnection, fetching: list[_Followed]) -> None:
        s = self.settings
        topics: dict[str, list] = {}
        for p in fetching:
            topics.setdefault(p.topic, []).append({
                "partition": p.partition, "current_leader_epoch": p.leader_epoch,
                "fetch_offset": p.fetch_offset, "log_start_offset": -1,
                "partition_max_bytes": s.max_bytes})
        body = {"replica_id": self.manager.broker_id, "max_wait_ms": s.wait_max_ms,
                "min_bytes": 1, "max_bytes": s.response_max_bytes, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
                "forgotten_topics_data": [], "rack_id": ""}
        future = conn.request(wire.FETCH, body)
        try:
            answer = future.result(s.wait_max_ms / 1000 + REQUEST_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise NetworkError(f"broker {self.leader_id} did not answer a fetch within "
                               f"{s.wait_max_ms / 1000 + REQUEST_TIMEOUT_S}s") from None
        self.fetches += 1
        error = wire.error_for_code(answer.get("error_code", 0))
        if error is not None:
            raise error
        by_key = {p.key: p for p in fetching}
        applies, hws = [], []
        for t in answer["responses"]:
            for part in t["partitions"]:
                p = by_key.get((t["topic"], part["partition_index"]))
                if p is None or not self._current(p):
                    continue
                code = part["error_code"]
                if code != wire.NONE:
                    self._partition_error(conn, p, code)
                    continue
                records = part["records"]
                hw = part["high_watermark"]
                if records is None or len(records) == 0:
                    if hw != p.high_watermark:
                        hws.append((p, hw, part["log_start_offset"]))
                    continue
                try:
                    channel = self._channel(p)
                    applies.append((p, channel, channel.apply(
                        p.generation, p.fetch_offset, hw, part["log_start_offset"],
                        records if records is not None else b"")))
                except Exception as exc:  # noqa: BLE001 - no channel: the replica is gone
                    self._no_channel(p, exc)
        # a new HW alone is told without waiting for the replica (replica_channel HW): one
        # message instead of a round trip, sent after the records, which go first
        for p, hw, start in hws:
            try:
                self._channel(p).high_watermark(p.generation, p.fetch_offset, hw, start)
                p.high_watermark = hw
            except Exception as exc:  # noqa: BLE001 - no channel: the replica is gone
                self._no_channel(p, exc)
        self._to_the_back([p for p, _, _ in applies])
        for p, channel, f in applies:
            try:
                position = channel.result(f, APPLY_TIMEOUT_S)
            except InvalidRecordError as exc:
                # the leader's batches do not follow our log end: truncate by epoch again
                self._note(f"invalid-{p.key}", f"{self.name}: {p.topic}-{p.partition}: "
                           f"batches do not fit the local log ({exc}); truncating again")
                p.truncating = True
                self._delay([p])
                continue
            except Exception as exc:  # noqa: BLE001 - replica stopping, channel died
                self._drop_channel(p)
                self._failed(p, "append", exc)
                if p.failures % FAILURES_BEFORE_WARNING == 0:
                    p.truncating = True     # ask the replica where it stands afresh
                self._delay([p])
                continue
            if self._moved_to(p, position):
                p.failures = 0

    def _to_the_back(self, fed: list[_Followed]) -> None:
        """Partitions that brought records go to the end of the next Fetch: past the first
        partition with data the leader returns only what fits in the response's max_bytes,
        so a fixed order would let the first partitions starve the others (Kafka's fetcher
        moves them to the end too: PartitionStates.updateAndMoveToEnd)."""
        if not fed or len(self._partitions) < 2:
            return
        with self._cond:
            for p in fed:
                if self._partitions.get(p.key) is p:
                    del self._partitions[p.key]
                    self._partitions[p.key] = p

    def _no_channel(self, p: _Followed, exc: BaseException) -> None:
        self._note(f"channel-{p.key}", f"{self.name}: {p.topic}-{p.partition}: "
                   f"no channel to the local replica ({exc!r})")
        self._delay([p])

    def _moved_to(self, p: _Followed, position: tuple[int, int] | None) -> bool:
        """The replica's (LEO, HW) after a change: where to fetch next; None (it moved on
        from this generation): the partition leaves the thread. True when it stays."""
        if position is None:
            self._forget(p)
            return False
        p.fetch_offset, p.high_watermark = position
        return True

    def _partition_error(self, conn: KafkaConnection, p: _Followed, code: int) -> None:
        if code == _OUT_OF_RANGE:
            self._out_of_range(conn, p)
            return
        error = wire.error_for_code(code, f"{p.topic}-{p.partition}")
        level = logging.DEBUG if isinstance(error, (NotLeaderForPartitionError,
                                                   FencedLeaderEpochError)) \
            or getattr(error, "retriable", False) else logging.WARNING
        self._note(f"error-{p.key}-{code}", f"{self.name}: {p.topic}-{p.partition}: broker "
                   f"{self.leader_id} answered {error!r}; retrying", level=level)
        self._delay([p])

    def _out_of_range(self, conn: KafkaConnection, p: _Followed) -> None:
        """The leader refused our fetch offset: past its LEO (an unclean election lost
        records) -> cut to its LEO; below its log start -> start over at its log start.
        The leader's offsets come from ListOffsets on the fetcher's own connection (as
        Kafka's fetcher asks them: latest first, then earliest)."""
        try:
            side = _ChannelSide(self._channel(p))
            leader = _WireLeader(conn, self.manager.broker_id, p)
            end = leader.log_offset(LATEST)
            start = leader.log_offset(EARLIEST) if p.fetch_offset <= end else -1
            if p.fetch_offset > end:
                log.warning("%s: %s-%d LEO %d is past leader %d's LEO %d: truncating to it",
                            self.name, p.topic, p.partition, p.fetch_offset, p.leader_id, end)
                ok = side.truncate(p.generation, end)
            elif p.fetch_offset < start:
                log.info("%s: %s-%d LEO %d is below leader %d's log start %d: starting over "
                         "there", self.name, p.topic, p.partition, p.fetch_offset,
                         p.leader_id, start)
                ok = side.truncate_fully(p.generation, start)
            else:
                self._delay([p])
                return
            position = side.follower_position(p.generation) if ok else None
        except Exception as exc:  # noqa: BLE001 - retried after the backoff
            self._note(f"range-{p.key}", f"{self.name}: {p.topic}-{p.partition}: leader "
                       f"offsets unavailable ({exc!r})")
            self._delay([p])
            return
        self._moved_to(p, position)


class BrokerFetcherManager:
    """The fetcher threads of broker ``broker_id``, one per leader broker (see the module
    docstring). ``endpoint(broker_id)`` answers a leader broker's (host, port) or None."""

    def __init__(self, broker_id: int, settings: FetcherSettings,
                 endpoint: Callable[[int], tuple[str, int] | None], local: LocalReplicas):
        self.broker_id = broker_id
        self.settings = settings
        self.endpoint = endpoint
        self.local = local
        #: how the fetchers connect to the inter-broker listener (set by the broker)
        self.security: ClientSecurity = PLAINTEXT
        self._lock = threading.Lock()
        self._threads: dict[int, BrokerFetcherThread] = {}
        self._where: dict[tuple[str, int], int] = {}        # partition -> leader id
        self._closed = False

    def follow(self, topic: str, partition: int, leader_id: int, leader_epoch: int,
               generation: int, handle) -> None:
        """Fetch ``topic-partition`` for the local replica ``handle`` from ``leader_id`` in
        ``leader_epoch`` (its ``generation``); a repeat of the current target is a no-op."""
        key = (topic, partition)
        with self._lock:
            if self._closed:
                return
            old_leader = self._where.get(key)
            if old_leader is not None:
                thread = self._threads[old_leader]
                current = thread.get(key)
                if current is not None and current.same(leader_id, leader_epoch, generation,
                                                        handle):
                    return
                thread.remove(key)
            thread = self._threads.get(leader_id)
            if thread is None:
                thread = self._threads[leader_id] = BrokerFetcherThread(self, leader_id)
            self._where[key] = leader_id
            thread.add(_Followed(topic, partition, leader_id, leader_epoch, generation,
                                 handle))

    def unfollow(self, topic: str, partition: int) -> None:
        """Stop fetching ``topic-partition`` (this broker leads it now, or stopped it)."""
        with self._lock:
            leader = self._where.pop((topic, partition), None)
            if leader is not None:
                self._threads[leader].remove((topic, partition))

    def status(self) -> list[dict]:
        with self._lock:
            threads = list(self._threads.values())
        return [t.status() for t in threads]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            threads, self._threads = list(self._threads.values()), {}
            self._where.clear()
        for t in threads:
            t.stop()
        for t in threads:
            t.join(5.0)


# -- Ray ------------------------------------------------------------------------------------
class RayLocalReplicas:
    """LocalReplicas over Ray: a replica's channel address through its actor handle (once
    per channel)."""

    def channel(self, handle):
        import ray
        from .replica_channel import ReplicaChannel
        address = ray.get(handle.channel_address.remote(), timeout=REQUEST_TIMEOUT_S)
        return ReplicaChannel(address, reader_thread=False)


__all__ = ["BrokerFetcherManager", "BrokerFetcherThread", "LocalReplicas",
           "RayLocalReplicas"]
