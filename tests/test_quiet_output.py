"""What raykafka's commands print, run as a user runs them (a subprocess per command): their
own output, none of the internal logs of Ray, Ray Data or Spark (tests/output_helpers.py),
unless --verbose asks for them. The demos' output is checked where they run: in
tests/test_cli.py::test_demo_runs_the_mixed_pipeline_and_counts_every_order_once and
tests/test_cli.py::test_simple_demo_runs_end_to_end_and_again_on_the_same_data_dir."""

from __future__ import annotations

from output_helpers import internal_lines
from test_cli import run_cli


def _blank(text: str) -> bool:
    return not text.strip()


def test_verbose_brings_back_rays_own_lines(tmp_path):
    """`raykafka demo --simple --verbose` shows what Ray logs of its own at start-up
    (Ray's INFO line "Started a local Ray instance"), which the plain command leaves out."""
    out = run_cli(str(tmp_path / "state"), "demo", "--simple", "--verbose", "--records",
                  "2000", timeout=300)
    stderr = out.stderr.decode()
    assert out.returncode == 0, (out.stdout.decode()[-2000:], stderr[-2000:])
    assert "Started a local Ray instance" in stderr
    assert "ray python log" in internal_lines(stderr)


def test_perf_on_an_embedded_cluster_prints_only_its_own_output(tmp_path):
    """`raykafka perf produce --embedded` (a command that starts its own Ray) prints its
    progress and summary and its JSON, none of Ray's own lines."""
    out = run_cli(str(tmp_path / "state"), "perf", "produce", "--embedded", "--topic",
                  "quiet", "--num-records", "20000", "--record-size", "100", "--create",
                  timeout=300)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, (stdout[-2000:], stderr[-2000:])
    assert internal_lines(stdout + "\n" + stderr) == {}
