"""Client configuration checks shared by Producer, SimpleConsumer and Consumer.

Each client owns its table of defaults (kafka-python's names); these helpers only check a
given dict against such a table, so no client imports another to validate its config.
Pure functions; thread-safe.
"""

from __future__ import annotations

from ..errors import InvalidConfigurationError


def validate_config(given: dict, defaults: dict, what: str) -> dict:
    """``defaults`` updated with ``given``; InvalidConfigurationError naming every unknown
    key (and listing the known ones) when ``given`` has a key ``defaults`` lacks."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise InvalidConfigurationError(
            f"unknown {what} config {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(sorted(defaults))}")
    config = dict(defaults)
    config.update(given)
    return config


def positive_int(config: dict, name: str, minimum: int = 0) -> int:
    """``config[name]`` when it is an int (not a bool) ``>= minimum``, else
    InvalidConfigurationError."""
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
