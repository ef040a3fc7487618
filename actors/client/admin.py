"""Admin: topics, leadership and reassignment, as API.md names them.

Requests go to any live broker, which validates them and writes ZooKeeper; the controller
acts on what is written. Calls that change the cluster wait (with a timeout) until the change
is visible in the metadata, so a topic is usable when ``create_topic`` returns and a
reassignment is done when ``reassign_partitions`` returns.

Partition health is read from the metadata alone (leader, isr, replicas of each partition),
as Kafka's ``kafka-topics --describe --under-replicated-partitions / --unavailable-partitions``
do: a partition is *offline* when it has no leader (-1), *under-replicated* when it has one
but its ISR is smaller than its replica list (``partition_health``, ``health_summary``).
"""

from __future__ import annotations

import random
import time

from coordination.credentials import MIN_ITERATIONS, scram_credential, user_path

from .. import raycompat
from ..protocol import unwrap, validate_topic_name
from .metadata import answers_within, first_answer
from ..errors import (IllegalArgumentError, IllegalStateError, InvalidReplicaAssignmentError,
                      KafkaError, KafkaTimeoutError, NoBrokersAvailable,
                      UnknownTopicOrPartitionError)

ray = raycompat.ray

ADMIN_TIMEOUT_S = 60.0
REASSIGN_TIMEOUT_S = 300.0
# How long a describe or list waits for the figures only a live leader or coordinator has
# (offsets, group lists), all asked at once: what does not come in time shows as unknown.
LIVE_ANSWER_TIMEOUT_S = 1.0
# How long describe_group waits for the group's coordinator (the group's state is nowhere
# else): a paused coordinator makes it fail with that broker's name instead of hanging.
COORDINATOR_ANSWER_TIMEOUT_S = 3.0


# -- partition health (pure: from one partition's metadata) ------------------------------------
def partition_health(state: dict) -> dict:
    """``{"offline": bool, "under_replicated": bool}`` of a partition's metadata
    (``leader``, ``isr``, ``replicas``): offline without a leader; under-replicated with a
    leader and an ISR smaller than the replica list."""
    offline = state["leader"] < 0
    return {"offline": offline,
            "under_replicated": not offline and len(state["isr"]) < len(state["replicas"])}


def health_summary(topics: dict) -> dict:
    """Counts over a metadata snapshot's ``topics`` ({topic: {partition: state}}):
    ``partitions``, ``under_replicated``, ``offline``."""
    out = {"partitions": 0, "under_replicated": 0, "offline": 0}
    for parts in topics.values():
        for state in parts.values():
            health = partition_health(state)
            out["partitions"] += 1
            out["under_replicated"] += health["under_replicated"]
            out["offline"] += health["offline"]
    return out


def _assigned(assignment) -> list[tuple[str, int]]:
    """A member's partitions from the coordinator's view: Kafka's consumer protocol
    assignment bytes (any client's), or the list form of an older raykafka member;
    bytes of another protocol type (not a consumer's) show as no partition."""
    from .consumer_protocol import decode_assignment
    if isinstance(assignment, (bytes, bytearray)):
        try:
            return decode_assignment(assignment)
        except ValueError:
            return []
    return sorted(tuple(tp) for tp in (assignment or []))


# -- reassignment plans (pure) -------------------------------------------------------------------
def parse_reassignment(plan) -> dict[tuple[str, int], list[int]]:
    """``{(topic, partition): [broker ids]}`` from a plan given either that way or in
    Kafka's JSON shape (``{"version": 1, "partitions": [{"topic", "partition",
    "replicas", "log_dirs"?}]}``, what kafka-reassign-partitions reads), checked locally:
    IllegalArgumentError for a wrong shape or type (a bool is not an int), InvalidTopicError
    for a bad topic name, InvalidReplicaAssignmentError for an empty plan, a partition listed
    twice, an empty replica list, a broker listed twice or a ``log_dirs`` other than "any"."""
    if isinstance(plan, dict) and "partitions" in plan and not any(
            isinstance(k, tuple) for k in plan):
        entries = _json_entries(plan)
    elif isinstance(plan, dict):
        entries = []
        for key, replicas in plan.items():
            if not isinstance(key, tuple) or len(key) != 2:
                raise IllegalArgumentError(f"a reassignment maps (topic, partition) to a list "
                                           f"of broker ids; got the key {key!r}")
            entries.append((key[0], key[1], replicas, None))
    else:
        raise IllegalArgumentError(f"a reassignment is a dict {{(topic, partition): [broker "
                                   f"ids]}}, got {type(plan).__name__}")
    if not entries:
        raise InvalidReplicaAssignmentError("the reassignment lists no partition")
    out: dict[tuple[str, int], list[int]] = {}
    for topic, partition, replicas, log_dirs in entries:
        validate_topic_name(topic)
        if not _is_int(partition) or partition < 0:
            raise IllegalArgumentError(f"{topic}: partition must be an int >= 0, got "
                                       f"{partition!r}")
        where = f"{topic}-{partition}"
        if (topic, partition) in out:
            raise InvalidReplicaAssignmentError(f"{where} is listed twice")
        if not isinstance(replicas, (list, tuple)) or \
                not all(_is_int(b) and b >= 0 for b in replicas):
            raise IllegalArgumentError(f"{where}: replicas must be a list of broker ids "
                                       f"(ints >= 0), got {replicas!r}")
        if not replicas:
            raise InvalidReplicaAssignmentError(f"{where}: the replica list is empty")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(f"{where}: broker listed twice in "
                                                f"{list(replicas)}")
        if log_dirs is not None and (not isinstance(log_dirs, list) or
                                     len(log_dirs) != len(replicas) or
                                     any(d != "any" for d in log_dirs)):
            raise InvalidReplicaAssignmentError(f"{where}: log_dirs must be \"any\" for each "
                                                f"replica (one log dir per broker here), got "
                                                f"{log_dirs!r}")
        out[(topic, partition)] = list(replicas)
    return out


def reassignment_json(plan: dict[tuple[str, int], list[int]]) -> dict:
    """Kafka's JSON shape of a parsed plan (what the broker's ``reassign_partitions``
    takes)."""
    return {"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(plan.items())]}


def _json_entries(plan: dict) -> list:
    version = plan.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise IllegalArgumentError(f"reassignment version {version!r} is not supported "
                                   f"(only 1)")
    parts = plan["partitions"]
    if not isinstance(parts, list):
        raise IllegalArgumentError(f"\"partitions\" must be a list, got "
                                   f"{type(parts).__name__}")
    entries = []
    for i, entry in enumerate(parts):
        if not isinstance(entry, dict) or not {"topic", "partition", "replicas"} <= set(entry):
            raise IllegalArgumentError(f"partitions[{i}] must be an object with \"topic\", "
                                       f"\"partition\" and \"replicas\", got {entry!r}")
        extra = set(entry) - {"topic", "partition", "replicas", "log_dirs"}
        if extra:
            raise IllegalArgumentError(f"partitions[{i}] has unknown fields "
                                       f"{sorted(extra)}")
        entries.append((entry["topic"], entry["partition"], entry["replicas"],
                        entry.get("log_dirs")))
    return entries


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Admin:
    """Requests go to the broker that answers a ping first (``_answering_brokers``), and
    the live figures of describe/list calls are asked of every leader or coordinator at once
    and awaited for at most ``live_timeout_s``: a paused or killed broker never holds an
    admin call up while another broker answers."""

    def __init__(self, cluster, *, timeout_s: float = ADMIN_TIMEOUT_S,
                 live_timeout_s: float = LIVE_ANSWER_TIMEOUT_S):
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.live_timeout_s = live_timeout_s

    def _answering_brokers(self) -> list[int]:
        """The cluster's broker ids, the first to answer a ping sent to all at once in
        front, the others after it in random order (the request goes to a broker that
        answers, not to a paused one that would hold it for ``timeout_s``)."""
        ids = self.cluster.broker_ids()
        random.shuffle(ids)
        refs, _ = self._ping(ids)       # one not running is asked last, in case it is back
        first, _ = first_answer(refs, self.timeout_s)
        return ([first] if first is not None else []) + [b for b in ids if b != first]

    def _ping(self, ids) -> tuple[dict, list[int]]:
        """A ping sent to each of brokers ``ids`` at once: ``({object ref: broker id},
        [ids of the brokers not running])``."""
        refs, not_running = {}, []
        for bid in ids:
            try:
                refs[self.cluster.broker(bid).ping.remote()] = bid
            except ValueError:
                not_running.append(bid)
        return refs, not_running

    def _call(self, method: str, *args):
        """Call ``method`` on a live broker; typed errors from the broker pass through."""
        last: BaseException | None = None
        for bid in self._answering_brokers():
            try:
                handle = self.cluster.broker(bid)
            except ValueError as exc:
                last = exc
                continue
            try:
                call = getattr(handle, method)
            except AttributeError:
                raise IllegalStateError(f"the brokers of this cluster do not take the "
                                        f"{method!r} request (an older version?)") from None
            try:
                return ray.get(call.remote(*args), timeout=self.timeout_s)
            except KafkaError as exc:             # the broker's typed error, not Ray's wrapper
                raise unwrap(exc) from None
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                last = exc
                continue
        raise NoBrokersAvailable(f"no broker answered {method} ({last!r})")

    # -- users (SCRAM credentials) -----------------------------------------------------------------
    def create_user(self, name: str, password: str, mechanism: str | None = None, *,
                    mechanisms=("SCRAM-SHA-256", "SCRAM-SHA-512"),
                    iterations: int = MIN_ITERATIONS) -> None:
        """Give user ``name`` SCRAM credentials for ``password`` (salted and iterated
        here: the password never leaves this process): for ``mechanism`` alone when given,
        else one per ``mechanisms`` (both SCRAM mechanisms); an existing user's credentials
        for those mechanisms are replaced (a password change)."""
        if mechanism is not None:
            mechanisms = (mechanism,)
        try:
            user_path(name)
            creds = {m: scram_credential(m, password, iterations=iterations).to_string()
                     for m in mechanisms}
        except ValueError as exc:
            raise IllegalArgumentError(str(exc)) from None
        self._call("set_user_credentials", name, creds)

    def delete_user(self, name: str) -> bool:
        """Remove user ``name``'s credentials (False when it had none). Connections it
        already opened stay open."""
        return self._call("delete_user", name)

    def list_users(self) -> list[str]:
        """The users with SCRAM credentials, sorted."""
        return sorted(self.user_mechanisms())

    def user_mechanisms(self) -> dict[str, list[str]]:
        """Every user with SCRAM credentials -> its mechanisms."""
        return self._call("list_users")

    # -- topics ------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None) -> None:
        validate_topic_name(name)
        if config is not None and not isinstance(config, dict):
            from ..errors import InvalidConfigurationError
            raise InvalidConfigurationError(f"config must be a dict, got {type(config).__name__}")
        self._call("create_topic", name, partitions, replication_factor, config)
        self.cluster.metadata.wait_for_leaders(name, timeout_s=self.timeout_s)

    def create_partitions(self, name: str, total: int,
                          assignment: list | None = None) -> dict[int, list[int]]:
        """Grow topic ``name`` to ``total`` partitions (kafka-python's ``create_partitions``,
        Kafka's ``kafka-topics --alter --partitions``): the new ones are placed over the
        live brokers with the topic's replication factor and config, or on ``assignment``
        (one broker id list per new partition). Returns the new partitions' replicas once
        every live broker's metadata shows them with leaders. Existing partitions and their
        records are untouched, so a key may now hash to another partition.
        InvalidPartitionsError unless ``total`` exceeds the current count;
        UnknownTopicOrPartitionError for a topic that does not exist;
        InvalidReplicaAssignmentError for an assignment that does not fit (the broker checks
        both, as for Kafka's CreatePartitions)."""
        validate_topic_name(name)
        added = self._call("create_partitions", name, total, assignment)
        self.cluster.metadata.wait_for_leaders(name, timeout_s=self.timeout_s,
                                               partitions=total)
        return {int(p): list(r) for p, r in added.items()}

    def delete_topic(self, name: str) -> None:
        self._call("delete_topic", name)
        self.cluster.metadata.wait_for_leaders(name, timeout_s=self.timeout_s, exists=False)
        deadline = time.monotonic() + self.timeout_s
        while self._call("topic_exists", name):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"topic {name!r} not deleted after {self.timeout_s}s")
            time.sleep(0.05)

    def list_topics(self) -> list[str]:
        return sorted(self._call("list_topics"))

    def alter_topic_config(self, name: str, config: dict) -> dict:
        return self._call("alter_topic_config", name, config)

    def topic_config(self, name: str) -> dict:
        return self._call("topic_config", name)

    def describe_topic(self, name: str) -> list[dict]:
        """One dict per partition: its metadata (``leader, replicas, isr, leader_epoch``,
        ``partition_health``) and the leader's ``log_start_offset, high_watermark,
        log_end_offset``, None where the leader gave nothing within ``live_timeout_s``."""
        return self.describe_topics([name])[name]

    def describe_topics(self, names=None) -> dict[str, list[dict]]:
        """``{topic: describe_topic(topic)}`` for ``names`` (None: every topic of the
        metadata), every leader of them all asked at once: one ``live_timeout_s`` at most,
        however many topics have a silent leader."""
        topics = self.cluster.metadata.refresh().get("topics", {})
        names = sorted(topics) if names is None else list(names)
        for name in names:
            validate_topic_name(name)
            if name not in topics:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        states, _ = self._leader_states({(name, p): st["leader"] for name in names
                                         for p, st in topics[name].items()})
        return {name: [self._partition_row(name, p, topics[name][p], states.get((name, p), {}))
                       for p in sorted(topics[name])] for name in names}

    @staticmethod
    def _partition_row(name: str, partition: int, st: dict, live: dict) -> dict:
        return {"topic": name, "partition": partition, "leader": st["leader"],
                "replicas": list(st["replicas"]), "isr": list(st["isr"]),
                "leader_epoch": st["leader_epoch"],
                "log_start_offset": live.get("log_start_offset"),
                "high_watermark": live.get("high_watermark"),
                "log_end_offset": live.get("log_end_offset"), **partition_health(st)}

    def _leader_states(self, leaders: dict) -> tuple[dict, list[int]]:
        """The leader replicas' own ``state()`` for ``leaders`` ({(topic, partition): leader
        broker id} from the metadata; -1, no leader, is skipped), every leader asked at once
        and all awaited together for at most ``live_timeout_s``: ``({(topic, partition):
        state}, sorted ids of the brokers whose leaders gave nothing in time)``."""
        refs, silent = {}, set()
        for (topic, partition), broker_id in leaders.items():
            if broker_id < 0:
                continue
            try:
                handle = self.cluster.metadata.leader(topic, partition).handle
            except KafkaError:                  # its replica actor is gone (killed broker)
                silent.add(broker_id)
                continue
            refs[handle.state.remote()] = ((topic, partition), broker_id)
        answers, missing = answers_within(refs, self.live_timeout_s)
        silent.update(broker_id for _, broker_id in missing)
        return {tp: state for (tp, _), state in answers.items()}, sorted(silent)

    # -- leadership ------------------------------------------------------------------------------
    def elect_preferred_leaders(self, topic: str | None = None) -> dict:
        """Make each partition's preferred replica (the first listed) its leader where it is
        in the ISR, for ``topic`` or every topic; returns when the metadata shows it done
        (KafkaTimeoutError after ``timeout_s``). A partition whose preferred broker does not
        answer a ping within ``live_timeout_s`` (paused, or killed before its ZooKeeper
        session ended) is left as it is: electing it would give the partition a leader that
        serves nothing. Returns ``{"skipped": [(topic, partition)], "unanswered_brokers":
        [ids]}``, those left out and why."""
        topics = self.cluster.metadata.refresh().get("topics", {})
        if topic is not None and topic not in topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        silent = set(self._silent_brokers())
        partitions, skipped = [], []
        for t, parts in sorted(topics.items()):
            for p, st in sorted(parts.items()):
                if topic in (None, t):
                    preferred = st["replicas"][0] if st["replicas"] else -1
                    (skipped if preferred in silent else partitions).append((t, p))
        if partitions:
            self._call("elect_preferred_leaders", partitions)
        deadline = time.monotonic() + self.timeout_s
        while True:
            snap = self.cluster.metadata.refresh().get("topics", {})
            pending = [(t, p) for t, p in partitions
                       if snap.get(t, {}).get(p, {}).get("replicas")
                       and snap[t][p]["replicas"][0] in snap[t][p]["isr"]
                       and snap[t][p]["leader"] != snap[t][p]["replicas"][0]]
            if not pending:
                return {"skipped": skipped, "unanswered_brokers": sorted(
                    {topics[t][p]["replicas"][0] for t, p in skipped})}
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"preferred leaders not elected for {pending[:5]}")
            time.sleep(0.1)

    def _silent_brokers(self) -> list[int]:
        """The broker ids that do not answer a ping (sent to all at once) within
        ``live_timeout_s``."""
        refs, not_running = self._ping(self.cluster.broker_ids())
        _, missing = answers_within(refs, self.live_timeout_s)
        return sorted(not_running + missing)

    def reassign_partitions(self, plan: dict, *, timeout_s: float = REASSIGN_TIMEOUT_S
                            ) -> None:
        """Move partitions to new replica sets: ``{(topic, partition): [broker ids]}`` (or
        Kafka's JSON shape). Checked here first (``parse_reassignment``: types, duplicates,
        topic names; unknown topics or partitions raise UnknownTopicOrPartitionError), then
        by the broker (brokers that exist; ReassignmentInProgressError while another one
        runs). Returns when the metadata shows every partition on its new replica set
        (KafkaTimeoutError after ``timeout_s``): the new replicas caught up and the old ones
        removed."""
        moves = parse_reassignment(plan)
        topics = self.cluster.metadata.refresh(newest=True).get("topics", {})
        for topic, partition in moves:
            if topic not in topics:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
            if partition not in topics[topic]:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} (partitions "
                    f"0..{len(topics[topic]) - 1})")
        self._call("reassign_partitions", reassignment_json(moves))
        deadline = time.monotonic() + timeout_s
        while True:
            snap = self.cluster.metadata.refresh(newest=True).get("topics", {})
            pending = sorted(tp for tp, replicas in moves.items()
                             if snap.get(tp[0], {}).get(tp[1], {}).get("replicas") != replicas)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"reassignment not done after {timeout_s}s for "
                                        f"{pending[:5]}{' ...' if len(pending) > 5 else ''}")
            time.sleep(0.1)

    def cluster_health(self) -> dict:
        """``health_summary`` of the whole cluster (partitions, under_replicated, offline)
        plus ``partitions_at_risk``: ``[(topic, partition, "offline"|"under-replicated")]``."""
        topics = self.cluster.metadata.refresh().get("topics", {})
        out = health_summary(topics)
        out["partitions_at_risk"] = [
            (t, p, "offline" if h["offline"] else "under-replicated")
            for t in sorted(topics) for p in sorted(topics[t])
            for h in [partition_health(topics[t][p])] if h["offline"] or h["under_replicated"]]
        return out

    # -- consumer groups ---------------------------------------------------------------------------
    def list_groups(self) -> list[str]:
        """Every group a coordinator knows (with members, or with committed offsets), and
        every group under ZooKeeper's /consumers (offsets_storage="zookeeper", the seed's
        registry) when ZooKeeper can be read."""
        return self.group_listing()["groups"]

    def group_listing(self) -> dict:
        """``{"groups": list_groups()'s names, "unanswered_brokers": [ids]}``: every
        coordinator is asked at once and awaited for at most ``live_timeout_s``; the groups
        of those that did not answer in time (a paused broker) are missing, and their broker
        ids listed."""
        from ..protocol import group_coordinator_actor_name
        refs = {}
        for bid in self.cluster.broker_ids():
            try:
                handle = ray.get_actor(group_coordinator_actor_name(bid),
                                       namespace=self.cluster.namespace)
            except ValueError:
                continue                    # this broker coordinates no group
            refs[handle.list_groups.remote()] = bid
        answers, silent = answers_within(refs, self.live_timeout_s)
        names: set[str] = set()
        for groups in answers.values():
            names.update(groups)
        zk_groups, _ = self._zk_groups(None)
        names.update(zk_groups)
        return {"groups": sorted(names), "unanswered_brokers": sorted(silent)}

    def _zk_groups(self, groups) -> tuple[dict, str | None]:
        """``({group: {(topic, partition): offset}}, None)`` from ZooKeeper's /consumers, or
        ``({}, why)`` when the cluster has no ZooKeeper address or it cannot be read."""
        zk_hosts = getattr(self.cluster, "zk_hosts", None)
        if not zk_hosts:
            return {}, "the cluster has no ZooKeeper address"
        from ..errors import ZooKeeperUnavailableError
        from .zk_consumer import read_groups
        try:
            return read_groups(zk_hosts, groups, timeout_s=min(self.timeout_s, 10.0)), None
        except ZooKeeperUnavailableError as exc:
            return {}, str(exc)

    def describe_group(self, group: str) -> dict:
        """``{"state", "generation", "protocol", "leader", "members": {member id:
        [(topic, partition)]}, "offsets": {(topic, partition): {"committed", "kafka",
        "zookeeper", "log_end", "lag"}}, "zookeeper_error"}``.

        ``kafka`` is the offset the coordinator holds (``__consumer_offsets``),
        ``zookeeper`` the one in ``/consumers/<group>/offsets`` (offsets_storage=
        "zookeeper", dual_commit), None where a store has none; ``committed`` is the larger,
        what a dual_commit consumer resumes from. ``zookeeper_error`` says why ZooKeeper
        was not read (None when it was). A group known only to ZooKeeper has state "Empty"
        and no members. GroupIdNotFoundError for a group nobody knows.

        ``log_end`` (the high watermark, what a consumer can reach) comes from the
        partitions' leaders, all asked at once for at most ``live_timeout_s``: where a
        leader gives nothing in time ``log_end`` and ``lag`` are None and its broker is in
        ``unanswered_brokers``. The coordinator gets COORDINATOR_ANSWER_TIMEOUT_S (the
        group's state is nowhere else): KafkaTimeoutError naming its broker after that."""
        from ..errors import GroupIdNotFoundError
        from .group import GroupMember
        member = GroupMember(self.cluster.metadata, group)
        # the lookup waits as long as any admin call: on a fresh cluster it creates the
        # offsets topic, whose partitions need a few seconds to get their leaders
        self._retry_group(member.coordinator)
        wait_s = COORDINATOR_ANSWER_TIMEOUT_S
        try:
            desc = self._retry_group(lambda: member._call("describe_group", group,
                                                          timeout_s=wait_s), timeout_s=wait_s)
        except KafkaTimeoutError:
            raise KafkaTimeoutError(f"the coordinator of group {group!r} (broker "
                                    f"{member.coordinator_id}) did not answer within "
                                    f"{wait_s:g}s") from None
        zk, zk_error = self._zk_groups([group])
        in_zk = zk.get(group, {})
        if desc["state"] == "Dead":
            if not in_zk:
                raise GroupIdNotFoundError(f"no group {group!r}")
            desc = {**desc, "state": "Empty"}
        tps = sorted(set(desc["offsets"]) | set(in_zk))
        leaders = {}
        for tp in tps:
            try:
                leaders[tp] = self.cluster.metadata.partition_state(*tp)["leader"]
            except KafkaError:                  # a deleted topic's offsets: no log end
                continue
        states, silent = self._leader_states(leaders)
        offsets = {}
        for tp in tps:
            kafka, zookeeper = desc["offsets"].get(tp), in_zk.get(tp)
            committed = max(o for o in (kafka, zookeeper) if o is not None)
            end = states.get(tp, {}).get("high_watermark")
            offsets[tp] = {
                "committed": committed, "kafka": kafka, "zookeeper": zookeeper,
                "log_end": end, "lag": None if end is None else max(end - committed, 0)}
        return {"group": group, "state": desc["state"], "generation": desc["generation"],
                "protocol": desc["protocol"], "leader": desc["leader"],
                "members": {mid: _assigned(m["assignment"])
                            for mid, m in desc["members"].items()},
                "offsets": offsets, "zookeeper_error": zk_error,
                "unanswered_brokers": silent}

    def delete_group_offsets(self, group: str, partitions=None) -> int:
        """Delete the group's committed offsets (all, or ``partitions``) from both stores:
        tombstones in ``__consumer_offsets`` and the ZooKeeper nodes
        ``/consumers/<group>/offsets/<t>/<p>`` (offsets_storage="zookeeper", dual_commit;
        topic nodes left empty go too). NonEmptyGroupError while the group has members: at
        the coordinator, or consumers registered live under ``/consumers/<group>/ids``.
        ZooKeeperUnavailableError when ZooKeeper cannot be reached. Returns how many
        (topic, partition)s were deleted, each counted once even if both stores held it."""
        from .group import GroupMember
        member = GroupMember(self.cluster.metadata, group)
        tps = None if partitions is None else [list(tp) for tp in partitions]
        return self._retry_group(lambda: member._call("delete_group_offsets", group, tps))

    def _retry_group(self, fn, *, timeout_s: float | None = None):
        from ..errors import (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                              NotCoordinatorError)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                return fn()
            except (CoordinatorLoadInProgressError, CoordinatorNotAvailableError,
                    NotCoordinatorError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- ACLs (a cluster started with an authorizer: authorizer.class.name, secure=True) -----
    @staticmethod
    def _acl(principal, resource_type, resource_name, operation, permission, pattern_type,
             host) -> dict:
        return {"principal": principal, "resource_type": resource_type,
                "resource_name": resource_name, "operation": operation,
                "permission": permission, "pattern_type": pattern_type, "host": host}

    def create_acl(self, principal: str, resource_type: str, resource_name: str,
                   operation: str, permission: str = "allow", pattern_type: str = "literal",
                   host: str = "*") -> None:
        """Allow (or deny) ``principal`` (``"User:alice"``, ``"User:*"``) the
        ``operation`` (``"read"``, ``"write"``, ``"create"``, ``"delete"``,
        ``"describe"``, ``"alter"``, ``"describe_configs"``, ``"alter_configs"``,
        ``"cluster_action"``, ``"idempotent_write"``, ``"all"``) on a resource
        (``"topic"``, ``"group"``, ``"cluster"`` named ``"kafka-cluster"``,
        ``"transactional_id"``), literal (``"*"``: all of that type) or prefixed; Kafka's
        model and ZooKeeper layout. IllegalArgumentError for a bad word,
        SecurityDisabledError when the cluster has no authorizer. Brokers apply it within
        moments (they watch ZooKeeper's ACL change notifications)."""
        self._call("create_acls", [self._acl(principal, resource_type, resource_name,
                                             operation, permission, pattern_type, host)])

    def delete_acl(self, principal: str, resource_type: str, resource_name: str,
                   operation: str, permission: str = "allow", pattern_type: str = "literal",
                   host: str = "*") -> bool:
        """Delete exactly that binding (the arguments of ``create_acl``); whether it
        existed."""
        return bool(self._call("delete_acls", [self._acl(
            principal, resource_type, resource_name, operation, permission, pattern_type,
            host)]))

    def list_acls(self) -> list[dict]:
        """Every binding: dicts with ``principal``, ``host``, ``resource_type``,
        ``resource_name``, ``pattern_type``, ``operation``, ``permission`` in the words
        ``create_acl`` takes."""
        return self._call("list_acls")
