"""The producer's record accumulator: per-partition queues of batches, bounded by
``buffer_memory``, from which the sender takes what is ready.

- ``ProducerBatch``: records bound for one partition that travel in one produce request.
  Either open (``send`` appends records to it) or built (``send_batch`` queues it already
  encoded, in a batch-sized piece of the caller's input). It is settled once; its futures
  read that outcome.
- ``PartitionQueue``: the batches of one partition, in send order, and the one in flight.
- ``RecordAccumulator``: the queues, the buffer-memory account and the one lock (with two
  conditions) that the producer, the sender and waiters share.
- ``cut_and_build``: ``send_batch``'s partitioned records cut into request-sized, built
  batches.

Invariants (under the lock): ``0 <= buffered_bytes <= buffer_memory`` (a record larger
than buffer_memory is refused before it gets here); at most one batch per partition is in
flight, and a batch that is retried goes back to the *head* of its queue, so a partition's
records are sent in order; ``incomplete`` holds every batch not yet over (queued, in
flight or backing off), and each charges its ``nbytes`` until ``forget``.

Thread-safe: every method takes the lock unless it says "lock held".
"""

from __future__ import annotations

import collections
import operator
import threading
import time

import numpy as np

from storage import records as _records

from ..errors import IllegalStateError, KafkaTimeoutError
from .futures import FutureRecordMetadata

# Upper bound of a record's framing in a v2 batch beyond key, value and header bytes:
# length, attributes, timestamp delta, offset delta, key length, value length, header count
# varints (5 + 1 + 10 + 5 + 5 + 5 + 5).
RECORD_OVERHEAD_MAX = 36
BATCH_OVERHEAD = _records.HEADER_SIZE

_DONE_LOCK = threading.Lock()


class Done:
    """A batch's "settled" flag with ``threading.Event``'s ``is_set`` / ``set`` / ``wait``,
    whose Event is made only when someone waits: most batches are settled before anyone
    asks, or are only called back, and an Event (a Condition and a lock) was a third of
    the cost of a linger-0 ``send``."""

    __slots__ = ("_flag", "_event")

    def __init__(self):
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        event = self._event
        if event is None:
            with _DONE_LOCK:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        # ``set`` writes the flag before it reads ``_event``: if it read None, the flag
        # is seen here, after ``_event`` was written
        if self._flag:
            event.set()
        return event.wait(timeout)


class ProducerBatch:
    """Records bound for one partition that travel in one produce request.

    Holds either the records (``send``) or the built bytes (``send_batch``); the bytes are
    built once and reused by retries. Its outcome (``base_offset`` or ``error``) is what
    every future of its records reads; ``settle`` sets it once and runs the callbacks.
    ``attempts`` counts the retries made, ``attempt_id`` the attempts ended (so a late
    answer of a timed-out attempt is recognised and dropped).
    """

    __slots__ = ("topic", "partition", "values", "keys", "timestamps", "headers", "size",
                 "count", "created", "closed", "data", "attempts", "retry_at", "sent_at",
                 "attempt_id", "done", "base_offset", "log_append_time", "log_start_offset",
                 "error", "callbacks", "nbytes", "riders", "broker_id", "base_sequence",
                 "_cb_lock")

    def __init__(self, topic: str, partition: int, now: float):
        self.topic = topic
        self.partition = partition
        self.values: list = []
        self.keys: list = []
        self.timestamps: list = []
        self.headers: list | None = None
        self.size = BATCH_OVERHEAD
        self.count = 0
        self.created = now
        self.closed = False
        self.data = None
        self.attempts = 0
        self.retry_at = 0.0
        self.sent_at = 0.0
        self.attempt_id = 0
        self.done = Done()
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        self.error: BaseException | None = None
        self.callbacks: list | None = None
        self.nbytes = 0  # bytes charged against buffer_memory
        # batches of the same partition sent behind this one in the same request (its
        # records get the offsets after this batch's); set while in flight
        self.riders: list | None = None
        self.broker_id: int | None = None   # the leader broker of its last attempt
        # an idempotent producer's first sequence, stamped when the bytes are first sent
        # and kept by every retry (-1: not stamped)
        self.base_sequence = -1
        self._cb_lock = threading.Lock()

    @property
    def wire_size(self) -> int:
        """Its size in a request: the built bytes, or the bound ``size`` keeps."""
        return self.size if self.data is None else len(self.data)

    def settle(self, base_offset: int, append_time: int, log_start: int,
               error: BaseException | None) -> None:
        """Resolve or fail every future of this batch (the first call wins) and run their
        callbacks, outside the lock."""
        with self._cb_lock:
            if self.done.is_set():
                return
            self.base_offset = base_offset
            self.log_append_time = append_time
            self.log_start_offset = log_start
            self.error = error
            self.done.set()
            callbacks, self.callbacks = self.callbacks, None
        for future, fn, errback in callbacks or ():
            future.fire(fn, errback)

    def add_callback(self, future: FutureRecordMetadata, fn, errback: bool) -> None:
        """Run ``fn`` through ``future`` when settled (at once if it already is)."""
        with self._cb_lock:
            if not self.done.is_set():
                if self.callbacks is None:
                    self.callbacks = []
                self.callbacks.append((future, fn, errback))
                return
        future.fire(fn, errback)


class PartitionQueue:
    __slots__ = ("batches", "inflight")

    def __init__(self):
        self.batches: collections.deque = collections.deque()
        self.inflight: ProducerBatch | None = None


class RecordAccumulator:
    """Per-partition batch queues within ``buffer_memory`` bytes; see the module docstring.

    ``lock`` guards everything here; ``wakeup`` (on ``lock``) is what the sender waits on,
    notified whenever there may be work for it; appends wait on ``space`` for memory.
    """

    def __init__(self, *, batch_limit: int, linger_s: float, buffer_memory: int,
                 max_block_s: float, request_limit: int | None = None,
                 max_group_batches: int | None = None):
        self.batch_limit = batch_limit
        # an idempotent producer's: at most this many batches of a partition in flight
        # (the broker remembers 5 per producer), and a retry resends the same group
        self.max_group_batches = max_group_batches
        self.request_limit = max(request_limit or batch_limit, batch_limit)
        self.linger_s = linger_s
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_s
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.space = threading.Condition(self.lock)
        self.queues: dict[tuple, PartitionQueue] = {}
        self.incomplete: set[ProducerBatch] = set()
        self.buffered_bytes = 0
        self.flushing = 0
        self.closed = False

    # -- appending -----------------------------------------------------------------------
    def append(self, topic: str, partition: int | None, key, value, timestamp_ms: int,
               headers, size: int, key_size: int, value_size: int, *, parts: list[int],
               sticky) -> FutureRecordMetadata:
        """Add one record to the open batch of its partition (a new batch when there is
        none or it is full). ``partition=None``: the ``sticky`` partitioner picks it, and
        moves on to its next partition whenever a new batch is needed (KIP-480).
        IllegalStateError if the producer closed while this waited for memory."""
        with self.lock:
            self._reserve(size)
            if self.closed:   # closed while we waited for space
                self._release(size)
                raise IllegalStateError("cannot send: the producer is closed")
            is_sticky = partition is None
            if is_sticky:
                partition = sticky.sticky_partition(topic, parts)
            q = self._queue(topic, partition)
            batch = q.batches[-1] if q.batches else None
            if (batch is None or batch.closed or batch.data is not None
                    or batch.size + size > self.batch_limit):
                if batch is not None and batch.data is None and not batch.closed:
                    batch.closed = True
                if is_sticky:  # KIP-480: a new batch moves null-key records on
                    partition = sticky.next_sticky(topic, parts)
                    q = self._queue(topic, partition)
                    batch = q.batches[-1] if q.batches else None
                    if (batch is not None and not batch.closed and batch.data is None
                            and batch.size + size <= self.batch_limit):
                        return self._append(batch, key, value, timestamp_ms, headers, size,
                                            key_size, value_size)
                batch = ProducerBatch(topic, partition, time.monotonic())
                q.batches.append(batch)
                self.incomplete.add(batch)
                self.wakeup.notify()
            return self._append(batch, key, value, timestamp_ms, headers, size, key_size,
                                value_size)

    def _append(self, batch: ProducerBatch, key, value, timestamp_ms, headers, size,
                key_size, value_size) -> FutureRecordMetadata:
        """Add one record to an open batch (lock held)."""
        index = batch.count
        batch.values.append(value)
        batch.keys.append(key)
        batch.timestamps.append(timestamp_ms)
        if headers:
            if batch.headers is None:
                batch.headers = [None] * index
            batch.headers.append(headers)
        elif batch.headers is not None:
            batch.headers.append(None)
        batch.count = index + 1
        batch.size += size
        batch.nbytes += size
        if batch.size + RECORD_OVERHEAD_MAX >= self.batch_limit:
            batch.closed = True
            self.wakeup.notify()
        return FutureRecordMetadata(batch, index, timestamp_ms, key_size, value_size)

    def enqueue(self, batch: ProducerBatch) -> None:
        """Queue a built batch behind everything already queued for its partition."""
        with self.lock:
            self._reserve(batch.nbytes)
            q = self._queue(batch.topic, batch.partition)
            if q.batches and q.batches[-1].data is None:
                q.batches[-1].closed = True  # keep send() records ahead of these
            q.batches.append(batch)
            self.incomplete.add(batch)
            self.wakeup.notify()

    def _queue(self, topic: str, partition: int) -> PartitionQueue:
        """The queue of (topic, partition), created on first use (lock held)."""
        q = self.queues.get((topic, partition))
        if q is None:
            q = self.queues[(topic, partition)] = PartitionQueue()
        return q

    # -- buffer memory -------------------------------------------------------------------
    def _reserve(self, size: int) -> None:
        """Charge ``size`` bytes against buffer_memory, waiting up to max_block_ms (lock
        held)."""
        if self.buffered_bytes + size <= self.buffer_memory:
            self.buffered_bytes += size
            return
        deadline = time.monotonic() + self.max_block_s
        self.wakeup.notify()  # make the sender drain what is waiting for linger
        while self.buffered_bytes + size > self.buffer_memory:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise KafkaTimeoutError(
                    f"buffer_memory={self.buffer_memory} bytes full for max_block_ms="
                    f"{int(self.max_block_s * 1000)}")
            self.space.wait(left)
        self.buffered_bytes += size

    def _release(self, size: int) -> None:
        self.buffered_bytes -= size
        self.space.notify_all()

    # -- what the sender takes -----------------------------------------------------------
    def collect_ready(self, now: float, tick_s: float) -> tuple[list, float]:
        """Pop the head batch of every idle partition that may go now and mark it in flight;
        also when the sender should look again at the latest (lock held)."""
        ready = []
        wake_at = now + tick_s
        hurry = self.flushing > 0 or self.closed
        for q in self.queues.values():
            if q.inflight is not None or not q.batches:
                continue
            b = q.batches[0]
            if b.retry_at > now:
                wake_at = min(wake_at, b.retry_at)
                continue
            if (b.closed or hurry or now - b.created >= self.linger_s
                    or len(q.batches) > 1):
                q.batches.popleft()
                b.closed = True
                q.inflight = b
                ready.append(b)
                if b.riders is None:            # a retried group keeps its riders
                    self._add_riders(q, b, now, hurry)
            else:
                wake_at = min(wake_at, b.created + self.linger_s)
        return ready, wake_at

    def _add_riders(self, q: PartitionQueue, head: ProducerBatch, now: float,
                    hurry: bool) -> None:
        """Send the batches queued behind ``head`` in the same request, as Kafka sends all
        of a partition's ready batches at once, up to ``request_limit`` bytes: with one
        request in flight per partition, a backlog of small ``send`` batches would
        otherwise drain one batch per round trip (lock held)."""
        size = head.wire_size
        riders = []
        most = (self.max_group_batches or 1 << 30) - 1
        while q.batches and len(riders) < most:
            nb = q.batches[0]
            if (nb.retry_at > now
                    or size + nb.wire_size > self.request_limit
                    or not (nb.closed or hurry or now - nb.created >= self.linger_s
                            or len(q.batches) > 1)):
                break
            q.batches.popleft()
            nb.closed = True
            size += nb.wire_size
            riders.append(nb)
        head.riders = riders or None

    def collect_expired(self, now: float, limit_s: float) -> list:
        """[(batch, attempt_id)] of the in-flight attempts sent more than ``limit_s`` ago
        (lock held)."""
        out = []
        for q in self.queues.values():
            b = q.inflight
            if b is not None and b.sent_at and now - b.sent_at > limit_s:
                out.append((b, b.attempt_id))
        return out

    def requeue(self, batch: ProducerBatch) -> None:
        """``batch`` (and its riders) will be retried: back to the *head* of its queue,
        in their order."""
        with self.lock:
            q = self.queues[(batch.topic, batch.partition)]
            if q.inflight is batch:
                q.inflight = None
            if self.max_group_batches is not None and batch.base_sequence >= 0:
                # idempotent: the same batches go again together (the broker answers a
                # repeated group as one duplicate, and refuses repeated and new mixed)
                q.batches.appendleft(batch)
                self.wakeup.notify()
                return
            riders, batch.riders = batch.riders or [], None
            for b in reversed([batch] + riders):
                q.batches.appendleft(b)
            self.wakeup.notify()

    def requeue_riders(self, batch: ProducerBatch) -> None:
        """The riders of ``batch`` go back to the head of their queue unsent (``batch``
        itself cannot go: aborted)."""
        with self.lock:
            riders, batch.riders = batch.riders or [], None
            if riders:
                q = self.queues[(batch.topic, batch.partition)]
                for b in reversed(riders):
                    q.batches.appendleft(b)
                self.wakeup.notify()

    def idle(self, batch: ProducerBatch) -> None:
        """The partition of ``batch`` may send its next batch."""
        with self.lock:
            q = self.queues.get((batch.topic, batch.partition))
            if q is not None and q.inflight is batch:
                q.inflight = None
                self.wakeup.notify()

    def forget(self, batch: ProducerBatch) -> None:
        """``batch`` is over: free its buffer memory."""
        with self.lock:
            if batch in self.incomplete:
                self.incomplete.discard(batch)
                self._release(batch.nbytes)

    # -- flush, close, metrics -----------------------------------------------------------
    def begin_flush(self) -> list:
        """Make every queued batch ready now; returns the batches to wait for."""
        with self.lock:
            pending = list(self.incomplete)
            self.flushing += 1
            self.wakeup.notify()
        return pending

    def end_flush(self) -> None:
        with self.lock:
            self.flushing -= 1

    def close(self) -> None:
        """Refuse new appends (those waiting for memory fail)."""
        with self.lock:
            self.closed = True
            self.space.notify_all()

    def metrics(self) -> dict:
        with self.lock:
            return {"buffered_bytes": self.buffered_bytes,
                    "incomplete_batches": len(self.incomplete),
                    "inflight": sum(1 for q in self.queues.values() if q.inflight)}


# -- send_batch: partitioned records into built, request-sized batches ---------------------
def cut_and_build(topic: str, assignment: list, values: list, keys, headers, ts: np.ndarray,
                  sizes: np.ndarray, *, limit: int, codec: int, now_ms: int,
                  buffer_memory: int):
    """Yield ``(batch, chunk)``: for each ``(partition, where)`` of ``assignment``, its
    records cut into batches of at most ``limit`` estimated bytes and built (``chunk``: a
    slice or an index array into the input). Batches are as large as allowed (fewer,
    larger batches cost the broker and the replica less), cut evenly so no partition ends
    with a runt batch."""
    for p, where in assignment:
        for chunk in _cuts(where, sizes, limit):
            if isinstance(chunk, slice):
                v = values[chunk]
                k = None if keys is None else keys[chunk]
                h = None if headers is None else headers[chunk]
            else:
                take = _taker(chunk)
                v = take(values)
                k = None if keys is None else take(keys)
                h = None if headers is None else take(headers)
            t = ts[chunk]
            nbytes = int(sizes[chunk].sum())
            if h is not None and not any(h):
                h = None
            data = _records.build(v, k, t, h, compression=codec, now_ms=now_ms)
            batch = ProducerBatch(topic, p, time.monotonic())
            batch.data = data
            batch.count = len(v)
            batch.closed = True
            batch.nbytes = min(nbytes, buffer_memory)
            yield batch, chunk


def _taker(index: np.ndarray):
    """A function list -> [list[i] for i in index] (itemgetter: a C loop)."""
    il = index.tolist()
    if len(il) == 1:
        return lambda items: [items[il[0]]]
    getter = operator.itemgetter(*il)
    return lambda items: list(getter(items))


def _cuts(where, sizes: np.ndarray, limit: int) -> list:
    """Split the records ``where`` (a slice or an index array) into the fewest runs of at
    most ``limit`` estimated bytes, of about equal size (every record alone fits: checked
    before)."""
    part = sizes[where]
    n = len(part)
    if n == 0:
        return []
    total = np.cumsum(part)
    target = int(total[-1]) / max(-(-int(total[-1]) // limit), 1)
    out = []
    start = 0
    while start < n:
        before = int(total[start - 1]) if start else 0
        end = int(np.searchsorted(total, before + target * 1.0001, side="right"))
        while end > start + 1 and int(total[end - 1]) - before > limit:
            end -= 1
        end = min(max(end, start + 1), n)
        out.append(slice(where.start + start, where.start + end) if isinstance(where, slice)
                   else where[start:end])
        start = end
    return out
