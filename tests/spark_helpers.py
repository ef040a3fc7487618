"""The Spark modules' shared Ray and Spark session (test_jobs_spark, test_jobs_streaming).

A RayDP session costs 25-30 s to start on 2 cores and a Ray 5-7 s: ``spark_ray`` starts
both for the first of a run of consecutive modules that use it (conftest puts them next to
each other) and keeps them for the next, stopping them before any other module. Spark
starts in the background, so a module's fixture can start its cluster meanwhile and then
``session()`` waits for it."""

from __future__ import annotations

import os
import threading

import pytest

from actors import raycompat
from cluster_helpers import next_module_uses, ray, stop_ray

APP_NAME = "raykafka-tests"
# Ray's object store for these modules: small, so that a topic larger than it is quick to
# fill (test_a_topic_larger_than_rays_object_store_is_read_without_using_it)
OBJECT_STORE_BYTES = 96 << 20
# `ray job submit` of an example starts a second driver with its own Spark (JVMs,
# executor): over a minute on a loaded 2-core machine, so it runs only when asked for
JOB_SUBMIT = os.environ.get("RAYKAFKA_TEST_JOB_SUBMIT") == "1"


class SharedSpark:
    """The Spark session being started (or started) on the shared Ray."""

    def __init__(self):
        self.spark = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, daemon=True, name="spark-start")
        self.thread.start()

    def _start(self) -> None:
        """The session, warmed up: its executor has run a job and read a block from Ray's
        object store (the first of each takes seconds)."""
        try:
            import pyarrow as pa

            from jobs.spark import dataset_to_df, spark_session
            session = spark_session(app_name=APP_NAME)
            session.range(1).count()
            warm = ray.data.from_arrow(pa.table({"value": [b"warm"]}))
            assert dataset_to_df(session, warm, warm.schema().base_schema).count() == 1
            self.spark = session
        except BaseException as exc:  # noqa: BLE001 - re-raised by session()
            self.error = exc

    def session(self, timeout_s: float = 600.0):
        self.thread.join(timeout=timeout_s)
        if self.error is not None:
            raise self.error
        assert self.spark is not None, f"the Spark session did not start within {timeout_s} s"
        return self.spark


_shared: SharedSpark | None = None


@pytest.fixture(scope="module")
def spark_ray(request) -> SharedSpark:
    """A private local Ray (4 logical CPUs: the Spark executor holds one, Ray Data's read
    tasks and a submitted or killed example's own executor need the others; the dashboard
    only with RAYKAFKA_TEST_JOB_SUBMIT=1) and a Spark session on it, kept for the next
    module that uses this fixture."""
    global _shared
    if _shared is None:
        raycompat.init_local(APP_NAME, num_cpus=4, dashboard=JOB_SUBMIT,
                             object_store_memory=OBJECT_STORE_BYTES)
        ray.data.DataContext.get_current().enable_progress_bars = False
        _shared = SharedSpark()
    yield _shared
    if not next_module_uses(request, "spark_ray"):
        from jobs.spark import stop_spark
        _shared.thread.join(timeout=600)
        _shared = None
        stop_spark()
        stop_ray()
