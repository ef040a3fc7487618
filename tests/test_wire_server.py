"""The Kafka listener (actors.server.network), its handlers (actors.server.handlers) and a
single-process broker over real storage Logs (actors.server.log_backend), without Ray:
framing, ordering, limits and bad input on real sockets; each API through our own codec;
then unmodified clients (kafka-python, kcat, confluent-kafka) producing and consuming."""

import concurrent.futures
import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import tracemalloc

import pytest

from actors import wire
from actors.server.handlers import Purgatory, DelayedOperation
from actors.server.log_backend import LocalBroker
from actors.server import pki
from actors.server.network import ListenerSecurity, SocketServer, SocketServerConfig
from storage.records import build, decode_records
from tests.fuzz_helpers import mutated_frames, send_round

_SIZE = struct.Struct(">i")


# -- helpers --------------------------------------------------------------------------------
def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _recv_frame(sock: socket.socket) -> bytes:
    size, = _SIZE.unpack(_recv_exactly(sock, 4))
    return _recv_exactly(sock, size)


def _closed_by_server(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class RawClient:
    """Requests through our own codec on one blocking socket."""

    def __init__(self, address, client_id="raw"):
        self.sock = socket.create_connection(address, timeout=10)
        self.client_id = client_id
        self.next_id = 0

    def send(self, api_key: int, version: int, body: dict) -> int:
        self.next_id += 1
        header = wire.RequestHeader(api_key, version, self.next_id, self.client_id)
        self.sock.sendall(wire.encode_request(header, body))
        return self.next_id

    def recv(self, api_key: int, version: int) -> tuple[int, dict]:
        return wire.decode_response(api_key, version, _recv_frame(self.sock))

    def call(self, api_key: int, version: int, body: dict) -> dict:
        cid = self.send(api_key, version, body)
        got, answer = self.recv(api_key, version)
        assert got == cid
        return answer

    def close(self):
        self.sock.close()


def _raw_request(correlation_id: int, api_key: int = 1000, payload: bytes = b"") -> bytes:
    body = struct.pack(">hhih", api_key, 0, correlation_id, -1) + payload
    return _SIZE.pack(len(body)) + body


class ScriptedHandler:
    """Answers each request with its correlation id and payload, now or through a future
    the test completes; ``payload == b'none'`` answers nothing, b'boom' raises."""

    def __init__(self, deferred: bool = False):
        self.deferred = deferred
        self.futures: list[concurrent.futures.Future] = []
        self.seen: list[int] = []
        self.lock = threading.Lock()

    def handle(self, request):
        cid = request.header.correlation_id
        payload = bytes(request.body)
        with self.lock:
            self.seen.append(cid)
        if payload == b"boom":
            raise RuntimeError("handler bug")
        if payload == b"invalid":
            raise wire.InvalidRequestError("bad body", request.header)
        answer = None if payload == b"none" else \
            [_SIZE.pack(4 + len(payload)), struct.pack(">i", cid), payload]
        if not self.deferred:
            return answer
        f = concurrent.futures.Future()
        f.answer = answer
        with self.lock:
            self.futures.append(f)
        return f


@pytest.fixture
def server_factory():
    servers = []

    def make(handler, **config):
        server = SocketServer(handler, SocketServerConfig(**config)).start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close()


def _answers(sock, n):
    out = []
    for _ in range(n):
        frame = _recv_frame(sock)
        out.append((struct.unpack(">i", frame[:4])[0], frame[4:]))
    return out


def _wait(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# -- the network layer ---------------------------------------------------------------------
@pytest.mark.parametrize("io_threads", [0, 2], ids=["inline", "io-threads"])
def test_pipelined_requests_are_answered_in_order(server_factory, io_threads):
    """50 requests written at once on one connection come back in order, their payloads
    intact, whether handled on the network thread or on io threads."""
    server = server_factory(ScriptedHandler(), io_threads=io_threads)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"".join(_raw_request(i, payload=b"p%d" % i) for i in range(50)))
        assert _answers(sock, 50) == [(i, b"p%d" % i) for i in range(50)]


def test_deferred_answers_completed_out_of_order_are_written_in_order(server_factory):
    """Futures completed in reverse order (from another thread) are written in request
    order: a later answer waits behind an earlier one still pending."""
    handler = ScriptedHandler(deferred=True)
    server = server_factory(handler)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"".join(_raw_request(i, payload=b"x%d" % i) for i in range(10)))
        assert _wait(lambda: len(handler.futures) == 10)
        done = threading.Thread(target=lambda: [f.set_result(f.answer)
                                                for f in reversed(handler.futures[1:])])
        done.start()
        done.join()
        sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            sock.recv(1)                        # the first is still pending: nothing sent
        sock.settimeout(10)
        handler.futures[0].set_result(handler.futures[0].answer)
        assert _answers(sock, 10) == [(i, b"x%d" % i) for i in range(10)]


def test_no_response_requests_are_skipped_in_the_order(server_factory):
    """A request answered with None (Produce acks=0) gets no response; the ones after it
    are still answered, in order."""
    server = server_factory(ScriptedHandler())
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(_raw_request(1, payload=b"a") + _raw_request(2, payload=b"none") +
                     _raw_request(3, payload=b"c"))
        assert _answers(sock, 2) == [(1, b"a"), (3, b"c")]


@pytest.mark.parametrize("payload", [b"none", b"answer"], ids=["acks0", "answered"])
def test_requests_received_before_the_peer_closes_are_all_handled(server_factory, payload):
    """Requests a client wrote before closing its socket are handed to the handler, all of
    them, even when the close arrives while the first is still inside it (Kafka's Selector
    processes the receives staged before a disconnect): an acks=0 producer that closes
    right after its last send loses nothing. Their answers are dropped."""
    release, inside = threading.Event(), threading.Event()

    class Slow(ScriptedHandler):
        def handle(self, request):
            if request.header.correlation_id == 0:
                inside.set()
                release.wait(10)
            return super().handle(request)

    handler = Slow()
    server = server_factory(handler, io_threads=2)
    sock = socket.create_connection(server.address, timeout=10)
    sock.sendall(b"".join(_raw_request(i, payload=payload) for i in range(20)))
    assert inside.wait(5)
    sock.close()
    release.set()
    assert _wait(lambda: len(handler.seen) == 20), (len(handler.seen), server.stats())
    assert handler.seen == list(range(20))
    assert _wait(lambda: server.stats()["closed"] == 1)


def test_a_connection_is_read_only_while_few_requests_are_unanswered(server_factory):
    """With max_queued_requests=4 and nothing answered, the server takes in 4 requests of
    the 12 written and no more until answers go out; then all 12 are answered."""
    handler = ScriptedHandler(deferred=True)
    server = server_factory(handler, max_queued_requests=4)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"".join(_raw_request(i) for i in range(12)))
        assert _wait(lambda: len(handler.futures) == 4)
        time.sleep(0.2)
        assert len(handler.futures) == 4
        for i in range(12):
            assert _wait(lambda: len(handler.futures) > i)
            handler.futures[i].set_result(handler.futures[i].answer)
        assert [cid for cid, _ in _answers(sock, 12)] == list(range(12))


def test_oversized_frame_closes_the_connection_without_allocating(server_factory):
    """A size above socket.request.max.bytes (and a negative one) closes the connection
    before any body buffer is allocated; the server goes on serving."""
    server = server_factory(ScriptedHandler(), socket_request_max_bytes=1024)
    tracemalloc.start()
    try:
        for size in (1025, 2**31 - 1, -5):
            with socket.create_connection(server.address, timeout=10) as sock:
                sock.sendall(_SIZE.pack(size) + b"\0" * 64)
                assert _closed_by_server(sock)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 512 * 1024
    assert server.stats()["oversized"] == 3
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(_raw_request(9, payload=b"ok"))
        assert _answers(sock, 1) == [(9, b"ok")]


def test_default_request_limit_is_kafkas_100_mib(server_factory):
    """socket.request.max.bytes defaults to Kafka's 104857600: a frame one byte over is
    refused at its size prefix."""
    server = server_factory(ScriptedHandler())
    assert server.config.socket_request_max_bytes == 100 * 1024 * 1024
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(_SIZE.pack(100 * 1024 * 1024 + 1))
        assert _closed_by_server(sock)


def test_truncated_frames_garbage_and_bad_headers_never_stop_the_server(server_factory):
    """A frame cut short by the peer, random garbage, a header shorter than its fields and
    an InvalidRequestError or a bug in the handler each end only their own connection."""
    handler = ScriptedHandler()
    server = server_factory(handler)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(_SIZE.pack(100) + b"\0" * 10)          # truncated, then closed
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(os.urandom(4096))
    for bad in (_SIZE.pack(3) + b"abc", _raw_request(1, payload=b"invalid"),
                _raw_request(2, payload=b"boom")):
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.sendall(bad)
            assert _closed_by_server(sock)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(_raw_request(7, payload=b"alive"))
        assert _answers(sock, 1) == [(7, b"alive")]
    stats = server.stats()
    assert stats["invalid"] >= 2 and stats["handler_errors"] == 1


def test_idle_connections_are_closed(server_factory):
    """connections.max.idle.ms: a connection silent past it is closed; one in use is not."""
    server = server_factory(ScriptedHandler(), connections_max_idle_ms=300)
    with socket.create_connection(server.address, timeout=10) as sock:
        start = time.monotonic()
        assert _closed_by_server(sock, timeout_s=5)
        assert 0.25 < time.monotonic() - start < 2.5
    assert server.stats()["idle_closed"] >= 1


def test_connections_over_max_connections_are_refused(server_factory):
    """max.connections=2: a third connection is closed at once; after one of the first two
    goes, a new one is served."""
    server = server_factory(ScriptedHandler(), max_connections=2)
    a = socket.create_connection(server.address, timeout=10)
    b = socket.create_connection(server.address, timeout=10)
    try:
        assert _wait(lambda: server.stats()["connections"] == 2)
        with socket.create_connection(server.address, timeout=10) as c:
            assert _closed_by_server(c)
        a.close()
        assert _wait(lambda: server.stats()["connections"] == 1)
        with socket.create_connection(server.address, timeout=10) as d:
            d.sendall(_raw_request(3, payload=b"in"))
            assert _answers(d, 1) == [(3, b"in")]
    finally:
        b.close()
    assert server.stats()["refused"] == 1


def test_close_stops_the_thread_and_frees_the_port():
    """close() closes the connections, ends the network thread and releases the port."""
    server = SocketServer(ScriptedHandler()).start()
    sock = socket.create_connection(server.address, timeout=10)
    server.close()
    assert _closed_by_server(sock)
    sock.close()
    assert not server._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=2)


def test_listeners_setting_uses_kafkas_format():
    """``listeners=PLAINTEXT://127.0.0.1:0`` gives host and a free port; other protocols are
    refused (not implemented)."""
    config = SocketServerConfig.from_properties({"listeners": "PLAINTEXT://127.0.0.1:0",
                                                 "socket.request.max.bytes": "2048"})
    assert (config.host, config.port, config.socket_request_max_bytes) == \
        ("127.0.0.1", 0, 2048)
    with pytest.raises(ValueError, match="PLAINTEXT"):
        SocketServerConfig.from_properties({"listeners": "SSL://127.0.0.1:9093"})


# -- the purgatory ------------------------------------------------------------------------
class _Op(DelayedOperation):
    def __init__(self, deadline_s, flag):
        super().__init__(deadline_s)
        self.flag = flag
        self.result = None

    def ready(self):
        return self.flag[0]

    def complete(self, expired):
        self.result = "expired" if expired else "ready"


def test_purgatory_completes_on_notify_or_at_the_deadline_once():
    """A parked operation completes when a notify finds it ready, or at its deadline;
    never twice; close() completes what is left."""
    purgatory = Purgatory()
    try:
        flag = [False]
        ready_op = _Op(time.monotonic() + 30, flag)
        purgatory.park(ready_op, ["k"])
        assert ready_op.result is None and len(purgatory) == 1
        flag[0] = True
        assert purgatory.notify("k") == 1 and ready_op.result == "ready"
        assert purgatory.notify("k") == 0
        late = _Op(time.monotonic() + 0.1, [False])
        purgatory.park(late, ["other"])
        assert _wait(lambda: late.result == "expired", 3)
        left = _Op(time.monotonic() + 60, [False])
        purgatory.park(left, ["x"])
    finally:
        purgatory.close()
    assert left.result == "expired"


def test_the_purgatory_wakes_its_expiry_thread_only_for_an_earlier_deadline():
    """Parking an operation that expires after the earliest one waiting does not wake the
    expiry thread (a follower's or consumer's long poll each parks one); an earlier
    deadline does, and it still expires on time."""
    purgatory = Purgatory()
    wakes = []
    notify = purgatory._lock.notify
    purgatory._lock.notify = lambda *a: (wakes.append(1), notify(*a))
    try:
        now = time.monotonic()
        purgatory.park(_Op(now + 60, [False]), ["a"])
        assert len(wakes) == 1
        for i in range(50):
            purgatory.park(_Op(now + 61 + i, [False]), ["b%d" % i])
        assert len(wakes) == 1
        soon = _Op(time.monotonic() + 0.1, [False])
        purgatory.park(soon, ["c"])
        assert len(wakes) == 2
        assert _wait(lambda: soon.result == "expired", 3)
    finally:
        purgatory.close()


def test_a_parked_fetch_woken_by_a_change_it_cannot_use_is_not_read_again():
    """A parked Fetch asks the backend's offsets (has_records) at each notify and reads
    the partitions only when they have records for it (as Kafka's DelayedFetch compares
    offsets); the read that completes it gives its answer. A backend that cannot tell
    (None) is read as before."""
    from actors.protocol import FetchResult
    from actors.server.handlers import _DelayedFetch, _FetchRead

    class Backend:
        def __init__(self, knows=True):
            self.reads, self.end, self.knows = 0, 5, knows

        def leader_epoch(self, topic, partition):
            return 3

        def has_records(self, topic, partition, offset, *, replica_id):
            return (self.end > offset) if self.knows else None

        def read(self, topic, partition, offset, max_bytes, *, replica_id,
                 isolation_level, cached_only=False):
            self.reads += 1
            data = bytes(build([b"v"] * (self.end - offset), base_offset=offset)) \
                if self.end > offset else b""
            return FetchResult(data, self.end, 0, self.end)

    header = wire.RequestHeader(wire.FETCH, 12, 7, "t")
    for knows, reads_while_waiting in ((True, 0), (None, 3)):
        backend = Backend(knows)
        purgatory = Purgatory()
        try:
            future = concurrent.futures.Future()
            read = _FetchRead(backend, _fetch_body("events", 0, 5, max_wait_ms=30_000))
            purgatory.park(_DelayedFetch(time.monotonic() + 30, read, 1, header, future),
                           read.keys())
            parked = backend.reads
            for _ in range(3):                  # e.g. the HW moved, nothing new below it
                assert purgatory.notify(("events", 0)) == 0
            assert backend.reads - parked == reads_while_waiting and not future.done()
            backend.end = 7
            assert purgatory.notify(("events", 0)) == 1
            frame = b"".join(bytes(b) for b in future.result(1))[4:]
            _, body = wire.decode_response(wire.FETCH, 12, frame)
            part = body["responses"][0]["partitions"][0]
            assert part["high_watermark"] == 7
            assert [r.offset for r in decode_records(bytes(part["records"]))] == [5, 6]
        finally:
            purgatory.close()


def test_metadata_creates_unknown_topics_only_where_the_broker_allows_it():
    """KafkaApis asks its admin APIs to create a topic a Metadata request names (off the
    network thread: handle_inline declines such a request) only with
    auto.create.topics.enable true and allow_auto_topic_creation set; a broker without
    admin APIs (one process) never creates."""
    from actors.server.handlers import NOT_INLINE, KafkaApis
    from actors.server.network import Request

    class Backend:
        cluster_id = "c"

        def brokers(self):
            return []

        def controller_id(self):
            return 0

        def topics(self):
            return ["known"]

        def partitions(self, name):
            return [] if name == "known" else None

    class Admin:
        def __init__(self, enabled):
            self.enabled, self.created = enabled, []

        def handlers(self):
            return {}

        def auto_create_enabled(self):
            return self.enabled

        def auto_create_topic(self, name, request=None):
            self.created.append(name)
            return wire.ERRORS_BY_NAME["LEADER_NOT_AVAILABLE"].code

    def request(allow):
        header = wire.RequestHeader(wire.METADATA, 12, 1, "t")
        frame = wire.encode_request(header, {"topics": [{"name": "new"}, {"name": "known"}],
                                             "allow_auto_topic_creation": allow})
        head = wire.decode_request_header(memoryview(frame)[4:])
        return Request(head[0], memoryview(frame)[4 + head[1]:], ("h", 1), 0)

    def code_of_new(apis, allow):
        frame = b"".join(bytes(b) for b in apis.handle(request(allow)))[4:]
        _, body = wire.decode_response(wire.METADATA, 12, frame)
        return {t["name"]: t["error_code"] for t in body["topics"]}["new"]

    unknown = wire.ERRORS_BY_NAME["UNKNOWN_TOPIC_OR_PARTITION"].code
    on, off = Admin(True), Admin(False)
    apis_on, apis_off = KafkaApis(Backend(), admin=on), KafkaApis(Backend(), admin=off)
    alone = KafkaApis(Backend())
    try:
        assert apis_on.handle_inline(request(True)) is NOT_INLINE
        assert code_of_new(apis_on, True) == wire.ERRORS_BY_NAME["LEADER_NOT_AVAILABLE"].code
        assert on.created == ["new"]
        assert code_of_new(apis_on, False) == unknown and on.created == ["new"]
        assert apis_off.handle_inline(request(True)) is not NOT_INLINE
        assert code_of_new(apis_off, True) == unknown and off.created == []
        assert code_of_new(alone, True) == unknown
    finally:
        for apis in (apis_on, apis_off, alone):
            apis.close()


# -- the handlers over real Logs ---------------------------------------------------------
@pytest.fixture
def broker(tmp_path):
    b = LocalBroker(str(tmp_path / "data")).start()
    b.create_topic("events", 2)
    yield b
    b.close()


def _batch(values):
    return bytes(build(values))


def _produce(client, version, topic, partition, values, acks=-1):
    return client.call(wire.PRODUCE, version, {
        "acks": acks, "timeout_ms": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": partition,
                                                "records": _batch(values)}]}]})


def _fetch_body(topic, partition, offset, max_wait_ms=0, min_bytes=1, epoch=-1):
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "fetch_offset": offset, "current_leader_epoch": epoch,
                 "partition_max_bytes": 1 << 20}]}]}


def test_api_versions_advertises_exactly_the_implemented_set(broker):
    """ApiVersions (v0 and flexible v3) lists exactly the six data-plane APIs,
    InitProducerId and the two SASL ones (advertised on every listener, as Kafka does) at
    the codec's ranges (a LocalBroker has no group coordinator: no group API); an unknown
    ApiVersions version is answered at v0 with UNSUPPORTED_VERSION (KIP-511)."""
    client = RawClient(broker.server.address)
    data_plane = {wire.API_VERSIONS, wire.METADATA, wire.PRODUCE, wire.FETCH,
                  wire.LIST_OFFSETS, wire.OFFSET_FOR_LEADER_EPOCH, wire.INIT_PRODUCER_ID,
                  wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE}
    for version in (0, 3):
        body = client.call(wire.API_VERSIONS, version, {"client_software_name": "t",
                                                        "client_software_version": "1"})
        assert body["error_code"] == 0
        assert {k["api_key"]: (k["min_version"], k["max_version"])
                for k in body["api_keys"]} == {k: v for k, v in wire.SUPPORTED_VERSIONS.items()
                                               if k in data_plane}
    client.sock.sendall(_SIZE.pack(10) + struct.pack(">hhih", wire.API_VERSIONS, 9, 41, -1))
    cid, body = wire.decode_response(wire.API_VERSIONS, 0, _recv_frame(client.sock))
    assert cid == 41 and body["error_code"] == 35
    assert body["api_keys"] == [{"api_key": 18, "min_version": 0, "max_version": 4}]
    client.close()


def test_unknown_api_key_closes_the_connection(broker):
    """A request for an API the broker does not implement (AddPartitionsToTxn here) closes
    the connection, as Kafka does with a request it cannot parse."""
    with socket.create_connection(broker.server.address, timeout=10) as sock:
        sock.sendall(_raw_request(1, api_key=24, payload=b"\x00\x01g\x00"))
        assert _closed_by_server(sock)


def test_metadata_lists_the_node_topics_and_unknown_topics(broker):
    """Metadata names this node (host, port, controller), every partition with its leader
    and epoch; an unknown topic gets UNKNOWN_TOPIC_OR_PARTITION; null topics = all."""
    client = RawClient(broker.server.address)
    body = client.call(wire.METADATA, 12, {"topics": None})
    assert body["brokers"] == [{"node_id": 0, "host": "127.0.0.1",
                                "port": broker.server.port, "rack": None}]
    assert body["controller_id"] == 0
    [topic] = body["topics"]
    assert topic["name"] == "events" and topic["error_code"] == 0
    assert [(p["partition_index"], p["leader_id"], p["leader_epoch"], p["isr_nodes"])
            for p in topic["partitions"]] == [(0, 0, 0, [0]), (1, 0, 0, [0])]
    body = client.call(wire.METADATA, 1, {"topics": [{"name": "nope"}]})
    assert [(t["name"], t["error_code"]) for t in body["topics"]] == [("nope", 3)]
    body = client.call(wire.METADATA, 0, {"topics": []})
    assert [t["name"] for t in body["topics"]] == ["events"]
    client.close()


@pytest.mark.parametrize("version", [3, 9])
def test_produce_appends_and_fetch_reads_back_the_batches(broker, version):
    """Produce assigns offsets in the Log; Fetch returns the same records with the high
    watermark and log start; acks=0 answers nothing and still appends."""
    client = RawClient(broker.server.address)
    body = _produce(client, version, "events", 1, [b"a", b"b", b"c"])
    [resp] = body["responses"]
    assert resp["partition_responses"][0]["error_code"] == 0
    assert resp["partition_responses"][0]["base_offset"] == 0
    client.send(wire.PRODUCE, version, {"acks": 0, "timeout_ms": 1000, "topic_data": [
        {"name": "events", "partition_data": [{"index": 1, "records": _batch([b"d"])}]}]})
    body = _produce(client, version, "events", 1, [b"e"])
    assert body["responses"][0]["partition_responses"][0]["base_offset"] == 4
    fetched = client.call(wire.FETCH, 12, _fetch_body("events", 1, 0))
    [part] = fetched["responses"][0]["partitions"]
    assert (part["error_code"], part["high_watermark"], part["log_start_offset"]) == (0, 5, 0)
    assert [r.value for r in decode_records(bytes(part["records"]))] == \
        [b"a", b"b", b"c", b"d", b"e"]
    assert broker.backend.log("events", 1).log_end_offset == 5
    client.close()


def test_per_partition_errors_are_kafkas_codes(broker):
    """Unknown partition -> 3, an offset past the end -> 1, a stale or future leader epoch
    -> 74 / 75, a batch that is not magic 2 -> 87; each requested partition is answered,
    a failed one with an empty record set as Kafka answers it."""
    client = RawClient(broker.server.address)
    _produce(client, 9, "events", 0, [b"x"])
    body = client.call(wire.PRODUCE, 9, {"acks": 1, "timeout_ms": 100, "topic_data": [
        {"name": "events", "partition_data": [{"index": 7, "records": _batch([b"y"])},
                                              {"index": 0, "records": b"\0" * 70}]},
        {"name": "ghost", "partition_data": [{"index": 0, "records": _batch([b"z"])}]}]})
    codes = [(t["name"], p["index"], p["error_code"]) for t in body["responses"]
             for p in t["partition_responses"]]
    assert codes == [("events", 7, 3), ("events", 0, 87), ("ghost", 0, 3)]
    body = client.call(wire.FETCH, 12, {**_fetch_body("events", 0, 5), "topics": [
        {"topic": "events", "partitions": [
            {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1000},
            {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1000},
            {"partition": 0, "fetch_offset": 0, "current_leader_epoch": 3,
             "partition_max_bytes": 1000}]}]})
    assert [(p["partition_index"], p["error_code"])
            for p in body["responses"][0]["partitions"]] == [(0, 1), (1, 0), (0, 75)]
    # a failed partition's records are empty, not null (librdkafka: "invalid MessageSetSize")
    assert [bytes(p["records"]) for p in body["responses"][0]["partitions"]
            if p["error_code"]] == [b"", b""]
    broker.backend.epoch = 2
    body = client.call(wire.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": "events", "partitions": [{"partition_index": 0, "timestamp": -1,
                                           "current_leader_epoch": 1}]}]})
    assert body["topics"][0]["partitions"][0]["error_code"] == 74
    client.close()


def test_fetch_max_bytes_lets_only_the_first_partition_with_data_overrun(broker):
    """A Fetch's max_bytes (KIP-74): the first partition with data gets its first batch
    whole however large; after it, a partition gets only the whole batches that fit in what
    is left of max_bytes (none when its first batch does not), so the answer stays near
    max_bytes. A partition_max_bytes below a partition's first batch still lets it come
    whole."""
    client = RawClient(broker.server.address)
    big = [b"b" * 3000]
    for partition in (0, 1):
        for _ in range(3):
            _produce(client, 9, "events", partition, big)
    size = len(_batch(big))

    def records(max_bytes, partition_max_bytes=1 << 20):
        body = client.call(wire.FETCH, 12, {**_fetch_body("events", 0, 0),
                                            "max_bytes": max_bytes, "topics": [
            {"topic": "events", "partitions": [
                {"partition": p, "fetch_offset": 0, "current_leader_epoch": -1,
                 "partition_max_bytes": partition_max_bytes} for p in (0, 1)]}]})
        parts = body["responses"][0]["partitions"]
        assert [p["error_code"] for p in parts] == [0, 0]
        return [len(bytes(p["records"])) for p in parts]

    assert records(100) == [size, 0]                   # first batch whole, nothing after it
    assert records(size + 100) == [size, 0]
    assert records(2 * size + 100) == [2 * size, 0]
    assert records(3 * size + size // 2, ) == [3 * size, 0]
    assert records(4 * size + 10) == [3 * size, size]  # the second gets what fits, whole
    assert records(1 << 20) == [3 * size, 3 * size]
    assert records(1 << 20, partition_max_bytes=100) == [size, size]
    client.close()


def test_list_offsets_and_offset_for_leader_epoch(broker):
    """ListOffsets answers earliest (-2), latest (-1), a timestamp and the max timestamp
    (-3); OffsetForLeaderEpoch answers the epoch's end offset from the epoch cache."""
    client = RawClient(broker.server.address)
    now = int(time.time() * 1000)
    client.call(wire.PRODUCE, 9, {"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "events", "partition_data": [
            {"index": 0, "records": bytes(build([b"a", b"b", b"c"],
                                                timestamps=[now - 300, now - 200, now - 100]))}]}]})

    def offset(ts, version=7):
        body = client.call(wire.LIST_OFFSETS, version, {"replica_id": -1, "topics": [
            {"name": "events", "partitions": [{"partition_index": 0, "timestamp": ts}]}]})
        p = body["topics"][0]["partitions"][0]
        assert p["error_code"] == 0
        return p["timestamp"], p["offset"]

    assert offset(-2) == (-1, 0) and offset(-1) == (-1, 3) and offset(-1, 1) == (-1, 3)
    assert offset(now - 250) == (now - 200, 1)
    assert offset(now + 10_000) == (-1, -1)
    assert offset(-3) == (now - 100, 2)
    body = client.call(wire.OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [
        {"topic": "events", "partitions": [
            {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
            {"partition": 1, "current_leader_epoch": -1, "leader_epoch": 5}]}]})
    assert [(p["error_code"], p["leader_epoch"], p["end_offset"])
            for p in body["topics"][0]["partitions"]] == [(0, 0, 3), (0, -1, -1)]
    client.close()


def test_long_poll_fetch_waits_for_data_or_max_wait(broker):
    """A Fetch with max_wait_ms=5000 at the log end is answered as soon as another
    connection produces (well before the wait), with every requested partition; one with
    max_wait_ms=300 and no data is answered empty after about 300 ms."""
    consumer = RawClient(broker.server.address)
    producer = RawClient(broker.server.address)
    start = time.monotonic()
    body = consumer.call(wire.FETCH, 11, _fetch_body("events", 0, 0, max_wait_ms=300))
    assert 0.25 < time.monotonic() - start < 3
    assert body["responses"][0]["partitions"][0]["records"] == b""
    request = {**_fetch_body("events", 0, 0, max_wait_ms=5000), "topics": [
        {"topic": "events", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
            {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    cid = consumer.send(wire.FETCH, 12, request)
    time.sleep(0.2)
    start = time.monotonic()
    _produce(producer, 9, "events", 0, [b"wake"])
    got, body = consumer.recv(wire.FETCH, 12)
    assert got == cid and time.monotonic() - start < 2
    parts = body["responses"][0]["partitions"]
    assert [p["partition_index"] for p in parts] == [0, 1]
    assert [r.value for r in decode_records(bytes(parts[0]["records"]))] == [b"wake"]
    consumer.close()
    producer.close()


def test_fetch_with_a_session_id_we_never_gave_is_refused(broker):
    """The broker is sessionless (KIP-227 not implemented): a Fetch naming a session gets
    FETCH_SESSION_ID_NOT_FOUND; session_id 0 is answered with session_id 0."""
    client = RawClient(broker.server.address)
    body = client.call(wire.FETCH, 12, {**_fetch_body("events", 0, 0), "session_id": 9,
                                        "session_epoch": 1})
    assert body["error_code"] == 70
    assert client.call(wire.FETCH, 12, _fetch_body("events", 0, 0))["session_id"] == 0
    client.close()


# -- unmodified clients ------------------------------------------------------------------
N_RECORDS = 3000


def test_kafka_python_produces_and_consumes_with_negotiated_versions(broker):
    """kafka-python 3.0.12 (KafkaProducer, KafkaConsumer with assigned partitions) finds
    its versions through ApiVersions, produces 3000 keyed records with acks=all and reads
    them back in order per partition. enable_idempotence=False: kafka-python infers a
    broker >= 0.11 from our versions and would need InitProducerId (not in this issue)."""
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                   enable_idempotence=False, linger_ms=5)
    futures = [producer.send("events", key=b"k%d" % (i % 7), value=b"v%d" % i)
               for i in range(N_RECORDS)]
    producer.flush(30)
    metas = [f.get(10) for f in futures]
    producer.close()
    assert {m.partition for m in metas} == {0, 1}
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                   enable_auto_commit=False, auto_offset_reset="earliest",
                                   consumer_timeout_ms=5000)
    consumer.assign([kafka.TopicPartition("events", 0), kafka.TopicPartition("events", 1)])
    got = {}
    for message in consumer:
        got.setdefault(message.partition, []).append((message.offset, message.value))
        if sum(map(len, got.values())) == N_RECORDS:
            break
    assert consumer.end_offsets([kafka.TopicPartition("events", 0)]) == \
        {kafka.TopicPartition("events", 0): len(got[0])}
    consumer.close()
    for partition, records in got.items():
        assert [o for o, _ in records] == list(range(len(records)))
        sent = [b"v%d" % i for i, m in enumerate(metas) if m.partition == partition]
        assert [v for _, v in records] == sent


def test_kcat_lists_produces_and_consumes(broker):
    """kcat (librdkafka): -L shows the broker and partitions, -P writes 3000 keyed lines,
    -C -e reads all of them back."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    listed = subprocess.run(["kcat", "-b", broker.bootstrap, "-L"], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"broker 0 at {broker.bootstrap}" in listed.stdout
    assert 'topic "events" with 2 partitions' in listed.stdout
    lines = "".join(f"key{i}:value{i}\n" for i in range(N_RECORDS))
    produced = subprocess.run(["kcat", "-b", broker.bootstrap, "-P", "-t", "events", "-K:"],
                              input=lines, capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", "events", "-o",
                               "beginning", "-e", "-f", "%k:%s\n"], capture_output=True,
                              text=True, timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.splitlines()) == sorted(lines.splitlines())


def test_confluent_kafka_admin_lists_every_topic(broker):
    """confluent-kafka's AdminClient.list_topics() with no topic (a Metadata v12 for all
    topics, whose body carries 3 bytes after its tagged fields) gets every topic and its
    partitions, not a closed connection."""
    ck_admin = pytest.importorskip("confluent_kafka.admin")
    metadata = ck_admin.AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(
        timeout=30)
    assert sorted(metadata.topics["events"].partitions) == [0, 1]
    assert list(metadata.brokers) == [0]


def _confluent_values(consumer, n: int) -> list:
    """The values of ``events`` 0-1 from the beginning, read by a confluent-kafka consumer
    until it has ``n`` (or 60 s passed)."""
    import confluent_kafka as ck
    consumer.assign([ck.TopicPartition("events", p, ck.OFFSET_BEGINNING) for p in (0, 1)])
    values, deadline = [], time.monotonic() + 60
    while len(values) < n and time.monotonic() < deadline:
        for m in consumer.consume(1000, 1.0):
            assert m.error() is None, m.error()
            values.append(m.value())
    return values


def test_confluent_kafka_produces_and_consumes(broker):
    """confluent-kafka (librdkafka, acks=all, idempotence off by default) produces 3000
    records; a Consumer with assigned partitions reads them all and the watermarks agree.
    (group.id is required by the client; with assign() it sends no group request the
    broker must answer.)"""
    ck = pytest.importorskip("confluent_kafka")
    errors = []
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(N_RECORDS):
        producer.produce("events", key=b"k%d" % i, value=b"c%d" % i,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and errors == []
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused",
                            "enable.auto.commit": False})
    values = _confluent_values(consumer, N_RECORDS)
    lows_highs = [consumer.get_watermark_offsets(ck.TopicPartition("events", p), 10)
                  for p in (0, 1)]
    consumer.close()
    assert sorted(values) == sorted(b"c%d" % i for i in range(N_RECORDS))
    assert sum(high - low for low, high in lows_highs) == N_RECORDS


def test_zstd_batches_of_librdkafka_are_stored_and_read_back_by_kafka_python(broker):
    """confluent-kafka producing with compression.type=zstd: the broker stores its batches
    as they came (codec 4 in their attributes), our decoder reads every record, and
    kafka-python and confluent-kafka consumers read the same records back."""
    ck = pytest.importorskip("confluent_kafka")
    from kafka import KafkaConsumer, TopicPartition
    from storage.records import CODEC_ZSTD, iter_headers
    errors = []
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                            "compression.type": "zstd"})
    want = [b"zstd value %d " % i * 5 for i in range(N_RECORDS)]
    for i, value in enumerate(want):
        producer.produce("events", key=b"k%d" % i, value=value, partition=i % 2,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and errors == []
    stored = []
    for p in (0, 1):
        data = broker.backend.log("events", p).read(0, 64 << 20)
        assert {h.compression for h in iter_headers(data)} == {CODEC_ZSTD}
        stored += [r.value for r in decode_records(data)]
    assert sorted(stored) == sorted(want)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    consumer.assign([TopicPartition("events", p) for p in (0, 1)])
    got = [m.value for m in consumer]
    consumer.close()
    assert sorted(got) == sorted(want)
    ck_consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused",
                               "enable.auto.commit": False})
    got = _confluent_values(ck_consumer, N_RECORDS)
    ck_consumer.close()
    assert sorted(got) == sorted(want)


def test_fuzzed_frames_while_a_producer_writes_lose_nothing_acknowledged(broker):
    """Thousands of random and mutated frames on many connections while kafka-python
    produces with acks=all: every acknowledged record is in the log in order, and the
    broker still answers afterwards."""
    kafka = pytest.importorskip("kafka")
    import random
    rng = random.Random(21)
    valid = [wire.encode_request(wire.RequestHeader(key, version, 5, "fuzz"), body)
             for key, version, body in (
                 (wire.PRODUCE, 9, {"acks": 1, "timeout_ms": 100, "topic_data": [
                     {"name": "events", "partition_data": [
                         {"index": 0, "records": bytes(build([b"junk"]))}]}]}),
                 (wire.FETCH, 12, _fetch_body("events", 0, 0)),
                 (wire.METADATA, 12, {"topics": None}),
                 (wire.LIST_OFFSETS, 7, {"topics": [{"name": "events", "partitions": [
                     {"partition_index": 0, "timestamp": -1}]}]}))]
    acked, failures = [], []

    def produce():
        producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                       enable_idempotence=False, retries=5)
        for i in range(1000):
            producer.send("events", partition=1, value=b"r%d" % i).add_callback(
                lambda m, i=i: acked.append(i)).add_errback(failures.append)
            if i % 100 == 0:
                time.sleep(0.02)
        producer.flush(60)
        producer.close()

    writer = threading.Thread(target=produce)
    writer.start()
    for _ in range(300):
        send_round(broker.server.address, mutated_frames(rng, valid))
    writer.join(120)
    assert failures == [] and len(acked) == 1000
    stored = [r.value for r in decode_records(broker.backend.log("events", 1).read(0, 1 << 24))]
    assert stored == [b"r%d" % i for i in range(1000)]
    client = RawClient(broker.server.address)
    assert client.call(wire.METADATA, 12, {"topics": None})["topics"][0]["name"] == "events"
    client.close()


def test_request_buffers_are_bounded_by_queued_max_request_bytes(server_factory):
    """queued.max.request.bytes=8 KiB with 5 KiB requests: a second connection's request
    is not read (no buffer allocated) while the first's is unanswered, and is served once
    the first is answered; every buffer is released after."""
    handler = ScriptedHandler(deferred=True)
    server = server_factory(handler, socket_request_max_bytes=6000,
                            queued_max_request_bytes=8192)
    payload = b"m" * 5000
    with socket.create_connection(server.address, timeout=10) as a, \
            socket.create_connection(server.address, timeout=10) as b:
        a.sendall(_raw_request(1, payload=payload))
        assert _wait(lambda: len(handler.futures) == 1)
        b.sendall(_raw_request(2, payload=payload))
        assert _wait(lambda: server.stats().get("memory_waits") == 1)
        time.sleep(0.1)
        assert len(handler.futures) == 1 and server.stats()["memory_bytes"] < 8192
        handler.futures[0].set_result(handler.futures[0].answer)
        assert _answers(a, 1) == [(1, payload)]
        assert _wait(lambda: len(handler.futures) == 2)
        handler.futures[1].set_result(handler.futures[1].answer)
        assert _answers(b, 1) == [(2, payload)]
    assert _wait(lambda: server.stats()["memory_bytes"] == 0)


def test_acks_0_failures_close_the_connection_and_bad_names_are_invalid_topics(broker):
    """An acks=0 produce that fails (unknown partition) closes the connection, Kafka's only
    way to tell the client; Metadata answers INVALID_TOPIC_EXCEPTION (17) for a bad name."""
    client = RawClient(broker.server.address)
    body = client.call(wire.METADATA, 9, {"topics": [{"name": "bad name!"}, {"name": ""}]})
    assert [t["error_code"] for t in body["topics"]] == [17, 17]
    client.send(wire.PRODUCE, 9, {"acks": 0, "timeout_ms": 100, "topic_data": [
        {"name": "events", "partition_data": [{"index": 9, "records": _batch([b"x"])}]}]})
    assert _closed_by_server(client.sock)
    client.close()


def test_clients_find_offsets_by_time_and_the_watermarks(broker):
    """kafka-python's beginning/end offsets and offsets_for_times (ListOffsets), and
    confluent-kafka's offsets_for_times and watermarks (ListOffsets at read_committed,
    which is the high watermark here: no transactions) agree with the Log."""
    kafka = pytest.importorskip("kafka")
    ck = pytest.importorskip("confluent_kafka")
    now = int(time.time() * 1000)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                   enable_idempotence=False)
    for i in range(10):
        producer.send("events", partition=0, value=b"%d" % i, timestamp_ms=now + i * 1000)
    producer.flush(30)
    producer.close()
    tp = kafka.TopicPartition("events", 0)
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    assert consumer.config["api_version"] == (3, 0)        # inferred from ListOffsets v7
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 10}
    found = consumer.offsets_for_times({tp: now + 4500})[tp]
    assert (found.offset, found.timestamp) == (5, now + 5000)
    assert consumer.offsets_for_times({tp: now + 60_000}) == {tp: None}
    consumer.close()
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused"})
    [got] = c.offsets_for_times([ck.TopicPartition("events", 0, now + 2500)], 10)
    assert got.offset == 3
    assert c.get_watermark_offsets(ck.TopicPartition("events", 0), 10) == (0, 10)
    c.close()



# -- TLS on the network layer (memory buffers: docs/security.md) -------------------------------
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN=alice)."""
    d = tmp_path_factory.mktemp("tls")
    ca, ca_key = pki.make_ca("network test CA", days=1)
    out = {"ca": str(d / "ca.pem")}
    pki.write_public(out["ca"], ca)
    for who, cn in (("server", "broker"), ("client", "alice")):
        cert, key = pki.make_certificate(ca, ca_key, ("127.0.0.1",), days=1, common_name=cn)
        out[who] = (str(d / f"{who}.pem"), str(d / f"{who}.key"))
        pki.write_public(out[who][0], cert)
        pki.write_private(out[who][1], key)
    return out


def _tls_server(handler, files, client_auth=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*files["server"])
    if client_auth:
        ctx.load_verify_locations(files["ca"])
        ctx.verify_mode = ssl.CERT_REQUIRED
    return SocketServer(handler, SocketServerConfig(), security=ListenerSecurity(
        name="SSL", protocol="SSL", ssl_context=ctx)).start()


def _tls_client(server, files, client_cert=False, rcvbuf=None):
    ctx = ssl.create_default_context(cafile=files["ca"])
    if client_cert:
        ctx.load_cert_chain(*files["client"])
    sock = socket.create_connection(server.address, timeout=10)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return ctx.wrap_socket(sock, server_hostname="127.0.0.1")


def test_tls_requests_in_tiny_records_and_answers_beyond_the_socket_buffers_arrive_whole(
        tls_files):
    """On an SSL listener, 40 pipelined requests each written as 7-byte TLS records (as
    librdkafka writes small pieces) are all answered, in order, with their payloads; 2 MiB
    answers to a client with a 64 KiB receive buffer (the server's sends come back short)
    arrive whole."""
    class Echo(ScriptedHandler):
        def handle(self, request):
            if bytes(request.body) == b"big":
                cid = request.header.correlation_id
                body = bytes(range(256)) * (8 << 10)
                return [_SIZE.pack(4 + len(body)), struct.pack(">i", cid), body]
            return super().handle(request)

    server = _tls_server(Echo(), tls_files)
    try:
        with _tls_client(server, tls_files, rcvbuf=64 << 10) as sock:
            frames = b"".join(_raw_request(i, payload=b"big" if i % 10 == 9 else
                                           b"p%03d" % i) for i in range(40))
            for k in range(0, len(frames), 7):
                sock.sendall(frames[k:k + 7])
            answers = _answers(sock, 40)
        assert [cid for cid, _ in answers] == list(range(40))
        for cid, payload in answers:
            assert payload == (bytes(range(256)) * (8 << 10) if cid % 10 == 9 else
                               b"p%03d" % cid)
        assert server.stats()["tls_handshakes"] == 1
    finally:
        server.close()


def test_tls_client_certificate_subject_is_the_principal(tls_files):
    """With client authentication required, a client presenting a certificate signed by
    the CA is ``User:CN=alice``; one without a certificate is refused at the handshake and
    the server keeps serving."""
    class Who(ScriptedHandler):
        principals = []

        def handle(self, request):
            self.principals.append(request.principal)
            return super().handle(request)

    handler = Who()
    server = _tls_server(handler, tls_files, client_auth=True)
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with _tls_client(server, tls_files) as sock:
                sock.sendall(_raw_request(1, payload=b"x"))
                _answers(sock, 1)
        with _tls_client(server, tls_files, client_cert=True) as sock:
            sock.sendall(_raw_request(2, payload=b"y"))
            assert _answers(sock, 1) == [(2, b"y")]
        assert handler.principals == ["User:CN=alice"]
        assert server.stats()["tls_failed"] == 1
    finally:
        server.close()

def test_a_client_that_never_reads_its_answers_stops_being_read(server_factory):
    """A client pipelining requests for 256 KiB answers and reading none: once the socket
    buffers are full the server stops reading its requests, so what it holds for that
    client stays bounded (a few answers, not 400)."""
    class Big(ScriptedHandler):
        def handle(self, request):
            super().handle(request)
            cid = request.header.correlation_id
            return [_SIZE.pack(4 + (256 << 10)), struct.pack(">i", cid), bytes(256 << 10)]

    handler = Big()
    server = server_factory(handler)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.setblocking(False)
        frames = b"".join(_raw_request(i) for i in range(400))
        sent = 0
        deadline = time.monotonic() + 3
        while sent < len(frames) and time.monotonic() < deadline:
            try:
                sent += sock.send(frames[sent:])
            except BlockingIOError:
                time.sleep(0.01)
        time.sleep(0.3)
        assert len(handler.seen) < 100
