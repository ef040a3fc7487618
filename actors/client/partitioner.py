"""Which partition a producer record goes to (an explicit ``partition`` is the producer's
business and wins over all of this).

- A user ``partitioner(key_bytes, all_partitions, available)`` when configured
  (``available`` is all partitions: the metadata seam does not say which leaders are up).
- Keyed records: ``to_positive(murmur2(key)) % num_partitions``, Kafka's hash (``murmur2``
  module), so a key lands on the same partition number as with Kafka's clients.
- Records without a key are *sticky per batch* (KIP-480): they fill one partition's batch,
  and each new batch moves to the next partition in round-robin order (from a random
  start), so a stream of null-key records covers all partitions evenly. The accumulator
  asks for the next partition when it opens a batch (``next_sticky``).
- ``assign``: the same rules for a whole ``send_batch`` at once, vectorised (murmur2 over
  numpy); keyless records are cut into contiguous slices spread round-robin.

Thread-safety: the sticky state is changed under the accumulator's lock (``send``); the
round-robin counter is an ``itertools.count`` (atomic under the GIL).
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from .murmur2 import murmur2, partitions_for_keys


class Partitioner:
    """``Partitioner(user=None)``; ``user`` is the configured partitioner callable."""

    def __init__(self, user=None):
        self.user = user
        self._sticky: dict[str, int] = {}
        self._rr = itertools.count(random.randrange(1 << 16))

    # -- one record (send) ---------------------------------------------------------------
    def partition(self, key, parts: list[int]):
        """The partition of a record with ``key`` (bytes or None) among ``parts``, or None
        for a keyless record with the default partitioner (sticky: the accumulator picks it
        under its lock). A user partitioner's answer is returned unchecked."""
        if self.user is not None:
            return self.user(key, list(parts), list(parts))
        if key is not None:
            return parts[(murmur2(key) & 0x7FFFFFFF) % len(parts)]
        return None

    def sticky_partition(self, topic: str, parts: list[int]) -> int:
        """The partition keyless records of ``topic`` currently stick to."""
        p = self._sticky.get(topic)
        if p is None or p not in parts:
            p = self.next_sticky(topic, parts)
        return p

    def next_sticky(self, topic: str, parts: list[int]) -> int:
        """Move keyless records of ``topic`` on to the next partition (a new batch)."""
        p = parts[next(self._rr) % len(parts)]
        self._sticky[topic] = p
        return p

    # -- many records (send_batch) -------------------------------------------------------
    def assign(self, keys, null_keys: bool, n: int, parts: list[int]) -> list:
        """[(partition, where)] for ``n`` records with ``keys`` (None: all keyless;
        ``null_keys``: some key is None); ``where`` is a slice or a sorted index array
        into the input, and partitions keep input order. A user partitioner's choices
        are returned unchecked."""
        if self.user is not None:
            user = self.user
            chosen = np.fromiter((user(k, list(parts), list(parts)) for k in
                                  (keys if keys is not None else itertools.repeat(None, n))),
                                 np.int64, n)
            return group_by_partition(chosen)
        if keys is not None and not null_keys:
            chosen = np.asarray(parts, np.int64)[partitions_for_keys(keys, len(parts))]
            return group_by_partition(chosen)
        if keys is not None:
            # null keys spread, non-null keys hashed
            null = np.fromiter((k is None for k in keys), bool, n)
            chosen = np.empty(n, np.int64)
            idx = np.flatnonzero(~null)
            chosen[idx] = np.asarray(parts, np.int64)[
                partitions_for_keys([keys[i] for i in idx.tolist()], len(parts))]
            nulls = np.flatnonzero(null)
            start = next(self._rr)
            chosen[nulls] = np.asarray(parts, np.int64)[
                (start + np.arange(len(nulls)) * len(parts) // max(len(nulls), 1))
                % len(parts)]
            return group_by_partition(chosen)
        start = next(self._rr)
        k = min(len(parts), max(n, 1))
        bounds = [n * i // k for i in range(k + 1)]
        return [(parts[(start + i) % len(parts)], slice(bounds[i], bounds[i + 1]))
                for i in range(k) if bounds[i + 1] > bounds[i]]


def group_by_partition(chosen: np.ndarray) -> list:
    """[(partition, sorted indexes of the records that go there)], stable order."""
    order = np.argsort(chosen, kind="stable")
    sorted_p = chosen[order]
    cuts = np.flatnonzero(sorted_p[1:] != sorted_p[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(chosen)]
    return [(int(sorted_p[a]), order[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
