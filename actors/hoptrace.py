"""Hop tracing: where a record's time goes between the processes of the data plane.

A diagnostic, off unless ``RAYKAFKA_HOP_TRACE`` names a directory when the process starts
(Ray's workers inherit the driver's environment in a local cluster). Each process then
appends one line per socket message it sends or reads to ``<dir>/<pid>``:

    <time.time_ns()> <pid> <thread name> <label>

Labels: ``L<k`` a listener read a request of API key k, ``L>`` it writes responses;
``C>`` a Kafka client connection writes a request, ``C<k`` it read the response to one of
API key k; ``R>op:n`` a broker sends a replica-channel request (op, n payload bytes),
``R<s`` it read an answer or push (status s); ``S<op`` a replica read a channel request,
``S>`` it sends an answer or push. The wall clock is shared by the processes of one
machine, so merging the files orders the hops of a record (``benchmarks/hop_trace.py``).

Each line is one ``write`` system call: it perturbs what it measures (tens of
microseconds per hop here), so compare traced runs with traced runs.
"""

from __future__ import annotations

import os
import threading
import time

#: the directory traced processes write to; None: tracing is off (the call sites test it)
DIR = os.environ.get("RAYKAFKA_HOP_TRACE") or None

_fd: int | None = None


def hop(label: str) -> None:
    """Record one hop of this process (only called when ``DIR`` is set)."""
    global _fd
    if _fd is None:
        _fd = os.open(os.path.join(DIR, str(os.getpid())),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_fd, f"{time.time_ns()} {os.getpid()} {threading.current_thread().name} "
                  f"{label}\n".encode())
