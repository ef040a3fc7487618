"""The one place that starts or attaches to Ray, with what this environment needs.

Everything Ray needs from us is passed at ``ray.init`` time, never left to the environment
of the moment Ray was imported, so the import order of ``ray`` and ``actors`` does not matter
(issue 7; docs/ray-notes.md has the Ray 2.60 source lines behind each step):

- loopback: a Ray we start binds to 127.0.0.1 only. Ray decides that from
  ``ray_constants.ENABLE_RAY_CLUSTER`` (read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` at
  import): when true, ``services.get_node_ip_address`` turns "127.0.0.1" into the machine's
  address and the GCS and raylet listen on every interface. ``_loopback`` sets both the
  constant of this driver and the variable its Ray processes inherit.
- token auth: the driver's mode lives in the C++ ``RayConfig``, read from ``RAY_AUTH_MODE``
  when ``ray._raylet`` loads. ``_reconcile_auth`` re-reads it (``Config.initialize``, what
  Ray itself does when it turns token auth on) whenever the variable and the cached mode
  disagree, and, attaching to an explicit address (where Ray never looks for a token
  itself), turns token mode on when the cluster is known to use it or a token is available.
- ``ray.init(address="local")`` always starts a private instance instead of joining whatever
  else runs on the machine.
- ``Cluster.connect`` attaches to the Ray that ``raykafka start`` left running, whose address
  (and auth mode) is in the state file ``~/.raykafka/<namespace>.json``, or to
  ``RAY_ADDRESS``; with neither it fails at once (``attach_address``), never tries Ray's
  "auto" (on a shared machine: another user's Ray, or a wait of minutes for one that is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from . import _rayenv

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

STATE_DIR = os.path.expanduser(os.environ.get("RAYKAFKA_STATE_DIR", "~/.raykafka"))
AUTH_MODE_ENV = "RAY_AUTH_MODE"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def state_path(namespace: str) -> str:
    return os.path.join(STATE_DIR, f"{namespace}.json")


def loopback_marker_path(namespace: str) -> str:
    """Present while the daemon of ``namespace`` runs a private Ray on 127.0.0.1. The
    ``raykafka-loopback.pth`` that scripts/install.sh puts in the environment's
    site-packages looks for any such file at interpreter start and then sets
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (unless set already), before a script can
    ``import ray``: without it, ``import ray; ray.init(address="auto")`` turns 127.0.0.1
    into the machine's address and waits for ever for a GCS that only listens on loopback
    (docs/ray-notes.md)."""
    return os.path.join(STATE_DIR, f"{namespace}.loopback")


def read_state(namespace: str) -> dict | None:
    try:
        with open(state_path(namespace)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


#: The niceness of the workers of a Ray raykafka starts (Ray's default is 15).
WORKER_NICENESS = 0


def init_local(namespace: str, *, dashboard: bool = False, **kwargs) -> None:
    """Use the Ray this process is attached to, or start a private local one on 127.0.0.1.

    ``dashboard=True`` also starts Ray's dashboard (the job server ``ray job submit`` talks
    to) on 127.0.0.1 at a free port; ``dashboard_url()`` tells where.
    """
    if ray.is_initialized():
        _hook_driver_messages()
        return
    _rayenv.for_ray_we_start()
    _loopback()
    _reconcile_auth()
    kwargs.setdefault("log_to_driver", False)
    _quiet(kwargs)
    kwargs.setdefault("object_store_memory",
                      int(os.environ.get("RAYKAFKA_OBJECT_STORE_BYTES", 2 << 30)))
    # Ray starts its workers at nice 15, below every ordinary process: a broker or replica
    # actor then loses the CPU to any busy client on the machine and its latency becomes
    # the client's (acks=all at RF=3 went from ~30 ms to over a second beside a polling
    # consumer; docs/dataplane.md "Niceness"). Servers run at the priority of their clients.
    kwargs["_system_config"] = {"worker_niceness": WORKER_NICENESS,
                                **(kwargs.get("_system_config") or {})}
    if dashboard:
        kwargs.update(include_dashboard=True, dashboard_host="127.0.0.1",
                      dashboard_port=_free_loopback_port())
    else:
        kwargs["include_dashboard"] = False
    with _agent_port(_free_loopback_port() if dashboard else None):
        ray.init(address="local", namespace=namespace, _node_ip_address="127.0.0.1", **kwargs)


@contextlib.contextmanager
def _agent_port(port: int | None):
    """Within: the Ray that ``ray.init`` starts puts its dashboard agent's HTTP server (the
    one that runs a ``ray job submit``) on ``port`` instead of Ray's fixed 52365.

    ray.init (Ray 2.60) takes no such argument and always asks for 52365: with any other
    Ray on the machine holding it (another session's, a killed daemon's agent not yet
    gone), the agent runs without its HTTP service and the job server never becomes ready
    (`raykafka start` waited its 60 s for it, then `ray job submit` failed). ``ray start``
    has ``--dashboard-agent-listen-port``; here the RayParams that ray.init builds get it."""
    if port is None:
        yield
        return
    from ray._private import parameter
    original = parameter.RayParams

    def with_agent_port(*args, **kw):
        kw.setdefault("dashboard_agent_listen_port", port)
        return original(*args, **kw)

    parameter.RayParams = with_agent_port
    try:
        yield
    finally:
        parameter.RayParams = original


def init_attach(namespace: str) -> None:
    """Attach this process to the Ray of ``namespace``'s cluster, unless it is attached
    already (a driver that called ``ray.init`` itself; a Ray task or actor): the Ray the
    state file of ``raykafka start`` records, else ``RAY_ADDRESS`` (``attach_address``)."""
    if ray.is_initialized():
        # A driver that called ray.init itself (a `ray job submit` script) gets the
        # raylet's worker-count warning too, as soon as a group's member actors start.
        _hook_driver_messages()
        return
    from .errors import ClusterNotFoundError
    state = read_state(namespace)
    address = attach_address(namespace, state, os.environ.get("RAY_ADDRESS"))
    try:
        attach(address, namespace, auth_mode=(state or {}).get("ray_auth_mode"))
    except ClusterNotFoundError as exc:
        source = (f"the state file {state_path(namespace)}"
                  if (state or {}).get("ray_address") == address else "RAY_ADDRESS")
        raise ClusterNotFoundError(f"{exc} (the address is from {source})") from None


def attach_address(namespace: str, state: dict | None, ray_address_env: str | None) -> str:
    """Where a process with no Ray yet attaches for ``namespace``: the Ray address in its
    state file (``state``; the ``raykafka start`` daemon writes it once ready, on a
    ``ray up`` head too), else ``RAY_ADDRESS`` (``ray_address_env``; what Ray sets for a
    ``ray job submit`` job). Raises ClusterNotFoundError with neither.

    Never Ray's "auto": it takes whichever Ray last started on this machine (Ray's
    ``/tmp/ray/ray_current_cluster``), on a shared machine another user's, and waits
    minutes when that Ray is gone. Whoever wants it says so: ``RAY_ADDRESS=auto``."""
    from .errors import ClusterNotFoundError
    if state and state.get("ray_address"):
        return state["ray_address"]
    if ray_address_env:
        return ray_address_env
    if state:
        raise ClusterNotFoundError(f"the cluster in namespace {namespace!r} is "
                                   f"{state.get('status')} (pid {state.get('pid')}), not "
                                   f"ready yet; try again")
    raise ClusterNotFoundError(not_found_message(namespace))


def not_found_message(namespace: str) -> str:
    """What to do when nothing says where ``namespace``'s cluster runs (one line)."""
    return (f"no raykafka cluster runs in namespace {namespace!r} as far as this machine "
            f"knows: no state file {state_path(namespace)} (`raykafka start` writes it) and "
            f"RAY_ADDRESS is not set; start one with `raykafka start --namespace {namespace}` "
            f"(or Cluster.start(namespace={namespace!r})), or set RAY_ADDRESS to the address "
            f"of the Ray it runs on")


def attach(address: str, namespace: str, *, auth_mode: str | None = None, **kwargs) -> None:
    """``ray.init`` a driver attached to the Ray at ``address``.

    A Ray head bound to 127.0.0.1 is only reachable through loopback, but an attaching driver
    announces (and is called back on) the machine's own address unless told otherwise: the
    attach then waits minutes for a GCS "at 192.0.2.x". Loopback heads get a loopback driver.
    ``auth_mode`` ("token" / "disabled") is the cluster's, when known (the state file has it).
    """
    _require_listening(address)
    if address.split(":")[0] in LOOPBACK_HOSTS:
        _loopback()
        kwargs.setdefault("_node_ip_address", "127.0.0.1")
    _reconcile_auth(attaching=address not in ("auto", ""), cluster_mode=auth_mode)
    _quiet(kwargs)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, **kwargs)
    except (ConnectionError, RuntimeError) as exc:
        from .errors import ClusterNotFoundError
        raise ClusterNotFoundError(f"no Ray cluster to attach to at {address!r}: {exc}") from None


#: How long ``attach`` waits for a TCP connection to a GCS before calling its address dead.
GCS_PROBE_TIMEOUT_S = 5.0


def _require_listening(address: str) -> None:
    """ClusterNotFoundError at once when nothing accepts a TCP connection at a
    ``host:port`` GCS address (a stale state file, a wrong RAY_ADDRESS): ``ray.init``
    retries it for minutes (127.0.0.1:1 with Ray 2.60: still retrying when ``timeout 200``
    ended it). "auto" and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=GCS_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        from .errors import ClusterNotFoundError
        raise ClusterNotFoundError(f"no Ray answers at {address!r} "
                                   f"({exc.strerror or type(exc).__name__})") from None


def ray_messages_to_stderr() -> None:
    """Print what Ray pushes to this driver (the raylet's warnings, a task's or actor's
    error) on stderr. Ray prints them on ``sys.stdout`` (``worker.print_to_stdstream``
    with ``is_err`` False) even with ``log_to_driver=False``, which mixes them into the
    data of a command whose output is data (``raykafka consume``, ``perf --json``)."""
    _driver_messages["to_stderr"] = True
    _hook_driver_messages()


#: Messages Ray pushes to a driver that point at nothing wrong here, left out unless
#: RAYKAFKA_VERBOSE: the raylet's "N PYTHON worker processes have been started", which it
#: sends whenever the node's worker processes (idle task workers included) pass 4, 5,
#: 6, ... times its CPU count (ray 2.60 src/ray/raylet/worker_pool.cc, WarnAboutSize):
#: one actor per partition replica (DESIGN.md) passes 4x on a 2-CPU machine with 8
#: (docs/ray-notes.md). Every other message (a dead actor, a failed task, memory) stays.
QUIET_DRIVER_MESSAGES = ("worker processes have been started on node",)
_driver_messages = {"to_stderr": False}


def _hook_driver_messages() -> None:
    """Route Ray's messages to this driver through ``_driver_message`` (once)."""
    import ray._private.worker as worker
    if getattr(worker.print_to_stdstream, "__raykafka__", False):
        return
    original = worker.print_to_stdstream

    def print_to_stdstream(data, ignore_prefix):
        data = _driver_message(data)
        if data is not None:
            return original(data, ignore_prefix)
    print_to_stdstream.__wrapped__ = original
    print_to_stdstream.__raykafka__ = True
    worker.print_to_stdstream = print_to_stdstream


def _driver_message(data: dict) -> dict | None:
    """One push of Ray's to this driver as it is to be printed (None: nothing to print)."""
    lines = list(data.get("lines") or ())
    if not _rayenv.verbose():
        lines = [line for line in lines
                 if not any(quiet in line for quiet in QUIET_DRIVER_MESSAGES)]
        if not lines:
            return None
    return dict(data, lines=lines, is_err=data.get("is_err") or _driver_messages["to_stderr"])


class _QuietRecords:
    """A logging filter: drops the records of Ray's that say nothing wrong: the notice
    that token authentication is on (Ray's default; raykafka's loopback Ray uses it).
    "Token authentication is disabled", a warning about security, is kept."""
    PREFIXES = ("Token authentication is enabled for this Ray cluster",)

    @classmethod
    def filter(cls, record) -> bool:
        return not str(record.msg).startswith(cls.PREFIXES)


def _quiet(kwargs: dict) -> None:
    """Unless RAYKAFKA_VERBOSE: ``ray.init``'s own INFO lines ("Started a local Ray
    instance") off, the notices of ``_QuietRecords`` and ``QUIET_DRIVER_MESSAGES`` left out.
    A ``logging_level`` given by the caller wins."""
    import logging
    _hook_driver_messages()
    if _rayenv.verbose():
        return
    kwargs.setdefault("logging_level", logging.WARNING)
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if _QuietRecords not in logger.filters:
        logger.addFilter(_QuietRecords)


def auth_mode() -> str:
    """This process's Ray auth mode as ``RAY_AUTH_MODE`` spells it: "token" or "disabled"."""
    from ray._raylet import AuthenticationMode, get_authentication_mode
    return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"


def dashboard_url() -> str | None:
    """``http://host:port`` of the dashboard (job server) of the Ray this driver is on."""
    url = ray._private.worker.get_dashboard_url() if ray.is_initialized() else None
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def wait_job_server(timeout_s: float = 60.0) -> bool:
    """Wait until this Ray's dashboard can take a ``ray job submit``; False at the deadline.

    The dashboard answers a submission with "500 No available agent" until it has recorded
    the head node and that node's dashboard agent (which runs the job) has registered its
    address, each in Ray's internal KV (ray 2.60: dashboard/modules/job/job_head.py,
    ``_get_head_node_agent_once``); that comes some seconds after ``ray.init`` returns.
    """
    from ray._private import ray_constants
    from ray.dashboard.consts import DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX
    from ray.experimental.internal_kv import _internal_kv_get
    deadline = time.monotonic() + timeout_s
    while True:
        head = _internal_kv_get(ray_constants.KV_HEAD_NODE_ID_KEY,
                                namespace=ray_constants.KV_NAMESPACE_JOB)
        if head and _internal_kv_get(f"{DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX}{head.decode()}",
                                     namespace=ray_constants.KV_NAMESPACE_DASHBOARD):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


# -- reconciling what Ray read at import ---------------------------------------------------------
def _loopback() -> None:
    """This driver and the Ray processes started from it keep 127.0.0.1 as 127.0.0.1.

    ``ray_constants.ENABLE_RAY_CLUSTER`` was computed when Ray was imported; with ``ray``
    imported before ``actors`` it is True whatever the environment says now. Ray reads it at
    call time as ``ray_constants.ENABLE_RAY_CLUSTER`` (services.get_node_ip_address), so
    setting the attribute takes effect; the variable reaches the processes Ray spawns.
    """
    _rayenv.loopback()
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False


def _reconcile_auth(*, attaching: bool = False, cluster_mode: str | None = None) -> None:
    """Make this driver's token-auth mode what the Ray processes (started or attached to) use.

    Starting: with ``RAY_AUTH_MODE`` unset, ``ray.init`` turns token auth on by itself and
    refreshes its config (worker.py: ``enable_token_auth_by_default``); nothing to do unless
    the variable was set after Ray read it. Attaching to an explicit address, Ray never
    turns token mode on by itself (worker.py: only for address None/"auto"), so the driver
    would send no token: use the cluster's recorded mode, else "token" when a token is
    available (the rule Ray applies to "auto"). A mode set in the environment is respected.
    """
    from ray._raylet import AuthenticationTokenLoader, Config
    if attaching and AUTH_MODE_ENV not in os.environ:
        if cluster_mode in ("token", "disabled"):
            os.environ[AUTH_MODE_ENV] = cluster_mode
        elif AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
            os.environ[AUTH_MODE_ENV] = "token"
    wanted = os.environ.get(AUTH_MODE_ENV)
    if wanted is not None and wanted.lower() != auth_mode():
        # RayConfig was read before the variable was set (Ray imported first): re-read it,
        # as ray's own _enable_token_auth does.
        Config.initialize("")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def this_node() -> NodeAffinitySchedulingStrategy:
    """Pin an actor to the node of the caller (a broker stays with its data)."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                          soft=False)


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Pin an actor or task to ``node_id`` (hard: it waits for that node, never moves)."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def holds_own_name(name: str, namespace: str) -> bool:
    """Whether the calling actor is still the live actor Ray knows by ``name``.

    ``ray.kill`` reaches the GCS at once and the process only later: between the two, a
    killed actor's threads go on running. The GCS releases the name when it marks the actor
    dead, so a thread about to act for its actor (start a successor, take a role) can ask
    whether anything is left to act for. False also when the name now belongs to another
    actor (a successor). When the GCS cannot be asked, Ray's error is raised: neither
    answer is known."""
    me = ray.get_runtime_context().get_actor_id()
    if me is None:
        return False
    try:
        holder = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return holder._actor_id.hex() == me
