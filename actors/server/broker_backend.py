"""BrokerBackend: the Kafka request handlers' ``Backend`` (handlers.py) for a Broker actor.

Metadata comes from what the Broker already holds, never from a call per request: the
controller's last UpdateMetadata (brokers with their listeners, topics, partitions with
leader, leader epoch, replicas and ISR) and the LeaderAndIsr requests this broker applied
(which partitions it leads, in which epoch). Data goes to the local leader replica actor
over its local channel (replica_channel.py): one ``ReplicaChannel`` per hosted replica,
opened on first use from the replica's ``channel_address()`` (one Ray call), kept while it
works, dropped when it fails or the replica actor changes (a new one opens on the next
request). A partition this broker does not lead answers NotLeaderForPartitionError
(NOT_LEADER_OR_FOLLOWER), so clients refresh their metadata and go to the new leader.

In a Broker the channels are read on the listener's network thread (``loop``: the
channel's answers and pushes complete Kafka requests there, with no thread hand-over);
without a ``loop`` each channel has a reader thread of its own.

The purgatory is woken through the channel: each link asks its replica to ``watch`` (push
its high watermark and log end offset whenever they change); the callback, on the thread
that reads the channel, records them and wakes the fetches parked on the partition when
the pushed tail answers them (``on_change_inline``), else queues the partition for the
notifier thread, which calls ``on_change(topic, partition)`` (``KafkaApis.notify``). Not
on the reading thread itself: such a Fetch reads through that same channel and waits for
its answer, which only that thread could deliver. The recorded high watermark also lets
a consumer's fetch at the high watermark (the usual long poll: nothing new yet) answer
empty without a round trip to the replica.

ListOffsets and OffsetForLeaderEpoch (a consumer's start, a follower's truncation after a
leader change) go over the channel too (LIST_OFFSET, EPOCH_END); DeleteRecords (an admin's
request) is one Ray call to the replica.

Ray stays behind ``ReplicaLookup`` (``RayReplicaLookup`` in production), so this module is
tested with in-process replicas. Thread-safe: ``_lock`` guards the link table only; no
lock is held while a replica or channel is waited on.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import logging
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..errors import (KafkaError, LeaderNotAvailableError, NotLeaderForPartitionError,
                      UnknownTopicOrPartitionError)
from ..protocol import EpochEndOffset, FetchResult, unwrap
from .handlers import BrokerEndpoint, NeedsReplica, PartitionMetadata
from .replica_channel import ReplicaChannel, wait

log = logging.getLogger(__name__)

#: How long a consumer fetch (max_wait 0: a long poll waits in the broker's purgatory, not
#: in the replica) or a control call may take the replica before the partition answers
#: REQUEST_TIMED_OUT. Short: a replica that hangs must not hold the request handler threads.
READ_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = 10.0


class ReplicaLookup(Protocol):
    """How the backend reaches the hosted replica actors (Ray in production)."""

    def handle(self, topic: str, partition: int) -> Any:
        """The hosted replica's handle, None when this broker hosts no such replica."""

    def channel_address(self, handle) -> str: ...

    def delete_records(self, handle, offset: int) -> tuple[int, int, int]:
        """DeleteRecords at the leader replica: (log start offset after it, high
        watermark, log end offset)."""


_BATCH_HEAD = struct.Struct(">qi")          # base offset, batch length (after these 12)
_LAST_DELTA = struct.Struct(">i")           # last offset delta, at byte 23 of a v2 batch
#: The newest batches a broker keeps of each partition it leads (pushed by the replica's
#: watch), from which follower fetches and consumer fetches at the tail are answered
#: without a round trip to the replica.
TAIL_CACHE_BYTES = 1 << 20
#: A follower's position is told to the leader replica when it moved, or at least this
#: often while it fetches (the leader's ISR check needs to hear from caught-up followers).
POSITION_EVERY_S = 0.1


@dataclass
class _Link:
    """One hosted replica's channel, what its watch last said (-1: nothing yet), and the
    tail of its log the watch pushed: whole batches ``[tail_start, tail_end)``."""

    handle: Any
    leader_epoch: int                     # a new leadership gets a new link (and watch)
    channel: ReplicaChannel
    high_watermark: int = -1
    log_end_offset: int = -1
    log_start_offset: int = -1
    leadership: int | None = None         # the replica's, at the first push
    stale: bool = False                   # the replica stopped leading: open a new link
    tail_start: int = -1
    tail_end: int = -1
    tail_bytes: int = 0
    lasts: list = field(default_factory=list)     # per cached batch: its last offset
    batches: list = field(default_factory=list)   # per cached batch: its bytes
    reported: dict = field(default_factory=dict)  # follower -> (offset, monotonic time)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def usable(self, handle, leader_epoch: int) -> bool:
        return (self.handle is handle and self.leader_epoch == leader_epoch
                and self.channel.alive and not self.stale)

    def saw(self, hw: int, leo: int, log_start: int | None = None) -> None:
        with self.lock:
            # answers come on several replica threads: never move backwards
            self.high_watermark = max(self.high_watermark, hw)
            self.log_end_offset = max(self.log_end_offset, leo)
            if log_start is not None:
                self.log_start_offset = max(self.log_start_offset, log_start)

    def pushed(self, ev) -> None:
        """A watch push (replica_channel.WatchEvent), on the channel's reader thread."""
        with self.lock:
            self.high_watermark = max(self.high_watermark, ev.high_watermark)
            self.log_end_offset = max(self.log_end_offset, ev.log_end_offset)
            self.log_start_offset = max(self.log_start_offset, ev.log_start_offset)
            if self.leadership is None:
                self.leadership = ev.leadership
            elif ev.leadership != self.leadership:
                self.stale = True                 # demoted or fenced: this link is done
            if ev.base != self.tail_end:          # the first push, or a gap: start over
                self.lasts, self.batches, self.tail_bytes = [], [], 0
                self.tail_start = ev.base
            data, pos = ev.data, 0
            while pos + 27 <= len(data):
                base, length = _BATCH_HEAD.unpack_from(data, pos)
                size = 12 + length
                last, = _LAST_DELTA.unpack_from(data, pos + 23)
                self.lasts.append(base + last)
                self.batches.append(data[pos:pos + size])
                self.tail_bytes += size
                pos += size
            self.tail_end = ev.end
            while self.tail_bytes > TAIL_CACHE_BYTES and len(self.batches) > 1:
                self.tail_bytes -= len(self.batches[0])
                self.tail_start = self.lasts[0] + 1
                del self.lasts[0], self.batches[0]

    def cached(self, offset: int, max_bytes: int, limit: int | None):
        """The batches from the one holding ``offset`` whose last offset is below ``limit``
        (the HW for a consumer; None: the log end, for a follower), about ``max_bytes`` of
        them but at least one: ``(bytes, hw, log_start, leo)``; None when the cache does
        not hold ``offset`` (the replica is asked)."""
        with self.lock:
            # only a tail that reaches what the replica would answer up to (the HW, or its
            # log end) answers: a push still on its way must not hide acknowledged records
            needed = self.log_end_offset if limit is None else limit
            if (self.stale or self.tail_start < 0 or offset < self.log_start_offset
                    or not self.tail_start <= offset <= self.tail_end
                    or self.tail_end < needed):
                return None
            i = bisect.bisect_left(self.lasts, offset)
            out, size = [], 0
            while i < len(self.batches) and max_bytes >= 0:
                if limit is not None and self.lasts[i] >= limit:
                    break
                n = len(self.batches[i])
                if out and size + n > max_bytes:
                    break
                out.append(self.batches[i])
                size += n
                i += 1
            data = out[0] if len(out) == 1 else b"".join(out)
            return (data if out else b"", self.high_watermark, self.log_start_offset,
                    self.log_end_offset)

    def should_report(self, follower: int, offset: int, now: float) -> bool:
        with self.lock:
            last = self.reported.get(follower)
            if last is not None and last[0] == offset and now - last[1] < POSITION_EVERY_S:
                return False
            self.reported[follower] = (offset, now)
            return True


class BrokerBackend:
    """The handlers' Backend for broker ``broker_id`` (see the module docstring).

    ``metadata()`` answers the broker's current UpdateMetadata snapshot (a dict replaced,
    never mutated); ``leader_epochs()`` the ``{(topic, partition): leader_epoch}`` of the
    partitions it leads by the LeaderAndIsr requests it applied; ``endpoint`` is this
    broker's own listener (answered until the controller's metadata lists it)."""

    def __init__(self, broker_id: int, *, metadata: Callable[[], dict],
                 leader_epochs: Callable[[], dict], replicas: ReplicaLookup,
                 endpoint: BrokerEndpoint, cluster_id: str | None = None,
                 on_change: Callable[[str, int], None] | None = None):
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.endpoint = endpoint
        self.on_change = on_change
        # ``on_change`` for the channel's reader thread: True when done, False when a
        # fetch needs the replica (then the notifier thread calls ``on_change``)
        self.on_change_inline: Callable[[str, int], bool] | None = None
        # the listener whose network thread serves the channels (replica_channel's
        # ``loop``); None: each channel reads on a thread of its own
        self.loop = None
        self._metadata = metadata
        self._leader_epochs = leader_epochs
        self._replicas = replicas
        self._lock = threading.Lock()              # guards _links
        self._open_lock = threading.Lock()         # one channel opened at a time
        self._links: dict[tuple[str, int], _Link] = {}
        self._changed: set[tuple[str, int]] = set()
        self._wake = threading.Condition()
        self._closed = False
        self._notifier = threading.Thread(target=self._notify_loop, daemon=True,
                                          name=f"broker-{broker_id}-notifier")
        self._notifier.start()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.channel.close()
        self._notifier.join(5.0)

    # -- metadata ---------------------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        known = self._metadata().get("brokers") or {}
        out = [BrokerEndpoint(int(bid), b["host"], int(b["port"]), b.get("rack"),
                              tuple((name, host, int(port)) for name, _, host, port
                                    in b.get("listeners") or ()))
               for bid, b in sorted(known.items(), key=lambda kv: int(kv[0]))
               if int(b.get("port") or 0) > 0]
        if not any(b.node_id == self.broker_id for b in out):
            out.append(self.endpoint)              # not in the controller's metadata yet
        return out

    def controller_id(self) -> int:
        return int(self._metadata().get("controller_id", -1))

    def topics(self) -> list[str]:
        return list(self._metadata().get("topics") or {})

    def partitions(self, topic: str) -> list[PartitionMetadata] | None:
        snap = self._metadata()
        parts = (snap.get("topics") or {}).get(topic)
        if parts is None:
            return None
        live = {int(b) for b in snap.get("brokers") or {}}
        out = []
        for p, state in sorted(parts.items(), key=lambda kv: int(kv[0])):
            leader = state.get("leader", -1)
            leader = -1 if leader is None else int(leader)
            replicas = tuple(state.get("replicas") or ())
            out.append(PartitionMetadata(
                int(p), leader, int(state.get("leader_epoch", -1)), replicas,
                tuple(state.get("isr") or ()),
                offline_replicas=tuple(r for r in replicas if r not in live),
                error=None if leader >= 0 else LeaderNotAvailableError(
                    f"{topic}-{p} has no leader")))
        return out

    def leader_epoch(self, topic: str, partition: int) -> int:
        epoch = self._leader_epochs().get((topic, partition))
        if epoch is not None:
            return epoch
        parts = (self._metadata().get("topics") or {}).get(topic)
        if parts is None or partition not in {int(p) for p in parts}:
            raise UnknownTopicOrPartitionError(f"{topic}-{partition} is not known to broker "
                                               f"{self.broker_id}")
        raise NotLeaderForPartitionError(f"broker {self.broker_id} is not the leader of "
                                         f"{topic}-{partition}")

    # -- data -------------------------------------------------------------------------------
    def append(self, topic: str, partition: int, records, *, acks: int,
               timeout_ms: int) -> concurrent.futures.Future:
        link = self._link(topic, partition)        # not the leader here: refused at once
        future = link.channel.produce(records, acks, timeout_ms)
        future.add_done_callback(lambda f: self._check(topic, partition, link, f, acks))
        return future

    def linked(self, topic: str, partition: int) -> bool:
        """Is there a working channel to the partition's leader replica (in the epoch this
        broker leads it in)? A produce to a partition without one may wait for Ray."""
        link = self._links.get((topic, partition))
        if link is None:
            return False
        try:
            return link.usable(self._replicas.handle(topic, partition),
                               self.leader_epoch(topic, partition))
        except KafkaError:
            return True                  # not the leader here: refused at once, no wait

    def has_records(self, topic: str, partition: int, offset: int, *,
                    replica_id: int) -> bool | None:
        """From what the partition's watch last pushed (Backend.has_records): records up
        to the log end for a follower broker, up to the HW for a consumer. None without a
        working link in the epoch this broker leads the partition in, or for an offset
        outside the log as the link knows it (the read answers the error)."""
        key = (topic, partition)
        link = self._links.get(key)
        if (link is None or link.stale or not link.channel.alive
                or self._leader_epochs().get(key) != link.leader_epoch):
            return None
        with link.lock:
            if not link.log_start_offset <= offset <= link.log_end_offset:
                return None
            end = link.log_end_offset if replica_id >= 0 else link.high_watermark
            return end > offset

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, *,
             replica_id: int, isolation_level: int,
             cached_only: bool = False) -> FetchResult:
        if cached_only and not self.linked(topic, partition):
            raise NeedsReplica()
        link = self._link(topic, partition)
        if replica_id >= 0:
            # a follower broker's fetch: the leader replica records the follower's position
            # (HW, ISR); the batches come from the pushed tail when it holds them, else
            # from the replica, up to its log end. The waiting is the purgatory's.
            got = link.cached(offset, max_bytes, None)
            if got is not None:
                if link.should_report(replica_id, offset, time.monotonic()):
                    link.channel.position(replica_id, link.leader_epoch, offset)
                return FetchResult(*got)
            if cached_only:
                raise NeedsReplica()
            future = link.channel.replica_fetch(replica_id, link.leader_epoch, offset,
                                                max_bytes)
        else:
            got = link.cached(offset, max_bytes, link.high_watermark)
            if got is not None:
                return FetchResult(*got)
            if cached_only:
                raise NeedsReplica()
            future = link.channel.fetch(offset, max_bytes, 0, 1)
        try:
            result = wait(future, READ_TIMEOUT_S)
        except Exception:
            self._check(topic, partition, link, future)
            raise
        link.saw(result.high_watermark, result.log_end_offset, result.log_start_offset)
        return result

    def list_offset(self, topic: str, partition: int, timestamp: int, *,
                    isolation_level: int, from_follower: bool = False) -> tuple[int, int]:
        return self._ask(topic, partition,
                         lambda c: c.list_offset(timestamp, from_follower=from_follower))

    def end_offset_for_epoch(self, topic: str, partition: int,
                             leader_epoch: int) -> EpochEndOffset:
        return self._ask(topic, partition, lambda c: c.end_offset_for_epoch(leader_epoch))

    def _ask(self, topic: str, partition: int, request):
        """One control request to the partition's leader replica over its channel (on an
        io thread: the answer may be read by the network thread)."""
        link = self._link(topic, partition)        # not the leader here: refused at once
        future = request(link.channel)
        try:
            return wait(future, CONTROL_TIMEOUT_S)
        except Exception:
            self._check(topic, partition, link, future)
            raise

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move the partition's log start offset to ``offset`` (-1: the high watermark)
        at its leader replica, as DeleteRecords asks; the new log start offset (the low
        watermark). OffsetOutOfRangeError past the high watermark. The pushed tail this
        broker keeps learns the new start at once (no read below it is answered from it)."""
        self.leader_epoch(topic, partition)        # not the leader here: refused at once
        start, hw, leo = self._replicas.delete_records(self._handle(topic, partition), offset)
        link = self._links.get((topic, partition))
        if link is not None:
            link.saw(hw, leo, start)
        return start

    # -- links to the replicas --------------------------------------------------------------
    def _handle(self, topic: str, partition: int):
        handle = self._replicas.handle(topic, partition)
        if handle is None:
            raise NotLeaderForPartitionError(f"broker {self.broker_id} hosts no replica of "
                                             f"{topic}-{partition}")
        return handle

    def _link(self, topic: str, partition: int) -> _Link:
        """The channel to the partition's local leader replica in its current leader
        epoch (opened now when there is none that works); NotLeaderForPartitionError when
        this broker does not lead it."""
        key = (topic, partition)
        epoch = self.leader_epoch(topic, partition)
        handle = self._handle(topic, partition)
        link = self._links.get(key)
        if link is not None and link.usable(handle, epoch):
            return link
        with self._open_lock:
            link = self._links.get(key)
            if link is not None and link.usable(handle, epoch):
                return link
            try:
                channel = ReplicaChannel(self._replicas.channel_address(handle),
                                         loop=self.loop)
            except Exception as exc:  # noqa: BLE001 - a replica stopping or gone: not here
                error = unwrap(exc)
                if isinstance(error, NotLeaderForPartitionError):
                    raise error from None
                raise NotLeaderForPartitionError(
                    f"broker {self.broker_id}: the replica of {topic}-{partition} gave no "
                    f"channel ({type(error).__name__}: {error})") from None
            new = _Link(handle, epoch, channel)
            channel.watch(lambda ev: self._watched(key, new, ev))
            with self._lock:
                old, self._links[key] = self._links.get(key), new
        if old is not None:
            old.channel.close()
        return new

    def _check(self, topic: str, partition: int, link: _Link, future,
               acks: int | None = None) -> None:
        """After a request: an acks=all produce that succeeded moved the HW past its
        batch (known here before its client hears of it, so a fetch after the answer sees
        the records); a channel that died is dropped (the next request opens a new one); a
        replica's own refusal (NotLeader...) leaves it as it is."""
        if not future.done() or future.cancelled():
            return                 # (not done: a read that timed out waits for nothing)
        error = future.exception()
        if error is None:
            if acks == -1:
                result = future.result()
                link.saw(result.last_offset + 1, result.last_offset + 1)
            return
        if link.channel.alive:
            return
        with self._lock:
            if self._links.get((topic, partition)) is link:
                del self._links[(topic, partition)]

    def _watched(self, key: tuple[str, int], link: _Link, ev) -> None:
        """The watch's callback, on the channel's reader thread: record; wake the fetches
        waiting on the partition right here when what they read is in the pushed tail
        (``on_change_inline``), else hand over to the notifier thread."""
        link.pushed(ev)
        inline = self.on_change_inline
        if inline is not None:
            try:
                if inline(*key):
                    return
            except Exception:  # noqa: BLE001 - the notifier tries again
                log.exception("broker %d: waking fetches of %s-%d", self.broker_id, *key)
        with self._wake:
            self._changed.add(key)
            self._wake.notify()

    def _notify_loop(self) -> None:
        while True:
            with self._wake:
                while not self._changed and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                changed, self._changed = self._changed, set()
            if self.on_change is None:
                continue
            for topic, partition in changed:
                try:
                    self.on_change(topic, partition)
                except Exception:  # noqa: BLE001 - a waker's bug must not stop the others
                    log.exception("broker %d: waking fetches of %s-%d", self.broker_id,
                                  topic, partition)


# -- Ray ------------------------------------------------------------------------------------
def _delete_records_on_replica(replica, offset: int) -> tuple[int, int, int]:
    """Runs inside the replica actor (``__ray_call__``): DeleteRecords as its leader
    (-1: up to the high watermark; never past it, as Kafka refuses)."""
    replica._require_leader()
    hw = replica.high_watermark
    if offset == -1:
        offset = hw
    if offset < 0 or offset > hw:
        from ..errors import OffsetOutOfRangeError
        raise OffsetOutOfRangeError(f"cannot delete records before {offset}: the high "
                                    f"watermark is {hw}")
    start = replica.delete_records_before(offset)
    return start, hw, replica.log.log_end_offset


class RayReplicaLookup:
    """ReplicaLookup over the broker's ReplicaManager and Ray calls to replica actors."""

    def __init__(self, replica_manager):
        self.replica_manager = replica_manager

    def handle(self, topic: str, partition: int):
        return self.replica_manager.get(topic, partition)

    @staticmethod
    def _get(ref):
        import ray
        try:
            return ray.get(ref, timeout=CONTROL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            from ..errors import RequestTimedOutError
            raise RequestTimedOutError(f"the replica did not answer within "
                                       f"{CONTROL_TIMEOUT_S}s") from None
        except ray.exceptions.RayActorError as exc:
            raise NotLeaderForPartitionError(f"the replica is gone ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - the replica's typed error, unwrapped
            raise unwrap(exc) from None

    def channel_address(self, handle) -> str:
        return self._get(handle.channel_address.remote())

    def delete_records(self, handle, offset: int) -> tuple[int, int, int]:
        return tuple(self._get(handle.__ray_call__.remote(_delete_records_on_replica,
                                                          offset)))


__all__ = ["BrokerBackend", "RayReplicaLookup", "ReplicaLookup"]
