"""Ray Data over raykafka topics: ``read_topic`` (a topic as a ``ray.data.Dataset``) and
``write_topic`` (a Dataset into a topic).

    from jobs.data import read_topic, write_topic
    ds = read_topic(cluster, "events", start_offset="earliest", end_offset="latest")
    counts = write_topic(ds.filter(...), cluster, "out")      # {partition: records}

``read_topic`` takes the parameters of ``ray.data.read_kafka`` (Ray 2.60) with ``cluster``
in place of ``bootstrap_servers``, and gives its columns (``SCHEMA``), so code written for
read_kafka moves over by changing the call. Differences, and why, are in docs/jobs.md.

How a read runs:
- On the driver, when the Dataset is created, every (topic, partition) range is resolved
  to integer offsets: "earliest" is the log start offset, "latest" the high watermark (the
  end of the committed records), a datetime the first offset whose timestamp is at or
  after it (the leader replica's ``offset_for_time``). The Dataset is a fixed snapshot:
  reading it again, later, reads the same offsets (even while producers append).
- Each range is one or more read tasks of at most ``max_records_per_task`` offsets. A task
  attaches to the cluster (``Cluster.connect(namespace)``), reads its range from the
  partition leader with ``SimpleConsumer.iter_columns`` (record batches decoded straight
  into Arrow, one fetch in flight while the previous one decodes) and yields Arrow blocks
  of exactly ``SCHEMA``, an empty range one empty block of it. The leader answers only
  records below its high watermark, and the range ends at or below the high watermark
  seen on the driver, so only committed records are read.

``write_topic`` runs Ray Data's write operator with a datasink: each write task creates a
Producer, sends every block it is given with ``Producer.send_batch`` (the bulk path),
waits until every record is acknowledged (``acks``), closes the producer and returns its
per-partition counts; the driver sums them.

Only the public API is imported here (``actors``, ``actors.errors``): jobs/ is a user of
raykafka like any other (tests/test_layering.py).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.datasource import Datasink, Datasource, ReadTask

from actors.errors import (IllegalArgumentError, InvalidConfigurationError, KafkaError,
                           KafkaTimeoutError, OffsetOutOfRangeError,
                           UnknownTopicOrPartitionError)
from jobs import raydata_fix

log = logging.getLogger(__name__)

#: The columns of every block ``read_topic`` produces: those ``ray.data.read_kafka``
#: declares in Ray 2.60. ``timestamp_type`` as the confluent client reports it: 0 not
#: available, 1 CreateTime, 2 LogAppendTime. ``headers`` keeps repeated keys, in order.
SCHEMA = pa.schema([
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("timestamp", pa.int64()),
    ("timestamp_type", pa.int32()),
    ("headers", pa.map_(pa.string(), pa.binary())),
])

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

#: At most this many offsets per read task. Ray Data runs short read tasks about one at a
#: time on a small cluster (its resource manager lends an operator the CPUs beyond its
#: reservation case by case), so fewer, longer tasks read faster: 10M records in 6
#: partitions, 1.67M-offset tasks against 833k, three rounds: 0.86-0.92 / 0.72-0.76 x
#: iter_columns against 0.60-0.70 x (docs/jobs.md, "What bounds them").
DEFAULT_MAX_RECORDS_PER_TASK = 4_000_000
DEFAULT_FETCH_MAX_BYTES = 4 << 20
# a read task's attempts to go on after a retriable failure (a leader that moved, a fetch
# that timed out) before it gives up; each restarts at the first offset not yet read
READ_RETRIES = 10
RETRY_BACKOFF_S = 0.2
RETRY_BACKOFF_MAX_S = 2.0
# offset-for-time lookups on the driver: how long one may take, retries included
LOOKUP_TIMEOUT_S = 60.0
# write: a block is handed to send_batch in slices of about this many bytes, so a task
# never holds a whole large block as Python bytes objects at once
SEND_SLICE_BYTES = 8 << 20
# send_batch calls a write task lets stay unsettled before it waits for the oldest
MAX_PENDING_SENDS = 16
# how much of a topic read_topic fetches on the driver to estimate the Dataset's size
SAMPLE_BYTES = 64 << 10

_NO_START_VALUES = ("latest",)
_NO_END_VALUES = ("earliest",)


# -- reading -----------------------------------------------------------------------------------

def read_topic(cluster, topics, start_offset="earliest", end_offset="latest", *,
               trigger: str = "once",
               partitions: dict | None = None,
               max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK,
               fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
               consumer_config: dict | None = None,
               timeout_ms: int | None = None,
               local_reads: bool = True,
               num_cpus: float | None = None,
               num_gpus: float | None = None,
               memory: float | None = None,
               override_num_blocks: int | None = None,
               label_selector: dict | None = None,
               fallback_strategy: list | None = None,
               max_calls: int | None = None,
               resources: dict | None = None,
               accelerator_type: str | None = None,
               runtime_env: dict | None = None,
               ray_remote_args: dict | None = None) -> "ray.data.Dataset":
    """A ``ray.data.Dataset`` of the records of ``topics`` from ``start_offset`` up to
    ``end_offset`` (exclusive), with the columns of ``SCHEMA``.

    ``cluster``: an ``actors.Cluster`` (or its namespace, a str). ``topics``: a topic name
    or a list of them. ``start_offset`` / ``end_offset`` as ``ray.data.read_kafka``:
    "earliest" / "latest", an int (the same offset for every partition), a datetime (the
    first record at or after it; naive datetimes are UTC), or ``{topic: {partition:
    offset}}`` whose values are any of those (partitions not listed: "earliest" /
    "latest"). An end past the high watermark is cut to it; an int start below the log
    start offset is raised to it (with a warning), as read_kafka does.

    ``partitions``: ``{topic: [partition, ...]}`` reads only those partitions of the topics
    it names (the others whole); default every partition.
    ``max_records_per_task``: a partition's range is split into read tasks of at most this
    many offsets. ``fetch_max_bytes``: bytes per fetch. ``consumer_config``: the
    SimpleConsumer's config (kafka-python names: ``request_timeout_ms``, ``retries``, ...).
    ``timeout_ms``: as read_kafka, a read task that has not reached its end after this long
    stops and returns what it read. ``local_reads``: a read task on the machine of a
    partition's leader replica reads the committed batches from the replica's segment
    files (the replica, asked through its actor handle, says where they are) instead of
    fetching them through a broker (``iter_range``); False fetches everything. The
    remaining arguments go to ``ray.data.read_datasource`` (resources of each read task).

    Raises, on the driver: UnknownTopicOrPartitionError (a topic or a partition named in
    an offset dict that does not exist), IllegalArgumentError (bad arguments, a start after
    the end), OffsetOutOfRangeError (a start past the high watermark),
    InvalidConfigurationError (a bad consumer_config).
    """
    if trigger != "once":
        raise IllegalArgumentError(f"only trigger='once' is supported, got {trigger!r}")
    if not isinstance(local_reads, bool):
        raise IllegalArgumentError(f"local_reads must be True or False, got {local_reads!r}")
    raydata_fix.fix()           # its tasks run at once from the start (jobs/raydata_fix.py)
    consumer_config = dict(consumer_config or {})
    cluster, ranges = plan_read(cluster, topics, start_offset, end_offset,
                                partitions=partitions,
                                max_records_per_task=max_records_per_task,
                                fetch_max_bytes=fetch_max_bytes, timeout_ms=timeout_ms,
                                consumer_config=consumer_config)
    source = TopicDatasource(cluster.namespace, ranges,
                             max_records_per_task=max_records_per_task,
                             fetch_max_bytes=fetch_max_bytes,
                             consumer_config=consumer_config, timeout_ms=timeout_ms,
                             estimated_bytes=_estimate_bytes(cluster, ranges, consumer_config),
                             local_reads=local_reads)
    if override_num_blocks is None:
        # as many blocks as read tasks (each task already cuts its output into blocks of
        # Ray's target size): Ray would otherwise split every task's output to reach its
        # default of 200 blocks, and a Dataset of many small blocks is several times
        # slower downstream (measured: read_topic_df's count 87 s instead of 6 s on 2M
        # records, benchmarks/jobs_bench.py)
        override_num_blocks = len(source.task_ranges())
    return ray.data.read_datasource(
        source, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
        override_num_blocks=override_num_blocks, label_selector=label_selector,
        fallback_strategy=fallback_strategy, max_calls=max_calls, resources=resources,
        accelerator_type=accelerator_type, runtime_env=runtime_env,
        ray_remote_args=ray_remote_args)


def plan_read(cluster, topics, start_offset, end_offset, *, partitions: dict | None = None,
              max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK,
              fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES, timeout_ms: int | None = None,
              consumer_config: dict | None = None):
    """``(cluster, ranges)``: the arguments of a read checked (``read_topic``'s rules and
    errors) and its ranges resolved now (``resolve_ranges``); ``cluster`` an
    ``actors.Cluster`` whatever was passed."""
    names = _topic_list(topics)
    _check_positive_int(max_records_per_task, "max_records_per_task")
    _check_positive_int(fetch_max_bytes, "fetch_max_bytes")
    if timeout_ms is not None:
        _check_positive_int(timeout_ms, "timeout_ms")
    if consumer_config is not None and not isinstance(consumer_config, dict):
        raise InvalidConfigurationError(f"consumer_config must be a dict, got "
                                        f"{type(consumer_config).__name__}")
    _validate_offset_arg(start_offset, "start_offset", names)
    _validate_offset_arg(end_offset, "end_offset", names)
    _validate_partitions(partitions, names)
    if (_is_int(start_offset) and _is_int(end_offset) and start_offset > end_offset) or (
            isinstance(start_offset, datetime) and isinstance(end_offset, datetime)
            and _datetime_to_ms(start_offset) > _datetime_to_ms(end_offset)):
        raise IllegalArgumentError(f"start_offset ({start_offset}) is after end_offset "
                                   f"({end_offset})")
    cluster = _as_cluster(cluster)
    ranges = resolve_ranges(cluster, names, start_offset, end_offset,
                            consumer_config=consumer_config, partitions=partitions)
    return cluster, ranges


def resolve_ranges(cluster, topics: list[str], start_offset, end_offset, *,
                   consumer_config: dict | None = None, partitions: dict | None = None
                   ) -> list[tuple[str, int, int, int]]:
    """``[(topic, partition, start, end)]``: the integer offsets ``read_topic`` reads,
    resolved now against the partition leaders (see ``read_topic`` for the rules)."""
    cluster = _as_cluster(cluster)
    consumer = cluster.simple_consumer(**(consumer_config or {}))
    try:
        out = []
        for topic in topics:
            parts = cluster.metadata.partitions_for(topic)
            if partitions is not None and topic in partitions:
                wanted = sorted(set(int(p) for p in partitions[topic]))
                missing = sorted(set(wanted) - set(parts))
                if missing:
                    raise UnknownTopicOrPartitionError(
                        f"partitions names partition(s) {missing} of topic {topic!r}, which "
                        f"has partitions 0..{len(parts) - 1}")
            else:
                wanted = parts
            for name, arg in (("start_offset", start_offset), ("end_offset", end_offset)):
                if isinstance(arg, dict):
                    missing = sorted(set(arg.get(topic, {})) - set(parts))
                    if missing:
                        raise UnknownTopicOrPartitionError(
                            f"{name} names partition(s) {missing} of topic {topic!r}, which "
                            f"has partitions 0..{len(parts) - 1}")
            for p in wanted:
                start = _for_partition(start_offset, topic, p, "earliest")
                end = _for_partition(end_offset, topic, p, "latest")
                out.append((topic, p) + _resolve(cluster, consumer, topic, p, start, end))
        return out
    finally:
        consumer.close()


def _resolve(cluster, consumer, topic: str, partition: int, start, end) -> tuple[int, int]:
    low = consumer.offsets_before(topic, partition, -2)[0]
    high = consumer.offsets_before(topic, partition, -1)[0]   # the high watermark
    if start == "earliest":
        first = low
    elif isinstance(start, datetime):
        first = _offset_for_time(cluster, topic, partition, start, high)
    else:
        first = start
    if end == "latest":
        last = high
    elif isinstance(end, datetime):
        last = _offset_for_time(cluster, topic, partition, end, high)
    else:
        last = end
    last = min(last, high)
    if first < low:
        log.warning("start_offset %s of %s-%d is below its log start offset %d (deleted by "
                    "retention): reading from %d", first, topic, partition, low, low)
        first = low
    if first > high:
        raise OffsetOutOfRangeError(
            f"start_offset {_describe(start, first)} of {topic}-{partition} is past its high "
            f"watermark {high}")
    if first > last:
        raise IllegalArgumentError(
            f"start_offset ({_describe(start, first)}) > end_offset ({_describe(end, last)}) "
            f"for partition {partition} of topic {topic!r}")
    return first, last


def _estimate_bytes(cluster, ranges, consumer_config: dict) -> int | None:
    """The in-memory size of the ranges, estimated from the first records of the first
    non-empty one (one small fetch): what Ray Data sizes its blocks by (without it, it
    cuts every read into 200 blocks, a few rows each for a small topic). None when there
    is nothing to sample."""
    total = sum(end - start for _, _, start, end in ranges)
    if total == 0:
        return 0
    topic, p, start, _ = next(r for r in ranges if r[3] > r[2])
    consumer = cluster.simple_consumer(**consumer_config)
    try:
        sample = consumer.fetch_columns(topic, p, start, max_bytes=SAMPLE_BYTES)
        if not sample.num_rows:
            return None
        per_record = to_block(sample, topic, p).nbytes / sample.num_rows
    except Exception:  # noqa: BLE001 - only an estimate: the read itself reports errors
        return None
    finally:
        consumer.close()
    return int(per_record * total)


def _describe(arg, resolved: int) -> str:
    return str(arg) if arg == resolved else f"{arg} (resolved to {resolved})"


def _offset_for_time(cluster, topic: str, partition: int, when: datetime, high: int) -> int:
    """The first offset of ``topic-partition`` whose timestamp is >= ``when``, asked of the
    leader replica (``offset_for_time``), retried while the leader moves; ``high`` (the
    high watermark) when no committed record is that new."""
    ms = _datetime_to_ms(when)

    def ask():
        handle = cluster.metadata.leader(topic, partition).handle
        return ray.get(handle.offset_for_time.remote(ms), timeout=30)

    found = _retrying(ask, what=f"offset_for_time of {topic}-{partition}",
                      on_retry=lambda: cluster.metadata.invalidate(topic),
                      deadline_s=LOOKUP_TIMEOUT_S)
    return high if found is None else min(int(found), high)


def split_ranges(ranges, max_records: int) -> list[tuple[str, int, int, int]]:
    """``ranges`` ``[(topic, partition, start, end)]`` cut into pieces of at most
    ``max_records`` offsets each, of near-equal size, in order (an empty range stays one
    empty piece)."""
    out = []
    for topic, p, start, end in ranges:
        n = end - start
        pieces = max(1, math.ceil(n / max_records))
        bounds = [start + (n * i) // pieces for i in range(pieces + 1)]
        out += [(topic, p, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


class TopicDatasource(Datasource):
    """The ``ray.data.Datasource`` behind ``read_topic``: fixed offset ranges
    ``[(topic, partition, start, end)]``, each cut into read tasks of at most
    ``max_records_per_task`` offsets (an empty range is one task giving one empty block)."""

    def __init__(self, namespace: str, ranges, *,
                 max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK,
                 fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                 consumer_config: dict | None = None, timeout_ms: int | None = None,
                 estimated_bytes: int | None = None, local_reads: bool = True):
        super().__init__()
        self.local_reads = bool(local_reads)
        self.estimated_bytes = estimated_bytes
        self.namespace = namespace
        self.ranges = [(str(t), int(p), int(s), int(e)) for t, p, s, e in ranges]
        self.max_records_per_task = max_records_per_task
        self.fetch_max_bytes = fetch_max_bytes
        self.consumer_config = dict(consumer_config or {})
        self.timeout_ms = timeout_ms
        self.target_block_bytes = ray.data.DataContext.get_current().target_max_block_size

    def get_name(self) -> str:
        return "ReadTopic"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.estimated_bytes

    def task_ranges(self) -> list[tuple[str, int, int, int]]:
        """The (topic, partition, start, end) of each read task, in order."""
        return split_ranges(self.ranges, self.max_records_per_task)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ReadTask]:
        tasks = []
        for topic, p, start, end in self.task_ranges():
            read = functools.partial(
                _read_range, self.namespace, topic, p, start, end,
                consumer_config=self.consumer_config, fetch_max_bytes=self.fetch_max_bytes,
                timeout_ms=self.timeout_ms, block_bytes=self.target_block_bytes,
                local_reads=self.local_reads)
            # num_rows stays unknown: offsets are an upper bound only (compacted topics
            # have gaps), and Ray's count() would return the metadata without reading
            meta = BlockMetadata(num_rows=None, size_bytes=None,
                                 input_files=[f"raykafka://{self.namespace}/{topic}/{p}"
                                              f"?start={start}&end={end}"],
                                 exec_stats=None)
            tasks.append(ReadTask(read, meta, schema=SCHEMA,
                                  per_task_row_limit=per_task_row_limit))
        return tasks


def _read_range(namespace: str, topic: str, partition: int, start: int, end: int, *,
                consumer_config: dict, fetch_max_bytes: int, timeout_ms: int | None,
                block_bytes: int | None, local_reads: bool = True):
    """One read task: the records of ``topic-partition`` in [start, end) as Arrow blocks
    of ``SCHEMA`` (about ``block_bytes`` each; at least one block, empty for an empty
    range)."""
    block_bytes = block_bytes or (128 << 20)
    pending: list[pa.Table] = []
    pending_bytes = 0
    emitted = False
    for table in iter_range(namespace, topic, partition, start, end,
                            consumer_config=consumer_config, fetch_max_bytes=fetch_max_bytes,
                            timeout_ms=timeout_ms, local_reads=local_reads):
        block = to_block(table, topic, partition)
        pending.append(block)
        pending_bytes += block.nbytes
        if pending_bytes >= block_bytes:
            yield pa.concat_tables(pending)
            emitted = True
            pending, pending_bytes = [], 0
    if pending:
        yield pa.concat_tables(pending)
    elif not emitted:
        yield SCHEMA.empty_table()


def iter_range(namespace: str, topic: str, partition: int, start: int, end: int, *,
               consumer_config: dict | None = None,
               fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
               timeout_ms: int | None = None, local_reads: bool = True):
    """The records of ``topic-partition`` in [start, end) as the non-empty tables of
    ``SimpleConsumer.iter_columns`` (one per fetch: offset, timestamp, timestamp_type, key,
    value, headers). What every reader of jobs/ runs: Ray Data's read tasks and Spark's
    Python workers (``jobs.spark.read_topic_df``).

    When the leader replica is on this Ray node (and ``local_reads``), the committed
    batches are read from its segment files (``SimpleConsumer.iter_local_columns``: the
    replica, asked through its actor handle, says where they are), with no broker in the
    way; whatever that cannot read (the leader elsewhere, a segment deleted or compacted
    meanwhile) is fetched from the leader broker, one fetch in flight while the previous
    one decodes.

    Attaches this process to the cluster's Ray (``Cluster.connect(namespace)``: ``ray.init``
    the first time in a process, a name lookup afterwards). A retriable failure (a leader
    that moved, a fetch that timed out) restarts the read at the first offset not yet
    read, at most READ_RETRIES times in a row. ``timeout_ms``: stop (with a warning) once
    the range has been read for that long."""
    if start >= end:
        return
    started = time.monotonic()
    from actors import Cluster
    consumer = Cluster.connect(namespace).simple_consumer(**(consumer_config or {}))
    pos = start
    failures = 0
    try:
        if local_reads:
            local = consumer.iter_local_columns(topic, partition, pos, end,
                                                max_bytes=fetch_max_bytes)
            while True:
                try:
                    table = next(local)
                except StopIteration as done:
                    pos = done.value
                    break
                pos = table.column("offset")[-1].as_py() + 1
                yield table
                if _timed_out(started, timeout_ms, topic, partition, pos, end):
                    return
            if pos >= end:
                return
        while True:
            try:
                for _, table in consumer.iter_columns(
                        topic, [partition], {partition: pos}, {partition: end},
                        max_bytes=fetch_max_bytes):
                    failures = 0
                    if table.num_rows:
                        pos = table.column("offset")[-1].as_py() + 1
                        yield table
                    if _timed_out(started, timeout_ms, topic, partition, pos, end):
                        return
                return
            except Exception as exc:  # noqa: BLE001 - retried or raised below
                failures += 1
                if not _retriable(exc) or failures > READ_RETRIES:
                    raise
                log.info("read of %s-%d at offset %d failed (%r); retrying", topic,
                         partition, pos, exc)
                consumer.metadata.invalidate(topic)
                time.sleep(min(RETRY_BACKOFF_S * 2 ** (failures - 1), RETRY_BACKOFF_MAX_S))
    finally:
        consumer.close()


def _timed_out(started: float, timeout_ms: int | None, topic: str, partition: int,
               pos: int, end: int) -> bool:
    """Whether a read started at ``started`` (monotonic s) and now at ``pos`` short of
    ``end`` has run past ``timeout_ms`` (then with a warning)."""
    if timeout_ms is None or pos >= end or (time.monotonic() - started) * 1000 < timeout_ms:
        return False
    log.warning("read task of %s-%d timed out after %d ms at offset %d before its end "
                "offset %d; returning what it read", topic, partition, timeout_ms, pos, end)
    return True


def to_block(table: pa.Table, topic: str, partition: int) -> pa.Table:
    """A table of ``SimpleConsumer.fetch_columns`` / ``iter_columns`` (offset, timestamp,
    timestamp_type, key, value, headers as list<struct<key, value>>) as a block of
    ``SCHEMA``: topic and partition added, timestamp_type in the confluent client's
    numbering (a record without a timestamp, -1, as "not available"), headers as
    map<string, binary> (repeated keys kept: Arrow maps do not require unique keys)."""
    n = table.num_rows

    def column(name):
        col = table.column(name)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()

    ts = column("timestamp").cast(pa.int64())
    ours = column("timestamp_type").cast(pa.int32())
    ts_type = pc.if_else(pc.equal(ts, -1), pa.scalar(TIMESTAMP_NOT_AVAILABLE, pa.int32()),
                         pc.add(ours, pa.scalar(TIMESTAMP_CREATE_TIME, pa.int32())))
    lists = column("headers")
    if lists.null_count:
        lists = pc.fill_null(lists, pa.scalar([], lists.type))
    entries = lists.values
    headers = pa.MapArray.from_arrays(lists.offsets, entries.field("key"),
                                      entries.field("value"))
    return pa.Table.from_arrays([
        column("offset").cast(pa.int64()),
        column("key").cast(pa.binary()),
        column("value").cast(pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        ts,
        ts_type.cast(pa.int32()),
        headers,
    ], schema=SCHEMA)


# -- writing -----------------------------------------------------------------------------------

def write_topic(ds, cluster, topic: str, *, acks="all", producer_config: dict | None = None,
                concurrency: int | None = None, ray_remote_args: dict | None = None
                ) -> dict[int, int]:
    """Produce every row of ``ds`` to ``topic``; returns ``{partition: records written}``.

    Columns: ``value`` (binary or string; null allowed when the key is not), and optionally
    ``key`` (binary or string), ``partition`` (int; null: the producer's partitioner, by
    key murmur2, without a key spread round-robin), ``headers`` (map<string, binary> as
    read_topic gives, or Spark's list<struct<key: string, value: binary>>; null: none) and
    ``timestamp`` (ms ints or an Arrow timestamp; null: now). Other columns (``offset``,
    ``topic``, ``timestamp_type`` of a read_topic Dataset...) are ignored.

    Each Ray Data write task creates its own Producer (``acks`` and ``producer_config``:
    kafka-python names, e.g. ``compression_type``, ``linger_ms``), sends its blocks with
    ``send_batch`` and returns only when every record is acknowledged. Order is kept per
    partition within a block; blocks are written in parallel, in no set order.
    ``concurrency`` / ``ray_remote_args`` go to ``Dataset.write_datasink``.

    Raises IllegalArgumentError (``ds`` not a Dataset, a missing ``value`` column, a column
    of the wrong type, a record with neither key nor value, a negative partition),
    UnknownTopicOrPartitionError (a partition the topic does not have, or an unknown
    topic that the brokers do not create on first use: their auto.create.topics.enable,
    the producer's ``allow_auto_create_topics``),
    InvalidConfigurationError (bad ``acks`` or ``producer_config``); errors in the write
    tasks reach the caller as the same classes (Ray's RayTaskError subclasses them). A
    failed write may have written part of the Dataset (at-least-once, as read_kafka's
    sibling ``write_kafka``).
    """
    if not isinstance(ds, ray.data.Dataset):
        raise IllegalArgumentError(f"write_topic takes a ray.data.Dataset, got "
                                   f"{type(ds).__name__}")
    raydata_fix.fix()
    if not isinstance(topic, str) or not topic:
        raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
    if producer_config is not None and not isinstance(producer_config, dict):
        raise InvalidConfigurationError(f"producer_config must be a dict, got "
                                        f"{type(producer_config).__name__}")
    config = {**(producer_config or {}), "acks": acks}
    cluster = _as_cluster(cluster)
    producer = cluster.producer(**config)      # checks the config here, on the driver
    try:
        producer.partitions_for(topic)          # UnknownTopicOrPartitionError
    finally:
        producer.close()
    schema = ds.schema(fetch_if_missing=False)
    if schema is not None:
        check_write_schema(getattr(schema, "base_schema", schema))
    sink = TopicDatasink(cluster.namespace, topic, config)
    ds.write_datasink(sink, concurrency=concurrency, ray_remote_args=ray_remote_args)
    return sink.counts


class TopicDatasink(Datasink):
    """The ``ray.data.Datasink`` behind ``write_topic``: one Producer per write task;
    ``counts`` (``{partition: records}``) is filled when the write completes."""

    def __init__(self, namespace: str, topic: str, producer_config: dict):
        self.namespace = namespace
        self.topic = topic
        self.producer_config = dict(producer_config)
        self.counts: dict[int, int] = {}

    def get_name(self) -> str:
        return "WriteTopic"

    def on_write_start(self, schema=None) -> None:
        """Nothing is checked here: when Ray fuses a map (``ds.map_batches(f)``) into the
        write, the schema it passes is that of the map's *input* (Ray 2.60,
        plan_write_op.py: "the schema from the first input bundle"), not of the blocks
        written. Each block is checked in ``write``; the driver checks the Dataset's
        schema when it is known without executing."""

    def write(self, blocks, ctx) -> dict[int, int]:
        """One write task: a Producer for all of its blocks; returns {partition: count}
        once every record is acknowledged. Futures are settled (and dropped) as they
        complete: a BatchFuture keeps its built batches alive until it is dropped."""
        from actors import Cluster
        producer = Cluster.connect(self.namespace).producer(**self.producer_config)
        wait_s = (producer.config["delivery_timeout_ms"]
                  + producer.config["request_timeout_ms"]) / 1000.0
        counts: dict[int, int] = {}
        pending: collections.deque = collections.deque()

        def settle(future) -> None:
            parts, _ = future.offsets(timeout=wait_s)    # raises the send's error
            # bincount, not np.unique: unique sorts the send's partitions (6% of a write
            # task's time in a profile of 250k-record blocks)
            n = np.bincount(np.asarray(parts, dtype=np.int64))
            for p in np.flatnonzero(n).tolist():
                counts[p] = counts.get(p, 0) + int(n[p])

        try:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows == 0:
                    continue
                check_write_schema(table.schema)
                pending.extend(_send_table(producer, self.topic, table))
                while pending and (pending[0].is_done or len(pending) > MAX_PENDING_SENDS):
                    settle(pending.popleft())
            while pending:
                settle(pending.popleft())
        except BaseException:
            producer.close(timeout=0)      # fail what is still queued, at once
            raise
        producer.close()
        return counts

    def on_write_complete(self, write_result) -> None:
        counts: dict[int, int] = {}
        for part in write_result.write_returns:
            for p, c in (part or {}).items():
                counts[p] = counts.get(p, 0) + c
        self.counts = dict(sorted(counts.items()))


def check_write_schema(schema: pa.Schema) -> None:
    """IllegalArgumentError unless ``schema`` has a ``value`` column and every column
    ``write_topic`` reads has a type it takes."""
    names = schema.names
    if "value" not in names:
        raise IllegalArgumentError(
            f"write_topic needs a 'value' column (binary or string), and optionally key, "
            f"partition, headers, timestamp; the Dataset has columns {names}")
    for name in ("value", "key"):
        if name in names and not _bytes_like(schema.field(name).type):
            raise IllegalArgumentError(
                f"column {name!r} must be binary or string, got {schema.field(name).type}")
    if "partition" in names:
        t = schema.field("partition").type
        if not (pa.types.is_integer(t) or pa.types.is_null(t)):
            raise IllegalArgumentError(f"column 'partition' must be an integer, got {t}")
    if "timestamp" in names:
        t = schema.field("timestamp").type
        if not (pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_null(t)):
            raise IllegalArgumentError(
                f"column 'timestamp' must be integer milliseconds or a timestamp, got {t}")
    if "headers" in names:
        t = schema.field("headers").type
        if not _headers_type(t):
            raise IllegalArgumentError(
                f"column 'headers' must be map<string, binary> or list<struct<key: string, "
                f"value: binary>> (string values allowed), got {t}")


def _bytes_like(t) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_null(t))


def _headers_type(t) -> bool:
    if pa.types.is_null(t):
        return True
    if pa.types.is_map(t):
        key, value = t.key_type, t.item_type
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            pa.types.is_struct(t.value_type):
        fields = {f.name: f.type for f in t.value_type}
        if set(fields) != {"key", "value"}:
            return False
        key, value = fields["key"], fields["value"]
    else:
        return False
    return (pa.types.is_string(key) or pa.types.is_large_string(key)) and _bytes_like(value)


def _send_table(producer, topic: str, table: pa.Table) -> list:
    """``send_batch`` the rows of ``table`` (slices of about SEND_SLICE_BYTES, grouped by
    their ``partition`` column where it has values); the BatchFutures."""
    n = table.num_rows
    rows = max(1, int(n * SEND_SLICE_BYTES / max(table.nbytes, 1)))
    futures = []
    for first in range(0, n, rows):
        piece = table.slice(first, rows)
        col = piece.column("partition") if "partition" in piece.column_names else None
        if col is None or col.null_count == piece.num_rows:
            futures.append(_send(producer, topic, piece, None))
            continue
        col = col.cast(pa.int64())
        if pc.any(pc.less(col, 0)).as_py():
            bad = pc.min(col).as_py()
            raise IllegalArgumentError(f"partition must be >= 0, got {bad}")
        parts = pc.fill_null(col, -1).to_numpy()
        for p in np.unique(parts).tolist():
            where = np.flatnonzero(parts == p)
            group = piece if len(where) == piece.num_rows else piece.take(where)
            futures.append(_send(producer, topic, group, None if p < 0 else p))
    return futures


def _send(producer, topic: str, table: pa.Table, partition):
    n = table.num_rows
    values = _bytes_column(table, "value")
    keys = _bytes_column(table, "key") if "key" in table.column_names else None
    timestamps = None
    if "timestamp" in table.column_names and \
            not pa.types.is_null(table.schema.field("timestamp").type):
        col = table.column("timestamp")
        if pa.types.is_timestamp(col.type):      # truncated to ms, as Kafka keeps them
            col = pc.cast(col, pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64())
        if col.null_count:
            col = pc.fill_null(col.cast(pa.int64()), int(time.time() * 1000))
        timestamps = col.cast(pa.int64()).to_numpy()
    headers = None
    if "headers" in table.column_names and table.column("headers").null_count < n:
        headers = [_header_pairs(h) for h in table.column("headers").to_pylist()]
    return producer.send_batch(topic, values, keys=keys, partition=partition,
                               timestamps=timestamps, headers=headers)


def _bytes_column(table: pa.Table, name: str) -> list:
    col = table.column(name)
    t = col.type
    if pa.types.is_null(t):
        return [None] * table.num_rows
    if pa.types.is_string(t):
        col = col.cast(pa.binary())
    elif pa.types.is_large_string(t):
        col = col.cast(pa.large_binary())
    return col.to_pylist()


def _header_pairs(headers):
    """One row of a headers column (map: [(k, v)], list<struct>: [{"key", "value"}]) as
    [(str, bytes|None)]; None for none."""
    if not headers:
        return None
    out = []
    for h in headers:
        k, v = (h["key"], h["value"]) if isinstance(h, dict) else h
        out.append((k, v.encode() if isinstance(v, str) else v))
    return out


# -- shared ------------------------------------------------------------------------------------

def _as_cluster(cluster):
    """An ``actors.Cluster``: ``cluster`` itself, or ``Cluster.connect(cluster)`` for a
    namespace."""
    if isinstance(cluster, str):
        from actors import Cluster
        return Cluster.connect(cluster)
    if not hasattr(cluster, "namespace") or not hasattr(cluster, "simple_consumer"):
        raise IllegalArgumentError(f"cluster must be an actors.Cluster or its namespace, "
                                   f"got {type(cluster).__name__}")
    return cluster


def _topic_list(topics) -> list[str]:
    names = [topics] if isinstance(topics, str) else topics
    if not isinstance(names, (list, tuple)) or not names:
        raise IllegalArgumentError(f"topics must be a topic name or a non-empty list of "
                                   f"them, got {topics!r}")
    for name in names:
        if not isinstance(name, str) or not name:
            raise IllegalArgumentError(f"topic names are non-empty str, got {name!r}")
    if len(set(names)) != len(names):
        raise IllegalArgumentError(f"topics lists a topic twice: {list(names)}")
    return list(names)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_positive_int(value, name: str) -> None:
    if not _is_int(value) or value < 1:
        raise IllegalArgumentError(f"{name} must be an int >= 1, got {value!r}")


def _check_offset(value, name: str) -> None:
    """One offset value: "earliest"/"latest" (not "latest" for a start, "earliest" for an
    end, as read_kafka), an int >= 0 or a datetime."""
    if isinstance(value, str):
        if value not in ("earliest", "latest"):
            raise IllegalArgumentError(f"{name} must be 'earliest', 'latest', an int, a "
                                       f"datetime or a dict, got {value!r}")
        if value in (_NO_START_VALUES if name.startswith("start") else _NO_END_VALUES):
            raise IllegalArgumentError(f"{name} cannot be {value!r}")
    elif _is_int(value):
        if value < 0:
            raise IllegalArgumentError(f"{name} must be >= 0, got {value}")
    elif not isinstance(value, datetime):
        raise IllegalArgumentError(f"{name} must be 'earliest', 'latest', an int, a "
                                   f"datetime or a dict, got {value!r}")


def _validate_offset_arg(arg, name: str, topics: list[str]) -> None:
    if not isinstance(arg, dict):
        _check_offset(arg, name)
        return
    for topic, per_partition in arg.items():
        if topic not in topics:
            raise IllegalArgumentError(f"{name} names topic {topic!r}, which is not read "
                                       f"(topics: {topics})")
        if not isinstance(per_partition, dict):
            raise IllegalArgumentError(f"{name}[{topic!r}] must be a dict mapping partition "
                                       f"(int) to offset, got {per_partition!r}")
        for p, value in per_partition.items():
            if not _is_int(p) or p < 0:
                raise IllegalArgumentError(f"{name}[{topic!r}] keys are partitions (ints "
                                           f">= 0), got {p!r}")
            _check_offset(value, f"{name}[{topic!r}][{p}]")


def _validate_partitions(partitions, topics: list[str]) -> None:
    if partitions is None:
        return
    if not isinstance(partitions, dict):
        raise IllegalArgumentError(f"partitions must be {{topic: [partition, ...]}}, got "
                                   f"{partitions!r}")
    for topic, parts in partitions.items():
        if topic not in topics:
            raise IllegalArgumentError(f"partitions names topic {topic!r}, which is not read "
                                       f"(topics: {topics})")
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
            raise IllegalArgumentError(f"partitions[{topic!r}] must be a list of partitions, "
                                       f"got {parts!r}")
        for p in parts:
            if not _is_int(p) or p < 0:
                raise IllegalArgumentError(f"partitions[{topic!r}] holds partitions (ints "
                                           f">= 0), got {p!r}")


def _for_partition(arg, topic: str, partition: int, default):
    if isinstance(arg, dict):
        arg = arg.get(topic, {}).get(partition, default)
    return int(arg) if _is_int(arg) else arg


def _datetime_to_ms(dt: datetime) -> int:
    """Milliseconds since the epoch; a naive datetime is UTC (as read_kafka)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _retriable(exc: BaseException) -> bool:
    """May ``exc`` go away if the request is sent again after a metadata refresh? Kafka's
    retriable errors (a moved leader, a timeout) and a leader actor that died or did not
    answer."""
    if isinstance(exc, KafkaError):
        return bool(getattr(exc, "retriable", False))
    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                            ray.exceptions.ActorUnavailableError))


def _retrying(fn, *, what: str, on_retry, deadline_s: float):
    deadline = time.monotonic() + deadline_s
    failures = 0
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - retried or raised
            failures += 1
            if not _retriable(exc):
                raise
            wait = min(RETRY_BACKOFF_S * 2 ** (failures - 1), RETRY_BACKOFF_MAX_S)
            if time.monotonic() + wait > deadline:
                if isinstance(exc, KafkaError):
                    raise
                raise KafkaTimeoutError(f"{what} did not succeed within {deadline_s}s "
                                        f"(last: {exc!r})") from exc
            on_retry()
            time.sleep(wait)
