"""An embedded, single-node ZooKeeper for local use and tests, run from Debian's jars.

What it runs: `java -cp <data_dir>:zookeeper.jar:slf4j-log4j12.jar:log4j-1.2.jar
org.apache.zookeeper.server.ZooKeeperServerMain <data_dir>/zoo.cfg`. Debian's zookeeper.jar
(3.8.0 in bookworm) carries a manifest Class-Path naming its own dependencies under
/usr/share/java (slf4j-api, netty, jetty, jackson, commons-cli/io, metrics, snappy, jute), so
only the slf4j binding has to be added: Debian ships no logback, so we bind slf4j to log4j 1.2
(slf4j-log4j12.jar + log4j-1.2.jar), exactly as Debian's own zkServer.sh does.

Files owned, all under `data_dir`:
  zoo.cfg            generated on every start (clientPortAddress=127.0.0.1, the port, dataDir,
                     admin server off, a 4lw whitelist for ruok/srvr)
  log4j.properties   generated; logs go to zookeeper.log (stdout/stderr to zookeeper.out)
  data/              ZooKeeper's snapshots and transaction log (survive restart)
  zookeeper.pid      JSON {"pid","port","cfg"}: how a later process finds a detached server
Invariant: at most one server per data_dir (start refuses when the pid file names a live one).

Not thread-safe: one owner starts and stops it.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

from coordination.errors import ZooKeeperServerError

ZOOKEEPER_JAR = pathlib.Path("/usr/share/java/zookeeper.jar")
#: The slf4j binding (Debian ships slf4j-api via the manifest but no binding; ZooKeeper 3.8
#: upstream uses logback, which Debian does not package).
LOGGING_JARS = (pathlib.Path("/usr/share/java/slf4j-log4j12.jar"),
                pathlib.Path("/usr/share/java/log4j-1.2.jar"))
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
PID_FILE = "zookeeper.pid"
LOG_FILE = "zookeeper.log"
OUT_FILE = "zookeeper.out"
#: Bound on attempts to find a free port when none was given (another process can take the
#: port between our probe and ZooKeeper's bind).
MAX_PORT_ATTEMPTS = 3


def find_java() -> str:
    java = shutil.which("java") or "/usr/bin/java"
    if not os.access(java, os.X_OK):
        raise ZooKeeperServerError("no java found (apt-get install default-jre-headless)")
    return java


def zookeeper_classpath(conf_dir: pathlib.Path) -> str:
    """conf_dir first (so log4j finds our log4j.properties), then the jars; checks that every
    jar in zookeeper.jar's manifest Class-Path exists, so a broken install fails here with a
    clear message rather than as a ClassNotFoundException in the log."""
    jars = (ZOOKEEPER_JAR, *LOGGING_JARS)
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise ZooKeeperServerError(
            f"missing ZooKeeper jars {missing} (apt-get install zookeeper)")
    return os.pathsep.join([str(conf_dir), *(str(j) for j in jars)])


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the caller retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def four_letter_word(port: int, word: str, *, timeout_s: float = 1.0) -> str:
    """Send a ZooKeeper 4lw command ("ruok", "srvr") and return the reply ("" if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")


def pid_alive(pid) -> bool:
    """Whether process ``pid`` runs (a zombie counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return True


def _pid_runs_cfg(pid: int, cfg: str) -> bool:
    """Guard against PID reuse: the process must be a java running our zoo.cfg."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return cfg.encode() in f.read()
    except OSError:
        return False


class EmbeddedZooKeeper:
    """A standalone ZooKeeper server process on 127.0.0.1:`port` with its data in `data_dir`.

    `start` blocks until the server answers `srvr` (or raises ZooKeeperServerError with the
    log's tail); `stop` is SIGTERM, then SIGKILL after `timeout_s`; `restart` reuses port and
    data, so sessions and znodes survive. Usable as a context manager.
    """

    def __init__(self, data_dir, port: int | None = None, *, tick_time_ms: int = 500,
                 min_session_timeout_ms: int = 1000, max_session_timeout_ms: int = 60000,
                 heap_mb: int = 256, fsync: bool = True):
        self.data_dir = pathlib.Path(data_dir).resolve()
        self.port = port
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap_mb = heap_mb
        self.fsync = fsync
        self._popen: subprocess.Popen | None = None
        self._pid: int | None = None
        self._atexit_registered = False
        #: Seconds the last `start` took from exec to the first good `srvr` reply.
        self.last_start_s: float | None = None

    # -- public ----------------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        if self.port is None:
            raise ZooKeeperServerError("ZooKeeper has no port yet: start it first")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def cfg_path(self) -> pathlib.Path:
        return self.data_dir / "zoo.cfg"

    @property
    def log_path(self) -> pathlib.Path:
        return self.data_dir / LOG_FILE

    def is_running(self) -> bool:
        return self._pid is not None and pid_alive(self._pid)

    def start(self, *, timeout_s: float = 30.0, detached: bool = False) -> EmbeddedZooKeeper:
        """Start the server and wait until it serves requests.

        detached=False: the server is stopped when this Python process exits (atexit).
        detached=True: it gets its own session (no terminal signals) and outlives us; find it
        later with `EmbeddedZooKeeper.attach(data_dir)`.
        """
        if self.is_running():
            raise ZooKeeperServerError(f"already running (pid {self._pid})")
        existing = self.attach(self.data_dir)
        if existing is not None:
            raise ZooKeeperServerError(
                f"a ZooKeeper (pid {existing.pid}, port {existing.port}) already runs on "
                f"{self.data_dir}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fixed_port = self.port is not None
        last_error: ZooKeeperServerError | None = None
        for _ in range(1 if fixed_port else MAX_PORT_ATTEMPTS):
            if not fixed_port:
                self.port = free_port()
            try:
                self._launch(timeout_s=timeout_s, detached=detached)
                return self
            except ZooKeeperServerError as exc:
                last_error = exc
                if "Address already in use" not in str(exc):
                    break
                self.port = None if not fixed_port else self.port
        raise last_error

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; idempotent. Removes the pid file."""
        pid = self._pid
        if pid is not None and pid_alive(pid):
            self._signal_and_wait(pid, signal.SIGTERM, timeout_s)
            if pid_alive(pid):
                self._signal_and_wait(pid, signal.SIGKILL, timeout_s)
            if pid_alive(pid):
                raise ZooKeeperServerError(f"ZooKeeper pid {pid} survived SIGKILL")
        self._pid = None
        self._popen = None
        (self.data_dir / PID_FILE).unlink(missing_ok=True)

    def restart(self, *, timeout_s: float = 30.0, down_s: float = 0.0) -> None:
        """Stop, stay down `down_s`, start again on the same port and data."""
        detached = self._popen is None and self._pid is not None
        self.stop(timeout_s=min(timeout_s, 10.0))
        if down_s > 0:
            time.sleep(down_s)   # the outage itself is what the caller asked for
        self.start(timeout_s=timeout_s, detached=detached)

    def server_info(self, *, timeout_s: float = 2.0) -> str:
        """The `srvr` reply: version, latency, mode, node count."""
        return four_letter_word(self.port, "srvr", timeout_s=timeout_s)

    @classmethod
    def attach(cls, data_dir) -> EmbeddedZooKeeper | None:
        """The live server whose pid file is in `data_dir`, or None (a stale pid file, whose
        process is gone or is not our ZooKeeper, is removed)."""
        data_dir = pathlib.Path(data_dir).resolve()
        pid_file = data_dir / PID_FILE
        try:
            info = json.loads(pid_file.read_text())
            pid, port, cfg = int(info["pid"]), int(info["port"]), str(info["cfg"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (pid_alive(pid) and _pid_runs_cfg(pid, cfg)):
            pid_file.unlink(missing_ok=True)
            return None
        zk = cls(data_dir, port)
        zk._pid = pid
        return zk

    def __enter__(self) -> EmbeddedZooKeeper:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _write_config(self) -> None:
        (self.data_dir / "data").mkdir(exist_ok=True)
        self.cfg_path.write_text("\n".join([
            "# generated by raykafka coordination.zk_server; rewritten on every start",
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            f"minSessionTimeout={self.min_session_timeout_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf",
            # Keep the data dir bounded: purge old snapshots/logs every hour, keep 3.
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            f"forceSync={'yes' if self.fsync else 'no'}",
            "",
        ]))
        (self.data_dir / "log4j.properties").write_text("\n".join([
            "log4j.rootLogger=INFO, FILE",
            "log4j.appender.FILE=org.apache.log4j.RollingFileAppender",
            f"log4j.appender.FILE.File={self.log_path}",
            "log4j.appender.FILE.MaxFileSize=10MB",
            "log4j.appender.FILE.MaxBackupIndex=2",
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout",
            "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n",
            "",
        ]))

    def _command(self) -> list[str]:
        return [
            find_java(), f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            f"-Dzookeeper.log.dir={self.data_dir}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp", zookeeper_classpath(self.data_dir),
            MAIN_CLASS, str(self.cfg_path),
        ]

    def _launch(self, *, timeout_s: float, detached: bool) -> None:
        self._write_config()
        started = time.monotonic()
        with open(self.data_dir / OUT_FILE, "ab") as out:
            self._popen = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=detached, close_fds=True)
        self._pid = self._popen.pid
        (self.data_dir / PID_FILE).write_text(json.dumps(
            {"pid": self._pid, "port": self.port, "cfg": str(self.cfg_path)}))
        try:
            self._wait_serving(started + timeout_s)
        except ZooKeeperServerError:
            self.stop(timeout_s=5.0)
            raise
        self.last_start_s = time.monotonic() - started
        if detached:
            # Nobody will wait() on it from here; let it be reaped by init when we exit.
            self._popen = None
        elif not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _stop_at_exit(self) -> None:
        if self._popen is not None:
            try:
                self.stop(timeout_s=5.0)
            except ZooKeeperServerError:
                pass

    def _wait_serving(self, deadline: float) -> None:
        """Poll `srvr` until it reports a mode (ruok answers "imok" before the database is
        loaded; srvr says "not currently serving" until it is)."""
        delay_s = 0.02
        while True:
            if self._popen is not None and self._popen.poll() is not None:
                raise ZooKeeperServerError(
                    f"ZooKeeper exited with {self._popen.returncode} during start:\n"
                    f"{self._log_tail()}")
            try:
                if "Mode:" in four_letter_word(self.port, "srvr", timeout_s=0.5):
                    return
            except OSError:
                pass   # not listening yet
            if time.monotonic() >= deadline:
                raise ZooKeeperServerError(
                    f"ZooKeeper on port {self.port} not serving before the deadline:\n"
                    f"{self._log_tail()}")
            time.sleep(delay_s)
            delay_s = min(delay_s * 1.5, 0.2)

    def _signal_and_wait(self, pid: int, sig: int, timeout_s: float) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._popen is not None:
                try:
                    self._popen.wait(timeout=0.05)   # reaps our own child
                    return
                except subprocess.TimeoutExpired:
                    continue
            if not pid_alive(pid):
                return
            time.sleep(0.05)

    def _log_tail(self, lines: int = 30) -> str:
        text = []
        for name in (OUT_FILE, LOG_FILE):
            try:
                text += (self.data_dir / name).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                pass
        return "\n".join(text[-lines:])
