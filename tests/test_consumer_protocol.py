"""actors.client.consumer_protocol against kafka-python 3.0's ConsumerProtocol classes (the
oracle): what raykafka's members send, a Kafka client leading the group reads; what Kafka
clients send at every version, raykafka's leader reads; and bad bytes raise ValueError."""

import pytest

from actors.client.consumer_protocol import (decode_assignment, decode_subscription,
                                             encode_assignment, encode_subscription)

meta = pytest.importorskip("kafka.protocol.consumer.metadata")
S, A = meta.ConsumerProtocolSubscription, meta.ConsumerProtocolAssignment


def test_our_subscription_and_assignment_read_by_kafka_python():
    """Our subscription (v2: topics, streams in user_data, owned partitions, generation)
    and assignment decode in kafka-python to the same values."""
    d = S.decode(encode_subscription(["b", "a"], owned=[("a", 1), ("b", 0), ("a", 0)],
                                     generation=7, streams={"a": 2, "b": 1}))
    assert (d.version, d.topics, d.generation_id) == (2, ["b", "a"], 7)
    assert [(tp.topic, tp.partitions) for tp in d.owned_partitions] == [("a", [0, 1]),
                                                                        ("b", [0])]
    assert d.user_data == b'{"streams": {"a": 2}}'
    assert S.decode(encode_subscription(["a"])).user_data is None   # no streams: no data
    a = A.decode(encode_assignment([("t", 2), ("u", 0), ("t", 1)]))
    assert [(tp.topic, tp.partitions) for tp in a.assigned_partitions] == [("t", [1, 2]),
                                                                          ("u", [0])]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_clients_subscriptions_and_assignments_read_at_every_version(version):
    """kafka-python's subscription at v0-3 (fields a version lacks: owned [], generation
    -1; foreign user data: no streams) and its assignments decode to the same values."""
    fields = {"topics": ["x", "y"], "user_data": b"\x00\x01sticky"}
    if version >= 1:
        fields["owned_partitions"] = [S.TopicPartition(topic="x", partitions=[2, 1])]
    if version >= 2:
        fields["generation_id"] = 4
    if version >= 3:
        fields["rack_id"] = "r1"
    got = decode_subscription(S(version=version, **fields).encode())
    assert (got["version"], got["topics"], got["streams"]) == (version, ["x", "y"], {})
    assert got["owned"] == ([("x", 2), ("x", 1)] if version >= 1 else [])
    assert got["generation"] == (4 if version >= 2 else -1)
    raw = A(version=version, assigned_partitions=[A.TopicPartition(topic="t",
                                                                   partitions=[3, 1])],
            user_data=b"ud").encode()
    assert decode_assignment(raw) == [("t", 1), ("t", 3)]


def test_bad_bytes_raise_value_error_and_empty_is_no_assignment():
    """Truncated or negative-length bytes raise ValueError (never an allocation of the
    claimed size); an empty assignment (a member the leader gave nothing) is []."""
    good = encode_subscription(["topic"], owned=[("topic", 0)], generation=1)
    for cut in range(2, 2 + 4 + 2 + 5):   # inside the topic array: always truncated
        with pytest.raises(ValueError):
            decode_subscription(good[:cut])
    with pytest.raises(ValueError):
        decode_subscription(b"\x00\x02\x7f\xff\xff\xff")
    with pytest.raises(ValueError):
        decode_assignment(b"\x00\x00\x00\x00\x00\x01\x7f\xff")
    assert decode_assignment(b"") == [] and decode_assignment(None) == []
