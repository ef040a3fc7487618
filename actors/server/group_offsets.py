"""Committed offsets as records of ``__consumer_offsets`` (seed 002, Kafka's
GroupMetadataManager), as pure logic: the record format, and the coordinator's in-memory
cache built from those records.

Record format: Kafka's own (so the topic reads the same to anyone who knows Kafka's):

- key, OffsetCommitKey v1: int16 version = 1, string group, string topic, int32 partition
  (string = int16 length + UTF-8);
- value, OffsetCommitValue v3: int16 version = 3, int64 offset, int32 leader epoch (-1),
  string metadata, int64 commit timestamp (ms);
- a tombstone (value None) deletes the key: an expired or deleted offset. Compaction keeps
  the newest record per key, so the topic stays small.
- a group's membership, GroupMetadataKey v2: int16 version = 2, string group; value,
  GroupMetadataValue v3's layout: int16 version = 3, string protocol type, int32
  generation, nullable string protocol, nullable string leader, int64 state timestamp,
  int32 count of members, each: string member id, nullable string group instance id,
  string client id, string client host, int32 rebalance timeout, int32 session timeout,
  bytes subscription, bytes assignment (bytes = int32 length + data). Kafka's subscription
  and assignment are its ConsumerProtocol's binary; here they are the JSON of what the
  member sent (its protocol metadata) and of its assignment. Written by the coordinator
  when a generation becomes stable or the group empty, so a coordinator that takes over
  resumes the group where it was (``encode_group``, ``decode_group``).

The cache (``OffsetCache``) is what the coordinator answers OffsetFetch from. A coordinator
that becomes leader of an offsets partition ``load``s every record of it in order (the last
record of a key wins, a tombstone removes it); until that is done the partition answers
CoordinatorLoadInProgressError. ``commit_records`` builds the records of one OffsetCommit
(appended with acks=all by the caller, and only then applied with ``apply``), and
``expired_records`` the tombstones of offsets older than ``offsets.retention.minutes`` for
groups that have no members (Kafka's rule: a group's offsets expire only while it is Empty).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from ..errors import CorruptRecordError, IllegalArgumentError
from ..protocol import OFFSETS_TOPIC  # noqa: F401 - re-exported for the coordinator
KEY_VERSION = 1
VALUE_VERSION = 3
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    commit_timestamp_ms: int = -1
    leader_epoch: int = -1


def offsets_partition(group_id: str, num_partitions: int) -> int:
    """Which ``__consumer_offsets`` partition (and so which coordinator) holds a group:
    Kafka's ``abs(groupId.hashCode) % offsets.topic.num.partitions``, with Java's
    String.hashCode, so a group lands on the same partition number as in Kafka."""
    h = 0
    data = group_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    # Kafka's Utils.abs: Integer.MIN_VALUE maps to 0
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def _string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0x7FFF:
        raise IllegalArgumentError(f"string of {len(raw)} bytes is too long for the "
                                   f"offsets format (at most 32767)")
    return _I16.pack(len(raw)) + raw


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0 or pos + n > len(buf):
        raise CorruptRecordError(f"offsets record: string length {n} at byte {pos - 2}")
    return buf[pos:pos + n].decode(), pos + n


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(group) + _string(topic) + _I32.pack(partition)


def encode_value(committed: CommittedOffset) -> bytes:
    return (_I16.pack(VALUE_VERSION) + _I64.pack(committed.offset)
            + _I32.pack(committed.leader_epoch) + _string(committed.metadata)
            + _I64.pack(committed.commit_timestamp_ms))


def decode_key(buf: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an offset-commit key; None for other keys (group
    metadata, version 2), which this cache does not keep."""
    try:
        (version,) = _I16.unpack_from(buf, 0)
        if version not in (0, 1):
            return None
        group, pos = _read_string(buf, 2)
        topic, pos = _read_string(buf, pos)
        (partition,) = _I32.unpack_from(buf, pos)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"offsets record key: {exc}") from None
    return group, topic, partition


GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 3


def _nullable(value: str | None) -> bytes:
    return _I16.pack(-1) if value is None else _string(value)


def _read_nullable(buf: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = _I16.unpack_from(buf, pos)
    if n == -1:
        return None, pos + 2
    return _read_string(buf, pos)


def _bytes(raw: bytes) -> bytes:
    return _I32.pack(len(raw)) + raw


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0 or pos + n > len(buf):
        raise CorruptRecordError(f"group metadata record: bytes length {n} at byte {pos - 4}")
    return bytes(buf[pos:pos + n]), pos + n


def encode_group_key(group: str) -> bytes:
    return _I16.pack(GROUP_KEY_VERSION) + _string(group)


def decode_group_key(buf: bytes) -> str | None:
    """The group of a group-metadata key (version 2); None for other keys."""
    try:
        (version,) = _I16.unpack_from(buf, 0)
        if version != GROUP_KEY_VERSION:
            return None
        return _read_string(buf, 2)[0]
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"group metadata key: {exc}") from None


def encode_group(snapshot: dict, now_ms: int) -> bytes:
    """The value of a group-metadata record from ``GroupLogic.snapshot``."""
    out = [_I16.pack(GROUP_VALUE_VERSION), _string(snapshot.get("protocol_type") or ""),
           _I32.pack(snapshot["generation"]), _nullable(snapshot.get("protocol")),
           _nullable(snapshot.get("leader_id")), _I64.pack(now_ms),
           _I32.pack(len(snapshot["members"]))]
    for m in snapshot["members"]:
        out += [_string(m["member_id"]), _nullable(m["group_instance_id"]),
                _string(m["client_id"]), _string(m.get("client_host", "")),
                _I32.pack(m["rebalance_timeout_ms"]), _I32.pack(m["session_timeout_ms"]),
                _bytes(_opaque_value(m["metadata"])), _bytes(_opaque_value(m["assignment"]))]
    return b"".join(out)


def _opaque_value(value) -> bytes:
    """A member's protocol metadata or assignment as stored: the bytes themselves (what
    Kafka clients and raykafka's members send, and what Kafka's GroupMetadataValue holds),
    or JSON for any other value (the form raykafka's members used before the byte form)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    import json
    return json.dumps(value).encode()


def _opaque_read(raw: bytes):
    """``_opaque_value`` back. JSON text starts with '{', '[' or 'n' (null); a consumer
    protocol's bytes start with their int16 version (a 0 byte), and any bytes that do
    not parse as JSON are bytes."""
    if raw[:1] in (b"{", b"[", b"n"):
        import json
        try:
            return json.loads(raw)
        except ValueError:
            pass
    return raw


def decode_group(buf: bytes) -> dict:
    """``encode_group``'s snapshot back (``GroupLogic.restore`` takes it)."""
    try:
        (version,) = _I16.unpack_from(buf, 0)
        if version != GROUP_VALUE_VERSION:
            raise CorruptRecordError(f"group metadata value version {version}")
        protocol_type, pos = _read_string(buf, 2)
        (generation,) = _I32.unpack_from(buf, pos)
        protocol, pos = _read_nullable(buf, pos + 4)
        leader, pos = _read_nullable(buf, pos)
        (ts,) = _I64.unpack_from(buf, pos)
        (count,) = _I32.unpack_from(buf, pos + 8)
        pos += 12
        members = []
        for _ in range(count):
            member_id, pos = _read_string(buf, pos)
            instance, pos = _read_nullable(buf, pos)
            client_id, pos = _read_string(buf, pos)
            host, pos = _read_string(buf, pos)
            rebalance, session = _I32.unpack_from(buf, pos)[0], _I32.unpack_from(buf, pos + 4)[0]
            metadata, pos = _read_bytes(buf, pos + 8)
            assignment, pos = _read_bytes(buf, pos)
            members.append({"member_id": member_id, "group_instance_id": instance,
                            "client_id": client_id, "client_host": host,
                            "rebalance_timeout_ms": rebalance, "session_timeout_ms": session,
                            "metadata": _opaque_read(metadata),
                            "assignment": _opaque_read(assignment)})
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptRecordError(f"group metadata value: {exc}") from None
    return {"protocol_type": protocol_type or None, "generation": generation,
            "protocol": protocol, "leader_id": leader, "state_timestamp_ms": ts,
            "members": members}


def decode_value(buf: bytes) -> CommittedOffset:
    try:
        (version,) = _I16.unpack_from(buf, 0)
        (offset,) = _I64.unpack_from(buf, 2)
        pos = 10
        epoch = -1
        if version >= 3:
            (epoch,) = _I32.unpack_from(buf, pos)
            pos += 4
        elif version not in (0, 1, 2):
            raise CorruptRecordError(f"offsets record value version {version}")
        metadata, pos = _read_string(buf, pos)
        (ts,) = _I64.unpack_from(buf, pos)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"offsets record value: {exc}") from None
    return CommittedOffset(offset, metadata, ts, epoch)


def _split(what) -> tuple:
    """An OffsetCommit entry, ``offset`` or ``(offset, metadata)``, as (offset, metadata)."""
    return what if isinstance(what, tuple) else (what, "")


class OffsetCache:
    """group -> (topic, partition) -> CommittedOffset, for the offsets partitions this
    coordinator leads. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self._partition_of: dict[str, int] = {}       # group -> offsets partition

    def load(self, partition: int, records) -> int:
        """Apply ``records`` (objects with ``key`` and ``value``) of offsets partition
        ``partition`` in log order; returns how many offset records were applied."""
        applied = 0
        with self._lock:
            for rec in records:
                if rec.key is None:
                    continue
                key = decode_key(rec.key)
                if key is None:
                    continue
                group, topic, p = key
                self._partition_of[group] = partition
                if rec.value is None:
                    self._offsets.get(group, {}).pop((topic, p), None)
                else:
                    self._offsets.setdefault(group, {})[(topic, p)] = decode_value(rec.value)
                applied += 1
        return applied

    def unload(self, partition: int) -> None:
        """This coordinator no longer leads ``partition``: forget its groups."""
        with self._lock:
            for group in [g for g, p in self._partition_of.items() if p == partition]:
                del self._partition_of[group]
                self._offsets.pop(group, None)

    @staticmethod
    def commit_records(group: str, offsets: dict, now_ms: int) -> list[tuple[bytes, bytes]]:
        """The (key, value) records of one OffsetCommit: ``offsets`` maps (topic,
        partition) -> offset or (offset, metadata)."""
        out = []
        for (topic, partition), what in sorted(offsets.items()):
            offset, metadata = _split(what)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise IllegalArgumentError(
                    f"committed offset for {topic}-{partition} must be an int >= 0, "
                    f"got {offset!r}")
            out.append((encode_key(group, topic, int(partition)),
                        encode_value(CommittedOffset(offset, metadata or "", now_ms))))
        return out

    def apply(self, partition: int, group: str, offsets: dict, now_ms: int) -> None:
        """The records of ``commit_records`` were appended: make them visible."""
        with self._lock:
            self._partition_of[group] = partition
            cache = self._offsets.setdefault(group, {})
            for (topic, p), what in offsets.items():
                offset, metadata = _split(what)
                cache[(topic, int(p))] = CommittedOffset(offset, metadata or "", now_ms)

    def fetch(self, group: str, partitions=None) -> dict[tuple[str, int], CommittedOffset]:
        with self._lock:
            cache = self._offsets.get(group, {})
            if partitions is None:
                return dict(cache)
            return {tp: cache[tp] for tp in partitions if tp in cache}

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(g for g, o in self._offsets.items() if o)

    def expired_records(self, now_ms: int, retention_ms: int, empty_groups: set
                        ) -> list[tuple[str, int, bytes]]:
        """Tombstones ``(group, offsets partition, key)`` of the offsets of Empty groups
        committed more than ``retention_ms`` ago."""
        out = []
        with self._lock:
            for group in sorted(empty_groups):
                for (topic, p), c in sorted(self._offsets.get(group, {}).items()):
                    if c.commit_timestamp_ms >= 0 and now_ms - c.commit_timestamp_ms \
                            > retention_ms:
                        out.append((group, self._partition_of[group],
                                    encode_key(group, topic, p)))
        return out

    def delete_records(self, group: str, partitions=None) -> list[bytes]:
        """Tombstone keys for the group's offsets (all, or ``partitions``)."""
        with self._lock:
            cache = self._offsets.get(group, {})
            keys = sorted(cache) if partitions is None else sorted(
                tp for tp in partitions if tp in cache)
        return [encode_key(group, t, p) for t, p in keys]

    def remove(self, group: str, partitions=None) -> None:
        """The tombstones of ``delete_records`` / ``expired_records`` were appended."""
        with self._lock:
            cache = self._offsets.get(group, {})
            for tp in (list(cache) if partitions is None else partitions):
                cache.pop(tp, None)
            if not cache:
                self._offsets.pop(group, None)
