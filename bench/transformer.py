"""A transformer encoder's training step, this engine against PyTorch eager, and the
largest batch each trains within a memory budget.

The model: a Linear projection of a ``[batch, L, F]`` sequence to ``d_model``, a
``TransformerEncoder`` of pre-norm ``TransformerEncoderLayer`` (GELU, dropout 0,
``batch_first``), the mean over the sequence, a Linear head and cross-entropy; Adam at
lr 1e-3.  ``engine.nn`` and ``torch.nn`` build it with the same classes, parameter
names and shapes (the weights are each library's own draw).  Cases (``CASES``):
``mnist_rows`` (MNIST read row by row: L=28, F=28, d_model 64, 4 heads, 2 layers,
feed-forward 128, 10 classes, batch 64) and ``long`` (L=128, batch 32).

1. **Step time**, as ``bench/cnn_step.py`` measures it: each side in its own fresh
   process (``bench/_sides.py``), the sides alternating over ``--repeats`` processes
   each, a process's time the median of 7 samples of 10 steps, the median over the
   processes reported.  PyTorch runs ``torch.set_num_threads`` at the cores with its
   fused and its foreach Adam, each a side; the faster is the baseline
   (``torch_adam``).  Its encoder's fast path is for inference only, so training runs
   its ordinary path (attention by ``scaled_dot_product_attention``).  Also the time
   of each kind of instruction of the engine's step (``engine_ms_by_op``).
2. **Largest batch in a budget** (``--budgets``, MiB; the ``mnist_rows`` shapes): the
   engine's is what ``compile_graph(graph, memory=budget)`` finds, the largest batch
   whose planned bytes (parameters, gradients, Adam's moments, activations, the batch
   itself and scratch: the arena the engine allocates, and all it allocates per step)
   fit.  PyTorch plans nothing, so its number is measured: a probe process trains at
   batch ``b`` and reports the step's peak resident memory over its own baseline
   (after the model, Adam and one step at batch 1, so that code pages, thread pools and
   Adam's moments are in the baseline), to which the exact bytes of the parameters and
   Adam's two moments are added back (``torch_bytes``).  The peak is Linux's VmHWM,
   reset at the baseline through ``/proc/self/clear_refs``.  A search over ``b`` (one
   fresh process per probe; interpolation, falling back to bisection) finds the
   largest batch whose ``torch_bytes`` fit; every probe is in the JSON.  Resident
   memory counts pages, not tensors: it includes the allocator's fragmentation and
   oneDNN's scratch, which is memory the step needs, and it can miss up to the few
   hundred KiB freed by the batch-1 step that malloc keeps for reuse.  The same
   measurement of the engine's step (``engine_rss_growth_bytes``) shows what its
   planned bytes leave out (the Python objects of a step, none of them batch-sized).

``--device gpu`` runs the engine (cupy) and PyTorch (CUDA) on the GPU, the batch copied
from host memory at each step and the device synchronised before each sample's clock
stops; PyTorch's bytes are then ``torch.cuda.max_memory_allocated`` over the step (its
tensors, exactly; the caching allocator reserves more).  Without cupy and a CUDA
device for both, the JSON says ``skipped`` and why.

    python bench/transformer.py --json
    python bench/transformer.py --quick --repeats 1 --json   # a smoke run, tiny shapes

Measured on the shared 2-core machine (2026-11-27, under other work: the processes'
times spread 3x; ``bench/results/cpu-2026-11-27/transformer.json``): mnist_rows 29.9 ms
per step against PyTorch's 23.0 (fused Adam), long 84.1 against 54.8; in 64 MiB the
engine plans batch 96 and PyTorch measures 184, in 256 MiB 391 and 791 (the engine's
plan grows by 682 KB a sample, PyTorch's resident memory by about 366 KB).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, cores, emit, fastest, median, peak_rss, run_side
from bench.cnn_step import engine_step

ADAMS = ("fused", "foreach")
MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    """One model and batch: a ``[batch, L, F]`` sequence, ``layers`` encoder layers."""

    L: int
    F: int
    d_model: int
    nhead: int
    layers: int
    ff: int
    classes: int
    batch: int


CASES = {
    "mnist_rows": Case(L=28, F=28, d_model=64, nhead=4, layers=2, ff=128, classes=10, batch=64),
    "long": Case(L=128, F=28, d_model=64, nhead=4, layers=2, ff=128, classes=10, batch=32),
    # --quick: small enough that a smoke run's time is mostly starting processes
    "tiny": Case(L=8, F=8, d_model=16, nhead=2, layers=1, ff=32, classes=10, batch=8),
}
BUDGETS_MIB = (64, 256)


# -- the model, in each library ------------------------------------------------------------


def engine_graph(case: Case) -> Any:
    """The model traced into a CalcGraph (``train`` path: cross-entropy on ``y``)."""
    from engine import nn

    try:
        from engine.nn.transformer import TransformerEncoder, TransformerEncoderLayer
    except ImportError:  # should the layers move, engine.nn still exports them
        from engine.nn import TransformerEncoder, TransformerEncoderLayer

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(case.F, case.d_model)
            layer = TransformerEncoderLayer(case.d_model, case.nhead, case.ff, dropout=0.0,
                                            activation="gelu", batch_first=True,
                                            norm_first=True)
            self.encoder = TransformerEncoder(layer, case.layers)
            self.head = nn.Linear(case.d_model, case.classes)

        def forward(self, x: Any) -> Any:
            return self.head(self.encoder(self.proj(x)).mean(1))

    nn.manual_seed(0)
    return nn.to_graph(Model(), inputs={"x": (0, case.L, case.F)}, loss="cross_entropy")


def torch_model(case: Case) -> Any:
    import torch

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(case.F, case.d_model)
            layer = torch.nn.TransformerEncoderLayer(
                case.d_model, case.nhead, case.ff, dropout=0.0, activation="gelu",
                batch_first=True, norm_first=True)
            # the nested-tensor fast path is inference's; off, it does not warn about
            # norm_first, and training is unchanged
            self.encoder = torch.nn.TransformerEncoder(layer, case.layers,
                                                       enable_nested_tensor=False)
            self.head = torch.nn.Linear(case.d_model, case.classes)

        def forward(self, x: Any) -> Any:
            return self.head(self.encoder(self.proj(x)).mean(1))

    torch.manual_seed(0)
    return Model()


def batch_data(case: Case, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.random((batch, case.L, case.F), dtype=np.float32),
            rng.integers(0, case.classes, batch))


def engine_program(case: Case, device: str, batch: int | None = None,
                   memory: int | None = None) -> Any:
    """The model compiled with Adam, for ``batch`` or for the largest batch in ``memory``."""
    from engine import Adam, compile_graph

    return compile_graph(engine_graph(case), batch_size=batch, memory=memory,
                         optimizer=Adam(lr=1e-3), device=device)


class TorchTrainer:
    """The PyTorch side: the model, Adam (``fused`` or ``foreach``), and its step on a
    batch from host memory (copied to the GPU at each step, as the engine's ``set``)."""

    def __init__(self, case: Case, adam: str, device: str) -> None:
        import torch

        torch.set_num_threads(cores())
        self.torch = torch
        self.dev = "cuda" if device == "gpu" else "cpu"
        self.model = torch_model(case).to(self.dev)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=adam == "fused",
                                    foreach=adam == "foreach")
        self.loss = torch.nn.CrossEntropyLoss()

    def step_fn(self, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
        xt, yt = self.torch.from_numpy(x), self.torch.from_numpy(y)
        model, opt, loss, dev = self.model, self.opt, self.loss, self.dev

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss(model(xt.to(dev)), yt.to(dev)).backward()
            opt.step()

        return step

    def state_bytes(self) -> int:
        """The parameters and Adam's two moments: what lives between steps."""
        return 3 * sum(p.numel() * p.element_size() for p in self.model.parameters())

    def sync(self) -> None:
        if self.dev == "cuda":
            self.torch.cuda.synchronize()


# -- timing ---------------------------------------------------------------------------------


def timed(step: Callable[[], None], sync: Callable[[], None], n: int) -> float:
    """Milliseconds per call over ``n`` back-to-back calls, the device synchronised."""
    sync()
    t = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t) / n * 1e3


def op_breakdown(vm: Any, sync: Callable[[], None], repeats: int) -> dict[str, float]:
    """Milliseconds per step spent in each instruction kind (forward and backward) and
    in the optimizer update, each bound step timed on its own (as ``cnn_step.py``)."""
    prog, b = vm.program, vm._binding
    path = prog.path_index("train")
    pc = prog.paths[path]
    kinds = [prog.instrs[k].op for k in (*pc.forward, *pc.backward)]
    steps = [*b.forward[path], *next(iter(b.backward.values()))]
    out: dict[str, float] = {}
    for kind, f in zip(kinds, steps, strict=True):
        out[kind] = out.get(kind, 0.0) + timed(f, sync, repeats)
    out["optimizer update"] = sum(timed(f, sync, repeats) for f in vm._flat_update)
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def step_child(side: str, case: Case, samples: int, steps: int, device: str) -> None:
    """One side's step time in this (fresh) process: warm up, then ``samples`` samples
    of ``steps`` steps; their median, and for the engine the per-instruction breakdown."""
    x, y = batch_data(case, case.batch)
    extra: dict[str, Any] = {}
    if side == "engine":
        from engine import VM
        from engine.runtime.backends import get_backend

        vm = VM(engine_program(case, device, batch=case.batch), seed=0)
        sync = get_backend(device).synchronize
        step = engine_step(vm, x, y)
        extra["planned_bytes"] = vm.program.total_bytes
    else:
        trainer = TorchTrainer(case, side.removeprefix("torch_"), device)
        sync, step = trainer.sync, trainer.step_fn(x, y)
    timed(step, sync, 3)  # warm up
    ms = [timed(step, sync, steps) for _ in range(samples)]
    if side == "engine":
        extra["ms_by_op"] = op_breakdown(vm, sync, steps)
    emit({"ms_step": statistics.median(ms), "samples_ms": ms, **extra})


# -- memory ------------------------------------------------------------------------------


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")


def rss_baseline() -> tuple[int, str]:
    """This process's resident bytes now, with the peak (VmHWM) reset to it where Linux
    allows (``/proc/self/clear_refs``), and the name of the method: ``reset_peak``, or
    ``peak_so_far`` (the peak since the start; a step's growth beneath an earlier peak
    then reads as 0, an underestimate)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmRSS:") * 1024, "reset_peak"
    except OSError:
        return peak_rss(), "peak_so_far"


def memory_child(side: str, case: Case, device: str, batch: int | None,
                 budget: int | None) -> None:
    """One probe in this (fresh) process.  The engine: compile for ``budget`` and train
    two steps at the batch found.  PyTorch: train two steps at ``batch`` after a warm
    step at batch 1.  Each: the step's peak memory over its baseline."""
    if side == "engine":
        from engine import VM, Adam, size
        from engine.runtime.backends import get_backend

        prog = engine_program(case, device, memory=budget)
        b = prog.batch_size
        after = sum(size(engine_graph(case), b + 1, Adam(lr=1e-3), device).values())
        # as PyTorch's probe: a warm step at batch 1 first, which loads the kernels (numba
        # compiles them at a VM's first use: code, not data, and not the batch's)
        engine_step(VM(engine_program(case, device, batch=1), seed=0), *batch_data(case, 1))()
        x, y = batch_data(case, b)
        base, method = rss_baseline()  # compiled and warm; the arena is allocated by VM()
        vm = VM(prog, seed=0)
        step = engine_step(vm, x, y)
        step()
        step()
        get_backend(device).synchronize()
        # on the GPU the arena is device memory, which the host's RSS does not see
        growth = _status_kib("VmHWM:") * 1024 - base if device == "cpu" else None
        emit({"batch": b, "planned_bytes": prog.total_bytes,
              "planned_bytes_by_zone": {z: m["planned"] for z, m in prog.memory.items()},
              "heap_bytes": vm.allocated_bytes, "planned_bytes_next_batch": after,
              "rss_growth_bytes": growth, "rss_method": method})
        return
    assert batch is not None
    trainer = TorchTrainer(case, side.removeprefix("torch_"), device)
    trainer.step_fn(*batch_data(case, 1))()  # code pages, thread pools, Adam's moments
    trainer.opt.zero_grad(set_to_none=True)
    x, y = batch_data(case, batch)
    if device == "gpu":
        torch = trainer.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step = trainer.step_fn(x, y)
        step()
        step()
        torch.cuda.synchronize()
        emit({"batch": batch, "bytes": int(torch.cuda.max_memory_allocated()),
              "state_bytes": trainer.state_bytes(), "growth_bytes": None,
              "method": "torch.cuda.max_memory_allocated"})
        return
    base, method = rss_baseline()
    # the batch is a view of host data (from_numpy), as a slice of a data set in memory
    # is, so it is not counted; the engine's plan holds a copy of it (on the GPU, both)
    step = trainer.step_fn(x, y)
    step()
    step()
    growth = _status_kib("VmHWM:") * 1024 - base
    emit({"batch": batch, "bytes": growth + trainer.state_bytes(),
          "state_bytes": trainer.state_bytes(), "growth_bytes": growth,
          "method": f"rss_{method}"})


def largest_within(measure: Callable[[int], int], budget: int, start: int = 1,
                   max_probes: int | None = None, cap: int = 1 << 20
                   ) -> tuple[int, dict[int, int], bool]:
    """The largest batch ``b`` with ``measure(b) <= budget`` (``measure`` growing with
    ``b``; 0 when batch 1 does not fit), each batch measured at most once: a bracket
    from ``start`` by doubling or halving, then interpolation within it (memory grows
    about linearly with the batch) and the interpolated batch's neighbour across the
    boundary, a bisection whenever those did not halve the bracket.  Returns the batch,
    the measurements, and whether the search ended (False when ``max_probes`` stopped
    it first: the batch is then one that fits).

    >>> largest_within(lambda b: 1000 + 10 * b, 2000, start=50)
    (100, {50: 1500, 100: 2000, 200: 3000, 101: 2010}, True)
    """
    seen: dict[int, int] = {}

    class Stop(Exception):
        pass

    def fits(b: int) -> bool:
        if b not in seen:
            if max_probes is not None and len(seen) >= max_probes:
                raise Stop
            seen[b] = measure(b)
        return seen[b] <= budget

    lo = hi = 0  # fits(lo), not fits(hi)
    try:
        b = max(1, min(start, cap))
        if fits(b):
            lo = b
            while not hi:  # double until a batch does not fit
                if lo >= cap:
                    return lo, seen, True
                b = min(2 * lo, cap)
                if fits(b):
                    lo = b
                else:
                    hi = b
        else:
            hi = b
            while not lo:  # halve until a batch fits
                if hi == 1:
                    return 0, seen, True
                b = hi // 2
                if fits(b):
                    lo = b
                else:
                    hi = b
        interpolate = True
        while hi - lo > 1:
            width = hi - lo
            if interpolate and seen[hi] > seen[lo]:
                b = lo + (budget - seen[lo]) * width // (seen[hi] - seen[lo])
                b = min(max(b, lo + 1), hi - 1)
                if fits(b):
                    lo = b
                else:
                    hi = b
                if hi - lo > 1:  # its neighbour across: where memory is linear, the end
                    b = lo + 1 if lo == b else hi - 1
                    if fits(b):
                        lo = b
                    else:
                        hi = b
            else:
                b = (lo + hi) // 2
                if fits(b):
                    lo = b
                else:
                    hi = b
            interpolate = 2 * (hi - lo) <= width
    except Stop:
        return lo, seen, False
    return lo, seen, True


def torch_probe(probes: dict[int, dict[str, Any]], common: list[str], mib: float, b: int
                ) -> int:
    """PyTorch's bytes for a step at batch ``b``, from a fresh probe process (its answer
    kept in ``probes``)."""
    r = run_side(__file__, ["--memory-side", "torch_fused", "--batch", str(b), *common])
    probes[b] = r
    print(f"  torch probe at {mib:g} MiB: batch {b}: {r['bytes']:,} bytes", file=sys.stderr,
          flush=True)
    return int(r["bytes"])


def budget_comparison(case_name: str, budgets_mib: list[float], device: str,
                      max_probes: int | None, log: bool) -> dict[str, Any]:
    """Per budget: the engine's largest batch and planned bytes, and PyTorch's largest
    batch by a search over fresh probe processes."""
    common = ["--case", case_name, "--device", device]
    out = []
    for mib in budgets_mib:
        budget = int(mib * MiB)
        eng = run_side(__file__, ["--memory-side", "engine", "--budget", str(budget), *common])
        if log:
            print(f"  engine at {mib} MiB: {eng}", file=sys.stderr, flush=True)
        probes: dict[int, dict[str, Any]] = {}
        tb, _, exact = largest_within(partial(torch_probe, probes, common, mib), budget,
                                      start=max(1, eng["batch"]), max_probes=max_probes)
        over = [b for b in probes if b > tb]
        nxt = probes[min(over)]["bytes"] if over else None
        at = probes.get(tb, {})
        out.append({
            "budget_bytes": budget, "budget_mib": mib,
            "engine_batch": eng["batch"], "engine_planned_bytes": eng["planned_bytes"],
            "engine_planned_bytes_by_zone": eng["planned_bytes_by_zone"],
            "engine_heap_bytes": eng["heap_bytes"],
            "engine_planned_bytes_next_batch": eng["planned_bytes_next_batch"],
            "engine_rss_growth_bytes": eng["rss_growth_bytes"],
            "torch_batch": tb, "torch_bytes": at.get("bytes"),
            "torch_state_bytes": at.get("state_bytes"),
            "torch_growth_bytes": at.get("growth_bytes"),
            "torch_bytes_first_over": nxt, "torch_search_complete": exact,
            "torch_probes": {str(b): probes[b]["bytes"] for b in sorted(probes)},
            "engine_batch_over_torch": round(eng["batch"] / tb, 2) if tb else None})
    shape = {k: v for k, v in asdict(CASES[case_name]).items() if k != "batch"}
    return {"case": case_name, "shape": shape,
            "torch_adam": "fused", "torch_measure": probes_method(device),
            "engine_measure": "planned bytes: the arena compile_graph(memory=budget) sizes, "
                              "all the engine allocates for a step",
            "budgets": out}


def probes_method(device: str) -> str:
    if device == "gpu":
        return ("torch.cuda.max_memory_allocated over two steps after a warm step at "
                "batch 1 (the parameters and Adam's moments included)")
    return ("peak RSS growth over two steps, over the process after the model, Adam and "
            "a warm step at batch 1, plus the bytes of the parameters and Adam's moments")


# -- the comparison ------------------------------------------------------------------------


def gpu_missing() -> str | None:
    """Why ``--device gpu`` cannot run here (None when cupy and PyTorch's CUDA both see a
    device), asked of a child so that this process imports neither."""
    return run_side(__file__, ["--gpu-check"]).get("missing")


def gpu_check_child() -> None:
    reasons = []
    try:
        from engine.runtime.backends.cupy_backend import import_cupy

        import_cupy()
    except Exception as e:  # any failure means: no engine on the GPU
        reasons.append(f"engine: {e}")
    try:
        import torch

        if not torch.cuda.is_available():
            reasons.append(f"torch {torch.__version__}: no CUDA device")
    except ImportError as e:
        reasons.append(f"torch: {e}")
    print(json.dumps({"missing": "; ".join(reasons) or None}))


def step_comparison(case_names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    sides = ["engine", *(f"torch_{a}" for a in ADAMS)]
    size = ["--samples", "2", "--steps", "3"] if args.quick else []
    runs = alternate(__file__, {f"{c}:{s}": ["--step-side", s, "--case", c, "--device",
                                             args.device, *size]
                                for c in case_names for s in sides}, args.repeats,
                     log=args.log)
    out: dict[str, Any] = {}
    for c in case_names:
        r = {s: runs[f"{c}:{s}"] for s in sides}
        if not r["engine"] or not any(r[f"torch_{a}"] for a in ADAMS):
            continue  # interrupted before both sides ran
        ms = {s: median(r[s], "ms_step") for s in sides}
        adam = fastest({a: ms[f"torch_{a}"] for a in ADAMS})
        t = f"torch_{adam}"
        kinds = r["engine"][0]["ms_by_op"]
        by_op = {k: round(statistics.median(x["ms_by_op"][k] for x in r["engine"]), 3)
                 for k in kinds}
        out[c] = {
            "shape": asdict(CASES[c]),
            "engine_ms_step": round(ms["engine"], 3), "torch_ms_step": round(ms[t], 3),
            "engine_over_torch": round(ms["engine"] / ms[t], 2),
            "speedup_vs_torch": round(ms[t] / ms["engine"], 2),
            "torch_adam": adam,
            "torch_ms_step_by_adam": {a: round(ms[f"torch_{a}"], 3) for a in ADAMS
                                      if ms[f"torch_{a}"] is not None},
            "runs_per_side": {s: len(r[s]) for s in sides},
            "engine_ms_step_runs": [round(x["ms_step"], 3) for x in r["engine"]],
            "torch_ms_step_runs": [round(x["ms_step"], 3) for x in r[t]],
            "engine_peak_rss_bytes": max(x["peak_rss_bytes"] for x in r["engine"]),
            "torch_peak_rss_bytes": max(x["peak_rss_bytes"] for x in r[t]),
            "engine_planned_bytes": r["engine"][0]["planned_bytes"],
            "engine_ms_by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}
    return out


def parse_budgets(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of MiB (e.g. 64,256)") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each budget must be more than 0 MiB")
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5,
                    help="fresh processes per side and case, alternating; the median is kept")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: the tiny case only, 2 samples of 3 steps, a 2 MiB "
                         "budget, at most 3 PyTorch probes")
    ap.add_argument("--cases", default="mnist_rows,long",
                    help=f"step-time cases, of {', '.join(CASES)} (default mnist_rows,long)")
    ap.add_argument("--budgets", type=parse_budgets,
                    default=list(map(float, BUDGETS_MIB)),
                    help="memory budgets in MiB, comma-separated, for the largest batch at "
                         "the mnist_rows shapes (default 64,256)")
    ap.add_argument("--no-budgets", action="store_true", help="time the steps only")
    ap.add_argument("--max-probes", type=int, default=None,
                    help="PyTorch probe processes per budget at most (default: until found)")
    ap.add_argument("--log", action="store_true", help="each child's answer on stderr")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--step-side", help=argparse.SUPPRESS)
    ap.add_argument("--memory-side", help=argparse.SUPPRESS)
    ap.add_argument("--gpu-check", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=7, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gpu_check:
        gpu_check_child()
        return
    if args.step_side:
        step_child(args.step_side, CASES[args.case], args.samples, args.steps, args.device)
        return
    if args.memory_side:
        memory_child(args.memory_side, CASES[args.case], args.device, args.batch, args.budget)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    budget_case, budgets, max_probes = "mnist_rows", args.budgets, args.max_probes
    if args.quick:
        cases, budget_case, budgets = ["tiny"], "tiny", [2.0]
        max_probes = 3 if max_probes is None else max_probes
    out: dict[str, Any] = {"device": args.device, "threads": cores(),
                           "repeats": args.repeats, "quick": args.quick}
    if args.device == "gpu":
        missing = gpu_missing()
        if missing:
            out["skipped"] = f"--device gpu needs cupy and PyTorch with CUDA: {missing}"
            print(json.dumps(out) if args.json else json.dumps(out, indent=2))
            return
    out["cases"] = step_comparison(cases, args)
    if not out["cases"]:
        sys.exit("transformer: interrupted before the engine and PyTorch had each run once")
    if not args.no_budgets:
        out["max_batch"] = budget_comparison(budget_case, budgets, args.device, max_probes,
                                             args.log)
    out["isolation"] = ("each side in a fresh process, alternating; medians; each memory "
                        "probe a fresh process")
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
