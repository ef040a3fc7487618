"""The controller's channel to the brokers (Kafka's ControllerChannelManager), without blocking.

The controller's loop never waits on a broker. ``ControllerChannel.send`` hands a request to
the transport and returns an ``InFlightRequest`` at once; a later tick calls ``collect``,
which asks the transport which answers are in (``ray.wait`` with a zero timeout behind
``RayBrokerTransport``) and settles each request as DELIVERED, FAILED, TIMED_OUT or STALE.

Rules (the invariants the controller relies on):

- At most one request is in flight per broker, as Kafka's one send thread per broker: a
  broker sees the controller's requests in the order they were sent, so a StopReplica can
  never overtake the LeaderAndIsr sent before it (Ray runs a threaded actor's calls
  concurrently, so two requests in flight at once could run in either order).
- Every request is stamped ``(controller_epoch, request_id)``, the id growing for the life
  of this channel. Brokers refuse a stamp older than one they applied, and an answer is
  accepted only from the request currently in flight for that broker, sent to the broker
  incarnation (registration czxid) that is live now; anything else is STALE and changes
  nothing (a late answer to an abandoned, timed-out request; an answer from a broker that
  has since restarted).
- Retries back off, and never stop for a live broker: a failed or timed-out request waits
  ``backoff_s(attempt)`` before its broker gets another request of that kind; after
  ``MAX_ATTEMPTS`` failures of the same payload the channel parks it, which sends it again
  only every ``PARKED_RETRY_S`` until it is delivered, the payload changes or the broker
  registers again (Kafka's controller retries a live broker until it answers: a broker
  that failed its first requests while starting on a busy machine must not go without its
  partitions and metadata for the rest of its life). Nothing here retries by itself: the
  controller's next tick decides again what each broker still lacks.

Not thread-safe: the controller's loop thread is its only user. The transport's
``on_answer`` callback (which only sets the loop's wake event) may run on any thread.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 0.2
BACKOFF_MAX_S = 5.0
PARKED_RETRY_S = 30.0


class RequestKind(str, enum.Enum):
    """A controller request, by the Broker method that serves it."""

    LEADER_AND_ISR = "leader_and_isr"
    UPDATE_METADATA = "update_metadata"
    STOP_REPLICA = "stop_replicas"


#: How long an answer may take before the request counts as lost. LeaderAndIsr may start
#: replica actors (seconds on a loaded machine); StopReplica closes logs and deletes data.
#: How long one broker watch (``Broker.await_stop``) waits before it answers "running" and
#: is sent again: bounds the Broker threads a deposed controller's watches hold.
WATCH_TIMEOUT_S = 30.0

REQUEST_TIMEOUT_S = {RequestKind.LEADER_AND_ISR: 30.0, RequestKind.UPDATE_METADATA: 10.0,
                     RequestKind.STOP_REPLICA: 30.0}


class RequestStatus(str, enum.Enum):
    IN_FLIGHT = "in_flight"
    DELIVERED = "delivered"      # the broker answered this request without error
    FAILED = "failed"            # the broker raised, or could not be reached
    TIMED_OUT = "timed_out"      # no answer by the deadline: abandoned
    STALE = "stale"              # an answer nobody waits for any more (see the module doc)


def backoff_s(attempt: int) -> float:
    """Wait before the next request of a kind that failed ``attempt`` times in a row."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** max(0, attempt - 1)))


class Transport(Protocol):
    """How requests reach brokers; the only part that touches Ray (see RayBrokerTransport)."""

    def send(self, broker_id: int, method: str, args: tuple) -> Any:
        """Start the call and return a token at once (never blocks on the broker)."""

    def poll(self, tokens: list) -> dict:
        """token -> (ok: bool, value or exception) for the calls among ``tokens`` that have
        finished; unfinished ones are absent. Never blocks."""

    def forget(self, token) -> None:
        """The caller no longer waits for ``token`` (it timed out)."""

    def watch(self, broker_id: int, broker_epoch: int) -> Any:
        """Start the broker's ``await_stop(broker_epoch)`` (never blocks) and return a token
        for ``poll``, which answers it ``(True, verdict)``: "running" (the watch ran out,
        the broker is up), "stopped" (it shut down), "gone" (another incarnation answered)
        or "dead" (the actor died or does not exist); ``(False, error)`` when nothing
        could be concluded."""


@dataclass
class InFlightRequest:
    """One request sent to one broker incarnation, until it is settled."""

    request_id: int
    controller_epoch: int
    broker_id: int
    broker_epoch: int            # czxid of the broker's registration when sent
    kind: RequestKind
    payload_key: Any             # what the request carries, comparable (for retry accounting)
    items: Any                   # what the sender needs back to record delivery
    sent_at: float
    deadline: float
    token: Any = None
    status: RequestStatus = RequestStatus.IN_FLIGHT
    result: Any = None           # the broker's answer (DELIVERED) or the error (FAILED)


@dataclass
class _Failures:
    payload_key: Any
    attempts: int
    failed_at: float             # when the last attempt was settled as failed

    def retry_at(self, parked: bool) -> float:
        return self.failed_at + (PARKED_RETRY_S if parked else backoff_s(self.attempts))


@dataclass
class ChannelStats:
    sent: int = 0
    delivered: int = 0
    failed: int = 0
    timed_out: int = 0
    stale: int = 0
    parked: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class ControllerChannel:
    """Requests in flight to brokers, at most one per broker (see the module docstring)."""

    def __init__(self, transport: Transport, *, clock: Callable[[], float] = time.monotonic,
                 max_attempts: int = MAX_ATTEMPTS):
        self.transport = transport
        self.clock = clock
        self.max_attempts = max_attempts
        self.controller_epoch = 0
        self._next_id = 1
        self._in_flight: dict[int, InFlightRequest] = {}
        self._abandoned: dict[Any, InFlightRequest] = {}     # token -> timed out request
        self._failures: dict[tuple[int, RequestKind], _Failures] = {}
        self._broker_epochs: dict[int, int] = {}
        self.stats = ChannelStats()

    def reset(self, controller_epoch: int) -> None:
        """A new controller term: requests of the old one are no longer waited for."""
        for req in self._in_flight.values():
            self.transport.forget(req.token)
        self.controller_epoch = controller_epoch
        self._in_flight.clear()
        self._abandoned.clear()
        self._failures.clear()
        self._broker_epochs.clear()

    def describe(self) -> dict:
        """What is pending, for status displays and failure messages: each in-flight
        request (broker, kind, age in seconds) and each failing (broker, kind) with its
        attempts and whether its payload is parked."""
        now = self.clock()
        return {"in_flight": [(r.broker_id, r.kind.name, round(now - r.sent_at, 1))
                              for r in sorted(self._in_flight.values(),
                                              key=lambda r: r.broker_id)],
                "failing": [(b, kind.name, f.attempts, f.attempts >= self.max_attempts)
                            for (b, kind), f in sorted(self._failures.items(),
                                                       key=lambda kv: (kv[0][0], kv[0][1].name))]}

    # -- sending ----------------------------------------------------------------------------
    def busy(self, broker_id: int) -> bool:
        return broker_id in self._in_flight

    def in_flight(self, kind: RequestKind | None = None) -> list[InFlightRequest]:
        return [r for r in self._in_flight.values() if kind is None or r.kind == kind]

    def can_send(self, broker_id: int, kind: RequestKind, payload_key: Any = None) -> bool:
        """Idle, and not backing off after a failure of this kind (a parked payload's
        backoff is ``PARKED_RETRY_S``; another payload's is the last failure's)."""
        if broker_id in self._in_flight:
            return False
        fail = self._failures.get((broker_id, kind))
        if fail is None:
            return True
        return self.clock() >= fail.retry_at(self.parked(broker_id, kind, payload_key))

    def failures(self, broker_id: int, kind: RequestKind) -> int:
        """How many requests of ``kind`` to this broker failed in a row (0 when healthy)."""
        fail = self._failures.get((broker_id, kind))
        return fail.attempts if fail is not None else 0

    def parked(self, broker_id: int, kind: RequestKind, payload_key: Any = None) -> bool:
        """This payload failed MAX_ATTEMPTS times to this broker incarnation: retried only
        every PARKED_RETRY_S (and not waited for by requests that depend on it)."""
        fail = self._failures.get((broker_id, kind))
        return (fail is not None and fail.payload_key == payload_key
                and fail.attempts >= self.max_attempts)

    def send(self, broker_id: int, broker_epoch: int, kind: RequestKind, args: tuple, *,
             payload_key: Any = None, items: Any = None) -> InFlightRequest:
        """Send ``kind`` with ``(controller_epoch, request_id, *args)``; returns at once."""
        if broker_id in self._in_flight:
            raise RuntimeError(f"broker {broker_id} already has request "
                               f"{self._in_flight[broker_id].request_id} in flight")
        self._note_broker_epoch(broker_id, broker_epoch)
        now = self.clock()
        req = InFlightRequest(request_id=self._next_id, controller_epoch=self.controller_epoch,
                              broker_id=broker_id, broker_epoch=broker_epoch, kind=kind,
                              payload_key=payload_key, items=items, sent_at=now,
                              deadline=now + REQUEST_TIMEOUT_S[kind])
        self._next_id += 1
        req.token = self.transport.send(
            broker_id, kind.value, (self.controller_epoch, *args, req.request_id))
        self._in_flight[broker_id] = req
        self.stats.sent += 1
        return req

    def _note_broker_epoch(self, broker_id: int, broker_epoch: int) -> None:
        if self._broker_epochs.get(broker_id) != broker_epoch:
            # a new incarnation starts with a clean retry record
            for key in [k for k in self._failures if k[0] == broker_id]:
                del self._failures[key]
            self._broker_epochs[broker_id] = broker_epoch

    # -- collecting -------------------------------------------------------------------------
    def collect(self, live_brokers: dict[int, int]) -> list[InFlightRequest]:
        """Settle what has finished, timed out or lost its broker; returns the settled
        requests (STALE ones included, for the record). Never blocks."""
        now = self.clock()
        settled: list[InFlightRequest] = []
        tokens = [r.token for r in self._in_flight.values()] + list(self._abandoned)
        answers = self.transport.poll(tokens) if tokens else {}
        for token in [t for t in self._abandoned if t in answers]:
            req = self._abandoned.pop(token)
            req.status = RequestStatus.STALE
            self.stats.stale += 1
            log.info("late answer to abandoned request %d (%s to broker %d) ignored",
                     req.request_id, req.kind.value, req.broker_id)
            settled.append(req)
        for broker_id, req in list(self._in_flight.items()):
            answer = answers.get(req.token)
            if live_brokers.get(broker_id) != req.broker_epoch:
                # the broker left or restarted: whatever it answers was for the old incarnation
                status, result = RequestStatus.STALE, None
                if answer is None:
                    self.transport.forget(req.token)
            elif answer is not None:
                ok, result = answer
                status = RequestStatus.DELIVERED if ok else RequestStatus.FAILED
            elif now >= req.deadline:
                status, result = RequestStatus.TIMED_OUT, None
                self._abandoned[req.token] = req
            else:
                continue
            del self._in_flight[broker_id]
            req.status, req.result = status, result
            self._account(req, now)
            settled.append(req)
        if len(self._abandoned) > 64:   # bound: the oldest abandoned ones are forgotten
            for token in list(self._abandoned)[:-64]:
                self.transport.forget(token)
                del self._abandoned[token]
        return settled

    def _account(self, req: InFlightRequest, now: float) -> None:
        key = (req.broker_id, req.kind)
        if req.status == RequestStatus.DELIVERED:
            self._failures.pop(key, None)
            self.stats.delivered += 1
            return
        if req.status == RequestStatus.STALE:
            self.stats.stale += 1
            return
        if req.status == RequestStatus.TIMED_OUT:
            self.stats.timed_out += 1
        else:
            self.stats.failed += 1
        prev = self._failures.get(key)
        attempts = (prev.attempts if prev is not None and prev.payload_key == req.payload_key
                    else 0) + 1
        self._failures[key] = _Failures(req.payload_key, attempts, now)
        if attempts >= self.max_attempts:
            self.stats.parked += 1
            log.warning("%s to broker %d failed %d times (last: %r): parked, sent again every "
                        "%.0f s until delivered, its payload changes or the broker registers "
                        "again", req.kind.value, req.broker_id, attempts, req.result,
                        PARKED_RETRY_S)
        else:
            log.info("%s to broker %d %s (attempt %d): %r", req.kind.value, req.broker_id,
                     req.status.value, attempts, req.result)


class RayBrokerTransport:
    """Broker calls through Ray: ``send`` is ``handle.<method>.remote(...)``, ``poll`` is
    ``ray.wait(..., timeout=0)``. The only place the controller calls Ray.

    ``on_answer`` is called (from a Ray thread) when any answer arrives, so the controller's
    loop wakes at once instead of on its next periodic tick."""

    def __init__(self, namespace: str, on_answer: Callable[[], None] | None = None):
        self.namespace = namespace
        self.on_answer = on_answer
        self._handles: dict[int, Any] = {}     # broker id -> actor handle (dropped on failure)

    def _handle(self, broker_id: int):
        import ray
        from ..protocol import broker_actor_name
        handle = self._handles.get(broker_id)
        if handle is None:
            handle = ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)
            self._handles[broker_id] = handle
        return handle

    def send(self, broker_id: int, method: str, args: tuple) -> "_Call":
        try:
            ref = getattr(self._handle(broker_id), method).remote(*args)
        except Exception as exc:  # noqa: BLE001 - no such actor (yet): a failed request
            self._handles.pop(broker_id, None)
            return _Call(broker_id, None, exc)
        self._notify_on_answer(ref)
        return _Call(broker_id, ref)

    def watch(self, broker_id: int, broker_epoch: int) -> "_Call":
        """``await_stop`` on a freshly looked-up handle (a cached one may be a previous
        incarnation's). The watch is what makes a killed broker's death visible at once:
        Ray fails the pending call with RayActorError when the actor dies."""
        import ray
        from ..protocol import broker_actor_name
        try:
            handle = ray.get_actor(broker_actor_name(broker_id), namespace=self.namespace)
        except ValueError:
            # registered in ZooKeeper, yet no actor of that name: it died
            return _Call(broker_id, None, None, watch=True, verdict="dead")
        except Exception as exc:  # noqa: BLE001 - the GCS did not answer: try again later
            return _Call(broker_id, None, exc, watch=True)
        self._handles[broker_id] = handle
        try:
            ref = handle.await_stop.remote(broker_epoch, WATCH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            return _Call(broker_id, None, exc, watch=True)
        self._notify_on_answer(ref)
        return _Call(broker_id, ref, watch=True)

    def _notify_on_answer(self, ref) -> None:
        if self.on_answer is not None:
            try:
                ref.future().add_done_callback(lambda _f: self.on_answer())
            except Exception:  # noqa: BLE001 - the periodic tick collects it anyway
                pass

    def poll(self, tokens: list) -> dict:
        import ray
        out: dict = {}
        by_ref = {}
        for call in tokens:
            if call.verdict is not None:
                out[call] = (True, call.verdict)
            elif call.ref is None:
                out[call] = (False, call.error)
            else:
                by_ref[call.ref] = call
        if by_ref:
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
            for ref in ready:
                try:
                    out[by_ref[ref]] = (True, ray.get(ref, timeout=0))
                except Exception as exc:  # noqa: BLE001 - the broker's error is the answer
                    out[by_ref[ref]] = (False, exc)
        for call, (ok, value) in list(out.items()):
            if call.watch and not ok and _actor_died(value):
                out[call] = (True, "dead")
            if not ok or out[call] == (True, "dead"):
                # a dead or restarted broker: look its name up again next time
                self._handles.pop(call.broker_id, None)
        return out

    def forget(self, token: "_Call") -> None:
        self._handles.pop(token.broker_id, None)


def _actor_died(exc) -> bool:
    """Did the call fail because its actor is dead (not merely unreachable for now)?"""
    import ray.exceptions
    return (isinstance(exc, ray.exceptions.RayActorError)
            and not isinstance(exc, getattr(ray.exceptions, "ActorUnavailableError", ())))


@dataclass(eq=False)
class _Call:
    """One broker call: its object ref, or the error that kept it from starting (or, for
    a watch, the verdict already known without a call)."""

    broker_id: int
    ref: Any
    error: BaseException | None = None
    watch: bool = False
    verdict: str | None = None
