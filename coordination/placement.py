"""Replica placement for new topics and added partitions: Kafka's
AdminUtils.assignReplicasToBrokers, as seed 003 describes it.

Rack-unaware (no broker has a rack): brokers sorted by id; partition p's leader is broker
(p + start_index) % n, so leaders go round-robin from a random start; the other replicas sit
at increasing shifts from the leader, the shift growing by one after every n partitions so
followers spread too (replica_index below). With 5 brokers, 10 partitions, RF 3 and start
index 0 this gives Kafka's documented table (see tests).

Rack-aware (every broker has a rack): the same walk over a rack-alternated broker list
(racks sorted, one broker from each in turn: rack A {0,1,2}, B {3,4,5} -> 0,3,1,4,2,5), and
a follower is skipped while a rack without a replica of this partition remains, or while an
unused broker remains. Each partition therefore spans min(RF, #racks) racks.

Guarantees: no broker holds two replicas of one partition; leaders differ by at most one
between brokers when partitions are created together; deterministic for fixed start_index and
replica_shift (random otherwise). Pure functions, no ZooKeeper.
"""

from __future__ import annotations

import random
from typing import Mapping

from coordination.errors import (InvalidPartitionsError, InvalidReplicaAssignmentError,
                                 InvalidReplicationFactorError)


def replica_index(first_replica_index: int, next_replica_shift: int, replica_number: int,
                  n_brokers: int) -> int:
    """Kafka's replicaIndex: position of the (replica_number+2)-th replica in the broker list.
    The shift is in 1..n-1, so a follower never lands on the leader's slot."""
    shift = 1 + (next_replica_shift + replica_number) % (n_brokers - 1)
    return (first_replica_index + shift) % n_brokers


def rack_alternated_brokers(broker_racks: Mapping[int, str]) -> list[int]:
    """Kafka's getRackAlternatedBrokerList: racks in sorted order, brokers in id order within a
    rack, one broker per rack in turn until all are listed."""
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in sorted(broker_racks.items()):
        by_rack.setdefault(rack, []).append(broker_id)
    iterators = [iter(by_rack[r]) for r in sorted(by_rack)]
    result: list[int] = []
    rack_index = 0
    # Bounded: each pass over the racks lists at least one broker until all are listed.
    while len(result) < len(broker_racks):
        nxt = next(iterators[rack_index], None)
        if nxt is not None:
            result.append(nxt)
        rack_index = (rack_index + 1) % len(iterators)
    return result


def assign_replicas_to_brokers(brokers: Mapping[int, str | None], *, partitions: int,
                               replication_factor: int, start_index: int | None = None,
                               replica_shift: int | None = None, start_partition_id: int = 0,
                               rng: random.Random | None = None) -> dict[int, tuple[int, ...]]:
    """Place `partitions` partitions (ids start_partition_id, ...) on `brokers` (id -> rack or
    None). Returns partition -> replica list, preferred leader first.

    start_index: the broker list position of partition 0's leader (random when None).
    replica_shift: the initial follower shift (random when None; when only start_index is
    given it defaults to start_index, as Kafka's fixedStartIndex sets both).
    Raises InvalidPartitionsError, InvalidReplicationFactorError, InvalidReplicaAssignmentError.
    """
    if partitions < 1:
        raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {partitions}.")
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"Replication factor must be larger than 0, got {replication_factor}.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: "
            f"{len(brokers)}.")
    if start_partition_id < 0:
        raise ValueError(f"start_partition_id must be >= 0, got {start_partition_id}")
    rng = rng or random.Random()
    racks = {b: r for b, r in brokers.items() if r is not None}
    if racks and len(racks) != len(brokers):
        raise InvalidReplicaAssignmentError(
            "Not all brokers have rack information for replica rack aware assignment: "
            f"brokers without a rack: {sorted(set(brokers) - set(racks))}.")
    broker_list = rack_alternated_brokers(racks) if racks else sorted(brokers)
    n = len(broker_list)
    if start_index is None:
        start_index = rng.randrange(n)
        shift = rng.randrange(n) if replica_shift is None else replica_shift
    else:
        shift = start_index if replica_shift is None else replica_shift
    num_racks = len(set(racks.values())) if racks else 0
    assignment: dict[int, tuple[int, ...]] = {}
    for partition in range(start_partition_id, start_partition_id + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start_index) % n
        if racks:
            assignment[partition] = _rack_aware_replicas(
                broker_list, racks, num_racks, first, shift, replication_factor)
        else:
            assignment[partition] = tuple(
                [broker_list[first]] +
                [broker_list[replica_index(first, shift, j, n)]
                 for j in range(replication_factor - 1)])
    return assignment


def _rack_aware_replicas(broker_list: list[int], racks: Mapping[int, str], num_racks: int,
                         first: int, shift: int, replication_factor: int) -> tuple[int, ...]:
    n = len(broker_list)
    leader = broker_list[first]
    replicas = [leader]
    racks_used = {racks[leader]}
    brokers_used = {leader}
    k = 0
    for _ in range(replication_factor - 1):
        # Bounded: within n-1 consecutive k the walk visits every other broker once, and one
        # of them satisfies both conditions (replication_factor <= n).
        for _attempt in range(n * n):
            broker = broker_list[replica_index(first, shift * num_racks, k, n)]
            k += 1
            rack = racks[broker]
            if ((rack not in racks_used or len(racks_used) == num_racks)
                    and (broker not in brokers_used or len(brokers_used) == n)):
                replicas.append(broker)
                racks_used.add(rack)
                brokers_used.add(broker)
                break
        else:
            raise AssertionError("rack-aware placement found no broker: unreachable")
    return tuple(replicas)
