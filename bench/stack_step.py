"""A paper-space trial's training step alone, as an explore worker runs it: one model
or a stack of K, numpy's kernels or numba's compiled ones, on one BLAS thread (a
worker's share of a 2-core machine with two workers).

The program is the one explore compiles for ``search_spaces/paper_mnist.yaml``
(``explore.candidate.compile_candidate`` / ``explore.scheduler.stacking.compile_stack``:
a 784-64-64-10 sigmoid MLP, uint8 pixels dequantized in the program, compiled for the
validation chunk and trained at batch 64), trained on the space's 10,000 MNIST rows in
shuffled mini-batches (``engine.runtime.train.train_epoch``).  Each configuration runs
in a fresh process (``bench/_sides.py``), configurations alternating; one epoch warms
up, the next ``--epochs`` are timed, and each run reports its median epoch.  Reported
per configuration (medians over ``--repeats`` runs): microseconds per model and
mini-batch, a model's FLOPs in it, and that step's model FLOP rate
(:mod:`engine.runtime.flops`) as a share of one core's GEMM peak (the machine's,
:mod:`explore.scheduler.peak`, over its cores).
``--ops`` adds, per configuration, the instructions that took longest (one run).

    python bench/stack_step.py --json
    python bench/stack_step.py --json --stacks 1,8 --kernels compiled --ops
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

from bench._sides import emit, median, run_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(ROOT, "search_spaces", "paper_mnist.yaml")
BATCH = 64


def program(stack: int, optimizer: str) -> Any:
    """The program explore compiles for ``stack`` paper-space trials of ``optimizer``."""
    from explore.binding import bind
    from explore.candidate import compile_candidate
    from explore.sampling import fixed
    from explore.scheduler.stacking import Drawn, compile_stack, graph_of
    from explore.space import load_space

    bound = bind(load_space(SPACE))
    params = {**fixed(bound.space), "optimizer": optimizer, "lr": 1e-3,
              "init": "xavier_uniform"}
    share = 400_000_000
    # SGD's members each with a momentum of its own, as a search draws them
    # (PerModelLR.momenta); the other optimizers' members differ in nothing stacked
    members = [{**params, "momentum": 0.5 + 0.4 * k / stack} if optimizer == "sgd" else params
               for k in range(stack)]
    if stack == 1:
        return bound, compile_candidate(bound, members[0], share).program
    drawn = [Drawn(None, m, graph_of(bound, m), False) for m in members]
    stacked: Any = compile_stack(bound, drawn, share).candidate
    return bound, stacked.program


def per_op(vm: Any, x: Any, y: Any, repeats: int = 200) -> list[list[Any]]:
    """Each instruction of a step at batch 64, and the optimizer's update, timed alone:
    its bound step repeated, as ``bench/cnn_step.py``'s ``op_breakdown`` times each
    kind of instruction, here each instruction with its operands' shapes (a stack's
    first layer apart from its others).  The slowest first: ``[[what, µs], ...]``."""
    from bench.cnn_step import timed

    rows = np.arange(BATCH)
    vm.gather("x", x, rows, check=False)
    vm.gather("y", y, rows, check=False)
    vm.train_step("train")  # bound at batch 64 (an epoch ends on a smaller batch)
    prog, b = vm.program, vm._binding
    path = prog.path_index("train")
    pc = prog.paths[path]
    steps = [*b.forward[path], *next(iter(b.backward.values()))]
    spent = []
    for k, f in zip((*pc.forward, *pc.backward), steps, strict=True):
        ins = prog.instrs[k]
        shapes = [tuple(prog.buffers[i].desc.shape) for i in ins.ins]
        spent.append([f"{ins.op} {shapes}", timed(f, repeats)])
    name = prog.optimizer.name if prog.optimizer else "-"
    spent.append([f"update ({name})",
                  sum(timed(f, repeats) for f in vm._flat_update)])
    top = sorted(spent, key=lambda e: -e[1])[:8]
    return [[what, round(ms * 1e3, 1)] for what, ms in top]


def child(args: argparse.Namespace) -> None:
    from engine import VM
    from explore.scheduler.peak import gemm_peak
    from explore.scheduler.shared_data import load_shared
    from explore.utilisation import round_flops

    bound, prog = program(args.stack, args.optimizer)
    data = load_shared(bound)
    try:
        x, y = data.arrays["x_train"], data.arrays["y_train"]
        from engine.runtime.train import train_epoch

        vm = VM(prog)
        rng = np.random.default_rng(0)
        train_epoch(vm, x, y, rng, batch=BATCH)  # warm: first touches, BLAS buffers
        times = []
        for _ in range(args.epochs):
            t = time.perf_counter()
            train_epoch(vm, x, y, rng, batch=BATCH)
            times.append(time.perf_counter() - t)
        epoch = statistics.median(times)
        steps = -(-len(y) // BATCH)
        per_model_step = epoch / steps / args.stack
        # a model's FLOPs in one mini-batch, as the run's counters count them
        flops, _ = round_flops(prog, BATCH, (BATCH, 0), args.stack)
        core_peak = (gemm_peak("cpu") or float("nan")) / (os.cpu_count() or 1)
        out: dict[str, Any] = {
            "us_per_model_step": per_model_step * 1e6, "flops_per_model_step": flops,
            "share_of_core_peak": flops / per_model_step / core_peak}
        if args.ops:
            out["ops"] = per_op(vm, x, y)
        emit(out)
    finally:
        data.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--stacks", default="1,2,4,8", help="models per program")
    ap.add_argument("--kernels", default="numpy,compiled")
    ap.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "rmsprop",
                                                            "adagrad"])
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ops", action="store_true", help="the slowest instructions too")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stack", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    # a worker's share of a 2-core machine: one BLAS thread, one numba thread
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    from explore.scheduler.peak import gemm_peak

    gemm_peak("cpu", fresh=True)  # measured here, outside the timed children
    kernels = args.kernels.split(",")
    for kern in kernels:
        if kern not in ("numpy", "compiled"):
            ap.error(f"kernels are numpy or compiled, not {kern!r}")
    configs = {f"{kern} x{k}": (kern, ["--child", "--stack", str(k), "--optimizer",
                                       args.optimizer, "--epochs", str(args.epochs),
                                       *(["--ops"] if args.ops else [])])
               for k in map(int, args.stacks.split(",")) for kern in kernels}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in configs}
    names = list(configs)
    for i in range(args.repeats):  # each run a fresh process, the order rotated
        k = i % len(names)
        for name in names[k:] + names[:k]:
            kern, child_args = configs[name]
            os.environ["CALCGRAPH_JIT"] = "1" if kern == "compiled" else "0"
            runs[name].append(run_side(__file__, child_args, timeout=600))
            print(f"  repeat {i + 1}/{args.repeats} {name}: "
                  f"{runs[name][-1]['us_per_model_step']:.0f} us", file=sys.stderr, flush=True)
    result = {"optimizer": args.optimizer, "repeats": args.repeats, "batch": BATCH,
              "threads": 1, "configs": {}}
    for name, rs in runs.items():
        result["configs"][name] = {
            "us_per_model_step": round(median(rs, "us_per_model_step"), 1),
            "flops_per_model_step": rs[0]["flops_per_model_step"],
            "share_of_core_peak": round(median(rs, "share_of_core_peak"), 3),
            **({"ops": rs[0]["ops"]} if args.ops and rs else {})}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
