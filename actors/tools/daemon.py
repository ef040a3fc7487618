"""The cluster daemon behind ``raykafka start`` / ``stop`` / ``status``.

``raykafka start`` spawns ``python -m actors.tools.daemon`` as a detached process (its own session,
no terminal, output to ``<data_dir>/daemon.log``). The daemon starts a private local Ray
(``raycompat.init_local``) or, with ``--ray-address``, attaches to a running one (a ``ray up``
cluster; its processes are never ended by us), an embedded ZooKeeper (unless ``--zk``) and
the brokers with ``Cluster.start``, then writes the state file and sleeps until
SIGTERM/SIGINT, on which it shuts the cluster down, leaves Ray (stopping it only when it
started it) and removes the state file.

The state file ``<RAYKAFKA_STATE_DIR or ~/.raykafka>/<namespace>.json`` (written atomically:
temp file + rename) is what later commands and ``Cluster.connect(namespace)`` read::

    {"namespace", "status": "starting" | "ready" | "stopping", "pid", "ray_address",
     "ray_auth_mode", "dashboard_url", "attached_ray", "data_dir", "zk_hosts", "embedded_zk",
     "zk_data_dir", "brokers", "bootstrap_servers", "security", "log_file", "ray_pids",
     "started_at"}

``security`` is None, or (``--secure``) where the secured cluster's files are
(``Cluster.security_files``: the CA, the admin password file, admin.properties) and its
protocol, mechanism and admin user; never a password.

A private Ray (no ``--ray-address``) runs its dashboard on 127.0.0.1 at a free port,
``dashboard_url``: the job server that ``ray job submit --address <dashboard_url>`` talks to.
``ray_auth_mode`` is the Ray's token-auth mode, which ``Cluster.connect`` adopts.

Invariants: a state file whose ``pid`` is not alive is stale (``live_state`` removes it);
``ray_address`` is only present once ``status`` is "ready".

Stopping (``stop_daemon``): SIGTERM, wait up to ``timeout_s``; SIGKILL if it is still there;
then whatever it left behind is ended by the PIDs it recorded (the embedded ZooKeeper through
its pid file, the Ray head's processes through ``ray_pids``), and the state file is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from coordination.zk_server import pid_alive

from .. import raycompat
from ..errors import ClusterNotFoundError, KafkaError, KafkaTimeoutError

START_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 60.0
LOG_NAME = "daemon.log"


# -- the state file ----------------------------------------------------------------------------
def write_state(namespace: str, state: dict) -> None:
    path = raycompat.state_path(namespace)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def remove_state(namespace: str, pid: int | None = None) -> None:
    """Remove the state file (only if it still belongs to ``pid``, when given)."""
    state = raycompat.read_state(namespace)
    if state is None or pid is None or state.get("pid") == pid:
        for path in (raycompat.state_path(namespace), raycompat.loopback_marker_path(namespace)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _mark_loopback(namespace: str) -> None:
    """Leave the marker that makes `import ray; ray.init(address="auto")` in a new
    interpreter of this environment keep 127.0.0.1 (raycompat.loopback_marker_path)."""
    path = raycompat.loopback_marker_path(namespace)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{os.getpid()}\n")


def _pid_is_daemon(pid: int) -> bool:
    """Guard against PID reuse: the process must be our daemon."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"actors.tools.daemon" in f.read()
    except OSError:
        return False


def live_state(namespace: str) -> dict | None:
    """The state of the daemon running ``namespace``, or None (a stale file is removed)."""
    state = raycompat.read_state(namespace)
    if state is None:
        return None
    pid = state.get("pid")
    if pid_alive(pid) and _pid_is_daemon(pid):
        return state
    # The daemon died without `raykafka stop` (killed, crashed): end what it left running
    # before the state file, which holds their PIDs, goes.
    _end_leftovers(state)
    remove_state(namespace, pid)
    return None


def require_ready(namespace: str) -> dict:
    state = live_state(namespace)
    if state is None:
        raise ClusterNotFoundError(f"no raykafka cluster runs in namespace {namespace!r} "
                                   f"(start one with `raykafka start --namespace {namespace}`)")
    if state.get("status") != "ready":
        raise ClusterNotFoundError(f"the cluster in namespace {namespace!r} is "
                                   f"{state.get('status')} (pid {state.get('pid')}); try again")
    return state


# -- starting and stopping (the CLI side) ---------------------------------------------------
def default_data_dir(namespace: str) -> str:
    return os.path.join(raycompat.STATE_DIR, "data", namespace)


def start_daemon(*, namespace: str, brokers: int, data_dir: str | None, zk: str | None,
                 ray_address: str | None = None, timeout_s: float = START_TIMEOUT_S,
                 progress=None, port: int | None = None, secure: bool = False,
                 config: dict | None = None) -> dict:
    """Spawn the daemon and wait until its state file says "ready"; returns the state.
    ``config``: broker settings (Kafka's names) for ``Cluster.start``.

    ``progress(elapsed_s, status)`` is called about every half second while waiting.
    """
    if live_state(namespace) is not None:
        state = raycompat.read_state(namespace) or {}
        raise KafkaError(f"a raykafka cluster already runs in namespace {namespace!r} "
                         f"(pid {state.get('pid')}); `raykafka stop --namespace {namespace}` "
                         f"first, or use another --namespace")
    data_dir = os.path.abspath(data_dir or default_data_dir(namespace))
    os.makedirs(data_dir, exist_ok=True)
    log_file = os.path.join(data_dir, LOG_NAME)
    cmd = [sys.executable, "-m", "actors.tools.daemon", "--namespace", namespace,
           "--brokers", str(brokers), "--data-dir", data_dir]
    if zk:
        cmd += ["--zk", zk]
    if ray_address:
        cmd += ["--ray-address", ray_address]
    if port:
        cmd += ["--port", str(port)]
    if secure:
        cmd += ["--secure"]
    for key, value in (config or {}).items():
        cmd += ["--config", f"{key}={value}"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, cwd=data_dir, env=env)
    started = time.monotonic()
    deadline = started + timeout_s
    next_tick = started
    while True:
        state = raycompat.read_state(namespace)
        if state and state.get("pid") == proc.pid and state.get("status") == "ready":
            return state
        code = proc.poll()
        if code is not None:
            raise KafkaError(f"the cluster daemon exited with code {code} while starting: "
                             f"{_last_error_line(log_file)} (log: {log_file})")
        now = time.monotonic()
        if now > deadline:
            _terminate(proc.pid, timeout_s=15)
            remove_state(namespace, proc.pid)
            raise KafkaTimeoutError(f"the cluster did not become ready within {timeout_s:.0f}s "
                                    f"(log: {log_file})")
        if progress is not None and now >= next_tick:
            progress(now - started, (state or {}).get("status", "spawning"))
            next_tick = now + 0.5
        time.sleep(0.1)


def _last_error_line(log_file: str) -> str:
    """The most telling line of a failed start: the last 'SomethingError: ...' line."""
    try:
        with open(log_file, errors="replace") as f:
            lines = [ln.strip() for ln in f.readlines()[-200:] if ln.strip()]
    except OSError:
        return "(no log)"
    for ln in reversed(lines):
        if "Error" in ln.split(":", 1)[0] or ln.startswith("raykafka-daemon: failed"):
            return ln
    return lines[-1] if lines else "(empty log)"


def _terminate(pid: int, *, timeout_s: float) -> bool:
    """SIGTERM, wait, SIGKILL; True if it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if _wait_gone(pid, timeout_s):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    _wait_gone(pid, 10)
    return True


def _wait_gone(pid: int, timeout_s: float, progress=None) -> bool:
    start = time.monotonic()
    next_tick = start
    while pid_alive(pid):
        now = time.monotonic()
        if now - start > timeout_s:
            return False
        if progress is not None and now >= next_tick:
            progress(now - start)
            next_tick = now + 0.5
        time.sleep(0.05)
    return True


def stop_daemon(namespace: str, *, timeout_s: float = STOP_TIMEOUT_S, progress=None) -> dict:
    """Stop the daemon of ``namespace``; returns what was done (``killed``, ``leftovers``)."""
    state = live_state(namespace)
    if state is None:
        raise ClusterNotFoundError(f"no raykafka cluster runs in namespace {namespace!r}")
    pid = state["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    killed = False
    if not _wait_gone(pid, timeout_s, progress):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_gone(pid, 10)
        killed = True
    leftovers = _end_leftovers(state)
    remove_state(namespace, pid)
    return {"pid": pid, "killed": killed, "leftovers": leftovers}


def _end_leftovers(state: dict) -> list[str]:
    """End what a dead daemon left running, by the PIDs its state recorded: the embedded
    ZooKeeper (through its pid file) and the Ray head's processes. Returns what was ended."""
    leftovers = []
    if state.get("zk_data_dir"):
        from coordination.zk_server import EmbeddedZooKeeper
        zk = EmbeddedZooKeeper.attach(state["zk_data_dir"])
        if zk is not None:
            leftovers.append(f"zookeeper pid {zk.pid}")
            zk.stop(timeout_s=10)
    for rpid in state.get("ray_pids") or []:
        if pid_alive(rpid) and _cmdline_has(rpid, b"ray"):
            leftovers.append(f"ray pid {rpid}")
            try:
                os.kill(rpid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _wait_listeners_closed(state.get("bootstrap_servers") or "")
    return leftovers


def _wait_listeners_closed(bootstrap_servers: str, timeout_s: float = 15.0) -> bool:
    """Until nothing accepts connections on the stopped cluster's listener addresses (at
    most ``timeout_s``): a broker's worker process outlives the Ray head it belonged to by
    a moment, and a ``start --port P`` right after the stop must find P free. True when
    all are closed."""
    import socket
    addresses = []
    for entry in bootstrap_servers.split(","):
        host, _, port = entry.strip().rpartition(":")
        if host and port.isdigit():
            addresses.append((host.split("://")[-1].strip("[]"), int(port)))
    deadline = time.monotonic() + timeout_s
    while addresses and time.monotonic() < deadline:
        try:
            with socket.create_connection(addresses[0], timeout=1.0):
                pass
        except OSError:
            addresses.pop(0)           # refused (or unreachable): no listener there now
            continue
        time.sleep(0.1)
    return not addresses


def _cmdline_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


# -- the daemon itself ----------------------------------------------------------------------------
def _ray_pids() -> list[int]:
    """PIDs of the Ray head processes this daemon started (gcs, raylet, ...)."""
    try:
        node = raycompat.ray._private.worker._global_node
        return sorted({info.process.pid for infos in node.all_processes.values()
                       for info in infos if info.process is not None})
    except Exception:  # noqa: BLE001 - private API; only used to clean up after a SIGKILL
        return []


def listeners_for_port(port: int | None, attached: bool, secure: bool = False) -> dict:
    """The cluster config ``raykafka start --port P`` stands for: broker i listens on P+i
    (broker.listener_settings), on 127.0.0.1 for the local Ray, on every address of its
    node for a Ray it attached to (Kafka's ``PLAINTEXT://:P``: the node's address is what
    the broker advertises); SASL_SSL instead of PLAINTEXT with ``--secure``."""
    if not port:
        return {}
    protocol = "SASL_SSL" if secure else "PLAINTEXT"
    return {"listeners": f"{protocol}://{'' if attached else '127.0.0.1'}:{port}"}


def run_daemon(namespace: str, brokers: int, data_dir: str, zk: str | None,
               ray_address: str | None = None, port: int | None = None,
               secure: bool = False, config: dict | None = None) -> int:
    from ..cluster import Cluster
    stop = threading.Event()
    base = {"namespace": namespace, "pid": os.getpid(), "data_dir": data_dir,
            "brokers": brokers, "log_file": os.path.join(data_dir, LOG_NAME),
            "embedded_zk": zk is None, "attached_ray": ray_address is not None,
            "zk_data_dir": os.path.join(data_dir, "zookeeper") if zk is None else None,
            "started_at": time.time()}
    write_state(namespace, {**base, "status": "starting"})
    print(f"raykafka-daemon: pid {os.getpid()} starting namespace {namespace!r}, "
          f"{brokers} brokers, data {data_dir}", flush=True)
    try:
        if ray_address is not None:
            # a Ray somebody else runs (a `ray up` cluster): attach; never end its processes
            raycompat.attach(ray_address, namespace)
        else:
            # our own Ray, with the job server `ray job submit` needs (loopback, free port)
            raycompat.init_local(namespace, dashboard=True)
            _mark_loopback(namespace)
        cluster = Cluster.start(num_brokers=brokers, data_dir=data_dir, zk=zk,
                                namespace=namespace, secure=secure,
                                config={**listeners_for_port(port, ray_address is not None,
                                                             secure), **(config or {})})
    except BaseException as exc:
        print(f"raykafka-daemon: failed to start: {type(exc).__name__}: {exc}", flush=True)
        remove_state(namespace, os.getpid())
        raise
    # Ray installs its own SIGTERM handler in ray.init (it exits at once): ours replaces it
    # so that a stop is a clean shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set())
    if ray_address is None and not raycompat.wait_job_server(timeout_s=60):
        print("raykafka-daemon: warning: Ray's job server (dashboard) is not ready after 60s; "
              "`ray job submit` may fail", flush=True)
    ray = raycompat.ray
    state = {**base, "status": "ready", "ray_address": ray.get_runtime_context().gcs_address,
             "ray_auth_mode": raycompat.auth_mode(), "dashboard_url": raycompat.dashboard_url(),
             "zk_hosts": cluster.zk_hosts, "broker_ids": cluster.broker_ids(),
             "bootstrap_servers": cluster.client_config()["bootstrap.servers"],
             # where the secrets are, never the secrets: this file is not private
             "security": cluster.security_files,
             "ray_pids": [] if ray_address is not None else _ray_pids()}
    write_state(namespace, state)
    print(f"raykafka-daemon: ready: ray {state['ray_address']}, zookeeper {cluster.zk_hosts}",
          flush=True)
    while not stop.wait(1.0):
        pass
    print("raykafka-daemon: stopping", flush=True)
    write_state(namespace, {**state, "status": "stopping"})
    try:
        cluster.shutdown()
    finally:
        try:
            ray.shutdown()
        finally:
            remove_state(namespace, os.getpid())
    print("raykafka-daemon: stopped", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m actors.tools.daemon")
    p.add_argument("--namespace", required=True)
    p.add_argument("--brokers", type=int, required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--zk", default=None)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--secure", action="store_true")
    p.add_argument("--config", action="append", default=[], metavar="K=V")
    a = p.parse_args(argv)
    config = dict(item.split("=", 1) for item in a.config)
    return run_daemon(a.namespace, a.brokers, os.path.abspath(a.data_dir), a.zk,
                      a.ray_address, a.port, a.secure, config)


if __name__ == "__main__":
    sys.exit(main())
