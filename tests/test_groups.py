"""Consumer groups against a real cluster (ZooKeeper, local Ray, RF=3 __consumer_offsets):
GroupMember's join/sync through the broker's GroupCoordinator, generation fencing of
commits, committed offsets surviving the coordinator's broker, and session expiry."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest

from actors import Cluster
from actors.client.group import GroupMember
from actors.errors import IllegalGenerationError, UnknownMemberIdError
from actors.protocol import OFFSETS_TOPIC, group_coordinator_actor_name
from cluster_helpers import FAST_CONFIG, ray, unique_namespace, wait_until
from cluster_helpers import local_ray  # noqa: F401 - autouse: this module's Ray

CONFIG = {**FAST_CONFIG, "offsets.topic.num.partitions": 2,
          "offsets.topic.replication.factor": 3, "group.initial.rebalance.delay.ms": 0,
          "group.min.session.timeout.ms": 1000}
SESSION_MS = 3000



@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module: each test uses its own group; the test that kills a
    broker starts it again."""
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("grp"), config=CONFIG)
    c.admin().create_topic("ev", partitions=6, replication_factor=1)
    yield c
    c.shutdown()


def coordinator_of(cluster, group: str, ask: int | None = None) -> int:
    """The broker id of ``group``'s coordinator, as broker ``ask`` (default the first)
    names it; retried while that broker cannot tell (restarted by an earlier test, it may
    not have the offsets topic's metadata yet)."""
    ask = cluster.broker_ids()[0] if ask is None else ask

    def found():
        try:
            return ray.get(cluster.broker(ask).find_coordinator.remote(group),
                           timeout=30)          # a dict: truthy even for broker 0
        except ray.exceptions.RayTaskError:
            return None
    return wait_until(found, timeout_s=60,
                      what=f"broker {ask} naming {group}'s coordinator")["broker_id"]


def restart(cluster, broker_id: int) -> None:
    """Start killed broker ``broker_id`` again and wait until the cluster serves groups as
    before: every broker holds the offsets topic's metadata with every partition led and
    nothing offline, and every leader's GroupCoordinator actor is up. A restarted broker
    starts its replicas one by one (about a second each on 2 busy cores) and gets the
    metadata after its LeaderAndIsr, so without this wait the next test's members could
    spend their whole join looking for a coordinator."""
    cluster.start_broker(broker_id)

    def in_service():
        """True, or an AssertionError naming what is not served yet (wait_until reports
        the last one, so a timeout says which broker lacked what)."""
        for b in cluster.broker_ids():
            try:
                handle = cluster.broker(b)
                offline = ray.get(handle.metadata_summary.remote(), timeout=30)["offline"]
                assert not offline, f"broker {b}: offline partitions {offline}"
                parts = (ray.get(handle.get_metadata.remote(), timeout=30).get("topics")
                         or {}).get(OFFSETS_TOPIC)
                assert parts, f"broker {b}: no metadata of {OFFSETS_TOPIC}"
                leaders = {p: part.get("leader", -1) for p, part in parts.items()}
                assert all(v >= 0 for v in leaders.values()), \
                    f"broker {b}: {OFFSETS_TOPIC} leaders {leaders}"
                for p in parts.values():
                    try:
                        ray.get_actor(group_coordinator_actor_name(p["leader"]),
                                      namespace=cluster.namespace)
                    except ValueError:
                        raise AssertionError(
                            f"no GroupCoordinator actor of broker {p['leader']}") from None
            except ray.exceptions.RayError as exc:
                raise AssertionError(f"broker {b}: {type(exc).__name__}") from None
        return True
    try:
        wait_until(in_service, timeout_s=180, interval_s=0.2,
                   what=f"the cluster serving groups again after broker {broker_id} restarted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {controller_node(cluster)}; "
                             f"controllers: {controller_states(cluster)}") from None


def controller_node(cluster) -> str:
    """Who holds /controller and in which session, and every Controller actor Ray has
    known, for a failure's message."""
    from cluster_helpers import zk_client
    from replication_helpers import controller_holder
    zk = zk_client(cluster)
    try:
        node = f"/controller: {controller_holder(zk)}"
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say what failed instead
        node = f"/controller: unread ({exc!r})"
    finally:
        zk.stop()
        zk.close()
    return f"{node}; Ray's Controller actors: {actors_of('Controller')}"


def actors_of(class_name: str) -> list:
    """Every actor of ``class_name`` the GCS has known (dead ones too; Ray's table does
    not say their namespace): (name, state, pid, whether that process still runs)."""
    import ray._private.state as ray_state
    try:
        table = ray_state.state.actor_table(None)
    except Exception as exc:  # noqa: BLE001 - a diagnostic
        return [f"unlisted ({exc!r})"]
    return [(a.get("Name"), a.get("State"), a.get("Pid"),
             bool(a.get("Pid")) and os.path.exists(f"/proc/{a.get('Pid')}"))
            for a in table.values() if a.get("ActorClassName") == class_name]


def controller_states(cluster) -> dict:
    """Each broker's controller status (role, ticks, last error, requests in flight), for
    a failure's message."""
    out = {}
    for b in cluster.broker_ids():
        try:
            out[b] = ray.get(cluster.broker(b).controller_status.remote(), timeout=10)
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say what failed instead
            out[b] = repr(exc)
    return out


def member(cluster, group="g", **kw) -> GroupMember:
    return GroupMember(cluster.metadata, group, session_timeout_ms=SESSION_MS,
                       rebalance_timeout_ms=10_000, **kw)


def join_all(members, topics=("ev",)):
    """Every member joins at once (threads), as members of one generation must. A member
    whose join is done heartbeats (and rejoins when told to) until every member's is, as a
    consumer's heartbeat thread would: on a loaded machine one join can take longer than
    the 3 s session, and a member left silent meanwhile would be expired and start the
    next rebalance (the settle loop could then go round for a minute)."""
    out, errors = {}, []
    joined = threading.Semaphore(0)
    everyone = threading.Event()

    def run(m):
        try:
            out[m] = m.join(topics)
            joined.release()
            while not everyone.wait(0.5):
                if not m.heartbeat():
                    out[m] = m.join(topics)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            joined.release()
    threads = [threading.Thread(target=run, args=(m,)) for m in members]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for _ in threads:
        joined.acquire(timeout=max(deadline - time.monotonic(), 0))
    everyone.set()
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0) + 30)
    assert not errors, errors
    return out


def settle(members, topics=("ev",)):
    """Heartbeat until every member holds an assignment of one, current generation."""
    def stable():
        if all(m.heartbeat() for m in members) and len({m.generation for m in members}) == 1:
            return True
        join_all(members, topics)
        return False
    wait_until(stable, timeout_s=60, interval_s=0.1, what="one stable generation")


def test_members_split_the_partitions_and_the_offsets_topic_is_created(cluster):
    """Three members of a new group: the offsets topic is created (compacted, RF 3), and
    once stable the six partitions are split two each, disjoint, in one generation."""
    members = [member(cluster, group="split") for _ in range(3)]
    join_all(members)
    settle(members)
    got = [set(m.assignment) for m in members]
    assert set().union(*got) == {("ev", p) for p in range(6)}
    assert sum(len(a) for a in got) == 6 and all(len(a) == 2 for a in got)
    rows = cluster.admin().describe_topic(OFFSETS_TOPIC)
    assert len(rows) == 2 and all(len(r["replicas"]) == 3 for r in rows)
    assert cluster.admin().topic_config(OFFSETS_TOPIC)["cleanup.policy"] == "compact"


def test_a_member_of_an_older_generation_cannot_commit(cluster):
    """After a rebalance the old generation's commit is refused (no split brain); the
    current generation's commit is stored and read back."""
    a = member(cluster)
    a.join(["ev"])
    old_generation = a.generation
    b = member(cluster)
    settle([a, b])
    assert a.generation > old_generation
    stale = GroupMember(cluster.metadata, "g")
    stale.member_id, stale.generation = a.member_id, old_generation
    with pytest.raises(IllegalGenerationError):
        stale.commit({("ev", 0): 5})
    a.commit({tp: 10 + tp[1] for tp in a.assignment})
    assert a.committed() == {tp: 10 + tp[1] for tp in a.assignment}
    with pytest.raises(UnknownMemberIdError):
        GroupMember(cluster.metadata, "g").commit({("ev", 0): 1})


def test_committed_offsets_survive_the_coordinators_broker(cluster):
    """Offsets committed with acks=all are still there when the coordinator's broker is
    killed: the new leader of the offsets partition loads them and answers."""
    m = member(cluster, group="durable")
    m.join(["ev"])
    m.commit({("ev", p): 100 + p for p in range(6)})
    broker_id = coordinator_of(cluster, "durable")
    cluster.kill_broker(broker_id)
    try:
        reader = GroupMember(cluster.metadata, "durable")
        got = wait_until(lambda: reader.committed() or None, timeout_s=60,
                         what="offsets from the new coordinator")
        assert got == {("ev", p): 100 + p for p in range(6)}
    finally:
        restart(cluster, broker_id)


def test_no_committed_offset_goes_backwards_while_the_coordinators_broker_dies(cluster):
    """Committed offsets never go backwards across a coordinator failover: while a member
    commits ever larger offsets every few ms and the coordinator's broker is killed, an
    observer (Consumer.committed, OffsetFetch) sees each partition's offset only grow, the
    new coordinator holds at least the last commit acknowledged before the kill, and the
    member's commits resume there (client retries, then a rejoin: the new coordinator
    knows the offsets, not the membership)."""
    from actors.errors import IllegalGenerationError, KafkaError, RebalanceInProgressError
    group = "monotonic"
    tps = [("ev", p) for p in range(6)]
    m = member(cluster, group=group)
    m.join(["ev"])
    assert sorted(m.assignment) == tps
    stop = threading.Event()
    acked: list[tuple[float, int]] = []          # (monotonic time acknowledged, offset)
    commit_errors: list[str] = []
    seen: list[tuple[float, tuple, int]] = []    # (monotonic time asked, tp, committed)
    read_errors: list[str] = []

    def commit_loop():
        offset = 1
        while not stop.is_set():
            try:
                m.commit({tp: offset for tp in tps})
                acked.append((time.monotonic(), offset))
            except (UnknownMemberIdError, IllegalGenerationError,
                    RebalanceInProgressError) as exc:
                # the new coordinator does not know the group: join it again
                commit_errors.append(type(exc).__name__)
                try:
                    m.join(["ev"], timeout_s=30)
                except KafkaError as join_exc:
                    commit_errors.append(f"join: {type(join_exc).__name__}")
            except Exception as exc:  # noqa: BLE001 - the coordinator moving: retried
                commit_errors.append(type(exc).__name__)
            offset += 1
            stop.wait(0.003)

    observer = cluster.consumer(group_id=group, zookeeper_registry=False)

    def observe_loop():
        while not stop.is_set():
            for tp in tps:
                asked = time.monotonic()
                try:
                    got = observer.committed(tp)
                except Exception as exc:  # noqa: BLE001 - no coordinator for a moment
                    read_errors.append(type(exc).__name__)
                    continue
                if got is not None:
                    seen.append((asked, tp, got))

    def coordinator_id(ask: int) -> int:
        return coordinator_of(cluster, group, ask)

    broker_id = coordinator_id(cluster.broker_ids()[0])
    survivor = next(b for b in cluster.broker_ids() if b != broker_id)
    threads = [threading.Thread(target=commit_loop, daemon=True),
               threading.Thread(target=observe_loop, daemon=True)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 20 and len(seen) >= 20, timeout_s=60,
                   what="commits acknowledged and observed before the kill")
        cluster.kill_broker(broker_id)     # returns when the coordinator actor is gone
        killed_at = time.monotonic()
        last_acked_before = max(off for at, off in acked if at <= killed_at)
        # commits resume: acknowledged after the kill, by the new coordinator
        wait_until(lambda: sum(1 for at, _ in acked if at > killed_at) >= 20,
                   timeout_s=90, interval_s=0.1, what="commits acknowledged after the kill")
        wait_until(lambda: {tp for at, tp, _ in seen if at > killed_at} == set(tps),
                   timeout_s=60, what="every partition observed after the kill")
        new_coordinator = coordinator_id(survivor)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        observer.close()
        restart(cluster, broker_id)
    assert new_coordinator != broker_id
    # (1) per partition, in the order observed, the committed offset never decreases
    for tp in tps:
        offsets = [off for _, t, off in seen if t == tp]
        backwards = [(a, b) for a, b in zip(offsets, offsets[1:]) if b < a]
        assert not backwards, f"{tp}: committed offset went backwards: {backwards[:5]}"
    # (2) what the new coordinator answers includes every commit acknowledged before
    after = [(tp, off) for at, tp, off in seen if at > killed_at]
    assert min(off for _, off in after) >= last_acked_before, (last_acked_before, after[:6])
    # (3) commits resumed past it, and the group's offsets hold the last one acknowledged
    resumed = [off for at, off in acked if at > killed_at]
    assert resumed and min(resumed) > last_acked_before
    final = wait_until(lambda: m.committed() or None, timeout_s=60, what="the final offsets")
    assert sorted(final) == tps and min(final.values()) >= acked[-1][1], (final, acked[-1])
    first_s = min(at for at, off in acked if at > killed_at) - killed_at
    print(f"\ncoordinator {broker_id} -> {new_coordinator}; {len(acked)} commits acknowledged "
          f"({len(resumed)} after the kill, the first {first_s:.2f}s after it), "
          f"{len(seen)} offsets observed; errors: commit "
          f"{sorted(set(commit_errors))}, read {sorted(set(read_errors))}")
    m.leave()


def test_consumer_group_commit_interval_commits_on_revoke_and_on_stop(cluster):
    """consumer_group(commit_interval_ms=...): a member commits what it processed at most
    every interval, and also before it gives a partition up and when it stops: with an
    interval longer than the test, the member joining later starts each partition it
    takes at the offset where the first member stopped (nothing processed twice), and
    after stop() the group's committed offsets are the log end."""
    cluster.admin().create_topic("intervals", partitions=4, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        producer.send_batch("intervals", [b"%d" % i for i in range(400)]).wait(timeout=60)
    conf = dict(commit_interval_ms=600_000, session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=300, auto_offset_reset="earliest")

    def count(records):           # local: shipped by value to the member actors
        return len(records)
    group = cluster.consumer_group("intervals", ["intervals"], 1, count, **conf)
    try:
        group.wait_for(lambda s: s["processed"] >= 400, timeout_s=60)
        (first,) = group.stats()["members"].values()
        assert first["commits"] == 0          # the interval has not passed
        group.scale(2)
        stats = group.wait_for(lambda s: len(s["members"]) == 2 and all(
            m["state"] == "running" and m["assignment"] for m in s["members"].values()),
            timeout_s=60)
        moved = [tp for m in stats["members"].values() if m["name"] != first["name"]
                 for tp in m["assignment"]]
        assert moved
        reader = cluster.consumer(group_id="intervals", zookeeper_registry=False)
        try:
            ends = {p: e for p, e in enumerate(
                cluster.simple_consumer().offsets_before("intervals", p, -1)[0]
                for p in range(4))}
            # committed on revoke: the new owner starts where the first member stopped
            assert {tp: reader.committed(tp) for tp in moved} == \
                {tp: ends[tp[1]] for tp in moved}
            final = group.stop()
            assert final["processed"] == 400, final     # nothing processed twice
            assert {p: reader.committed(("intervals", p)) for p in range(4)} == ends
        finally:
            reader.close()
    finally:
        group.stop()


def test_a_member_that_stops_heartbeating_loses_its_partitions(cluster):
    """A member that stops heartbeating is expired after its session timeout: the others
    are told to rejoin and share all six partitions."""
    a, b, c = (member(cluster, group="expiry") for _ in range(3))
    join_all([a, b, c])
    settle([a, b, c])
    # c goes silent; a and b keep heartbeating until they are told to rejoin
    wait_until(lambda: not (a.heartbeat() and b.heartbeat()), timeout_s=SESSION_MS / 1000 + 10,
               interval_s=0.2, what="a rebalance after c's session timed out")
    settle([a, b])
    assert set(a.assignment) | set(b.assignment) == {("ev", p) for p in range(6)}


class Listener:
    def __init__(self):
        self.revoked, self.assigned = [], []

    def on_partitions_revoked(self, tps):
        self.revoked.append(sorted(tps))

    def on_partitions_assigned(self, tps):
        self.assigned.append(sorted(tps))


def test_two_consumers_share_a_topic_and_the_survivor_resumes_from_the_commits(cluster):
    """Two Consumers of one group read disjoint shares of a topic (listener told of each
    assignment); offsets are committed when partitions are revoked (auto-commit) and at
    close, so the survivor, assigned every partition after the other closes, reads on from
    the commits: every record exactly once across the two."""
    with cluster.producer() as producer:
        producer.send_batch("ev", [b"r%03d" % i for i in range(120)]).wait(timeout=60)
    conf = dict(group_id="readers", auto_offset_reset="earliest", enable_auto_commit=True,
                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
    la, lb = Listener(), Listener()
    a, b = cluster.consumer(**conf), cluster.consumer(**conf)
    a.subscribe(["ev"], listener=la)
    b.subscribe(["ev"], listener=lb)
    seen = {a: [], b: []}

    def drain(c, until):
        while not until():
            for recs in c.poll(timeout_ms=200).values():
                seen[c].extend(r.value for r in recs)

    stop = threading.Event()
    tb = threading.Thread(target=drain, args=(b, stop.is_set))
    tb.start()
    try:
        drain(a, lambda: len(seen[a]) + len(seen[b]) >= 120 and a.assignment()
              and b.assignment() and not (a.assignment() & b.assignment()))
    finally:
        stop.set()
        tb.join(timeout=60)
    assert a.assignment() | b.assignment() == {("ev", p) for p in range(6)}
    assert la.assigned and lb.assigned
    b.close()
    more = []
    wait_until(lambda: (more.extend(r.value for recs in a.poll(timeout_ms=200).values()
                                    for r in recs) or True)
               and a.assignment() == {("ev", p) for p in range(6)},
               timeout_s=60, what="the survivor owns every partition")
    a.close()
    everything = seen[a] + seen[b] + more
    assert sorted(everything) == sorted(b"r%03d" % i for i in range(120))


def test_an_empty_groups_offsets_expire_after_the_retention_and_members_keep_theirs():
    """offsets.retention.minutes: the committed offsets of a group without members are
    deleted (tombstones) once older than the retention; a group that still has a member
    keeps its offsets however old."""
    config = {**CONFIG, "offsets.retention.minutes": 0.05,          # 3 s
              "offsets.retention.check.interval.ms": 500}
    c = Cluster.start(num_brokers=1, namespace=unique_namespace("expire"),
                      config={**config, "offsets.topic.replication.factor": 1})
    try:
        c.admin().create_topic("ev", partitions=2, replication_factor=1)
        # the member's commit is the older one: were membership ignored, it would expire
        # first
        stays = GroupMember(c.metadata, "stays", session_timeout_ms=SESSION_MS)
        stays.join(["ev"])
        stays.commit({("ev", 1): 9})
        stop = threading.Event()

        def beat():
            while not stop.wait(0.3):
                stays.heartbeat()
        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        try:
            gone = GroupMember(c.metadata, "gone", session_timeout_ms=SESSION_MS)
            gone.join(["ev"])
            gone.commit({("ev", 0): 7})
            gone.leave()
            reader = GroupMember(c.metadata, "gone")
            wait_until(lambda: reader.committed() == {}, timeout_s=30,
                       what="the empty group's offsets expired")
            assert stays.committed() == {("ev", 1): 9}
        finally:
            stop.set()
            beater.join(timeout=5)
    finally:
        c.shutdown()


def test_deleting_a_groups_offsets_writes_tombstones(cluster):
    """Admin.delete_group_offsets on a group without members: the offsets are gone for
    OffsetFetch, and the group's __consumer_offsets partition holds a tombstone (null value)
    for each deleted key, which compaction then removes with the key."""
    from actors.server.group_offsets import decode_key, offsets_partition
    m = member(cluster, group="tomb")
    m.join(["ev"])
    m.commit({("ev", 0): 5, ("ev", 1): 6})
    m.leave()
    assert cluster.admin().delete_group_offsets("tomb") == 2
    assert GroupMember(cluster.metadata, "tomb").committed() == {}
    partition = offsets_partition("tomb", CONFIG["offsets.topic.num.partitions"])
    consumer = cluster.simple_consumer()
    tombstones, offset = set(), 0
    while True:
        records = consumer.fetch(OFFSETS_TOPIC, partition, offset)
        if not records:
            break
        for r in records:
            key = decode_key(r.key) if r.key else None
            if key and key[0] == "tomb" and r.value is None:
                tombstones.add(key[1:])
        offset = records[-1].offset + 1
    assert tombstones == {("ev", 0), ("ev", 1)}


def test_a_pattern_subscription_picks_up_a_topic_created_after_subscribe(cluster):
    """subscribe(pattern=...) in a group: a topic created later that matches is assigned
    and read without a new subscribe (the seed's filter watch)."""
    cluster.admin().create_topic("pat-a", partitions=1, replication_factor=1)
    c = cluster.consumer(group_id="pat", auto_offset_reset="earliest",
                         session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
    c.subscribe(pattern=r"pat-.*")
    seen = set()
    try:
        with cluster.producer() as producer:
            producer.send("pat-a", b"a").get(timeout=30)
        wait_until(lambda: seen.update(r.topic for recs in c.poll(timeout_ms=200).values()
                                       for r in recs) or "pat-a" in seen,
                   timeout_s=60, what="the first topic read")
        cluster.admin().create_topic("pat-b", partitions=1, replication_factor=1)
        with cluster.producer() as producer:
            producer.send("pat-b", b"b").get(timeout=60)
        wait_until(lambda: seen.update(r.topic for recs in c.poll(timeout_ms=200).values()
                                       for r in recs) or "pat-b" in seen,
                   timeout_s=60, what="the topic created after subscribe read")
        assert ("pat-b", 0) in c.assignment()
    finally:
        c.close()


def test_a_cooperative_member_keeps_consuming_what_it_keeps_while_the_group_rebalances(
        cluster):
    """KIP-429: a cooperative-sticky member rejoins in the background, so while a
    rebalance waits (here for a member that stays silent) its polls go on returning the
    records of the partition it keeps."""
    admin = cluster.admin()
    admin.create_topic("coop-live", partitions=2, replication_factor=1)
    group = "coop-live"
    consumer = cluster.consumer(group_id=group, auto_offset_reset="earliest",
                                partition_assignment_strategy="cooperative-sticky",
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=200)
    silent = GroupMember(cluster.metadata, group, strategy="cooperative-sticky",
                         session_timeout_ms=10_000, rebalance_timeout_ms=10_000)
    late = GroupMember(cluster.metadata, group, strategy="cooperative-sticky",
                       session_timeout_ms=10_000, rebalance_timeout_ms=30_000)
    producer = cluster.producer(acks="all")
    joined = {}
    try:
        consumer.subscribe(["coop-live"])
        wait_until(lambda: consumer.poll(timeout_ms=100) is not None
                   and len(consumer.assignment()) == 2, timeout_s=60, what="both partitions")
        joiner = threading.Thread(target=lambda: joined.update(
            silent=silent.join(["coop-live"])), daemon=True)
        joiner.start()
        # the silent member takes a partition from the consumer (a handover) and then
        # never beats again: the next rebalance waits for it until its session ends (10 s)
        wait_until(lambda: consumer.poll(timeout_ms=100) is not None and "silent" in joined
                   and len(consumer.assignment()) == 1, timeout_s=30, interval_s=0,
                   what="one partition handed to the silent member")
        threading.Thread(target=lambda: joined.update(late=late.join(["coop-live"])),
                         daemon=True).start()

        def rebalance_waiting():
            consumer.poll(timeout_ms=100)
            return admin.describe_group(group)["state"] == "PreparingRebalance"
        wait_until(rebalance_waiting, timeout_s=30, interval_s=0,
                   what="a rebalance waiting for the silent member")
        (kept,) = consumer.assignment()
        for _ in range(5):
            producer.send("coop-live", b"during", partition=kept[1])
        producer.flush()
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 5 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r for r in recs if r.value == b"during"]
        assert len(got) == 5
        assert admin.describe_group(group)["state"] == "PreparingRebalance"
        # the silent member is dropped at its session timeout: the rebalance completes,
        # the consumer keeping its partition and the late member getting the other
        wait_until(lambda: consumer.poll(timeout_ms=100) is not None and "late" in joined,
                   timeout_s=60, what="the rebalance completed")
        assert consumer.assignment() == {kept}
        assert [tuple(tp) for tp in joined["late"]] == [("coop-live", 1 - kept[1])]
    finally:
        producer.close()
        consumer.close()
        late.leave()


class Poller:
    """Polls a consumer on a thread of its own, as an application does, recording
    (partition, offset) of every record it returns."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.got: list[tuple[int, int]] = []
        self.stop = threading.Event()
        self.errors: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                for recs in self.consumer.poll(timeout_ms=100).values():
                    self.got += [(r.partition, r.offset) for r in recs]
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                time.sleep(0.1)

    def offsets(self, partition: int) -> list[int]:
        return [o for p, o in self.got if p == partition]

    def close(self):
        self.stop.set()
        self.thread.join(timeout=30)
        self.consumer.close()


def _handover_topic(cluster, name: str, per_partition: int):
    cluster.admin().create_topic(name, partitions=2, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(per_partition):
            for p in (0, 1):
                producer.send(name, b"%d" % i, partition=p)
        producer.flush()
    return dict(group_id=name, auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=200, partition_assignment_strategy="cooperative-sticky")


def _first_member(cluster, conf: dict, listener) -> Poller:
    """The group's first consumer, polling on its thread, once it returned all 20."""
    consumer = cluster.consumer(**conf)
    consumer.subscribe([conf["group_id"]], listener=listener)
    poller = Poller(consumer)
    try:
        wait_until(lambda: len(poller.got) == 20, timeout_s=60, what="the first member's 20")
    except BaseException:
        poller.close()
        raise
    return poller


def _write_late(cluster, topic: str, partitions) -> None:
    """Five more records (b"late") to each of ``partitions`` of ``topic``, acks=all."""
    with cluster.producer(acks="all") as producer:
        for p in partitions:
            for _ in range(5):
                producer.send(topic, b"late", partition=p)
        producer.flush()


def _read_late(poller: Poller, partition: int, what: str) -> None:
    """``poller`` reads the five late records of ``partition``: offsets 10 to 14, once."""
    wait_until(lambda: len(poller.offsets(partition)) == 5, timeout_s=60, what=what)
    assert poller.offsets(partition) == list(range(10, 15))


def test_a_cooperative_move_takes_one_generation_and_resumes_at_the_old_owners_commit(
        cluster):
    """cooperative-sticky with the handover: a member joining gets the partition that
    moves to it in the generation of its join (one JoinGroup round; KIP-429 takes two)
    and reads it on from the offset its old owner committed when it gave it up."""
    admin = cluster.admin()
    conf = _handover_topic(cluster, "handover", 10)
    first, second = Listener(), Listener()
    pa = _first_member(cluster, conf, first)
    a, pb = pa.consumer, None
    try:
        generation = admin.describe_group("handover")["generation"]
        b = cluster.consumer(**conf)
        b.subscribe(["handover"], listener=second)
        pb = Poller(b)
        wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1,
                   timeout_s=60, what="one partition each")
        (moved,) = b.assignment()
        assert first.revoked == [[moved]] and second.assigned == [[moved]]
        described = admin.describe_group("handover")
        assert (described["state"], described["generation"]) == ("Stable", generation + 1)
        _write_late(cluster, "handover", [moved[1]])
        _read_late(pb, moved[1], "the late records read by the new owner")
        assert not pa.errors and not pb.errors
    finally:
        pa.close()
        if pb is not None:
            pb.close()


class SlowRevoke(Listener):
    """A listener whose on_partitions_revoked waits for ``gate`` (a slow commit)."""

    def __init__(self, gate: threading.Event):
        super().__init__()
        self.gate = gate
        self.revoking = threading.Event()

    def on_partitions_revoked(self, tps):
        self.revoking.set()
        assert self.gate.wait(60)
        super().on_partitions_revoked(tps)


@contextlib.contextmanager
def _held_revoke(cluster, name: str, prepare=lambda consumer: None):
    """A first member of group ``name`` (two partitions of 10 records) whose
    on_partitions_revoked waits for a gate, and a second consumer joining (``prepare``d
    before it subscribes), polling: yields (gate, the first's listener, its Poller, the
    second's Poller) once the first was asked to give a partition up."""
    conf = _handover_topic(cluster, name, 10)
    gate = threading.Event()
    slow = SlowRevoke(gate)
    pa = _first_member(cluster, conf, slow)
    pb = None
    try:
        b = cluster.consumer(**conf)
        prepare(b)
        b.subscribe([name])
        pb = Poller(b)
        assert slow.revoking.wait(60), "the first member was never asked to give one up"
        yield gate, slow, pa, pb
        assert not pa.errors and not pb.errors
    finally:
        gate.set()
        pa.close()
        if pb is not None:
            pb.close()


def test_a_moved_partition_is_not_fetched_by_its_new_owner_before_its_old_owner_revoked_it(
        cluster):
    """The handover waits for the old owner: while its on_partitions_revoked runs, the
    new owner neither has the moved partition in its assignment nor reads records written
    to it meanwhile; once the revoke ends it reads them, from the offset the old owner
    committed (nothing skipped, nothing twice)."""
    with _held_revoke(cluster, "slow-revoke") as (gate, slow, pa, pb):
        b = pb.consumer
        _write_late(cluster, "slow-revoke", (0, 1))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:     # the revoke is held: nothing moves
            assert len(b.assignment()) == 0, b.assignment()
            time.sleep(0.05)
        assert pb.got == []
        gate.set()
        wait_until(lambda: len(b.assignment()) == 1, timeout_s=60, what="the handover")
        (moved,) = b.assignment()
        assert slow.revoked == [[moved]]
        _read_late(pb, moved[1], "the late records read by the new owner")
        assert sorted(pa.offsets(moved[1])) == list(range(10))


class LeaderLookups:
    """A consumer's metadata, recording the partitions whose leader broker it looked up
    (to open the connection its fetches will use)."""

    def __init__(self, inner):
        self.inner = inner
        self.asked: list = []

    def leader_broker(self, topic, partition):
        self.asked.append((topic, partition))
        return self.inner.leader_broker(topic, partition)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_new_owner_looks_up_a_moved_partitions_leader_while_its_old_owner_revokes(
        cluster):
    """A member waiting for a partition to be handed over finds its leader broker and
    opens the connection to it (a connect, slow the first time) while the old owner still
    revokes it, not after the handover: the first fetch goes out as soon as the
    partition is released."""
    def spy(consumer):
        consumer.metadata = LeaderLookups(consumer.metadata)
    with _held_revoke(cluster, "early-lookup", prepare=spy) as (gate, _slow, _pa, pb):
        b = pb.consumer
        asked = b.metadata.asked
        wait_until(lambda: asked, timeout_s=30,
                   what="the new owner looking up the moved partition's leader")
        assert b.assignment() == set()         # the old owner's revoke is still held
        gate.set()
        wait_until(lambda: len(b.assignment()) == 1, timeout_s=60, what="the handover")
        assert asked[0] == next(iter(b.assignment()))


@ray.remote(num_cpus=0)
class Gate:
    """A gate Ray tasks wait at until the test opens it."""

    def __init__(self):
        import asyncio
        self.opened = asyncio.Event()

    async def wait(self):
        await self.opened.wait()

    async def open(self):
        self.opened.set()


@ray.remote(num_cpus=0)
def _release_later(gate, handle, group_id, member_id, generation, partitions):
    ray.get(gate.wait.remote())
    return ray.get(handle.release_partitions.remote(group_id, member_id, generation,
                                                    partitions))


class _Method:
    def __init__(self, remote):
        self.remote = remote


class ReleaseVia:
    """A group coordinator's handle whose ``release_partitions`` goes through
    ``release(handle, *args)`` (returning an ObjectRef); everything else goes straight."""

    def __init__(self, handle, release):
        self.handle = handle
        self.release_partitions = _Method(lambda *args: release(handle, *args))

    def __getattr__(self, name):
        return getattr(self.handle, name)


def _route_releases(consumer, release) -> None:
    """Send ``consumer``'s releases through ``release`` (see ReleaseVia)."""
    member = consumer._group
    lookup = member.coordinator
    member.coordinator = lambda: ReleaseVia(lookup(), release)


def test_a_member_goes_on_with_what_it_kept_while_its_release_travels(cluster):
    """A cooperative member that gave a partition up does not wait for the coordinator's
    answer to its release: while the release is held on its way, its poll returns the
    records written meanwhile to the partition it kept (the new owner still waits for
    the moved one); once the release arrives, the new owner reads the moved partition
    on from the old owner's commit."""
    conf = _handover_topic(cluster, "held-release", 10)
    gate = Gate.remote()
    pa = _first_member(cluster, conf, Listener())
    a, pb = pa.consumer, None
    try:
        _route_releases(a, lambda handle, *args: _release_later.remote(gate, handle, *args))
        b = cluster.consumer(**conf)
        b.subscribe(["held-release"])
        pb = Poller(b)
        wait_until(lambda: len(a.assignment()) == 1, timeout_s=60,
                   what="the first member giving a partition up")
        ((_, kept),) = a.assignment()
        moved = 1 - kept
        _write_late(cluster, "held-release", (0, 1))
        # the old code waited for the release's answer (10 s at most) inside poll
        wait_until(lambda: len(pa.offsets(kept)) == 15, timeout_s=8,
                   what="the kept partition's late records while the release is held")
        assert b.assignment() == set() and pb.got == []
        ray.get(gate.open.remote())
        _read_late(pb, moved, "the moved partition's late records read by the new owner")
        assert sorted(pa.offsets(moved)) == list(range(10))
        assert not pa.errors and not pb.errors
    finally:
        ray.get(gate.open.remote())
        pa.close()
        if pb is not None:
            pb.close()


def test_a_release_that_fails_makes_its_member_rejoin_and_the_partition_moves(cluster):
    """A release the coordinator refuses (here: sent with a stale generation) leaves the
    moved partition pending and its new owner waiting; the old owner rejoins, and the
    next generation gives the partition to the new owner, read on from the old owner's
    commit."""
    admin = cluster.admin()
    conf = _handover_topic(cluster, "failed-release", 10)
    pa = _first_member(cluster, conf, Listener())
    a, pb = pa.consumer, None
    try:
        generation = admin.describe_group("failed-release")["generation"]

        def stale(handle, group_id, member_id, gen, partitions):
            return handle.release_partitions.remote(group_id, member_id, gen - 1, partitions)
        _route_releases(a, stale)
        b = cluster.consumer(**conf)
        b.subscribe(["failed-release"])
        pb = Poller(b)
        wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1,
                   timeout_s=60, what="the moved partition at its new owner")
        (moved,) = b.assignment()
        assert admin.describe_group("failed-release")["generation"] >= generation + 2
        _write_late(cluster, "failed-release", [moved[1]])
        _read_late(pb, moved[1], "the moved partition's late records read by the new owner")
        assert not pa.errors and not pb.errors
    finally:
        pa.close()
        if pb is not None:
            pb.close()


class SlowRevokeOnce(Listener):
    """A listener whose first on_partitions_revoked takes ``seconds`` (a slow commit)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_partitions_revoked(self, tps):
        if tps and not self.revoked:
            time.sleep(self.seconds)
        super().on_partitions_revoked(tps)


def test_a_slow_revoke_does_not_make_its_member_rejoin_twice(cluster):
    """An eager member whose revoke outlasts several heartbeats hears, from the beats it
    sends meanwhile, of the rebalance it is about to join; that must not make it rejoin
    once more after the join (for the group's leader, a second rebalance: the cause of
    the 9-11 s failovers groups_bench showed with 6 s sessions). One join, one
    generation."""
    admin = cluster.admin()
    admin.create_topic("slow-leader", partitions=2, replication_factor=1)
    conf = dict(group_id="slow-leader", auto_offset_reset="earliest",
                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=100)
    slow = SlowRevokeOnce(1.5)
    a = cluster.consumer(**conf)
    a.subscribe(["slow-leader"], listener=slow)
    pa = Poller(a)
    pb = None
    try:
        wait_until(lambda: len(a.assignment()) == 2, timeout_s=60, what="the first member")
        generation = admin.describe_group("slow-leader")["generation"]
        b = cluster.consumer(**conf)
        b.subscribe(["slow-leader"])
        pb = Poller(b)
        wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1,
                   timeout_s=60, what="one partition each")
        assert slow.revoked == [[("slow-leader", 0), ("slow-leader", 1)]]
        time.sleep(1.0)          # a second rebalance would start within a poll or two
        described = admin.describe_group("slow-leader")
        assert (described["state"], described["generation"]) == ("Stable", generation + 1)
        assert not pa.errors and not pb.errors
    finally:
        pa.close()
        if pb is not None:
            pb.close()


def test_a_stable_group_survives_its_coordinators_broker_without_a_rebalance(cluster):
    """The coordinator stores a group's membership when a generation becomes stable; when
    its broker is killed, the new coordinator resumes the group (same generation, same
    members, Stable) and the consumers, heartbeating on, are never told to give up a
    partition."""
    admin = cluster.admin()
    conf = dict(group_id="resumed", auto_offset_reset="earliest", enable_auto_commit=False,
                session_timeout_ms=6000, heartbeat_interval_ms=300)
    listeners = [Listener(), Listener()]
    consumers = [cluster.consumer(**conf), cluster.consumer(**conf)]
    for c, listener in zip(consumers, listeners):
        c.subscribe(["ev"], listener=listener)

    stop = threading.Event()

    def keep_polling(c):          # each consumer polls on a thread of its own, as an app
        while not stop.is_set():
            try:
                c.poll(timeout_ms=100)
            except Exception:  # noqa: BLE001 - partitions of the killed broker: retried
                time.sleep(0.1)
    threads = [threading.Thread(target=keep_polling, args=(c,), daemon=True)
               for c in consumers]
    for t in threads:
        t.start()

    def poll_all():
        time.sleep(0.05)

    def described():
        try:
            return admin.describe_group("resumed")
        except Exception:  # noqa: BLE001 - the coordinator is moving
            return None

    def stable_with_two():
        poll_all()
        d = described()
        return d if d and d["state"] == "Stable" and len(d["members"]) == 2 and all(
            c.assignment() for c in consumers) else None
    try:
        before = wait_until(stable_with_two, timeout_s=60, interval_s=0, what="2 members")
        revoked_before = [len(lst.revoked) for lst in listeners]
        broker_id = coordinator_of(cluster, "resumed")
        cluster.kill_broker(broker_id)
        try:
            def resumed_elsewhere():
                poll_all()
                try:
                    found = ray.get(cluster.broker(next(
                        b for b in cluster.broker_ids() if b != broker_id)).find_coordinator
                        .remote("resumed"), timeout=30)["broker_id"]
                except ray.exceptions.RayTaskError:
                    return None                     # no coordinator for the group yet
                return found != broker_id and stable_with_two()
            after = wait_until(resumed_elsewhere, timeout_s=60, interval_s=0.1,
                               what="the group on the new coordinator")
            assert after["generation"] == before["generation"]
            assert set(after["members"]) == set(before["members"])
            # heartbeats go on being accepted: still the same generation a while later
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                poll_all()
            last = described()
            assert last["generation"] == before["generation"] and last["state"] == "Stable"
            assert [len(lst.revoked) for lst in listeners] == revoked_before
        finally:
            restart(cluster, broker_id)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        for c in consumers:
            c.close()


def test_a_partition_whose_leader_is_gone_does_not_hold_up_poll(cluster):
    """A consumer starting on three partitions, one of them offline (RF 1, its broker
    killed, no position yet): poll returns the other two partitions' records at once
    instead of retrying the offline one's list_offsets for default_api_timeout_ms."""
    cluster.admin().create_topic("half-dead", partitions=3, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for p in range(3):
            producer.send("half-dead", b"x", partition=p)
        producer.flush()
    dead = cluster.metadata.leader("half-dead", 0).broker_id
    live = [p for p in range(3) if cluster.metadata.leader("half-dead", p).broker_id != dead]
    cluster.kill_broker(dead)
    try:
        with cluster.consumer(auto_offset_reset="earliest",
                              default_api_timeout_ms=60_000) as consumer:
            consumer.assign([("half-dead", p) for p in range(3)])
            got = set()
            started = time.monotonic()
            while not set(live) <= got and time.monotonic() - started < 30:
                try:
                    got |= {tp[1] for tp in consumer.poll(timeout_ms=500)}
                except Exception:  # noqa: BLE001 - the offline partition's error, typed
                    pass
            assert set(live) <= got
            assert time.monotonic() - started < 15
    finally:
        restart(cluster, dead)


def waiting_beat(m: GroupMember, wait_ms: int):
    """A heartbeat of ``m`` with ``wait_ms`` on a thread; (thread, answer): answer gets
    "current" (its result) and "after_s" (how long it took)."""
    answer = {}

    def beat():
        t0 = time.monotonic()
        answer["current"] = m.heartbeat(wait_ms=wait_ms)
        answer["after_s"] = time.monotonic() - t0
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread, answer


def test_a_waiting_heartbeat_is_answered_as_soon_as_a_rebalance_starts(cluster):
    """Heartbeats are long polls: in a Stable group one waits at the coordinator for its
    wait_ms, and one waiting when another member's join starts a rebalance is answered at
    once (False: rejoin), not at the end of its wait."""
    # a 20 s session: the coordinator waits up to half the session, so 8 s is not cut
    a = GroupMember(cluster.metadata, "beats", session_timeout_ms=20_000,
                    rebalance_timeout_ms=10_000)
    a.join(["ev"])
    started = time.monotonic()
    assert a.heartbeat(wait_ms=400) and time.monotonic() - started >= 0.35
    waiting, answer = waiting_beat(a, 8000)
    b = member(cluster, group="beats")
    joiner = threading.Thread(target=lambda: b.join(["ev"]), daemon=True)
    joiner.start()
    waiting.join(timeout=30)
    assert answer["current"] is False and answer["after_s"] < 4, answer
    a.leave()                 # b's join completes without a
    joiner.join(timeout=60)
    b.leave()


def test_a_beat_waits_at_most_half_the_session_and_a_member_dead_meanwhile_expires_on_time(
        cluster):
    """The session is refreshed when a beat arrives, not when its long poll answers, and
    the wait is cut to half the member's session: a member that goes silent after a waiting
    beat is expired one session after that beat arrived (not a wait later)."""
    a = GroupMember(cluster.metadata, "dies-waiting", session_timeout_ms=4000,
                    rebalance_timeout_ms=10_000)
    b = GroupMember(cluster.metadata, "dies-waiting", session_timeout_ms=20_000,
                    rebalance_timeout_ms=10_000)
    settle([a, b])          # both in one generation (joined at once, a may land first)
    sent = time.monotonic()
    assert a.heartbeat(wait_ms=8000)              # a's last beat: waits 2 s, not 8
    assert 1.5 <= time.monotonic() - sent < 6
    expired_after = None
    while time.monotonic() - sent < 30:
        if not b.heartbeat(wait_ms=500):           # False: a rebalance (a expired)
            expired_after = time.monotonic() - sent
            break
    # refreshed when the beat answered, a would go at 2 + 4 = 6 s at the earliest
    assert expired_after is not None and expired_after < 5.5, expired_after
    b.leave()


def test_a_waiting_beat_is_not_answered_when_another_offsets_partition_changes(cluster):
    """A notice about an offsets partition other than the group's (as a LeaderAndIsr naming
    the coordinator's broker a follower of another partition is) leaves the group's waiting
    heartbeat waiting: only a change of the group's own partition sends it looking for a
    new coordinator."""
    a = GroupMember(cluster.metadata, "beats-scoped", session_timeout_ms=20_000,
                    rebalance_timeout_ms=10_000)
    a.join(["ev"])
    coordinator = a.coordinator()
    waiting, answer = waiting_beat(a, 3000)
    wait_until(lambda: ray.get(coordinator.__ray_call__.remote(
        lambda self: "beats-scoped" in self._rebalancing)), timeout_s=10, interval_s=0.02,
        what="the beat waiting at the coordinator")
    # a partition number no group maps to: nothing of this group's changes
    ray.get(coordinator.partitions_changed.remote(
        CONFIG["offsets.topic.num.partitions"], [(99, False, 0)]))
    waiting.join(timeout=30)
    assert answer["current"] is True and answer["after_s"] >= 2.5, answer
    a.leave()
