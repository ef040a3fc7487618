#!/usr/bin/env bash
# Installs everything raykafka needs on a Debian machine (run as root):
#   - Debian packages: zookeeper (the real server), and the peers used by benchmarks
#   - a virtual environment .venv at the repository root with raykafka and its test tools
# Safe to run again: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
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

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
echo "== pip install -e .[test,bench]"
.venv/bin/pip install -q -e ".[test,bench]"
