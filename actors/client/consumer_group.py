"""ConsumerGroup: the Ray way of consuming: N member actors of one consumer group, each
processing its partitions with a user function, committing after processing.

    group = cluster.consumer_group("billing", ["events"], num_members=3, process_fn=handle)
    group.scale(5)                  # more members: the group rebalances
    group.wait_for(lambda s: s["processed"] >= 10_000, timeout_s=60)
    group.stop()

Each member is a threaded Ray actor (``ConsumerGroupMember``) that attaches to the cluster
with the ``connect(namespace)`` the composition root hands it (``Cluster.connect``: client/
never imports actors.cluster) and runs one ``Consumer(group_id=...)`` with auto-commit
off, in a loop:

1. ``poll`` (which joins, rejoins and heartbeats as the group protocol says);
2. ``process_fn(batch)`` once per partition, with that partition's records of the poll,
   in offset order: a list of Records, or with ``batch_format="pyarrow"`` one
   ``pyarrow.Table`` (``Consumer.poll_columns``: decoded straight into columns, no Python
   object per record; the fast path) or with ``batch_format="pandas"`` that Table as a
   ``pandas.DataFrame``;
3. commit the next offset of every partition processed in step 2: after every poll by
   default, or with ``commit_interval_ms=N`` (a keyword of ``consumer_group``) at most every
   N ms, what was processed since the last commit; either way also before a partition is
   revoked (the rebalance listener) and when the member stops.

So every record is processed at least once (only processed offsets are ever committed). A
record is processed twice only when its member dies (or is fenced by a rebalance) between
steps 2 and 3: at most one poll's worth of records per moved partition
(``max_poll_records``), or with ``commit_interval_ms`` what was processed in that interval.
A commit refused because the group moved on (IllegalGeneration / RebalanceInProgress /
UnknownMemberId) is counted in ``commit_failures`` and the loop goes on: the next poll
rejoins, and the partition's new owner starts from the last committed offset.

``process_fn`` runs in the member's process; it must be picklable (Ray ships it). If it
raises, the member stops consuming (state "failed", the error in ``stats()``), leaves the
group so that its partitions move, and nothing past the failed batch is committed.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from typing import Callable

from ..errors import (InvalidConfigurationError, KafkaError, KafkaTimeoutError,
                      RebalanceInProgressError)

#: How long one poll of a member waits for records before it checks for a stop.
POLL_TIMEOUT_MS = 200
#: What process_fn is given (the ``batch_format`` keyword, as Ray Data's map_batches names it).
BATCH_FORMATS = ("records", "pyarrow", "pandas")
#: States of a member, as ``stats()`` reports them.
STARTING, RUNNING, STOPPED, FAILED = "starting", "running", "stopped", "failed"
_names = itertools.count()


class ConsumerGroupMember:
    """One member: a Consumer in the group and the process/commit loop on a thread. Made a
    Ray actor by ConsumerGroup; usable in-process too (tests). ``connect(namespace)``
    returns a cluster handle in the member's process (``Cluster.connect``)."""

    def __init__(self, namespace: str, group_id: str, topics: list[str], pattern: str | None,
                 process_fn: Callable, consumer_config: dict, name: str,
                 commit_interval_ms: int = 0, batch_format: str = "records", *,
                 connect: Callable):
        self.namespace = namespace
        self.connect = connect
        self.batch_format = batch_format
        self.group_id = group_id
        self.topics = list(topics)
        self.pattern = pattern
        self.process_fn = process_fn
        self.consumer_config = dict(consumer_config)
        self.name = name
        self.state = STARTING
        self.error: str | None = None
        self.processed = 0
        self.batches = 0
        #: time.time() when the first poll with records returned, and how many it returned;
        #: time.time() when the latest poll's records were processed (None: none yet)
        self.first_poll_at: float | None = None
        self.first_poll_records = 0
        self.last_processed_at: float | None = None
        self.commits = 0
        self.commit_failures = 0
        #: the rebalance listener's calls, oldest first: ("revoked" | "assigned", [tp])
        self.rebalances: list[tuple[str, list]] = []
        self.last_commit: dict[tuple[str, int], int] = {}
        self.commit_interval_s = commit_interval_ms / 1000
        #: processed, not committed yet: {tp: next offset} (the loop's thread only)
        self._pending: dict[tuple[str, int], int] = {}
        self._last_commit_at = time.monotonic()
        self._consumer = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control (actor methods) ---------------------------------------------------------------
    def start(self) -> str:
        """Join the group and start the loop; returns the member's name."""
        cluster = self.connect(self.namespace)
        config = {**self.consumer_config, "group_id": self.group_id,
                  "enable_auto_commit": False,
                  "client_id": self.consumer_config.get("client_id", self.name)}
        self._consumer = cluster.consumer(**config)
        self._consumer.subscribe(self.topics or (), pattern=self.pattern, listener=self)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"consumer-group-member-{self.name}")
        self._thread.start()
        return self.name

    def stop(self, timeout_s: float = 30.0) -> dict:
        """Finish the batch in hand, commit it, leave the group; returns ``stats()``."""
        self._stop.set()
        self._done.wait(timeout_s)
        return self.stats()

    def stats(self) -> dict:
        with self._lock:
            consumer = self._consumer
            assignment = sorted(consumer.assignment()) if consumer is not None and \
                self.state == RUNNING else []
            return {"name": self.name, "state": self.state, "error": self.error,
                    "processed": self.processed, "batches": self.batches,
                    "first_poll_at": self.first_poll_at,
                    "first_poll_records": self.first_poll_records,
                    "last_processed_at": self.last_processed_at,
                    "commits": self.commits, "commit_failures": self.commit_failures,
                    "assignment": assignment, "committed": dict(self.last_commit),
                    "rebalances": list(self.rebalances)}

    def ping(self) -> bool:
        return True

    # -- rebalance listener (poll's thread) --------------------------------------------------
    # What was processed of a partition and not committed yet (commit_interval_ms) is
    # committed before the partition goes; the listener also records the rebalances for
    # stats().
    def on_partitions_revoked(self, partitions) -> None:
        tps = [tuple(tp) for tp in partitions]
        going = {tp: self._pending.pop(tp) for tp in tps if tp in self._pending}
        if going and self._consumer is not None:
            self._commit(self._consumer, going)
        with self._lock:
            self.rebalances.append(("revoked", sorted(tps)))

    def on_partitions_assigned(self, partitions) -> None:
        with self._lock:
            self.rebalances.append(("assigned", sorted(tuple(tp) for tp in partitions)))

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        consumer = self._consumer
        pending = self._pending
        process_fn = self.process_fn
        columnar = self.batch_format != "records"
        pandas = self.batch_format == "pandas"
        self.state = RUNNING
        try:
            while not self._stop.is_set():
                if columnar:
                    polled = consumer.poll_columns(timeout_ms=POLL_TIMEOUT_MS)
                else:
                    polled = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
                if polled:
                    polled_at = time.time()
                    processed = 0
                    for tp in sorted(polled):
                        batch = polled[tp]
                        if columnar:
                            n = batch.num_rows
                            following = batch.column("offset")[-1].as_py() + 1
                            process_fn(batch.to_pandas() if pandas else batch)
                        else:
                            n = len(batch)
                            following = batch[-1].offset + 1
                            process_fn(batch)
                        pending[tp] = following
                        processed += n
                    with self._lock:
                        if self.first_poll_at is None:
                            self.first_poll_at, self.first_poll_records = polled_at, processed
                        self.processed += processed
                        self.batches += len(polled)
                        self.last_processed_at = time.time()
                if pending and time.monotonic() - self._last_commit_at >= \
                        self.commit_interval_s:
                    self._commit_pending(consumer)
        except Exception as exc:  # noqa: BLE001 - the user's function or the consumer failed
            with self._lock:
                self.state = FAILED
                self.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        finally:
            try:
                # what was processed (never the batch that failed) is committed
                self._commit_pending(consumer)
            except Exception:  # noqa: BLE001 - the consumer itself may be what failed
                pass
            try:
                consumer.close()        # auto-commit is off: only leaves the group
            except Exception:  # noqa: BLE001 - leaving is best effort; the session ends it
                pass
            with self._lock:
                if self.state != FAILED:
                    self.state = STOPPED
            self._done.set()

    def _commit_pending(self, consumer) -> None:
        self._last_commit_at = time.monotonic()
        if not self._pending:
            return
        offsets = {tp: off for tp, off in self._pending.items()
                   if tp in consumer.assignment()}
        self._pending.clear()
        if offsets and isinstance(self._commit(consumer, offsets), RebalanceInProgressError):
            # the group is completing a rebalance this member is part of: kept for the
            # next try (or the revoke of the partition), unless a newer offset of the
            # partition was processed meanwhile. (Fenced, the offsets are dropped: the
            # partition may have a new owner whose commits must not be overwritten.)
            for tp, offset in offsets.items():
                self._pending.setdefault(tp, offset)

    def _commit(self, consumer, offsets: dict) -> KafkaError | None:
        """Commit; the error if the coordinator refused (counted), else None."""
        try:
            consumer.commit(offsets)
        except KafkaError as exc:
            # fenced: the group moved on; the next poll rejoins, the new owner re-reads
            with self._lock:
                self.commit_failures += 1
            return exc
        with self._lock:
            self.commits += 1
            self.last_commit.update(offsets)
        return None


class ConsumerGroup:
    """Handle on the member actors of one group, made by ``Cluster.consumer_group``. See the
    module docstring. ``with cluster.consumer_group(...) as group:`` stops it on exit.
    ``connect(namespace)`` is how a member attaches to ``cluster`` from its own process
    (``Cluster.connect``, passed in by the composition root)."""

    def __init__(self, cluster, group_id: str, topics=(), num_members: int = 1,
                 process_fn: Callable | None = None, *, connect: Callable,
                 pattern: str | None = None, consumer_config: dict | None = None,
                 actor_options: dict | None = None, commit_interval_ms: int = 0,
                 batch_format: str = "records"):
        if not isinstance(group_id, str) or not group_id:
            raise InvalidConfigurationError(f"group_id must be a non-empty string, got "
                                            f"{group_id!r}")
        if isinstance(topics, str):
            topics = [topics]
        topics = list(topics or ())
        if not topics and pattern is None:
            raise InvalidConfigurationError("consumer_group needs topics or a pattern")
        if topics and pattern is not None:
            raise InvalidConfigurationError("consumer_group takes topics or a pattern, "
                                            "not both")
        if not callable(process_fn):
            raise InvalidConfigurationError(f"process_fn must be callable, got "
                                            f"{process_fn!r}")
        _check_members(num_members)
        consumer_config = dict(consumer_config or {})
        # not a Consumer setting: how often the members commit (0: after every poll);
        # taken from consumer_config too, where cluster.consumer_group's keywords land
        commit_interval_ms = consumer_config.pop("commit_interval_ms", commit_interval_ms)
        if (not isinstance(commit_interval_ms, (int, float)) or
                isinstance(commit_interval_ms, bool) or commit_interval_ms < 0):
            raise InvalidConfigurationError(f"commit_interval_ms must be a number >= 0, got "
                                            f"{commit_interval_ms!r}")
        batch_format = consumer_config.pop("batch_format", batch_format)
        if batch_format not in BATCH_FORMATS:
            raise InvalidConfigurationError(f"batch_format must be one of {BATCH_FORMATS}, "
                                            f"got {batch_format!r}")
        if batch_format != "records":
            for key in ("key_deserializer", "value_deserializer"):
                if consumer_config.get(key) is not None:
                    raise InvalidConfigurationError(
                        f"batch_format={batch_format!r} gives the raw bytes of keys and "
                        f"values; {key} applies to batch_format='records' only")
        for key in ("group_id", "enable_auto_commit"):
            if key in consumer_config:
                raise InvalidConfigurationError(
                    f"consumer_config may not set {key!r}: the group sets it")
        # fail here, in the caller, on a bad config, not later inside an actor
        from .consumer import DEFAULTS
        from .config import validate_config
        validate_config({**consumer_config, "group_id": group_id}, DEFAULTS, "consumer")
        self.cluster = cluster
        self.connect = connect
        self.group_id = group_id
        self.topics = topics
        self.pattern = pattern
        self.process_fn = process_fn
        self.consumer_config = consumer_config
        self.commit_interval_ms = commit_interval_ms
        self.batch_format = batch_format
        self.actor_options = {"num_cpus": 0, "max_concurrency": 4,
                              **(actor_options or {})}
        self._members: list[tuple[str, object]] = []     # (name, handle), oldest first
        self._stopped = False
        self.scale(num_members)

    # -- membership -----------------------------------------------------------------------------
    def scale(self, num_members: int, *, timeout_s: float = 60.0) -> None:
        """Grow or shrink to ``num_members``: new members join (the group rebalances), the
        newest members leave after finishing and committing their batch in hand."""
        import ray
        _check_members(num_members)
        if self._stopped:
            raise KafkaError(f"consumer group {self.group_id!r} was stopped")
        while len(self._members) > num_members:
            name, handle = self._members.pop()
            self._stop_member(handle, timeout_s)
        starting = []
        while len(self._members) + len(starting) < num_members:
            name = f"{self.group_id}-member-{next(_names)}"
            handle = ray.remote(ConsumerGroupMember).options(
                name=f"consumer-group-{name}", namespace=self.cluster.namespace,
                **self.actor_options).remote(
                self.cluster.namespace, self.group_id, self.topics, self.pattern,
                self.process_fn, self.consumer_config, name, self.commit_interval_ms,
                self.batch_format, connect=self.connect)
            starting.append((name, handle))
        if starting:
            try:
                ray.get([h.start.remote() for _, h in starting], timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                for _, h in starting:
                    ray.kill(h)
                raise KafkaTimeoutError(f"consumer group {self.group_id!r}: new members did "
                                        f"not start within {timeout_s:.0f}s") from None
            self._members.extend(starting)

    def members(self) -> list[str]:
        return [name for name, _ in self._members]

    def handle(self, name: str):
        """The actor of member ``name`` (for fault injection: ``ray.kill(group.handle(n))``)."""
        for member, handle in self._members:
            if member == name:
                return handle
        raise KeyError(name)

    def forget(self, name: str) -> None:
        """Drop a member that died (was killed) from this handle's list."""
        self._members = [(m, h) for m, h in self._members if m != name]

    # -- watching -------------------------------------------------------------------------------
    def stats(self, *, timeout_s: float = 30.0) -> dict:
        """``{"processed": total, "members": {name: member stats}}``; a dead member shows
        ``{"state": "dead"}``."""
        import ray
        members = {}
        refs = [(name, h.stats.remote()) for name, h in self._members]
        for name, ref in refs:
            try:
                members[name] = ray.get(ref, timeout=timeout_s)
            except ray.exceptions.RayActorError:
                members[name] = {"name": name, "state": "dead", "processed": 0,
                                 "assignment": []}
        return {"group_id": self.group_id,
                "processed": sum(m["processed"] for m in members.values()),
                "members": members}

    def wait_for(self, predicate: Callable[[dict], bool], *, timeout_s: float = 60.0,
                 interval_s: float = 0.2) -> dict:
        """Poll ``stats()`` until ``predicate(stats)`` holds; returns those stats or raises
        KafkaTimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if predicate(stats):
                return stats
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"consumer group {self.group_id!r}: condition not "
                                        f"met within {timeout_s:.0f}s; last stats {stats}")
            time.sleep(interval_s)

    # -- the end ----------------------------------------------------------------------------------
    def stop(self, *, timeout_s: float = 30.0) -> dict:
        """Every member finishes its batch, commits and leaves; returns the last stats."""
        if self._stopped:
            return {"group_id": self.group_id, "processed": 0, "members": {}}
        final = {}
        while self._members:
            name, handle = self._members.pop()
            final[name] = self._stop_member(handle, timeout_s)
        self._stopped = True
        return {"group_id": self.group_id,
                "processed": sum(m.get("processed", 0) for m in final.values()),
                "members": final}

    def _stop_member(self, handle, timeout_s: float) -> dict:
        import ray
        try:
            stats = ray.get(handle.stop.remote(timeout_s), timeout=timeout_s + 10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            stats = {"state": "dead", "processed": 0}
        ray.kill(handle)
        return stats

    def __enter__(self) -> "ConsumerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"ConsumerGroup({self.group_id!r}, topics={self.topics or self.pattern!r}, "
                f"members={len(self._members)})")


def _check_members(num_members) -> None:
    if not isinstance(num_members, int) or isinstance(num_members, bool) or num_members < 0:
        raise InvalidConfigurationError(f"num_members must be an integer >= 0, got "
                                        f"{num_members!r}")
