"""One benchmark, two revisions of the code, side by side: the working tree against ``BASE``.

For a change that has no switch in the product (and should not get one just to be
measured), the only fair comparison is the same benchmark run on the code before and
after it, alternating, on the same machine minutes apart. ``BASE`` is checked out into a
temporary git worktree, and the working tree's ``bench/`` is copied over its own, so both
sides are measured by the same benchmark and only the product's code differs; each round runs ``python -m bench.<module> ... --json FILE`` there
and here (the current directory comes first on ``sys.path``, so each run imports its own
tree's code, subprocesses included), in alternating order.

    .venv/bin/python -m bench.diagnostics.revisions HEAD~1 --rounds 2 --json warm_snapshot.json -- \\
        freshness_bench --only tidemark --rate 2000 --seconds 60 --warmup 20

The JSON holds every run's own JSON under ``base`` and ``head``; the printed table shows
the numeric figures of ``--pick`` (a dotted path into each run's JSON) per run and their medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import emit_json

ROOT = Path(__file__).resolve().parents[2]


def _pick(figures: dict[str, Any], path: str) -> dict[str, float]:
    node: Any = figures
    for part in path.split("."):
        node = node[part]
    return {k: float(v) for k, v in node.items() if isinstance(v, int | float)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="git revision to compare the working tree against")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, alternating which goes first")
    parser.add_argument("--json", required=True, help="write every run's figures here")
    parser.add_argument("--png", help="draw the medians side by side to this PNG file")
    parser.add_argument("--pick", default="contenders.tidemark", help="dotted path of the figures to tabulate")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    bench = argv[split + 1:]  # -- MODULE [ARGS...]: a module of bench/ and its arguments
    if not bench:
        parser.error("name the benchmark after --, e.g. -- freshness_bench --only tidemark")
    work = Path(tempfile.mkdtemp(prefix="tidemark-revisions-"))
    base_tree = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
                   check=True, capture_output=True)
    shutil.copytree(ROOT / "bench", base_tree / "bench", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    try:
        for round_ in range(args.rounds):
            order = ["base", "head"] if round_ % 2 == 0 else ["head", "base"]
            for side in order:
                out = work / f"{side}-{round_}.json"
                tree = base_tree if side == "base" else ROOT
                subprocess.run([sys.executable, "-m", f"bench.{bench[0]}", *bench[1:], "--json", str(out)],
                               cwd=tree, check=True)
                runs[side].append(json.loads(out.read_text()))
                print(f"round {round_ + 1} {side}: {_pick(runs[side][-1], args.pick)}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *argv], check=True, capture_output=True, text=True).stdout.strip()

    base_rev = git("rev-parse", "--short", args.base)
    head_rev = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    medians = {side: {k: statistics.median(_pick(r, args.pick)[k] for r in rs) for k in _pick(rs[0], args.pick)}
               for side, rs in runs.items()}
    emit_json({"benchmark": "revisions", "base": base_rev, "head": head_rev, "measured": bench, "pick": args.pick,
               "runs": runs, "medians": medians}, args.json, png=args.png)
    keys = list(medians["head"])
    print(f"\n| {args.pick} (median of {args.rounds}) | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for side, label in (("base", f"base {base_rev}"), ("head", f"head {head_rev}")):
        print(f"| {label} | " + " | ".join(f"{medians[side][k]:.2f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
