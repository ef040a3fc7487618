"""Spark over raykafka topics, through RayDP (Spark on Ray) in the cluster the brokers run on.

    from actors import Cluster
    from jobs.spark import spark_session, read_topic_df, write_topic_df, stop_spark
    cluster = Cluster.connect()                      # or Cluster.start(...): Ray is up
    spark = spark_session(app_name="etl")            # RayDP, set up for Java 17 (below)
    df = read_topic_df(spark, cluster, "events")     # Spark's Kafka source columns
    counts = write_topic_df(df.where("key IS NOT NULL"), cluster, "keyed")   # {partition: n}
    stop_spark()

``spark_session`` starts Spark inside the Ray this process is attached to (``raydp.init_spark``):
a RayDP master actor, an app master (a Ray Java worker) and ``num_executors`` executors (Ray
Java actors), with the driver JVM in this process. It passes what RayDP 1.6.5 needs on Java 17
(docs/jobs.md, "RayDP 1.6.5 on Java 17", has what was tried):

- ``JAVA_OPTIONS`` (``-XX:+IgnoreUnrecognizedVMOptions`` and ``--add-opens`` for the
  java.base packages RayDP's documentation lists, plus those of Spark's own launcher) to the
  driver, the executors and the app master (``spark.ray.raydp_app_master.extraJavaOptions``).
  The app master gets no options but these: without them ``ray.data.from_spark`` fails (the
  app master dies on ``InaccessibleObjectException ... does not "opens java.lang"``: Ray
  Java serialises the Java Map it returns with FST, which needs the opens on Java 16+);
- ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = this interpreter (else Spark's Python
  workers start the system ``python3``, which has neither pyarrow nor ray);
- ``spark.driver.host`` / ``bindAddress`` = the address of this driver's Ray node
  (127.0.0.1 on raykafka's loopback Ray);
- small defaults for one machine (``DEFAULT_CONFIGS``); ``configs`` overrides any of them.

``read_topic_df`` resolves the offset ranges on the driver and reads them inside Spark's
executors, as Spark's own Kafka source does, one Spark partition per range. Its reader is
the JVM one (``jobs/jvm``: a Java DataSource V2, ``raykafka.spark.TopicSource``, whose jar
``spark_session`` adds to the session) whenever the leaders have PLAINTEXT listeners: each
task fetches its range from the leader's Kafka listener and hands Spark columnar batches
of only the columns the query uses (a ``count()`` reads batch headers only). Otherwise
(a secured cluster, no JDK, ``RAYKAFKA_SPARK_READER=python``) a ``mapInArrow`` whose
Python workers (attached to Ray once, ``attach_workers``) fetch the range with a
``SimpleConsumer`` (``jobs.data.iter_range``) and yield Arrow record batches of every
column. Nothing goes through Ray's object store either way.
``dataset_to_df`` still turns a Ray Dataset into a DataFrame (RayDP's Ray ->
Spark bridge, through Arrow IPC objects this driver holds until ``release_df``).
``write_topic_df`` is RayDP's Spark -> Ray bridge (``ray.data.from_spark``) and
``jobs.data.write_topic``.

Only the public API is imported (``actors``, ``actors.errors``, ``jobs.data``; and
``jobs.jvm.build``, which builds the JVM reader's jar).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from actors.errors import (IllegalArgumentError, IllegalStateError,
                           InvalidConfigurationError, KafkaTimeoutError)
from jobs.data import (DEFAULT_FETCH_MAX_BYTES,
                       TIMESTAMP_CREATE_TIME, _as_cluster, _topic_list, iter_range, plan_read,
                       split_ranges, write_topic)
from jobs.quiet import spark_log4j2_properties, verbose

log = logging.getLogger(__name__)

# -- the session -------------------------------------------------------------------------------

#: java.base packages opened to unnamed modules: the list of RayDP's documentation
#: (doc/spark_on_ray.md, item 4; its tests' conftest) plus what Spark 3.5's own launcher
#: adds for the driver (org.apache.spark.launcher.JavaModuleOptions).
JAVA_OPENS = (
    "java.base/java.lang", "java.base/java.lang.invoke", "java.base/java.lang.reflect",
    "java.base/java.io", "java.base/java.net", "java.base/java.nio", "java.base/java.math",
    "java.base/java.text", "java.base/java.util", "java.base/java.util.concurrent",
    "java.base/java.util.concurrent.atomic", "java.base/jdk.internal.ref",
    "java.base/sun.nio.ch", "java.base/sun.nio.cs", "java.base/sun.security.action",
    "java.base/sun.util.calendar", "java.security.jgss/sun.security.krb5",
)
#: The JVM options every JVM of the session gets (driver, executors, app master).
JAVA_OPTIONS = " ".join(["-XX:+IgnoreUnrecognizedVMOptions",
                         *(f"--add-opens={p}=ALL-UNNAMED" for p in JAVA_OPENS),
                         "-Djdk.reflect.useDirectMethodHandle=false"])
JAVA_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
                    "spark.ray.raydp_app_master.extraJavaOptions")

#: Defaults fit for one small machine (2 cores, a few GiB for Spark); ``configs`` wins.
#: The shuffle partitions default to twice the executor cores (Spark's 200 is 200 tasks
#: per shuffle, most of them empty, on a machine with 2 cores).
DEFAULT_CONFIGS = {
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",        # Kafka timestamps are UTC
    "spark.ui.enabled": "false",                # no web UI port (turn on with configs)
    "spark.ui.showConsoleProgress": "false",    # no progress bars on stderr
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
SPARK_MASTER_SUFFIX = "_SPARK_MASTER"           # raydp's name for the master actor
#: RayDP's setting for the driver JVM's ``-Dlog4j2.configurationFile``. Its default,
#: "log4j2-default.properties", is a file no JVM finds: log4j2 says "ERROR
#: StatusConsoleListener Reconfiguration failed: No configuration found" on the terminal and
#: Spark falls back to its defaults profile, which prints how to change the level.
SPARK_DRIVER_LOG4J2_KEY = "spark.log4j.config.file.name"
#: The driver JVM runs a Ray core worker (RayDP's Ray Java client) that writes Ray's C++ log
#: lines to its stderr, our terminal: "[2026-11-25 23:42:42,739 I 7931 8004]
#: gcs_client.cc:96: GcsClient has no Cluster ID set, and won't fetch from GCS" at INFO,
#: before Ray's logging reads its level (RAY_BACKEND_LOG_LEVEL=warning only adds a line
#: saying so). Lines of this shape at DEBUG or INFO are left out of the JVM's stderr.
RAY_CPP_INFO_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DI] \d+ \d+\] ")
STOP_TIMEOUT_S = 60.0

_lock = threading.RLock()
_session: SparkSession | None = None
_session_args: dict | None = None
#: id(DataFrame) -> (the DataFrame, the Ray objects it reads): see ``dataset_to_df``
_held: dict[int, tuple[DataFrame, list]] = {}


def spark_session(app_name: str = "raykafka", num_executors: int = 1, executor_cores: int = 1,
                  executor_memory: str | int = "1g", configs: dict | None = None, *,
                  log_level: str | None = "WARN") -> SparkSession:
    """A Spark session on RayDP inside the Ray this process is attached to.

    Ray must be up: ``Cluster.start(...)`` or ``Cluster.connect(namespace)`` first (or
    ``ray.init``): Spark runs in that Ray, next to the brokers. ``num_executors`` executors
    of ``executor_cores`` Ray CPUs and ``executor_memory`` each (Ray actors).
    ``configs``: Spark settings, over ``DEFAULT_CONFIGS``; extra Java options given for
    the driver, the executors or the app master are added after ``JAVA_OPTIONS``.
    ``log_level``: the SparkContext's log level (None: leave log4j's). Unless
    RAYKAFKA_VERBOSE (jobs/quiet.py) or ``configs`` names one (``spark.log4j.config.file.name``),
    the driver JVM starts with a log4j2 configuration at that level
    (``jobs.quiet.spark_log4j2_properties``), so its start prints nothing but warnings.
    Before it returns, the executors' Python workers are started and attached to Ray
    (``attach_workers``): what ``read_topic_df``'s reads need.

    One session per process (RayDP's rule): called again with the same arguments it returns
    the running session; with others it raises IllegalStateError (``stop_spark()`` first).
    Raises IllegalStateError (Ray not initialised, a Spark session not made here already
    running), InvalidConfigurationError (bad sizes, more cores per executor than the Ray
    cluster has CPUs: the executor would never start).
    """
    args = {"app_name": app_name, "num_executors": num_executors,
            "executor_cores": executor_cores, "executor_memory": executor_memory,
            "configs": dict(configs or {})}
    _check_session_args(app_name, num_executors, executor_cores, executor_memory, configs)
    if log_level is not None and not isinstance(log_level, str):
        raise InvalidConfigurationError(f"log_level must be a str such as 'WARN', got "
                                        f"{log_level!r}")
    from pyspark import SparkContext
    with _lock:
        global _session, _session_args
        if _session is not None and SparkContext._active_spark_context is None:
            try:                        # stopped behind our back (spark.stop()): clean up
                stop_spark()
            except Exception as exc:  # noqa: BLE001 - what is left of it is gone anyway
                log.warning("cleaning up a Spark session stopped elsewhere: %r", exc)
                _session, _session_args = None, None
        if _session is not None:
            if args != _session_args:
                raise IllegalStateError(
                    f"a Spark session ({_session_args['app_name']!r}) already runs in this "
                    f"process with other settings; call jobs.spark.stop_spark() first")
            return _session
        if not ray.is_initialized():
            raise IllegalStateError(
                "spark_session() starts Spark inside the Ray of a raykafka cluster, and this "
                "process is not attached to one: call Cluster.start(...) or "
                "Cluster.connect(namespace) first")
        if SparkContext._active_spark_context is not None:
            raise IllegalStateError(
                "a SparkContext not made by jobs.spark.spark_session already runs in this "
                "process; stop it first (its JVM options cannot be changed)")
        cpus = ray.cluster_resources().get("CPU", 0)
        if executor_cores > cpus:
            raise InvalidConfigurationError(
                f"executor_cores={executor_cores} but the Ray cluster has {cpus:g} CPUs: "
                f"the executor would never be scheduled")
        import raydp
        conf = session_configs(num_executors * executor_cores, configs)
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
        # the driver JVM's own address (block manager, ...): Spark would otherwise pick the
        # machine's first interface when the hostname resolves to loopback
        os.environ.setdefault("SPARK_LOCAL_IP", conf["spark.driver.bindAddress"])
        started = time.monotonic()
        log4j2, quiet = None, log_level is not None and not verbose()
        if quiet and SPARK_DRIVER_LOG4J2_KEY not in conf:
            log4j2 = conf[SPARK_DRIVER_LOG4J2_KEY] = _write_log4j2(log_level)
        try:
            with _driver_jvm_stderr_filtered(quiet):
                spark = raydp.init_spark(app_name, num_executors, executor_cores,
                                         executor_memory, configs=conf)
        except Exception as exc:
            if "has inited" in str(exc):
                raise IllegalStateError(
                    "a RayDP Spark session not made by jobs.spark.spark_session already runs "
                    "in this process; raydp.stop_spark() it first") from None
            raise
        finally:
            if log4j2 is not None:              # read once, when the driver JVM started
                os.unlink(log4j2)
        if log_level is not None:
            spark.sparkContext.setLogLevel(log_level)
        attach_workers(spark, num_executors * executor_cores)
        log.info("Spark session %r on RayDP up in %.1fs", app_name, time.monotonic() - started)
        _session, _session_args = spark, args
        return spark


def session_configs(total_cores: int = 1, configs: dict | None = None) -> dict:
    """The Spark configs ``spark_session`` passes to ``raydp.init_spark``: DEFAULT_CONFIGS,
    the Java 17 options on the three JVM kinds, this interpreter for Python workers, the
    driver bound to this driver's Ray node address, then ``configs``."""
    user = {str(k): str(v) for k, v in (configs or {}).items()}
    host = _driver_host()
    shuffle = str(max(2, 2 * total_cores))
    conf = {**DEFAULT_CONFIGS,
            "spark.sql.shuffle.partitions": shuffle,
            "spark.default.parallelism": shuffle,
            "spark.pyspark.python": sys.executable,
            "spark.driver.host": host,
            "spark.driver.bindAddress": host}
    conf = {**conf, **user}
    jar = jvm_reader_jar()
    if jar is not None:                 # the JVM reader of read_topic_df, on every JVM
        conf["spark.jars"] = ",".join(filter(None, [user.get("spark.jars", "").strip(),
                                                   str(jar)]))
    for key in JAVA_OPTION_KEYS:
        conf[key] = " ".join(filter(None, [JAVA_OPTIONS, user.get(key, "").strip()]))
    return conf


def active_session() -> SparkSession | None:
    """The session ``spark_session`` started in this process, or None."""
    return _session


def stop_spark(timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the session ``spark_session`` started (``raydp.stop_spark``: the driver's
    SparkContext, the executors and the app master) and wait until RayDP's master actor is
    gone, so a new session may take its name. Nothing to do without a session."""
    global _session, _session_args
    with _lock:
        if _session is None:
            return
        app_name = _session_args["app_name"]
        import raydp
        try:
            raydp.stop_spark()
        finally:
            _session, _session_args = None, None
            _held.clear()
        if not ray.is_initialized():
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get_actor(app_name + SPARK_MASTER_SUFFIX)
            except ValueError:
                return
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"RayDP's master actor of {app_name!r} still exists "
                                        f"{timeout_s:g}s after stop_spark()")
            time.sleep(0.1)


@contextlib.contextmanager
def _driver_jvm_stderr_filtered(active: bool = True):
    """While the block runs (``raydp.init_spark``, which starts the driver JVM: it inherits
    this process's fd 2 for its life), fd 2 is a pipe; a thread copies what comes through
    it to the real stderr, all but ``RAY_CPP_INFO_LINE`` lines. Afterwards this process
    has its own stderr back and only the JVM writes to the pipe (the thread ends when the
    JVM does)."""
    if not active:
        yield
        return
    sys.stderr.flush()
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_copy_stderr, args=(read_end, stderr), daemon=True,
                     name="spark-driver-stderr").start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(stderr, 2)


def _copy_stderr(read_end: int, stderr: int) -> None:
    with os.fdopen(read_end, "rb") as lines:
        for line in lines:
            if not RAY_CPP_INFO_LINE.match(line):
                os.write(stderr, line)
    os.close(stderr)


def _write_log4j2(level: str) -> str:
    """A temporary file of ``spark_log4j2_properties(level)``; its path."""
    import tempfile
    fd, path = tempfile.mkstemp(prefix="raykafka-spark-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write(spark_log4j2_properties(level))
    return path


def _check_session_args(app_name, num_executors, executor_cores, executor_memory, configs):
    if not isinstance(app_name, str) or not app_name:
        raise InvalidConfigurationError(f"app_name must be a non-empty str, got {app_name!r}")
    for name, value in (("num_executors", num_executors), ("executor_cores", executor_cores)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidConfigurationError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(executor_memory, (str, int)) or isinstance(executor_memory, bool) or \
            not str(executor_memory).strip():
        raise InvalidConfigurationError(f"executor_memory must be a size such as '1g' or a "
                                        f"number of bytes, got {executor_memory!r}")
    if configs is not None and not isinstance(configs, dict):
        raise InvalidConfigurationError(f"configs must be a dict of Spark settings, got "
                                        f"{type(configs).__name__}")


def _driver_host() -> str:
    """The address of the Ray node this driver runs on: what executors on other nodes reach
    the driver at; 127.0.0.1 on a loopback Ray (raykafka's embedded default)."""
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("NodeManagerAddress"):
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


# -- reading -----------------------------------------------------------------------------------

_HEADER = T.StructType([T.StructField("key", T.StringType()),
                        T.StructField("value", T.BinaryType())])
#: The columns of Spark's Kafka source (``includeHeaders`` on), what ``read_topic_df`` gives.
SPARK_SCHEMA = T.StructType([
    T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()),
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
    T.StructField("timestamp", T.TimestampType()),
    T.StructField("timestampType", T.IntegerType()),
    T.StructField("headers", T.ArrayType(_HEADER)),
])
#: The Arrow blocks handed to Spark (RayDP maps each Arrow type to the Spark type above).
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
#: Spark's timestampType numbers Kafka's TimestampType ids: -1 none, 0 CreateTime,
#: 1 LogAppendTime; read_topic's timestamp_type the confluent client's: 0 none,
#: 1 CreateTime, 2 LogAppendTime. So Spark's = read_topic's - 1.
SPARK_CREATE_TIME = 0
SPARK_LOG_APPEND_TIME = 1
SPARK_NO_TIMESTAMP_TYPE = -1


#: ``read_topic_df``'s default ``max_records_per_task``: the most offsets one Spark
#: partition reads. Larger than ``read_topic``'s: a Spark task has a fixed cost of its own
#: (a Python worker's task set-up, measured at tens of ms on 2 cores) and Spark's own
#: Kafka source reads one topic partition per Spark partition.
DEFAULT_SPARK_RECORDS_PER_PARTITION = 4_000_000
#: ``read_topic_df``'s options (the rest of ``read_topic``'s are Ray task resources: the
#: reads run in Spark's executors here)
#: The JVM reader (``jobs/jvm``): its DataSource V2 class and jar file name.
JVM_SOURCE_CLASS = "raykafka.spark.TopicSource"
JVM_JAR_NAME = "raykafka-spark.jar"
#: The JVM reader's Spark tasks: as many as the executors have cores, each reading its
#: ranges at once (a fetch thread and connection per range, up to 2 fetches of
#: ``fetch_max_bytes`` held each), at most this many ranges per task.
JVM_MAX_RANGES_PER_TASK = 8
#: A piece of the JVM reader carries its record count (``SimpleConsumer.count_records``, the
#: leader replicas' batch headers, counted when the DataFrame is made) when its range holds
#: at most this many batches: a ``count()`` (also grouped by topic or partition) is then
#: answered from the counts, without reading (aggregate push-down). A bound on what every
#: ``read_topic_df`` pays up front: about 3 us per batch header.
JVM_COUNT_MAX_BATCHES = 20_000
READ_OPTIONS = ("partitions", "max_records_per_task", "fetch_max_bytes", "consumer_config",
                "timeout_ms")


def read_topic_df(spark, cluster, topic_or_topics, starting_offsets="earliest",
                  ending_offsets="latest", **read_options) -> DataFrame:
    """A Spark DataFrame of the records of ``topic_or_topics`` from ``starting_offsets`` up to
    ``ending_offsets`` (exclusive), with exactly the columns of Spark's Kafka source
    (``SPARK_SCHEMA``): key, value (binary), topic, partition (int), offset (long),
    timestamp (timestamp), timestampType (int: 0 CreateTime, 1 LogAppendTime, -1 none),
    headers (array<struct<key: string, value: binary>>, repeated keys kept, in order; null
    for a record without headers, as Spark's source gives).

    ``spark``: a session of ``spark_session``. ``cluster``: an ``actors.Cluster`` or its
    namespace. Offsets as ``jobs.data.read_topic`` takes them ("earliest", "latest", an int,
    a datetime, ``{topic: {partition: offset}}``) or as Spark's ``startingOffsets`` /
    ``endingOffsets`` option, a JSON string ``'{"events": {"0": 23, "1": -2}}'`` (-2
    earliest, -1 latest). ``read_options``: ``partitions``, ``max_records_per_task`` (the
    most offsets one Spark partition reads), ``fetch_max_bytes``, ``consumer_config``,
    ``timeout_ms``, as ``read_topic`` takes them.

    Offsets are resolved when this is called: the DataFrame is a fixed snapshot of
    committed records (below each partition's high watermark). The records are read when
    Spark computes the DataFrame, inside its executors, as Spark's own Kafka source does:
    one Spark partition per offset range (``jobs.data.split_ranges``), fetch by fetch, so
    Spark works on the first records while later ones are fetched. The reader is the JVM
    one (``jobs/jvm``: Fetch requests to the leader's PLAINTEXT listener, columnar batches
    of only the columns the query uses) when ``_jvm_read_options`` says it can, else
    Spark's Python workers (``RangeReader`` in a ``mapInArrow``: every column).
    ``RAYKAFKA_SPARK_READER`` (``READERS``) forces one. Nothing goes through Ray's object
    store and nothing is held after the action: each action reads the ranges again
    (``df.cache()`` to keep them).

    Raises what ``read_topic`` raises (UnknownTopicOrPartitionError, IllegalArgumentError,
    OffsetOutOfRangeError, InvalidConfigurationError), on the driver, and
    IllegalArgumentError for a ``spark`` that is not a SparkSession, offsets JSON that does
    not parse or an option not in READ_OPTIONS.
    """
    if not isinstance(spark, SparkSession):
        raise IllegalArgumentError(f"spark must be a SparkSession (jobs.spark.spark_session()), "
                                   f"got {type(spark).__name__}")
    unknown = sorted(set(read_options) - set(READ_OPTIONS))
    if unknown:
        raise IllegalArgumentError(
            f"read_topic_df takes the read options {list(READ_OPTIONS)}, not {unknown} (the "
            f"reads run in Spark's executors, not in Ray tasks)")
    names = _topic_list(topic_or_topics)
    start = _spark_offsets(starting_offsets, "starting_offsets")
    end = _spark_offsets(ending_offsets, "ending_offsets")
    options = {"max_records_per_task": DEFAULT_SPARK_RECORDS_PER_PARTITION,
               "fetch_max_bytes": DEFAULT_FETCH_MAX_BYTES, "timeout_ms": None,
               "consumer_config": {}, **read_options}
    options["consumer_config"] = dict(options["consumer_config"] or {})
    cluster, ranges = plan_read(cluster, names, start, end, **options)
    pieces = [r for r in split_ranges(ranges, options["max_records_per_task"]) if r[3] > r[2]]
    if not pieces:
        return spark.createDataFrame([], SPARK_SCHEMA)
    jvm = _jvm_read_options(spark, cluster, pieces, options)
    if jvm is not None:
        return spark.read.format(JVM_SOURCE_CLASS).options(**jvm).load()
    reader = RangeReader(cluster.namespace, _ray_address(), pieces,
                         consumer_config=options["consumer_config"],
                         fetch_max_bytes=options["fetch_max_bytes"],
                         timeout_ms=options["timeout_ms"])
    return spark.range(0, len(pieces), 1, numPartitions=len(pieces)) \
        .mapInArrow(reader, SPARK_SCHEMA)


#: ``read_topic_df``'s reader: "auto" (the JVM reader when it can, else Python workers),
#: "jvm" (the JVM reader or IllegalStateError), "python" (Spark's Python workers).
READER_ENV = "RAYKAFKA_SPARK_READER"
READERS = ("auto", "jvm", "python")


def jvm_reader_jar():
    """The jar of the JVM reader (``jobs/jvm``, built on first use and cached), or None
    without a JDK or with ``RAYKAFKA_SPARK_READER=python``."""
    if os.environ.get(READER_ENV, "auto") == "python":
        return None
    from jobs.jvm.build import jar_path
    return jar_path()


def _reader_choice() -> str:
    choice = os.environ.get(READER_ENV, "auto").strip().lower() or "auto"
    if choice not in READERS:
        raise InvalidConfigurationError(f"{READER_ENV} must be one of {list(READERS)}, got "
                                        f"{choice!r}")
    return choice


def _piece_counts(cluster, pieces, consumer_config: dict) -> list:
    """Each piece's record count (``SimpleConsumer.count_records``, the pieces counted at
    once), None for one past ``JVM_COUNT_MAX_BATCHES``; [] when counting failed (the query
    then reads, as without counts)."""
    import concurrent.futures
    try:
        consumer = cluster.simple_consumer(**consumer_config)
    except Exception as exc:  # noqa: BLE001 - a count is an optimisation: read instead
        log.debug("read_topic_df: no counts (%r)", exc)
        return []
    try:
        with concurrent.futures.ThreadPoolExecutor(min(8, len(pieces))) as pool:
            return list(pool.map(lambda piece: consumer.count_records(
                *piece, max_batches=JVM_COUNT_MAX_BATCHES), pieces))
    except Exception as exc:  # noqa: BLE001 - a count is an optimisation: read instead
        log.debug("read_topic_df: no counts (%r)", exc)
        return []
    finally:
        consumer.close()


def _jvm_read_options(spark, cluster, pieces, options) -> dict | None:
    """The options of the JVM reader (``jobs/jvm``: ``raykafka.spark.TopicSource``) for
    ``pieces``, or None when Spark's Python workers read instead: ``RAYKAFKA_SPARK_READER``
    says python, the session was started without the reader's jar (no JDK), the cluster
    or ``consumer_config`` asks for SASL/SSL, or a leader has no PLAINTEXT listener. (With
    ``RAYKAFKA_SPARK_READER=jvm`` those raise IllegalStateError instead.)"""
    choice = _reader_choice()
    if choice == "python":
        return None

    def cannot(reason: str):
        if choice == "jvm":
            raise IllegalStateError(f"{READER_ENV}=jvm but the JVM reader cannot read this: "
                                    f"{reason}")
        log.debug("read_topic_df through Python workers: %s", reason)
        return None

    jars = spark.sparkContext.getConf().get("spark.jars", "")
    if JVM_JAR_NAME not in jars:
        return cannot("the Spark session was started without the reader's jar (no javac?)")
    protocol = str(options["consumer_config"].get("security_protocol", "PLAINTEXT")).upper()
    if protocol != "PLAINTEXT" or (cluster.security_files is not None
                                   and "security_protocol" not in options["consumer_config"]):
        return cannot("the cluster's clients use SASL/SSL")
    from actors.errors import KafkaError
    metadata = cluster.metadata
    try:
        lines = []
        for topic, partition, start, end in pieces:
            broker, _ = metadata.leader_broker(topic, partition)
            host, port = metadata.broker_address(broker, "PLAINTEXT")
            lines.append(f"{topic}\t{partition}\t{start}\t{end}\t{host}\t{port}")
        bootstrap = []
        for broker in sorted(int(b) for b in metadata.snapshot().get("brokers") or {}):
            with contextlib.suppress(KafkaError):
                bootstrap.append("%s:%d" % metadata.broker_address(broker, "PLAINTEXT"))
    except KafkaError as exc:
        return cannot(f"no PLAINTEXT leader address ({exc})")
    counts = ([] if options["timeout_ms"] is not None
              else _piece_counts(cluster, pieces, options["consumer_config"]))
    if counts:
        lines = [f"{line}\t{-1 if n is None else n}" for line, n in zip(lines, counts)]
    conf = spark.sparkContext.getConf()
    cores = int(conf.get("spark.executor.instances", "1")) * \
        int(conf.get("spark.executor.cores", "1"))
    per_task = min(JVM_MAX_RANGES_PER_TASK, -(-len(lines) // max(1, cores)))
    out = {"pieces": "\n".join(lines), "bootstrap": ",".join(bootstrap),
           "ranges_per_task": str(per_task),
           "fetch_max_bytes": str(options["fetch_max_bytes"]),
           "client_id": str(options["consumer_config"].get("client_id", "raykafka-spark"))}
    if options["timeout_ms"] is not None:
        out["timeout_ms"] = str(options["timeout_ms"])
    return out


class RangeReader:
    """What ``read_topic_df``'s ``mapInArrow`` runs in a Spark Python worker: its input
    rows are indexes into ``pieces`` (``(topic, partition, start, end)``); for each it
    yields the range's records as Arrow record batches of ``ARROW_SCHEMA``, one per fetch.
    Pickled with the plan; attaches the worker to the Ray at ``ray_address`` the first
    time (Spark reuses its Python workers, ``spark.python.worker.reuse``)."""

    def __init__(self, namespace: str, ray_address: str, pieces, *, consumer_config: dict,
                 fetch_max_bytes: int, timeout_ms: int | None):
        self.namespace = namespace
        self.ray_address = ray_address
        self.pieces = [tuple(p) for p in pieces]
        self.consumer_config = dict(consumer_config)
        self.fetch_max_bytes = fetch_max_bytes
        self.timeout_ms = timeout_ms

    def __call__(self, batches):
        attach_worker(self.ray_address)
        for batch in batches:
            for index in batch.column(0).to_pylist():
                topic, partition, start, end = self.pieces[index]
                for table in iter_range(self.namespace, topic, partition, start, end,
                                        consumer_config=self.consumer_config,
                                        fetch_max_bytes=self.fetch_max_bytes,
                                        timeout_ms=self.timeout_ms):
                    yield to_spark_batch(table, topic, partition)


def attach_workers(spark: SparkSession, slots: int = 1) -> float:
    """Start the executors' Python workers and attach each to Ray now (one task per slot),
    so the first ``read_topic_df`` does not wait for it (10-20 s on a busy 2-core
    machine); the seconds it took. ``spark_session`` calls it."""
    started = time.monotonic()
    schema = T.StructType([T.StructField("id", T.LongType())])
    namespace = ray.get_runtime_context().namespace
    spark.range(0, slots, 1, numPartitions=slots) \
        .mapInArrow(_AttachOnly(_ray_address(), namespace), schema).collect()
    return time.monotonic() - started


class _AttachOnly:
    """``attach_workers``' mapInArrow function: attaches the worker (``Cluster.connect``,
    as a read does), passes its input on."""

    def __init__(self, ray_address: str, namespace: str):
        self.ray_address = ray_address
        self.namespace = namespace

    def __call__(self, batches):
        attach_worker(self.ray_address)
        from actors import Cluster
        try:
            Cluster.connect(self.namespace)
        except Exception as exc:  # noqa: BLE001 - only a warm-up: a read reports errors
            log.debug("attaching a Spark Python worker: %r", exc)
        yield from batches


def attach_worker(ray_address: str) -> None:
    """Attach this process (a Spark Python worker) to the Ray at ``ray_address`` unless it
    is attached already: where ``Cluster.connect`` looks (RAY_ADDRESS) when no
    ``raykafka start`` state names one."""
    if not ray.is_initialized():
        os.environ["RAY_ADDRESS"] = ray_address


def _ray_address() -> str:
    """The GCS address of the Ray this driver is attached to (what a Spark Python worker
    attaches to)."""
    return ray.get_runtime_context().gcs_address


def to_spark_batch(table: pa.Table, topic: str, partition: int) -> pa.RecordBatch:
    """A table of ``SimpleConsumer.iter_columns`` (offset, timestamp, timestamp_type, key,
    value, headers) as a record batch of ``ARROW_SCHEMA``: Spark's Kafka source columns in
    its order, the timestamp as microseconds (UTC), timestampType in Kafka's numbering (-1
    for a record without a timestamp), headers null where a record has none. The numeric
    columns are computed in NumPy (several times cheaper than Arrow's kernels for one
    fetch's worth of rows) and wrapped without a copy."""
    n = table.num_rows

    def column(name):
        col = table.column(name)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()

    ts = column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    ts_type = np.where(ts == -1, np.int32(SPARK_NO_TIMESTAMP_TYPE),
                       column("timestamp_type").to_numpy(zero_copy_only=False)
                       ).astype(np.int32, copy=False)
    return pa.RecordBatch.from_arrays([
        column("key").cast(pa.binary()),
        column("value").cast(pa.binary()),
        _repeated_string(topic, n),
        pa.array(np.full(n, partition, np.int32)),
        column("offset").cast(pa.int64()),
        pa.array(ts * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(ts_type),
        _null_when_empty(column("headers")),
    ], schema=ARROW_SCHEMA)


def _repeated_string(text: str, n: int) -> pa.Array:
    """A string array of ``n`` times ``text``, built from its buffers."""
    raw = text.encode()
    offsets = np.arange(0, (n + 1) * len(raw), len(raw) or 1, dtype=np.int32)[:n + 1] \
        if raw else np.zeros(n + 1, np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def _null_when_empty(lists: pa.ListArray) -> pa.ListArray:
    """``lists`` (headers) with every empty list null, as Spark's Kafka source gives a
    record without headers. (A slice of a list array, what a fetch whose first batch began
    before the range gives, is rebuilt from offset 0: Arrow takes no validity bitmap with
    sliced offsets.)"""
    lists = lists.cast(ARROW_SCHEMA.field("headers").type)
    offsets = lists.offsets.to_numpy(zero_copy_only=False)
    first, last = int(offsets[0]), int(offsets[-1])
    if first == last:
        return pa.nulls(len(lists), lists.type)
    empty = np.diff(offsets) == 0
    if lists.null_count:
        empty |= lists.is_null().to_numpy(zero_copy_only=False)
    if not empty.any():
        return lists
    return pa.ListArray.from_arrays(pa.array(offsets - first, pa.int32()),
                                    lists.values.slice(first, last - first),
                                    type=lists.type, mask=pa.array(empty))


def to_spark_block(block: pa.Table) -> pa.Table:
    """A block of ``read_topic`` (``jobs.data.SCHEMA``) as one of ``ARROW_SCHEMA``: Spark's
    Kafka source columns in its order, the timestamp as microseconds (UTC), timestampType
    in Kafka's numbering, headers as a list of (key, value) structs."""
    ts = pc.multiply(block.column("timestamp").cast(pa.int64()), 1000)
    ts_type = pc.subtract(block.column("timestamp_type").cast(pa.int32()),
                          pa.scalar(TIMESTAMP_CREATE_TIME - SPARK_CREATE_TIME, pa.int32()))
    return pa.Table.from_arrays([
        block.column("key").cast(pa.binary()),
        block.column("value").cast(pa.binary()),
        block.column("topic").cast(pa.string()),
        block.column("partition").cast(pa.int32()),
        block.column("offset").cast(pa.int64()),
        ts.cast(pa.timestamp("us", tz="UTC")),
        ts_type,
        block.column("headers").cast(ARROW_SCHEMA.field("headers").type),
    ], schema=ARROW_SCHEMA)


def dataset_to_df(spark: SparkSession, ds: "ray.data.Dataset", schema: pa.Schema) -> DataFrame:
    """``ds`` (every block of Arrow ``schema``) as a Spark DataFrame, one partition per block,
    through the JVM side of RayDP's Ray -> Spark bridge; an empty DataFrame of that schema
    when ``ds`` has no blocks (Ray drops empty blocks).

    Each block is turned into Arrow IPC stream bytes by a Ray task (``_arrow_ipc``) and the
    executors read those objects straight from Ray's object store (RayDP's
    ``RayDatasetRDD``, the bridge's path for blocks that are bytes): no Python worker,
    no pandas. ``Dataset.to_spark`` takes the bridge's other path for Arrow blocks (a
    ``mapInPandas`` whose Python workers each attach to Ray and convert every block to
    pandas and back), 2 to 5 times slower here even on small topics, and its first
    use in a session waits for a Python worker to start and attach to Ray.

    The IPC objects are owned by this driver, which holds them (``_held``) until
    ``release_df(df)`` or ``stop_spark()``: until then the DataFrame, and every DataFrame
    derived from it, can be recomputed at any time. (RayDP's own ``to_spark`` hands them
    to its master actor, ``add_objects``, which has no way to let go of them before the
    session stops: a long-running job, such as a micro-batch stream, would keep every
    batch it ever read in Ray's object store.)
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from raydp.spark.dataset import _convert_by_rdd
    struct = T.StructType([T.StructField(f.name, from_arrow_type(f.type), f.nullable)
                           for f in schema])
    # the block references as Dataset.to_spark collects them; not to_arrow_refs, which ends
    # (Dataset._execute) by asking every Ray worker for memory stats, waiting up to 60 s
    # for a stopped one
    pairs = [_arrow_ipc.remote(ref) for bundle in ds.iter_internal_ref_bundles()
             for ref in bundle.block_refs]
    if not pairs:
        return spark.createDataFrame([], struct)
    refs = [data for data, _ in pairs]
    ray.get([rows for _, rows in pairs])        # a conversion's error is raised here
    df = _convert_by_rdd(spark, refs, _owner_addresses(refs), struct)
    with _lock:
        _held[id(df)] = (df, refs)
    return df


def _owner_addresses(refs: list) -> list:
    """Each object's owner address, what RayDP's ``get_locations`` gives (the executors'
    preferred locations), without its ``ray.worker.global_worker``: Ray logs a
    DeprecationWarning on the driver's terminal the first time that name is used."""
    core_worker = ray._private.worker.global_worker.core_worker
    return [core_worker.get_owner_address(ref) for ref in refs]


def release_df(df: DataFrame) -> bool:
    """Let go of the Ray objects behind ``df``, a DataFrame of ``read_topic_df`` (or
    ``dataset_to_df``), so Ray's object store can free them. Afterwards ``df`` and every
    DataFrame derived from it can no longer be computed, except from what Spark cached
    (``df.cache()`` before the first action). True when ``df`` held objects; False when it
    was released already or is not one of these (a DataFrame derived from it, say).
    ``stop_spark()`` releases every one."""
    with _lock:
        return _held.pop(id(df), None) is not None


def held_dfs() -> int:
    """How many DataFrames of ``read_topic_df`` hold Ray objects in this process."""
    with _lock:
        return len(_held)


@ray.remote(num_cpus=0, num_returns=2)
def _arrow_ipc(block: pa.Table) -> tuple[bytes, int]:
    """One block as Arrow IPC stream bytes (a Python bytes object is what Java can read),
    and its row count (small: waiting on it does not fetch the data)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, block.schema) as writer:
        writer.write_table(block)
    return sink.getvalue().to_pybytes(), block.num_rows


def _spark_offsets(value, name: str):
    """Spark's JSON offsets (``{"topic": {"0": 23}}``, -2 earliest, -1 latest) as
    read_topic's ``{topic: {0: 23}}``; anything else as it is (read_topic checks it)."""
    if not (isinstance(value, str) and value.lstrip().startswith("{")):
        return value
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise IllegalArgumentError(f"{name} is not valid JSON offsets ({exc}): {value!r}") \
            from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise IllegalArgumentError(f"{name} as JSON must be {{topic: {{partition: offset}}}}, "
                                   f"got {value!r}")
    out = {}
    for topic, parts in parsed.items():
        out[topic] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise IllegalArgumentError(f"{name}: partition {p!r} of topic {topic!r} is not "
                                           f"an integer") from None
            if not isinstance(off, int) or isinstance(off, bool) or off < -2:
                raise IllegalArgumentError(f"{name}: offset of {topic}-{p} must be an int "
                                           f">= 0, -1 (latest) or -2 (earliest), got {off!r}")
            out[topic][partition] = {-2: "earliest", -1: "latest"}.get(off, off)
    return out


# -- writing -----------------------------------------------------------------------------------

_BYTES_TYPES = (T.BinaryType, T.StringType, T.NullType)
_INT_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
#: The columns write_topic_df passes on (others, such as topic or offset, are dropped).
WRITE_COLUMNS = ("value", "key", "partition", "headers", "timestamp")


def write_topic_df(df, cluster, topic: str, *, acks="all", producer_config: dict | None = None,
                   concurrency: int | None = None, ray_remote_args: dict | None = None
                   ) -> dict[int, int]:
    """Produce every row of the Spark DataFrame ``df`` to ``topic``; returns
    ``{partition: records written}``.

    Columns as Spark's Kafka sink takes them: ``value`` (binary or string, required),
    ``key`` (binary or string), ``partition`` (int; null: the producer's partitioner),
    ``headers`` (array<struct<key: string, value: binary>>, what read_topic_df gives, or
    map<string, binary>; string values allowed) and, unlike Spark's sink, ``timestamp``
    (timestamp, or long milliseconds; null: now). Other columns (a ``topic`` column
    too: ``topic`` names where everything goes) are not sent.

    The DataFrame becomes a Ray Dataset through RayDP (``ray.data.from_spark``: Spark
    computes it and caches its partitions as Arrow in the executors, Ray tasks fetch them)
    and is written with ``jobs.data.write_topic`` (``acks``, ``producer_config``,
    ``concurrency``, ``ray_remote_args`` as there). Delivery is at least once.

    Raises IllegalArgumentError (``df`` not a DataFrame, no ``value`` column, a column of a
    type not listed), UnknownTopicOrPartitionError (a partition the topic does not have, or
    an unknown topic the brokers do not create: as write_topic), InvalidConfigurationError (bad ``acks`` / ``producer_config``): the schema,
    the topic and the config are checked before Spark computes anything.
    """
    if not isinstance(df, DataFrame):
        raise IllegalArgumentError(f"write_topic_df takes a Spark DataFrame, got "
                                   f"{type(df).__name__}")
    if not isinstance(topic, str) or not topic:
        raise IllegalArgumentError(f"topic must be a non-empty str, got {topic!r}")
    columns = check_write_df_schema(df.schema)
    if producer_config is not None and not isinstance(producer_config, dict):
        raise InvalidConfigurationError(f"producer_config must be a dict, got "
                                        f"{type(producer_config).__name__}")
    cluster = _as_cluster(cluster)
    producer = cluster.producer(**{**(producer_config or {}), "acks": acks})
    try:
        producer.partitions_for(topic)          # UnknownTopicOrPartitionError, before Spark
    finally:
        producer.close()
    out = df.select(*[_headers_as_json(df.schema["headers"].dataType) if c == "headers"
                      else F.col(c) for c in columns])
    if out.rdd.getNumPartitions() == 0:         # RayDP's bridge fails on no partitions
        return {}
    from raydp.spark import release_spark_recoverable, spark_dataframe_to_ray_dataset
    try:
        # RayDP's bridge itself: ray.data.from_spark passes it its parallelism, whose default
        # (None) Ray Data logs as a use of the deprecated argument
        with _no_sql_ctx_warning():
            ds = spark_dataframe_to_ray_dataset(out)
        if "headers" in columns:
            ds = ds.map_batches(_headers_from_json, batch_format="pyarrow", batch_size=None)
        return write_topic(ds, cluster, topic, acks=acks, producer_config=producer_config,
                           concurrency=concurrency, ray_remote_args=ray_remote_args)
    finally:
        with _no_sql_ctx_warning():
            release_spark_recoverable(out)      # unpersist the Arrow copy in the executors


@contextlib.contextmanager
def _no_sql_ctx_warning():
    """RayDP reads ``DataFrame.sql_ctx``, which PySpark 3.5 warns about at every call (a
    UserWarning about RayDP's code, not the user's): left out, other warnings kept."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"DataFrame\.sql_ctx is an internal",
                                category=UserWarning)
        yield


def check_write_df_schema(schema: T.StructType) -> list[str]:
    """The columns of ``schema`` that ``write_topic_df`` sends, in WRITE_COLUMNS order;
    IllegalArgumentError for a missing ``value`` or a column of a type it does not take."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise IllegalArgumentError(
            f"write_topic_df needs a 'value' column (binary or string), and optionally key, "
            f"partition, headers, timestamp; the DataFrame has columns {list(fields)}")
    for name in ("value", "key"):
        if name in fields and not isinstance(fields[name], _BYTES_TYPES):
            raise IllegalArgumentError(f"column {name!r} must be binary or string, got "
                                       f"{fields[name].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], (*_INT_TYPES, T.NullType)):
        raise IllegalArgumentError(f"column 'partition' must be an integer, got "
                                   f"{fields['partition'].simpleString()}")
    if "timestamp" in fields and not isinstance(
            fields["timestamp"], (T.TimestampType, T.TimestampNTZType, T.NullType, *_INT_TYPES)):
        raise IllegalArgumentError(f"column 'timestamp' must be a timestamp or long "
                                   f"milliseconds, got {fields['timestamp'].simpleString()}")
    if "headers" in fields and not _spark_headers_type(fields["headers"]):
        raise IllegalArgumentError(
            f"column 'headers' must be array<struct<key: string, value: binary>> or "
            f"map<string, binary> (string values allowed), got "
            f"{fields['headers'].simpleString()}")
    return [name for name in WRITE_COLUMNS if name in fields]


def _headers_as_json(t) -> Column:
    """The ``headers`` column as JSON text, ``[{"key": k, "value": base64}]`` (null stays
    null), which ``_headers_from_json`` turns back into Arrow on the Ray side.

    Nested columns do not cross RayDP's Spark -> Ray bridge reliably: Spark's Arrow writer
    gives a list or map column whose child has no values (every header list of a partition
    empty or null) zero-length buffers, which Ray's Arrow serialiser then rejects ("Buffer
    #1 too small in array of type int32 ..."; outside tests Ray falls back to Arrow IPC with
    a warning, in tests it raises). Flat columns cross fine."""
    col = F.col("headers")
    if isinstance(t, T.NullType):
        return F.lit(None).cast("string").alias("headers")
    if isinstance(t, T.MapType):
        col = F.map_entries(col)
    col = F.transform(col, lambda h: F.struct(h["key"].alias("key"),
                                              h["value"].cast("binary").alias("value")))
    return F.to_json(col).alias("headers")


_HEADERS_ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _headers_from_json(batch: pa.Table) -> pa.Table:
    """``_headers_as_json``'s text back as list<struct<key: string, value: binary>>."""
    out = []
    for text in batch.column("headers").to_pylist():
        if text is None:
            out.append(None)
            continue
        out.append([{"key": h.get("key"),
                     "value": None if h.get("value") is None else base64.b64decode(h["value"])}
                    for h in json.loads(text)])
    index = batch.schema.get_field_index("headers")
    return batch.set_column(index, pa.field("headers", _HEADERS_ARROW),
                            pa.array(out, _HEADERS_ARROW))


def _spark_headers_type(t) -> bool:
    if isinstance(t, T.NullType):
        return True
    if isinstance(t, T.MapType):
        key, value = t.keyType, t.valueType
    elif isinstance(t, T.ArrayType) and isinstance(t.elementType, T.StructType):
        fields = {f.name: f.dataType for f in t.elementType.fields}
        if set(fields) != {"key", "value"}:
            return False
        key, value = fields["key"], fields["value"]
    else:
        return False
    return isinstance(key, T.StringType) and isinstance(value, _BYTES_TYPES)
