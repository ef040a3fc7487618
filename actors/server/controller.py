"""The Controller: one per broker, the one elected on ``/controller`` is active.

Every broker creates its Controller actor (so it lives and dies with the broker, as in Kafka);
each runs a ControllerCandidate on its own ZooKeeper session. The active one runs a
reconciliation loop: the target state is durable in ZooKeeper, the current state is observed,
and each tick runs numbered steps, each guarded, never blocking on a slow broker:

1. observe   live brokers (with their registration czxid as the broker epoch), topics and
             their assignments, partition states, pending admin requests;
2. decide    new partitions get a leader (first live replica) and an ISR; partitions whose
             leader died get a new one from the live ISR (from any live replica only when
             unclean.leader.election.enable); dead replicas leave the ISR; preferred-replica
             elections move leadership back;
3. persist   every partition-state change is a conditional update (expected zk version, and
             the controller epoch's zk version in the same multi-op, so a deposed controller's
             write fails);
4. act       LeaderAndIsr to each broker whose partitions changed (or that restarted), and the
             metadata snapshot to every live broker, all stamped with the controller epoch
             (brokers reject older epochs);
5. clean up  topic deletions (StopReplica with delete to every hosting broker, then the znodes;
             a broker that was down meets the topic's next incarnation under another topic
             id and drops its stale directory), completed admin requests, and
             /config/changes notifications older than 15 minutes.

Watches only set an event that wakes the loop; the loop re-reads ZooKeeper and decides.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import ray

from coordination import zk_layout as L
from coordination.election import ControllerCandidate
from coordination.errors import (ControllerMovedError, CoordinationError, NodeAlreadyExistsError,
                                 NodeMissingError, VersionConflictError)
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore

from ..protocol import broker_actor_name

log = logging.getLogger(__name__)

TICK_S = 1.0
BROKER_CALL_TIMEOUT_S = 10.0
CONFIG_CHANGE_EXPIRY_MS = 15 * 60 * 1000       # Kafka's changeExpirationMs
CONFIG_CHANGE_PURGE_INTERVAL_S = 60.0


@dataclass
class _Partition:
    replicas: list[int]
    state: L.PartitionState | None = None
    zk_version: int = -1


@dataclass
class _Observed:
    brokers: dict[int, int] = field(default_factory=dict)      # id -> czxid (broker epoch)
    broker_info: dict[int, dict] = field(default_factory=dict)
    topics: dict[str, dict[int, _Partition]] = field(default_factory=dict)
    configs: dict[str, dict] = field(default_factory=dict)
    deleting: list[str] = field(default_factory=list)
    topic_ids: dict[str, str] = field(default_factory=dict)


class ControllerLogic:
    """The active controller's state machine, testable with a fake ``send``."""

    def __init__(self, store: ZkStore, *, broker_id: int, namespace: str,
                 unclean_leader_election: bool = False, send=None):
        self.store = store
        self.broker_id = broker_id
        self.namespace = namespace
        self.unclean = unclean_leader_election
        self.epoch = 0
        self.epoch_zk_version: int | None = None
        self._send = send or self._ray_send
        self._sent: dict[tuple[int, str, int], tuple] = {}    # (broker, t, p) -> state sent
        self._broker_epochs_sent: dict[int, int] = {}          # broker -> czxid seen
        self._seen_broker_epochs: dict[int, int] = {}          # broker -> czxid at last elect
        self._last_metadata: dict | None = None
        self._metadata_sent_to: dict[int, int] = {}            # broker -> czxid
        self.wake = threading.Event()
        self._last_purge = float("-inf")

    def activate(self, epoch: int, epoch_zk_version: int | None) -> None:
        self.epoch = epoch
        self.epoch_zk_version = epoch_zk_version
        self._sent.clear()
        self._broker_epochs_sent.clear()
        self._seen_broker_epochs = {}
        self._metadata_sent_to.clear()
        self._last_metadata = None

    def _watch(self, *_):
        self.wake.set()

    # -- 1. observe -------------------------------------------------------------------------
    def observe(self) -> _Observed:
        obs = _Observed()
        zk = self.store.zk
        for bid in self.store.broker_ids(watch=self._watch):
            stat = zk.exists(L.broker_path(bid))
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

    # -- 2 + 3. decide and persist ------------------------------------------------------------
    def elect(self, obs: _Observed, preferred: set[tuple[str, int]] | None = None) -> None:
        live = set(obs.brokers)
        # A broker registered under a new session since the last tick restarted (or its
        # session expired) faster than we saw it leave: as Kafka does, its partitions get a
        # new leader epoch, so nothing keeps talking to the previous incarnation.
        restarted = {b for b, czxid in obs.brokers.items()
                     if self._seen_broker_epochs.get(b, czxid) != czxid}
        settled = True
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            for p, part in parts.items():
                new = self._decide(part, live, (topic, p) in (preferred or ()))
                st = part.state
                if st is not None and st.leader in restarted:
                    base = new or st
                    if (base.leader, base.leader_epoch) == (st.leader, st.leader_epoch):
                        new = L.PartitionState(leader=st.leader,
                                               leader_epoch=st.leader_epoch + 1,
                                               isr=base.isr, controller_epoch=self.epoch)
                if new is None:
                    continue
                if part.state is None:
                    try:
                        part.zk_version = self.store.create_partition_state(topic, p, new)
                    except NodeAlreadyExistsError:
                        self.wake.set()  # someone wrote it meanwhile: re-read next tick
                        settled = False
                        continue
                else:
                    try:
                        part.zk_version = self.store.update_partition_state(
                            topic, p, new, expected_version=part.zk_version,
                            controller_epoch_zk_version=self.epoch_zk_version)
                    except VersionConflictError:
                        self.wake.set()
                        settled = False
                        continue
                part.state = new
                log.info("controller %d: %s-%d leader %d epoch %d isr %s", self.broker_id,
                         topic, p, new.leader, new.leader_epoch, list(new.isr))
        if settled:
            self._seen_broker_epochs = dict(obs.brokers)

    def _decide(self, part: _Partition, live: set[int], preferred: bool) -> L.PartitionState | None:
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
    def propagate(self, obs: _Observed) -> None:
        per_broker: dict[int, list[dict]] = {}
        for topic, parts in obs.topics.items():
            if topic in obs.deleting:
                continue
            for p, part in parts.items():
                if part.state is None:
                    continue
                entry = {"topic": topic, "partition": p, "leader": part.state.leader,
                         "leader_epoch": part.state.leader_epoch, "isr": list(part.state.isr),
                         "replicas": list(part.replicas), "config": obs.configs.get(topic, {}),
                         "topic_id": obs.topic_ids.get(topic)}
                key_state = (part.state.leader, part.state.leader_epoch, tuple(part.state.isr),
                             tuple(part.replicas), tuple(sorted(entry["config"].items())),
                             entry["topic_id"])
                for bid in part.replicas:
                    if bid not in obs.brokers:
                        continue
                    restarted = self._broker_epochs_sent.get(bid) != obs.brokers[bid]
                    if restarted or self._sent.get((bid, topic, p)) != key_state:
                        per_broker.setdefault(bid, []).append((entry, key_state))
        for bid, items in per_broker.items():
            ok = self._send(bid, "leader_and_isr", self.epoch, [e for e, _ in items])
            if ok:
                for e, key_state in items:
                    self._sent[(bid, e["topic"], e["partition"])] = key_state
        for bid, czxid in obs.brokers.items():
            if bid not in per_broker or self._sent_all(bid, per_broker[bid]):
                self._broker_epochs_sent[bid] = czxid
        metadata = self.metadata_snapshot(obs)
        for bid, czxid in obs.brokers.items():
            if metadata != self._last_metadata or self._metadata_sent_to.get(bid) != czxid:
                if self._send(bid, "update_metadata", self.epoch, metadata):
                    self._metadata_sent_to[bid] = czxid
                else:
                    self._metadata_sent_to.pop(bid, None)
        self._last_metadata = metadata

    def _sent_all(self, bid: int, items) -> bool:
        return all(self._sent.get((bid, e["topic"], e["partition"])) == k for e, k in items)

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
        for topic in obs.deleting:
            parts = obs.topics.get(topic, {})
            hosts = sorted({b for part in parts.values() for b in part.replicas})
            done = True
            for bid in hosts:
                if bid in obs.brokers:
                    done &= self._send(bid, "stop_replicas", self.epoch,
                                       [(topic, p) for p in parts], True)
                # a dead broker removes the topic's directories when it starts again
            if done:
                try:
                    self.store.complete_topic_deletion(topic)
                except NodeMissingError:
                    pass
                for key in [k for k in self._sent if k[1] == topic]:
                    del self._sent[key]
                log.info("controller %d: deleted topic %s", self.broker_id, topic)
            else:
                self.wake.set()

    def preferred_requests(self) -> set[tuple[str, int]] | None:
        req = self.store.get_preferred_replica_election(watch=self._watch)
        if req is None:
            return None
        return {(t, p) for t, p in req}

    def purge_config_changes(self) -> None:
        """At most once a minute, drop /config/changes notifications older than 15 minutes
        (configs travel to replicas with LeaderAndIsr; a notification only wakes the loop)."""
        now = time.monotonic()
        if now - self._last_purge < CONFIG_CHANGE_PURGE_INTERVAL_S:
            return
        self._last_purge = now
        removed = self.store.purge_config_changes(CONFIG_CHANGE_EXPIRY_MS)
        if removed:
            log.info("controller %d: purged %d config change notifications", self.broker_id,
                     removed)

    def tick(self) -> None:
        self.purge_config_changes()
        preferred = self.preferred_requests()
        obs = self.observe()
        self.elect(obs, preferred)
        self.propagate(obs)
        if preferred is not None:
            self.store.complete_preferred_replica_election()
        if obs.deleting:
            self.delete_topics(obs)
            obs = self.observe()
            self.propagate(obs)

    # -- transport ---------------------------------------------------------------------------------
    def _ray_send(self, broker_id: int, method: str, *args) -> bool:
        """Call a broker; False (retried next tick) when it is unreachable or slow."""
        try:
            handle = ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)
            ray.get(getattr(handle, method).remote(*args), timeout=BROKER_CALL_TIMEOUT_S)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure: retry on the next tick
            log.info("controller %d: %s to broker %d failed: %r", self.broker_id, method,
                     broker_id, exc)
            self.wake.set()
            return False


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
        self._active = False
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
        self.logic.activate(epoch, self.candidate.epoch_zk_version)
        self._active = True
        self.logic.wake.set()

    def _on_resigned(self) -> None:
        self._active = False

    def _loop(self) -> None:
        while not self._closed.is_set():
            self.logic.wake.wait(TICK_S)
            self.logic.wake.clear()
            if self._closed.is_set() or not self._active or not self.candidate.is_active:
                continue
            start = time.monotonic()
            try:
                self.logic.tick()
                self.ticks += 1
                self.last_error = None
            except ControllerMovedError as exc:
                self.last_error = repr(exc)
                self._active = False
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
        return {"broker_id": self.broker_id, "active": self._active and self.candidate.is_active,
                "epoch": st.epoch, "ticks": self.ticks, "last_error": self.last_error}

    def wake(self) -> None:
        self.logic.wake.set()

    def close(self) -> None:
        self._closed.set()
        self.logic.wake.set()
        try:
            self.candidate.close()
        finally:
            self.zk.close()
