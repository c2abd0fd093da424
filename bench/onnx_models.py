"""The onnx package's light model zoo, imported, sized and checked against onnxruntime.

Per model: import time (median of ``--repeats``), ONNX nodes before and instructions
after optimisation (the inference program at batch 1), planned bytes per zone for
inference at batch 1 and 32 and for training at batch 32 (cross-entropy on the logits,
SGD with momentum), the training plan's lower bound (the most bytes live at one
instruction, summed over zones), the largest training batch that fits 4 GiB, and the
largest relative difference from onnxruntime over a batch of 2 random images, with the
generated weights replaced by random ones (``engine.onnx_io.light.randomized``: the
shipped weights are one value per tensor, under which every image looks alike).

    python bench/onnx_models.py --json
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

from engine import SGD, VM, compile_graph
from engine.onnx_io import import_onnx
from engine.onnx_io.light import data_input, light_models, randomized

GiB4 = 4 << 30


def rel_err(model: Any) -> float:
    """max |engine - onnxruntime| / max |onnxruntime| over 2 random images."""
    import onnxruntime as ort

    m = randomized(model)
    g = import_onnx(m, freeze=True)
    inp = data_input(m)
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).random((2, *dims[1:]), dtype=np.float32)
    vm = VM(compile_graph(g, batch_size=2))
    vm.set(inp.name, x)
    vm.forward("infer")
    got = vm.get(m.graph.output[0].name)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # old models list initializers as inputs: a warning each
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    # the models were exported for one image: run them one at a time
    want = np.concatenate([sess.run(None, {inp.name: x[i:i + 1]})[0] for i in range(2)])
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def measure(name: str, path: str, repeats: int, ort_check: bool) -> dict[str, Any]:
    import onnx

    model = onnx.load(path)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        g = import_onnx(model, freeze=True)
        times.append(time.perf_counter() - t)
    b1 = compile_graph(g, batch_size=1)
    b32 = compile_graph(g, batch_size=32)
    tg = import_onnx(model, loss="cross_entropy")
    opt = SGD(lr=0.01, momentum=0.9)
    train = compile_graph(tg, batch_size=32, optimizer=opt)
    fits = compile_graph(tg, memory=GiB4, optimizer=opt)
    code = b1.paths[b1.path_index("infer")]
    return {
        "name": name,
        "import_s": round(statistics.median(times), 3),
        "nodes_before": len(model.graph.node),
        "nodes_after": len(code.forward),
        "infer_b1_bytes": b1.total_bytes, "infer_b1_zones": b1.zone_bytes,
        "infer_b32_bytes": b32.total_bytes,
        "train_b32_bytes": train.total_bytes, "train_b32_zones": train.zone_bytes,
        "train_b32_lower_bound": sum(z["lower_bound"] for z in train.memory.values()),
        "max_train_batch_4GiB": fits.batch_size,
        "max_train_batch_4GiB_bytes": fits.total_bytes,
        "max_rel_err_vs_onnxruntime": rel_err(model) if ort_check else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--repeats", type=int, default=5, help="imports timed per model")
    ap.add_argument("--no-onnxruntime", action="store_true", help="skip the output check")
    args = ap.parse_args()
    wanted = [m for m in args.models.split(",") if m]
    models = [measure(n, p, args.repeats, not args.no_onnxruntime)
              for n, p in light_models().items() if not wanted or n in wanted]
    out = {"models": models}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
