"""Admin: topics and leadership, as API.md names them.

Requests go to any live broker, which validates them and writes ZooKeeper; the controller
acts on what is written. Calls that change the cluster wait (with a timeout) until the change
is visible in the metadata, so a topic is usable when ``create_topic`` returns.
"""

from __future__ import annotations

import random
import time

from .. import raycompat
from ..protocol import validate_topic_name
from ..errors import (KafkaError, KafkaTimeoutError, NoBrokersAvailable,
                     UnknownTopicOrPartitionError)

ray = raycompat.ray

ADMIN_TIMEOUT_S = 60.0


class Admin:
    def __init__(self, cluster, *, timeout_s: float = ADMIN_TIMEOUT_S):
        self.cluster = cluster
        self.timeout_s = timeout_s

    def _call(self, method: str, *args):
        """Call ``method`` on a live broker; typed errors from the broker pass through."""
        ids = self.cluster.broker_ids()
        random.shuffle(ids)
        last: BaseException | None = None
        for bid in ids:
            try:
                handle = self.cluster.broker(bid)
            except ValueError as exc:
                last = exc
                continue
            try:
                return ray.get(getattr(handle, method).remote(*args), timeout=self.timeout_s)
            except KafkaError:
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                last = exc
                continue
        raise NoBrokersAvailable(f"no broker answered {method} ({last!r})")

    # -- topics ------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None) -> None:
        validate_topic_name(name)
        if config is not None and not isinstance(config, dict):
            from ..errors import InvalidConfigurationError
            raise InvalidConfigurationError(f"config must be a dict, got {type(config).__name__}")
        self._call("create_topic", name, partitions, replication_factor, config)
        self.cluster.metadata.wait_for_leaders(name, timeout_s=self.timeout_s)

    def delete_topic(self, name: str) -> None:
        self._call("delete_topic", name)
        self.cluster.metadata.wait_for_leaders(name, timeout_s=self.timeout_s, exists=False)
        deadline = time.monotonic() + self.timeout_s
        while self._call("topic_exists", name):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"topic {name!r} not deleted after {self.timeout_s}s")
            time.sleep(0.05)

    def list_topics(self) -> list[str]:
        return sorted(self._call("list_topics"))

    def alter_topic_config(self, name: str, config: dict) -> dict:
        return self._call("alter_topic_config", name, config)

    def topic_config(self, name: str) -> dict:
        return self._call("topic_config", name)

    def describe_topic(self, name: str) -> list[dict]:
        validate_topic_name(name)
        parts = self.cluster.metadata.refresh().get("topics", {}).get(name)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        out = []
        for p in sorted(parts):
            st = parts[p]
            row = {"topic": name, "partition": p, "leader": st["leader"],
                   "replicas": list(st["replicas"]), "isr": list(st["isr"]),
                   "leader_epoch": st["leader_epoch"], "log_start_offset": None,
                   "high_watermark": None, "log_end_offset": None}
            if st["leader"] >= 0:
                try:
                    ref = self.cluster.metadata.leader(name, p)
                    state = ray.get(ref.handle.state.remote(), timeout=self.timeout_s)
                    row.update(log_start_offset=state["log_start_offset"],
                               high_watermark=state["high_watermark"],
                               log_end_offset=state["log_end_offset"])
                except (KafkaError, ray.exceptions.RayActorError,
                        ray.exceptions.GetTimeoutError):
                    pass
            out.append(row)
        return out

    # -- leadership ------------------------------------------------------------------------------
    def elect_preferred_leaders(self, topic: str | None = None) -> None:
        topics = self.cluster.metadata.refresh().get("topics", {})
        if topic is not None and topic not in topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        partitions = [(t, p) for t, parts in topics.items() if topic in (None, t)
                      for p in parts]
        self._call("elect_preferred_leaders", partitions)
        deadline = time.monotonic() + self.timeout_s
        while True:
            snap = self.cluster.metadata.refresh().get("topics", {})
            pending = [(t, p) for t, p in partitions
                       if snap.get(t, {}).get(p, {}).get("replicas")
                       and snap[t][p]["replicas"][0] in snap[t][p]["isr"]
                       and snap[t][p]["leader"] != snap[t][p]["replicas"][0]]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"preferred leaders not elected for {pending[:5]}")
            time.sleep(0.1)

    def reassign_partitions(self, plan: dict) -> None:
        from ..errors import IllegalStateError
        raise IllegalStateError("partition reassignment needs replication, which is not "
                                "built yet")

    # -- groups (consumer groups are built by a later issue) -----------------------------------
    def list_groups(self) -> list[str]:
        return []
