"""InitProducerId on the Kafka listener: producer ids for idempotent producers (KIP-98).

``ProducerIdApis(generate).handlers()`` gives ``{INIT_PRODUCER_ID: handler}`` for KafkaApis
(handlers.py); ``generate()`` hands out a cluster-unique producer id (the broker's
coordination.producer_ids.ProducerIdManager, blocks reserved in ZooKeeper).

As Kafka answers without a transactional id: every request gets a new producer id at
epoch 0, including v3+ requests that carry the producer's current id and epoch (Kafka
"blindly accepts" them, TransactionCoordinator.handleInitProducerId; the producer then
starts its sequences at 0 under the new id). Only one of the two set is INVALID_REQUEST,
as Kafka's KafkaApis checks.

Not implemented: transactions. A transactional id is answered UNSUPPORTED_VERSION (as a
Kafka-compatible broker with transactions disabled answers, e.g. Redpanda's; a
non-retriable error every client reports as fatal for its transactional producer), an
empty one INVALID_REQUEST (as Kafka). Thread-safe: no state of its own.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from .. import wire
from ..errors import CoordinatorNotAvailableError, KafkaError
from .authorizer import CLUSTER, Access
from .network import Request

log = logging.getLogger(__name__)
_ERR = wire.ERRORS_BY_NAME


class ProducerIdApis:
    """The InitProducerId handler over ``generate`` (see the module docstring)."""

    def __init__(self, generate: Callable[[], int], access: Access | None = None):
        self.generate = generate
        self.access = access or Access()     # Kafka's ACLs (authorizer.py)
        self.handed_out = 0

    def handlers(self) -> dict[int, Callable[[Request], Any]]:
        return {wire.INIT_PRODUCER_ID: self.init_producer_id}

    def init_producer_id(self, request: Request):
        body = wire.decode_request_body(request.header, request.body, 0)
        tid = body["transactional_id"]
        pid, epoch = body["producer_id"], body["producer_epoch"]
        if tid is not None:
            code = _ERR["INVALID_REQUEST" if tid == "" else "UNSUPPORTED_VERSION"].code
        elif (pid == -1) != (epoch == -1):
            code = _ERR["INVALID_REQUEST"].code
        elif not (self.access.allowed(request, "IdempotentWrite", "Cluster", CLUSTER)
                  or self.access.allowed_any(request, "Write", "Topic")):
            # Kafka: IdempotentWrite on the cluster, or Write on some topic
            code = _ERR["CLUSTER_AUTHORIZATION_FAILED"].code
        else:
            try:
                new = self.generate()
            except Exception as exc:  # noqa: BLE001 - answered as a retriable error
                log.warning("InitProducerId: no producer id: %s", exc)
                if not isinstance(exc, KafkaError):
                    exc = CoordinatorNotAvailableError(f"no producer id block: {exc}")
                code = wire.error_code(exc)
            else:
                self.handed_out += 1
                return wire.encode_response_parts(request.header, {
                    "throttle_time_ms": 0, "error_code": wire.NONE, "producer_id": new,
                    "producer_epoch": 0})
        return wire.encode_response_parts(request.header, {
            "throttle_time_ms": 0, "error_code": code, "producer_id": -1,
            "producer_epoch": -1})


__all__ = ["ProducerIdApis"]
