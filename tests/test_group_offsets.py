"""Committed offsets as __consumer_offsets records (Kafka's key v1 / value v3 format) and
the coordinator's offset cache: load with tombstones, commit, fetch, expiry of Empty
groups' offsets, deletion; the group -> partition mapping matches Kafka's."""

from __future__ import annotations

from collections import namedtuple

import pytest

from actors.errors import CorruptRecordError, IllegalArgumentError
from actors.server.group_offsets import (CommittedOffset, OffsetCache, decode_key,
                                         decode_value, encode_key, encode_value,
                                         offsets_partition)

Rec = namedtuple("Rec", "key value")


def test_groups_map_to_the_partition_kafka_would_choose():
    """abs(String.hashCode) % partitions as Java computes it (values from Java 17 itself,
    including a hash of Integer.MIN_VALUE and a non-BMP character)."""
    java = {"a": 47, "my-group": 12, "polygenelubricants": 0, "grüppe-😀": 14,
            "console-consumer-12345": 6, "": 0}
    assert {g: offsets_partition(g, 50) for g in java} == java


def test_key_and_value_round_trip_in_kafkas_layout():
    """The key is int16 1, group, topic, int32 partition; the value int16 3, offset,
    epoch, metadata, timestamp; both decode back."""
    key = encode_key("g", "t", 7)
    assert key == b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x07"
    assert decode_key(key) == ("g", "t", 7)
    value = CommittedOffset(42, "meta", 1234, -1)
    assert decode_value(encode_value(value)) == value
    assert decode_key(b"\x00\x02\x00\x01g") is None          # group metadata: not ours


def test_corrupt_records_raise_a_typed_error():
    """A truncated key or value raises CorruptRecordError, not struct.error."""
    with pytest.raises(CorruptRecordError):
        decode_key(b"\x00\x01\x00\x09gr")
    with pytest.raises(CorruptRecordError):
        decode_value(b"\x00\x03\x00")


def test_loading_keeps_the_last_record_of_each_key_and_drops_tombstones():
    """load applies records in log order: a later commit replaces an earlier one, a
    tombstone removes the key; unload forgets the partition's groups."""
    cache = OffsetCache()
    k1, k2 = encode_key("g", "t", 0), encode_key("g", "t", 1)
    cache.load(3, [Rec(k1, encode_value(CommittedOffset(5))),
                   Rec(k2, encode_value(CommittedOffset(9))),
                   Rec(k1, encode_value(CommittedOffset(7))),
                   Rec(k2, None)])
    assert cache.fetch("g") == {("t", 0): CommittedOffset(7)}
    cache.unload(3)
    assert cache.fetch("g") == {}


def test_commit_then_fetch_and_bad_offsets():
    """commit_records builds one record per partition and apply makes them visible; an
    offset that is not an int >= 0 is refused with IllegalArgumentError."""
    cache = OffsetCache()
    offsets = {("t", 0): 10, ("t", 1): (20, "m")}
    records = OffsetCache.commit_records("g", offsets, 1000)
    assert [decode_key(k) for k, _ in records] == [("g", "t", 0), ("g", "t", 1)]
    cache.apply(0, "g", offsets, 1000)
    assert cache.fetch("g", [("t", 1), ("t", 9)]) == {("t", 1): CommittedOffset(20, "m", 1000)}
    for bad in (-1, "3", True, 1.5):
        with pytest.raises(IllegalArgumentError):
            OffsetCache.commit_records("g", {("t", 0): bad}, 1000)


def test_only_empty_groups_offsets_expire_after_the_retention():
    """expired_records names the offsets older than the retention of groups listed as
    Empty, nothing of a group with members; remove then drops them."""
    cache = OffsetCache()
    cache.apply(1, "idle", {("t", 0): 1}, 1000)
    cache.apply(2, "busy", {("t", 0): 1}, 1000)
    cache.apply(1, "fresh", {("t", 0): 1}, 9000)
    expired = cache.expired_records(10_000, 5000, empty_groups={"idle", "fresh"})
    assert expired == [("idle", 1, encode_key("idle", "t", 0))]
    cache.remove("idle")
    assert cache.groups() == ["busy", "fresh"]
    assert cache.delete_records("busy") == [encode_key("busy", "t", 0)]


def test_group_metadata_round_trips_and_is_told_apart_from_offset_keys():
    """A group-metadata record (key v2, value v3 layout) decodes to what was encoded; its
    key is not an offsets key and an offsets key is not a group key; a cut value raises
    CorruptRecordError."""
    from actors.server.group_offsets import (decode_group, decode_group_key, encode_group,
                                             encode_group_key)
    snap = {"protocol_type": "consumer", "generation": 7, "protocol": "range",
            "leader_id": "m1",
            "members": [{"member_id": "m1", "group_instance_id": None, "client_id": "c1",
                         "rebalance_timeout_ms": 300_000, "session_timeout_ms": 10_000,
                         "metadata": {"topics": ["t"], "owned": []},
                         "assignment": [["t", 0], ["t", 1]]},
                        {"member_id": "m2", "group_instance_id": "i2", "client_id": "c2",
                         "rebalance_timeout_ms": 1000, "session_timeout_ms": 6000,
                         "metadata": {"topics": ["t"]}, "assignment": []}]}
    value = encode_group(snap, 1234)
    got = decode_group(value)
    assert got.pop("state_timestamp_ms") == 1234
    for m in got["members"]:
        assert m.pop("client_host") == ""
    assert got == snap
    assert decode_group_key(encode_group_key("g")) == "g"
    assert decode_key(encode_group_key("g")) is None
    assert decode_group_key(encode_key("g", "t", 0)) is None
    with pytest.raises(CorruptRecordError):
        decode_group(value[:-3])
