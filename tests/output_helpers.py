"""What counts as the internal logs of Ray, Ray Data and Spark in a command's output: the lines
raykafka's commands leave out unless --verbose (docs/cli.md, "Output and --verbose")."""

import re

#: One pattern per kind of line, each found in the output of `raykafka demo` before issue 20.
INTERNAL_PATTERNS = {
    # Ray's and Ray Data's Python loggers: "2026-11-25 23:41:45,311\tINFO worker.py:2038 -- "
    "ray python log": re.compile(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO|WARNING) \S+:\d+ -- ", re.M),
    # Ray's C++ log: "[2026-11-25 23:42:42,739 I 7931 8004] gcs_client.cc:96: ..."
    "ray c++ log": re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIW] \d+ \d+\]", re.M),
    # Spark's log4j: "26/11/25 23:42:37 WARN NativeCodeLoader: ..."
    "spark log": re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARN) ", re.M),
    "log4j2 status": re.compile(r"StatusConsoleListener"),
    "spark default profile": re.compile(r"Setting default log level|sc\.setLogLevel"),
    "raylet worker count": re.compile(r"worker processes have been started"),
    "ray deprecation": re.compile(r"DeprecationWarning"),
}


def internal_lines(text: str) -> dict[str, list[str]]:
    """{kind: the lines of ``text`` of that kind}, only kinds found."""
    found = {}
    for kind, pattern in INTERNAL_PATTERNS.items():
        lines = [line for line in text.splitlines() if pattern.search(line)]
        if lines:
            found[kind] = lines[:3]
    return found
