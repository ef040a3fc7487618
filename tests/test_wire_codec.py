"""actors.wire, the Kafka protocol codec, against kafka-python 3.0's kafka.protocol as the
oracle: for every API and version advertised, kafka-python's encoded requests decode to
the values it was given and re-encode to the same bytes; our encoded responses are the
bytes kafka-python encodes for the same values, and decode back to them. Then bad input
(truncation at every byte, mutations, lengths out of range, unknown keys and versions) and
Kafka's error code table."""

import os
import random
import struct
import tracemalloc
import uuid

import pytest

from actors import errors, wire

kp_errors = pytest.importorskip("kafka.errors")
from kafka.protocol.consumer import (FetchRequest, FetchResponse, ListOffsetsRequest,  # noqa
                                     ListOffsetsResponse, OffsetForLeaderEpochRequest,
                                     OffsetForLeaderEpochResponse)
from kafka.protocol.metadata import (ApiVersionsRequest, ApiVersionsResponse,  # noqa: E402
                                     MetadataRequest, MetadataResponse)
from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402
from kafka.protocol.consumer import (HeartbeatRequest, HeartbeatResponse,  # noqa: E402
                                     JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
                                     LeaveGroupResponse, OffsetCommitRequest,
                                     OffsetCommitResponse, OffsetFetchRequest,
                                     OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse  # noqa
from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse,  # noqa: E402
                                  DescribeGroupsRequest, DescribeGroupsResponse,
                                  ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse,  # noqa: E402
                                  CreatePartitionsRequest, CreatePartitionsResponse,
                                  CreateTopicsRequest, CreateTopicsResponse,
                                  DeleteRecordsRequest, DeleteRecordsResponse,
                                  DeleteTopicsRequest, DeleteTopicsResponse,
                                  DescribeClusterRequest, DescribeClusterResponse,
                                  DescribeConfigsRequest, DescribeConfigsResponse,
                                  IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse)
from kafka.protocol.admin import (CreateAclsRequest, CreateAclsResponse,  # noqa: E402
                                  DeleteAclsRequest, DeleteAclsResponse,
                                  DescribeAclsRequest, DescribeAclsResponse)
from kafka.protocol.producer.transaction import (InitProducerIdRequest,  # noqa: E402
                                                  InitProducerIdResponse)
from kafka.protocol.sasl import (SaslAuthenticateRequest,  # noqa: E402
                                 SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)
from kafka.protocol.schemas.fields.codecs import BitField  # noqa: E402

ORACLE = {
    wire.API_VERSIONS: (ApiVersionsRequest, ApiVersionsResponse),
    wire.METADATA: (MetadataRequest, MetadataResponse),
    wire.PRODUCE: (ProduceRequest, ProduceResponse),
    wire.FETCH: (FetchRequest, FetchResponse),
    wire.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    wire.OFFSET_FOR_LEADER_EPOCH: (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
    wire.FIND_COORDINATOR: (FindCoordinatorRequest, FindCoordinatorResponse),
    wire.JOIN_GROUP: (JoinGroupRequest, JoinGroupResponse),
    wire.SYNC_GROUP: (SyncGroupRequest, SyncGroupResponse),
    wire.HEARTBEAT: (HeartbeatRequest, HeartbeatResponse),
    wire.LEAVE_GROUP: (LeaveGroupRequest, LeaveGroupResponse),
    wire.OFFSET_COMMIT: (OffsetCommitRequest, OffsetCommitResponse),
    wire.OFFSET_FETCH: (OffsetFetchRequest, OffsetFetchResponse),
    wire.LIST_GROUPS: (ListGroupsRequest, ListGroupsResponse),
    wire.DESCRIBE_GROUPS: (DescribeGroupsRequest, DescribeGroupsResponse),
    wire.DELETE_GROUPS: (DeleteGroupsRequest, DeleteGroupsResponse),
    wire.CREATE_TOPICS: (CreateTopicsRequest, CreateTopicsResponse),
    wire.DELETE_TOPICS: (DeleteTopicsRequest, DeleteTopicsResponse),
    wire.DELETE_RECORDS: (DeleteRecordsRequest, DeleteRecordsResponse),
    wire.DESCRIBE_CONFIGS: (DescribeConfigsRequest, DescribeConfigsResponse),
    wire.ALTER_CONFIGS: (AlterConfigsRequest, AlterConfigsResponse),
    wire.CREATE_PARTITIONS: (CreatePartitionsRequest, CreatePartitionsResponse),
    wire.INCREMENTAL_ALTER_CONFIGS: (IncrementalAlterConfigsRequest,
                                     IncrementalAlterConfigsResponse),
    wire.DESCRIBE_CLUSTER: (DescribeClusterRequest, DescribeClusterResponse),
    wire.DESCRIBE_ACLS: (DescribeAclsRequest, DescribeAclsResponse),
    wire.CREATE_ACLS: (CreateAclsRequest, CreateAclsResponse),
    wire.DELETE_ACLS: (DeleteAclsRequest, DeleteAclsResponse),
    wire.INIT_PRODUCER_ID: (InitProducerIdRequest, InitProducerIdResponse),
    wire.SASL_HANDSHAKE: (SaslHandshakeRequest, SaslHandshakeResponse),
    wire.SASL_AUTHENTICATE: (SaslAuthenticateRequest, SaslAuthenticateResponse),
}
CASES = [(key, v) for key, (lo, hi) in sorted(wire.SUPPORTED_VERSIONS.items())
         for v in range(lo, hi + 1)]
IDS = [f"{wire.API_NAMES[k]}-v{v}" for k, v in CASES]


# -- sample values from the schema --------------------------------------------------------
def _sample(fields, version: int, rng: random.Random, nulls: bool) -> dict:
    """A value for every field present at ``version`` (tagged ones with non-default
    values, so both codecs write them); nullable fields None when ``nulls``."""
    out = {}
    for f in fields:
        if not f.present(version):
            continue
        if nulls and f.nullable_at(version):
            out[f.name] = None
        elif f.type == "bool":
            out[f.name] = not f.default
        elif f.type in ("int8", "int16", "int32", "int64"):
            bits = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}[f.type]
            out[f.name] = rng.choice([-1, 1, 300 if bits > 7 else 100, (1 << bits) - 1,
                                      -(1 << bits)])
        elif f.type == "string":
            out[f.name] = rng.choice(["t", "topic-é", "x" * 200])     # 200: a 2-byte uvarint
        elif f.type in ("records", "bytes"):
            out[f.name] = os.urandom(rng.choice([0, 61, 300]))
        elif f.type == "uuid":
            out[f.name] = os.urandom(16)
        elif f.type == "[]int32":
            out[f.name] = [rng.randrange(-5, 1 << 31) for _ in range(rng.randrange(3))]
        elif f.type == "[]int64":
            out[f.name] = [rng.randrange(-5, 1 << 63) for _ in range(rng.randrange(3))]
        elif f.type == "[]string":
            out[f.name] = [rng.choice(["g", "group-é", "x" * 200])
                           for _ in range(rng.randrange(3))]
        elif f.type == "{}":
            out[f.name] = _sample(f.fields, version, rng, nulls)
        elif f.type == "[]":
            out[f.name] = [_sample(f.fields, version, rng, nulls) for _ in range(2)]
        else:
            raise AssertionError(f.type)
    return out


# kafka-python's names where they are not Kafka's JSON names in snake_case
_ORACLE_NAMES = {"topic_authorized_operations": "authorized_operations",
                 "cluster_authorized_operations": "authorized_operations"}


def _to_oracle(kp_struct, value: dict, version: int) -> dict:
    """Our dict as kafka-python constructor arguments (nested containers, uuid.UUID)."""
    out = {}
    for name, v in value.items():
        name = _ORACLE_NAMES.get(name, name)
        field = kp_struct.fields[name]
        if field.is_struct_array() and v is not None:
            v = [field.data_class(version=version, **_to_oracle(field, item, version))
                 for item in v]
        elif field.is_struct() and v is not None:
            v = field.data_class(version=version, **_to_oracle(field, v, version))
        elif field.type_str == "uuid":
            v = uuid.UUID(bytes=v)
        elif name == "authorized_operations":   # kafka-python: a set of bit numbers
            v = BitField.from_32_bit_field(v)
        out[name] = v
    return out


def _same(decoded, expected) -> None:
    """Every value of ``expected`` is in ``decoded`` (which also has the defaults)."""
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert key in decoded, key
            _same(decoded[key], value)
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert len(decoded) == len(expected)
        for d, e in zip(decoded, expected):
            _same(d, e)
    elif isinstance(decoded, memoryview):
        assert bytes(decoded) == expected
    else:
        assert decoded == expected


def _message(api_key: int, kind: str):
    return wire._MESSAGES[(api_key, kind)]


# -- round trips ----------------------------------------------------------------------------
@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
@pytest.mark.parametrize("api_key,version", CASES, ids=IDS)
def test_requests_kafka_python_encodes_decode_and_reencode_byte_for_byte(api_key, version,
                                                                          nulls):
    """A request kafka-python encodes at each advertised version decodes to the values it
    was given, with its header, and our encoding of the result is the same bytes."""
    rng = random.Random(api_key * 100 + version)
    sample = _sample(_message(api_key, "request").fields, version, rng, nulls)
    kp_cls = ORACLE[api_key][0]
    req = kp_cls(version=version, **_to_oracle(kp_cls._struct, sample, version))
    req.with_header(correlation_id=123456, client_id=None if nulls else "client-é")
    frame = req.encode(header=True)
    header, body = wire.decode_request(frame)
    assert header == (api_key, version, 123456, None if nulls else "client-é")
    _same(body, sample)
    assert wire.encode_request(header, body) == struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
@pytest.mark.parametrize("api_key,version", CASES, ids=IDS)
def test_responses_match_kafka_python_byte_for_byte_both_ways(api_key, version, nulls):
    """Our response to each advertised version is the frame kafka-python encodes for the
    same values (header version included: v0 for ApiVersions always); kafka-python decodes
    ours and we decode its back to the values."""
    rng = random.Random(api_key * 100 + version + 7)
    sample = _sample(_message(api_key, "response").fields, version, rng, nulls)
    if api_key == wire.API_VERSIONS:
        sample["error_code"] = 0    # else kafka-python decodes the body as v0 (KIP-511)
    header = wire.RequestHeader(api_key, version, 98765, "c")
    ours = wire.encode_response(header, sample)
    assert struct.unpack(">i", ours[:4])[0] == len(ours) - 4
    kp_cls = ORACLE[api_key][1]
    resp = kp_cls(version=version, **_to_oracle(kp_cls._struct, sample, version))
    resp.with_header(correlation_id=98765)
    assert resp.encode(header=True, framed=True) == ours
    decoded = kp_cls.decode(ours[4:], version=version, header=True)
    assert decoded.header.correlation_id == 98765
    correlation_id, body = wire.decode_response(api_key, version, ours[4:])
    assert correlation_id == 98765
    _same(body, sample)


def test_records_are_slices_of_the_frame_and_encode_without_a_copy():
    """A Produce request's records decode to a memoryview into the frame itself, and a
    Fetch response's records travel as the very object given (no copy on either side)."""
    batch = os.urandom(1 << 20)
    header = wire.RequestHeader(wire.PRODUCE, 9, 1, "c")
    frame = bytearray(wire.encode_request(header, {"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})[4:])
    _, body = wire.decode_request(memoryview(frame))
    records = body["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(records, memoryview) and records.obj is frame
    assert records == batch
    parts = wire.encode_response_parts(wire.RequestHeader(wire.FETCH, 12, 2, "c"), {
        "responses": [{"topic": "t", "partitions": [{"partition_index": 0,
                                                     "records": records}]}]})
    assert any(p is records for p in parts)


def test_defaults_fill_fields_absent_at_a_version():
    """A decoded body has every field of the schema: those absent at its version hold
    Kafka's defaults (Fetch v4 has no session, current_leader_epoch -1, max_bytes set)."""
    header = wire.RequestHeader(wire.FETCH, 4, 1, None)
    frame = wire.encode_request(header, {"max_wait_ms": 500, "min_bytes": 1, "topics": [
        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 5,
                                       "partition_max_bytes": 1024}]}]})
    _, body = wire.decode_request(frame[4:])
    assert body["session_id"] == 0 and body["session_epoch"] == -1
    assert body["replica_id"] == -1 and body["rack_id"] == ""
    p = body["topics"][0]["partitions"][0]
    assert p["current_leader_epoch"] == -1 and p["log_start_offset"] == -1


def test_unknown_tagged_fields_are_skipped():
    """A flexible body carrying a tag this schema does not know decodes (the tag is
    skipped), as KIP-482 requires."""
    header = wire.RequestHeader(wire.METADATA, 12, 3, "c")
    frame = bytearray(wire.encode_request(header, {"topics": None})[4:])
    assert frame[-1] == 0                               # the body's empty tag buffer
    frame[-1:] = bytes([1, 42, 3]) + b"abc"             # one tag 42 of 3 bytes
    _, body = wire.decode_request(frame)
    assert body["topics"] is None


# -- bad input ----------------------------------------------------------------------------
def _produce_frame(version: int) -> bytes:
    header = wire.RequestHeader(wire.PRODUCE, version, 7, "client")
    return wire.encode_request(header, {"acks": 1, "timeout_ms": 100, "topic_data": [
        {"name": "topic", "partition_data": [{"index": 0, "records": b"r" * 70}]}]})[4:]


@pytest.mark.parametrize("version", [3, 9], ids=["v3", "v9-flexible"])
def test_every_truncation_raises_invalid_request(version):
    """Cut anywhere, a request raises InvalidRequestError and nothing else."""
    frame = _produce_frame(version)
    for cut in range(len(frame)):
        with pytest.raises(wire.InvalidRequestError):
            wire.decode_request(frame[:cut])


@pytest.mark.parametrize("version", [3, 9], ids=["v3", "v9-flexible"])
def test_random_mutations_decode_or_raise_invalid_request(version):
    """Thousands of mutated frames (bytes flipped, inserted, cut): each decodes or raises
    InvalidRequestError, never another exception."""
    rng = random.Random(version)
    frame = _produce_frame(version)
    for _ in range(3000):
        b = bytearray(frame)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            choice = rng.random()
            if choice < 0.6:
                b[i] = rng.randrange(256)
            elif choice < 0.8:
                b.insert(i, rng.randrange(256))
            else:
                del b[i]
        try:
            wire.decode_request(bytes(b))
        except wire.InvalidRequestError:
            pass


def test_huge_or_negative_lengths_raise_before_allocating():
    """An array count of 2**31-1, a string length of 32767 and negative lengths in a small
    frame raise InvalidRequestError without allocating anything near their size."""
    head = struct.pack(">hhih", wire.PRODUCE, 3, 1, -1)
    bad = [head + struct.pack(">hhii", -1, 1, 100, 2**31 - 1),             # topic count
           head + struct.pack(">hhi", -1, 1, 100) + struct.pack(">ih", 1, 32767),   # name
           head + struct.pack(">hhii", -1, 1, 100, -7),                    # count < -1
           head + struct.pack(">hhi", -1, 1, 100) + struct.pack(">ihi", 1, 1, 1) + b"t" +
           struct.pack(">i", 2**31 - 1)]                                   # partitions
    flexible = struct.pack(">hhih", wire.PRODUCE, 9, 1, -1) + b"\x00" + b"\x00" + \
        struct.pack(">hi", 1, 100) + b"\xff\xff\xff\xff\x07"             # uvarint 2**31
    tracemalloc.start()
    try:
        for frame in bad + [flexible]:
            with pytest.raises(wire.InvalidRequestError):
                wire.decode_request(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_overlong_uvarint_and_bad_utf8_raise_invalid_request():
    """A varint longer than 5 bytes and a client_id that is not UTF-8 are bad input."""
    with pytest.raises(wire.InvalidRequestError, match="varint"):
        wire.decode_request(struct.pack(">hhih", wire.PRODUCE, 9, 1, -1) + b"\x00" +
                            b"\xff" * 8)
    with pytest.raises(wire.InvalidRequestError):
        wire.decode_request(struct.pack(">hhih", wire.METADATA, 1, 1, 2) + b"\xff\xfe" +
                            struct.pack(">i", -1))


def test_bytes_after_a_request_body_are_ignored_as_kafka_does():
    """A request body followed by bytes its version does not name is read as Kafka's broker
    reads it (its fields, the rest ignored): librdkafka's all-topics Metadata v12 body
    carries 3 such bytes after its tagged fields."""
    header, body = wire.decode_request(_produce_frame(3) + b"\x00")
    assert header.api_key == wire.PRODUCE and body == wire.decode_request(_produce_frame(3))[1]
    librdkafka = (struct.pack(">hhih", wire.METADATA, 12, 3, 7) + b"rdkafka" + b"\x00"
                  + b"\x00\x00\x00\x00\x01\x00\x00")
    header, body = wire.decode_request(librdkafka)
    assert (header.api_version, header.client_id) == (12, "rdkafka")
    assert body["topics"] is None and body["allow_auto_topic_creation"] is False


def test_bytes_after_a_response_body_are_refused():
    """A response is exactly its fields: trailing bytes make it invalid."""
    header = wire.RequestHeader(wire.API_VERSIONS, 0, 5, "t")
    raw = wire.encode_response(header, wire.api_versions_error_body())[4:]
    assert wire.decode_response(wire.API_VERSIONS, 0, raw)[0] == 5
    with pytest.raises(wire.InvalidRequestError, match="after the body"):
        wire.decode_response(wire.API_VERSIONS, 0, raw + b"\x00")


def test_unknown_api_key_or_version_raises_with_the_header():
    """An API key or version the codec does not implement raises InvalidRequestError that
    carries the header, so a server can answer ApiVersions (KIP-511) or close."""
    with pytest.raises(wire.InvalidRequestError, match="unknown API key 24") as info:
        wire.decode_request(struct.pack(">hhih", 24, 1, 77, 1) + b"c" + b"\x00" * 8)
    assert info.value.header == (24, 1, 77, "c")
    with pytest.raises(wire.InvalidRequestError, match="version 5 is not supported") as info:
        wire.decode_request(struct.pack(">hhih", wire.API_VERSIONS, 5, 78, -1) + b"\x00")
    assert info.value.header.correlation_id == 78
    with pytest.raises(wire.InvalidRequestError, match="shorter than a header"):
        wire.decode_request(b"\x00\x01")


def test_api_versions_error_body_is_a_v0_answer_with_its_own_range():
    """KIP-511's answer to an unknown ApiVersions version: v0 body, error 35, ApiVersions'
    range; kafka-python reads it at v0."""
    header = wire.RequestHeader(wire.API_VERSIONS, 0, 5, None)
    frame = wire.encode_response(header, wire.api_versions_error_body())
    decoded = ApiVersionsResponse.decode(frame[4:], version=0, header=True)
    assert decoded.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == \
        [(18, 0, 4)]


# -- error codes ------------------------------------------------------------------------
# Where our table (Kafka's Errors.java) differs from kafka-python's retriable flag:
# Kafka's CorruptRecordException is a RetriableException.
_RETRIABLE_DIFFERENCES = {2}


def test_error_table_matches_kafka_python_codes_and_retriable_flags():
    """Every code -1..120 is in the table once; the codes and retriable flags agree with
    kafka-python's errors (but CORRUPT_MESSAGE, retriable in Kafka's own client)."""
    oracle = {c.errno: c for c in vars(kp_errors).values()
              if isinstance(c, type) and issubclass(c, kp_errors.BrokerResponseError)
              and getattr(c, "errno", None) is not None}
    assert set(wire.ERRORS) == set(range(-1, 121))
    differ = {code for code, e in wire.ERRORS.items()
              if code in oracle and e.retriable != oracle[code].retriable}
    assert differ == _RETRIABLE_DIFFERENCES
    assert wire.ERRORS_BY_NAME["NOT_LEADER_OR_FOLLOWER"].code == 6


def test_typed_errors_map_to_codes_and_back():
    """Each typed error of actors.errors with a Kafka code maps to it and back to the same
    class; a code without a class gives BrokerResponseError with the table's retriable."""
    for cls_name, name in wire._TYPED.items():
        cls = wire.InvalidRequestError if cls_name == "InvalidRequestError" \
            else getattr(errors, cls_name)
        if cls_name == "UnsupportedVersionError":
            continue                    # a batch's magic: CORRUPT_MESSAGE (below)
        code = wire.error_code(cls("x"))
        assert wire.ERRORS[code].name == name
        if cls_name != "KafkaTimeoutError":
            assert type(wire.error_for_code(code, "m")) is cls
    assert wire.error_code(errors.UnsupportedVersionError("magic 7")) == 2
    assert type(wire.error_for_code(35)) is errors.UnsupportedVersionError
    assert wire.error_code(ValueError("bug")) == -1
    assert wire.error_for_code(0) is None
    e = wire.error_for_code(70)
    assert isinstance(e, wire.BrokerResponseError) and isinstance(e, errors.KafkaError)
    assert (e.code, e.name, e.retriable) == (70, "FETCH_SESSION_ID_NOT_FOUND", True)
    assert wire.error_code(e) == 70
    assert wire.error_for_code(9999).name == "UNKNOWN_ERROR_CODE_9999"
