"""Each shipped space, shrunk to a few trials on one worker with its sampler seed, run
as a user runs it: the trials it gives (numbers, states, parameters, values and
reports) are the scheduler's observable behaviour, stored in ``golden/shipped_runs.json``
so that a change to the scheduler's structure is checked against what it did before.

``python -m tests.explore.golden_runs --write [SPACE ...]`` stores them again, those
named or all (only for a change that is meant to alter what a run does, said in its
commit)."""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

from tests.explore.cli_run import explore_run

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "search_spaces"
GOLDEN = Path(__file__).parent / "golden" / "shipped_runs.json"
SHIPPED = sorted(p.stem for p in SPACES.glob("*.yaml"))

# Small enough for the test suite, big enough that the sampler leaves its startup
# trials, the pruners decide and (on quick) trials are pruned.
TRIALS, ROUNDS = 5, 2
MNIST = {"train": 600, "valid": 300}


# OpenBLAS's kernels for one x86 generation on every x86 machine: each CPU's own (FMA or
# not, 4 or 8 lanes) round a product's last bits differently, and the residual space's
# first trial, trained on 600 images, carried those bits into a validation accuracy 1.3
# points apart (0.08 with these kernels, 0.067 with Haswell's or Zen's, on an AMD EPYC):
# a difference that says nothing of the scheduler.  Elsewhere (ARM) it is not set.
SAME_KERNELS = {"OPENBLAS_CORETYPE": "Sandybridge"} if platform.machine() in (
    "x86_64", "AMD64") else {}


def shrunk(name: str) -> dict[str, Any]:
    """The shipped space ``name``, on one worker with a few trials of few rounds."""
    space = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    budget = space.setdefault("budget", {})
    budget.update(trials=TRIALS, rounds=min(ROUNDS, budget.get("rounds", ROUNDS)),
                  workers=1)
    # the kernels the runs were stored with: one worker holds the whole budget, where
    # ``auto`` would compile, and the compiled kernels agree with numpy's only to
    # rounding, which a TPE draw can carry into a different trial
    budget.setdefault("kernels", "numpy")
    sampler = space.get("sampler")
    sampler = {"name": sampler} if isinstance(sampler, str) else dict(sampler or {})
    sampler.setdefault("seed", 0)
    if "startup_trials" in sampler:
        sampler["startup_trials"] = min(sampler["startup_trials"], 2)
    space["sampler"] = sampler
    data = space["dataset"]
    if isinstance(data, dict) and data.get("name") in ("mnist", "mnist_rows"):
        data.update(MNIST)
    pruner = space.get("pruner")
    if isinstance(pruner, dict) and "warmup_rounds" in pruner:
        pruner["warmup_rounds"] = min(pruner["warmup_rounds"], 1)
    if "keep_models" in space:
        space["keep_models"] = 1
    return space


def run(name: str, folder: Path) -> list[dict[str, Any]]:
    """Run the shrunk space ``name`` in ``folder`` (its models and builder modules
    beside it, as shipped); its trials in order."""
    for extra in ("models", "residual_models.py"):
        src = SPACES / extra
        if src.is_dir():
            shutil.copytree(src, folder / extra)
        elif src.exists():
            shutil.copy(src, folder / extra)
    f = folder / f"{name}.yaml"
    f.write_text(yaml.safe_dump(shrunk(name), sort_keys=False))
    result = explore_run(f, env=SAME_KERNELS)
    if result.exit_code != 0:
        raise AssertionError(f"{name}: exit {result.exit_code}\n{result.output}")
    study = optuna.load_study(study_name=shrunk(name)["name"],
                              storage=f"sqlite:///{folder / (name + '.db')}")
    return [{"number": t.number, "state": t.state.name, "params": t.params,
             "values": t.values,
             "reports": sorted([s, v] for s, v in t.intermediate_values.items())}
            for t in sorted(study.trials, key=lambda t: t.number)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the runs as the golden")
    ap.add_argument("spaces", nargs="*", default=SHIPPED)
    args = ap.parse_args()
    runs = {}
    for name in args.spaces:
        with tempfile.TemporaryDirectory() as tmp:
            runs[name] = run(name, Path(tmp))
        print(name, [(t["number"], t["state"]) for t in runs[name]], file=sys.stderr)
    if args.write:  # the spaces named replace theirs; the others' stored runs are kept
        GOLDEN.parent.mkdir(exist_ok=True)
        stored = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**stored, **runs}, indent=1, sort_keys=True) + "\n")
    else:
        print(json.dumps(runs, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
