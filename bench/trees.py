"""One benchmark in two source trees, before and after a change: is the change slower?

Runs ``python BENCH ARGS`` with each tree first on ``PYTHONPATH`` (and as the working
folder), each run a fresh process, the trees alternating (before, after, after, before,
...) so that neither always goes first on a machine whose load drifts, ``--repeats``
times each; reads the number at ``--key`` of the JSON object the benchmark prints last.
Prints the medians, every value, and after/before (one JSON object with ``--json``).

A tree is a git worktree of the commit to compare: ``git worktree add /tmp/before
COMMIT``.  For example, the explore side of ``explore_throughput.py``::

    python bench/trees.py --before /tmp/before --after . --key seconds --repeats 5 -- \\
        bench/explore_throughput.py --child explore --trials 20 --rounds 3 \\
        --train 5000 --valid 0 --memory 1GB --workers 2 --eval-batch 0 --stack 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_in(tree: Path, bench: str, args: list[str], key: str) -> float:
    """``python BENCH ARGS`` with ``tree``'s packages first; the value at ``key``
    (dotted for nested objects) of the last JSON line it prints."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(tree / bench), *args], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{bench} in {tree} exited {out.returncode}:\n{out.stderr[-3000:]}")
    value: Any = json.loads(out.stdout.strip().splitlines()[-1])
    for part in key.split("."):
        value = value[part]
    return float(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the tree before the change")
    ap.add_argument("--after", type=Path, required=True, help="the tree after it")
    ap.add_argument("--key", required=True, help="the JSON key to compare (a.b for nested)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("bench", help="the benchmark script, relative to each tree")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    got: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(a.repeats):
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for side in order:
            got[side].append(run_in(trees[side], a.bench, args, a.key))
            if not a.json:
                print(f"repeat {i + 1}: {side} {got[side][-1]:.4g}", file=sys.stderr)
    med = {side: statistics.median(v) for side, v in got.items()}
    result = {"bench": a.bench, "args": args, "key": a.key, "repeats": a.repeats,
              "before_median": med["before"], "after_median": med["after"],
              "after_over_before": med["after"] / med["before"] if med["before"] else None,
              "before_all": got["before"], "after_all": got["after"]}
    print(json.dumps(result) if a.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
