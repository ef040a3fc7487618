"""Shared pieces of the replication fault tests: a producer that writes sequence-numbered
records the whole time and remembers what was acknowledged, and checks that read what each
replica really holds on disk (its segment files), independently of the actors."""

from __future__ import annotations

import glob
import os
import threading

from cluster_helpers import FAST_CONFIG, local_ray, ray, wait_until  # noqa: F401 - fixture
from cluster_helpers import zk_client
from coordination import zk_layout as L
from storage.records import iter_headers

#: The fault tests' cluster: RF=3 topics with min.insync.replicas=2, a follower out of the
#: ISR after 2 s without catching up, 3 s ZooKeeper sessions.
LAG_MS = 2000
CONFIG = {**FAST_CONFIG, "min.insync.replicas": 2, "replica.lag.time.max.ms": LAG_MS}
TOPIC_CONFIG = {"min.insync.replicas": "2"}



class SequenceProducer:
    """Sends b"<tag>-<n>" with acks=all to one partition in a background thread, one record
    in flight per send batch of ``batch`` records; ``acked`` maps value -> offset for every
    acknowledged record, ``errors`` counts sends that failed for good (after retries)."""

    def __init__(self, cluster, topic: str, partition: int = 0, *, tag: str = "seq",
                 batch: int = 20, acks="all", pause_s: float = 0.005):
        self.cluster = cluster
        self.topic, self.partition = topic, partition
        self.tag, self.batch, self.pause_s = tag, batch, pause_s
        self.producer = cluster.producer(acks=acks, linger_ms=0, request_timeout_ms=5000,
                                         delivery_timeout_ms=60000)
        self.acked: dict[bytes, int] = {}
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="seq-producer")

    def start(self) -> "SequenceProducer":
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            futures = []
            for _ in range(self.batch):
                value = b"%s-%08d" % (self.tag.encode(), n)
                n += 1
                try:
                    futures.append((value, self.producer.send(self.topic, value,
                                                              partition=self.partition)))
                except Exception as exc:  # noqa: BLE001 - no metadata in max_block_ms
                    with self._lock:
                        self.errors.append(exc)
                    break
            for value, fut in futures:
                try:
                    meta = fut.get(timeout=90)
                except Exception as exc:  # noqa: BLE001 - counted, the test decides
                    with self._lock:
                        self.errors.append(exc)
                    continue
                with self._lock:
                    self.acked[value] = meta.offset
            self._stop.wait(self.pause_s)

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_for_more(self, n: int, timeout_s: float = 60.0) -> None:
        """Until ``n`` more records than now are acknowledged."""
        target = self.acked_count() + n
        wait_until(lambda: self.acked_count() >= target, timeout_s=timeout_s,
                   what=f"{n} more acknowledged records")

    def stop(self) -> dict[bytes, int]:
        self._stop.set()
        self._thread.join(timeout=120)
        self.producer.close(timeout=30)
        with self._lock:
            return dict(self.acked)


def leader_of(cluster, topic: str, partition: int = 0) -> int:
    return cluster.metadata.refresh()["topics"][topic][partition]["leader"]


def partition_row(cluster, topic: str, partition: int = 0) -> dict:
    return cluster.metadata.refresh()["topics"][topic][partition]


def zk_partition_state(zk, topic: str, partition: int = 0) -> L.PartitionState:
    """The partition's state as the controller wrote it in ZooKeeper (``zk``: a client of
    ``zk_client(cluster)``): the decision itself, where a broker's metadata cache may
    still hold the one before (caches receive UpdateMetadata one by one, and a resumed
    broker's cache lags until its turn)."""
    data = zk.get(L.partition_state_path(topic, partition))[0]
    return L.PartitionState.from_bytes(topic, partition, data)


def controller_holder(zk) -> str | None:
    """/controller's body and the session holding it (to set beside each candidate's own
    session, ``Controller.status()["session"]``), None when nobody is controller."""
    if zk.exists(L.CONTROLLER_PATH) is None:
        return None
    data, stat = zk.get(L.CONTROLLER_PATH)
    return f"{data.decode()} held by session {stat.ephemeralOwner:x}"


def partition_story(cluster, topic: str, partition: int = 0) -> str:
    """What ZooKeeper holds for the partition (its state, the controller, the registered
    brokers) beside what each live broker's metadata cache says: a failed failover wait
    names which side is stuck."""
    from actors.protocol import broker_actor_name, controller_actor_name
    zk = zk_client(cluster)
    try:
        state = zk.get(L.partition_state_path(topic, partition))[0].decode()
        controller = controller_holder(zk)
        registered = sorted(zk.get_children(L.BROKER_IDS_PATH))
    finally:
        zk.stop()
        zk.close()
    caches, controllers = {}, {}
    for bid in cluster.broker_ids():
        try:
            handle = ray.get_actor(broker_actor_name(bid), namespace=cluster.namespace)
            snap = ray.get(handle.get_metadata.remote(), timeout=10)
            row = snap["topics"][topic][partition]
            caches[bid] = (row["leader"], list(row["isr"]), snap.get("controller_epoch"))
        except Exception as exc:  # noqa: BLE001 - a dead broker is part of the story
            caches[bid] = type(exc).__name__
        try:
            handle = ray.get_actor(controller_actor_name(bid), namespace=cluster.namespace)
            st = ray.get(handle.status.remote(), timeout=10)
            controllers[bid] = {k: st[k] for k in ("role", "epoch", "ticks", "last_error")}
            if st.get("requests"):
                controllers[bid].update({k: st["requests"].get(k) for k in (
                    "watched_brokers", "dead_brokers", "pending", "queued_isr_changes")})
        except Exception as exc:  # noqa: BLE001 - a dead controller likewise
            controllers[bid] = type(exc).__name__
    return (f"ZooKeeper: state {state}, controller {controller}, brokers {registered}; "
            f"broker caches (leader, isr, controller epoch): {caches}; "
            f"controllers: {controllers}")


def wait_for_full_isr(cluster, topic: str, partition: int = 0, timeout_s: float = 60.0):
    def full():
        st = partition_row(cluster, topic, partition)
        return st["leader"] >= 0 and sorted(st["isr"]) == sorted(st["replicas"])
    wait_until(full, timeout_s=timeout_s, what=f"{topic}-{partition} ISR back to all replicas")


def read_committed(cluster, topic: str, partition: int = 0) -> list:
    """Every record below the high watermark, read through the leader."""
    cluster.metadata.invalidate()
    consumer = cluster.simple_consumer()
    out, offset = [], 0
    while True:
        recs = [r for r in consumer.fetch(topic, partition, offset, 4 << 20) if r.offset >= offset]
        if not recs:
            return out
        out.extend(recs)
        offset = recs[-1].offset + 1


def replica_state(cluster, broker_id: int, topic: str, partition: int = 0) -> dict:
    from actors.protocol import replica_actor_name
    handle = ray.get_actor(replica_actor_name(topic, partition, broker_id),
                           namespace=cluster.namespace)
    return ray.get(handle.state.remote(), timeout=30)


def disk_bytes_below(cluster, broker_id: int, topic: str, partition: int, end_offset: int) -> bytes:
    """The batches of the replica's segment files (read from disk, in offset order) whose
    offsets are all below ``end_offset``: what must be byte-identical on every replica."""
    path = os.path.join(cluster.data_dir, f"broker-{broker_id}", f"{topic}-{partition}")
    data = b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.join(path, "*.log"))))
    out = []
    for h in iter_headers(data, check_crc=False):
        if h.last_offset >= end_offset:
            break
        out.append(data[h.position:h.position + h.size])
    return b"".join(out)


def wait_replicas_converged(cluster, topic: str, partition: int = 0, timeout_s: float = 60.0):
    """Until every replica's log end offset equals the leader's high watermark and log end."""
    def converged():
        row = partition_row(cluster, topic, partition)
        states = [replica_state(cluster, b, topic, partition) for b in row["replicas"]]
        ends = {s["log_end_offset"] for s in states}
        leader = [s for s in states if s["broker_id"] == row["leader"]]
        return (len(ends) == 1 and leader and leader[0]["high_watermark"] == ends.pop()
                and states)
    return wait_until(converged, timeout_s=timeout_s, what="replicas converged")


def assert_no_acknowledged_loss(acked: dict, records: list, cluster=None, topic=None,
                                partition: int = 0) -> None:
    """Every acknowledged value is in the log at the offset its acknowledgement named, and
    every offset holds one value. Given the cluster and topic, a failure also says what was
    read, where each replica stands and where on its disk the first missing value is."""
    by_offset = {r.offset: r.value for r in records}
    assert len(by_offset) == len(records)
    missing = [(v, o) for v, o in acked.items() if by_offset.get(o) != v]
    if missing and cluster is not None:
        story = loss_story(cluster, topic, partition, records, missing)
    else:
        story = ""
    assert not missing, (f"{len(missing)} acknowledged records lost or moved, e.g. "
                         f"{missing[:3]}{story}")


def loss_story(cluster, topic: str, partition: int, records: list, missing: list) -> str:
    """For a failed no-loss check: the offsets read, each replica's role, epoch, log end
    and HW, the offset each replica's segment files hold the first missing value at, and
    the partition's story (ZooKeeper, the brokers' caches, the controllers)."""
    from storage.records import decode_records
    value, offset = missing[0]
    lines = [f"\nread {len(records)} records, offsets "
             f"{records[0].offset if records else None}..{records[-1].offset if records else None}; "
             f"first missing {value!r} acknowledged at {offset}"]
    for bid in cluster.broker_ids():
        try:
            st = replica_state(cluster, bid, topic, partition)
            lines.append(f"replica on {bid}: {st['role']} leader={st['leader']} "
                         f"epoch={st['leader_epoch']} isr={st['isr']} "
                         f"start={st['log_start_offset']} leo={st['log_end_offset']} "
                         f"hw={st['high_watermark']} generation={st['generation']}")
        except Exception as exc:  # noqa: BLE001 - a dead replica is part of the story
            lines.append(f"replica on {bid}: {type(exc).__name__}")
        try:
            path = os.path.join(cluster.data_dir, f"broker-{bid}", f"{topic}-{partition}")
            data = b"".join(open(f, "rb").read()
                            for f in sorted(glob.glob(os.path.join(path, "*.log"))))
            found = [r.offset for r in decode_records(data) if r.value == value]
            lines.append(f"  on disk: {value!r} at offsets {found}")
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure
            lines.append(f"  on disk: unreadable ({exc!r})")
    try:
        lines.append(partition_story(cluster, topic, partition))
    except Exception as exc:  # noqa: BLE001
        lines.append(f"partition story unavailable: {exc!r}")
    return "\n".join(lines)
