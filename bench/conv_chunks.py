"""Conv's columns a few images at a time (:data:`engine.ops.conv.CHUNK_BYTES`): the
forward convolution and both gradients of one layer at batch 64, on one thread as a
search's worker runs them, for several chunk sizes, each setting in a fresh process
(``bench/_sides.py``), the settings alternating; milliseconds per op (medians of
``--repeats`` processes, each the median of 7 samples), and the program's workspace.

The layer is a training program of its own: a 3x3 convolution of ``C`` channels to
``C`` (so that the measured one's input gradient is taken), then the measured one,
``C`` to ``M`` channels of ``H``x``H`` with a ``K``x``K`` kernel (same padding), and a
linear classifier; the times are of the ops of both convolutions.

    python bench/conv_chunks.py --json
    python bench/conv_chunks.py --json --shapes 32,32,14,5 --chunks 1,4,16,0

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, emit, median

BATCH = 64
# (C, M, H, K): the MNIST CNN space's heaviest block (32 to 32 channels, 5x5, at
# 14x14), a 3x3 one of the same width, and a narrower one at 28x28
SHAPES = ("32,32,14,5", "32,32,14,3", "16,32,14,3", "8,16,28,3")
CHUNKS = ("1", "2", "4", "8", "16", "0")  # MiB of columns at once; 0: the whole batch
OPS = ("Conv", "ConvGradWeight", "ConvGradInput")


def program(c: int, m: int, h: int, k: int) -> Any:
    from engine import VM, Adam, CalcGraph, Init, Mode, compile_graph

    g = CalcGraph()
    x = g.placeholder("x", (0, c, h, h))
    y = g.placeholder("y", (0,), dtype="int64")
    w0 = g.parameter("w0", (c, c, 3, 3), init=Init.he_uniform())
    w1 = g.parameter("w1", (m, c, k, k), init=Init.he_uniform())
    wf = g.parameter("wf", (m * h * h, 10), init=Init.he_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    t = p.Relu(p.Conv(x, w0, pads=(1, 1, 1, 1)))
    t = p.Reshape(p.Conv(t, w1, pads=(k // 2,) * 4), shape=(0, m * h * h))
    loss, _ = p.SoftmaxCrossEntropyLoss(p.MatMul(t, wf), y, outputs=["loss", "log_prob"])
    p.set_loss(loss)
    return VM(compile_graph(g, batch_size=BATCH, optimizer=Adam()))


def op_times(shape: str, ops: tuple[str, ...]) -> tuple[dict[str, float], int]:
    """Milliseconds of each of ``ops`` (all its instructions) in a training step of
    :func:`program` for ``shape`` ("C,M,H,K"), one thread, the median of 7 samples of 5
    steps; and the program's workspace bytes."""
    import threadpoolctl

    threadpoolctl.threadpool_limits(1)  # one worker's thread, as in a 2-core search
    c, m, h, k = (int(v) for v in shape.split(","))
    vm = program(c, m, h, k)
    rng = np.random.default_rng(0)
    vm.set("x", rng.random((BATCH, c, h, h), dtype=np.float32))
    vm.set("y", rng.integers(0, 10, BATCH))
    for _ in range(3):
        vm.train_step("train")
    prog, b = vm.program, vm._binding
    pc = prog.paths[prog.path_index("train")]
    kinds = [prog.instrs[i].op for i in (*pc.forward, *pc.backward)]
    steps = [*b.forward[prog.path_index("train")], *next(iter(b.backward.values()))]
    by_op = {op: [f for kind, f in zip(kinds, steps, strict=True) if kind == op] for op in ops}
    samples: dict[str, list[float]] = {op: [] for op in ops}
    for _ in range(7):
        for op, fs in by_op.items():
            t0 = time.perf_counter()
            for _ in range(5):
                for f in fs:
                    f()
            samples[op].append((time.perf_counter() - t0) / 5 * 1e3)
    return {op: statistics.median(v) for op, v in samples.items()}, \
        prog.zone_bytes["workspace"]


def child(shape: str, chunk_mib: float) -> None:
    from engine.ops import conv

    if chunk_mib > 0:
        conv.CHUNK_BYTES = int(chunk_mib * (1 << 20))
    else:
        conv.CHUNK_BYTES = 1 << 62  # the whole batch at once
    ms, workspace = op_times(shape, OPS)
    emit({**ms, "workspace_bytes": workspace})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--shape", action="append", default=[],
                    help="C,M,H,K of the measured layer (repeatable; default: four)")
    ap.add_argument("--chunks", default=",".join(CHUNKS),
                    help="MiB of columns at once, comma-separated (0: the whole batch)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--chunk", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        child(args.side, args.chunk)
        return
    shapes = args.shape or list(SHAPES)
    chunks = [float(v) for v in args.chunks.split(",")]
    out: dict[str, Any] = {"batch": BATCH, "repeats": args.repeats, "threads": 1,
                           "shapes": {}}
    for shape in shapes:
        sides = {f"{mib:g}": ["--side", shape, "--chunk", str(mib)] for mib in chunks}
        runs = alternate(__file__, sides, args.repeats)
        rows = {}
        for name, rs in runs.items():
            ms = {op: round(median(rs, op), 3) for op in OPS}
            rows["whole batch" if float(name) == 0 else f"{name} MiB"] = {
                **ms, "total_ms": round(sum(ms.values()), 3),
                "workspace_bytes": rs[0]["workspace_bytes"]}
        out["shapes"][shape] = rows
    if args.json:
        print(json.dumps(out))
        return
    for shape, rows in out["shapes"].items():
        print(f"C,M,H,K = {shape}")
        for name, r in rows.items():
            print(f"  {name:>12}: " + ", ".join(f"{op} {r[op]:.2f} ms" for op in OPS) +
                  f"; total {r['total_ms']:.2f} ms, workspace {r['workspace_bytes']:,} B")


if __name__ == "__main__":
    main()
