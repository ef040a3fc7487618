"""A bounded retry policy for ZooKeeper operations.

Why not kazoo's KazooRetry: it retries a fixed, implicit set of errors and by default forever
(`max_tries=-1` for connections). Here the retryable errors are an explicit tuple, every
attempt sleeps with full jitter, and both an attempt count and a wall-clock deadline bound the
loop, so a caller always gets an answer (or a typed error) within `deadline_s`.

Only retry operations that are idempotent or made idempotent by the caller (an ambiguous
create must look for its own node afterwards): a ConnectionLoss does not say whether the
request reached the server.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError

from coordination.errors import ZkUnavailableError

T = TypeVar("T")

#: Errors that say "ZooKeeper did not answer" rather than "ZooKeeper said no". Session expiry
#: is deliberately absent: retrying on an expired session would silently drop ephemerals.
RETRYABLE_ZK_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionLoss, OperationTimeoutError, KazooTimeoutError, ZkUnavailableError)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by `max_attempts` and `deadline_s`.

    Thread-safe: the policy holds no state; each `run` call keeps its own counters.
    """
    max_attempts: int = 10
    deadline_s: float = 30.0
    base_delay_s: float = 0.05
    max_delay_s: float = 1.0
    retryable: tuple[type[BaseException], ...] = field(default=RETRYABLE_ZK_ERRORS)

    def __post_init__(self):
        if self.max_attempts < 1 or self.deadline_s <= 0 or self.base_delay_s < 0:
            raise ValueError(f"invalid retry policy {self}")

    def delays_s(self, *, rng: random.Random | None = None):
        """The sleep before attempt 2, 3, ...: uniform in [0, min(max, base * 2**n)]."""
        rng = rng or random
        for attempt in range(self.max_attempts - 1):
            yield rng.uniform(0, min(self.max_delay_s, self.base_delay_s * (2 ** attempt)))

    def run(self, fn: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> T:
        """Call `fn` until it returns, raises a non-retryable error, or the bounds are hit.

        On exhaustion raises ZkUnavailableError chained to the last retryable error.
        """
        deadline = clock() + self.deadline_s
        delays = self.delays_s()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except self.retryable as exc:
                delay = next(delays, None)
                remaining = deadline - clock()
                if delay is None or remaining <= 0:
                    raise ZkUnavailableError(
                        f"gave up after {attempt} attempts / {self.deadline_s:.1f}s: "
                        f"{type(exc).__name__}: {exc}") from exc
                sleep(min(delay, remaining))


#: The default for short metadata operations.
DEFAULT_RETRY = RetryPolicy()
