"""The producer's sender: ONE background thread that takes ready batches from the
accumulator, sends them to their partitions' leader brokers, and handles the answers.

Each round (``step``) takes, under the accumulator's lock, the answers that arrived, the
attempts that outlived their request timeout and the batches that may go, then acts on them
outside the lock:

- dispatch: build each v2 batch once (``storage.records.build``, with the codec), look its
  partition's leader broker up in the cached metadata, and send every ready batch of one
  broker in ONE Produce request (Kafka's ``Sender.sendProduceRequests``; cut at
  ``request_limit`` bytes) over that broker's connection (``network.BrokerConnections``);
  the answer comes back through the request's future as one completion per batch, so the
  thread never blocks on one broker while others are ready;
- complete: settle the batch (acknowledged, or failed for good), or retry it per the
  ``RetryPolicy`` (``delivery_timeout_ms``-bounded, Kafka's default): refresh the topic's
  metadata and put the batch back at the head of its queue after a backoff. Each attempt
  ends once: a late answer of a timed-out attempt is dropped. An attempt that timed out
  closes its broker's connection (as Kafka's NetworkClient does): whatever else is in
  flight there fails with NetworkError and is retried over a new connection.

Idempotence (``idempotent=True``, KIP-98): before the first dispatch the sender asks a
broker for a producer id (InitProducerId); every batch is stamped, when its bytes are first
sent, with (producer id, epoch, the partition's next sequence), and keeps them on every
retry, so a broker that already wrote it answers with the original offsets instead of
writing it again. A partition has one request in flight holding at most 5 batches (the
window the broker remembers per producer), retried as the same group. On
OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID or INVALID_PRODUCER_EPOCH the batch fails
(its records may be lost: they are reported, never silently retried out of order) and the
producer bumps its epoch, restarting every partition's sequences at 0 (Kafka's idempotent
producer, KIP-360); past epoch 32767 it asks for a new producer id.

Thread-safety: completions are handed over under the accumulator's lock; everything else
runs on the sender thread, except ``stop`` (any thread).
"""

from __future__ import annotations

import logging
import struct
import threading
import time

from storage import records as _records

from .. import wire
from ..errors import (InvalidProducerEpochError, NetworkError, OutOfOrderSequenceError,
                      RequestTimedOutError, UnknownProducerIdError)
from ..protocol import unwrap
from .accumulator import ProducerBatch, RecordAccumulator
from .network import BrokerConnections, broker_error, parse_produce, wait_answer
from .retry import RetryPolicy, final_error

log = logging.getLogger(__name__)

_PRODUCER_FIELDS = struct.Struct(">qhi")     # producer_id, producer_epoch, base_sequence
_CRC = struct.Struct(">I")

# The sender wakes at least this often to check request deadlines.
SENDER_TICK_S = 0.1
# An attempt is expired this long after the replica's own timeout (which answers first).
EXPIRY_GRACE_S = 1.0
# The errors after which an idempotent producer bumps its epoch (KIP-360).
_SEQUENCE_ERRORS = (OutOfOrderSequenceError, UnknownProducerIdError, InvalidProducerEpochError)
MAX_PRODUCER_EPOCH = 32767
#: The batches of a partition an idempotent producer has in flight (Kafka's limit for
#: max.in.flight.requests.per.connection with idempotence; the broker keeps 5 per producer).
MAX_IN_FLIGHT_BATCHES = 5


class Sender:
    """``Sender(accumulator, metadata, retry, acks=, request_timeout_ms=, codec=,
    invalidate=, client_id=)``; ``start()`` runs it, ``stop()`` ends it.
    ``invalidate(topic)`` forgets the topic's metadata before a retry. ``metadata``
    provides ``leader_broker(topic, partition)`` and ``broker_address(broker_id)``."""

    def __init__(self, accumulator: RecordAccumulator, metadata, retry: RetryPolicy, *,
                 acks: int, request_timeout_ms: int, codec: int, invalidate,
                 client_id: str | None = None, idempotent: bool = False, security=None):
        self._acc = accumulator
        self._metadata = metadata
        self._network = BrokerConnections(metadata, client_id=client_id, security=security)
        self._retry = retry
        self._acks = acks
        self._request_timeout_ms = request_timeout_ms
        self._codec = codec
        self._invalidate = invalidate
        self._completions: list = []     # guarded by the accumulator's lock
        self.idempotent = idempotent
        self.producer_id = -1            # the idempotent producer's (sender thread only)
        self.producer_epoch = -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="raykafka-producer-sender")

    @property
    def network(self) -> BrokerConnections:
        """The connections to the brokers (for a request besides the produces: metadata)."""
        return self._network

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list:
        """Stop taking batches; returns the batches not over yet (for the caller to fail)."""
        with self._acc.lock:
            self._stopping = True
            leftover = list(self._acc.incomplete)
            self._acc.wakeup.notify()
        return leftover

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)
        self._network.close()

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                if not self.step():
                    return
            except Exception:  # noqa: BLE001 - the sender must outlive any one bug
                log.exception("producer sender step failed")
                time.sleep(SENDER_TICK_S)

    def step(self) -> bool:
        """One round: take completions and ready batches under the lock, act outside it.
        Returns False when the producer has stopped."""
        acc = self._acc
        expiry_s = self._request_timeout_ms / 1000.0 + EXPIRY_GRACE_S
        with acc.lock:
            while True:
                if self._stopping:
                    return False
                completions, self._completions = self._completions, []
                now = time.monotonic()
                ready, wake_at = acc.collect_ready(now, SENDER_TICK_S)
                expired = acc.collect_expired(now, expiry_s)
                if completions or ready or expired:
                    break
                acc.wakeup.wait(min(max(wake_at - now, 0.0005), SENDER_TICK_S))
        for batch, attempt_id, outcome, error in completions:
            self._complete(batch, attempt_id, outcome, error)
        for batch, attempt_id in expired:
            if batch.broker_id is not None:
                self._network.drop(batch.broker_id)   # what else is in flight there fails
            self._complete(batch, attempt_id, None, RequestTimedOutError(
                f"produce to {batch.topic}-{batch.partition} timed out after "
                f"{self._request_timeout_ms} ms"))
        self._dispatch(ready)
        return True

    # -- one attempt per batch, one request per broker ---------------------------------
    def _dispatch(self, ready: list) -> None:
        """Send ``ready`` (each batch with its riders: the batches of the same partition
        queued behind it), grouped by leader broker: one Produce request per broker,
        within ``request_limit`` bytes; the answers arrive as completions."""
        by_broker: dict[int, list] = {}
        if ready and self.idempotent and self.producer_id < 0:
            try:
                self._init_producer_id(ready[0])
            except Exception as exc:  # noqa: BLE001 - each batch retries (or fails) with it
                for batch in ready:
                    self._complete(batch, batch.attempt_id, None, exc)
                return
        for batch in ready:
            group = self._prepare(batch)
            if group is None:
                continue
            try:
                broker_id, _ = self._metadata.leader_broker(batch.topic, batch.partition)
            except Exception as exc:  # noqa: BLE001 - classified in _complete
                self._complete(batch, batch.attempt_id, None, exc)
                continue
            batch.broker_id = broker_id
            by_broker.setdefault(broker_id, []).append((batch, group))
        limit = self._acc.request_limit
        for broker_id, items in by_broker.items():
            request, size = [], 0
            for batch, group in items:
                nbytes = sum(len(b.data) for b in group)
                if request and size + nbytes > limit:
                    self._send(broker_id, request)
                    request, size = [], 0
                request.append((batch, group))
                size += nbytes
            self._send(broker_id, request)

    def _prepare(self, batch: ProducerBatch) -> list | None:
        """``batch`` and its riders, built; None (and the batch released) when close()
        aborted it while it was queued."""
        riders = [r for r in batch.riders or () if not r.done.is_set()]
        for r in batch.riders or ():
            if r.done.is_set():        # aborted by close() while queued
                self._acc.forget(r)
        batch.riders = riders or None
        if batch.done.is_set():   # aborted by close() while queued
            self._acc.requeue_riders(batch)
            self._acc.idle(batch)
            self._acc.forget(batch)
            return None
        group = [batch] + riders
        try:
            for b in group:
                if b.data is None:
                    b.data = _records.build(b.values, b.keys, b.timestamps, b.headers,
                                            compression=self._codec)
                    b.values = b.keys = b.headers = None
                if self.idempotent and b.base_sequence < 0:
                    self._stamp(b)
        except Exception as exc:  # noqa: BLE001 - classified in _complete
            self._complete(batch, batch.attempt_id, None, exc)
            return None
        return group

    # -- idempotence -----------------------------------------------------------------------
    def _init_producer_id(self, batch: ProducerBatch) -> None:
        """Get a producer id from the leader broker of ``batch`` (any broker can answer)."""
        broker_id, _ = self._metadata.leader_broker(batch.topic, batch.partition)
        body = {"transactional_id": None, "transaction_timeout_ms": 60000,
                "producer_id": -1, "producer_epoch": -1}
        future = self._network.send(broker_id, wire.INIT_PRODUCER_ID, body)
        answer = wait_answer(self._network, broker_id, future,
                             self._request_timeout_ms / 1000.0, "InitProducerId")
        if answer["error_code"]:
            raise broker_error(answer["error_code"])
        self.producer_id, self.producer_epoch = answer["producer_id"], answer["producer_epoch"]
        self._sequences.clear()
        log.info("idempotent producer: producer id %d, epoch %d", self.producer_id,
                 self.producer_epoch)

    def _stamp(self, b: ProducerBatch) -> None:
        """Write (producer id, epoch, the partition's next sequence) into ``b``'s header
        (the fields are under the CRC: it is computed again)."""
        tp = (b.topic, b.partition)
        seq = self._sequences.get(tp, 0)
        data = bytearray(b.data)
        _PRODUCER_FIELDS.pack_into(data, _records.PRODUCER_ID_POS, self.producer_id,
                                   self.producer_epoch, seq)
        _CRC.pack_into(data, _records.CRC_POS,
                       _records.crc32c(memoryview(data)[_records.ATTRIBUTES_POS:]))
        b.data = bytes(data)
        b.base_sequence = seq
        self._sequences[tp] = (seq + b.count) % (1 << 31)

    def _bump_epoch(self, error: BaseException) -> None:
        """After a sequence error: a new epoch (or, past the last one, a new producer id)
        and every partition's sequences from 0 (batches already stamped keep theirs)."""
        self._sequences.clear()
        if self.producer_epoch >= MAX_PRODUCER_EPOCH:
            self.producer_id = self.producer_epoch = -1
        else:
            self.producer_epoch += 1
        log.warning("idempotent producer: %r; epoch bumped to %d", unwrap(error),
                    self.producer_epoch)

    def _send(self, broker_id: int, request: list) -> None:
        """One Produce request to ``broker_id`` carrying ``request``: [(batch, its group)],
        one partition each."""
        topics: dict[str, list] = {}
        attempts = []
        now = time.monotonic()
        for batch, group in request:
            payload = batch.data if len(group) == 1 else b"".join(b.data for b in group)
            topics.setdefault(batch.topic, []).append(
                {"index": batch.partition, "records": payload})
            batch.sent_at = now
            attempts.append((batch, batch.attempt_id, group))
        body = {"transactional_id": None, "acks": self._acks,
                "timeout_ms": self._request_timeout_ms,
                "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()]}
        try:
            future = self._network.send(broker_id, wire.PRODUCE, body,
                                        expect_response=self._acks != 0)
        except Exception as exc:  # noqa: BLE001 - classified in _complete
            for batch, attempt_id, _ in attempts:
                self._complete(batch, attempt_id, None, exc)
            return
        if self._acks == 0:
            # fire and forget: settled once written; the partitions may send again
            completions = []
            for batch, attempt_id, group in attempts:
                for b in group:
                    b.settle(-1, -1, -1, None)
                completions.append((batch, attempt_id, None, None))
            self._hand_over(completions)
            return

        def on_done(fut, attempts=attempts, broker_id=broker_id):
            try:
                answers = parse_produce(fut.result())
                error = None
            except BaseException as exc:  # noqa: BLE001 - handed to the sender thread
                answers, error = {}, exc
            completions = []
            for batch, attempt_id, _ in attempts:
                if error is not None:
                    completions.append((batch, attempt_id, None, error))
                    continue
                answer = answers.get((batch.topic, batch.partition))
                if answer is None:
                    answer = NetworkError(f"broker {broker_id} answered a produce without "
                                          f"{batch.topic}-{batch.partition}")
                if isinstance(answer, BaseException):
                    completions.append((batch, attempt_id, None, answer))
                else:
                    completions.append((batch, attempt_id, answer, None))
            self._hand_over(completions)

        future.add_done_callback(on_done)

    def _hand_over(self, completions: list) -> None:
        with self._acc.lock:
            self._completions.extend(completions)
            self._acc.wakeup.notify()

    def _complete(self, batch: ProducerBatch, attempt_id: int, outcome, error) -> None:
        """Handle the end of one attempt of ``batch`` (and its riders): its answer, its
        failure (``error`` as raised: the retry policy tells a replica's error from a
        local one), or its timeout. The riders share the outcome: their records follow
        the batch's in the log."""
        if attempt_id != batch.attempt_id:
            return
        batch.attempt_id += 1
        batch.sent_at = 0.0
        group = [batch] + (batch.riders or [])
        if batch.done.is_set():  # acks=0 (settled when sent), or aborted by close()
            if error is not None:
                log.warning("produce to %s-%d failed after its futures were settled: %r",
                            batch.topic, batch.partition, unwrap(error))
        elif error is None:
            offset = outcome.base_offset
            for b in group:
                b.settle(offset, outcome.log_append_time_ms, outcome.log_start_offset, None)
                offset += b.count
        else:
            backoff = None if self._stopping else self._retry.next_backoff_s(
                error, failed_attempts=batch.attempts + 1, started_s=batch.created)
            if backoff is not None:
                for b in group:
                    b.attempts = batch.attempts + 1
                    b.retry_at = time.monotonic() + backoff
                log.info("retrying %s-%d (retry %d of at most %d) after %r", batch.topic,
                         batch.partition, batch.attempts, self._retry.max_attempts - 1,
                         unwrap(error))
                self._invalidate(batch.topic)
                self._acc.requeue(batch)
                return
            if self._retry.retriable(error):
                self._invalidate(batch.topic)
            if self.idempotent and isinstance(unwrap(error), _SEQUENCE_ERRORS):
                self._bump_epoch(error)
            for b in group:
                b.settle(-1, -1, -1, final_error(error))
        batch.riders = None
        self._acc.idle(batch)
        for b in group:
            self._acc.forget(b)
