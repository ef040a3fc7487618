"""The client API's value types: ``Record`` (what consumers return) and ``RecordMetadata``
(what a producer's future resolves to). Plain NamedTuples: cheap to build by the million,
picklable across Ray, comparable and unpackable like tuples.
"""

from __future__ import annotations

from typing import NamedTuple


class Record(NamedTuple):
    """One consumed record.

    ``key``/``value`` are ``bytes`` or None (null) unless a deserializer is set;
    ``headers`` is a list of ``(str, bytes)`` (a header value may be None);
    ``timestamp_type`` is 0 (CreateTime) or 1 (LogAppendTime).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: object
    value: object
    headers: list


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written.

    ``offset`` is -1 when the producer did not wait for the answer (``acks=0``).
    ``timestamp`` is the record's CreateTime, or the broker's LogAppendTime when the topic
    uses that. The extra fields (with defaults) follow kafka-python: ``log_start_offset``
    (-1 when unknown) and the serialized key/value sizes in bytes (-1 for null).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    log_start_offset: int = -1
    serialized_key_size: int = -1
    serialized_value_size: int = -1
