"""actors.connection.KafkaConnection against a real listener (a LocalBroker: storage.Log
behind the Kafka handlers, no Ray): negotiation, pipelining, acks=0, broken connections."""

from __future__ import annotations

import socket
import threading

import pytest

from actors import wire
from actors.connection import KafkaConnection
from actors.errors import NetworkError
from actors.server.log_backend import LocalBroker
from storage.records import build, decode_records


@pytest.fixture
def broker(tmp_path):
    b = LocalBroker(str(tmp_path / "data")).start()
    b.create_topic("events", 2)
    yield b
    b.close()


def _address(broker):
    host, port = broker.bootstrap.rsplit(":", 1)
    return host, int(port)


def _produce_body(values, acks=-1, partition=0):
    return {"acks": acks, "timeout_ms": 5000, "topic_data": [
        {"name": "events", "partition_data": [
            {"index": partition, "records": bytes(build(values))}]}]}


def _fetch_body(offset, partition=0, max_wait_ms=0):
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "topics": [{"topic": "events", "partitions": [
                {"partition": partition, "current_leader_epoch": -1,
                 "fetch_offset": offset, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": []}


def test_negotiates_the_highest_version_both_sides_know(broker):
    """ApiVersions at connect keeps, per API, the top version of wire.SUPPORTED_VERSIONS
    the broker also serves."""
    conn = KafkaConnection(*_address(broker))
    try:
        served = broker.apis.versions()       # a LocalBroker serves no group API
        assert set(conn.versions) == set(served)
        for key, (_, hi) in served.items():
            assert conn.versions[key] == wire.SUPPORTED_VERSIONS[key][1] == hi
    finally:
        conn.close()


def test_pipelined_requests_are_answered_in_order_with_their_bodies(broker):
    """Fifty produces sent before any answer is read come back with consecutive offsets,
    and a fetch afterwards returns every record."""
    conn = KafkaConnection(*_address(broker))
    try:
        futures = [conn.request(wire.PRODUCE, _produce_body([b"v%d" % i]))
                   for i in range(50)]
        offsets = [f.result(10)["responses"][0]["partition_responses"][0]["base_offset"]
                   for f in futures]
        assert offsets == list(range(50))
        answer = conn.request(wire.FETCH, _fetch_body(0)).result(10)
        records = answer["responses"][0]["partitions"][0]["records"]
        assert isinstance(records, memoryview)
        assert [r.value for r in decode_records(bytes(records))] == \
            [b"v%d" % i for i in range(50)]
    finally:
        conn.close()


def test_acks_zero_resolves_at_once_and_the_next_answer_still_pairs(broker):
    """A request without a response (acks=0) resolves to None; the fetch sent after it is
    paired with its own answer, not shifted by one."""
    conn = KafkaConnection(*_address(broker))
    try:
        assert conn.request(wire.PRODUCE, _produce_body([b"x"], acks=0),
                            expect_response=False).result(1) is None
        answer = conn.request(wire.FETCH, _fetch_body(0, max_wait_ms=2000)).result(10)
        assert answer["responses"][0]["partitions"][0]["high_watermark"] == 1
    finally:
        conn.close()


def _answer_api_versions(conn) -> None:
    """Read one request (ApiVersions) from ``conn`` and answer it with every version
    actors.wire knows."""
    size = int.from_bytes(conn.recv(4), "big")
    frame = b""
    while len(frame) < size:
        frame += conn.recv(size - len(frame))
    header, _ = wire.decode_request(frame)
    conn.sendall(wire.encode_response(header, {
        "error_code": 0, "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                                      for k, (lo, hi) in wire.SUPPORTED_VERSIONS.items()],
        "throttle_time_ms": 0}))


def test_a_connection_the_broker_drops_fails_pending_and_later_requests(tmp_path):
    """A server that closes the socket after ApiVersions: the long poll in flight and every
    later request fail with NetworkError (retriable), never hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []

    def serve():
        conn, _ = listener.accept()
        accepted.append(conn)
        _answer_api_versions(conn)
        conn.recv(1 << 16)                 # the fetch arrives; then the broker "dies"
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    conn = KafkaConnection("127.0.0.1", port)
    pending = conn.request(wire.FETCH, _fetch_body(0, max_wait_ms=30000))
    with pytest.raises(NetworkError):
        pending.result(10)
    assert not conn.alive
    with pytest.raises(NetworkError):
        conn.request(wire.FETCH, _fetch_body(0)).result(1)
    thread.join(5)
    listener.close()


def test_connecting_to_a_closed_port_is_a_network_error():
    """Nobody listening: NetworkError at once, naming the address."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(NetworkError, match=str(port)):
        KafkaConnection("127.0.0.1", port, connect_timeout_s=2)


def test_without_a_reader_thread_request_returns_answered_and_starts_no_thread(broker):
    """reader_thread=False: each request comes back already answered (read on the
    calling thread), produce and long-poll fetch alike, and no thread is started."""
    before = {t.name for t in threading.enumerate()}
    conn = KafkaConnection(*_address(broker), reader_thread=False, read_timeout_s=10)
    try:
        assert not any(t.name.startswith("kafka-conn") for t in threading.enumerate()
                       if t.name not in before)
        produced = conn.request(wire.PRODUCE, _produce_body([b"a", b"b"]))
        assert produced.done()
        assert produced.result(0)["responses"][0]["partition_responses"][0][
            "base_offset"] == 0
        fetched = conn.request(wire.FETCH, _fetch_body(0, max_wait_ms=100))
        assert fetched.done()
        records = fetched.result(0)["responses"][0]["partitions"][0]["records"]
        assert [r.value for r in decode_records(bytes(records))] == [b"a", b"b"]
    finally:
        conn.close()


def _silent_after_api_versions():
    """A server answering ApiVersions, then reading requests and answering none: the
    listener socket, its port, and the accepted connections (to close)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = []

    def serve():
        conn, _ = listener.accept()
        accepted.append(conn)
        _answer_api_versions(conn)
        while conn.recv(1 << 16):
            pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1], accepted


def test_without_a_reader_thread_a_late_answer_fails_the_connection():
    """reader_thread=False: a broker that stays silent past read_timeout_s fails the
    request and the connection with NetworkError (retriable), after about that long."""
    import time
    listener, port, accepted = _silent_after_api_versions()
    conn = KafkaConnection("127.0.0.1", port, reader_thread=False, read_timeout_s=0.3)
    started = time.monotonic()
    future = conn.request(wire.FETCH, _fetch_body(0))
    waited = time.monotonic() - started
    with pytest.raises(NetworkError, match="did not answer within 0.3s"):
        future.result(0)
    assert 0.25 <= waited < 5
    assert not conn.alive
    for c in accepted:
        c.close()
    listener.close()


def test_without_a_reader_thread_close_from_another_thread_ends_a_read():
    """reader_thread=False: a request blocked reading (a long poll) ends with
    NetworkError as soon as another thread closes the connection."""
    import time
    listener, port, accepted = _silent_after_api_versions()
    conn = KafkaConnection("127.0.0.1", port, reader_thread=False, read_timeout_s=30)
    threading.Timer(0.2, conn.close).start()
    started = time.monotonic()
    future = conn.request(wire.FETCH, _fetch_body(0, max_wait_ms=30000))
    with pytest.raises(NetworkError):
        future.result(0)
    assert time.monotonic() - started < 5
    for c in accepted:
        c.close()
    listener.close()
