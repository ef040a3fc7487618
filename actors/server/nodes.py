"""Which Ray node each broker runs on.

A broker's data lives on one machine's disk, so a broker is pinned to a node (node-affinity,
``soft=False``) and its replicas and controller candidate are pinned to the same node. The
choice, made by ``Cluster.start`` and again by ``start_broker``:

1. Candidates: the alive nodes; on a multi-node Ray the worker nodes (DESIGN.md: Ray and
   ZooKeeper on the head, one broker per worker), the head only when there is no worker.
   A single-node Ray (the embedded default) puts every broker on that node.
2. Data first: every candidate is asked (a zero-CPU task pinned to it) which
   ``<data_dir>/broker-<id>/meta.properties`` it holds. A broker whose data one node alone
   holds goes back to that node. Data seen from several nodes is on a shared filesystem
   (or all nodes are one machine), so it pins nothing.
3. The rest are spread: each to the candidate with the fewest brokers so far (ties in the
   candidates' order), which gives one broker per worker while there are enough workers.
"""

from __future__ import annotations

import os

from .. import raycompat

ray = raycompat.ray

HEAD_RESOURCE = "node:__internal_head__"
PROBE_TIMEOUT_S = 30.0
META_PROPERTIES = "meta.properties"


def choose_broker_nodes(broker_ids: list[int], candidates: list[str],
                        holders: dict[int, list[str]]) -> dict[int, str]:
    """broker id -> node id (see the module docstring; pure, for unit tests).

    ``holders[b]`` lists the candidate nodes that hold broker b's data."""
    if not candidates:
        raise ValueError("no alive Ray node to place brokers on")
    out: dict[int, str] = {}
    load = {n: 0 for n in candidates}
    for b in broker_ids:
        found = [n for n in holders.get(b, []) if n in load]
        if len(found) == 1:
            out[b] = found[0]
            load[found[0]] += 1
    for b in broker_ids:
        if b not in out:
            node = min(candidates, key=lambda n: load[n])
            out[b] = node
            load[node] += 1
    return out


def candidate_nodes() -> list[str]:
    """Alive node ids that may host brokers: the workers, else the head (sorted by id)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    workers = sorted(n["NodeID"] for n in alive if HEAD_RESOURCE not in n.get("Resources", {}))
    if workers:
        return workers
    return sorted(n["NodeID"] for n in alive)


def broker_dirs_with_meta(data_dir: str) -> list[int]:
    """Broker ids whose ``broker-<id>/meta.properties`` exists under ``data_dir`` here."""
    try:
        names = os.listdir(data_dir)
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith("broker-") and name[7:].isdigit() and \
                os.path.exists(os.path.join(data_dir, name, META_PROPERTIES)):
            out.append(int(name[7:]))
    return sorted(out)


def place_brokers(broker_ids: list[int], data_dir: str) -> dict[int, str]:
    """broker id -> node id for ``broker_ids`` on the Ray this process is attached to."""
    candidates = candidate_nodes()
    if len(candidates) == 1:
        return {b: candidates[0] for b in broker_ids}
    probe = ray.remote(num_cpus=0)(broker_dirs_with_meta)
    refs = {n: probe.options(scheduling_strategy=raycompat.on_node(n)).remote(data_dir)
            for n in candidates}
    holders: dict[int, list[str]] = {}
    reachable = []
    for node, ref in refs.items():
        try:
            found = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a node that cannot run a task hosts no broker
            ray.cancel(ref, force=True)
            continue
        reachable.append(node)
        for b in found:
            holders.setdefault(b, []).append(node)
    return choose_broker_nodes(broker_ids, reachable or candidates, holders)
