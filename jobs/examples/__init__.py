"""Example jobs: each runs with ``python jobs/examples/<name>.py`` (an embedded cluster) or
``ray job submit --working-dir . -- python jobs/examples/<name>.py`` (a running cluster)."""
