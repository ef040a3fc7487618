"""What a raykafka job shows on its terminal: its own output (progress bars, tables, one-line
errors) and the warnings that point at a real problem, not the internal logs of Ray Data and
Spark, unless ``RAYKAFKA_VERBOSE=1`` (what ``raykafka --verbose`` sets; docs/cli.md, "Output
and --verbose").

- Ray's own start-up lines and the raylet's worker-count notices: ``actors`` leaves them out
  when it starts or attaches to Ray (actors/raycompat.py).
- Ray Data: ``quiet_ray_data()`` (the examples call it): no progress display (bars on a
  terminal, an INFO block every 10 s otherwise) and no INFO lines on the console; Ray Data
  still writes everything to its log file (``<Ray session>/logs/ray-data/``), and its
  warnings and errors still reach the console.
- Spark: ``jobs.spark.spark_session`` gives the driver JVM a log4j2 configuration at its
  ``log_level`` (``spark_log4j2_properties``).
"""

from __future__ import annotations

import logging
import os

#: The switch; the same variable as actors' (actors/_rayenv.py), read by name because jobs/
#: imports only the public API of actors/.
VERBOSE_ENV = "RAYKAFKA_VERBOSE"


def verbose() -> bool:
    """True when ``RAYKAFKA_VERBOSE`` asks for the internal logs of Ray and Spark."""
    return os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def quiet_ray_data() -> None:
    """Unless ``verbose()``: this process's Ray Data executions show no progress and no
    INFO lines on the console (warnings and errors still do; the log file keeps all)."""
    if verbose():
        return
    import ray.data
    ray.data.DataContext.get_current().enable_progress_bars = False
    # the one line Ray Data logs when its progress display is off (a WARNING that says how
    # to turn it back on) comes from this module's logger; nothing else is logged there
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    for handler in logging.getLogger("ray.data").handlers:
        if handler.get_name() == "console":     # ray/data/_internal/logging.py DEFAULT_CONFIG
            handler.setLevel(logging.WARNING)


def spark_log4j2_properties(level: str) -> str:
    """A log4j2 configuration for a Spark driver JVM: ``level`` and above on stderr, as
    Spark's own default does, but without its notes on how to change the level, and
    Hadoop's "Unable to load native-hadoop library" (always true here: pure-Java
    fallbacks are what Spark uses) only as an error."""
    return "\n".join([
        "# written by raykafka's jobs.spark.spark_session (jobs/quiet.py)",
        "status = error",
        f"rootLogger.level = {level.lower()}",
        "rootLogger.appenderRef.stderr.ref = console",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
        "logger.hadoop_native.name = org.apache.hadoop.util.NativeCodeLoader",
        "logger.hadoop_native.level = error",
        "",
    ])
