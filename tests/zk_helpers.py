"""Shared helpers for tests that need a real ZooKeeper (Debian's, through
coordination.zk_server). Import the functions; each test module makes its own fixture."""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from coordination.zk_server import EmbeddedZooKeeper


def start_zookeeper(data_dir) -> EmbeddedZooKeeper:
    """A fresh server on a free loopback port; the caller stops it."""
    return EmbeddedZooKeeper(data_dir).start(timeout_s=30.0)


def wait_until(predicate, *, timeout_s: float, what: str, interval_s: float = 0.02,
               detail=None):
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout_s`,
    with what `detail()` (when given) says about the state then."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            state = f" ({detail()})" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}{state}")
        time.sleep(interval_s)


def plain_client(hosts: str, *, timeout_s: float = 10.0) -> KazooClient:
    """A bare kazoo client (no chroot, no wrapper): how a test reads what really is in
    ZooKeeper."""
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=timeout_s)
    return client


def expire_session(hosts: str, kazoo_client: KazooClient, *, timeout_s: float = 10.0) -> int:
    """Expire `kazoo_client`'s session the standard way: attach a second client to the same
    session id and password, then close it (closeSession ends the session on the server).
    Returns the expired session id."""
    session_id, password = kazoo_client.client_id
    twin = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=10.0)
    twin.start(timeout=timeout_s)
    twin.stop()
    twin.close()
    return session_id


class StallingProxy:
    """A TCP forwarder in front of a ZooKeeper server that can (1) drop every connection it
    carries and (2) accept the next N connections and never answer them: what ZooKeeper
    3.8.0 does to a client that connects while it is still loading its database.
    ``StallingProxy(target_port).start()``; ``port`` is where clients connect."""

    def __init__(self, target_port: int):
        import socket
        import threading
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list = []
        self._stall = 0
        self.stalled = 0
        self._closed = False

    def start(self) -> "StallingProxy":
        import threading
        threading.Thread(target=self._accept, daemon=True, name="stalling-proxy").start()
        return self

    def stall_next(self, n: int) -> None:
        with self._lock:
            self._stall = n

    def drop_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _close_quietly(s)

    def close(self) -> None:
        self._closed = True
        _close_quietly(self._listener)
        self.drop_all()

    def _accept(self) -> None:
        import socket
        import threading
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
                if self._stall > 0:
                    self._stall -= 1
                    self.stalled += 1
                    continue               # held open, never read, never answered
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                _close_quietly(client)
                continue
            with self._lock:
                self._sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src, dst) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    _close_quietly(src)
    _close_quietly(dst)


def _close_quietly(sock) -> None:
    import socket
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
