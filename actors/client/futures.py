"""What ``Producer.send`` and ``Producer.send_batch`` return: views of the outcome of the
producer batches that carry the records.

A batch (``accumulator.ProducerBatch``) is settled once, by the sender (acknowledged, or
failed for good) or by ``close``; these futures only read it. ``FutureRecordMetadata`` is one
record of one batch; ``BatchFuture`` is every record of one ``send_batch`` call, spread over
the request-sized batches it was cut into.

Thread-safety: any thread may wait on or read a future. Callbacks run on the thread that
settles the batch (the sender), or at once in the caller's thread when added to a settled
future; they must not block.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..errors import KafkaTimeoutError
from ..types import RecordMetadata

log = logging.getLogger(__name__)


class FutureRecordMetadata:
    """The outcome of one ``send``: resolves to a RecordMetadata or fails with a KafkaError.

    ``get(timeout=None)`` blocks (KafkaTimeoutError after ``timeout`` seconds);
    ``add_callback(fn, *args, **kw)`` calls ``fn(*args, record_metadata, **kw)`` on success,
    ``add_errback(fn, *args, **kw)`` calls ``fn(*args, exception, **kw)`` on failure.
    """

    __slots__ = ("_batch", "_index", "_timestamp", "_key_size", "_value_size")

    def __init__(self, batch, index: int, timestamp: int, key_size: int, value_size: int):
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
        self._batch.add_callback(self, _bind(fn, args, kwargs), errback=False)
        return self

    def add_errback(self, fn, *args, **kwargs) -> "FutureRecordMetadata":
        self._batch.add_callback(self, _bind(fn, args, kwargs), errback=True)
        return self

    def add_both(self, fn, *args, **kwargs) -> "FutureRecordMetadata":
        self.add_callback(fn, *args, **kwargs)
        return self.add_errback(fn, *args, **kwargs)

    def fire(self, fn, errback: bool) -> None:
        """Call ``fn`` if it applies to the settled outcome (the batch calls this); a
        callback that raises is logged, never propagated to the sender."""
        error = self._batch.error
        try:
            if errback and error is not None:
                fn(error)
            elif not errback and error is None:
                fn(self._metadata())
        except Exception:  # noqa: BLE001 - a user callback must not kill the sender
            log.exception("producer callback %r raised", fn)


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


def _bind(fn, args, kwargs):
    """``fn`` taking the outcome after ``args`` and before ``kwargs`` (kafka-python's)."""
    if not args and not kwargs:
        return fn

    def call(value):
        return fn(*args, value, **kwargs)
    return call
