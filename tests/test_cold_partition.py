"""A partition is warm as soon as it is created: a replica's first requests pay no lazy
start-up (issue 7, defect 5: the first send to each new partition took ~0.4 s, almost all of
it the replica importing pandas through pyarrow on its first produce)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, tempfile
from actors.server.replica import PartitionReplica
from storage.records import build
replica = PartitionReplica("cold", 0, 0, tempfile.mkdtemp(), {})
replica.become_leader(0, [0], [0])
batch = build([b"v"] * 10, [b"k"] * 10, headers=[[("h", b"1")]] * 10)
before = set(sys.modules)
replica.produce(batch, -1, 1000)
replica.fetch(0, 1 << 20)
replica.list_offsets(-1)
print(json.dumps(sorted(set(sys.modules) - before)))
replica.stop()
"""


def test_a_replicas_first_produce_and_fetch_import_no_module():
    """In a fresh interpreter, a leader replica's first produce, fetch and list_offsets
    import no module at all (nothing lazy is left on the request path: no pyarrow, no
    pandas), so the first request costs what the second does."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr.decode()
    imported = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert imported == [], imported
