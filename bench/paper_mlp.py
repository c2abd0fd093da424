"""The CalcGraph paper's model (784-64-64-10, sigmoid, sigmoid, softmax + cross-entropy,
biases, Adam lr 1e-3) on 10,000 MNIST samples:

(a) full batch: one round = one step over all 10,000 samples;
(b) mini-batch 64: one epoch over the 10,000 samples, reported per step.

Three implementations, timed interleaved in one run, median of ``--repeats``:
this engine, PyTorch eager on the CPU (same thread count; the faster of its foreach
and fused Adam), and a hand-written numpy loop with preallocated buffers and ``out=``
(a flat parameter buffer so Adam is a few vectorised calls, as in the engine).
Peak RSS is measured in fresh subprocesses that train only one implementation.

    python bench/paper_mlp.py --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import VM, Adam, compile_graph
from engine.models import paper_mlp
from explore.datasets import load_mnist

N = 10_000
SIZES = (784, 64, 64, 10)


def data() -> tuple[np.ndarray, np.ndarray]:
    ds = load_mnist()
    return ds.train.x[:N].copy(), ds.train.y[:N].copy()


# -- this engine ---------------------------------------------------------------------


class EngineRunner:
    def __init__(self, batch: int) -> None:
        self.vm = VM(compile_graph(paper_mlp(SIZES), batch_size=batch, optimizer=Adam(lr=1e-3)))
        self.batch = batch

    def epoch(self, x: np.ndarray, y: np.ndarray) -> None:
        vm, b = self.vm, self.batch
        for s in range(0, len(y), b):
            vm.set("x", x[s:s + b])
            vm.set("y", y[s:s + b])
            vm.forward(0)
            vm.apply_loss(0)
            vm.backward(0)
            vm.optimize()

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        from engine.runtime.train import evaluate

        return evaluate(self.vm, x, y)


# -- PyTorch eager -------------------------------------------------------------------


class TorchRunner:
    def __init__(self, batch: int, fused: bool) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(784, 64), torch.nn.Sigmoid(),
            torch.nn.Linear(64, 64), torch.nn.Sigmoid(),
            torch.nn.Linear(64, 10),
        )
        kw = {"fused": True} if fused else {"foreach": True}
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, **kw)
        self.loss = torch.nn.CrossEntropyLoss()
        self.batch = batch

    def epoch(self, x: Any, y: Any) -> None:
        b, model, opt, loss = self.batch, self.model, self.opt, self.loss
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
            a = math.sqrt(6.0 / (fan_in + fan_out))
            self.P[i][...] = rng.uniform(-a, a, shapes[i])
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


# -- harness -----------------------------------------------------------------------------


def blas_threads() -> int:
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        return int(info[0]["num_threads"]) if info else os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def interleaved(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():  # warm-up
        f()
    for _ in range(repeats):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def pick_torch(batch: int, xt: Any, yt: Any) -> TorchRunner:
    """The faster of torch's foreach and fused Adam for this batch (the best baseline)."""
    best, best_t = None, float("inf")
    for fused in (False, True):
        r = TorchRunner(batch, fused)
        r.epoch(xt, yt)
        t0 = time.perf_counter()
        for _ in range(2):
            r.epoch(xt, yt)
        t = time.perf_counter() - t0
        if t < best_t:
            best, best_t = r, t
    assert best is not None
    return best


def peak_rss(which: str, x: np.ndarray, y: np.ndarray) -> int:
    """Peak RSS (bytes) of a fresh process that trains one implementation for five
    full-batch rounds.  The 10,000 samples reach it as a .npy pair, so the peak is not
    that of unpickling the whole of MNIST."""
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y)
        out = subprocess.run([sys.executable, __file__, "--rss-child", which, "--data", d],
                             check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def rss_child(which: str, folder: str) -> None:
    x = np.load(os.path.join(folder, "x.npy"))
    y = np.load(os.path.join(folder, "y.npy"))
    if which == "engine":
        r: Any = EngineRunner(N)
        for _ in range(5):
            r.epoch(x, y)
    else:
        import torch

        torch.set_num_threads(blas_threads())
        r = TorchRunner(N, fused=False)
        for _ in range(5):
            r.epoch(torch.from_numpy(x), torch.from_numpy(y))
    print(vm_hwm())


def vm_hwm() -> int:
    """Peak resident set of this process image in bytes.  /proc's VmHWM belongs to the
    address space, unlike ru_maxrss, which Linux carries over from the forking parent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rss-child", choices=["engine", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.data)
        return
    import torch

    threads = blas_threads()
    torch.set_num_threads(threads)
    x, y = data()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    full = interleaved({
        "engine": (lambda r: lambda: r.epoch(x, y))(EngineRunner(N)),
        "torch": (lambda r: lambda: r.epoch(xt, yt))(pick_torch(N, xt, yt)),
        "numpy": (lambda r: lambda: r.epoch(x, y))(NumpyRunner(N)),
    }, args.repeats)
    steps = math.ceil(N / 64)
    mini = interleaved({
        "engine": (lambda r: lambda: r.epoch(x, y))(EngineRunner(64)),
        "torch": (lambda r: lambda: r.epoch(xt, yt))(pick_torch(64, xt, yt)),
        "numpy": (lambda r: lambda: r.epoch(x, y))(NumpyRunner(64)),
    }, args.repeats)
    heap = compile_graph(paper_mlp(SIZES), batch_size=N, optimizer=Adam()).total_bytes
    result = {
        "engine_ms_full": full["engine"] * 1e3,
        "torch_ms_full": full["torch"] * 1e3,
        "numpy_ms_full": full["numpy"] * 1e3,
        "engine_us_step64": mini["engine"] / steps * 1e6,
        "torch_us_step64": mini["torch"] / steps * 1e6,
        "numpy_us_step64": mini["numpy"] / steps * 1e6,
        "engine_heap_bytes": heap,
        "engine_peak_rss_bytes": peak_rss("engine", x, y),
        "torch_peak_rss_bytes": peak_rss("torch", x, y),
        "threads": threads,
        "repeats": args.repeats,
    }
    result["speedup_vs_torch_full"] = result["torch_ms_full"] / result["engine_ms_full"]
    result["speedup_vs_torch_step64"] = result["torch_us_step64"] / result["engine_us_step64"]
    result["ratio_to_numpy_full"] = result["engine_ms_full"] / result["numpy_ms_full"]
    result["ratio_to_numpy_step64"] = result["engine_us_step64"] / result["numpy_us_step64"]
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>26}: {v:,.3f}" if isinstance(v, float) else f"{k:>26}: {v:,}")


if __name__ == "__main__":
    main()
