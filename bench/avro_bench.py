"""Avro ingest through a schema registry, against Structured Streaming's ``from_avro`` and Tidemark's JSON.

A throwaway broker and registry (the embedded Apicurio Registry). One topic gets
``--records`` Avro values of about 1 KB in Confluent's framing: a 20-field record, written
with three versions of its subject interleaved (v2 adds a field with a default, v3 another
and widens an int to a long). A second topic gets the same records as JSON. Side by side in
one session, order rotating over ``--reps``:

* ``tidemark-avro``: ``format: avro`` — each record decoded with its own writer schema
  into v3, every guarantee on (intent ledger, one Delta commit per batch with its offsets);
* ``structured-streaming-avro``: ``readStream.format("kafka")`` → ``from_avro`` of
  ``substring(value, 6)`` with one fixed schema (v3, PERMISSIVE: v1 and v2 records decode
  wrongly, as such a job's would) → ``writeStream.format("delta")``, AvailableNow;
* ``tidemark-json``: Tidemark's JSON ingest of the same records.

Each Tidemark run is checked: every record once, every field decoded. Reported: records/s
per run, medians, and the ratios Avro / Structured Streaming and Avro / JSON.

    .venv/bin/python -m bench.avro_bench --reps 2 --json docs/bench/avro.json --png docs/bench/avro.png
    .venv/bin/python -m bench.avro_bench --records 50000 --reps 1
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import statistics
import struct
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.ingest_bench import PARTITIONS, new_topic

_BASE = [("order_id", "string"), ("customer", "string"), ("amount", "double"), ("currency", "string"),
         ("qty", "int"), ("sku", "string"), ("warehouse", "string"), ("status", "string"), ("priority", "int"),
         ("discount", "double"), ("tax", "double"), ("country", "string"), ("city", "string"),
         ("street", "string"), ("zip", "string"), ("email", "string"), ("phone", "string"), ("note", "string")]
V1: dict[str, Any] = {"type": "record", "name": "Order", "fields": [{"name": n, "type": t} for n, t in _BASE]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
V3: dict[str, Any] = {**V2, "fields": [{**f, "type": "long"} if f["name"] == "qty" else f for f in V2["fields"]]
                      + [{"name": "region", "type": "string", "default": "eu"}]}
#: Spark DDL of v3, for the JSON pipeline.
DDL = ", ".join(f"{f['name']} {({'string': 'STRING', 'double': 'DOUBLE', 'int': 'INT', 'long': 'BIGINT'})[f['type']]}"
                for f in V3["fields"])


def _record(rng: random.Random, i: int, version: int, value_bytes: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "order_id": f"o-{i}", "customer": f"c-{rng.randrange(10_000)}", "amount": round(rng.uniform(1, 500), 2),
        "currency": "EUR", "qty": rng.randrange(1, 20), "sku": f"sku-{rng.randrange(1000)}", "warehouse": "w-3",
        "status": "new", "priority": rng.randrange(5), "discount": 0.1, "tax": 0.2, "country": "DE",
        "city": "Berlin", "street": "Unter den Linden 1", "zip": "10117", "email": "a@example.org",
        "phone": "+49 30 1234567", "note": ""}
    if version >= 2:
        record["channel"] = "app"
    if version >= 3:
        record["region"] = "us"
    record["note"] = "x" * max(0, value_bytes - len(json.dumps(record)))
    return record


def produce(bootstrap: str, avro_topic: str, json_topic: str, ids: dict[int, int], records: int,
            value_bytes: int) -> None:
    """The same records to both topics: Confluent-framed Avro (versions interleaved) and JSON."""
    import fastavro
    from confluent_kafka import Producer

    parsed = {v: fastavro.parse_schema(s) for v, s in ((1, V1), (2, V2), (3, V3))}
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.kbytes": 1_048_576})
    producer.init_transactions(30)
    written = 0
    while written < records:
        producer.begin_transaction()
        for _ in range(min(1000, records - written)):
            version = 1 + written % 3
            record = _record(rng, written, version, value_bytes)
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parsed[version], record)
            partition = written % PARTITIONS
            producer.produce(avro_topic, value=struct.pack(">bI", 0, ids[version]) + body.getvalue(),
                             partition=partition)
            full = {**{f["name"]: f.get("default") for f in V3["fields"]}, **record}
            producer.produce(json_topic, value=json.dumps(full).encode(), partition=partition)
            written += 1
            if written % 10_000 == 0:
                producer.poll(0)
        producer.commit_transaction(60)
    producer.flush(60)


def register(url: str, subject: str, schema: dict[str, Any]) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return int(SchemaRegistryClient({"url": url}).register_schema(subject, Schema(json.dumps(schema), "AVRO")))


def run_tidemark(spark: Any, bootstrap: str, topic: str, target: Path, registry: str, fmt: str) -> int:
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    pipeline: dict[str, Any] = {"name": "bench", "topics": [topic], "target": str(target), "format": fmt,
                                "transactions": {"atomic": False}}
    if fmt == "json":
        pipeline["schema"] = DDL
    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "schema_registry": {"url": registry},
                           "pipelines": [pipeline]})
    return IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded().rows


def run_structured_streaming(spark: Any, bootstrap: str, topic: str, target: Path) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from connectors.kafka_config import spark_options
    from tidemark.config import KafkaConnection

    raw = (spark.readStream.format("kafka").options(**spark_options(KafkaConnection(bootstrap_servers=bootstrap),
                                                                    bootstrap))
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
    body = F.expr("substring(value, 6, length(value) - 5)")
    rows = raw.select(from_avro(body, json.dumps(V3), {"mode": "PERMISSIVE"}).alias("p"),
                      "topic", "partition", "offset").select("p.*", F.col("topic").alias("_kafka_topic"),
                                                             F.col("partition").alias("_kafka_partition"),
                                                             F.col("offset").alias("_kafka_offset"))
    query = (rows.writeStream.format("delta").option("checkpointLocation", f"{target}_checkpoint")
             .trigger(availableNow=True).start(str(target)))
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"structured streaming failed: {query.exception()}")
    return int(spark.read.format("delta").load(str(target)).count())


def verify(spark: Any, target: Path, expected: int) -> None:
    """Every record once, every field decoded (v1's records with v2's and v3's defaults)."""
    stats = (spark.read.format("delta").load(str(target))
             .selectExpr("count(*) AS n", "count(DISTINCT _kafka_partition, _kafka_offset) AS d",
                         "count(order_id) AS decoded", "count(channel) AS channel", "count(region) AS region")
             .first())
    if not (stats.n == stats.d == stats.decoded == stats.channel == stats.region == expected):
        raise AssertionError(f"{target}: {stats.asDict()}; expected {expected} each")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=2, help="runs per contender, order rotating")
    report_arguments(parser)
    args = parser.parse_args(argv)

    from infra.process import free_port_block
    from infra.registry import EmbeddedRegistry
    from infra.spark import build_session
    from tidemark.settings import load_settings

    load_before = loadavg()
    settings = load_settings()
    work = Path(tempfile.mkdtemp(prefix="tidemark-avro-bench-"))
    registry = EmbeddedRegistry(work / "registry", settings.home_dir, port=free_port_block(2, start=28300),
                                java=settings.registry.java)
    url = registry.start()
    names = ("tidemark-avro", "structured-streaming-avro", "tidemark-json")
    seconds: dict[str, list[float]] = {n: [] for n in names}
    try:
        with kafka_broker() as (bootstrap, broker_version):
            topics = {}
            for use, count in (("warm", min(50_000, args.records)), ("timed", args.records)):
                avro_topic, json_topic = new_topic(bootstrap, f"avro-{use}"), new_topic(bootstrap, f"json-{use}")
                ids = {v: register(url, f"{avro_topic}-value", s) for v, s in ((1, V1), (2, V2), (3, V3))}
                started = time.monotonic()
                produce(bootstrap, avro_topic, json_topic, ids, count, args.value_bytes)
                print(f"produced {count:,} records twice in {time.monotonic() - started:.0f}s", flush=True)
                topics[use] = (avro_topic, json_topic)
            spark = build_session(settings, "tidemark-avro-bench", warehouse=work / "warehouse")
            # Untimed warm-up of each contender on topics of its own: the JIT and the session's first jobs.
            run_tidemark(spark, bootstrap, topics["warm"][0], work / "warm-avro", url, "avro")
            run_structured_streaming(spark, bootstrap, topics["warm"][0], work / "warm-ss")
            run_tidemark(spark, bootstrap, topics["warm"][1], work / "warm-json", url, "json")
            avro_topic, json_topic = topics["timed"]
            for rep in range(args.reps):
                order = names[rep % 3:] + names[:rep % 3]
                for name in order:
                    target = work / f"{name}-{rep}"
                    started = time.monotonic()
                    if name == "structured-streaming-avro":
                        rows = run_structured_streaming(spark, bootstrap, avro_topic, target)
                    else:
                        rows = run_tidemark(spark, bootstrap, avro_topic if name == "tidemark-avro" else json_topic,
                                            target, url, "avro" if name == "tidemark-avro" else "json")
                    took = time.monotonic() - started
                    if rows != args.records:
                        raise AssertionError(f"{name}: {rows} rows, expected {args.records}")
                    if name.startswith("tidemark"):
                        verify(spark, target, args.records)
                    seconds[name].append(took)
                    print(f"rep {rep} {name}: {took:.1f}s, {args.records / took:,.0f} records/s", flush=True)
                    shutil.rmtree(target, ignore_errors=True)
            spark.stop()
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)

    med = {n: statistics.median(s) for n, s in seconds.items()}
    vs_ss = med["structured-streaming-avro"] / med["tidemark-avro"]
    vs_json = med["tidemark-json"] / med["tidemark-avro"]
    lines = header("Avro ingest through a schema registry", load_before)
    lines += ["", (f"Kafka {broker_version}, Apicurio Registry; {args.records:,} records of ~{args.value_bytes} B, "
                  "20 fields, three writer versions interleaved."), "",
              "| contender | runs (s) | median records/s |", "|---|---|---|"]
    lines += [f"| {n} | {', '.join(f'{s:.1f}' for s in seconds[n])} | {args.records / med[n]:,.0f} |" for n in names]
    lines += ["", (f"Avro / Structured Streaming with from_avro: **{vs_ss:.2f}×**; Avro / Tidemark's JSON: "
                  f"**{vs_json:.2f}×**.")]
    emit(lines, args.output)
    emit_json({"benchmark": "avro_bench", "records": args.records, "value_bytes": args.value_bytes,
               "runs_seconds": seconds, "median_seconds": med, "ratio_vs_structured_streaming": vs_ss,
               "ratio_vs_json": vs_json}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
