"""The client side of the protocol: Metadata, Admin, Producer, Consumer, SimpleConsumer, the
retry policy (and, with consumer groups, the member actor and the assignors).

Imports ``actors.protocol`` (and the shared top-level modules), never ``actors.server``.
"""
