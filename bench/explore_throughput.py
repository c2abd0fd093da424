"""Trials per minute: ``explore`` against Optuna ``n_jobs=2`` training PyTorch models.

The paper's MNIST MLP space (``search_spaces/paper_mnist.yaml``: the fixed 784-64-64-10
sigmoid MLP; optimizer, learning rate and init searched; 10,000 training images,
mini-batches of 64), 60 trials of 10 rounds, the same TPE sampler (seed 0) and median
pruner on both sides, 2 workers / 2 jobs, each side in a fresh process, one after the
other, in one run.

- explore: ``Scheduler`` over the space with the given memory budget (default 200MB:
  small enough that candidates wait for room, so packing is exercised);
- baseline: what a user writes: ``study.optimize(objective, n_trials=60, n_jobs=2)``,
  the objective building a PyTorch model and optimizer (the fastest implementation:
  fused where PyTorch has it), reporting validation accuracy each round for pruning;
  one PyTorch thread per job (two jobs on two cores: measured faster than two each).

Reported: trials per minute (wall time of the whole search, start-up included), the
best validation accuracy of each, explore's packing efficiency (mean fraction of the
budget held by trial heaps while candidates waited; also as a fraction of what the
budget leaves after data and worker overheads), its accounted peak and the measured
peak resident memory of both.

    python bench/explore_throughput.py --json
"""

from __future__ import annotations

import argparse
import json
import os
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


def run_explore(trials: int, memory: int, workers: int) -> dict[str, Any]:
    import optuna

    from explore.data import load
    from explore.scheduler import Scheduler
    from explore.space import load_space
    from explore.study import open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE)
    budget = space.budget.model_copy(update={"trials": trials, "memory": memory,
                                             "workers": workers})
    space = space.model_copy(update={"budget": budget})
    data = load(space.dataset.name)
    with tempfile.TemporaryDirectory() as tmp:
        study = open_study(space, f"sqlite:///{tmp}/bench.db")
        t0 = time.perf_counter()
        stats = Scheduler(space, study, data, workers=workers, memory=memory,
                          device="cpu").run(trials)
        wall = time.perf_counter() - t0
        best = study.best_value
        states = [t.state.name for t in study.trials]
    room = stats.budget - stats.data - sum(stats.overheads)
    eff = stats.packing_efficiency()
    return {"seconds": wall, "best": best, "packing_efficiency": eff,
            "arena_utilisation": eff * stats.budget / room if eff is not None else None,
            "peak_bytes": stats.peak, "rss_peak_bytes": stats.rss_peak,
            "budget_bytes": stats.budget, "fixed_bytes": stats.data + sum(stats.overheads),
            "pruned": states.count("PRUNED"), "failed": states.count("FAIL")}


def run_baseline(trials: int, jobs: int) -> dict[str, Any]:
    import optuna
    import torch

    from explore.data import load_mnist

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
        rng = np.random.default_rng(trial.number)
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
                                sampler=optuna.samplers.TPESampler(seed=0, multivariate=True,
                                                                   group=True),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2,
                                                                   n_warmup_steps=2))
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=jobs)
    wall = time.perf_counter() - t0
    states = [t.state.name for t in study.trials]
    return {"seconds": wall, "best": study.best_value, "rss_peak_bytes": vmhwm(),
            "pruned": states.count("PRUNED"), "failed": states.count("FAIL")}


def child(side: str, trials: int, memory: int, workers: int) -> dict[str, Any]:
    if side == "explore":
        return run_explore(trials, memory, workers)
    return run_baseline(trials, workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--memory", default="200MB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--child", choices=["explore", "baseline"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    from explore.space import parse_size

    memory = parse_size(args.memory)
    if args.child:
        print(json.dumps(child(args.child, args.trials, memory, args.workers)))
        return
    res = {}
    for side in ("explore", "baseline"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--trials",
               str(args.trials), "--memory", str(memory), "--workers", str(args.workers)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        res[side] = json.loads(out.strip().splitlines()[-1])
    e, b = res["explore"], res["baseline"]
    result = {
        "explore_trials_per_min": round(args.trials / e["seconds"] * 60, 2),
        "baseline_trials_per_min": round(args.trials / b["seconds"] * 60, 2),
        "packing_efficiency": e["packing_efficiency"],
        "arena_utilisation": e["arena_utilisation"],
        "peak_bytes": e["peak_bytes"], "budget_bytes": e["budget_bytes"],
        "fixed_bytes": e["fixed_bytes"],
        "explore_rss_peak_bytes": e["rss_peak_bytes"],
        "baseline_rss_peak_bytes": b["rss_peak_bytes"],
        "explore_best": round(e["best"], 4), "baseline_best": round(b["best"], 4),
        "explore_pruned": e["pruned"], "baseline_pruned": b["pruned"],
        "trials": args.trials, "workers": args.workers,
    }
    result["speedup"] = round(result["explore_trials_per_min"] /
                              result["baseline_trials_per_min"], 2)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
