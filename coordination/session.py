"""A ZooKeeper session: connecting (with the namespace chroot) and a thin, timed wrapper
around kazoo's calls.

Why a wrapper: kazoo's synchronous calls wait on the reply with no timeout; while the server
is down a request can sit in kazoo's queue for as long as the reconnect takes. Every call
here goes through `*_async(...).get(timeout=...)`, so it answers within `timeout_s` or raises
ZkUnavailableError. A timed-out request may still reach the server later: callers make their
writes idempotent or conditional (versioned), never blind.

What passes through unchanged: kazoo's NoNodeError, NodeExistsError, BadVersionError,
NotEmptyError (the callers in this package turn them into their own typed errors). What is
translated: ConnectionLoss / timeouts / closed client -> ZkUnavailableError, session expiry
-> ZkSessionExpiredError.

Namespace isolation is a chroot in the connection string ("127.0.0.1:2181/raykafka-<ns>"):
kazoo prefixes every path, watches and children listings come back relative, and nothing in
this package needs to know about the prefix. The chroot node itself must exist before a
chrooted client can create anything, so `connect` creates it first with a short-lived
un-chrooted client.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (ConnectionClosedError, ConnectionLoss, NoNodeError,
                              NotEmptyError, OperationTimeoutError, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from coordination.errors import ZkSessionExpiredError, ZkUnavailableError
from coordination.zk_layout import chroot_for, split_connect

log = logging.getLogger(__name__)

#: Bound on the nodes a recursive delete walks (a topic has ~3 nodes per partition).
MAX_RECURSIVE_DELETE_NODES = 100_000


@dataclass(frozen=True)
class ZkSettings:
    """How to reach ZooKeeper. ``hosts`` is a connect string, optionally with a chroot
    ("h:p/chroot", Kafka's ``zookeeper.connect``), which wins; otherwise the chroot is the
    namespace's; ``namespace`` None and no chroot in ``hosts`` means the server's root."""
    hosts: str
    namespace: str | None = None
    session_timeout_s: float = 10.0
    connect_timeout_s: float = 15.0
    op_timeout_s: float = 10.0
    #: Cap on kazoo's reconnect backoff: after a ZooKeeper restart we want to be back well
    #: inside the session timeout (kazoo's default cap is 60 s).
    reconnect_max_delay_s: float = 0.5
    #: How long one connection handshake may wait for the server's answer; None: a third
    #: of the session timeout (at least 1 s). kazoo would wait the whole session timeout
    #: (divided by the number of hosts), which loses the session when a server accepts the
    #: connection but never answers (see `_BoundedHandshake`).
    handshake_timeout_s: float | None = None
    #: "user:password": the session authenticates with ZooKeeper's digest scheme and
    #: creates every znode with Kafka's secure ACLs (``secure_acl``): only this credential
    #: changes the registry. None: open ACLs, as Kafka without zookeeper.set.acl.
    digest: str | None = None

    def __repr__(self) -> str:           # never print the credential
        return (f"ZkSettings(hosts={self.hosts!r}, namespace={self.namespace!r}, "
                f"digest={'<set>' if self.digest else None})")

    @property
    def handshake_timeout(self) -> float:
        if self.handshake_timeout_s is not None:
            return self.handshake_timeout_s
        return max(1.0, self.session_timeout_s / 3.0)

    @property
    def servers(self) -> str:
        """The host:port list, without a chroot."""
        return split_connect(self.hosts)[0]

    @property
    def chroot(self) -> str:
        """The chroot in ``hosts`` when it has one (Kafka's ``zookeeper.connect`` form), else
        the namespace's ("/raykafka-<namespace>"), else "" (the server's root)."""
        chroot = split_connect(self.hosts)[1]
        if chroot or self.namespace is None:
            return chroot
        return chroot_for(self.namespace)

    @property
    def connection_string(self) -> str:
        return self.servers + self.chroot


#: Paths (relative to the chroot) nobody but the cluster may read: credentials and broker
#: secrets (Kafka's ZkData.SensitiveRootPaths).
SENSITIVE_PATHS = ("/config/users", "/config/brokers")
#: Kept open, as Kafka keeps the old consumers' path: ZooKeeper-based consumers (the seed's
#: high-level consumer, actors/client/zk_consumer.py) register and commit there without
#: the cluster's credential.
OPEN_PATHS = ("/consumers",)


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def secure_acl(path: str) -> list:
    """Kafka's ACL for a znode of a secured cluster (ZkData.defaultAcls): all rights for
    the creator's credential, read for everyone except on sensitive paths; the old
    consumers' path stays open."""
    if _under(path, OPEN_PATHS):
        return list(OPEN_ACL_UNSAFE)
    if _under(path, SENSITIVE_PATHS):
        return list(CREATOR_ALL_ACL)
    return list(CREATOR_ALL_ACL) + list(READ_ACL_UNSAFE)


def digest_from_config(config: dict) -> str | None:
    """The ZooKeeper credential a broker's config asks for: ``zookeeper.auth.digest``
    ("user:password") when ``zookeeper.set.acl`` is true, else None. ValueError when ACLs
    are asked for without a credential."""
    if str(config.get("zookeeper.set.acl", "false")).strip().lower() != "true":
        return None
    digest = str(config.get("zookeeper.auth.digest") or "")
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        raise ValueError("zookeeper.set.acl=true needs zookeeper.auth.digest as "
                         "user:password (the cluster's ZooKeeper credential)")
    return digest


def _translate(exc: BaseException, what: str) -> BaseException:
    if isinstance(exc, SessionExpiredError):
        return ZkSessionExpiredError(f"{what}: ZooKeeper session expired")
    if isinstance(exc, (ConnectionLoss, OperationTimeoutError, KazooTimeoutError,
                        ConnectionClosedError)):
        return ZkUnavailableError(f"{what}: {type(exc).__name__}: {exc}")
    return exc


class ZkClient:
    """One kazoo session with timed calls. Thread-safe (kazoo's client is).

    Owns the KazooClient it was given: `close` stops it.
    """

    def __init__(self, kazoo: KazooClient, *, op_timeout_s: float = 10.0,
                 secure: bool = False):
        self.kazoo = kazoo
        self.op_timeout_s = op_timeout_s
        self.secure = secure            # create znodes with secure_acl (ZkSettings.digest)

    # -- session -------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """KazooState.CONNECTED, SUSPENDED or LOST."""
        return self.kazoo.state

    @property
    def connected(self) -> bool:
        return self.kazoo.state == KazooState.CONNECTED

    @property
    def session_id(self) -> int | None:
        """The current session id (changes after an expiry); None while not connected
        (kazoo names its session only while connected, even if the session lives on)."""
        client_id = self.kazoo.client_id
        return client_id[0] if client_id else None

    @property
    def credentials(self) -> tuple[int, bytes] | None:
        """(session id, password) of the current session: what ``end_session`` needs to
        end it from another process once this one is known dead."""
        client_id = self.kazoo.client_id
        return (client_id[0], client_id[1]) if client_id else None

    def add_listener(self, listener: Callable[[str], object]) -> None:
        """`listener(state)` runs on kazoo's thread: it must only set flags or events."""
        self.kazoo.add_listener(listener)

    def remove_listener(self, listener: Callable[[str], object]) -> None:
        self.kazoo.remove_listener(listener)

    def close(self) -> None:
        """Close the session (its ephemeral nodes go at once) and stop kazoo's threads."""
        try:
            self.kazoo.stop()
        finally:
            self.kazoo.close()

    # -- timed calls -----------------------------------------------------------------------

    def _wait(self, async_result, what: str, timeout_s: float | None):
        try:
            return async_result.get(timeout=self.op_timeout_s if timeout_s is None else timeout_s)
        except Exception as exc:   # noqa: BLE001 - re-raised, translated or as is
            translated = _translate(exc, what)
            if translated is exc:
                raise
            raise translated from exc

    def get(self, path: str, *, watch=None, timeout_s: float | None = None
            ) -> tuple[bytes, ZnodeStat]:
        return self._wait(self.kazoo.get_async(path, watch=watch), f"get {path}", timeout_s)

    def get_many(self, paths: list[str], *, timeout_s: float | None = None
                 ) -> list[tuple[bytes, ZnodeStat] | None]:
        """Read several znodes in one pipelined round: every request is sent before any
        answer is awaited (one session answers in order), so N reads cost about one round
        trip and one wake-up of the caller instead of N. None for a node that does not
        exist; any other failure is raised as ``get`` raises it."""
        pending = [self.kazoo.get_async(path) for path in paths]
        deadline = time.monotonic() + (self.op_timeout_s if timeout_s is None else timeout_s)
        out: list = []
        for path, result in zip(paths, pending):
            try:
                out.append(result.get(timeout=max(0.001, deadline - time.monotonic())))
            except NoNodeError:
                out.append(None)
            except Exception as exc:   # noqa: BLE001 - re-raised, translated or as is
                translated = _translate(exc, f"get {path}")
                if translated is exc:
                    raise
                raise translated from exc
        return out

    def exists(self, path: str, *, watch=None, timeout_s: float | None = None
               ) -> ZnodeStat | None:
        return self._wait(self.kazoo.exists_async(path, watch=watch), f"exists {path}",
                          timeout_s)

    def get_children(self, path: str, *, watch=None, timeout_s: float | None = None
                     ) -> list[str]:
        return self._wait(self.kazoo.get_children_async(path, watch=watch),
                          f"get_children {path}", timeout_s)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False,
               timeout_s: float | None = None) -> str:
        """Returns the created path (with the sequence suffix when `sequence`)."""
        acl = secure_acl(path) if self.secure else None
        return self._wait(self.kazoo.create_async(path, value, acl=acl, ephemeral=ephemeral,
                                                  sequence=sequence, makepath=makepath),
                          f"create {path}", timeout_s)

    def set(self, path: str, value: bytes, *, version: int = -1,
            timeout_s: float | None = None) -> ZnodeStat:
        return self._wait(self.kazoo.set_async(path, value, version=version), f"set {path}",
                          timeout_s)

    def delete(self, path: str, *, version: int = -1, timeout_s: float | None = None) -> None:
        self._wait(self.kazoo.delete_async(path, version=version), f"delete {path}", timeout_s)

    def ensure_path(self, path: str, *, timeout_s: float | None = None) -> None:
        acl = secure_acl(path) if self.secure else None
        self._wait(self.kazoo.ensure_path_async(path, acl=acl), f"ensure_path {path}",
                   timeout_s)

    def commit(self, transaction, *, timeout_s: float | None = None) -> list:
        """Commit a `kazoo.transaction()`; returns kazoo's per-op results (an exception
        instance in the slot of each failed op)."""
        return self._wait(transaction.commit_async(), "multi", timeout_s)

    def transaction(self):
        return self.kazoo.transaction()

    def delete_recursive(self, path: str, *, timeout_s: float | None = None) -> int:
        """Delete `path` and everything below it, children first; returns nodes deleted.

        Tolerates concurrent deletes (NoNode) and retries a node whose children changed under
        it, at most MAX_RECURSIVE_DELETE_NODES node visits in all."""
        deleted = 0
        stack = [path]
        visits = 0
        while stack:
            visits += 1
            if visits > MAX_RECURSIVE_DELETE_NODES:
                raise ZkUnavailableError(f"delete_recursive {path}: too many nodes")
            node = stack[-1]
            try:
                children = self.get_children(node, timeout_s=timeout_s)
            except NoNodeError:
                stack.pop()
                continue
            if children:
                stack.extend(f"{node.rstrip('/')}/{c}" for c in children)
                continue
            try:
                self.delete(node, timeout_s=timeout_s)
                deleted += 1
            except NoNodeError:
                pass
            except NotEmptyError:
                continue   # a child appeared meanwhile: list it again
            stack.pop()
        return deleted


class _BoundedHandshake(ConnectionHandler):
    """kazoo's connection loop with a bounded handshake: the ConnectRequest's answer is
    awaited for at most ``handshake_timeout_s``, then the attempt counts as failed and the
    loop tries again.

    Why: kazoo waits ``session_timeout / len(hosts)`` for that answer, the whole session
    timeout with one server. ZooKeeper 3.8.0 (Debian's) binds its port before it has loaded
    its database; a connection that arrives in that window is refused with "ZooKeeperServer
    not running", but the close then fails on a NullPointerException (zkDb is null) and the
    socket stays open, unanswered. A client caught there waited the whole 18 s and came
    back to a server that had meanwhile expired its session (restored sessions get a fresh
    timeout when the server starts): fault test 7's lost session. ``_invoke`` is kazoo's
    writer for the connection handshake only (Connect, then auth packets)."""

    handshake_timeout_s = 6.0

    def _invoke(self, timeout, request, xid=None):
        if isinstance(request, Connect):
            timeout = min(timeout, self.handshake_timeout_s)
        return super()._invoke(timeout, request, xid)


def _kazoo_client(connection_string: str, settings: ZkSettings, *,
                  client_id: tuple[int, bytes] | None = None,
                  connection_retry: KazooRetry | None = None) -> KazooClient:
    secure = {}
    if settings.digest:
        secure = {"auth_data": [("digest", settings.digest)],
                  "default_acl": list(CREATOR_ALL_ACL) + list(READ_ACL_UNSAFE)}
    kazoo = KazooClient(
        hosts=connection_string,
        timeout=settings.session_timeout_s,
        client_id=client_id,
        **secure,
        # Reconnect forever (the session's fate is decided by the server, not by us) but
        # quickly: a capped backoff.
        connection_retry=connection_retry or KazooRetry(
            max_tries=-1, delay=0.05, backoff=2, max_delay=settings.reconnect_max_delay_s),
        command_retry=KazooRetry(max_tries=3, delay=0.05, max_delay=0.5,
                                 deadline=settings.op_timeout_s),
    )
    old = kazoo._connection
    handler = _BoundedHandshake(kazoo, old.retry_sleeper, logger=old.logger,
                                sasl_options=old.sasl_options)
    handler.handshake_timeout_s = settings.handshake_timeout
    kazoo._connection = handler
    return kazoo


def _start(kazoo: KazooClient, timeout_s: float, what: str) -> None:
    try:
        kazoo.start(timeout=timeout_s)
    except KazooTimeoutError as exc:
        kazoo.stop()
        kazoo.close()
        raise ZkUnavailableError(f"{what}: no ZooKeeper session within {timeout_s:.1f}s") from exc


def ensure_chroot(settings: ZkSettings) -> None:
    """Create the namespace's chroot node if missing (idempotent)."""
    chroot = settings.chroot
    if not chroot:
        return
    bootstrap = _kazoo_client(settings.servers, settings)
    _start(bootstrap, settings.connect_timeout_s, f"connect {settings.servers}")
    try:
        ZkClient(bootstrap, op_timeout_s=settings.op_timeout_s,
                 secure=bool(settings.digest)).ensure_path(chroot)
    finally:
        bootstrap.stop()
        bootstrap.close()


def connect(settings: ZkSettings) -> ZkClient:
    """Open a session in the namespace (creating its chroot); raises ZkUnavailableError when
    no session is established within `connect_timeout_s`."""
    ensure_chroot(settings)
    kazoo = _kazoo_client(settings.connection_string, settings)
    _start(kazoo, settings.connect_timeout_s, f"connect {settings.connection_string}")
    return ZkClient(kazoo, op_timeout_s=settings.op_timeout_s, secure=bool(settings.digest))


def end_session(settings: ZkSettings, credentials: tuple[int, bytes], *,
                timeout_s: float = 5.0) -> bool:
    """End somebody else's session at the server now, instead of after its timeout: attach
    to it with its (id, password) and close it, so its ephemeral nodes go at once (the
    session-clone trick). Only for a session whose owner is known dead: a live owner would
    find its session expired. True when the close was sent; False when no server answered
    within ``timeout_s`` (the session then expires by itself).

    The client that attaches is stopped whatever happens: one left running would keep the
    dead owner's session alive for as long as this process lives (a fresh-clone run: a
    killed controller's /controller held for 180 s, no controller elected). It attaches
    without the chroot: kazoo's start reads a chroot's "/" once connected, one more
    request that can fail, and a session belongs to no path."""
    kazoo = _kazoo_client(settings.servers, settings, client_id=tuple(credentials),
                          connection_retry=KazooRetry(max_tries=3, delay=0.05, max_delay=0.5))
    ended = False
    try:
        kazoo.start(timeout=timeout_s)
        ended = True
    except KazooTimeoutError:
        pass
    except Exception as exc:  # noqa: BLE001 - connected or not, it is stopped below
        ended = kazoo.connected               # then the stop closes the session
        log.warning("ending session 0x%x: attaching failed (%s: %s)%s", credentials[0],
                    type(exc).__name__, exc, "; closing it" if ended else "")
    finally:
        try:
            kazoo.stop()                      # connected: sends the close; else a no-op
        except Exception as exc:  # noqa: BLE001 - the close is best effort; never left running
            log.warning("ending session 0x%x: stop failed (%s: %s)", credentials[0],
                        type(exc).__name__, exc)
            ended = False
        finally:
            kazoo.close()
    return ended
