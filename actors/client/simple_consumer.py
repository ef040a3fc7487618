"""SimpleConsumer: the seed's low-level consumer. The caller names topic, partition and
offset; no group, no committed offsets, no background threads.

- ``fetch(topic, partition, offset, max_bytes=1048576, max_wait_ms=0, min_bytes=1)
  -> list[Record]``: the records at or after ``offset`` from one fetch of the partition
  leader (whole batches of at most about ``max_bytes``, a first batch larger than that still
  whole; records before ``offset`` in the first batch are dropped). Up to the high
  watermark; an empty list at the end. With ``max_wait_ms`` the leader holds the request
  until ``min_bytes`` are readable or the wait is over (Kafka's long poll), so a record is
  seen about one round trip after it is committed instead of on the next call.
- ``multifetch([(topic, partition, offset, max_bytes), ...], max_wait_ms=0, min_bytes=1)
  -> {(topic, partition): [Record]}``: all requests issued at once (one actor call each),
  then gathered; with ``max_wait_ms`` each leader waits on its own, so the call returns
  when every one has answered (at most about ``max_wait_ms`` plus a round trip).
- ``offsets_before(topic, partition, time_ms, max_offsets=1) -> [int]``: descending;
  ``time_ms=-1`` latest (the high watermark), ``-2`` earliest (the log start offset).
- ``fetch_columns`` / ``multifetch_columns``: the same reads decoded straight into a
  pyarrow Table (offset, timestamp, timestamp_type, key, value, headers): the bulk path.

Errors are typed: OffsetOutOfRangeError (below the log start or past the high watermark),
UnknownTopicOrPartitionError (when the metadata, after re-reading a broker, does not know
the topic or partition: not retried). Retriable errors (a stale leader: NotLeaderForPartition,
LeaderNotAvailable, KafkaStorageError, the leader actor dead or unreachable, or not
answering within ``request_timeout_ms``) make it invalidate the metadata and retry per
``retry.RetryPolicy``: at most ``retries`` times, with backoff, and never past
``default_api_timeout_ms`` from the call; then the last error is raised (KafkaTimeoutError
for a request that did not answer). Each request waits at most ``request_timeout_ms`` plus
its ``max_wait_ms`` (the leader may hold a long poll that long before answering).
Thread-safe (no mutable state beyond the metadata object, which is thread-safe).
"""

from __future__ import annotations

import time

import numpy as np
import ray

from storage.records import decode_columns, decode_records, iter_headers, numbers_view

from ..errors import IllegalArgumentError, IllegalStateError, KafkaTimeoutError
from ..types import Record
from .config import validate_config
from .retry import RetryPolicy, final_error

DEFAULT_CONFIG = {
    "retries": 5,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 1000,
    "request_timeout_ms": 30000,
    "default_api_timeout_ms": 60000,
    "key_deserializer": None,
    "value_deserializer": None,
    "client_id": None,
}

DEFAULT_FETCH_MAX_BYTES = 1048576


def next_fetch_offset(data) -> int | None:
    """The offset after the last batch of a fetch answer, read from the batch headers (CRCs
    are left to the decode): where the next fetch of the partition starts. None when the
    answer holds no batch; CorruptRecordError when the headers do not parse."""
    last = None
    for last in iter_headers(data, check_crc=False):
        pass
    return None if last is None else last.next_offset


def fetch_remote(handle, offset: int, max_bytes: int, max_wait_ms: int = 0,
                 min_bytes: int = 1):
    """``handle.fetch.remote(...)`` on a leader replica: the long-poll arguments travel
    only when they ask for more than an immediate answer, and a leader whose ``fetch``
    does not take them (Ray checks the signature at ``.remote``) is asked without them:
    it answers at once, as a zero wait would."""
    if max_wait_ms <= 0 and min_bytes == 1:
        return handle.fetch.remote(offset, max_bytes)
    try:
        return handle.fetch.remote(offset, max_bytes, max_wait_ms=max_wait_ms,
                                   min_bytes=min_bytes)
    except TypeError:
        return handle.fetch.remote(offset, max_bytes)


class SimpleConsumer:
    """``SimpleConsumer(metadata, **config)``; see the module docstring."""

    def __init__(self, metadata, **config):
        self.metadata = metadata
        self.config = validate_config(config, DEFAULT_CONFIG, "simple consumer")
        self._retry = RetryPolicy.from_config(self.config,
                                              deadline_key="default_api_timeout_ms")
        self._timeout_s = self.config["request_timeout_ms"] / 1000.0
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "SimpleConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- public reads ----------------------------------------------------------------------
    def fetch(self, topic: str, partition: int, offset: int,
              max_bytes: int = DEFAULT_FETCH_MAX_BYTES, max_wait_ms: int = 0,
              min_bytes: int = 1) -> list[Record]:
        _check_request(topic, partition, offset, max_bytes)
        _check_wait(max_wait_ms, min_bytes)
        data = self._fetch(topic, partition, offset, max_bytes, max_wait_ms, min_bytes).data
        return self._records(topic, partition, offset, data)

    def multifetch(self, requests, max_wait_ms: int = 0, min_bytes: int = 1) -> dict:
        _check_wait(max_wait_ms, min_bytes)
        datas = self._multicall(requests, max_wait_ms, min_bytes)
        return {(t, p): self._records(t, p, o, d) for (t, p, o, _), d in datas}

    def fetch_columns(self, topic: str, partition: int, offset: int,
                      max_bytes: int = DEFAULT_FETCH_MAX_BYTES):
        """The records at or after ``offset`` as a ``pyarrow.Table`` (columns offset,
        timestamp, timestamp_type, key, value, headers); keys and values raw bytes."""
        _check_request(topic, partition, offset, max_bytes)
        data = self._fetch(topic, partition, offset, max_bytes).data
        return _table(offset, data)

    def multifetch_columns(self, requests) -> dict:
        """``multifetch`` into pyarrow Tables: ``{(topic, partition): Table}``."""
        return {(t, p): _table(o, d) for (t, p, o, _), d in self._multicall(requests)}

    def iter_columns(self, topic: str, partitions=None, start_offsets=None,
                     end_offsets=None, max_bytes: int = 4 << 20):
        """Read partitions from start to end as a stream of ``(partition, pyarrow.Table)``
        (the consume throughput path).

        ``partitions``: None for all; ``start_offsets``/``end_offsets``: None for the log
        start / the high watermark at the call, or ``{partition: offset}`` (end exclusive).
        One fetch per partition stays in flight: the next one is issued (its offset read
        from the batch headers) before the current answer is decoded, so fetching and
        decoding overlap. Stale leaders are retried as in ``fetch``.
        """
        parts = list(self.metadata.partitions_for(topic) if partitions is None else partitions)
        start = {p: (start_offsets or {}).get(p) for p in parts}
        end = {p: (end_offsets or {}).get(p) for p in parts}
        for p in parts:
            if start[p] is None:
                start[p] = self.offsets_before(topic, p, -2)[0]
            if end[p] is None:
                end[p] = self.offsets_before(topic, p, -1)[0]
        pos = dict(start)
        inflight = {}   # ObjectRef -> partition

        def issue(p):
            if pos[p] < end[p]:
                ref = self.metadata.leader(topic, p).handle.fetch.remote(pos[p], max_bytes)
                inflight[ref] = p

        for p in parts:
            issue(p)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self._timeout_s)
            if not ready:
                raise KafkaTimeoutError(f"fetch of {topic} did not answer within "
                                        f"{self._timeout_s}s")
            p = inflight.pop(ready[0])
            offset = pos[p]
            try:
                data = ray.get(ready[0], timeout=self._timeout_s).data
            except Exception as exc:  # noqa: BLE001 - typed below
                if not self._retry.retriable(exc):
                    raise final_error(exc) from None
                self.metadata.invalidate(topic)
                data = self._fetch(topic, p, offset, max_bytes).data
            following = next_fetch_offset(data)
            if following is None:
                raise KafkaTimeoutError(f"{topic}-{p}: empty fetch at offset {offset} before "
                                        f"the end offset {end[p]} (records deleted?)")
            pos[p] = following
            issue(p)
            table = _table(offset, data)
            if pos[p] > end[p]:
                table = table.filter(_lt(table, end[p]))
            yield p, table

    def offsets_before(self, topic: str, partition: int, time_ms: int,
                       max_offsets: int = 1) -> list[int]:
        if isinstance(time_ms, bool) or not isinstance(time_ms, int):
            raise IllegalArgumentError(f"time_ms must be an int, got {time_ms!r}")
        if isinstance(max_offsets, bool) or not isinstance(max_offsets, int) or max_offsets < 1:
            raise IllegalArgumentError(f"max_offsets must be an int >= 1, got {max_offsets!r}")
        _check_tp(topic, partition)
        return list(self._call(topic, partition, "list_offsets", time_ms, max_offsets))

    # -- plumbing --------------------------------------------------------------------------
    def _records(self, topic: str, partition: int, offset: int, data) -> list[Record]:
        kd = self.config["key_deserializer"]
        vd = self.config["value_deserializer"]
        out = []
        append = out.append
        for r in decode_records(data):
            if r.offset < offset:
                continue
            key, value = r.key, r.value
            if kd is not None and key is not None:
                key = kd(key)
            if vd is not None and value is not None:
                value = vd(value)
            append(Record(topic, partition, r.offset, r.timestamp, r.timestamp_type, key,
                          value, r.headers))
        return out

    def _call(self, topic: str, partition: int, method: str, *args, wait_ms: int = 0,
              send=None):
        """One request to the leader of (topic, partition), retried per the policy;
        ``send(handle)`` issues it (default: ``handle.<method>.remote(*args)``), and
        ``wait_ms`` is how long the leader may hold it before answering."""
        if self._closed:
            raise IllegalStateError("the simple consumer is closed")
        if send is None:
            def send(handle):
                return getattr(handle, method).remote(*args)

        def attempt(left_s):
            leader = self.metadata.leader(topic, partition)
            return ray.get(send(leader.handle),
                           timeout=self._attempt_timeout_s(left_s, wait_ms))

        return self._retry.call(attempt, on_retry=lambda _exc: self.metadata.invalidate(topic),
                                what=f"{method} of {topic}-{partition}")

    def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int,
               max_wait_ms: int = 0, min_bytes: int = 1):
        """One fetch (a long poll with ``max_wait_ms``), retried per the policy."""
        return self._call(topic, partition, "fetch", wait_ms=max_wait_ms,
                          send=lambda h: fetch_remote(h, offset, max_bytes, max_wait_ms,
                                                      min_bytes))

    def _attempt_timeout_s(self, left_s: float | None, wait_ms: int = 0) -> float:
        """``request_timeout_ms`` past the leader's ``wait_ms``, or less when the call's
        deadline is nearer."""
        timeout_s = self._timeout_s + wait_ms / 1000.0
        if left_s is None:
            return timeout_s
        return max(min(timeout_s, left_s), 0.001)

    def _multicall(self, requests, max_wait_ms: int = 0, min_bytes: int = 1) -> list:
        """[((topic, partition, offset, max_bytes), fetched bytes)], the fetches issued
        together; the ones that fail retriably (a timeout included) are redone one by one
        through ``_fetch`` (with its retries)."""
        requests = [tuple(r) for r in requests]
        for r in requests:
            if len(r) != 4:
                raise IllegalArgumentError(
                    f"multifetch takes (topic, partition, offset, max_bytes) tuples, got {r!r}")
            _check_request(*r)
        refs = []
        for t, p, o, m in requests:
            try:
                refs.append(fetch_remote(self.metadata.leader(t, p).handle, o, m,
                                         max_wait_ms, min_bytes))
            except Exception as exc:  # noqa: BLE001 - redone (or raised) by _call below
                if not self._retry.retriable(exc):
                    raise final_error(exc) from None
                refs.append(None)
        out = []
        deadline = time.monotonic() + self._timeout_s + max_wait_ms / 1000.0
        for (t, p, o, m), ref in zip(requests, refs):
            data = None
            if ref is not None:
                try:
                    data = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001)).data
                except Exception as exc:  # noqa: BLE001 - typed below
                    if not self._retry.retriable(exc):
                        raise final_error(exc) from None
                    self.metadata.invalidate(t)
            if data is None:
                data = self._fetch(t, p, o, m, max_wait_ms, min_bytes).data
            out.append(((t, p, o, m), data))
        return out


def _check_tp(topic, partition) -> None:
    if not isinstance(topic, str) or not topic:
        raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise IllegalArgumentError(f"partition must be an int >= 0, got {partition!r}")


def _check_request(topic, partition, offset, max_bytes) -> None:
    _check_tp(topic, partition)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise IllegalArgumentError(f"offset must be an int >= 0, got {offset!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise IllegalArgumentError(f"max_bytes must be an int >= 1, got {max_bytes!r}")


def _check_wait(max_wait_ms, min_bytes) -> None:
    if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, int) or max_wait_ms < 0:
        raise IllegalArgumentError(f"max_wait_ms must be an int >= 0, got {max_wait_ms!r}")
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise IllegalArgumentError(f"min_bytes must be an int >= 0, got {min_bytes!r}")


def _lt(table, end: int):
    import pyarrow.compute as pc
    return pc.less(table.column("offset"), end)


def _table(offset: int, data):
    import pyarrow as pa
    columns = decode_columns(data)
    table = pa.table(columns)
    if table.num_rows:
        first = int(np.searchsorted(numbers_view(columns["offset"]), offset, side="left"))
        if first:
            table = table.slice(first)
    return table
