"""Kafka's default partitioner hash: bit-exact with Java's Utils.murmur2 (no Ray needed)."""

import random

import numpy as np
import pytest

from actors.client.murmur2 import (murmur2, murmur2_many, partition_for_key, partitions_for_keys,
                            to_positive)

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed Java ints), plus the empty key
UTILS_TEST_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}

# kafka-python's test_partitioner.test_murmur2_java_compatibility: partition of 1000,
# "compared with output from Kafka's org.apache.kafka.clients.producer.Partitioner"
PARTITION_VECTORS_1000 = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566,
                          b"\x00 ": 742}


@pytest.mark.parametrize("key,expected", sorted(UTILS_TEST_VECTORS.items()))
def test_murmur2_matches_kafka_utils_test(key, expected):
    """murmur2 returns exactly Java's signed int for Kafka's own test vectors."""
    assert murmur2(key) == expected
    assert murmur2(bytearray(key)) == expected


@pytest.mark.parametrize("key,expected", sorted(PARTITION_VECTORS_1000.items()))
def test_partition_matches_java_partitioner(key, expected):
    """toPositive(murmur2(key)) % 1000 is the partition Kafka's Java partitioner picks."""
    assert partition_for_key(key, 1000) == expected
    assert int(partitions_for_keys([key], 1000)[0]) == expected


def test_to_positive_is_a_mask_not_abs():
    """toPositive clears the sign bit (Java's Utils.toPositive), so MIN_VALUE maps to 0."""
    assert to_positive(-(2 ** 31)) == 0
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-790332482) == 1357151166


def test_vectorised_equals_scalar_on_random_keys():
    """murmur2_many agrees with murmur2 on random keys of every length 0..70 and any bytes."""
    rnd = random.Random(1234)
    keys = [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 70)))
            for _ in range(3000)]
    keys += list(UTILS_TEST_VECTORS)
    got = murmur2_many(keys)
    assert got.dtype == np.int32
    assert got.tolist() == [murmur2(k) for k in keys]


def test_vectorised_uniform_lengths_and_partitions():
    """The uniform-length fast path (with and without padding) and the partition helper
    agree with the scalar functions."""
    for width in (0, 3, 4, 8, 13):
        keys = [bytes(random.Random(width * 1000 + i).getrandbits(8) for _ in range(width))
                for i in range(500)]
        assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]
        assert partitions_for_keys(keys, 7).tolist() == [partition_for_key(k, 7)
                                                         for k in keys]
    assert murmur2_many([]).tolist() == []
