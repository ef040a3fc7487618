"""One retry policy for every client (Producer, SimpleConsumer, Consumer), after kazoo's
KazooRetry: an explicit classification of what may be retried, exponential backoff with
jitter, and two bounds, a number of attempts and a deadline, whichever comes first.

What is retried (``RetryPolicy.retriable``, on the error *as raised*, before ``unwrap``):

- Everything ``protocol.is_retriable`` calls retriable: Kafka's retriable errors
  (NotLeaderForPartition, LeaderNotAvailable, NotEnoughReplicas, FencedLeaderEpoch,
  RequestTimedOut, NoBrokersAvailable, ...), KafkaStorageError (the replica's log is offline
  or closing, e.g. a leader being demoted), a dead or unreachable actor (RayActorError), and
  a call that did not answer in time (Ray's GetTimeoutError).
- **UnknownTopicOrPartitionError depends on where it was raised.** Raised in this process,
  it comes from the client's Metadata, which says "unknown" only after re-reading a broker's
  metadata when its cache missed the topic or partition: the cluster has just answered,
  and asking again would only turn a user's typo into a long wait. It is final. Answered by
  a broker (a partition's error code in a response: ``network.broker_error`` marks it) or
  raised by an actor (it arrives wrapped in Ray's RayTaskError), it means the broker or
  replica this client's metadata pointed at does not host the partition (any more): the
  metadata is stale, so it is retried after a refresh, as Kafka retries
  UNKNOWN_TOPIC_OR_PARTITION.
- **GetTimeoutError is retried** within the bounds: the leader may be paused, overloaded or
  about to lose its leadership, and the metadata refresh before the next attempt can name a
  new leader. The retried requests are reads (fetch, list_offsets), so a retry cannot
  duplicate anything; the producer times its requests itself (RequestTimedOutError, also
  retried: at-least-once, as its docstring says). When a timeout is the last error, the
  caller sees KafkaTimeoutError, never Ray's own exception.
- Anything else (OffsetOutOfRange, InvalidRecord, RecordTooLarge, IllegalArgument, a bug)
  is raised at once.

Bounds: attempt ``n`` (1-based) that failed is followed by a wait of
``min(retry_backoff_ms * 2**(n-1), retry_backoff_max_ms)``, scaled by a random factor in
``[1 - jitter, 1]`` (so the cap holds and concurrent clients spread out), unless ``n`` is
``max_attempts`` or the next attempt would start later than ``deadline_ms`` after the first
one began. Giving up raises the last error, typed (``final_error``).

What each client maps onto it:

====================  ============================  ========================================
client                max_attempts                  deadline_ms
====================  ============================  ========================================
Producer              ``retries`` + 1 (default      ``delivery_timeout_ms`` (120 s) from the
                      unbounded, as Kafka's)        batch's creation: Kafka's default
SimpleConsumer        ``retries`` + 1 (default 6)   ``default_api_timeout_ms`` (60 s) a call
Consumer              ``retries`` + 1 (default      ``default_api_timeout_ms`` (60 s): a
                      unbounded)                    partition failing that long fails poll
====================  ============================  ========================================

Each attempt's own timeout stays ``request_timeout_ms`` (at most what is left before the
deadline). Thread-safe: a policy holds only its configuration; ``call`` keeps its state on
the stack.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

from ..errors import InvalidConfigurationError, KafkaTimeoutError, UnknownTopicOrPartitionError
from ..protocol import is_retriable, unwrap
from .config import positive_int

T = TypeVar("T")

DEFAULT_JITTER = 0.2


def _crossed_ray(exc: BaseException) -> bool:
    """Was ``exc`` answered by a broker (``network.broker_error``) or raised by an actor
    (it reached us wrapped in Ray's RayTaskError)?"""
    if getattr(exc, "from_broker", False):
        return True
    import ray.exceptions
    return isinstance(exc, ray.exceptions.RayTaskError)


def final_error(exc: BaseException, what: str = "the request") -> BaseException:
    """The error a caller sees when retrying ends: the actor's typed error without Ray's
    wrapper, and KafkaTimeoutError for Ray's GetTimeoutError (``what`` names the request)."""
    import ray.exceptions
    error = unwrap(exc)
    if isinstance(error, ray.exceptions.GetTimeoutError):
        return KafkaTimeoutError(f"{what} did not answer in time ({error})")
    return error


class RetryPolicy:
    """Which errors to retry, how long to wait between attempts, and when to give up.

    ``RetryPolicy(max_attempts=, retry_backoff_ms=, retry_backoff_max_ms=, deadline_ms=)``;
    ``deadline_ms=None`` leaves only the attempt bound. ``classify`` (default
    ``protocol.is_retriable``), ``clock`` (seconds, monotonic), ``sleep`` and ``rng`` (a
    ``random.Random``) are seams for tests. Invariants:
    ``1 <= max_attempts``; ``0 <= retry_backoff_ms <= retry_backoff_max_ms``;
    ``0 <= jitter <= 1``; every backoff is in
    ``[(1 - jitter) * base, base]`` with ``base <= retry_backoff_max_ms``.
    """

    def __init__(self, *, max_attempts: int, retry_backoff_ms: int,
                 retry_backoff_max_ms: int, deadline_ms: int | None,
                 jitter: float = DEFAULT_JITTER,
                 classify: Callable[[BaseException], bool] = is_retriable,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
                or max_attempts < 1:
            raise InvalidConfigurationError(f"max_attempts must be an int >= 1, got "
                                            f"{max_attempts!r}")
        if retry_backoff_ms < 0 or retry_backoff_max_ms < 0:
            raise InvalidConfigurationError("retry backoffs must be >= 0 ms")
        if deadline_ms is not None and deadline_ms <= 0:
            raise InvalidConfigurationError(f"deadline_ms must be > 0, got {deadline_ms!r}")
        if not 0.0 <= jitter <= 1.0:
            raise InvalidConfigurationError(f"jitter must be in [0, 1], got {jitter!r}")
        self.max_attempts = max_attempts
        self.retry_backoff_ms = retry_backoff_ms
        # as Kafka: a cap below the first backoff is raised to it
        self.retry_backoff_max_ms = max(retry_backoff_max_ms, retry_backoff_ms)
        self.deadline_ms = deadline_ms
        self.jitter = jitter
        self._classify = classify
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()

    @classmethod
    def from_config(cls, config: dict, *, deadline_key: str, **kwargs) -> "RetryPolicy":
        """The policy of a client config with ``retries``, ``retry_backoff_ms``,
        ``retry_backoff_max_ms`` and the deadline named ``deadline_key`` (all checked)."""
        return cls(max_attempts=positive_int(config, "retries") + 1,
                   retry_backoff_ms=positive_int(config, "retry_backoff_ms"),
                   retry_backoff_max_ms=positive_int(config, "retry_backoff_max_ms"),
                   deadline_ms=positive_int(config, deadline_key, 1), **kwargs)

    # -- the three decisions ----------------------------------------------------------------
    def retriable(self, exc: BaseException) -> bool:
        """May a request that raised ``exc`` (as raised: before ``unwrap``) succeed if sent
        again after a metadata refresh? See the module docstring."""
        if isinstance(exc, UnknownTopicOrPartitionError) and not _crossed_ray(exc):
            return False
        return self._classify(exc)

    def backoff_s(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` (>= 1) attempts failed: exponential
        from ``retry_backoff_ms``, capped at ``retry_backoff_max_ms``, with jitter down."""
        exponent = min(max(failed_attempts - 1, 0), 62)   # 2**62 ms is past any cap
        base_ms = min(self.retry_backoff_ms * (1 << exponent), self.retry_backoff_max_ms)
        factor = 1.0 - self.jitter * self._rng.random()
        return base_ms * factor / 1000.0

    def next_backoff_s(self, exc: BaseException, *, failed_attempts: int,
                       started_s: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up: ``exc`` is not
        retriable, ``failed_attempts`` reached ``max_attempts``, or the next attempt would
        start past ``deadline_ms`` after ``started_s`` (a ``clock`` reading)."""
        if not self.retriable(exc) or failed_attempts >= self.max_attempts:
            return None
        backoff = self.backoff_s(failed_attempts)
        if self.deadline_ms is not None and \
                self._clock() + backoff - started_s > self.deadline_ms / 1000.0:
            return None
        return backoff

    # -- the loop, for blocking calls -------------------------------------------------------
    def call(self, attempt: Callable[[float | None], T], *,
             on_retry: Callable[[BaseException], None] | None = None,
             what: str = "the request") -> T:
        """``attempt(left_s)`` until it returns; ``left_s`` is the time left before the
        deadline (None without one), for the attempt's own timeout. Before each retry,
        ``on_retry(error)`` runs (clients refresh their metadata there) and the policy
        sleeps its backoff. Giving up raises ``final_error`` of the last error (``what``
        names the request in a timeout's message)."""
        started = self._clock()
        failed = 0
        while True:
            left = None
            if self.deadline_ms is not None:
                left = max(self.deadline_ms / 1000.0 - (self._clock() - started), 0.0)
            try:
                return attempt(left)
            except Exception as exc:  # noqa: BLE001 - classified here
                failed += 1
                backoff = self.next_backoff_s(exc, failed_attempts=failed, started_s=started)
                if backoff is None:
                    raise final_error(exc, what) from None
                if on_retry is not None:
                    on_retry(exc)
                self._sleep(backoff)
