"""Producer: kafka-python's KafkaProducer, speaking Kafka's protocol to the brokers.

Data path, one module per noun (as Kafka's producer)::

    send() ──► Partitioner (partitioner.py) ──► RecordAccumulator (accumulator.py): an open
                       │  batch per partition, bounded by buffer_memory; a batch is ready
                       │  when full (batch_size) or linger_ms old, or when flush()/close()
                       ▼  asks
               Sender (sender.py): ONE thread; builds the v2 batches, sends every ready
               batch of one leader broker in ONE Produce request over that broker's
               connection (network.py), handles the answers, retries per the
               RetryPolicy (retry.py)
    send_batch() ─► partitions a whole list at once (vectorised murmur2), builds the
                    request-sized batches in the caller's thread and queues them, already
                    built, on the same per-partition queues

What the caller holds are futures (futures.py): FutureRecordMetadata per ``send``,
BatchFuture per ``send_batch``. This module keeps the public surface: config, argument
checks, and the composition of the pieces above.

Guarantees and their mechanisms:
- Order per partition (and so per key): at most one request per partition is in flight, and
  a batch that fails retriably goes back to the *head* of its partition's queue. Records of
  one key always map to one partition (for a fixed partition count).
- Exactly once per partition with ``enable_idempotence=True`` (the default, as Kafka 3+;
  KIP-98, no transactions): the producer gets a producer id (InitProducerId) and numbers
  each partition's batches; a retried batch that the leader (or, after a failover, the new
  leader) already has is answered with its original offsets, not written again. It needs
  acks="all" (setting both ``enable_idempotence=True`` and another acks is an
  InvalidConfigurationError; another acks alone turns idempotence off, as Kafka 3.2+).
  A partition then has at most 5 batches in flight (one request), retried together.
- At-least-once without idempotence: a retried request whose first attempt was in fact
  appended (a timeout, a leader that died after writing) is written again. Nothing
  acknowledged is lost by the client; durability past a leader's death is the cluster's
  (acks="all").
- Bounded: ``retries`` attempts per batch with exponential backoff (jittered) from
  ``retry_backoff_ms`` to ``retry_backoff_max_ms``, and no retry that would start later than
  ``delivery_timeout_ms`` after the batch was created (Kafka's defaults: retries unbounded,
  120 s); each attempt times out after ``request_timeout_ms``; ``buffer_memory`` bytes of
  unacknowledged records at most (send blocks up to ``max_block_ms``, then
  KafkaTimeoutError).
- Retriable: what ``retry.RetryPolicy`` says (Kafka's retriable error codes such as
  NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR, our own request timeout, a broken or
  refused connection: NetworkError); each retry invalidates the topic's metadata first. An unknown topic or partition named by the metadata (which has re-read a
  broker) is final. Anything else fails the batch's futures with the typed error.

Thread-safety: send/send_batch/flush/close may be called from any threads. Future callbacks
run on the sender thread (or in the caller's thread when added to a finished future); they
must not block.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from storage.compression import codec_id

from .. import wire
from ..errors import (IllegalArgumentError, IllegalStateError, InvalidConfigurationError,
                      KafkaTimeoutError, NoBrokersAvailable, RecordTooLargeError,
                      UnknownTopicOrPartitionError, UnsupportedCodecError)
from .accumulator import (BATCH_OVERHEAD, RECORD_OVERHEAD_MAX, RecordAccumulator,
                          cut_and_build)
from ..connection import SECURITY_DEFAULTS, ClientSecurity
from .config import positive_int, validate_config
from .futures import BatchFuture, FutureRecordMetadata
from .metadata import attach_network, client_metadata
from .network import broker_error, known_broker_ids, topic_metadata
from .partitioner import Partitioner
from .retry import RetryPolicy
from .sender import MAX_IN_FLIGHT_BATCHES, Sender

log = logging.getLogger(__name__)

#: How long a Metadata request asking for a topic's creation waits for each broker.
METADATA_REQUEST_TIMEOUT_S = 10.0

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
    "enable_idempotence": True,      # Kafka 3+'s default (needs acks="all")
    "allow_auto_create_topics": True,  # ask the brokers to make an unknown topic
    **SECURITY_DEFAULTS,
}

_ACKS = {0: 0, 1: 1, -1: -1, "all": -1, "0": 0, "1": 1, "-1": -1}


class Producer:
    """A thread-safe producer; see the module docstring. ``Producer(metadata, **config)``.

    ``metadata`` provides ``partitions_for(topic)``, ``leader_broker(topic, partition)``
    (broker id, leader epoch), ``broker_address(broker_id)`` (host, port) and
    ``invalidate(topic=None)``. A steady send makes no Ray call: the metadata is cached and
    the records travel on the brokers' Kafka listeners.
    """

    def __init__(self, metadata, **config):
        self.metadata = metadata = client_metadata(metadata)
        explicit_idempotence = "enable_idempotence" in config
        self.config = config = validate_config(config, DEFAULT_CONFIG, "producer")
        acks = config["acks"]
        if acks not in _ACKS or isinstance(acks, bool):
            raise InvalidConfigurationError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")
        idempotent = config["enable_idempotence"]
        if not isinstance(idempotent, bool):
            raise InvalidConfigurationError(
                f"enable_idempotence must be True or False, got {idempotent!r}")
        if idempotent and _ACKS[acks] != -1:
            if explicit_idempotence:
                raise InvalidConfigurationError(
                    f"enable_idempotence=True needs acks='all', got acks={acks!r}")
            idempotent = False              # Kafka 3.2+: another acks turns it off
        self.idempotent = idempotent
        self._auto_create = config["allow_auto_create_topics"]
        if not isinstance(self._auto_create, bool):
            raise InvalidConfigurationError(
                f"allow_auto_create_topics must be True or False, got {self._auto_create!r}")
        batch_size = positive_int(config, "batch_size", 1)
        linger_s = positive_int(config, "linger_ms") / 1000.0
        retry = RetryPolicy.from_config(config, deadline_key="delivery_timeout_ms")
        self._max_request_size = positive_int(config, "max_request_size", 1)
        request_timeout_ms = positive_int(config, "request_timeout_ms", 1)
        max_block_s = positive_int(config, "max_block_ms") / 1000.0
        self._buffer_memory = positive_int(config, "buffer_memory", 1)
        self._metadata_max_age_s = positive_int(config, "metadata_max_age_ms") / 1000.0
        try:
            self._codec = codec_id(config["compression_type"] or "none")
        except UnsupportedCodecError:
            raise InvalidConfigurationError(
                f"compression_type must be None, 'gzip', 'snappy', 'lz4' or 'zstd', got "
                f"{config['compression_type']!r}") from None
        for name in ("key_serializer", "value_serializer", "partitioner"):
            if config[name] is not None and not callable(config[name]):
                raise InvalidConfigurationError(f"{name} must be callable, got "
                                                f"{config[name]!r}")
        self._partitions: dict[str, tuple[list, float]] = {}
        self._known_topics: set[str] = set()
        self._max_block_s = max_block_s
        self._metadata_backoff_s = max(positive_int(config, "retry_backoff_ms"), 10) / 1000.0
        self._partitioner = Partitioner(config["partitioner"])
        # a batch never grows past what one request may carry
        self._accumulator = RecordAccumulator(
            batch_limit=min(batch_size, self._max_request_size), linger_s=linger_s,
            buffer_memory=self._buffer_memory, max_block_s=max_block_s,
            request_limit=self._max_request_size,
            max_group_batches=MAX_IN_FLIGHT_BATCHES if idempotent else None)
        self._sender = Sender(self._accumulator, metadata, retry, acks=_ACKS[acks],
                              request_timeout_ms=request_timeout_ms, codec=self._codec,
                              invalidate=self._invalidate, client_id=config["client_id"],
                              idempotent=idempotent,
                              security=ClientSecurity.from_config(config))
        attach_network(metadata, self._sender.network)
        self._sender.start()

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- metadata ------------------------------------------------------------------------
    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (cached for ``metadata_max_age_ms``).

        Like Kafka's producer, waits up to ``max_block_ms`` for metadata while no broker
        answers, or while the answers lack a topic this producer has sent to before (every
        broker restarted, their caches not filled yet); then KafkaTimeoutError. A topic
        the brokers do not know is asked for with a Metadata request that allows its
        creation (``allow_auto_create_topics``, kafka-python's name; on by default as in
        Kafka's clients): a broker with ``auto.create.topics.enable`` makes it and this
        waits for its leaders like for a known topic. Where no broker makes it (creation
        off, here or on the brokers) UnknownTopicOrPartitionError comes at once (a typo
        should not block for a minute, as it does in Kafka's producer)."""
        hit = self._partitions.get(topic)
        if hit is not None and time.monotonic() - hit[1] < self._metadata_max_age_s:
            return hit[0]
        deadline = time.monotonic() + self._max_block_s
        while True:
            try:
                parts = list(self.metadata.partitions_for(topic))
                break
            except (NoBrokersAvailable, UnknownTopicOrPartitionError) as exc:
                if (isinstance(exc, UnknownTopicOrPartitionError)
                        and topic not in self._known_topics):
                    if not self._ask_to_create(topic):
                        raise
                    self._known_topics.add(topic)   # being made: wait for its leaders
                if time.monotonic() + self._metadata_backoff_s > deadline:
                    raise KafkaTimeoutError(
                        f"no metadata for topic {topic!r} within max_block_ms="
                        f"{int(self._max_block_s * 1000)} (last: {exc})") from exc
                time.sleep(self._metadata_backoff_s)
                self.metadata.invalidate(topic)
        self._known_topics.add(topic)
        self._partitions[topic] = (parts, time.monotonic())
        return parts

    def _ask_to_create(self, topic: str) -> bool:
        """A Metadata request allowing ``topic``'s creation to a live broker: True when a
        broker has made it or is making it, False when none will (creation off, no broker
        answered). A name the brokers refuse, or a principal they deny, raises the typed
        error they answered."""
        if not self._auto_create:
            return False
        brokers = known_broker_ids(self.metadata)
        answer = topic_metadata(self._sender.network, brokers, [topic], allow_auto_create=True,
                                timeout_s=min(self._max_block_s, METADATA_REQUEST_TIMEOUT_S))
        if answer is None:
            return False
        broker_id, codes = answer
        unknown = wire.ERRORS_BY_NAME["UNKNOWN_TOPIC_OR_PARTITION"].code
        code = codes.get(topic, unknown)
        if code == wire.ERRORS_BY_NAME["LEADER_NOT_AVAILABLE"].code:
            log.info("topic %r is being created by broker %d on first use", topic, broker_id)
            return True
        if code == wire.NONE:           # the broker knows it: this client's cache lagged
            return True
        if code == unknown:
            return False
        raise broker_error(code, f"topic {topic!r}: broker {broker_id} answered "
                                 f"{wire.ERRORS[code].name}")

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
        if self._accumulator.closed:
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
        if partition is None:
            partition = self._partitioner.partition(key, parts)
            if partition is not None and self._partitioner.user is not None:
                self._check_partition(topic, partition, parts)
                partition = int(partition)
        else:
            self._check_partition(topic, partition, parts)
            partition = int(partition)
        return self._accumulator.append(topic, partition, key, value, timestamp_ms, headers,
                                        size, key_size, value_size, parts=parts,
                                        sticky=self._partitioner)

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
        if self._accumulator.closed:
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
        else:
            assignment = self._partitioner.assign(keys, null_keys, n, parts)
            if self._partitioner.user is not None:
                for p, _ in assignment:
                    self._check_partition(topic, p, parts)

        pieces = []
        for batch, chunk in cut_and_build(
                topic, assignment, values, keys, headers, ts, sizes,
                limit=self._max_request_size - BATCH_OVERHEAD, codec=self._codec,
                now_ms=now_ms, buffer_memory=self._buffer_memory):
            pieces.append((batch, chunk))
            self._accumulator.enqueue(batch)
        return BatchFuture(topic, n, pieces, ts)

    # -- flush and close -----------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far now and wait until it is acknowledged or failed;
        KafkaTimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = self._accumulator.begin_flush()
        try:
            for b in pending:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if not b.done.wait(left):
                    raise KafkaTimeoutError(f"flush did not complete within {timeout}s")
        finally:
            self._accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new sends, deliver what is queued (waiting up to ``timeout`` seconds),
        fail whatever is left with KafkaTimeoutError, and stop the sender thread.
        Idempotent."""
        self._accumulator.close()
        try:
            self.flush(timeout)
        except KafkaTimeoutError:
            pass
        for b in self._sender.stop():
            b.settle(-1, -1, -1, KafkaTimeoutError(
                f"producer closed before {b.topic}-{b.partition} records were acknowledged"))
            self._accumulator.forget(b)
        self._sender.join(timeout=5.0)

    @property
    def closed(self) -> bool:
        return self._accumulator.closed

    def metrics(self) -> dict:
        return self._accumulator.metrics()


# -- argument checks (pure) ----------------------------------------------------------------

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

