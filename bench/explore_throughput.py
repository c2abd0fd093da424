"""Trials per minute: ``explore`` against Optuna ``n_jobs=2`` training PyTorch models.

The paper's MNIST MLP space (``search_spaces/paper_mnist.yaml``: the fixed 784-64-64-10
sigmoid MLP; optimizer, learning rate and init searched; 10,000 training images,
mini-batches of 64), 60 trials of 10 rounds, the same TPE sampler and the space's
pruner (none: every trial runs its 10 rounds, as in the paper) on both sides, 2
workers / 2 jobs, each side in a fresh process, one after the other, in one run.
Repeat i runs both sides with seed ``--seed + i`` (sampler, inits, shuffling).

``--pruner median`` (warm-up 2 rounds) prunes on both sides.  Trials per minute then
hangs on how many trials the pruner lets finish, which hangs on how good the first
few happened to be: one seed let 30 of 60 finish on one side and 9 on the other.
Rounds per minute is the steadier figure there.

- explore: ``Scheduler`` over the space with its memory budget (1GB; ``--memory``),
  validating in one chunk of 10,000 rows as the space says (``--eval-batch`` changes
  it; the baseline validates the same 10,000 rows in one call), one trial in hand per
  worker plus one ready (the default);
- explore, packed: the same with as many trials per worker as the arenas hold (what
  the packing efficiency is measured on);
- baseline: what a user writes: ``study.optimize(objective, n_trials=60, n_jobs=2)``,
  the objective building a PyTorch model and optimizer (the fastest implementation:
  fused where PyTorch has it), reporting validation accuracy each round for pruning;
  one PyTorch thread per job (two jobs on two cores: measured faster than two each).

Reported (medians of ``--repeats`` interleaved runs, each side in a fresh process):
trials per minute (wall time of the whole search, start-up included) and rounds per
minute (the same ratio without a pruner; with one, the steadier figure), the best
validation accuracy of each, the packing efficiency of the packed runs, the accounted
peak and the measured peak resident memory of both.
The packing efficiency is the time-weighted mean fraction of memory held by trial heaps
while trials were waiting, twice: ``packing_efficiency`` of the whole budget and
``packed_arena_utilisation`` of what the budget leaves for trials once the data set and
the measured constants are placed (``fixed_bytes``: the scheduler, the workers, the
resource tracker and the data, which no packing can use:
at 200MB they alone take a third of the budget).  A trial's heap at a 10,000-row
validation chunk is about 21 MB, so the 60 trials need more than the budget and queue;
a gap too small for one is filled with the same trial compiled for smaller chunks.
The default run's own figure (``explore_packing_efficiency``) is low by design: it holds
two trials per worker so that the sampler learns from each result before sampling much
further ahead, and its trials wait for the sampler, not for memory; on two cores holding
more would not run more at once.

    python bench/explore_throughput.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(ROOT, "search_spaces", "paper_mnist.yaml")


def vmhwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def pruner_of(name: str | None) -> str:
    """The pruner both sides use: ``name``, or the space's."""
    from explore.space import load_space

    return name or load_space(SPACE).pruner.name


def run_explore(trials: int, memory: int, workers: int, seed: int, depth: int | None = None,
                eval_batch: int | None = None, pruner: str | None = None) -> dict[str, Any]:
    import optuna

    from explore.scheduler import Scheduler
    from explore.scheduler.shared_data import load_shared
    from explore.space import load_space
    from explore.study import open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE)
    budget = space.budget.model_copy(update={"trials": trials, "memory": memory,
                                             "workers": workers, "seed": seed})
    update: dict[str, Any] = {"budget": budget,
                              "sampler": space.sampler.model_copy(update={"seed": seed}),
                              "pruner": space.pruner.model_copy(update={
                                  "name": pruner_of(pruner), "warmup_rounds": 2})}
    if eval_batch:
        update["training"] = space.training.model_copy(update={"eval_batch_size": eval_batch})
    space = space.model_copy(update=update)
    data = load_shared(space)  # as `explore run` loads it: the run's rows, compact
    with tempfile.TemporaryDirectory() as tmp:
        study = open_study(space, f"sqlite:///{tmp}/bench.db")
        t0 = time.perf_counter()
        stats = Scheduler(space, study, data, workers=workers, memory=memory,
                          device="cpu", trials_per_worker=depth).run(trials)
        wall = time.perf_counter() - t0
        best = study.best_value
        states = [t.state.name for t in study.trials]
        rounds = sum(len(t.intermediate_values) + (t.state.name == "COMPLETE")
                     for t in study.trials)
    room = stats.budget - stats.fixed - stats.headroom
    return {"seconds": wall, "best": best, "packing_efficiency": stats.packing_efficiency(),
            "arena_utilisation": stats.packing_efficiency(of=room),
            "peak_bytes": stats.peak, "measured_peak_bytes": stats.measured_peak,
            "budget_bytes": stats.budget, "fixed_bytes": stats.fixed,
            "pruned": states.count("PRUNED"), "failed": states.count("FAIL"), "rounds": rounds}


def run_baseline(trials: int, jobs: int, seed: int, pruner: str | None = None
                 ) -> dict[str, Any]:
    import optuna
    import torch

    from explore.datasets import load_mnist

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
    ds = load_mnist()
    x, y = torch.from_numpy(ds.train.x[:10_000].copy()), torch.from_numpy(ds.train.y[:10_000])
    xv, yv = torch.from_numpy(ds.valid.x.copy()), torch.from_numpy(ds.valid.y.copy())
    init = {"xavier_uniform": torch.nn.init.xavier_uniform_,
            "he_uniform": lambda w: torch.nn.init.kaiming_uniform_(w, nonlinearity="relu"),
            "normal": lambda w: torch.nn.init.normal_(w, 0.0, 0.05)}

    def objective(trial: optuna.Trial) -> float:
        init_name = trial.suggest_categorical("init", ["xavier_uniform", "he_uniform", "normal"])
        opt_name = trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop", "adagrad"])
        lr = trial.suggest_float("lr", 1e-4, 3e-1, log=True)
        momentum = trial.suggest_float("momentum", 0.0, 0.95) if opt_name == "sgd" else 0.0
        layers = [torch.nn.Linear(784, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)]
        for lin in layers:
            init[init_name](lin.weight)
            torch.nn.init.zeros_(lin.bias)
        model = torch.nn.Sequential(layers[0], torch.nn.Sigmoid(), layers[1], torch.nn.Sigmoid(),
                                    layers[2])
        params = list(model.parameters())
        cls, kw = {"sgd": (torch.optim.SGD, {"momentum": momentum}),
                   "adam": (torch.optim.Adam, {}), "rmsprop": (torch.optim.RMSprop, {}),
                   "adagrad": (torch.optim.Adagrad, {})}[opt_name]
        try:
            opt = cls(params, lr=lr, fused=True, **kw)
        except (RuntimeError, TypeError, ValueError):
            opt = cls(params, lr=lr, foreach=True, **kw)
        loss_fn = torch.nn.CrossEntropyLoss()
        torch.manual_seed(seed + trial.number)
        rng = np.random.default_rng(seed + trial.number)
        acc = 0.0
        for rnd in range(10):
            order = torch.from_numpy(rng.permutation(len(y)))
            xs, ys = x[order], y[order]
            model.train()
            for s in range(0, len(y), 64):
                opt.zero_grad(set_to_none=True)
                loss_fn(model(xs[s:s + 64]), ys[s:s + 64]).backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                acc = float((model(xv).argmax(1) == yv).float().mean())
            trial.report(acc, rnd + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return acc

    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                                                   group=True),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2,
                                                                   n_warmup_steps=2)
                                if pruner_of(pruner) == "median" else
                                optuna.pruners.NopPruner())
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=jobs)
    wall = time.perf_counter() - t0
    states = [t.state.name for t in study.trials]
    rounds = sum(len(t.intermediate_values) for t in study.trials)
    return {"seconds": wall, "best": study.best_value, "measured_peak_bytes": vmhwm(),
            "pruned": states.count("PRUNED"), "failed": states.count("FAIL"), "rounds": rounds}


def child(side: str, trials: int, memory: int, workers: int, seed: int,
          eval_batch: int | None, pruner: str | None) -> dict[str, Any]:
    if side == "explore":
        return run_explore(trials, memory, workers, seed, eval_batch=eval_batch, pruner=pruner)
    if side == "packed":
        return run_explore(trials, memory, workers, seed, depth=1_000_000,
                           eval_batch=eval_batch, pruner=pruner)
    return run_baseline(trials, workers, seed, pruner)


def median(runs: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--memory", default="",
                    help="the memory budget (default: the space's, 1GB)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0,
                    help="repeat i runs both sides with seed SEED + i")
    ap.add_argument("--eval-batch", type=int, default=0,
                    help="explore's validation chunk (default 0: the space's, 10,000: the "
                         "whole validation set at once, as the baseline validates)")
    ap.add_argument("--pruner", choices=["none", "median"], default=None,
                    help="both sides' pruner (default: the space's, none)")
    ap.add_argument("--child", choices=["explore", "packed", "baseline"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    from explore.space import load_space, parse_size

    memory = parse_size(args.memory) if args.memory else load_space(SPACE).budget.memory
    if args.child:
        print(json.dumps(child(args.child, args.trials, memory, args.workers, args.seed,
                               args.eval_batch or None, args.pruner)))
        return
    runs: dict[str, list[dict[str, Any]]] = {"explore": [], "packed": [], "baseline": []}
    for i in range(args.repeats):  # interleaved, each in a fresh process
        for side in runs:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--trials",
                   str(args.trials), "--memory", str(memory), "--workers", str(args.workers),
                   "--seed", str(args.seed + i), "--eval-batch", str(args.eval_batch)]
            if args.pruner:
                cmd += ["--pruner", args.pruner]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            r["trials_per_min"] = args.trials / r["seconds"] * 60
            r["rounds_per_min"] = r["rounds"] / r["seconds"] * 60
            runs[side].append(r)
    e, p, b = runs["explore"], runs["packed"], runs["baseline"]

    def rnd(x: Any, n: int = 2) -> Any:
        return round(x, n) if isinstance(x, float) else x

    result = {
        "explore_trials_per_min": rnd(median(e, "trials_per_min")),
        "baseline_trials_per_min": rnd(median(b, "trials_per_min")),
        "packing_efficiency": rnd(median(p, "packing_efficiency"), 4),
        "peak_bytes": max(r["peak_bytes"] for r in e + p),
        "budget_bytes": memory,
        "explore_best": rnd(median(e, "best"), 4),
        "baseline_best": rnd(median(b, "best"), 4),
        "packed_best": rnd(median(p, "best"), 4),
        "explore_rounds_per_min": rnd(median(e, "rounds_per_min"), 1),
        "baseline_rounds_per_min": rnd(median(b, "rounds_per_min"), 1),
        "packed_trials_per_min": rnd(median(p, "trials_per_min")),
        "packed_arena_utilisation": rnd(median(p, "arena_utilisation"), 4),
        "explore_packing_efficiency": rnd(median(e, "packing_efficiency"), 4),
        "fixed_bytes": median(e, "fixed_bytes"),
        # explore: the PSS of its process tree (what its budget holds); the baseline: the
        # resident peak of its one process (its trials are threads).
        "explore_peak_bytes": max(r["measured_peak_bytes"] for r in e),
        "baseline_peak_bytes": max(r["measured_peak_bytes"] for r in b),
        "explore_pruned": [r["pruned"] for r in e], "baseline_pruned": [r["pruned"] for r in b],
        "packed_pruned": [r["pruned"] for r in p],
        "explore_trials_per_min_all": [rnd(r["trials_per_min"]) for r in e],
        "baseline_trials_per_min_all": [rnd(r["trials_per_min"]) for r in b],
        "explore_best_all": [rnd(r["best"], 4) for r in e],
        "baseline_best_all": [rnd(r["best"], 4) for r in b],
        "trials": args.trials, "workers": args.workers, "repeats": args.repeats,
        "eval_batch": args.eval_batch or None, "pruner": pruner_of(args.pruner),
        "seeds": [args.seed + i for i in range(args.repeats)],
    }
    result["speedup"] = rnd(result["explore_trials_per_min"] /
                            result["baseline_trials_per_min"])
    result["rounds_speedup"] = rnd(result["explore_rounds_per_min"] /
                                   result["baseline_rounds_per_min"])
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
