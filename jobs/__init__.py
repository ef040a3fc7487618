"""Spark (RayDP) and Ray Data readers/writers, example pipelines and perf tools.
Uses only raykafka's public API."""
