"""The process environment raykafka needs when it starts Ray, and nothing read at import.

Nothing here imports Ray. ``raycompat`` calls ``for_ray_we_start()`` right before it starts a
Ray (the processes Ray spawns inherit this environment); ``import actors`` calls
``at_import()``, which only sets what is safe whatever the import order. Why each variable:
the comments below; docs/ray-notes.md.

Ray 2.60 reads several settings once, when ``ray`` is imported (``ray_constants``) or when
``ray._raylet`` loads (the C++ ``RayConfig``, which holds ``RAY_AUTH_MODE``). An environment
variable set after that is seen by the Ray processes started later but not by this driver,
and the two then disagree (issue 7: a driver that sends no token to a GCS that wants one).
So no setting that Ray reads at import is set here after Ray was imported: ``raycompat``
reconciles the driver's already-read settings at ``ray.init`` time instead.
"""

import os
import sys

# Ray 2.60 binds its servers to every interface, and resolves "127.0.0.1" (a node address or
# the host of an attach address) to the machine's address, unless this is 0. Read once by
# ray._private.ray_constants (ENABLE_RAY_CLUSTER) at import; raycompat also sets that constant.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# Record decoding allocates and frees large buffers per call; glibc's default trims and
# re-maps them each time (~35% of decode time, measured). glibc reads these at process start,
# so they only matter to the processes started afterwards: Ray's workers inherit the
# environment of the process that starts Ray, so this reaches every actor.
WORKER_ENV = {"MALLOC_TRIM_THRESHOLD_": "1000000000", "MALLOC_MMAP_THRESHOLD_": "1000000000"}


#: ``RAYKAFKA_VERBOSE=1`` (what ``raykafka --verbose`` sets, inherited by the processes a
#: command starts): show what Ray, Ray Data and Spark log of their own at start-up and while
#: running. Unset or "0": raykafka's commands, demos and examples show their own output and
#: the warnings that point at a real problem (docs/cli.md, "Output and --verbose").
VERBOSE_ENV = "RAYKAFKA_VERBOSE"


def verbose() -> bool:
    """True when ``RAYKAFKA_VERBOSE`` asks for the internal logs of Ray and Spark."""
    return os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def loopback() -> None:
    """Ask the Ray processes started from here to keep 127.0.0.1 as 127.0.0.1."""
    os.environ.update(LOOPBACK_ENV)


def for_ray_we_start() -> None:
    """The environment of a Ray this process starts (inherited by all of its processes).

    This interpreter's bin directory goes first on PATH: Ray's job agent starts a submitted
    job's ``python ...`` entrypoint through PATH, and without it a cluster started as
    ``.venv/bin/raykafka start`` (the venv not activated) would run jobs with the system's
    python, which has neither Ray nor raykafka."""
    loopback()
    for name, value in WORKER_ENV.items():
        os.environ.setdefault(name, value)
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bin_dir and path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)


def at_import() -> None:
    """What ``import actors`` sets: the worker environment (read by no one at import) and,
    only while Ray is not yet imported, the loopback default, so that a script that imports
    ``actors`` first and then calls ``ray.init(_node_ip_address="127.0.0.1")`` itself still
    gets a loopback Ray. With Ray already imported it sets nothing Ray reads: the driver would
    not see it, only the processes it starts would."""
    for name, value in WORKER_ENV.items():
        os.environ.setdefault(name, value)
    if "ray" not in sys.modules:
        for name, value in LOOPBACK_ENV.items():
            os.environ.setdefault(name, value)
