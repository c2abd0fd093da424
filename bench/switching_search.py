"""A successive-halving search in a memory budget too small for the trials paused at
its rung: paused trials switched out to files (``budget.switching: true``, the default)
against pruned for room (``false``, the old behaviour).

METHOD.  MNIST (``--train`` 4,000 training and ``--valid`` 2,000 validation images,
shipped offline; ``--dataset digits`` for scikit-learn's digits), ``--trials`` 16 of
``--rounds`` 3, a random sampler (seed ``--seed + i`` in repeat i, the same on both
sides), successive halving with pausing (``warmup_rounds: 1``: one rung, after the
first round; Optuna's reduction factor 4: a trial goes on when it is in the top quarter
of the values reported there so far, else it waits paused, and resumes if later results
promote it).  The model: an MLP of two hidden layers of 128 to 1,024 units, Adam or SGD,
learning rate 1e-3 to 1e-1, batches of 64, validation in chunks of 256.  One worker, so
that with the seeded sampler the search runs in lockstep (reproducible: the same trials
in the same order on both sides; the test of ``tests/explore/scheduler/
test_switching_search.py`` holds it to the bit), and so that both sides train one trial
at a time.

The budget: ``memory`` = the run's fixed bytes (the scheduler's process, the worker,
the resource tracker and the data set, measured once at the start by a one-trial run
of the same space: its budget minus its arena and its headroom) plus the headroom the
scheduler holds back (2% of the budget) plus ``--fraction`` (a quarter) of the heaps of
the rung's trials, or the biggest trial's heap and ``--margin`` (12 MB: a run's own
fixed bytes come out a few MB above the calibration's) where that is more.  All
``--trials`` reach the rung; their heaps are computed before the run by drawing each
trial's parameters as the run does, from the seeded sampler of
``explore.study.make_sampler``, and compiling them, each aligned as the arena aligns
it, per seed.  ``--memory`` sets the budget instead.  Each run reports the arena it got
and its rung's heaps as they ran (``arena_over_rung``: about 0.25, moved by the fixed
bytes measured in that run, and more where the biggest trial needs it).

Each side runs ``explore.run`` on the space in its own fresh process
(``bench/_sides.py``), the sides alternating, ``--repeats`` (5) times.  Per side:
median wall time of ``explore.run`` (loading the data set and starting the worker
included, alike on both sides), median best validation accuracy (the objective), trials
completed and pruned, trials switched out, switches out (``switched_out`` of the
trials' records, ``explore.results.load``) and bytes written by them, and switches back
in (the run's record).  ``best_by_seed`` pairs the two sides' best per seed: in
lockstep each seed is the same search on both sides up to the first trial pruned for
room.

    python bench/switching_search.py --json
    python bench/switching_search.py --json --quick   # 6 trials of 2 rounds, 1 repeat
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import alternate, emit, median

SIDES = {"switching": True, "pruning": False}
WIDTHS = [128, 256, 512, 1024]
BIG = 4 << 30  # a budget that holds everything: the calibration's, the heaps' share


def space(dataset: str, trials: int, rounds: int, train: int, valid: int, memory: int,
          switching: bool, seed: int) -> dict[str, Any]:
    """The searched space (see the module docstring)."""
    data: dict[str, Any] = {"name": dataset}
    if dataset == "mnist":
        data.update(train=train, valid=valid)
    return {
        "name": "switching_search",
        "dataset": data,
        "objectives": [{"metric": "accuracy", "direction": "maximize"}],
        "budget": {"trials": trials, "rounds": rounds, "device": "cpu", "memory": memory,
                   "workers": 1, "switching": switching, "seed": seed,
                   # one choice for the calibration's big budget and the runs' small
                   # one: under "auto" they would differ, and so would the fixed bytes
                   "kernels": "numpy"},
        "sampler": {"name": "random", "seed": seed},
        "pruner": {"name": "successive_halving", "warmup_rounds": 1, "pause": True},
        "model": {"family": "mlp", "depth": 2, "width": {"choice": WIDTHS},
                  "activation": "relu", "dropout": 0.0, "init": "he_uniform"},
        "training": {"optimizer": {"choice": ["adam", "sgd"]},
                     "lr": {"float": [1.0e-3, 1.0e-1], "log": True},
                     "batch_size": 64, "eval_batch_size": 256},
        "keep_models": 0,
    }


def rung_heaps(sp: dict[str, Any], trials: int, seed: int) -> list[int]:
    """The aligned heaps of the trials the seeded random sampler draws first: every
    trial reaches the rung, so these are the rung's."""
    import optuna

    from engine.alignment import align_up
    from explore.binding import bind
    from explore.candidate import compile_candidate
    from explore.sampling import suggest
    from explore.space import parse_space
    from explore.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parsed = parse_space(sp)
    bound = bind(parsed)
    study = optuna.create_study()
    heaps = []
    for n in range(trials):  # trial n draws with the seed's and n's randomness, as a run
        study.sampler = make_sampler(parsed, n)
        params = suggest(study.ask(), parsed)
        heaps.append(align_up(compile_candidate(bound, params, share=BIG)
                              .program.total_bytes))
    return heaps


def budget_for(base: int, arena: int) -> int:
    """The budget whose arena is ``arena`` when the run's processes and data take
    ``base`` bytes: the scheduler also holds back a headroom that grows with the budget
    (``explore.scheduler.admission.headroom``)."""
    from explore.scheduler.admission import headroom

    memory = base + arena
    for _ in range(20):
        memory = base + arena + headroom(memory)
    return memory


def run_side(sp: dict[str, Any]) -> dict[str, Any]:
    """``explore.run`` on ``sp`` in this (fresh) process; what it did."""
    import optuna

    import explore
    from engine.alignment import align_up
    from explore.attrs import RUNS_ATTR
    from explore.results import load

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="switching_search.") as tmp:
        url = f"sqlite:///{tmp}/s.db"
        t0 = time.perf_counter()
        study = explore.run(sp, storage=url)
        wall = time.perf_counter() - t0
        df = load(url, sp["name"])
        run = (study.user_attrs.get(RUNS_ATTR) or [{}])[-1]
    states = df["state"].tolist()
    done = df[df["state"] == "complete"]
    best_row = done.loc[done["value"].idxmax()] if len(done) else None
    out = [int(x or 0) for x in df.get("switched_out", [])]
    heaps = sum(align_up(int(b)) for b in df["total_bytes"] if b == b and b is not None)
    sw = run.get("switching") or {}
    arena = run.get("arena")
    return {
        "seconds": wall,
        "best": float(best_row["value"]) if best_row is not None else None,
        "best_trial": int(best_row["number"]) if best_row is not None else None,
        "best_was_switched_out": bool(best_row is not None and
                                      int(best_row.get("switched_out") or 0) > 0),
        "trials": len(states), "completed": states.count("complete"),
        "pruned": states.count("pruned"), "failed": states.count("fail"),
        "switched_out": sum(out), "trials_switched_out": sum(1 for x in out if x),
        "switch_bytes": int(sum(int(x or 0) for x in df.get("switch_bytes", []))),
        "switched_in": sw.get("switched_in"),
        "completed_after_switch": int(sum(1 for x, s in zip(out, states, strict=True)
                                          if x and s == "complete")),
        "budget_bytes": run.get("budget"), "arena_bytes": arena, "rung_heap_bytes": heaps,
        "arena_over_rung": round(arena / heaps, 4) if arena and heaps else None,
        "measured_peak_bytes": run.get("measured_peak"),
    }


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """A one-trial, one-round run of the space with a roomy budget, in a fresh process:
    its fixed bytes (budget - arena)."""
    from bench._sides import run_side as child

    got = child(__file__, ["--child", "calibrate", *common(args), "--seed", str(args.seed),
                           "--memory", str(BIG)])
    return got


def common(args: argparse.Namespace) -> list[str]:
    return ["--dataset", args.dataset, "--trials", str(args.trials), "--rounds",
            str(args.rounds), "--train", str(args.train), "--valid", str(args.valid)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train", type=int, default=4000, help="MNIST training images")
    ap.add_argument("--valid", type=int, default=2000, help="MNIST validation images")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0,
                    help="repeat i runs both sides with seed SEED + i")
    ap.add_argument("--fraction", type=float, default=0.25,
                    help="the share of the rung's heaps the arena holds")
    ap.add_argument("--margin", type=int, default=12_000_000,
                    help="bytes the arena holds beyond the biggest trial's heap, at least")
    ap.add_argument("--memory", type=int, default=0,
                    help="the budget in bytes (default 0: fixed bytes + FRACTION of the "
                         "rung's heaps, per seed)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 6 trials of 2 rounds on 1,000 + 500 images, 1 repeat")
    ap.add_argument("--log", action="store_true", help="each child's answer on stderr")
    ap.add_argument("--child", choices=[*SIDES, "calibrate"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.trials, args.rounds, args.train, args.valid = 6, 2, 1000, 500
        args.repeats = 1

    def space_of(seed: int, memory: int, switching: bool, trials: int | None = None,
                 rounds: int | None = None) -> dict[str, Any]:
        return space(args.dataset, trials or args.trials, rounds or args.rounds, args.train,
                     args.valid, memory, switching, seed)

    if args.child == "calibrate":
        r = run_side(space_of(args.seed, args.memory, True, trials=1, rounds=1))
        from explore.scheduler.admission import headroom

        emit({"fixed_bytes": r["budget_bytes"] - r["arena_bytes"] - headroom(r["budget_bytes"]),
              "seconds": r["seconds"]})
        return
    if args.child:
        emit(run_side(space_of(args.seed, args.memory, SIDES[args.child])))
        return

    seeds = [args.seed + i for i in range(args.repeats)]
    fixed = None
    heaps: dict[int, int | None] = {s: None for s in seeds}
    if args.memory:
        memory = {s: args.memory for s in seeds}
    else:
        fixed = int(calibrate(args)["fixed_bytes"])
        drawn = {s: rung_heaps(space_of(s, BIG, True), args.trials, s) for s in seeds}
        heaps = {s: sum(h) for s, h in drawn.items()}
        # the arena holds the biggest trial at least (else that trial fails, unplaced),
        # with a margin: a run's own fixed bytes come out a few MB above the calibration's
        memory = {s: budget_for(fixed, max(max(h) + args.margin, int(args.fraction * sum(h))))
                  for s, h in drawn.items()}
    sides = {name: ["--child", name, *common(args)] for name in SIDES}
    runs = alternate(__file__, sides, args.repeats, log=args.log,
                     per_repeat=lambda i: ["--seed", str(seeds[i]),
                                           "--memory", str(memory[seeds[i]])])

    def rnd(x: Any, n: int = 3) -> Any:
        return round(x, n) if isinstance(x, float) else x

    result: dict[str, Any] = {
        "dataset": args.dataset, "trials": args.trials, "rounds": args.rounds,
        "train": args.train if args.dataset == "mnist" else None,
        "valid": args.valid if args.dataset == "mnist" else None,
        "workers": 1, "repeats": args.repeats, "seeds": seeds, "cores": os.cpu_count(),
        "fraction": args.fraction, "fixed_bytes": fixed,
        "memory_by_seed": [memory[s] for s in seeds],
        "rung_heap_bytes_by_seed": [heaps[s] for s in seeds],
    }
    keys = ("seconds", "best", "completed", "pruned", "failed", "switched_out",
            "trials_switched_out", "switch_bytes", "switched_in", "completed_after_switch",
            "arena_over_rung", "measured_peak_bytes")
    for name, got in runs.items():
        for k in keys:
            result[f"{name}_{k}"] = rnd(median(got, k), 4 if k == "best" else 3)
        result[f"{name}_seconds_runs"] = [rnd(r["seconds"]) for r in got]
        result[f"{name}_best_runs"] = [rnd(r["best"], 4) for r in got]
        result[f"{name}_best_was_switched_out_runs"] = [r["best_was_switched_out"]
                                                        for r in got]
    a, b = result["switching_seconds"], result["pruning_seconds"]
    result["seconds_switching_over_pruning"] = rnd(a / b) if a and b else None
    n = min(len(runs["switching"]), len(runs["pruning"]))
    result["best_by_seed"] = [
        {"seed": seeds[i], "switching": rnd(runs["switching"][i]["best"], 4),
         "pruning": rnd(runs["pruning"][i]["best"], 4)} for i in range(n)]
    result["by_seed"] = [
        {"seed": seeds[i], **{f"{name}_{k}": rnd(runs[name][i][k]) for name in SIDES
                              for k in ("seconds", "completed", "pruned", "failed",
                                        "switched_out", "switched_in", "arena_over_rung")}}
        for i in range(n)]
    diffs = [runs["switching"][i]["best"] - runs["pruning"][i]["best"] for i in range(n)
             if runs["switching"][i]["best"] is not None and
             runs["pruning"][i]["best"] is not None]
    result["best_gain_median"] = rnd(statistics.median(diffs), 4) if diffs else None
    result["pruning_still_switches"] = any(r["switched_out"] for r in runs["pruning"])
    if args.json:
        print(json.dumps(result))
        return
    for name in SIDES:
        print(f"{name:>9}: {result[f'{name}_seconds']} s, best {result[f'{name}_best']}, "
              f"{result[f'{name}_completed']} completed, {result[f'{name}_pruned']} pruned, "
              f"{result[f'{name}_switched_out']} switches out "
              f"({result[f'{name}_switch_bytes']} bytes)")


if __name__ == "__main__":
    main()
