"""coordination/ under ZooKeeper faults, against a real server: session expiry and a
ZooKeeper outage of ~10 s. Every wait is on an observable condition with a deadline."""

import itertools
import json
import time

import pytest
from kazoo.client import KazooState

from coordination import zk_layout as L
from coordination.election import ControllerCandidate, ControllerRole
from coordination.registry import BrokerRegistration
from coordination.session import ZkSettings, connect
from coordination.store import ZkStore
from zk_helpers import (StallingProxy, expire_session, plain_client, start_zookeeper,
                        wait_until)

_ns = itertools.count()
#: How long ZooKeeper stays down in the outage test (the issue's "stopped for 10 s").
OUTAGE_S = 10.0


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    server = start_zookeeper(tmp_path_factory.mktemp("zk"))
    yield server
    server.stop()


@pytest.fixture
def clients(zk_server):
    namespace = f"f{next(_ns)}"
    made = []

    def make(session_timeout_s=6.0):
        client = connect(ZkSettings(hosts=zk_server.hosts, namespace=namespace,
                                    session_timeout_s=session_timeout_s))
        made.append(client)
        return client
    make.root = L.chroot_for(namespace)
    yield make
    for client in made:
        client.close()


def _owner(zk_server, path):
    raw = plain_client(zk_server.hosts)
    try:
        stat = raw.exists(path)
        return None if stat is None else stat.ephemeralOwner
    finally:
        raw.stop()
        raw.close()


def test_registration_comes_back_after_session_expiry(zk_server, clients):
    """After the broker's session is expired, kazoo opens a new session and the loop
    re-creates /brokers/ids/<id> owned by it, with the same body."""
    zk = clients()
    reg = BrokerRegistration(zk, L.BrokerInfo(broker_id=5, host="h", port=1))
    reg.start(timeout_s=10)
    path = clients.root + "/brokers/ids/5"
    old_session = expire_session(zk_server.hosts, zk.kazoo)
    wait_until(lambda: zk.session_id not in (None, old_session) and reg.registered,
               timeout_s=20, what="re-registration in a new session")
    assert _owner(zk_server, path) == zk.session_id
    assert reg.registrations == 2
    raw = plain_client(zk_server.hosts)
    body = json.loads(raw.get(path)[0])
    raw.stop()
    raw.close()
    assert body["timestamp"] == str(reg.info.timestamp_ms)   # first start time, as the seed says
    reg.close()


def test_the_fencing_hook_runs_before_the_registration_comes_back(zk_server, clients):
    """After a session expiry, ``before_reregister`` (the broker fences its replicas there)
    runs once the old registration is gone and before the new one exists, and not at the
    first registration; the registration then records the new czxid."""
    zk = clients()
    seen = []
    path = clients.root + "/brokers/ids/6"

    def hook():
        seen.append(_owner(zk_server, path))
    reg = BrokerRegistration(zk, L.BrokerInfo(broker_id=6, host="h", port=1),
                             before_reregister=hook)
    reg.start(timeout_s=10)
    first = reg.czxid
    assert seen == [] and first is not None
    old_session = expire_session(zk_server.hosts, zk.kazoo)
    wait_until(lambda: zk.session_id not in (None, old_session) and reg.registered,
               timeout_s=20, what="re-registration in a new session")
    assert seen and seen[0] is None, "the hook ran while no registration existed"
    assert reg.czxid is not None and reg.czxid != first
    reg.close()


def test_controller_resigns_on_session_loss_and_a_new_epoch_follows(zk_server, clients):
    """Expiring the active controller's session drops its role (on_resigned); a controller
    (the other candidate, or itself in its new session) then holds epoch 2."""
    resigned = []
    zk1, zk2 = clients(), clients()
    c1 = ControllerCandidate(zk1, broker_id=1, on_resigned=lambda: resigned.append(1)).start()
    assert c1.wait_active(timeout_s=10)
    c2 = ControllerCandidate(zk2, broker_id=2).start()
    wait_until(lambda: c2.status().controller_id == 1, timeout_s=10, what="c2 follows c1")
    expire_session(zk_server.hosts, zk1.kazoo)
    wait_until(lambda: resigned == [1], timeout_s=20, what="c1 resigned")
    wait_until(lambda: [c.epoch for c in (c1, c2) if c.is_active] == [2], timeout_s=20,
               what="exactly one controller, epoch 2")
    store_epoch = ZkStore(zk2)   # read through a client of the namespace
    assert store_epoch.zk.get(L.CONTROLLER_EPOCH_PATH)[0] == b"2"
    c1.close()
    c2.close()


def test_zookeeper_outage_of_10s_keeps_registration_and_election(zk_server, clients):
    """ZooKeeper stopped ~10 s and started again: the broker is registered again in a live
    session (the same one if it survived), exactly one controller is active, its epoch is
    unchanged if its session survived and one higher if not, and the cluster id is stable."""
    zk1, zk2 = clients(session_timeout_s=8.0), clients(session_timeout_s=8.0)
    cluster_id = ZkStore(zk1).get_or_create_cluster_id()
    reg = BrokerRegistration(zk1, L.BrokerInfo(broker_id=1, host="h", port=1))
    reg.start(timeout_s=10)
    c1 = ControllerCandidate(zk1, broker_id=1).start()
    assert c1.wait_active(timeout_s=10)
    c2 = ControllerCandidate(zk2, broker_id=2).start()
    wait_until(lambda: c2.status().controller_id == 1, timeout_s=10, what="c2 follows c1")
    sessions_before = (zk1.session_id, zk2.session_id)

    zk_server.stop()
    try:    # the server comes back whatever fails here: the module's next tests use it
        wait_until(lambda: zk1.state == KazooState.SUSPENDED, timeout_s=10, what="suspended")
        # is_active drops on kazoo's thread at once, the role on the candidate's loop
        # thread at its next round: wait for both
        wait_until(lambda: (not c1.is_active and not reg.registered
                            and c1.status().role == ControllerRole.SUSPENDED),
                   timeout_s=10, what="roles paused while disconnected",
                   detail=lambda: (c1.status(), reg.registered))
        time.sleep(OUTAGE_S)   # the outage itself is the fault under test
    finally:
        zk_server.start(timeout_s=30)

    wait_until(lambda: reg.registered, timeout_s=30, what="broker registered again")
    wait_until(lambda: sum(c.is_active for c in (c1, c2)) == 1, timeout_s=30,
               what="exactly one active controller")
    active = c1 if c1.is_active else c2
    survived = zk1.session_id == sessions_before[0]
    assert active.epoch == (1 if survived and active is c1 else 2)
    assert _owner(zk_server, clients.root + "/brokers/ids/1") == zk1.session_id
    assert _owner(zk_server, clients.root + "/controller") == active.zk.session_id
    assert ZkStore(zk2).get_or_create_cluster_id() == cluster_id
    reg.close()
    c1.close()
    c2.close()


def test_a_handshake_the_server_never_answers_does_not_cost_the_session(zk_server):
    """A connection the server accepts but never answers (ZooKeeper 3.8.0 does this to a
    client that connects while it loads its database) is given up after the handshake
    timeout and tried again, so the session survives. kazoo alone waits the whole session
    timeout per attempt: two such connections in a row lost the session."""
    proxy = StallingProxy(zk_server.port).start()
    settings = ZkSettings(hosts=f"127.0.0.1:{proxy.port}", namespace=f"f{next(_ns)}",
                          session_timeout_s=9.0)
    assert settings.handshake_timeout == 3.0
    zk = connect(settings)
    try:
        session = zk.session_id
        proxy.stall_next(2)
        proxy.drop_all()
        wait_until(lambda: proxy.stalled == 2, timeout_s=20, what="two stalled handshakes")
        wait_until(lambda: zk.connected, timeout_s=30, what="connected again")
        assert zk.session_id == session, "the session expired during the stalled handshakes"
    finally:
        zk.close()
        proxy.close()


_OWNER = """
import sys, time
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=30.0)
zk.start(timeout=20)
zk.create(sys.argv[2], b"x", ephemeral=True)
session, password = zk.client_id
print(f"{session} {password.hex()}", flush=True)
time.sleep(600)
"""


def test_a_dead_sessions_end_whose_attach_fails_after_connecting_still_ends_it(
        zk_server, monkeypatch):
    """end_session (a standby controller ending a killed controller's session) whose
    kazoo start fails after the connection was made still closes the session at once: the
    client it attached with is stopped, never left running on the dead process's session.
    One left running kept a killed controller's /controller for the 180 s of a fresh-clone
    run's wait (kazoo's start reads the chroot's "/" once connected: one more request that
    a loaded machine can lose)."""
    import signal
    import subprocess
    import sys

    from kazoo.client import KazooClient
    from kazoo.exceptions import ConnectionLoss

    from coordination.session import end_session
    path = f"/end-session-{next(_ns)}"
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, zk_server.hosts, path],
                             stdout=subprocess.PIPE, text=True)
    try:
        session, password = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)       # dead; its session lives on (30 s)
        owner.wait(10)
    assert _owner(zk_server, path) == int(session)
    real_start = KazooClient.start

    def start_then_lose_a_request(self, timeout=15):
        real_start(self, timeout=timeout)
        raise ConnectionLoss("lost after connecting")

    monkeypatch.setattr(KazooClient, "start", start_then_lose_a_request)
    try:
        end_session(ZkSettings(hosts=zk_server.hosts, namespace=f"f{next(_ns)}"),
                    (int(session), bytes.fromhex(password)))
    finally:
        monkeypatch.undo()
    wait_until(lambda: _owner(zk_server, path) is None, timeout_s=15,
               what="the dead process's ephemeral node gone (its session: 30 s)")
