"""SimpleConsumer: the seed's low-level consumer. The caller names topic, partition and
offset; no group, no committed offsets, no background threads. It speaks Kafka's protocol
to the leader brokers (``network.BrokerConnections``: one connection per broker, found in
the cached metadata; a steady fetch makes no Ray call).

- ``fetch(topic, partition, offset, max_bytes=1048576, max_wait_ms=0, min_bytes=1)
  -> list[Record]``: the records at or after ``offset`` from one Fetch to the partition's
  leader broker (whole batches of at most about ``max_bytes``, a first batch larger than
  that still whole; records before ``offset`` in the first batch are dropped). Up to the
  high watermark; an empty list at the end. With ``max_wait_ms`` the broker holds the
  request in its purgatory until ``min_bytes`` are readable or the wait is over (Kafka's
  long poll), so a record is seen about one round trip after it is committed.
- ``multifetch([(topic, partition, offset, max_bytes), ...], max_wait_ms=0, min_bytes=1)
  -> {(topic, partition): [Record]}``: ONE Fetch per leader broker carrying all of its
  partitions, sent together, then gathered; with ``max_wait_ms`` each broker waits on its
  own, so the call returns when every one has answered (at most about ``max_wait_ms`` plus
  a round trip).
- ``offsets_before(topic, partition, time_ms, max_offsets=1) -> [int]``: descending;
  ``time_ms=-1`` latest (the high watermark), ``-2`` earliest (the log start offset): a
  ListOffsets request. Other times, or more than one offset, are the seed's
  getOffsetsBefore (segment boundaries, which ListOffsets v1+ cannot express): one Ray call
  to the leader replica, as before.
- ``count_records(topic, partition, start, end, max_batches=None)``: how many records a
  read of [start, end) gives, from the leader replica's batch headers (a Ray call; no
  record moves): what a pushed-down ``count()`` of ``read_topic_df`` answers with.
- ``fetch_columns`` / ``multifetch_columns`` / ``iter_columns``: the same reads decoded
  straight into a pyarrow Table (offset, timestamp, timestamp_type, key, value, headers):
  the bulk path.
- ``iter_local_columns(topic, partition, start, end)``: the jobs' bulk path on the leader
  replica's machine: the committed batches read from the replica's segment files (where
  one Ray call to the replica says they are), decoded as ``iter_columns`` does, with no
  broker in the way; it stops where the files no longer hold the range (or the leader is
  on another machine) and returns the offset it reached, for a fetch to go on from.

Errors are typed: OffsetOutOfRangeError (below the log start or past the high watermark),
UnknownTopicOrPartitionError (when the metadata, after re-reading a broker, does not know
the topic or partition: not retried). Retriable errors (a stale leader:
NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, KAFKA_STORAGE_ERROR, UNKNOWN_TOPIC_OR_PARTITION
answered by a broker, a broken connection: NetworkError, or no answer within
``request_timeout_ms``: KafkaTimeoutError, the connection then closed) make it invalidate the
metadata and retry per ``retry.RetryPolicy``: at most ``retries`` times, with backoff, and
never past ``default_api_timeout_ms`` from the call; then the last error is raised. Each
request waits at most ``request_timeout_ms`` plus its ``max_wait_ms`` (the broker may hold a
long poll that long before answering).
Thread-safe (the connections and the metadata object are).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
import time

import numpy as np
import ray

from storage.records import (LOG_OVERHEAD, CorruptRecordError, decode_columns,
                             decode_records, iter_headers, numbers_view, valid_prefix)

from .. import wire
from ..errors import IllegalArgumentError, IllegalStateError, KafkaTimeoutError
from ..types import Record
from ..connection import SECURITY_DEFAULTS, ClientSecurity
from .config import validate_config
from .metadata import attach_network, client_metadata
from .network import (BrokerConnections, fetch_body, list_offsets_body, parse_fetch,
                      parse_list_offsets, wait_answer)
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
    **SECURITY_DEFAULTS,
}

DEFAULT_FETCH_MAX_BYTES = 1048576

log = logging.getLogger(__name__)


def next_fetch_offset(data) -> int | None:
    """The offset after the last batch of a fetch answer, read from the batch headers (CRCs
    are left to the decode): where the next fetch of the partition starts. None when the
    answer holds no batch; CorruptRecordError when the headers do not parse."""
    last = None
    for last in iter_headers(data, check_crc=False):
        pass
    return None if last is None else last.next_offset


class SimpleConsumer:
    """``SimpleConsumer(metadata, **config)``; see the module docstring. ``metadata``
    provides ``leader_broker``, ``broker_address``, ``partitions_for``, ``invalidate`` (and
    ``leader``, a replica's actor handle, for ``offsets_before``'s seed form)."""

    def __init__(self, metadata, **config):
        self.metadata = metadata = client_metadata(metadata)
        self.config = validate_config(config, DEFAULT_CONFIG, "simple consumer")
        self._retry = RetryPolicy.from_config(self.config,
                                              deadline_key="default_api_timeout_ms")
        self._timeout_s = self.config["request_timeout_ms"] / 1000.0
        self._network = BrokerConnections(metadata, client_id=self.config["client_id"],
                                          security=ClientSecurity.from_config(self.config))
        attach_network(metadata, self._network)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._network.close()

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
        One Fetch per leader broker stays in flight, carrying every partition of the
        topic it leads that is not finished (``max_bytes`` each): when a broker answers,
        its next Fetch (offsets read from the batch headers) goes out before the answer is
        decoded, so fetching and decoding overlap. A partition whose fetch fails
        retriably is fetched alone with ``fetch``'s retries, then rejoins its broker's.
        """
        self._check_open()
        parts = list(self.metadata.partitions_for(topic) if partitions is None else partitions)
        start = {p: (start_offsets or {}).get(p) for p in parts}
        end = {p: (end_offsets or {}).get(p) for p in parts}
        for p in parts:
            if start[p] is None:
                start[p] = self.offsets_before(topic, p, -2)[0]
            if end[p] is None:
                end[p] = self.offsets_before(topic, p, -1)[0]
        pos = dict(start)
        waiting = {p for p in parts if pos[p] < end[p]}     # to send, not in flight
        alone: set = set()       # to fetch alone, with retries (a broker's fetch failed)
        inflight: dict = {}      # future -> (broker id, {partition: offset asked})

        def issue():
            groups: dict[int, list] = {}
            for p in sorted(waiting):
                try:
                    broker_id, _ = self.metadata.leader_broker(topic, p)
                except Exception:  # noqa: BLE001 - fetched alone, with retries, below
                    alone.add(p)
                    continue
                groups.setdefault(broker_id, []).append(p)
            for broker_id, ps in groups.items():
                body = fetch_body([(topic, p, pos[p], max_bytes) for p in ps], max_wait_ms=0,
                                  min_bytes=1)
                try:
                    future = self._network.send(broker_id, wire.FETCH, body)
                except Exception:  # noqa: BLE001 - fetched alone, with retries, below
                    alone.update(ps)
                    continue
                inflight[future] = (broker_id, {p: pos[p] for p in ps})
            waiting.clear()

        def advance(p, offset, data):
            following = next_fetch_offset(data)
            if following is None:
                raise KafkaTimeoutError(f"{topic}-{p}: empty fetch at offset {offset} before "
                                        f"the end offset {end[p]} (records deleted?)")
            pos[p] = following
            if following < end[p]:
                waiting.add(p)

        def table_of(p, offset, data):
            table = _table(offset, data)
            return table.filter(_lt(table, end[p])) if pos[p] > end[p] else table

        issue()
        while inflight or alone:
            answered = []          # (partition, offset, data)
            for p in sorted(alone):          # a broker's fetch failed: alone, retried
                offset = pos[p]
                alone.discard(p)
                data = self._fetch(topic, p, offset, max_bytes).data
                advance(p, offset, data)
                answered.append((p, offset, data))
            if not answered:
                done, _ = concurrent.futures.wait(
                    list(inflight), timeout=self._timeout_s,
                    return_when=concurrent.futures.FIRST_COMPLETED)
                if not done:
                    raise KafkaTimeoutError(f"fetch of {topic} did not answer within "
                                            f"{self._timeout_s}s")
                future = done.pop()
                broker_id, asked = inflight.pop(future)
                try:
                    outcomes = parse_fetch(future.result())
                except Exception as exc:  # noqa: BLE001 - each partition alone, below
                    if not self._retry.retriable(exc):
                        raise final_error(exc) from None
                    outcomes = {}
                error = outcomes.get(None)
                for p, offset in asked.items():
                    outcome = outcomes.get((topic, p), error)
                    if isinstance(outcome, BaseException):
                        if not self._retry.retriable(outcome):
                            raise final_error(outcome) from None
                    if outcome is None or isinstance(outcome, BaseException):
                        self.metadata.invalidate(topic)
                        alone.add(p)         # fetched alone next round, with retries
                        continue
                    advance(p, offset, outcome.data)
                    answered.append((p, offset, outcome.data))
            issue()                          # the next fetches go before the decode
            for p, offset, data in answered:
                yield p, table_of(p, offset, data)

    def iter_local_columns(self, topic: str, partition: int, start: int, end: int, *,
                           max_bytes: int = 4 << 20):
        """The records of ``topic-partition`` in [start, end) as pyarrow Tables (as
        ``iter_columns``), read from the leader replica's segment files when that replica
        is on this Ray node: one Ray call to the replica (``file_ranges``: where the
        committed batches are), then ``pread`` of about ``max_bytes`` of whole batches at
        a time, each decoded (CRC and framing checked) with no broker, socket or copy
        between the page cache and the decode. A generator whose return value is the
        offset it reached (``start`` when it read nothing): the rest, if any, is for a
        fetch. It stops early, without an error, when the leader is elsewhere, the
        replica cannot say (not the leader any more...), or the files no longer hold what
        it said (a segment deleted by retention or rewritten by compaction since: a file
        gone, a batch not where it should be, or corrupt); the fetch then answers as it
        would have (OffsetOutOfRangeError for records deleted...)."""
        self._check_open()
        _check_tp(topic, partition)
        _check_int("start", start, 0)
        _check_int("end", end, 0)
        _check_int("max_bytes", max_bytes, 1)
        if start >= end:
            return start
        try:
            answer = self._call_replica(topic, partition, "file_ranges", start, end)
        except Exception as exc:  # noqa: BLE001 - the fetch that follows answers for it
            log.debug("%s-%d: no local read of [%d, %d): %r", topic, partition, start, end, exc)
            return start
        if answer["node_id"] != ray.get_runtime_context().get_node_id():
            return start
        pos = start
        for path, position, size, first_base in answer["ranges"]:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                log.debug("%s-%d: %s gone (%r): fetching from %d", topic, partition, path,
                          exc, pos)
                return pos
            try:
                expected = first_base       # the next batch's base offset, at least
                first = True                # the batch at ``position`` starts at first_base
                stop = position + size
                while position < stop:
                    data = os.pread(fd, min(max(max_bytes, LOG_OVERHEAD), stop - position),
                                    position)
                    whole, headers, why = valid_prefix(data, check_crc=False)
                    if not headers and len(data) >= LOG_OVERHEAD:
                        length = struct.unpack_from(">i", data, 8)[0] + LOG_OVERHEAD
                        if len(data) < length <= stop - position:
                            # one batch larger than max_bytes: read it whole
                            data = os.pread(fd, length, position)
                            whole, headers, why = valid_prefix(data, check_crc=False)
                    if not headers:
                        raise CorruptRecordError(f"no whole batch at {position}: {why}")
                    for h in headers:
                        if h.base_offset < expected or (first and h.base_offset != first_base):
                            raise CorruptRecordError(
                                f"batch at position {position + h.position} has base offset "
                                f"{h.base_offset}, expected {expected}")
                        first = False
                        expected = h.next_offset
                    position += whole
                    table = _table(pos, data if whole == len(data) else memoryview(data)[:whole])
                    offsets = numbers_view(table.column("offset").chunk(0))
                    keep = int(np.searchsorted(offsets, end))   # offsets ascend: a slice
                    if keep:
                        pos = int(offsets[keep - 1]) + 1
                        yield table if keep == len(offsets) else table.slice(0, keep)
                    if expected >= end:     # the batches read hold every record < end
                        return end
            except (OSError, CorruptRecordError) as exc:
                log.debug("%s-%d: local read of %s stopped (%r): fetching from %d", topic,
                          partition, path, exc, pos)
                return pos
            finally:
                os.close(fd)
        return pos

    def offsets_before(self, topic: str, partition: int, time_ms: int,
                       max_offsets: int = 1) -> list[int]:
        if isinstance(time_ms, bool) or not isinstance(time_ms, int):
            raise IllegalArgumentError(f"time_ms must be an int, got {time_ms!r}")
        if isinstance(max_offsets, bool) or not isinstance(max_offsets, int) or max_offsets < 1:
            raise IllegalArgumentError(f"max_offsets must be an int >= 1, got {max_offsets!r}")
        _check_tp(topic, partition)
        if time_ms in (-1, -2) and max_offsets == 1:
            return [self._list_offset(topic, partition, time_ms)]
        return list(self._call_replica(topic, partition, "list_offsets", time_ms,
                                       max_offsets))

    def count_records(self, topic: str, partition: int, start: int, end: int, *,
                      max_batches: int | None = None) -> int | None:
        """How many records a read of offsets [start, end) of ``topic-partition`` gives
        (control batches left out; gaps a compaction left not counted), counted by the
        leader replica from its batch headers without moving the records (one Ray call);
        None when the range holds more than ``max_batches`` batches. ``end`` at most the
        high watermark (OffsetOutOfRangeError past it, or with ``start`` below the log
        start)."""
        _check_tp(topic, partition)
        _check_int("start", start, 0)
        _check_int("end", end, 0)
        if start > end:
            raise IllegalArgumentError(f"start {start} is after end {end}")
        if max_batches is not None:
            _check_int("max_batches", max_batches, 1)
        return self._call_replica(topic, partition, "count_records", start, end, max_batches)

    # -- plumbing --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the simple consumer is closed")

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

    def _call(self, topic: str, partition: int, what: str, attempt):
        """``attempt(left_s)`` (one request about (topic, partition)) retried per the
        policy, the topic's metadata invalidated before each retry."""
        self._check_open()
        return self._retry.call(attempt, on_retry=lambda _exc: self.metadata.invalidate(topic),
                                what=f"{what} of {topic}-{partition}")

    def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int,
               max_wait_ms: int = 0, min_bytes: int = 1):
        """One Fetch of one partition (a long poll with ``max_wait_ms``), retried per the
        policy: its FetchOutcome."""
        def attempt(left_s):
            broker_id, _ = self.metadata.leader_broker(topic, partition)
            body = fetch_body([(topic, partition, offset, max_bytes)],
                              max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                              max_bytes=max_bytes)
            future = self._network.send(broker_id, wire.FETCH, body)
            answer = parse_fetch(wait_answer(
                self._network, broker_id, future, self._attempt_timeout_s(left_s, max_wait_ms),
                f"fetch of {topic}-{partition}"))
            outcome = answer.get((topic, partition), answer.get(None))
            if outcome is None:
                raise KafkaTimeoutError(f"broker {broker_id} answered a fetch without "
                                        f"{topic}-{partition}")
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return self._call(topic, partition, "fetch", attempt)

    def _list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        """ListOffsets of one partition (-1 latest, -2 earliest), retried per the policy."""
        def attempt(left_s):
            broker_id, _ = self.metadata.leader_broker(topic, partition)
            future = self._network.send(broker_id, wire.LIST_OFFSETS,
                                        list_offsets_body([(topic, partition, timestamp)]))
            answer = parse_list_offsets(wait_answer(
                self._network, broker_id, future, self._attempt_timeout_s(left_s),
                f"list_offsets of {topic}-{partition}"))
            outcome = answer.get((topic, partition))
            if outcome is None:
                raise KafkaTimeoutError(f"broker {broker_id} answered list_offsets without "
                                        f"{topic}-{partition}")
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome[1]

        return self._call(topic, partition, "list_offsets", attempt)

    def _call_replica(self, topic: str, partition: int, method: str, *args):
        """``method(*args)`` on the leader replica actor (a Ray call: the seed's forms the
        wire cannot carry), retried per the policy."""
        def attempt(left_s):
            leader = self.metadata.leader(topic, partition)
            return ray.get(getattr(leader.handle, method).remote(*args),
                           timeout=self._attempt_timeout_s(left_s))

        return self._call(topic, partition, method, attempt)

    def _attempt_timeout_s(self, left_s: float | None, wait_ms: int = 0) -> float:
        """``request_timeout_ms`` past the broker's ``wait_ms``, or less when the call's
        deadline is nearer."""
        timeout_s = self._timeout_s + wait_ms / 1000.0
        if left_s is None:
            return timeout_s
        return max(min(timeout_s, left_s), 0.001)

    def _multicall(self, requests, max_wait_ms: int = 0, min_bytes: int = 1) -> list:
        """[((topic, partition, offset, max_bytes), fetched bytes)]: one Fetch per leader
        broker, sent together; the partitions that fail retriably (a timeout included) are
        redone one by one through ``_fetch`` (with its retries)."""
        self._check_open()
        requests = [tuple(r) for r in requests]
        for r in requests:
            if len(r) != 4:
                raise IllegalArgumentError(
                    f"multifetch takes (topic, partition, offset, max_bytes) tuples, got {r!r}")
            _check_request(*r)
        groups: dict[int, list] = {}
        for r in requests:
            try:
                broker_id, _ = self.metadata.leader_broker(r[0], r[1])
            except Exception as exc:  # noqa: BLE001 - redone (or raised) by _fetch below
                if not self._retry.retriable(exc):
                    raise final_error(exc) from None
                continue
            groups.setdefault(broker_id, []).append(r)
        futures = {}
        for broker_id, rs in groups.items():
            body = fetch_body(rs, max_wait_ms=max_wait_ms, min_bytes=min_bytes)
            try:
                futures[broker_id] = self._network.send(broker_id, wire.FETCH, body)
            except Exception as exc:  # noqa: BLE001 - redone by _fetch below
                if not self._retry.retriable(exc):
                    raise final_error(exc) from None
        answers: dict = {}
        deadline = time.monotonic() + self._timeout_s + max_wait_ms / 1000.0
        for broker_id, future in futures.items():
            try:
                body = wait_answer(self._network, broker_id, future,
                                   deadline - time.monotonic(), "multifetch")
                outcomes = parse_fetch(body)
            except Exception as exc:  # noqa: BLE001 - redone (or raised) below
                if not self._retry.retriable(exc):
                    raise final_error(exc) from None
                continue
            error = outcomes.pop(None, None)
            for r in groups[broker_id]:
                answers[r] = outcomes.get((r[0], r[1]), error)
        out = []
        for t, p, o, m in requests:
            outcome = answers.get((t, p, o, m))
            if isinstance(outcome, BaseException):
                if not self._retry.retriable(outcome):
                    raise final_error(outcome) from None
                self.metadata.invalidate(t)
                outcome = None
            if outcome is None:
                outcome = self._fetch(t, p, o, m, max_wait_ms, min_bytes)
            out.append(((t, p, o, m), outcome.data))
        return out


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise IllegalArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_tp(topic, partition) -> None:
    if not isinstance(topic, str) or not topic:
        raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
    _check_int("partition", partition, 0)


def _check_request(topic, partition, offset, max_bytes) -> None:
    _check_tp(topic, partition)
    _check_int("offset", offset, 0)
    _check_int("max_bytes", max_bytes, 1)


def _check_wait(max_wait_ms, min_bytes) -> None:
    _check_int("max_wait_ms", max_wait_ms, 0)
    _check_int("min_bytes", min_bytes, 0)


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
