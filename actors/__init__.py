"""raykafka's actors and client API.

    from actors import Cluster, Admin, Producer, Consumer, SimpleConsumer, Record, RecordMetadata

The names are imported lazily, so ``from actors.errors import ...`` stays cheap (no Ray).
"""

from . import _rayenv

_rayenv.at_import()  # safe in either import order (see _rayenv)

_EXPORTS = {
    "Cluster": ("actors.cluster", "Cluster"),
    "Admin": ("actors.client.admin", "Admin"),
    "Producer": ("actors.client.producer", "Producer"),
    "Consumer": ("actors.client.consumer", "Consumer"),
    "SimpleConsumer": ("actors.client.simple_consumer", "SimpleConsumer"),
    "Record": ("actors.types", "Record"),
    "RecordMetadata": ("actors.types", "RecordMetadata"),
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'actors' has no attribute {name!r}")
