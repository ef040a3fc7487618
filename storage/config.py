"""LogConfig: the per-topic settings of a partition log, with Kafka's names and defaults.

``LogConfig(segment_bytes=...)`` takes Python names; ``LogConfig.from_properties`` takes
Kafka's dotted names (``{"segment.bytes": "1048576"}``) as topics and brokers give them.
Every value is checked; a bad one raises InvalidConfigurationError naming the setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidConfigurationError

DAY_MS = 24 * 3600 * 1000
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * DAY_MS
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    flush_messages: int | None = None      # fsync after this many messages (None: never)
    flush_ms: int | None = None            # fsync when the oldest unflushed write is this old
    retention_ms: int = 7 * DAY_MS         # -1: keep forever
    retention_bytes: int = -1              # -1: no size limit
    cleanup_policy: str = "delete"
    delete_retention_ms: int = DAY_MS      # how long tombstones survive compaction
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    message_timestamp_type: str = "CreateTime"
    file_delete_delay_ms: int = 60000
    cleaner_dedupe_buffer_size: int = 128 << 20   # memory bound of the compactor's offset map

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "min_cleanable_dirty_ratio":
                if not isinstance(value, (int, float)) or isinstance(value, bool) \
                        or not 0.0 <= value <= 1.0:
                    raise InvalidConfigurationError(
                        f"min.cleanable.dirty.ratio must be a number in [0, 1], got {value!r}")
            elif f.name == "cleanup_policy":
                if value not in CLEANUP_POLICIES:
                    raise InvalidConfigurationError(
                        f"cleanup.policy must be one of {', '.join(CLEANUP_POLICIES)}, "
                        f"got {value!r}")
            elif f.name == "message_timestamp_type":
                if value not in TIMESTAMP_TYPES:
                    raise InvalidConfigurationError(
                        f"message.timestamp.type must be CreateTime or LogAppendTime, "
                        f"got {value!r}")
            elif f.name in ("flush_messages", "flush_ms") and value is None:
                continue
            elif not isinstance(value, int) or isinstance(value, bool):
                raise InvalidConfigurationError(
                    f"{_dotted(f.name)} must be an integer, got {value!r}")
        _at_least("segment.bytes", self.segment_bytes, 14)  # Kafka's minimum: a batch header
        if self.segment_bytes > 2**31 - 1:
            raise InvalidConfigurationError(
                f"segment.bytes must be at most {2**31 - 1} (positions are int32), "
                f"got {self.segment_bytes}")
        _at_least("segment.ms", self.segment_ms, 1)
        _at_least("index.interval.bytes", self.index_interval_bytes, 0)
        _at_least("max.message.bytes", self.max_message_bytes, 0)
        if self.flush_messages is not None:
            _at_least("flush.messages", self.flush_messages, 1)
        if self.flush_ms is not None:
            _at_least("flush.ms", self.flush_ms, 0)
        _at_least("retention.ms", self.retention_ms, -1)
        _at_least("retention.bytes", self.retention_bytes, -1)
        _at_least("delete.retention.ms", self.delete_retention_ms, 0)
        _at_least("min.compaction.lag.ms", self.min_compaction_lag_ms, 0)
        _at_least("file.delete.delay.ms", self.file_delete_delay_ms, 0)
        _at_least("log.cleaner.dedupe.buffer.size", self.cleaner_dedupe_buffer_size, 1024)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_properties(cls, props: Mapping[str, Any] | None = None, *,
                        base: "LogConfig | None" = None) -> "LogConfig":
        """A LogConfig from Kafka's dotted names; values may be strings (as from a CLI or
        ZooKeeper). Unknown names raise InvalidConfigurationError."""
        values: dict[str, Any] = {}
        for key, raw in (props or {}).items():
            name = _PROPERTY_NAMES.get(key)
            if name is None:
                raise InvalidConfigurationError(
                    f"unknown topic config {key!r}; known: {', '.join(sorted(_PROPERTY_NAMES))}")
            values[name] = _coerce(key, name, raw)
        return dataclasses.replace(base or cls(), **values)

    def to_properties(self) -> dict[str, str]:
        out = {}
        for dotted, name in _PROPERTY_NAMES.items():
            value = getattr(self, name)
            out[dotted] = "" if value is None else str(value)
        return out


def _dotted(name: str) -> str:
    for dotted, n in _PROPERTY_NAMES.items():
        if n == name:
            return dotted
    return name


def _at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise InvalidConfigurationError(f"{name} must be at least {minimum}, got {value}")


_PROPERTY_NAMES = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.interval.bytes": "index_interval_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "max.message.bytes": "max_message_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "cleanup_policy",
    "delete.retention.ms": "delete_retention_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "message.timestamp.type": "message_timestamp_type",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "log.cleaner.dedupe.buffer.size": "cleaner_dedupe_buffer_size",
}


def _coerce(key: str, name: str, raw: Any) -> Any:
    if name in ("cleanup_policy", "message_timestamp_type"):
        if not isinstance(raw, str):
            raise InvalidConfigurationError(f"{key} must be a string, got {raw!r}")
        return raw.replace(" ", "")
    if name == "min_cleanable_dirty_ratio":
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise InvalidConfigurationError(f"{key} must be a number, got {raw!r}") from None
    if name in ("flush_messages", "flush_ms") and raw in (None, ""):
        return None
    if isinstance(raw, bool):
        raise InvalidConfigurationError(f"{key} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise InvalidConfigurationError(f"{key} must be an integer, got {raw!r}")
