"""Kafka's wire protocol: the request and response codec both sides of the data plane use.

A frame on the socket is ``int32 size`` then ``size`` bytes: a header, then a body.

    request header v1   api_key int16 | api_version int16 | correlation_id int32 |
                        client_id nullable string (int16 length, -1 = null)
    request header v2   v1, then a tagged-field buffer (used by flexible request versions)
    response header v0  correlation_id int32
    response header v1  v0, then a tagged-field buffer (flexible response versions;
                        ApiVersions' response header is v0 at every version, KIP-511)

Flexible versions (KIP-482) write strings, bytes and arrays "compact" (unsigned varint
length + 1, 0 = null) and end every struct with tagged fields: uvarint count, then per
field uvarint tag, uvarint size, value. Unknown tags are skipped; the request header's
client_id stays a non-compact string even in v2.

Bodies are plain dicts keyed by Kafka's field names in snake_case (kafka-python's spelling:
``topic_data``, ``partition_data``, ``records``), nested lists of dicts for arrays. A decode
sets every field of the schema, the ones absent at that version to their default; an encode
takes a missing key as its default. ``records`` fields decode to a memoryview slice of the
frame (never copied, never parsed: the broker hands batches through) and encode from any
bytes-like object without copying it (``encode_*_parts`` give the frame as a list of buffers
for ``socket.sendmsg``).

The schemas below are transcribed from Kafka's JSON message definitions for the versions
raykafka implements (``SUPPORTED_VERSIONS``, the research note's first advertised set);
from each the module generates one reader and one writer per (message, version) the first
time it is used.

Bad input raises ``InvalidRequestError`` (Kafka's INVALID_REQUEST) and nothing else: a
truncated body, a negative or over-long length, bad UTF-8, trailing bytes, an unknown API key
or version. A length is checked against the bytes left before anything is allocated, so no
input makes a decode allocate more than the frame's own size over again.

Thread-safe: the generated codecs keep no state; the cache that holds them is filled under
a lock.

Imports nothing of ``actors.server``, ``actors.client`` or ``actors.tools``.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import errors as _errors
from .errors import KafkaError

# -- API keys and the versions implemented ------------------------------------------------
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_FOR_LEADER_EPOCH = 23
API_VERSIONS = 18
# consumer groups (served by the group coordinator: actors/server/group_handlers.py)
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
# -- admin APIs (served through the brokers' AdminManager: actors/server/admin_handlers.py)
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
DESCRIBE_CLUSTER = 60
# ACLs (actors/server/acl_handlers.py)
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
# the idempotent producer (KIP-98, no transactions: actors/server/producer_handlers.py)
INIT_PRODUCER_ID = 22
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36

#: (min, max) version of each API this codec reads and writes (the research note's §1e):
#: Produce >= 3 (magic-2 batches only) and Fetch >= 4 make librdkafka use record batch v2.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 7),
    METADATA: (0, 12),
    API_VERSIONS: (0, 4),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    # groups: the classic protocol (no KIP-848), one group per OffsetFetch (v8 batches),
    # one key per FindCoordinator (v4 batches), JoinGroup without KIP-800's reason (v8)
    FIND_COORDINATOR: (0, 3),
    JOIN_GROUP: (0, 7),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 7),
    LIST_GROUPS: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    # -- admin APIs: Kafka 4's ranges (CreateTopics v0-1, DeleteTopics v0 and
    # DescribeConfigs v0 are gone there; every client negotiates up to them)
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    DELETE_RECORDS: (0, 2),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_CLUSTER: (0, 2),
    # ACLs: Kafka 4 dropped v0 (its pattern type is implicitly LITERAL)
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    # the idempotent producer: v3's producer id and epoch are read (a new id is answered,
    # as Kafka does without a transactional id); v5 (TRANSACTION_ABORTABLE) is not offered
    INIT_PRODUCER_ID: (0, 4),
    # SASL: v0 handshake's raw token framing is not implemented (SaslAuthenticate after it)
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
}

API_NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets",
             METADATA: "Metadata", API_VERSIONS: "ApiVersions",
             OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
             FIND_COORDINATOR: "FindCoordinator", JOIN_GROUP: "JoinGroup",
             SYNC_GROUP: "SyncGroup", HEARTBEAT: "Heartbeat", LEAVE_GROUP: "LeaveGroup",
             OFFSET_COMMIT: "OffsetCommit", OFFSET_FETCH: "OffsetFetch",
             LIST_GROUPS: "ListGroups", DESCRIBE_GROUPS: "DescribeGroups",
             DELETE_GROUPS: "DeleteGroups",
             # -- admin APIs
             CREATE_TOPICS: "CreateTopics", DELETE_TOPICS: "DeleteTopics",
             DELETE_RECORDS: "DeleteRecords", DESCRIBE_CONFIGS: "DescribeConfigs",
             ALTER_CONFIGS: "AlterConfigs", CREATE_PARTITIONS: "CreatePartitions",
             INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
             DESCRIBE_CLUSTER: "DescribeCluster",
             # -- ACLs
             DESCRIBE_ACLS: "DescribeAcls", CREATE_ACLS: "CreateAcls",
             DELETE_ACLS: "DeleteAcls",
             INIT_PRODUCER_ID: "InitProducerId",
             # -- SASL
             SASL_HANDSHAKE: "SaslHandshake", SASL_AUTHENTICATE: "SaslAuthenticate"}


class InvalidRequestError(KafkaError):
    """Bytes that are not a request (or response) this codec can read: truncated, a length
    out of range, an unknown API key or version, trailing bytes. Kafka's INVALID_REQUEST
    (42); a broker closes the connection that sent it (ApiVersions at an unknown version
    excepted: that one is answered, KIP-511).

    ``header`` is the request header when it could be read (None otherwise), so a server
    can tell which request it was."""

    def __init__(self, message: str, header: "RequestHeader | None" = None):
        super().__init__(message)
        self.header = header


# -- the message schemas ------------------------------------------------------------------
# One line per field: name, type, versions, then options: null:V (nullable in versions V),
# tag:N (a tagged field), =X (default). Types: int8 int16 int32 int64 bool string bytes
# records uuid, []int32 / []int64 / []string (arrays of numbers or strings), [] (array of
# the struct indented below), {} (a struct). Versions: "3+", "8-10", "0". A message line
# without flexible:V is never flexible; lines starting with "#" are comments.
_SCHEMAS = """
ApiVersionsRequest 18 flexible:3+
  client_software_name string 3+
  client_software_version string 3+
ApiVersionsResponse 18 flexible:3+
  error_code int16 0+
  api_keys [] 0+
    api_key int16 0+
    min_version int16 0+
    max_version int16 0+
  throttle_time_ms int32 1+
  supported_features [] 3+ tag:0
    name string 3+
    min_version int16 3+
    max_version int16 3+
  finalized_features_epoch int64 3+ tag:1 =-1
  finalized_features [] 3+ tag:2
    name string 3+
    max_version_level int16 3+
    min_version_level int16 3+
  zk_migration_ready bool 3+ tag:3 =false

MetadataRequest 3 flexible:9+
  topics [] 0+ null:1+
    topic_id uuid 10+
    name string 0+ null:10+
  allow_auto_topic_creation bool 4+ =true
  include_cluster_authorized_operations bool 8-10
  include_topic_authorized_operations bool 8+
MetadataResponse 3 flexible:9+
  throttle_time_ms int32 3+
  brokers [] 0+
    node_id int32 0+
    host string 0+
    port int32 0+
    rack string 1+ null:1+
  cluster_id string 2+ null:2+
  controller_id int32 1+ =-1
  topics [] 0+
    error_code int16 0+
    name string 0+ null:12+
    topic_id uuid 10+
    is_internal bool 1+
    partitions [] 0+
      error_code int16 0+
      partition_index int32 0+
      leader_id int32 0+
      leader_epoch int32 7+ =-1
      replica_nodes []int32 0+
      isr_nodes []int32 0+
      offline_replicas []int32 5+
    topic_authorized_operations int32 8+ =-2147483648
  cluster_authorized_operations int32 8-10 =-2147483648

ProduceRequest 0 flexible:9+
  transactional_id string 3+ null:3+
  acks int16 0+
  timeout_ms int32 0+
  topic_data [] 0+
    name string 0+
    partition_data [] 0+
      index int32 0+
      records records 0+ null:0+
ProduceResponse 0 flexible:9+
  responses [] 0+
    name string 0+
    partition_responses [] 0+
      index int32 0+
      error_code int16 0+
      base_offset int64 0+
      log_append_time_ms int64 2+ =-1
      log_start_offset int64 5+ =-1
      record_errors [] 8+
        batch_index int32 8+
        batch_index_error_message string 8+ null:8+
      error_message string 8+ null:8+
  throttle_time_ms int32 1+

FetchRequest 1 flexible:12+
  cluster_id string 12+ null:12+ tag:0
  replica_id int32 0+ =-1
  max_wait_ms int32 0+
  min_bytes int32 0+
  max_bytes int32 3+ =2147483647
  isolation_level int8 4+
  session_id int32 7+
  session_epoch int32 7+ =-1
  topics [] 0+
    topic string 0+
    partitions [] 0+
      partition int32 0+
      current_leader_epoch int32 9+ =-1
      fetch_offset int64 0+
      last_fetched_epoch int32 12+ =-1
      log_start_offset int64 5+ =-1
      partition_max_bytes int32 0+
  forgotten_topics_data [] 7+
    topic string 7+
    partitions []int32 7+
  rack_id string 11+
FetchResponse 1 flexible:12+
  throttle_time_ms int32 1+
  error_code int16 7+
  session_id int32 7+
  responses [] 0+
    topic string 0+
    partitions [] 0+
      partition_index int32 0+
      error_code int16 0+
      high_watermark int64 0+
      last_stable_offset int64 4+ =-1
      log_start_offset int64 5+ =-1
      diverging_epoch {} 12+ tag:0
        epoch int32 12+ =-1
        end_offset int64 12+ =-1
      current_leader {} 12+ tag:1
        leader_id int32 12+ =-1
        leader_epoch int32 12+ =-1
      snapshot_id {} 12+ tag:2
        end_offset int64 12+ =-1
        epoch int32 12+ =-1
      aborted_transactions [] 4+ null:4+
        producer_id int64 4+
        first_offset int64 4+
      preferred_read_replica int32 11+ =-1
      records records 0+ null:0+

ListOffsetsRequest 2 flexible:6+
  replica_id int32 0+
  isolation_level int8 2+
  topics [] 0+
    name string 0+
    partitions [] 0+
      partition_index int32 0+
      current_leader_epoch int32 4+ =-1
      timestamp int64 0+
      max_num_offsets int32 0 =1
ListOffsetsResponse 2 flexible:6+
  throttle_time_ms int32 2+
  topics [] 0+
    name string 0+
    partitions [] 0+
      partition_index int32 0+
      error_code int16 0+
      old_style_offsets []int64 0
      timestamp int64 1+ =-1
      offset int64 1+ =-1
      leader_epoch int32 4+ =-1

OffsetForLeaderEpochRequest 23 flexible:4+
  replica_id int32 3+ =-2
  topics [] 0+
    topic string 0+
    partitions [] 0+
      partition int32 0+
      current_leader_epoch int32 2+ =-1
      leader_epoch int32 0+
OffsetForLeaderEpochResponse 23 flexible:4+
  throttle_time_ms int32 2+
  topics [] 0+
    topic string 0+
    partitions [] 0+
      error_code int16 0+
      partition int32 0+
      leader_epoch int32 1+ =-1
      end_offset int64 0+ =-1

FindCoordinatorRequest 10 flexible:3+
  key string 0-3
  key_type int8 1+
FindCoordinatorResponse 10 flexible:3+
  throttle_time_ms int32 1+
  error_code int16 0-3
  error_message string 1-3 null:1-3
  node_id int32 0-3
  host string 0-3
  port int32 0-3

JoinGroupRequest 11 flexible:6+
  group_id string 0+
  session_timeout_ms int32 0+
  rebalance_timeout_ms int32 1+ =-1
  member_id string 0+
  group_instance_id string 5+ null:5+
  protocol_type string 0+
  protocols [] 0+
    name string 0+
    metadata bytes 0+
JoinGroupResponse 11 flexible:6+
  throttle_time_ms int32 2+
  error_code int16 0+
  generation_id int32 0+ =-1
  protocol_type string 7+ null:7+
  protocol_name string 0+ null:7+
  leader string 0+
  member_id string 0+
  members [] 0+
    member_id string 0+
    group_instance_id string 5+ null:5+
    metadata bytes 0+

SyncGroupRequest 14 flexible:4+
  group_id string 0+
  generation_id int32 0+
  member_id string 0+
  group_instance_id string 3+ null:3+
  protocol_type string 5+ null:5+
  protocol_name string 5+ null:5+
  assignments [] 0+
    member_id string 0+
    assignment bytes 0+
SyncGroupResponse 14 flexible:4+
  throttle_time_ms int32 1+
  error_code int16 0+
  protocol_type string 5+ null:5+
  protocol_name string 5+ null:5+
  assignment bytes 0+

HeartbeatRequest 12 flexible:4+
  group_id string 0+
  generation_id int32 0+
  member_id string 0+
  group_instance_id string 3+ null:3+
HeartbeatResponse 12 flexible:4+
  throttle_time_ms int32 1+
  error_code int16 0+

LeaveGroupRequest 13 flexible:4+
  group_id string 0+
  member_id string 0-2
  members [] 3+
    member_id string 3+
    group_instance_id string 3+ null:3+
    reason string 5+ null:5+
LeaveGroupResponse 13 flexible:4+
  throttle_time_ms int32 1+
  error_code int16 0+
  members [] 3+
    member_id string 3+
    group_instance_id string 3+ null:3+
    error_code int16 3+

OffsetCommitRequest 8 flexible:8+
  group_id string 0+
  generation_id_or_member_epoch int32 1+ =-1
  member_id string 1+
  group_instance_id string 7+ null:7+
  retention_time_ms int64 2-4 =-1
  topics [] 0+
    name string 0-9
    partitions [] 0+
      partition_index int32 0+
      committed_offset int64 0+
      committed_leader_epoch int32 6+ =-1
      commit_timestamp int64 1 =-1
      committed_metadata string 0+ null:0+
OffsetCommitResponse 8 flexible:8+
  throttle_time_ms int32 3+
  topics [] 0+
    name string 0-9
    partitions [] 0+
      partition_index int32 0+
      error_code int16 0+

OffsetFetchRequest 9 flexible:6+
  group_id string 0-7
  topics [] 0-7 null:2-7
    name string 0-7
    partition_indexes []int32 0-7
  require_stable bool 7+ =false
OffsetFetchResponse 9 flexible:6+
  throttle_time_ms int32 3+
  topics [] 0-7
    name string 0-7
    partitions [] 0-7
      partition_index int32 0-7
      committed_offset int64 0-7
      committed_leader_epoch int32 5-7 =-1
      metadata string 0-7 null:0-7
      error_code int16 0-7
  error_code int16 2-7 =0

ListGroupsRequest 16 flexible:3+
  states_filter []string 4+
  types_filter []string 5+
ListGroupsResponse 16 flexible:3+
  throttle_time_ms int32 1+
  error_code int16 0+
  groups [] 0+
    group_id string 0+
    protocol_type string 0+
    group_state string 4+
    group_type string 5+

DescribeGroupsRequest 15 flexible:5+
  groups []string 0+
  include_authorized_operations bool 3+
DescribeGroupsResponse 15 flexible:5+
  throttle_time_ms int32 1+
  groups [] 0+
    error_code int16 0+
    error_message string 6+ null:6+
    group_id string 0+
    group_state string 0+
    protocol_type string 0+
    protocol_data string 0+
    members [] 0+
      member_id string 0+
      group_instance_id string 4+ null:4+
      client_id string 0+
      client_host string 0+
      member_metadata bytes 0+
      member_assignment bytes 0+
    authorized_operations int32 3+ =-2147483648

DeleteGroupsRequest 42 flexible:2+
  groups_names []string 0+
DeleteGroupsResponse 42 flexible:2+
  throttle_time_ms int32 0+
  results [] 0+
    group_id string 0+
    error_code int16 0+

# -- admin APIs (transcribed from Kafka 4's JSON definitions, kafka-python 3.0's copy)
CreateTopicsRequest 19 flexible:5+
  topics [] 0+
    name string 0+
    num_partitions int32 0+
    replication_factor int16 0+
    assignments [] 0+
      partition_index int32 0+
      broker_ids []int32 0+
    configs [] 0+
      name string 0+
      value string 0+ null:0+
  timeout_ms int32 0+ =60000
  validate_only bool 1+
CreateTopicsResponse 19 flexible:5+
  throttle_time_ms int32 2+
  topics [] 0+
    name string 0+
    topic_id uuid 7+
    error_code int16 0+
    error_message string 1+ null:0+
    topic_config_error_code int16 5+ tag:0
    num_partitions int32 5+ =-1
    replication_factor int16 5+ =-1
    configs [] 5+ null:5+
      name string 5+
      value string 5+ null:5+
      read_only bool 5+
      config_source int8 5+ =-1
      is_sensitive bool 5+

DeleteTopicsRequest 20 flexible:4+
  topics [] 6+
    name string 6+ null:6+
    topic_id uuid 6+
  topic_names []string 0-5
  timeout_ms int32 0+
DeleteTopicsResponse 20 flexible:4+
  throttle_time_ms int32 1+
  responses [] 0+
    name string 0+ null:6+
    topic_id uuid 6+
    error_code int16 0+
    error_message string 5+ null:5+

DeleteRecordsRequest 21 flexible:2+
  topics [] 0+
    name string 0+
    partitions [] 0+
      partition_index int32 0+
      offset int64 0+
  timeout_ms int32 0+
DeleteRecordsResponse 21 flexible:2+
  throttle_time_ms int32 0+
  topics [] 0+
    name string 0+
    partitions [] 0+
      partition_index int32 0+
      low_watermark int64 0+
      error_code int16 0+

DescribeConfigsRequest 32 flexible:4+
  resources [] 0+
    resource_type int8 0+
    resource_name string 0+
    configuration_keys []string 0+ null:0+
  include_synonyms bool 1+
  include_documentation bool 3+
DescribeConfigsResponse 32 flexible:4+
  throttle_time_ms int32 0+
  results [] 0+
    error_code int16 0+
    error_message string 0+ null:0+
    resource_type int8 0+
    resource_name string 0+
    configs [] 0+
      name string 0+
      value string 0+ null:0+
      read_only bool 0+
      config_source int8 1+ =-1
      is_default bool 0
      is_sensitive bool 0+
      synonyms [] 1+
        name string 1+
        value string 1+ null:0+
        source int8 1+
      config_type int8 3+
      documentation string 3+ null:0+

AlterConfigsRequest 33 flexible:2+
  resources [] 0+
    resource_type int8 0+
    resource_name string 0+
    configs [] 0+
      name string 0+
      value string 0+ null:0+
  validate_only bool 0+
AlterConfigsResponse 33 flexible:2+
  throttle_time_ms int32 0+
  responses [] 0+
    error_code int16 0+
    error_message string 0+ null:0+
    resource_type int8 0+
    resource_name string 0+

CreatePartitionsRequest 37 flexible:2+
  topics [] 0+
    name string 0+
    count int32 0+
    assignments [] 0+ null:0+
      broker_ids []int32 0+
  timeout_ms int32 0+
  validate_only bool 0+
CreatePartitionsResponse 37 flexible:2+
  throttle_time_ms int32 0+
  results [] 0+
    name string 0+
    error_code int16 0+
    error_message string 0+ null:0+

IncrementalAlterConfigsRequest 44 flexible:1+
  resources [] 0+
    resource_type int8 0+
    resource_name string 0+
    configs [] 0+
      name string 0+
      config_operation int8 0+
      value string 0+ null:0+
  validate_only bool 0+
IncrementalAlterConfigsResponse 44 flexible:1+
  throttle_time_ms int32 0+
  responses [] 0+
    error_code int16 0+
    error_message string 0+ null:0+
    resource_type int8 0+
    resource_name string 0+

DescribeClusterRequest 60 flexible:0+
  include_cluster_authorized_operations bool 0+
  endpoint_type int8 1+ =1
  include_fenced_brokers bool 2+
DescribeClusterResponse 60 flexible:0+
  throttle_time_ms int32 0+
  error_code int16 0+
  error_message string 0+ null:0+
  endpoint_type int8 1+ =1
  cluster_id string 0+
  controller_id int32 0+ =-1
  brokers [] 0+
    broker_id int32 0+
    host string 0+
    port int32 0+
    rack string 0+ null:0+
    is_fenced bool 2+
  cluster_authorized_operations int32 0+ =-2147483648
DescribeAclsRequest 29 flexible:2+
  resource_type_filter int8 0+
  resource_name_filter string 0+ null:0+
  pattern_type_filter int8 1+ =3
  principal_filter string 0+ null:0+
  host_filter string 0+ null:0+
  operation int8 0+
  permission_type int8 0+
DescribeAclsResponse 29 flexible:2+
  throttle_time_ms int32 0+
  error_code int16 0+
  error_message string 0+ null:0+
  resources [] 0+
    resource_type int8 0+
    resource_name string 0+
    pattern_type int8 1+ =3
    acls [] 0+
      principal string 0+
      host string 0+
      operation int8 0+
      permission_type int8 0+

CreateAclsRequest 30 flexible:2+
  creations [] 0+
    resource_type int8 0+
    resource_name string 0+
    resource_pattern_type int8 1+ =3
    principal string 0+
    host string 0+
    operation int8 0+
    permission_type int8 0+
CreateAclsResponse 30 flexible:2+
  throttle_time_ms int32 0+
  results [] 0+
    error_code int16 0+
    error_message string 0+ null:0+

DeleteAclsRequest 31 flexible:2+
  filters [] 0+
    resource_type_filter int8 0+
    resource_name_filter string 0+ null:0+
    pattern_type_filter int8 1+ =3
    principal_filter string 0+ null:0+
    host_filter string 0+ null:0+
    operation int8 0+
    permission_type int8 0+
DeleteAclsResponse 31 flexible:2+
  throttle_time_ms int32 0+
  filter_results [] 0+
    error_code int16 0+
    error_message string 0+ null:0+
    matching_acls [] 0+
      error_code int16 0+
      error_message string 0+ null:0+
      resource_type int8 0+
      resource_name string 0+
      pattern_type int8 1+ =3
      principal string 0+
      host string 0+
      operation int8 0+
      permission_type int8 0+
# -- idempotent producer
InitProducerIdRequest 22 flexible:2+
  transactional_id string 0+ null:0+
  transaction_timeout_ms int32 0+
  producer_id int64 3+ =-1
  producer_epoch int16 3+ =-1
InitProducerIdResponse 22 flexible:2+
  throttle_time_ms int32 0+
  error_code int16 0+
  producer_id int64 0+ =-1
  producer_epoch int16 0+
# -- SASL (issue 23): SaslHandshake, SaslAuthenticate ---------------------------------------
SaslHandshakeRequest 17
  mechanism string 0+
SaslHandshakeResponse 17
  error_code int16 0+
  mechanisms []string 0+

SaslAuthenticateRequest 36 flexible:2+
  auth_bytes bytes 0+
SaslAuthenticateResponse 36 flexible:2+
  error_code int16 0+
  error_message string 0+ null:0+
  auth_bytes bytes 0+
  session_lifetime_ms int64 1+ =0
"""

_NO_MAX = 1 << 15
_FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "bool": "?"}
_TYPES = set(_FIXED) | {"string", "bytes", "records", "uuid", "[]", "{}", "[]int32",
                        "[]int64", "[]string"}
_ZERO_UUID = bytes(16)


def _versions(text: str) -> tuple[int, int]:
    if text.endswith("+"):
        return int(text[:-1]), _NO_MAX
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


@dataclass(frozen=True)
class _Field:
    name: str
    type: str
    versions: tuple[int, int]
    nullable: tuple[int, int] | None
    tag: int | None
    default: Any
    fields: tuple["_Field", ...]

    def present(self, version: int) -> bool:
        return self.versions[0] <= version <= self.versions[1]

    def nullable_at(self, version: int) -> bool:
        return self.nullable is not None and self.nullable[0] <= version <= self.nullable[1]

    def default_expr(self) -> str:
        if self.type in ("[]", "[]int32", "[]int64", "[]string"):
            return "None" if self.default is None and self.nullable else "[]"
        return repr(self.default)


@dataclass(frozen=True)
class _Message:
    name: str
    api_key: int
    flexible_from: int
    fields: tuple[_Field, ...]


def _default(type_: str, text: str | None, nullable: bool):
    if text is not None:
        if text in ("true", "false"):
            return text == "true"
        return int(text)
    if nullable or type_ in ("{}",):
        return None
    if type_ in _FIXED:
        return False if type_ == "bool" else 0
    return {"string": "", "bytes": b"", "records": b"", "uuid": _ZERO_UUID}.get(type_)


def _parse_field(line: str) -> tuple[int, _Field]:
    indent = (len(line) - len(line.lstrip(" "))) // 2
    name, type_, versions, *options = line.split()
    if type_ not in _TYPES:
        raise ValueError(f"schema: unknown type {type_!r} of {name}")
    nullable = tag = default = None
    for option in options:
        if option.startswith("null:"):
            nullable = _versions(option[5:])
        elif option.startswith("tag:"):
            tag = int(option[4:])
        elif option.startswith("="):
            default = option[1:]
        else:
            raise ValueError(f"schema: unknown option {option!r} of {name}")
    return indent, _Field(name, type_, _versions(versions), nullable, tag,
                          _default(type_, default, nullable is not None), ())


def _nest(items: list[tuple[int, _Field]], depth: int, start: int) -> tuple[tuple, int]:
    """The fields at ``depth`` from ``items[start]`` on, each with its children."""
    out, i = [], start
    while i < len(items) and items[i][0] == depth:
        field = items[i][1]
        children, i = _nest(items, depth + 1, i + 1)
        if children:
            field = _Field(field.name, field.type, field.versions, field.nullable, field.tag,
                           field.default, children)
        out.append(field)
    return tuple(out), i


def _parse_schemas(text: str) -> dict[tuple[int, str], _Message]:
    messages, current, items = {}, None, []

    def close():
        if current is not None:
            fields, used = _nest(items, 1, 0)
            if used != len(items):
                raise ValueError(f"schema: bad indentation in {current[0]}")
            messages[(current[1], current[0].endswith("Request") and "request" or
                      "response")] = _Message(current[0], current[1], current[2], fields)

    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):      # a blank line or a comment
            continue
        if not line.startswith(" "):
            close()
            name, key, *flexible = line.split()     # no flexible:V: never flexible
            current, items = (name, int(key), _versions(flexible[0][9:])[0] if flexible
                                    else _NO_MAX), []
        else:
            items.append(_parse_field(line))
    close()
    return messages


_MESSAGES = _parse_schemas(_SCHEMAS)


# -- unsigned varints (readers and writers the generated code calls) -----------------------
def _uvarint_rest(buf, pos: int, first: int) -> tuple[int, int]:
    """The rest of an unsigned varint whose first byte ``first`` had its high bit set."""
    value, shift = first & 0x7F, 7
    while True:
        if shift > 28:
            raise InvalidRequestError("unsigned varint longer than 5 bytes")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _uvarint_bytes(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_UVARINTS = [bytes([i]) for i in range(0x80)]


def _bad(what: str) -> InvalidRequestError:
    return InvalidRequestError(what)


# -- the code generator -------------------------------------------------------------------
class _Gen:
    """Writes the Python source of one message version's reader or writer functions."""

    def __init__(self, version: int, flexible: bool):
        self.version = version
        self.flexible = flexible
        self.lines: list[str] = []
        self.structs: dict[str, Any] = {}
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def struct(self, fmt: str) -> str:
        name = "_S_" + fmt.replace("?", "o")
        self.structs[name] = struct.Struct(">" + fmt)
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def function(self, name: str, fields, tail: bool) -> None:
        raise NotImplementedError

    def build(self, fields) -> str:
        """The source of ``ROOT`` for the message's fields and of every function it calls
        (one per nested struct and tagged field, queued in ``pending`` as they are met)."""
        self.pending = [(self.ROOT, fields)]
        done = 0
        while done < len(self.pending):
            name, sub_fields, *tail = self.pending[done]
            self.function(name, sub_fields, tail[0] if tail else True)
            done += 1
        return "\n".join(self.lines)


def _fixed_runs(fields, version):
    """Split the present untagged fields into runs: a list of fixed-width fields (read or
    written with one struct) or a single variable-width field."""
    runs, fixed = [], []
    for f in fields:
        if not f.present(version) or f.tag is not None:
            continue
        if f.type in _FIXED:
            fixed.append(f)
            continue
        if fixed:
            runs.append(fixed)
            fixed = []
        runs.append(f)
    if fixed:
        runs.append(fixed)
    return runs


class _ReaderGen(_Gen):
    """``def NAME(buf, pos, end) -> (dict, pos)`` for a struct's fields at one version."""

    ROOT = "_r0"

    def function(self, name: str, fields, tail: bool) -> None:
        self.emit(0, f"def {name}(buf, pos, end):")
        self.emit(1, "d = {}")
        for f in fields:
            if not f.present(self.version) or (f.tag is not None and self.flexible):
                self.emit(1, f"d[{f.name!r}] = {f.default_expr()}")
        for run in _fixed_runs(fields, self.version):
            if isinstance(run, list):
                s = self.struct("".join(_FIXED[f.type] for f in run))
                targets = "".join(f"d[{f.name!r}], " for f in run)
                self.emit(1, f"{targets}= {s}.unpack_from(buf, pos)")
                self.emit(1, f"pos += {self.structs[s].size}")
            else:
                self.variable(1, run)
        if tail and self.flexible:
            self.tagged(fields)
        self.emit(1, "return d, pos")

    def length(self, depth: int, f, what: str) -> None:
        """``n`` = the length or count of a variable field; None when null."""
        if self.flexible:
            self.emit(depth, "n = buf[pos]; pos += 1")
            self.emit(depth, "if n & 0x80: n, pos = _uvarint_rest(buf, pos, n)")
            self.emit(depth, "n -= 1")
        else:
            fmt = "h" if f.type == "string" else "i"
            self.emit(depth, f"n, = {self.struct(fmt)}.unpack_from(buf, pos); pos += "
                             f"{2 if fmt == 'h' else 4}")
        self.emit(depth, "if n < 0:")
        if f.nullable_at(self.version):
            self.emit(depth + 1, "if n != -1:")
            self.emit(depth + 2, f"raise _bad('{f.name}: {what} ' + str(n))")
            self.emit(depth + 1, "n = None")
        else:
            self.emit(depth + 1, f"raise _bad('{f.name}: null or negative {what} ' + str(n))")
        self.emit(depth, "elif n > end - pos:")
        self.emit(depth + 1, f"raise _bad('{f.name}: {what} ' + str(n) + ' with only ' + "
                             f"str(end - pos) + ' bytes left')")

    def variable(self, depth: int, f) -> None:
        key = repr(f.name)
        if f.type == "uuid":
            self.emit(depth, f"if end - pos < 16: raise _bad('{f.name}: truncated uuid')")
            self.emit(depth, f"d[{key}] = bytes(buf[pos:pos + 16]); pos += 16")
            return
        if f.type == "{}":
            sub = self.fresh("_r")
            self.emit(depth, f"d[{key}], pos = {sub}(buf, pos, end)")
            self.pending.append((sub, f.fields))
            return
        self.length(depth, f, "length" if f.type in ("string", "bytes", "records") else "count")
        if f.nullable_at(self.version):
            self.emit(depth, "if n is None:")
            self.emit(depth + 1, f"d[{key}] = None")
            self.emit(depth, "else:")
            depth += 1
        if f.type == "string":
            self.emit(depth, f"d[{key}] = str(buf[pos:pos + n], 'utf-8'); pos += n")
        elif f.type == "bytes":
            self.emit(depth, f"d[{key}] = bytes(buf[pos:pos + n]); pos += n")
        elif f.type == "records":
            self.emit(depth, f"d[{key}] = buf[pos:pos + n]; pos += n")
        elif f.type in ("[]int32", "[]int64"):
            width = 4 if f.type == "[]int32" else 8
            code = "i" if width == 4 else "q"
            self.emit(depth, f"if {width} * n > end - pos: raise _bad('{f.name}: count ' + "
                             f"str(n) + ' with only ' + str(end - pos) + ' bytes left')")
            self.emit(depth, f"d[{key}] = list(_unpack_from('>' + str(n) + '{code}', buf, pos))"
                             f"; pos += {width} * n")
        elif f.type == "[]string":   # n strings, each at least one byte: n <= end - pos
            self.emit(depth, "items = []")
            self.emit(depth, "for _ in range(n):")
            if self.flexible:
                self.emit(depth + 1, "m = buf[pos]; pos += 1")
                self.emit(depth + 1, "if m & 0x80: m, pos = _uvarint_rest(buf, pos, m)")
                self.emit(depth + 1, "m -= 1")
            else:
                self.emit(depth + 1, f"m, = {self.struct('h')}.unpack_from(buf, pos); pos += 2")
            self.emit(depth + 1, f"if m < 0 or m > end - pos: raise _bad('{f.name}: string "
                                 f"length ' + str(m) + ' with ' + str(end - pos) + ' bytes "
                                 f"left')")
            self.emit(depth + 1, "items.append(str(buf[pos:pos + m], 'utf-8')); pos += m")
            self.emit(depth, f"d[{key}] = items")
        else:   # an array of structs: at least one byte each, so n <= end - pos bounds it
            sub = self.fresh("_r")
            self.emit(depth, "items = []")
            self.emit(depth, "for _ in range(n):")
            self.emit(depth + 1, f"item, pos = {sub}(buf, pos, end)")
            self.emit(depth + 1, "items.append(item)")
            self.emit(depth, f"d[{key}] = items")
            self.pending.append((sub, f.fields))

    def tagged(self, fields) -> None:
        tagged = [f for f in fields if f.tag is not None and f.present(self.version)]
        self.emit(1, "count = buf[pos]; pos += 1")
        self.emit(1, "if count & 0x80: count, pos = _uvarint_rest(buf, pos, count)")
        self.emit(1, "for _ in range(count):")
        self.emit(2, "tag = buf[pos]; pos += 1")
        self.emit(2, "if tag & 0x80: tag, pos = _uvarint_rest(buf, pos, tag)")
        self.emit(2, "size = buf[pos]; pos += 1")
        self.emit(2, "if size & 0x80: size, pos = _uvarint_rest(buf, pos, size)")
        self.emit(2, "if size > end - pos: raise _bad('tagged field ' + str(tag) + "
                     "' of ' + str(size) + ' bytes with only ' + str(end - pos) + ' left')")
        for f in tagged:
            sub = self.fresh("_t")
            self.emit(2, f"if tag == {f.tag}:")
            self.emit(3, f"t, used = {sub}(buf, pos, pos + size)")
            self.emit(3, "if used != pos + size: raise _bad('tagged field ' + str(tag) + "
                         "' has ' + str(pos + size - used) + ' bytes left over')")
            self.emit(3, f"d[{f.name!r}] = t[{f.name!r}]")
            self.pending.append((sub, (_untag(f),), False))
        self.emit(2, "pos += size")



class _WriterGen(_Gen):
    """``def NAME(d, out)`` appending a struct's encoding at one version to the list out."""

    ROOT = "_w0"

    def function(self, name: str, fields, tail: bool) -> None:
        self.emit(0, f"def {name}(d, out):")
        self.emit(1, "get = d.get")
        for run in _fixed_runs(fields, self.version):
            if isinstance(run, list):
                s = self.struct("".join(_FIXED[f.type] for f in run))
                args = ", ".join(f"get({f.name!r}, {f.default!r})" for f in run)
                self.emit(1, f"out.append({s}.pack({args}))")
            else:
                self.variable(1, run)
        if tail and self.flexible:
            self.tagged(fields)
        self.emit(1, "return out")

    def length(self, depth: int, expr: str, f) -> None:
        if self.flexible:
            self.emit(depth, f"out.append(_uvarint_bytes({expr} + 1))")
        else:
            fmt = "h" if f.type == "string" else "i"
            self.emit(depth, f"out.append({self.struct(fmt)}.pack({expr}))")

    def variable(self, depth: int, f) -> None:
        self.emit(depth, f"v = get({f.name!r}, {f.default_expr()})")
        if f.type == "uuid":
            self.emit(depth, "if len(v) != 16: raise ValueError("
                             f"'{f.name}: a uuid is 16 bytes, got ' + str(len(v)))")
            self.emit(depth, "out.append(v)")
            return
        if f.type == "{}":
            sub = self.fresh("_w")
            self.emit(depth, f"{sub}(v, out)")
            self.pending.append((sub, f.fields))
            return
        self.emit(depth, "if v is None:")
        if f.nullable_at(self.version):
            self.emit(depth + 1, "out.append(" + ("b'\\x00'" if self.flexible else
                                                 ("b'\\xff\\xff'" if f.type == "string"
                                                  else "b'\\xff\\xff\\xff\\xff'")) + ")")
        else:
            self.emit(depth + 1, f"raise ValueError('{f.name} cannot be null at version "
                                 f"{self.version}')")
        self.emit(depth, "else:")
        depth += 1
        if f.type == "string":
            self.emit(depth, "v = v.encode('utf-8')")
        if f.type in ("string", "bytes", "records"):
            if f.type == "records":
                self.emit(depth, "n = v.nbytes if type(v) is memoryview else len(v)")
            else:
                self.emit(depth, "n = len(v)")
            self.length(depth, "n", f)
            self.emit(depth, "out.append(v)")
        elif f.type in ("[]int32", "[]int64"):
            code = "i" if f.type == "[]int32" else "q"
            self.length(depth, "len(v)", f)
            self.emit(depth, f"out.append(_pack('>' + str(len(v)) + '{code}', *v))")
        elif f.type == "[]string":
            self.length(depth, "len(v)", f)
            self.emit(depth, "for item in v:")
            self.emit(depth + 1, "item = item.encode('utf-8')")
            if self.flexible:
                self.emit(depth + 1, "out.append(_uvarint_bytes(len(item) + 1))")
            else:
                self.emit(depth + 1, f"out.append({self.struct('h')}.pack(len(item)))")
            self.emit(depth + 1, "out.append(item)")
        else:
            sub = self.fresh("_w")
            self.length(depth, "len(v)", f)
            self.emit(depth, "for item in v:")
            self.emit(depth + 1, f"{sub}(item, out)")
            self.pending.append((sub, f.fields))

    def tagged(self, fields) -> None:
        tagged = sorted((f for f in fields if f.tag is not None and f.present(self.version)),
                        key=lambda f: f.tag)
        if not tagged:
            self.emit(1, "out.append(b'\\x00')")
            return
        self.emit(1, "tags = []")
        for f in tagged:
            sub = self.fresh("_t")
            self.emit(1, f"v = get({f.name!r})")
            self.emit(1, f"if v is not None and v != {f.default_expr()}:")
            self.emit(2, f"body = b''.join({sub}({{{f.name!r}: v}}, []))")
            self.emit(2, f"tags += [_uvarint_bytes({f.tag}), _uvarint_bytes(len(body)), body]")
            self.pending.append((sub, (_untag(f),), False))
        self.emit(1, "out.append(_uvarint_bytes(len(tags) // 3))")
        self.emit(1, "out += tags")



def _untag(f: _Field) -> _Field:
    return _Field(f.name, f.type, f.versions, f.nullable, None, f.default, f.fields)


_GLOBALS = {"_uvarint_rest": _uvarint_rest, "_uvarint_bytes": _uvarint_bytes, "_bad": _bad,
            "_unpack_from": struct.unpack_from, "_pack": struct.pack}
_codecs: dict[tuple[int, str, int, str], Any] = {}
_codecs_lock = threading.Lock()


def _codec(api_key: int, kind: str, version: int, direction: str):
    """The generated reader (direction "read") or writer ("write") of a request or response
    body (kind) at one version; InvalidRequestError if not supported."""
    key = (api_key, kind, version, direction)
    fn = _codecs.get(key)
    if fn is not None:
        return fn
    lo, hi = SUPPORTED_VERSIONS.get(api_key, (1, 0))
    if not lo <= version <= hi:
        if api_key not in SUPPORTED_VERSIONS:
            raise InvalidRequestError(f"unknown API key {api_key}")
        raise InvalidRequestError(f"{API_NAMES[api_key]} version {version} is not supported "
                                  f"(versions {lo}-{hi} are)")
    message = _MESSAGES[(api_key, kind)]
    gen = (_ReaderGen if direction == "read" else _WriterGen)(
        version, version >= message.flexible_from)
    source = gen.build(message.fields)
    namespace = dict(_GLOBALS, **gen.structs)
    exec(compile(source, f"<wire {message.name} v{version} {direction}>", "exec"), namespace)
    fn = namespace[gen.ROOT]
    fn.source = source
    with _codecs_lock:
        _codecs[key] = fn
    return fn


def is_flexible(api_key: int, version: int) -> bool:
    """Does this request/response version use compact encodings and tagged fields?"""
    return version >= _MESSAGES[(api_key, "request")].flexible_from


def request_header_version(api_key: int, version: int) -> int:
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    if api_key == API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0


# -- headers -----------------------------------------------------------------------------
class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_HEAD = struct.Struct(">hhih")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def _skip_tags(buf, pos: int, end: int) -> int:
    """Skip a tagged-field buffer nothing is expected in; the position after it."""
    count = buf[pos]
    pos += 1
    if count & 0x80:
        count, pos = _uvarint_rest(buf, pos, count)
    for _ in range(count):
        tag = buf[pos]
        pos += 1
        if tag & 0x80:
            _, pos = _uvarint_rest(buf, pos, tag)
        size = buf[pos]
        pos += 1
        if size & 0x80:
            size, pos = _uvarint_rest(buf, pos, size)
        if size > end - pos:
            raise InvalidRequestError(f"header tagged field of {size} bytes with only "
                                      f"{end - pos} left")
        pos += size
    return pos


def decode_request_header(frame) -> tuple[RequestHeader, int]:
    """The header of a request frame (without its size prefix) and where its body starts.

    The header's version follows from its API key and version; for an API or version this
    codec does not know, the v1 fields are read (all a server needs to answer or close) and
    the body is taken to start after them."""
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    end = len(buf)
    if end < _HEAD.size:
        raise InvalidRequestError(f"request of {end} bytes is shorter than a header")
    api_key, api_version, correlation_id, n = _HEAD.unpack_from(buf, 0)
    pos = _HEAD.size
    if n < -1 or n > end - pos:
        raise InvalidRequestError(f"client_id length {n} with {end - pos} bytes left")
    client_id = None
    try:
        if n >= 0:
            client_id = str(buf[pos:pos + n], "utf-8")
            pos += n
        header = RequestHeader(api_key, api_version, correlation_id, client_id)
        lo, hi = SUPPORTED_VERSIONS.get(api_key, (1, 0))
        if lo <= api_version <= hi and is_flexible(api_key, api_version):
            pos = _skip_tags(buf, pos, end)
    except (IndexError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"bad request header: {exc}") from None
    return header, pos


def encode_request_header(header: RequestHeader) -> bytes:
    client = None if header.client_id is None else header.client_id.encode("utf-8")
    out = _HEAD.pack(header.api_key, header.api_version, header.correlation_id,
                     -1 if client is None else len(client)) + (client or b"")
    if request_header_version(header.api_key, header.api_version) == 2:
        out += b"\x00"
    return out


# -- bodies ------------------------------------------------------------------------------
def _read(api_key: int, kind: str, version: int, frame, pos: int,
          header: RequestHeader | None = None) -> dict:
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    try:
        reader = _codec(api_key, kind, version, "read")
        end = len(buf)
        body, pos = reader(buf, pos, end)
    except InvalidRequestError as exc:
        exc.header = header
        raise
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"{API_NAMES.get(api_key, api_key)} v{version} {kind}: "
                                  f"truncated or malformed ({exc})", header) from None
    # A request may carry bytes after the fields its version names: Kafka's broker reads
    # those fields and ignores the rest, and clients rely on it (librdkafka's all-topics
    # Metadata v12 carries 3 such bytes). A response must be exactly its fields.
    if pos != end and kind != "request":
        raise InvalidRequestError(f"{API_NAMES[api_key]} v{version} {kind}: {end - pos} "
                                  f"bytes after the body", header)
    return body


def decode_request_body(header: RequestHeader, frame, pos: int) -> dict:
    """The body of a request frame whose header ``decode_request_header`` read."""
    return _read(header.api_key, "request", header.api_version, frame, pos, header)


def decode_request(frame) -> tuple[RequestHeader, dict]:
    """A request frame (without its size prefix): its header and body."""
    header, pos = decode_request_header(frame)
    return header, decode_request_body(header, frame, pos)


def _framed(head: bytes, parts: list) -> list:
    size = len(head) + sum(p.nbytes if type(p) is memoryview else len(p) for p in parts)
    parts.insert(0, _I32.pack(size) + head)
    return parts


def encode_request_parts(header: RequestHeader, body: dict) -> list:
    """A request as a list of buffers, the 4-byte size prefix included (records fields are
    in it as given, not copied)."""
    writer = _codec(header.api_key, "request", header.api_version, "write")
    return _framed(encode_request_header(header), writer(body, []))


def encode_request(header: RequestHeader, body: dict) -> bytes:
    """A request frame, the size prefix included."""
    return b"".join(encode_request_parts(header, body))


def encode_response_parts(header: RequestHeader, body: dict) -> list:
    """The response to the request with ``header``, as a list of buffers, the 4-byte size
    prefix included (records fields are in it as given, not copied)."""
    writer = _codec(header.api_key, "response", header.api_version, "write")
    head = _I32.pack(header.correlation_id)
    if response_header_version(header.api_key, header.api_version) == 1:
        head += b"\x00"
    return _framed(head, writer(body, []))


def encode_response(header: RequestHeader, body: dict) -> bytes:
    """The response frame to the request with ``header``, the size prefix included."""
    return b"".join(encode_response_parts(header, body))


def decode_response(api_key: int, api_version: int, frame) -> tuple[int, dict]:
    """A response frame (without its size prefix) to a request of that API and version:
    (correlation_id, body). Records fields are memoryview slices of ``frame``."""
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    if len(buf) < 4:
        raise InvalidRequestError(f"response of {len(buf)} bytes is shorter than a header")
    correlation_id, = _I32.unpack_from(buf, 0)
    pos = 4
    if api_key in SUPPORTED_VERSIONS and response_header_version(api_key, api_version) == 1:
        try:
            pos = _skip_tags(buf, pos, len(buf))
        except IndexError:
            raise InvalidRequestError("truncated response header") from None
    return correlation_id, _read(api_key, "response", api_version, buf, pos)


def api_versions_error_body() -> dict:
    """KIP-511: the ApiVersions answer to a version the broker does not know is a v0 body
    with UNSUPPORTED_VERSION and ApiVersions' own range, so the client retries within it."""
    lo, hi = SUPPORTED_VERSIONS[API_VERSIONS]
    return {"error_code": ERRORS_BY_NAME["UNSUPPORTED_VERSION"].code,
            "api_keys": [{"api_key": API_VERSIONS, "min_version": lo, "max_version": hi}]}


# -- Kafka's error codes -----------------------------------------------------------------
# code, name, retriable (as Kafka's Java client classes them: a RetriableException or an
# InvalidMetadataException). From org.apache.kafka.common.protocol.Errors.
_ERROR_TABLE = """
-1 UNKNOWN_SERVER_ERROR 0
0 NONE 0
1 OFFSET_OUT_OF_RANGE 0
2 CORRUPT_MESSAGE 1
3 UNKNOWN_TOPIC_OR_PARTITION 1
4 INVALID_FETCH_SIZE 0
5 LEADER_NOT_AVAILABLE 1
6 NOT_LEADER_OR_FOLLOWER 1
7 REQUEST_TIMED_OUT 1
8 BROKER_NOT_AVAILABLE 0
9 REPLICA_NOT_AVAILABLE 1
10 MESSAGE_TOO_LARGE 0
11 STALE_CONTROLLER_EPOCH 0
12 OFFSET_METADATA_TOO_LARGE 0
13 NETWORK_EXCEPTION 1
14 COORDINATOR_LOAD_IN_PROGRESS 1
15 COORDINATOR_NOT_AVAILABLE 1
16 NOT_COORDINATOR 1
17 INVALID_TOPIC_EXCEPTION 0
18 RECORD_LIST_TOO_LARGE 0
19 NOT_ENOUGH_REPLICAS 1
20 NOT_ENOUGH_REPLICAS_AFTER_APPEND 1
21 INVALID_REQUIRED_ACKS 0
22 ILLEGAL_GENERATION 0
23 INCONSISTENT_GROUP_PROTOCOL 0
24 INVALID_GROUP_ID 0
25 UNKNOWN_MEMBER_ID 0
26 INVALID_SESSION_TIMEOUT 0
27 REBALANCE_IN_PROGRESS 0
28 INVALID_COMMIT_OFFSET_SIZE 0
29 TOPIC_AUTHORIZATION_FAILED 0
30 GROUP_AUTHORIZATION_FAILED 0
31 CLUSTER_AUTHORIZATION_FAILED 0
32 INVALID_TIMESTAMP 0
33 UNSUPPORTED_SASL_MECHANISM 0
34 ILLEGAL_SASL_STATE 0
35 UNSUPPORTED_VERSION 0
36 TOPIC_ALREADY_EXISTS 0
37 INVALID_PARTITIONS 0
38 INVALID_REPLICATION_FACTOR 0
39 INVALID_REPLICA_ASSIGNMENT 0
40 INVALID_CONFIG 0
41 NOT_CONTROLLER 1
42 INVALID_REQUEST 0
43 UNSUPPORTED_FOR_MESSAGE_FORMAT 0
44 POLICY_VIOLATION 0
45 OUT_OF_ORDER_SEQUENCE_NUMBER 0
46 DUPLICATE_SEQUENCE_NUMBER 0
47 INVALID_PRODUCER_EPOCH 0
48 INVALID_TXN_STATE 0
49 INVALID_PRODUCER_ID_MAPPING 0
50 INVALID_TRANSACTION_TIMEOUT 0
51 CONCURRENT_TRANSACTIONS 1
52 TRANSACTION_COORDINATOR_FENCED 0
53 TRANSACTIONAL_ID_AUTHORIZATION_FAILED 0
54 SECURITY_DISABLED 0
55 OPERATION_NOT_ATTEMPTED 0
56 KAFKA_STORAGE_ERROR 1
57 LOG_DIR_NOT_FOUND 0
58 SASL_AUTHENTICATION_FAILED 0
59 UNKNOWN_PRODUCER_ID 0
60 REASSIGNMENT_IN_PROGRESS 0
61 DELEGATION_TOKEN_AUTH_DISABLED 0
62 DELEGATION_TOKEN_NOT_FOUND 0
63 DELEGATION_TOKEN_OWNER_MISMATCH 0
64 DELEGATION_TOKEN_REQUEST_NOT_ALLOWED 0
65 DELEGATION_TOKEN_AUTHORIZATION_FAILED 0
66 DELEGATION_TOKEN_EXPIRED 0
67 INVALID_PRINCIPAL_TYPE 0
68 NON_EMPTY_GROUP 0
69 GROUP_ID_NOT_FOUND 0
70 FETCH_SESSION_ID_NOT_FOUND 1
71 INVALID_FETCH_SESSION_EPOCH 1
72 LISTENER_NOT_FOUND 1
73 TOPIC_DELETION_DISABLED 0
74 FENCED_LEADER_EPOCH 1
75 UNKNOWN_LEADER_EPOCH 1
76 UNSUPPORTED_COMPRESSION_TYPE 0
77 STALE_BROKER_EPOCH 0
78 OFFSET_NOT_AVAILABLE 1
79 MEMBER_ID_REQUIRED 0
80 PREFERRED_LEADER_NOT_AVAILABLE 1
81 GROUP_MAX_SIZE_REACHED 0
82 FENCED_INSTANCE_ID 0
83 ELIGIBLE_LEADERS_NOT_AVAILABLE 1
84 ELECTION_NOT_NEEDED 1
85 NO_REASSIGNMENT_IN_PROGRESS 0
86 GROUP_SUBSCRIBED_TO_TOPIC 0
87 INVALID_RECORD 0
88 UNSTABLE_OFFSET_COMMIT 1
89 THROTTLING_QUOTA_EXCEEDED 1
90 PRODUCER_FENCED 0
91 RESOURCE_NOT_FOUND 0
92 DUPLICATE_RESOURCE 0
93 UNACCEPTABLE_CREDENTIAL 0
94 INCONSISTENT_VOTER_SET 0
95 INVALID_UPDATE_VERSION 0
96 FEATURE_UPDATE_FAILED 0
97 PRINCIPAL_DESERIALIZATION_FAILURE 0
98 SNAPSHOT_NOT_FOUND 0
99 POSITION_OUT_OF_RANGE 0
100 UNKNOWN_TOPIC_ID 1
101 DUPLICATE_BROKER_REGISTRATION 0
102 BROKER_ID_NOT_REGISTERED 0
103 INCONSISTENT_TOPIC_ID 1
104 INCONSISTENT_CLUSTER_ID 0
105 TRANSACTIONAL_ID_NOT_FOUND 0
106 FETCH_SESSION_TOPIC_ID_ERROR 1
107 INELIGIBLE_REPLICA 0
108 NEW_LEADER_ELECTED 0
109 OFFSET_MOVED_TO_TIERED_STORAGE 0
110 FENCED_MEMBER_EPOCH 0
111 UNRELEASED_INSTANCE_ID 0
112 UNSUPPORTED_ASSIGNOR 0
113 STALE_MEMBER_EPOCH 0
114 MISMATCHED_ENDPOINT_TYPE 0
115 UNSUPPORTED_ENDPOINT_TYPE 0
116 UNKNOWN_CONTROLLER_ID 0
117 UNKNOWN_SUBSCRIPTION_ID 0
118 TELEMETRY_TOO_LARGE 0
119 INVALID_REGISTRATION 0
120 TRANSACTION_ABORTABLE 0
"""


class ErrorCode(NamedTuple):
    code: int
    name: str
    retriable: bool


ERRORS: dict[int, ErrorCode] = {}
for _line in _ERROR_TABLE.split("\n"):
    if _line:
        _code, _name, _retriable = _line.split()
        ERRORS[int(_code)] = ErrorCode(int(_code), _name, _retriable == "1")
ERRORS_BY_NAME: dict[str, ErrorCode] = {e.name: e for e in ERRORS.values()}
NONE = 0

#: The typed errors of actors.errors that have a Kafka error code (class name -> code name).
_TYPED = {
    "OffsetOutOfRangeError": "OFFSET_OUT_OF_RANGE",
    "CorruptRecordError": "CORRUPT_MESSAGE",
    "UnknownTopicOrPartitionError": "UNKNOWN_TOPIC_OR_PARTITION",
    "LeaderNotAvailableError": "LEADER_NOT_AVAILABLE",
    "NotLeaderForPartitionError": "NOT_LEADER_OR_FOLLOWER",
    "RequestTimedOutError": "REQUEST_TIMED_OUT",
    "BrokerNotAvailableError": "BROKER_NOT_AVAILABLE",
    "RecordTooLargeError": "MESSAGE_TOO_LARGE",
    "StaleControllerEpochError": "STALE_CONTROLLER_EPOCH",
    "CoordinatorLoadInProgressError": "COORDINATOR_LOAD_IN_PROGRESS",
    "CoordinatorNotAvailableError": "COORDINATOR_NOT_AVAILABLE",
    "NotCoordinatorError": "NOT_COORDINATOR",
    "InvalidTopicError": "INVALID_TOPIC_EXCEPTION",
    "NotEnoughReplicasError": "NOT_ENOUGH_REPLICAS",
    "NotEnoughReplicasAfterAppendError": "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "IllegalGenerationError": "ILLEGAL_GENERATION",
    "InconsistentGroupProtocolError": "INCONSISTENT_GROUP_PROTOCOL",
    "UnknownMemberIdError": "UNKNOWN_MEMBER_ID",
    "InvalidSessionTimeoutError": "INVALID_SESSION_TIMEOUT",
    "RebalanceInProgressError": "REBALANCE_IN_PROGRESS",
    "UnsupportedVersionError": "UNSUPPORTED_VERSION",
    "TopicAlreadyExistsError": "TOPIC_ALREADY_EXISTS",
    "InvalidPartitionsError": "INVALID_PARTITIONS",
    "InvalidReplicationFactorError": "INVALID_REPLICATION_FACTOR",
    "InvalidReplicaAssignmentError": "INVALID_REPLICA_ASSIGNMENT",
    "InvalidConfigurationError": "INVALID_CONFIG",
    "NotControllerError": "NOT_CONTROLLER",
    "InvalidRequestError": "INVALID_REQUEST",
    "KafkaStorageError": "KAFKA_STORAGE_ERROR",
    "ReassignmentInProgressError": "REASSIGNMENT_IN_PROGRESS",
    "NonEmptyGroupError": "NON_EMPTY_GROUP",
    "GroupIdNotFoundError": "GROUP_ID_NOT_FOUND",
    "FencedLeaderEpochError": "FENCED_LEADER_EPOCH",
    "UnknownLeaderEpochError": "UNKNOWN_LEADER_EPOCH",
    "UnsupportedCodecError": "UNSUPPORTED_COMPRESSION_TYPE",
    "FencedInstanceIdError": "FENCED_INSTANCE_ID",
    "InvalidRecordError": "INVALID_RECORD",
    "InvalidUpdateVersionError": "INVALID_UPDATE_VERSION",
    "InconsistentClusterIdError": "INCONSISTENT_CLUSTER_ID",
    "KafkaTimeoutError": "REQUEST_TIMED_OUT",       # the client's own; the wire's is 7
    "NetworkError": "NETWORK_EXCEPTION",
    "TopicAuthorizationFailedError": "TOPIC_AUTHORIZATION_FAILED",
    "GroupAuthorizationFailedError": "GROUP_AUTHORIZATION_FAILED",
    "ClusterAuthorizationFailedError": "CLUSTER_AUTHORIZATION_FAILED",
    "SecurityDisabledError": "SECURITY_DISABLED",
    # the idempotent producer
    "OutOfOrderSequenceError": "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "InvalidProducerEpochError": "INVALID_PRODUCER_EPOCH",
    "UnknownProducerIdError": "UNKNOWN_PRODUCER_ID",
    "SaslAuthenticationError": "SASL_AUTHENTICATION_FAILED",
    "UnsupportedSaslMechanismError": "UNSUPPORTED_SASL_MECHANISM",
    "IllegalSaslStateError": "ILLEGAL_SASL_STATE",
}
_CLASS_CODES: dict[type, int] = {}
_CODE_CLASSES: dict[int, type] = {}
for _cls_name, _name in _TYPED.items():
    _cls = InvalidRequestError if _cls_name == "InvalidRequestError" \
        else getattr(_errors, _cls_name)
    _CLASS_CODES[_cls] = ERRORS_BY_NAME[_name].code
    if _cls_name != "KafkaTimeoutError":
        _CODE_CLASSES[ERRORS_BY_NAME[_name].code] = _cls


class BrokerResponseError(KafkaError):
    """An error code from a broker that no typed error of actors.errors stands for: its
    ``code``, ``name`` and ``retriable`` are Kafka's."""

    def __init__(self, code: int, message: str = ""):
        info = ERRORS.get(code) or ErrorCode(code, f"UNKNOWN_ERROR_CODE_{code}", False)
        super().__init__(f"{info.name} ({code}){': ' + message if message else ''}")
        self.code = code
        self.name = info.name
        self.retriable = info.retriable


def error_code(exc: BaseException) -> int:
    """The Kafka error code to answer for ``exc``: its class's (or the nearest base class's
    with one), UNKNOWN_SERVER_ERROR (-1) for anything else. A storage-layer batch with an
    unknown magic (UnsupportedVersionError, a CorruptRecordError) is a CORRUPT_MESSAGE on
    the wire: the wire's UNSUPPORTED_VERSION speaks of API versions."""
    if isinstance(exc, BrokerResponseError):
        return exc.code
    if type(exc) is _errors.UnsupportedVersionError:
        return ERRORS_BY_NAME["CORRUPT_MESSAGE"].code
    for cls in type(exc).__mro__:
        code = _CLASS_CODES.get(cls)
        if code is not None:
            return code
    return -1


def error_for_code(code: int, message: str = "") -> KafkaError | None:
    """The typed error for a Kafka error code (None for NONE): the actors.errors class
    when one exists, else a BrokerResponseError carrying the code."""
    if code == NONE:
        return None
    cls = _CODE_CLASSES.get(code)
    if cls is None:
        return BrokerResponseError(code, message)
    return cls(message or ERRORS[code].name)


__all__ = [
    "PRODUCE", "FETCH", "LIST_OFFSETS", "METADATA", "API_VERSIONS", "OFFSET_FOR_LEADER_EPOCH",
    "OFFSET_COMMIT", "OFFSET_FETCH", "FIND_COORDINATOR", "JOIN_GROUP", "HEARTBEAT",
    "LEAVE_GROUP", "SYNC_GROUP", "DESCRIBE_GROUPS", "LIST_GROUPS", "DELETE_GROUPS",
    "CREATE_TOPICS", "DELETE_TOPICS", "DELETE_RECORDS", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
    "CREATE_PARTITIONS", "INCREMENTAL_ALTER_CONFIGS", "DESCRIBE_CLUSTER",
    "DESCRIBE_ACLS", "CREATE_ACLS", "DELETE_ACLS",
    "INIT_PRODUCER_ID",
    "SASL_HANDSHAKE", "SASL_AUTHENTICATE",
    "SUPPORTED_VERSIONS", "API_NAMES", "InvalidRequestError", "BrokerResponseError",
    "RequestHeader", "ErrorCode", "ERRORS", "ERRORS_BY_NAME", "NONE", "error_code",
    "error_for_code", "decode_request_header", "decode_request_body", "decode_request",
    "encode_request", "encode_request_parts", "encode_response", "encode_response_parts",
    "decode_response", "encode_request_header", "is_flexible", "request_header_version",
    "response_header_version", "api_versions_error_body",
]
