"""The ``raykafka`` command line.

Errors a user can make print one clear line on stderr and exit non-zero, without a traceback.
Commands are added as the issues that build them land.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from storage.errors import KafkaError

EXIT_USAGE = 2
EXIT_ERROR = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump: the contract for user mistakes
        self.exit(EXIT_USAGE, f"raykafka: error: {message} (see --help)\n")


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cmd_demo(args) -> int:
    from .demo import run
    run(data_dir=args.data_dir, records=args.records)
    return 0


def cmd_perf_storage(args) -> int:
    script = os.path.join(_repo_root(), "benchmarks", "storage_bench.py")
    if not os.path.exists(script):
        raise KafkaError(f"benchmark script not found: {script}")
    cmd = [sys.executable, script] + (["--quick"] if args.quick else [])
    return subprocess.call(cmd)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raykafka", description="A Kafka-design commit log on Ray.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="run the main demo job")
    demo.add_argument("--data-dir", default=None, help="where to keep the demo's data")
    demo.add_argument("--records", type=_positive_int, default=300_000,
                      help="records to write before the crash (default 300000)")
    demo.set_defaults(func=cmd_demo)

    perf = sub.add_parser("perf", help="benchmarks")
    perf_sub = perf.add_subparsers(dest="perf_command", metavar="WHAT", parser_class=_Parser)
    perf_sub.required = True
    ps = perf_sub.add_parser("storage", help="the storage engine benchmark")
    ps.add_argument("--quick", action="store_true", help="a shorter run")
    ps.set_defaults(func=cmd_perf_storage)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KafkaError as exc:
        print(f"raykafka: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("raykafka: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
