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
             its current incarnation, then (once no first-attempt LeaderAndIsr is in
             flight, so clients do not learn of leaders before the leaders do; held at most
             METADATA_HOLD_S) the metadata snapshot to every live broker. Requests go out to all brokers at once
             through the ControllerChannel (channel.py) and are answered on a later tick;
             they are stamped with the controller epoch and a request id (brokers refuse
             older stamps);
5. clean up  topic deletions (StopReplica with delete to every live hosting broker; once all
             have answered, the znodes go; a broker that was down meets the topic's next
             incarnation under another topic id and drops its stale directory), completed
             admin requests, and /config/changes notifications older than 15 minutes.

Watches and answers only set an event that wakes the loop; the loop re-reads ZooKeeper and
decides. ``ControllerLogic`` touches Ray only through its transport, so it runs in unit tests
with a fake store and a fake transport (tests/test_controller_logic.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from coordination import zk_layout as L
from coordination.election import ControllerCandidate
from coordination.errors import (ControllerMovedError, CoordinationError, NodeAlreadyExistsError,
                                 NodeMissingError, VersionConflictError)
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore

from ..protocol import ControllerRole
from .channel import ControllerChannel, RayBrokerTransport, RequestKind, RequestStatus

log = logging.getLogger(__name__)

TICK_S = 1.0
CONFIG_CHANGE_EXPIRY_MS = 15 * 60 * 1000       # Kafka's changeExpirationMs
CONFIG_CHANGE_PURGE_INTERVAL_S = 60.0
#: How long new metadata waits for LeaderAndIsr answers before it goes out anyway. Only a
#: broker's first attempt holds it: a broker whose LeaderAndIsr already failed or timed out
#: does not hold every client's view of the cluster again on each retry.
METADATA_HOLD_S = 30.0
#: A lost conditional update is re-read and decided again at most this often per tick.
MAX_STATE_WRITE_ATTEMPTS = 3


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


class ControllerLogic:
    """The active controller's state machine (the steps of the module docstring).

    Not thread-safe: the Controller's loop thread is its only caller (``wake`` is the one
    thing other threads touch). ``transport`` defaults to Ray (RayBrokerTransport); tests
    pass a fake one, and a fake store with the ZkStore methods used here.
    """

    def __init__(self, store: ZkStore, *, broker_id: int, namespace: str,
                 unclean_leader_election: bool = False, transport=None, clock=time.monotonic):
        self.store = store
        self.broker_id = broker_id
        self.namespace = namespace
        self.unclean = unclean_leader_election
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

    def _watch(self, *_):
        self.wake.set()

    # -- 1. observe -------------------------------------------------------------------------
    def observe(self) -> _Observed:
        obs = _Observed()
        for bid in self.store.broker_ids(watch=self._watch):
            stat = self.store.zk.exists(L.broker_path(bid))
            info = self.store.get_broker(bid)
            if stat is not None and info is not None:
                obs.brokers[bid] = stat.czxid
                obs.broker_info[bid] = {"host": info.host, "port": info.port, "rack": info.rack}
        obs.deleting = self.store.pending_topic_deletions(watch=self._watch)
        self.store.config_changes(watch=self._watch)   # an altered config wakes the loop
        for topic in self.store.topics(watch=self._watch):
            try:
                assignment, _, topic_id = self.store.get_topic(topic, watch=self._watch)
            except NodeMissingError:
                continue
            obs.topic_ids[topic] = topic_id
            parts = {}
            for p, replicas in assignment.items():
                part = _Partition(list(replicas))
                try:
                    part.state, part.zk_version = self.store.get_partition_state(topic, p)
                except NodeMissingError:
                    pass
                parts[p] = part
            obs.topics[topic] = parts
            obs.configs[topic] = self.store.get_topic_config(topic)
        return obs

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
                for topic, topic_id in req.items:
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
            for p, part in parts.items():
                wanted = (topic, p) in (preferred or ())
                settled &= self._settle_partition(topic, p, part, live, restarted, wanted)
        if settled:
            self._seen_broker_epochs = dict(obs.brokers)
            self._restart_bumped.clear()
        return settled

    def _settle_partition(self, topic: str, p: int, part: _Partition, live: set[int],
                          restarted: dict[int, int], preferred: bool) -> bool:
        for _ in range(MAX_STATE_WRITE_ATTEMPTS):
            new = self._decide(part, live, preferred)
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

    def _decide(self, part: _Partition, live: set[int], preferred: bool) -> L.PartitionState | None:
        """The partition's next state, or None to leave it as it is (pure)."""
        state = part.state
        live_replicas = [r for r in part.replicas if r in live]
        if state is None:
            if not live_replicas:
                return None  # stays new until a replica is alive
            return L.PartitionState(leader=live_replicas[0], leader_epoch=0,
                                    isr=tuple(live_replicas), controller_epoch=self.epoch)
        leader = state.leader
        isr = [r for r in state.isr if r in live]
        if preferred and part.replicas and part.replicas[0] in isr and leader != part.replicas[0]:
            return L.PartitionState(leader=part.replicas[0], leader_epoch=state.leader_epoch + 1,
                                    isr=tuple(isr), controller_epoch=self.epoch)
        if leader in live:
            if len(isr) != len(state.isr):  # a dead follower leaves the ISR
                return L.PartitionState(leader=leader, leader_epoch=state.leader_epoch,
                                        isr=tuple(isr), controller_epoch=self.epoch)
            return None
        candidates = [r for r in part.replicas if r in isr]
        if not candidates and self.unclean:
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
                         "topic_id": obs.topic_ids.get(topic)}
                key_state = (part.state.leader, part.state.leader_epoch, tuple(part.state.isr),
                             tuple(part.replicas), tuple(sorted(entry["config"].items())),
                             entry["topic_id"])
                for bid in part.replicas:
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
               for r in self.channel.in_flight(RequestKind.LEADER_AND_ISR)):
            return   # all brokers get the new metadata together, once the leaders know
        version = self._metadata_version
        for bid, czxid in sorted(obs.brokers.items()):
            if self._metadata_delivered.get(bid) == (czxid, version) or bid in lai_owed:
                continue
            if self.channel.can_send(bid, RequestKind.UPDATE_METADATA, version):
                self.channel.send(bid, czxid, RequestKind.UPDATE_METADATA, (metadata,),
                                  payload_key=version)

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
                "topics": topics}

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
        settled = self.elect(obs, preferred)
        if preferred is not None and settled:
            # only once every preferred leader was written: a lost race is retried next tick
            self.store.complete_preferred_replica_election()
        lai_owed = self.send_leader_and_isr(obs)
        self.delete_topics(obs)
        self.send_metadata(obs, lai_owed)

    def status(self) -> dict:
        return {"in_flight": len(self.channel.in_flight()), **self.channel.stats.as_dict()}


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
        self.broker_id = broker_id
        self.conf = conf
        settings = ZkSettings(hosts=conf["zk_hosts"], namespace=conf["namespace"],
                              session_timeout_s=conf.get("zk_session_timeout_s", 6.0))
        self.zk = connect(settings)
        self.store = ZkStore(self.zk)
        self.store.ensure_persistent_paths()
        self.logic = ControllerLogic(
            self.store, broker_id=broker_id, namespace=conf["namespace"],
            unclean_leader_election=str(conf.get("config", {}).get(
                "unclean.leader.election.enable", "false")).lower() == "true")
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
        while not self._closed.is_set():
            self.logic.wake.wait(TICK_S)
            self.logic.wake.clear()
            if self._closed.is_set() or self.role != ControllerRole.ACTIVE:
                continue
            with self._activation_lock:
                activation, self._activation = self._activation, None
            if activation is not None:
                self.logic.activate(*activation)
            start = time.monotonic()
            try:
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

    def status(self) -> dict:
        st = self.candidate.status()
        role = self.role
        return {"broker_id": self.broker_id, "role": role, "epoch": st.epoch,
                "ticks": self.ticks, "last_error": self.last_error,
                "requests": self.logic.status() if role == ControllerRole.ACTIVE else None}

    def wake(self) -> None:
        self.logic.wake.set()

    def close(self) -> None:
        self._closed.set()
        self.logic.wake.set()
        try:
            self.candidate.close()
        finally:
            self.zk.close()
