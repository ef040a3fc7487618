#!/usr/bin/env python3
"""Jobs benchmark (issues 10, 24): Ray Data and Spark reading and writing topics, against
the same records in Parquet and one consumer loop, measured in the same run.

One run on a private local Ray (127.0.0.1, ``--num-cpus`` CPUs), an embedded ZooKeeper
and a 3-broker cluster, one 6-partition topic of 100-byte values. In this order:

1. ``write_topic_records_per_s``: ``jobs.data.write_topic`` of a materialised Ray Dataset
   of N records (value only, acks=all, RF=1) into the topic; the dataset is built and
   materialised before the clock starts.
2. ``iter_columns_records_per_s``: the baseline, ``raykafka perf consume``
   (``SimpleConsumer.iter_columns``, one loop in this process, fetches pipelined per
   partition over the brokers' Kafka listeners) of all N records.
3. ``read_topic_records_per_s``: ``jobs.data.read_topic`` of all N records into Arrow
   blocks in Ray's object store (``Dataset.materialize()``), read tasks in parallel
   (from the leader replicas' segment files: all on this machine).
   2 and 3 alternate: a cold pair (``*_cold_*``: read_topic's workers import and attach
   to the cluster), then ``--read-repeat`` warm pairs (default 3) whose medians are the
   figures and the goal, as the Spark queries' is on warm runs (each run in
   ``*_warm_s``).
4. A Parquet copy of the same records in Spark's Kafka source columns (that Dataset
   through ``jobs.spark.to_spark_block``, ``write_parquet``; not a goal), then the
   Dataset is dropped (its blocks leave the object store).
5. Spark (RayDP, one executor of one core): four queries, each through ``read_topic_df``
   (its JVM reader unless ``--spark-reader python``; ``spark_reader`` says which read)
   and over the Parquet copy: ``count()``, ``groupBy("partition").count()``,
   ``sum(length(value))`` and a ``noop`` write (every column computed, nothing stored).
   Each is run once cold (``spark_<query>_cold_s``, ``spark_parquet_<query>_cold_s``: the
   first time in the session) and ``--repeat`` times warm (``spark_<query>_s``,
   ``spark_parquet_<query>_s``: the median), topic and Parquet alternating.

Goals (issue 24): every warm Spark query through the topic within 2 x the same query
over Parquet; read_topic >= 1.0 x iter_columns; write_topic >= 1,000,000 records/s (with
``--no-spark`` the Spark goals are null in ``goals``, "not run" in the table). A
phase that fails is reported (``<phase>_error``) and the run goes on, so the last line is
always one JSON object; figures go to stderr as a table, with the load average.

    python benchmarks/jobs_bench.py              # 10M records (303-465 s at load 9-130)
    python benchmarks/jobs_bench.py --quick      # 2M records (155 s at load 3-24)
    python benchmarks/jobs_bench.py --no-spark --num-cpus 4   # read_topic's scaling

Nothing outside this run is touched: the Ray it starts is its own and ends with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import actors  # noqa: E402,F401  (sets Ray's environment before Ray is imported)
from benchmarks.common import bench_cluster, finish, phase, ratio, say  # noqa: E402

GOAL_READ_VS_ITER_COLUMNS = 1.0
GOAL_WRITE_RECORDS_PER_S = 1_000_000
GOAL_SPARK_VS_PARQUET = 2.0
TOPIC = "jobs-bench"
QUERIES = ("count", "groupby", "sum_value_length", "noop")


def _values(batch, size: int):
    import numpy as np
    import pyarrow as pa
    ids = batch["id"]
    n = len(ids)
    raw = np.full((n, size), ord("x"), dtype=np.uint8)
    digits = np.char.zfill(ids.astype(str), 12).astype("S12").view(np.uint8).reshape(n, 12)
    raw[:, :12] = digits
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                    pa.py_buffer(raw.tobytes())])
    return pa.table({"value": values})


def write(cluster, records: int, size: int) -> dict:
    import ray

    from jobs.data import write_topic
    blocks = max(12, records // 250_000)
    ds = (ray.data.range(records, override_num_blocks=blocks)
          .map_batches(_values, fn_kwargs={"size": size}, batch_format="numpy",
                       batch_size=None)
          .materialize())
    t0 = time.perf_counter()
    counts = write_topic(ds, cluster, TOPIC, acks="all")
    elapsed = time.perf_counter() - t0
    written = sum(counts.values())
    if written != records:
        raise RuntimeError(f"write_topic wrote {written} of {records} records")
    return {"write_topic_records_per_s": round(records / elapsed),
            "write_topic_s": round(elapsed, 2), "write_topic_blocks": blocks}


def _iter_columns_once(cluster, records: int) -> float:
    from actors.tools import perf
    result = perf.consume(cluster, TOPIC, num_records=records, progress=False)
    if result["records"] != records:
        raise RuntimeError(f"perf consume read {result['records']} of {records} records")
    return result["elapsed_s"]


def _read_topic_once(cluster, records: int, state: dict) -> float:
    from jobs.data import read_topic
    state.pop("dataset", None)                  # the last run's blocks leave the store
    t0 = time.perf_counter()
    ds = read_topic(cluster, TOPIC).materialize()
    elapsed = time.perf_counter() - t0
    got = ds.count()
    if got != records:
        raise RuntimeError(f"read_topic read {got} of {records} records")
    state["dataset"] = ds                       # kept for the Parquet copy
    return elapsed


def reads(cluster, records: int, state: dict, warm: int) -> dict:
    """The baseline loop (``iter_columns``) and ``read_topic`` alternated: a cold pair
    (``_cold``: read_topic's workers import and attach) then ``warm`` pairs, whose medians
    are the figures (the single runs in ``*_warm_s``): on this shared 2-core machine one
    run of either moves by a quarter between runs."""
    out = {"iter_columns_cold_s": _iter_columns_once(cluster, records),
           "read_topic_cold_s": _read_topic_once(cluster, records, state)}
    runs: dict[str, list[float]] = {"iter_columns": [], "read_topic": []}
    for _ in range(warm):
        runs["iter_columns"].append(_iter_columns_once(cluster, records))
        runs["read_topic"].append(_read_topic_once(cluster, records, state))
    for name, times in runs.items():
        median = statistics.median(times)
        out.update({f"{name}_s": round(median, 3),
                    f"{name}_records_per_s": round(records / median),
                    f"{name}_warm_s": [round(t, 3) for t in times],
                    f"{name}_cold_records_per_s": round(records / out[f"{name}_cold_s"])})
        out[f"{name}_cold_s"] = round(out[f"{name}_cold_s"], 3)
    out["read_topic_blocks"] = state["dataset"].num_blocks()
    return out


def parquet_copy(state: dict, path: str) -> dict:
    from jobs.spark import to_spark_block
    t0 = time.perf_counter()
    ds = state.pop("dataset")
    ds.map_batches(to_spark_block, batch_format="pyarrow", batch_size=None,
                   zero_copy_batch=True).write_parquet(path)
    del ds                                  # its blocks leave the object store
    return {"parquet_write_s": round(time.perf_counter() - t0, 2),
            "parquet_MB": round(sum(os.path.getsize(os.path.join(d, f))
                                    for d, _, fs in os.walk(path) for f in fs) / 1e6, 1)}


def _query(name: str, df):
    """Run query ``name`` on ``df``; what it answers (checked against ``_expected``)."""
    if name == "count":
        return df.count()
    if name == "groupby":
        return sum(row["count"] for row in df.groupBy("partition").count().collect())
    if name == "sum_value_length":
        return df.selectExpr("sum(length(value)) AS n").collect()[0]["n"]
    if name == "noop":
        df.write.format("noop").mode("overwrite").save()
        return None
    raise ValueError(name)


def _expected(name: str, records: int, size: int):
    return {"count": records, "groupby": records, "sum_value_length": records * size,
            "noop": None}[name]


def spark(cluster, records: int, size: int, path: str, executor_memory: str,
          repeat: int) -> dict:
    from jobs.spark import read_topic_df, spark_session
    t0 = time.perf_counter()
    session = spark_session(app_name="raykafka-jobs-bench", executor_memory=executor_memory)
    session.range(1).count()                         # the executor up and warm
    out = {"spark_start_s": round(time.perf_counter() - t0, 1)}
    plan = read_topic_df(session, cluster, TOPIC)._jdf.queryExecution().executedPlan()
    out["spark_reader"] = "jvm" if "RaykafkaScan" in plan.toString() else "python"
    sources = {"spark": lambda: read_topic_df(session, cluster, TOPIC),
               "spark_parquet": lambda: session.read.parquet(path)}

    def run(source: str, name: str) -> float:
        t = time.perf_counter()
        got = _query(name, sources[source]())        # the DataFrame made inside the clock
        elapsed = time.perf_counter() - t
        want = _expected(name, records, size)
        if got != want:
            raise RuntimeError(f"{source} {name}: got {got}, expected {want}")
        return elapsed

    for name in QUERIES:
        for source in sources:
            out[f"{source}_{name}_cold_s"] = round(run(source, name), 2)
        warm: dict = {source: [] for source in sources}
        for _ in range(repeat):
            for source in sources:
                warm[source].append(run(source, name))
        for source, times in warm.items():
            out[f"{source}_{name}_s"] = round(statistics.median(times), 2)
        say(f"  {name}: topic {out[f'spark_{name}_s']}s, Parquet "
            f"{out[f'spark_parquet_{name}_s']}s (warm)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000,000 records")
    ap.add_argument("--records", type=int, default=None,
                    help="records in the topic (default 10,000,000; --quick 2,000,000)")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--num-cpus", type=int, default=None,
                    help="CPUs of the Ray the run starts (default: the machine's)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="warm runs of each Spark query (the median is reported)")
    ap.add_argument("--read-repeat", type=int, default=3,
                    help="warm runs of iter_columns and read_topic, alternated (the medians "
                         "are reported)")
    ap.add_argument("--executor-memory", default="2g", help="Spark executor memory")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark phases")
    ap.add_argument("--spark-reader", choices=("auto", "jvm", "python"), default=None,
                    help="read_topic_df's reader (RAYKAFKA_SPARK_READER; default: auto, the "
                         "JVM reader when it can)")
    a = ap.parse_args()
    records = a.records or (2_000_000 if a.quick else 10_000_000)
    if records < 1 or a.record_size < 12 or a.partitions < 1 or a.brokers < 1 \
            or a.repeat < 1 or a.read_repeat < 1 or (a.num_cpus is not None and a.num_cpus < 1):
        ap.error("--records, --partitions, --brokers, --repeat, --read-repeat and --num-cpus "
                 "must be >= 1, --record-size >= 12")
    if a.spark_reader is not None:
        from jobs.spark import READER_ENV
        os.environ[READER_ENV] = a.spark_reader
    from actors.tools import perf
    from jobs.quiet import quiet_ray_data
    t_start = time.perf_counter()
    out: dict = {"brokers": a.brokers, "partitions": a.partitions,
                 "record_size": a.record_size, "records": records,
                 "load_average_start": _load()}
    state: dict = {}
    ray_kwargs = {} if a.num_cpus is None else {"num_cpus": a.num_cpus}
    with bench_cluster("jobs-bench", a.brokers, **ray_kwargs) as (cluster, work):
        import ray
        quiet_ray_data()
        out["ray_cpus"] = int(ray.cluster_resources().get("CPU", 0))
        parquet = os.path.join(work, "parquet")
        out["cluster_start_s"] = round(time.perf_counter() - t_start, 1)
        cluster.admin().create_topic(TOPIC, partitions=a.partitions, replication_factor=1,
                                     config=dict(perf.PERF_TOPIC_CONFIG))
        try:
            phase(out, "write_topic", write, cluster, records, a.record_size)
            if "write_topic_error" not in out:
                phase(out, "reads", reads, cluster, records, state, a.read_repeat)
                if "dataset" in state:
                    phase(out, "parquet", parquet_copy, state, parquet)
                if a.no_spark:
                    out["spark_skipped"] = True
                elif "parquet_write_s" in out:
                    phase(out, "spark", spark, cluster, records, a.record_size, parquet,
                          a.executor_memory, a.repeat)
        finally:
            state.clear()
            from jobs.spark import stop_spark
            stop_spark()
    out["load_average_end"] = _load()
    return finish(out, t_start, _goals, _table)


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages (``uptime``'s)."""
    return [round(x, 2) for x in os.getloadavg()]


def _goals(out: dict) -> None:
    read, base = out.get("read_topic_records_per_s"), out.get("iter_columns_records_per_s")
    write = out.get("write_topic_records_per_s")
    out["read_topic_vs_iter_columns"] = ratio(read, base)
    goals = {
        "read_topic_vs_iter_columns": out["read_topic_vs_iter_columns"] is not None
        and out["read_topic_vs_iter_columns"] >= GOAL_READ_VS_ITER_COLUMNS,
        "write_topic_records_per_s": write is not None and write >= GOAL_WRITE_RECORDS_PER_S,
    }
    for name in QUERIES:
        for kind in ("", "_cold"):
            out[f"spark_{name}{kind}_vs_parquet"] = ratio(
                out.get(f"spark_{name}{kind}_s"), out.get(f"spark_parquet_{name}{kind}_s"))
        r = out[f"spark_{name}_vs_parquet"]
        goals[f"spark_{name}_vs_parquet"] = None if out.get("spark_skipped") else \
            r is not None and r <= GOAL_SPARK_VS_PARQUET
    out["goals"] = goals


def _table(out: dict) -> None:
    def fmt(v, spec="{:,.0f}"):
        return "-" if v is None else spec.format(v)

    def mark(key):
        met = out["goals"][key]
        return "not run" if met is None else "met" if met else "MISSED"
    rows = [
        ("write_topic records/s", fmt(out.get("write_topic_records_per_s")),
         f">= {GOAL_WRITE_RECORDS_PER_S:,}: {mark('write_topic_records_per_s')}"),
        ("iter_columns records/s (baseline)", fmt(out.get("iter_columns_records_per_s")), ""),
        ("read_topic records/s", fmt(out.get("read_topic_records_per_s")), ""),
        ("read_topic / iter_columns", fmt(out.get("read_topic_vs_iter_columns"), "{:.2f}"),
         f">= {GOAL_READ_VS_ITER_COLUMNS}: {mark('read_topic_vs_iter_columns')}"),
        ("  cold, records/s",
         f"{fmt(out.get('read_topic_cold_records_per_s'))} / "
         f"{fmt(out.get('iter_columns_cold_records_per_s'))} "
         f"({fmt(ratio(out.get('read_topic_cold_records_per_s'), out.get('iter_columns_cold_records_per_s')), '{:.2f}')})", ""),
    ]
    for name in QUERIES:
        rows.append((f"Spark {name} s: topic / Parquet",
                     f"{fmt(out.get(f'spark_{name}_s'), '{:.2f}')} / "
                     f"{fmt(out.get(f'spark_parquet_{name}_s'), '{:.2f}')} "
                     f"({fmt(out.get(f'spark_{name}_vs_parquet'), '{:.1f}')}x)",
                     f"<= {GOAL_SPARK_VS_PARQUET}x: {mark(f'spark_{name}_vs_parquet')}"))
        rows.append(("  cold", f"{fmt(out.get(f'spark_{name}_cold_s'), '{:.2f}')} / "
                     f"{fmt(out.get(f'spark_parquet_{name}_cold_s'), '{:.2f}')} "
                     f"({fmt(out.get(f'spark_{name}_cold_vs_parquet'), '{:.1f}')}x)", ""))
    for what, value, goal in rows:
        say(f"{what:<36}{value:>26}   {goal}")
    for key in sorted(k for k in out if k.endswith("_error")):
        say(f"{key}: {out[key]}")
    say(f"whole run {out['elapsed_s']}s on {out.get('ray_cpus')} Ray CPUs; load average "
        f"{out['load_average_start']} at the start, {out['load_average_end']} at the end")


if __name__ == "__main__":
    sys.exit(main())
