"""cluster.consumer_group: member actors of one consumer group processing a topic while a
producer writes (the issue's group test 1), against a real cluster (ZooKeeper, local Ray,
RF=3 __consumer_offsets). A ledger actor records every (partition, offset) a member
processed, so the tests can count what was processed, by whom, and how often."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

import pytest

from actors import Cluster
from actors.errors import InvalidConfigurationError
from coordination.zk_server import pid_alive
from cluster_helpers import FAST_CONFIG, ray, unique_namespace, wait_until, zk_client
from cluster_helpers import local_ray  # noqa: F401 - autouse: this module's Ray

CONFIG = {**FAST_CONFIG, "offsets.topic.num.partitions": 2,
          "offsets.topic.replication.factor": 3, "group.initial.rebalance.delay.ms": 0,
          "group.min.session.timeout.ms": 1000}
SESSION_MS = 3000
PARTITIONS = 12
MAX_POLL = 50


@pytest.fixture(scope="module")
def cluster():
    c = Cluster.start(num_brokers=3, namespace=unique_namespace("cgrp"), config=CONFIG)
    yield c
    c.shutdown()


@ray.remote(num_cpus=0)
class Ledger:
    """Every (partition, offset) processed, with the member that processed it."""

    def __init__(self):
        self.seen: list[tuple[str, int, int]] = []

    def add(self, member: str, items: list[tuple[int, int]]) -> None:
        self.seen.extend((member, p, o) for p, o in items)

    def get(self) -> list[tuple[str, int, int]]:
        return list(self.seen)


def recording(ledger):
    """A process_fn that writes each record's (partition, offset) to the ledger."""
    def process(records):
        import os
        member = os.environ.get("RAY_ACTOR_ID", "?")
        ray.get(ledger.add.remote(member, [(r.partition, r.offset) for r in records]))
    return process


class Writer:
    """A producer thread writing numbered records round-robin over the partitions."""

    def __init__(self, cluster, topic: str):
        self.producer = cluster.producer(acks="all", linger_ms=5)
        self.topic = topic
        self.acked: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Writer":
        self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            futures = [self.producer.send(self.topic, b"v%d" % (i + k),
                                          partition=(i + k) % PARTITIONS)
                       for k in range(24)]
            for f in futures:
                md = f.get(timeout=60)
                self.acked.append((md.partition, md.offset))
            i += 24
            time.sleep(0.02)

    def stop(self) -> list[tuple[int, int]]:
        self._stop.set()
        self._thread.join(timeout=60)
        self.producer.close()
        return self.acked


def _owners(stats: dict) -> dict[tuple[str, int], list[str]]:
    owners = defaultdict(list)
    for name, m in stats["members"].items():
        for tp in m.get("assignment", []):
            owners[tuple(tp)].append(name)
    return owners


def _settled(group, topic: str, partitions: int, members: int) -> dict | None:
    """The members' own view, when ``members`` members each own something and together own
    every partition exactly once: {member name: set of partitions}; else None."""
    stats = group.stats()["members"]
    owned = {n: set(map(tuple, m["assignment"])) for n, m in stats.items()
             if m["state"] == "running"}
    everything = [tp for tps in owned.values() for tp in tps]
    if (len(owned) == members and all(owned.values())
            and sorted(everything) == [(topic, p) for p in range(partitions)]):
        return owned
    return None


def _zk_owners(cluster, group: str, topic: str, partitions: int) -> dict[int, str]:
    """The seed's owners registry: partition -> the owner id in
    /consumers/<group>/owners/<topic>/<partition> (absent partitions left out)."""
    zk = zk_client(cluster)
    try:
        out = {}
        for p in range(partitions):
            path = f"/consumers/{group}/owners/{topic}/{p}"
            if zk.exists(path):
                out[p] = zk.get(path)[0].decode()
        return out
    finally:
        zk.stop()
        zk.close()


def _coordinator_owners(cluster, group: str) -> dict | None:
    """partition -> owner member ids, from the coordinator, when the group is Stable."""
    desc = cluster.admin().describe_group(group)
    if desc["state"] != "Stable":
        return None
    owners = defaultdict(list)
    for member_id, tps in desc["members"].items():
        for tp in tps:
            owners[tp].append(member_id)
    return {"generation": desc["generation"], "owners": dict(owners),
            "members": len(desc["members"])}


def test_three_member_actors_share_twelve_partitions_and_survive_a_killed_member(cluster):
    """Three member actors consume a 12-partition topic under a producer: every partition
    has exactly one owner (coordinator's view), killing a member moves its partitions to
    the others within session_timeout_ms + 1 s, every acknowledged record is
    processed at least once, and duplicates stay within one poll batch per partition."""
    cluster.admin().create_topic("work", partitions=PARTITIONS, replication_factor=1)
    ledger = Ledger.remote()
    writer = Writer(cluster, "work").start()
    group = cluster.consumer_group(
        "workers", ["work"], num_members=3, process_fn=recording(ledger),
        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300, fetch_max_wait_ms=100,
        max_poll_records=MAX_POLL, auto_offset_reset="earliest")
    try:
        stable = wait_until(lambda: (lambda o: o if o and o["members"] == 3 else None)(
            _coordinator_owners(cluster, "workers")), timeout_s=60, what="3 members, Stable")
        assert sorted(stable["owners"]) == [("work", p) for p in range(PARTITIONS)]
        assert all(len(ids) == 1 for ids in stable["owners"].values())
        group.wait_for(lambda s: all(m["processed"] > 0 for m in s["members"].values()),
                       timeout_s=60)
        owned = wait_until(lambda: _settled(group, "work", PARTITIONS, 3), timeout_s=60,
                           what="the members' own view settled")
        # the seed's registry agrees: one owner node per partition, three owners in all
        registry = wait_until(lambda: (lambda o: o if len(o) == PARTITIONS and
                                       len(set(o.values())) == 3 else None)(
            _zk_owners(cluster, "workers", "work", PARTITIONS)), timeout_s=30,
            what="every partition in the ZooKeeper owners registry")
        assert len(registry) == PARTITIONS
        victim = group.members()[0]
        assert owned[victim], "the victim owned nothing"
        pid = ray.get(group.handle(victim).__ray_call__.remote(
            lambda self: __import__("os").getpid()), timeout=60)
        asked_at = time.monotonic()
        ray.kill(group.handle(victim))
        group.forget(victim)
        # ray.kill only asks Ray's GCS: under load a member lived on for up to 5 s after
        # it (groups_bench); the bound counts from the process's end
        killed_at = wait_until(lambda: not pid_alive(pid) and time.monotonic(),
                               timeout_s=60, interval_s=0.005, what="the member's end")
        after = wait_until(lambda: (lambda o: o if o and o["members"] == 2 else None)(
            _coordinator_owners(cluster, "workers")), timeout_s=60, interval_s=0.05,
            what="2 members, Stable")
        took = time.monotonic() - killed_at
        print(f"\nthe killed member's partitions had new owners after {took:.2f}s "
              f"({time.monotonic() - asked_at:.2f}s after ray.kill)")
        assert sorted(after["owners"]) == [("work", p) for p in range(PARTITIONS)]
        assert all(len(ids) == 1 for ids in after["owners"].values())
        assert after["generation"] > stable["generation"]
        survivors = wait_until(lambda: _settled(group, "work", PARTITIONS, 2), timeout_s=30,
                               what="the survivors own every partition")
        assert owned[victim] <= set().union(*survivors.values())
        wait_until(lambda: (lambda o: len(o) == PARTITIONS and len(set(o.values())) == 2)(
            _zk_owners(cluster, "workers", "work", PARTITIONS)), timeout_s=30,
            what="the registry shows the two survivors owning every partition")
        # the bound: session timeout (counted from the victim's last beat, before
        # the kill) + 1 s for the rebalance (the survivors' waiting beats hear of it at once)
        assert took <= SESSION_MS / 1000 + 1.0, f"partitions moved only after {took:.1f}s"
        time.sleep(1.0)   # the writer goes on for a moment under the new generation
    finally:
        acked = writer.stop()
    ends = Counter()
    for p, o in acked:
        ends[p] = max(ends[p], o + 1)
    group.wait_for(lambda s: all(
        s["members"][n].get("committed", {}).get(("work", p), 0) >= ends[p]
        for p in range(PARTITIONS) for n in s["members"]
        if ("work", p) in s["members"][n].get("assignment", [])), timeout_s=60)
    group.stop()
    seen = ray.get(ledger.get.remote())
    counts = Counter((p, o) for _, p, o in seen)
    missing = [po for po in acked if po not in counts]
    assert not missing, f"{len(missing)} acknowledged records never processed: {missing[:5]}"
    dups = Counter(p for (p, _), n in counts.items() if n > 1)
    assert all(n <= MAX_POLL for n in dups.values()), f"duplicates per partition: {dups}"


def test_scaling_up_and_down_rebalances_and_keeps_one_owner_per_partition(cluster):
    """scale(3) then scale(1): the group rebalances each time, every partition keeps
    exactly one owner, and what was processed before is not processed again (commits
    after processing)."""
    cluster.admin().create_topic("scaled", partitions=6, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(600):
            producer.send("scaled", b"%d" % i, partition=i % 6)
        producer.flush()
    ledger = Ledger.remote()
    with cluster.consumer_group("scalers", "scaled", num_members=1,
                                process_fn=recording(ledger), session_timeout_ms=SESSION_MS,
                                heartbeat_interval_ms=500,
                                auto_offset_reset="earliest") as group:
        group.wait_for(lambda s: s["processed"] >= 600, timeout_s=60)
        group.scale(3)
        assert len(group.members()) == 3
        wait_until(lambda: (lambda o: o if o and o["members"] == 3 else None)(
            _coordinator_owners(cluster, "scalers")), timeout_s=60, what="3 members")
        group.scale(1)
        stable = wait_until(lambda: (lambda o: o if o and o["members"] == 1 else None)(
            _coordinator_owners(cluster, "scalers")), timeout_s=60, what="1 member")
        assert sorted(stable["owners"]) == [("scaled", p) for p in range(6)]
        with cluster.producer(acks="all") as producer:
            for i in range(60):
                producer.send("scaled", b"late%d" % i, partition=i % 6)
            producer.flush()
        wait_until(lambda: len({(p, o) for _, p, o in ray.get(ledger.get.remote())}) >= 660,
                   timeout_s=60, what="the late records processed")
    counts = Counter((p, o) for _, p, o in ray.get(ledger.get.remote()))
    assert len(counts) == 660
    assert max(counts.values()) == 1, "a record was processed twice without any failure"


def test_cooperative_sticky_revokes_only_the_partitions_that_move(cluster):
    """cooperative-sticky (KIP-429): when a third member joins, the two first members are
    asked to give up only the partitions that move to it, and keep the others throughout;
    under the eager protocol every partition would be revoked first."""
    cluster.admin().create_topic("coop", partitions=6, replication_factor=1)
    ledger = Ledger.remote()
    with cluster.consumer_group("coop", ["coop"], 2, recording(ledger),
                                partition_assignment_strategy="cooperative-sticky",
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300,
                                auto_offset_reset="earliest") as group:
        # the second member's partitions are handed over by the first once it gave them
        # up: wait until the coordinator's view and the members' agree
        wait_until(lambda: (lambda o: o and o["members"] == 2 and len(o["owners"]) == 6)(
            _coordinator_owners(cluster, "coop")), timeout_s=60,
            what="2 members owning the 6 partitions")
        wait_until(lambda: _settled(group, "coop", 6, 2), timeout_s=60, what="2 members")
        first = group.stats()["members"]
        before = {n: set(map(tuple, m["assignment"])) for n, m in first.items()}
        assert all(len(tps) == 3 for tps in before.values()), before
        seen_before = {n: len(m["rebalances"]) for n, m in first.items()}
        group.scale(3)
        # the newcomer's two partitions come from two owners, each handing its own over
        wait_until(lambda: (lambda o: o and all(len(tps) == 2 for tps in o.values()))(
            _settled(group, "coop", 6, 3)), timeout_s=60, what="3 members own 2 each")
        after = group.stats()["members"]
        newcomer = (set(after) - set(before)).pop()
        assert len(after[newcomer]["assignment"]) == 2
        for name, kept_before in before.items():
            now = set(map(tuple, after[name]["assignment"]))
            assert now <= kept_before, f"{name} gained partitions it did not have"
            moved = kept_before - now
            revoked = set()
            for kind, tps in after[name]["rebalances"][seen_before[name]:]:
                if kind == "revoked":
                    revoked |= set(map(tuple, tps))
            assert revoked == moved, (name, revoked, moved)
        assert sum(len(before[n] - set(map(tuple, after[n]["assignment"]))) for n in before) == 2


def test_a_failing_process_fn_stops_its_member_and_commits_nothing_after(cluster):
    """process_fn raising stops that member (state failed, the error in stats) and the
    failed batch is not committed: the group's committed offset stays where it was."""
    cluster.admin().create_topic("poison", partitions=1, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(10):
            producer.send("poison", b"bad" if i == 5 else b"ok", partition=0)
        producer.flush()

    def fussy(records):
        if any(r.value == b"bad" for r in records):
            raise ValueError("cannot handle 'bad'")

    group = cluster.consumer_group("fussy", ["poison"], 1, fussy, max_poll_records=5,
                                   session_timeout_ms=SESSION_MS, auto_offset_reset="earliest")
    try:
        stats = group.wait_for(lambda s: any(m["state"] == "failed"
                                             for m in s["members"].values()), timeout_s=60)
        (member,) = stats["members"].values()
        assert "cannot handle 'bad'" in member["error"]
        assert member["committed"] == {("poison", 0): 5}
    finally:
        group.stop()


def test_bad_arguments_are_refused_in_the_caller(cluster):
    """Bad arguments raise InvalidConfigurationError before any actor starts."""
    with pytest.raises(InvalidConfigurationError, match="process_fn"):
        cluster.consumer_group("g", ["t"], 1, process_fn=None)
    with pytest.raises(InvalidConfigurationError, match="num_members"):
        cluster.consumer_group("g", ["t"], -1, process_fn=print)
    with pytest.raises(InvalidConfigurationError, match="topics or a pattern"):
        cluster.consumer_group("g", [], 1, process_fn=print)
    with pytest.raises(InvalidConfigurationError, match="enable_auto_commit"):
        cluster.consumer_group("g", ["t"], 1, process_fn=print, enable_auto_commit=True)
    with pytest.raises(InvalidConfigurationError):
        cluster.consumer_group("g", ["t"], 1, process_fn=print, no_such_option=1)


# -- columns: Consumer.poll_columns and batch_format ----------------------------------------------
def _fill_mixed(cluster, topic: str, n: int) -> None:
    """n records over 2 partitions, lz4-compressed: null and set keys, a null value,
    headers with a repeated key."""
    cluster.admin().create_topic(topic, partitions=2, replication_factor=1)
    with cluster.producer(acks="all", compression_type="lz4", linger_ms=5) as producer:
        for i in range(n):
            producer.send(topic, None if i == 7 else b"v%d" % i,
                          key=None if i % 3 == 0 else b"k%d" % i, partition=i % 2,
                          headers=[("h", b"%d" % i), ("h", None)] if i % 4 == 0 else [])
        producer.flush()


def _fill_numbered(cluster, topic: str, partitions: int, n: int) -> None:
    """n records b"0", b"1", ... round-robin over the partitions of a new topic."""
    cluster.admin().create_topic(topic, partitions=partitions, replication_factor=1)
    with cluster.producer(acks="all", linger_ms=5) as producer:
        for i in range(n):
            producer.send(topic, b"%d" % i, partition=i % partitions)
        producer.flush()


def _poll_all(consumer, n: int, columnar: bool, **kw) -> list:
    """(partition, offset, timestamp, key, value, headers) of what poll/poll_columns gives,
    until n rows."""
    got = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        if columnar:
            for (topic, p), table in consumer.poll_columns(timeout_ms=500, **kw).items():
                assert set(table.column("topic").to_pylist()) == {topic}
                for row in table.to_pylist():
                    assert row["partition"] == p
                    got.append((p, row["offset"], row["timestamp"], row["key"],
                                row["value"], [(h["key"], h["value"]) for h in
                                               row["headers"]]))
        else:
            for (topic, p), records in consumer.poll(timeout_ms=500, **kw).items():
                got.extend((p, r.offset, r.timestamp, r.key, r.value, list(r.headers))
                           for r in records)
    return got


def test_poll_columns_gives_what_poll_gives_as_one_table_per_partition(cluster):
    """poll_columns returns the same records as poll (null keys and values, repeated
    headers, lz4 batches), as Tables of the documented schema, at most max_records rows."""
    import pyarrow as pa
    _fill_mixed(cluster, "columns-mixed", 60)
    tps = [("columns-mixed", 0), ("columns-mixed", 1)]
    with cluster.consumer(auto_offset_reset="earliest") as rows:
        rows.assign(tps)
        expected = sorted(_poll_all(rows, 60, columnar=False))
    with cluster.consumer(auto_offset_reset="earliest") as cols:
        cols.assign(tps)
        table = next(iter(cols.poll_columns(timeout_ms=10_000, max_records=7).values()))
        assert table.schema == pa.schema([
            ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
            ("timestamp", pa.int64()), ("timestamp_type", pa.int32()),
            ("key", pa.binary()), ("value", pa.binary()),
            ("headers", pa.list_(pa.struct([("key", pa.string()),
                                             ("value", pa.binary())])))])
        cols.seek_to_beginning()
        sizes = []
        got = []
        while len(got) < 60:
            batch = _poll_all(cols, 1, columnar=True, max_records=7)
            sizes.append(len(batch))
            got.extend(batch)
    assert max(sizes) <= 7
    assert sorted(got) == expected and len(expected) == 60
    # the fixture's odd records came through as they were written
    record7 = [r for r in got if r[:2] == (1, 3)][0]
    assert (record7[3], record7[4]) == (b"k7", None)
    record0 = [r for r in got if r[:2] == (0, 0)][0]
    assert (record0[3], record0[5]) == (None, [("h", b"0"), ("h", None)])


def test_switching_between_poll_and_poll_columns_skips_and_repeats_nothing(cluster):
    """Alternating poll and poll_columns (a few rows each) returns every offset exactly
    once: what one form had fetched and not returned is fetched again in the other."""
    cluster.admin().create_topic("columns-switch", partitions=1, replication_factor=1)
    with cluster.producer(acks="all") as producer:
        for i in range(200):
            producer.send("columns-switch", b"%d" % i, partition=0)
        producer.flush()
    offsets = []
    with cluster.consumer(auto_offset_reset="earliest") as consumer:
        consumer.assign([("columns-switch", 0)])
        deadline = time.monotonic() + 60
        turn = 0
        while len(offsets) < 200 and time.monotonic() < deadline:
            offsets += [r[1] for r in _poll_all(consumer, 1, columnar=turn % 2 == 1,
                                                max_records=9)]
            turn += 1
    assert offsets == list(range(200))


def test_poll_columns_refuses_a_consumer_with_a_deserializer(cluster):
    """Columns are the raw bytes: a consumer with a value_deserializer is refused, typed."""
    with cluster.consumer(value_deserializer=bytes.decode) as consumer:
        consumer.assign([("columns-switch", 0)])
        with pytest.raises(InvalidConfigurationError, match="value_deserializer"):
            consumer.poll_columns()
    with pytest.raises(InvalidConfigurationError, match="batch_format"):
        cluster.consumer_group("g", ["t"], 1, process_fn=print, batch_format="arrow")
    with pytest.raises(InvalidConfigurationError, match="key_deserializer"):
        cluster.consumer_group("g", ["t"], 1, process_fn=print, batch_format="pyarrow",
                               key_deserializer=bytes.decode)


# -- fetching: the next fetch in flight while records are handed out; pause ------------------------
@pytest.mark.parametrize("columnar", [False, True])
def test_poll_sends_a_partitions_next_fetch_before_it_returns_its_records(cluster, columnar):
    """Pipelining: when poll returns records of a partition, the fetch of the records after
    them is already in flight (sent before the answer was decoded), at the position that
    follows what was fetched; the records still come exactly once, in order."""
    topic = f"prefetch-{int(columnar)}"
    _fill_numbered(cluster, topic, 1, 300)
    tp = (topic, 0)
    offsets = []
    with cluster.consumer(auto_offset_reset="earliest", fetch_max_bytes=2048) as consumer:
        consumer.assign([tp])
        got = _poll_all(consumer, 1, columnar=columnar)
        offsets += [r[1] for r in got]
        in_flight = consumer._inflight.get(tp)
        assert in_flight is not None and in_flight.offset == consumer._positions[tp]
        assert in_flight.offset > offsets[-1]
        offsets += [r[1] for r in _poll_all(consumer, 300 - len(offsets), columnar=columnar)]
    assert offsets == list(range(300))


@pytest.mark.parametrize("columnar", [False, True])
def test_a_paused_partition_returns_nothing_until_resumed_even_what_was_fetched(cluster,
                                                                                columnar):
    """pause: poll returns no record of the partition (not even ones fetched before the
    pause, or by a fetch in flight); after resume it goes on from the first offset not
    returned, so every offset comes exactly once."""
    topic = f"pause-fetched-{int(columnar)}"
    _fill_numbered(cluster, topic, 2, 400)
    seen = []
    with cluster.consumer(auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        seen += _poll_all(consumer, 1, columnar=columnar, max_records=5)
        paused = seen[0][0]          # the rest of its fetch is buffered, its next in flight
        assert {p for p, *_ in seen} == {paused} and len(seen) == 5
        consumer.pause((topic, paused))
        while len([r for r in seen if r[0] != paused]) < 200:
            got = _poll_all(consumer, 1, columnar=columnar, max_records=50)
            assert {p for p, *_ in got} == {1 - paused}
            seen += got
        assert (consumer.poll_columns if columnar else consumer.poll)(timeout_ms=300) == {}
        consumer.resume((topic, paused))
        while len(seen) < 400:
            seen += _poll_all(consumer, 400 - len(seen), columnar=columnar)
    for p in (0, 1):
        assert [r[1] for r in seen if r[0] == p] == list(range(200))


def columns_recording(ledger):
    """A process_fn for batch_format pyarrow/pandas: (partition, offset) of each row."""
    def process(batch):
        import os
        member = os.environ.get("RAY_ACTOR_ID", "?")
        if hasattr(batch, "to_pydict"):
            cols = batch.to_pydict()
        else:                                   # pandas
            cols = {c: batch[c].tolist() for c in ("partition", "offset")}
        ray.get(ledger.add.remote(member, list(zip(cols["partition"], cols["offset"]))))
    return process


def _group_until(cluster, group_id: str, topic: str, members: int, process_fn, n: int,
                 **config) -> dict:
    """Run a consumer group on ``topic`` from its start until it processed ``n`` records;
    its stats() after stop()."""
    group = cluster.consumer_group(group_id, [topic], members, process_fn,
                                   session_timeout_ms=SESSION_MS,
                                   auto_offset_reset="earliest", **config)
    try:
        group.wait_for(lambda s: s["processed"] >= n, timeout_s=90)
    finally:
        stats = group.stop()
    return stats


@pytest.mark.parametrize("batch_format", ["pyarrow", "pandas"])
def test_a_columnar_consumer_group_processes_every_record_and_commits(cluster, batch_format):
    """With batch_format pyarrow (or pandas) two members get their partitions' records as
    tables: every produced record is processed (at least once), and the group's committed
    offsets reach the log ends."""
    topic = f"columns-group-{batch_format}"
    group_id = f"cols-{batch_format}"
    _fill_numbered(cluster, topic, 4, 2000)
    ledger = Ledger.remote()
    stats = _group_until(cluster, group_id, topic, 2, columns_recording(ledger), 2000,
                         batch_format=batch_format, max_poll_records=300)
    assert all(m["state"] == "stopped" for m in stats["members"].values()), stats
    seen = {(p, o) for _, p, o in ray.get(ledger.get.remote())}
    assert seen == {(p, o) for p in range(4) for o in range(500)}
    # what the group committed (a partition may have moved between the members)
    with cluster.consumer(group_id=group_id, zookeeper_registry=False) as reader:
        committed = {p: reader.committed((topic, p)) for p in range(4)}
    assert committed == {p: 500 for p in range(4)}


def test_a_members_stats_say_when_it_first_got_records_and_last_processed_some(cluster):
    """stats() of a member: first_poll_at (time.time() when its first poll with records
    returned) with that poll's record count, and last_processed_at (after its latest
    batch), in the order the member saw them, within the test's own clock readings;
    None and 0 for a member that got nothing."""
    topic = "member-times"
    cluster.admin().create_topic(topic, partitions=1, replication_factor=1)
    group = cluster.consumer_group("member-times", [topic], 2, lambda batch: None,
                                   session_timeout_ms=SESSION_MS, auto_offset_reset="earliest",
                                   max_poll_records=100)
    try:
        # both members in one stable generation before any record exists, so the one
        # partition stays with one member (a member joining late could take it over)
        wait_until(lambda: (_coordinator_owners(cluster, "member-times") or {})
                   .get("members") == 2, timeout_s=60, what="both members in the group")
        before = time.time()
        with cluster.producer(acks="all", linger_ms=5) as producer:
            for i in range(300):
                producer.send(topic, b"%d" % i)
            producer.flush()
        group.wait_for(lambda s: s["processed"] >= 300, timeout_s=90)
    finally:
        stats = group.stop()
    after = time.time()
    members = stats["members"].values()
    (busy,) = [m for m in members if m["processed"]]     # one partition: one member
    (idle,) = [m for m in members if not m["processed"]]
    assert before < busy["first_poll_at"] <= busy["last_processed_at"] < after
    assert 0 < busy["first_poll_records"] <= 100
    assert (idle["first_poll_at"], idle["first_poll_records"],
            idle["last_processed_at"]) == (None, 0, None)


def test_partitions_added_to_a_subscribed_topic_reach_the_group(cluster):
    """Admin.create_partitions on a topic a group consumes: the group's leader sees the new
    count at its next metadata refresh and rebalances (Kafka's assignment snapshot), so the
    members together own every partition, the new ones included, and read what is written
    there."""
    admin = cluster.admin()
    admin.create_topic("growing", partitions=2)
    stop = threading.Event()
    owned: dict[int, set] = {}
    values: list = []

    def member(i: int) -> None:
        consumer = cluster.consumer(group_id="g-growing", session_timeout_ms=SESSION_MS,
                                    auto_offset_reset="earliest")
        consumer.subscribe(["growing"])
        try:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=200).values():
                    values.extend(r.value for r in records)
                owned[i] = set(consumer.assignment())
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        def owners() -> list:
            return sorted(tp for tps in list(owned.values()) for tp in tps)
        wait_until(lambda: owners() == [("growing", 0), ("growing", 1)], timeout_s=60,
                   what="the group owning the topic's 2 partitions", detail=owners)
        admin.create_partitions("growing", 4)
        wait_until(lambda: owners() == [("growing", p) for p in range(4)], timeout_s=60,
                   what="the group owning all 4 partitions", detail=owners)
        producer = cluster.producer()
        for p in range(4):
            producer.send("growing", b"p%d" % p, partition=p)
        producer.flush(timeout=30)
        producer.close()
        wait_until(lambda: sorted(values) == [b"p0", b"p1", b"p2", b"p3"], timeout_s=60,
                   what="a record from each partition", detail=lambda: sorted(values))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    admin.delete_topic("growing")
