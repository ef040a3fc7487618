"""KafkaConnection: one TCP connection to a Kafka broker, speaking ``actors.wire``.

Both sides of the data plane are Kafka clients of a broker: raykafka's Producer, Consumer
and SimpleConsumer (client side), and a follower broker's replica fetcher (server side, as
Kafka's ReplicaFetcherThread uses the clients' NetworkClient). This module is what they
share, beside the codec.

Requests are pipelined: ``request`` writes the frame at once and returns a
``concurrent.futures.Future`` of the decoded response body; a broker answers a
connection's requests in order, so the reader thread pairs each response with the oldest
request still waiting for one (and checks its correlation id). A request that expects no
response (Produce with acks=0) gets a future already resolved to None.

When the connection breaks (the broker died, closed it, or sent what cannot be decoded)
every request in flight and every later one fails with ``NetworkError`` (retriable, Kafka's
NETWORK_EXCEPTION): the caller opens a new connection, refreshing its metadata first when
the broker may have changed. Nothing here retries; nothing here blocks forever: the
connect has a timeout, and a caller waits on a future with its own.

Versions: at connect the connection asks ApiVersions (v3, or v0 when the broker refuses
it, KIP-511) and keeps, per API, the highest version both the broker and ``actors.wire``
know; ``request`` uses it unless told otherwise.

Thread-safe: any thread may call ``request``; sends are serialised by a lock (a frame is
written whole, in correlation order); responses are read and decoded on one reader thread
per connection, which also runs the futures' callbacks (keep them short).
"""

from __future__ import annotations

import collections
import concurrent.futures
import socket
import struct
import threading

from . import wire
from .errors import KafkaError, NetworkError

_SIZE = struct.Struct(">i")
DEFAULT_MAX_RESPONSE_BYTES = 256 << 20     # a fetch answer is bounded by its max_bytes
CONNECT_TIMEOUT_S = 5.0
_IOV_MAX = 512


class KafkaConnection:
    """``KafkaConnection(host, port)``: see the module docstring."""

    def __init__(self, host: str, port: int, *, client_id: str = "raykafka",
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 versions: dict[int, int] | None = None):
        self.host, self.port = host, int(port)
        self.client_id = client_id
        self.max_response_bytes = max_response_bytes
        try:
            self._sock = socket.create_connection((host, self.port), timeout=connect_timeout_s)
        except OSError as exc:
            raise NetworkError(f"cannot connect to broker at {host}:{port}: {exc}") from None
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()              # correlation ids, the queue, sends
        self._waiting: collections.deque = collections.deque()  # (cid, key, version, fut)
        self._next_id = 0
        self._dead: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"kafka-conn-{host}:{port}")
        self._reader.start()
        self.versions = dict(versions) if versions is not None else \
            self._negotiate(connect_timeout_s)

    # -- public -----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def request(self, api_key: int, body: dict, *, version: int | None = None,
                expect_response: bool = True) -> concurrent.futures.Future:
        """Send one request; the future answers its decoded response body (a dict whose
        records fields are memoryview slices of the response frame), or raises
        NetworkError once the connection is gone."""
        if version is None:
            version = self.versions.get(api_key)
            if version is None:
                raise KafkaError(f"broker {self.host}:{self.port} does not serve "
                                 f"{wire.API_NAMES.get(api_key, api_key)}")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                future.set_exception(self._broken())
                return future
            cid = self._next_id
            self._next_id = (cid + 1) & 0x7FFFFFFF
            parts = wire.encode_request_parts(
                wire.RequestHeader(api_key, version, cid, self.client_id), body)
            if expect_response:
                self._waiting.append((cid, api_key, version, future))
            try:
                self._send_all(parts)
            except OSError as exc:
                self._fail_locked(NetworkError(f"send to {self.host}:{self.port} failed: "
                                               f"{exc}"))
                if not expect_response:
                    future.set_exception(self._broken())
                return future
        if not expect_response:
            future.set_result(None)
        return future

    def close(self) -> None:
        with self._lock:
            self._fail_locked(NetworkError(f"connection to {self.host}:{self.port} closed"))

    # -- internals --------------------------------------------------------------------------
    def _negotiate(self, timeout_s: float) -> dict[int, int]:
        lo, hi = wire.SUPPORTED_VERSIONS[wire.API_VERSIONS]
        body = {"client_software_name": "raykafka", "client_software_version": "1"}
        try:
            answer = self.request(wire.API_VERSIONS, body, version=min(hi, 3)
                                  ).result(timeout_s)
            if answer["error_code"] != wire.NONE:       # KIP-511: retry at v0
                answer = self.request(wire.API_VERSIONS, {}, version=0).result(timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise NetworkError(f"broker at {self.host}:{self.port} did not answer "
                               f"ApiVersions within {timeout_s}s") from None
        except NetworkError:
            raise
        except Exception as exc:  # noqa: BLE001 - not a Kafka broker, or a broken one
            self.close()
            raise NetworkError(f"broker at {self.host}:{self.port}: ApiVersions failed: "
                               f"{exc}") from None
        if answer["error_code"] != wire.NONE:
            self.close()
            raise NetworkError(f"broker at {self.host}:{self.port} refused ApiVersions "
                               f"(error {answer['error_code']})")
        versions = {}
        for api in answer["api_keys"]:
            ours = wire.SUPPORTED_VERSIONS.get(api["api_key"])
            if ours is None:
                continue
            top = min(ours[1], api["max_version"])
            if top >= max(ours[0], api["min_version"]):
                versions[api["api_key"]] = top
        return versions

    def _send_all(self, parts: list) -> None:
        views = [p if type(p) is memoryview else memoryview(p) for p in parts]
        while views:
            sent = self._sock.sendmsg(views[:_IOV_MAX])
            while sent and views:
                n = views[0].nbytes
                if sent >= n:
                    sent -= n
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0
            # drop empty buffers left at the head
            while views and views[0].nbytes == 0:
                views.pop(0)

    def _broken(self) -> NetworkError:
        dead = self._dead
        return dead if isinstance(dead, NetworkError) else NetworkError(str(dead))

    def _fail_locked(self, exc: BaseException) -> None:
        if self._dead is None:
            self._dead = exc
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        waiting, self._waiting = list(self._waiting), collections.deque()
        for _, _, _, future in waiting:
            if not future.done():
                future.set_exception(self._broken())

    def _recv_exactly(self, n: int) -> bytearray | None:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:], n - got)
            if k == 0:
                return None
            got += k
        return buf

    def _read_loop(self) -> None:
        why: BaseException
        try:
            while True:
                head = self._recv_exactly(4)
                if head is None:
                    why = NetworkError(f"broker at {self.host}:{self.port} closed the "
                                       f"connection")
                    break
                size, = _SIZE.unpack(head)
                if size < 4 or size > self.max_response_bytes:
                    why = NetworkError(f"broker at {self.host}:{self.port} sent a response "
                                       f"of {size} bytes")
                    break
                frame = self._recv_exactly(size)
                if frame is None:
                    why = NetworkError(f"broker at {self.host}:{self.port} closed the "
                                       f"connection mid-response")
                    break
                with self._lock:
                    if not self._waiting:
                        why = NetworkError(f"broker at {self.host}:{self.port} sent a "
                                           f"response nobody asked for")
                        break
                    cid, api_key, version, future = self._waiting.popleft()
                try:
                    got, body = wire.decode_response(api_key, version, memoryview(frame))
                    if got != cid:
                        raise NetworkError(f"response correlation id {got}, expected {cid}")
                except Exception as exc:  # noqa: BLE001 - a broken stream: end it
                    why = exc if isinstance(exc, NetworkError) else NetworkError(
                        f"undecodable {wire.API_NAMES.get(api_key, api_key)} v{version} "
                        f"response from {self.host}:{self.port}: {exc}")
                    future.set_exception(why)
                    break
                future.set_result(body)
        except OSError as exc:
            why = NetworkError(f"connection to {self.host}:{self.port} broke: {exc}")
        with self._lock:
            self._fail_locked(why)


__all__ = ["KafkaConnection", "DEFAULT_MAX_RESPONSE_BYTES"]
