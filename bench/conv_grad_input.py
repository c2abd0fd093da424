"""Conv's input gradient two ways: col2im (``W^T @ dY`` scattered back by kH·kW strided
adds) and the transposed convolution (dY padded and convolved with the flipped kernel
by the forward's im2col, :func:`engine.ops.conv.transposed_conv`), on the layers a
search of ``search_spaces/cnn_mnist.yaml`` trains: 3x3 and 5x5 kernels, 8 to 32
channels, at 14x14 and 7x7, batch 64, on one thread as a search's worker runs them.

Each form in a fresh process (``bench/_sides.py``), the forms alternating; the layer is
``bench/conv_chunks.py``'s program (a 3x3 convolution, then the measured ``C`` to
``M`` one, then a classifier).  Reported per layer: milliseconds of the measured
layer's ConvGradInput (medians of ``--repeats`` processes, each the median of 7
samples), the program's workspace, and which form ConvGradInput takes by its rule.

    python bench/conv_grad_input.py --json

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, emit, median

BATCH = 64
# (C, M, H, K): dY with as many channels as dX, fewer, twice and four times as many
SHAPES = ("32,32,14,5", "32,16,7,5", "32,8,7,3", "8,8,14,5", "16,16,14,3",
          "8,16,14,3", "8,16,14,5", "16,32,14,3", "16,32,14,5", "16,32,7,3",
          "16,32,7,5", "8,32,14,3", "8,32,14,5", "8,32,7,3")
FORMS = ("col2im", "transposed")


def child(shape: str, form: str) -> None:
    from bench.conv_chunks import op_times
    from engine.ops import conv

    if form == "col2im":
        conv.transposed_conv = lambda *a, **k: None
    ms, workspace = op_times(shape, ("ConvGradInput",))
    emit({"ms": ms["ConvGradInput"], "workspace_bytes": workspace})


def rule(shape: str) -> str:
    from engine.ops import conv

    c, m, h, k = (int(v) for v in shape.split(","))
    chosen = conv.transposed_conv((BATCH, c, h, h), (m, c, k, k), {"pads": (k // 2,) * 4},
                                  "cpu")
    return "col2im" if chosen is None else "transposed"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--shape", action="append", default=[],
                    help="C,M,H,K of the measured layer (repeatable; default: fourteen)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        child(args.side, args.form)
        return
    out: dict[str, Any] = {"batch": BATCH, "repeats": args.repeats, "threads": 1,
                           "shapes": {}}
    for shape in args.shape or list(SHAPES):
        runs = alternate(__file__, {f: ["--side", shape, "--form", f] for f in FORMS},
                         args.repeats)
        row: dict[str, Any] = {f: {"ms": round(median(runs[f], "ms"), 3),
                                   "workspace_bytes": runs[f][0]["workspace_bytes"]}
                               for f in FORMS}
        row["speedup"] = round(row["col2im"]["ms"] / row["transposed"]["ms"], 2)
        row["rule"] = rule(shape)
        out["shapes"][shape] = row
    if args.json:
        print(json.dumps(out))
        return
    for shape, r in out["shapes"].items():
        print(f"C,M,H,K = {shape}: col2im {r['col2im']['ms']:.2f} ms, transposed "
              f"{r['transposed']['ms']:.2f} ms ({r['speedup']}x); the rule takes {r['rule']}")


if __name__ == "__main__":
    main()
