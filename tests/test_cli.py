"""The ``raykafka`` command line, run as a user runs it (a subprocess per command) against a
cluster that ``raykafka start`` leaves running in the background, with a private state dir
(RAYKAFKA_STATE_DIR) and a unique namespace."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from cluster_helpers import unique_namespace, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(state_dir: str) -> dict:
    env = dict(os.environ)
    env["RAYKAFKA_STATE_DIR"] = state_dir
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    return env


def run_cli(state_dir: str, *args, stdin: bytes | None = None, timeout: float = 180):
    """``python -m actors.tools.cli ARGS`` → CompletedProcess (bytes stdout/stderr)."""
    return subprocess.run([sys.executable, "-m", "actors.tools.cli", *args], input=stdin,
                          capture_output=True, timeout=timeout, env=_env(state_dir), cwd=ROOT)


#: Every error line: argparse's form, ``raykafka <command>: error: <message>``.
ERROR_LINE = re.compile(r"raykafka( [a-z-]+)*: error: ")


def assert_one_line_error(proc, code: int, *needles: str):
    err = proc.stderr.decode()
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert "\r" not in err, err        # no progress bar drawn before the error
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert ERROR_LINE.match(lines[0]), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def daemon_port():
    """The --port the module's daemon starts with (and starts again with after a stop)."""
    return _free_port_run(2)


@pytest.fixture(scope="module")
def daemon(daemon_port):
    """A cluster started with ``raykafka start --port P``; stopped (and checked gone) at
    the end."""
    state_dir = tempfile.mkdtemp(prefix="rk-cli-")
    ns = unique_namespace("cli")
    # one offsets partition: the groups tests wait for 2 offsets replicas to start, not 12
    started = run_cli(state_dir, "start", "--namespace", ns, "--brokers", "2",
                      "--port", str(daemon_port), "--config", "num.partitions=2",
                      "--config", "offsets.topic.num.partitions=1", timeout=240)
    assert started.returncode == 0, started.stderr.decode()[-3000:]
    try:
        yield state_dir, ns
    finally:
        state_file = os.path.join(state_dir, f"{ns}.json")
        if os.path.exists(state_file):
            run_cli(state_dir, "stop", "--namespace", ns, timeout=120)
        shutil.rmtree(state_dir, ignore_errors=True)


def cli(daemon, *args, **kw):
    state_dir, ns = daemon
    return run_cli(state_dir, *args, "--namespace", ns, **kw)


def test_start_writes_a_ready_state_file_and_status_reports_the_brokers(daemon):
    """After `raykafka start` the state file says ready; `status` lists both live brokers
    and the controller."""
    state_dir, ns = daemon
    with open(os.path.join(state_dir, f"{ns}.json")) as f:
        state = json.load(f)
    assert state["status"] == "ready" and state["ray_address"].startswith("127.0.0.1:")
    out = cli(daemon, "status")
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode()
    assert "brokers     0, 1 live" in text and "controller  broker" in text


def test_start_config_sets_broker_settings_that_topic_auto_creation_uses(daemon):
    """`start --config num.partitions=2` (the module's daemon) reaches the brokers: kcat
    and `raykafka produce` producing to a topic nobody created get it made with 2
    partitions (`produce` with no input makes none); a bad setting is a one-line typed
    error before anything starts."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    bootstrap = cli(daemon, "status", "--bootstrap").stdout.decode().strip()
    produced = subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", "cli-auto"],
                              input=b"x\ny\n", capture_output=True, timeout=120)
    assert produced.returncode == 0, produced.stderr.decode()
    described = cli(daemon, "topics", "describe", "cli-auto")
    assert described.returncode == 0, described.stderr.decode()
    assert "\tPartitionCount: 2\t" in described.stdout.decode(), described.stdout.decode()
    # raykafka's own producer asks for the creation too, as Kafka's console producer does
    produced = cli(daemon, "produce", "cli-auto-own", stdin=b"a\nb\n")
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = cli(daemon, "consume", "cli-auto-own", "--from-beginning", "--max-messages", "2",
                   "--timeout-ms", "30000")
    assert sorted(consumed.stdout.decode().split()) == ["a", "b"], consumed.stderr.decode()
    assert "\tPartitionCount: 2\t" in cli(daemon, "topics", "describe",
                                          "cli-auto-own").stdout.decode()
    # no input, no topic (the first line sent makes it, as with Kafka's console producer)
    produced = cli(daemon, "produce", "cli-auto-none", stdin=b"")
    assert produced.returncode == 0, produced.stderr.decode()
    assert "produced 0 records" in produced.stderr.decode()
    assert "cli-auto-none" not in cli(daemon, "topics", "list").stdout.decode().split()
    assert_one_line_error(cli(daemon, "start", "--config", "auto.create.topics.enable=maybe"),
                          1, "auto.create.topics.enable must be true or false")


def test_status_and_the_state_file_show_the_zookeeper_connect_string_with_its_chroot(daemon):
    """`status` prints the same zookeeper string as the state file: host:port/chroot, the
    string a KazooClient needs to see the cluster's znodes."""
    state_dir, ns = daemon
    with open(os.path.join(state_dir, f"{ns}.json")) as f:
        state = json.load(f)
    assert state["zk_hosts"].endswith(f"/raykafka-{ns}")
    text = cli(daemon, "status").stdout.decode()
    assert f"zookeeper   {state['zk_hosts']}" in text


def test_a_second_start_in_the_same_namespace_is_refused(daemon):
    """Starting twice in one namespace fails with one line naming the running daemon."""
    assert_one_line_error(cli(daemon, "start"), 1, "already runs")


def test_topics_create_list_describe_alter_delete(daemon):
    """The topics commands do what Kafka's kafka-topics does, with Kafka-style output."""
    out = cli(daemon, "topics", "create", "cli-t", "--partitions", "3",
              "--replication-factor", "1", "--config", "retention.ms=60000")
    assert out.returncode == 0, out.stderr.decode()
    assert "cli-t" in cli(daemon, "topics", "list").stdout.decode().split()
    desc = cli(daemon, "topics", "describe", "cli-t").stdout.decode()
    assert "PartitionCount: 3" in desc and "retention.ms=60000" in desc
    assert desc.count("\tPartition: ") == 3
    out = cli(daemon, "topics", "alter", "cli-t", "--config", "retention.bytes=1000000")
    assert out.returncode == 0, out.stderr.decode()
    assert "retention.bytes=1000000" in cli(daemon, "topics", "describe", "cli-t").stdout.decode()
    out = cli(daemon, "topics", "alter", "cli-t", "--partitions", "5")   # kafka-topics' way
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode() == "Altered topic cli-t: 5 partitions (2 added).\n"
    desc = cli(daemon, "topics", "describe", "cli-t").stdout.decode()
    assert "PartitionCount: 5" in desc and desc.count("\tPartition: ") == 5
    assert_one_line_error(cli(daemon, "topics", "alter", "cli-t", "--partitions", "4"), 1,
                          "InvalidPartitionsError")
    assert cli(daemon, "topics", "delete", "cli-t").returncode == 0
    assert "cli-t" not in cli(daemon, "topics", "list").stdout.decode().split()


def test_produce_from_stdin_and_consume_from_the_beginning(daemon):
    """Lines piped into `produce` (key<TAB>value) come back from `consume`, per key in
    order, with keys printed when asked."""
    assert cli(daemon, "topics", "create", "cli-io", "--partitions", "2",
               "--replication-factor", "1").returncode == 0
    lines = [f"k{i % 7}\tv{i}" for i in range(3000)]
    out = cli(daemon, "produce", "cli-io", "--key-separator", "\t",
              stdin=("\n".join(lines) + "\n").encode())
    assert out.returncode == 0, out.stderr.decode()
    assert "produced 3000 records" in out.stderr.decode()
    out = cli(daemon, "consume", "cli-io", "--from-beginning", "--max-messages", "3000",
              "--print-key")
    assert out.returncode == 0, out.stderr.decode()
    got = out.stdout.decode().splitlines()
    assert sorted(got) == sorted(lines)
    for k in range(7):
        mine = [int(ln.split("\tv")[1]) for ln in got if ln.startswith(f"k{k}\t")]
        assert mine == sorted(mine)
    out = cli(daemon, "consume", "cli-io", "--from-beginning", "--max-messages", "5")
    assert len(out.stdout.decode().splitlines()) == 5


@pytest.fixture(scope="module")
def three_records(daemon):
    """A topic holding three records, for the tests that end a running `consume`."""
    assert cli(daemon, "topics", "create", "cli-three", "--partitions", "1",
               "--replication-factor", "1").returncode == 0
    assert cli(daemon, "produce", "cli-three", stdin=b"a\nb\nc\n").returncode == 0
    return "cli-three"


def _consume_running(daemon, topic: str, *args) -> subprocess.Popen:
    """`consume TOPIC --from-beginning ARGS` with no end, once it printed its first line."""
    state_dir, ns = daemon
    proc = subprocess.Popen([sys.executable, "-m", "actors.tools.cli", "consume", topic,
                             "--from-beginning", *args, "--namespace", ns],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(state_dir), cwd=ROOT)
    assert proc.stdout.readline() == b"a\n"
    return proc


def test_consume_reads_one_partition_from_an_offset_as_kafkas_console_consumer(
        daemon, three_records):
    """`consume --partition P --offset O` (kafka-console-consumer's options) prints that
    partition from offset O; an offset past the log end, a partition the topic lacks and
    --offset without --partition are one-line errors."""
    out = cli(daemon, "consume", three_records, "--partition", "0", "--offset", "1",
              "--max-messages", "2")
    assert out.returncode == 0 and out.stdout == b"b\nc\n", out.stderr.decode()
    out = cli(daemon, "consume", three_records, "--partition", "0", "--offset", "earliest",
              "--max-messages", "1")
    assert out.returncode == 0 and out.stdout == b"a\n", out.stderr.decode()
    assert_one_line_error(cli(daemon, "consume", three_records, "--partition", "0",
                              "--offset", "4"), 1, "OffsetOutOfRangeError")
    assert_one_line_error(cli(daemon, "consume", three_records, "--partition", "1"), 1,
                          "has no partition 1")
    assert_one_line_error(cli(daemon, "consume", three_records, "--offset", "1"), 2,
                          "--offset needs --partition")


def test_consume_ends_when_its_output_pipe_closes_while_idle(daemon, three_records):
    """`consume | head -1`: once the reader of its stdout is gone, a consume with nothing
    more to print exits 0 within moments instead of waiting for a next record forever."""
    proc = _consume_running(daemon, three_records)
    try:
        proc.stdout.close()
        assert proc.wait(timeout=20) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_ends_consume_quietly(daemon, three_records):
    """SIGTERM (`kill`, `timeout`) ends a running `consume` with exit 143 and nothing on
    stderr: no stack dump from Ray's failure signal handler."""
    proc = _consume_running(daemon, three_records)
    try:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        err = proc.stderr.read().decode()
        assert code == 143 and err == "", (code, err)
    finally:
        proc.kill()
        proc.wait()


def test_user_mistakes_are_one_line_errors_without_tracebacks(daemon):
    """Bad topic names, impossible replication, unknown topics, bad configs, bad
    arguments and ACLs on a cluster without an authorizer each print one line and exit
    non-zero (2 for argument errors)."""
    assert_one_line_error(cli(daemon, "topics", "create", "bad name", "--partitions", "1",
                              "--replication-factor", "1"), 1, "InvalidTopicError")
    assert_one_line_error(cli(daemon, "topics", "create", "rf9", "--partitions", "1",
                              "--replication-factor", "9"), 1,
                          "InvalidReplicationFactorError")
    assert_one_line_error(cli(daemon, "consume", "no-such-topic", "--timeout-ms", "100"), 1,
                          "UnknownTopicOrPartitionError")
    assert_one_line_error(cli(daemon, "produce", "bad name", stdin=b"x\n"), 1,
                          "InvalidTopicError")
    assert_one_line_error(cli(daemon, "topics", "create", "cfg", "--partitions", "1",
                              "--replication-factor", "1", "--config", "retention.ms=soon"),
                          1, "InvalidConfigurationError")
    assert_one_line_error(cli(daemon, "topics", "create", "p0", "--partitions", "0",
                              "--replication-factor", "1"), 2, "positive integer")
    assert_one_line_error(cli(daemon, "topics", "alter", "x", "--config", "novalue"), 2,
                          "key=value")
    assert_one_line_error(cli(daemon, "topics", "alter", "x"), 2, "--partitions N or")
    assert_one_line_error(cli(daemon, "consume", "x", "--group", ""), 2, "non-empty")
    assert_one_line_error(cli(daemon, "acls", "add", "User:a", "--operation", "read"), 2,
                          "exactly one resource")
    assert_one_line_error(cli(daemon, "acls", "add", "User:a", "--operation", "read",
                              "--topic", "t"), 1, "SecurityDisabledError")


def test_every_error_line_names_its_command_in_argparse_form(daemon):
    """Errors of parsing, of arguments found wrong later, typed errors and a command's own
    failures all read ``raykafka <command>: error: ...`` (they were "raykafka: error:",
    "raykafka: Name:" and bare lines)."""
    for args, code, start in (
            (("topics", "create", "x", "--partitions", "0", "--replication-factor", "1"), 2,
             "raykafka topics create: error: argument --partitions"),
            (("produce", "t", "--key-separator", ""), 2,
             "raykafka produce: error: --key-separator"),
            (("topics", "describe", "no-such-topic"), 1,
             "raykafka topics describe: error: UnknownTopicOrPartitionError"),
            (("users", "delete", "no-such-user"), 1,
             "raykafka users delete: error: no user 'no-such-user'")):
        proc = cli(daemon, *args)
        assert_one_line_error(proc, code)
        assert proc.stderr.decode().startswith(start), proc.stderr.decode()


def test_namespace_and_verbose_are_accepted_before_a_command_groups_action(daemon):
    """`raykafka topics --namespace NS list` (options before the ACTION, as kafka-topics
    takes them in any order) reaches NS's cluster; two different namespaces, before and
    after the ACTION, are a one-line usage error (exit 2)."""
    state_dir, ns = daemon
    out = run_cli(state_dir, "topics", "--namespace", ns, "create", "cli-outer",
                  "--partitions", "1", "--replication-factor", "1")
    assert out.returncode == 0, out.stderr.decode()
    listed = run_cli(state_dir, "topics", "--namespace", ns, "list")
    assert listed.returncode == 0, listed.stderr.decode()
    assert "cli-outer" in listed.stdout.decode().split()
    assert_one_line_error(run_cli(state_dir, "groups", "--namespace", ns, "list",
                                  "--namespace", "some-other"), 2, "--namespace given twice")


def test_namespace_and_verbose_are_accepted_before_the_command(daemon):
    """`raykafka --namespace NS --verbose status` (global options first, as `ray` and
    `kubectl` take them) reaches NS's cluster; they were "invalid choice" errors naming the
    namespace as a COMMAND; before a command that takes no --namespace, a one-line usage
    error (exit 2)."""
    state_dir, ns = daemon
    out = run_cli(state_dir, "--namespace", ns, "--verbose", "status")
    assert out.returncode == 0, out.stderr.decode()
    assert "brokers     0, 1 live" in out.stdout.decode()
    assert_one_line_error(run_cli(state_dir, "--namespace", ns, "perf", "storage"), 2,
                          "raykafka perf storage: error: this command takes no --namespace")


def test_produce_with_an_empty_key_separator_is_a_usage_error(daemon):
    """`produce --key-separator ''` exits 2 with one line naming the option (it was a
    ValueError from bytes.partition)."""
    assert_one_line_error(cli(daemon, "produce", "cli-io", "--key-separator", "",
                              stdin=b"k v\n"), 2, "--key-separator")


def test_topics_delete_refuses_the_offsets_topic(daemon):
    """`topics delete __consumer_offsets` exits 1 with InvalidTopicError, as Kafka's
    kafka-topics refuses an internal topic: it would drop every group's offsets."""
    assert_one_line_error(cli(daemon, "topics", "delete", "__consumer_offsets"), 1,
                          "InvalidTopicError", "internal")


def test_perf_consume_of_an_unknown_topic_is_one_line_without_a_progress_bar(daemon):
    """`perf consume` of a missing topic prints only the UnknownTopicOrPartitionError line,
    exit 1: no progress bar is drawn before the topic is known."""
    proc = cli(daemon, "perf", "consume", "--topic", "no-such-topic", "--num-records", "10")
    assert_one_line_error(proc, 1, "UnknownTopicOrPartitionError", "no-such-topic")
    assert proc.stderr.decode().startswith("raykafka perf consume: error: "), \
        proc.stderr.decode()


def test_groups_describe_on_a_fresh_cluster_waits_for_the_offsets_topic(daemon):
    """The first `groups describe` of a cluster, which creates the offsets topic, answers
    GroupIdNotFoundError for an unknown group, not CoordinatorNotAvailableError while the
    new topic's partitions get their leaders."""
    topics = cli(daemon, "topics", "list").stdout.decode().split()
    assert "__consumer_offsets" not in topics, "run this before any group is used"
    assert_one_line_error(cli(daemon, "groups", "describe", "first-group"), 1,
                          "GroupIdNotFoundError", "first-group")


def test_consume_with_a_group_commits_and_groups_describe_shows_no_lag(daemon):
    """`consume --group` reads from the group's committed offsets and commits what it
    printed: a second run prints nothing new; `groups list` names the group and
    `groups describe` shows each partition's committed offset at the log end (lag 0), and
    an unknown group in one line."""
    assert cli(daemon, "topics", "create", "cli-grp", "--partitions", "2",
               "--replication-factor", "1").returncode == 0
    out = cli(daemon, "produce", "cli-grp", stdin=("\n".join(f"v{i}" for i in range(20))
                                                   + "\n").encode())
    assert out.returncode == 0, out.stderr.decode()
    out = cli(daemon, "consume", "cli-grp", "--group", "g1", "--from-beginning",
              "--max-messages", "20", timeout=240)
    assert out.returncode == 0, out.stderr.decode()
    assert sorted(out.stdout.decode().split()) == sorted(f"v{i}" for i in range(20))
    out = cli(daemon, "consume", "cli-grp", "--group", "g1", "--from-beginning",
              "--timeout-ms", "3000", timeout=240)
    assert out.returncode == 0 and out.stdout == b"", out.stderr.decode()
    out = cli(daemon, "groups", "list")
    assert "g1" in out.stdout.decode().split(), out.stderr.decode()
    out = cli(daemon, "groups", "describe", "g1")
    assert out.returncode == 0, out.stderr.decode()
    rows = [ln.split() for ln in out.stdout.decode().splitlines()
            if ln.startswith("cli-grp")]
    assert len(rows) == 2 and all(r[4] == "0" and r[5] == "kafka" for r in rows), \
        out.stdout.decode()
    assert sum(int(r[2]) for r in rows) == 20
    assert_one_line_error(cli(daemon, "groups", "describe", "no-such-group"), 1,
                          "GroupIdNotFoundError", "no-such-group")


def test_reassign_moves_a_partition_and_status_counts_partitions_at_risk(daemon, tmp_path):
    """`reassign PLAN.json` (Kafka's plan file) moves a partition to the other broker and
    waits for it; `topics describe` then shows the new replica, and `status` prints the
    partition totals with their under-replicated and offline counts."""
    assert cli(daemon, "topics", "create", "cli-move", "--partitions", "1",
               "--replication-factor", "1").returncode == 0
    desc = cli(daemon, "topics", "describe", "cli-move").stdout.decode()
    old = int(desc.split("Replicas: ")[1].split("\t")[0])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "cli-move", "partition": 0, "replicas": [1 - old]}]}))
    out = cli(daemon, "reassign", str(plan), timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert "cli-move-0  replicas %d" % (1 - old) in out.stdout.decode()
    desc = cli(daemon, "topics", "describe", "cli-move").stdout.decode()
    assert "Replicas: %d\t" % (1 - old) in desc and "UnderReplicated: 0\tOffline: 0" in desc
    status = cli(daemon, "status").stdout.decode()
    assert " under-replicated, 0 offline)" in status
    assert cli(daemon, "elect-leaders", "--topic", "cli-move").returncode == 0


def test_perf_produce_and_consume_print_a_json_last_line(daemon):
    """`perf produce` and `perf consume` end with one JSON line carrying records_per_s,
    MB_per_s, p50_ms and p99_ms; --throughput paces the producer; consume reads what
    produce wrote."""
    out = cli(daemon, "perf", "produce", "--topic", "cli-perf", "--num-records", "200000",
              "--record-size", "100", "--create")
    assert out.returncode == 0, out.stderr.decode()
    produced = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert produced["records"] == 200_000
    for key in ("records_per_s", "MB_per_s", "p50_ms", "p99_ms"):
        assert produced[key] > 0, key
    out = cli(daemon, "perf", "produce", "--topic", "cli-perf", "--num-records", "40000",
              "--record-size", "100", "--chunk-records", "4000", "--throughput", "40000")
    assert out.returncode == 0, out.stderr.decode()
    paced = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert paced["throughput_limit"] == 40000
    assert paced["elapsed_s"] >= 0.85, "10 chunks at 40k records/s take at least 0.9 s"
    out = cli(daemon, "perf", "consume", "--topic", "cli-perf", "--num-records", "200000")
    assert out.returncode == 0, out.stderr.decode()
    consumed = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert consumed["records"] == 200_000 and consumed["records_per_s"] > 0


def test_cluster_connect_from_another_driver_finds_the_cluster(daemon):
    """A separate Python driver attaches with Cluster.connect(namespace) and sees the
    topics the CLI created."""
    assert cli(daemon, "topics", "create", "cli-connect", "--partitions", "1",
               "--replication-factor", "1").returncode == 0
    state_dir, ns = daemon
    code = ("import sys; from actors import Cluster; c = Cluster.connect(sys.argv[1]); "
            "print(sorted(c.admin().list_topics())); print(c.broker_ids())")
    out = subprocess.run([sys.executable, "-c", code, ns], capture_output=True, timeout=120,
                         env=_env(state_dir), cwd=ROOT)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert "'cli-connect'" in out.stdout.decode() and "[0, 1]" in out.stdout.decode()


def test_an_attached_command_exits_without_rays_exit_hook_and_keeps_its_output(daemon):
    """The command's entry point (cli.run) ends a command that attached to the running
    cluster with os._exit after flushing its output: no exit hook runs (Ray's sleeps
    0.5 s, then disconnects), its piped, block-buffered output is whole and its exit code
    kept; the same command finding no cluster exits the usual way, its exit hooks run."""
    state_dir, ns = daemon
    for i in range(3):
        assert cli(daemon, "topics", "create", f"cli-exit-{i}", "--partitions", "1",
                   "--replication-factor", "1").returncode == 0
    code = ("import atexit, sys; from actors.tools import cli; "
            "atexit.register(lambda: print('exit hook ran', file=sys.stderr, flush=True)); "
            "sys.argv = ['raykafka', 'topics', 'list', '--namespace', sys.argv[1]]; cli.run()")
    out = subprocess.run([sys.executable, "-c", code, ns], capture_output=True, timeout=120,
                         env=_env(state_dir), cwd=ROOT)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert {f"cli-exit-{i}" for i in range(3)} <= set(out.stdout.decode().split())
    assert "exit hook ran" not in out.stderr.decode()
    out = subprocess.run([sys.executable, "-c", code, unique_namespace("nobody")],
                         capture_output=True, timeout=120, env=_env(state_dir), cwd=ROOT)
    assert out.returncode == 1 and "ClusterNotFoundError" in out.stderr.decode()
    assert "exit hook ran" in out.stderr.decode()


def _free_port_run(n: int) -> int:
    """A port P with P..P+n-1 all free on 127.0.0.1 (checked by binding them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise AssertionError("no run of free ports")


def test_start_with_a_port_puts_broker_i_on_port_plus_i(daemon, daemon_port):
    """`start --port P` (the module's daemon): broker i's Kafka listener is 127.0.0.1:P+i,
    and `status --bootstrap` prints exactly those; a range past 65535 is a usage error."""
    assert_one_line_error(cli(daemon, "start", "--brokers", "2", "--port", "65535"), 2,
                          "65536")
    out = cli(daemon, "status", "--bootstrap")
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == f"127.0.0.1:{daemon_port},127.0.0.1:{daemon_port + 1}"


def test_stop_returns_only_once_the_listener_ports_are_closed():
    """After a stop, `start --port P` must find P free: the stop waits (bounded) until
    nothing accepts connections on the cluster's listener addresses, which a broker's worker
    process can hold a moment after its Ray head is gone."""
    import threading

    from actors.tools.daemon import _wait_listeners_closed
    lingering = socket.socket()
    lingering.bind(("127.0.0.1", 0))
    lingering.listen()
    port = lingering.getsockname()[1]
    threading.Timer(0.5, lingering.close).start()
    started = time.monotonic()
    assert _wait_listeners_closed(f"127.0.0.1:{port},127.0.0.1:{_free_port_run(1)}", 10.0)
    assert 0.4 < time.monotonic() - started < 5
    still = socket.socket()
    still.bind(("127.0.0.1", 0))
    still.listen()
    try:
        assert not _wait_listeners_closed(f"127.0.0.1:{still.getsockname()[1]}", 0.5)
    finally:
        still.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False


def test_commands_without_a_running_cluster_fail_fast_and_clearly(tmp_path):
    """With no cluster in the namespace, status/topics/stop say so in one line; a command
    that attaches also says how to start one or find one (RAY_ADDRESS)."""
    for args in (("status",), ("topics", "list"), ("stop",)):
        out = run_cli(str(tmp_path), *args, "--namespace", "nothing-here", timeout=60)
        assert_one_line_error(out, 1, "no raykafka cluster runs", "ClusterNotFoundError")
    out = run_cli(str(tmp_path), "topics", "list", "--namespace", "nothing-here", timeout=60)
    assert_one_line_error(out, 1, "raykafka start --namespace nothing-here", "RAY_ADDRESS")


def test_cluster_connect_without_a_cluster_fails_at_once_and_attaches_to_no_ray(tmp_path):
    """Cluster.connect of a namespace with no state file and no RAY_ADDRESS, in a fresh
    Python: ClusterNotFoundError within seconds and Ray never initialised (it attached to
    Ray's "auto": whichever Ray ran on this machine, or a wait of minutes)."""
    code = ("import ray; from actors import Cluster; from actors.errors import "
            "ClusterNotFoundError\n"
            "try:\n    Cluster.connect('nothing-here')\n"
            "except ClusterNotFoundError as exc:\n    print('raised', ray.is_initialized(), exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                         env=_env(str(tmp_path)), cwd=ROOT)
    text = out.stdout.decode()
    assert out.returncode == 0 and text.startswith("raised False "), \
        (text, out.stderr.decode()[-2000:])
    assert "RAY_ADDRESS" in text and "raykafka start" in text, text


def test_version_prints_the_project_version(tmp_path):
    """`raykafka --version` and `-V` print "raykafka <pyproject.toml's version>", exit 0."""
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    for flag in ("--version", "-V"):
        out = run_cli(str(tmp_path), flag, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode() == f"raykafka {version}\n"


def test_simple_demo_runs_end_to_end_and_again_on_the_same_data_dir(tmp_path):
    """`raykafka demo --simple` starts the embedded default, produces and reads back every
    record, prints its summary (and only its own output: no Ray start-up lines, no
    token-authentication notice, no raylet worker-count warnings, nothing on stderr) and
    exits 0; a second run on the same --data-dir replaces the topic the first one left
    (with another partition count: fewer replica actors to start) instead of failing."""
    from output_helpers import internal_lines
    for run, (records, partitions) in enumerate((("20000", "3"), ("2000", "2"))):
        out = run_cli(str(tmp_path / "state"), "demo", "--simple", "--records", records,
                      "--partitions", partitions, "--data-dir", str(tmp_path / "demo"),
                      timeout=300)
        text = out.stdout.decode()
        assert out.returncode == 0, (text[-2000:], out.stderr.decode()[-2000:])
        assert f"records consumed   {int(records):,}" in text
        assert "every record read back once" in text
        assert ("deleting the 'demo-events'" in text) == (run == 1)
        err = out.stderr.decode()
        assert internal_lines(text + "\n" + err) == {}
        assert not err.strip(), err[-3000:]


def test_demo_runs_the_mixed_pipeline_and_counts_every_order_once(tmp_path):
    """`raykafka demo` (the main job) runs Ray producer tasks -> topic -> consumer-group
    actors -> topic -> Spark, and its aggregate matches what was produced: exit 0, every
    order counted once, a JSON summary with ok true as its last line; and it prints none of
    Ray's, Ray Data's or Spark's own log lines (tests/output_helpers.py), nothing on
    stderr."""
    from output_helpers import internal_lines
    out = run_cli(str(tmp_path / "state"), "demo", "--records", "3000", "--partitions", "3",
                  timeout=600)
    text, err = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, (text[-3000:], err[-3000:])
    assert "every order counted once: yes" in text
    assert internal_lines(text + "\n" + err) == {}
    assert not err.strip(), err[-3000:]
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["ok"] and summary["records"] == 3000
    assert sum(t["orders"] for t in summary["tiers"].values()) == 3000
    import pyarrow.parquet as pq
    table = pq.read_table(summary["parquet"])
    assert sum(table.column("orders").to_pylist()) == 3000


def test_a_killed_daemon_leaves_nothing_running_and_a_new_start_serves_its_records(
        daemon, daemon_port):
    """After the daemon (the module's) is SIGKILLed (no `stop`), the next command reports no
    cluster in one line and ends the ZooKeeper and Ray processes the dead daemon recorded;
    `start` on the same data dir and --port then serves the topic and every record
    acknowledged before the kill."""
    from coordination.zk_server import EmbeddedZooKeeper
    state_dir, ns = daemon
    assert cli(daemon, "topics", "create", "cli-durable", "--partitions", "1",
               "--replication-factor", "1").returncode == 0
    assert cli(daemon, "produce", "cli-durable",
               stdin=b"".join(b"r%d\n" % i for i in range(100))).returncode == 0
    with open(os.path.join(state_dir, f"{ns}.json")) as f:
        state = json.load(f)
    zk = EmbeddedZooKeeper.attach(state["zk_data_dir"])
    assert zk is not None and state["ray_pids"]
    os.kill(state["pid"], signal.SIGKILL)
    wait_until(lambda: not _alive(state["pid"]), timeout_s=30, what="daemon gone")
    assert_one_line_error(cli(daemon, "status", timeout=120), 1, "no raykafka cluster runs")
    for pid in [zk.pid, *state["ray_pids"]]:
        wait_until(lambda: not _alive(pid), timeout_s=30, what=f"leftover pid {pid} ended")
    out = cli(daemon, "start", "--brokers", "2", "--port", str(daemon_port), timeout=240)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    out = cli(daemon, "consume", "cli-durable", "--from-beginning", "--max-messages", "100")
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == [f"r{i}" for i in range(100)]


def test_start_on_a_running_ray_attaches_and_stop_leaves_that_ray_running(tmp_path):
    """`start --ray-address` puts the brokers on a Ray somebody else runs (here: this test's
    own): the state records no Ray PIDs to end, the cluster serves, and `stop` ends the
    brokers but leaves that Ray running."""
    from cluster_helpers import ray, start_ray, stop_ray
    start_ray()
    try:
        address = ray.get_runtime_context().gcs_address
        state_dir, ns = str(tmp_path / "state"), unique_namespace("attached")
        out = run_cli(state_dir, "start", "--namespace", ns, "--brokers", "1",
                      "--ray-address", address, "--data-dir", str(tmp_path / "data"),
                      timeout=240)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
        assert "(attached)" in out.stdout.decode()
        with open(os.path.join(state_dir, f"{ns}.json")) as f:
            state = json.load(f)
        assert state["attached_ray"] is True and state["ray_pids"] == []
        assert state["ray_address"] == address
        assert ray.get_actor("broker-0", namespace=ns) is not None, "brokers run on our Ray"
        assert run_cli(state_dir, "topics", "create", "att", "--partitions", "1",
                       "--replication-factor", "1", "--namespace", ns).returncode == 0
        assert run_cli(state_dir, "produce", "att", "--namespace", ns,
                       stdin=b"a\nb\n").returncode == 0
        got = run_cli(state_dir, "consume", "att", "--from-beginning", "--max-messages", "2",
                      "--namespace", ns)
        assert got.returncode == 0 and got.stdout.decode().split() == ["a", "b"]
        out = run_cli(state_dir, "stop", "--namespace", ns, timeout=120)
        assert out.returncode == 0, out.stderr.decode()
        wait_until(lambda: not _alive(state["pid"]), timeout_s=30, what="daemon gone")
        assert ray.get(ray.put(41)) == 41, "the Ray we attached to still runs"
        with pytest.raises(ValueError):
            ray.get_actor("broker-0", namespace=ns)
    finally:
        stop_ray()


# -- last: it ends the module's daemon (every test that uses the daemon comes before it) ----
def test_stop_ends_the_daemon_its_zookeeper_and_its_ray(daemon):
    """`stop` ends the daemon, its ZooKeeper and its Ray and removes the state file; a
    command after it is a clear one-line error. (That a new `start` on the same data dir
    serves the same records: the killed-daemon test above.)"""
    from coordination.zk_server import EmbeddedZooKeeper
    state_dir, ns = daemon
    with open(os.path.join(state_dir, f"{ns}.json")) as f:
        state = json.load(f)
    zk = EmbeddedZooKeeper.attach(state["zk_data_dir"])
    assert zk is not None and state["ray_pids"]
    out = cli(daemon, "stop")
    assert out.returncode == 0, out.stderr.decode()
    assert not os.path.exists(os.path.join(state_dir, f"{ns}.json"))
    for pid in [state["pid"], zk.pid, *state["ray_pids"]]:
        wait_until(lambda: not _alive(pid), timeout_s=30, what=f"pid {pid} gone")
    assert_one_line_error(cli(daemon, "status"), 1, "ClusterNotFoundError")
