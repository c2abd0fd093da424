"""Memory truth: does a run stay within its budget as the operating system counts it?

For each of two spaces (``quick.yaml``: 5,000 MNIST images; ``mnist_full.yaml``: all
60,000) and each of twelve architectures (MLPs of 1 to 4 layers, 16 to 2,048 units;
two CNNs), ``explore run`` trains four trials of that architecture (learning rates
differ) in a fresh process, with 2 workers, at the space's budget, while the PSS of
its whole process tree is sampled every 20 ms from outside
(:func:`explore.procmem.run_measured`, as ``shared/tools/treemem.py`` measures).
Per cell: the planned peak (constants plus the heaps placed, at their most), the
measured peak (outside, and the run's own sampler), the measured constants (the
scheduler, the resource tracker, each worker, the data) and the residual (measured
minus planned: negative means the plan is conservative).  Over ``--repeats`` runs the
highest measured peak is kept: the budget must hold for the worst.

    python bench/memory_truth.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explore.procmem import run_measured  # noqa: E402

SPACES = {"quick": ("quick.yaml", "300MB"), "mnist_full": ("mnist_full.yaml", "400MB")}
MLP = {"family": "mlp", "dropout": 0.0, "init": "he_uniform"}
CNN = {"family": "cnn", "kernel": 3, "stride": 1, "pool": True, "batch_norm": False,
       "residual": False, "activation": "relu", "init": "he_uniform"}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "mlp_1x16": {**MLP, "depth": 1, "width": 16, "activation": "relu"},
    "mlp_1x64": {**MLP, "depth": 1, "width": 64, "activation": "tanh"},
    "mlp_1x256": {**MLP, "depth": 1, "width": 256, "activation": "relu"},
    "mlp_1x1024": {**MLP, "depth": 1, "width": 1024, "activation": "relu"},
    "mlp_2x32": {**MLP, "depth": 2, "width": 32, "activation": "tanh"},
    "mlp_2x128": {**MLP, "depth": 2, "width": 128, "activation": "relu"},
    "mlp_2x512": {**MLP, "depth": 2, "width": 512, "activation": "relu"},
    "mlp_2x2048": {**MLP, "depth": 2, "width": 2048, "activation": "relu"},
    "mlp_3x256": {**MLP, "depth": 3, "width": 256, "activation": "tanh"},
    "mlp_4x128": {**MLP, "depth": 4, "width": 128, "activation": "relu"},
    "cnn_1x8": {**CNN, "blocks": 1, "channels": 8, "depth": 0, "width": 32},
    "cnn_2x16": {**CNN, "blocks": 2, "channels": 16, "depth": 1, "width": 64},
}


def space_for(base: str, arch: dict[str, Any], folder: Path, name: str) -> Path:
    """The space file ``base`` with its model fixed to ``arch``: 4 trials of 1 round,
    2 workers, learning rates drawn (the trials differ, the architecture does not)."""
    space = yaml.safe_load((ROOT / "search_spaces" / base).read_text())
    space.update(name=name, model=arch, pruner="none",
                 sampler={"name": "random", "seed": 0})
    space["budget"].update(trials=4, rounds=1, workers=2)
    space["training"] = {"optimizer": "adam", "lr": {"float": [1.0e-3, 1.0e-2], "log": True},
                         "batch_size": 64}
    f = folder / f"{name}.yaml"
    f.write_text(yaml.safe_dump(space, sort_keys=False))
    return f


def measure(space_file: Path, memory: str) -> dict[str, Any]:
    import optuna

    db = space_file.with_suffix(".db")
    db.unlink(missing_ok=True)
    os.environ["EXPLORE_TRACEBACK"] = "1"  # a failed run's output with its traceback
    rc, output, peak = run_measured([sys.executable, "-m", "explore.cli", "run",
                                     str(space_file), "--memory", memory, "--quiet"],
                                    timeout=900)
    if rc != 0:
        raise SystemExit(f"{space_file.name} at {memory} failed ({rc}):\n{output}")
    study = optuna.load_study(study_name=space_file.stem, storage=f"sqlite:///{db}")
    run = study.user_attrs["runs"][-1]
    return {"measured_peak": peak, "run": run,
            "states": sorted({t.state.name.lower() for t in study.get_trials()})}


def cell(space: str, arch: str, folder: Path, repeats: int) -> dict[str, Any]:
    base, memory = SPACES[space]
    f = space_for(base, ARCHITECTURES[arch], folder, f"{space}_{arch}")
    runs = [measure(f, memory) for _ in range(repeats)]
    worst = max(runs, key=lambda r: r["measured_peak"])
    run = worst["run"]
    return {
        "space": space, "architecture": arch, "budget_bytes": run["budget"],
        "workers": run["workers"], "planned_peak_bytes": run["peak"],
        "measured_peak_bytes": worst["measured_peak"],
        "measured_peak_by_the_run_bytes": run["measured_peak"],
        "residual_bytes": worst["measured_peak"] - run["peak"],
        "within_budget": all(r["measured_peak"] <= r["run"]["budget"] for r in runs),
        "constants": {"scheduler": run["main"], "resource_tracker": run["tracker"],
                      "workers": run["overheads"], "data": run["data"]},
        "growth_bytes": run["growth"], "arena_bytes": run["arena"],
        "measured_peaks_bytes": [r["measured_peak"] for r in runs],
        "trial_states": worst["states"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=3, help="runs per cell (worst kept)")
    ap.add_argument("--spaces", default=",".join(SPACES))
    ap.add_argument("--architectures", default=",".join(ARCHITECTURES))
    args = ap.parse_args()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("EXPLORE_CACHE_DIR", os.path.join(tmp, "cache"))
        for space in args.spaces.split(","):
            for arch in args.architectures.split(","):
                cells.append(cell(space, arch, Path(tmp), args.repeats))
                if not args.json:
                    c = cells[-1]
                    print(f"{space:>10} {arch:>11}: planned {c['planned_peak_bytes'] / 1e6:7.1f}"
                          f" MB, measured {c['measured_peak_bytes'] / 1e6:7.1f} MB of "
                          f"{c['budget_bytes'] / 1e6:.0f} MB, residual "
                          f"{c['residual_bytes'] / 1e6:+6.1f} MB", flush=True)
    residuals = [c["residual_bytes"] for c in cells]
    out = {"cells": cells, "all_within_budget": all(c["within_budget"] for c in cells),
           "residual_median_bytes": statistics.median(residuals),
           "residual_max_bytes": max(residuals), "repeats": args.repeats}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"all within budget: {out['all_within_budget']}; residual median "
              f"{out['residual_median_bytes'] / 1e6:+.1f} MB, max "
              f"{out['residual_max_bytes'] / 1e6:+.1f} MB")


if __name__ == "__main__":
    main()
