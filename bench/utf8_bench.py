"""UTF-8 validation of record values: Spark's ``is_valid_utf8`` vs ``tidemark_is_valid_utf8``.

The ingest checks every record's value (G7: non-UTF-8 values go to quarantine). This
times the check alone on ``--records`` cached ~1 KB JSON values (ASCII, like most
payloads), as ``count()`` of the rows that pass, next to a filter that checks nothing;
the difference is the check's cost. Order alternates.

    .venv/bin/python -m bench.utf8_bench             # 300,000 values, 5 reps
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.common import emit, header, loadavg

CHECKS = {"spark is_valid_utf8": "is_valid_utf8(value)", "tidemark_is_valid_utf8": "tidemark_is_valid_utf8(value)",
          "no check": "true"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from infra.spark import build_session
    from tidemark.settings import load_settings

    load_before = loadavg()
    spark = build_session(load_settings(), "tidemark-utf8-bench")
    try:
        values = spark.range(args.records).select(F.encode(F.concat(
            F.lit('{"order_id":"o-'), F.col("id").cast("string"), F.lit('","note":"'), F.repeat(F.lit("x"), 950),
            F.lit('"}')), "UTF-8").alias("value")).cache()
        values.count()
        times: dict[str, list[float]] = {name: [] for name in CHECKS}
        for rep in range(args.reps + 1):
            order = list(CHECKS) if rep % 2 == 0 else list(reversed(CHECKS))
            for name in order:
                t0 = time.perf_counter()
                passed = values.where(F.expr(CHECKS[name])).count()
                elapsed = time.perf_counter() - t0
                if passed != args.records:
                    raise AssertionError(f"{name}: {passed} of {args.records} values passed")
                if rep:  # rep 0 warms the JIT
                    times[name].append(elapsed)
    finally:
        spark.stop()
    med = {name: statistics.median(t) for name, t in times.items()}
    cost = {name: med[name] - med["no check"] for name in ("spark is_valid_utf8", "tidemark_is_valid_utf8")}
    lines = ["", *header("UTF-8 validation: Spark's is_valid_utf8 vs tidemark_is_valid_utf8", load_before),
             f"{args.records:,} cached ASCII JSON values of ~1 KB; median of {args.reps} after a warm-up.", "",
             "| check | median s | all runs (s) |", "|---|---:|---|"]
    lines += [f"| {name} | {med[name]:.2f} | {', '.join(f'{t:.2f}' for t in times[name])} |" for name in CHECKS]
    ratio = cost["spark is_valid_utf8"] / cost["tidemark_is_valid_utf8"]
    lines += ["", (f"**Cost of the check (median minus no check): Spark {cost['spark is_valid_utf8']:.2f} s, "
              f"Tidemark {cost['tidemark_is_valid_utf8']:.2f} s — {ratio:.1f}× cheaper.**")]
    emit(lines, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
