"""Where ``Cluster.connect`` attaches a process (raycompat.init_attach): unit tests with a
private state dir and Ray's ``init`` replaced by a recorder, no Ray started."""

from __future__ import annotations

import json
import socket
import time

import pytest

from actors import Cluster, raycompat
from actors.errors import ClusterNotFoundError

ray = raycompat.ray


@pytest.fixture
def no_ray(monkeypatch, tmp_path):
    """A process with no Ray attached, no RAY_ADDRESS, an empty state dir; ``ray.init`` and
    ``raycompat.attach`` are not called unless a test puts its recorder in."""
    monkeypatch.setattr(raycompat, "STATE_DIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def no_init(*args, **kwargs):
        raise AssertionError(f"ray.init{args or ''} {kwargs.get('address', '')} was called")
    monkeypatch.setattr(ray, "init", no_init)
    return tmp_path


def _record_attach(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(raycompat, "attach", lambda address, namespace, auth_mode=None:
                        calls.append((address, namespace, auth_mode)))
    return calls


def _write_state(state_dir, namespace: str, state: dict) -> None:
    with open(state_dir / f"{namespace}.json", "w") as f:
        json.dump(state, f)


def test_connect_without_state_or_ray_address_fails_at_once_saying_what_to_do(no_ray):
    """No state file, no RAY_ADDRESS, no Ray in the process: ClusterNotFoundError before any
    ray.init (it was ray.init("auto"): another user's Ray, or a wait of minutes), naming
    both ways to start a cluster and RAY_ADDRESS."""
    started = time.monotonic()
    with pytest.raises(ClusterNotFoundError) as info:
        Cluster.connect("nope")
    assert time.monotonic() - started < 1.0
    text = str(info.value)
    for needle in ("'nope'", "raykafka start --namespace nope", "Cluster.start",
                   "RAY_ADDRESS", str(no_ray / "nope.json")):
        assert needle in text, text


def test_a_state_file_still_starting_is_a_clear_error(no_ray):
    """A state file without a Ray address yet (the daemon is starting) and no RAY_ADDRESS:
    ClusterNotFoundError saying so, no ray.init."""
    _write_state(no_ray, "ns", {"status": "starting", "pid": 4242})
    with pytest.raises(ClusterNotFoundError, match="starting.*try again"):
        raycompat.init_attach("ns")


def test_the_state_file_address_comes_first_then_ray_address(no_ray, monkeypatch):
    """The Ray the state file records (with its auth mode) is attached to, even with
    RAY_ADDRESS set; RAY_ADDRESS is used where no state file exists (a `ray job submit`
    job)."""
    calls = _record_attach(monkeypatch)
    _write_state(no_ray, "recorded", {"status": "ready", "ray_address": "127.0.0.1:6001",
                                      "ray_auth_mode": "token"})
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    raycompat.init_attach("recorded")
    raycompat.init_attach("unrecorded")
    assert calls == [("127.0.0.1:6001", "recorded", "token"),
                     ("10.0.0.9:6379", "unrecorded", None)]


def test_a_process_attached_already_uses_its_own_ray(no_ray, monkeypatch):
    """After the process's own ray.init (or in a Ray task or actor) nothing is attached,
    with or without a state file or RAY_ADDRESS."""
    calls = _record_attach(monkeypatch)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    raycompat.init_attach("nope")
    assert calls == []


def test_a_driver_that_called_ray_init_itself_is_spared_the_worker_count_warning(
        no_ray, monkeypatch):
    """A `ray job submit` script calls ray.init, then Cluster.connect: the raylet's "worker
    processes have been started" push (which a group's member actors set off) is left out
    of its output as it is for a Ray raykafka started; Ray's other pushes still print."""
    import ray._private.worker as worker
    printed = []
    monkeypatch.setattr(worker, "print_to_stdstream",
                        lambda data, ignore_prefix: printed.append(data["lines"]))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.delenv("RAYKAFKA_VERBOSE", raising=False)
    raycompat.init_attach("nope")
    warning = ("WARNING: 30 PYTHON worker processes have been started on node: 68c7 with "
               "address: 127.0.0.1, which is 15x the maximum expected startup concurrency")
    worker.print_to_stdstream({"lines": [warning], "pid": "raylet", "is_err": False},
                              ignore_prefix=False)
    worker.print_to_stdstream({"lines": ["an actor died"], "pid": "raylet", "is_err": False},
                              ignore_prefix=False)
    assert printed == [["an actor died"]]


def test_a_dead_recorded_address_fails_fast_naming_where_it_came_from(no_ray):
    """A state file (or RAY_ADDRESS) naming an address where nothing listens fails with
    ClusterNotFoundError within a second, before ray.init (which retried it for minutes),
    saying where the address came from."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    _write_state(no_ray, "stale", {"status": "ready", "ray_address": dead})
    started = time.monotonic()
    with pytest.raises(ClusterNotFoundError, match="state file") as info:
        raycompat.init_attach("stale")
    assert time.monotonic() - started < 1.0
    assert dead in str(info.value)
