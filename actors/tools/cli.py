"""The ``raykafka`` command line (the contract is API.md's "Command line"; docs/cli.md).

Cluster commands (``start``, ``stop``, ``status``, ``topics``, ``produce``, ``consume``,
``elect-leaders``, ``perf``) find the cluster of ``--namespace`` (default "raykafka") through
the state file that ``raykafka start``'s daemon writes (see actors/daemon.py).

Errors a user can make print one clear line on stderr and exit non-zero, without a traceback,
all in argparse's form ``raykafka <command>: error: <message>`` (``_error``; a typed error's
message starts with its name, ``ClusterNotFoundError: ...``): argument errors exit 2,
everything else 1 (130 on Ctrl-C). An unexpected internal error is also one line, unless
``RAYKAFKA_DEBUG=1`` asks for the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from storage.errors import KafkaError

EXIT_USAGE = 2
EXIT_ERROR = 1
DEFAULT_NAMESPACE = "raykafka"
PRODUCE_CHUNK_RECORDS = 10_000
CONSUME_FETCH_BYTES = 1 << 20


VERBOSE_HELP = ("also show what Ray and Spark log of their own (the same as "
                "RAYKAFKA_VERBOSE=1)")


class UsageError(Exception):
    """A mistake in the arguments found after parsing (exit 2, one line)."""


class CommandError(Exception):
    """A command that could not do what it was asked, not a Kafka error (exit 1, one line):
    a user or ACL to remove that is not there, a demo whose checks failed."""


def _error(prog: str, message: str) -> None:
    """The one form of every error line: argparse's ``<prog>: error: <message>``."""
    _err(f"{prog}: error: {message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump: the contract for user mistakes
        _error(self.prog, f"{message} (see {self.prog} --help)")
        self.exit(EXIT_USAGE)


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def version() -> str:
    """raykafka's version: the ``pyproject.toml`` of the source tree this code runs from (a
    checkout on PYTHONPATH), else the installed package's metadata."""
    path = os.path.join(_repo_root(), "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            project = tomllib.load(f).get("project", {})
        if project.get("name") == "raykafka" and project.get("version"):
            return str(project["version"])
    except (OSError, ValueError):
        pass
    from importlib import metadata
    try:
        return metadata.version("raykafka")
    except metadata.PackageNotFoundError:
        return "unknown"


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- attaching to the running cluster --------------------------------------------------------
#: Set by ``connect``: this process attached to a Ray it did not start, so ``run`` may end
#: it without Ray's exit hook.
_attached = False


def connect(namespace: str):
    """``Cluster.connect`` to the cluster ``raykafka start`` left running in ``namespace``.

    A stale state file (its daemon gone) is removed first; then the attach is
    ``Cluster.connect``'s (``raycompat.init_attach``): the Ray the state file names, else
    RAY_ADDRESS (a cluster started inside an existing Ray cluster), else a fast, clear
    ClusterNotFoundError; quietly (no Ray INFO lines on the terminal).
    """
    from .. import raycompat
    from . import daemon
    from ..cluster import Cluster
    if not raycompat.ray.is_initialized():
        daemon.live_state(namespace)
    raycompat.init_attach(namespace)
    # stdout is this command's output (records, tables, JSON): Ray's own messages go to
    # stderr (docs/ray-notes.md)
    raycompat.ray_messages_to_stderr()
    _exit_on_sigterm()
    cluster = Cluster.connect(namespace)
    global _attached
    _attached = True
    return cluster


def _exit_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``) ends the command quietly with exit 143, its
    ``finally`` blocks run (a group member commits and leaves), instead of the failure
    handler Ray installed when attaching, which prints a C++ stack dump to stderr."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def _output_closed(out) -> bool:
    """True when ``out`` is a pipe whose reader has gone (``consume ... | head`` after
    ``head`` exited): an idle consume notices it now, not at its next record."""
    import select
    try:
        poller = select.poll()
        poller.register(out.fileno(), 0)    # 0: only POLLERR / POLLHUP are reported
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):           # not a real file descriptor
        return False


def _start_embedded(brokers: int = 3):
    """An in-process cluster (``--embedded``), quiet, with its own temporary data dir."""
    from .. import raycompat
    from ..cluster import Cluster
    raycompat.init_local("raykafka-embedded")
    raycompat.ray_messages_to_stderr()
    _exit_on_sigterm()
    ns = f"embedded-{os.getpid()}"
    return Cluster.start(num_brokers=brokers, namespace=ns)


# -- start / stop / status -----------------------------------------------------------------
def cmd_start(args) -> int:
    from . import daemon
    interactive = sys.stderr.isatty()

    def progress(elapsed_s, status):
        line = f"starting cluster {args.namespace!r}: {status} ({elapsed_s:.0f}s)"
        if interactive:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        elif int(elapsed_s * 2) % 10 == 0:  # a line every ~5 s when not on a terminal
            _err(line)

    if args.port and args.port + args.brokers - 1 > 65535:
        raise UsageError(f"--port {args.port} with {args.brokers} brokers needs ports up to "
                         f"{args.port + args.brokers - 1} (the last is 65535)")
    if args.wait_workers and not args.ray_address:
        raise UsageError("--wait-workers waits for the worker nodes of the Ray given with "
                         "--ray-address")
    from ..cluster import validate_config
    config = _parse_config(args.config)
    validate_config(config)          # a bad setting: its one-line error before anything runs
    t0 = time.monotonic()
    try:
        if args.wait_workers and daemon.live_state(args.namespace) is None:
            _wait_for_workers(args, progress)
        state = daemon.start_daemon(namespace=args.namespace, brokers=args.brokers,
                                    data_dir=args.data_dir, zk=args.zk,
                                    ray_address=args.ray_address,
                                    timeout_s=args.timeout, progress=progress,
                                    port=args.port, secure=args.secure, config=config)
    finally:
        if interactive:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    print(f"raykafka cluster {args.namespace!r} started in {time.monotonic() - t0:.1f}s")
    print(f"  brokers     {', '.join(map(str, state.get('broker_ids', [])))}")
    print(f"  zookeeper   {state['zk_hosts']}"
          f"{' (embedded)' if state.get('embedded_zk') else ''}")
    print(f"  ray         {state['ray_address']}"
          f"{' (attached)' if state.get('attached_ray') else ' (private, local)'}")
    print(f"  data dir    {state['data_dir']}")
    print(f"  daemon      pid {state['pid']}, log {state['log_file']}")
    from .. import raycompat
    print(f"  state file  {raycompat.state_path(args.namespace)}")
    if state.get("security"):
        for line in secure_client_lines(state["security"], state.get("bootstrap_servers")):
            print(line)
    return 0


def secure_client_lines(security: dict, bootstrap: str | None) -> list[str]:
    """What ``start --secure`` prints: the clients' settings (the password by its file,
    never its text) and a command to try them."""
    return [
        f"  security    {security['protocol']} with {security['mechanism']}, ACLs, "
        f"ZooKeeper ACLs; files in {security['directory']}",
        "client settings (librdkafka / confluent-kafka; Python: "
        "Cluster.connect(ns).client_config()):",
        f"  bootstrap.servers={bootstrap or '(raykafka status --bootstrap)'}",
        f"  security.protocol={security['protocol']}",
        f"  sasl.mechanism={security['mechanism']}",
        f"  sasl.username={security['user']}",
        f"  sasl.password=<the contents of {security['password_file']}>",
        f"  ssl.ca.location={security['ca_file']}",
        f"try: kcat -F {security['properties_file']} -L",
    ]


def _wait_for_workers(args, progress) -> None:
    """``start --wait-workers N``: wait (up to ``--timeout``) until the Ray at
    ``--ray-address`` has N alive worker nodes. A ``ray up`` cluster's workers join after its
    head, and the brokers are placed on the worker nodes there are when the cluster starts
    (actors/server/nodes.py): started too early they would all go to the first ones."""
    from .. import raycompat
    from ..errors import KafkaTimeoutError
    from ..server.nodes import HEAD_RESOURCE
    ray = raycompat.ray
    raycompat.attach(args.ray_address, args.namespace)
    try:
        started = time.monotonic()
        while True:
            workers = sum(1 for n in ray.nodes() if n.get("Alive")
                          and HEAD_RESOURCE not in n.get("Resources", {}))
            if workers >= args.wait_workers:
                return
            elapsed = time.monotonic() - started
            if elapsed > args.timeout:
                raise KafkaTimeoutError(
                    f"{workers} of {args.wait_workers} worker nodes joined the Ray at "
                    f"{args.ray_address} within {args.timeout:.0f}s")
            progress(elapsed, f"{workers} of {args.wait_workers} worker nodes")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def cmd_stop(args) -> int:
    from . import daemon
    interactive = sys.stderr.isatty()

    def progress(elapsed_s):
        if interactive:
            print(f"\rstopping cluster {args.namespace!r} ({elapsed_s:.0f}s)", end="",
                  file=sys.stderr, flush=True)

    t0 = time.monotonic()
    try:
        done = daemon.stop_daemon(args.namespace, timeout_s=args.timeout, progress=progress)
    finally:
        if interactive:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    how = "killed (SIGKILL after the deadline)" if done["killed"] else "stopped"
    print(f"raykafka cluster {args.namespace!r} {how} in {time.monotonic() - t0:.1f}s "
          f"(daemon pid {done['pid']})")
    if done["leftovers"]:
        print(f"  also ended: {', '.join(done['leftovers'])}")
    return 0


def cmd_status(args) -> int:
    from . import daemon
    from ..cluster import bootstrap_servers_of
    state = daemon.require_ready(args.namespace)
    cluster = connect(args.namespace)
    snap = cluster.metadata.refresh()
    if args.bootstrap:
        print(bootstrap_servers_of(snap))
        return 0
    live = sorted(int(b) for b in snap.get("brokers", {}))
    expected = cluster.broker_ids()
    topics = snap.get("topics", {})
    print(f"cluster     {args.namespace!r} (daemon pid {state['pid']}, up "
          f"{_duration(time.time() - state.get('started_at', time.time()))})")
    print(f"brokers     {', '.join(map(str, live)) or 'none'} live"
          + (f"; down: {', '.join(map(str, sorted(set(expected) - set(live))))}"
             if set(expected) - set(live) else ""))
    print(f"controller  broker {snap.get('controller_id', -1)} "
          f"(epoch {snap.get('controller_epoch', 0)})")
    print(f"kafka       {bootstrap_servers_of(snap) or 'none'}  (bootstrap.servers)")
    print(f"zookeeper   {cluster.zk_hosts}")
    files = cluster.security_files
    if files:
        print(f"security    secure: {files['protocol']} with {files['mechanism']}, ACLs, "
              f"ZooKeeper ACLs; admin user {files['user']!r}, password in "
              f"{files['password_file']}, CA {files['ca_file']}, kcat -F "
              f"{files['properties_file']}")
    else:
        print("security    none (PLAINTEXT; `raykafka start --secure` for SASL_SSL)")
    print(f"ray         {state['ray_address']}")
    if state.get("dashboard_url"):
        # Ray's CLI sends the token only when told to (ray 2.60)
        auth = "RAY_AUTH_MODE=token " if state.get("ray_auth_mode") == "token" else ""
        print(f"jobs        {auth}ray job submit --address {state['dashboard_url']} -- python ...")
    print(f"data dir    {cluster.data_dir}")
    for line in status_topic_lines(topics):
        print(line)
    return 0


STATUS_AT_RISK_LINES = 20


def status_topic_lines(topics: dict) -> list[str]:
    """The partition part of ``status``: totals with the under-replicated and offline
    counts, one line per topic, then the partitions at risk (at most
    STATUS_AT_RISK_LINES). Pure: from a metadata snapshot's ``topics``."""
    from ..client.admin import health_summary, partition_health
    total = health_summary(topics)
    lines = [f"topics      {len(topics)}",
             f"partitions  {total['partitions']} ({total['under_replicated']} "
             f"under-replicated, {total['offline']} offline)"]
    at_risk = []
    for name in sorted(topics):
        parts = topics[name]
        rf = max((len(s["replicas"]) for s in parts.values()), default=0)
        health = health_summary({name: parts})
        lines.append(f"  {name}  partitions {len(parts)}  replication-factor {rf}"
                     + (f"  under-replicated {health['under_replicated']}"
                        if health["under_replicated"] else "")
                     + (f"  OFFLINE {health['offline']}" if health["offline"] else ""))
        for p in sorted(parts):
            marker = _marker(partition_health(parts[p]))
            if marker:
                st = parts[p]
                at_risk.append(f"  {marker:<16}  {name}-{p}  leader {st['leader']}  "
                               f"replicas {','.join(map(str, st['replicas']))}  "
                               f"isr {','.join(map(str, st['isr'])) or '-'}")
    if at_risk:
        lines.append("at risk")
        lines += at_risk[:STATUS_AT_RISK_LINES]
        if len(at_risk) > STATUS_AT_RISK_LINES:
            lines.append(f"  ... and {len(at_risk) - STATUS_AT_RISK_LINES} more "
                         f"(raykafka topics describe --under-replicated-partitions)")
    return lines


def _marker(health: dict) -> str:
    """"OFFLINE", "UNDER-REPLICATED" or "" for ``partition_health``'s answer."""
    if health["offline"]:
        return "OFFLINE"
    return "UNDER-REPLICATED" if health["under_replicated"] else ""


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


# -- topics ----------------------------------------------------------------------------------
def _parse_config(items) -> dict:
    out = {}
    for item in items or []:
        for piece in item.split(","):
            key, sep, value = piece.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"--config takes key=value pairs (e.g. retention.ms=60000), "
                                 f"got {piece!r}")
            out[key.strip()] = value.strip()
    return out


def _check_topic_name(name: str) -> None:
    from ..protocol import validate_topic_name
    validate_topic_name(name)


def cmd_topics_create(args) -> int:
    config = _parse_config(args.config)
    _check_topic_name(args.name)
    admin = connect(args.namespace).admin()
    admin.create_topic(args.name, partitions=args.partitions,
                       replication_factor=args.replication_factor, config=config or None)
    print(f"Created topic {args.name} (partitions {args.partitions}, replication-factor "
          f"{args.replication_factor}{', config ' + _fmt_config(config) if config else ''}).")
    return 0


def cmd_topics_list(args) -> int:
    for name in connect(args.namespace).admin().list_topics():
        print(name)
    return 0


def _fmt_config(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def cmd_topics_describe(args) -> int:
    if args.name is not None:
        _check_topic_name(args.name)
    admin = connect(args.namespace).admin()
    names = [args.name] if args.name else admin.list_topics()
    only = {"under_replicated"} if args.under_replicated_partitions else set()
    if args.unavailable_partitions:
        only.add("offline")
    silent: set[int] = set()
    described = admin.describe_topics(names)       # every leader asked at once
    for name in names:
        rows = described[name]
        try:
            config = admin.topic_config(name)
        except KafkaError:
            config = {}
        for line in describe_lines(name, rows, config, only=only):
            print(line)
        silent.update(r["leader"] for r in rows
                      if r["leader"] >= 0 and r["high_watermark"] is None)
    if silent:
        _unanswered_note(silent, admin.live_timeout_s, "their offsets show as ?")
    return 0


NOTE_PARTITIONS = 10        # partitions a note names at most


def _unanswered_note(broker_ids, timeout_s: float, what: str) -> None:
    """The one stderr line that names the brokers whose figures are missing, and why."""
    ids = sorted(broker_ids)
    _err(f"note: no answer within {timeout_s:g}s from broker{'s' if len(ids) > 1 else ''} "
         f"{', '.join(map(str, ids))} (paused, dead or overloaded): {what}")


def describe_lines(name: str, rows: list[dict], config: dict, *, only=()) -> list[str]:
    """``topics describe`` of one topic, as Kafka's kafka-topics prints it, plus the
    under-replicated and offline counts in the header and a marker on each such partition.
    ``only`` ({"under_replicated", "offline"}) keeps just those partitions (and no header),
    as ``--under-replicated-partitions`` / ``--unavailable-partitions``. Pure."""
    lines = []
    if not only:
        rf = max((len(r["replicas"]) for r in rows), default=0)
        under = sum(1 for r in rows if r["under_replicated"])
        offline = sum(1 for r in rows if r["offline"])
        lines.append(f"Topic: {name}\tPartitionCount: {len(rows)}\tReplicationFactor: {rf}\t"
                     f"Configs: {_fmt_config(config)}\tUnderReplicated: {under}\t"
                     f"Offline: {offline}")
    for r in rows:
        if only and not any(r[k] for k in only):
            continue
        marker = _marker(r)
        lines.append(f"\tTopic: {name}\tPartition: {r['partition']}\tLeader: "
                     f"{r['leader'] if r['leader'] >= 0 else 'none'}\t"
                     f"Replicas: {','.join(map(str, r['replicas']))}\t"
                     f"Isr: {','.join(map(str, r['isr']))}\tLeaderEpoch: {r['leader_epoch']}\t"
                     f"LogStartOffset: {_off(r['log_start_offset'])}\t"
                     f"HighWatermark: {_off(r['high_watermark'])}"
                     + (f"\t{marker}" if marker else ""))
    return lines


def _off(value) -> str:
    return "?" if value is None else str(value)


def cmd_topics_delete(args) -> int:
    _check_topic_name(args.name)
    from ..errors import InvalidTopicError
    from ..protocol import OFFSETS_TOPIC
    if args.name == OFFSETS_TOPIC:      # as Kafka's kafka-topics --delete refuses it
        raise InvalidTopicError(f"topic {OFFSETS_TOPIC!r} is internal (every group's "
                                f"committed offsets) and cannot be deleted")
    connect(args.namespace).admin().delete_topic(args.name)
    print(f"Deleted topic {args.name}.")
    return 0


def cmd_topics_alter(args) -> int:
    config = _parse_config(args.config)
    if not config and args.partitions is None:
        raise UsageError("topics alter needs --partitions N or at least one --config key=value")
    _check_topic_name(args.name)
    admin = connect(args.namespace).admin()
    if args.partitions is not None:     # kafka-topics --alter --partitions: grow only
        added = admin.create_partitions(args.name, args.partitions)
        print(f"Altered topic {args.name}: {args.partitions} partitions "
              f"({len(added)} added).")
    if config:
        merged = admin.alter_topic_config(args.name, config)
        print(f"Altered topic {args.name}: {_fmt_config(merged)}")
    return 0


# -- produce / consume ------------------------------------------------------------------------
def _stdin_chunks(stream, limit: int):
    """Lists of lines (without the newline) from ``stream``: as many as are already there,
    up to ``limit``, so piped input travels in large batches and typed lines go at once."""
    import select
    fd = stream.fileno()
    chunk = []
    while True:
        line = stream.readline()
        if not line:
            break
        chunk.append(line[:-1] if line.endswith(b"\n") else line)
        if len(chunk) >= limit:
            yield chunk
            chunk = []
            continue
        # Typed lines go at once; piped input (always ready) fills whole chunks. Lines
        # already in the reader's buffer but not in the pipe only cut a chunk short.
        try:
            ready, _, _ = select.select([fd], [], [], 0)
        except (OSError, ValueError):
            ready = [fd]
        if not ready:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_produce(args) -> int:
    _check_topic_name(args.topic)
    if args.key_separator == "":
        raise UsageError("--key-separator needs at least one character")
    cluster = connect(args.namespace)
    sep = args.key_separator.encode() if args.key_separator is not None else None
    total = 0
    line_no = 0
    _check_topic_to_produce(cluster, args.topic)
    with cluster.producer(acks=_acks(args.acks), linger_ms=args.linger_ms) as producer:
        futures = []
        for lines in _stdin_chunks(sys.stdin.buffer, PRODUCE_CHUNK_RECORDS):
            keys = None
            if sep is not None:
                keys, values = [], []
                for line in lines:
                    line_no += 1
                    key, found, value = line.partition(sep)
                    if not found:
                        raise UsageError(f"line {line_no} has no key separator "
                                         f"{args.key_separator!r}: {line[:60]!r}")
                    keys.append(key)
                    values.append(value)
            else:
                values = lines
                line_no += len(lines)
            futures.append(producer.send_batch(args.topic, values, keys=keys))
            total += len(values)
            while futures and futures[0].is_done:
                futures.pop(0).wait()
        producer.flush(timeout=120)
        for f in futures:
            f.wait(timeout=120)
    _err(f"produced {total} records to {args.topic}")
    return 0


def _check_topic_to_produce(cluster, topic: str) -> None:
    """Before stdin is read: a topic the brokers do not know is made by the first line
    sent (the producer asks for it, as Kafka's console producer does: no input, no
    topic), unless the cluster's auto.create.topics.enable is false; then the error comes
    now, not after the input is typed."""
    from ..errors import UnknownTopicOrPartitionError
    try:
        cluster.metadata.partitions_for(topic)
    except UnknownTopicOrPartitionError:
        # Cluster.start keeps the setting as "true" or "false" (actors/cluster.py)
        if cluster.config.get("auto.create.topics.enable") == "false":
            raise UnknownTopicOrPartitionError(
                f"unknown topic {topic!r}, and the cluster does not create topics on first "
                f"use (auto.create.topics.enable=false): `raykafka topics create` it "
                f"first") from None


def _acks(text: str):
    return "all" if text in ("all", "-1") else int(text)


def _write_record(out, r, args, key_sep: bytes) -> None:
    if args.print_key:
        out.write((r.key if r.key is not None else b"null") + key_sep)
    out.write((r.value if r.value is not None else b"null") + b"\n")


def _consume_group(args) -> int:
    """consume --group: a member of the group (its share of the partitions, from the
    group's committed offsets), committing what it printed."""
    if not args.group:
        raise UsageError("--group needs a non-empty name")
    cluster = connect(args.namespace)
    cluster.metadata.partitions_for(args.topic)          # an unknown topic fails here
    consumer = cluster.consumer(group_id=args.group, enable_auto_commit=True,
                                auto_offset_reset="earliest" if args.from_beginning
                                else "latest")
    consumer.subscribe([args.topic])
    out = sys.stdout.buffer
    key_sep = (args.key_separator or "\t").encode()
    count, limit = 0, args.max_messages
    idle_since = time.monotonic()
    try:
        while limit is None or count < limit:
            got = consumer.poll(timeout_ms=500,
                                max_records=None if limit is None else limit - count)
            for _, records in sorted(got.items()):
                for r in records:
                    _write_record(out, r, args, key_sep)
                    count += 1
            out.flush()
            if got:
                idle_since = time.monotonic()
            elif _output_closed(out) or (args.timeout_ms is not None and (
                    time.monotonic() - idle_since) * 1000 >= args.timeout_ms):
                break
        consumer.commit()
    finally:
        consumer.close()
    _err(f"Processed a total of {count} messages")
    return 0


def _start_offset(value: str):
    """--offset: 'earliest', 'latest' or a non-negative offset (kafka-console-consumer's)."""
    if value in ("earliest", "latest"):
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'earliest', 'latest' or a non-negative "
                                         f"offset, got {value!r}")
    return int(value)


def _consume_positions(consumer, args, partitions) -> dict:
    """Where each partition's read starts: --offset for --partition's, else the log start
    (--from-beginning) or end. An offset outside the partition's log is a typed error."""
    from ..errors import OffsetOutOfRangeError
    offset = args.offset if args.offset is not None else (
        "earliest" if args.from_beginning else "latest")
    if not isinstance(offset, int):
        when = -2 if offset == "earliest" else -1
        return {p: consumer.offsets_before(args.topic, p, when)[0] for p in partitions}
    (p,) = partitions
    start = consumer.offsets_before(args.topic, p, -2)[0]
    end = consumer.offsets_before(args.topic, p, -1)[0]
    if not start <= offset <= end:
        raise OffsetOutOfRangeError(f"offset {offset} is outside {args.topic}-{p}, which "
                                    f"holds offsets {start} to {end - 1} (next: {end})")
    return {p: offset}


def cmd_consume(args) -> int:
    _check_topic_name(args.topic)
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition (the partition it is an offset of)")
    if args.offset is not None and args.from_beginning:
        raise UsageError("--offset and --from-beginning cannot be used together")
    if args.group is not None:
        if args.partition is not None:
            raise UsageError("--partition reads one partition without a group; "
                             "--group takes the group's share of every partition")
        return _consume_group(args)
    cluster = connect(args.namespace)
    partitions = cluster.metadata.partitions_for(args.topic)
    if args.partition is not None:
        if args.partition not in partitions:
            from ..errors import UnknownTopicOrPartitionError
            raise UnknownTopicOrPartitionError(
                f"topic {args.topic!r} has no partition {args.partition} (it has "
                f"{len(partitions)}: 0 to {len(partitions) - 1})")
        partitions = [args.partition]
    consumer = cluster.simple_consumer()
    positions = _consume_positions(consumer, args, partitions)
    out = sys.stdout.buffer
    key_sep = (args.key_separator or "\t").encode()
    count = 0
    limit = args.max_messages
    idle_since = time.monotonic()
    while limit is None or count < limit:
        got = consumer.multifetch([(args.topic, p, positions[p], CONSUME_FETCH_BYTES)
                                   for p in partitions])
        any_new = False
        for (_, p), records in sorted(got.items()):
            for r in records:
                if limit is not None and count >= limit:
                    break
                _write_record(out, r, args, key_sep)
                count += 1
                positions[p] = r.offset + 1
                any_new = True
        out.flush()
        if any_new:
            idle_since = time.monotonic()
        else:
            if _output_closed(out) or (args.timeout_ms is not None and (
                    time.monotonic() - idle_since) * 1000 >= args.timeout_ms):
                break
            time.sleep(0.1)
    _err(f"Processed a total of {count} messages")
    return 0


# -- leadership ------------------------------------------------------------------------------
def cmd_elect_leaders(args) -> int:
    if args.topic is not None:
        _check_topic_name(args.topic)
    admin = connect(args.namespace).admin()
    done = admin.elect_preferred_leaders(args.topic)
    print(f"Preferred leaders elected for {args.topic or 'all topics'}.")
    skipped = [f"{t}-{p}" for t, p in done["skipped"]]
    if skipped:
        more = len(skipped) - NOTE_PARTITIONS
        _unanswered_note(done["unanswered_brokers"], admin.live_timeout_s,
                         f"left as they are: {', '.join(skipped[:NOTE_PARTITIONS])}"
                         f"{f' and {more} more' if more > 0 else ''}")
    return 0


def cmd_reassign(args) -> int:
    moves = read_reassignment_plan(args.plan)
    t0 = time.monotonic()
    connect(args.namespace).admin().reassign_partitions(moves, timeout_s=args.timeout)
    print(f"Reassignment of {len(moves)} partition{'s' if len(moves) != 1 else ''} done in "
          f"{time.monotonic() - t0:.1f}s:")
    for (topic, partition), replicas in sorted(moves.items()):
        print(f"  {topic}-{partition}  replicas {','.join(map(str, replicas))}")
    return 0


def read_reassignment_plan(path: str) -> dict:
    """The plan in a kafka-reassign-partitions JSON file, checked before the cluster is
    contacted: an unreadable file or invalid JSON is a UsageError; a wrong shape, a bad
    topic name or a duplicate the typed error of ``admin.parse_reassignment``."""
    from ..client.admin import parse_reassignment
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        plan = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not JSON ({exc}); a plan is {{\"version\": 1, "
                         f"\"partitions\": [{{\"topic\", \"partition\", \"replicas\"}}]}}") \
            from None
    if not isinstance(plan, dict) or "partitions" not in plan:
        raise UsageError(f"{path} is not a reassignment plan: expected {{\"version\": 1, "
                         f"\"partitions\": [{{\"topic\", \"partition\", \"replicas\"}}]}}")
    return parse_reassignment(plan)


def cmd_groups(args) -> int:
    admin = connect(args.namespace).admin()
    if args.groups_command == "list":
        listing = admin.group_listing()
        for name in listing["groups"]:
            print(name)
        if listing["unanswered_brokers"]:
            _unanswered_note(listing["unanswered_brokers"], admin.live_timeout_s,
                             "the groups they coordinate are not listed")
        return 0
    desc = admin.describe_group(args.group)
    owner = {tp: mid for mid, tps in desc["members"].items() for tp in tps}
    print(f"GROUP {desc['group']}  state {desc['state']}  generation {desc['generation']}  "
          f"assignor {desc['protocol'] or '-'}  members {len(desc['members'])}")
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "STORED-IN",
             "CONSUMER-ID")]
    for tp in sorted(set(desc["offsets"]) | set(owner)):
        o = desc["offsets"].get(tp, {})
        stores = [name for name in ("kafka", "zookeeper") if o.get(name) is not None]
        rows.append((tp[0], str(tp[1]), _dash(o.get("committed")),
                     _off(o["log_end"]) if o else "-", _off(o["lag"]) if o else "-",
                     "+".join(stores) or "-", owner.get(tp, "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if desc.get("zookeeper_error"):
        _err(f"note: offsets stored in ZooKeeper not shown: {desc['zookeeper_error']}")
    if desc.get("unanswered_brokers"):
        _unanswered_note(desc["unanswered_brokers"], admin.live_timeout_s,
                         "their partitions' LOG-END-OFFSET and LAG show as ?")
    return 0


def _dash(value) -> str:
    return "-" if value is None else str(value)


# -- users (SCRAM credentials) ----------------------------------------------------------------
def _read_password(name: str) -> str:
    """The password from stdin when it is not a terminal (its first line), else asked for
    twice without echo: never a command-line argument (``ps`` would show it)."""
    if not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        import getpass
        password = getpass.getpass(f"Password for {name}: ")
        if getpass.getpass("Again: ") != password:
            raise UsageError("the two passwords differ")
    if not password:
        raise UsageError("the password is empty")
    return password


def cmd_users(args) -> int:
    admin = connect(args.namespace).admin()
    if args.users_command == "add":
        password = _read_password(args.name)
        mechanisms = args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        admin.create_user(args.name, password, mechanisms=mechanisms,
                          iterations=args.iterations)
        print(f"Set the {', '.join(mechanisms)} credentials of user {args.name}.")
    elif args.users_command == "delete":
        if not admin.delete_user(args.name):
            raise CommandError(f"no user {args.name!r}")
        print(f"Deleted user {args.name}.")
    else:
        for name, mechanisms in sorted(admin.user_mechanisms().items()):
            print(f"{name}\t{','.join(mechanisms)}")
    return 0


# -- perf ------------------------------------------------------------------------------------
def _perf_cluster(args):
    if args.embedded:
        return _start_embedded(args.brokers)
    return connect(args.namespace)


def _acl_args(args) -> dict:
    """The ACL binding the add/remove arguments name (create_acl's keyword arguments)."""
    kinds = [(k, v) for k, v in (("topic", args.topic), ("group", args.group),
                                 ("transactional_id", args.transactional_id),
                                 ("cluster", "kafka-cluster" if args.cluster else None))
             if v is not None]
    if len(kinds) != 1:
        raise UsageError("name exactly one resource: --topic T, --group G, "
                         "--transactional-id X or --cluster")
    (resource_type, name), = kinds
    return {"principal": args.principal, "resource_type": resource_type,
            "resource_name": name, "operation": args.operation,
            "permission": "deny" if args.deny else "allow",
            "pattern_type": "prefixed" if args.prefixed else "literal", "host": args.host}


def _fmt_acl(a: dict) -> str:
    return (f"{a['permission']:<5}  {a['principal']:<20}  {a['operation']:<16}  "
            f"{a['resource_type']}:{a['resource_name']}"
            f"{' (prefixed)' if a['pattern_type'] == 'prefixed' else ''}"
            f"{'' if a['host'] == '*' else '  from ' + a['host']}")


def cmd_acls(args) -> int:
    binding = _acl_args(args) if args.acls_command != "list" else None
    admin = connect(args.namespace).admin()
    if binding is None:
        rows = [a for a in admin.list_acls()
                if args.principal in (None, a["principal"])
                and (args.topic is None or (a["resource_type"], a["resource_name"])
                     == ("topic", args.topic))]
        for a in rows:
            print(_fmt_acl(a))
        return 0
    if args.acls_command == "add":
        admin.create_acl(**binding)
        print(f"Added: {_fmt_acl(binding)}")
        return 0
    if admin.delete_acl(**binding):
        print(f"Removed: {_fmt_acl(binding)}")
        return 0
    raise CommandError(f"no such ACL: {_fmt_acl(binding)}")


def cmd_perf_produce(args) -> int:
    from . import perf
    cluster = _perf_cluster(args)
    try:
        perf.ensure_topic(cluster, args.topic, partitions=args.partitions,
                          create=args.embedded or args.create)
        result = perf.produce(cluster, args.topic, num_records=args.num_records,
                              record_size=args.record_size, acks=_acks(args.acks),
                              batch_size=args.batch_size, chunk_records=args.chunk_records,
                              throughput=args.throughput)
    finally:
        if args.embedded:
            cluster.shutdown()
    perf.print_result(result)
    return 0


def cmd_perf_consume(args) -> int:
    from . import perf
    cluster = _perf_cluster(args)
    try:
        if args.embedded:
            perf.ensure_topic(cluster, args.topic, partitions=args.partitions, create=True)
            perf.fill(cluster, args.topic, num_records=args.num_records,
                      record_size=args.record_size)
        else:       # an unknown topic: one error line, before the progress bar starts
            cluster.metadata.partitions_for(args.topic)
        result = perf.consume(cluster, args.topic, num_records=args.num_records)
    finally:
        if args.embedded:
            cluster.shutdown()
    perf.print_result(result)
    return 0


def cmd_perf_storage(args) -> int:
    script = os.path.join(_repo_root(), "benchmarks", "storage_bench.py")
    if not os.path.exists(script):
        raise KafkaError(f"benchmark script not found: {script}")
    cmd = [sys.executable, script] + (["--quick"] if args.quick else [])
    return subprocess.call(cmd)


def cmd_perf_clients(args) -> int:
    script = os.path.join(_repo_root(), "benchmarks", "clients_bench.py")
    if not os.path.exists(script):
        raise KafkaError(f"benchmark script not found: {script}")
    cmd = [sys.executable, script] + (["--quick"] if args.quick else []) + (
        ["--profile", str(args.profile)] if args.profile else [])
    return subprocess.call(cmd)


def cmd_perf_scale(args) -> int:
    from . import perf
    summary = perf.scale(sizes=args.sizes, brokers=args.brokers, idle_s=args.idle_seconds,
                         records=args.records, record_size=args.record_size,
                         data_dir=args.data_dir)
    print(json.dumps(summary, allow_nan=False), flush=True)
    return 0


# -- demo ------------------------------------------------------------------------------------
def cmd_demo(args) -> int:
    if args.storage:
        from .storage_demo import run
        run(data_dir=args.data_dir, records=args.records or 300_000)
        return 0
    if args.simple:
        from .demo import run
        summary = run(records=args.records or 200_000, partitions=args.partitions,
                      brokers=args.brokers, data_dir=args.data_dir)
        if not summary["ok"]:
            raise CommandError("the demo's checks failed (DEMO FAILED above)")
        return 0
    return _run_job("jobs.examples.etl", *_demo_job_args(args))


#: The main demo is a job (Ray tasks, consumer-group actors and Spark together), so it lives
#: with the jobs (jobs/examples/etl.py), which use the public API of actors/; actors/ never
#: imports jobs/ (tests/test_layering.py). The CLI runs it as ``python -m`` in a child
#: process that inherits the terminal; its exit status is the command's.
JOB_STOP_TIMEOUT_S = 60.0


def _demo_job_args(args) -> list[str]:
    argv = ["--records", str(args.records or 100_000), "--partitions", str(args.partitions),
            "--brokers", str(args.brokers)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir,
                 "--output", os.path.join(args.data_dir, "etl-tiers.parquet")]
    return argv


def _run_job(module: str, *argv: str) -> int:
    """``python -m module argv...`` with this interpreter; its exit status (128 + N when a
    signal N ended it, as a shell says). On Ctrl-C (which the child gets too, being in this
    terminal's process group) wait for it to shut its cluster down."""
    proc = subprocess.Popen([sys.executable, "-m", module, *argv])
    try:
        code = proc.wait()
        return code if code >= 0 else 128 - code
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=JOB_STOP_TIMEOUT_S)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        raise


# -- the parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--namespace", default=DEFAULT_NAMESPACE, type=_namespace,
                        help=f"which cluster (default {DEFAULT_NAMESPACE!r})")
    common.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)

    # the same options before a command group's ACTION (``raykafka topics --namespace ns
    # create ...``, as kafka-topics takes its options in any order), under their own names:
    # an ACTION's parser would otherwise overwrite them with its defaults (main merges them)
    outer = _Parser(add_help=False)
    outer.add_argument("--namespace", dest="outer_namespace", default=None, type=_namespace,
                       help=f"which cluster (default {DEFAULT_NAMESPACE!r}; also accepted "
                            f"after ACTION)")
    outer.add_argument("--verbose", dest="outer_verbose", action="store_true",
                       help=VERBOSE_HELP)

    p = _Parser(prog="raykafka", description="A Kafka-design commit log on Ray.")
    p.add_argument("-V", "--version", action="version", version=f"raykafka {version()}")
    # and before the COMMAND (``raykafka --namespace ns status``, as ``ray``'s and
    # ``kubectl``'s global options): a third name each, since a command's own parser
    # writes its defaults over any dest it shares with this one
    p.add_argument("--namespace", dest="top_namespace", default=None, type=_namespace,
                   metavar="NAMESPACE",
                   help="which cluster, for the commands that take --namespace")
    p.add_argument("--verbose", dest="top_verbose", action="store_true",
                   help="show Ray's and Spark's own log lines, for the commands that take "
                        "--verbose")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def cmd(parent, name, func, help_, parents=(common,)):
        sp = parent.add_parser(name, help=help_, parents=list(parents))
        sp.set_defaults(func=func, prog=sp.prog)   # its errors start "raykafka topics create:"
        return sp

    s = cmd(sub, "start", cmd_start, "start a local cluster in the background")
    s.add_argument("--brokers", type=_positive_int, default=3, help="brokers (default 3)")
    s.add_argument("--data-dir", default=None,
                   help="where the cluster keeps its data (default ~/.raykafka/data/<ns>)")
    s.add_argument("--zk", default=None, type=_zk_connect, metavar="HOST:PORT[/CHROOT]",
                   help="an external ZooKeeper, as Kafka's zookeeper.connect (default: start "
                        "an embedded one; the chroot defaults to /raykafka-<namespace>)")
    s.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="run the brokers on this running Ray (\"auto\", or HOST:PORT of its "
                        "GCS; on a `ray up` cluster one broker per worker node) instead of a "
                        "private local Ray; `stop` then leaves that Ray running")
    s.add_argument("--wait-workers", type=_non_negative_int, default=0, metavar="N",
                   help="with --ray-address: first wait (up to --timeout) until that Ray has "
                        "N worker nodes, so that the brokers go one per worker (the workers "
                        "of a `ray up` cluster join after its head; default 0: no wait)")
    s.add_argument("--port", type=_listener_port, default=None, metavar="P",
                   help="the Kafka listeners' ports: broker i on P+i (default: free ports; "
                        "`raykafka status --bootstrap` prints them)")
    s.add_argument("--secure", action="store_true",
                   help="SASL_SSL listeners (SCRAM), ACLs and ZooKeeper ACLs: makes a CA, "
                        "certificates and an admin user under <data-dir>/security (reused "
                        "when there) and prints the client settings (docs/security.md)")
    s.add_argument("--config", action="append", metavar="K=V",
                   help="a broker setting by Kafka's name, as in server.properties "
                        "(repeatable), e.g. num.partitions=3, default.replication.factor=3, "
                        "auto.create.topics.enable=false")
    s.add_argument("--timeout", type=_positive_float, default=150.0,
                   help="seconds to wait for the cluster (default 150)")
    s = cmd(sub, "stop", cmd_stop, "stop the cluster `start` left running")
    s.add_argument("--timeout", type=_positive_float, default=60.0,
                   help="seconds before SIGKILL (default 60)")
    s = cmd(sub, "status", cmd_status, "brokers, controller and topics of the running cluster")
    s.add_argument("--bootstrap", action="store_true",
                   help="print only the brokers' Kafka listeners (bootstrap.servers)")

    topics = sub.add_parser("topics", help="create, list, describe, delete, alter topics",
                            parents=[outer])
    tsub = topics.add_subparsers(dest="topics_command", metavar="ACTION", parser_class=_Parser)
    tsub.required = True
    t = cmd(tsub, "create", cmd_topics_create, "create a topic")
    t.add_argument("name")
    t.add_argument("--partitions", type=_positive_int, required=True)
    t.add_argument("--replication-factor", type=_positive_int, required=True)
    t.add_argument("--config", action="append", metavar="K=V", help="topic config (repeatable)")
    cmd(tsub, "list", cmd_topics_list, "list topics")
    t = cmd(tsub, "describe", cmd_topics_describe, "partitions, leaders, ISR, offsets")
    t.add_argument("name", nargs="?")
    t.add_argument("--under-replicated-partitions", action="store_true",
                   help="only partitions whose ISR is smaller than their replica list")
    t.add_argument("--unavailable-partitions", action="store_true",
                   help="only partitions without a leader (offline)")
    t = cmd(tsub, "delete", cmd_topics_delete, "delete a topic")
    t.add_argument("name")
    t = cmd(tsub, "alter", cmd_topics_alter,
            "change a topic's config, or grow its partition count")
    t.add_argument("name")
    t.add_argument("--partitions", type=_positive_int, metavar="N",
                   help="the new partition count (more than now: partitions are only added)")
    t.add_argument("--config", action="append", metavar="K=V")

    s = cmd(sub, "produce", cmd_produce, "produce lines from stdin")
    s.add_argument("topic")
    s.add_argument("--key-separator", default=None, metavar="S",
                   help="each line is key<S>value")
    s.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"],
                   help="acknowledgement each send waits for (default all: every in-sync "
                        "replica)")
    s.add_argument("--linger-ms", type=_non_negative_int, default=5, metavar="MS",
                   help="how long a batch waits for more lines (default 5)")

    s = cmd(sub, "consume", cmd_consume, "print a topic's records")
    s.add_argument("topic")
    s.add_argument("--group", default=None,
                   help="read as a member of this consumer group (its share of the "
                        "partitions, from its committed offsets, committing as it goes)")
    s.add_argument("--from-beginning", action="store_true",
                   help="start at the earliest offset (with --group: where the group has "
                        "no committed offset) instead of the end")
    s.add_argument("--partition", type=_non_negative_int, default=None, metavar="P",
                   help="read only this partition")
    s.add_argument("--offset", type=_start_offset, default=None, metavar="O",
                   help="with --partition: start at this offset, 'earliest' or 'latest' "
                        "(the default)")
    s.add_argument("--max-messages", type=_positive_int, default=None, metavar="N",
                   help="exit after printing N records")
    s.add_argument("--timeout-ms", type=_positive_int, default=None,
                   help="exit after this long without a new record")
    s.add_argument("--print-key", action="store_true",
                   help="print each record's key before its value")
    s.add_argument("--key-separator", default=None, help="between key and value (default tab)")

    groups = sub.add_parser("groups", help="consumer groups: list, describe (lag)",
                            parents=[outer])
    gsub = groups.add_subparsers(dest="groups_command", metavar="ACTION", parser_class=_Parser)
    gsub.required = True
    cmd(gsub, "list", cmd_groups, "list groups")
    g = cmd(gsub, "describe", cmd_groups, "describe a group")
    g.add_argument("group")

    acls = sub.add_parser("acls", help="ACLs of a cluster with an authorizer: add, list, "
                          "remove", parents=[outer])
    asub = acls.add_subparsers(dest="acls_command", metavar="ACTION", parser_class=_Parser)
    asub.required = True
    for action, help_ in (("add", "allow (or --deny) a principal an operation on a resource"),
                          ("remove", "remove exactly that ACL (add's arguments)")):
        a = cmd(asub, action, cmd_acls, help_)
        a.add_argument("principal", metavar="PRINCIPAL", help="User:NAME, or User:* for all")
        a.add_argument("--operation", required=True,
                       help="read, write, create, delete, describe, alter, describe_configs, "
                            "alter_configs, cluster_action, idempotent_write or all")
        a.add_argument("--topic", default=None)
        a.add_argument("--group", default=None)
        a.add_argument("--transactional-id", default=None)
        a.add_argument("--cluster", action="store_true", help="the cluster itself")
        a.add_argument("--prefixed", action="store_true",
                       help="the name is a prefix: every resource whose name starts with it")
        a.add_argument("--deny", action="store_true", help="a Deny ACL (it wins over Allow)")
        a.add_argument("--host", default="*", help="only from this address (default *)")
    a = cmd(asub, "list", cmd_acls, "list ACLs")
    a.add_argument("--principal", default=None)
    a.add_argument("--topic", default=None)
    users = sub.add_parser("users", help="SCRAM users: add (or change a password), list, "
                                         "delete", parents=[outer])
    usub = users.add_subparsers(dest="users_command", metavar="ACTION", parser_class=_Parser)
    usub.required = True
    u = cmd(usub, "add", cmd_users, "add a user or change its password (read from stdin, "
            "or asked for on a terminal)")
    u.add_argument("name")
    u.add_argument("--mechanism", action="append",
                   choices=["SCRAM-SHA-256", "SCRAM-SHA-512"],
                   help="repeatable (default: both)")
    u.add_argument("--iterations", type=_positive_int, default=4096,
                   help="PBKDF2 iterations (4096..16384, default 4096)")
    cmd(usub, "list", cmd_users, "list users and their mechanisms")
    u = cmd(usub, "delete", cmd_users, "delete a user")
    u.add_argument("name")

    s = cmd(sub, "reassign", cmd_reassign, "move partitions to new replicas (a "
            "kafka-reassign-partitions JSON plan) and wait until done")
    s.add_argument("plan", metavar="PLAN.json")
    s.add_argument("--timeout", type=_positive_float, default=300.0,
                   help="seconds to wait for the reassignment (default 300)")
    s = cmd(sub, "elect-leaders", cmd_elect_leaders, "move leadership to preferred replicas")
    s.add_argument("--topic", default=None)

    perf = sub.add_parser("perf", help="benchmarks")
    perf_sub = perf.add_subparsers(dest="perf_command", metavar="WHAT", parser_class=_Parser)
    perf_sub.required = True
    for name, func in (("produce", cmd_perf_produce), ("consume", cmd_perf_consume)):
        ps = cmd(perf_sub, name, func, f"{name} throughput and latency")
        ps.add_argument("--topic", required=True)
        ps.add_argument("--num-records", type=_positive_int, required=True)
        ps.add_argument("--record-size", type=_positive_int, default=100,
                        required=(name == "produce"))
        ps.add_argument("--embedded", action="store_true",
                        help="start a cluster in this process instead of using a running one")
        ps.add_argument("--brokers", type=_positive_int, default=3,
                        help="brokers of the --embedded cluster (default 3)")
        ps.add_argument("--partitions", type=_positive_int, default=6,
                        help="partitions when the topic is created (default 6)")
        if name == "produce":
            ps.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
            ps.add_argument("--batch-size", type=_positive_int, default=None,
                            help="bytes per produce request (default 4 MiB)")
            ps.add_argument("--chunk-records", type=_positive_int, default=None,
                            help="records per send_batch call")
            ps.add_argument("--create", action="store_true",
                            help="create the topic if it is missing")
            ps.add_argument("--throughput", type=int, default=-1, metavar="RECORDS_PER_S",
                            help="pace the producer to this rate (default -1: unlimited), "
                                 "to measure latency below saturation")
    ps = cmd(perf_sub, "storage", cmd_perf_storage, "the storage engine benchmark", parents=())
    ps.add_argument("--quick", action="store_true", help="a shorter run")
    ps = cmd(perf_sub, "clients", cmd_perf_clients, "Kafka clients (confluent-kafka) against "
             "raykafka's own clients and Redis Streams, and librdkafka's end-to-end latency "
             "(starts its own private Ray and cluster)", parents=())
    ps.add_argument("--quick", action="store_true", help="a shorter run")
    ps.add_argument("--profile", type=_positive_int, default=None, metavar="SECONDS",
                    help="py-spy the brokers for this long during an extra produce run")
    ps = cmd(perf_sub, "scale", cmd_perf_scale, "the cost of a partition: replicas next to "
             "bare Ray actors (starts its own private Ray and cluster)", parents=())
    ps.add_argument("--sizes", type=_increasing_sizes, default=(10, 30, 60), metavar="N,N,...",
                    help="total partitions after each step, increasing (default 10,30,60)")
    ps.add_argument("--brokers", type=_positive_int, default=3, help="brokers (default 3)")
    ps.add_argument("--idle-seconds", type=_positive_float, default=10.0,
                    help="idle CPU window per step (default 10)")
    ps.add_argument("--records", type=_positive_int, default=200_000,
                    help="records of the throughput run per step (default 200000)")
    ps.add_argument("--record-size", type=_positive_int, default=100,
                    help="bytes per record (default 100)")
    ps.add_argument("--data-dir", default=None,
                    help="where the cluster keeps its data (default: a temporary dir)")
    ps.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)

    demo = cmd(sub, "demo", cmd_demo, "run the main demo job: Ray producer tasks -> topic -> "
               "consumer-group actors -> topic -> Spark aggregation", parents=())
    which = demo.add_mutually_exclusive_group()
    which.add_argument("--simple", action="store_true",
                       help="produce and read back keyed records only (no group, no Spark), "
                            "checking order per key and exactly-once reads")
    which.add_argument("--storage", action="store_true",
                       help="the storage crash demo instead (a log killed mid-write, recovered)")
    demo.add_argument("--records", type=_positive_int, default=None,
                      help="records to produce (default 100000; --simple: 200000; "
                           "--storage: 300000)")
    demo.add_argument("--partitions", type=_positive_int, default=6)
    demo.add_argument("--brokers", type=_positive_int, default=3)
    demo.add_argument("--data-dir", default=None, help="where to keep the demo's data")
    demo.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return p


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _listener_port(text: str) -> int:
    """``--port``: a TCP port for broker 0 (broker i gets P+i, so leave room above it)."""
    port = _int_at_least(text, 1, "a port number (1-65535)")
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return port


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "a number >= 0")


def _zk_connect(text: str) -> str:
    """``--zk``: Kafka's zookeeper.connect, ``host:port[,host:port...][/chroot]``."""
    from coordination.zk_layout import split_connect
    try:
        split_connect(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _increasing_sizes(text: str) -> tuple[int, ...]:
    """``10,30,60``: positive totals, strictly increasing."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated partition counts like 10,30,60, got {text!r}") from None
    if any(n < 1 for n in sizes) or any(a >= b for a, b in zip(sizes, sizes[1:])):
        raise argparse.ArgumentTypeError(
            f"partition counts must be positive and increasing, got {text!r}")
    return sizes


def _namespace(text: str) -> str:
    if not text or not all(c.isalnum() or c in "-_." for c in text):
        raise argparse.ArgumentTypeError(f"a namespace is letters, digits, '-', '_' or '.', "
                                         f"got {text!r}")
    return text


def _one_line(exc: BaseException) -> str:
    """The typed error behind a Ray wrapper, as ``Name: first line of the message``."""
    try:
        from ..protocol import unwrap
        exc = unwrap(exc)
    except ImportError:
        pass
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _merge_outer_options(args) -> None:
    """``--namespace`` / ``--verbose`` given before the COMMAND or before a command group's
    ACTION count as if given after it; given in two places, the namespaces must agree. A
    command that takes neither option refuses it wherever it is given."""
    for given in (getattr(args, "top_namespace", None), getattr(args, "outer_namespace", None)):
        if given is None:
            continue
        if not hasattr(args, "namespace"):
            raise UsageError("this command takes no --namespace")
        if args.namespace not in (DEFAULT_NAMESPACE, given):
            raise UsageError(f"--namespace given twice: {given!r} and {args.namespace!r}")
        args.namespace = given
    if getattr(args, "top_verbose", False) or getattr(args, "outer_verbose", False):
        if not hasattr(args, "verbose"):
            raise UsageError("this command takes no --verbose")
        args.verbose = True


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:   # argparse would name the top-level parser; the command is what was wrong
        parser = _Parser(prog=getattr(args, "prog", parser.prog))
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        _merge_outer_options(args)
    except UsageError as exc:
        _error(args.prog, str(exc))
        return EXIT_USAGE
    if getattr(args, "verbose", False):
        # read where Ray and Spark are started, here and in the processes started from here
        from .._rayenv import VERBOSE_ENV
        os.environ[VERBOSE_ENV] = "1"
    prog = args.prog
    try:
        return args.func(args)
    except UsageError as exc:
        _error(prog, str(exc))
        return EXIT_USAGE
    except CommandError as exc:
        _error(prog, str(exc))
        return EXIT_ERROR
    except KafkaError as exc:
        _error(prog, _one_line(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _err(f"{prog}: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - Ray errors and bugs: one line unless asked
        if os.environ.get("RAYKAFKA_DEBUG"):
            raise
        _error(prog, f"{_one_line(exc)} (RAYKAFKA_DEBUG=1 shows the traceback)")
        return EXIT_ERROR


def run() -> None:
    """The ``raykafka`` command (``main`` and exit). A command that attached to a running
    cluster ends at once: Ray's exit hook would sleep 0.5 s ("so log messages finish
    printing") and then disconnect, about 1.0 s of a 2.2 s ``raykafka topics list``
    (measured 2026-11-29), and such a process owns nothing that needs it (the cluster runs
    on; Ray sees the driver's connection close, as for any driver that ends). A command
    that started Ray or a cluster itself (``demo``, ``--embedded``) exits the usual way,
    which stops them."""
    rc = main()
    if _attached:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):   # a closed pipe: nothing more to say there
                pass
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
