#!/usr/bin/env python3
"""Proves cluster.yaml on this one machine: `ray up` of a head and worker nodes, jobs
through `ray job submit`, the documented stop and `ray down`, and that nothing of it is
left running.

    .venv/bin/python scripts/ray_up_proof.py [--workers N] [--job both|word_count|smoke]

How (docs/cluster.md, "`ray up` on several machines"; every step is timed):

1. Debian's openssh-server, netcat-openbsd and rsync (apt-get, only when missing).
2. A throwaway ssh key pair, host key and Ray token in a temporary dir.
3. The cluster's own network: a new network namespace, its loopback up, nothing else. Every
   node lives in it, so the cluster runs on the ports cluster.yaml names (ssh 22, Ray 6379,
   the job server 8265, ZooKeeper 2181, Ray's other defaults) without meeting any other
   program here, and nothing of it is reachable from this machine's network: Ray binds
   its servers on every interface of a multi-node cluster, and here every interface is
   that private loopback. This script reaches it only through the ssh proxy command
   (`nsenter --net=<that namespace> nc %h 22`; Ray's cluster config has no ssh port
   field) and through the tunnel `ray dashboard` opens to the job server, as a user does.
4. One Ray node per loopback address (the head 127.0.0.1, workers 127.0.0.2, ...: Ray's
   local provider names a node by its address): a private sshd (its own config: no PAM,
   root by key only, one address) started as
   `unshare --pid --fork --mount-proc --kill-child`, so that every process started through
   that ssh (Ray, ZooKeeper, the raykafka daemon, brokers, jobs) lives in the node's own PID
   namespace. That is what makes `ray down` safe here: it runs `ray stop` on the head, which
   ends every Ray process it can see (psutil over /proc), and there it sees only the
   head's. Each node's mount namespace has its own /tmp/ray (Ray's session dirs and the
   address file `ray stop` deletes), /dev/shm (the object store), "disk" (the data dir) and
   home (/root: ~/.raykafka, ~/.ray, ~/.bashrc, ~/ray_bootstrap_*), so that no file of
   another engineer's Ray or raykafka is seen or touched.
5. Before any Ray command: checks over ssh that every session is in those namespaces, not
   this script's, with only the sshd's few processes and the private mounts, and that a
   `ray stop` run on the head finds nothing and ends none of the Ray processes outside. A
   canary outside, a copy of sleep named raylet-canary (any `ray stop` would end it: it ends
   every process whose name contains "raylet"), must live through the whole run.
6. A derived config: cluster.yaml with HEAD_NODE_IP 127.0.0.1, the workers' addresses, the
   install and data dirs in the temporary dir, the ssh key and proxy command, a smaller
   object store, and the workers' node address (on real machines Ray finds it). Every
   placeholder it replaces must be found: a changed cluster.yaml fails here instead of
   proving something else.
7. `ray up -y`; `ray exec ... 'raykafka status'`; `ray dashboard` (the tunnel); the jobs
   with `ray job submit --working-dir .` (a small produce/consume job, then
   jobs/examples/word_count.py, its counts checked against its sample text and read back
   from the output topic with `raykafka consume`); the brokers' data, one broker per
   worker, on that worker's disk.
8. The stop command cluster.yaml documents, through `ray exec`, then `ray down -y`; then
   no process but the sshd may be left in any node's namespace (a worker's Ray ends by
   itself once the head's is gone); the sshds and the network namespace are ended; no
   process of the run is left. On any failure the namespaces are ended (a PID namespace's
   init dies and the kernel ends the rest), so a failed run leaves nothing running either;
   its logs are kept.

Never runs `ray stop` outside those namespaces. Ends only processes it started, by PID.
"""

from __future__ import annotations

import argparse
import ast
import getpass
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
RAY = os.path.join(VENV_BIN, "ray")
APT_PACKAGES = {"/usr/sbin/sshd": "openssh-server", "/usr/bin/nc": "netcat-openbsd",
                "/usr/bin/rsync": "rsync"}
#: What cluster.yaml names and the derived config moves into the temporary dir.
INSTALL_DIR = "/opt/raykafka"
DATA_DIR = "/var/lib/raykafka"
#: cluster.yaml's ports, inside the cluster's own network namespace.
ZK_PORT, DASHBOARD_PORT = 2181, 8265
#: What the object store may take per node here (Ray's default is 30% of the memory).
OBJECT_STORE_BYTES = 700_000_000

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class ProofError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def ns_of(pid, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def pids_in(kind: str, ns: str | None) -> list[int]:
    """Host PIDs of the processes in namespace ``ns`` (of type pid or net)."""
    if ns is None:
        return []
    return [p.pid for p in psutil.process_iter() if ns_of(p.pid, kind) == ns]


def outside_ray_processes() -> dict[int, str]:
    """Ray's long-lived processes in this script's PID namespace (other engineers')."""
    mine = ns_of("self", "pid")
    out = {}
    for p in psutil.process_iter(["name", "create_time"]):
        if p.info["name"] in ("raylet", "gcs_server") and ns_of(p.pid, "pid") == mine:
            out[p.pid] = f"{p.info['name']}@{p.info['create_time']}"
    return out


class Node:
    """One Ray node: a private sshd on ``ip``:22 in the cluster's network namespace and in
    PID and mount namespaces of its own."""

    def __init__(self, proof: Proof, name: str, ip: str):
        self.proof, self.name, self.ip = proof, name, ip
        self.dir = os.path.join(proof.tmp, "nodes", name)
        self.home = os.path.join(self.dir, "home")      # mounted over /root
        self.disk = os.path.join(self.dir, "disk")      # mounted over the data dir
        self.unshare: subprocess.Popen | None = None
        self.sshd_pid: int | None = None                # host PID of the sshd (ns init)
        self.pid_ns: str | None = None

    def start(self) -> None:
        p = self.proof
        for d in ("home", "disk", "tmp-ray"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        cfg = os.path.join(self.dir, "sshd_config")
        with open(cfg, "w") as f:
            f.write("\n".join([
                "Port 22", f"ListenAddress {self.ip}",
                f"HostKey {p.tmp}/ssh/host_ed25519", f"PidFile {self.dir}/sshd.pid",
                f"AuthorizedKeysFile {p.tmp}/ssh/authorized_keys",
                "PermitRootLogin prohibit-password", "AllowUsers root",
                "PubkeyAuthentication yes", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                "X11Forwarding no", "PrintMotd no", "UseDNS no", "MaxStartups 50:30:100",
                ""]))
        # shared into the node's home: this machine's pip cache (a quicker install) and,
        # read-only, the pyenv interpreter of this repository's .venv (its `ray stop`)
        share = []
        for rel, ro in ((".cache/pip", False), (".pyenv", True)):
            src, dst = os.path.join(os.path.expanduser("~"), rel), os.path.join(self.home, rel)
            if os.path.isdir(src):
                share += [f"mkdir -p {dst}", f"mount --bind {src} {dst}"]
                share += [f"mount -o remount,bind,ro {dst}"] if ro else []
        init = os.path.join(self.dir, "nsinit.sh")
        with open(init, "w") as f:
            f.write("\n".join([
                "#!/bin/sh",
                "# PID 1 of this node's namespaces: private mounts, then the sshd",
                "set -eu",
                "mkdir -p /run/sshd /tmp/ray",
                f"mount --bind {self.dir}/tmp-ray /tmp/ray",
                "mount -t tmpfs -o size=3g,mode=1777 tmpfs /dev/shm",
                f"mount --bind {self.disk} {p.data_dir}",
                *share,
                f"mount --rbind {self.home} /root",
                f"exec /usr/sbin/sshd -D -e -f {cfg}", ""]))
        os.chmod(init, 0o755)
        with open(os.path.join(p.logs, f"sshd-{self.name}.log"), "ab") as out:
            self.unshare = subprocess.Popen(
                [*p.in_net, "unshare", "--pid", "--fork", "--mount-proc",
                 "--propagation", "private", "--kill-child", init],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 30
        while subprocess.run([*p.in_net, "nc", "-z", "-w", "1", self.ip, "22"],
                             capture_output=True, check=False).returncode != 0:
            if self.unshare.poll() is not None:
                raise ProofError(f"{self.name}: sshd exited ({self.unshare.returncode}); "
                                 f"see {p.logs}/sshd-{self.name}.log")
            if time.monotonic() > deadline:
                raise ProofError(f"{self.name}: sshd not listening on {self.ip}:22")
            time.sleep(0.2)
        children = psutil.Process(self.unshare.pid).children()
        if len(children) != 1:
            raise ProofError(f"{self.name}: unshare has children {children}")
        self.sshd_pid = children[0].pid
        self.pid_ns = ns_of(self.sshd_pid, "pid")
        log(f"{self.name}: private sshd on {self.ip}:22, host pid {self.sshd_pid}, "
            f"{self.pid_ns}")

    def ssh(self, command: str, *, timeout: float = 120, check: bool = True) -> str:
        p = self.proof
        cmd = ["ssh", "-i", f"{p.tmp}/ssh/id_ed25519", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes",
               "-o", f"ProxyCommand={p.proxy}", f"root@{self.ip}", command]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise ProofError(f"{self.name}: ssh {command!r} exited {r.returncode}: "
                             f"{r.stderr.strip()[-500:]}")
        return r.stdout

    def processes(self) -> list[tuple[int, str, str]]:
        """(pid, comm, args) of every process in the namespace, as seen from inside."""
        rows = []
        for line in self.ssh("ps -eo pid=,comm=,args=").splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2:
                rows.append((int(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
        return rows

    def verify_isolated(self) -> None:
        """The safety gate before any Ray command reaches this node."""
        inside = self.ssh("readlink /proc/self/ns/pid /proc/self/ns/net").split()
        if inside != [self.pid_ns, self.proof.net_ns] or \
                inside[0] == ns_of("self", "pid") or inside[1] == ns_of("self", "net"):
            raise ProofError(f"{self.name}: ssh session in {inside}, expected "
                             f"{[self.pid_ns, self.proof.net_ns]}")
        procs = self.processes()
        if len(procs) > 6 or procs[0][0] != 1 or procs[0][1] != "sshd":
            raise ProofError(f"{self.name}: unexpected processes in the namespace: {procs}")
        # marker files put in this node's own dirs are what it sees at the shared paths;
        # /dev/shm is the 3 GiB tmpfs of nsinit.sh
        marker = f".ray_up_proof-{os.getpid()}"
        for d in ("tmp-ray", "disk", "home"):
            open(os.path.join(self.dir, d, marker), "w").close()
        seen = self.ssh(f"test -e /tmp/ray/{marker} && echo tmp-ray; "
                        f"test -e {self.proof.data_dir}/{marker} && echo disk; "
                        f"test -e ~/{marker} && echo home; "
                        "df -B1G --output=size /dev/shm | tail -1").split()
        if seen != ["tmp-ray", "disk", "home", "3"]:
            raise ProofError(f"{self.name}: not private in the namespace: {seen}")
        log(f"{self.name}: isolated: {len(procs)} processes visible over ssh "
            f"({', '.join(c for _, c, _ in procs)}), the cluster's network, own /tmp/ray, "
            f"/dev/shm, data dir and home")

    def stop(self) -> None:
        """End the namespace: SIGTERM its sshd (PID 1 there; the kernel then kills every
        other process of the namespace), SIGKILL through unshare's --kill-child if need be."""
        if self.unshare is None:
            return
        if self.unshare.poll() is None and self.sshd_pid and psutil.pid_exists(self.sshd_pid):
            try:
                os.kill(self.sshd_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.unshare.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.unshare.kill()                      # --kill-child: SIGKILL to the ns init
            self.unshare.wait(timeout=20)


class Proof:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="raykafka-rayup-")
        self.logs = os.path.join(self.tmp, "logs")
        os.makedirs(self.logs)
        self.install_dir = os.path.join(self.tmp, "opt", "raykafka")
        self.data_dir = os.path.join(self.tmp, "var", "raykafka")
        os.makedirs(self.data_dir)
        self.cluster_name = f"raykafka-proof-{os.getpid()}"
        self.brokers = args.brokers or args.workers or 3
        self.nodes = [Node(self, "head", "127.0.0.1")] + [
            Node(self, f"worker{i + 1}", f"127.0.0.{i + 2}") for i in range(args.workers)]
        self.config = os.path.join(self.tmp, "cluster.yaml")
        self.token = os.path.join(self.tmp, "auth_token")
        self.timings: list[tuple[str, float]] = []
        self.verified = False
        self.stop_command = ""
        self.outside_before: dict[int, str] = {}
        self.canary: subprocess.Popen | None = None
        self.netns_holder: subprocess.Popen | None = None
        self.net_ns: str | None = None
        self.in_net: list[str] = []
        self.proxy = ""
        self.tunnel: subprocess.Popen | None = None
        self.tunnel_port = free_port()
        self.wheels = ""
        self.client_env = dict(os.environ)
        for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAYKAFKA_STATE_DIR"):
            self.client_env.pop(k, None)
        self.client_env.update({
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # Ray's client-side files (the local provider's cluster state, the config
            # cache) in our dir instead of the shared /tmp/ray
            "TMPDIR": os.path.join(self.tmp, "client-tmp"),
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_UP_enable_autoscaler_v2": "1",
            # the cluster's token mode, explicitly, with the token made for this run
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token})
        os.makedirs(self.client_env["TMPDIR"])

    def step(self, name, fn, *a, **kw):
        log(f"== {name}")
        t = time.monotonic()
        try:
            return fn(*a, **kw)
        finally:
            self.timings.append((name, time.monotonic() - t))

    # -- set-up ----------------------------------------------------------------------------
    def packages(self) -> None:
        missing = sorted({pkg for path, pkg in APT_PACKAGES.items() if not os.path.exists(path)})
        if not missing:
            log("openssh-server, netcat-openbsd, rsync present")
            return
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        with open(os.path.join(self.logs, "apt.log"), "ab") as out:
            subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=out,
                           stderr=subprocess.STDOUT, check=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, stdout=out,
                           stderr=subprocess.STDOUT, check=True, timeout=900)
        log(f"installed {', '.join(missing)}")

    def keys(self) -> None:
        d = os.path.join(self.tmp, "ssh")
        os.makedirs(d, mode=0o700)
        for name in ("id_ed25519", "host_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                            f"ray_up_proof-{os.getpid()}", "-f", os.path.join(d, name)],
                           check=True)
        shutil.copy(os.path.join(d, "id_ed25519.pub"), os.path.join(d, "authorized_keys"))
        with open(self.token, "w") as f:
            f.write(secrets.token_hex(32))
        os.chmod(self.token, 0o600)

    def network(self) -> None:
        """The cluster's network namespace, held by a sleep of ours; its loopback up."""
        self.netns_holder = subprocess.Popen(["unshare", "--net", "sleep", "86400"],
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while ns_of(self.netns_holder.pid, "net") in (None, ns_of("self", "net")):
            if time.monotonic() > deadline:
                raise ProofError("the network namespace did not come up")
            time.sleep(0.05)
        self.net_ns = ns_of(self.netns_holder.pid, "net")
        self.in_net = ["nsenter", f"--net=/proc/{self.netns_holder.pid}/ns/net"]
        self.proxy = " ".join(self.in_net) + " nc %h 22"
        subprocess.run([*self.in_net, "ip", "link", "set", "lo", "up"], check=True)
        log(f"cluster network: {self.net_ns} (held by pid {self.netns_holder.pid}), "
            f"loopback only; ssh proxy command: {self.proxy}")

    def wheelhouse(self) -> None:
        """The cluster's network has no way out, so the nodes install from wheels made here:
        everything pyproject.toml names (with the test and bench extras), the build
        backend, and pip (install.sh upgrades it); install.sh then runs with
        PIP_NO_INDEX=1 and PIP_FIND_LINKS=<these> (pip's cache makes this quick). Made by
        the python3 the nodes' install.sh finds on an ssh login's PATH, for its markers."""
        import tomllib
        with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
            project = tomllib.load(f)
        reqs = [*project["project"]["dependencies"], *project["build-system"]["requires"],
                "pip", *(r for extra in ("test", "bench")
                         for r in project["project"]["optional-dependencies"][extra])]
        self.wheels = os.path.join(self.tmp, "wheelhouse")
        python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        venv = os.path.join(self.tmp, "wheel-venv")
        with open(os.path.join(self.logs, "pip_wheel.log"), "w") as out:
            subprocess.run([python, "-m", "venv", venv], stdout=out, stderr=subprocess.STDOUT,
                           check=True, timeout=300)
            subprocess.run([os.path.join(venv, "bin", "pip"), "wheel", "-q", "--wheel-dir",
                            self.wheels, *reqs], cwd=self.tmp, stdout=out,
                           stderr=subprocess.STDOUT, check=True, timeout=1200)
        shutil.rmtree(venv)
        log(f"{len(os.listdir(self.wheels))} wheels for {len(reqs)} requirements in "
            f"{self.wheels}")

    def start_nodes(self) -> None:
        for node in self.nodes:
            node.start()

    def start_canary(self) -> None:
        """A process outside the namespaces that any `ray stop` would end: a copy of sleep
        named raylet-canary (`ray stop` ends every process whose name contains "raylet").
        It must live through the whole run."""
        path = os.path.join(self.tmp, "canary", "raylet-canary")
        os.makedirs(os.path.dirname(path))
        shutil.copy(shutil.which("sleep"), path)
        self.canary = subprocess.Popen([path, "86400"], stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        time.sleep(0.2)
        if psutil.Process(self.canary.pid).name() != "raylet-canary":
            raise ProofError("the canary does not carry its name")
        log(f"canary outside the namespaces: pid {self.canary.pid}, name raylet-canary")

    def check_canary(self, when: str) -> None:
        if self.canary is None or self.canary.poll() is not None:
            raise ProofError(f"the canary outside the namespaces was ended ({when}): a "
                             f"`ray stop` reached beyond them")

    def verify(self) -> None:
        for node in self.nodes:
            node.verify_isolated()
        # `ray stop` where `ray down` will run it: it must find nothing and end nothing
        # outside (the processes of the other Ray instances on this machine)
        before = outside_ray_processes()
        out = self.nodes[0].ssh(f"{RAY} stop 2>&1", timeout=180)
        if "Did not find any active Ray processes" not in out:
            raise ProofError(f"`ray stop` inside the head's namespace found something: {out}")
        self.check_canary("the `ray stop` test")
        after = outside_ray_processes()
        gone = {p: d for p, d in before.items() if after.get(p) != d}
        if gone:
            raise ProofError(f"Ray processes outside ended during the `ray stop` test: {gone}")
        self.outside_before = after
        log(f"`ray stop` in the head's namespace: nothing found; the canary and the "
            f"{len(before)} raylet/gcs_server processes outside still run")
        self.verified = True

    def derive(self) -> None:
        with open(os.path.join(REPO, "cluster.yaml")) as f:
            text = f.read()
        config = yaml.safe_load(text)
        workers = [n.ip for n in self.nodes[1:]]
        store = f"--object-store-memory={OBJECT_STORE_BYTES}"
        # (placeholder in cluster.yaml, replacement), in this order; each must occur
        subs = [
            ("HEAD_NODE_IP", "127.0.0.1"),
            ("--wait-workers 3", f"--wait-workers {len(workers)}"),
            ("--brokers 3", f"--brokers {self.brokers}"),
            (INSTALL_DIR, self.install_dir),
            (DATA_DIR, self.data_dir),
            ("ray start --head", f"ray start --head {store}"),
            ("bash scripts/install.sh",
             f"PIP_NO_INDEX=1 PIP_FIND_LINKS={self.wheels} bash scripts/install.sh"),
            # a worker here is one more loopback address, which Ray would not find by
            # itself (it finds no route out and says 127.0.0.1): the one its sshd was
            # reached on. On real machines Ray finds the node's address.
            ("ray start --address=$RAY_HEAD_IP:6379",
             (f"ray start --address=$RAY_HEAD_IP:6379 {store} "
              "--node-ip-address=$(echo $SSH_CONNECTION | cut -d' ' -f3)")),
        ]
        used = {old: 0 for old, _ in subs}

        def sub(cmd: str) -> str:
            for old, new in subs:
                cmd, n = re.subn(re.escape(old), lambda _, new=new: new, cmd)
                used[old] += n
            return cmd

        for key in ("setup_commands", "head_setup_commands", "head_start_ray_commands",
                    "worker_start_ray_commands", "worker_setup_commands"):
            if key in config:
                config[key] = [sub(c) for c in config[key] or []]
        m = re.search(r"ray exec cluster\.yaml '([^']*raykafka stop[^']*)'", text)
        if not m:
            raise ProofError("cluster.yaml documents no `ray exec cluster.yaml '... raykafka "
                             "stop ...'` before `ray down`")
        self.stop_command = sub(m.group(1))
        missing = [old for old, n in used.items() if n == 0]
        if missing:
            raise ProofError(f"cluster.yaml no longer contains {missing}: update the proof")
        for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
            if ("ray start" in c or "raykafka start" in c) and "RAY_AUTH_MODE=" not in c:
                raise ProofError(f"start command without an explicit RAY_AUTH_MODE: {c}")
        if any("ray stop" in c for k in config if k.endswith("commands")
               for c in config[k] or []):
            raise ProofError("cluster.yaml runs `ray stop`")
        if not {".venv", ".git"} <= set(config.get("rsync_exclude") or []):
            raise ProofError("cluster.yaml's rsync_exclude lacks .venv or .git")
        if f"--port {ZK_PORT}" not in text or f"--dashboard-port={DASHBOARD_PORT}" not in text:
            raise ProofError("cluster.yaml's ZooKeeper or job server port changed: update "
                             "the proof")
        config["cluster_name"] = self.cluster_name
        config["provider"].update(head_ip="127.0.0.1", worker_ips=workers)
        config["min_workers"] = config["max_workers"] = len(workers)
        config["auth"] = {"ssh_user": "root", "ssh_private_key": f"{self.tmp}/ssh/id_ed25519",
                          "ssh_proxy_command": self.proxy}
        mounts = {}
        for remote in config["file_mounts"]:
            if remote == INSTALL_DIR:
                mounts[self.install_dir] = REPO
            elif remote == "~/.ray/auth_token":
                mounts[remote] = self.token
            else:
                raise ProofError(f"unknown file mount {remote}: update the proof")
        config["file_mounts"] = mounts
        with open(self.config, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False, width=1000)
        log(f"derived {self.config}: head 127.0.0.1, workers {workers or 'none'}, "
            f"{self.brokers} broker(s)")

    # -- the cluster ---------------------------------------------------------------------
    def ray_cli(self, args: list[str], *, name: str, timeout: float, check: bool = True,
                show_tail: int = 0) -> str:
        if not self.verified:
            raise ProofError("refusing to run a Ray command before the namespaces are verified")
        path = os.path.join(self.logs, f"{name}.log")
        with open(path, "w") as out:
            r = subprocess.run([RAY, *args], cwd=REPO, env=self.client_env, stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=timeout, check=False)
        with open(path, errors="replace") as f:
            text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f.read())
        if check and r.returncode != 0:
            tail = "\n".join(text.splitlines()[-40:])
            raise ProofError(f"`ray {' '.join(args[:2])}` exited {r.returncode} "
                             f"(log {path}):\n{tail}")
        for line in text.strip().splitlines()[-show_tail:] if show_tail else []:
            print(f"    | {line}", flush=True)
        return text

    def exec_(self, command: str, *, name: str, timeout: float = 300) -> str:
        return self.ray_cli(["exec", self.config, command], name=name, timeout=timeout)

    def ray_up(self) -> None:
        self.ray_cli(["up", "-y", "--no-config-cache", self.config], name="ray_up",
                     timeout=self.args.up_timeout)
        self.check_canary("`ray up`")
        status = self.exec_("raykafka status", name="raykafka_status")
        for line in status.splitlines():
            if line.startswith(("cluster ", "brokers ", "controller ", "zookeeper ", "ray ",
                                "data dir ")):
                print(f"    | {line.rstrip()}", flush=True)
        if f"127.0.0.1:{ZK_PORT}/" not in status:
            raise ProofError(f"raykafka status does not show ZooKeeper on the head: {status}")

    def open_tunnel(self) -> None:
        """`ray dashboard`: an ssh tunnel from 127.0.0.1:<free port> here to the job server."""
        with open(os.path.join(self.logs, "ray_dashboard.log"), "w") as out:
            self.tunnel = subprocess.Popen(
                [RAY, "dashboard", "--port", str(self.tunnel_port), self.config], cwd=REPO,
                env=self.client_env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not listening("127.0.0.1", self.tunnel_port):
            if self.tunnel.poll() is not None or time.monotonic() > deadline:
                raise ProofError(f"`ray dashboard` did not open 127.0.0.1:{self.tunnel_port}")
            time.sleep(0.3)
        log(f"`ray dashboard`: job server tunnelled to http://127.0.0.1:{self.tunnel_port}")

    def close_tunnel(self) -> None:
        if self.tunnel is not None and self.tunnel.poll() is None:
            os.killpg(self.tunnel.pid, signal.SIGTERM)   # ray dashboard and its ssh
            self.tunnel.wait(timeout=20)

    def submit(self, name: str, entrypoint: list[str]) -> str:
        return self.ray_cli(
            ["job", "submit", "--address", f"http://127.0.0.1:{self.tunnel_port}",
             "--working-dir", ".", "--", *entrypoint],
            name=f"job_{name}", timeout=self.args.job_timeout)

    def job_smoke(self) -> None:
        result = last_json(self.submit("smoke", ["python", "-c", SMOKE_JOB]))
        if not result.get("ok"):
            raise ProofError(f"smoke job: {result}")
        log(f"smoke job: {result['records']} records produced and read back through "
            f"Cluster.connect(); broker -> node: {result['broker_nodes']}")

    def job_word_count(self) -> None:
        with open(os.path.join(REPO, "jobs", "examples", "word_count.py")) as f:
            tree = ast.parse(f.read())
        lines = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and getattr(n.targets[0], "id", "") == "SAMPLE_LINES")
        want: dict[str, int] = {}
        for line in lines:
            for w in re.split(r"[^0-9a-z]+", line.lower()):
                if w:
                    want[w] = want.get(w, 0) + 1
        result = last_json(self.submit("word_count", ["python", "jobs/examples/word_count.py"]))
        if (result.get("words"), result.get("total")) != (len(want), sum(want.values())):
            raise ProofError(f"word_count: {result}, expected {len(want)} words, "
                             f"{sum(want.values())} in all")
        if sum(result.get("written", {}).values()) != len(want):
            raise ProofError(f"word_count wrote {result.get('written')}, expected {len(want)}")
        # the output topic read back on the cluster, independently of the job
        text = self.exec_(f"raykafka consume {result['output']} --from-beginning --print-key "
                          f"--max-messages {len(want)} --timeout-ms 30000",
                          name="consume_counts")
        got = {}
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 and parts[1].strip().isdigit():
                got[parts[0].strip()] = int(parts[1])
        if got != want:
            wrong = {w: (got.get(w), n) for w, n in want.items() if got.get(w) != n}
            raise ProofError(f"{result['output']} read back differs (got, want): "
                             f"{dict(list(wrong.items())[:10])}; extra "
                             f"{sorted(set(got) - set(want))[:10]}")
        log(f"word_count: {len(want)} distinct words, {sum(want.values())} in all, as "
            f"expected; topic {result['output']!r} read back with `raykafka consume`: every "
            f"count right ({result.get('seconds')}s in the job)")

    def placement(self) -> None:
        """Each broker's log dir is on the "disk" of the node it runs on: one per worker
        (with workers), else on the head."""
        where = {}
        for node in self.nodes:
            for name in sorted(os.listdir(node.disk)):
                if name.startswith("broker-"):
                    where[name] = node.name
        log(f"broker data dirs: {where or 'none'}")
        hosts = {n.name for n in self.nodes[1:]} or {"head"}
        if len(where) != self.brokers or set(where.values()) != hosts:
            raise ProofError(f"expected {self.brokers} brokers' data on {sorted(hosts)}: {where}")

    def network_check(self) -> None:
        """Every process of the cluster is in its network namespace, so nothing of it
        listens on this machine's network."""
        pids = [pid for node in self.nodes for pid in pids_in("pid", node.pid_ns)]
        outside = [pid for pid in pids if ns_of(pid, "net") != self.net_ns]
        if outside:
            raise ProofError(f"cluster processes outside the cluster's network: {outside}")
        ss = subprocess.run([*self.in_net, "ss", "-ltnH"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
        log(f"the cluster's {len(pids)} processes are all in its own network namespace "
            f"({len(ss)} listening sockets there, none on this machine's network)")

    def down(self) -> None:
        log(f"stop (cluster.yaml's documented command): {self.stop_command}")
        out = self.exec_(self.stop_command, name="raykafka_stop", timeout=300)
        for line in out.splitlines():
            if line.startswith(("raykafka cluster", "zookeeper")):
                print(f"    | {line.rstrip()}", flush=True)
        self.ray_cli(["down", "-y", self.config], name="ray_down", timeout=600, show_tail=2)
        self.check_canary("`ray down`")

    def nothing_left_in_namespaces(self) -> None:
        """After the stop and `ray down`, only the sshds remain. `ray down` runs `ray stop`
        on the head only (the local provider does nothing on the workers): a worker's Ray
        ends by itself once the head's is gone, which takes it a while."""
        started = time.monotonic()
        for node in self.nodes:
            limit = 30 if node is self.nodes[0] else self.args.worker_exit_timeout
            while True:
                left = [(pid, comm, args[:100]) for pid, comm, args in node.processes()
                        if comm != "sshd" and "ps -eo pid=,comm=,args=" not in args]
                if not left:
                    break
                if time.monotonic() - started > limit:
                    raise ProofError(f"{node.name}: still running {time.monotonic() - started:.0f}"
                                     f"s after the stop and `ray down`: {left}")
                time.sleep(2)
            log(f"{node.name}: only the sshd is left in the namespace "
                f"({time.monotonic() - started:.0f}s after `ray down`)")

    def outside_untouched(self) -> None:
        self.check_canary("the run")
        after = outside_ray_processes()
        gone = {p: d for p, d in self.outside_before.items() if after.get(p) != d}
        log(f"the canary outside lived through the run; of the {len(self.outside_before)} "
            f"raylet/gcs_server processes of other Ray instances "
            f"{len(self.outside_before) - len(gone)} still run"
            + (f" ({len(gone)} ended meanwhile, as their owners' runs do)" if gone else ""))

    def stop_all(self) -> None:
        """The tunnel, the sshds (their namespaces go with them), the network's holder, the
        canary: each by its PID."""
        self.close_tunnel()
        for node in self.nodes:
            node.stop()
        for proc in (self.netns_holder, self.canary):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)

    def our_processes(self) -> list[str]:
        """Processes of this run that are still there: anything in its namespaces, anything
        whose command line names its temporary dir (ssh control masters, the tunnel)."""
        me = os.getpid()
        spaces = [("pid", n.pid_ns) for n in self.nodes] + [("net", self.net_ns)]
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if p.pid != me and (self.tmp in cmd or any(
                    ns and ns_of(p.pid, kind) == ns for kind, ns in spaces)):
                out.append(f"{p.pid} {cmd[:120]}")
        return out

    def nothing_left(self) -> None:
        deadline = time.monotonic() + 30           # Ray's ssh ControlPersist is 10 s
        while self.our_processes():
            if time.monotonic() > deadline:
                raise ProofError(f"left running: {self.our_processes()}")
            time.sleep(1)
        if listening("127.0.0.1", self.tunnel_port):
            raise ProofError(f"127.0.0.1:{self.tunnel_port} (the tunnel) still listening")
        log(f"nothing left: no process in the {len(self.nodes)} node namespace(s) or the "
            f"cluster's network, no ssh, tunnel or canary of ours")

    # -- cleanup -------------------------------------------------------------------------
    def cleanup(self, ok: bool) -> None:
        try:
            self.stop_all()                  # on failure this ends the whole cluster
        except Exception as exc:  # noqa: BLE001 - keep cleaning up
            log(f"cleanup: {exc!r}")
        deadline = time.monotonic() + 15
        while self.our_processes() and time.monotonic() < deadline:
            time.sleep(1)
        for line in self.our_processes():     # stragglers of ours: by PID
            log(f"cleanup: ending {line}")
            try:
                os.kill(int(line.split()[0]), signal.SIGTERM)
            except ProcessLookupError:
                pass
        # Ray's ssh control sockets of this cluster (command_runner.py: /tmp/ray_ssh_<user
        # hash>/<cluster name hash>)
        user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
        control = f"/tmp/ray_ssh_{user}/" + \
            hashlib.sha256(self.cluster_name.encode()).hexdigest()[:10]
        shutil.rmtree(control, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(control))          # only when empty
        except OSError:
            pass
        if ok and not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            shutil.rmtree(os.path.join(self.tmp, "opt"), ignore_errors=True)   # the venv
            log(f"kept {self.tmp} (logs in {self.logs}; Ray's in nodes/*/tmp-ray)")

    def run(self) -> None:
        a = self.args
        self.step("packages", self.packages)
        self.step("keys and token", self.keys)
        self.step("the cluster's network", self.network)
        self.step("private sshds in their own namespaces", self.start_nodes)
        self.step("canary", self.start_canary)
        self.step("safety checks", self.verify)
        self.step("wheels for the nodes", self.wheelhouse)
        self.step("derive the config", self.derive)
        self.step("ray up", self.ray_up)
        self.step("ray dashboard (tunnel)", self.open_tunnel)
        if a.job in ("smoke", "both"):
            self.step("job: smoke", self.job_smoke)
        if a.job in ("word_count", "both"):
            self.step("job: word_count", self.job_word_count)
        self.step("broker placement", self.placement)
        self.step("network isolation", self.network_check)
        self.close_tunnel()
        self.step("stop and ray down", self.down)
        self.step("nothing left in the namespaces", self.nothing_left_in_namespaces)
        self.step("outside Ray untouched", self.outside_untouched)
        self.step("end the sshds and the network", self.stop_all)
        self.step("nothing left", self.nothing_left)


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise ProofError(f"no JSON summary in the job's output:\n{text[-2000:]}")


#: A job of our own: produce and read back through Cluster.connect(), report placement.
SMOKE_JOB = r"""
import json, ray
from actors import Cluster
c = Cluster.connect()
c.admin().create_topic("proof-smoke", partitions=3)
values = [b"record-%d" % i for i in range(3000)]
with c.producer() as p:
    p.send_batch("proof-smoke", values).wait(timeout=120)
cons = c.simple_consumer()
got = []
for part in range(3):
    off = 0
    while True:
        recs = cons.fetch("proof-smoke", part, off)
        if not recs:
            break
        got += [r.value for r in recs]
        off = recs[-1].offset + 1
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
placed = {b: nodes.get(c.broker_node(b), c.broker_node(b)) for b in c.broker_ids()}
print(json.dumps({"ok": sorted(got) == sorted(values), "records": len(got),
                  "broker_nodes": placed}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1,
                   help="worker nodes, 127.0.0.2, ... (default 1; 0: the brokers go on the "
                        "head)")
    p.add_argument("--brokers", type=int, default=0,
                   help="brokers (default: one per worker, 3 without workers)")
    p.add_argument("--job", choices=["both", "word_count", "smoke"], default="both")
    p.add_argument("--up-timeout", type=float, default=900)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--worker-exit-timeout", type=float, default=180,
                   help="how long a worker's Ray may take to end after `ray down`")
    p.add_argument("--keep", action="store_true", help="keep the temporary dir")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("ray_up_proof: run as root (apt-get, namespaces, mounts, sshd)", file=sys.stderr)
        return 2
    if not os.path.exists(RAY):
        print(f"ray_up_proof: no {RAY}: bash scripts/install.sh first", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    proof = Proof(args)
    log(f"ray_up_proof: {proof.tmp}, cluster {proof.cluster_name}, head and "
        f"{args.workers} worker(s)")
    ok = False
    try:
        proof.run()
        ok = True
    except (ProofError, subprocess.SubprocessError, KeyboardInterrupt, OSError) as exc:
        log(f"FAILED: {type(exc).__name__}: {exc}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        proof.cleanup(ok)
    total = time.monotonic() - T0
    print("\ntimings:")
    for name, s in proof.timings:
        print(f"  {name:38s} {s:7.1f}s")
    print(f"  {'total':38s} {total:7.1f}s")
    print(f"\nray_up_proof: {'PASSED' if ok else 'FAILED'} in {total / 60:.1f} min")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
