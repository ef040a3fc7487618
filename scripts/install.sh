#!/usr/bin/env bash
# Installs everything raykafka needs on a Debian machine (run as root):
#   - Debian packages: zookeeper (the real server), and the peers used by benchmarks
#   - a virtual environment .venv at the repository root with raykafka and its test tools
# Safe to run again: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# the JDK (not only the JRE): jobs/jvm/build.py compiles read_topic_df's Spark reader with javac
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)   # a Kafka client the tests use as an oracle
if [ "${RAYKAFKA_INSTALL_PEERS:-0}" = 1 ]; then
  command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
  command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# pip warns, once per package, about every file:// index of the machine's pip config that
# lacks that package ("WARNING: Location 'file:///.../six/' is ignored: it is neither a
# file nor a directory."). Those lines say nothing about this install and are left out;
# every other warning and error of pip's reaches the terminal.
# A pipeline, not a process substitution: its filter has ended when the function returns,
# and with pipefail the function's status is pip's (the filter's own is ignored).
PIP_NOISE="^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$"
quiet_pip() {
  { "$@" 2>&1 1>&3 3>&- | { grep -v -E "$PIP_NOISE" >&2 || true; }; } 3>&1
}

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
  quiet_pip .venv/bin/pip install -q --upgrade pip
fi
echo "== pip install -e .[test,bench]"
# setuptools' notes about editable installs in general ("Editable installation...",
# UserWarnings of its build backend) say nothing about this one and are left out as well
PYTHONWARNINGS=ignore::UserWarning quiet_pip .venv/bin/pip install -q -e ".[test,bench]"
# Byte-compile the project now: an editable install leaves that to the first import, and
# with PYTHONDONTWRITEBYTECODE set (as on CI machines) every Ray worker process (each
# replica, each broker) would compile the modules from source again, 100-200 ms each.
.venv/bin/python -m compileall -q -j 0 actors storage coordination jobs >/dev/null
# A private Ray that `raykafka start` runs listens on 127.0.0.1 only; this hook lets a
# script of the environment that imports ray first still attach to it with
# ray.init(address="auto") (actors/raycompat.py: loopback_marker_path).
cp scripts/raykafka-loopback.pth "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"

# kafkajs, a test-only pure-JS Kafka client (tests/js, pinned in its package-lock.json),
# when node is on the machine; tests/test_kafka_clients_matrix.py skips its rows without node.
if command -v npm >/dev/null 2>&1; then
  lock_version() { node -p "require('./tests/js/package-lock.json').packages['node_modules/kafkajs'].version"; }
  have_version() { node -p "require('./tests/js/node_modules/kafkajs/package.json').version" 2>/dev/null || true; }
  if [ "$(have_version)" != "$(lock_version)" ]; then
    echo "== npm ci (tests/js: kafkajs)"
    (cd tests/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
fi
