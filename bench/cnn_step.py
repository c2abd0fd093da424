"""One training step of ``engine.models.mnist_cnn`` at batch 64 (Adam), this engine
against PyTorch eager on the CPU (``torch.set_num_threads`` at the cores; foreach and
fused Adam, each with the model in contiguous and in channels-last memory format: the
fastest of the four is the baseline, named in ``torch_variant``), median of
``--repeats`` fresh processes per side of the median of 7 samples of 20 steps each.
Each side runs in its own fresh process (``bench/_sides.py``: one library's idle
thread pool spinning beside the other's work slows either side on two cores), the sides
alternating; peak RSS comes from the same processes.  Also the time of each kind of
instruction of the engine's step (where it is slower, the breakdown says where the
time goes), and the step and workspace with each of Conv's forward algorithms (im2col
is the default), each algorithm a side of its own.  ``--device gpu`` runs the engine
(cupy) and PyTorch (CUDA) on the GPU, both copying the batch from host memory at each
step, the device synchronised before each sample's clock stops; the per-instruction
breakdown then times each instruction's repeats up to a synchronisation, so it counts
the kernels' run as well as their launch.

    python bench/cnn_step.py --json

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, cores, emit, fastest, median

BATCH = 64
ALGORITHMS = ("im2col", "direct", "winograd")
TORCH_VARIANTS = ("fused", "foreach", "fused_channels_last", "foreach_channels_last")


SYNC: list[Callable[[], None]] = []  # the device's synchronize, on the GPU


def engine_vm(algorithm: str = "im2col", device: str = "cpu") -> Any:
    from engine import VM, Adam, compile_graph
    from engine.models import mnist_cnn

    return VM(compile_graph(mnist_cnn(algorithm=algorithm), batch_size=BATCH,
                            optimizer=Adam(lr=1e-3), device=device))


def engine_step(vm: Any, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    def step() -> None:
        vm.set("x", x, check=False)
        vm.set("y", y, check=False)
        vm.train_step("train")

    return step


def op_breakdown(vm: Any, repeats: int = 20) -> dict[str, float]:
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


def torch_step(x: np.ndarray, y: np.ndarray, variant: str, device: str = "cpu"
               ) -> Callable[[], None]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 49, 10))
    if device == "gpu":
        model = model.to("cuda")
    if variant.endswith("channels_last"):
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    adam = variant.split("_")[0]  # fused or foreach
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=adam == "fused",
                           foreach=adam == "foreach")
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xt), yt).backward()
        opt.step()

    def gpu_step() -> None:  # the batch from host memory, as the engine's set does
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xt.to("cuda")), yt.to("cuda")).backward()
        opt.step()

    return gpu_step if device == "gpu" else step


def timed(step: Callable[[], None], n: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    for sync in SYNC:
        sync()
    return (time.perf_counter() - t) / n * 1e3


def child(side: str, samples: int, steps: int, device: str = "cpu") -> None:
    """One side in this (fresh) process: warm up, then ``samples`` samples of ``steps``
    steps; their median (ms per step), and for the engine its Conv workspace and (im2col)
    the per-instruction breakdown."""
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, BATCH)
    extra: dict[str, Any] = {}
    if side.startswith("engine"):
        algorithm = side.removeprefix("engine").lstrip("_") or "im2col"
        vm = engine_vm(algorithm, device)
        if device == "gpu":
            SYNC.append(vm.backend.synchronize)
        step = engine_step(vm, x, y)
        # the forward convolutions' own scratch (the zone is the largest of any
        # instruction, here a gradient's, whichever forward algorithm runs)
        extra["conv_forward_workspace_bytes"] = max(i.workspace for i in vm.program.instrs
                                                    if i.op == "Conv")
    else:
        import torch

        torch.set_num_threads(cores())
        if device == "gpu":
            SYNC.append(torch.cuda.synchronize)
        step = torch_step(x, y, side.removeprefix("torch_"), device)
    timed(step, 5)  # warm up
    ms = [timed(step, steps) for _ in range(samples)]
    if side == "engine":
        extra["ms_by_op"] = op_breakdown(vm, steps)
    emit({"ms_step": statistics.median(ms), "samples_ms": ms, **extra})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=5,
                    help="fresh processes per side, alternating; the median is kept")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 samples of 3 steps per process")
    ap.add_argument("--log", action="store_true", help="each child's answer on stderr")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help="the engine's Conv algorithms to time, each a side of its own "
                         "(default all; im2col, the default, always runs)")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=7, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=20, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        child(args.side, args.samples, args.steps, args.device)
        return
    size = ["--samples", "2", "--steps", "3"] if args.quick else []
    chosen = {"im2col", *(a.strip() for a in args.algorithms.split(",") if a.strip())}
    unknown = chosen - set(ALGORITHMS)
    if unknown:
        ap.error(f"--algorithms: unknown {sorted(unknown)}; known: {', '.join(ALGORITHMS)}")
    engines = {a: "engine" if a == "im2col" else f"engine_{a}" for a in ALGORITHMS
               if a in chosen}
    sides = [*engines.values(), *(f"torch_{v}" for v in TORCH_VARIANTS)]
    runs = alternate(__file__, {s: ["--side", s, "--device", args.device, *size]
                                for s in sides}, args.repeats,
                     log=args.log)
    if not runs["engine"] or not any(runs[f"torch_{v}"] for v in TORCH_VARIANTS):
        sys.exit("cnn_step: interrupted before the engine and PyTorch had each run once")
    sides = [s for s in sides if runs[s]]  # an interrupted run: the sides that ran
    engines = {a: s for a, s in engines.items() if runs[s]}
    ms = {s: median(runs[s], "ms_step") for s in sides}
    variant = fastest({v: ms.get(f"torch_{v}") for v in TORCH_VARIANTS})
    torch_side = f"torch_{variant}"
    out: dict[str, Any] = {
        "engine_ms_step": round(ms["engine"], 3), "torch_ms_step": round(ms[torch_side], 3),
        "threads": cores(), "batch": BATCH, "repeats": args.repeats, "device": args.device}
    out["engine_over_torch"] = round(ms["engine"] / ms[torch_side], 2)
    out["speedup_vs_torch"] = round(ms[torch_side] / ms["engine"], 2)
    out["torch_variant"] = variant
    out["torch_ms_step_by_variant"] = {v: round(ms[f"torch_{v}"], 3) for v in TORCH_VARIANTS
                                       if f"torch_{v}" in ms}
    out["runs_per_side"] = {s: len(runs[s]) for s in sides}
    out["engine_ms_step_runs"] = [round(r["ms_step"], 3) for r in runs["engine"]]
    out["torch_ms_step_runs"] = [round(r["ms_step"], 3) for r in runs[torch_side]]
    out["engine_peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in runs["engine"])
    out["torch_peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in runs[torch_side])
    out["engine_ms_step_by_conv_algorithm"] = {a: round(ms[s], 3) for a, s in engines.items()}
    out["conv_forward_workspace_bytes_by_algorithm"] = {
        a: runs[s][0]["conv_forward_workspace_bytes"] for a, s in engines.items()}
    kinds = runs["engine"][0]["ms_by_op"]
    by_op = {k: round(statistics.median(r["ms_by_op"][k] for r in runs["engine"]), 3)
             for k in kinds}
    out["engine_ms_by_op"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1]))
    out["isolation"] = "each side in a fresh process, alternating; medians"
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
