"""The activations the engine computes with a transcendental, numpy's kernel against the
compiled one (``engine.ops.jit``): float32 ``Sigmoid`` and ``Tanh`` (a rational
function numba vectorises) and, for scale, numpy's ``exp``, each op run in place as the
planner runs it, on tensors the size of a stacked MLP's layer (``[64, 8, 64]``), one
MNIST validation chunk's (``[10000, 64]``) and a CNN's activation (``[64, 16, 28,
28]``), on one thread.

Each kernel in a fresh process (``bench/_sides.py``), the kernels alternating; reported
per op and size: nanoseconds per element (medians of ``--repeats`` processes, each the
median of 7 samples), and the compiled form's speed-up over numpy's.

    python bench/activations.py --json

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, calls_per_sample, emit, median, timed

SIZES = {"stack_layer": (64, 8, 64), "validation_chunk": (10000, 64),
         "cnn_activation": (64, 16, 28, 28)}
OPS = ("Sigmoid", "Tanh")
KERNELS = ("numpy", "compiled")


def child(op: str, size: str, kernel: str) -> None:
    os.environ["CALCGRAPH_JIT"] = "1" if kernel == "compiled" else "0"
    import numpy as np

    from engine.ops import KernelArgs, get_op

    x = np.random.default_rng(0).normal(size=SIZES[size]).astype(np.float32) * 3
    spec = get_op(op)
    variant = spec.variants["numba" if kernel == "compiled" else "numpy"]
    step = variant.kernel(KernelArgs(np, [x], [x], np.zeros(1, np.uint8), {}))

    def sync() -> None:
        return None

    k = calls_per_sample(step, sync)
    ms = statistics.median(timed(step, sync, k) for _ in range(7))
    emit({"ns_per_element": ms * 1e6 / x.size})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--side", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        child(*args.side)
        return
    out: dict[str, Any] = {"repeats": args.repeats, "threads": 1, "dtype": "float32",
                           "ops": {}}
    for op in OPS:
        for size in SIZES:
            runs = alternate(__file__, {kern: ["--side", op, size, kern] for kern in KERNELS},
                             args.repeats)
            row: dict[str, Any] = {kern: round(median(runs[kern], "ns_per_element"), 3)
                                   for kern in KERNELS}
            row["speedup"] = round(row["numpy"] / row["compiled"], 2)
            out["ops"][f"{op} {size}"] = row
    if args.json:
        print(json.dumps(out))
        return
    for what, r in out["ops"].items():
        print(f"{what}: numpy {r['numpy']:.3f} ns/element, compiled {r['compiled']:.3f} "
              f"({r['speedup']}x)")


if __name__ == "__main__":
    main()
