"""Builds ``jobs/jvm/src`` (the Spark DataSource V2 behind ``read_topic_df``) into a jar,
once per source version, with the JDK's ``javac`` against pyspark's own jars: no Maven, no
download.

``jar_path()`` returns the jar, building it the first time: sources and pyspark's version
hashed into the cache key, the jar kept at ``$XDG_CACHE_HOME/raykafka/jvm/<key>/`` (default
``~/.cache``), written to a temporary directory and renamed into place, so concurrent
builders on one machine never see half a jar. ``None`` (and a logged reason) when there is
no ``javac`` or the build fails: ``read_topic_df`` then reads through Spark's Python
workers. ``python -m jobs.jvm.build`` builds it and prints the path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

SRC = Path(__file__).resolve().parent / "src"
JAR_NAME = "raykafka-spark.jar"
#: The class ``spark.read.format(...)`` names.
SOURCE_CLASS = "raykafka.spark.TopicSource"
JAVA_RELEASE = "11"                 # Spark 3.5 runs on Java 8/11/17; RayDP here on 17

_lock = threading.Lock()
_built: dict[str, Path | None] = {}


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.java"))


def pyspark_jars() -> Path:
    import pyspark
    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return Path(home) / "jars"


def cache_key() -> str:
    import pyspark
    h = hashlib.sha256(f"pyspark {pyspark.__version__} release {JAVA_RELEASE}\n".encode())
    for path in sources():
        h.update(str(path.relative_to(SRC)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raykafka" / "jvm"


def javac() -> str | None:
    """The JDK's javac: on PATH, else next to ``java`` / under JAVA_HOME."""
    found = shutil.which("javac")
    if found:
        return found
    for home in (os.environ.get("JAVA_HOME"),
                 os.path.dirname(os.path.dirname(os.path.realpath(shutil.which("java") or "")))):
        if home and os.path.isfile(os.path.join(home, "bin", "javac")):
            return os.path.join(home, "bin", "javac")
    return None


def jar_path() -> Path | None:
    """The built jar (built now if missing), or None when it cannot be built (the reason
    logged at WARNING once per process)."""
    key = cache_key()
    with _lock:
        if key in _built:
            return _built[key]
        target = cache_dir() / key / JAR_NAME
        if not target.is_file():
            try:
                build(target)
            except BuildError as exc:
                log.warning("the JVM reader of read_topic_df is not available (%s); "
                            "reading through Spark's Python workers", exc)
                _built[key] = None
                return None
        _built[key] = target
        return target


class BuildError(Exception):
    pass


def build(target: Path) -> Path:
    """Compile the sources into the jar ``target`` (replaced atomically)."""
    compiler = javac()
    if compiler is None:
        raise BuildError("no javac: install a JDK, e.g. Debian's openjdk-17-jdk-headless")
    jars = pyspark_jars()
    if not jars.is_dir():
        raise BuildError(f"no pyspark jars at {jars}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=target.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [compiler, "--release", JAVA_RELEASE, "-nowarn", "-Xlint:none",
               "-encoding", "UTF-8", "-cp", str(jars / "*"), "-d", str(classes),
               *map(str, sources())]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"javac did not run: {exc!r}") from None
        if done.returncode != 0:
            raise BuildError(f"javac failed ({done.returncode}): "
                             f"{(done.stderr or done.stdout).strip()[-2000:]}")
        partial = Path(tmp) / JAR_NAME
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n"
                                                 "Created-By: raykafka jobs/jvm/build.py\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        os.replace(partial, target)
    return target


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    path = jar_path()
    print(path if path else "not built (see the warning above)")
    sys.exit(0 if path else 1)
