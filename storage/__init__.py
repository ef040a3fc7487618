"""The storage engine: record batches, segments, indexes and the partition Log.

Pure Python (no Ray, no ZooKeeper); imports nothing else of raykafka's.
"""

from .errors import (CorruptRecordError, InvalidConfigurationError, KafkaError,
                     KafkaStorageError, OffsetOutOfRangeError, RecordTooLargeError)
from .log import Log, LogConfig

__all__ = ["Log", "LogConfig", "KafkaError", "CorruptRecordError", "OffsetOutOfRangeError",
           "RecordTooLargeError", "InvalidConfigurationError", "KafkaStorageError"]
