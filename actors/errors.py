"""Every error a raykafka user can catch, under one base class ``KafkaError``.

The storage layer's errors are defined in ``storage.errors`` (it imports nothing of ours);
they are re-exported here as the very same classes.
"""

from storage.errors import (CorruptRecordError, InvalidConfigurationError, InvalidRecordError,
                            KafkaError, KafkaStorageError, OffsetOutOfRangeError,
                            RecordTooLargeError, UnsupportedCodecError, UnsupportedVersionError)

__all__ = [
    "KafkaError", "CorruptRecordError", "InvalidConfigurationError", "InvalidRecordError",
    "KafkaStorageError", "OffsetOutOfRangeError", "RecordTooLargeError",
    "UnsupportedCodecError", "UnsupportedVersionError",
]
