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
]
