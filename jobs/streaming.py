"""Micro-batch streaming over raykafka topics, with Spark Structured Streaming's guarantees.

    from jobs.spark import spark_session
    from jobs.streaming import MicroBatchStream, ParquetSink
    spark = spark_session(app_name="clicks")
    stream = MicroBatchStream(cluster, "clicks", "/data/ckpt/clicks", spark=spark,
                              max_offsets_per_trigger=100_000)
    sink = ParquetSink("/data/out/clicks-per-user",
                       transform=lambda df: df.groupBy("key").count())
    stream.run(sink, trigger_interval_s=5)            # until stop() / a stop condition

Each trigger plans a batch, ``[start, end)`` per partition: ``start`` where the last batch
ended (the first batch: ``starting_offsets``), ``end`` the partition's high watermark
(committed records only), the whole of it capped at ``max_offsets_per_trigger``. Then it
runs the batch: reads it (``read_topic_df`` with a Spark session, ``read_topic`` without),
hands it to the user's ``foreach_batch(data, batch_id)`` and checkpoints.

The checkpoint directory holds Spark's two logs, one small JSON file per batch:

    <checkpoint_dir>/metadata        {"id", "topics", ...}: which query this is
    <checkpoint_dir>/initial-offsets where the first batch starts (``starting_offsets``
                                     resolved once, so "latest" is not re-read later)
    <checkpoint_dir>/offsets/<N>     the range of batch N, written BEFORE batch N runs
    <checkpoint_dir>/commits/<N>     written AFTER foreach_batch(batch N) has returned

Each file is written once, atomically (a temporary file, fsync, then a hard link to its
name, which fails if the name exists: a second query on the same directory cannot
overwrite the first's plan), and the directory is fsynced. A process killed at any point
and started again finds the last planned batch: committed, it goes on after it;
not committed, it runs that batch again with exactly the recorded range (not a new one up
to the current high watermark), so the sink sees batch N with the same records every time.
Results are exactly-once when the sink writes batch N idempotently: ``ParquetSink`` writes
``<path>/batch=<N>`` through a temporary directory and a rename, and skips a batch whose
directory exists (it was written before the job died, and the same range gives the same
result). A sink that is not idempotent (``write_topic_df`` to another topic) gets
at-least-once: a batch re-run after a crash is written again.

Where this follows Spark's Kafka source (``KafkaMicroBatchStream``): a batch is planned only
when some partition has records past the last end (no empty batches); partitions added to a
topic start at their earliest offset; ``max_offsets_per_trigger`` is split over the
partitions in proportion to what each has waiting, every partition with records getting at
least one while the cap allows; records deleted by retention before they were read fail
the stream (``fail_on_data_loss=True``, OffsetOutOfRangeError) or are skipped with a
warning (False); the logs keep the last ``min_batches_to_retain`` batches (100).

Only the public API is imported (``actors``, ``actors.errors``, ``jobs.*``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from actors.errors import (IllegalArgumentError, InvalidCheckpointError,
                           OffsetOutOfRangeError, UnknownTopicOrPartitionError)
from jobs.data import _as_cluster, _topic_list, read_topic

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
MIN_BATCHES_TO_RETAIN = 100
EARLIEST, LATEST = -2, -1           # in offset dicts, as Spark's startingOffsets has them

Offsets = dict[str, dict[int, int]]  # {topic: {partition: offset}}


# -- the checkpoint ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchPlan:
    """The range of one batch, as ``offsets/<batch_id>`` records it."""
    batch_id: int
    start: Offsets
    end: Offsets
    timestamp_ms: int

    @property
    def num_records(self) -> int:
        return sum(self.end[t][p] - self.start.get(t, {}).get(p, self.end[t][p])
                   for t in self.end for p in self.end[t])

    def to_json(self) -> dict:
        return {"version": CHECKPOINT_VERSION, "batch_id": self.batch_id,
                "timestamp_ms": self.timestamp_ms,
                "start": _offsets_json(self.start), "end": _offsets_json(self.end)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> "BatchPlan":
        try:
            if doc["version"] != CHECKPOINT_VERSION:
                raise InvalidCheckpointError(f"{where}: version {doc['version']!r}, this "
                                             f"code reads version {CHECKPOINT_VERSION}")
            plan = cls(int(doc["batch_id"]), _offsets_from_json(doc["start"]),
                       _offsets_from_json(doc["end"]), int(doc["timestamp_ms"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidCheckpointError(f"{where} is not a batch plan ({exc!r})") from None
        for topic, parts in plan.end.items():
            for p, end in parts.items():
                start = plan.start.get(topic, {}).get(p)
                if start is None or not 0 <= start <= end:
                    raise InvalidCheckpointError(
                        f"{where}: {topic}-{p} has start {start}, end {end}")
        return plan


def _offsets_json(offsets: Offsets) -> dict:
    return {t: {str(p): o for p, o in sorted(parts.items())}
            for t, parts in sorted(offsets.items())}


def _offsets_from_json(doc: dict) -> Offsets:
    out = {}
    for topic, parts in doc.items():
        if not isinstance(topic, str):
            raise TypeError(f"topic {topic!r}")
        out[topic] = {}
        for p, off in parts.items():
            if not isinstance(off, int) or isinstance(off, bool):
                raise TypeError(f"offset {off!r} of {topic}-{p}")
            out[topic][int(p)] = off
    return out


class Checkpoint:
    """The offsets and commits logs of one query in ``path`` (see the module docstring).

    Opening it takes an exclusive lock on ``<path>/lock`` (``fcntl.flock``; a killed
    process's lock goes with it): a second query on the same directory on this machine is
    refused with InvalidCheckpointError; on other machines the create-once log files
    refuse it at its first batch. ``close()`` lets the lock go.
    """

    def __init__(self, path: str | os.PathLike, topics: list[str], *,
                 min_batches_to_retain: int = MIN_BATCHES_TO_RETAIN):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise IllegalArgumentError(f"checkpoint_dir must be a directory path, got {path!r}")
        if not isinstance(min_batches_to_retain, int) or min_batches_to_retain < 1:
            raise IllegalArgumentError(f"min_batches_to_retain must be an int >= 1, got "
                                       f"{min_batches_to_retain!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.min_batches_to_retain = min_batches_to_retain
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise InvalidCheckpointError(f"checkpoint_dir {self.path} is not a directory")
        for sub in ("offsets", "commits"):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)
        self._lock_file = open(os.path.join(self.path, "lock"), "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise InvalidCheckpointError(
                f"checkpoint_dir {self.path} is in use by another running query") from None
        try:
            self.query_id = self._metadata(sorted(topics))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def _metadata(self, topics: list[str]) -> str:
        where = os.path.join(self.path, "metadata")
        doc = self._read(where)
        if doc is None:
            doc = {"version": CHECKPOINT_VERSION, "id": str(uuid.uuid4()), "topics": topics,
                   "created_ms": int(time.time() * 1000)}
            if self._write_once(where, doc):
                return doc["id"]
            doc = self._read(where)          # another query made it first: check it
        if not isinstance(doc, dict) or "id" not in doc or "topics" not in doc:
            raise InvalidCheckpointError(f"{where} is not a query's metadata: {doc!r}")
        if sorted(doc["topics"]) != topics:
            raise InvalidCheckpointError(
                f"checkpoint_dir {self.path} belongs to a query of topics {doc['topics']}, "
                f"not {topics}: use another directory for another query")
        return doc["id"]

    # -- the logs --------------------------------------------------------------------------
    def batch_ids(self, log_name: str) -> list[int]:
        """The batch ids of ``offsets`` or ``commits``, ascending (other names ignored)."""
        names = os.listdir(os.path.join(self.path, log_name))
        return sorted(int(n) for n in names if n.isdigit())

    def latest_plan(self) -> BatchPlan | None:
        ids = self.batch_ids("offsets")
        return self.read_plan(ids[-1]) if ids else None

    def read_plan(self, batch_id: int) -> BatchPlan | None:
        """``offsets/<batch_id>`` (None when it is not there, or purged)."""
        where = os.path.join(self.path, "offsets", str(batch_id))
        doc = self._read(where)
        if doc is None:
            return None
        plan = BatchPlan.from_json(doc, where)
        if plan.batch_id != batch_id:
            raise InvalidCheckpointError(f"{where} holds batch {plan.batch_id}")
        return plan

    def read_commit(self, batch_id: int) -> dict | None:
        """``commits/<batch_id>``: ``{"batch_id", "num_records", "total_records" (of every
        batch up to this one), "timestamp_ms"}``, or None when not committed."""
        where = os.path.join(self.path, "commits", str(batch_id))
        doc = self._read(where)
        if doc is None:
            return None
        if not isinstance(doc, dict) or doc.get("batch_id") != batch_id:
            raise InvalidCheckpointError(f"{where} is not the commit of batch {batch_id}: "
                                         f"{doc!r}")
        return doc

    def initial_offsets(self) -> Offsets | None:
        """Where the query's first batch starts (``initial-offsets``), None before it was
        resolved."""
        where = os.path.join(self.path, "initial-offsets")
        doc = self._read(where)
        if doc is None:
            return None
        try:
            return _offsets_from_json(doc["offsets"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidCheckpointError(f"{where} is not a query's initial offsets "
                                         f"({exc!r})") from None

    def write_initial_offsets(self, offsets: Offsets) -> Offsets:
        """Record where the first batch starts, once: returns what is recorded (another
        query's, when it wrote them first)."""
        where = os.path.join(self.path, "initial-offsets")
        if self._write_once(where, {"version": CHECKPOINT_VERSION,
                                    "offsets": _offsets_json(offsets)}):
            return offsets
        return self.initial_offsets()

    def is_committed(self, batch_id: int) -> bool:
        return self.read_commit(batch_id) is not None

    def total_records(self) -> int:
        """Records of every committed batch (the last commit's running total)."""
        ids = self.batch_ids("commits")
        return int(self.read_commit(ids[-1]).get("total_records", 0)) if ids else 0

    def write_plan(self, plan: BatchPlan) -> None:
        where = os.path.join(self.path, "offsets", str(plan.batch_id))
        if not self._write_once(where, plan.to_json()):
            raise InvalidCheckpointError(
                f"{where} exists: another query planned batch {plan.batch_id} in "
                f"{self.path} (two queries on one checkpoint_dir)")

    def write_commit(self, batch_id: int, info: dict) -> None:
        where = os.path.join(self.path, "commits", str(batch_id))
        if not self._write_once(where, dict(info, version=CHECKPOINT_VERSION,
                                             batch_id=batch_id)):
            raise InvalidCheckpointError(f"{where} exists: batch {batch_id} was committed "
                                         f"by another query on {self.path}")
        self._purge(batch_id)

    def _purge(self, batch_id: int) -> None:
        """Drop log entries older than the last ``min_batches_to_retain`` batches."""
        oldest_kept = batch_id - self.min_batches_to_retain + 1
        for log_name in ("offsets", "commits"):
            for n in self.batch_ids(log_name):
                if n >= oldest_kept:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, log_name, str(n)))

    # -- files -----------------------------------------------------------------------------
    @staticmethod
    def _read(where: str):
        try:
            with open(where, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InvalidCheckpointError(f"{where} is damaged (not JSON: {exc}); the log "
                                         f"files are written atomically, so something "
                                         f"else wrote it") from None

    @staticmethod
    def _write_once(where: str, doc: dict) -> bool:
        """Write ``doc`` to ``where`` atomically unless ``where`` exists; False if it did."""
        directory = os.path.dirname(where)
        tmp = os.path.join(directory, f".{os.path.basename(where)}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps(doc, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, where)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return True


# -- planning ----------------------------------------------------------------------------------

def split_cap(available: dict, cap: int | None) -> dict:
    """How many records of each ``{key: waiting}`` a batch of at most ``cap`` records takes:
    everything when ``cap`` is None or not exceeded; otherwise ``cap`` in all, shared in
    proportion to what waits (rounded by largest remainders), never more than waits, and
    at least one for every key with records waiting while the cap allows (a small
    partition is not starved by big ones, as in Spark's rate limit)."""
    total = sum(available.values())
    if cap is None or total <= cap:
        return dict(available)
    waiting = sorted((k for k, n in available.items() if n > 0),
                     key=lambda k: (-available[k], str(k)))
    take = {k: 0 for k in available}
    if cap < len(waiting):
        for k in waiting[:cap]:                 # the biggest backlogs first
            take[k] = 1
        return take
    shares = {k: cap * available[k] / total for k in waiting}
    for k in waiting:
        take[k] = max(int(math.floor(shares[k])), 1)
    while sum(take.values()) > cap:             # the ones given to small keys: from the biggest
        biggest = max(waiting, key=lambda k: (take[k], str(k)))
        take[biggest] -= 1
    by_remainder = sorted(waiting, key=lambda k: (-(shares[k] - take[k]), str(k)))
    left = cap - sum(take.values())
    while left > 0:
        for k in by_remainder:
            if left and take[k] < available[k]:
                take[k] += 1
                left -= 1
    return take


@dataclass
class BatchInfo:
    """What a run of one batch did."""
    batch_id: int
    start: Offsets
    end: Offsets
    num_records: int
    rerun: bool                  # the batch was planned by an earlier run that did not commit
    # seconds: making the batch's data (with Spark only resolving its ranges: the records
    # are read when foreach_batch's actions compute the DataFrame, inside process_s),
    # foreach_batch, and the whole batch from its plan to its commit
    read_s: float = 0.0
    process_s: float = 0.0
    latency_s: float = 0.0
    result: Any = field(default=None, repr=False)   # what foreach_batch returned

    @property
    def records_per_s(self) -> float:
        """The batch's throughput: its records over its latency."""
        return self.num_records / self.latency_s if self.latency_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"batch_id": self.batch_id, "num_records": self.num_records, "rerun": self.rerun,
                "read_s": round(self.read_s, 3), "process_s": round(self.process_s, 3),
                "latency_s": round(self.latency_s, 3),
                "records_per_s": round(self.records_per_s),
                "start": _offsets_json(self.start), "end": _offsets_json(self.end)}


class MicroBatchStream:
    """A micro-batch query over ``topics`` checkpointed in ``checkpoint_dir``.

    ``cluster``: an ``actors.Cluster`` or its namespace. ``topics``: a name or a list.
    ``spark``: a session of ``jobs.spark.spark_session``: batches are Spark DataFrames of
    ``read_topic_df`` (Spark's Kafka source columns); None: Ray Datasets of
    ``read_topic`` (``jobs.data.SCHEMA``). ``starting_offsets``: where the first batch
    starts when the checkpoint has none, "earliest", "latest", or ``{topic: {partition:
    offset}}`` (-2 earliest, -1 latest; partitions not named: earliest). A checkpoint
    that has batches decides where to go on, whatever ``starting_offsets`` says.
    ``max_offsets_per_trigger``: at most this many records per batch (None: no cap).
    ``fail_on_data_loss``: what to do when records a batch should read were deleted by
    retention (or the log was truncated below a recorded offset): True raise
    OffsetOutOfRangeError, False log a warning and read what is left.
    ``read_options``: passed to ``read_topic`` / ``read_topic_df``.

    Raises IllegalArgumentError (bad arguments), UnknownTopicOrPartitionError (a topic that
    does not exist), InvalidCheckpointError (a directory of another query, damaged, or in
    use). ``close()`` (or ``with``) lets the checkpoint's lock go.
    """

    def __init__(self, cluster, topics, checkpoint_dir, *, spark=None,
                 starting_offsets="earliest", max_offsets_per_trigger: int | None = None,
                 fail_on_data_loss: bool = True,
                 min_batches_to_retain: int = MIN_BATCHES_TO_RETAIN,
                 read_options: dict | None = None):
        self.topics = _topic_list(topics)
        if max_offsets_per_trigger is not None and (
                not isinstance(max_offsets_per_trigger, int)
                or isinstance(max_offsets_per_trigger, bool) or max_offsets_per_trigger < 1):
            raise IllegalArgumentError(f"max_offsets_per_trigger must be an int >= 1 or None, "
                                       f"got {max_offsets_per_trigger!r}")
        if not isinstance(fail_on_data_loss, bool):
            raise IllegalArgumentError(f"fail_on_data_loss must be a bool, got "
                                       f"{fail_on_data_loss!r}")
        if read_options is not None and not isinstance(read_options, dict):
            raise IllegalArgumentError(f"read_options must be a dict, got {read_options!r}")
        if spark is not None:
            from pyspark.sql import SparkSession
            if not isinstance(spark, SparkSession):
                raise IllegalArgumentError(f"spark must be a SparkSession or None, got "
                                           f"{type(spark).__name__}")
        self._starting = _check_starting_offsets(starting_offsets, self.topics)
        self.cluster = _as_cluster(cluster)
        self.spark = spark
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.fail_on_data_loss = fail_on_data_loss
        self.read_options = dict(read_options or {})
        for topic in self.topics:
            self.cluster.metadata.partitions_for(topic)     # UnknownTopicOrPartitionError
        self.checkpoint = Checkpoint(checkpoint_dir, self.topics,
                                     min_batches_to_retain=min_batches_to_retain)
        self._stop = threading.Event()
        self.last_progress: BatchInfo | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.checkpoint.close()

    def stop(self) -> None:
        """Ask ``run`` to return after the batch it is running (callable from any thread)."""
        self._stop.set()

    # -- planning --------------------------------------------------------------------------
    def _watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        """``{(topic, partition): (log start offset, high watermark)}`` now."""
        consumer = self.cluster.simple_consumer(**self.read_options.get("consumer_config", {}))
        try:
            out = {}
            for topic in self.topics:
                for p in self.cluster.metadata.partitions_for(topic):
                    low = consumer.offsets_before(topic, p, EARLIEST)[0]
                    high = consumer.offsets_before(topic, p, LATEST)[0]
                    out[(topic, p)] = (low, high)
            return out
        finally:
            consumer.close()

    def _starts(self, marks) -> dict[tuple[str, int], int]:
        """Where the next new batch starts in each partition: after the last planned
        batch, or, before the first, at the initial offsets. Those are resolved from
        ``starting_offsets`` once, and recorded (as Spark records its source's initial
        offsets), so "latest" means the end of the topic when the query first started, also
        across restarts. A partition neither knows (added to the topic since) starts at
        its earliest offset, as in Spark's Kafka source."""
        plan = self.checkpoint.latest_plan()
        if plan is not None:
            known = plan.end
        else:
            known = self.checkpoint.initial_offsets()
            if known is None:
                resolved: Offsets = {}
                for (topic, p), (low, high) in marks.items():
                    arg = self._starting
                    if isinstance(arg, dict):
                        arg = arg.get(topic, {}).get(p, EARLIEST)
                    resolved.setdefault(topic, {})[p] = {EARLIEST: low, LATEST: high}.get(arg, arg)
                known = self.checkpoint.write_initial_offsets(resolved)
        return {(topic, p): known.get(topic, {}).get(p, low)
                for (topic, p), (low, _) in marks.items()}

    def _check_loss(self, start: int, low: int, high: int, topic: str, p: int,
                    batch_id: int) -> int:
        """``start`` where records are still there, or the typed error / a warning."""
        if low <= start <= high:
            return start
        what = (f"records {start}..{low - 1} of {topic}-{p} were deleted (log start offset "
                f"{low})" if start < low else
                f"{topic}-{p} has no offset {start} any more (high watermark {high}: the log "
                f"was truncated or the topic recreated)")
        if self.fail_on_data_loss:
            raise OffsetOutOfRangeError(f"batch {batch_id}: {what}; fail_on_data_loss=False "
                                        f"goes on with what is left")
        log.warning("batch %d: %s; reading from %d (fail_on_data_loss=False)", batch_id, what,
                    min(max(start, low), high))
        return min(max(start, low), high)

    def plan_next(self, until: dict | None = None) -> tuple[BatchPlan, bool] | None:
        """The batch the next trigger runs and whether it is a re-run: the last planned one
        when it is not committed (re-run, exactly its recorded range), else a new one up to
        the high watermarks, or to ``until`` (``{(topic, partition): offset}``) where that is
        lower (None when no partition has records past the last end). A new plan is
        written to the offsets log before it is returned."""
        latest = self.checkpoint.latest_plan()
        if latest is not None and not self.checkpoint.is_committed(latest.batch_id):
            return latest, True
        marks = self._watermarks()
        if until is not None:
            marks = {tp: (low, max(min(high, until.get(tp, high)), low))
                     for tp, (low, high) in marks.items()}
        batch_id = 0 if latest is None else latest.batch_id + 1
        starts = self._starts(marks)
        for (topic, p), (low, high) in marks.items():
            starts[(topic, p)] = self._check_loss(starts[(topic, p)], low, high, topic, p,
                                                  batch_id)
        waiting = {tp: max(marks[tp][1] - starts[tp], 0) for tp in marks}
        if not any(waiting.values()):
            return None
        take = split_cap(waiting, self.max_offsets_per_trigger)
        start, end = {}, {}
        for (topic, p), first in sorted(starts.items()):
            start.setdefault(topic, {})[p] = first
            end.setdefault(topic, {})[p] = first + take[(topic, p)]
        plan = BatchPlan(batch_id, start, end, int(time.time() * 1000))
        self.checkpoint.write_plan(plan)
        return plan, False

    # -- running ---------------------------------------------------------------------------
    def run_batch(self, foreach_batch: Callable[[Any, int], Any], *,
                  until: dict | None = None) -> BatchInfo | None:
        """Plan (or re-plan) one batch and run it: read it, ``foreach_batch(data,
        batch_id)``, commit. None when there was nothing to do. An exception from
        ``foreach_batch`` (or the read) leaves the batch planned and not committed: the
        next run_batch (or the next process on this checkpoint) runs it again.
        ``until``: as ``plan_next``'s."""
        if not callable(foreach_batch):
            raise IllegalArgumentError(f"foreach_batch must be callable (data, batch_id), got "
                                       f"{foreach_batch!r}")
        planned_at = time.monotonic()
        planned = self.plan_next(until)
        if planned is None:
            return None
        plan, rerun = planned
        if rerun:
            marks = self._watermarks()
            for topic, parts in plan.start.items():
                for p, first in parts.items():
                    if (topic, p) not in marks:
                        raise UnknownTopicOrPartitionError(
                            f"batch {plan.batch_id} reads {topic}-{p}, which no longer exists")
                    low, high = marks[(topic, p)]
                    if plan.end[topic][p] > high:
                        raise OffsetOutOfRangeError(
                            f"batch {plan.batch_id} was planned up to offset "
                            f"{plan.end[topic][p]} of {topic}-{p}, whose high watermark is "
                            f"now {high}: the log lost committed records (an unclean leader "
                            f"election), the batch cannot be read again as it was")
                    if first < low:
                        self._check_loss(first, low, high, topic, p, plan.batch_id)
            log.info("batch %d was planned but not committed: running it again "
                     "(%d records)", plan.batch_id, plan.num_records)
        began = time.monotonic()
        data = self._read(plan)
        read_s = time.monotonic() - began
        try:
            result = foreach_batch(data, plan.batch_id)
            process_s = time.monotonic() - began - read_s
            previous = self.checkpoint.read_commit(plan.batch_id - 1) or {}
            self.checkpoint.write_commit(plan.batch_id, {
                "num_records": plan.num_records,
                "total_records": int(previous.get("total_records", 0)) + plan.num_records,
                "timestamp_ms": int(time.time() * 1000)})
        finally:
            self._release(data)
        info = BatchInfo(plan.batch_id, plan.start, plan.end, plan.num_records, rerun,
                         read_s, process_s, time.monotonic() - planned_at, result)
        self.last_progress = info
        log.info("batch %d committed: %d records in %.2fs (%.0f records/s; read %.2fs, "
                 "processed %.2fs)", info.batch_id, info.num_records, info.latency_s,
                 info.records_per_s, read_s, process_s)
        return info

    def run(self, foreach_batch: Callable[[Any, int], Any], *, trigger_interval_s: float = 0.0,
            available_now: bool = False, max_batches: int | None = None,
            timeout_s: float | None = None,
            on_batch: Callable[[BatchInfo], None] | None = None) -> list[BatchInfo]:
        """Run batches until a stop condition; returns what each did.

        ``trigger_interval_s``: a batch starts at most this often (Spark's ProcessingTime
        trigger); with nothing new the stream waits for the next trigger. Stops on
        ``stop()``, after ``max_batches`` batches, after ``timeout_s`` seconds, or, with
        ``available_now`` (Spark's Trigger.AvailableNow), once everything that was in the
        topics when ``run`` began is processed (a re-run batch first, then new ones,
        ``max_offsets_per_trigger`` still applying). ``on_batch(info)`` after each commit.
        """
        if not isinstance(trigger_interval_s, (int, float)) or trigger_interval_s < 0:
            raise IllegalArgumentError(f"trigger_interval_s must be a number >= 0, got "
                                       f"{trigger_interval_s!r}")
        if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
            raise IllegalArgumentError(f"max_batches must be an int >= 1 or None, got "
                                       f"{max_batches!r}")
        if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
            raise IllegalArgumentError(f"timeout_s must be a number > 0 or None, got "
                                       f"{timeout_s!r}")
        self._stop.clear()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        target = None
        if available_now:
            target = {tp: high for tp, (_, high) in self._watermarks().items()}
        done: list[BatchInfo] = []
        while not self._stop.is_set():
            if max_batches is not None and len(done) >= max_batches:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            began = time.monotonic()
            info = self.run_batch(foreach_batch, until=target)
            if info is not None:
                done.append(info)
                if on_batch is not None:
                    on_batch(info)
                wait = trigger_interval_s - (time.monotonic() - began)
            elif target is not None:
                break                           # nothing left below the target
            else:
                wait = max(trigger_interval_s - (time.monotonic() - began), 0.1)
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            if wait > 0:
                self._stop.wait(wait)
        return done

    def _read(self, plan: BatchPlan):
        """The records of the plan's ranges, and of no other partition (one added to a
        topic since the plan was made is not read)."""
        topics = sorted(plan.end)
        only = {t: sorted(plan.end[t]) for t in topics}
        if self.spark is not None:
            from jobs.spark import read_topic_df
            return read_topic_df(self.spark, self.cluster, topics, plan.start, plan.end,
                                 partitions=only, **self.read_options)
        return read_topic(self.cluster, topics, plan.start, plan.end, partitions=only,
                          **self.read_options)

    def _release(self, data) -> None:
        if self.spark is not None:
            from jobs.spark import release_df
            release_df(data)


def _check_starting_offsets(value, topics: list[str]):
    if value == "earliest":
        return EARLIEST
    if value == "latest":
        return LATEST
    if isinstance(value, dict):
        out = {}
        for topic, parts in value.items():
            if topic not in topics:
                raise IllegalArgumentError(f"starting_offsets names topic {topic!r}, which the "
                                           f"stream does not read ({topics})")
            if not isinstance(parts, dict):
                raise IllegalArgumentError(f"starting_offsets[{topic!r}] must be "
                                           f"{{partition: offset}}, got {parts!r}")
            out[topic] = {}
            for p, off in parts.items():
                if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                    raise IllegalArgumentError(f"starting_offsets: partition {p!r} of "
                                               f"{topic!r} must be an int >= 0")
                if not isinstance(off, int) or isinstance(off, bool) or off < -2:
                    raise IllegalArgumentError(
                        f"starting_offsets: offset of {topic}-{p} must be an int >= 0, -1 "
                        f"(latest) or -2 (earliest), got {off!r}")
                out[topic][p] = off
        return out
    raise IllegalArgumentError(f"starting_offsets must be 'earliest', 'latest' or "
                               f"{{topic: {{partition: offset}}}}, got {value!r}")


# -- an idempotent sink ------------------------------------------------------------------------

class ParquetSink:
    """``foreach_batch`` that writes each batch's result to ``<path>/batch=<N>`` once.

    ``transform(data)`` (optional) turns the batch (a Spark DataFrame or a Ray Dataset)
    into what is written. The result is written to ``<path>/_tmp-batch=<N>-<uuid>`` and
    renamed to ``batch=<N>``: a directory ``batch=<N>`` is always complete. A batch whose
    directory exists is skipped (written before a crash; the re-run has the same range).
    Temporary directories a killed writer left are removed when the sink starts a batch.
    Spark and ``pyarrow.dataset`` read ``<path>`` as one table with a ``batch`` column and
    skip names starting with "_". ``path`` must be a file system every Spark executor (or
    Ray worker) writes to and this driver renames on: one machine's disk, or a shared one.
    Returns the number of rows written (None when skipped).
    """

    TMP_PREFIX = "_tmp-"

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise IllegalArgumentError(f"path must be a directory path, got {path!r}")
        if transform is not None and not callable(transform):
            raise IllegalArgumentError(f"transform must be callable or None, got {transform!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.transform = transform
        os.makedirs(self.path, exist_ok=True)

    def batch_dir(self, batch_id: int) -> str:
        return os.path.join(self.path, f"batch={batch_id}")

    def __call__(self, data, batch_id: int):
        final = self.batch_dir(batch_id)
        self._clean_temporaries(batch_id)
        if os.path.isdir(final):
            log.info("batch %d is in %s already: skipped", batch_id, final)
            return None
        out = data if self.transform is None else self.transform(data)
        tmp = os.path.join(self.path, f"{self.TMP_PREFIX}batch={batch_id}-{uuid.uuid4().hex}")
        rows = _write_parquet(out, tmp)
        os.rename(tmp, final)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return rows

    def _clean_temporaries(self, batch_id: int) -> None:
        prefix = f"{self.TMP_PREFIX}batch={batch_id}-"
        for name in os.listdir(self.path):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)

    def batches(self) -> list[int]:
        """The batch ids written, ascending."""
        out = []
        for name in os.listdir(self.path):
            if name.startswith("batch=") and name[6:].isdigit():
                out.append(int(name[6:]))
        return sorted(out)


def _write_parquet(out, directory: str) -> int | None:
    from pyspark.sql import DataFrame
    if isinstance(out, DataFrame):
        out = out.cache()
        try:
            rows = out.count()
            out.write.mode("errorifexists").parquet(directory)
        finally:
            out.unpersist()
        return rows
    import ray.data
    if isinstance(out, ray.data.Dataset):
        out = out.materialize()
        out.write_parquet(directory)
        os.makedirs(directory, exist_ok=True)       # Ray writes no file for no rows
        return out.count()
    raise IllegalArgumentError(f"a ParquetSink writes a Spark DataFrame or a Ray Dataset; "
                               f"the transform gave {type(out).__name__}")
