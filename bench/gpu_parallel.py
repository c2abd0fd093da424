"""The CalcGraph paper's parallel execution (Sect. 4.5): within a device-memory budget
(5 GB), how many training processes of the paper's MLP (784-64-64-10, sigmoid, Adam,
full batch of 10,000 MNIST samples, as in its Sect. 4.3) run side by side, this engine
against PyTorch, and the total rounds per second of each.

- engine: the count is known before anything runs, from the plan:
  ``budget // (constant + heap)``, with ``heap`` = ``Program.total_bytes`` and
  ``constant`` the per-process cost besides the heap (``--constant``, e.g. the one
  ``bench/gpu_memory.py`` measured, else measured here as one engine process's peak
  minus its heap).  Then that many processes run, and the peak memory they hold together
  is checked against the budget (``engine_within_budget``).
- PyTorch: the count is found by trying, as the paper did: k processes, each capped at
  ``budget / k`` by ``torch.cuda.set_per_process_memory_fraction``, run a few rounds;
  k is accepted when every process finished and their peak together stayed within the
  budget.  The search starts at ``budget // (one process's peak)`` and steps by one up
  until a k fails, or down until one passes.

Memory is the device's used memory (NVML, sampled every 20 ms by this process, which
holds no CUDA context) above what was used before the processes started; on the CPU
(``--device cpu``), the sum of the processes' peak resident sets.  Throughput: each
process loads its data and model, then waits for a common start and trains for
``--seconds`` (each round synchronised); rounds per second summed over the processes.
The host's cores are shared out among the k processes of a group (``OMP_NUM_THREADS``
and ``OPENBLAS_NUM_THREADS`` at cores // k), for both sides alike.
The engine's and PyTorch's groups alternate over ``--repeats`` runs (medians), each
group's processes fresh.

    python bench/gpu_parallel.py --json                 # on a GPU machine
    python bench/gpu_parallel.py --json --device cpu --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import emit

SIZES = (784, 64, 64, 10)
ROWS = 10_000
SIDES = ("engine", "torch")


def parse_bytes(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    for u, f in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(u):
            return int(float(t[:-len(u)]) * f)
    return int(t)


# -- one training process ------------------------------------------------------------


class Trainer:
    """One side's model on one device, its data resident there; ``round()`` is one
    synchronised full-batch step."""

    def __init__(self, side: str, device: str, x: np.ndarray, y: np.ndarray,
                 fraction: float | None) -> None:
        self.side = side
        self.heap: int | None = None
        if side == "engine":
            from engine import VM, Adam, compile_graph
            from engine.models import paper_mlp
            from engine.runtime.backends import get_backend

            prog = compile_graph(paper_mlp(SIZES), batch_size=len(y), optimizer=Adam(lr=1e-3),
                                 device=device)
            self.vm = VM(prog, seed=0)
            self.vm.set("x", x)
            self.vm.set("y", y)
            self.backend = get_backend(device)
            self.heap = prog.total_bytes
            return
        import torch

        dev = "cuda" if device == "gpu" else "cpu"
        if dev == "cuda" and fraction is not None:
            torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0))
        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(784, 64), torch.nn.Sigmoid(), torch.nn.Linear(64, 64),
            torch.nn.Sigmoid(), torch.nn.Linear(64, 10)).to(dev)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3,
                                    fused=dev == "cuda", foreach=dev != "cuda")
        self.loss = torch.nn.CrossEntropyLoss()
        self.x, self.y = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
        self.cuda = dev == "cuda"

    def round(self) -> None:
        if self.side == "engine":
            self.vm.train_step("train")
            self.backend.synchronize()
            return
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(self.x), self.y).backward()
        self.opt.step()
        if self.cuda:
            self.torch.cuda.synchronize()


def worker(side: str, device: str, folder: str, seconds: float, fraction: float | None
           ) -> None:
    """Load, warm up, say ready (a file), wait for the start file, train for
    ``seconds``; print the rounds done (one JSON line)."""
    x, y = np.load(os.path.join(folder, "x.npy")), np.load(os.path.join(folder, "y.npy"))
    t = Trainer(side, device, x, y, fraction)
    t.round()
    open(os.path.join(folder, f"ready.{os.getpid()}"), "w").close()
    start = os.path.join(folder, "start")
    while not os.path.exists(start):
        time.sleep(0.005)
    rounds, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t.round()
        rounds += 1
    emit({"side": side, "rounds": rounds, "seconds": time.perf_counter() - t0,
          "heap": t.heap})


# -- a group of processes -------------------------------------------------------------


class Sampler:
    """The device's used memory, every 20 ms, in a thread of this (CUDA-free) process."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        last, t0 = -1, time.monotonic()  # let the last group's contexts finish going
        while (now := self.used()) != last and time.monotonic() - t0 < 3:
            last = now
            time.sleep(0.1)
        self.peak = self.baseline = now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.used())


def group(side: str, k: int, device: str, folder: str, seconds: float, budget: int,
          cap: bool, timeout: float) -> dict[str, Any]:
    """Run ``k`` processes of ``side`` side by side; their rounds per second and the
    memory they held together at the peak."""
    for f in os.listdir(folder):
        if f.startswith("ready.") or f == "start":
            os.remove(os.path.join(folder, f))
    args = [sys.executable, os.path.abspath(__file__), "--worker", side, "--device", device,
            "--data", folder, "--seconds", str(seconds)]
    if cap and side == "torch" and device == "gpu":
        args += ["--fraction", str(budget / k / gpu_total())]
    sampler = Sampler() if device == "gpu" else None
    procs: list[subprocess.Popen[str]] = []
    with sampler or _null():
        # the cores shared out: k processes with a thread pool of every core each spin
        # against one another (both libraries alike)
        threads = str(max(1, (os.cpu_count() or 1) // k))
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads}
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for _ in range(k)]
        deadline = time.monotonic() + timeout
        while (sum(f.startswith("ready.") for f in os.listdir(folder))
               + sum(p.poll() is not None for p in procs) < k  # a dead one is never ready
               and time.monotonic() < deadline):
            time.sleep(0.01)
        open(os.path.join(folder, "start"), "w").close()
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())
                                          + seconds + 30))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                outs.append((out, err + "\n(timed out)"))
    answers, errors = [], []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = out.strip().splitlines()
        if p.returncode == 0 and lines:
            answers.append(json.loads(lines[-1]))
        else:
            errors.append(f"exit {p.returncode}: {err[-600:]}")
    if sampler is not None:
        peak: int = sampler.peak - sampler.baseline
    else:
        peak = sum(a["peak_rss_bytes"] for a in answers)
    rate = sum(a["rounds"] / a["seconds"] for a in answers) if not errors else None
    return {"side": side, "processes": k, "ok": not errors and peak <= budget,
            "failed_processes": len(errors), "errors": errors[:3],
            "peak_bytes": peak, "within_budget": peak <= budget, "rounds_per_s": rate,
            "heap": answers[0]["heap"] if answers else None}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def gpu_total() -> int:
    from engine.runtime.backends import gpu_memory_bytes

    return gpu_memory_bytes(0)


def torch_count(device: str, folder: str, budget: int, cap: bool, timeout: float,
                limit: int, seconds: float) -> tuple[int, list[dict[str, Any]]]:
    """The most PyTorch processes that run within the budget, found by trying."""
    tries = [group("torch", 1, device, folder, seconds, budget, cap, timeout)]
    if not tries[0]["ok"]:
        return 0, tries
    k = max(1, min(limit, budget // max(1, tries[0]["peak_bytes"])))
    seen = {1: True}
    while True:  # up from a k that passed, down from one that failed, to the boundary
        if k not in seen:
            tries.append(group("torch", k, device, folder, seconds, budget, cap, timeout))
            seen[k] = tries[-1]["ok"]
        if seen[k]:
            if k >= limit or seen.get(k + 1) is False:
                break
            k += 1
        else:
            if k <= 1 or seen.get(k - 1):
                break
            k -= 1
    return max(n for n, ok in seen.items() if ok), tries


def write_data(folder: str, rows: int, synthetic: bool) -> str:
    if synthetic:
        rng = np.random.default_rng(0)
        x, y, source = rng.random((rows, 784), dtype=np.float32), rng.integers(0, 10, rows), \
            "synthetic"
    else:
        from explore.datasets import load_mnist

        ds = load_mnist()
        x, y, source = ds.train.x[:rows].copy(), ds.train.y[:rows].copy(), "mnist"
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)
    return source


def engine_constant(device: str, folder: str, seconds: float, timeout: float
                    ) -> tuple[int, int]:
    """One engine process alone: (its peak - its heap, its heap)."""
    r = group("engine", 1, device, folder, seconds, 1 << 62, False, timeout)
    if r["heap"] is None:
        raise RuntimeError(f"the engine process failed: {r['errors']}")
    return r["peak_bytes"] - r["heap"], r["heap"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--budget", default="5GB", help="device memory for all processes")
    ap.add_argument("--constant", type=int, default=None,
                    help="per-process bytes besides the heap (default: measured here)")
    ap.add_argument("--seconds", type=float, default=10.0, help="timed training per run")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs per side")
    ap.add_argument("--max-processes", type=int, default=64)
    ap.add_argument("--no-cap", action="store_true",
                    help="PyTorch processes uncapped: only their total is checked")
    ap.add_argument("--synthetic", action="store_true", help="random data, not MNIST")
    ap.add_argument("--smoke", action="store_true",
                    help="512 random rows, 600 MB, 2 processes at most, 0.3 s runs, 1 repeat")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds to get ready")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no repeat after this many seconds (repeats_done says)")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.device, args.data, args.seconds, args.fraction)
        return
    if args.smoke:
        args.budget, args.seconds, args.repeats = "600MB", 0.3, 1
        args.max_processes, args.synthetic = min(args.max_processes, 2), True
    budget, cap = parse_bytes(args.budget), not args.no_cap
    started = time.monotonic()
    rows = 512 if args.smoke else ROWS
    with tempfile.TemporaryDirectory() as folder:
        source = write_data(folder, rows, args.synthetic)
        t = min(args.seconds, 2.0)
        if args.constant is None:
            constant, heap = engine_constant(args.device, folder, t, args.timeout)
            constant_source = "one engine process alone: peak - heap"
        else:
            constant, heap = args.constant, engine_constant(args.device, folder, t,
                                                            args.timeout)[1]
            constant_source = "given"
        n_engine = min(args.max_processes, budget // (constant + heap))
        n_torch, tries = torch_count(args.device, folder, budget, cap, args.timeout,
                                     args.max_processes, t)
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        done = 0
        for i in range(args.repeats):
            if i and args.budget_s and time.monotonic() - started > args.budget_s:
                break
            done += 1
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                n = n_engine if side == "engine" else n_torch
                if n:
                    runs[side].append(group(side, n, args.device, folder, args.seconds,
                                            budget, cap, args.timeout))

    def med(side: str, key: str) -> Any:
        vals = [r[key] for r in runs[side] if r[key] is not None]
        return statistics.median(vals) if vals else None

    out = {
        "device": args.device, "budget_bytes": budget, "rows": rows, "data": source,
        "engine_heap_bytes": heap, "engine_constant_bytes": constant,
        "engine_constant_source": constant_source,
        "engine_processes": n_engine, "torch_processes": n_torch,
        "engine_rounds_per_s": med("engine", "rounds_per_s"),
        "torch_rounds_per_s": med("torch", "rounds_per_s"),
        "engine_peak_bytes": max((r["peak_bytes"] for r in runs["engine"]), default=None),
        "torch_peak_bytes": max((r["peak_bytes"] for r in runs["torch"]), default=None),
        "engine_within_budget": all(r["within_budget"] for r in runs["engine"]),
        "torch_cap": "set_per_process_memory_fraction(budget / k)" if cap else None,
        "torch_search": [{k: r[k] for k in ("processes", "ok", "peak_bytes",
                                               "failed_processes", "errors")} for r in tries],
        "runs": runs, "seconds": args.seconds, "repeats": args.repeats, "repeats_done": done,
        "memory_source": "nvml, device-wide, above the baseline" if args.device == "gpu"
        else "sum of the processes' peak RSS",
    }
    er, tr = out["engine_rounds_per_s"], out["torch_rounds_per_s"]
    out["throughput_ratio"] = er / tr if er and tr else None
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
