"""The data plane's costs (issue 21): the wire codec (actors.wire) against kafka-python
3.0's kafka.protocol, and a request round trip over a local socket against a Ray actor
call.

- ``produce_decode_*``: decoding a Produce v9 request (header included) carrying one
  partition's records, 1 MiB and 1 KiB: what a broker does per produce request.
- ``fetch_encode_*``: encoding a Fetch v12 response (header and size prefix included),
  6 partitions of 170 KiB (~1 MiB) and 1 partition of 1 KiB. Ours is measured twice: as
  buffer lists (what the listener writes with sendmsg) and joined into one bytes object.
- ``socket_rtt_*``: a client in this process, a LocalBroker (listener + handlers + storage
  Logs) in another: ApiVersions v3, Produce v9 acks=1 of one 100-byte record, Fetch v12 of
  the last record; and ``raw_echo``, a 4-byte-framed echo between two processes in plain
  Python (the floor under any Python server).
- ``e2e_<rate>_p50_ms`` / ``p99``: end to end through a LocalBroker in another process:
  a confluent-kafka producer (acks=all, linger 0) paced at ``rate`` records/s of 100 bytes,
  a confluent-kafka consumer long-polling the partition (fetch.wait.max.ms 500) stamps
  each record's arrival: RF=1, no Ray, no replica hop (the floor of the socket path).
- ``ray_call_p50_ms``: an empty method call on a Ray actor (a private local Ray), as
  benchmarks/replication_bench.py measures it.

Each figure is a median (p50) of many timed calls after a warm-up; the machine is shared,
so read them as orders of magnitude. Prints progress on stderr and one JSON object on
stdout. ``--no-ray`` skips the Ray call.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from actors import wire  # noqa: E402
from benchmarks.common import phase, say  # noqa: E402

_SIZE = struct.Struct(">i")


def _p50_us(fn, calls: int) -> float:
    for _ in range(min(calls, 50)):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return round(statistics.median(times) / 1000, 2)


def _percentiles_ms(times_ns: list[int]) -> tuple[float, float]:
    times_ns = sorted(times_ns)
    return (round(times_ns[len(times_ns) // 2] / 1e6, 4),
            round(times_ns[int(len(times_ns) * 0.99)] / 1e6, 4))


# -- the codec ------------------------------------------------------------------------------
def _produce_frames(records: bytes):
    from kafka.protocol.producer import ProduceRequest
    req = ProduceRequest(version=9, transactional_id=None, acks=-1, timeout_ms=30000,
                         topic_data=[ProduceRequest.TopicProduceData(name="events", partition_data=[
                             ProduceRequest.TopicProduceData.PartitionProduceData(
                                 index=0, records=records)])])
    req.with_header(correlation_id=7, client_id="bench")
    return ProduceRequest, req.encode(header=True)


def codec(calls: int) -> dict:
    from kafka.protocol.consumer import FetchResponse
    out = {}
    for label, size in (("1mib", 1 << 20), ("1kib", 1 << 10)):
        kp_cls, frame = _produce_frames(os.urandom(size))
        n = calls if size < 1 << 16 else max(calls // 20, 50)
        out[f"produce_decode_{label}_us_ours"] = _p50_us(lambda: wire.decode_request(frame), n)
        out[f"produce_decode_{label}_us_kafka_python"] = _p50_us(
            lambda: kp_cls.decode(frame, version=9, header=True), n)
    header = wire.RequestHeader(wire.FETCH, 12, 9, "bench")
    for label, parts, size in (("1mib", 6, 170 << 10), ("1kib", 1, 1 << 10)):
        records = [os.urandom(size) for _ in range(parts)]
        body = {"session_id": 0, "responses": [{"topic": "events", "partitions": [
            {"partition_index": i, "high_watermark": 1000, "last_stable_offset": 1000,
             "log_start_offset": 0, "records": r} for i, r in enumerate(records)]}]}
        P = FetchResponse.FetchableTopicResponse.PartitionData

        def kp_encode():
            resp = FetchResponse(version=12, throttle_time_ms=0, error_code=0, session_id=0,
                                 responses=[FetchResponse.FetchableTopicResponse(
                                     topic="events", partitions=[
                                         P(partition_index=i, error_code=0, high_watermark=1000,
                                           last_stable_offset=1000, log_start_offset=0,
                                           aborted_transactions=None, preferred_read_replica=-1,
                                           records=r) for i, r in enumerate(records)])])
            resp.with_header(correlation_id=9)
            return resp.encode(header=True, framed=True)

        assert b"".join(wire.encode_response_parts(header, body)) == kp_encode()
        n = calls if size < 1 << 16 else max(calls // 20, 50)
        out[f"fetch_encode_{label}_us_ours_parts"] = _p50_us(
            lambda: wire.encode_response_parts(header, body), n)
        out[f"fetch_encode_{label}_us_ours_joined"] = _p50_us(
            lambda: b"".join(wire.encode_response_parts(header, body)), n)
        out[f"fetch_encode_{label}_us_kafka_python"] = _p50_us(kp_encode, n)
    return out


# -- round trips over a local socket -----------------------------------------------------------
_BROKER = """
import sys, tempfile
from actors.server.log_backend import LocalBroker
broker = LocalBroker(tempfile.mkdtemp(prefix="wire-bench-")).start()
broker.create_topic("events", 1)
print(broker.server.port, flush=True)
sys.stdin.read()
broker.close()
"""

_ECHO = """
import socket, struct, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 16)
while True:
    head = conn.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        break
    n = struct.unpack(">i", head)[0]
    body = conn.recv(n, socket.MSG_WAITALL)
    conn.sendall(head + body)
"""


def _spawn(code: str):
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=_ROOT, text=True)
    port = int(proc.stdout.readline())
    return proc, port


def _end(proc) -> None:
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _recv_exactly(sock, n: int) -> bytes:
    return sock.recv(n, socket.MSG_WAITALL)


def _timed_calls(sock, frame: bytes, calls: int) -> list[int]:
    times = []
    for i in range(calls + 100):
        t0 = time.perf_counter_ns()
        sock.sendall(frame)
        size, = _SIZE.unpack(_recv_exactly(sock, 4))
        _recv_exactly(sock, size)
        if i >= 100:
            times.append(time.perf_counter_ns() - t0)
    return times


def socket_rtt(calls: int) -> dict:
    from storage.records import build
    out = {}
    proc, port = _spawn(_ECHO)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            p50, p99 = _percentiles_ms(_timed_calls(sock, _SIZE.pack(100) + b"x" * 100, calls))
            out.update(raw_echo_rtt_p50_ms=p50, raw_echo_rtt_p99_ms=p99)
    finally:
        _end(proc)
    proc, port = _spawn(_BROKER)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            batch = bytes(build([b"v" * 100]))
            requests = {
                "api_versions": (wire.API_VERSIONS, 3, {"client_software_name": "bench",
                                                        "client_software_version": "1"}),
                "produce": (wire.PRODUCE, 9, {"acks": 1, "timeout_ms": 5000, "topic_data": [
                    {"name": "events", "partition_data": [{"index": 0, "records": batch}]}]}),
                "fetch": (wire.FETCH, 12, {"max_wait_ms": 0, "min_bytes": 1, "topics": [
                    {"topic": "events", "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 200}]}]}),
            }
            for name, (key, version, body) in requests.items():
                frame = wire.encode_request(wire.RequestHeader(key, version, 1, "bench"), body)
                p50, p99 = _percentiles_ms(_timed_calls(sock, frame, calls))
                out[f"socket_rtt_{name}_p50_ms"] = p50
                out[f"socket_rtt_{name}_p99_ms"] = p99
    finally:
        _end(proc)
    out["socket_rtt_p50_ms"] = out.get("socket_rtt_api_versions_p50_ms")
    return out


# -- end to end through librdkafka ---------------------------------------------------------
def warm_group_coordinator(bootstrap: str, timeout_s: float = 120.0) -> dict:
    """Have the group coordinator up before anything is timed (clients_bench,
    listener_bench): the first client with a ``group.id`` (``e2e_once``'s consumer,
    clients_bench's) makes the brokers create ``__consumer_offsets``, whose partition
    replicas are processes (6 partitions x RF 3 here: about 0.6 CPU-seconds each to
    start). Left to a timed run, those starts took most of this 2-core machine: a consume
    measured 160-280k records/s, 390-440k once they were done, as much as from a
    LocalBroker. Returns how long the coordinator took (``group_coordinator_s``)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench"})
    try:
        while True:
            try:
                consumer.committed([TopicPartition("__warm_up__", 0)],
                                   timeout=max(deadline - time.monotonic(), 1))
                break
            except KafkaException:
                # NOT_COORDINATOR was seen once while the new partitions' leaders took
                # over (librdkafka does not retry committed() on it)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    while True:        # every replica of every partition started and in sync
        parts = admin.list_topics("__consumer_offsets", timeout=10).topics[
            "__consumer_offsets"].partitions
        if parts and all(p.leader >= 0 and len(p.isrs) == len(p.replicas)
                         for p in parts.values()):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"__consumer_offsets not in sync after {timeout_s} s")
        time.sleep(0.2)
    return {"group_coordinator_s": round(time.perf_counter() - t0, 2)}


def e2e_once(bootstrap: str, topic: str, partitions: int, rate: int, seconds: float) -> dict:
    """One paced end-to-end run: a confluent-kafka producer (acks=all, linger 0) sends
    100-byte records at ``rate``/s for ``seconds`` (its default partitioner spreads them),
    a consumer long-polling every partition stamps their arrival. ``{records, p50_ms,
    p99_ms}``."""
    import threading

    import confluent_kafka as ck
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                            "enable.auto.commit": False, "fetch.wait.max.ms": 500,
                            "fetch.min.bytes": 1})
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_END) for p in range(partitions)])
    latencies, stop = [], threading.Event()

    def consume():
        while not stop.is_set():
            for m in consumer.consume(1, 0.2):
                if m.error() is None:
                    sent, = struct.unpack(">d", m.value()[:8])
                    latencies.append(time.time() - sent)

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(2)               # the consumer's first fetches are parked
    start = time.time()
    for i in range(int(rate * seconds)):
        while time.time() < start + i / rate:
            time.sleep(0.0002)
        producer.produce(topic, struct.pack(">d", time.time()) + b"x" * 92)
        producer.poll(0)
    producer.flush(30)
    time.sleep(1.5)
    stop.set()
    reader.join(10)
    consumer.close()
    latencies.sort()
    return {"records": len(latencies),
            "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3)}


def e2e(rates: list[int], seconds: float) -> dict:
    out = {}
    proc, port = _spawn(_BROKER)
    try:
        for rate in rates:
            run = e2e_once(f"127.0.0.1:{port}", "events", 1, rate, seconds)
            out.update({f"e2e_{rate}_{k}": v for k, v in run.items()})
    finally:
        _end(proc)
    return out


# -- a Ray actor call ---------------------------------------------------------------------
def time_ray_calls(calls: int) -> dict:
    """p50 / p99 of an empty method call on a fresh actor of the Ray this process uses."""
    import ray

    @ray.remote(num_cpus=0)
    class Pinger:
        def ping(self):
            return None

    pinger = Pinger.remote()
    ray.get(pinger.ping.remote())
    times = []
    for i in range(calls + 100):
        t0 = time.perf_counter_ns()
        ray.get(pinger.ping.remote())
        if i >= 100:
            times.append(time.perf_counter_ns() - t0)
    ray.kill(pinger)
    p50, p99 = _percentiles_ms(times)
    return {"ray_call_p50_ms": p50, "ray_call_p99_ms": p99}


def ray_call(calls: int) -> dict:
    import ray

    from actors import raycompat
    raycompat.init_local(f"wire-bench-{os.getpid()}")
    try:
        return time_ray_calls(calls)
    finally:
        ray.shutdown()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--e2e-rates", default="100,1000",
                        help="records/s of the end-to-end runs ('' skips them)")
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    out = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    phase(out, "codec", codec, args.calls)
    phase(out, "socket_rtt", socket_rtt, args.calls)
    if args.e2e_rates:
        phase(out, "e2e", e2e, [int(r) for r in args.e2e_rates.split(",")], args.e2e_seconds)
    if not args.no_ray:
        phase(out, "ray_call", ray_call, args.calls)
    if out.get("socket_rtt_p50_ms") and out.get("ray_call_p50_ms"):
        out["ray_call_over_socket_rtt"] = round(out["ray_call_p50_ms"] /
                                                out["socket_rtt_p50_ms"], 1)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
