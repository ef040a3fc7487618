"""The one place that starts or attaches to Ray, with what this environment needs.

- ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray 2.60 bind its servers to loopback when
  asked for 127.0.0.1 (it must be in the environment before Ray starts its processes).
- ``ray.init(address="local")`` always starts a private instance instead of joining whatever
  else runs on the machine.
- ``Cluster.connect`` attaches to the Ray that ``raykafka start`` left running, whose address
  is in the state file ``~/.raykafka/<namespace>.json``, or to ``RAY_ADDRESS`` / "auto".
"""

from __future__ import annotations

import json
import os

from . import _rayenv  # noqa: E402,F401  (the environment Ray must see first)

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

STATE_DIR = os.path.expanduser(os.environ.get("RAYKAFKA_STATE_DIR", "~/.raykafka"))


def state_path(namespace: str) -> str:
    return os.path.join(STATE_DIR, f"{namespace}.json")


def read_state(namespace: str) -> dict | None:
    try:
        with open(state_path(namespace)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def init_local(namespace: str) -> None:
    """Use the Ray this process is attached to, or start a private local one."""
    if ray.is_initialized():
        return
    ray.init(address="local", namespace=namespace, _node_ip_address="127.0.0.1",
             include_dashboard=False, log_to_driver=False,
             object_store_memory=int(os.environ.get("RAYKAFKA_OBJECT_STORE_BYTES", 2 << 30)))


def init_attach(namespace: str) -> None:
    """Attach to a running Ray (the one ``raykafka start`` recorded, else RAY_ADDRESS/auto)."""
    if ray.is_initialized():
        return
    state = read_state(namespace)
    address = (state or {}).get("ray_address") or os.environ.get("RAY_ADDRESS") or "auto"
    attach(address, namespace)


def attach(address: str, namespace: str, **kwargs) -> None:
    """``ray.init`` a driver attached to the Ray at ``address``.

    A Ray head bound to 127.0.0.1 is only reachable through loopback, but an attaching driver
    announces (and is called back on) the machine's own address unless told otherwise: the
    attach then waits minutes for a GCS "at 192.0.2.x". Loopback heads get a loopback driver.
    """
    if address.split(":")[0] in ("127.0.0.1", "localhost"):
        kwargs.setdefault("_node_ip_address", "127.0.0.1")
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, **kwargs)
    except (ConnectionError, RuntimeError) as exc:
        from .errors import ClusterNotFoundError
        raise ClusterNotFoundError(f"no Ray cluster to attach to at {address!r}: {exc}") from None


def this_node() -> NodeAffinitySchedulingStrategy:
    """Pin an actor to the node of the caller (a broker stays with its data)."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                          soft=False)


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Pin an actor or task to ``node_id`` (hard: it waits for that node, never moves)."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
