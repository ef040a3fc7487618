"""Kafka's consumer protocol: the bytes a consumer group's members exchange through the
coordinator (Kafka's ConsumerProtocolSubscription and ConsumerProtocolAssignment, from
clients/src/main/resources/common/message/ConsumerProtocol*.json). The coordinator never
reads them; the group's leader reads every member's subscription and writes each member's
assignment. raykafka's members speak it too, so a group can mix raykafka's Consumers with
confluent-kafka, kafka-python or aiokafka consumers, any of them the leader.

    subscription  version int16 (0-3; we write 2) | topics [string] |
                  user_data nullable bytes | v1+: owned_partitions [topic string,
                  partitions [int32]] | v2+: generation_id int32 | v3+: rack_id nullable
                  string
    assignment    version int16 (0-3; we write 0) | assigned_partitions [topic string,
                  partitions [int32]] | user_data nullable bytes

Non-flexible encodings: int16-length strings, int32-length bytes and int32 array counts.
A reader takes any version and ignores bytes after the fields it knows (a newer version's
additions), as Kafka's ConsumerProtocol does. raykafka's own extra, the seed's consumer
threads per topic (``streams``, read by the ``range`` assignor), travels in user_data as
JSON, only when some topic has more than one stream. Bad bytes raise ValueError.
"""

from __future__ import annotations

import json
import struct

SUBSCRIPTION_VERSION = 2
ASSIGNMENT_VERSION = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def _nullable_bytes(b: bytes | None) -> bytes:
    return _I32.pack(-1) if b is None else _I32.pack(len(b)) + bytes(b)


def _partitions(tps) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(int(partition))
    out = [_I32.pack(len(by_topic))]
    for topic in sorted(by_topic):
        ps = sorted(by_topic[topic])
        out += [_string(topic), _I32.pack(len(ps)), struct.pack(f">{len(ps)}i", *ps)]
    return b"".join(out)


class _Reader:
    def __init__(self, raw):
        self.buf = bytes(raw)
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"consumer protocol: {n} bytes wanted at byte {self.pos} of "
                             f"{len(self.buf)}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def string(self) -> str:
        return self._take(self.i16()).decode("utf-8")

    def nullable_string(self) -> str | None:
        n = self.i16()
        return None if n == -1 else self._take(n).decode("utf-8")

    def nullable_bytes(self) -> bytes | None:
        n = self.i32()
        return None if n == -1 else self._take(n)

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > len(self.buf) - self.pos:      # each item takes a byte at least
            raise ValueError(f"consumer protocol: array of {n} at byte {self.pos - 4}")
        return n

    def partitions(self) -> list[tuple[str, int]]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            out += [(topic, self.i32()) for _ in range(self.count())]
        return out

    def done(self) -> bool:
        return self.pos >= len(self.buf)


def encode_subscription(topics, *, owned=(), generation: int = -1,
                        streams: dict | None = None) -> bytes:
    """A member's JoinGroup metadata: its topics, the partitions it owns and the
    generation it owned them in (the cooperative assignor's input), and ``streams``
    (topic -> consumer threads) when any is more than 1."""
    extra = {t: int(n) for t, n in (streams or {}).items() if int(n) != 1}
    user_data = json.dumps({"streams": extra}, sort_keys=True).encode() if extra else None
    return b"".join([_I16.pack(SUBSCRIPTION_VERSION), _I32.pack(len(topics)),
                     *(_string(t) for t in topics), _nullable_bytes(user_data),
                     _partitions(owned), _I32.pack(generation)])


def decode_subscription(raw) -> dict:
    """``{"version", "topics", "owned", "generation", "streams", "user_data"}`` of any
    client's subscription (fields its version lacks: owned [], generation -1)."""
    r = _Reader(raw)
    version = r.i16()
    if version < 0:
        raise ValueError(f"consumer protocol: subscription version {version}")
    topics = [r.string() for _ in range(r.count())]
    user_data = r.nullable_bytes()
    owned, generation = [], -1
    if version >= 1 and not r.done():
        owned = r.partitions()
    if version >= 2 and not r.done():
        generation = r.i32()
    return {"version": version, "topics": topics, "owned": owned, "generation": generation,
            "streams": _streams(user_data), "user_data": user_data}


def _streams(user_data: bytes | None) -> dict:
    """raykafka's streams from user_data; other clients' user data (a sticky assignor's
    state, say) is not ours: no streams."""
    if not user_data or user_data[:1] != b"{":
        return {}
    try:
        streams = json.loads(user_data).get("streams") or {}
        return {str(t): int(n) for t, n in streams.items() if int(n) >= 1}
    except (ValueError, AttributeError, TypeError):
        return {}


def encode_assignment(partitions) -> bytes:
    """A member's SyncGroup assignment: ``[(topic, partition)]``."""
    return _I16.pack(ASSIGNMENT_VERSION) + _partitions(partitions) + _nullable_bytes(None)


def decode_assignment(raw) -> list[tuple[str, int]]:
    """The ``[(topic, partition)]`` of any client's assignment bytes (b"": nothing)."""
    if raw is None or len(raw) == 0:
        return []
    r = _Reader(raw)
    if r.i16() < 0:
        raise ValueError("consumer protocol: negative assignment version")
    return sorted(r.partitions())


__all__ = ["encode_subscription", "decode_subscription", "encode_assignment",
           "decode_assignment", "SUBSCRIPTION_VERSION", "ASSIGNMENT_VERSION"]
