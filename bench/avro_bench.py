"""Avro and Protobuf ingest through a schema registry, against Structured Streaming's ``from_avro`` and Tidemark's JSON.

A throwaway broker and registry (the embedded Apicurio Registry). One topic gets
``--records`` Avro values of about 1 KB in Confluent's framing: a 20-field record, written
with three versions of its subject interleaved (v2 adds a field with a default, v3 another
and widens an int to a long). A second topic gets the same records as JSON, a third as
Protobuf in Confluent's framing, written with three versions of a ``.proto`` subject that
mirror the Avro ones (v2 adds ``channel``, v3 adds ``region`` and widens ``qty`` from int32
to int64; Apicurio's BACKWARD rule refuses that widening for Protobuf, so the subject's
compatibility is set to NONE before v3). Side by side in one session, order rotating over
``--reps``:

* ``tidemark-avro``: ``format: avro`` — each record decoded with its own writer schema
  into v3, every guarantee on (intent ledger, one Delta commit per batch with its offsets);
* ``structured-streaming-avro``: ``readStream.format("kafka")`` → ``from_avro`` of
  ``substring(value, 6)`` with one fixed schema (v3, PERMISSIVE: v1 and v2 records decode
  wrongly, as such a job's would) → ``writeStream.format("delta")``, AvailableNow;
* ``tidemark-json``: Tidemark's JSON ingest of the same records;
* ``tidemark-protobuf``: ``format: protobuf`` — each record parsed with its own writer's
  descriptor and read into v3's message by field number (proto3: a v1 record's ``channel``
  and ``region`` read as ``""``), every guarantee on as for Avro.

Each Tidemark run is checked: every record once, every field decoded (each version's
``channel`` and ``region`` as written or as the reader's default). Reported: records/s per
run, medians, and the throughput ratios Avro / Structured Streaming, Avro / JSON and
Protobuf / Avro, each with its noise band: the smallest and largest ratio of the two
contenders' runs in one round.

    .venv/bin/python -m bench.avro_bench --reps 2 --json docs/bench/avro.json --png docs/bench/avro.png
    .venv/bin/python -m bench.avro_bench --records 20000 --reps 1
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
import urllib.request
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


def _proto(schema: dict[str, Any]) -> str:
    """The ``.proto`` twin of an Avro version: the same fields in the same order, numbered from 1."""
    kinds = {"string": "string", "double": "double", "int": "int32", "long": "int64"}
    fields = " ".join(f"{kinds[f['type']]} {f['name']} = {n};" for n, f in enumerate(schema["fields"], 1))
    return f'syntax = "proto3";\npackage bench;\nmessage Order {{ {fields} }}\n'


#: The Protobuf subject's versions (proto3: no presence, so a field a writer lacks reads as ``""``).
PROTO = {1: _proto(V1), 2: _proto(V2), 3: _proto(V3)}


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


def produce(bootstrap: str, topics: dict[str, str], ids: dict[str, dict[int, int]], records: int,
            value_bytes: int) -> None:
    """The same records to the three ``topics`` (by format): Confluent-framed Avro and Protobuf
    (writer versions interleaved, ``ids`` by format and version) and JSON."""
    import fastavro
    from confluent_kafka import Producer
    from google.protobuf import message_factory

    from connectors.protobuf_schemas import compile_schema, frame, indexes, message

    parsed = {v: fastavro.parse_schema(s) for v, s in ((1, V1), (2, V2), (3, V3))}
    protos = {}  # version -> (message class, Confluent framing's header)
    for version, text in PROTO.items():
        descriptor = message(compile_schema(text, f"bench v{version}"), "bench.Order", f"bench v{version}")
        protos[version] = (message_factory.GetMessageClass(descriptor),
                           frame(ids["protobuf"][version], indexes(descriptor), b""))
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
            producer.produce(topics["avro"], value=struct.pack(">bI", 0, ids["avro"][version]) + body.getvalue(),
                             partition=partition)
            full = {**{f["name"]: f.get("default") for f in V3["fields"]}, **record}
            producer.produce(topics["json"], value=json.dumps(full).encode(), partition=partition)
            cls, head = protos[version]
            producer.produce(topics["protobuf"], value=head + cls(**record).SerializeToString(), partition=partition)
            written += 1
            if written % 10_000 == 0:
                producer.poll(0)
        producer.commit_transaction(60)
    producer.flush(60)


def register(url: str, subject: str, schema: dict[str, Any] | str, kind: str = "AVRO") -> int:
    """Register ``schema`` (an Avro schema, or ``.proto`` text with ``kind="PROTOBUF"``) under ``subject``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    text = schema if isinstance(schema, str) else json.dumps(schema)
    return int(SchemaRegistryClient({"url": url}).register_schema(subject, Schema(text, kind)))


def register_all(url: str, avro_topic: str, protobuf_topic: str) -> dict[str, dict[int, int]]:
    """Both subjects' three versions; the Protobuf subject's compatibility NONE before v3
    (Apicurio's BACKWARD refuses int32 -> int64 for Protobuf)."""
    ids = {"avro": {v: register(url, f"{avro_topic}-value", s) for v, s in ((1, V1), (2, V2), (3, V3))},
           "protobuf": {}}
    subject = f"{protobuf_topic}-value"
    for version in (1, 2, 3):
        if version == 3:
            request = urllib.request.Request(f"{url}/config/{subject}", method="PUT",
                                             data=json.dumps({"compatibility": "NONE"}).encode(),
                                             headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
            urllib.request.urlopen(request, timeout=10).read()
        ids["protobuf"][version] = register(url, subject, PROTO[version], "PROTOBUF")
    if len(set(ids["protobuf"].values())) != 3:
        raise AssertionError(f"{subject}: expected three schema ids, got {ids['protobuf']}")
    return ids


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
    """Every record once, every field decoded (v1's records with v2's and v3's defaults: Avro's
    and JSON's ``web``/``eu``, proto3's ``""``), each version's ``channel`` and ``region`` as written."""
    stats = (spark.read.format("delta").load(str(target))
             .selectExpr("count(*) AS n", "count(DISTINCT _kafka_partition, _kafka_offset) AS d",
                         "count(order_id) AS decoded", "count(channel) AS channel", "count(region) AS region",
                         "count_if(channel = 'app') AS app", "count_if(region = 'us') AS us")
             .first())
    if not (stats.n == stats.d == stats.decoded == stats.channel == stats.region == expected):
        raise AssertionError(f"{target}: {stats.asDict()}; expected {expected} each")
    # Record i is written with version 1 + i % 3: v2 and v3 carry channel 'app', v3 region 'us'.
    if (stats.app, stats.us) != (expected - (expected + 2) // 3, expected // 3):
        raise AssertionError(f"{target}: {stats.asDict()}; expected {expected - (expected + 2) // 3} 'app', "
                             f"{expected // 3} 'us'")


def band(seconds: dict[str, list[float]], slower: str, faster: str) -> tuple[float, float]:
    """The smallest and largest ratio ``slower``'s seconds / ``faster``'s over the rounds (the
    throughput of ``faster`` over ``slower`` in each round): the noise band of their ratio."""
    ratios = [a / b for a, b in zip(seconds[slower], seconds[faster], strict=True)]
    return min(ratios), max(ratios)


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
    names = ("tidemark-avro", "structured-streaming-avro", "tidemark-json", "tidemark-protobuf")
    #: Each contender's topic (by format) and Tidemark's ``format`` (None: Structured Streaming).
    runs = {"tidemark-avro": ("avro", "avro"), "structured-streaming-avro": ("avro", None),
            "tidemark-json": ("json", "json"), "tidemark-protobuf": ("protobuf", "protobuf")}
    seconds: dict[str, list[float]] = {n: [] for n in names}
    try:
        with kafka_broker() as (bootstrap, broker_version):
            topics: dict[str, dict[str, str]] = {}
            for use, count in (("warm", min(50_000, args.records)), ("timed", args.records)):
                topics[use] = {fmt: new_topic(bootstrap, f"{fmt}-{use}") for fmt in ("avro", "json", "protobuf")}
                ids = register_all(url, topics[use]["avro"], topics[use]["protobuf"])
                started = time.monotonic()
                produce(bootstrap, topics[use], ids, count, args.value_bytes)
                print(f"produced {count:,} records three times in {time.monotonic() - started:.0f}s", flush=True)
            spark = build_session(settings, "tidemark-avro-bench", warehouse=work / "warehouse")
            # Untimed warm-up of each contender on topics of its own: the JIT and the session's first jobs.
            for name in names:
                fmt, tidemark_format = runs[name]
                if tidemark_format is None:
                    run_structured_streaming(spark, bootstrap, topics["warm"][fmt], work / f"warm-{name}")
                else:
                    run_tidemark(spark, bootstrap, topics["warm"][fmt], work / f"warm-{name}", url, tidemark_format)
            for rep in range(args.reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    target = work / f"{name}-{rep}"
                    fmt, tidemark_format = runs[name]
                    started = time.monotonic()
                    if tidemark_format is None:
                        rows = run_structured_streaming(spark, bootstrap, topics["timed"][fmt], target)
                    else:
                        rows = run_tidemark(spark, bootstrap, topics["timed"][fmt], target, url, tidemark_format)
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
    protobuf_vs_avro = med["tidemark-avro"] / med["tidemark-protobuf"]
    bands = {"vs_structured_streaming": band(seconds, "structured-streaming-avro", "tidemark-avro"),
             "vs_json": band(seconds, "tidemark-json", "tidemark-avro"),
             "protobuf_vs_avro": band(seconds, "tidemark-avro", "tidemark-protobuf")}

    def shown(ratio: float, key: str) -> str:
        low, high = bands[key]
        return f"**{ratio:.2f}×** (band {low:.2f}–{high:.2f})"

    lines = header("Avro and Protobuf ingest through a schema registry", load_before)
    lines += ["", (f"Kafka {broker_version}, Apicurio Registry; {args.records:,} records of ~{args.value_bytes} B, "
                  "20 fields, three writer versions interleaved."), "",
              "| contender | runs (s) | median records/s |", "|---|---|---|"]
    lines += [f"| {n} | {', '.join(f'{s:.1f}' for s in seconds[n])} | {args.records / med[n]:,.0f} |" for n in names]
    lines += ["", (f"Avro / Structured Streaming with from_avro: {shown(vs_ss, 'vs_structured_streaming')}; "
                   f"Avro / Tidemark's JSON: {shown(vs_json, 'vs_json')}; Protobuf / Avro: "
                   f"{shown(protobuf_vs_avro, 'protobuf_vs_avro')} (target ≥ 0.8×: "
                   f"{'met' if protobuf_vs_avro >= 0.8 else 'not met'}).")]
    emit(lines, args.output)
    emit_json({"benchmark": "avro_bench", "records": args.records, "value_bytes": args.value_bytes,
               "runs_seconds": seconds, "median_seconds": med, "ratio_vs_structured_streaming": vs_ss,
               "ratio_vs_json": vs_json, "ratio_protobuf_vs_avro": protobuf_vs_avro,
               "ratio_bands": {k: list(v) for k, v in bands.items()}}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
