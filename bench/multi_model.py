"""The CalcGraph paper's multi-model scenario (Sect. 4.4): N models of the paper's
MLP with randomly drawn learning parameters (optimizer, learning rate, init method),
R rounds each, a round being one epoch of mini-batches of 64 over 10,000 MNIST
samples.

- engine: the trials grouped into stacks of up to ``--stack`` models that share
  their optimizer but for the learning rate (:mod:`engine.compile.stack`: one program trains
  them side by side, each with its own init and learning rate), every stack
  compiled, added to one :class:`~engine.runtime.pool.ModelPool` over one arena, and trained
  round-robin (each round, each stack is switched in, trains one epoch and is
  switched out) — or ``--schedule completion``.  ``--stack 1`` trains each model
  alone; ``--unstacked`` times that too, in the same run.  The auto-tuner
  (:mod:`engine.autotune`) chooses each program's kernel variants on its first steps
  (its time counted; ``ENGINE_AUTOTUNE=0`` for the static defaults).  On the CPU the
  engine's BLAS runs on one thread (``--engine-blas-threads``, 0: OpenBLAS's own count)
  and its compiled kernels on every core: the stacks' first layer then skips MNIST's
  zero pixels (81% of them) on both cores, the ``sparse`` form of
  :mod:`engine.ops.stacked`, which beside a multi-threaded BLAS would run on one;
- PyTorch eager (CPU, same threads): what a user writes without switching, one
  model and optimizer built per trial and trained to completion.

``--device gpu`` runs both on the GPU (the engine's programs and arena with cupy,
PyTorch with CUDA), each copying every mini-batch from host memory as it trains and
synchronising the device before the clock stops.

Both run the same trials, cell after cell, each side of a cell in a fresh
subprocess (``bench/_sides.py``): on a small machine one library's idle thread pool
(OpenMP, OpenBLAS) spinning next to the other's work costs either side up to 40%.
Times exclude loading the data and starting Python; each cell reports the median of
``--repeats`` (default 5) runs per side, the sides alternating.  Cells with more than
``--max-model-rounds`` model-rounds are trimmed (listed in the output).

    python bench/multi_model.py --json

Measured on the 2-core machine (2026-11-25, ``--only 100:10``, medians of 5): the engine
13.1 s against PyTorch's 68.3 (5.23x), again 11.6 against 58.0 (5.0x); with
``--engine-blas-threads 0`` 15.2 against 52.3 (3.43x).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, cores, emit
from engine import SGD, Adagrad, Adam, Init, Optimizer, RMSProp, compile_graph
from engine.autotune import autotune_refused
from engine.compile.stack import stack_graphs, stack_key, stack_optimizers
from engine.models import paper_mlp
from engine.runtime.arena import Arena
from engine.runtime.pool import ModelPool
from engine.runtime.program import Program
from engine.runtime.train import train_epoch
from explore.datasets import load_mnist

SIZES = (784, 64, 64, 10)
N_SAMPLES = 10_000
BATCH = 64
GRID = [(n, r) for n in (1, 10, 100, 1000) for r in (1, 10, 30)]
OPTIMIZERS = ("sgd", "adam", "rmsprop", "adagrad")
INITS = ("xavier_uniform", "he_uniform", "normal")


@dataclass(frozen=True)
class Trial:
    optimizer: str
    lr: float
    init: str
    seed: int

    def engine_optimizer(self) -> Optimizer:
        return {"sgd": lambda: SGD(lr=self.lr, momentum=0.9), "adam": lambda: Adam(lr=self.lr),
                "rmsprop": lambda: RMSProp(lr=self.lr),
                "adagrad": lambda: Adagrad(lr=self.lr)}[self.optimizer]()

    def engine_init(self) -> Init:
        return {"xavier_uniform": Init.xavier_uniform(), "he_uniform": Init.he_uniform(),
                "normal": Init.normal(0.0, 0.05)}[self.init]


def draw(n: int, seed: int) -> list[Trial]:
    rng = np.random.default_rng(seed)
    lr_range = {"sgd": (1e-3, 1e-1), "adam": (1e-4, 1e-2), "rmsprop": (1e-4, 1e-2),
                "adagrad": (1e-3, 1e-1)}
    out = []
    for i in range(n):
        opt = OPTIMIZERS[int(rng.integers(len(OPTIMIZERS)))]
        lo, hi = lr_range[opt]
        lr = float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        out.append(Trial(opt, lr, INITS[int(rng.integers(len(INITS)))], i))
    return out


def stacks(trials: list[Trial], width: int) -> list[list[Trial]]:
    """Trials that can train as one stack (same optimizer but for the learning rate),
    in near-equal chunks of at most ``width``."""
    groups: dict[Any, list[Trial]] = {}
    for t in trials:
        groups.setdefault(stack_key(t.engine_optimizer()), []).append(t)
    out: list[list[Trial]] = []
    for g in groups.values():
        n = math.ceil(len(g) / width)
        out.extend(g[i::n] for i in range(n))
    return out


def compile_stack(group: list[Trial], device: str = "cpu") -> Program:
    """A group's program, its kernel variants chosen by the auto-tuner on its first
    steps (:mod:`engine.autotune`; ``ENGINE_AUTOTUNE=0`` runs the static defaults)."""
    tune = not autotune_refused()
    if len(group) == 1:
        t = group[0]
        return compile_graph(paper_mlp(SIZES, init=t.engine_init()), batch_size=BATCH,
                             optimizer=t.engine_optimizer(), device=device, autotune=tune)
    graphs = [paper_mlp(SIZES, init=t.engine_init()) for t in group]
    return compile_graph(stack_graphs(graphs), batch_size=BATCH,
                         optimizer=stack_optimizers([t.engine_optimizer() for t in group]),
                         device=device, autotune=tune)


def run_engine(trials: list[Trial], rounds: int, x: np.ndarray, y: np.ndarray,
               schedule: str, width: int, device: str = "cpu") -> tuple[float, float]:
    from engine.runtime.backends import get_backend

    t0 = time.perf_counter()
    groups = stacks(trials, width)
    programs = [compile_stack(g, device) for g in groups]
    pool = ModelPool(Arena.for_programs(programs))
    models = [pool.add(p, seed=g[0].seed) for p, g in zip(programs, groups, strict=True)]
    rng = np.random.default_rng(0)
    losses: dict[int, Any] = {}
    if schedule == "round-robin":
        for _ in range(rounds):
            for i, m in enumerate(models):
                losses[i] = train_epoch(pool.activate(m), x, y, rng, loss="loss")
    else:
        for i, m in enumerate(models):
            vm = pool.activate(m)
            for _ in range(rounds):
                losses[i] = train_epoch(vm, x, y, rng, loss="loss")
    pool.pause()
    get_backend(device).synchronize()
    return time.perf_counter() - t0, float(np.mean(np.concatenate(
        [np.atleast_1d(v) for v in losses.values()])))


TORCH_OPTIMIZERS = {"sgd": ("SGD", {"momentum": 0.9}), "adam": ("Adam", {}),
                    "rmsprop": ("RMSprop", {}), "adagrad": ("Adagrad", {})}


def torch_optimizer(torch: Any, t: Trial, params: list[Any]) -> Any:
    """The fastest implementation PyTorch has on this device: the fused kernel where
    there is one (Adam's fused CPU kernel takes an epoch from 80 to 56 ms here), else
    foreach."""
    name, kw = TORCH_OPTIMIZERS[t.optimizer]
    cls = getattr(torch.optim, name)
    try:
        return cls(params, lr=t.lr, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return cls(params, lr=t.lr, foreach=True, **kw)


def run_torch(trials: list[Trial], rounds: int, x: np.ndarray, y: np.ndarray,
              device: str = "cpu") -> tuple[float, float]:
    import torch

    dev = "cuda" if device == "gpu" else "cpu"
    t0 = time.perf_counter()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    rng = np.random.default_rng(0)
    loss_fn = torch.nn.CrossEntropyLoss()
    last: list[float] = []
    for t in trials:
        torch.manual_seed(t.seed)
        layers = [torch.nn.Linear(a, b) for a, b in itertools.pairwise(SIZES)]
        for lin in layers:
            {"xavier_uniform": torch.nn.init.xavier_uniform_,
             "he_uniform": lambda w: torch.nn.init.kaiming_uniform_(w, nonlinearity="relu"),
             "normal": lambda w: torch.nn.init.normal_(w, 0.0, 0.05)}[t.init](lin.weight)
            torch.nn.init.zeros_(lin.bias)
        model = torch.nn.Sequential(layers[0], torch.nn.Sigmoid(), layers[1],
                                    torch.nn.Sigmoid(), layers[2]).to(dev)
        opt = torch_optimizer(torch, t, list(model.parameters()))
        for _ in range(rounds):
            order = torch.from_numpy(rng.permutation(len(y)))
            xs, ys = xt[order], yt[order]
            total = 0.0
            for s in range(0, len(y), BATCH):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(xs[s:s + BATCH].to(dev)), ys[s:s + BATCH].to(dev))
                loss.backward()
                opt.step()
                total += loss.item() * len(ys[s:s + BATCH])
        last.append(total / len(y))
    if dev == "cuda":
        torch.cuda.synchronize()
    # Like the engine's: the mean over the models of their last round's loss.
    return time.perf_counter() - t0, float(np.mean(last))


def child(side: str, models: int, rounds: int, schedule: str, width: int,
          device: str = "cpu", blas_threads: int = 0) -> dict[str, Any]:
    """One side of one cell, in this (fresh) process; ``blas_threads``: the engine's
    BLAS threads (0: OpenBLAS's own count)."""
    threads = cores()
    ds = load_mnist()
    x, y = ds.train.x[:N_SAMPLES].copy(), ds.train.y[:N_SAMPLES].copy()
    trials = draw(models, seed=models * 1000 + rounds)
    if side == "engine":
        if blas_threads:  # before any kernel is bound: jit.parallel_threads() reads it once
            from threadpoolctl import threadpool_limits

            threadpool_limits(blas_threads, user_api="blas")
        run_engine(trials[:2], 1, x[:640], y[:640], schedule, width, device)  # warm up
        seconds, loss = run_engine(trials, rounds, x, y, schedule, width, device)
    else:
        import torch

        torch.set_num_threads(threads)
        run_torch(trials[:1], 1, x[:640], y[:640], device)
        seconds, loss = run_torch(trials, rounds, x, y, device)
    return {"seconds": seconds, "loss": loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--max-model-rounds", type=int, default=1000,
                    help="skip cells with more model-rounds (N x R) than this")
    ap.add_argument("--schedule", default="round-robin", choices=["round-robin", "completion"])
    ap.add_argument("--stack", type=int, default=8,
                    help="train up to this many same-optimizer models as one stack (1: none)")
    ap.add_argument("--unstacked", action="store_true",
                    help="also time the engine without stacking, in the same run")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved runs of each side per cell; the median is reported")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                    help="where both sides train (gpu: cupy and CUDA)")
    ap.add_argument("--only", help="run just the cells N:R,N:R,... (e.g. 100:10)")
    ap.add_argument("--engine-blas-threads", type=int, default=1,
                    help="the engine's BLAS threads on the CPU (default 1: its compiled "
                         "kernels then run on every core; 0: OpenBLAS's own count)")
    ap.add_argument("--child", choices=["engine", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--models", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit(child(args.child, args.models, args.rounds, args.schedule, args.stack,
                   args.device, args.engine_blas_threads))
        return
    threads = cores()
    cells: list[dict[str, Any]] = []
    trimmed = []
    grid = GRID
    if args.only:
        grid = [tuple(int(v) for v in c.split(":")) for c in args.only.split(",")]  # type: ignore[misc]
    sides = [("engine", args.stack)]
    if args.unstacked and args.stack != 1:
        sides.append(("engine_unstacked", 1))
    if not args.no_torch:
        sides.append(("torch", 1))
    for n, r in grid:
        if n * r > args.max_model_rounds and not args.only:
            trimmed.append({"models": n, "rounds": r})
            continue
        runs = alternate(__file__, {name: [
            "--child", name.split("_")[0], "--models", str(n), "--rounds", str(r),
            "--schedule", args.schedule, "--stack", str(width), "--device", args.device,
            "--engine-blas-threads", str(args.engine_blas_threads if args.device == "cpu" else 0)]
            for name, width in sides},
            args.repeats)
        cell: dict[str, Any] = {"models": n, "rounds": r}
        for name, got in runs.items():
            secs = sorted(g["seconds"] for g in got)
            cell[f"{name}_s"] = round(statistics.median(secs), 3)
            cell[f"{name}_runs_s"] = [round(v, 3) for v in secs]
            cell[f"{name}_last_loss"] = round(statistics.median(g["loss"] for g in got), 4)
        if "torch_s" in cell:
            cell["speedup"] = round(cell["torch_s"] / cell["engine_s"], 2)
        cells.append(cell)
        if not args.json:
            print(cell, flush=True)
    out = {"cells": cells, "trimmed": trimmed, "schedule": args.schedule, "stack": args.stack,
           "engine_blas_threads": args.engine_blas_threads,
           "repeats": args.repeats, "threads": threads, "samples": N_SAMPLES, "batch": BATCH,
           "device": args.device}
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
