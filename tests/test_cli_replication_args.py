"""`raykafka reassign` and `raykafka elect-leaders` refuse wrong arguments and bad plan
files with one stderr line and a non-zero exit, before contacting any cluster (none runs
here: a private, empty state dir)."""

from __future__ import annotations

import json

import pytest

from test_cli import assert_one_line_error, run_cli


def plan_file(tmp_path, body) -> str:
    path = tmp_path / "plan.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


def entry(topic="t", partition=0, replicas=(1, 2), **extra):
    return {"topic": topic, "partition": partition, "replicas": list(replicas), **extra}


@pytest.mark.parametrize("body, code, needle", [
    (None, 2, "cannot read"),
    ("{not json", 2, "is not JSON"),
    ([entry()], 2, "is not a reassignment plan"),
    ({"version": 1, "partitions": [entry(replicas=(1, 1))]}, 1,
     "InvalidReplicaAssignmentError"),
    ({"version": 1, "partitions": [entry(), entry()]}, 1, "InvalidReplicaAssignmentError"),
    ({"version": 1, "partitions": [entry(replicas=())]}, 1, "InvalidReplicaAssignmentError"),
    ({"version": 1, "partitions": [entry(topic="bad name")]}, 1, "InvalidTopicError"),
    ({"version": 1, "partitions": [entry(partition="0")]}, 1, "IllegalArgumentError"),
    ({"version": 3, "partitions": [entry()]}, 1, "IllegalArgumentError"),
])
def test_a_bad_plan_file_is_one_line_and_non_zero(tmp_path, body, code, needle):
    """Each bad plan (missing, not JSON, wrong shape, duplicate or empty replicas, a
    partition listed twice, a bad topic name or type, an unknown version) gets its one-line
    error: exit 2 for an unreadable file, 1 with the typed error's name otherwise."""
    path = str(tmp_path / "missing.json") if body is None else plan_file(tmp_path, body)
    out = run_cli(str(tmp_path / "state"), "reassign", path, "--namespace", "nothing-here",
                  timeout=120)
    assert_one_line_error(out, code, needle)


@pytest.mark.parametrize("args, code, needle", [
    (("reassign",), 2, "PLAN.json"),
    (("reassign", "a.json", "b.json"), 2, "unrecognized arguments"),
    (("reassign", "a.json", "--timeout", "0"), 2, "positive"),
    (("elect-leaders", "--topic", "bad name"), 1, "InvalidTopicError"),
    (("elect-leaders", "--topic"), 2, "expected one argument"),
    (("elect-leaders", "extra"), 2, "raykafka elect-leaders: error: unrecognized arguments"),
    (("topics", "delete", "t", "--yes"), 2,
     "raykafka topics delete: error: unrecognized arguments: --yes (see raykafka topics "
     "delete --help)"),
    (("produce", "t", "--linger-ms", "-1"), 2, "argument --linger-ms: expected a number >= 0"),
    (("consume", "t", "--max-messages", "0"), 2, "argument --max-messages"),
])
def test_wrong_arguments_are_one_line_and_non_zero(tmp_path, args, code, needle):
    """Missing or extra arguments, a bad count or --timeout and a bad --topic are one-line
    errors, before any cluster is looked for."""
    out = run_cli(str(tmp_path / "state"), *args, "--namespace", "nothing-here", timeout=120)
    assert_one_line_error(out, code, needle)


def test_a_valid_plan_without_a_cluster_says_no_cluster_runs(tmp_path):
    """A valid plan gets past the checks and fails on the missing cluster, in one line."""
    path = plan_file(tmp_path, {"version": 1, "partitions": [entry()]})
    out = run_cli(str(tmp_path / "state"), "reassign", path, "--namespace", "nothing-here",
                  timeout=120)
    assert_one_line_error(out, 1, "no raykafka cluster runs")


@pytest.mark.parametrize("args, needle", [
    (("--wait-workers", "-1"), "expected a number >= 0, got '-1'"),
    (("--wait-workers", "two"), "expected a number >= 0, got 'two'"),
    (("--wait-workers", "2"), "--wait-workers waits for the worker nodes of the Ray given "
                              "with --ray-address"),
])
def test_start_wait_workers_needs_a_count_and_a_ray_address(tmp_path, args, needle):
    """`start --wait-workers` (cluster.yaml's head command) refuses a negative or non-number
    count, and a count without --ray-address, in one line before starting anything."""
    out = run_cli(str(tmp_path), "start", *args, timeout=60)
    assert_one_line_error(out, 2, needle)
