"""Upkeep of one partition's Log (flush.ms, retention, compaction), run only when it is due.

A replica used to call ``Log.maintain`` every second on a thread of its own: with one actor
per replica that polling was most of an idle replica's cost above Ray's own floor. Here one
thread sleeps until ``Log.next_maintenance_in_ms`` says something is due (with nothing due it
sleeps until woken) and the replica wakes it early after whatever can bring work closer: an
append (``after_append``, a cheap check that only wakes the thread when the deadline moved
earlier or a segment rolled), a config change, a deletion or truncation (``wake``). The
thread itself starts the first time something falls due, so a replica that never holds
data never has one.

Guards: passes are at least ``MIN_INTERVAL_S`` apart; a pass that leaves work due (a
compaction that cannot progress, a storage error) backs off exponentially up to
``MAX_BACKOFF_S``; and the thread re-checks at least every ``MAX_SLEEP_S`` (a wall-clock
jump moves the log's deadlines; monotonic sleeps would not notice).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.05
MAX_BACKOFF_S = 300.0
MAX_SLEEP_S = 900.0


class Upkeep:
    """Runs ``the_log.maintain()`` when due. Thread-safe; ``close`` ends the thread."""

    def __init__(self, the_log, name: str, *, errors: tuple = (Exception,)):
        self._log = the_log
        self._name = name
        self._errors = errors
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._kicked = False
        self._closed = False
        # what the thread is waiting for, read without the lock by after_append (the GIL
        # makes each read atomic; a stale read only costs one spurious wake-up)
        self._computing = False
        self._target = float("inf")          # time.monotonic() of the next pass
        self._seen_segments = -1
        self.wakeups = 0                     # times the thread woke (timer or kick)
        self.runs = 0                        # maintain() passes
        self.start_if_due()

    # -- the replica's hooks ----------------------------------------------------------------
    def after_append(self) -> None:
        """Call after every append: wakes the thread only when the append brought the next
        deadline closer (first unflushed write with flush.ms, retention.bytes reached) or
        rolled a segment (new retention and compaction candidates)."""
        if self._closed:
            return
        if self._thread is None:
            self.start_if_due()
            return
        if self._computing or len(self._log.segments) != self._seen_segments:
            self.wake()
            return
        delay = self._log.next_maintenance_in_ms(include_compaction=False)
        if delay is not None and time.monotonic() + delay / 1000 < self._target:
            self.wake()

    def wake(self) -> None:
        """Re-compute the next deadline now (after a config change, deletion, truncation)."""
        if self._thread is None:
            self.start_if_due()
            return
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def start_if_due(self) -> None:
        """Start the thread the first time the log has something that will fall due."""
        if self._thread is not None or self._closed:
            return
        try:
            delay = self._log.next_maintenance_in_ms()
        except self._errors as exc:
            log.warning("%s upkeep: %s", self._name, exc)
            delay = 0
        if delay is None:
            return
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"upkeep-{self._name}")
                self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def stats(self) -> dict:
        """For tests and benchmarks: how often the thread woke and ran, and what it waits for."""
        target = self._target
        return {"thread": self._thread is not None, "wakeups": self.wakeups, "runs": self.runs,
                "next_in_s": (None if target == float("inf")
                              else max(target - time.monotonic(), 0.0))}

    # -- the thread ----------------------------------------------------------------------------
    def _next_delay_s(self) -> float | None:
        self._seen_segments = len(self._log.segments)
        delay = self._log.next_maintenance_in_ms()
        return None if delay is None else delay / 1000

    def _run(self) -> None:
        last_run = float("-inf")
        backoff = 0.0
        while True:
            with self._cond:
                self._kicked = False
                self._computing = True
            try:
                delay = self._next_delay_s()
            except self._errors as exc:
                log.warning("%s upkeep: %s", self._name, exc)
                delay = 0.0
            now = time.monotonic()
            if delay is not None and delay <= 0 and now - last_run < max(backoff,
                                                                          MIN_INTERVAL_S):
                delay = last_run + max(backoff, MIN_INTERVAL_S) - now
            with self._cond:
                self._computing = False
                if delay is None:
                    self._target = float("inf")
                    timeout = MAX_SLEEP_S
                else:
                    self._target = now + delay
                    timeout = min(delay, MAX_SLEEP_S)
                if timeout > 0 and not self._kicked and not self._closed:
                    self._cond.wait(timeout)
                if self._closed:
                    return
                kicked = self._kicked
                self.wakeups += 1
            if kicked and time.monotonic() < self._target:
                continue                    # re-compute: the log changed
            try:
                if self._log.next_maintenance_in_ms() != 0:
                    continue                # a stale deadline: nothing is due after all
                self._log.maintain()
                self.runs += 1
                last_run = time.monotonic()
                still = self._log.next_maintenance_in_ms()
                backoff = (min(max(backoff * 2, 1.0), MAX_BACKOFF_S) if still == 0 else 0.0)
            except self._errors as exc:
                log.warning("%s upkeep: %s", self._name, exc)
                last_run = time.monotonic()
                backoff = min(max(backoff * 2, 1.0), MAX_BACKOFF_S)
