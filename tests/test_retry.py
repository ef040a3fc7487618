"""RetryPolicy (actors/client/retry.py) alone: what it retries, how long it waits, when it
gives up. A fake clock and sleep; no Ray runtime (only Ray's exception classes)."""

import random

import pytest
import ray.exceptions

from actors.client.retry import RetryPolicy
from actors.errors import (IllegalArgumentError, InvalidConfigurationError, InvalidRecordError,
                           KafkaStorageError, KafkaTimeoutError, LeaderNotAvailableError,
                           NotEnoughReplicasError, NotLeaderForPartitionError,
                           OffsetOutOfRangeError, RecordTooLargeError, RequestTimedOutError,
                           UnknownTopicOrPartitionError)


def from_actor(error: BaseException) -> BaseException:
    """``error`` as ``ray.get`` raises it when an actor raised it (RayTaskError subclass)."""
    return ray.exceptions.RayTaskError("produce", "traceback", error).as_instanceof_cause()


class FakeTime:
    """A clock that only ``sleep`` moves."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FixedRng:
    """``random()`` always answers ``value`` (0: no jitter; just under 1: all of it)."""

    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


def policy(time_=None, **kw) -> RetryPolicy:
    time_ = time_ or FakeTime()
    args = dict(max_attempts=5, retry_backoff_ms=100, retry_backoff_max_ms=1000,
                deadline_ms=60_000, clock=time_.clock, sleep=time_.sleep)
    args.update(kw)
    return RetryPolicy(**args)


@pytest.mark.parametrize("error", [
    NotLeaderForPartitionError("x"), LeaderNotAvailableError("x"), NotEnoughReplicasError("x"),
    KafkaStorageError("x"), RequestTimedOutError("x"), ray.exceptions.RayActorError(),
    ray.exceptions.GetTimeoutError("x"), from_actor(NotLeaderForPartitionError("x")),
    from_actor(KafkaStorageError("x"))], ids=lambda e: type(e).__name__)
def test_retries_stale_leader_dead_actor_and_timeout_errors(error):
    """Kafka's retriable errors, KafkaStorageError, a dead actor and Ray's GetTimeoutError
    are retriable, raised here or by an actor."""
    assert policy().retriable(error)


@pytest.mark.parametrize("error", [
    OffsetOutOfRangeError("x"), InvalidRecordError("x"), RecordTooLargeError("x"),
    IllegalArgumentError("x"), ValueError("x"), from_actor(OffsetOutOfRangeError("x")),
    from_actor(InvalidRecordError("x"))], ids=lambda e: type(e).__name__)
def test_does_not_retry_errors_a_resend_cannot_fix(error):
    """Out-of-range offsets, bad records, bad arguments and programming errors are not
    retriable, wherever they were raised."""
    assert not policy().retriable(error)


def test_unknown_topic_is_final_from_metadata_and_retriable_from_a_replica():
    """UnknownTopicOrPartitionError raised in this process (the client's metadata, after its
    refresh) is final; the same error from an actor (stale metadata) is retried."""
    p = policy()
    assert not p.retriable(UnknownTopicOrPartitionError("no topic"))
    assert p.retriable(from_actor(UnknownTopicOrPartitionError("not hosted here")))


def test_backoff_doubles_from_retry_backoff_ms_up_to_the_cap():
    """Without jitter the waits are retry_backoff_ms * 2**(n-1), capped at
    retry_backoff_max_ms."""
    p = policy(rng=FixedRng(0.0))
    waits_ms = [round(p.backoff_s(n) * 1000, 6) for n in range(1, 8)]
    assert waits_ms == [100, 200, 400, 800, 1000, 1000, 1000]
    assert round(p.backoff_s(10_000) * 1000, 6) == 1000   # no overflow for huge counts


def test_jitter_stays_within_its_bounds_and_varies():
    """Each wait lies in [(1 - jitter) * base, base] (never above the cap), and the waits of
    one attempt number differ between draws."""
    p = policy(rng=random.Random(7), jitter=0.2)
    for n, base_ms in [(1, 100), (2, 200), (3, 400), (5, 1000), (9, 1000)]:
        draws = [p.backoff_s(n) * 1000 for _ in range(200)]
        assert all(0.8 * base_ms - 1e-9 <= d <= base_ms + 1e-9 for d in draws), (n, draws)
        assert max(draws) - min(draws) > 0.1 * base_ms
    lowest = policy(rng=FixedRng(0.999999), jitter=0.2).backoff_s(1) * 1000
    assert lowest == pytest.approx(80, abs=0.01)


def test_call_returns_once_a_transient_error_clears():
    """call() retries a retriable error, refreshing through on_retry, and returns the first
    success."""
    t = FakeTime()
    p = policy(t, rng=FixedRng(0.0))
    answers = [from_actor(NotLeaderForPartitionError("old leader")),
               ray.exceptions.RayActorError(), "records"]
    refreshed = []

    def attempt(_left_s):
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert p.call(attempt, on_retry=refreshed.append) == "records"
    assert len(refreshed) == 2 and t.sleeps == [0.1, 0.2]


def test_call_raises_a_non_retriable_error_at_once_unwrapped():
    """A non-retriable error ends call() on the first attempt, without sleeping, as the
    actor's own typed error (not Ray's wrapper)."""
    t = FakeTime()
    p = policy(t)
    calls = []

    def attempt(_left_s):
        calls.append(1)
        raise from_actor(OffsetOutOfRangeError("past the end"))

    with pytest.raises(OffsetOutOfRangeError) as info:
        p.call(attempt)
    assert type(info.value) is OffsetOutOfRangeError
    assert calls == [1] and t.sleeps == []


def test_call_gives_up_after_max_attempts_with_the_last_typed_error():
    """With a retriable error every time, call() makes exactly max_attempts attempts and
    raises the last error, unwrapped."""
    t = FakeTime()
    p = policy(t, max_attempts=4)
    calls = []

    def attempt(_left_s):
        calls.append(1)
        raise from_actor(LeaderNotAvailableError(f"attempt {len(calls)}"))

    with pytest.raises(LeaderNotAvailableError, match="attempt 4") as info:
        p.call(attempt)
    assert type(info.value) is LeaderNotAvailableError
    assert len(calls) == 4 and len(t.sleeps) == 3


def test_call_gives_up_before_an_attempt_would_start_past_the_deadline():
    """No attempt starts later than deadline_ms after the first; each attempt is told the
    time left; a timeout as last error surfaces as KafkaTimeoutError."""
    t = FakeTime()
    p = policy(t, max_attempts=1000, retry_backoff_ms=300, retry_backoff_max_ms=300,
               deadline_ms=1000, rng=FixedRng(0.0))
    lefts = []
    started = t.now

    def attempt(left_s):
        lefts.append(left_s)
        t.now += 0.05                      # each attempt takes 50 ms
        raise ray.exceptions.GetTimeoutError("no answer")

    with pytest.raises(KafkaTimeoutError):
        p.call(attempt)
    # attempts start at 0, 350, 700 ms; the next would start at 1050 ms > 1000 ms
    assert len(lefts) == 3
    assert lefts == pytest.approx([1.0, 0.65, 0.3])
    assert t.now - started <= 1.0


def test_next_backoff_gives_up_on_attempts_deadline_or_classification():
    """next_backoff_s answers None when the error is final, the attempts are spent, or the
    wait would cross the deadline; otherwise the jittered wait."""
    t = FakeTime()
    p = policy(t, max_attempts=3, deadline_ms=500, rng=FixedRng(0.0))
    retriable = NotLeaderForPartitionError("x")
    assert p.next_backoff_s(retriable, failed_attempts=1, started_s=t.now) == 0.1
    assert p.next_backoff_s(retriable, failed_attempts=3, started_s=t.now) is None
    assert p.next_backoff_s(InvalidRecordError("x"), failed_attempts=1, started_s=t.now) is None
    assert p.next_backoff_s(retriable, failed_attempts=2, started_s=t.now - 0.35) is None


def test_from_config_maps_client_settings_and_refuses_bad_ones():
    """from_config turns retries into retries + 1 attempts and the named deadline into
    deadline_ms; a non-int or negative setting is an InvalidConfigurationError."""
    config = {"retries": 2, "retry_backoff_ms": 10, "retry_backoff_max_ms": 5,
              "delivery_timeout_ms": 3000}
    p = RetryPolicy.from_config(config, deadline_key="delivery_timeout_ms")
    assert (p.max_attempts, p.retry_backoff_ms, p.retry_backoff_max_ms, p.deadline_ms) == \
        (3, 10, 10, 3000)
    for bad in ({"retries": -1}, {"retries": "3"}, {"retry_backoff_ms": True},
                {"delivery_timeout_ms": 0}):
        with pytest.raises(InvalidConfigurationError):
            RetryPolicy.from_config({**config, **bad}, deadline_key="delivery_timeout_ms")
