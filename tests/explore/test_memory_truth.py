"""The budget holds as the operating system counts it: ``explore run`` is started as a
user starts it, the PSS of its whole process tree (the command, its workers, the
resource tracker) is sampled every 20 ms from outside, and the peak must not pass the
budget; the run's own record must say the same.  Where the trials are enough to fill
the budget, the packing must use it (safety must not come from wasting memory)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from engine.alignment import align_up
from explore.procmem import run_measured
from explore.scheduler.admission import headroom
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import machine_key
from explore.scheduler.switched import SWITCHED
from explore.study import RECORD_ATTR

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


def check(result: dict[str, Any], budget: int, tight: bool = False) -> None:
    """The run ended well, within ``budget`` as sampled and as it recorded, and every
    trial ended by the pruner or completed; where the budget is ``tight`` (an arena of a
    few MB, so the space's widest candidates need more than an empty arena), those fail
    saying they do not fit, as candidates too big for the arena do, and the rest
    complete."""
    assert result["rc"] == 0, result["output"]
    run = result["run"]
    assert result["peak"] <= budget, (f"the process tree peaked at {result['peak']:,} bytes "
                                      f"over a budget of {budget:,}: {run}")
    assert 0 < run["measured_peak"] <= budget
    assert run["peak"] <= budget  # the plan

    def too_big(t: optuna.trial.FrozenTrial) -> bool:
        reason = t.user_attrs.get("explore", {}).get("fail_reason") or ""
        return tight and t.state.name == "FAIL" and reason.startswith("does not fit")

    assert all(t.state.name in ("COMPLETE", "PRUNED") or too_big(t)
               for t in result["trials"]), [
        (t.number, t.state.name, t.user_attrs.get("explore", {}).get("fail_reason"))
        for t in result["trials"] if t.state.name not in ("COMPLETE", "PRUNED")]
    assert any(t.state.name == "COMPLETE" for t in result["trials"])
    waited = any(w > 0 for _, _, _, w in run["timeline"])
    if waited:  # trials enough to fill it: the memory was used, not wasted
        assert run["peak"] >= 0.8 * budget, run


def copy_space(tmp_path: Path, name: str) -> Path:
    f = tmp_path / name
    shutil.copy(SPACES / name, f)
    return f


@pytest.mark.slow
@pytest.mark.alone
# 180 MB: a little over the least a quiet machine admits (164 MB named, its fixed costs
# 153 MB), where nothing else shares the libraries' pages and so lowers their PSS; its
# arenas hold the narrower MLPs only
@pytest.mark.parametrize("memory", ["180MB", "200MB", "400MB"])
def test_the_quick_space_stays_within_its_budget(tmp_path: Path, memory: str) -> None:
    check(measured_run(copy_space(tmp_path, "quick.yaml"), memory), int(memory[:-2]) * 10**6,
          tight=memory == "180MB")


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("memory", ["230MB", "300MB", "500MB"])
def test_the_full_mnist_space_stays_within_its_budget(tmp_path: Path, memory: str) -> None:
    check(measured_run(copy_space(tmp_path, "mnist_full.yaml"), memory),
          int(memory[:-2]) * 10**6)


@pytest.mark.slow
@pytest.mark.alone
# compiled kernels: numba's LLVM in each worker (about 100 MB), and each kernel a trial
# loads after the warm-up, held to the budget as well
@pytest.mark.parametrize(("memory", "kernels"), [("250MB", "numpy"), ("400MB", "numpy"),
                                                 ("600MB", "compiled")])
def test_trials_that_fill_the_budget_pack_it_and_stay_within(tmp_path: Path, memory: str,
                                                             kernels: str) -> None:
    f = tmp_path / "filling.yaml"
    f.write_text(FILLING.replace("MEMORY", memory).replace(
        "workers: 2,", f"workers: 2, kernels: {kernels},"))
    result = measured_run(f, memory)
    check(result, int(memory[:-2]) * 10**6)
    assert any(w > 0 for _, _, _, w in result["run"]["timeline"])  # it did fill
    assert {t.user_attrs[RECORD_ATTR]["kernels"] for t in result["trials"]} == {kernels}


def test_a_small_run_stays_within_its_budget(tmp_path: Path) -> None:
    """The default suite's check: a digits space at a budget close to its minimum."""
    f = tmp_path / "digits.yaml"
    f.write_text("name: digits\ndataset: digits\nbudget: {trials: 6, rounds: 2, "
                 "memory: 150MB, workers: 2}\nsampler: {name: random, seed: 0}\n"
                 "model: {depth: 1, width: {int: [16, 64]}}\n"
                 "training: {optimizer: adam, lr: 0.01, batch_size: 32}\n")
    check(measured_run(f, "150MB"), 150 * 10**6)


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_a_run_whose_workers_start_ahead_stays_within_its_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started while the study opens (explore.scheduler.prestart) are in the
    tree before the run has measured anything: at about the least budget that lets
    both start ahead (twice the driver, the tracker, the data and two workers by this
    machine's constants), the tree stays within it, as sampled from outside."""
    # constants of these runs' own (other tests raise the machine's meanwhile)
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path / "cache"))
    space = ("name: NAME\ndataset: digits\nbudget: {trials: 6, rounds: 2, memory: 400MB, "
             "workers: 2}\nsampler: {name: random, seed: 0}\n"
             "model: {depth: 1, width: {int: [16, 64]}}\n"
             "training: {optimizer: adam, lr: 0.01, batch_size: 32}\n")
    first = tmp_path / "first.yaml"
    first.write_text(space.replace("NAME", "first"))
    result = measured_run(first, "400MB")  # the constants, and the driver's size
    check(result, 400 * 10**6)
    run = result["run"]
    known = load_constants(machine_key("cpu", "0"))
    assert known is not None
    need = 2 * run["main"] + known.tracker + run["data"] + 2 * (known.worker + 10**6)
    budget = need
    while budget - headroom(budget) < need:
        budget += 10**6
    again = tmp_path / "again.yaml"
    again.write_text(space.replace("NAME", "again"))
    result = measured_run(again, str(budget))
    assert result["run"] is not None and result["run"]["started_ahead"] == 2, result
    check(result, budget)


# Successive halving that pauses its trials at the rung: more trials pause there than
# the arena holds, and they wait switched out to files for the room the next one needs.
# One architecture, Adam only: every trial's heap is the smallest candidate's (23.1 MB),
# so that none can fail for room and the arena holds a whole number of equal heaps.
SWITCHING = """\
name: switching
dataset: digits
budget: {trials: 24, rounds: 3, memory: MEMORY, workers: 1}
sampler: {name: random, seed: 0}
pruner: {name: successive_halving, warmup_rounds: 1, pause: true}
model: {depth: 2, width: 1024}
training: {optimizer: adam, lr: {float: [1.0e-3, 1.0e-1], log: true}, batch_size: 32,
           eval_batch_size: 32}
"""
# Rotation: every trial in hand at once (``in_flight``), more than twice what the arena
# holds, advanced round by round; those waiting their turn are switched out.
ROTATING = """\
name: rotating
dataset: digits
budget: {trials: 24, rounds: 2, memory: MEMORY, workers: 1, in_flight: 24}
sampler: {name: random, seed: 0}
pruner: none
model: {depth: 2, width: 1024}
training: {optimizer: adam, lr: {float: [1.0e-3, 1.0e-1], log: true}, batch_size: 32,
           eval_batch_size: 32}
"""
# The budget: about twice the least (``explore run`` names 188 MB for these spaces on
# a 2-core Linux machine).  A run whose trials fill the budget plans to within its
# headroom (2%) of it, and other programs ending beside it (the default suite's -n auto,
# other users' tests) raise its PSS by 5 to 10 MB as the library pages they shared with
# it become its own: at 152 MB (headroom 3 MB, 1.8 MB heaps) the tree peaked 0.03 to
# 2 MB over the budget in 10 of 30 runs on a busy 2-core machine.  At 384 MB the
# headroom is 7.7 MB, and the arena (237.7 MB alone, 247.6 beside pytest -n 2
# neighbours, as the processes' measured constants move with the programs beside them)
# holds 10 of the 23.1 MB heaps with 7 to 17 MB to spare, 6 MB clear of an 11th (at
# 390 MB it came within 0.3 MB of one, which would have left a margin of about 1 MB):
# the tree peaked 12.8 to 13.8 MB under the budget alone and 18.3 to 18.9 MB under
# beside neighbours, in 12 runs.  A run takes 14 to 17 s alone (the successive halving
# 42 to 46 s beside two-worker runs on 2 cores).
TIGHT = "384MB"


def switching_run(folder: Path, space: str, name: str) -> dict[str, Any]:
    """``explore run`` of ``space`` at TIGHT, measured (check()ed), whose states went
    to files in ``folder`` (on disk: ``<space>.artifacts``, beside the space) and are
    gone after it."""
    f = folder / f"{name}.yaml"
    f.write_text(space.replace("MEMORY", TIGHT))
    try:
        result = measured_run(f, TIGHT, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"explore run {f.name} had not ended after 240 s")
    check(result, int(TIGHT[:-2]) * 10**6)
    run = result["run"]
    assert run["switching"]["switched_out"] > 0, run["switching"]
    assert not (folder / f"{name}.artifacts" / SWITCHED).exists()  # no state left
    return result


@pytest.mark.slow
@pytest.mark.alone
def test_paused_trials_wait_switched_out_within_the_budget(on_disk: Path) -> None:
    result = switching_run(on_disk, SWITCHING, "switching")
    trials = result["trials"]
    moved = [t for t in trials if t.user_attrs.get(RECORD_ATTR, {}).get("switched_out")]
    assert moved, result["run"]["switching"]  # the trials' records say so too
    assert sum(t.user_attrs[RECORD_ATTR]["switched_out"] for t in moved) == \
        result["run"]["switching"]["switched_out"]
    assert {t.state.name for t in trials} == {"COMPLETE", "PRUNED"}  # none failed
    # those paused to the end (pruned then) alone are more than the arena holds
    heap = align_up(trials[0].user_attrs[RECORD_ATTR]["total_bytes"])
    paused = [t for t in trials if t.state.name == "PRUNED"]
    assert len(paused) > result["run"]["arena"] // heap, (len(paused), result["run"])


@pytest.mark.slow
@pytest.mark.alone
def test_trials_in_rotation_wait_their_turn_switched_out_within_the_budget(
        on_disk: Path) -> None:
    result = switching_run(on_disk, ROTATING, "rotating")
    run, trials = result["run"], result["trials"]
    records = [t.user_attrs.get(RECORD_ATTR, {}) for t in trials]
    heap = align_up(records[0]["total_bytes"])
    assert 2 * (run["arena"] // heap) <= 24  # in flight: twice what the arena holds
    # every trial ran its two rounds and completed, none failed or was pruned for room
    assert [t.state.name for t in trials] == ["COMPLETE"] * 24
    assert all(r["rounds"] == 2 for r in records)
    # those waiting their turn left and came back in
    assert run["switching"]["switched_in"] == run["switching"]["switched_out"]
    assert sum(r.get("switched_out", 0) for r in records) == \
        run["switching"]["switched_out"] >= 24 - run["arena"] // heap


DATA_READ = """\
name: data_read
dataset: {name: mnist, train: 30000, valid: 2000}
budget: {trials: 4, rounds: 1, memory: 400MB, workers: 2}
sampler: {name: random, seed: 0}
pruner: none
model: {depth: 1, width: 16}
training: {optimizer: sgd, lr: 0.05, batch_size: 256}
"""


@pytest.mark.slow
def test_the_workers_reading_the_data_set_is_not_taken_for_growth(tmp_path: Path) -> None:
    """The data set (24 MB here) is charged once, whole; as each worker first reads its
    pages the PSS of those moves from the driver to the workers, which the driver's
    meter sees only at its next full reading while a worker's report has it at once.
    Taken for growth, that shift (a third of the data set: 8 MB) was held back from the
    arenas, and at a tight budget failed trials for room they had (the full MNIST
    space at 230 MB)."""
    space = tmp_path / "data_read.yaml"
    space.write_text(DATA_READ)
    result = measured_run(space, "400MB")
    check(result, 400 * 10**6)
    run = result["run"]
    assert run["data"] > 20 * 10**6
    assert run["growth"] < run["data"] // 8, run
