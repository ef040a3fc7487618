#!/usr/bin/env python3
"""The floor under end-to-end latency on this machine: a message passed along a chain of
processes over Unix-domain sockets, doing nothing else (docs/dataplane.md, "The floor of a
chain of processes").

A record's end-to-end path is a chain of process wake-ups: at RF=3 acks=all the fewest any
design with a replica actor per partition can have is 8 hand-offs (producer -> leader
broker -> leader replica -> leader broker -> follower broker -> follower replica ->
follower broker -> leader broker -> consumer; the two followers in parallel); raykafka's
path today has about 14 (docs/dataplane.md, "a hop trace"). Here the driver sends an
8-byte timestamp ``--rate`` times a second into a ring of ``hops - 1`` forwarding
processes (each: read what its socket has, write it on; several messages that queued go
on as one write, as requests batch in the real path) and a reader thread in the driver
takes it back: ``hops`` hand-offs. p50 / p99 per (hops, rate), next to an empty Ray call
measured in the same run (``ray_call_p50_ms``; issue 21 asks e2e p50 <= 2 x it).

``--ray``: the forwarding processes are Ray actors (nice 0, as raykafka's), each
forwarding on a thread of its own while Ray's worker loop runs beside it, as a replica's
channel thread does.

    python benchmarks/hop_floor.py [--hops 2,4,8,14] [--rates 1000,10000] [--seconds 4] [--ray]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.common import finish, phase, ratio, say  # noqa: E402
from benchmarks.replication_bench import percentile, ray_call_ms  # noqa: E402

STAMP = struct.Struct("=q")


def _connect(path: str, deadline_s: float = 30.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


def forward(listen_path: str, next_path: str) -> None:
    """One link of the chain: accept the predecessor, connect the successor, pass on."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(listen_path)
    server.listen(1)
    out = _connect(next_path)
    conn, _ = server.accept()
    server.close()
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(buf)
        if not n:
            out.close()
            return
        out.sendall(view[:n])


class Forwarder:
    """``forward`` on a thread of a Ray actor's process."""

    def start(self, listen_path: str, next_path: str) -> bool:
        threading.Thread(target=forward, args=(listen_path, next_path), daemon=True).start()
        return True


def chain(hops: int, rates: list[int], seconds: float, use_ray: bool) -> dict:
    """Latency through ``hops`` hand-offs at each rate; the processes are started once."""
    work = tempfile.mkdtemp(prefix="raykafka-hops-")
    paths = [os.path.join(work, f"p{i}") for i in range(hops)]   # p0: the driver's
    back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    back.bind(paths[0])
    back.listen(1)
    links = []
    import ray
    if use_ray:
        remote = ray.remote(Forwarder).options(num_cpus=0)
        links = [remote.remote() for _ in range(hops - 1)]
        ray.get([a.start.remote(paths[i + 1], paths[(i + 2) % hops])
                 for i, a in enumerate(links)])
    else:
        ctx = multiprocessing.get_context("spawn")
        for i in range(hops - 1):
            p = ctx.Process(target=forward, args=(paths[i + 1], paths[(i + 2) % hops]),
                            daemon=True)
            p.start()
            links.append(p)
    out = _connect(paths[1])
    inbound, _ = back.accept()
    result = {}
    pids = [p.pid for p in links] if not use_ray else \
        ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in links])
    try:
        for rate in rates:
            cpu0 = _cpu(pids)
            lat = _run(out, inbound, rate, seconds)
            # CPU of the forwarding processes per message per process: what one
            # hand-off costs (with Ray, plus each worker's idle timer)
            used = _cpu(pids) - cpu0
            result[f"hops{hops}_{rate}_p50_ms"] = percentile(lat, 50)
            result[f"hops{hops}_{rate}_p99_ms"] = percentile(lat, 99)
            result[f"hops{hops}_{rate}_cpu_us_per_handoff"] = round(
                used / (rate * seconds) / len(pids) * 1e6, 1)
    finally:
        out.close()
        inbound.close()
        back.close()
        if use_ray:
            for a in links:
                ray.kill(a, no_restart=True)
        else:
            for p in links:
                p.join(5)
        shutil.rmtree(work, ignore_errors=True)      # the sockets' paths
    return result


def _cpu(pids: list) -> float:
    import psutil
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _run(out: socket.socket, inbound: socket.socket, rate: int, seconds: float) -> list:
    """Send ``rate`` stamps a second (paced per millisecond) for ``seconds``; the
    latencies of those after the first half second (ms)."""
    total = int(rate * seconds)
    skip = rate // 2
    lat: list[float] = []

    def read() -> None:
        pending = b""
        got = 0
        while got < total:
            data = inbound.recv(1 << 16)
            if not data:
                return
            now = time.perf_counter_ns()
            pending += data
            whole = len(pending) // 8 * 8
            for (sent,) in STAMP.iter_unpack(pending[:whole]):
                if got >= skip:
                    lat.append((now - sent) / 1e6)
                got += 1
            pending = pending[whole:]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    per_ms = max(rate // 1000, 1)
    step_ns = 1_000_000 if rate >= 1000 else 1_000_000_000 // rate
    t = time.perf_counter_ns()
    sent = 0
    while sent < total:
        t += step_ns
        delay = (t - time.perf_counter_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        n = min(per_ms, total - sent)
        now = time.perf_counter_ns()
        out.sendall(STAMP.pack(now) * n)
        sent += n
    reader.join(seconds + 30)
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hops", default="2,4,8,14")
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ray", action="store_true",
                    help="the forwarding processes are Ray actors (default: plain processes)")
    a = ap.parse_args()
    hops = [int(h) for h in a.hops.split(",")]
    if min(hops) < 2:
        ap.error("--hops: at least 2 (the driver and one forwarding process)")
    rates = [int(r) for r in a.rates.split(",")]
    t_start = time.perf_counter()
    out: dict = {"ray_actors": a.ray, "hops": hops, "rates": rates}
    import logging

    import ray

    from actors import raycompat
    raycompat.init_local("raykafka-hop-floor", logging_level=logging.WARNING)
    try:
        phase(out, "ray_call", ray_call_ms)
        for h in hops:
            phase(out, f"hops{h}", chain, h, rates, a.seconds, a.ray)
    finally:
        ray.shutdown()
    return finish(out, t_start, lambda o: None, _table)


def _table(out: dict) -> None:
    call = out.get("ray_call_p50_ms")
    say(f"empty Ray call p50 {call} ms (issue 21's e2e goal: p50 <= {2 * call:.2f} ms)"
        if call else "empty Ray call: not measured")
    say(f"{'hand-offs':>9}  " + "  ".join(f"{r:>7,}/s p50 (x call) / p99, CPU/hand-off"
                                            for r in out["rates"]))
    for h in out["hops"]:
        cells = []
        for r in out["rates"]:
            p50 = out.get(f"hops{h}_{r}_p50_ms")
            p99 = out.get(f"hops{h}_{r}_p99_ms")
            cpu = out.get(f"hops{h}_{r}_cpu_us_per_handoff")
            cells.append(f"{p50} ({ratio(p50, call)}x) / {p99}, {cpu} us".rjust(36)
                         if p50 is not None else "failed".rjust(36))
        say(f"{h:>9}  " + "  ".join(cells))


if __name__ == "__main__":
    raise SystemExit(main())
