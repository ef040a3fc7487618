"""PartitionReplica: the Ray actor that owns one replica of one partition (a storage Log).

A thin shell: byte-level work is the Log's, the leader's replication decisions are
``LeaderState``'s (partition_state.py, pure), the follower's fetch loop is ``ReplicaFetcher``'s
(fetcher.py), the epoch -> start offset map is ``LeaderEpochCache``'s (epoch_cache.py). This
actor adds the role, leader-epoch and controller fencing, the high watermark and its
waiters, and upkeep (flush.ms, retention, compaction) run only when due (server/upkeep.py).
docs/replication.md is the contract.

Requests (all return plain data; errors are raised as actors.errors classes):
    produce(batch, acks, timeout_ms)                      leader -> ProduceResult
    fetch(offset, max_bytes, max_wait_ms, min_bytes)      leader -> FetchResult (below the HW)
    replica_fetch(follower_id, fetch_offset, leader_epoch, max_bytes, max_wait_ms)
                                                          leader -> ReplicaFetchResult
    offsets_for_leader_epoch(leader_epoch)                leader -> EpochEndOffset
    list_offsets(time_ms, max_offsets)                    leader -> [offsets] (the seed's API)
    become_leader / become_follower (..., zk_version)     from the broker, for the controller
    fence()                                               from the broker: ZooKeeper session lost
    channel_address()                                     the local channel serving produce
                                                          and fetch without a Ray call each
                                                          (server/replica_channel.py)
    state()                                               a dict for describe/tests

Cost: an RF=1 leader has no fetcher, no ISR thread and no HW checkpoint writes while it
runs (its HW is its LEO after every append); a follower has one fetch thread; a leader with
followers has one ISR thread that sleeps until a follower could fall out of sync.

Concurrency: a threaded actor; ``ray_actor_class`` puts follower fetches and consumer
fetches in concurrency groups of their own, so consumers long-polling never starve
followers, and neither starves produce. ``_lock`` guards role, epoch, ISR, HW and the
leader state; appends (leader and follower) and truncations happen under it so a role
change never interleaves with them; reads take no lock (the Log's reads are lock-free).
Waiters (acks=-1, long polls) wait on ``_changed`` (notified on append, HW move, ISR
change, role change); the ISR thread waits on ``_isr_wake``; both share ``_lock``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time

from storage import Log, LogConfig
from storage.checkpoint import read_offset, write_atomic, write_offset
from storage.records import iter_headers

from ..errors import (BrokerNotAvailableError, FencedLeaderEpochError, IllegalArgumentError,
                      InvalidUpdateVersionError, NotEnoughReplicasAfterAppendError,
                      NotEnoughReplicasError, NotLeaderForPartitionError,
                      OffsetOutOfRangeError, RequestTimedOutError, UnknownLeaderEpochError)
from ..protocol import (EpochEndOffset, FetchResult, ProduceResult, ReplicaFetchResult,
                        ReplicaRole, broker_actor_name, unwrap)
from .epoch_cache import LeaderEpochCache
from .fetcher import FetcherSettings, RayLeaderLink, ReplicaFetcher
from .list_offsets import list_offset_in_log
from .gcpause import freeze_startup_heap
from .threadnames import name_native_threads
from .partition_state import LeaderState
from .replica_channel import ReplicaChannelServer
from .upkeep import Upkeep

log = logging.getLogger(__name__)

HW_CHECKPOINT = "replication-offset-checkpoint"
ALTER_PARTITION_TIMEOUT_S = 30.0
ALTER_PARTITION_RETRY_S = 1.0        # after an unanswered or failed proposal
# Ray concurrency groups (threads) of a replica actor, besides the default one (produce,
# admin): followers' long polls, and consumers' long polls.
# Ray starts their threads with the actor, so they are kept small: a leader's followers
# (RF-1 of them, plus replicas being added by a reassignment) each park one replica_fetch.
CONCURRENCY_GROUPS = {"replication": 3, "fetch": 4}
METHOD_GROUPS = {"replica_fetch": "replication", "offsets_for_leader_epoch": "replication",
                 "fetch": "fetch"}


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    """``<broker data dir>/<topic>-<partition>``, as Kafka names partition directories."""
    return os.path.join(data_dir, f"{topic}-{partition}")


PARTITION_METADATA = "partition.metadata"


def read_partition_topic_id(path: str) -> str | None:
    """The topic id recorded in ``<path>/partition.metadata`` (None when absent or unreadable)."""
    try:
        with open(os.path.join(path, PARTITION_METADATA)) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "topic_id":
                    return value.strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def claim_partition_dir(path: str, topic_id: str) -> bool:
    """Make ``path`` belong to the topic incarnation ``topic_id`` (Kafka's partition.metadata).

    A directory left by an earlier topic of the same name (deleted while this broker was
    down, then created again) carries another id: its data is not this topic's, so it is
    removed before the log opens. A directory without the file (or a new one) is claimed.
    Returns True when stale data was removed.
    """
    found = read_partition_topic_id(path) if os.path.isdir(path) else None
    removed = False
    if found is not None and found != topic_id:
        log.warning("%s holds data of an earlier topic incarnation (topic id %s, now %s): "
                    "removing it", path, found, topic_id)
        shutil.rmtree(path)
        removed = True
    if found != topic_id:
        os.makedirs(path, exist_ok=True)
        write_atomic(os.path.join(path, PARTITION_METADATA),
                     f"version: 0\ntopic_id: {topic_id}\n")
    return removed


class PartitionReplica:
    """One replica of (topic, partition) on one broker. See the module docstring.

    Invariants: ``log_start_offset <= high_watermark <= log_end_offset`` (the HW is clamped
    after a truncation); a leader's HW never moves back while it leads; ``_leadership``
    changes whenever this replica stops acknowledging (demoted, fenced, stopped), and every
    acks=-1 wait that started under another value answers NotLeaderForPartitionError.
    """

    def __init__(self, topic: str, partition: int, broker_id: int, data_dir: str,
                 log_config: dict | None = None, min_insync_replicas: int = 1,
                 topic_id: str | None = None, *, namespace: str | None = None,
                 replication_config: dict | None = None, clock_ms=None):
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.path = partition_dir(data_dir, topic, partition)
        self.topic_id = topic_id
        self.min_insync_replicas = min_insync_replicas
        self.namespace = namespace
        conf = dict(replication_config or {})
        self.lag_time_max_ms = int(conf.get("replica.lag.time.max.ms", 30000))
        self.hw_checkpoint_interval_ms = int(
            conf.get("replica.high.watermark.checkpoint.interval.ms", 5000))
        self.fetcher_settings = FetcherSettings.from_config(conf)
        self._clock_ms = clock_ms or _monotonic_ms
        if topic_id is not None:
            claim_partition_dir(self.path, topic_id)
        self.log = Log.open(self.path, LogConfig.from_properties(log_config or {}))
        # an empty log has nothing to rebuild from: no file until the first epoch is assigned
        self.epoch_cache = LeaderEpochCache(
            self.path, self.log if self.log.log_end_offset > self.log.log_start_offset else None)
        # as Kafka does at load: the checkpoint may name epochs whose records a crash took
        # (written back before the log's tail was); they must not outlive the log
        self.epoch_cache.truncate_from_end(self.log.log_end_offset)
        self.role = ReplicaRole.NONE
        self.leader_epoch = -1
        self.leader_id = -1
        self.zk_version = -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list = []          # listen(): called where _changed is notified
        self._isr_wake = threading.Condition(self._lock)
        self._hw = self._clamp(read_offset(os.path.join(self.path, HW_CHECKPOINT)) or 0)
        self._hw_written = self._hw
        self._hw_written_ms = self._clock_ms()
        self._hw_file_lock = threading.Lock()
        self._fenced = False
        self._stopped = False
        self._leadership = 0           # bumped when this replica stops acknowledging
        self._generation = 0           # bumped on every role change: stale threads stop
        self._state: LeaderState | None = None
        self._isr_thread: threading.Thread | None = None
        self._isr_blocked = False      # a stale zk_version: wait for the next LeaderAndIsr
        self._isr_retry_at_ms = 0
        self._fetcher: ReplicaFetcher | None = None
        self._ack_waiters: list = []   # when_acked: (last, leadership, deadline, ms, cb)
        self._channel = None           # ReplicaChannelServer, started by channel_address
        self.alter_partition_fn = None  # tests may inject; else the Broker actor is called
        self.isr_proposals = 0
        # flush.ms, retention, compaction: a thread that sleeps until something is due
        self.upkeep = Upkeep(self.log, f"{topic}-{partition}")

    def ready(self) -> bool:
        freeze_startup_heap()       # once, when the replica is first asked (gcpause.py)
        return True

    def node_id(self) -> str:
        """The Ray node this replica (and its log) is on."""
        import ray
        return ray.get_runtime_context().get_node_id()

    def _clamp(self, offset: int) -> int:
        return max(min(offset, self.log.log_end_offset), self.log.log_start_offset)

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def is_leader(self) -> bool:
        return self.role == ReplicaRole.LEADER

    @property
    def config(self) -> LogConfig:
        return self.log.config

    # -- role changes (from the broker, on the controller's LeaderAndIsr) ------------------
    def become_leader(self, leader_epoch: int, isr: list[int], replicas: list[int],
                      zk_version: int = -1) -> dict:
        """Lead from now on: stamp ``leader_epoch`` on appends, start the epoch in the epoch
        cache at the LEO, start the HW at the checkpointed value (min the LEO), and (with
        followers) start the ISR thread."""
        fetcher = None
        with self._lock:
            self._check_epoch(leader_epoch)
            fetcher, self._fetcher = self._fetcher, None
            # acks=-1 waits of an earlier epoch of this leadership carry on: their records
            # stay in the log, and the HW passes them once the ISR has them
            same_term = (self.is_leader and not self._fenced and self._state is not None
                         and leader_epoch == self.leader_epoch)
            previous = self._state if same_term else None
            self._generation += 1
            leo = self.log.log_end_offset
            self.epoch_cache.assign(leader_epoch, leo)
            self.role = ReplicaRole.LEADER
            self.leader_epoch = leader_epoch
            self.leader_id = self.broker_id
            self.zk_version = zk_version
            self.replicas = list(replicas) or [self.broker_id]
            self._fenced = False
            self._isr_blocked = False
            self._isr_retry_at_ms = 0
            self._hw = self._clamp(self._hw)
            self._state = LeaderState(
                leader_id=self.broker_id, replicas=self.replicas, isr=list(isr),
                high_watermark=self._hw, epoch_start_offset=self._epoch_start(leader_epoch, leo),
                lag_time_max_ms=self.lag_time_max_ms, now_ms=self._clock_ms())
            if previous is not None:               # a repeated LeaderAndIsr: keep what we know
                self._state.adopt_followers(previous)
            self.isr = list(self._state.isr)
            self._move_hw_locked()
            if not self._state.single_replica:
                self._start_isr_thread_locked()
            self._notify_locked()
            self._isr_wake.notify_all()
        if fetcher is not None:
            fetcher.stop()
        return self.state()

    def become_follower(self, leader_id: int, leader_epoch: int, isr: list[int],
                        replicas: list[int], zk_version: int = -1, *,
                        fetch: bool = True) -> dict:
        """Follow ``leader_id`` in ``leader_epoch``: stop acknowledging, and (re)start the
        fetcher, which first truncates by leader epoch. A repeated request for the same
        leader and epoch keeps the running fetcher (and the generation).

        ``fetch=False``: the broker fetches for this replica (its fetcher thread per leader
        broker, server/broker_fetcher.py, over Kafka's Fetch): no thread here; the answer's
        ``generation`` is what the broker's calls (``apply_fetch``, ``truncate``...) carry.
        A replica used without a broker (tests, tools) fetches for itself over Ray."""
        old = None
        with self._lock:
            same_target = (self.role == ReplicaRole.FOLLOWER and not self._stopped
                           and (self.leader_id, self.leader_epoch) == (leader_id, leader_epoch))
            self._check_epoch(leader_epoch)
            if self.is_leader and not self._fenced:
                self._leadership += 1
            self.role = ReplicaRole.FOLLOWER
            self.leader_epoch = leader_epoch
            self.leader_id = leader_id
            self.zk_version = zk_version
            self.isr = list(isr)
            self.replicas = list(replicas)
            self._fenced = False
            self._state = None
            self._hw = self._clamp(self._hw)
            keep = ((self._fetcher is not None
                     and self._fetcher.targets(leader_id, leader_epoch))
                    or (not fetch and self._fetcher is None and same_target))
            if not keep:
                self._generation += 1
                old, self._fetcher = self._fetcher, None
                if (fetch and leader_id >= 0 and leader_id != self.broker_id
                        and not self._stopped):
                    self._fetcher = ReplicaFetcher(
                        self, RayLeaderLink(self._namespace(), self.topic, self.partition,
                                            leader_id),
                        follower_id=self.broker_id, leader_id=leader_id,
                        leader_epoch=leader_epoch, generation=self._generation,
                        settings=self.fetcher_settings, name=f"{self.topic}-{self.partition}")
                    self._fetcher.start()
            self._notify_locked()
            self._isr_wake.notify_all()
        if old is not None:
            old.stop()
        return self.state()

    def fence(self) -> dict:
        """The broker lost its ZooKeeper session: acknowledge nothing more (produce and pending
        acks=-1 waits answer NotLeaderForPartitionError) until the next LeaderAndIsr."""
        with self._lock:
            if not self._fenced:
                self._fenced = True
                self._leadership += 1
                log.warning("%s-%d on broker %d fenced: acknowledging nothing until the next "
                            "LeaderAndIsr", self.topic, self.partition, self.broker_id)
            self._notify_locked()
            self._isr_wake.notify_all()
        return self.state()

    def _check_epoch(self, leader_epoch: int) -> None:
        if leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic}-{self.partition}: leader epoch {leader_epoch} is older than "
                f"{self.leader_epoch}")

    def _epoch_start(self, epoch: int, default: int) -> int:
        for e, start in reversed(self.epoch_cache.entries):
            if e == epoch:
                return start
        return default

    def _namespace(self) -> str | None:
        if self.namespace is None:
            ray = sys.modules.get("ray")
            # (a module another thread is still importing has no is_initialized yet)
            if ray is not None and getattr(ray, "is_initialized", bool)():
                self.namespace = ray.get_runtime_context().namespace
        return self.namespace

    def update_config(self, log_config: dict, min_insync_replicas: int | None = None) -> None:
        """Apply new topic settings in place: requests in flight carry on, later ones (and
        the upkeep thread) see the new values."""
        config = LogConfig.from_properties(log_config or {})
        if config != self.log.config:
            self.log.update_config(config)
            self.upkeep.wake()
        if min_insync_replicas is not None:
            with self._lock:
                self.min_insync_replicas = int(min_insync_replicas)
                self._notify_locked()

    # -- leader: the high watermark ---------------------------------------------------------
    def _move_hw_locked(self) -> bool:
        """Recompute the leader's HW; wake waiters when it moved."""
        state = self._state
        if state is None or not state.update_high_watermark(self.log.log_end_offset):
            return False
        self._hw = state.high_watermark
        self._notify_locked()
        return True

    def _acking(self, leadership: int) -> bool:
        return (self.is_leader and not self._fenced and not self._stopped
                and self._leadership == leadership)

    def _require_leader(self) -> None:
        if not self.is_leader or self._fenced or self._stopped:
            why = " (fenced: its broker lost ZooKeeper)" if self._fenced else ""
            raise NotLeaderForPartitionError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition}"
                f"{why} (leader {self.leader_id}, epoch {self.leader_epoch})")

    # -- client requests ------------------------------------------------------------------
    def produce(self, batch, acks: int = -1, timeout_ms: int = 30000) -> ProduceResult:
        """Append as leader. acks=0/1 answer after the append; acks=-1 waits until the HW
        passes the batch (docs/replication.md lists every other answer)."""
        result, leadership = self.append_as_leader(batch, acks)
        if acks == -1 and not self.acked(result.last_offset):
            self.await_acks(result.last_offset, leadership, timeout_ms)
        return result

    def append_as_leader(self, batch, acks: int = -1) -> tuple[ProduceResult, int]:
        """The append half of ``produce``: (its answer, the leadership it was made under,
        for ``await_acks``). The local channel runs it in arrival order and waits apart."""
        if acks not in (0, 1, -1):
            raise IllegalArgumentError(f"acks must be 0, 1 or -1 (all), got {acks!r}")
        with self._lock:
            self._require_leader()
            if acks == -1 and len(self.isr) < self.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{self.topic}-{self.partition}: ISR {self.isr} is smaller than "
                    f"min.insync.replicas={self.min_insync_replicas}")
            appended = self.log.append(batch, leader_epoch=self.leader_epoch,
                                       validate_records=True)
            leadership = self._leadership
            if not self._move_hw_locked():
                self._notify_locked()        # followers' long polls: new data
        self.upkeep.after_append()
        # the timestamp the log stamped (LogAppendTime), never a second clock reading
        return ProduceResult(appended.base_offset, appended.last_offset,
                             appended.log_append_time_ms, self.log.log_start_offset), leadership

    def acked(self, last_offset: int) -> bool:
        """Has the HW passed ``last_offset`` (an acks=-1 produce may answer)?"""
        return self._hw > last_offset

    def await_acks(self, last_offset: int, leadership: int, timeout_ms: int) -> None:
        """The wait half of an acks=-1 ``produce`` (see ``append_as_leader``): until the HW
        passes ``last_offset``, or the typed error that ends the wait."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        with self._lock:
            while True:
                outcome = self._ack_outcome_locked(last_offset, leadership, deadline,
                                                   timeout_ms)
                if outcome is True:
                    return
                if outcome is not None:
                    raise outcome
                self._changed.wait(deadline - time.monotonic())

    def when_acked(self, last_offset: int, leadership: int, timeout_ms: int,
                   callback) -> float | None:
        """``await_acks`` without a thread: ``callback(True or the typed error)`` once the
        wait is over, from whichever thread moved the replica (under its lock: the
        callback must only hand the outcome on) or from this call; a wait past its
        deadline ends when ``expire_acks`` is next called. The deadline (monotonic s) of
        a wait that goes on, None when the callback already ran."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        with self._lock:
            outcome = self._ack_outcome_locked(last_offset, leadership, deadline, timeout_ms)
            if outcome is None:
                self._ack_waiters.append((last_offset, leadership, deadline, timeout_ms,
                                          callback))
                return deadline
        callback(outcome)
        return None

    def expire_acks(self) -> None:
        """End the ``when_acked`` waits past their deadline (RequestTimedOutError)."""
        with self._lock:
            self._settle_acks_locked()

    def _settle_acks_locked(self) -> None:
        waiting = []
        for w in self._ack_waiters:
            outcome = self._ack_outcome_locked(*w[:4])
            if outcome is None:
                waiting.append(w)
            else:
                w[4](outcome)
        self._ack_waiters = waiting

    def _notify_locked(self) -> None:
        """Something a waiter waits for changed (an append, the HW, the ISR, the role)."""
        self._changed.notify_all()
        for listener in self._listeners:
            listener()
        if self._ack_waiters:
            self._settle_acks_locked()

    def _ack_outcome_locked(self, last_offset: int, leadership: int, deadline: float,
                            timeout_ms: int):
        """True when an acks=-1 append up to ``last_offset`` may answer, the typed error
        that ends its wait, or None while it waits."""
        if not self._acking(leadership):
            return NotLeaderForPartitionError(
                f"{self.topic}-{self.partition}: broker {self.broker_id} stopped "
                f"leading while offset {last_offset} waited for its followers")
        if len(self.isr) < self.min_insync_replicas:
            return NotEnoughReplicasAfterAppendError(
                f"{self.topic}-{self.partition}: ISR {self.isr} shrank below "
                f"min.insync.replicas={self.min_insync_replicas}"
                + ("" if self._hw > last_offset else
                   f" while offset {last_offset} waited"))
        if self._hw > last_offset:
            return True
        if time.monotonic() >= deadline:
            return RequestTimedOutError(
                f"{self.topic}-{self.partition}: offset {last_offset} not replicated "
                f"to ISR {self.isr} within {timeout_ms} ms (HW {self._hw})")
        return None

    def fetch(self, offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
              min_bytes: int = 1, *, isolation: str = "high_watermark") -> FetchResult:
        """A consumer's fetch: whole batches below the HW. ``offset`` in (HW, LEO] answers
        empty, above the LEO raises OffsetOutOfRangeError. With ``max_wait_ms`` it waits
        until ``min_bytes`` are readable (or the wait is over): Kafka's long poll."""
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000
        while True:
            with self._lock:
                self._require_leader_for_reads()
                hw, leadership = self._hw, self._leadership
            result = self._read_for_consumer(offset, max_bytes, hw, isolation)
            if len(result.data) >= max(min_bytes, 1) or max_wait_ms <= 0:
                return result
            with self._lock:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return result
                if self._hw == hw and self._leadership == leadership and self.is_leader:
                    self._changed.wait(remaining)

    def _require_leader_for_reads(self) -> None:
        if not self.is_leader or self._stopped:
            self._require_leader()

    def _read_for_consumer(self, offset: int, max_bytes: int, hw: int,
                           isolation: str) -> FetchResult:
        leo = self.log.log_end_offset
        if isolation != "high_watermark":
            data = self.log.read(offset, max_bytes)
        elif isinstance(offset, int) and not isinstance(offset, bool) and hw <= offset <= leo:
            data = b""                            # not committed yet: empty, not an error
        else:
            data = self.log.read(offset, max_bytes, max_offset=hw)
        return FetchResult(data, hw, self.log.log_start_offset, leo)

    def list_offsets(self, time_ms: int, max_offsets: int = 1) -> list[int]:
        self._require_leader_for_reads()
        if time_ms == -1:
            # "latest" for a consumer is the high watermark, not records it may not read
            rest = self.log.offsets_before(-1, max_offsets)
            return [self.high_watermark] + [o for o in rest if o < self.high_watermark][
                :max_offsets - 1]
        return self.log.offsets_before(time_ms, max_offsets)

    def list_offset(self, timestamp: int, *, from_follower: bool = False
                    ) -> tuple[int, int]:
        """ListOffsets as this partition's leader answers it (list_offsets.py): (timestamp,
        offset) for -1 (latest: the HW; the log end offset ``from_follower``, a follower
        broker's request, as Kafka answers one with a replica id), -2 (earliest), -3 (the
        largest timestamp) or a timestamp."""
        self._require_leader_for_reads()
        if from_follower and timestamp == -1:
            return -1, self.log.log_end_offset
        return list_offset_in_log(self.log, timestamp, self.high_watermark)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        self._require_leader_for_reads()
        return self.log.offset_for_time(timestamp_ms)

    def count_records(self, start: int, end: int, max_batches: int | None = None
                      ) -> int | None:
        """How many committed records have offsets in [start, end) (``Log.count_records``:
        batch headers only; None past ``max_batches`` headers). OffsetOutOfRangeError for
        an end past the high watermark."""
        self._require_leader_for_reads()
        hw = self.high_watermark
        if isinstance(end, int) and not isinstance(end, bool) and end > hw:
            raise OffsetOutOfRangeError(f"end offset {end} is past the high watermark {hw}")
        return self.log.count_records(start, end, max_batches=max_batches)

    def file_ranges(self, start: int, end: int) -> dict:
        """For a reader on this replica's machine (a job's read task): where the committed
        records [start, min(end, HW)) are in the log's files, so it reads them with
        ``pread`` instead of through a broker. ``{"node_id", "high_watermark", "ranges":
        Log.file_ranges}``; the reader checks what it reads (CRC, framing, offsets) and
        fetches instead where the files no longer hold it. OffsetOutOfRangeError for a
        start outside [log start, HW]."""
        self._require_leader_for_reads()
        hw = self.high_watermark
        if not isinstance(start, int) or isinstance(start, bool) or \
                not self.log.log_start_offset <= start <= hw:
            raise OffsetOutOfRangeError(
                f"start offset {start!r} is outside [{self.log.log_start_offset}, {hw}]")
        if not isinstance(end, int) or isinstance(end, bool):
            raise OffsetOutOfRangeError(f"end offset must be an integer, got {end!r}")
        stop = max(min(end, hw), start)
        return {"node_id": self.node_id(), "high_watermark": hw,
                "ranges": self.log.file_ranges(start, stop) if start < stop else []}

    def delete_records_before(self, offset: int) -> int:
        self._require_leader()
        try:
            start = self.log.delete_records_before(offset)
            self.epoch_cache.truncate_from_start(start)
            return start
        finally:
            self.upkeep.wake()       # deleted segments are unlinked after file.delete.delay.ms

    # -- leader: requests from followers ------------------------------------------------------
    def replica_fetch(self, follower_id: int, fetch_offset: int, leader_epoch: int,
                      max_bytes: int = 1 << 20, max_wait_ms: int = 500) -> ReplicaFetchResult:
        """A follower's fetch: records its LEO (= ``fetch_offset``), then waits up to
        ``max_wait_ms`` for data past it, and answers batches up to the LEO with the HW.

        As Kafka's DelayedFetch for followers, a moved HW alone does not answer a waiting
        fetch: followers learn it with the next data or when the wait runs out. Answering
        it would double the calls per append (each follower's fetch that reports the
        append moves the HW, which would wake every waiting fetch once more) for a value
        only the follower's own checkpoint uses."""
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000
        with self._lock:
            self._record_follower_locked(follower_id, fetch_offset, leader_epoch)
            leadership = self._leadership
            while (self.log.log_end_offset <= fetch_offset
                   and self._leadership == leadership and self.is_leader):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            hw = self._hw
        data = self.log.read(fetch_offset, max_bytes)
        return ReplicaFetchResult(data, hw, self.log.log_start_offset,
                                  self.log.log_end_offset)

    def follower_fetched(self, follower_id: int, fetch_offset: int,
                         leader_epoch: int) -> None:
        """A follower fetched at ``fetch_offset`` (its LEO) and its broker answered it from
        the tail it caches (replica_channel's watch): record the position (HW, ISR), as
        ``replica_fetch`` does, without reading anything."""
        with self._lock:
            self._record_follower_locked(follower_id, fetch_offset, leader_epoch)

    def _record_follower_locked(self, follower_id: int, fetch_offset: int,
                                leader_epoch: int) -> None:
        self._check_follower_epoch(leader_epoch)
        leo = self.log.log_end_offset
        if fetch_offset > leo or fetch_offset < self.log.log_start_offset:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: follower {follower_id} fetch offset "
                f"{fetch_offset} is out of range [{self.log.log_start_offset}, {leo}]")
        state = self._state
        state.record_fetch(follower_id, fetch_offset, leo, self._clock_ms())
        self._move_hw_locked()
        if (state.pending_isr is None and follower_id not in state.isr
                and state.can_join(follower_id)):
            self._isr_wake.notify_all()           # an expansion to propose

    def tail(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole batches from ``offset`` (a batch boundary at or below the LEO), about
        ``max_bytes`` of them, and the offset after the last: what the local channel's
        watch pushes to the broker as the log grows. Not CRC-checked again: they were
        checked when appended."""
        last = self.log.last_appended(offset)
        if last is not None and len(last[0]) <= max_bytes:
            return last
        data = self.log.read(offset, max_bytes, check_crc=False)
        if not data:
            return b"", offset
        end = offset
        for h in iter_headers(data, check_crc=False):
            end = h.last_offset + 1
        return data, end

    def _check_follower_epoch(self, leader_epoch: int) -> None:
        if leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic}-{self.partition}: fetch in leader epoch {leader_epoch}, the "
                f"current one is {self.leader_epoch}")
        if leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{self.topic}-{self.partition}: leader epoch {leader_epoch} is newer than "
                f"{self.leader_epoch} (LeaderAndIsr not here yet)")
        if not self.is_leader or self._stopped or self._state is None:
            raise NotLeaderForPartitionError(
                f"broker {self.broker_id} does not lead {self.topic}-{self.partition} in "
                f"epoch {leader_epoch}")

    def offsets_for_leader_epoch(self, leader_epoch: int) -> EpochEndOffset:
        """KIP-101: the largest epoch <= ``leader_epoch`` this leader knows and where the
        next one starts (its LEO for the latest); (-1, -1) when unknown."""
        with self._lock:
            if not self.is_leader or self._stopped:
                self._require_leader()
            epoch, end = self.epoch_cache.end_offset_for(leader_epoch, self.log.log_end_offset)
        return EpochEndOffset(epoch, end)

    # -- leader: the ISR thread -----------------------------------------------------------
    def _start_isr_thread_locked(self) -> None:
        if self._isr_thread is not None and self._isr_thread.is_alive():
            return
        self._isr_thread = threading.Thread(
            target=self._isr_loop, daemon=True, name=f"isr-{self.topic}-{self.partition}")
        self._isr_thread.start()

    def _isr_loop(self) -> None:
        """While this replica leads with followers: propose shrinks when a follower falls out
        of sync and expansions when one catches up (one proposal in flight), and write the
        HW checkpoint when due. Sleeps until the next such moment."""
        while True:
            with self._lock:
                proposal = None
                while proposal is None:
                    state = self._state
                    if not self.is_leader or self._stopped or state is None \
                            or state.single_replica:
                        self._isr_thread = None
                        return
                    now = self._clock_ms()
                    leo = self.log.log_end_offset
                    if not self._fenced and not self._isr_blocked \
                            and now >= self._isr_retry_at_ms:
                        proposal = state.isr_change(leo, now)
                    if proposal is not None:
                        break
                    wait_ms = state.next_check_in_ms(leo, now)
                    if now < self._isr_retry_at_ms:
                        wait_ms = min(wait_ms, self._isr_retry_at_ms - now)
                    if self._hw != self._hw_written:
                        wait_ms = min(wait_ms, max(self._hw_written_ms
                                                   + self.hw_checkpoint_interval_ms - now, 0))
                        if wait_ms == 0:
                            break
                    self._isr_wake.wait(max(wait_ms, 1) / 1000)
                if proposal is not None:
                    state.propose(proposal)
                    request = (self.leader_epoch, list(state.pending_isr), self.zk_version)
            if proposal is None:
                self._checkpoint_hw()
                continue
            self._send_isr_proposal(state, *request)

    def _send_isr_proposal(self, state: LeaderState, epoch: int, new_isr: list[int],
                           zk_version: int) -> None:
        self.isr_proposals += 1
        log.info("%s-%d: leader %d proposes ISR %s (was %s, epoch %d, zk_version %d)",
                 self.topic, self.partition, self.broker_id, new_isr, state.isr, epoch,
                 zk_version)
        try:
            answer = self._alter_partition(epoch, new_isr, zk_version)
            error = None
        except Exception as exc:  # noqa: BLE001 - every refusal is handled below
            answer, error = None, unwrap(exc)
        with self._lock:
            if self._state is not state or self.leader_epoch != epoch:
                return                          # a newer LeaderAndIsr decided meanwhile
            if error is None:
                self._apply_isr_answer(state, answer, new_isr)
            elif isinstance(error, FencedLeaderEpochError):
                state.abandoned()
                log.warning("%s-%d: ISR change refused, leader %d is fenced (%s)",
                            self.topic, self.partition, self.broker_id, error)
                if not self._fenced:
                    self._fenced = True
                    self._leadership += 1
            elif isinstance(error, InvalidUpdateVersionError):
                state.abandoned()
                self._isr_blocked = True
                log.warning("%s-%d: ISR change refused, zk_version %d is stale (%s); waiting "
                            "for the next LeaderAndIsr", self.topic, self.partition,
                            zk_version, error)
            else:
                state.abandoned()
                self._isr_retry_at_ms = self._clock_ms() + int(ALTER_PARTITION_RETRY_S * 1000)
                log.warning("%s-%d: ISR change %s not made (alter_partition failed: %r); "
                            "retrying in %.0f s", self.topic, self.partition, new_isr, error,
                            ALTER_PARTITION_RETRY_S)
            self._notify_locked()

    def _apply_isr_answer(self, state: LeaderState, answer: dict, proposed: list[int]) -> None:
        if answer.get("leader") != self.broker_id or \
                answer.get("leader_epoch", self.leader_epoch) != self.leader_epoch:
            state.abandoned()
            return
        state.committed(list(answer["isr"]), self._clock_ms())
        if sorted(state.isr) != sorted(proposed):
            # the controller wrote another ISR than asked (e.g. it refused a replica it does
            # not see alive): do not ask again at once
            self._isr_retry_at_ms = self._clock_ms() + int(ALTER_PARTITION_RETRY_S * 1000)
        self.isr = list(state.isr)
        self.zk_version = int(answer.get("zk_version", self.zk_version))
        if not self._move_hw_locked():
            self._notify_locked()       # acks=all waits: the ISR may be below min now

    def _alter_partition(self, epoch: int, new_isr: list[int], zk_version: int) -> dict:
        if self.alter_partition_fn is not None:
            return self.alter_partition_fn(self.topic, self.partition, self.broker_id, epoch,
                                           new_isr, zk_version)
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            raise BrokerNotAvailableError("no Ray here: the broker cannot be reached")
        try:
            broker = ray.get_actor(broker_actor_name(self.broker_id),
                                   namespace=self._namespace())
        except ValueError:
            raise BrokerNotAvailableError(f"broker {self.broker_id} actor not found") from None
        ref = broker.alter_partition.remote(self.topic, self.partition, self.broker_id, epoch,
                                            new_isr, zk_version)
        return ray.get(ref, timeout=ALTER_PARTITION_TIMEOUT_S)

    # -- follower: what the fetcher asks (fetcher.FollowerSide) -------------------------------
    def _current(self, generation: int) -> bool:
        return (self._generation == generation and not self._stopped
                and self.role == ReplicaRole.FOLLOWER)

    def follower_position(self, generation: int) -> tuple[int, int] | None:
        with self._lock:
            if not self._current(generation):
                return None
            return self.log.log_end_offset, self._hw

    def latest_epoch(self, generation: int) -> int | None:
        with self._lock:
            return self.epoch_cache.latest_epoch if self._current(generation) else None

    def epoch_end_offset(self, generation: int, epoch: int) -> tuple[int, int] | None:
        with self._lock:
            if not self._current(generation):
                return None
            return self.epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    def truncate(self, generation: int, offset: int) -> bool:
        with self._lock:
            if not self._current(generation):
                return False
            if offset < self.log.log_end_offset:
                log.info("%s-%d: follower %d truncates from %d to %d", self.topic,
                         self.partition, self.broker_id, self.log.log_end_offset, offset)
                self.log.truncate_to(offset)
            self.epoch_cache.truncate_from_end(self.log.log_end_offset)
            self._hw = self._clamp(self._hw)
        self.upkeep.wake()
        return True

    def truncate_fully(self, generation: int, offset: int) -> bool:
        with self._lock:
            if not self._current(generation):
                return False
            self.log.truncate_fully_and_start_at(offset)
            self.epoch_cache.clear()
            self._hw = offset
        self.upkeep.wake()
        return True

    def apply_fetch(self, generation: int, fetch_offset: int,
                    result: ReplicaFetchResult) -> bool:
        """Append what the leader sent (its offsets and epochs kept), learn epochs from the
        batch headers and the HW from the answer (min our LEO)."""
        with self._lock:
            if not self._current(generation):
                return False
            if self.log.log_end_offset != fetch_offset:
                return True                      # raced with a truncation: fetch again
            if result.data:
                self.log.append(result.data, assign_offsets=False)
                for h in iter_headers(result.data, check_crc=False):
                    self.epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
            leo = self.log.log_end_offset
            if result.log_start_offset > self.log.log_start_offset \
                    and result.log_start_offset <= leo:
                start = self.log.delete_records_before(result.log_start_offset)
                self.epoch_cache.truncate_from_start(start)
            self._hw = self._clamp(min(result.high_watermark, leo))
            self._notify_locked()
        if result.data:
            self.upkeep.after_append()
        self._checkpoint_hw()
        return True

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoint_hw(self, force: bool = False) -> None:
        """Write replication-offset-checkpoint when the HW moved and the interval passed (or
        ``force``). RF=1 leaders never call this while running: their HW is their LEO."""
        with self._hw_file_lock:
            hw, now = self._hw, self._clock_ms()
            if hw == self._hw_written or (
                    not force and now - self._hw_written_ms < self.hw_checkpoint_interval_ms):
                return
            try:
                write_offset(os.path.join(self.path, HW_CHECKPOINT), hw)
            except OSError as exc:
                log.warning("%s-%d: cannot write %s: %s", self.topic, self.partition,
                            HW_CHECKPOINT, exc)
                self._hw_written_ms = now            # retried after the interval
                return
            self._hw_written, self._hw_written_ms = hw, now

    # -- describe ---------------------------------------------------------------------------
    def state(self) -> dict:
        with self._lock:
            followers = {}
            if self._state is not None:
                followers = {r: {"log_end_offset": f.log_end_offset,
                                 "last_caught_up_ms": f.last_caught_up_ms}
                             for r, f in self._state.followers.items()}
            return {
                "topic": self.topic, "partition": self.partition, "broker_id": self.broker_id,
                "role": self.role.value, "is_leader": self.is_leader,
                "leader": self.leader_id, "leader_epoch": self.leader_epoch,
                "isr": list(self.isr), "replicas": list(self.replicas),
                "zk_version": self.zk_version, "fenced": self._fenced,
                "pending_isr": (list(self._state.pending_isr) if self._state is not None
                                and self._state.pending_isr is not None else None),
                "followers": followers,
                "fetcher_alive": self._fetcher is not None and self._fetcher.alive,
                "generation": self._generation,
                "log_start_offset": self.log.log_start_offset,
                "log_end_offset": self.log.log_end_offset,
                "high_watermark": self._hw,
                "size_bytes": self.log.size_bytes, "topic_id": self.topic_id,
                "min_insync_replicas": self.min_insync_replicas,
                "isr_proposals": self.isr_proposals,
            }

    def epoch_entries(self) -> list[tuple[int, int]]:
        """The leader epoch cache's (epoch, start_offset) entries (tests, tools)."""
        return self.epoch_cache.entries

    # -- lifecycle --------------------------------------------------------------------------
    def watch_state(self) -> tuple[int, int, int, int]:
        """(high watermark, log end offset, log start offset, leadership) now;
        NotLeaderForPartitionError once the replica is stopped. ``leadership`` changes
        whenever this replica stops acknowledging (demoted, fenced)."""
        with self._lock:
            if self._stopped:
                raise NotLeaderForPartitionError(
                    f"{self.topic}-{self.partition} on broker {self.broker_id} stopped")
            return self._hw, self.log.log_end_offset, self.log.log_start_offset, \
                self._leadership

    def listen(self, listener):
        """Call ``listener()`` wherever ``_changed`` waiters are woken (appends, HW moves,
        role changes, stop), on the thread that made the change and under the
        replica's lock: it must only take note (set an event). A listener can skip the
        changes its own thread pushes anyway, where a waiter would be woken for each (a
        thread switch per append on a 2-core machine). Returns the function that removes
        it."""
        with self._lock:
            self._listeners = [*self._listeners, listener]

        def remove() -> None:
            with self._lock:
                self._listeners = [x for x in self._listeners if x is not listener]
        return remove

    def channel_address(self) -> str:
        """The address of this replica's local channel (server/replica_channel.py), started
        on the first ask: produce and fetch over a Unix socket, without a Ray call each."""
        with self._lock:
            if self._stopped:
                raise NotLeaderForPartitionError(
                    f"{self.topic}-{self.partition} on broker {self.broker_id} is stopped")
            if self._channel is None:
                self._channel = ReplicaChannelServer(self)
            return self._channel.address

    def upkeep_stats(self) -> dict:
        """How often the upkeep thread woke and ran (tests, benchmarks)."""
        return self.upkeep.stats()

    def stop(self, delete: bool = False) -> None:
        """Stop the fetcher and ISR thread, answer every waiter, write the HW checkpoint,
        close the log (and delete its directory when the topic is being deleted)."""
        with self._lock:
            self._stopped = True
            self._leadership += 1
            self._generation += 1
            fetcher, self._fetcher = self._fetcher, None
            channel, self._channel = self._channel, None
            self._notify_locked()
            self._isr_wake.notify_all()
        if channel is not None:
            channel.close()
        if fetcher is not None:
            fetcher.stop()
        self.upkeep.close()
        if not delete:
            self._checkpoint_hw(force=True)
        with self._lock:                 # no append or truncation can be in progress now
            self.log.close()
        if delete:
            shutil.rmtree(self.path, ignore_errors=True)


def ray_actor_class():
    """PartitionReplica as a Ray actor class whose methods run in their concurrency groups
    (``METHOD_GROUPS``, declared with ``CONCURRENCY_GROUPS``; Ray takes groups only at
    ``ray.remote``, not in ``.options``), so a
    consumer's long poll can never take the thread a follower's fetch needs, and neither
    can take produce's. Built once, lazily (Ray is imported only here)."""
    global _RAY_CLASS
    if _RAY_CLASS is None:
        import ray
        def __init__(self, *args, **kwargs):
            name_native_threads()   # the actor's threads named in top -H (threadnames.py)
            PartitionReplica.__init__(self, *args, **kwargs)
        attrs = {"__init__": __init__}
        for name, group in METHOD_GROUPS.items():
            attrs[name] = ray.method(concurrency_group=group)(_forward(name))
        cls = type("PartitionReplica", (PartitionReplica,), attrs)
        cls.__module__ = __name__
        _RAY_CLASS = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(cls)
    return _RAY_CLASS


_RAY_CLASS = None


def _forward(name: str):
    base = getattr(PartitionReplica, name)

    def method(self, *args, **kwargs):
        return base(self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method
