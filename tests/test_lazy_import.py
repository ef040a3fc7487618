"""storage.lazy: numpy stays out of the processes that never need it (a partition
replica's worker, a broker's), and the stand-in gives way to the module itself."""

import subprocess
import sys

from storage.lazy import lazy_module


def test_a_replica_or_broker_worker_imports_no_numpy_until_it_needs_it():
    """Importing the replica, broker, controller and group coordinator modules in a fresh
    interpreter leaves numpy unimported (it is 107 of the 188 ms a replica's import adds
    to every replica worker); building a 50-record batch (the numpy path) imports it."""
    code = ("import sys\n"
            "import actors.server.replica, actors.server.broker, actors.server.controller\n"
            "import actors.server.group_coordinator\n"
            "print('numpy' in sys.modules)\n"
            "from storage import records\n"
            "records.build([b'v%d' % i for i in range(50)])\n"
            "print('numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "True"]


def test_the_first_attribute_read_puts_the_module_itself_in_the_global():
    """The stand-in answers its first attribute from the imported module and puts that
    module in its place, so later reads are the module's own."""
    import json
    namespace: dict = {}
    namespace["j"] = lazy_module(namespace, "j", "json")
    assert "not imported yet" in repr(namespace["j"])
    assert namespace["j"].dumps([1]) == "[1]"
    assert namespace["j"] is json
