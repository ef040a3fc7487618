"""actors.server.threadnames: a thread started after name_native_threads() carries its
Python name in the kernel (/proc/self/task/<tid>/comm), cut to 15 bytes; one started
before keeps the process's name. Run in a child process: the hook is process-wide."""

from __future__ import annotations

import subprocess
import sys

from actors.server.threadnames import native_name

CHILD = r"""
import threading
from actors.server.threadnames import name_native_threads

def comm_of(thread_name):
    out = {}
    def run():
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            out["comm"] = f.read().strip()
    t = threading.Thread(target=run, name=thread_name)
    t.start(); t.join()
    return out["comm"]

with open("/proc/self/comm") as f:
    process = f.read().strip()
before = comm_of("kafka-network-9092")
assert name_native_threads() is True
assert name_native_threads() is False          # once per process
after = comm_of("kafka-network-9092")
print(repr((process, before, after)))
"""


def test_threads_started_after_the_call_carry_their_python_names():
    """Before the call a thread has the process's name; after it, its own, cut to 15."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    process, before, after = eval(out.stdout.strip())
    assert before == process
    assert after == "kafka-network-9"


def test_native_names_are_cut_to_15_bytes_without_splitting_a_character():
    """The kernel keeps 15 bytes: a name is cut there, and a multi-byte character that
    would straddle the cut is left out whole."""
    assert native_name("channel-conn") == b"channel-conn"
    assert native_name("broker-12-fetcher-3") == b"broker-12-fetch"
    assert native_name("abcdefghijklmn\u00e9") == b"abcdefghijklmn"
