"""Typed errors of the storage layer.

The storage layer imports nothing else of ours, so the base class of every error a user can
catch, ``KafkaError``, is defined here; ``actors.errors`` re-exports these same classes and
adds the cluster's own. Names follow Kafka's (kafka-python's spelling).
"""


class KafkaError(Exception):
    """Base of every raykafka error. ``retriable`` says whether a retry may succeed."""

    retriable = False


class CorruptRecordError(KafkaError):
    """Bytes that claim to be a record batch are not: bad CRC, bad length, bad varint...

    The message says what was wrong and where (the byte position when known).
    """


class InvalidRecordError(KafkaError):
    """A well-formed batch that the log refuses (e.g. offsets not increasing)."""


class UnsupportedCodecError(CorruptRecordError):
    """A batch names a compression codec that does not exist or cannot be used."""


class UnsupportedVersionError(CorruptRecordError):
    """A batch with a magic byte this code does not know."""


class RecordTooLargeError(KafkaError):
    """A batch larger than ``max.message.bytes`` (or a producer's ``max_request_size``)."""


class OffsetOutOfRangeError(KafkaError):
    """An offset below the log start offset or past the log end offset."""


class InvalidConfigurationError(KafkaError):
    """A configuration value that is unknown, of the wrong type or out of range."""


class KafkaStorageError(KafkaError):
    """The log cannot be used: its directory is missing, locked, or closed."""


class OutOfOrderSequenceError(KafkaError):
    """An idempotent producer's batch whose first sequence does not follow the last one the
    partition has from that producer (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER): a gap."""


class InvalidProducerEpochError(KafkaError):
    """An idempotent producer's batch with an epoch older than the partition has seen
    from that producer id (Kafka's INVALID_PRODUCER_EPOCH)."""


class UnknownProducerIdError(KafkaError):
    """The partition holds no state of the producer id (Kafka's UNKNOWN_PRODUCER_ID; a
    Kafka 2.5+ broker no longer answers it, older brokers did after retention)."""


class CorruptSnapshotError(KafkaError):
    """A producer-state ``.snapshot`` file that cannot be read: short, a bad version or
    CRC. The log deletes it and rebuilds the state from the log instead."""


__all__ = [
    "KafkaError",
    "CorruptRecordError",
    "InvalidRecordError",
    "UnsupportedCodecError",
    "UnsupportedVersionError",
    "RecordTooLargeError",
    "OffsetOutOfRangeError",
    "InvalidConfigurationError",
    "KafkaStorageError",
    "OutOfOrderSequenceError",
    "InvalidProducerEpochError",
    "UnknownProducerIdError",
    "CorruptSnapshotError",
]
