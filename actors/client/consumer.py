"""Consumer (kafka-python names): fetches from the leader brokers over Kafka's protocol,
tracks positions.

This is the consumer without a group (``group_id=None``): partitions come from ``assign``,
or from ``subscribe`` (every partition of the matching topics, re-read as topics appear).
Positions start per ``auto_offset_reset``; an out-of-range position is reset the same way.

Fetching is Kafka's: ONE Fetch request per leader broker carries every assigned partition
it leads (``network.BrokerConnections``: a connection per broker kept for fetches, the
brokers found in the cached metadata, so a steady poll makes no Ray call), a long poll
with ``max_wait_ms`` = min(time left in the ``poll``, ``fetch_max_wait_ms``) and
``min_bytes`` = ``fetch_min_bytes``: the broker parks it in its purgatory until data is
committed (or the wait ends), and the consumer sees a record about one round trip after
its commit, without polling in a loop. At most one Fetch is in flight per broker, as in
Kafka's consumer: a broker answers a connection's requests in order, so a second one
would wait out the first one's long poll (it did: a record on a quiet partition waited
``fetch_max_wait_ms`` behind its neighbour's fetch). When a broker answers with data, its
next Fetch, for all its partitions, goes out before the answer is decoded (the Java
consumer's pipelining). ``poll`` returns as soon as any partition answers with records;
fetches still waiting stay in flight for the next ``poll``. A ``seek`` abandons its
partition's fetch in flight (its answer, for the old position, is never used; the
broker's next Fetch waits for it). Positions
start and reset with ListOffsets requests (``auto_offset_reset``; ``seek_to_*``;
``beginning_offsets``, ``end_offsets``, ``offsets_for_times``).

Retries follow ``retry.RetryPolicy``: ListOffsets (``position``, ``seek_to_*``) retries in
the call; a fetch that fails retriably (NOT_LEADER_OR_FOLLOWER and Kafka's other retriable
codes, a broken connection, no answer within ``request_timeout_ms`` past its wait, which
also closes the connection) invalidates the metadata and puts its partition in backoff, and
later fetches of that partition (in this poll or the next) retry it. A partition that
keeps failing past ``retries`` retries or ``default_api_timeout_ms`` makes ``poll`` raise
the last error, typed; so does any non-retriable error (an unknown topic or partition of an
``assign``ed partition included; a subscribed topic that disappears is dropped at the next
subscription refresh instead, which reads the topics with a Metadata request every
``metadata_max_age_ms``).
With a ``group_id`` and ``subscribe``, partitions come from the group instead
(``group.GroupMember``: JoinGroup/SyncGroup with the group's coordinator). A background
thread heartbeats every ``heartbeat_interval_ms`` independently of how long the caller
takes between polls (KIP-62); when the coordinator answers that the group rebalances, the
next ``poll`` rejoins: with an eager assignor (range, roundrobin) it first revokes every
partition (``on_partitions_revoked``, after an auto-commit), with cooperative-sticky only
the partitions that move (KIP-429), and it then *releases* them at the coordinator
without waiting for the answer (it goes on with what it kept; a release that failed makes
it rejoin, which gives the partitions out afresh). A partition that moves is handed over
inside the same generation (no second JoinGroup round): its new owner gets it in the SyncGroup answer but claims it from the coordinator
(``GroupMember.claim``, a long poll waited on next to the fetches) and fetches it only once
its old owner released it, after that owner's commit. New partitions start at the group's
committed offset (which the claim answers; else per ``auto_offset_reset``) and are
announced with ``on_partitions_assigned`` when claimed. A caller that does not poll for
``max_poll_interval_ms`` leaves the group (its partitions go to the others) and rejoins at
its next poll. ``commit`` writes what ``poll`` has returned (or the given offsets) through
the coordinator, refused (typed error) for a member of an older generation.

Offsets storage (seed 000 5.6): ``offsets_storage="kafka"`` commits to __consumer_offsets
through the coordinator; ``"zookeeper"`` writes ``/consumers/<g>/offsets/<t>/<p>`` (after the
coordinator has checked the member's generation: an older generation is refused the same
way); ``dual_commit=True`` writes both and reads the larger of the two (Kafka 0.8.2's
migration path). With a group, the consumer also keeps the seed's ZooKeeper registry
(``/consumers/<g>/ids/<consumer_id>``, ``/consumers/<g>/owners/<t>/<p>``) on its own
ZooKeeper session (``zk_consumer.ConsumerZk``; ``zookeeper_registry=False`` turns it off).

The seed's message streams (``create_message_streams``, ``create_message_streams_by_filter``)
are fed by one background fetch loop calling this consumer's poll (``streams.py``); such a
consumer is not polled or iterated directly.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import gc
import itertools
import operator
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

import logging
import threading

from .. import raycompat, wire
from ..errors import (CorruptRecordError, IllegalArgumentError, IllegalStateError,
                      InvalidConfigurationError, KafkaTimeoutError, OffsetOutOfRangeError,
                      UnknownTopicOrPartitionError)
from . import streams as _streams
from ..protocol import unwrap
from ..connection import SECURITY_DEFAULTS, ClientSecurity
from .config import positive_int, validate_config
from .group import GroupMember
from .retry import RetryPolicy, final_error
from .metadata import attach_network, client_metadata
from .network import (BrokerConnections, broker_error, fetch_body, known_broker_ids,
                      list_offsets_body, parse_fetch, parse_list_offsets, topic_metadata,
                      wait_answer)
from .simple_consumer import next_fetch_offset

ray = raycompat.ray
log = logging.getLogger(__name__)
#: How long poll waits on fetches at most before it looks whether the group needs it (a
#: rebalance the heartbeat heard, a background join that ended).
GROUP_CHECK_S = 0.05
#: A claim's long poll at the coordinator (a handover waiting for its old owner's release).
CLAIM_WAIT_MS = 5000
#: How long the subscription's Metadata request waits for one broker before asking the
#: next (a paused broker must not hold poll up for request_timeout_ms)
METADATA_WAIT_S = 2.0
_TOPIC_PARTITION = operator.itemgetter(0, 1)      # a Record's (topic, partition)
_OFFSET = operator.attrgetter("offset")

DEFAULTS = {
    "group_id": None,
    "auto_offset_reset": "latest",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "session_timeout_ms": 10000,
    "heartbeat_interval_ms": 3000,
    "max_poll_records": 500,
    "partition_assignment_strategy": "range",
    "max_poll_interval_ms": 300000,
    "group_instance_id": None,
    "offsets_storage": "kafka",       # or "zookeeper" (seed 000 5.6)
    "dual_commit": False,             # commit to both stores, read the max (migration)
    "zookeeper_registry": True,       # the seed's /consumers/<g>/ids and /owners mirror
    "key_deserializer": None,
    "value_deserializer": None,
    "fetch_max_bytes": 1 << 20,
    "fetch_max_wait_ms": 500,         # the leader holds a fetch up to this long (long poll)
    "fetch_min_bytes": 1,             # ... until this many bytes are readable
    # how often poll re-reads the topics for the subscription (a topic created later that
    # matches, a subscribed topic appearing or going): Kafka's metadata.max.age.ms, whose
    # default is 5 minutes; 1 s here. Re-reading at every poll asked every broker each time
    # (the member actors' poll spent 60% of its time there)
    "metadata_max_age_ms": 1000,
    "allow_auto_create_topics": True,  # a subscribed topic nobody made: brokers may make it
    "consumer_timeout_ms": float("inf"),
    "request_timeout_ms": 30000,
    "retries": 2147483647,            # bounded by default_api_timeout_ms, as Kafka's
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 1000,
    "default_api_timeout_ms": 60000,
    "client_id": "raykafka-consumer",
    **SECURITY_DEFAULTS,
}


class OffsetAndTimestamp(NamedTuple):
    """kafka-python's answer of ``offsets_for_times``: the offset and timestamp of the
    first record at or after the time asked."""

    offset: int
    timestamp: int


@dataclass
class _Backoff:
    """A partition whose fetches fail retriably: since when, how often, and when next."""

    started_s: float
    failed_attempts: int = 0
    retry_at_s: float = 0.0


@dataclass
class _InFlight:
    """A partition's fetch in flight: sent for ``offset`` in the Fetch request ``future``
    to ``broker_id`` (shared by the partitions of one request); the broker owes an answer
    by ``expires_s`` (its wait plus ``request_timeout_ms``), else it counts as timed out."""

    offset: int
    future: concurrent.futures.Future
    expires_s: float
    broker_id: int


class _BackgroundJoin:
    """A cooperative rejoin (``GroupMember.join``) on a thread of its own; ``done`` is set
    when it has an outcome, ``result()`` gives the assignment or raises its error."""

    def __init__(self, group, topics, owned, streams, joining: threading.Event,
                 joined: threading.Event):
        self.owned = list(owned)
        self.done = threading.Event()
        self._outcome = None
        self._error: BaseException | None = None

        def run():
            try:
                self._outcome = group.join(topics, owned=self.owned, streams=streams)
            except BaseException as exc:  # noqa: BLE001 - raised in poll's thread
                self._error = exc
            finally:
                joining.clear()
                joined.set()
                self.done.set()
        threading.Thread(target=run, daemon=True,
                         name=f"raykafka-join-{group.group_id}").start()

    def result(self) -> list:
        if self._error is not None:
            raise self._error
        return self._outcome


class Consumer:
    def __init__(self, cluster, *topics, **config):
        self.config = validate_config(config, DEFAULTS, "consumer")
        self._retry = RetryPolicy.from_config(self.config,
                                              deadline_key="default_api_timeout_ms")
        if self.config["auto_offset_reset"] not in ("earliest", "latest"):
            raise InvalidConfigurationError(
                f"auto_offset_reset must be 'earliest' or 'latest', got "
                f"{self.config['auto_offset_reset']!r}")
        positive_int(self.config, "fetch_max_wait_ms")
        positive_int(self.config, "fetch_min_bytes")
        self._metadata_max_age_s = positive_int(self.config, "metadata_max_age_ms") / 1000
        self._subscription_read_at: float | None = None     # None: re-read at next poll
        if self.config["offsets_storage"] not in ("kafka", "zookeeper"):
            raise InvalidConfigurationError(
                f"offsets_storage must be 'kafka' or 'zookeeper', got "
                f"{self.config['offsets_storage']!r}")
        for key in ("dual_commit", "zookeeper_registry", "allow_auto_create_topics"):
            if not isinstance(self.config[key], bool):
                raise InvalidConfigurationError(f"{key} must be a bool, got "
                                                f"{self.config[key]!r}")
        self.cluster = cluster
        self.metadata = client_metadata(cluster.metadata)
        self._network = BrokerConnections(self.metadata, client_id=self.config["client_id"],
                                          security=ClientSecurity.from_config(self.config))
        attach_network(self.metadata, self._network)
        self._assigned: list[tuple[str, int]] = []
        self._positions: dict[tuple[str, int], int] = {}
        self._subscription: set[str] = set()
        self._pattern = None
        self._buffer: list = []                  # Records (poll)
        self._chunks: list = []                  # ((topic, partition), Table) (poll_columns)
        self._columnar = False                   # which of the two fetches fill
        self._backoffs: dict[tuple[str, int], _Backoff] = {}
        self._inflight: dict[tuple[str, int], _InFlight] = {}
        # broker id -> the last Fetch sent to it: a broker answers a connection's requests
        # in order, so a second Fetch behind a long poll would wait it out; one at a time
        # per broker, as Kafka's consumer (its answer may be one nothing waits for any
        # more: a partition sought or paused meanwhile)
        self._fetching: dict[int, concurrent.futures.Future] = {}
        self._closed = False
        self._group: GroupMember | None = None
        self._group_topics: list[str] | None = None
        self._listener = None
        self._returned: dict[tuple[str, int], int] = {}     # next offset after what poll gave
        self._rejoin = threading.Event()
        self._left = threading.Event()
        self._joining = threading.Event()        # a join is under way: no beats
        # a rejoin is under way, revoking before its JoinGroup: beats go on (the session)
        # but a rebalance they report is the one being joined, not a new one
        self._revoking = threading.Event()
        self._join_ended = threading.Event()     # ... and is over: beat again at once
        self._join: _BackgroundJoin | None = None   # a cooperative rejoin under way
        # assigned by the group, not claimed yet (a handover waiting for its release)
        self._awaiting: list[tuple[str, int]] = []
        self._claim = None                        # group.Claim in flight for them
        self._releases: list = []                 # group.Pending: releases in flight
        self._last_poll = time.monotonic()
        self._last_auto_commit = time.monotonic()
        self._heartbeat_thread: threading.Thread | None = None
        self._paused: set = set()
        self._filter: _streams.TopicFilter | None = None
        self._streams: _streams.StreamFeeder | None = None
        self._poll_lock = threading.RLock()       # the stream feeder's poll vs commit/close
        self._zk = None                           # zk_consumer.ConsumerZk (groups only)
        self.consumer_id: str | None = None       # the seed's consumer id (groups only)
        if self.config["group_id"] is not None:
            self._setup_zookeeper()
            self._group = GroupMember(
                self.metadata, self.config["group_id"],
                strategy=self.config["partition_assignment_strategy"],
                session_timeout_ms=positive_int(self.config, "session_timeout_ms", 1),
                rebalance_timeout_ms=positive_int(self.config, "max_poll_interval_ms", 1),
                group_instance_id=self.config["group_instance_id"],
                client_id=self.config["client_id"],
                retry_backoff_ms=self.config["retry_backoff_ms"],
                offsets_storage=self.config["offsets_storage"],
                dual_commit=self.config["dual_commit"], zk=self._zk)
            positive_int(self.config, "heartbeat_interval_ms", 1)
        if topics:
            self.subscribe(topics)

    def _setup_zookeeper(self) -> None:
        """The consumer's own ZooKeeper session (opened on first use), for ZooKeeper
        offsets and the seed's registry."""
        from .zk_consumer import ConsumerZk, new_consumer_id
        group_id = self.config["group_id"]
        self.consumer_id = new_consumer_id(str(group_id))
        needs_zk = self.config["offsets_storage"] == "zookeeper" or self.config["dual_commit"]
        if not (needs_zk or self.config["zookeeper_registry"]):
            return
        zk_hosts = getattr(self.cluster, "zk_hosts", None)
        if not zk_hosts:
            if needs_zk:
                raise InvalidConfigurationError(
                    "offsets_storage='zookeeper' / dual_commit need the cluster's zk_hosts")
            return
        self._zk = ConsumerZk(zk_hosts, str(group_id), self.consumer_id,
                              session_timeout_ms=positive_int(self.config,
                                                              "session_timeout_ms", 1))

    def _registry_on(self) -> bool:
        return self._zk is not None and self.config["zookeeper_registry"]

    def _subscribed(self) -> bool:
        return bool(self._subscription or self._pattern is not None
                    or self._filter is not None)

    def _registration(self) -> tuple[dict, str]:
        """The seed's registry body: ({topic or regex: streams}, pattern)."""
        feeder = self._streams
        if self._filter is not None:
            return {self._filter.regex: feeder.counts if feeder else 1}, self._filter.pattern
        if self._pattern is not None:
            return {self._pattern.pattern: 1}, "white_list"
        counts = feeder.counts if feeder is not None and not isinstance(feeder.counts, int) \
            else {}
        return {t: counts.get(t, 1) for t in sorted(self._subscription)}, "static"

    def _join_streams(self) -> dict | None:
        """The stream count per topic sent in JoinGroup (the range assignor's threads)."""
        feeder = self._streams
        if feeder is None:
            return None
        if isinstance(feeder.counts, int):
            return {t: feeder.counts for t in self._group_topics or ()}
        return dict(feeder.counts)

    def _no_streams(self, what: str) -> None:
        if self._streams is not None:
            raise IllegalStateError(f"{what}: this consumer feeds message streams "
                                    f"(create_message_streams*); iterate the streams instead")

    # -- assignment -------------------------------------------------------------------------
    def subscribe(self, topics=(), pattern: str | None = None, listener=None) -> None:
        """Subscribe to ``topics`` or a regex ``pattern`` (topics created later that match
        are picked up). With a group, ``listener`` (an object with
        ``on_partitions_revoked(partitions)`` and ``on_partitions_assigned(partitions)``)
        is called around each rebalance, in ``poll``'s thread."""
        self._check_open()
        self._no_streams("subscribe()")
        if isinstance(topics, str):
            topics = [topics]
        if not topics and pattern is None:
            raise IllegalStateError("subscribe needs topics or a pattern")
        self._subscription = set(topics)
        self._pattern = re.compile(pattern) if pattern is not None else None
        self._listener = listener
        self._subscription_read_at = None
        if self._group is not None:
            self._group_topics = None
            self._rejoin.set()
            return
        self._refresh_subscription()

    def _matching_topics(self, topics: dict | None = None) -> list[str]:
        if topics is None:
            topics = self._read_topics()
        if self._filter is not None:
            return sorted(t for t in topics if self._filter.matches(t))
        return sorted(t for t in topics if t in self._subscription or
                      (self._pattern is not None and self._pattern.fullmatch(t)))

    def _refresh_subscription(self) -> None:
        if not self._subscribed():
            return
        self._subscription_read_at = time.monotonic()
        try:
            topics = self._read_topics()
        except Exception:
            self._subscription_read_at = None     # a refused name: every poll says it again
            raise
        if self._group is not None:
            matching = self._matching_topics(topics)
            if matching != self._group_topics:
                self._rejoin.set()        # a new matching topic: the group assigns it
            elif self._group.is_leader and self._group.assigned_counts is not None:
                # partitions added to a subscribed topic: the leader rejoins to assign them
                # (Kafka's ConsumerCoordinator: its assignment snapshot no longer matches)
                assigned = self._group.assigned_counts
                grown = [t for t in matching if len(topics[t]) != assigned.get(t)]
                for t in grown:
                    self.metadata.invalidate(t)       # the assignor counts from it
                if grown:
                    self._rejoin.set()
            return
        tps = [(t, p) for t in self._matching_topics(topics) for p in sorted(topics[t])]
        self._set_assignment(tps)

    def _read_topics(self) -> dict:
        """``{topic: [partitions]}`` of every topic, for the subscription: the client's
        metadata read afresh (a Metadata request to the brokers, Kafka's periodic refresh;
        Ray only when no listener answers), then the creation of the subscribed topics it
        lacks asked for."""
        topics = {t: sorted(int(p) for p in parts)
                  for t, parts in self.metadata.refresh().get("topics", {}).items()}
        timeout_s = min(self.config["request_timeout_ms"] / 1000, METADATA_WAIT_S)
        self._ask_to_create(sorted(self._subscription - topics.keys()), timeout_s)
        return topics

    def _ask_to_create(self, missing: list[str], timeout_s: float) -> None:
        """A Metadata request naming the subscribed topics the listing lacks, allowing
        their creation (``allow_auto_create_topics``, on by default as in Kafka's
        consumer): a broker with ``auto.create.topics.enable`` makes them, and a later
        refresh finds them with their leaders. Nothing is asked for a pattern (as Kafka's
        consumer, which lists topics for one). A name the brokers refuse or a principal
        they deny raises their typed error (InvalidTopicError,
        TopicAuthorizationFailedError) from ``poll`` as Kafka's consumer does (and from
        ``subscribe`` without a group, which reads its topics there)."""
        if not missing or not self.config["allow_auto_create_topics"]:
            return
        answer = topic_metadata(self._network, known_broker_ids(self.metadata), missing,
                                allow_auto_create=True, timeout_s=timeout_s)
        if answer is None:
            return
        broker_id, codes = answer
        quiet = (wire.NONE, wire.ERRORS_BY_NAME["LEADER_NOT_AVAILABLE"].code,
                 wire.ERRORS_BY_NAME["UNKNOWN_TOPIC_OR_PARTITION"].code)
        for topic in missing:
            code = codes.get(topic, wire.NONE)
            if code == wire.ERRORS_BY_NAME["LEADER_NOT_AVAILABLE"].code:
                log.info("subscribed topic %r is being created by broker %d on first use",
                         topic, broker_id)
            elif code not in quiet:
                raise broker_error(code, f"subscribed topic {topic!r}: broker {broker_id} "
                                         f"answered {wire.ERRORS[code].name}")

    # -- the group --------------------------------------------------------------------------------
    def _ensure_group(self) -> None:
        """Join, or rejoin after a rebalance, before fetching (poll's thread).

        A cooperative member that owns partitions rejoins in the background (KIP-429): the
        JoinGroup/SyncGroup run on a thread of their own while poll goes on fetching and
        returning the partitions it owns, and the outcome is applied at the first poll
        after it arrives (revoking and releasing what moves, claiming what comes: see
        ``_joined``). Everything else (a first join, eager assignors, a member that left)
        joins here, before fetching."""
        if self._group is None or not self._subscribed():
            return
        self._check_claim()
        self._check_releases()
        if self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat_loop, daemon=True,
                name=f"raykafka-heartbeat-{self.config['group_id']}")
            self._heartbeat_thread.start()
        rounds = 0
        while True:
            if self._join is not None:
                if not self._join.done.is_set():
                    return                   # still joining: keep fetching what we own
                join, self._join = self._join, None
                self._last_poll = time.monotonic()
                self._joined(join.owned, join.result())
                continue
            if not (self._rejoin.is_set() or self._left.is_set()
                    or not self._group.member_id):
                return
            rounds += 1
            if rounds > 10:
                raise IllegalStateError(f"group {self.config['group_id']!r} did not settle "
                                        f"in 10 rounds")
            background = (not self._group.eager and bool(self._assigned)
                          and bool(self._group.member_id) and not self._left.is_set())
            # from here until the JoinGroup, a rebalance the beats report is this one (an
            # eager member's revoke can take a while; a notice it heard again must not
            # start another rejoin once this one ends: a leader's rejoin is a rebalance)
            self._revoking.set()
            try:
                self._rejoin.clear()
                self._left.clear()
                self._awaiting, self._claim = [], None     # never ours: the rejoin decides
                owned = list(self._assigned)
                if self._group.eager and owned:
                    self._revoke(owned)
                    owned = []
                self._group_topics = self._matching_topics()
                if self._registry_on():          # the seed registers before it rebalances
                    self._zk.register(*self._registration())
                self._joining.set()
            except BaseException:
                self._rejoin.set()               # the next poll tries again
                raise
            finally:
                self._revoking.clear()
            if background:
                self._join = _BackgroundJoin(self._group, self._group_topics, owned,
                                             self._join_streams(), self._joining,
                                             self._join_ended)
                continue
            try:
                new = self._group.join(self._group_topics, owned=owned,
                                       streams=self._join_streams())
            finally:
                self._joining.clear()
                self._join_ended.set()
                self._last_poll = time.monotonic()
            self._joined(owned, new)

    def _joined(self, owned: list, new: list) -> None:
        """Apply a join's outcome: ``owned`` what the member owned when it joined, ``new``
        its assignment of the new generation. What it gives up (cooperative) is revoked,
        then released at the coordinator; what it gains is claimed: at once what nobody
        has to release, the rest when released (``_check_claim``)."""
        lost = [tp for tp in owned if tp not in new]
        if lost:
            self._revoke(lost)
            self._release(lost)           # committed: their new owners may fetch them
        kept = [tp for tp in new if tp in self._assigned]
        if kept != self._assigned:
            self._set_assignment(kept)
        self._awaiting = [tp for tp in new if tp not in self._assigned]
        self._claim = None
        if self._awaiting:
            self._send_claim(0)
            self._find_leaders(self._awaiting)
            self._check_claim(block=True)

    def _release(self, tps) -> None:
        """Release ``tps`` at the coordinator without waiting for its answer: poll goes
        on with the partitions it kept meanwhile (``_check_releases`` reads the answer)."""
        try:
            pending = self._group.release(tps)
        except Exception as exc:  # noqa: BLE001 - as a failed release's answer
            self._release_failed(f"release of {list(tps)}", self._group.generation, exc)
            return
        if pending is not None:
            pending.expected = len(tps)
            self._releases.append(pending)

    def _check_releases(self) -> None:
        """Read the releases that answered. One that failed (the coordinator moved or
        died, no answer) left its partitions pending, and their new owner waiting: the
        member rejoins, so the next generation gives them out afresh. One that freed fewer
        partitions than it gave up means the leader named no handover for them (a Kafka
        client leading with KIP-429's cooperative-sticky, whose second round gives them
        to their new owner): the member rejoins, as KIP-429 asks of a member that revoked
        partitions."""
        waiting = []
        for pending in self._releases:
            if not pending.ready():
                waiting.append(pending)
                continue
            exc = pending.error()
            if exc is not None:
                self._release_failed(pending.what, pending.generation, exc)
            elif pending.get() < getattr(pending, "expected", 0) \
                    and self._group.generation == pending.generation:
                log.info("%s in group %r: no handover named for them; rejoining (KIP-429)",
                         pending.what, self.config["group_id"])
                self._rejoin.set()
        self._releases = waiting

    def _release_failed(self, what: str, generation: int, exc: BaseException) -> None:
        log.warning("%s in group %r failed: %r; rejoining", what, self.config["group_id"],
                    unwrap(exc))
        if self._group.generation == generation:   # else a rejoin settled it already
            self._rejoin.set()

    def _find_leaders(self, tps) -> None:
        """Open the connections to the leader brokers of ``tps`` while their claim is out,
        so the first fetch after the claim does not wait for a connect (a traced handover
        waited 75 ms for a lookup). Never raises: a leader not found now is met again by
        the fetch."""
        for tp in tps:
            try:
                self._network.connection(self.metadata.leader_broker(*tp)[0], "fetch")
            except Exception:  # noqa: BLE001 - see above
                pass

    def _send_claim(self, wait_ms: int) -> None:
        """Claim what is awaited (a long poll of ``wait_ms`` at the coordinator)."""
        try:
            self._claim = self._group.claim(self._awaiting, wait_ms)
        except Exception as exc:  # noqa: BLE001 - as a failed claim's answer
            self._claim_failed(exc)

    def _check_claim(self, block: bool = False) -> None:
        """Apply the claim in flight if it answered (``block``: wait for it): the
        partitions it gives are assigned from their committed offsets and announced;
        the rest are claimed again (a long poll)."""
        claim = self._claim
        if claim is None or not (block or claim.ready()):
            return
        self._claim = None
        try:
            got = claim.result()
        except Exception as exc:  # noqa: BLE001 - rejoin (typed errors logged)
            self._claim_failed(exc)
            return
        ready = [tp for tp in self._awaiting if tp in got]
        if ready:
            for tp in ready:
                if got[tp] is not None:
                    self._positions[tp] = got[tp]
            self._awaiting = [tp for tp in self._awaiting if tp not in got]
            self._set_assignment(self._assigned + ready)
            if self._listener is not None:
                self._listener.on_partitions_assigned(list(ready))
        if self._awaiting:
            self._send_claim(CLAIM_WAIT_MS)

    def _claim_failed(self, exc: BaseException) -> None:
        """A claim that failed (the group rebalances, the coordinator moved): what it
        waited for was never this member's; it rejoins."""
        log.info("claim of %s in group %r: %r", self._awaiting, self.config["group_id"],
                 unwrap(exc))
        self._awaiting, self._claim = [], None
        self._rejoin.set()

    def _revoke(self, tps) -> None:
        """Give up ``tps``: commit what poll returned of them (auto-commit), tell the
        listener, stop fetching them."""
        if self.config["enable_auto_commit"]:
            self._commit_returned(tps, quiet=True)
        if self._listener is not None:
            self._listener.on_partitions_revoked(list(tps))
        self._set_assignment([tp for tp in self._assigned if tp not in tps])

    def _heartbeat_loop(self) -> None:
        """KIP-62: heartbeats from their own thread, whatever the caller does between
        polls; a caller silent for max_poll_interval_ms leaves the group."""
        interval_s = self.config["heartbeat_interval_ms"] / 1000
        max_poll_s = self.config["max_poll_interval_ms"] / 1000
        # a steady beat is a long poll at the coordinator (answered at once when a
        # rebalance starts); one while a rejoin is owed is plain, every 0.1 s at most
        wait_ms = min(self.config["heartbeat_interval_ms"],
                      self.config["session_timeout_ms"] // 2)
        while not self._closed:
            group = self._group
            steady = not (self._rejoin.is_set() or not group.member_id
                          or self._left.is_set() or self._joining.is_set()
                          or self._revoking.is_set())
            if not steady:
                # the first beat after a join goes out as soon as it ends: a rebalance
                # that starts right after is heard at once, not a sleep later
                self._join_ended.wait(min(interval_s, 0.1))
                self._join_ended.clear()
                if (self._closed or not group.member_id or self._left.is_set()
                        or self._joining.is_set()):
                    continue
            try:
                if time.monotonic() - self._last_poll > max_poll_s:
                    log.warning("consumer of group %r: no poll for %.0fs "
                                "(max_poll_interval_ms): leaving the group",
                                self.config["group_id"], time.monotonic() - self._last_poll)
                    group.leave()
                    self._left.set()
                    continue
                if not group.heartbeat(wait_ms if steady else 0) \
                        and not self._joining.is_set() \
                        and not self._revoking.is_set():  # a rejoin under way settles it
                    self._rejoin.set()
            except Exception as exc:  # noqa: BLE001 - the coordinator moved: next beat
                log.info("heartbeat of group %r: %r", self.config["group_id"], exc)
                time.sleep(min(interval_s, 0.5))

    def assign(self, partitions) -> None:
        self._check_open()
        self._no_streams("assign()")
        if self._group is not None and self._group.member_id:
            raise IllegalStateError("assign() after subscribe() in a group: unsubscribe first")
        tps = []
        for tp in partitions:
            topic, partition = tp
            if partition not in self.metadata.partitions_for(topic):
                raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
            tps.append((topic, partition))
        self._subscription, self._pattern = set(), None
        self._set_assignment(tps)

    def _set_assignment(self, tps) -> None:
        self._assigned = list(tps)
        self._positions = {tp: off for tp, off in self._positions.items() if tp in tps}
        self._backoffs = {tp: b for tp, b in self._backoffs.items() if tp in tps}
        self._returned = {tp: o for tp, o in self._returned.items() if tp in tps}
        self._inflight = {tp: f for tp, f in self._inflight.items() if tp in tps}
        self._buffer = [r for r in self._buffer if (r.topic, r.partition) in self._positions]
        self._chunks = [c for c in self._chunks if c[0] in self._positions]
        self._paused &= set(self._assigned)
        self._assignment_changed()

    def _assignment_changed(self) -> None:
        """Tell the streams (new mapping; re-read what moved between streams) and the
        ZooKeeper owners registry."""
        if self._streams is not None:
            for tp, offset in self._streams.remap(self._assigned).items():
                self.seek(tp, offset)
        if self._registry_on():
            if self._group is not None and self._subscribed():
                thread = self._streams.thread_of if self._streams is not None else (lambda _tp: 0)
                from .zk_consumer import owner_id
                self._zk.set_owners({tp: owner_id(self.consumer_id, thread(tp))
                                     for tp in self._assigned})
            else:
                self._zk.set_owners({})

    def assignment(self) -> set:
        return set(self._assigned)

    def unsubscribe(self) -> None:
        self._no_streams("unsubscribe()")
        if self._group is not None and self._group.member_id:
            self._revoke(list(self._assigned))
            self._group.leave()
        self._awaiting, self._claim = [], None
        self._subscription, self._pattern = set(), None
        self._set_assignment([])
        if self._registry_on():
            self._zk.unregister()

    # -- pausing (kafka-python's names) -----------------------------------------------------------
    def pause(self, *partitions) -> None:
        """Stop fetching ``partitions`` (they stay assigned) until ``resume``."""
        for tp in partitions:
            tp = tuple(tp)
            self._require_assigned(tp)
            self._paused.add(tp)
            self._unfetch({tp})

    def _unfetch(self, tps: set) -> None:
        """Forget what was fetched of ``tps`` and not returned yet (their fetches in flight,
        their buffered records or Tables), each partition re-positioned at its first
        buffered offset, so that it is fetched again from there."""
        first: dict = {}
        for r in self._buffer:
            if (r.topic, r.partition) in tps:
                first.setdefault((r.topic, r.partition), r.offset)
        for tp, table in self._chunks:
            if tp in tps:
                first.setdefault(tp, table.column("offset")[0].as_py())
        if first:
            self._buffer = [r for r in self._buffer if (r.topic, r.partition) not in first]
            self._chunks = [c for c in self._chunks if c[0] not in first]
            self._positions.update(first)
        for tp in tps:
            self._inflight.pop(tp, None)      # its answer would be for a later position

    def resume(self, *partitions) -> None:
        for tp in partitions:
            self._paused.discard(tuple(tp))

    def paused(self) -> set:
        return set(self._paused)

    # -- positions ----------------------------------------------------------------------------
    def _list_offset(self, tp, time_ms: int) -> int:
        """The partition leader's offset for ``time_ms`` (-1 latest, -2 earliest), retried
        per the policy."""
        return self._list_offsets([tp], time_ms)[tp][1]

    def _list_offsets(self, tps, timestamp, *, retried: bool = True,
                      left_s: float | None = None) -> dict:
        """ListOffsets for ``tps`` at ``timestamp`` (an int, or ``{tp: int}``): one request
        per leader broker, each waited on for ``request_timeout_ms`` at most (``left_s``,
        when less); a partition that fails retriably asked again alone per the policy
        (``retried``; else its error raised): ``{tp: (timestamp, offset)}``."""
        stamp = timestamp if isinstance(timestamp, dict) else dict.fromkeys(tps, timestamp)
        timeout_s = self.config["request_timeout_ms"] / 1000
        if left_s is not None:
            timeout_s = max(min(timeout_s, left_s), 0.001)
        groups: dict[int, list] = {}
        out, again = {}, []
        for tp in tps:
            try:
                groups.setdefault(self.metadata.leader_broker(*tp)[0], []).append(tp)
            except Exception as exc:  # noqa: BLE001 - retried alone below
                if not retried or not self._retry.retriable(exc):
                    raise final_error(exc) from None
                again.append(tp)
        futures = {}
        for broker_id, group in groups.items():
            body = list_offsets_body([(t, p, stamp[(t, p)]) for t, p in group])
            try:
                futures[broker_id] = self._network.send(broker_id, wire.LIST_OFFSETS, body)
            except Exception as exc:  # noqa: BLE001 - retried alone below
                if not retried or not self._retry.retriable(exc):
                    raise final_error(exc) from None
                again.extend(group)
        for broker_id, future in futures.items():
            try:
                answers = parse_list_offsets(wait_answer(
                    self._network, broker_id, future, timeout_s, "list_offsets"))
            except Exception as exc:  # noqa: BLE001 - retried alone below
                if not retried or not self._retry.retriable(exc):
                    raise final_error(exc) from None
                answers = {}
            for tp in groups[broker_id]:
                answer = answers.get(tp)
                if isinstance(answer, BaseException) or answer is None:
                    if answer is not None and (not retried or
                                               not self._retry.retriable(answer)):
                        raise final_error(answer) from None
                    again.append(tp)
                else:
                    out[tp] = answer
        if again:
            self.metadata.invalidate()
        for tp in again:
            def attempt(left_s, tp=tp):
                return self._list_offsets([tp], stamp[tp], retried=False, left_s=left_s)[tp]

            out[tp] = self._retry.call(
                attempt, on_retry=lambda _exc, t=tp[0]: self.metadata.invalidate(t),
                what=f"list_offsets of {tp[0]}-{tp[1]}")
        return out

    def beginning_offsets(self, partitions) -> dict:
        """``{(topic, partition): log start offset}`` (ListOffsets -2, kafka-python's)."""
        tps = [tuple(tp) for tp in partitions]
        return {tp: o for tp, (_, o) in self._list_offsets(tps, -2).items()}

    def end_offsets(self, partitions) -> dict:
        """``{(topic, partition): high watermark}`` (ListOffsets -1, kafka-python's)."""
        tps = [tuple(tp) for tp in partitions]
        return {tp: o for tp, (_, o) in self._list_offsets(tps, -1).items()}

    def offsets_for_times(self, timestamps: dict) -> dict:
        """``{(topic, partition): ms}`` -> ``{(topic, partition): OffsetAndTimestamp or
        None}``: the first record at or after each time (None when there is none),
        kafka-python's ``offsets_for_times`` (ListOffsets with the times)."""
        stamps = {tuple(tp): int(ts) for tp, ts in timestamps.items()}
        for tp, ts in stamps.items():
            if ts < 0:
                raise IllegalArgumentError(f"the time of {tp} must be >= 0, got {ts}")
        answers = self._list_offsets(list(stamps), stamps)
        return {tp: None if offset < 0 else OffsetAndTimestamp(offset, ts)
                for tp, (ts, offset) in answers.items()}

    def position(self, tp) -> int:
        tp = tuple(tp)
        self._require_assigned(tp)
        if tp not in self._positions and self._group is not None:
            committed = self._group.committed([tp])
            if tp in committed:
                self._positions[tp] = committed[tp]
        if tp not in self._positions:
            reset = -2 if self.config["auto_offset_reset"] == "earliest" else -1
            self._positions[tp] = self._list_offset(tp, reset)
        return self._positions[tp]

    def _start_position(self, tp) -> int:
        """A position for ``tp``, which has none: the group's committed offset, else one
        list_offsets attempt per ``auto_offset_reset`` (its error raised, not retried)."""
        if self._group is not None:
            committed = self._group.committed([tp])
            if tp in committed:
                self._positions[tp] = committed[tp]
                return committed[tp]
        reset = -2 if self.config["auto_offset_reset"] == "earliest" else -1
        offset = self._list_offsets([tp], reset, retried=False)[tp][1]
        self._positions[tp] = offset
        return offset

    def seek(self, tp, offset: int) -> None:
        tp = tuple(tp)
        self._require_assigned(tp)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OffsetOutOfRangeError(f"seek offset must be an integer >= 0, got {offset!r}")
        self._positions[tp] = offset
        self._inflight.pop(tp, None)     # its answer would be for the old position
        self._buffer = [r for r in self._buffer if (r.topic, r.partition) != tp]
        self._chunks = [c for c in self._chunks if c[0] != tp]

    def seek_to_beginning(self, *tps) -> None:
        for tp in tps or self._assigned:
            self.seek(tp, self._list_offset(tuple(tp), -2))

    def seek_to_end(self, *tps) -> None:
        for tp in tps or self._assigned:
            self.seek(tp, self._list_offset(tuple(tp), -1))

    def _require_assigned(self, tp) -> None:
        if tp not in self._assigned:
            raise IllegalStateError(f"partition {tp} is not assigned to this consumer")

    # -- commits (groups only) ----------------------------------------------------------------
    def commit(self, offsets=None) -> None:
        """Commit ``{(topic, partition): offset}`` (the next offset to read), or with None
        everything ``poll`` has returned so far. Refused with the coordinator's typed error
        (IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError) when this
        member's generation is no longer current: nothing is committed then."""
        self._check_open()
        if self._group is None:
            raise IllegalStateError("commit needs a group_id")
        with self._poll_lock:
            if offsets is None:
                self._take_stream_marks()
                offsets = {tp: off for tp, off in self._returned.items()
                           if tp in self._assigned}
            offsets = {tuple(tp): off for tp, off in dict(offsets).items()}
            if offsets:
                self._group.commit(offsets)

    def _take_stream_marks(self) -> None:
        """With message streams, what was handed out counts as returned (seed 004's
        ConsumerIterator), not what was queued."""
        if self._streams is None:
            return
        for tp, offset in self._streams.take_marks().items():
            if tp in self._assigned:
                self._returned[tp] = offset

    def _commit_returned(self, tps, quiet: bool = False) -> None:
        self._take_stream_marks()
        offsets = {tp: self._returned[tp] for tp in tps if tp in self._returned}
        if not offsets:
            return
        try:
            self._group.commit(offsets)
            self._last_auto_commit = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - an auto-commit is best effort
            if not quiet:
                raise
            log.info("auto-commit of group %r failed: %r", self.config["group_id"], exc)

    def committed(self, tp):
        """The group's committed offset of ``tp`` (None: nothing committed, or no group)."""
        if self._group is None:
            return None
        return self._group.committed([tuple(tp)]).get(tuple(tp))

    # -- fetching -------------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """Records fetched since the last poll, at most ``max_records``; when there are
        none, fetch rounds (long polls at the leaders) until some arrive or ``timeout_ms``
        is over. See the module docstring."""
        self._no_streams("poll()")
        return self._poll(timeout_ms, max_records)

    def poll_columns(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """``poll``, with each partition's records as one ``pyarrow.Table`` instead of a
        list of Records: ``{(topic, partition): Table}``, columns ``topic`` string,
        ``partition`` int32, ``offset`` int64, ``timestamp`` int64 (ms),
        ``timestamp_type`` int32 (0 CreateTime, 1 LogAppendTime), ``key`` and ``value``
        binary (null for null), ``headers`` list<struct<key: string, value: binary>>, in
        offset order. Fetched batches are decoded straight into columns (CRCs checked as
        poll does), with no Python object per record: the fast way to hand records to
        vectorised code. Positions, commits, rebalances and ``max_records`` work as with
        ``poll``. key/value deserializers do not apply (the columns are the bytes), so a
        consumer configured with one is refused (InvalidConfigurationError). Switching
        between ``poll`` and ``poll_columns`` re-fetches what was fetched and not returned
        yet; nothing is skipped."""
        self._no_streams("poll_columns()")
        for key in ("key_deserializer", "value_deserializer"):
            if self.config[key] is not None:
                raise InvalidConfigurationError(
                    f"poll_columns gives the raw bytes of keys and values; this consumer has "
                    f"a {key} (it applies to poll() only)")
        return self._poll(timeout_ms, max_records, columnar=True)

    def _use_format(self, columnar: bool) -> None:
        """Fill Tables (``columnar``) or Records from now on. What is buffered in the other
        form is dropped and its partitions re-positioned at its first offset, so the next
        fetches read it again in the new form."""
        if columnar == self._columnar:
            return
        if columnar:
            # before the first poll_columns joins the group, not in the first decode with
            # partitions assigned (imported there, pyarrow.compute made a group's members
            # start their partitions up to 0.1 s apart on the 2-core machine)
            import pyarrow.compute  # noqa: F401
        self._columnar = columnar
        self._unfetch({(r.topic, r.partition) for r in self._buffer}
                      | {tp for tp, _ in self._chunks})

    def _group_waits(self) -> bool:
        """The group needs poll's thread: a rejoin is owed or a background join ended."""
        if self._group is None or not self._subscribed():
            return False
        if self._join is not None:
            return self._join.done.is_set()
        if self._claim is not None and self._claim.ready():
            return True
        return self._rejoin.is_set() or self._left.is_set()

    def _has_data(self) -> bool:
        return bool(self._chunks) if self._columnar else bool(self._buffer)

    def _poll(self, timeout_ms: int = 0, max_records: int | None = None, *,
              track: bool = True, columnar: bool = False) -> dict:
        """poll; with ``track`` False (the stream feeder) what it returns does not count as
        returned: the streams count what they hand out. ``columnar``: poll_columns."""
        self._check_open()
        self._use_format(columnar)
        self._last_poll = time.monotonic()
        if self._subscribed() and (
                self._subscription_read_at is None or
                time.monotonic() - self._subscription_read_at >= self._metadata_max_age_s):
            self._refresh_subscription()
        self._ensure_group()
        if (self._group is not None and self.config["enable_auto_commit"]
                and (time.monotonic() - self._last_auto_commit) * 1000
                >= self.config["auto_commit_interval_ms"]):
            self._commit_returned(list(self._assigned), quiet=True)
            self._last_auto_commit = time.monotonic()
        limit = max_records or self.config["max_poll_records"]
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while not self._has_data():
            if self._group_waits():
                # a rebalance started (the heartbeat heard it) or a background join ended:
                # joined now, not after this poll's timeout
                self._ensure_group()
            left_ms = int(max(deadline - time.monotonic(), 0) * 1000)
            self._fetch_round(min(left_ms, self.config["fetch_max_wait_ms"]), deadline)
            if self._has_data() or time.monotonic() >= deadline:
                break
            if not self._inflight:
                # every partition in backoff, nothing assigned, or a leader that answers
                # at once (no long poll): do not spin (a claim's answer ends the wait)
                pause = min(0.05, max(deadline - time.monotonic(), 0))
                if self._claim is not None:
                    ray.wait([self._claim.ref], timeout=pause)
                else:
                    time.sleep(pause)
        if columnar:
            return self._take_columns(limit, track)
        if len(self._buffer) <= limit:
            taken, self._buffer = self._buffer, []
        else:     # cut in place: a memmove, not a copy of the rest with a refcount each
            taken = self._buffer[:limit]
            del self._buffer[:limit]
        out: dict = {}
        # the buffer holds runs of one partition's records in offset order (one per fetch
        # answer): grouped run by run, not record by record
        for tp, run in itertools.groupby(taken, key=_TOPIC_PARTITION):
            records = out.get(tp)
            if records is None:
                out[tp] = records = list(run)
            else:
                records.extend(run)
            if track:
                self._returned[tp] = records[-1].offset + 1
        self._last_poll = time.monotonic()
        return out

    def _take_columns(self, limit: int, track: bool) -> dict:
        """poll_columns' answer: up to ``limit`` rows of the buffered Tables, a partition's
        Tables concatenated in offset order; the rest of a Table cut at ``limit`` stays."""
        import pyarrow as pa
        parts: dict = {}
        rows = 0
        while self._chunks and rows < limit:
            tp, table = self._chunks[0]
            if rows + table.num_rows > limit:
                keep = limit - rows
                self._chunks[0] = (tp, table.slice(keep))
                table = table.slice(0, keep)
            else:
                self._chunks.pop(0)
            parts.setdefault(tp, []).append(table)
            rows += table.num_rows
        out = {tp: tables[0] if len(tables) == 1 else pa.concat_tables(tables)
               for tp, tables in parts.items()}
        if track:
            for tp, table in out.items():
                self._returned[tp] = table.column("offset")[-1].as_py() + 1
        self._last_poll = time.monotonic()
        return out

    def _fetch_round(self, max_wait_ms: int, deadline_s: float) -> None:
        """Send a Fetch (waiting up to ``max_wait_ms`` at the broker) to every leader
        broker of an assigned partition that has none in flight and is not in backoff;
        then take answers until one brings records, none is left in flight, or
        ``deadline_s`` passed and every fetch sent in this round has answered (older ones,
        sent with a longer wait by an earlier poll, stay in flight)."""
        sent = self._send_fetches(max_wait_ms)
        while self._inflight and not self._has_data():
            if self._group_waits():
                return                       # poll joins first; the fetches stay in flight
            now = time.monotonic()
            late = {}
            for tp, f in list(self._inflight.items()):
                if now >= f.expires_s:
                    late[f.broker_id] = f
                    del self._inflight[tp]
                    self._failed(tp, KafkaTimeoutError(
                        f"fetch of {tp[0]}-{tp[1]} did not answer in time"))
            for broker_id in late:           # a broker that does not answer: reconnect
                self._network.drop(broker_id, "fetch")
            owed = [f.expires_s for tp, f in self._inflight.items() if tp in sent]
            if not owed and now >= deadline_s:
                return
            if not self._inflight:
                return
            until = min(min(f.expires_s for f in self._inflight.values()),
                        max(deadline_s, min(owed, default=deadline_s)))
            wait_s = max(until - now, 0)
            if self._group is not None:
                wait_s = min(wait_s, GROUP_CHECK_S)   # a rebalance is not waited out
            futures = {f.future for f in self._inflight.values()}
            done, _ = concurrent.futures.wait(futures, timeout=wait_s,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                tps = [tp for tp, f in self._inflight.items() if f.future is future]
                sent.difference_update(tps)
                self._take_answer(future, tps)

    def _send_fetches(self, max_wait_ms: int) -> set:
        """One Fetch per leader broker, for the assigned partitions it leads without a
        fetch in flight, not paused and not in backoff; the partitions sent to."""
        now = time.monotonic()
        asked: dict[tuple, int] = {}
        for tp in self._assigned:
            if tp in self._inflight or tp in self._paused:
                continue
            backoff = self._backoffs.get(tp)
            if backoff is not None and backoff.retry_at_s > now:
                continue
            try:
                offset = self._positions.get(tp)
                if offset is None:
                    # one attempt, not position()'s retries: a partition whose leader is
                    # gone must not hold up poll (the group's rejoin, the other
                    # partitions) for default_api_timeout_ms; it is retried from backoff
                    offset = self._start_position(tp)
            except Exception as exc:  # noqa: BLE001 - retried or raised by _failed
                self._failed(tp, exc)
                continue
            asked[tp] = offset
        return set(self._fetch_at(asked, max_wait_ms, install=True))

    def _busy_brokers(self) -> set:
        """The brokers with a Fetch of ours still unanswered (or answered and not taken)."""
        busy = {f.broker_id for f in self._inflight.values()}
        busy.update(b for b, future in self._fetching.items() if not future.done())
        return busy

    def _fetch_at(self, asked: dict, max_wait_ms: int, *, install: bool) -> dict:
        """Fetch ``asked`` (``{tp: offset}``): one request per leader broker, a long poll
        of ``max_wait_ms``; ``{tp: _InFlight}`` of the partitions sent (installed as in
        flight with ``install``). A partition that cannot be sent is put in backoff
        (``install``) or left out. With ``install`` (a round), a broker with a Fetch in
        flight is left out: its partitions go with its next one (``_take_answer``)."""
        busy = self._busy_brokers() if install else ()
        groups: dict[int, list] = {}
        for tp, offset in asked.items():
            try:
                groups.setdefault(self.metadata.leader_broker(*tp)[0], []).append(tp)
            except Exception as exc:  # noqa: BLE001 - retried or raised by _failed
                if install:
                    self._failed(tp, exc)
        out = {}
        expires_s = time.monotonic() + (self.config["request_timeout_ms"] + max_wait_ms) / 1000
        partition_max_bytes = self.config["fetch_max_bytes"]
        for broker_id, tps in groups.items():
            if broker_id in busy:
                continue
            body = fetch_body([(t, p, asked[(t, p)], partition_max_bytes) for t, p in tps],
                              max_wait_ms=max_wait_ms,
                              min_bytes=self.config["fetch_min_bytes"])
            try:
                future = self._network.send(broker_id, wire.FETCH, body, purpose="fetch")
            except Exception as exc:  # noqa: BLE001 - retried or raised by _failed
                if install:
                    for tp in tps:
                        self._failed(tp, exc)
                continue
            self._fetching[broker_id] = future
            for tp in tps:
                out[tp] = _InFlight(asked[tp], future, expires_s, broker_id)
        if install:
            self._inflight.update(out)
        return out

    def _take_answer(self, future, tps) -> None:
        """A broker's answer to the Fetch ``future`` for ``tps``: when a partition brought
        data, the broker's next Fetch goes out first (it reads while this process decodes:
        the Java consumer's pipelining), for ALL its partitions that can be fetched (the
        quiet ones too: a later Fetch would queue behind this long poll on the
        connection); then each partition's part is taken."""
        fetches = {tp: self._inflight.pop(tp) for tp in tps}
        try:
            outcomes = parse_fetch(future.result())
        except Exception as exc:  # noqa: BLE001 - every partition of it failed so
            outcomes = {None: exc}
        error = outcomes.pop(None, None)
        ahead_at: dict = {}
        parts: dict = {}
        moved = False
        for tp, fetch in fetches.items():
            outcome = outcomes.get(tp, error)
            if outcome is None:
                outcome = KafkaTimeoutError(f"the answer to a fetch of {tp[0]}-{tp[1]} "
                                            f"left it out")
            parts[tp] = outcome
            if (isinstance(outcome, BaseException) or self._positions.get(tp) != fetch.offset
                    or tp in self._paused):
                continue
            try:
                following = next_fetch_offset(outcome.data)
            except CorruptRecordError:
                continue                           # the decode reports it
            if following is not None and following > fetch.offset:
                ahead_at[tp] = following
                moved = True
            else:
                ahead_at[tp] = fetch.offset        # nothing new: asked again as it was
        held: dict = {}
        if moved:
            held = self._fetchable_at(next(iter(fetches.values())).broker_id, fetches)
            ahead = self._prefetch({**ahead_at, **held})
        else:
            # a long poll that ran out (or a broker that answers at once): the next round
            # asks again, paced by poll
            ahead = {}
        for tp in held:
            if tp in ahead:
                self._inflight[tp] = ahead[tp]
        for tp, fetch in fetches.items():
            self._take(tp, fetch, parts[tp], ahead.get(tp))

    def _fetchable_at(self, broker_id: int, besides) -> dict:
        """``{tp: position}`` of the assigned partitions led by ``broker_id`` that a round
        would fetch now (none in flight, not paused, not in backoff, position known),
        except ``besides``: held back while the broker had a Fetch in flight."""
        if len(self._inflight) + len(besides) >= len(self._assigned):
            return {}                              # every partition is in flight or answered
        now = time.monotonic()
        out = {}
        for tp in self._assigned:
            if tp in besides or tp in self._inflight or tp in self._paused:
                continue
            backoff = self._backoffs.get(tp)
            position = self._positions.get(tp)
            if position is None or (backoff is not None and backoff.retry_at_s > now):
                continue
            try:
                if self.metadata.leader_broker(*tp)[0] != broker_id:
                    continue
            except Exception:  # noqa: BLE001 - the round meets it again
                continue
            out[tp] = position
        return out

    def _prefetch(self, asked: dict) -> dict:
        """The next fetches of ``asked`` (``{tp: offset}``, long polls), sent while the
        answer in hand is decoded and handed out: ``{tp: _InFlight}``, installed only once
        the decode put the partition at that offset (``_advance``). Never raises: a
        failure is met again by the next round's own fetch."""
        if not asked:
            return {}
        try:
            return self._fetch_at(asked, self.config["fetch_max_wait_ms"], install=False)
        except Exception:  # noqa: BLE001 - see above
            return {}

    def _take(self, tp, fetch: _InFlight, outcome, ahead: _InFlight | None) -> None:
        """``outcome`` (a FetchOutcome, or the error) of ``fetch``: its records into the
        buffer, or its error handled (an out-of-range position reset, the rest per the
        retry policy)."""
        from storage.records import decode_records

        from ..types import Record
        if isinstance(outcome, BaseException):
            if isinstance(outcome, OffsetOutOfRangeError):
                self._positions.pop(tp, None)  # reset per auto_offset_reset next time
                self._backoffs.pop(tp, None)
                return
            self._failed(tp, outcome)
            return
        self._backoffs.pop(tp, None)
        if self._positions.get(tp) != fetch.offset:
            return                             # sought elsewhere meanwhile
        data = outcome.data
        # the next fetch went out before this answer was decoded; it stands only once the
        # decode succeeded (a corrupt batch must not be skipped by a position moved past it)
        try:
            following = next_fetch_offset(data)
        except CorruptRecordError:
            following = None                   # the decode below reports it
            ahead = None
        if self._columnar:
            table = _columns(tp, fetch.offset, data)
            if table.num_rows:
                self._chunks.append((tp, table))
                self._advance(tp, table.column("offset")[-1].as_py() + 1, following, ahead)
            else:
                self._advance(tp, fetch.offset, following, ahead)
            return
        recs = decode_records(data)
        # the first batch may start before the offset asked for (offsets increase)
        first = bisect.bisect_left(recs, fetch.offset, key=_OFFSET)
        if first:
            recs = recs[first:]
        if not recs:
            # batches with no record at or after the offset (an empty answer: no move)
            self._advance(tp, fetch.offset, following, ahead)
            return
        kd, vd = self.config["key_deserializer"], self.config["value_deserializer"]
        if kd is None and vd is None:
            # Record = (topic, partition) + the decoded record's fields, built in C (a
            # Python call per record cost the member actors' poll a sixth of its time),
            # with the cyclic GC paused as decode_records does: its passes over thousands
            # of new tuples (which cannot form cycles) took two thirds of the building
            paused = gc.isenabled()
            gc.disable()
            try:
                self._buffer.extend(map(tuple.__new__, itertools.repeat(Record),
                                        map((tp[0], tp[1]).__add__, recs)))
            finally:
                if paused:
                    gc.enable()
        else:
            for r in recs:
                self._buffer.append(Record(
                    tp[0], tp[1], r.offset, r.timestamp, r.timestamp_type,
                    kd(r.key) if kd and r.key is not None else r.key,
                    vd(r.value) if vd and r.value is not None else r.value, r.headers))
        self._advance(tp, recs[-1].offset + 1, following, ahead)

    def _advance(self, tp, after_last: int, following: int | None,
                 ahead: _InFlight | None) -> None:
        """The position of ``tp`` after a decoded answer: past its batches (``following``,
        from their headers: records a compaction removed from a batch's end are not asked
        for again), or past its last record (``after_last``) where the headers did not
        say; the prefetch ``ahead`` (sent for ``following``) stands if that is the
        position."""
        position = following if following is not None and following >= after_last \
            else after_last
        self._positions[tp] = position
        if ahead is not None and ahead.offset == position:
            self._inflight[tp] = ahead

    def _failed(self, tp, exc: BaseException) -> None:
        """A fetch of ``tp`` failed with ``exc`` (as raised): put the partition in backoff
        and refresh the metadata, or raise the typed error when the policy gives up."""
        if (isinstance(exc, UnknownTopicOrPartitionError) and not self._retry.retriable(exc)
                and self._subscribed()):
            self._subscription_read_at = None
            return   # a subscribed topic went away: the next poll's refresh drops it
        now = time.monotonic()
        backoff = self._backoffs.get(tp) or _Backoff(started_s=now)
        backoff.failed_attempts += 1
        wait_s = self._retry.next_backoff_s(exc, failed_attempts=backoff.failed_attempts,
                                            started_s=backoff.started_s)
        if wait_s is None:
            self._backoffs.pop(tp, None)
            raise final_error(exc, f"fetch of {tp[0]}-{tp[1]}") from None
        backoff.retry_at_s = now + wait_s
        self._backoffs[tp] = backoff
        self.metadata.invalidate(tp[0])

    def __iter__(self):
        idle_since = time.monotonic()
        while not self._closed:
            batch = self.poll(timeout_ms=100)
            if not batch:
                if (time.monotonic() - idle_since) * 1000 >= self.config["consumer_timeout_ms"]:
                    return
                continue
            idle_since = time.monotonic()
            for recs in batch.values():
                yield from recs

    # -- the seed's stream API ---------------------------------------------------------------------
    def create_message_streams(self, topic_count_map) -> dict:
        """``{topic: n}`` -> ``{topic: [n streams]}``: this consumer subscribes to the
        topics (in its group, the range assignor gives it n threads per topic) and each
        partition it is assigned feeds exactly one of its topic's streams (see
        ``streams.py``). Once per consumer; not with ``subscribe``/``assign``/``poll``."""
        if not isinstance(topic_count_map, dict) or not topic_count_map:
            raise IllegalArgumentError("create_message_streams needs {topic: number of "
                                       "streams}")
        counts = {}
        for topic, n in topic_count_map.items():
            if not isinstance(topic, str) or not topic:
                raise IllegalArgumentError(f"create_message_streams: bad topic {topic!r}")
            counts[topic] = _streams.check_stream_count(n, f"topic {topic!r}")
        feeder = self._start_streams(counts, topics=set(counts), topic_filter=None)
        out: dict = {}
        for stream in feeder.streams:
            out.setdefault(stream.topic, []).append(stream)
        return out

    def create_message_streams_by_filter(self, whitelist=None, blacklist=None,
                                         n_streams: int = 1) -> list:
        """``n_streams`` streams over every topic matching the whitelist regex and not the
        blacklist regex (Kafka's TopicFilter; internal topics never match), topics created
        later included; each partition feeds exactly one stream."""
        n = _streams.check_stream_count(n_streams, "create_message_streams_by_filter")
        topic_filter = _streams.TopicFilter(whitelist, blacklist)
        return list(self._start_streams(n, topics=set(), topic_filter=topic_filter).streams)

    def _start_streams(self, counts, *, topics: set, topic_filter):
        self._check_open()
        if self._streams is not None:
            raise IllegalStateError("message streams were already created on this consumer "
                                    "(once per consumer, as the seed's connector)")
        if self._subscribed() or self._assigned:
            raise IllegalStateError(
                "this consumer already has a subscription or an assignment "
                "(subscribe/assign); message streams need a consumer of their own")
        with self._poll_lock:
            self._subscription, self._pattern, self._filter = topics, None, topic_filter
            self._listener = None
            self._streams = _streams.StreamFeeder(self, counts)
            if self._group is not None:
                self._group_topics = None
                self._rejoin.set()
            else:
                self._refresh_subscription()
        return self._streams.start()

    def close(self) -> None:
        """Leave the group (after an auto-commit of what poll returned, or with message
        streams of what they handed out) and stop."""
        if self._closed:
            return
        if self._streams is not None:
            self._streams.stop()
        with self._poll_lock:
            if self._closed:
                return
            try:
                if self._group is not None and self._group.member_id:
                    if self.config["enable_auto_commit"]:
                        self._commit_returned(list(self._assigned), quiet=True)
                    self._group.leave()
            finally:
                self._closed = True
                self._buffer = []
                self._chunks = []
                self._inflight = {}
                self._fetching = {}
                self._network.close()
                if self._zk is not None:
                    self._zk.close()
        # the heartbeat thread ends with its call in flight (a long poll, answered by
        # the leave): not left inside a Ray call when the process exits right after
        beats = self._heartbeat_thread
        if beats is not None and beats is not threading.current_thread():
            beats.join(timeout=5)

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()



def _columns(tp, offset: int, data):
    """The records of a fetch answer at ``offset`` as poll_columns' Table (the first batch
    may start before ``offset``: those rows are cut)."""
    import numpy as np
    import pyarrow as pa

    from storage.records import arrow_numbers, decode_columns, numbers_view
    columns = decode_columns(data)
    offsets = columns["offset"]
    n = len(offsets)
    # no pa.scalar, pa.repeat or to_numpy: they import pandas (see arrow_numbers)
    first = int(np.searchsorted(numbers_view(offsets), offset, side="left"))
    name = tp[0].encode()
    table = pa.table({
        "topic": pa.StringArray.from_buffers(    # the topic n times
            n, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(name)),
            pa.py_buffer(name * n)),
        "partition": arrow_numbers(np.full(n, tp[1], np.int32)),
        "offset": offsets, "timestamp": columns["timestamp"],
        "timestamp_type": columns["timestamp_type"], "key": columns["key"],
        "value": columns["value"], "headers": columns["headers"]})
    return table.slice(first) if first else table
