"""The server side of the protocol: Broker, PartitionReplica, Controller (and, as replication
and groups land, the ISR logic, the leader-epoch cache and the group coordinator).

Imports ``actors.protocol`` (and the shared top-level modules), never ``actors.client``.
"""
