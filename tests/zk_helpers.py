"""Shared helpers for tests that need a real ZooKeeper (Debian's, through
coordination.zk_server). Import the functions; each test module makes its own fixture."""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from coordination.zk_server import EmbeddedZooKeeper


def start_zookeeper(data_dir) -> EmbeddedZooKeeper:
    """A fresh server on a free loopback port; the caller stops it."""
    return EmbeddedZooKeeper(data_dir).start(timeout_s=30.0)


def wait_until(predicate, *, timeout_s: float, what: str, interval_s: float = 0.02):
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}")
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
