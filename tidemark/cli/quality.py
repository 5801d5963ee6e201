"""`tidemark check`: a pipeline's quality checks, with Data Docs."""

from __future__ import annotations

import argparse

from tidemark.cli.context import CONFIG, pipeline_of
from tidemark.cli.output import table
from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    check = sub.add_parser("check", parents=[CONFIG], help="quality checks of a pipeline's table (Great Expectations); "
                                         "exit 1 if any fails")
    check.add_argument("pipeline")
    check.add_argument("--docs", metavar="DIR", help="where the GX project and Data Docs live "
                                                     "(default ~/.tidemark/quality)")
    check.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from connectors.kafka_config import librdkafka_config, spark_options
    from infra.spark import build_session
    from quality.audit import audit, registry_of

    config, pipeline, bootstrap = pipeline_of(args)
    docs = Path(args.docs) if args.docs else settings().home_dir / "quality"
    spark = build_session(settings(), f"tidemark-check-{pipeline.name}")
    try:
        report = audit(spark, pipeline, kafka_options=spark_options(config.kafka, bootstrap),
                       client_config=librdkafka_config(config.kafka, bootstrap), docs_dir=docs,
                       registry=registry_of(config, pipeline))
    finally:
        spark.stop()
    rows = [(v.suite, v.check, "PASS" if v.passed else "FAIL", v.observed) for v in report.verdicts]
    print(table(rows, ("suite", "check", "verdict", "observed")))
    if report.skipped:
        print("\nskipped by an operator's seek (not read, not missing):")
        for line in report.skipped:
            print(f"  {line}")
    print(f"\nData Docs: file://{report.docs}")
    if report.passed:
        print(f"{pipeline.name}: all {len(rows)} checks passed")
        return 0
    failed = sum(1 for v in report.verdicts if not v.passed)
    print(f"{pipeline.name}: {failed} of {len(rows)} checks FAILED; the Data Docs list the offending rows")
    return 1
