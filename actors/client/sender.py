"""The producer's sender: ONE background thread that takes ready batches from the
accumulator, sends each to its partition's leader, and handles the answers.

Each round (``step``) takes, under the accumulator's lock, the answers that arrived, the
attempts that outlived their request timeout and the batches that may go, then acts on them
outside the lock:

- dispatch: build the v2 batch once (``storage.records.build``, with the codec), look the
  leader up, call ``leader.produce.remote(batch, acks, timeout_ms)``; the answer comes back
  through the ObjectRef's future as a completion, so the thread never blocks on one
  partition while others are ready;
- complete: settle the batch (acknowledged, or failed for good), or retry it per the
  ``RetryPolicy`` (``delivery_timeout_ms``-bounded, Kafka's default): refresh the topic's
  metadata and put the batch back at the head of its queue after a backoff. Each attempt
  ends once: a late answer of a timed-out attempt is dropped.

Thread-safety: completions are handed over under the accumulator's lock; everything else
runs on the sender thread, except ``stop`` (any thread).
"""

from __future__ import annotations

import logging
import threading
import time

from storage import records as _records

from ..errors import RequestTimedOutError
from ..protocol import unwrap
from .accumulator import ProducerBatch, RecordAccumulator
from .retry import RetryPolicy, final_error

log = logging.getLogger(__name__)

# The sender wakes at least this often to check request deadlines.
SENDER_TICK_S = 0.1
# An attempt is expired this long after the replica's own timeout (which answers first).
EXPIRY_GRACE_S = 1.0


class Sender:
    """``Sender(accumulator, metadata, retry, acks=, request_timeout_ms=, codec=,
    invalidate=)``; ``start()`` runs it, ``stop()`` ends it. ``invalidate(topic)`` forgets
    the topic's metadata before a retry."""

    def __init__(self, accumulator: RecordAccumulator, metadata, retry: RetryPolicy, *,
                 acks: int, request_timeout_ms: int, codec: int, invalidate):
        self._acc = accumulator
        self._metadata = metadata
        self._retry = retry
        self._acks = acks
        self._request_timeout_ms = request_timeout_ms
        self._codec = codec
        self._invalidate = invalidate
        self._completions: list = []     # guarded by the accumulator's lock
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="raykafka-producer-sender")

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
            self._complete(batch, attempt_id, None, RequestTimedOutError(
                f"produce to {batch.topic}-{batch.partition} timed out after "
                f"{self._request_timeout_ms} ms"))
        for batch in ready:
            self._dispatch(batch)
        return True

    # -- one attempt ---------------------------------------------------------------------
    def _dispatch(self, batch: ProducerBatch) -> None:
        """Build (once) and send one batch, with its riders (the batches of the same
        partition queued behind it) in the same request; the answer arrives as a
        completion."""
        riders = [r for r in batch.riders or () if not r.done.is_set()]
        for r in batch.riders or ():
            if r.done.is_set():        # aborted by close() while queued
                self._acc.forget(r)
        batch.riders = riders or None
        if batch.done.is_set():   # aborted by close() while queued
            self._acc.requeue_riders(batch)
            self._acc.idle(batch)
            self._acc.forget(batch)
            return
        attempt_id = batch.attempt_id
        group = [batch] + riders
        try:
            for b in group:
                if b.data is None:
                    b.data = _records.build(b.values, b.keys, b.timestamps, b.headers,
                                            compression=self._codec)
                    b.values = b.keys = b.headers = None
            payload = batch.data if not riders else b"".join(b.data for b in group)
            leader = self._metadata.leader(batch.topic, batch.partition)
            batch.sent_at = time.monotonic()
            ref = leader.handle.produce.remote(payload, self._acks, self._request_timeout_ms)
        except Exception as exc:  # noqa: BLE001 - classified in _complete
            self._complete(batch, attempt_id, None, exc)
            return
        if self._acks == 0:
            # fire and forget for the caller; the sender still paces by the answer
            for b in group:
                b.settle(-1, -1, -1, None)

        def on_done(fut, batch=batch, attempt_id=attempt_id):
            try:
                outcome, error = fut.result(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the sender thread
                outcome, error = None, exc
            with self._acc.lock:
                self._completions.append((batch, attempt_id, outcome, error))
                self._acc.wakeup.notify()

        ref.future().add_done_callback(on_done)

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
            for b in group:
                b.settle(-1, -1, -1, final_error(error))
        batch.riders = None
        self._acc.idle(batch)
        for b in group:
            self._acc.forget(b)
