"""The clients' way to the brokers: Kafka's protocol over one connection per broker (and
purpose), found through the client's metadata.

``BrokerConnections(metadata)`` keeps a ``KafkaConnection`` (actors/connection.py) per
(broker id, purpose), opened on first use at the address the metadata gives for that
broker (``metadata.broker_address(broker_id)``: the ``host``/``port`` the broker registered
and the controller's UpdateMetadata carries). A consumer keeps its long-polled Fetch
requests on a connection of their own (purpose ``"fetch"``): a broker answers a
connection's requests in order, so a ListOffsets sent behind a parked Fetch would wait out
the long poll.

A connection that broke, or that a caller gave up on (``drop``, or ``wait_answer`` when a
request outlived its timeout, as Kafka's NetworkClient disconnects), is closed; every request in flight on it
fails with NetworkError (retriable) and the next ``send`` opens a new one. Nothing here
retries or makes a Ray call: the clients' retry policy and metadata refresh do.

``parse_*`` turn response bodies into per-partition outcomes: a value, or the typed error
of the partition's error code (``broker_error``), marked as answered by a broker so the
retry policy tells it from the client's own metadata saying "unknown" (retry.py).

Thread-safe: connections are opened and dropped under one lock; a KafkaConnection is itself
thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import NamedTuple

from .. import wire
from ..connection import PLAINTEXT, ClientSecurity, KafkaConnection
from ..errors import KafkaError, KafkaTimeoutError, NetworkError

log = logging.getLogger(__name__)

#: Connecting and negotiating versions with a broker: at most this long (a paused broker
#: accepts the TCP connection in its kernel and never answers ApiVersions).
CONNECT_TIMEOUT_S = 5.0


def broker_error(code: int, message: str | None = None) -> KafkaError:
    """The typed error for a partition's (or request's) error code, marked as a broker's
    answer (``from_broker``): retry.py retries an UNKNOWN_TOPIC_OR_PARTITION a broker
    answered (its cache or this client's metadata is stale), not one the client's own
    metadata raised."""
    exc = wire.error_for_code(code, message or "")
    exc.from_broker = True
    return exc


class ProduceOutcome(NamedTuple):
    """A partition's answer in a Produce response."""

    base_offset: int
    log_append_time_ms: int
    log_start_offset: int


class FetchOutcome(NamedTuple):
    """A partition's answer in a Fetch response (``data``: whole batches, a memoryview of
    the response frame, possibly empty)."""

    data: object
    high_watermark: int
    log_start_offset: int


def parse_produce(body: dict) -> dict:
    """{(topic, partition): ProduceOutcome or error} of a Produce response."""
    out = {}
    for topic in body["responses"]:
        for p in topic["partition_responses"]:
            tp = (topic["name"], p["index"])
            if p["error_code"]:
                out[tp] = broker_error(p["error_code"], p.get("error_message"))
            else:
                out[tp] = ProduceOutcome(p["base_offset"], p["log_append_time_ms"],
                                         p["log_start_offset"])
    return out


def parse_fetch(body: dict) -> dict:
    """{(topic, partition): FetchOutcome or error} of a Fetch response; a request-level
    error applies to every partition (an empty dict carries it under None)."""
    if body["error_code"]:
        return {None: broker_error(body["error_code"])}
    out = {}
    for topic in body["responses"]:
        for p in topic["partitions"]:
            tp = (topic["topic"], p["partition_index"])
            if p["error_code"]:
                out[tp] = broker_error(p["error_code"])
            else:
                data = p["records"]
                out[tp] = FetchOutcome(b"" if data is None else data, p["high_watermark"],
                                       p["log_start_offset"])
    return out


def parse_list_offsets(body: dict) -> dict:
    """{(topic, partition): (timestamp, offset) or error} of a ListOffsets response."""
    out = {}
    for topic in body["topics"]:
        for p in topic["partitions"]:
            tp = (topic["name"], p["partition_index"])
            out[tp] = (broker_error(p["error_code"]) if p["error_code"]
                       else (p["timestamp"], p["offset"]))
    return out


#: A Fetch's response-wide max_bytes that never binds: raykafka's clients bound each partition
#: by its own partition_max_bytes (a first batch larger than it still comes whole). Under a
#: response limit, a broker gives a partition after the first with data only what fits in
#: what is left (KIP-74), which would leave partitions empty that have records.
NO_RESPONSE_LIMIT = 0x7FFFFFFF


def fetch_body(partitions, *, max_wait_ms: int, min_bytes: int,
               max_bytes: int = NO_RESPONSE_LIMIT) -> dict:
    """A consumer's Fetch (sessionless, read_uncommitted) for ``partitions``: an iterable of
    ``(topic, partition, fetch_offset, partition_max_bytes)``."""
    topics: dict[str, list] = {}
    for topic, partition, offset, partition_max_bytes in partitions:
        topics.setdefault(topic, []).append({
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": partition_max_bytes})
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
            "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [], "rack_id": ""}


def list_offsets_body(partitions) -> dict:
    """A consumer's ListOffsets for ``partitions``: ``(topic, partition, timestamp)``
    (-1 latest = the high watermark, -2 earliest, or a timestamp in ms)."""
    topics: dict[str, list] = {}
    for topic, partition, timestamp in partitions:
        topics.setdefault(topic, []).append({
            "partition_index": partition, "current_leader_epoch": -1,
            "timestamp": timestamp})
    return {"replica_id": -1, "isolation_level": 0,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}


def known_broker_ids(metadata) -> list:
    """The brokers of ``metadata``'s cached snapshot (none for a metadata that keeps
    none, as the unit tests' fakes): whom a Metadata request may go to."""
    snapshot = getattr(metadata, "snapshot", None)
    return list((snapshot() if snapshot is not None else {}).get("brokers") or {})


def topic_metadata(network: "BrokerConnections", broker_ids, topics, *,
                   allow_auto_create: bool, timeout_s: float) -> tuple[int, dict] | None:
    """A Metadata request for ``topics`` (names) to the first of ``broker_ids`` that
    answers within ``timeout_s`` each: ``(broker id, {name: error code})``, None when none
    answered. With ``allow_auto_create`` a broker whose ``auto.create.topics.enable`` is
    on creates a topic it does not know (answering LEADER_NOT_AVAILABLE while it is being
    made), as for Kafka's clients."""
    body = {"topics": [{"name": t} for t in topics],
            "allow_auto_topic_creation": allow_auto_create}
    for broker_id in broker_ids:
        try:
            broker_id = int(broker_id)
            future = network.send(broker_id, wire.METADATA, body)
            answer = wait_answer(network, broker_id, future, timeout_s, "metadata")
        except Exception:  # noqa: BLE001 - another broker may answer
            continue
        return broker_id, {t["name"]: t["error_code"] for t in answer["topics"]}
    return None


def wait_answer(network: "BrokerConnections", broker_id: int, future, timeout_s: float,
                what: str, purpose: str = "data") -> dict:
    """The response body of ``future`` (a request to ``broker_id``) within ``timeout_s``;
    else the connection is closed (what else waits on it fails with NetworkError, and the
    next request reconnects: a paused broker is not waited on twice) and KafkaTimeoutError
    (retriable) raised."""
    try:
        return future.result(timeout=max(timeout_s, 0.001))
    except concurrent.futures.TimeoutError:
        network.drop(broker_id, purpose)
        raise KafkaTimeoutError(f"{what}: broker {broker_id} did not answer within "
                                f"{timeout_s:.3f}s") from None


class BrokerConnections:
    """``BrokerConnections(metadata, client_id=)``: see the module docstring.

    ``metadata`` provides ``broker_address(broker_id) -> (host, port)`` (raising a
    retriable error for a broker it does not know)."""

    def __init__(self, metadata, *, client_id: str | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 security: ClientSecurity | None = None):
        self._metadata = metadata
        self._security = security or PLAINTEXT
        self._client_id = client_id or "raykafka"
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._connections: dict[tuple[int, str], KafkaConnection] = {}
        # one lock per (broker, purpose) held while its connection opens: two threads never
        # open two connections to one broker, and a paused broker's opening (up to
        # connect_timeout_s) holds up no other broker's
        self._opening: dict[tuple[int, str], threading.Lock] = {}
        self._closed = False

    def connection(self, broker_id: int, purpose: str = "data") -> KafkaConnection:
        """The open connection to ``broker_id`` for ``purpose``, opened now if there is
        none (NetworkError when the broker cannot be reached)."""
        key = (broker_id, purpose)
        conn = self._connections.get(key)
        if conn is not None and conn.alive:
            return conn
        # a broker's listener of the client's security protocol (fakes know only one)
        host, port = (self._metadata.broker_address(broker_id)
                      if self._security.protocol == "PLAINTEXT" else
                      self._metadata.broker_address(broker_id, self._security.protocol))
        with self._lock:
            if self._closed:
                raise NetworkError("the client is closed")
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            conn = self._connections.get(key)
            if conn is not None and conn.alive:
                return conn
            conn = KafkaConnection(host, port, client_id=self._client_id,
                                   connect_timeout_s=self._connect_timeout_s,
                                   security=self._security)
            with self._lock:
                if self._closed:
                    conn.close()
                    raise NetworkError("the client is closed")
                self._connections[key] = conn
            return conn

    def send(self, broker_id: int, api_key: int, body: dict, *, purpose: str = "data",
             expect_response: bool = True) -> concurrent.futures.Future:
        """One request to ``broker_id``: the future of its decoded response body (None
        without a response). Raises NetworkError when no connection can be opened; the
        future fails with NetworkError when the connection breaks before the answer."""
        conn = self.connection(broker_id, purpose)
        return conn.request(api_key, body, expect_response=expect_response)

    def drop(self, broker_id: int, purpose: str | None = None) -> None:
        """Close the connections to ``broker_id`` (of ``purpose``, or all): what is in
        flight on them fails with NetworkError, the next ``send`` reconnects."""
        with self._lock:
            keys = [k for k in self._connections
                    if k[0] == broker_id and (purpose is None or k[1] == purpose)]
            conns = [self._connections.pop(k) for k in keys]
        for conn in conns:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._connections = list(self._connections.values()), {}
        for conn in conns:
            conn.close()


__all__ = ["BrokerConnections", "ProduceOutcome", "FetchOutcome", "broker_error",
           "parse_produce", "parse_fetch", "parse_list_offsets", "fetch_body",
           "known_broker_ids", "list_offsets_body", "topic_metadata", "wait_answer"]
