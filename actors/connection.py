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

Security (``ClientSecurity``, kafka-python's setting names): over SSL and SASL_SSL the
connection speaks TLS through an ``ssl.SSLObject`` on memory buffers (its handshake at
connect, within the connect timeout; one lock around the TLS state, so the reader thread
and the senders never use it at once). Over SASL_PLAINTEXT and SASL_SSL it authenticates
after ApiVersions: SaslHandshake v1, then SaslAuthenticate with SCRAM-SHA-256/512's or
PLAIN's tokens; a refusal raises SaslAuthenticationError or UnsupportedSaslMechanismError
(not retriable: the same settings fail again) and closes the connection.

Thread-safe: any thread may call ``request``; sends are serialised by a lock (a frame is
written whole, in correlation order); responses are read and decoded on one reader thread
per connection, which also runs the futures' callbacks (keep them short).

``reader_thread=False`` is for a connection one thread owns and uses one request at a
time (a follower broker's fetcher): no reader thread; ``request`` reads the response on
the calling thread before it returns, each read bounded by ``read_timeout_s`` (past it
the connection fails with NetworkError). That saves a thread hand-off per request (the
reader thread's wake-up, the future's condition and a GIL transfer): one per Fetch round
of a follower broker. ``close`` from another thread still ends a read in progress.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import hmac
import os
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass

from coordination.credentials import SCRAM_MECHANISMS, keys_of, salted_password

from . import hoptrace, wire
from .errors import (IllegalSaslStateError, InvalidConfigurationError, KafkaError,
                     NetworkError, SaslAuthenticationError, UnsupportedSaslMechanismError)

_SIZE = struct.Struct(">i")
DEFAULT_MAX_RESPONSE_BYTES = 256 << 20     # a fetch answer is bounded by its max_bytes
CONNECT_TIMEOUT_S = 5.0
_IOV_MAX = 512
_TLS_READ = 256 * 1024

#: The clients' security settings (kafka-python's names) and their defaults.
SECURITY_DEFAULTS = {
    "security_protocol": "PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_check_hostname": True,
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ClientSecurity:
    """How a connection secures itself: ``ClientSecurity.from_config(config)`` from a
    client's config (the keys of ``SECURITY_DEFAULTS``). The password is kept out of
    ``repr``."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str | None = None
    password: str | None = None
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True

    def __repr__(self) -> str:
        return (f"ClientSecurity({self.protocol}, mechanism={self.mechanism}, "
                f"username={self.username!r})")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @classmethod
    def from_config(cls, config: dict) -> "ClientSecurity":
        protocol = str(config.get("security_protocol") or "PLAINTEXT").upper()
        if protocol not in _PROTOCOLS:
            raise InvalidConfigurationError(f"security_protocol must be one of "
                                            f"{', '.join(_PROTOCOLS)}, got {protocol!r}")
        mechanism = str(config.get("sasl_mechanism") or "PLAIN").upper()
        if protocol.startswith("SASL"):
            if mechanism not in _MECHANISMS:
                raise InvalidConfigurationError(f"sasl_mechanism must be one of "
                                                f"{', '.join(_MECHANISMS)}, got {mechanism!r}")
            if not config.get("sasl_plain_username") or \
                    config.get("sasl_plain_password") is None:
                raise InvalidConfigurationError(f"{protocol} needs sasl_plain_username and "
                                                f"sasl_plain_password")
        context = None
        if protocol.endswith("SSL"):
            # ssl_cadata (PEM text) is not kafka-python's: a broker's fetchers use it when
            # the CA comes as KIP-651's ssl.truststore.certificates (server/listeners.py)
            context = ssl.create_default_context(cafile=config.get("ssl_cafile"),
                                                 cadata=config.get("ssl_cadata"))
            context.check_hostname = bool(config.get("ssl_check_hostname", True))
            if config.get("ssl_certfile"):
                context.load_cert_chain(config["ssl_certfile"], config.get("ssl_keyfile"))
        return cls(protocol, mechanism, config.get("sasl_plain_username"),
                   config.get("sasl_plain_password"), context,
                   bool(config.get("ssl_check_hostname", True)))


PLAINTEXT = ClientSecurity()


def set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """Make a blocking socket's reads fail with BlockingIOError (EAGAIN) after ``seconds``
    without data: the kernel's timer (SO_RCVTIMEO), so each read stays one system call
    (``settimeout`` polls before every read)."""
    whole, micros = divmod(max(1, round(seconds * 1e6)), 1_000_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, micros))


#: buffers per ``sendmsg`` call (Linux allows 1024)
IOV_MAX = 512


def consume_sent(parts: list, sent: int) -> None:
    """Drop ``sent`` bytes from the front of the buffer list ``parts`` (what a
    non-blocking ``sendmsg`` took of it)."""
    i = 0
    while i < len(parts):
        p = parts[i]
        size = p.nbytes if type(p) is memoryview else len(p)
        if sent < size:
            break
        sent -= size
        i += 1
    del parts[:i]
    if sent:
        parts[0] = memoryview(parts[0])[sent:]


def security_config(config: dict) -> dict:
    """The security settings of a client config (the others dropped)."""
    return {k: config[k] for k in SECURITY_DEFAULTS if k in config}


class KafkaConnection:
    """``KafkaConnection(host, port)``: see the module docstring."""

    def __init__(self, host: str, port: int, *, client_id: str = "raykafka",
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 versions: dict[int, int] | None = None,
                 security: ClientSecurity = PLAINTEXT,
                 reader_thread: bool = True, read_timeout_s: float | None = None):
        self.host, self.port = host, int(port)
        self.client_id = client_id
        self.max_response_bytes = max_response_bytes
        self.security = security
        deadline = time.monotonic() + connect_timeout_s
        try:
            self._sock = socket.create_connection((host, self.port), timeout=connect_timeout_s)
        except OSError as exc:
            raise NetworkError(f"cannot connect to broker at {host}:{port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls: ssl.SSLObject | None = None
        self._tls_lock = threading.Lock()          # the TLS object and its buffers
        self._plain = bytearray()                  # decrypted, not yet taken
        if security.tls:
            self._tls_handshake(deadline)
        self._inline = not reader_thread
        self._sock.settimeout(None)
        if self._inline and read_timeout_s is not None:
            set_receive_timeout(self._sock, read_timeout_s)
        self._read_timeout_s = read_timeout_s
        self._lock = threading.Lock()              # correlation ids, the queue, sends
        self._read_lock = threading.Lock()         # inline: one reader at a time
        self._waiting: collections.deque = collections.deque()  # (cid, key, version, fut)
        self._next_id = 0
        self._dead: BaseException | None = None
        if reader_thread:
            threading.Thread(target=self._read_loop, daemon=True,
                             name=f"kafka-conn-{host}:{port}").start()
        self.versions = dict(versions) if versions is not None else \
            self._negotiate(max(0.1, deadline - time.monotonic()), security.tls)
        if security.sasl:
            try:
                self._authenticate(max(0.1, deadline - time.monotonic()))
            except BaseException:
                self.close()
                raise

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
        elif self._inline:
            self._settle(future)
        return future

    def close(self) -> None:
        with self._lock:
            self._fail_locked(NetworkError(f"connection to {self.host}:{self.port} closed"))

    # -- internals --------------------------------------------------------------------------
    # -- TLS (an SSLObject on memory buffers: the reader and the senders share it) ------------
    def _tls_handshake(self, deadline: float) -> None:
        incoming, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls_in = incoming
        ctx = self.security.ssl_context
        self._tls = ctx.wrap_bio(incoming, self._tls_out,
                                 server_hostname=self.host if ctx.check_hostname else None)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._sock.sendall(self._tls_out.read())
                self._sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    data = self._sock.recv(65536)
                except (socket.timeout, OSError) as exc:
                    self._sock.close()
                    raise NetworkError(f"TLS handshake with {self.host}:{self.port} failed: "
                                       f"{exc!r}") from None
                if not data:
                    self._sock.close()
                    raise NetworkError(f"broker at {self.host}:{self.port} closed the "
                                       f"connection during the TLS handshake")
                incoming.write(data)
            except (ssl.SSLError, ssl.CertificateError) as exc:
                self._sock.close()
                raise NetworkError(f"TLS handshake with {self.host}:{self.port} failed: "
                                   f"{exc}") from None
        self._sock.sendall(self._tls_out.read())

    def _tls_send(self, views: list) -> None:
        """Encrypt and send (the caller holds ``_lock``: ciphertext leaves in order)."""
        for view in views:
            with self._tls_lock:
                self._tls.write(view)
                data = self._tls_out.read()
            self._sock.sendall(data)

    def _tls_recv_into(self, view: memoryview) -> int:
        """Decrypted bytes into ``view`` (0 at the end of the stream)."""
        while True:
            with self._tls_lock:
                try:
                    return self._tls.read(len(view), view)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    return 0
                pending = self._tls_out.read() if self._tls_out.pending else b""
            if pending:     # e.g. a TLS 1.3 key update's answer
                with self._lock:
                    self._sock.sendall(pending)
            data = self._sock.recv(_TLS_READ)
            if not data:
                return 0
            with self._tls_lock:
                self._tls_in.write(data)

    # -- SASL ---------------------------------------------------------------------------------
    def _authenticate(self, timeout_s: float) -> None:
        sec = self.security
        where = f"broker at {self.host}:{self.port}"
        if wire.SASL_HANDSHAKE not in self.versions or \
                wire.SASL_AUTHENTICATE not in self.versions:
            raise IllegalSaslStateError(f"{where} does not serve SaslHandshake v1 and "
                                        f"SaslAuthenticate: is it a SASL listener?")
        answer = self.request(wire.SASL_HANDSHAKE, {"mechanism": sec.mechanism},
                              version=1).result(timeout_s)
        code = answer["error_code"]
        if code == wire.ERRORS_BY_NAME["UNSUPPORTED_SASL_MECHANISM"].code:
            raise UnsupportedSaslMechanismError(
                f"{where} does not enable SASL mechanism {sec.mechanism}; it enables "
                f"{', '.join(answer['mechanisms']) or 'none'}")
        if code != wire.NONE:
            raise wire.error_for_code(code, f"SaslHandshake refused by {where}")
        client = (_PlainClient(sec.username, sec.password) if sec.mechanism == "PLAIN"
                  else _ScramClient(sec.mechanism, sec.username, sec.password))
        token = client.first()
        while token is not None:
            answer = self.request(wire.SASL_AUTHENTICATE, {"auth_bytes": token}
                                  ).result(timeout_s)
            if answer["error_code"] != wire.NONE:
                message = answer.get("error_message") or ""
                exc = wire.error_for_code(answer["error_code"], f"{where}: {message}")
                raise exc if isinstance(exc, KafkaError) else SaslAuthenticationError(message)
            token = client.next(bytes(answer["auth_bytes"]))

    def _negotiate(self, timeout_s: float, tls: bool = False) -> dict[int, int]:
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
        except NetworkError as exc:
            if not tls:         # e.g. a TLS alert read as a response size, or a reset
                raise NetworkError(f"{exc} during ApiVersions (is it a TLS listener, and "
                                   f"security_protocol without SSL?)") from None
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
        if self._tls is not None:
            self._tls_send(views)
            return
        if hoptrace.DIR:
            hoptrace.hop("C>")
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
            if self._tls is not None:
                k = self._tls_recv_into(view[got:])
            else:
                k = self._sock.recv_into(view[got:], n - got)
            if k == 0:
                return None
            got += k
        return buf

    def _read_one(self) -> BaseException | None:
        """Read one response and answer the oldest request waiting for it; what ends the
        connection (None while it goes on)."""
        try:
            head = self._recv_exactly(4)
            if head is None:
                return NetworkError(f"broker at {self.host}:{self.port} closed the "
                                    f"connection")
            size, = _SIZE.unpack(head)
            if size < 4 or size > self.max_response_bytes:
                return NetworkError(f"broker at {self.host}:{self.port} sent a response "
                                    f"of {size} bytes")
            frame = self._recv_exactly(size)
            if frame is None:
                return NetworkError(f"broker at {self.host}:{self.port} closed the "
                                    f"connection mid-response")
        except BlockingIOError:         # inline: SO_RCVTIMEO passed
            return NetworkError(f"broker at {self.host}:{self.port} did not answer within "
                                f"{self._read_timeout_s}s")
        except OSError as exc:
            return NetworkError(f"connection to {self.host}:{self.port} broke: {exc}")
        with self._lock:
            if not self._waiting:
                return NetworkError(f"broker at {self.host}:{self.port} sent a "
                                    f"response nobody asked for")
            cid, api_key, version, future = self._waiting.popleft()
        if hoptrace.DIR:
            hoptrace.hop(f"C<{api_key}")
        try:
            got, body = wire.decode_response(api_key, version, memoryview(frame))
            if got != cid:
                raise NetworkError(f"response correlation id {got}, expected {cid}")
        except Exception as exc:  # noqa: BLE001 - a broken stream: end it
            why = exc if isinstance(exc, NetworkError) else NetworkError(
                f"undecodable {wire.API_NAMES.get(api_key, api_key)} v{version} "
                f"response from {self.host}:{self.port}: {exc}")
            future.set_exception(why)
            return why
        future.set_result(body)
        return None

    def _read_loop(self) -> None:
        while True:
            why = self._read_one()
            if why is not None:
                break
        with self._lock:
            self._fail_locked(why)

    def _settle(self, future: concurrent.futures.Future) -> None:
        """Inline mode: read responses on this thread until ``future`` has its answer
        (or the connection failed, which answers it with the error)."""
        with self._read_lock:
            while not future.done():
                why = self._read_one()
                if why is not None:
                    with self._lock:
                        self._fail_locked(why)
                    return


class _PlainClient:
    """RFC 4616's one message."""

    def __init__(self, user: str, password: str):
        self.user, self.password = user, password

    def first(self) -> bytes:
        return f"\0{self.user}\0{self.password}".encode()

    def next(self, _answer: bytes) -> None:
        return None


class _ScramClient:
    """RFC 5802's client side: client-first, client-final, then the server's signature
    checked (a broker that does not know the password cannot pass for the real one)."""

    def __init__(self, mechanism: str, user: str, password: str):
        self.mechanism, self.password = mechanism, password
        self.digest, _ = SCRAM_MECHANISMS[mechanism]
        self.nonce = base64.b64encode(os.urandom(24)).decode()
        name = user.replace("=", "=3D").replace(",", "=2C")
        self.client_first_bare = f"n={name},r={self.nonce}"
        self.step = 0

    def first(self) -> bytes:
        return ("n,," + self.client_first_bare).encode()

    def next(self, answer: bytes) -> bytes | None:
        self.step += 1
        text = answer.decode("utf-8", "replace")
        if self.step == 1:
            attrs = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
            nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i")
            if not nonce.startswith(self.nonce) or salt is None or iterations is None:
                raise SaslAuthenticationError(f"unexpected SCRAM server-first-message "
                                              f"{text!r}")
            salted = salted_password(self.mechanism, self.password, base64.b64decode(salt),
                                     int(iterations))
            client_key, stored, server_key = keys_of(self.mechanism, salted)
            without_proof = f"c=biws,r={nonce}"
            auth_message = f"{self.client_first_bare},{text},{without_proof}".encode()
            signature = hmac.new(stored, auth_message, self.digest).digest()
            proof = bytes(a ^ b for a, b in zip(client_key, signature))
            self.expected = b"v=" + base64.b64encode(
                hmac.new(server_key, auth_message, self.digest).digest())
            return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
        if hmac.compare_digest(answer, self.expected):
            return None
        raise SaslAuthenticationError("the broker's SCRAM server signature is wrong")


__all__ = ["KafkaConnection", "DEFAULT_MAX_RESPONSE_BYTES", "ClientSecurity",
           "SECURITY_DEFAULTS", "security_config", "set_receive_timeout"]
