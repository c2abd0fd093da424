"""A CNN search's trials one by one: each drawn network of the MNIST CNN space trained
by explore's program and by PyTorch, on one thread each, as the workers of a 2-core
search run them (``bench/peers.py --searches mnist_cnn``).  Where that search takes
longer in explore than in Optuna + PyTorch, this says which trials and which ops.

Configurations are drawn from ``search_spaces/cnn_mnist.yaml`` by Optuna's random
sampler (``--seed``), with the questions every side of ``bench/peers.py`` asks
(:func:`explore.sampling.suggest`).  For each, explore and PyTorch alternate, each run a
fresh process (``bench/_sides.py``) that builds the network (explore: its graph compiled
at batch 64 with the trial's optimizer, the kernels a search's worker binds; PyTorch:
``bench/_torch_models.py``, its fused Adam) and times ``--steps`` mini-batches of 64 of
the space's training images after three to warm up; medians of ``--repeats``.  Each
configuration's FLOPs per step come from explore's compiler
(:mod:`engine.runtime.flops`), so both sides' rates are of the same arithmetic.
``--ops`` adds, for the configuration slowest in explore, the milliseconds per step of
each kind of instruction in its program.

    python bench/cnn_trials.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import emit, median, run_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(ROOT, "search_spaces", "cnn_mnist.yaml")
SIDES = ("explore", "torch")
BATCH = 64
WARM = 3  # mini-batches before the clock


def space(rows: int | None = None) -> Any:
    """The CNN space, with ``rows`` training images where given (its validation rows
    unchanged)."""
    from explore.space import load_space

    s = load_space(SPACE)
    if rows is None or s.dataset is None:
        return s
    return s.model_copy(update={"dataset": s.dataset.model_copy(update={"train": rows})})


def draw(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` configurations of the space, drawn at random as a search's first trials are."""
    import optuna

    from explore.sampling import suggest

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        t = study.ask()
        out.append(suggest(t, s))
        study.tell(t, 0.0)
    return out


def program(params: dict[str, Any], rows: int | None = None) -> Any:
    """``params``'s network compiled as a worker compiles a trial: at batch 64, with the
    trial's optimizer."""
    from engine import compile_graph
    from explore.binding import bind
    from explore.candidate import graph_of
    from explore.optimizers import build_optimizer

    return compile_graph(graph_of(bind(space(rows)), params), batch_size=BATCH,
                         optimizer=build_optimizer(params))


def step_flops(params: dict[str, Any]) -> int:
    """FLOPs of one training step of ``params``'s network at batch 64 (explore's count)."""
    return int(program(params).flops.train_step("train"))


def arrays(rows: int) -> dict[str, Any]:
    from bench.peers import load_arrays

    return load_arrays(space(rows))


def child_explore(params: dict[str, Any], steps: int, rows: int, ops: bool) -> None:
    import numpy as np

    from engine import VM
    from engine.runtime.train import train_epoch
    from explore.scheduler.worker.device import numba_without_blas, warm_up

    numba_without_blas()
    warm_up()  # as a worker does before its first trial
    a = arrays(rows)
    vm = VM(program(params, rows), seed=0)
    rng = np.random.default_rng(0)
    x, y = a["x_train"], a["y_train"]
    train_epoch(vm, x[:WARM * BATCH], y[:WARM * BATCH], rng, batch=BATCH)
    t = time.perf_counter()
    train_epoch(vm, x[:steps * BATCH], y[:steps * BATCH], rng, batch=BATCH)
    out: dict[str, Any] = {"step_s": (time.perf_counter() - t) / steps}
    if ops:
        from bench.cnn_step import op_breakdown

        out["ms_by_op"] = op_breakdown(vm, 5)
    emit(out)


def child_torch(params: dict[str, Any], steps: int, rows: int) -> None:
    import torch

    from bench import _torch_models as tm
    from bench.peers import TorchTrainer

    torch.set_num_threads(1)  # one of two workers on two cores, as in bench/peers.py
    tr = TorchTrainer(space(rows), "cpu", arrays(rows))
    torch.manual_seed(0)
    net = tm.model(params, tr.x.shape[1], tr.classes, tr.image)
    opt = tm.optimizer(params, list(net.parameters()))
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    net.train()

    def run(n: int) -> None:
        order = torch.randperm(len(tr.y), generator=gen)
        for s in range(0, n * BATCH, BATCH):
            idx = order[s:s + BATCH]
            opt.zero_grad(set_to_none=True)
            loss_fn(net(tr.x[idx]), tr.y[idx]).backward()
            opt.step()

    run(WARM)
    t = time.perf_counter()
    run(steps)
    emit({"step_s": (time.perf_counter() - t) / steps})


def short(params: dict[str, Any]) -> dict[str, Any]:
    """The architecture's part of ``params`` (what sets a step's cost)."""
    keep = ("blocks", "channels", "kernel", "batch_norm", "residual", "depth", "width")
    out = {k: params[k] for k in keep if k in params}
    if "channels" in out:
        out["channels"] = list(out["channels"])[:int(params.get("blocks") or 0)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--configs", type=int, default=6, help="networks drawn")
    ap.add_argument("--seed", type=int, default=0, help="the random sampler's")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per side")
    ap.add_argument("--steps", type=int, default=30, help="mini-batches timed")
    ap.add_argument("--rows", type=int, default=10000, help="training images loaded")
    ap.add_argument("--ops", action="store_true",
                    help="explore's ms per op kind for its slowest configuration")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 configs, 3 steps")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.configs, args.steps, args.repeats, args.rows = 2, 3, 1, 2000
    if args.side:
        params = json.loads(args.params)
        if args.side == "explore":
            child_explore(params, args.steps, args.rows, args.ops)
        else:
            child_torch(params, args.steps, args.rows)
        return
    # one BLAS thread for explore's child (a worker's), one for PyTorch's (set above)
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    common = ["--steps", str(args.steps), "--rows", str(args.rows)]
    configs = []
    for params in draw(args.configs, args.seed):
        flops = step_flops(params)
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for i in range(args.repeats):  # the order rotated each repeat
            for side in SIDES[i % 2:] + SIDES[:i % 2]:
                runs[side].append(run_side(__file__, [
                    "--side", side, "--params", json.dumps(params), *common], timeout=900))
        ms = {s: median(runs[s], "step_s") * 1e3 for s in SIDES}
        configs.append({"network": short(params), "mflop_per_step": round(flops / 1e6, 1),
                        "ms_per_step": {s: round(v, 2) for s, v in ms.items()},
                        "gflops": {s: round(flops / v / 1e6, 1) for s, v in ms.items()},
                        "explore_over_torch": round(ms["explore"] / ms["torch"], 2),
                        "params": params})
    ratios = [c["explore_over_torch"] for c in configs]
    result: dict[str, Any] = {
        "configs": configs, "repeats": args.repeats, "steps": args.steps,
        "median_explore_over_torch": round(statistics.median(ratios), 2),
        # what a search of these trials would take on each side: the sum of the steps
        "total_explore_over_torch": round(
            sum(c["ms_per_step"]["explore"] for c in configs)
            / sum(c["ms_per_step"]["torch"] for c in configs), 2)}
    if args.ops:
        slowest = max(configs, key=lambda c: c["ms_per_step"]["explore"])
        answer = run_side(__file__, ["--side", "explore", "--params",
                                     json.dumps(slowest["params"]), *common, "--ops"],
                          timeout=900)
        result["ops"] = {"network": slowest["network"], "ms_by_op": answer["ms_by_op"]}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
