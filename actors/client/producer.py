"""Producer: kafka-python's KafkaProducer over PartitionReplica actors.

Data path::

    send() ──► per-partition accumulator (open batch per partition, bounded by buffer_memory)
                       │  a batch is ready when full (batch_size) or linger_ms old,
                       │  or when flush()/close() asks
                       ▼
               ONE sender thread: builds the v2 batch (storage.records.build, with the
               codec), calls leader.produce.remote(batch, acks, timeout_ms), and handles
               the answer (through ObjectRef futures, so the thread never blocks on one
               partition while others are ready)

    send_batch() ─► partitions a whole list at once (vectorised murmur2), builds the
                    request-sized batches in the caller's thread and queues them, already
                    built, on the same per-partition queues

Guarantees and their mechanisms:
- Order per partition (and so per key): at most one request per partition is in flight, and
  a batch that fails retriably goes back to the *head* of its partition's queue. Records of
  one key always map to one partition (for a fixed partition count).
- At-least-once: a retried request whose first attempt was in fact appended (a timeout, a
  leader that died after writing) is written again. Nothing acknowledged is lost by the
  client; durability past a leader's death is the cluster's (acks="all").
- Bounded: ``retries`` attempts per batch with exponential backoff from ``retry_backoff_ms``
  to ``retry_backoff_max_ms``, and no retry that would start later than
  ``delivery_timeout_ms`` after the batch was created (Kafka's defaults: retries unbounded,
  120 s); each attempt times out after ``request_timeout_ms``;
  ``buffer_memory`` bytes of unacknowledged records at most (send blocks up to
  ``max_block_ms``, then KafkaTimeoutError).
- Retriable: KafkaError subclasses with ``retriable`` (NotLeaderForPartition,
  LeaderNotAvailable, NotEnoughReplicas, ...), our own request timeout, and Ray's
  RayActorError family (the leader actor died or is unreachable). Each retry invalidates the
  topic's metadata first. Anything else fails the batch's futures with the typed error.

Partitioning: an explicit ``partition`` wins; else a custom ``partitioner(key_bytes,
all_partitions, available)`` if configured (``available`` is all partitions: the metadata
seam does not say which leaders are up); else keyed records go to
``to_positive(murmur2(key)) % num_partitions`` (Kafka's hash); records without a key are
*sticky per batch* (KIP-480): they fill one partition's batch, and each new batch moves to
the next partition in round-robin order (from a random start), so a stream of null-key
records covers all partitions evenly and deterministically.

Thread-safety: send/send_batch/flush/close may be called from any threads. Future callbacks
run on the sender thread (or in the caller's thread when added to a finished future); they
must not block.
"""

from __future__ import annotations

import collections
import itertools
import logging
import operator
import random
import threading
import time

import numpy as np
import ray
import ray.exceptions

from storage import records as _records
from storage.compression import codec_id

from ..errors import (IllegalArgumentError, IllegalStateError, InvalidConfigurationError,
                     KafkaError, KafkaStorageError, KafkaTimeoutError, RecordTooLargeError, RequestTimedOutError,
                     UnknownTopicOrPartitionError, UnsupportedCodecError)
from .murmur2 import murmur2, partitions_for_keys
from ..protocol import unwrap
from ..types import RecordMetadata

log = logging.getLogger(__name__)

DEFAULT_CONFIG = {
    "acks": "all",
    "batch_size": 16384,
    "linger_ms": 5,
    "compression_type": None,
    "key_serializer": None,
    "value_serializer": None,
    "partitioner": None,
    "retries": 2147483647,           # Kafka's default: retry until delivery_timeout_ms
    "delivery_timeout_ms": 120000,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 1000,
    "max_request_size": 1048576,
    "request_timeout_ms": 30000,
    "max_block_ms": 60000,
    "buffer_memory": 32 * 1024 * 1024,
    "metadata_max_age_ms": 300000,
    "client_id": None,
}

# Upper bound of a record's framing in a v2 batch beyond key, value and header bytes:
# length, attributes, timestamp delta, offset delta, key length, value length, header count
# varints (5 + 1 + 10 + 5 + 5 + 5 + 5).
RECORD_OVERHEAD_MAX = 36
BATCH_OVERHEAD = _records.HEADER_SIZE
# Built batches at least this large go to the object store from the caller's thread.
PUT_MIN_BYTES = 64 * 1024
# The sender wakes at least this often to check request deadlines.
SENDER_TICK_S = 0.1
_ACKS = {0: 0, 1: 1, -1: -1, "all": -1, "0": 0, "1": 1, "-1": -1}


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaStorageError):
        # Kafka's KafkaStorageException is retriable (an InvalidMetadataException): the
        # replica's log is offline or closing (e.g. a leader being demoted), so refresh the
        # metadata and try the (new) leader.
        return True
    if isinstance(exc, KafkaError):
        return bool(exc.retriable)
    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))


def validate_config(given: dict, defaults: dict, what: str) -> dict:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise InvalidConfigurationError(
            f"unknown {what} config {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(sorted(defaults))}")
    config = dict(defaults)
    config.update(given)
    return config


def _positive_int(config: dict, name: str, minimum: int = 0) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


# =========================================================================================
# futures
# =========================================================================================

class _Batch:
    """Records bound for one partition that travel in one produce request.

    Holds either the records (``send``) or the built bytes (``send_batch``); the bytes are
    built once and reused by retries. Its outcome (``base_offset`` or ``error``) is what
    every future of its records reads.
    """

    __slots__ = ("topic", "partition", "values", "keys", "timestamps", "headers", "size",
                 "count", "created", "closed", "data", "attempts", "retry_at", "sent_at",
                 "attempt_id", "done", "base_offset", "log_append_time", "log_start_offset",
                 "error", "callbacks", "nbytes")

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
        self.done = threading.Event()
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        self.error: BaseException | None = None
        self.callbacks: list | None = None
        self.nbytes = 0  # bytes charged against buffer_memory


class FutureRecordMetadata:
    """The outcome of one ``send``: resolves to a RecordMetadata or fails with a KafkaError.

    ``get(timeout=None)`` blocks (KafkaTimeoutError after ``timeout`` seconds);
    ``add_callback(fn, *args, **kw)`` calls ``fn(*args, record_metadata, **kw)`` on success,
    ``add_errback(fn, *args, **kw)`` calls ``fn(*args, exception, **kw)`` on failure.
    """

    __slots__ = ("_producer", "_batch", "_index", "_timestamp", "_key_size", "_value_size")

    def __init__(self, producer, batch: _Batch, index: int, timestamp: int, key_size: int,
                 value_size: int):
        self._producer = producer
        self._batch = batch
        self._index = index
        self._timestamp = timestamp
        self._key_size = key_size
        self._value_size = value_size

    @property
    def is_done(self) -> bool:
        return self._batch.done.is_set()

    def succeeded(self) -> bool:
        return self._batch.done.is_set() and self._batch.error is None

    def failed(self) -> bool:
        return self._batch.done.is_set() and self._batch.error is not None

    @property
    def exception(self) -> BaseException | None:
        return self._batch.error if self._batch.done.is_set() else None

    @property
    def value(self) -> RecordMetadata | None:
        return self._metadata() if self.succeeded() else None

    def _metadata(self) -> RecordMetadata:
        b = self._batch
        offset = b.base_offset + self._index if b.base_offset >= 0 else -1
        ts = b.log_append_time if b.log_append_time >= 0 else self._timestamp
        return RecordMetadata(b.topic, b.partition, offset, ts, b.log_start_offset,
                              self._key_size, self._value_size)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.done.wait(timeout):
            raise KafkaTimeoutError(
                f"record for {self._batch.topic}-{self._batch.partition} not acknowledged "
                f"within {timeout}s")
        if self._batch.error is not None:
            raise self._batch.error
        return self._metadata()

    def add_callback(self, fn, *args, **kwargs) -> "FutureRecordMetadata":
        self._producer._add_callback(self, fn, args, kwargs, errback=False)
        return self

    def add_errback(self, fn, *args, **kwargs) -> "FutureRecordMetadata":
        self._producer._add_callback(self, fn, args, kwargs, errback=True)
        return self

    def add_both(self, fn, *args, **kwargs) -> "FutureRecordMetadata":
        self.add_callback(fn, *args, **kwargs)
        return self.add_errback(fn, *args, **kwargs)


class BatchFuture:
    """The outcome of one ``send_batch``: the request-sized batches it was cut into.

    - ``wait(timeout=None)``: block until every part is acknowledged; raises the first
      part's error (some parts may have succeeded: see ``exception``/``parts``).
    - ``offsets(timeout=None) -> (partitions, offsets)``: two int64 numpy arrays in the
      order of the input records (offset -1 with ``acks=0``): the compact form.
    - ``get(timeout=None) -> list[RecordMetadata]`` in input order (costs ~1 µs a record).
    """

    def __init__(self, topic: str, n: int, parts: list, timestamps):
        self.topic = topic
        self._n = n
        self._parts = parts  # [(batch, indexes into the input (ndarray) or slice)]
        self._timestamps = timestamps

    def __len__(self) -> int:
        return self._n

    @property
    def is_done(self) -> bool:
        return all(b.done.is_set() for b, _ in self._parts)

    def succeeded(self) -> bool:
        return self.is_done and all(b.error is None for b, _ in self._parts)

    @property
    def exception(self) -> BaseException | None:
        for b, _ in self._parts:
            if b.done.is_set() and b.error is not None:
                return b.error
        return None

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for b, _ in self._parts:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not b.done.wait(left):
                raise KafkaTimeoutError(f"batch of {self._n} records to {self.topic!r} not "
                                        f"acknowledged within {timeout}s")
        for b, _ in self._parts:
            if b.error is not None:
                raise b.error

    def offsets(self, timeout: float | None = None):
        self.wait(timeout)
        partitions = np.empty(self._n, np.int64)
        offsets = np.empty(self._n, np.int64)
        for b, where in self._parts:
            partitions[where] = b.partition
            if b.base_offset >= 0:
                offsets[where] = np.arange(b.base_offset, b.base_offset + b.count)
            else:
                offsets[where] = -1
        return partitions, offsets

    def get(self, timeout: float | None = None) -> list[RecordMetadata]:
        partitions, offsets = self.offsets(timeout)
        ts = np.empty(self._n, np.int64)
        ts[:] = self._timestamps
        lso = np.full(self._n, -1, np.int64)
        for b, where in self._parts:
            if b.log_append_time >= 0:
                ts[where] = b.log_append_time
            lso[where] = b.log_start_offset
        topic = self.topic
        return [RecordMetadata(topic, p, o, t, s) for p, o, t, s in
                zip(partitions.tolist(), offsets.tolist(), ts.tolist(), lso.tolist())]


# =========================================================================================
# the producer
# =========================================================================================

class _PartitionQueue:
    __slots__ = ("batches", "inflight")

    def __init__(self):
        self.batches: collections.deque = collections.deque()
        self.inflight: _Batch | None = None


class Producer:
    """A thread-safe producer; see the module docstring. ``Producer(metadata, **config)``.

    ``metadata`` provides ``partitions_for(topic)``, ``leader(topic, partition)`` (a
    LeaderRef with ``.handle``) and ``invalidate(topic=None)``.
    """

    def __init__(self, metadata, **config):
        self.metadata = metadata
        self.config = config = validate_config(config, DEFAULT_CONFIG, "producer")
        acks = config["acks"]
        if acks not in _ACKS or isinstance(acks, bool):
            raise InvalidConfigurationError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")
        self._acks = _ACKS[acks]
        self._batch_size = _positive_int(config, "batch_size", 1)
        self._linger_s = _positive_int(config, "linger_ms") / 1000.0
        self._retries = _positive_int(config, "retries")
        self._delivery_timeout_s = _positive_int(config, "delivery_timeout_ms", 1) / 1000.0
        self._backoff_s = _positive_int(config, "retry_backoff_ms") / 1000.0
        self._backoff_max_s = max(_positive_int(config, "retry_backoff_max_ms") / 1000.0,
                                  self._backoff_s)
        self._max_request_size = _positive_int(config, "max_request_size", 1)
        self._request_timeout_ms = _positive_int(config, "request_timeout_ms", 1)
        self._max_block_s = _positive_int(config, "max_block_ms") / 1000.0
        self._buffer_memory = _positive_int(config, "buffer_memory", 1)
        self._metadata_max_age_s = _positive_int(config, "metadata_max_age_ms") / 1000.0
        try:
            self._codec = codec_id(config["compression_type"] or "none")
        except UnsupportedCodecError:
            raise InvalidConfigurationError(
                f"compression_type must be None, 'gzip', 'snappy' or 'lz4', got "
                f"{config['compression_type']!r}") from None
        if self._codec == _records.CODEC_ZSTD:
            raise InvalidConfigurationError("compression_type 'zstd' is not supported")
        for name in ("key_serializer", "value_serializer", "partitioner"):
            if config[name] is not None and not callable(config[name]):
                raise InvalidConfigurationError(f"{name} must be callable, got "
                                                f"{config[name]!r}")
        # a batch never grows past what one request may carry
        self._batch_limit = min(self._batch_size, self._max_request_size)

        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)   # the sender waits on this
        self._space = threading.Condition(self._lock)    # send() waits for buffer_memory
        self._cb_lock = threading.Lock()
        self._queues: dict[tuple, _PartitionQueue] = {}
        self._incomplete: set[_Batch] = set()
        self._completions: list = []
        self._buffered_bytes = 0
        self._flushing = 0
        self._closed = False
        self._stopping = False
        self._partitions: dict[str, tuple[list, float]] = {}
        self._sticky: dict[str, int] = {}
        self._rr = itertools.count(random.randrange(1 << 16))
        self._sender = threading.Thread(target=self._run_sender, daemon=True,
                                        name="raykafka-producer-sender")
        self._sender.start()

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- metadata ------------------------------------------------------------------------
    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (cached for ``metadata_max_age_ms``)."""
        hit = self._partitions.get(topic)
        if hit is not None and time.monotonic() - hit[1] < self._metadata_max_age_s:
            return hit[0]
        parts = list(self.metadata.partitions_for(topic))
        self._partitions[topic] = (parts, time.monotonic())
        return parts

    def _invalidate(self, topic: str) -> None:
        self._partitions.pop(topic, None)
        try:
            self.metadata.invalidate(topic)
        except Exception:  # noqa: BLE001 - a failed invalidation only delays a refresh
            log.exception("metadata.invalidate(%r) failed", topic)

    def _check_partition(self, topic: str, partition, parts: list[int]) -> list[int]:
        if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)):
            raise IllegalArgumentError(f"partition must be an int, got {partition!r}")
        if partition < 0:
            raise IllegalArgumentError(f"partition must be >= 0, got {partition}")
        if partition not in parts:
            self._invalidate(topic)   # the topic may have grown: look once more
            parts = self.partitions_for(topic)
            if partition not in parts:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} (it has {len(parts)})")
        return parts

    # -- send ----------------------------------------------------------------------------
    def send(self, topic: str, value=None, key=None, partition=None, timestamp_ms=None,
             headers=None) -> FutureRecordMetadata:
        """Queue one record; returns its future. Raises at once (appending nothing) for a
        closed producer (IllegalStateError), a key/value that is not bytes without a
        serializer or bad headers/timestamp (IllegalArgumentError), a record larger than
        ``max_request_size`` or ``buffer_memory`` (RecordTooLargeError), an unknown topic or
        partition (UnknownTopicOrPartitionError), or a full buffer for ``max_block_ms``
        (KafkaTimeoutError)."""
        if self._closed:
            raise IllegalStateError("cannot send: the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
        if value is None and key is None:
            raise IllegalArgumentError("a record needs a key or a value (or both)")
        cfg = self.config
        if cfg["key_serializer"] is not None and key is not None:
            key = cfg["key_serializer"](key)
        if cfg["value_serializer"] is not None and value is not None:
            value = cfg["value_serializer"](value)
        key = _as_bytes(key, "key")
        value = _as_bytes(value, "value")
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        elif isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, (int, np.integer)):
            raise IllegalArgumentError(f"timestamp_ms must be an int, got {timestamp_ms!r}")
        else:
            timestamp_ms = int(timestamp_ms)
        header_bytes = 0
        if headers:
            headers, header_bytes = _check_headers(headers)
        key_size = -1 if key is None else len(key)
        value_size = -1 if value is None else len(value)
        size = RECORD_OVERHEAD_MAX + max(key_size, 0) + max(value_size, 0) + header_bytes
        if size + BATCH_OVERHEAD > self._max_request_size:
            raise RecordTooLargeError(
                f"the record is {size + BATCH_OVERHEAD} bytes when serialized, larger than "
                f"max_request_size={self._max_request_size}")
        if size > self._buffer_memory:
            raise RecordTooLargeError(f"the record is {size} bytes, larger than "
                                      f"buffer_memory={self._buffer_memory}")

        parts = self.partitions_for(topic)
        sticky = False
        if partition is not None:
            self._check_partition(topic, partition, parts)
            partition = int(partition)
        elif cfg["partitioner"] is not None:
            partition = cfg["partitioner"](key, list(parts), list(parts))
            self._check_partition(topic, partition, parts)
            partition = int(partition)
        elif key is not None:
            partition = parts[(murmur2(key) & 0x7FFFFFFF) % len(parts)]
        else:
            sticky = True

        with self._lock:
            self._reserve(size)
            if self._closed:   # closed while we waited for space
                self._release(size)
                raise IllegalStateError("cannot send: the producer is closed")
            if sticky:
                partition = self._sticky_partition(topic, parts)
            q = self._queues.get((topic, partition))
            if q is None:
                q = self._queues[(topic, partition)] = _PartitionQueue()
            batch = q.batches[-1] if q.batches else None
            if (batch is None or batch.closed or batch.data is not None
                    or batch.size + size > self._batch_limit):
                if batch is not None and batch.data is None and not batch.closed:
                    batch.closed = True
                if sticky:  # KIP-480: a new batch moves null-key records on
                    partition = self._next_sticky(topic, parts)
                    q = self._queues.get((topic, partition))
                    if q is None:
                        q = self._queues[(topic, partition)] = _PartitionQueue()
                    batch = q.batches[-1] if q.batches else None
                    if (batch is not None and not batch.closed and batch.data is None
                            and batch.size + size <= self._batch_limit):
                        return self._append(batch, key, value, timestamp_ms, headers, size,
                                            key_size, value_size)
                batch = _Batch(topic, partition, time.monotonic())
                q.batches.append(batch)
                self._incomplete.add(batch)
                self._wakeup.notify()
            return self._append(batch, key, value, timestamp_ms, headers, size, key_size,
                                value_size)

    def _append(self, batch: _Batch, key, value, timestamp_ms, headers, size, key_size,
                value_size) -> FutureRecordMetadata:
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
        if batch.size + RECORD_OVERHEAD_MAX >= self._batch_limit:
            batch.closed = True
            self._wakeup.notify()
        return FutureRecordMetadata(self, batch, index, timestamp_ms, key_size, value_size)

    def _sticky_partition(self, topic: str, parts: list[int]) -> int:
        p = self._sticky.get(topic)
        if p is None or p not in parts:
            p = self._next_sticky(topic, parts)
        return p

    def _next_sticky(self, topic: str, parts: list[int]) -> int:
        p = parts[next(self._rr) % len(parts)]
        self._sticky[topic] = p
        return p

    def _reserve(self, size: int) -> None:
        """Charge ``size`` bytes against buffer_memory, waiting up to max_block_ms (lock
        held)."""
        if self._buffered_bytes + size <= self._buffer_memory:
            self._buffered_bytes += size
            return
        deadline = time.monotonic() + self._max_block_s
        self._wakeup.notify()  # make the sender drain what is waiting for linger
        while self._buffered_bytes + size > self._buffer_memory:
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                raise KafkaTimeoutError(
                    f"buffer_memory={self._buffer_memory} bytes full for max_block_ms="
                    f"{int(self._max_block_s * 1000)}")
            self._space.wait(left)
        self._buffered_bytes += size

    def _release(self, size: int) -> None:
        self._buffered_bytes -= size
        self._space.notify_all()

    # -- bulk send -----------------------------------------------------------------------
    def send_batch(self, topic: str, values, keys=None, partition=None, timestamps=None,
                   headers=None) -> BatchFuture:
        """Queue many records at once: the throughput path.

        ``values`` (and ``keys``, when given) are equal-length sequences of bytes (or None;
        or objects when a serializer is configured); ``timestamps`` a sequence of ms ints or
        None (now); ``headers`` None or one list of (str, bytes) per record. Records are
        partitioned like ``send`` (keys with vectorised murmur2; without keys, contiguous
        slices spread round-robin over the partitions; or all to ``partition``), and cut
        into batches of at most ``max(batch_size, ...)`` that fit ``max_request_size``,
        built here, in the caller's thread, and queued in order behind earlier sends.
        Validation is all-or-nothing: a bad record raises before anything is queued.
        """
        if self._closed:
            raise IllegalStateError("cannot send: the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
        n = len(values)
        cfg = self.config
        if cfg["value_serializer"] is not None:
            ser = cfg["value_serializer"]
            values = [None if v is None else ser(v) for v in values]
        if keys is not None:
            if len(keys) != n:
                raise IllegalArgumentError(f"{len(keys)} keys for {n} values")
            if cfg["key_serializer"] is not None:
                ser = cfg["key_serializer"]
                keys = [None if k is None else ser(k) for k in keys]
        values, null_values = _as_bytes_list(values, "value")
        keys, null_keys = (None, True) if keys is None else _as_bytes_list(keys, "key")
        if null_values and null_keys and any(
                v is None and (keys is None or keys[i] is None) for i, v in enumerate(values)):
            raise IllegalArgumentError("a record needs a key or a value (or both)")
        now_ms = int(time.time() * 1000)
        if timestamps is None:
            ts = np.full(n, now_ms, np.int64)
        else:
            if len(timestamps) != n:
                raise IllegalArgumentError(f"{len(timestamps)} timestamps for {n} values")
            try:
                ts = np.asarray(timestamps, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise IllegalArgumentError("timestamps must be ints (ms)") from None
        header_sizes = None
        if headers is not None:
            if len(headers) != n:
                raise IllegalArgumentError(f"{len(headers)} header lists for {n} values")
            checked = []
            header_sizes = np.zeros(n, np.int64)
            for i, h in enumerate(headers):
                if h:
                    h, header_sizes[i] = _check_headers(h)
                    checked.append(h)
                else:
                    checked.append(None)
            headers = checked
        sizes = _sizes(values, null_values) + RECORD_OVERHEAD_MAX
        if keys is not None:
            sizes += _sizes(keys, null_keys)
        if header_sizes is not None:
            sizes += header_sizes
        if n and int(sizes.max()) + BATCH_OVERHEAD > self._max_request_size:
            i = int(sizes.argmax())
            raise RecordTooLargeError(
                f"record {i} is {int(sizes[i]) + BATCH_OVERHEAD} bytes when serialized, "
                f"larger than max_request_size={self._max_request_size}")

        parts = self.partitions_for(topic)
        if partition is not None:
            self._check_partition(topic, partition, parts)
            assignment = [(int(partition), slice(0, n))]
        elif cfg["partitioner"] is not None:
            chosen = np.fromiter((cfg["partitioner"](k, list(parts), list(parts)) for k in
                                  (keys if keys is not None else itertools.repeat(None, n))),
                                 np.int64, n)
            for p in np.unique(chosen).tolist():
                self._check_partition(topic, p, parts)
            assignment = _group(chosen)
        elif keys is not None and not null_keys:
            chosen = np.asarray(parts, np.int64)[partitions_for_keys(keys, len(parts))]
            assignment = _group(chosen)
        elif keys is not None:
            # null keys spread, non-null keys hashed
            null = np.fromiter((k is None for k in keys), bool, n)
            chosen = np.empty(n, np.int64)
            idx = np.flatnonzero(~null)
            chosen[idx] = np.asarray(parts, np.int64)[
                partitions_for_keys([keys[i] for i in idx.tolist()], len(parts))]
            nulls = np.flatnonzero(null)
            start = next(self._rr)
            chosen[nulls] = np.asarray(parts, np.int64)[
                (start + np.arange(len(nulls)) * len(parts) // max(len(nulls), 1))
                % len(parts)]
            assignment = _group(chosen)
        else:
            start = next(self._rr)
            k = min(len(parts), max(n, 1))
            bounds = [n * i // k for i in range(k + 1)]
            assignment = [(parts[(start + i) % len(parts)], slice(bounds[i], bounds[i + 1]))
                          for i in range(k) if bounds[i + 1] > bounds[i]]

        # Requests as large as allowed (an actor call costs ~1 ms: fewer, larger requests
        # are faster), cut evenly so no partition ends with a runt request.
        cut_limit = self._max_request_size - BATCH_OVERHEAD
        built = [(p, chunk) for p, where in assignment
                 for chunk in _cuts(where, sizes, cut_limit)]
        pieces = []
        for p, chunk in built:
            if isinstance(chunk, slice):
                v = values[chunk]
                k = None if keys is None else keys[chunk]
                h = None if headers is None else headers[chunk]
                t = ts[chunk]
                nbytes = int(sizes[chunk].sum())
            else:
                take = _taker(chunk)
                v = take(values)
                k = None if keys is None else take(keys)
                h = None if headers is None else take(headers)
                t = ts[chunk]
                nbytes = int(sizes[chunk].sum())
            if h is not None and not any(h):
                h = None
            data = _records.build(v, k, t, h, compression=self._codec, now_ms=now_ms)
            batch = _Batch(topic, p, time.monotonic())
            # Into the object store here, in the caller's thread: the sender's actor call
            # then passes a reference instead of copying a megabyte under the GIL.
            batch.data = ray.put(data) if len(data) >= PUT_MIN_BYTES else data
            batch.count = len(v)
            batch.closed = True
            batch.nbytes = min(nbytes, self._buffer_memory)
            pieces.append((batch, chunk))
            self._enqueue(batch)
        return BatchFuture(topic, n, pieces, ts)

    def _enqueue(self, batch: _Batch) -> None:
        """Queue a built batch behind everything already queued for its partition."""
        with self._lock:
            self._reserve(batch.nbytes)
            q = self._queues.get((batch.topic, batch.partition))
            if q is None:
                q = self._queues[(batch.topic, batch.partition)] = _PartitionQueue()
            if q.batches and q.batches[-1].data is None:
                q.batches[-1].closed = True  # keep send() records ahead of these
            q.batches.append(batch)
            self._incomplete.add(batch)
            self._wakeup.notify()

    # -- flush and close -----------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far now and wait until it is acknowledged or failed;
        KafkaTimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._incomplete)
            self._flushing += 1
            self._wakeup.notify()
        try:
            for b in pending:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if not b.done.wait(left):
                    raise KafkaTimeoutError(f"flush did not complete within {timeout}s")
        finally:
            with self._lock:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Refuse new sends, deliver what is queued (waiting up to ``timeout`` seconds),
        fail whatever is left with KafkaTimeoutError, and stop the sender thread.
        Idempotent."""
        with self._lock:
            self._closed = True
            self._space.notify_all()
        try:
            self.flush(timeout)
        except KafkaTimeoutError:
            pass
        with self._lock:
            self._stopping = True
            leftover = list(self._incomplete)
            self._wakeup.notify()
        for b in leftover:
            self._settle(b, -1, -1, -1, KafkaTimeoutError(
                f"producer closed before {b.topic}-{b.partition} records were acknowledged"))
            self._forget(b)
        self._sender.join(timeout=5.0)

    @property
    def closed(self) -> bool:
        return self._closed

    def metrics(self) -> dict:
        with self._lock:
            return {"buffered_bytes": self._buffered_bytes,
                    "incomplete_batches": len(self._incomplete),
                    "inflight": sum(1 for q in self._queues.values() if q.inflight)}

    # -- the sender thread ---------------------------------------------------------------
    def _run_sender(self) -> None:
        while True:
            try:
                if not self._sender_step():
                    return
            except Exception:  # noqa: BLE001 - the sender must outlive any one bug
                log.exception("producer sender step failed")
                time.sleep(SENDER_TICK_S)

    def _sender_step(self) -> bool:
        """One round: take completions and ready batches under the lock, act outside it.
        Returns False when the producer has stopped."""
        with self._lock:
            while True:
                if self._stopping:
                    return False
                completions, self._completions = self._completions, []
                now = time.monotonic()
                ready, wake_at = self._collect_ready(now)
                expired = self._collect_expired(now)
                if completions or ready or expired:
                    break
                self._wakeup.wait(min(max(wake_at - now, 0.0005), SENDER_TICK_S))
        for batch, attempt_id, outcome, error in completions:
            self._complete(batch, attempt_id, outcome, error)
        for batch, attempt_id in expired:
            self._complete(batch, attempt_id, None, RequestTimedOutError(
                f"produce to {batch.topic}-{batch.partition} timed out after "
                f"{self._request_timeout_ms} ms"))
        for batch in ready:
            self._dispatch(batch)
        return True

    def _collect_ready(self, now: float):
        """Pop the head batch of every idle partition that may go now (lock held)."""
        ready = []
        wake_at = now + SENDER_TICK_S
        hurry = self._flushing > 0 or self._closed
        for q in self._queues.values():
            if q.inflight is not None or not q.batches:
                continue
            b = q.batches[0]
            if b.retry_at > now:
                wake_at = min(wake_at, b.retry_at)
                continue
            if (b.closed or hurry or now - b.created >= self._linger_s
                    or len(q.batches) > 1):
                q.batches.popleft()
                b.closed = True
                q.inflight = b
                ready.append(b)
            else:
                wake_at = min(wake_at, b.created + self._linger_s)
        return ready, wake_at

    def _collect_expired(self, now: float):
        limit = self._request_timeout_ms / 1000.0 + 1.0  # the replica's own timeout first
        out = []
        for q in self._queues.values():
            b = q.inflight
            if b is not None and b.sent_at and now - b.sent_at > limit:
                out.append((b, b.attempt_id))
        return out

    def _dispatch(self, batch: _Batch) -> None:
        """Build (once) and send one batch; its answer arrives as a completion."""
        if batch.done.is_set():   # aborted by close() while queued
            self._idle(batch)
            self._forget(batch)
            return
        attempt_id = batch.attempt_id
        try:
            if batch.data is None:
                batch.data = _records.build(batch.values, batch.keys, batch.timestamps,
                                            batch.headers, compression=self._codec)
                batch.values = batch.keys = batch.headers = None
            leader = self.metadata.leader(batch.topic, batch.partition)
            batch.sent_at = time.monotonic()
            ref = leader.handle.produce.remote(batch.data, self._acks,
                                               self._request_timeout_ms)
        except Exception as exc:  # noqa: BLE001 - classified in _complete
            self._complete(batch, attempt_id, None, exc)
            return
        if self._acks == 0:
            # fire and forget for the caller; the sender still paces by the answer
            self._settle(batch, -1, -1, -1, None)

        def on_done(fut, batch=batch, attempt_id=attempt_id):
            try:
                outcome, error = fut.result(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the sender thread
                outcome, error = None, exc
            with self._lock:
                self._completions.append((batch, attempt_id, outcome, error))
                self._wakeup.notify()

        ref.future().add_done_callback(on_done)

    def _complete(self, batch: _Batch, attempt_id: int, outcome, error) -> None:
        """Handle the end of one attempt of ``batch``: its answer, its failure, or its
        timeout. Each attempt ends once: a late answer of a timed-out attempt is dropped."""
        if attempt_id != batch.attempt_id:
            return
        batch.attempt_id += 1
        batch.sent_at = 0.0
        if error is not None:
            error = unwrap(error)
        if batch.done.is_set():  # acks=0 (settled when sent), or aborted by close()
            if error is not None:
                log.warning("produce to %s-%d failed after its futures were settled: %r",
                            batch.topic, batch.partition, error)
        elif error is None:
            self._settle(batch, outcome.base_offset, outcome.log_append_time_ms,
                         outcome.log_start_offset, None)
        elif (_retriable(error) and batch.attempts < self._retries and not self._stopping
              and self._retry_backoff(batch) is not None):
            backoff = self._retry_backoff(batch)
            batch.attempts += 1
            batch.retry_at = time.monotonic() + backoff * random.uniform(0.8, 1.0)
            log.info("retrying %s-%d (attempt %d/%d) after %r", batch.topic,
                     batch.partition, batch.attempts, self._retries, error)
            self._invalidate(batch.topic)
            with self._lock:
                q = self._queues[(batch.topic, batch.partition)]
                if q.inflight is batch:
                    q.inflight = None
                q.batches.appendleft(batch)   # at the head: order is kept
                self._wakeup.notify()
            return
        else:
            if _retriable(error):
                self._invalidate(batch.topic)
            self._settle(batch, -1, -1, -1, error)
        self._idle(batch)
        self._forget(batch)

    def _retry_backoff(self, batch: _Batch) -> float | None:
        """Seconds to wait before the next attempt of ``batch``, or None when that attempt
        would start past its delivery timeout."""
        backoff = min(self._backoff_s * (2 ** batch.attempts), self._backoff_max_s)
        if time.monotonic() + backoff - batch.created > self._delivery_timeout_s:
            return None
        return backoff

    def _idle(self, batch: _Batch) -> None:
        """The partition of ``batch`` may send its next batch."""
        with self._lock:
            q = self._queues.get((batch.topic, batch.partition))
            if q is not None and q.inflight is batch:
                q.inflight = None
                self._wakeup.notify()

    def _forget(self, batch: _Batch) -> None:
        """``batch`` is over: free its buffer memory."""
        with self._lock:
            if batch in self._incomplete:
                self._incomplete.discard(batch)
                self._release(batch.nbytes)

    def _settle(self, batch: _Batch, base_offset: int, append_time: int, log_start: int,
                error: BaseException | None) -> None:
        """Resolve or fail every future of ``batch`` (the first call wins) and run their
        callbacks."""
        with self._cb_lock:
            if batch.done.is_set():
                return
            batch.base_offset = base_offset
            batch.log_append_time = append_time
            batch.log_start_offset = log_start
            batch.error = error
            batch.done.set()
            callbacks, batch.callbacks = batch.callbacks, None
        for future, fn, errback in callbacks or ():
            self._run_callback(future, fn, errback)

    def _add_callback(self, future: FutureRecordMetadata, fn, args, kwargs,
                      errback: bool) -> None:
        if args or kwargs:
            fn = _partial(fn, args, kwargs)
        batch = future._batch
        with self._cb_lock:
            if not batch.done.is_set():
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append((future, fn, errback))
                return
        self._run_callback(future, fn, errback)

    @staticmethod
    def _run_callback(future: FutureRecordMetadata, fn, errback: bool) -> None:
        error = future._batch.error
        try:
            if errback and error is not None:
                fn(error)
            elif not errback and error is None:
                fn(future._metadata())
        except Exception:  # noqa: BLE001 - a user callback must not kill the sender
            log.exception("producer callback %r raised", fn)


# =========================================================================================
# helpers (pure)
# =========================================================================================

def _partial(fn, args, kwargs):
    def call(value):
        return fn(*args, value, **kwargs)
    return call


def _as_bytes(obj, what: str):
    if obj is None or type(obj) is bytes:
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    raise IllegalArgumentError(
        f"{what} must be bytes or None, got {type(obj).__name__} (configure a "
        f"{what}_serializer to send other types)")


def _as_bytes_list(items, what: str) -> tuple[list, bool]:
    """(``items`` as a list of bytes-or-None, whether there is a None among them)."""
    items = items if isinstance(items, list) else list(items)
    types = set(map(type, items))
    if not types <= {bytes, type(None)}:
        items = [_as_bytes(x, what) for x in items]
    return items, type(None) in types


def _check_headers(headers):
    """(headers as a list of (str, bytes|None), their encoded size) or IllegalArgumentError."""
    out = []
    size = 5
    try:
        for h_key, h_value in headers:
            if not isinstance(h_key, str):
                raise IllegalArgumentError(f"header keys must be str, got {h_key!r}")
            if h_value is not None and not isinstance(h_value, (bytes, bytearray, memoryview)):
                raise IllegalArgumentError(
                    f"header values must be bytes or None, got {type(h_value).__name__} for "
                    f"header {h_key!r}")
            h_value = None if h_value is None else bytes(h_value)
            out.append((h_key, h_value))
            size += 10 + len(h_key.encode("utf-8")) + (len(h_value) if h_value else 0)
    except (TypeError, ValueError):
        raise IllegalArgumentError(
            f"headers must be a list of (str, bytes) pairs, got {headers!r}") from None
    return out, size


def _sizes(items, has_none: bool) -> np.ndarray:
    if has_none:
        return np.fromiter((0 if x is None else len(x) for x in items), np.int64, len(items))
    return np.fromiter(map(len, items), np.int64, len(items))


def _taker(index: np.ndarray):
    """A function list -> [list[i] for i in index] (itemgetter: a C loop)."""
    il = index.tolist()
    if len(il) == 1:
        return lambda items: [items[il[0]]]
    getter = operator.itemgetter(*il)
    return lambda items: list(getter(items))


def _group(chosen: np.ndarray) -> list:
    """[(partition, sorted indexes of the records that go there)], stable order."""
    order = np.argsort(chosen, kind="stable")
    sorted_p = chosen[order]
    cuts = np.flatnonzero(sorted_p[1:] != sorted_p[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(chosen)]
    return [(int(sorted_p[a]), order[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


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
