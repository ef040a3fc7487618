"""The broker's Kafka listener: sockets and framing, apart from request handling (Kafka's
SocketServer / KafkaApis split).

``SocketServer`` owns one listening TCP socket and the connections accepted on it, served
by one network thread running a ``selectors`` loop. A request is a 4-byte big-endian size
then that many bytes; the size is checked against ``socket.request.max.bytes`` before the
body's buffer is allocated, and the body is read straight into that buffer (no copy). The
request header is decoded here; the request goes to ``handler.handle(request)``, which
returns the response frame as a list of buffers (``wire.encode_response_parts``), None for
no response (Produce with acks=0), or a ``concurrent.futures.Future`` of either when the
answer comes later (a long-poll Fetch parked in a purgatory, an acks=all Produce waiting
for its replicas). The future may be completed from any thread.

Invariants, per connection:
- requests are handed to the handler one at a time, in the order they arrived: the next is
  handed over only when ``handle`` has returned for the one before (Kafka mutes a channel
  for the same reason: two Produce requests of one client must append in order);
- responses are written in request order: a response completed early waits behind the
  ones still pending before it;
- at most ``max_queued_requests`` requests are received and not yet answered; past that,
  and while answers wait for the socket to take them, the connection is not read from
  (TCP pushes back on the client);
- the request buffers of all connections (allocated at a size prefix, released when the
  request is answered) total at most ``queued.max.request.bytes``: a connection whose next
  request does not fit waits, unread, until memory is released (Kafka's memory pool);
- a connection with nothing pending and no bytes moved for ``connections.max.idle.ms`` is
  closed; beyond ``max.connections`` a new connection is accepted and closed at once.
- a client that closes (or resets) its connection, or whose socket can no longer be
  written, still has every request it sent before that handled, in order (an acks=0
  producer closes right after its last send); the answers are dropped.

Bad input closes the connection, as Kafka does: a size below 0 or above the limit (before
any allocation), a header that cannot be read, an ``InvalidRequestError`` from the handler
(unknown API key or version, a malformed body). An exception of any other kind from the
handler is logged and closes that connection only; the server goes on.

Security (``ListenerSecurity``, Kafka's security protocols): on an SSL or SASL_SSL
listener each accepted connection gets a TLS object on memory buffers (``_Tls``: an
``ssl.SSLObject``), and the network thread moves the ciphertext itself: one ``recv`` of up
to ``_TLS_READ`` bytes feeds many TLS records, which are decrypted straight into the
request's buffer, and a response is encrypted in ``_TLS_CHUNK`` pieces, each sent with one
``send`` (an ``ssl.SSLSocket`` reads every record with two system calls and writes each
with one: librdkafka sends many small records, and those calls were most of a TLS
listener's extra CPU). The handshake runs on the network thread without blocking; a
handshake that fails closes the connection after its alert is sent. Bytes already taken
from the socket are invisible to the selector, so a connection with such bytes left is
served again without waiting. On a SASL_PLAINTEXT or
SASL_SSL listener a connection starts unauthenticated: it may send ApiVersions,
SaslHandshake and SaslAuthenticate only (the last two go to its own authenticator, whose
``AuthStep`` says when it is done and who it is); any other request closes it, as Kafka
does. A failed authentication's answer is held ``failed_authentication_delay_ms`` (a
timer of the network thread, no thread sleeps, the connection unread meanwhile) and the
connection is closed once it is written. Every request carries its connection's
``principal`` (``User:ANONYMOUS`` until SASL or a client certificate says otherwise) and
the ``listener`` name it came in on: what an authorizer reads.

Thread-safety: ``start``/``close``/``stats``/``port`` may be called from any thread;
everything else runs on the network thread, or on ``io_threads`` handler threads when
configured (0, the default, calls the handler on the network thread: right for a handler
that never blocks, e.g. one that returns futures for anything slow).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import selectors
import heapq
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

from .. import hoptrace, wire
from ..connection import IOV_MAX as _IOV_MAX
from ..connection import consume_sent as _consume

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_TLS_CHUNK = 256 * 1024             # plaintext bytes encrypted (and sent) at a time
_TLS_READ = 256 * 1024              # ciphertext bytes taken from a socket at a time
ANONYMOUS = "User:ANONYMOUS"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: What an unauthenticated connection may send on a SASL listener.
_BEFORE_AUTH = (wire.API_VERSIONS, wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE)


@dataclass(frozen=True)
class ListenerSecurity:
    """A listener's name and security protocol, and what it takes: ``ssl_context`` (a
    server-side ``ssl.SSLContext``) for SSL and SASL_SSL, ``authenticator`` (makes one
    connection's SASL state, with ``handle(request) -> AuthStep``) for the SASL ones."""

    name: str = "PLAINTEXT"
    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    authenticator: Callable[[], Any] | None = None
    failed_authentication_delay_ms: int = 100     # Kafka's default

    def __post_init__(self):
        if self.protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security protocol {self.protocol!r} is not one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}")
        if self.protocol.endswith("SSL") and self.ssl_context is None:
            raise ValueError(f"listener {self.name} ({self.protocol}) needs an SSL context")
        if self.protocol.startswith("SASL") and self.authenticator is None:
            raise ValueError(f"listener {self.name} ({self.protocol}) needs an authenticator")
        if self.failed_authentication_delay_ms < 0:
            raise ValueError("failed_authentication_delay_ms must be >= 0")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")


class AuthStep(NamedTuple):
    """What an authenticator did with one SASL request: the response frame; ``principal``
    once authenticated; ``failed`` (why) when the connection must close after the answer,
    ``delay`` when that answer first waits ``failed_authentication_delay_ms``."""

    parts: list
    principal: str | None = None
    failed: str | None = None
    delay: bool = False


@dataclass(frozen=True)
class SocketServerConfig:
    """The listener's settings, under Kafka's names (dots become underscores)."""

    host: str = "127.0.0.1"
    port: int = 0                               # 0: a free port
    socket_request_max_bytes: int = 100 * 1024 * 1024
    connections_max_idle_ms: int = 600_000      # Kafka's default: 10 minutes
    max_connections: int = 2**31 - 1
    max_queued_requests: int = 16               # per connection, received and unanswered
    queued_max_request_bytes: int = 512 * 1024 * 1024   # all connections' request buffers
    io_threads: int = 0                         # 0: handle on the network thread
    backlog: int = 128

    def __post_init__(self):
        for name in ("socket_request_max_bytes", "connections_max_idle_ms",
                     "max_connections", "max_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise ValueError("queued_max_request_bytes must be at least "
                             "socket_request_max_bytes")
        if self.io_threads < 0:
            raise ValueError(f"io_threads must be >= 0, got {self.io_threads}")

    @classmethod
    def from_properties(cls, props: dict | None = None, **overrides) -> "SocketServerConfig":
        """From Kafka's dotted names (``listeners`` as ``PLAINTEXT://host:port``)."""
        kwargs = dict(overrides)
        for key, value in (props or {}).items():
            if key == "listeners":
                scheme, _, address = str(value).partition("://")
                if scheme != "PLAINTEXT":
                    raise ValueError(f"listeners: only PLAINTEXT is implemented, got {value!r}")
                host, _, port = address.rpartition(":")
                kwargs["host"], kwargs["port"] = host or "127.0.0.1", int(port)
            elif key in ("socket.request.max.bytes", "connections.max.idle.ms",
                         "max.connections", "queued.max.request.bytes"):
                kwargs[key.replace(".", "_")] = int(value)
            else:
                raise ValueError(f"unknown listener setting {key!r}")
        return cls(**kwargs)


class Request(NamedTuple):
    """What the handler gets: the decoded header, the body's bytes (a memoryview of the
    frame, valid for as long as it is referenced), and who sent it."""

    header: wire.RequestHeader
    body: memoryview
    client: Any                     # the peer's address
    received_ns: int                # time.monotonic_ns() when the whole frame was in
    principal: str = ANONYMOUS      # who the connection authenticated as (``User:<name>``)
    listener: str = "PLAINTEXT"     # the listener name it came in on


#: What a handler's optional ``handle_inline`` answers for a request it will not serve on
#: the network thread (it may wait): the request goes to an io thread, untouched.
NOT_INLINE = object()


class RequestHandler(Protocol):
    def handle(self, request: Request) -> "list | None | concurrent.futures.Future":
        """The response frame (a list of buffers, size prefix included), None for no
        response, or a Future of either. InvalidRequestError closes the connection."""

    # optional: ``handle_inline(request)``, called on the network thread first when there
    # are io threads: ``handle``'s answer, or NOT_INLINE (then ``handle`` runs on an io
    # thread). For requests whose answer needs no waiting: two thread hand-offs saved.


class _Slot:
    """One received request's place in its connection's response order."""

    __slots__ = ("done", "parts", "size")

    def __init__(self, size: int):
        self.done = False
        self.parts: list | None = None
        self.size = size                # the request's buffer, released when answered


class _Tls:
    """A connection's TLS state on memory buffers: ``obj`` (an ``ssl.SSLObject``) reads
    ciphertext from ``incoming`` and writes to ``outgoing``; ``raw`` is ciphertext taken
    from ``outgoing`` and not yet accepted by the socket."""

    __slots__ = ("obj", "incoming", "outgoing", "raw")

    def __init__(self, context: ssl.SSLContext):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.raw: memoryview | None = None

    def take_output(self) -> None:
        """Move what the TLS object wrote (records, alerts, tickets) behind ``raw``."""
        if self.outgoing.pending:
            data = self.outgoing.read()
            self.raw = memoryview(data if self.raw is None else bytes(self.raw) + data)

    def buffered(self) -> bool:
        """Are there bytes already out of the socket (decrypted or not)?"""
        return bool(self.obj.pending() or self.incoming.pending)


class _Connection:
    __slots__ = ("sock", "peer", "size_buf", "size_got", "body", "body_got", "inbox",
                 "slots", "busy", "out", "last_active", "closed", "want_write", "muted",
                 "registered", "waiting_size", "handshaking", "handshake_events",
                 "authenticator", "principal", "closing", "tls", "peer_gone",
                 "read_over")

    def __init__(self, sock: socket.socket, peer, now: float):
        self.sock = sock
        self.peer = peer
        self.size_buf = bytearray(4)
        self.size_got = 0
        self.body: bytearray | None = None
        self.body_got = 0
        self.inbox: collections.deque = collections.deque()   # (slot, Request) not handed over
        self.slots: collections.deque = collections.deque()   # responses, in request order
        self.busy = False               # a request is inside handler.handle
        self.out: list = []             # buffers being written
        self.last_active = now
        self.closed = False
        self.want_write = False
        self.muted = False
        self.waiting_size: int | None = None       # a request size waiting for memory
        self.registered = selectors.EVENT_READ     # the events the selector watches
        self.handshaking = False        # a TLS handshake is under way
        self.handshake_events = selectors.EVENT_READ
        self.authenticator = None       # SASL state until authenticated (None: done/none)
        self.principal = ANONYMOUS
        self.closing: str | None = None  # why: close once the output is written
        self.tls: _Tls | None = None    # TLS state (SSL and SASL_SSL listeners)
        self.peer_gone: str | None = None  # why answers are dropped: the peer left
        self.read_over = False          # the peer's end of the stream (or a read error)

    def pending(self) -> int:
        return len(self.slots)


class SocketServer:
    """A Kafka listener: ``SocketServer(handler, config).start()``, then ``port``."""

    def __init__(self, handler: RequestHandler, config: SocketServerConfig | None = None, *,
                 security: ListenerSecurity | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config or SocketServerConfig()
        self.security = security or ListenerSecurity()
        self._handler = handler
        self._inline = getattr(handler, "handle_inline", None)
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._completions: collections.deque = collections.deque()   # thread-safe appends
        self._connections: dict[socket.socket, _Connection] = {}
        self._pool = (concurrent.futures.ThreadPoolExecutor(
            self.config.io_threads, thread_name_prefix="kafka-io")
            if self.config.io_threads else None)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stats = collections.Counter()
        self._memory_bytes = 0          # request buffers allocated and not yet answered
        self._memory_waiters: collections.deque = collections.deque()
        self._next_idle_check = 0.0
        self._delayed: list = []        # heap: (due, seq, conn, slot, parts) failed answers
        self._delay_seq = 0
        self._tls_pending: set = set()  # connections with bytes out of the socket to read
        self._tls_scratch = bytearray(_TLS_READ) if self.security.tls else None
        self._calls: collections.deque = collections.deque()    # for the network thread
        self._attached: dict[socket.socket, _Attached] = {}
        self.port: int | None = None
        self.host = self.config.host

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "SocketServer":
        """Bind, listen and start the network thread; ``port`` is then the bound port."""
        if self._thread is not None:
            raise RuntimeError("SocketServer already started")
        listener = socket.socket(socket.AF_INET6 if ":" in self.config.host
                                 else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.config.host, self.config.port))
            listener.listen(self.config.backlog)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"kafka-network-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection, stop the threads. Idempotent."""
        self._stopping.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "SocketServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stats(self) -> dict:
        """Counters: accepted, closed, refused (over max.connections), requests,
        responses, oversized, invalid, idle_closed, handler_errors, memory_waits; and
        connections and memory_bytes (request buffers held) now."""
        out = dict(self._stats)
        out["connections"] = len(self._connections)
        out["memory_bytes"] = self._memory_bytes
        return out

    # -- the network thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                timeout = min(self.config.connections_max_idle_ms / 1000.0, 1.0)
                if self._delayed:
                    timeout = max(0.0, min(timeout, self._delayed[0][0] - self._clock()))
                if self._tls_pending:
                    timeout = 0.0
                for key, events in self._selector.select(timeout):
                    what = key.data
                    if what == "accept":
                        self._accept()
                    elif what == "wake":
                        self._drain_wake()
                    elif type(what) is _Attached:
                        self._serve_attached(what, events)
                    else:
                        self._serve(what, events)
                self._serve_tls_pending()
                self._run_calls()
                self._complete_pending()
                self._answer_delayed()
                self._close_idle()
        except Exception:       # a bug here would otherwise leave every client hanging
            log.exception("network thread of the listener on port %s failed", self.port)
        finally:
            for conn in list(self._connections.values()):
                self._close(conn, "shutdown")
            self._run_calls()
            for attached in list(self._attached.values()):
                self._detach_now(attached.sock)
                attached.owner.loop_closed()
            self._selector.close()
            if self._listener is not None:
                self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    # -- other sockets on the network thread ----------------------------------------------
    def attach(self, sock: socket.socket, owner) -> None:
        """Serve ``sock`` (non-blocking) on the network thread as well: ``owner.on_readable()``
        when it can be read, ``owner.on_writable()`` when it can be written and
        ``set_writing(sock, True)`` asked for that, ``owner.loop_closed()`` when the
        listener closes with it still attached. Thread-safe (from another thread the
        registration waits for the network thread's next turn; what arrives meanwhile
        stays in the socket). RuntimeError once the listener is closing."""
        if self._stopping.is_set() or self._thread is None:
            raise RuntimeError("the listener is not running")
        attached = _Attached(sock, owner)
        self._on_loop(lambda: self._attach_now(attached))

    def set_writing(self, sock: socket.socket, on: bool) -> None:
        """Whether an attached socket's owner wants ``on_writable`` calls. Thread-safe."""
        self._on_loop(lambda: self._set_writing_now(sock, on))

    def detach(self, sock: socket.socket) -> None:
        """Stop serving an attached socket and close it. Thread-safe: from another thread
        the socket is shut down at once (its peer sees the end) and closed on the network
        thread's next turn (an fd closed while registered would confuse the selector)."""
        if threading.current_thread() is self._thread:
            self._detach_now(sock)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is None or not self._thread.is_alive():
            sock.close()
            return
        self._on_loop(lambda: self._detach_now(sock))

    def _on_loop(self, call) -> None:
        if threading.current_thread() is self._thread:
            call()
        else:
            self._calls.append(call)
            self._wake()

    def _run_calls(self) -> None:
        while self._calls:
            try:
                self._calls.popleft()()
            except Exception:  # noqa: BLE001 - one owner's bug must not stop the others
                log.exception("listener on port %s: a call on the network thread failed",
                              self.port)

    def _attach_now(self, attached: "_Attached") -> None:
        if attached.sock.fileno() < 0:
            return                      # detached (closed) before its turn came
        self._attached[attached.sock] = attached
        self._selector.register(attached.sock, selectors.EVENT_READ, attached)

    def _set_writing_now(self, sock: socket.socket, on: bool) -> None:
        attached = self._attached.get(sock)
        if attached is None or attached.writing == on:
            return
        attached.writing = on
        self._selector.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if on
                                                             else 0), attached)

    def _detach_now(self, sock: socket.socket) -> None:
        if self._attached.pop(sock, None) is not None:
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass
        sock.close()

    def _serve_attached(self, attached: "_Attached", events: int) -> None:
        if attached.sock not in self._attached:
            return                      # detached by an earlier event of this turn
        try:
            if events & selectors.EVENT_WRITE:
                attached.owner.on_writable()
            if events & selectors.EVENT_READ and attached.sock in self._attached:
                attached.owner.on_readable()
        except Exception:  # noqa: BLE001 - the owner's bug: it loses its socket, not us
            log.exception("listener on port %s: serving an attached socket failed",
                          self.port)
            self._detach_now(attached.sock)
            attached.owner.loop_closed()

    def _serve(self, conn: _Connection, events: int) -> None:
        """One connection's events; a bug met on its behalf closes it alone."""
        try:
            if conn.handshaking:
                self._handshake(conn)
                return
            if events & selectors.EVENT_WRITE:
                self._write(conn)
            if events & selectors.EVENT_READ and not conn.closed:
                self._read(conn)
        except Exception as exc:
            log.exception("serving the connection from %s failed", conn.peer)
            self._stats["handler_errors"] += 1
            self._close(conn, f"internal error: {exc!r}")

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass                # already woken (buffer full) or closed

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _accept(self) -> None:
        for _ in range(64):     # a bounded batch per wakeup
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:          # e.g. EMFILE: keep serving the others
                log.warning("accept failed: %s", exc)
                return
            if len(self._connections) >= self.config.max_connections:
                self._stats["refused"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = None
            if self.security.tls:
                try:
                    tls = _Tls(self.security.ssl_context)
                except (ssl.SSLError, ValueError) as exc:
                    log.info("TLS set-up for %s failed: %s", peer, exc)
                    sock.close()
                    continue
            conn = _Connection(sock, peer, self._clock())
            conn.tls = tls
            conn.handshaking = tls is not None
            if self.security.sasl:
                conn.authenticator = self.security.authenticator()
            self._connections[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._stats["accepted"] += 1

    # -- TLS ------------------------------------------------------------------------------
    def _handshake(self, conn: _Connection) -> None:
        """The TLS handshake as far as the socket allows, never blocking: when it needs
        the peer's bytes (or the socket's room for its own) the selector waits for that;
        done, the connection is served as any other."""
        tls = conn.tls
        while True:
            try:
                if not self._send_raw(conn):
                    self._handshake_wait(conn, selectors.EVENT_WRITE)
                    return
            except OSError as exc:
                self._handshake_failed(conn, f"TLS handshake failed: {exc}")
                return
            try:
                tls.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLError, ValueError) as exc:
                tls.take_output()           # the alert that tells the client why
                if tls.raw is not None:
                    try:
                        conn.sock.send(tls.raw)
                    except OSError:
                        pass
                self._handshake_failed(conn, f"TLS handshake failed: {exc}")
                return
            tls.take_output()
            if tls.raw is not None:
                continue                    # our flight first, then the peer's answer
            try:
                n = conn.sock.recv_into(self._tls_scratch)
            except (BlockingIOError, InterruptedError):
                self._handshake_wait(conn, selectors.EVENT_READ)
                return
            except OSError as exc:
                self._handshake_failed(conn, f"TLS handshake failed: {exc}")
                return
            if n == 0:
                self._handshake_failed(conn, "closed by the peer during the TLS handshake")
                return
            tls.incoming.write(memoryview(self._tls_scratch)[:n])
        tls.take_output()                   # e.g. TLS 1.3 session tickets: sent by _write
        conn.handshaking = False
        conn.last_active = self._clock()
        self._stats["tls_handshakes"] += 1
        cert = tls.obj.getpeercert()
        if cert:            # a verified client certificate: Kafka's principal is its DN
            conn.principal = "User:" + ",".join(
                f"{_DN_NAMES.get(k, k)}={v}" for rdn in reversed(cert.get("subject", ()))
                for k, v in rdn)
        if tls.raw is not None:
            self._write(conn)
        self._update_interest(conn)

    def _handshake_failed(self, conn: _Connection, why: str) -> None:
        self._stats["tls_failed"] += 1
        self._close(conn, why)

    def _handshake_wait(self, conn: _Connection, events: int) -> None:
        conn.handshake_events = events
        if events != conn.registered:
            self._selector.modify(conn.sock, events, conn)
            conn.registered = events

    def _serve_tls_pending(self) -> None:
        """Read the connections whose TLS layer holds decrypted bytes (the selector does
        not see those)."""
        pending, self._tls_pending = self._tls_pending, set()
        for conn in pending:
            if not conn.closed and self._reading(conn):
                self._serve(conn, selectors.EVENT_READ)

    def _note_tls_pending(self, conn: _Connection) -> None:
        if conn.tls is not None and not conn.closed and not conn.handshaking and \
                self._reading(conn) and conn.tls.buffered():
            self._tls_pending.add(conn)

    def _tls_recv_into(self, conn: _Connection, view: memoryview) -> int:
        """Decrypted bytes into ``view``, as many TLS records as it takes to fill it or
        as are here, taking ciphertext from the socket when none are left (0: the peer
        closed; BlockingIOError: nothing to read now). A record is decrypted by one call:
        filling the view here saves the read loop's round per (librdkafka's often tiny)
        record."""
        tls = conn.tls
        obj = tls.obj
        size = len(view)
        got = 0
        while True:
            try:
                while got < size:
                    n = obj.read(size - got, view[got:] if got else view)
                    if not n:                   # the peer's close_notify
                        return got
                    got += n
                return got
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:      # the peer's close_notify
                return got
            finally:
                if tls.outgoing.pending:        # e.g. the answer to a TLS 1.3 key update
                    tls.take_output()
                    self._write(conn)
            if got:
                return got
            n = conn.sock.recv_into(self._tls_scratch)
            if n == 0:
                return 0
            tls.incoming.write(memoryview(self._tls_scratch)[:n])

    def _send_raw(self, conn: _Connection) -> bool:
        """Send the connection's pending ciphertext; True when none is left."""
        tls = conn.tls
        while tls.raw is not None:
            try:
                sent = conn.sock.send(tls.raw)
            except (BlockingIOError, InterruptedError):
                return False
            tls.raw = tls.raw[sent:] if sent < len(tls.raw) else None
        return True

    def _close(self, conn: _Connection, why: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._stats["closed"] += 1
        log.debug("closing connection from %s: %s", conn.peer, why)
        self._connections.pop(conn.sock, None)
        if conn.registered:
            self._selector.unregister(conn.sock)
        conn.sock.close()
        conn.inbox.clear()
        self._tls_pending.discard(conn)
        self._release(sum(slot.size for slot in conn.slots) +
                      (len(conn.body) if conn.body is not None else 0))
        conn.slots.clear()
        conn.out = []
        conn.body = None

    @staticmethod
    def _reading(conn: _Connection) -> bool:
        """May the connection's next bytes be read? Not while too many of its requests are
        unanswered, while its next request waits for memory, nor while answers wait for
        the socket (a client that does not read its answers stops being read)."""
        return not conn.muted and conn.waiting_size is None and not conn.want_write and \
            conn.closing is None and not conn.read_over

    def _update_interest(self, conn: _Connection) -> None:
        """Register for what the connection waits on: reads unless muted, writes while
        output is left; nothing (unregistered) when muted with nothing to write."""
        if conn.closed:
            return
        if conn.handshaking:
            return                      # the handshake's own events (_handshake_wait)
        events = (selectors.EVENT_READ if self._reading(conn) else 0) | \
            (selectors.EVENT_WRITE if conn.want_write else 0)
        if events & selectors.EVENT_READ:
            self._note_tls_pending(conn)
        if events == conn.registered:
            return
        if not conn.registered:
            self._selector.register(conn.sock, events, conn)
        elif not events:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.registered = events

    # -- reading --------------------------------------------------------------------------
    def _read(self, conn: _Connection) -> None:
        """Read what the socket has: the 4-byte size, then the body into its own buffer."""
        for _ in range(16):     # bounded: other connections get their turn
            if conn.closed or not self._reading(conn):
                return
            if conn.body is None:
                view = memoryview(conn.size_buf)[conn.size_got:]
            else:
                view = memoryview(conn.body)[conn.body_got:]
            try:
                n = conn.sock.recv_into(view) if conn.tls is None else \
                    self._tls_recv_into(conn, view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._peer_left(conn, f"read failed: {exc}", read_over=True)
                return
            if n == 0:
                self._peer_left(conn, "closed by the peer", read_over=True)
                return
            conn.last_active = self._clock()
            if conn.body is None:
                conn.size_got += n
                if conn.size_got < 4:
                    continue
                size, = _SIZE.unpack(conn.size_buf)
                conn.size_got = 0
                if size < 0 or size > self.config.socket_request_max_bytes:
                    self._stats["oversized"] += 1
                    self._close(conn, f"request size {size} outside 0.."
                                      f"{self.config.socket_request_max_bytes} "
                                      f"(socket.request.max.bytes)")
                    return
                if not self._allocate(conn, size):
                    return
            else:
                conn.body_got += n
            if conn.body_got == len(conn.body):
                frame, conn.body = conn.body, None
                self._received(conn, memoryview(frame))
        self._note_tls_pending(conn)        # stopped at the bound with bytes decrypted

    def _peer_left(self, conn: _Connection, why: str, *, read_over: bool) -> None:
        """The peer closed (or reset) the connection, or it cannot be written. The requests
        it sent before that are still handled, in order, as Kafka's Selector processes the
        receives staged before a disconnect (an acks=0 producer closes right after its
        last send); their answers are dropped. After a failed write the rest of what the
        peer sent is read too (our side is shut for writing: a live peer sees the end of
        the stream). The connection closes once its end is read and nothing is left."""
        conn.read_over = conn.read_over or read_over
        if conn.read_over and not conn.slots:
            self._close(conn, why)
            return
        if conn.peer_gone is None:
            conn.peer_gone = why
            conn.out = []
            if conn.tls is not None:
                conn.tls.raw = None
            if not read_over:
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        conn.want_write = False
        self._update_interest(conn)

    def _received(self, conn: _Connection, frame: memoryview) -> None:
        try:
            header, pos = wire.decode_request_header(frame)
        except wire.InvalidRequestError as exc:
            self._stats["invalid"] += 1
            self._release(len(frame))
            self._close(conn, str(exc))
            return
        self._stats["requests"] += 1
        if hoptrace.DIR:
            hoptrace.hop(f"L<{header.api_key}")
        slot = _Slot(len(frame))
        conn.slots.append(slot)
        conn.inbox.append((slot, Request(header, frame[pos:], conn.peer,
                                         time.monotonic_ns(), ANONYMOUS,
                                         self.security.name)))
        if len(conn.slots) >= self.config.max_queued_requests:
            conn.muted = True
            self._update_interest(conn)
        self._dispatch(conn)

    # -- the memory pool of request buffers (queued.max.request.bytes) ---------------------
    def _allocate(self, conn: _Connection, size: int) -> bool:
        """The body buffer for a request of ``size`` bytes, if the pool has room (always
        when nothing is allocated); else the connection waits for memory, unread."""
        if self._memory_bytes and \
                self._memory_bytes + size > self.config.queued_max_request_bytes:
            conn.waiting_size = size
            self._memory_waiters.append(conn)
            self._stats["memory_waits"] += 1
            self._update_interest(conn)
            return False
        self._memory_bytes += size
        conn.body = bytearray(size)
        conn.body_got = 0
        return True

    def _release(self, size: int) -> None:
        self._memory_bytes -= size
        while self._memory_waiters:
            conn = self._memory_waiters[0]
            if not conn.closed:
                if self._memory_bytes and self._memory_bytes + conn.waiting_size > \
                        self.config.queued_max_request_bytes:
                    return
                size, conn.waiting_size = conn.waiting_size, None
                self._allocate(conn, size)
                self._update_interest(conn)
            self._memory_waiters.popleft()

    # -- handing requests over and taking answers back --------------------------------------
    def _dispatch(self, conn: _Connection) -> None:
        """Hand the connection's next request to the handler, if none is inside it."""
        while conn.inbox and not conn.busy and not conn.closed and conn.closing is None:
            slot, request = conn.inbox.popleft()
            # the principal as of now: a request read before authentication completed
            # is handed over after it
            request = request._replace(principal=conn.principal)
            if conn.authenticator is not None and \
                    request.header.api_key != wire.API_VERSIONS:
                if request.header.api_key not in _BEFORE_AUTH:
                    self._stats["unauthenticated"] += 1
                    name = wire.API_NAMES.get(request.header.api_key,
                                              request.header.api_key)
                    self._close(conn, f"{name} before SASL authentication completed")
                    return
                conn.busy = True
                handle = conn.authenticator.handle
                if self._pool is None:
                    self._handled(conn, slot, self._call(request, handle))
                else:                   # PLAIN runs a PBKDF2: not on the network thread
                    self._pool.submit(self._call_in_pool, conn, slot, request, handle)
                continue
            conn.busy = True
            if self._pool is None:
                self._handled(conn, slot, self._call(request))
                continue
            if self._inline is not None:
                result = self._call(request, self._inline)
                if result is not NOT_INLINE:
                    self._handled(conn, slot, result)
                    continue
            self._pool.submit(self._call_in_pool, conn, slot, request)

    def _call(self, request: Request, handle=None):
        try:
            return (handle or self._handler.handle)(request)
        except wire.InvalidRequestError as exc:
            return _Failure(str(exc), "invalid")
        except Exception as exc:
            log.exception("handler failed on %s v%s from %s",
                          wire.API_NAMES.get(request.header.api_key, request.header.api_key),
                          request.header.api_version, request.client)
            return _Failure(f"handler failed: {exc!r}", "handler_errors")

    def _call_in_pool(self, conn: _Connection, slot: _Slot, request: Request,
                      handle=None) -> None:
        result = self._call(request, handle)
        self._completions.append((conn, slot, result, True))
        self._wake()

    def _handled(self, conn: _Connection, slot: _Slot, result) -> None:
        """``handle`` returned ``result`` for the request of ``slot`` (network thread)."""
        conn.busy = False
        if isinstance(result, concurrent.futures.Future):
            result.add_done_callback(lambda f, c=conn, s=slot: self._future_done(c, s, f))
        else:
            self._finish(conn, slot, result)
        self._dispatch(conn)

    def _future_done(self, conn: _Connection, slot: _Slot, future) -> None:
        """A deferred answer completed (on whichever thread completed it)."""
        try:
            result = future.result()
        except Exception as exc:
            log.warning("deferred answer failed for %s: %r", conn.peer, exc)
            result = _Failure(f"deferred answer failed: {exc!r}", "handler_errors")
        if threading.current_thread() is self._thread:
            self._finish(conn, slot, result)
        else:
            self._completions.append((conn, slot, result, False))
            self._wake()

    def _complete_pending(self) -> None:
        while self._completions:
            conn, slot, result, from_handle = self._completions.popleft()
            if conn.closed:
                continue
            if from_handle:
                self._handled(conn, slot, result)
            else:
                self._finish(conn, slot, result)

    def _finish(self, conn: _Connection, slot: _Slot, result) -> None:
        if conn.closed:
            return
        if isinstance(result, _Failure):
            self._stats[result.kind] += 1
            self._close(conn, result.why)
            return
        if isinstance(result, AuthStep):
            result = self._auth_step(conn, slot, result)
            if result is None:
                return                  # held: answered by _answer_delayed
        slot.done = True
        slot.parts = result
        self._flush(conn)

    def _auth_step(self, conn: _Connection, slot: _Slot, step: AuthStep):
        """Apply an authenticator's step to the connection: its answer's parts, or None
        when the answer is held (a failed authentication, delayed)."""
        if step.principal is not None:
            conn.principal = step.principal
            conn.authenticator = None
            self._stats["authenticated"] += 1
        if step.failed is None:
            return step.parts
        self._stats["authentication_failed"] += 1
        conn.closing = step.failed
        for later, _ in conn.inbox:     # read behind it: never answered
            conn.slots.remove(later)
            self._release(later.size)
        conn.inbox.clear()
        self._update_interest(conn)     # unread from now on
        delay_s = self.security.failed_authentication_delay_ms / 1000.0
        if not step.delay or delay_s <= 0:
            return step.parts
        self._delay_seq += 1
        heapq.heappush(self._delayed, (self._clock() + delay_s, self._delay_seq, conn, slot,
                                       step.parts))
        return None

    def _answer_delayed(self) -> None:
        """Write the held answers whose delay is over (their connections then close)."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, conn, slot, parts = heapq.heappop(self._delayed)
            if not conn.closed:
                slot.done = True
                slot.parts = parts
                self._flush(conn)

    # -- writing --------------------------------------------------------------------------
    def _flush(self, conn: _Connection) -> None:
        """Move the finished responses at the head of the order to the output and write."""
        while conn.slots and conn.slots[0].done:
            slot = conn.slots.popleft()
            self._release(slot.size)
            if slot.parts is not None and conn.peer_gone is None:
                conn.out.extend(slot.parts)
                self._stats["responses"] += 1
        if conn.muted and len(conn.slots) < self.config.max_queued_requests:
            conn.muted = False
            self._update_interest(conn)
        if conn.peer_gone is not None:
            if conn.read_over and not conn.slots:
                self._close(conn, conn.peer_gone)
            return
        if conn.out:
            self._write(conn)

    def _write(self, conn: _Connection) -> None:
        tls = conn.tls
        while (conn.out or tls is not None and tls.raw is not None) and not conn.closed:
            try:
                if tls is None:
                    if hoptrace.DIR:
                        hoptrace.hop("L>")
                    sent = conn.sock.sendmsg(conn.out[:_IOV_MAX])
                    _consume(conn.out, sent)
                elif not self._send_raw(conn):
                    break
                elif conn.out:      # the next piece, encrypted whole (records of 16 KB)
                    chunk = _head_bytes(conn.out, _TLS_CHUNK)
                    tls.obj.write(chunk)
                    _consume(conn.out, len(chunk))
                    tls.take_output()
            except (BlockingIOError, InterruptedError):
                break
            except (OSError, ValueError) as exc:      # ssl.SSLError is an OSError
                self._peer_left(conn, f"write failed: {exc}", read_over=False)
                return
            conn.last_active = self._clock()
        if conn.closed:
            return
        want = bool(conn.out) or tls is not None and tls.raw is not None
        if conn.closing is not None and not want and not conn.slots:
            self._close(conn, conn.closing)
            return
        if want != conn.want_write:
            conn.want_write = want
            self._update_interest(conn)
        if not want and conn.slots and conn.slots[0].done:
            self._flush(conn)

    # -- idle connections -----------------------------------------------------------------
    def _close_idle(self) -> None:
        limit_s = self.config.connections_max_idle_ms / 1000.0
        now = self._clock()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + min(limit_s / 2, 1.0)
        for conn in list(self._connections.values()):
            if not conn.slots and not conn.out and conn.waiting_size is None and \
                    now - conn.last_active > limit_s:
                self._stats["idle_closed"] += 1
                self._close(conn, f"idle for over {self.config.connections_max_idle_ms} ms")


class _Attached:
    """A socket of another owner served on the network thread (``SocketServer.attach``)."""

    __slots__ = ("sock", "owner", "writing")

    def __init__(self, sock: socket.socket, owner):
        self.sock = sock
        self.owner = owner
        self.writing = False


class _Failure(NamedTuple):
    why: str
    kind: str           # the stats counter it adds to


#: Kafka's names for the attributes of a certificate's subject (its principal is the DN)
_DN_NAMES = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
             "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C"}


def _head_bytes(parts: list, limit: int) -> bytes:
    """The first ``limit`` bytes (or fewer) of the buffer list ``parts``, joined."""
    out, size = [], 0
    for p in parts:
        room = limit - size
        if room <= 0:
            break
        view = memoryview(p)
        out.append(view[:room])
        size += min(view.nbytes, room)
    return b"".join(out)


__all__ = ["SocketServer", "SocketServerConfig", "Request", "RequestHandler",
           "ListenerSecurity", "AuthStep", "ANONYMOUS", "SECURITY_PROTOCOLS"]
