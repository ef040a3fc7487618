"""Produce throughput on a SASL_SSL listener next to a PLAINTEXT one of the same brokers,
in the same run (issue 23's goal: SASL_SSL >= 0.7x PLAINTEXT): a 3-broker cluster with
``PLAINTEXT`` and ``SASL_SSL`` (SCRAM-SHA-512) listeners, a test CA and certificate made
in a temporary directory, the brokers replicating over the SASL_SSL listener. Per
listener: confluent-kafka (librdkafka's TLS, in C) and raykafka's Producer (Python's ssl
on memory buffers), acks=all, 100-byte records, a 6-partition topic (RF=1 by default).
The two listeners alternate, ``--rounds`` times, so load on the machine falls on both.

Also ``confluent_<listener>_client_cpu_us_per_record`` and ``..._client_writes_per_record``
(per round: this process's CPU, librdkafka's threads included, and its write system calls):
librdkafka writes every buffer segment of a request as a TLS record of its own, one
``write`` each, where a plaintext request goes out in a few ``sendmsg`` calls, and that
client-side cost, not the broker's, is most of what TLS takes from confluent-kafka here
(docs/security.md).

Prints ``<client>_<listener>_records_per_s`` (the best round), ``<client>_round_ratios``
(each round's SASL_SSL / PLAINTEXT, the two measured back to back) and ``<client>_ratio``
(their median: on a shared machine whose load moves between rounds, a round's two runs
see the same load, the best runs of each listener may not) as one JSON line on stdout
(progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.common import bench_cluster, say  # noqa: E402

PARTITIONS = 6
VALUE = b"x" * 100


def _client_cost() -> tuple[float, int]:
    """This process's CPU seconds (every thread: librdkafka's too) and write system calls."""
    with open("/proc/self/io") as f:
        writes = next(int(line.split()[1]) for line in f if line.startswith("syscw:"))
    return time.process_time(), writes


def _confluent(conf: dict, topic: str, n: int, cost: dict | None = None) -> float:
    """Records/s of ``n`` acks=all records; ``cost`` gets the client's CPU microseconds and
    write system calls per record."""
    from confluent_kafka import Producer
    producer = Producer({**conf, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": False})
    for partition in range(PARTITIONS):    # every leader connected (and authenticated) first
        producer.produce(topic, VALUE, partition=partition)
    assert producer.flush(60) == 0, "warm-up records left unsent after 60 s"
    cpu0, writes0 = _client_cost()
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(300) == 0, "records left unsent after 300 s"
    rate = n / (time.perf_counter() - started)
    if cost is not None:
        cpu1, writes1 = _client_cost()
        cost["cpu_us"] = round((cpu1 - cpu0) * 1e6 / n, 2)
        cost["writes"] = round((writes1 - writes0) / n, 4)
    return rate


def _raykafka(cluster, settings: dict, topic: str, n: int) -> float:
    producer = cluster.producer(acks="all", linger_ms=5, **settings)
    try:
        for partition in range(PARTITIONS):    # every leader connected first
            producer.send(topic, VALUE, partition=partition).get(60)
        started = time.perf_counter()
        futures = [producer.send(topic, VALUE, partition=i % PARTITIONS) for i in range(n)]
        producer.flush(120)
        for f in futures[-PARTITIONS:]:
            f.get(60)
        return n / (time.perf_counter() - started)
    finally:
        producer.close()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="per confluent run")
    parser.add_argument("--raykafka-records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rf", type=int, default=1)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(_ROOT, "tests"))
    from security_helpers import make_pki
    pki = make_pki(tempfile.mkdtemp(prefix="raykafka-pki-"))
    password = os.urandom(12).hex()
    config = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
              "inter.broker.listener.name": "SASL_SSL",
              "sasl.jaas.config": f'x required username="broker" password="{password}";',
              "ssl.certificate.location": pki["cert"], "ssl.key.location": pki["key"],
              "ssl.ca.location": pki["ca"]}
    out = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    with bench_cluster("security-bench", 3, config=config) as (cluster, _):
        cluster.admin().create_user("bench", password)
        topic = "security-bench"
        cluster.admin().create_topic(topic, partitions=PARTITIONS, replication_factor=args.rf)
        confluent = {
            "PLAINTEXT": {"bootstrap.servers": cluster.bootstrap_servers_for("PLAINTEXT")},
            "SASL_SSL": {"bootstrap.servers": cluster.bootstrap_servers_for("SASL_SSL"),
                         "security.protocol": "SASL_SSL", "ssl.ca.location": pki["ca"],
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench",
                         "sasl.password": password}}
        ours = {"PLAINTEXT": {},
                "SASL_SSL": {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                             "sasl_plain_username": "bench", "sasl_plain_password": password,
                             "ssl_cafile": pki["ca"]}}
        time.sleep(2)                                   # leaders settled
        ratios: dict = {"confluent": [], "raykafka": []}
        for _ in range(args.rounds):
            for client in ("confluent", "raykafka"):
                rates = {}
                for listener in ("PLAINTEXT", "SASL_SSL"):
                    cost: dict = {}
                    rates[listener] = rate = (
                        _confluent(confluent[listener], topic, args.records, cost)
                        if client == "confluent" else
                        _raykafka(cluster, ours[listener], topic, args.raykafka_records))
                    key = f"{client}_{listener.lower()}_records_per_s"
                    out[key] = max(out.get(key, 0), round(rate))
                    for what, value in cost.items():
                        out.setdefault(f"{client}_{listener.lower()}_client_{what}_per_record",
                                       []).append(value)
                    say(f"{client} {listener}: {rate:,.0f} records/s"
                        + (f" (client: {cost['cpu_us']} us of CPU and {cost['writes']} write "
                           f"calls per record)" if cost else ""))
                ratios[client].append(round(rates["SASL_SSL"] / rates["PLAINTEXT"], 2))
    for client, values in ratios.items():
        out[f"{client}_round_ratios"] = values
        out[f"{client}_ratio"] = statistics.median(values)
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
