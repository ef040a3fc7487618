"""The import order of ``ray`` and ``actors`` never matters (issue 7, defect 1).

Ray 2.60 reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` (loopback binding) and ``RAY_AUTH_MODE``
(token auth) once, when it is imported; a script that imports ``ray`` before ``actors`` used
to start a Ray whose processes and driver disagreed (``InvalidAuthToken`` with
``~/.ray/auth_token`` present, servers on every interface without it). Every case runs in a
fresh interpreter with its own HOME (so whether ``~/.ray/auth_token`` exists is ours to
choose and the developer's real ``~/.ray`` is never touched) and its own RAYKAFKA_STATE_DIR.
The four Cluster.start children run two at a time, to keep the file's time modest.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_TIMEOUT_S = 300.0
PARALLEL_CHILDREN = 2  # a Ray start is CPU-bound: more at once only slows each down
# what a user's fresh shell has none of (the pytest process itself may have set some)
SCRUBBED_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAYKAFKA_STATE_DIR")

# The driver of one Cluster.start combination. argv: order ("ray" | "actors"), namespace,
# data dir.
# Prints one JSON line starting with RESULT.
START_CHILD = textwrap.dedent('''
    import json, os, sys
    ORDER, NS, DATA_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
    if ORDER == "ray":
        import ray
        from actors import Cluster
    else:
        from actors import Cluster
        import ray
    import psutil

    out = {}
    cluster = Cluster.start(num_brokers=1, namespace=NS, data_dir=DATA_DIR)
    try:
        out["gcs_address"] = ray.get_runtime_context().gcs_address
        cluster.admin().create_topic("orders", partitions=1)
        producer = cluster.producer()
        producer.send("orders", b"from-driver").get(timeout=60)
        producer.close()

        @ray.remote
        def produce_in_task(ns):
            from actors import Cluster
            p = Cluster.connect(ns).producer()
            offset = p.send("orders", b"from-task").get(timeout=60).offset
            p.close()
            return offset

        @ray.remote
        class Reader:
            def read(self, ns):
                from actors import Cluster
                records = Cluster.connect(ns).simple_consumer().fetch("orders", 0, 0)
                return [r.value.decode() for r in records]

        out["task_offset"] = ray.get(produce_in_task.remote(NS), timeout=120)
        reader = Reader.remote()
        out["actor_read"] = ray.get(reader.read.remote(NS), timeout=120)
        # every server this driver started (Ray's, its workers', ZooKeeper) listens on loopback
        listeners = set()
        for proc in psutil.Process().children(recursive=True):
            try:
                conns = proc.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            listeners |= {f"{proc.name()} {c.laddr.ip}:{c.laddr.port}" for c in conns
                          if c.status == psutil.CONN_LISTEN}
        out["listeners"] = sorted(listeners)
    finally:
        cluster.shutdown()
        ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)
''')

# `ray job submit`'s entrypoint: ray first, then actors, then Cluster.connect.
JOB_SCRIPT = textwrap.dedent('''
    import json, sys
    import ray
    from actors import Cluster
    ns = sys.argv[1]
    cluster = Cluster.connect(ns)
    producer = cluster.producer()
    offset = producer.send("jobs", b"from-job").get(timeout=60).offset
    producer.close()
    values = [r.value.decode() for r in cluster.simple_consumer().fetch("jobs", 0, offset)]
    print("JOBRESULT " + json.dumps({"offset": offset, "values": values}), flush=True)
''')

# On PYTHONPATH, makes every Python process of the CLI test import ray before anything else:
# the CLI, the daemon it spawns, and the job's driver.
RAY_FIRST_SITECUSTOMIZE = "import ray  # noqa: F401  (issue 7: ray imported before actors)\n"


def _home(tmp: str, *, token: bool) -> str:
    """A HOME with (or without) ``~/.ray/auth_token``."""
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    if token:
        os.makedirs(os.path.join(home, ".ray"))
        with open(os.path.join(home, ".ray", "auth_token"), "w") as f:
            f.write(secrets.token_hex(32))
    return home


def _env(tmp: str, home: str, *, pythonpath: tuple[str, ...] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["HOME"] = home
    env["RAYKAFKA_STATE_DIR"] = os.path.join(tmp, "state")
    env["PYTHONPATH"] = os.pathsep.join((*pythonpath, ROOT))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """End a child we started in its own session, and everything it started there."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _is_loopback(listener: str) -> bool:
    ip = listener.split(" ", 1)[1].rsplit(":", 1)[0]
    return ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1")


# -- Cluster.start in both orders, with and without a token file ---------------------------------
COMBINATIONS = [(order, token) for order in ("ray", "actors") for token in (True, False)]


def _combo_id(combo) -> str:
    order, token = combo
    return f"{order}-first-token-{'present' if token else 'absent'}"


@pytest.fixture(scope="module")
def start_results():
    """Run every combination's child, two at a time; {combination: (returncode, output)}."""
    tmp = tempfile.mkdtemp(prefix="rk-order-")
    pending = list(COMBINATIONS)
    running: dict = {}
    results = {}
    deadline = time.monotonic() + CHILD_TIMEOUT_S * len(COMBINATIONS) / PARALLEL_CHILDREN
    try:
        while pending or running:
            while pending and len(running) < PARALLEL_CHILDREN:
                combo = pending.pop(0)
                running[combo] = (_spawn_start_child(tmp, *combo), time.monotonic())
            for combo, ((proc, log), started) in list(running.items()):
                timed_out = time.monotonic() - started > CHILD_TIMEOUT_S or \
                    time.monotonic() > deadline
                if proc.poll() is None and not timed_out:
                    continue
                if proc.poll() is None:
                    _kill_group(proc)
                log.seek(0)
                results[combo] = ("timeout" if timed_out else proc.returncode, log.read())
                log.close()
                del running[combo]
            time.sleep(0.2)
        yield results
    finally:
        for (proc, log), _ in running.values():
            if proc.poll() is None:
                _kill_group(proc)
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _spawn_start_child(tmp: str, order: str, token: bool):
    d = os.path.join(tmp, _combo_id((order, token)))
    os.makedirs(d)
    script = os.path.join(d, "child.py")
    with open(script, "w") as f:
        f.write(START_CHILD)
    log = open(os.path.join(d, "out.log"), "w+")
    proc = subprocess.Popen([sys.executable, script, order, f"order-{order}",
                             os.path.join(d, "data")], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=_env(d, _home(d, token=token)),
                            cwd=d, start_new_session=True)
    return proc, log


def _result(start_results, combo) -> dict:
    code, output = start_results[combo]
    lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
    assert code == 0 and lines, f"{_combo_id(combo)} exited {code}:\n{output[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("combo", COMBINATIONS, ids=_combo_id)
def test_cluster_start_and_connect_from_a_task_and_an_actor_in_either_import_order(
        start_results, combo):
    """Cluster.start works whether ray or actors is imported first, with ~/.ray/auth_token
    present or absent; a Ray task and a Ray actor Cluster.connect to it, and a record the
    driver and the task produced is fetched back by the actor."""
    out = _result(start_results, combo)
    assert out["task_offset"] == 1
    assert out["actor_read"] == ["from-driver", "from-task"]


@pytest.mark.parametrize("combo", COMBINATIONS, ids=_combo_id)
def test_the_embedded_ray_binds_only_to_loopback_in_either_import_order(start_results, combo):
    """The Ray that Cluster.start starts (and ZooKeeper, and every worker) listens on
    127.0.0.1 only, and its GCS address is a loopback one, whatever the import order."""
    out = _result(start_results, combo)
    assert out["gcs_address"].startswith("127.0.0.1:"), out["gcs_address"]
    assert out["listeners"], "no listening socket found: the check saw nothing"
    assert [ln for ln in out["listeners"] if not _is_loopback(ln)] == []


# -- the CLI, the daemon and `ray job submit`, ray imported first everywhere ------------------
class _Daemon:
    """A `raykafka start --brokers 1` daemon run the way a user's shell runs it, with
    ~/.ray/auth_token present and ray imported before actors in every process."""

    def __init__(self, tmp: str):
        self.tmp = tmp
        site = os.path.join(tmp, "site")
        os.makedirs(site)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(RAY_FIRST_SITECUSTOMIZE)
        self.env = _env(tmp, _home(tmp, token=True), pythonpath=(site,))
        self.ns = "order-cli"
        self.state_file = os.path.join(self.env["RAYKAFKA_STATE_DIR"], f"{self.ns}.json")
        self.state: dict = {}

    def cli(self, *args, timeout=240):
        return subprocess.run([sys.executable, "-m", "actors.tools.cli", *args, "--namespace",
                               self.ns], capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.tmp)

    def script(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path


@pytest.fixture(scope="module")
def daemon():
    """The CLI's start (asserted), shared by the tests below; stopped (asserted) after."""
    d = _Daemon(tempfile.mkdtemp(prefix="rk-order-cli-"))
    try:
        started = d.cli("start", "--brokers", "1")
        assert started.returncode == 0, started.stdout + started.stderr
        with open(d.state_file) as f:
            d.state = json.load(f)
        assert d.state["ray_address"].startswith("127.0.0.1:"), d.state
        yield d
        stopped = d.cli("stop", timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not os.path.exists(d.state_file)
    finally:
        if os.path.exists(d.state_file):
            _stop_leftover_daemon(d.state_file, d.env)
        shutil.rmtree(d.tmp, ignore_errors=True)


def test_cli_daemon_and_ray_job_submit_work_with_ray_imported_first(daemon):
    """With ~/.ray/auth_token present and ray imported before actors in every process (the
    CLI, the daemon it spawns, the job's driver): `raykafka start`, `status` and `stop`
    work, and a script sent with `ray job submit` to the daemon's job server (127.0.0.1)
    runs `import ray; from actors import Cluster; Cluster.connect(...)` and round-trips a
    record."""
    state = daemon.state
    status = daemon.cli("status", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert state.get("dashboard_url", "").startswith("http://127.0.0.1:"), state
    assert state["dashboard_url"] in status.stdout, status.stdout
    created = daemon.cli("topics", "create", "jobs", "--partitions", "1",
                         "--replication-factor", "1", timeout=120)
    assert created.returncode == 0, created.stdout + created.stderr
    job = daemon.script("job.py", JOB_SCRIPT)
    # Ray's own CLI sends the cluster's token only when RAY_AUTH_MODE=token (ray 2.60
    # turns it on by itself only for `ray start`); `raykafka status` prints this line.
    submitted = _ray_job_submit(state["dashboard_url"], [sys.executable, job, daemon.ns],
                                env={**daemon.env, "RAY_AUTH_MODE": "token"}, cwd=daemon.tmp)
    lines = [ln for ln in submitted.stdout.splitlines() if ln.startswith("JOBRESULT ")]
    assert submitted.returncode == 0 and lines, (submitted.stdout[-4000:] +
                                                 submitted.stderr[-4000:] +
                                                 _tail(state["log_file"]))
    assert json.loads(lines[-1][len("JOBRESULT "):]) == {"offset": 0, "values": ["from-job"]}


# A user's own driver in a fresh shell: ray first, Ray's "auto", then Cluster.connect.
AUTO_DRIVER = textwrap.dedent('''
    import json, sys
    import ray
    ray.init(address="auto")
    from actors import Cluster
    cluster = Cluster.connect(sys.argv[1])
    cluster.admin().create_topic("drivers", partitions=1)
    with cluster.producer() as producer:
        offset = producer.send("drivers", b"from-driver").get(timeout=60).offset
    values = [r.value.decode() for r in cluster.simple_consumer().fetch("drivers", 0, 0)]
    print("DRIVERRESULT " + json.dumps({"gcs": ray.get_runtime_context().gcs_address,
                                        "offset": offset, "values": values}), flush=True)
''')


def test_a_driver_that_imports_ray_first_attaches_with_ray_init_auto(daemon):
    """A script of this environment run from a fresh shell, `import ray;
    ray.init(address="auto")` before importing actors, attaches to the private loopback Ray
    of `raykafka start` and round-trips a record (Ray would otherwise turn 127.0.0.1 into
    the machine's address and wait for ever: the environment's raykafka-loopback.pth)."""
    driver = daemon.script("driver.py", AUTO_DRIVER)
    # RAY_ADDRESS: what Ray's "auto" takes first; without it Ray scans for GCS processes and
    # may find other tests' Rays. The address goes through the same 127.0.0.1 rewrite either
    # way; with it Ray treats the address as explicit and sends its token only with
    # RAY_AUTH_MODE=token (worker.py: auth turns itself on only for an address it found).
    env = {**daemon.env, "RAY_ADDRESS": daemon.state["ray_address"], "RAY_AUTH_MODE": "token"}
    try:
        ran = subprocess.run([sys.executable, driver, daemon.ns], capture_output=True,
                             text=True, timeout=120, env=env, cwd=daemon.tmp)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the driver did not attach in 120 s: {(exc.stderr or b'')[-2000:]!r}")
    lines = [ln for ln in ran.stdout.splitlines() if ln.startswith("DRIVERRESULT ")]
    assert ran.returncode == 0 and lines, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert json.loads(lines[-1][len("DRIVERRESULT "):]) == {
        "gcs": daemon.state["ray_address"], "offset": 0, "values": ["from-driver"]}


def _ray_job_submit(dashboard_url: str, entrypoint: list[str], *, env: dict, cwd: str,
                    attempts: int = 3):
    """``ray job submit`` (blocking). Only Ray's own transient refusal, "No available agent
    ... please try again later" (its dashboard gives the head node's agent 10 s, which a
    loaded machine can exceed), is retried, a bounded number of times."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    for _ in range(attempts):
        proc = subprocess.run([ray_cli, "job", "submit", "--address", dashboard_url, "--",
                               *entrypoint], capture_output=True, text=True, timeout=240,
                              env=env, cwd=cwd)
        if "No available agent" not in proc.stdout + proc.stderr:
            return proc
    return proc


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n--- " + path + "\n" + "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _stop_leftover_daemon(state_file: str, env: dict) -> None:
    """After a failure: stop the daemon this test started (by the PIDs its state recorded)."""
    ns = os.path.basename(state_file)[:-len(".json")]
    subprocess.run([sys.executable, "-m", "actors.tools.cli", "stop", "--namespace", ns],
                   capture_output=True, timeout=120, env=env)
    if not os.path.exists(state_file):
        return
    with open(state_file) as f:
        state = json.load(f)
    for pid in [state.get("pid"), *(state.get("ray_pids") or [])]:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
