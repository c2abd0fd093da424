"""The budget holds as the operating system counts it: ``explore run`` is started as a
user starts it, the PSS of its whole process tree (the command, its workers, the
resource tracker) is sampled every 20 ms from outside, and the peak must not pass the
budget; the run's own record must say the same.  Where the trials are enough to fill
the budget, the packing must use it (safety must not come from wasting memory)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from explore.procmem import run_measured

ROOT = Path(__file__).resolve().parent.parent.parent
SPACES = ROOT / "search_spaces"
pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="needs Linux /proc/PID/smaps_rollup for PSS")

# A space whose trials (wide MLPs holding up to 8 per worker) are more than the budget
# holds at once: candidates wait for room, and the packing is measured.  Its widest
# candidate stays well inside the room a worker's arena gives at 250 MB (width 640:
# about 31 MB; the arena of 48 MB less the workers' measured growth left 36.5 to 48 MB,
# as what the processes measure moves with the programs beside them), so that no trial
# fails for room and the test measures the packing alone.
FILLING = """\
name: filling
dataset: {name: mnist, train: 3000, valid: 1000}
budget: {trials: 16, rounds: 1, memory: MEMORY, workers: 2, trials_per_worker: 8}
sampler: {name: random, seed: 0}
pruner: none
model: {depth: 2, width: {int: [256, 640]}}
training: {optimizer: adam, lr: 0.001, batch_size: 64, eval_batch_size: 1000}
"""


def measured_run(space: Path, memory: str, timeout: float = 600) -> dict[str, Any]:
    """Run ``explore run SPACE --memory MEMORY`` and sample its tree's PSS from outside;
    the peak, the exit status and output, and the run's record in its study."""
    rc, output, peak = run_measured([sys.executable, "-m", "explore.cli", "run", str(space),
                                     "--memory", memory, "--quiet"], timeout=timeout)
    study = optuna.load_study(study_name=space.stem,
                              storage=f"sqlite:///{space.with_suffix('.db')}") \
        if rc == 0 else None
    run = study.user_attrs["runs"][-1] if study else None
    return {"rc": rc, "output": output, "peak": peak, "run": run,
            "trials": study.get_trials() if study else []}


def check(result: dict[str, Any], budget: int) -> None:
    assert result["rc"] == 0, result["output"]
    run = result["run"]
    assert result["peak"] <= budget, (f"the process tree peaked at {result['peak']:,} bytes "
                                      f"over a budget of {budget:,}: {run}")
    assert 0 < run["measured_peak"] <= budget
    assert run["peak"] <= budget  # the plan
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in result["trials"]), [
        (t.number, t.state.name, t.user_attrs.get("explore", {}).get("fail_reason"))
        for t in result["trials"] if t.state.name not in ("COMPLETE", "PRUNED")]
    waited = any(w > 0 for _, _, _, w in run["timeline"])
    if waited:  # trials enough to fill it: the memory was used, not wasted
        assert run["peak"] >= 0.8 * budget, run


def copy_space(tmp_path: Path, name: str) -> Path:
    f = tmp_path / name
    shutil.copy(SPACES / name, f)
    return f


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["150MB", "200MB", "400MB"])
def test_the_quick_space_stays_within_its_budget(tmp_path: Path, memory: str) -> None:
    check(measured_run(copy_space(tmp_path, "quick.yaml"), memory), int(memory[:-2]) * 10**6)


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["230MB", "300MB", "500MB"])
def test_the_full_mnist_space_stays_within_its_budget(tmp_path: Path, memory: str) -> None:
    check(measured_run(copy_space(tmp_path, "mnist_full.yaml"), memory),
          int(memory[:-2]) * 10**6)


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["250MB", "400MB"])
def test_trials_that_fill_the_budget_pack_it_and_stay_within(tmp_path: Path,
                                                             memory: str) -> None:
    f = tmp_path / "filling.yaml"
    f.write_text(FILLING.replace("MEMORY", memory))
    result = measured_run(f, memory)
    check(result, int(memory[:-2]) * 10**6)
    assert any(w > 0 for _, _, _, w in result["run"]["timeline"])  # it did fill


def test_a_small_run_stays_within_its_budget(tmp_path: Path) -> None:
    """The default suite's check: a digits space at a budget close to its minimum."""
    f = tmp_path / "digits.yaml"
    f.write_text("name: digits\ndataset: digits\nbudget: {trials: 6, rounds: 2, "
                 "memory: 150MB, workers: 2}\nsampler: {name: random, seed: 0}\n"
                 "model: {depth: 1, width: {int: [16, 64]}}\n"
                 "training: {optimizer: adam, lr: 0.01, batch_size: 32}\n")
    check(measured_run(f, "150MB"), 150 * 10**6)
