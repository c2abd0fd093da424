"""One training step of ``engine.models.mnist_cnn`` at batch 64 (Adam), this engine
against PyTorch eager on the CPU with the same thread count, interleaved, median of
``--repeats`` samples of 20 steps each; with the time of each kind of instruction of
the engine's step (where it is slower, the breakdown says where the time goes), and
the step and workspace with each of Conv's forward algorithms (im2col is the default).

    python bench/cnn_step.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import VM, Adam, compile_graph
from engine.models import mnist_cnn

BATCH = 64


def engine_vm(algorithm: str = "im2col") -> VM:
    return VM(compile_graph(mnist_cnn(algorithm=algorithm), batch_size=BATCH,
                            optimizer=Adam(lr=1e-3)))


def engine_step(vm: VM, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    def step() -> None:
        vm.set("x", x, check=False)
        vm.set("y", y, check=False)
        vm.train_step("train")

    return step


def op_breakdown(vm: VM, repeats: int = 20) -> dict[str, float]:
    """Milliseconds per step spent in each instruction kind (forward and backward) and
    in the optimizer update, each bound step timed on its own."""
    prog, b = vm.program, vm._binding
    pc = prog.paths[prog.path_index("train")]
    kinds = [prog.instrs[k].op for k in (*pc.forward, *pc.backward)]
    steps = [*b.forward[prog.path_index("train")],
             *next(iter(b.backward.values()))]
    out: dict[str, float] = {}
    for kind, f in zip(kinds, steps, strict=True):
        out[kind] = out.get(kind, 0.0) + timed(f, repeats)
    out["optimizer update"] = sum(timed(f, repeats) for f in vm._flat_update)
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def torch_step(x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 49, 10))
    try:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xt), yt).backward()
        opt.step()

    return step


def timed(step: Callable[[], None], n: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, BATCH)
    vm = engine_vm()
    steps = {"engine": engine_step(vm, x, y), "torch": torch_step(x, y)}
    others = {a: engine_vm(a) for a in ("direct", "winograd")}
    steps.update({a: engine_step(v, x, y) for a, v in others.items()})
    for s in steps.values():  # warm up
        timed(s, 5)
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.repeats):
        for k, s in steps.items():
            samples[k].append(timed(s))
    out = {"engine_ms_step": round(statistics.median(samples["engine"]), 3),
           "torch_ms_step": round(statistics.median(samples["torch"]), 3),
           "threads": threads, "batch": BATCH, "repeats": args.repeats}
    out["engine_over_torch"] = round(out["engine_ms_step"] / out["torch_ms_step"], 2)
    out["engine_ms_step_by_conv_algorithm"] = {
        "im2col": out["engine_ms_step"],
        **{a: round(statistics.median(samples[a]), 3) for a in others}}
    # the forward convolutions' own scratch (the zone is the largest of any instruction,
    # here a gradient's, whichever forward algorithm runs)
    out["conv_forward_workspace_bytes_by_algorithm"] = {
        a: max(i.workspace for i in v.program.instrs if i.op == "Conv")
        for a, v in {"im2col": vm, **others}.items()}
    out["engine_ms_by_op"] = op_breakdown(vm)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
