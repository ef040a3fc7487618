"""Kafka's default key partitioner: ``murmur2(key) & 0x7fffffff`` modulo the partition count.

``murmur2`` is a bit-exact port of Java's ``org.apache.kafka.common.utils.Utils.murmur2``
(MurmurHash2, 32-bit, seed ``0x9747b28c``, little-endian 4-byte words, unsigned shifts), so
a key lands on the same partition number as with Kafka's Java client and kafka-python.
It returns Java's *signed* int32. ``to_positive`` is Java's ``Utils.toPositive`` (a mask,
not ``abs``: ``abs(MIN_VALUE)`` would stay negative).

``murmur2_many`` is the same hash over many keys at once with numpy (the producer's bulk
path): keys are laid out as rows of a zero-padded (n, ceil(max_len/4)) uint32 matrix, and
each word column is mixed in only for the rows whose key is long enough. Zero padding makes
the 1-3 trailing bytes of a key exactly the little-endian word Java folds in. Cost is one
pass of a few numpy ops per 4-byte column, so it suits keys of similar, modest lengths.

Pure functions; thread-safe.
"""

from __future__ import annotations

import struct

import numpy as np

SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def murmur2(data) -> int:
    """Java's ``Utils.murmur2(data)``: a signed 32-bit int."""
    data = bytes(data)
    length = len(data)
    h = (SEED ^ length) & _MASK32
    n4 = length // 4
    if n4:
        for k in struct.unpack_from(f"<{n4}I", data):
            k = (k * _M) & _MASK32
            k ^= k >> _R
            k = (k * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    rest = length & 3
    if rest:
        tail = length & ~3
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(h: int) -> int:
    """Java's ``Utils.toPositive``: clear the sign bit."""
    return h & 0x7FFFFFFF


def partition_for_key(key, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    return to_positive(murmur2(key)) % num_partitions


def murmur2_many(keys) -> np.ndarray:
    """``murmur2`` of every key (bytes-like, none None) as a signed int32 numpy array."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int32)
    lengths = np.fromiter(map(len, keys), np.int64, n)
    max_len = int(lengths.max())
    words = (max_len + 3) // 4
    width = max(words, 1) * 4
    joined = b"".join(keys)
    if int(lengths.min()) == max_len:
        flat = np.frombuffer(joined, np.uint8)
        if width == max_len:
            mat = flat.reshape(n, width) if max_len else np.zeros((n, 4), np.uint8)
        else:
            mat = np.zeros((n, width), np.uint8)
            mat[:, :max_len] = flat.reshape(n, max_len)
    else:
        mat = np.zeros((n, width), np.uint8)
        # row-major order of the mask is the order of the joined bytes
        mat[np.arange(width)[None, :] < lengths[:, None]] = np.frombuffer(joined, np.uint8)
    w = np.ascontiguousarray(mat).view("<u4").reshape(n, max(words, 1))
    m = np.uint32(_M)
    h = (np.uint32(SEED) ^ lengths.astype(np.uint32)).astype(np.uint32)
    full = lengths // 4
    rest = lengths & 3
    for j in range(words):
        k = w[:, j] * m
        k ^= k >> np.uint32(_R)
        k *= m
        mixed = (h * m) ^ k
        tail = (h ^ w[:, j]) * m  # the 1-3 trailing bytes (zero padded) of keys ending here
        h = np.where(full > j, mixed, np.where((full == j) & (rest > 0), tail, h))
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partitions_for_keys(keys, num_partitions: int) -> np.ndarray:
    """Kafka's default partition of every key, as an int64 numpy array."""
    return (murmur2_many(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(
        np.int64) % num_partitions
