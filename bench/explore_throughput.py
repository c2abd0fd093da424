"""Trials per minute: ``explore`` against Optuna training PyTorch models, with
``n_jobs=2`` and as two processes on one journal file.

The paper's MNIST MLP space (``search_spaces/paper_mnist.yaml``: the fixed 784-64-64-10
sigmoid MLP; optimizer, learning rate and init searched; 10,000 training images,
mini-batches of 64), 60 trials of 10 rounds, the same TPE sampler and the space's
pruner (none: every trial runs its 10 rounds, as in the paper) on every side, 2
workers / 2 jobs / 2 processes, each side in its own fresh process
(``bench/_sides.py``), the sides alternating.  Repeat i runs every side with seed
``--seed + i`` (sampler, inits, shuffling).

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
- baseline ``njobs``: what a user writes: ``study.optimize(objective, n_trials=60,
  n_jobs=2)``, the objective building a PyTorch model and optimizer (the fastest
  implementation: fused where PyTorch has it), reporting validation accuracy each round
  for pruning; one PyTorch thread per job (two jobs on two cores: measured faster than
  two each);
- baseline ``journal``: the strongest a user writes: two processes, each running
  ``study.optimize(objective, n_trials=30)`` (the trials split so that the total is
  explore's) on one study in ``JournalStorage(JournalFileBackend(path))``, the same
  objective, one PyTorch thread each, each its own TPE sampler (process k seeded
  ``seed + 100000 k``: the same seed would draw the same first trials twice) and
  pruner.  Both processes import and load their data first; the clock starts when both
  are ready and stops when the last one is done.

Reported (medians of ``--repeats`` interleaved runs, each side in a fresh process):
trials per minute (wall time of the search, the explore side's start-up of its workers
included, the baselines' data loading not) and rounds per minute (the same ratio
without a pruner; with one, the steadier figure), the best validation accuracy of each,
the packing efficiency of the packed runs, the accounted peak and the measured peak
resident memory.  Each baseline has its own keys (``baseline_njobs_*``,
``baseline_journal_*``); ``baseline_*`` without a name and the ratios ``speedup`` and
``rounds_speedup`` are the better one's by trials per minute, named in
``baseline_better``.
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
    python bench/explore_throughput.py --json --pruner median

The figures measured, with the machine and command: ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, median, peak_rss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(ROOT, "search_spaces", "paper_mnist.yaml")
SIDES = ("explore", "packed", "njobs", "journal")
BASELINES = ("njobs", "journal")


@dataclass(frozen=True)
class Size:
    """How much each side searches: the space's unless ``--quick`` or the options say."""

    trials: int
    rounds: int
    train: int
    valid: int | None  # None: the whole validation split

    def args(self) -> list[str]:
        return ["--trials", str(self.trials), "--rounds", str(self.rounds),
                "--train", str(self.train), "--valid", str(self.valid or 0)]


def pruner_of(name: str | None) -> str:
    """The pruner every side uses: ``name``, or the space's."""
    from explore.space import load_space

    return name or load_space(SPACE).pruner.name


def run_explore(size: Size, memory: int, workers: int, seed: int, depth: int | None = None,
                eval_batch: int | None = None, pruner: str | None = None,
                stack: int | None = None) -> dict[str, Any]:
    import optuna

    from explore.binding import bind
    from explore.scheduler import Scheduler
    from explore.scheduler.shared_data import load_shared
    from explore.space import load_space
    from explore.study import open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(SPACE)
    budget = space.budget.model_copy(update={"trials": size.trials, "rounds": size.rounds,
                                             "memory": memory, "workers": workers,
                                             "seed": seed, "stack": stack or
                                             space.budget.stack})
    assert space.dataset is not None
    update: dict[str, Any] = {"budget": budget,
                              "dataset": space.dataset.model_copy(update={
                                  "train": size.train, "valid": size.valid}),
                              "sampler": space.sampler.model_copy(update={"seed": seed}),
                              "pruner": space.pruner.model_copy(update={
                                  "name": pruner_of(pruner), "warmup_rounds": 2})}
    # the fixed workload the baselines run: a validation after every round
    update["training"] = space.training.model_copy(update={
        "validate_every": 1, **({"eval_batch_size": eval_batch} if eval_batch else {})})
    space = space.model_copy(update=update)
    bound = bind(space)
    data = load_shared(bound)  # as `explore run` loads it: the run's rows, compact
    with tempfile.TemporaryDirectory() as tmp:
        study = open_study(space, f"sqlite:///{tmp}/bench.db")
        t0 = time.perf_counter()
        stats = Scheduler(bound, study, data, workers=workers, memory=memory,
                          device="cpu", trials_per_worker=depth).run(size.trials)
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


def objective_of(size: Size, seed: int) -> Any:
    """The baselines' objective: the space's model in PyTorch, trained on the first
    ``size.train`` MNIST images, validated on ``size.valid`` in one call each round."""
    import optuna
    import torch

    from explore.datasets import load_mnist

    ds = load_mnist()
    n = size.train
    x, y = torch.from_numpy(ds.train.x[:n].copy()), torch.from_numpy(ds.train.y[:n].copy())
    v = size.valid or len(ds.valid.y)
    xv, yv = torch.from_numpy(ds.valid.x[:v].copy()), torch.from_numpy(ds.valid.y[:v].copy())
    init = {"xavier_uniform": torch.nn.init.xavier_uniform_,
            "he_uniform": lambda w: torch.nn.init.kaiming_uniform_(w, nonlinearity="relu"),
            "normal": lambda w: torch.nn.init.normal_(w, 0.0, 0.05)}

    def objective(trial: optuna.Trial) -> float:
        init_name = trial.suggest_categorical("init", ["xavier_uniform", "he_uniform", "normal"])
        opt_name = trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop", "adagrad"])
        lr = trial.suggest_float("lr", 1e-4, 3e-1, log=True)
        momentum = trial.suggest_float("momentum", 0.0, 0.95) if opt_name == "sgd" else 0.0
        torch.manual_seed(seed + trial.number)  # (n_jobs: threads share this generator)
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
        rng = np.random.default_rng(seed + trial.number)
        acc = 0.0
        for rnd in range(size.rounds):
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

    return objective


def sampler_and_pruner(seed: int, pruner: str | None) -> tuple[Any, Any]:
    import optuna

    return (optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True),
            optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2)
            if pruner_of(pruner) == "median" else optuna.pruners.NopPruner())


def summary(study: Any) -> dict[str, Any]:
    states = [t.state.name for t in study.trials]
    return {"best": study.best_value, "pruned": states.count("PRUNED"),
            "failed": states.count("FAIL"),
            "rounds": sum(len(t.intermediate_values) for t in study.trials)}


def run_njobs(size: Size, jobs: int, seed: int, pruner: str | None = None) -> dict[str, Any]:
    """``study.optimize(objective, n_jobs=jobs)`` in this process."""
    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
    objective = objective_of(size, seed)
    sampler, prune = sampler_and_pruner(seed, pruner)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=prune)
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=size.trials, n_jobs=jobs)
    wall = time.perf_counter() - t0
    return {"seconds": wall, **summary(study), "measured_peak_bytes": peak_rss()}


def journal_storage(path: str) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(path))


def run_journal(size: Size, jobs: int, seed: int, pruner: str | None = None
                ) -> dict[str, Any]:
    """``jobs`` fresh processes each running ``study.optimize`` on one journal-file
    study, the trials split between them; timed from when all of them are ready (torch
    imported, data loaded) to when the last one finishes."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.log")
        optuna.create_study(storage=journal_storage(path), study_name="bench",
                            direction="maximize")
        procs = []
        for k in range(jobs):
            share = size.trials // jobs + (k < size.trials % jobs)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "journal-worker",
                   "--journal", path, "--seed", str(seed + 100_000 * k),
                   "--trial-seed", str(seed), *Size(share, size.rounds, size.train,
                                                   size.valid).args()]
            if pruner:
                cmd += ["--pruner", pruner]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        for p in procs:
            assert p.stdout is not None
            ready = p.stdout.readline().strip()
            if ready != "ready":
                raise RuntimeError(f"a journal worker said {ready!r}, not 'ready'")
        t0 = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on Linux
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        answers = []
        for p in procs:
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"a journal worker exited {p.returncode}")
            answers.append(json.loads(out.strip().splitlines()[-1]))
        study = optuna.load_study(study_name="bench", storage=journal_storage(path))
        return {"seconds": max(a["end"] for a in answers) - t0, **summary(study),
                # the workers' resident peaks added up (each is one process)
                "measured_peak_bytes": sum(a["peak_rss_bytes"] for a in answers)}


def journal_worker(size: Size, path: str, seed: int, trial_seed: int, pruner: str | None
                   ) -> None:
    """One process of the journal baseline: get ready, say so, wait for 'go' on stdin,
    run ``size.trials`` trials, print when it finished."""
    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    objective = objective_of(size, trial_seed)
    sampler, prune = sampler_and_pruner(seed, pruner)
    study = optuna.load_study(study_name="bench", storage=journal_storage(path),
                              sampler=sampler, pruner=prune)
    print("ready", flush=True)
    sys.stdin.readline()
    study.optimize(objective, n_trials=size.trials)
    print(json.dumps({"end": time.monotonic(), "peak_rss_bytes": peak_rss()}), flush=True)


def child(side: str, size: Size, memory: int, workers: int, seed: int,
          eval_batch: int | None, pruner: str | None, stack: int | None = None
          ) -> dict[str, Any]:
    if side == "explore":
        return run_explore(size, memory, workers, seed, eval_batch=eval_batch, pruner=pruner,
                           stack=stack)
    if side == "packed":
        return run_explore(size, memory, workers, seed, depth=1_000_000,
                           eval_batch=eval_batch, pruner=pruner, stack=stack)
    if side == "journal":
        return run_journal(size, workers, seed, pruner)
    return run_njobs(size, workers, seed, pruner)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=0, help="rounds per trial (0: the space's)")
    ap.add_argument("--train", type=int, default=0,
                    help="training images (0: the space's, 10,000)")
    ap.add_argument("--valid", type=int, default=0,
                    help="validation images (0: all 10,000)")
    ap.add_argument("--memory", default="",
                    help="the memory budget (default: the space's, 1GB)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0,
                    help="repeat i runs every side with seed SEED + i")
    ap.add_argument("--eval-batch", type=int, default=0,
                    help="explore's validation chunk (default 0: the space's, 10,000: the "
                         "whole validation set at once, as the baselines validate)")
    ap.add_argument("--pruner", choices=["none", "median"], default=None,
                    help="every side's pruner (default: the space's, none)")
    ap.add_argument("--stack", type=int, default=0,
                    help="explore's budget.stack: trials asked at once and stacked where "
                         "they share an optimizer kind (0: the space's)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 4 trials of 2 rounds on 1,000 + 1,000 images")
    ap.add_argument("--log", action="store_true", help="each child's answer on stderr")
    ap.add_argument("--child", choices=[*SIDES, "journal-worker"], help=argparse.SUPPRESS)
    ap.add_argument("--journal", help=argparse.SUPPRESS)
    ap.add_argument("--trial-seed", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from explore.space import load_space, parse_size

    space = load_space(SPACE)
    if args.quick:
        args.trials, args.rounds, args.train, args.valid = 4, 2, 1000, 1000
        args.eval_batch = args.eval_batch or 1000
    size = Size(args.trials, args.rounds or space.budget.rounds,
                args.train or (space.dataset.train if space.dataset else None) or 10_000,
                args.valid or None)
    memory = parse_size(args.memory) if args.memory else space.budget.memory
    if args.child == "journal-worker":
        journal_worker(size, args.journal, args.seed, args.trial_seed, args.pruner)
        return
    if args.child:
        print(json.dumps(child(args.child, size, memory, args.workers, args.seed,
                               args.eval_batch or None, args.pruner, args.stack or None)))
        return
    common = [*size.args(), "--memory", str(memory), "--workers", str(args.workers),
              "--eval-batch", str(args.eval_batch), "--stack", str(args.stack),
              *(["--pruner", args.pruner] if args.pruner else [])]
    # repeat i: every side with seed SEED + i, each in a fresh process
    runs = alternate(__file__, {s: ["--child", s, *common] for s in SIDES}, args.repeats,
                     per_repeat=lambda i: ["--seed", str(args.seed + i)], log=args.log)
    for got in runs.values():
        for r in got:
            r["trials_per_min"] = size.trials / r["seconds"] * 60
            r["rounds_per_min"] = r["rounds"] / r["seconds"] * 60
    e, p = runs["explore"], runs["packed"]

    def rnd(x: Any, n: int = 2) -> Any:
        return round(x, n) if isinstance(x, float) else x

    result: dict[str, Any] = {
        "explore_trials_per_min": rnd(median(e, "trials_per_min")),
        "packing_efficiency": rnd(median(p, "packing_efficiency"), 4),
        "peak_bytes": max(r["peak_bytes"] for r in e + p),
        "budget_bytes": memory,
        "explore_best": rnd(median(e, "best"), 4),
        "packed_best": rnd(median(p, "best"), 4),
        "explore_rounds_per_min": rnd(median(e, "rounds_per_min"), 1),
        "packed_trials_per_min": rnd(median(p, "trials_per_min")),
        "packed_arena_utilisation": rnd(median(p, "arena_utilisation"), 4),
        "explore_packing_efficiency": rnd(median(e, "packing_efficiency"), 4),
        "fixed_bytes": median(e, "fixed_bytes"),
        # explore: the PSS of its process tree (what its budget holds); n_jobs: the
        # resident peak of its one process (its trials are threads); journal: its two
        # processes' resident peaks added up.
        "explore_peak_bytes": max(r["measured_peak_bytes"] for r in e),
        "explore_pruned": [r["pruned"] for r in e], "packed_pruned": [r["pruned"] for r in p],
        "explore_trials_per_min_all": [rnd(r["trials_per_min"]) for r in e],
        "explore_best_all": [rnd(r["best"], 4) for r in e],
    }
    for b in BASELINES:
        got = runs[b]
        result.update({
            f"baseline_{b}_trials_per_min": rnd(median(got, "trials_per_min")),
            f"baseline_{b}_rounds_per_min": rnd(median(got, "rounds_per_min"), 1),
            f"baseline_{b}_best": rnd(median(got, "best"), 4),
            f"baseline_{b}_peak_bytes": max(r["measured_peak_bytes"] for r in got),
            f"baseline_{b}_pruned": [r["pruned"] for r in got],
            f"baseline_{b}_trials_per_min_all": [rnd(r["trials_per_min"]) for r in got],
            f"baseline_{b}_best_all": [rnd(r["best"], 4) for r in got],
        })
        result[f"speedup_vs_{b}"] = rnd(result["explore_trials_per_min"] /
                                        result[f"baseline_{b}_trials_per_min"])
    better = max(BASELINES, key=lambda b: result[f"baseline_{b}_trials_per_min"])
    result["baseline_better"] = better
    for key in ("trials_per_min", "rounds_per_min", "best", "peak_bytes", "pruned",
                "trials_per_min_all", "best_all"):
        result[f"baseline_{key}"] = result[f"baseline_{better}_{key}"]
    result.update({
        "trials": size.trials, "rounds": size.rounds, "workers": args.workers,
        "repeats": args.repeats, "eval_batch": args.eval_batch or None,
        "stack": args.stack or space.budget.stack,
        "pruner": pruner_of(args.pruner), "seeds": [args.seed + i for i in range(args.repeats)],
        "isolation": "each side in a fresh process, alternating; medians"})
    result["speedup"] = rnd(result["explore_trials_per_min"] /
                            result["baseline_trials_per_min"])
    result["rounds_speedup"] = rnd(result["explore_rounds_per_min"] /
                                   result["baseline_rounds_per_min"])
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
