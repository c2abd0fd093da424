"""ONNX's own node tests (``onnx.backend.test``, 1,884 cases in onnx 1.23) against this
engine: every case of every operator the engine claims must pass; the others are
skipped by operator (or element type), each with its reason.

    python bench/onnx_conformance.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.onnx_io.backend import CLAIMED, NOT_CLAIMED, node_cases, run_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    outcomes = [run_case(c) for c in node_cases()]
    counts = Counter(o.status for o in outcomes)
    per_op: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        if o.status != "skipped" or all(op in CLAIMED for op in o.operators):
            for op in o.operators:
                per_op[op][o.status] += 1
    reasons = Counter(o.reason.split(":")[0] if o.status == "skipped" else "" for o in outcomes
                      if o.status == "skipped")
    result = {
        "passed": counts["passed"], "failed": counts["failed"], "skipped": counts["skipped"],
        "operators": sorted(CLAIMED),
        "per_operator": {op: dict(c) for op, c in sorted(per_op.items())},
        "failures": [{"case": o.name, "reason": o.reason} for o in outcomes
                     if o.status == "failed"],
        "not_claimed": NOT_CLAIMED,
        "skip_reasons": dict(reasons.most_common(12)),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"passed {result['passed']}, failed {result['failed']}, skipped "
              f"{result['skipped']} over {len(outcomes)} cases; claimed: "
              f"{', '.join(result['operators'])}")
        for f in result["failures"]:
            print(f"  FAILED {f['case']}: {f['reason']}")


if __name__ == "__main__":
    main()
