"""Device memory of a training process, measured against the plan: is the heap the
program plans (``Program.total_bytes``) what the device gives, what does a process cost
besides its heap, and does a step allocate anything?

Each architecture of ``bench/_gpu_cases.py`` (MLPs, the MNIST CNN, stacks of 8 MLPs,
traced ``engine.nn`` models, the onnx package's light models at two batch sizes) runs
in its own fresh process, which reads its own device memory at each stage: the bytes
the driver's management library (NVML) lists for this process, where it lists
processes (``memory_source`` "nvml_process": then cases may run side by side,
``--jobs``, since no case counts another's memory), else the device's used memory
(NVML device-wide, "nvml"; the driver's free memory, ``cudaMemGetInfo``, beside it),
which holds only while one case runs at a time:

1. before any CUDA call (``used_before``);
2. after the CUDA context and a cuBLAS handle (``used_context``);
3. after ``VM(program)`` allocated and zeroed the heap (``used_heap``);
4. after a few warm-up steps (kernels compiled and loaded);
5. after up to ``--steps`` (1,000) steady-state training steps on the fed inputs, or
   ``--max-seconds`` of them (``steps`` says how many ran).

CuPy's memory pool (used and total bytes) is read at each stage too, and a memory hook
counts the pool's allocations during the steady steps: a step that allocates nothing
leaves ``pool_mallocs_in_steps`` at 0 and both counters unchanged (``steady``).  Where
a step does allocate, each instruction and the optimizer update run once more under
the hook, and ``mallocs_by_op`` says which kinds of instruction did, and how much.

Per case: ``planned`` (the heap), ``measured`` = used after the steps - used before the
context, ``context_bytes`` (the CUDA context and cuBLAS handle), and
``overhead = measured - planned`` and ``residual = overhead - constant``, where
``constant`` (top level) is the per-process constant, the median overhead (or
``--constant``, e.g. from an earlier run, so a second group of cases is judged by the
first's constant); ``residual_over_heap`` = residual / planned.  Top level: the
constant, ``max_abs_residual_over_heap``, every residual, the device's name.

``--device cpu --smoke`` runs tiny cases on the CPU with the process's resident set
(VmRSS) standing for device memory: the plumbing and the JSON, not a GPU result (the
GPU-only fields are null).

    python bench/gpu_memory.py --json                      # on a GPU machine
    python bench/gpu_memory.py --json --jobs 4             # cases side by side
    python bench/gpu_memory.py --json --families onnx --constant 123456789
    python bench/gpu_memory.py --json --device cpu --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._gpu_cases import CASES, SMOKE, family, feed
from bench._sides import emit, run_side

WARMUP = 3
# The driver maps device memory in pages of 2 MiB: the finest step a reading of a
# process's device memory can show (on the CPU, a page of the resident set).
GRANULARITY = 2 << 20


# -- one case, in this (fresh) process -------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Probe:
    """Reads used memory: on the GPU this process's own device memory as NVML lists it
    (0 before this process made a CUDA context), else the device's used memory through
    NVML (no CUDA context needed, so it can read before one exists); on the CPU this
    process's resident set."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.nvml: Any = None
        self.cupy: Any = None
        self.per_process: bool | None = None  # unknown until a context exists
        if device == "gpu":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
                self._pynvml = pynvml
            except Exception:  # no NVML: the driver's free memory only, after the context
                self.nvml = None

    def own(self) -> int | None:
        """This process's device memory as NVML lists it; None where it is not listed
        (no NVML, or a container whose process ids are not the host's)."""
        if self.nvml is None:
            return None
        try:
            listed = self._pynvml.nvmlDeviceGetComputeRunningProcesses(self.nvml)
        except Exception:  # NVML's errors are many classes; any means "cannot say"
            return None
        for p in listed:
            used = getattr(p, "usedGpuMemory", None)
            if getattr(p, "pid", None) == os.getpid() and used is not None:
                return int(used)
        return None

    def used(self) -> int | None:
        if self.device != "gpu":
            return rss_bytes()
        if self.per_process:
            return self.own() or 0
        if self.nvml is not None:
            return int(self._pynvml.nvmlDeviceGetMemoryInfo(self.nvml).used)
        if self.cupy is not None:  # total - free, only once a context exists
            free, total = self.cupy.cuda.runtime.memGetInfo()
            return int(total - free)
        return None

    def free(self) -> int | None:
        if self.cupy is None:
            return None
        return int(self.cupy.cuda.runtime.memGetInfo()[0])

    def pool(self) -> dict[str, int | None]:
        if self.cupy is None:
            return {"used": None, "total": None, "pinned_free_blocks": None}
        pool = self.cupy.get_default_memory_pool()
        pinned = self.cupy.get_default_pinned_memory_pool()
        return {"used": int(pool.used_bytes()), "total": int(pool.total_bytes()),
                "pinned_free_blocks": int(pinned.n_free_blocks())}

    def sync(self) -> None:
        if self.cupy is not None:
            self.cupy.cuda.Device().synchronize()


def malloc_counter(cupy: Any) -> Any:
    """A CuPy memory hook counting the pool's allocations (``malloc``) and the
    device allocations behind them (``alloc``)."""

    class Counter(cupy.cuda.MemoryHook):
        name = "CalcGraphCounter"

        def __init__(self) -> None:
            self.mallocs = 0
            self.allocs = 0
            self.bytes = 0

        def malloc_postprocess(self, **kwargs: Any) -> None:
            self.mallocs += 1
            self.bytes += int(kwargs.get("mem_size") or kwargs.get("size") or 0)

        def alloc_postprocess(self, **kwargs: Any) -> None:
            self.allocs += 1

    return Counter()


def mallocs_by_op(vm: Any, cupy: Any) -> dict[str, list[int]]:
    """Where a step's pool allocations happen: each instruction of the train path
    (forward, then backward) and the optimizer update run once more on their own under
    a counting hook; ``{op: [mallocs, bytes]}`` summed over the instructions of each
    kind (``forward[i]``/``backward[i]`` where the steps are not one per instruction)."""
    prog, b = vm.program, vm._binding
    pi = prog.path_index("train")
    pc = prog.paths[pi]
    parts = [("forward", pc.forward, b.forward[pi]),
             ("backward", pc.backward, next(iter(b.backward.values()), ()))]
    out: dict[str, list[int]] = {}

    def count(label: str, f: Any) -> None:
        counter = malloc_counter(cupy)
        with counter:
            f()
            cupy.cuda.Device().synchronize()
        if counter.mallocs:
            got = out.setdefault(label, [0, 0])
            got[0] += counter.mallocs
            got[1] += counter.bytes

    vm.forward("train")  # the backward steps read what the forward wrote
    for name, instrs, steps in parts:
        one_each = len(instrs) == len(steps)
        for i, f in enumerate(steps):
            count(prog.instrs[instrs[i]].op if one_each else f"{name}[{i}]", f)
    for f in vm._flat_update:
        count("optimizer update", f)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0]))


def device_name(probe: Probe) -> str:
    if probe.cupy is not None:
        name = probe.cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


def child(case: str, device: str, steps: int, max_seconds: float) -> dict[str, Any]:
    """Measure one case in this fresh process (see the module's docstring)."""
    from engine import VM

    probe = Probe(device)
    used_before = probe.used()
    if device == "gpu":
        import cupy

        probe.cupy = cupy
        cupy.cuda.Device(0).use()
        cupy.cuda.device.get_cublas_handle()
        probe.sync()
        if probe.own() is not None:  # listed: count this process alone, from zero
            probe.per_process, used_before = True, 0
    else:
        import numpy as np

        np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)  # BLAS's buffers
    if used_before is None:  # no NVML: the first reading is after the context
        used_before = probe.used()
    used_context, free_context, pool_context = probe.used(), probe.free(), probe.pool()
    program = {**CASES, **SMOKE}[case](device)
    vm = VM(program, seed=0)
    probe.sync()
    used_heap, free_heap, pool_heap = probe.used(), probe.free(), probe.pool()
    feed(vm)
    for _ in range(WARMUP):
        vm.train_step("train")
    probe.sync()
    used_warm, pool_warm = probe.used(), probe.pool()
    counter = malloc_counter(probe.cupy) if probe.cupy is not None else None
    done, t0 = 0, time.perf_counter()
    if counter is not None:
        counter.__enter__()
    try:
        while done < steps and (done % 50 or time.perf_counter() - t0 < max_seconds):
            vm.train_step("train")
            done += 1
        probe.sync()
    finally:
        if counter is not None:
            counter.__exit__(None, None, None)
    seconds = time.perf_counter() - t0
    used_after, free_after, pool_after = probe.used(), probe.free(), probe.pool()

    def diff(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a - b

    by_op = mallocs_by_op(vm, probe.cupy) if counter is not None and counter.mallocs else {}
    pool_used_change = diff(pool_after["used"], pool_warm["used"])
    pool_total_change = diff(pool_after["total"], pool_warm["total"])
    mallocs = counter.mallocs if counter is not None else None
    return {
        "case": case, "family": family(case), "device": device,
        "device_name": device_name(probe),
        "memory_source": ("nvml_process" if probe.per_process else "nvml"
                          if probe.nvml is not None else "memgetinfo")
        if device == "gpu" else "rss",
        "batch": program.batch_size, "planned": program.total_bytes,
        "zones": program.zone_bytes, "heap_allocated": vm.allocated_bytes,
        "used_before": used_before, "used_context": used_context, "used_heap": used_heap,
        "used_warm": used_warm, "used_after": used_after,
        "free_context": free_context, "free_heap": free_heap, "free_after": free_after,
        "context_bytes": diff(used_context, used_before),
        "heap_bytes_measured": diff(used_heap, used_context),
        "warmup_bytes": diff(used_warm, used_heap),
        "measured": diff(used_after, used_before),
        "pool_context": pool_context, "pool_heap": pool_heap, "pool_warm": pool_warm,
        "pool_after": pool_after,
        "pool_heap_bytes": diff(pool_heap["used"], pool_context["used"]),
        "pool_used_change_in_steps": pool_used_change,
        "pool_total_change_in_steps": pool_total_change,
        "pool_mallocs_in_steps": mallocs,
        "device_allocs_in_steps": counter.allocs if counter is not None else None,
        "pool_malloc_bytes_in_steps": counter.bytes if counter is not None else None,
        "mallocs_by_op": by_op,
        "used_change_in_steps": diff(used_after, used_warm),
        "steady": None if counter is None else
        (pool_used_change == 0 and pool_total_change == 0 and mallocs == 0),
        "steps": done, "steps_s": seconds,
    }


# -- the suite ------------------------------------------------------------------------


def summarize(cases: list[dict[str, Any]], constant: int | None,
              granularity: int = GRANULARITY) -> dict[str, Any]:
    """The per-process constant (the median of measured - planned, unless given) and
    each case's residual against it.  A case is ``within`` when its residual is under
    1% of its heap or under the memory's ``granularity``: the driver maps device memory
    in 2 MiB pages, so a reading moves in 2 MiB steps, and a heap smaller than a page
    can land in one already mapped (no reading can resolve less).  Beside it, with no
    fitted constant: ``over_context`` (measured - the process's own context - planned)
    and ``pages_beyond_rounded`` (what is left once the heap is rounded up to pages)."""
    ok = [c for c in cases if c.get("measured") is not None]
    source = "given" if constant is not None else "median of measured - planned"
    if constant is None and ok:
        constant = int(statistics.median(c["measured"] - c["planned"] for c in ok))
    for c in cases:
        if c.get("measured") is None or constant is None:
            c["overhead"] = c["residual"] = c["residual_over_heap"] = c["within"] = None
            continue
        c["overhead"] = c["measured"] - c["planned"]
        c["residual"] = c["overhead"] - constant
        c["residual_over_heap"] = c["residual"] / c["planned"] if c["planned"] else None
        c["within"] = abs(c["residual"]) < max(c["planned"] / 100, granularity)
        # The other reading, with no fitted constant: beyond the context and the heap
        # rounded up to whole pages, how many pages (a heap under a page may ride in
        # one already mapped: -1; the warm-up's kernel code: +1)
        if c.get("context_bytes") is not None:
            c["over_context"] = c["measured"] - c["context_bytes"] - c["planned"]
            rounded = -(-c["planned"] // granularity) * granularity
            c["pages_beyond_rounded"] = round(
                (c["measured"] - c["context_bytes"] - rounded) / granularity, 2)
    ratios = [abs(c["residual_over_heap"]) for c in ok if c["residual_over_heap"] is not None]
    contexts = [c["context_bytes"] for c in ok if c.get("context_bytes") is not None]
    steady = [c["steady"] for c in ok if c.get("steady") is not None]
    within = [c["within"] for c in ok if c.get("within") is not None]
    over = [c["over_context"] for c in ok if c.get("over_context") is not None]
    return {
        "constant": constant, "constant_source": source,
        "context_bytes_median": int(statistics.median(contexts)) if contexts else None,
        "max_abs_residual_over_heap": max(ratios) if ratios else None,
        "residuals": {c["case"]: c["residual"] for c in ok},
        "granularity": granularity,
        "all_within": all(within) if within else None,
        "not_within": [c["case"] for c in ok if c.get("within") is False],
        "over_context_range": [min(over), max(over)] if over else None,
        "pages_beyond_rounded": {c["case"]: c.get("pages_beyond_rounded") for c in ok},
        "all_steady": all(steady) if steady else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny cases and 5 steps: the plumbing, on any device")
    ap.add_argument("--families", default="",
                    help="comma-separated families to run (mlp,cnn,stack,nn,onnx; default all)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default all)")
    ap.add_argument("--steps", type=int, default=0, help="steady steps (default 1000; 5 smoke)")
    ap.add_argument("--max-seconds", type=float, default=20.0,
                    help="stop a case's steady steps after this long (at a multiple of 50)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case's process")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no case after this many seconds (listed in skipped)")
    ap.add_argument("--constant", type=int, default=None,
                    help="judge residuals against this per-process constant (bytes)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cases run side by side (each counts its own memory where the "
                         "driver lists processes)")
    ap.add_argument("--log", action="store_true", help="each case's answer on stderr")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    steps = args.steps or (5 if args.smoke else 1000)
    if args.case:
        emit(child(args.case, args.device, steps, args.max_seconds))
        return
    pool = SMOKE if args.smoke else CASES
    names = [c for c in pool if (not args.families or family(c) in args.families.split(","))
             and (not args.cases or c in args.cases.split(","))]
    t0 = time.monotonic()

    def measure(name: str) -> tuple[str, dict[str, Any]]:
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            return "skipped", {}
        try:
            got = run_side(__file__, ["--case", name, "--device", args.device,
                                      "--steps", str(steps), "--max-seconds",
                                      str(args.max_seconds)], timeout=args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"  {name}: FAILED {str(e)[-300:]}", file=sys.stderr, flush=True)
            return "failed", {"case": name, "error": str(e)[-1500:]}
        if args.log:
            print(f"  {name}: {got}", file=sys.stderr, flush=True)
        return "ok", got

    with ThreadPoolExecutor(max(1, args.jobs)) as ex:  # answers kept in the cases' order
        answers = list(ex.map(measure, names))
    cases = [got for kind, got in answers if kind == "ok"]
    failed = [got for kind, got in answers if kind == "failed"]
    skipped = [n for n, (kind, _) in zip(names, answers, strict=True) if kind == "skipped"]
    # A device-wide reading counts every process on the device: side by side, the cases
    # would count one another's memory, so such a run says that it is not isolated.
    shared = args.jobs > 1 and any(c["memory_source"] in ("nvml", "memgetinfo")
                                   for c in cases)
    out = {"device": args.device,
           "device_name": cases[0]["device_name"] if cases else None,
           "smoke": args.smoke, "steps": steps,
           **summarize(cases, args.constant, GRANULARITY if args.device == "gpu"
                       else os.sysconf("SC_PAGE_SIZE")),
           "cases": cases, "failed": failed, "skipped": skipped, "jobs": args.jobs,
           "isolation": "each case in a fresh process, " + (
               "one after another" if args.jobs <= 1 else
               f"{args.jobs} side by side, each counting its own memory" if not shared else
               f"{args.jobs} side by side on device-wide readings: NOT isolated")}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
