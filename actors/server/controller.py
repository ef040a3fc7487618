"""The Controller: one per broker, the one elected on ``/controller`` is active.

Every broker creates its Controller actor (so it lives and dies with the broker, as in Kafka);
each runs a ControllerCandidate on its own ZooKeeper session. The active one runs a
reconciliation loop: the target state is durable in ZooKeeper, the current state is observed,
and each tick runs numbered steps, each guarded, none waiting on a broker:

1. observe   live brokers (with their registration czxid as the broker epoch), topics and
             their assignments, partition states, pending admin requests; then collect the
             brokers' answers to earlier requests (``ControllerChannel.collect``: what was
             delivered, what failed or timed out, which answers are stale);
2. decide    new partitions get a leader (first live replica) and an ISR; partitions whose
             leader died get the first live ISR member in assignment order (any live replica
             only when unclean.leader.election.enable); dead followers leave the ISR; a
             partition with no eligible replica goes offline (leader -1, its last ISR kept)
             until an ISR member returns; preferred-replica elections move leadership back;
             a leader whose broker registered again (new czxid) gets a new leader epoch;
3. persist   every partition-state change is a conditional update (expected zk version, and
             the controller epoch's zk version in the same multi-op, so a deposed
             controller's write fails); a lost race re-reads that partition and decides again
             (bounded), it never overwrites what it did not read;
4. act       LeaderAndIsr to each live broker whose partitions are not known delivered to
             its current incarnation, then (once no first-attempt LeaderAndIsr that moves
             a leader or epoch is in flight, so clients do not learn of leaders before the
             leaders do; held at most METADATA_HOLD_S) the metadata snapshot to every live
             broker. Requests go out to all brokers at once
             through the ControllerChannel (channel.py) and are answered on a later tick;
             they are stamped with the controller epoch and a request id (brokers refuse
             older stamps);
   reassign  /admin/reassign_partitions, one partition at a time per step (Kafka's ZK-mode
             onPartitionReassignment): assignment = target + old (new replicas start as
             followers), wait until every target replica is in the ISR, move leadership into
             the target set if needed (epoch + 1), shrink the ISR to the target, StopReplica
             (delete) the removed replicas on live brokers, then write the target assignment
             and drop the entry (the znode goes when empty);
5. clean up  topic deletions (StopReplica with delete to every live hosting broker; once all
             have answered, the znodes go; a broker that was down meets the topic's next
             incarnation under another topic id and drops its stale directory), completed
             admin requests, and /config/changes notifications older than 15 minutes.

Broker liveness: a broker is live when it is registered *and* its Broker actor is not known
dead. The loop keeps one pending ``await_stop`` call per registered broker incarnation
(``transport.watch``); Ray fails it the moment the actor dies, which wakes the loop, and
that incarnation (its registration czxid) counts as dead even while its ephemeral znode
lingers until the session times out. A new registration (new czxid) is live again.

AlterPartition (the leaders' ISR changes) reaches the loop through a queue
(``submit_alter_partition`` from any thread, answered through a future); the loop handles
them before each tick (``handle_requests``), so ControllerLogic keeps one thread.

Watches and answers only set an event that wakes the loop; the loop re-reads ZooKeeper and
decides. ``ControllerLogic`` touches Ray only through its transport, so it runs in unit tests
with a fake store and a fake transport (tests/test_controller_logic.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from coordination import zk_layout as L
from coordination.election import ControllerCandidate
from coordination.errors import (ControllerMovedError, CoordinationError, NodeAlreadyExistsError,
                                 NodeMissingError, VersionConflictError)
from coordination.session import ZkSettings, connect, digest_from_config
from coordination.store import ZkStore

from ..errors import (FencedLeaderEpochError, InvalidUpdateVersionError, NotControllerError,
                      RequestTimedOutError, UnknownTopicOrPartitionError)
from .. import raycompat
from ..protocol import ControllerRole, controller_actor_name
from .channel import ControllerChannel, RayBrokerTransport, RequestKind, RequestStatus
from .controller_watch import ActiveControllerWatch
from .threadnames import name_native_threads

log = logging.getLogger(__name__)

TICK_S = 1.0
#: How often a candidate asks Ray whether it is still the actor its name stands for.
ALIVE_CHECK_S = 2.0
CONFIG_CHANGE_EXPIRY_MS = 15 * 60 * 1000       # Kafka's changeExpirationMs
CONFIG_CHANGE_PURGE_INTERVAL_S = 60.0
#: How long new metadata waits for LeaderAndIsr answers before it goes out anyway. Only a
#: broker's first attempt holds it: a broker whose LeaderAndIsr already failed or timed out
#: does not hold every client's view of the cluster again on each retry.
METADATA_HOLD_S = 30.0
#: How long a leader's ISR change may wait for the loop thread (the forwarding Broker
#: waits 5 s for the answer).
ALTER_PARTITION_TIMEOUT_S = 5.0
#: A lost conditional update is re-read and decided again at most this often per tick.
MAX_STATE_WRITE_ATTEMPTS = 3
#: Bound on AlterPartition requests waiting for the loop, and on those handled per pass.
MAX_PENDING_REQUESTS = 10_000
MAX_REQUESTS_PER_PASS = 1_000
#: A broker watch (``await_stop``) that failed without proving the broker dead is sent
#: again after this long.
WATCH_RETRY_S = 1.0
#: Verdicts of a broker watch that prove the watched incarnation is gone.
WATCH_DEAD = frozenset({"dead", "stopped", "gone"})
#: Kafka's defaults for auto.leader.rebalance.enable's check.
LEADER_IMBALANCE_CHECK_INTERVAL_S = 300.0
LEADER_IMBALANCE_PER_BROKER_PCT = 10.0


def _true(value) -> bool:
    return str(value).strip().lower() == "true"


@dataclass
class _Partition:
    replicas: list[int]
    state: L.PartitionState | None = None
    zk_version: int = -1
    unsettled: bool = False      # a write lost its race this tick: nothing is sent for it


@dataclass
class _Observed:
    brokers: dict[int, int] = field(default_factory=dict)      # id -> czxid (broker epoch)
    broker_info: dict[int, dict] = field(default_factory=dict)
    topics: dict[str, dict[int, _Partition]] = field(default_factory=dict)
    configs: dict[str, dict] = field(default_factory=dict)
    deleting: list[str] = field(default_factory=list)
    topic_ids: dict[str, str] = field(default_factory=dict)
    topic_versions: dict[str, int] = field(default_factory=dict)
    registered: dict[int, int] = field(default_factory=dict)   # ZooKeeper's view, dead too


@dataclass
class _AlterPartition:
    topic: str
    partition: int
    leader_id: int
    leader_epoch: int
    new_isr: list[int]
    zk_version: int
    future: concurrent.futures.Future


class ControllerLogic:
    """The active controller's state machine (the steps of the module docstring).

    Not thread-safe: the Controller's loop thread is its only caller (``wake`` is the one
    thing other threads touch). ``transport`` defaults to Ray (RayBrokerTransport); tests
    pass a fake one, and a fake store with the ZkStore methods used here.
    """

    def __init__(self, store: ZkStore, *, broker_id: int, namespace: str,
                 unclean_leader_election: bool = False, transport=None, clock=time.monotonic,
                 auto_leader_rebalance: bool = False,
                 leader_imbalance_check_interval_s: float = LEADER_IMBALANCE_CHECK_INTERVAL_S,
                 leader_imbalance_per_broker_pct: float = LEADER_IMBALANCE_PER_BROKER_PCT):
        self.store = store
        self.broker_id = broker_id
        self.namespace = namespace
        self.unclean = unclean_leader_election      # the broker default; topics override it
        self.auto_leader_rebalance = auto_leader_rebalance
        self.imbalance_check_interval_s = leader_imbalance_check_interval_s
        self.imbalance_pct = leader_imbalance_per_broker_pct
        self.epoch = 0
        self.epoch_zk_version: int | None = None
        self.wake = threading.Event()
        self.clock = clock
        self.channel = ControllerChannel(
            transport or RayBrokerTransport(namespace, on_answer=self.wake.set), clock=clock)
        # what each broker incarnation acknowledged: (broker, topic, p) -> (czxid, key_state)
        self._delivered: dict[tuple[int, str, int], tuple[int, tuple]] = {}
        self._metadata_delivered: dict[int, tuple[int, int]] = {}   # broker -> (czxid, version)
        self._stopped: dict[tuple[int, str, str | None], int] = {}  # (broker, topic, id) -> czxid
        self._metadata: dict | None = None
        self._metadata_version = 0
        self._seen_broker_epochs: dict[int, int] = {}     # broker -> czxid at the last settled elect
        self._restart_bumped: dict[tuple[str, int], tuple[int, int]] = {}  # (t,p) -> (leader, czxid)
        self._last_purge = float("-inf")
        self._requests: queue.Queue[_AlterPartition] = queue.Queue(MAX_PENDING_REQUESTS)
        # broker liveness from Ray: broker -> (czxid, token) of its pending await_stop call
        self._watches: dict[int, tuple[int, object]] = {}
        self._watch_retry_at: dict[int, float] = {}
        self._dead: dict[int, int] = {}          # broker -> czxid of an incarnation known dead
        self._live: set[int] | None = None       # live brokers at the last observe
        self._next_imbalance_check = float("inf")
        self._removing: dict[tuple[str, int], set[int]] = {}   # reassignment: no LAI to these
        self._replica_stopped: dict[tuple[int, str, int], int] = {}  # (b, t, p) -> czxid

    def activate(self, epoch: int, epoch_zk_version: int | None) -> None:
        """A new term: nothing known delivered, no request of the old term waited for."""
        self.epoch = epoch
        self.epoch_zk_version = epoch_zk_version
        self.channel.reset(epoch)
        self._delivered.clear()
        self._metadata_delivered.clear()
        self._stopped.clear()
        self._metadata = None
        self._seen_broker_epochs = {}
        self._restart_bumped.clear()
        for _, token in self._watches.values():
            self.transport.forget(token)
        self._watches.clear()
        self._watch_retry_at.clear()
        self._live = None
        self._next_imbalance_check = self.clock() + self.imbalance_check_interval_s
        self._removing.clear()
        self._replica_stopped.clear()

    @property
    def transport(self):
        return self.channel.transport

    def _watch(self, *_):
        self.wake.set()

    # -- 1. observe -------------------------------------------------------------------------
    def observe(self) -> _Observed:
        obs = _Observed()
        for bid in self.store.broker_ids(watch=self._watch):
            stat = self.store.zk.exists(L.broker_path(bid))
            info = self.store.get_broker(bid)
            if stat is not None and info is not None:
                obs.registered[bid] = stat.czxid
                obs.broker_info[bid] = {"host": info.host, "port": info.port, "rack": info.rack,
                                        "listeners": [list(x) for x in info.listeners()]}
        self.watch_brokers(obs.registered)
        obs.brokers = {b: c for b, c in obs.registered.items() if self._dead.get(b) != c}
        self._live = set(obs.brokers)
        obs.deleting = self.store.pending_topic_deletions(watch=self._watch)
        self.store.config_changes(watch=self._watch)   # an altered config wakes the loop
        for topic in self.store.topics(watch=self._watch):
            try:
                assignment, version, topic_id = self.store.get_topic(topic, watch=self._watch)
            except NodeMissingError:
                continue
            obs.topic_ids[topic] = topic_id
            obs.topic_versions[topic] = version
            states = self.store.get_partition_states(topic, assignment)
            parts = {}
            for p, replicas in assignment.items():
                part = _Partition(list(replicas))
                if p in states:
                    part.state, part.zk_version = states[p]
                parts[p] = part
            obs.topics[topic] = parts
            obs.configs[topic] = self.store.get_topic_config(topic)
        return obs

    def watch_brokers(self, registered: dict[int, int]) -> None:
        """Broker liveness from Ray: settle the answered ``await_stop`` watches (a dead,
        stopped or replaced incarnation is recorded dead), and keep one pending per
        registered incarnation not known dead. Never blocks."""
        tokens = [token for _, token in self._watches.values()]
        answers = self.transport.poll(tokens) if tokens else {}
        now = self.clock()
        for bid, (czxid, token) in list(self._watches.items()):
            if registered.get(bid) != czxid:
                # that incarnation left ZooKeeper (or was replaced): stop waiting on it
                del self._watches[bid]
                self.transport.forget(token)
                continue
            answer = answers.get(token)
            if answer is None:
                continue
            del self._watches[bid]
            ok, verdict = answer
            if ok and verdict in WATCH_DEAD:
                log.info("controller %d: broker %d (czxid %x) is %s", self.broker_id, bid,
                         czxid, verdict)
                self._dead[bid] = czxid
            elif not ok:
                log.info("controller %d: watch of broker %d failed: %r", self.broker_id, bid,
                         verdict)
                self._watch_retry_at[bid] = now + WATCH_RETRY_S
        for bid in [b for b in self._dead if registered.get(b) != self._dead[b]]:
            del self._dead[bid]          # that incarnation is gone from ZooKeeper too
        for bid, czxid in sorted(registered.items()):
            if bid in self._watches or self._dead.get(bid) == czxid:
                continue
            if now < self._watch_retry_at.get(bid, float("-inf")):
                continue
            self._watch_retry_at.pop(bid, None)
            self._watches[bid] = (czxid, self.transport.watch(bid, czxid))

    def collect(self, obs: _Observed) -> None:
        """Record what the brokers acknowledged since the last tick (never blocks)."""
        for req in self.channel.collect(obs.brokers):
            if req.status != RequestStatus.DELIVERED:
                continue
            bid, czxid = req.broker_id, req.broker_epoch
            if req.kind == RequestKind.LEADER_AND_ISR:
                failed = _failed_partitions(req.result)
                for entry, key_state in req.items:
                    tp = (entry["topic"], entry["partition"])
                    if tp in failed:
                        log.info("controller %d: broker %d refused %s-%d: %s", self.broker_id,
                                 bid, tp[0], tp[1], failed[tp])
                    else:
                        self._delivered[(bid, *tp)] = (czxid, key_state)
            elif req.kind == RequestKind.UPDATE_METADATA:
                self._metadata_delivered[bid] = (czxid, req.payload_key)
            elif req.kind == RequestKind.STOP_REPLICA:
                for item in req.items:
                    if len(item) == 3 and item[0] == "partition":          # a reassignment's removed replica
                        self._replica_stopped[(bid, item[1], item[2])] = czxid
                    else:
                        topic, topic_id = item
                        self._stopped[(bid, topic, topic_id)] = czxid

    # -- 2 + 3. decide and persist ------------------------------------------------------------
    def elect(self, obs: _Observed, preferred: set[tuple[str, int]] | None = None) -> bool:
        """Decide and persist every partition's state; True when no write was left undone
        (a lost race that re-reading within the bound did not settle)."""
        live = set(obs.brokers)
        # A broker registered under a new session since the last settled tick restarted (or
        # its session expired) faster than we saw it leave: as Kafka does, its partitions
        # get a new leader epoch, so nothing keeps talking to the previous incarnation.
        restarted = {b: czxid for b, czxid in obs.brokers.items()
                     if self._seen_broker_epochs.get(b, czxid) != czxid}
        settled = True
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            unclean = self.unclean_for(obs.configs.get(topic, {}))
            for p, part in parts.items():
                wanted = (topic, p) in (preferred or ())
                settled &= self._settle_partition(topic, p, part, live, restarted, wanted,
                                                  unclean)
        if settled:
            self._seen_broker_epochs = dict(obs.brokers)
            self._restart_bumped.clear()
        return settled

    def unclean_for(self, topic_config: dict) -> bool:
        """unclean.leader.election.enable: the topic's setting, else the broker default."""
        value = topic_config.get("unclean.leader.election.enable")
        return self.unclean if value is None else _true(value)

    def _settle_partition(self, topic: str, p: int, part: _Partition, live: set[int],
                          restarted: dict[int, int], preferred: bool,
                          unclean: bool = False) -> bool:
        for _ in range(MAX_STATE_WRITE_ATTEMPTS):
            new = self._decide(part, live, preferred, unclean)
            bump = None
            st = part.state
            if st is not None and st.leader in restarted:
                bump = (st.leader, restarted[st.leader])
                base = new or st
                if (base.leader, base.leader_epoch) == (st.leader, st.leader_epoch) \
                        and self._restart_bumped.get((topic, p)) != bump:
                    new = L.PartitionState(leader=st.leader, leader_epoch=st.leader_epoch + 1,
                                           isr=base.isr, controller_epoch=self.epoch)
            if new is None:
                return True
            try:
                if st is None:
                    part.zk_version = self.store.create_partition_state(topic, p, new)
                else:
                    part.zk_version = self.store.update_partition_state(
                        topic, p, new, expected_version=part.zk_version,
                        controller_epoch_zk_version=self.epoch_zk_version)
            except (VersionConflictError, NodeAlreadyExistsError):
                # Someone changed it since we read it: read it again and decide from that.
                try:
                    part.state, part.zk_version = self.store.get_partition_state(topic, p)
                except NodeMissingError:
                    part.state, part.zk_version = None, -1
                continue
            part.state = new
            if bump is not None:
                self._restart_bumped[(topic, p)] = bump
            log.info("controller %d: %s-%d leader %d epoch %d isr %s", self.broker_id,
                     topic, p, new.leader, new.leader_epoch, list(new.isr))
            return True
        log.warning("controller %d: %s-%d state kept changing under us; next tick",
                    self.broker_id, topic, p)
        part.unsettled = True
        self.wake.set()
        return False

    def _decide(self, part: _Partition, live: set[int], preferred: bool,
                unclean: bool = False) -> L.PartitionState | None:
        """The partition's next state, or None to leave it as it is (pure). The ISR only
        ever holds live, assigned replicas (a dead follower or one a reassignment removed
        leaves it); the leader is elected from it in assignment order, from any live
        replica only when ``unclean``."""
        state = part.state
        live_replicas = [r for r in part.replicas if r in live]
        if state is None:
            if not live_replicas:
                return None  # stays new until a replica is alive
            return L.PartitionState(leader=live_replicas[0], leader_epoch=0,
                                    isr=tuple(live_replicas), controller_epoch=self.epoch)
        leader = state.leader
        isr = [r for r in state.isr if r in live and r in part.replicas]
        if preferred and part.replicas and part.replicas[0] in isr and leader != part.replicas[0]:
            return L.PartitionState(leader=part.replicas[0], leader_epoch=state.leader_epoch + 1,
                                    isr=tuple(isr), controller_epoch=self.epoch)
        if leader in live and leader in part.replicas:
            if len(isr) != len(state.isr):  # a dead or unassigned follower leaves the ISR
                return L.PartitionState(leader=leader, leader_epoch=state.leader_epoch,
                                        isr=tuple(isr), controller_epoch=self.epoch)
            return None
        candidates = [r for r in part.replicas if r in isr]
        if not candidates and unclean:
            candidates = live_replicas
        if candidates:
            new_leader = candidates[0]
            new_isr = tuple(isr) if new_leader in isr else (new_leader,)
            return L.PartitionState(leader=new_leader, leader_epoch=state.leader_epoch + 1,
                                    isr=new_isr, controller_epoch=self.epoch)
        if leader == -1:
            return None  # already offline
        # offline: keep the last ISR (Kafka does) so a clean election can happen later
        return L.PartitionState(leader=-1, leader_epoch=state.leader_epoch + 1,
                                isr=tuple(state.isr), controller_epoch=self.epoch)

    # -- AlterPartition (the leaders' ISR changes) ----------------------------------------------
    def submit_alter_partition(self, topic: str, partition: int, leader_id: int,
                               leader_epoch: int, new_isr: list[int],
                               zk_version: int) -> concurrent.futures.Future:
        """Queue a leader's ISR change for the loop thread (any thread may call this); the
        future answers what ``alter_partition`` answers, or raises what it raises."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        request = _AlterPartition(topic, int(partition), int(leader_id), int(leader_epoch),
                                  [int(r) for r in new_isr], int(zk_version), future)
        try:
            self._requests.put_nowait(request)
        except queue.Full:
            future.set_exception(RequestTimedOutError(
                f"controller {self.broker_id}: {MAX_PENDING_REQUESTS} ISR changes queued"))
        self.wake.set()
        return future

    def handle_requests(self) -> int:
        """Answer the queued AlterPartition requests (loop thread); returns how many.
        ControllerMovedError (we were deposed) answers NotControllerError and is re-raised
        so the loop steps down."""
        handled = 0
        while handled < MAX_REQUESTS_PER_PASS:
            try:
                req = self._requests.get_nowait()
            except queue.Empty:
                break
            handled += 1
            if not req.future.set_running_or_notify_cancel():
                continue
            try:
                req.future.set_result(self.alter_partition(
                    req.topic, req.partition, req.leader_id, req.leader_epoch, req.new_isr,
                    req.zk_version))
            except ControllerMovedError as exc:
                req.future.set_exception(NotControllerError(str(exc)))
                raise
            except CoordinationError as exc:   # ZooKeeper trouble: the leader asks again
                req.future.set_exception(RequestTimedOutError(
                    f"controller {self.broker_id}: {exc}"))
            except Exception as exc:  # noqa: BLE001 - typed refusals travel to the leader
                req.future.set_exception(exc)
        if not self._requests.empty():
            self.wake.set()
        return handled

    def fail_requests(self, exc: BaseException) -> None:
        """Answer every queued request with ``exc`` (this candidate is not active)."""
        while True:
            try:
                req = self._requests.get_nowait()
            except queue.Empty:
                return
            if req.future.set_running_or_notify_cancel():
                req.future.set_exception(exc)

    def alter_partition(self, topic: str, partition: int, leader_id: int, leader_epoch: int,
                        new_isr: list[int], zk_version: int) -> dict:
        """Validate and write a leader's ISR change (Kafka's AlterPartition, ZooKeeper mode);
        answers the partition's state ``{leader, leader_epoch, isr, zk_version}``.

        FencedLeaderEpochError when ``leader_id`` / ``leader_epoch`` are not the current
        leader's; InvalidUpdateVersionError when ``zk_version`` is stale (unless the state
        already is what was proposed: a retry whose first answer was lost). The ISR keeps
        the leader, holds only assigned replicas, and gains only live ones."""
        try:
            state, version = self.store.get_partition_state(topic, partition)
            assignment, _, _ = self.store.get_topic(topic)
        except NodeMissingError:
            raise UnknownTopicOrPartitionError(
                f"{topic}-{partition} has no partition state") from None
        replicas = list(assignment.get(partition, ()))
        if state.leader != leader_id or state.leader_epoch != leader_epoch:
            raise FencedLeaderEpochError(
                f"{topic}-{partition}: leader {leader_id} epoch {leader_epoch} is not the "
                f"current leader {state.leader} epoch {state.leader_epoch}")
        live = self._live if self._live is not None else set(self.store.broker_ids())
        isr = [r for r in dict.fromkeys(new_isr)
               if r in replicas and (r in state.isr or r in live or r == leader_id)]
        if leader_id not in isr:
            isr.insert(0, leader_id)
        answer = {"leader": state.leader, "leader_epoch": state.leader_epoch,
                  "isr": list(state.isr), "zk_version": version}
        if zk_version != version:
            if tuple(isr) == tuple(state.isr):
                return answer            # already written: our answer to a retry
            raise InvalidUpdateVersionError(
                f"{topic}-{partition}: zk version {zk_version} is stale (now {version})")
        if tuple(isr) == tuple(state.isr):
            return answer
        new = L.PartitionState(leader=state.leader, leader_epoch=state.leader_epoch,
                               isr=tuple(isr), controller_epoch=self.epoch)
        try:
            version = self.store.update_partition_state(
                topic, partition, new, expected_version=version,
                controller_epoch_zk_version=self.epoch_zk_version)
        except VersionConflictError:
            raise InvalidUpdateVersionError(
                f"{topic}-{partition}: the state changed while the ISR change was written"
            ) from None
        log.info("controller %d: %s-%d isr %s -> %s (leader %d epoch %d)", self.broker_id,
                 topic, partition, list(state.isr), isr, leader_id, leader_epoch)
        self.wake.set()        # the replicas and the metadata learn it on the next tick
        return {"leader": new.leader, "leader_epoch": new.leader_epoch, "isr": list(new.isr),
                "zk_version": version}

    # -- auto.leader.rebalance.enable ------------------------------------------------------------
    def imbalanced_partitions(self, obs: _Observed, skip=frozenset()) -> set[tuple[str, int]]:
        """When the rebalance check is due: the partitions to hand back to their preferred
        replica, for every broker whose share of preferred partitions it does not lead
        exceeds leader.imbalance.per.broker.percentage (Kafka's
        checkAndTriggerAutoLeaderRebalance). Only preferred replicas that are live and in
        the ISR are candidates; ``skip`` (reassigning, deleting) is left alone."""
        if not self.auto_leader_rebalance:
            return set()
        now = self.clock()
        if now < self._next_imbalance_check:
            return set()
        self._next_imbalance_check = now + self.imbalance_check_interval_s
        total: dict[int, int] = {}
        not_led: dict[int, list[tuple[str, int, _Partition]]] = {}
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            for p, part in parts.items():
                if not part.replicas or part.state is None or (topic, p) in skip:
                    continue
                preferred = part.replicas[0]
                total[preferred] = total.get(preferred, 0) + 1
                if part.state.leader != preferred:
                    not_led.setdefault(preferred, []).append((topic, p, part))
        out = set()
        for bid, lagging in not_led.items():
            if len(lagging) / total[bid] * 100 <= self.imbalance_pct:
                continue
            for topic, p, part in lagging:
                if bid in obs.brokers and bid in part.state.isr:
                    out.add((topic, p))
        if out:
            log.info("controller %d: leader imbalance; moving %d partitions back to their "
                     "preferred replicas", self.broker_id, len(out))
        return out

    # -- reassignment ----------------------------------------------------------------------------
    def reassign(self, obs: _Observed, plan: dict | None) -> set[tuple[str, int]]:
        """Advance each partition of ``plan`` (/admin/reassign_partitions) by the steps of
        the module docstring (each step persisted before the next is taken, so a new
        controller resumes from what ZooKeeper holds); returns those still reassigning."""
        self._removing = {}
        if not plan:
            return set()
        done: list[tuple[str, int]] = []
        assignments: dict[str, dict[int, list[int]]] = {}     # topic -> partitions to rewrite
        stops: dict[int, list[tuple[str, int]]] = {}
        for (topic, p), target in sorted(plan.items()):
            part = obs.topics.get(topic, {}).get(p)
            if part is None or topic in obs.deleting or not target:
                done.append((topic, p))       # the topic went away meanwhile: nothing to do
                continue
            step = self._reassign_step(topic, p, part, list(target), obs, stops)
            if step == part.replicas:
                done.append((topic, p))       # already the target: nothing left to do
            elif step is not None:
                assignments.setdefault(topic, {})[p] = step
        for topic, changes in sorted(assignments.items()):
            full = {q: list(part.replicas) for q, part in obs.topics[topic].items()}
            full.update(changes)
            try:
                obs.topic_versions[topic] = self.store.set_topic_assignment(
                    topic, full, expected_version=obs.topic_versions.get(topic, -1),
                    controller_epoch_zk_version=self.epoch_zk_version)
            except (VersionConflictError, NodeMissingError):
                self.wake.set()               # read again next tick
                continue
            for q, replicas in changes.items():
                obs.topics[topic][q].replicas = list(replicas)
                if list(replicas) == list(plan[(topic, q)]):
                    done.append((topic, q))
                    log.info("controller %d: %s-%d reassigned to %s", self.broker_id, topic,
                             q, replicas)
        self._send_reassignment_stops(obs, stops)
        for key in [k for k in self._replica_stopped if (k[1], k[2]) in done]:
            del self._replica_stopped[key]    # a later reassignment starts afresh
        if done:
            remaining = {tp: r for tp, r in plan.items() if tp not in done}
            try:
                if remaining:
                    self.store.set_reassignment(remaining)
                else:
                    self.store.complete_reassignment()
            except NodeMissingError:
                pass
        return {tp for tp in plan if tp not in done}

    def _reassign_step(self, topic: str, p: int, part: _Partition, target: list[int],
                       obs: _Observed, stops: dict) -> list[int] | None:
        """One partition's next reassignment step; returns the assignment to write, if any
        (the state writes and StopReplica requests happen here)."""
        current = list(part.replicas)
        if any(r not in current for r in target):
            # A: new replicas join as followers (LeaderAndIsr follows from the assignment)
            return target + [r for r in current if r not in target]
        removed = [r for r in current if r not in target]
        st = part.state
        if st is None or part.unsettled:
            return None
        live = set(obs.brokers)
        if not set(target) <= set(st.isr):
            return None                        # B: wait until every target replica caught up
        if st.leader not in target or st.leader not in live:
            # C: leadership into the target set, first live target replica in ISR order
            leader = next((r for r in target if r in st.isr and r in live), None)
            if leader is None:
                return None
            new = L.PartitionState(leader=leader, leader_epoch=st.leader_epoch + 1,
                                   isr=tuple(r for r in st.isr if r in live),
                                   controller_epoch=self.epoch)
            self._write_state(topic, p, part, new)
            return None
        if any(r not in target for r in st.isr):
            # D: the removed replicas leave the ISR before they are stopped
            new = L.PartitionState(leader=st.leader, leader_epoch=st.leader_epoch,
                                   isr=tuple(r for r in st.isr if r in target),
                                   controller_epoch=self.epoch)
            if not self._write_state(topic, p, part, new):
                return None
        if removed:
            # E: StopReplica (delete) to the removed replicas on live brokers
            self._removing[(topic, p)] = set(removed)
            waiting = [b for b in removed if b in obs.brokers
                       and self._replica_stopped.get((b, topic, p)) != obs.brokers[b]]
            if waiting:
                for b in waiting:
                    stops.setdefault(b, []).append((topic, p))
                return None
        return target                          # F: the target assignment, then done

    def _write_state(self, topic: str, p: int, part: _Partition, new: L.PartitionState) -> bool:
        """One conditional write of a partition state; False (and a re-read next tick) when
        it lost a race."""
        try:
            part.zk_version = self.store.update_partition_state(
                topic, p, new, expected_version=part.zk_version,
                controller_epoch_zk_version=self.epoch_zk_version)
        except (VersionConflictError, NodeMissingError):
            part.unsettled = True
            self.wake.set()
            return False
        part.state = new
        log.info("controller %d: %s-%d leader %d epoch %d isr %s (reassignment)",
                 self.broker_id, topic, p, new.leader, new.leader_epoch, list(new.isr))
        return True

    def _send_reassignment_stops(self, obs: _Observed, stops: dict) -> None:
        for bid, partitions in sorted(stops.items()):
            payload_key = ("reassign", tuple(sorted(partitions)))
            if self.channel.can_send(bid, RequestKind.STOP_REPLICA, payload_key):
                self.channel.send(bid, obs.brokers[bid], RequestKind.STOP_REPLICA,
                                  (sorted(partitions), True), payload_key=payload_key,
                                  items=[("partition", t, p) for t, p in sorted(partitions)])

    # -- 4. act ---------------------------------------------------------------------------------
    def send_leader_and_isr(self, obs: _Observed) -> set[int]:
        """LeaderAndIsr to every live broker lacking a partition state (all at once).
        Returns the brokers still owed one (in flight, or waiting out a backoff)."""
        per_broker: dict[int, list[tuple[dict, tuple]]] = {}
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            for p, part in parts.items():
                if part.state is None or part.unsettled:
                    continue
                entry = {"topic": topic, "partition": p, "leader": part.state.leader,
                         "leader_epoch": part.state.leader_epoch, "isr": list(part.state.isr),
                         "replicas": list(part.replicas), "config": obs.configs.get(topic, {}),
                         "topic_id": obs.topic_ids.get(topic), "zk_version": part.zk_version}
                key_state = (part.state.leader, part.state.leader_epoch, tuple(part.state.isr),
                             tuple(part.replicas), tuple(sorted(entry["config"].items())),
                             entry["topic_id"], part.zk_version)
                removing = self._removing.get((topic, p), ())
                for bid in part.replicas:
                    if bid in removing:
                        continue     # being stopped by a reassignment: never started again
                    czxid = obs.brokers.get(bid)
                    if czxid is not None and self._delivered.get((bid, topic, p)) != (czxid, key_state):
                        per_broker.setdefault(bid, []).append((entry, key_state))
        owed = set()
        for bid, items in sorted(per_broker.items()):
            payload_key = tuple((e["topic"], e["partition"], k) for e, k in items)
            if self.channel.can_send(bid, RequestKind.LEADER_AND_ISR, payload_key):
                self.channel.send(bid, obs.brokers[bid], RequestKind.LEADER_AND_ISR,
                                  ([e for e, _ in items],), payload_key=payload_key, items=items)
            if not self.channel.parked(bid, RequestKind.LEADER_AND_ISR, payload_key):
                owed.add(bid)
        return owed

    def send_metadata(self, obs: _Observed, lai_owed: set[int] = frozenset()) -> None:
        """The metadata snapshot to every live broker that lacks it, but only once no
        LeaderAndIsr is in flight to a live broker (leaders know before clients do, and the
        brokers' caches change together rather than one by one as their answers come in),
        and not yet to a broker still owed a LeaderAndIsr (which goes first)."""
        metadata = self.metadata_snapshot(obs)
        if metadata != self._metadata:
            self._metadata = metadata
            self._metadata_version += 1
        now = self.clock()
        if any(r.broker_id in obs.brokers and now - r.sent_at < METADATA_HOLD_S
               and self.channel.failures(r.broker_id, RequestKind.LEADER_AND_ISR) == 0
               and self._moves_leadership(r)
               for r in self.channel.in_flight(RequestKind.LEADER_AND_ISR)):
            return   # all brokers get the new metadata together, once the leaders know
        version = self._metadata_version
        for bid, czxid in sorted(obs.brokers.items()):
            if self._metadata_delivered.get(bid) == (czxid, version) or bid in lai_owed:
                continue
            if self.channel.can_send(bid, RequestKind.UPDATE_METADATA, version):
                self.channel.send(bid, czxid, RequestKind.UPDATE_METADATA, (metadata,),
                                  payload_key=version)

    def _moves_leadership(self, req) -> bool:
        """Does this LeaderAndIsr tell its broker of a leader or leader epoch it has not
        acknowledged yet? Only those hold the metadata back: an ISR-only change (a
        follower left or joined) may reach clients before a slow or paused follower."""
        for entry, key_state in req.items or ():
            prev = self._delivered.get((req.broker_id, entry["topic"], entry["partition"]))
            if prev is None or prev[0] != req.broker_epoch or prev[1][:2] != key_state[:2]:
                return True
        return False

    def metadata_snapshot(self, obs: _Observed) -> dict:
        topics = {}
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            topics[topic] = {
                p: {"leader": part.state.leader if part.state else -1,
                    "leader_epoch": part.state.leader_epoch if part.state else -1,
                    "isr": list(part.state.isr) if part.state else [],
                    "replicas": list(part.replicas)}
                for p, part in sorted(parts.items())}
        return {"controller_id": self.broker_id, "controller_epoch": self.epoch,
                "brokers": {bid: obs.broker_info[bid] for bid in sorted(obs.brokers)},
                "topics": topics, "summary": partition_summary(topics)}

    # -- 5. clean up ----------------------------------------------------------------------------
    def delete_topics(self, obs: _Observed) -> None:
        """StopReplica (delete) to each live hosting broker; the znodes go once all have
        answered. A dead broker removes the topic's directories when it starts again."""
        todo: dict[int, list[tuple[str, str | None, list[int]]]] = {}
        for topic in obs.deleting:
            parts = obs.topics.get(topic, {})
            topic_id = obs.topic_ids.get(topic)
            hosts = sorted({b for part in parts.values() for b in part.replicas
                            if b in obs.brokers})
            waiting = [b for b in hosts
                       if self._stopped.get((b, topic, topic_id)) != obs.brokers[b]]
            if waiting:
                for bid in waiting:
                    todo.setdefault(bid, []).append((topic, topic_id, sorted(parts)))
                continue
            try:
                self.store.complete_topic_deletion(topic)
            except NodeMissingError:
                pass
            for key in [k for k in self._delivered if k[1] == topic]:
                del self._delivered[key]
            for key in [k for k in self._stopped if k[1] == topic]:
                del self._stopped[key]
            log.info("controller %d: deleted topic %s", self.broker_id, topic)
        for bid, topics in sorted(todo.items()):
            partitions = [(t, p) for t, _, ps in topics for p in ps]
            payload_key = tuple(partitions)
            if self.channel.can_send(bid, RequestKind.STOP_REPLICA, payload_key):
                self.channel.send(bid, obs.brokers[bid], RequestKind.STOP_REPLICA,
                                  (partitions, True), payload_key=payload_key,
                                  items=[(t, tid) for t, tid, _ in topics])

    def preferred_requests(self) -> set[tuple[str, int]] | None:
        req = self.store.get_preferred_replica_election(watch=self._watch)
        if req is None:
            return None
        return {(t, p) for t, p in req}

    def purge_config_changes(self) -> None:
        """At most once a minute, drop /config/changes notifications older than 15 minutes
        (configs travel to replicas with LeaderAndIsr; a notification only wakes the loop)."""
        now = self.clock()
        if now - self._last_purge < CONFIG_CHANGE_PURGE_INTERVAL_S:
            return
        self._last_purge = now
        removed = self.store.purge_config_changes(CONFIG_CHANGE_EXPIRY_MS)
        if removed:
            log.info("controller %d: purged %d config change notifications", self.broker_id,
                     removed)

    def tick(self) -> None:
        """One pass of the steps in the module docstring."""
        self.purge_config_changes()
        preferred = self.preferred_requests()
        obs = self.observe()
        self.collect(obs)
        plan = self.store.get_reassignment(watch=self._watch)
        reassigning = set(plan or ())
        rebalance = self.imbalanced_partitions(obs, skip=reassigning)
        wanted = ((preferred or set()) | rebalance) - reassigning
        settled = self.elect(obs, wanted)
        if preferred is not None and settled:
            # only once every preferred leader was written: a lost race is retried next tick
            self.store.complete_preferred_replica_election()
        self.reassign(obs, plan)
        lai_owed = self.send_leader_and_isr(obs)
        self.delete_topics(obs)
        self.send_metadata(obs, lai_owed)

    def status(self) -> dict:
        return {"in_flight": len(self.channel.in_flight()), **self.channel.stats.as_dict(),
                "pending": self.channel.describe(),
                "watched_brokers": sorted(self._watches),
                "dead_brokers": {b: f"{c:x}" for b, c in sorted(self._dead.items())},
                "queued_isr_changes": self._requests.qsize()}


def partition_summary(topics: dict) -> dict:
    """Counts for status displays from a metadata snapshot's topics: partitions, offline
    ones (no leader), under-replicated ones (ISR smaller than the replica list), and those
    whose leader is not their preferred replica (Kafka's OfflinePartitionsCount,
    UnderReplicatedPartitions, PreferredReplicaImbalanceCount)."""
    out = {"partitions": 0, "offline_partitions": 0, "under_replicated_partitions": 0,
           "preferred_replica_imbalance": 0}
    for parts in topics.values():
        for part in parts.values():
            out["partitions"] += 1
            if part["leader"] < 0:
                out["offline_partitions"] += 1
            if len(part["isr"]) < len(part["replicas"]):
                out["under_replicated_partitions"] += 1
            if part["replicas"] and part["leader"] >= 0 and part["leader"] != part["replicas"][0]:
                out["preferred_replica_imbalance"] += 1
    return out


def _failed_partitions(result) -> dict[tuple[str, int], str]:
    """(topic, partition) -> error of the partitions a LeaderAndIsr answer refused."""
    out = {}
    for row in result or ():
        if isinstance(row, dict) and row.get("error"):
            out[(row.get("topic"), row.get("partition"))] = row["error"]
    return out


class Controller:
    """The controller candidate actor of one broker (see the module docstring)."""

    def __init__(self, broker_id: int, conf: dict):
        name_native_threads()       # its threads named in top -H, /proc (threadnames.py)
        self.broker_id = broker_id
        self.conf = conf
        settings = ZkSettings(hosts=conf["zk_hosts"], namespace=conf["namespace"],
                              session_timeout_s=conf.get("zk_session_timeout_s", 6.0),
                              digest=digest_from_config(conf.get("config") or {}))
        self.zk = connect(settings)
        self.store = ZkStore(self.zk)
        self.store.ensure_persistent_paths()
        config = conf.get("config") or {}
        self.logic = ControllerLogic(
            self.store, broker_id=broker_id, namespace=conf["namespace"],
            unclean_leader_election=_true(config.get("unclean.leader.election.enable",
                                                     "false")),
            auto_leader_rebalance=_true(config.get("auto.leader.rebalance.enable", "true")),
            leader_imbalance_check_interval_s=float(config.get(
                "leader.imbalance.check.interval.seconds", LEADER_IMBALANCE_CHECK_INTERVAL_S)),
            leader_imbalance_per_broker_pct=float(config.get(
                "leader.imbalance.per.broker.percentage", LEADER_IMBALANCE_PER_BROKER_PCT)))
        self._closed = threading.Event()
        self._role = ControllerRole.STANDBY
        self._activation_lock = threading.Lock()
        self._activation: tuple[int, int | None] | None = None   # won, not yet applied
        self.ticks = 0
        self.last_error: str | None = None
        self.candidate = ControllerCandidate(self.zk, broker_id=broker_id,
                                             on_elected=self._on_elected,
                                             on_resigned=self._on_resigned)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"controller-{broker_id}")
        self._thread.start()
        self.candidate.start()
        # a standby ends a dead active controller's session (see controller_watch.py)
        self.watch = ActiveControllerWatch(self.zk, self.candidate, settings,
                                           namespace=conf["namespace"],
                                           broker_id=broker_id).start()

    def _on_elected(self, epoch: int) -> None:
        # Runs on the candidate's thread: the loop thread applies it before its next tick,
        # so ControllerLogic keeps a single thread.
        with self._activation_lock:
            self._activation = (epoch, self.candidate.epoch_zk_version)
        self._role = ControllerRole.ACTIVE
        self.logic.wake.set()

    def _on_resigned(self) -> None:
        self._role = ControllerRole.STANDBY

    @property
    def role(self) -> ControllerRole:
        """ACTIVE only while this candidate holds /controller in a live session."""
        if self._role == ControllerRole.ACTIVE and self.candidate.is_active:
            return ControllerRole.ACTIVE
        return ControllerRole.STANDBY

    def _loop(self) -> None:
        checked = time.monotonic()
        while not self._closed.is_set():
            self.logic.wake.wait(TICK_S)
            self.logic.wake.clear()
            if time.monotonic() - checked >= ALIVE_CHECK_S:
                checked = time.monotonic()
                self._leave_if_killed()
            if self._closed.is_set() or self.role != ControllerRole.ACTIVE:
                self.logic.fail_requests(NotControllerError(
                    f"broker {self.broker_id}'s controller is not active"))
                continue
            with self._activation_lock:
                activation, self._activation = self._activation, None
            if activation is not None:
                self.logic.activate(*activation)
            start = time.monotonic()
            try:
                self.logic.handle_requests()
                self.logic.tick()
                self.ticks += 1
                self.last_error = None
            except ControllerMovedError as exc:
                self.last_error = repr(exc)
                self._role = ControllerRole.STANDBY
            except CoordinationError as exc:
                self.last_error = repr(exc)
                self.logic.wake.set()
                self._closed.wait(0.2)
            except Exception as exc:  # noqa: BLE001 - a bug must not kill the loop
                log.exception("controller %d tick failed", self.broker_id)
                self.last_error = repr(exc)
                self._closed.wait(0.5)
            if time.monotonic() - start > 5:
                log.warning("controller %d: slow tick %.1fs", self.broker_id,
                            time.monotonic() - start)

    def _leave_if_killed(self) -> None:
        """When Ray no longer knows this process as the candidate of its broker, leave the
        election, end the ZooKeeper session and end the process (should Ray have answered
        wrongly, the broker's supervisor then starts a new candidate).

        Ray marks a killed actor dead (and releases its name, which a restarted broker's new
        candidate then takes) before the process is gone, and a process can outlive its
        kill for good (ray-project/ray#52322): a killed candidate's kazoo thread would keep
        its session, and with it /controller, alive, so that no live candidate is ever
        elected. (Seen under load: the restarted broker's candidate and the two others all
        standbys for minutes, /controller held by the killed candidate's session.)"""
        try:
            alive = raycompat.holds_own_name(controller_actor_name(self.broker_id),
                                             self.conf["namespace"])
        except Exception:  # noqa: BLE001 - the GCS did not answer: ask again next time
            return
        if alive:
            return
        log.warning("controller %d: Ray no longer knows this candidate by its name (it was "
                    "killed, or its broker was): leaving the election", self.broker_id)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - its session ends with the process anyway
            log.exception("controller %d: closing after the kill failed", self.broker_id)
        logging.shutdown()
        os._exit(0)

    def status(self) -> dict:
        st = self.candidate.status()
        role = self.role
        credentials = self.zk.credentials
        error = self.candidate.error
        return {"broker_id": self.broker_id, "role": role, "epoch": st.epoch,
                "ticks": self.ticks, "last_error": self.last_error,
                # the candidate's own view: whom /controller named at its last read, its
                # ZooKeeper session and connection, and the error of its last round
                "follows": st.controller_id, "candidate_role": st.role.value,
                "session": f"{credentials[0]:x}" if credentials else None,
                "zk_state": str(self.zk.state),
                "candidate_error": repr(error) if error is not None else None,
                "dead_controller_sessions_ended": self.watch.sessions_ended,
                "requests": self.logic.status() if role == ControllerRole.ACTIVE else None}

    def wake(self) -> None:
        self.logic.wake.set()

    def session_credentials(self) -> tuple[int, bytes] | None:
        """This candidate's ZooKeeper session (id, password), for the standbys'
        ActiveControllerWatch: they end it once Ray reports this actor dead."""
        return self.zk.credentials

    def await_stop(self, timeout_s: float = 30.0) -> str:
        """The standbys' watch on this controller: "stopped" once it closes, "running" after
        ``timeout_s``; Ray fails the call with ActorDiedError when this actor dies."""
        return "stopped" if self._closed.wait(min(float(timeout_s), 300.0)) else "running"

    def alter_partition(self, topic: str, partition: int, leader_id: int, leader_epoch: int,
                        new_isr: list[int], zk_version: int,
                        timeout_s: float = ALTER_PARTITION_TIMEOUT_S) -> dict:
        """A leader's ISR change (forwarded by its Broker), answered by the loop thread:
        ``{leader, leader_epoch, isr, zk_version}``; NotControllerError when this candidate
        is not active, FencedLeaderEpochError / InvalidUpdateVersionError as
        ``ControllerLogic.alter_partition`` says, RequestTimedOutError after ``timeout_s``."""
        if self.role != ControllerRole.ACTIVE:
            raise NotControllerError(f"broker {self.broker_id}'s controller is not active")
        future = self.logic.submit_alter_partition(topic, partition, leader_id, leader_epoch,
                                                   new_isr, zk_version)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimedOutError(
                f"controller {self.broker_id}: no answer to the ISR change of "
                f"{topic}-{partition} within {timeout_s}s") from None

    def close(self) -> None:
        self._closed.set()
        self.watch.stop()
        self.logic.wake.set()
        self.logic.fail_requests(NotControllerError(
            f"broker {self.broker_id}'s controller is closing"))
        try:
            self.candidate.close()
        finally:
            self.zk.close()
