#!/usr/bin/env python3
"""What a request costs a broker when its caches are cold (issue 21's latency goal).

At 1,000 records/s a record wakes some sixteen threads across ~30 processes on 2 vCPUs,
and each wake-up costs several times what the same code costs in a hot loop
(docs/dataplane.md, "Measured (2026-12-02)"). This script tells whether that factor is our
code doing more work on the real path, or the machine making the same work dearer: it
times ONE thing, the broker's whole Produce handling in this process (request header
decode, ``KafkaApis.handle``: body decode, ``Log.append`` of one 100-byte record, the
response encoded), always the same request, as CPU time of this thread
(``time.thread_time_ns``), between calls of five kinds:

- ``hot``: none, back to back (what ``wire_bench.py``'s in-process figures are);
- ``spin_1ms``: 1 ms of busy waiting (the CPU stays busy with this process; little of the
  cache is touched);
- ``thrash_16mib``: a read of 16 MiB of other memory (what other processes' work does to
  the caches between two of a broker's wake-ups), no sleep;
- ``sleep_1ms`` / ``sleep_10ms``: the thread sleeps, as a server's thread does between
  requests (the other processes of the machine run meanwhile).

Prints a line per kind (p50 / p90 microseconds of CPU per call) and one JSON object; each
kind's ``x_hot`` is its p50 over the hot loop's in the same run. Nothing else is started:
no Ray, no socket.

    python benchmarks/cold_handler.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from actors import wire  # noqa: E402
from actors.server.handlers import KafkaApis  # noqa: E402
from actors.server.log_backend import LogBackend  # noqa: E402
from actors.server.network import Request  # noqa: E402
from benchmarks.common import say  # noqa: E402
from storage import records  # noqa: E402

THRASH_BYTES = 16 << 20


def _produce_frame() -> bytes:
    """A Produce v9 request (acks=1, no size prefix) of one 100-byte record to events-0."""
    batch = records.build([b"x" * 100])
    header = wire.RequestHeader(0, 9, 7, "bench")
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
            "topic_data": [{"name": "events",
                            "partition_data": [{"index": 0, "records": batch}]}]}
    return wire.encode_request(header, body)[4:]


def _timed(handle_one, calls: int, between) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        between()
        t0 = time.thread_time_ns()
        handle_one()
        times.append(time.thread_time_ns() - t0)
    times.sort()
    return times[len(times) // 2] / 1000, times[int(len(times) * 0.9)] / 1000


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="each kind is timed this often")
    a = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="raykafka-cold-")
    backend = LogBackend(work)
    apis = KafkaApis(backend)
    try:
        backend.create_topic("events", 1)
        frame = _produce_frame()

        def handle_one():
            view = memoryview(frame)
            header, start = wire.decode_request_header(view)
            answer = apis.handle(Request(header, view[start:], ("127.0.0.1", 0),
                                         time.monotonic_ns()))
            assert isinstance(answer, list), answer

        other = bytearray(THRASH_BYTES)
        other_view = memoryview(other).cast("Q")

        def nothing():
            pass

        def spin():
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass

        def thrash():
            # touch one word of every 64-byte line of 16 MiB: the caches hold other data
            sum(other_view[::8])

        kinds = {"hot": (nothing, 3000), "spin_1ms": (spin, 1000),
                 "thrash_16mib": (thrash, 1000),
                 "sleep_1ms": (lambda: time.sleep(0.001), 1000),
                 "sleep_10ms": (lambda: time.sleep(0.01), 300)}
        _timed(handle_one, 2000, nothing)   # warm-up
        best: dict[str, list] = {k: [] for k in kinds}
        for _ in range(a.rounds):
            for kind, (between, calls) in kinds.items():
                best[kind].append(_timed(handle_one, calls, between))
        out = {}
        for kind, runs in best.items():
            p50 = sorted(r[0] for r in runs)[len(runs) // 2]
            p90 = sorted(r[1] for r in runs)[len(runs) // 2]
            out[f"{kind}_p50_us"], out[f"{kind}_p90_us"] = round(p50, 1), round(p90, 1)
        for kind in kinds:
            out[f"{kind}_x_hot"] = round(out[f"{kind}_p50_us"] / out["hot_p50_us"], 2)
            say(f"{kind:14s} p50 {out[f'{kind}_p50_us']:7.1f} us  p90 "
                f"{out[f'{kind}_p90_us']:7.1f} us  ({out[f'{kind}_x_hot']:.2f} x hot)")
    finally:
        apis.close()
        backend.close()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
