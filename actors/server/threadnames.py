"""Python thread names as the operating system's thread names, in a server process.

CPython 3.11 leaves every thread of a process with the process's own name in the kernel
(``/proc/<pid>/task/<tid>/comm``): in a broker's process ``top -H``, ``ps -L`` and
``/proc`` show a dozen threads all called ``ray::Broker``, and a thread that is busy
cannot be told from the others without attaching a profiler. ``name_native_threads``
makes every thread started afterwards in this process take its Python name
(``kafka-network-9092``, ``broker-1-fetcher-0``, ``channel-conn``...; the kernel keeps
the first 15 bytes), as the JVM's threads of a Kafka broker carry theirs and as Python
itself does from 3.14 on. ``benchmarks/thread_wakes.py`` reads them to tell a record's
wake-ups and CPU per thread (docs/dataplane.md).

Only raykafka's own server processes (Broker, PartitionReplica, Controller) call it: they
run nothing but raykafka and Ray; a user's process is left as it is. The main thread keeps
the name Ray gives it (``ray::Broker.<method>``).
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading

log = logging.getLogger(__name__)

_PR_SET_NAME = 15            # prctl(2): the calling thread's name, at most 15 bytes + NUL
_lock = threading.Lock()
_installed = False


def _setter():
    """prctl from the C library, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def native_name(name: str) -> bytes:
    """What the kernel keeps of ``name``: its first 15 bytes of UTF-8 (not cutting a
    character in two)."""
    data = name.encode("utf-8", "replace")[:15]
    return data.decode("utf-8", "ignore").encode("utf-8")


def name_native_threads() -> bool:
    """Once per process: every thread started from now on names itself in the kernel
    after its Python name. True when installed now; False when already installed or the
    platform has no prctl (then nothing changes)."""
    global _installed
    with _lock:
        if _installed:
            return False
        prctl = _setter()
        bootstrap = getattr(threading.Thread, "_bootstrap_inner", None)
        if prctl is None or bootstrap is None:
            return False

        def named_bootstrap(self):
            try:
                prctl(_PR_SET_NAME, native_name(self.name), 0, 0, 0)
            except Exception:  # noqa: BLE001 - a name is never worth a thread
                pass
            return bootstrap(self)

        threading.Thread._bootstrap_inner = named_bootstrap
        _installed = True
        return True


__all__ = ["name_native_threads", "native_name"]
