#!/usr/bin/env python3
"""What one copy of the data costs this machine's kernel: the floor under every hop a
replicated byte takes (docs/dataplane.md, "what bounds RF=3 / RF=1 on one machine").

Measured in this process, 1 MiB at a time: ``uds_cpu_s_per_GB`` (a Unix-domain socket pair,
one thread sending, one receiving into a reused buffer: both ends' CPU) and
``page_cache_write_cpu_s_per_GB`` (appending to a new file in ``--dir``). The last line is
one JSON object.

    python benchmarks/copy_cost.py [--gb 1] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import tempfile
import threading
import time

CHUNK = 1 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def uds_cost(chunks: int) -> dict:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    data = memoryview(os.urandom(CHUNK))

    def receive() -> None:
        view = memoryview(bytearray(CHUNK))
        got = 0
        while got < chunks * CHUNK:
            got += b.recv_into(view)

    reader = threading.Thread(target=receive)
    c0, t0 = _cpu(), time.perf_counter()
    reader.start()
    for _ in range(chunks):
        a.sendall(data)
    reader.join()
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    a.close()
    b.close()
    gb = chunks * CHUNK / 1e9
    return {"uds_cpu_s_per_GB": round(cpu / gb, 3), "uds_GB_per_s": round(gb / wall, 2)}


def write_cost(chunks: int, directory: str) -> dict:
    data = memoryview(os.urandom(CHUNK))
    fd, path = tempfile.mkstemp(prefix="copy-cost-", dir=directory)
    try:
        c0, t0 = _cpu(), time.perf_counter()
        for _ in range(chunks):
            os.write(fd, data)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
    finally:
        os.close(fd)
        os.unlink(path)
    gb = chunks * CHUNK / 1e9
    return {"page_cache_write_cpu_s_per_GB": round(cpu / gb, 3),
            "page_cache_write_GB_per_s": round(gb / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="data per measurement (GB)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the file is written")
    a = ap.parse_args()
    chunks = max(int(a.gb * 1e9 / CHUNK), 1)
    out = {**uds_cost(chunks), **write_cost(chunks, a.dir)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
