"""The seed's high-level stream API (seed 000 5.1, seed 004): ``create_message_streams`` and
``create_message_streams_by_filter`` on a Consumer.

- ``TopicFilter``: a whitelist or blacklist regex (Kafka's TopicFilter: commas mean "or",
  spaces and surrounding quotes are dropped, the whole topic name must match); internal
  topics (``__consumer_offsets``) are never matched.
- ``stream_mapping``: which stream each assigned partition feeds. Per topic, the
  consumer's partitions of that topic, sorted, are split over the topic's streams in
  contiguous ranges, the first ``len % n`` streams taking one more (seed 004's range over
  consumer threads: with the ``range`` assignor this is exactly the thread the group
  assigned the partition to; with the other assignors it is the same rule applied to what
  this consumer got). A partition feeds exactly one stream; the mapping is recomputed on
  every assignment change.
- ``StreamFeeder``: one background thread per Consumer (the seed's fetcher threads): it
  calls the consumer's poll under the consumer's poll lock, and puts each record in the
  queue of its partition's stream. A stream whose queue holds ``2 * max_poll_records``
  records has its partitions paused until it drains (the seed's bounded queues), so a
  slow stream does not hold up the others and memory stays bounded.
- ``MessageStream``: an iterator of Records over one queue. ``next`` waits for a record;
  with ``consumer_timeout_ms`` it raises StopIteration after that long without one (the
  stream can be iterated again later); after ``close`` it stops.

Commits keep the Consumer's meaning, counted at hand-out: a record counts as consumed when
a stream returns it (the seed's ConsumerIterator), not when it is queued; auto-commit,
``commit()``, the commit on revoke and the one on close write the next offset after the
last record handed out of each partition. On a rebalance the queued records of a partition
that leaves are dropped (its next owner reads them from the committed offset); a partition
that stays but moves to another stream is re-read from its first queued record.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time

from ..errors import IllegalArgumentError

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "__"
#: The feeder's poll: short, so that a stream's pause, a close, a rebalance are seen soon.
POLL_MS = 100
#: After an error in the feeder's poll, wait this long before the next one.
ERROR_BACKOFF_S = 0.5


def kafka_regex(expr: str) -> str:
    """Kafka's TopicFilter normalisation of a whitelist/blacklist: trimmed, ',' -> '|',
    spaces removed, surrounding quotes stripped."""
    if not isinstance(expr, str) or not expr.strip():
        raise IllegalArgumentError(f"a topic filter must be a non-empty regex, got {expr!r}")
    out = expr.strip().replace(",", "|").replace(" ", "")
    out = re.sub(r"""^["']+""", "", out)
    return re.sub(r"""["']+$""", "", out)


class TopicFilter:
    """A whitelist and/or blacklist (see the module docstring). With both, a topic must
    match the whitelist and not the blacklist; with neither, every non-internal topic."""

    def __init__(self, whitelist: str | None = None, blacklist: str | None = None):
        self.whitelist = None if whitelist is None else kafka_regex(whitelist)
        self.blacklist = None if blacklist is None else kafka_regex(blacklist)
        try:
            self._white = None if self.whitelist is None else re.compile(self.whitelist)
            self._black = None if self.blacklist is None else re.compile(self.blacklist)
        except re.error as exc:
            raise IllegalArgumentError(f"bad topic filter regex: {exc}") from None

    def matches(self, topic: str) -> bool:
        if topic.startswith(INTERNAL_PREFIX):
            return False
        if self._white is not None and not self._white.fullmatch(topic):
            return False
        return not (self._black is not None and self._black.fullmatch(topic))

    @property
    def pattern(self) -> str:
        """The seed's registry pattern: "white_list" or "black_list"."""
        return "black_list" if self.whitelist is None and self.blacklist is not None \
            else "white_list"

    @property
    def regex(self) -> str:
        """The regex the registry shows (the whitelist, else the blacklist, else ".*")."""
        if self.whitelist is not None:
            return self.whitelist
        return self.blacklist if self.blacklist is not None else ".*"

    def __repr__(self) -> str:
        return f"TopicFilter(whitelist={self.whitelist!r}, blacklist={self.blacklist!r})"


def check_stream_count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise IllegalArgumentError(f"{what}: the number of streams must be an int >= 1, "
                                   f"got {n!r}")
    return n


def stream_mapping(partitions, n_streams) -> dict[tuple[str, int], int]:
    """``{(topic, partition): stream index within its topic}`` for the given partitions;
    ``n_streams`` is an int (every topic) or ``{topic: n}``. See the module docstring."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(int(partition))
    out: dict[tuple[str, int], int] = {}
    for topic, parts in by_topic.items():
        n = n_streams if isinstance(n_streams, int) else n_streams.get(topic, 1)
        check_stream_count(n, f"topic {topic!r}")
        parts = sorted(set(parts))
        per, extra = divmod(len(parts), n)
        pos = 0
        for stream in range(n):
            size = per + (1 if stream < extra else 0)
            for p in parts[pos:pos + size]:
                out[(topic, p)] = stream
            pos += size
    return out


class MessageStream:
    """One stream: an iterator of Records (see the module docstring)."""

    def __init__(self, feeder: "StreamFeeder", index: int, topic: str | None, thread: int):
        self._feeder = feeder
        self.index = index          # the queue's number in the feeder
        self.topic = topic          # None for a filter's stream (it spans topics)
        self.thread = thread        # the seed's thread number within the topic

    def __iter__(self):
        return self

    def __next__(self):
        return self._feeder.next_record(self.index)

    def partitions(self) -> list[tuple[str, int]]:
        """The partitions feeding this stream now."""
        return self._feeder.partitions_of(self.index)

    def __repr__(self) -> str:
        what = self.topic if self.topic is not None else "filter"
        return f"MessageStream({what!r}, thread={self.thread})"


class StreamFeeder:
    """The fetch loop feeding the streams of one Consumer (see the module docstring).

    ``counts`` is ``{topic: n}`` (create_message_streams: one set of streams per topic) or
    an int (a filter's n streams, shared by every matching topic)."""

    def __init__(self, consumer, counts):
        self.consumer = consumer
        self.counts = counts
        if isinstance(counts, int):
            self.streams = [MessageStream(self, i, None, i) for i in range(counts)]
            self._base = None
        else:
            self.streams, self._base, index = [], {}, 0
            for topic in sorted(counts):
                self._base[topic] = index
                for i in range(counts[topic]):
                    self.streams.append(MessageStream(self, index, topic, i))
                    index += 1
        self._cond = threading.Condition(threading.Lock())
        self._queues = [collections.deque() for _ in self.streams]
        self._mapping: dict[tuple[str, int], int] = {}       # tp -> thread within topic
        self._marks: dict[tuple[str, int], int] = {}         # tp -> next offset handed out
        self._errors: dict[int, BaseException] = {}
        self._paused: set = set()
        self._stop = threading.Event()
        self._closed = False
        self.queue_max = max(2 * int(consumer.config["max_poll_records"]), 1)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"raykafka-streams-{id(consumer):x}")

    def start(self) -> "StreamFeeder":
        self._thread.start()
        return self

    # -- the mapping --------------------------------------------------------------------------
    def thread_of(self, tp) -> int:
        """The seed's consumer thread (stream number within the topic) ``tp`` feeds."""
        return self._mapping.get(tuple(tp), 0)

    def _queue_of(self, tp) -> int | None:
        thread = self._mapping.get(tp)
        if thread is None:
            return None
        if self._base is None:
            return thread
        base = self._base.get(tp[0])
        return None if base is None else base + thread

    def partitions_of(self, index: int) -> list[tuple[str, int]]:
        with self._cond:
            return sorted(tp for tp in self._mapping if self._queue_of(tp) == index)

    def remap(self, assigned) -> dict:
        """The consumer's assignment changed (its thread, under the poll lock): a new
        mapping; queued records of partitions that left are dropped, those of partitions
        that changed stream are dropped and re-read. Returns ``{tp: offset}`` to re-read
        from."""
        assigned = [tuple(tp) for tp in assigned]
        counts = self.counts if isinstance(self.counts, int) else {
            t: n for t, n in self.counts.items()}
        mapping = stream_mapping([tp for tp in assigned if isinstance(counts, int)
                                  or tp[0] in counts], counts)
        rewind: dict[tuple[str, int], int] = {}
        with self._cond:
            old = self._mapping
            moved = {tp for tp in old if mapping.get(tp) != old[tp]}
            self._mapping = mapping
            if moved:
                for q in self._queues:
                    kept = collections.deque()
                    for tp, rec in q:
                        if tp in moved:
                            if tp in mapping and tp not in rewind:
                                rewind[tp] = rec.offset
                        else:
                            kept.append((tp, rec))
                    q.clear()
                    q.extend(kept)
            for tp in list(self._marks):
                if tp not in mapping:
                    del self._marks[tp]
            self._paused &= set(mapping)
            self._cond.notify_all()
        return rewind

    # -- handing out ---------------------------------------------------------------------------
    def next_record(self, index: int):
        timeout_ms = self.consumer.config["consumer_timeout_ms"]
        deadline = None if timeout_ms in (None, float("inf")) else \
            time.monotonic() + max(timeout_ms, 0) / 1000
        with self._cond:
            while True:
                q = self._queues[index]
                if q:
                    tp, rec = q.popleft()
                    self._marks[tp] = rec.offset + 1
                    return rec
                err = self._errors.pop(index, None)
                if err is not None:
                    raise err
                if self._closed:
                    raise StopIteration
                wait_s = 1.0
                if deadline is not None:
                    wait_s = deadline - time.monotonic()
                    if wait_s <= 0:
                        raise StopIteration
                self._cond.wait(timeout=min(wait_s, 1.0))

    def take_marks(self) -> dict:
        """``{tp: next offset}`` handed out so far (the poll lock is held by the caller)."""
        with self._cond:
            return dict(self._marks)

    # -- the fetch loop --------------------------------------------------------------------------
    def _run(self) -> None:
        consumer = self.consumer
        while not self._stop.is_set():
            try:
                with consumer._poll_lock:
                    if self._stop.is_set() or consumer._closed:
                        break
                    self._apply_pauses()
                    batch = consumer._poll(timeout_ms=POLL_MS, track=False)
                    if batch:
                        self._distribute(batch)
            except Exception as exc:  # noqa: BLE001 - handed to the streams, then go on
                if self._stop.is_set() or consumer._closed:
                    break
                log.info("message streams of %r: %r", consumer.config.get("group_id"), exc)
                with self._cond:
                    for i in range(len(self._queues)):
                        self._errors[i] = exc
                    self._cond.notify_all()
                self._stop.wait(ERROR_BACKOFF_S)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _apply_pauses(self) -> None:
        with self._cond:
            full = {i for i, q in enumerate(self._queues) if len(q) >= self.queue_max}
            want = {tp for tp in self._mapping if self._queue_of(tp) in full}
        resume, pause = self._paused - want, want - self._paused
        if resume:
            self.consumer.resume(*resume)
        if pause:
            self.consumer.pause(*pause)
        self._paused = want

    def _distribute(self, batch: dict) -> None:
        with self._cond:
            for tp, records in batch.items():
                index = self._queue_of(tp)
                if index is None:
                    continue              # not ours any more (a rebalance in between)
                self._queues[index].extend((tp, r) for r in records)
            self._cond.notify_all()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop (it finishes its poll first); streams then stop."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)
        with self._cond:
            self._closed = True
            for q in self._queues:
                q.clear()
            self._cond.notify_all()
