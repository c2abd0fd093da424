"""The CalcGraph paper's model (784-64-64-10, sigmoid, sigmoid, softmax + cross-entropy,
biases, Adam lr 1e-3) on 10,000 MNIST samples:

(a) full batch: one round = one step over all 10,000 samples;
(b) mini-batch 64: one epoch over the 10,000 samples, reported per step.

Three implementations: this engine, PyTorch eager on the CPU (``torch.set_num_threads``
at the cores; its foreach and its fused Adam are both timed and the faster one is the
baseline, named in ``torch_adam_*``), and a hand-written numpy loop with preallocated
buffers and ``out=`` (a flat parameter buffer so Adam is a few vectorised calls, as in
the engine).  Each side of each case runs in its own fresh process (``bench/_sides.py``:
PyTorch's OpenMP pool and OpenBLAS's pool spinning against each other on two cores
slowed PyTorch by up to 2.3x when they shared one), which loads the 10,000 samples
from a .npy pair, warms up, and times several rounds; the sides alternate across
``--repeats`` (default 5) fresh processes each and the median of the processes'
medians is reported.  Peak RSS (``/proc/self/status`` VmHWM) comes from the same
processes: the largest over the repeats, of the full-batch case unless suffixed
``_step64``.  ``--compile`` adds ``torch.compile`` as an extra column (not a baseline
of the ratios).  ``--device gpu`` runs the engine (cupy) and PyTorch (CUDA) on the GPU,
each copying every batch from host memory as it trains and synchronising the device
at the end of each timed round; the numpy loop stays on the CPU, for reference.

    python bench/paper_mlp.py --json

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, cores, emit, fastest, median

N = 10_000
SIZES = (784, 64, 64, 10)
CASES = {"full": N, "step64": 64}  # case: batch
ADAMS = ("foreach", "fused")


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    from explore.datasets import load_mnist

    ds = load_mnist()
    return ds.train.x[:n].copy(), ds.train.y[:n].copy()


# -- this engine ---------------------------------------------------------------------


class EngineRunner:
    def __init__(self, batch: int, device: str = "cpu") -> None:
        from engine import VM, Adam, compile_graph
        from engine.models import paper_mlp
        from engine.runtime.backends import get_backend

        self.vm = VM(compile_graph(paper_mlp(SIZES), batch_size=batch, optimizer=Adam(lr=1e-3),
                                   device=device))
        self.batch = batch
        self.sync = get_backend(device).synchronize

    def epoch(self, x: np.ndarray, y: np.ndarray) -> None:
        vm, b = self.vm, self.batch
        for s in range(0, len(y), b):
            vm.set("x", x[s:s + b])
            vm.set("y", y[s:s + b])
            vm.forward(0)
            vm.apply_loss(0)
            vm.backward(0)
            vm.optimize()
        self.sync()

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        from engine.runtime.train import evaluate

        return evaluate(self.vm, x, y)


# -- PyTorch eager -------------------------------------------------------------------


class TorchRunner:
    def __init__(self, batch: int, adam: str, compiled: bool = False,
                 device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.dev = "cuda" if device == "gpu" else "cpu"
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(784, 64), torch.nn.Sigmoid(),
            torch.nn.Linear(64, 64), torch.nn.Sigmoid(),
            torch.nn.Linear(64, 10),
        ).to(self.dev)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=adam == "fused",
                                    foreach=adam == "foreach")
        self.loss = torch.nn.CrossEntropyLoss()
        self.batch = batch
        # torch.compile (inductor, C++ on the CPU) of the model's forward; the backward
        # is compiled by AOTAutograd with it.  Not what the issue compares against.
        self.forward: Any = torch.compile(self.model) if compiled else self.model

    def epoch(self, x: Any, y: Any) -> None:
        b, model, opt, loss = self.batch, self.forward, self.opt, self.loss
        if self.dev == "cuda":  # each batch from host memory, as the engine's
            for s in range(0, len(y), b):
                opt.zero_grad(set_to_none=True)
                loss(model(x[s:s + b].to("cuda")), y[s:s + b].to("cuda")).backward()
                opt.step()
            self.torch.cuda.synchronize()
            return
        for s in range(0, len(y), b):
            opt.zero_grad(set_to_none=True)
            loss(model(x[s:s + b]), y[s:s + b]).backward()
            opt.step()


# -- hand-written numpy ------------------------------------------------------------------


class NumpyRunner:
    """The same network, written by hand as fast as numpy allows: one flat parameter
    buffer (so Adam is vectorised over all parameters), every activation and gradient
    preallocated, every call with ``out=``."""

    def __init__(self, batch: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        shapes = []
        for a, b in itertools.pairwise(SIZES):
            shapes += [(a, b), (b,)]
        n = sum(math.prod(s) for s in shapes)
        self.p = np.zeros(n, np.float32)
        self.g = np.zeros(n, np.float32)
        self.m = np.zeros(n, np.float32)
        self.v = np.zeros(n, np.float32)
        self.s = np.zeros(n, np.float32)
        self.P, self.G, o = [], [], 0
        for shp in shapes:
            k = math.prod(shp)
            self.P.append(self.p[o:o + k].reshape(shp))
            self.G.append(self.g[o:o + k].reshape(shp))
            o += k
        for i in range(0, len(shapes), 2):
            fan_in, fan_out = shapes[i]
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            self.P[i][...] = rng.uniform(-bound, bound, shapes[i])
        self.batch = batch
        self.t = 0
        self._bufs: dict[int, dict[str, np.ndarray]] = {}

    def bufs(self, b: int) -> dict[str, np.ndarray]:
        if b not in self._bufs:
            f = np.float32
            self._bufs[b] = {
                "x": np.empty((b, 784), f), "h1": np.empty((b, 64), f),
                "h2": np.empty((b, 64), f), "z": np.empty((b, 10), f),
                "row": np.empty((b, 1), f), "e": np.empty((b, 10), f),
                "d2": np.empty((b, 64), f), "d1": np.empty((b, 64), f),
                "idx": np.empty(b, np.int64), "pick": np.empty(b, f), "lp": np.empty(b, f),
                "y": np.empty(b, np.int64),
            }
        return self._bufs[b]

    @staticmethod
    def _sigmoid(z: np.ndarray) -> None:
        np.multiply(z, 0.5, out=z)
        np.tanh(z, out=z)
        np.multiply(z, 0.5, out=z)
        np.add(z, 0.5, out=z)

    def step(self, xb: np.ndarray, yb: np.ndarray) -> None:
        b = len(yb)
        B = self.bufs(b)
        x, h1, h2, z, row, e = B["x"], B["h1"], B["h2"], B["z"], B["row"], B["e"]
        w0, b0, w1, b1, w2, b2 = self.P
        gw0, gb0, gw1, gb1, gw2, gb2 = self.G
        np.copyto(x, xb)
        np.copyto(B["y"], yb)
        # forward
        np.matmul(x, w0, out=h1)
        np.add(h1, b0, out=h1)
        self._sigmoid(h1)
        np.matmul(h1, w1, out=h2)
        np.add(h2, b1, out=h2)
        self._sigmoid(h2)
        np.matmul(h2, w2, out=z)
        np.add(z, b2, out=z)
        # softmax cross-entropy gradient: (softmax(z) - onehot) / b
        np.max(z, axis=1, keepdims=True, out=row)
        np.subtract(z, row, out=e)
        np.exp(e, out=e)
        np.sum(e, axis=1, keepdims=True, out=row)
        np.divide(e, row, out=e)
        idx = B["idx"]
        idx.fill(10)
        np.cumsum(idx, out=idx)
        np.subtract(idx, 10, out=idx)
        np.add(idx, B["y"], out=idx)
        flat = e.reshape(-1)
        np.take(flat, idx, out=B["pick"], mode="clip")
        # the loss, as the engine and torch compute it: -mean(log p[label])
        np.log(B["pick"], out=B["lp"])
        self.loss = -float(np.sum(B["lp"])) / b
        np.subtract(B["pick"], 1, out=B["pick"])
        np.put(flat, idx, B["pick"], mode="clip")
        np.multiply(e, 1.0 / b, out=e)
        # backward
        np.matmul(h2.T, e, out=gw2)
        np.sum(e, axis=0, out=gb2)
        d2, d1 = B["d2"], B["d1"]
        np.matmul(e, w2.T, out=d2)
        np.subtract(1, h2, out=d1)  # d1 is free until dL/dh1: use it for h2 (1 - h2)
        np.multiply(d1, h2, out=d1)
        np.multiply(d2, d1, out=d2)
        np.matmul(h1.T, d2, out=gw1)
        np.sum(d2, axis=0, out=gb1)
        np.matmul(d2, w1.T, out=d1)
        np.subtract(1, h1, out=h2)  # h2 is dead now: reuse it as scratch
        np.multiply(h2, h1, out=h2)
        np.multiply(d1, h2, out=d1)
        np.matmul(x.T, d1, out=gw0)
        np.sum(d1, axis=0, out=gb0)
        # Adam over the flat buffer
        self.t += 1
        p, g, m, v, s = self.p, self.g, self.m, self.v, self.s
        np.multiply(m, 0.9, out=m)
        np.multiply(g, 0.1, out=s)
        np.add(m, s, out=m)
        np.multiply(v, 0.999, out=v)
        np.multiply(g, g, out=s)
        np.multiply(s, 0.001, out=s)
        np.add(v, s, out=v)
        bc1, bc2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        np.sqrt(v, out=s)
        np.multiply(s, 1 / math.sqrt(bc2), out=s)
        np.add(s, 1e-8, out=s)
        np.divide(m, s, out=s)
        np.multiply(s, 1e-3 / bc1, out=s)
        np.subtract(p, s, out=p)

    def epoch(self, x: np.ndarray, y: np.ndarray) -> None:
        b = self.batch
        for s in range(0, len(y), b):
            self.step(x[s:s + b], y[s:s + b])


# -- one side, in its own process ---------------------------------------------------------


def child(side: str, case: str, folder: str, rounds: int, device: str = "cpu") -> None:
    """Train one implementation on the samples in ``folder``: one warm-up round (two at
    full batch), then ``rounds`` timed ones; print their median and this process's peak."""
    x = np.load(os.path.join(folder, "x.npy"))
    y = np.load(os.path.join(folder, "y.npy"))
    batch = min(CASES[case], len(y))
    extra: dict[str, Any] = {}
    if side == "engine":
        r: Any = EngineRunner(batch, device)
        extra["heap_bytes"] = r.vm.program.total_bytes
    elif side == "numpy":
        r = NumpyRunner(batch)
    else:
        import torch

        torch.set_num_threads(cores())
        adam = side.split("_")[-1] if side != "torch_compile" else "fused"
        r = TorchRunner(batch, adam, compiled=side == "torch_compile", device=device)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(2 if case == "full" else 1):  # warm-up (torch.compile compiles here)
        r.epoch(x, y)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        r.epoch(x, y)
        times.append(time.perf_counter() - t0)
    emit({"seconds": statistics.median(times), "rounds_s": times,
          "steps": math.ceil(len(y) / batch), **extra})


# -- the comparison ------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5,
                    help="fresh processes per side and case, alternating; the median is kept")
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile (an extra column, not a baseline)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1,024 samples, two timed rounds per process")
    ap.add_argument("--log", action="store_true", help="each child's answer on stderr")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                    help="where the engine and PyTorch train (numpy: always the CPU)")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        child(args.side, args.case, args.data, args.rounds, args.device)
        return
    n = 1024 if args.quick else N
    sides = ["engine", "numpy", *(f"torch_{a}" for a in ADAMS)]
    sides += ["torch_compile"] if args.compile else []
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        x, y = data(n)
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y)
        runs = {case: alternate(__file__, {s: [
            "--side", s, "--case", case, "--data", d, "--device", args.device,
            "--rounds", str(2 if args.quick else 10 if case == "full" else 5)]
            for s in sides}, args.repeats, log=args.log) for case in CASES}
    for case, unit, scale in (("full", "ms", 1e3), ("step64", "us", 1e6)):
        steps = runs[case]["engine"][0]["steps"]
        t = {s: median(runs[case][s], "seconds") / steps * scale for s in sides}
        adam = fastest({a: t[f"torch_{a}"] for a in ADAMS})
        torch_side = f"torch_{adam}"
        for name, side in (("engine", "engine"), ("torch", torch_side), ("numpy", "numpy")):
            result[f"{name}_{unit}_{case}"] = t[side]
            result[f"{name}_{unit}_{case}_runs"] = [r["seconds"] / steps * scale
                                                    for r in runs[case][side]]
            suffix = "" if case == "full" else "_step64"
            result[f"{name}_peak_rss_bytes{suffix}"] = max(r["peak_rss_bytes"]
                                                          for r in runs[case][side])
        result[f"torch_adam_{case}"] = adam
        result[f"torch_{unit}_{case}_by_adam"] = {a: t[f"torch_{a}"] for a in ADAMS}
        if args.compile:
            result[f"torch_compile_{unit}_{case}"] = t["torch_compile"]
        result[f"speedup_vs_torch_{case}"] = t[torch_side] / t["engine"]
        result[f"ratio_to_numpy_{case}"] = t["engine"] / t["numpy"]
    result.update({"engine_heap_bytes": runs["full"]["engine"][0]["heap_bytes"],
                   "threads": cores(), "repeats": args.repeats, "samples": n,
                   "device": args.device,
                   "isolation": "each side in a fresh process, alternating; medians"})
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>30}: {v:,.3f}" if isinstance(v, float) else f"{k:>30}: {v}")


if __name__ == "__main__":
    main()
