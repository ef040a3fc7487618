"""Operator tools: the ``raykafka`` command line, its background daemon, the demos and perf."""
