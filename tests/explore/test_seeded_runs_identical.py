"""A seeded run on one worker stores the same values, bit for bit, every time: every
trial's parameters, state, values, reports and attributes, and the study's own, but
for the few that record when, where and in which process the run happened, named
here (:data:`VARIES`).  ``test_reproducible.py`` compares what the sampler and the
pruner see; this compares everything stored.

Two runs of one space can still differ in what they cannot control: the memory the
operating system reports (each run measures its own processes, and packs trials by
it) and the timing of every message.  A trial's metrics must depend on neither: the
second test makes one run place each trial as the smallest program it may run as,
the first as the largest, as a run with less room left would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from explore.candidate import Candidate
from tests.explore.cli_run import run_here

# A table, standardised; trials paused at a rung and resumed (successive halving); the
# best models kept as artifacts; validation rows not a multiple of the training batch.
SPACE = """\
name: seeded
dataset: {name: breast_cancer, valid: 0.2, test: 0.2, scale: standard, seed: 0}
objectives:
  - {metric: loss}
budget: {trials: 6, rounds: 2, memory: 400MB, workers: 1}
sampler: {name: tpe, seed: 0, startup_trials: 3}
pruner: {name: successive_halving, pause: true}
model:
  family: mlp
  depth: {int: [0, 2]}
  width: {int: [8, 64], log: true}
  activation: {choice: [relu, tanh]}
  dropout: {float: [0.0, 0.3]}
training:
  optimizer: {choice: [adam, sgd]}
  lr: {float: [1.0e-3, 1.0e-1], log: true}
  batch_size: 32
keep_models: 2
"""

# What a run stores that says when, where and by which process it ran: wall-clock
# times, process ids and host names, the ids Optuna gives artifacts, absolute paths.
VARIES = {
    "trial": {"datetime_start", "datetime_complete"},
    "trial explore": {"start", "end", "placed_at", "busy_s", "train_seconds", "valid_seconds",
                      "out_spans", "pid", "host", "driver", "model"},
    "trial user_attrs": {"explore_claim"},
    # the run's own record: its timeline, its processes' measured memory, storage times
    "study user_attrs": {"runs", "artifacts"},
    "study models": {"artifact"},
    # per driver (host:pid:...): its heartbeat and storage times; per artifact (an id)
    "study system_attrs prefixes": {"explore:heartbeat:", "explore:storage-time:",
                                    "artifacts:"},
}


def stored(storage: str) -> dict[str, Any]:
    """Everything a storage holds of its one study, but :data:`VARIES`."""
    [summary] = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    user = {k: v for k, v in study.user_attrs.items()
            if k not in VARIES["study user_attrs"]}
    user["models"] = [{k: v for k, v in m.items() if k not in VARIES["study models"]}
                      for m in user.get("models", [])]
    system = {k: v for k, v in study._storage.get_study_system_attrs(study._study_id).items()
              if not k.startswith(tuple(VARIES["study system_attrs prefixes"]))}
    trials = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        user_attrs = {k: v for k, v in t.user_attrs.items()
                      if k not in VARIES["trial user_attrs"]}
        user_attrs["explore"] = {k: v for k, v in user_attrs.get("explore", {}).items()
                                 if k not in VARIES["trial explore"]}
        trial = {"number": t.number, "state": t.state.name, "params": t.params,
                 "distributions": {k: repr(d) for k, d in t.distributions.items()},
                 "values": t.values, "reports": sorted(t.intermediate_values.items()),
                 "user_attrs": user_attrs, "system_attrs": t.system_attrs,
                 "datetime_start": str(t.datetime_start),
                 "datetime_complete": str(t.datetime_complete)}
        trials.append({k: v for k, v in trial.items() if k not in VARIES["trial"]})
    return {"directions": [d.name for d in study.directions], "user_attrs": user,
            "system_attrs": system, "trials": trials}


def differences(a: Any, b: Any, at: str = "") -> Iterator[str]:
    """Where ``a`` and ``b`` differ: floats compared bit for bit (``0.9165`` and
    ``0.91650001`` differ), as the JSON a storage keeps them in writes them.

    >>> list(differences({"v": [0.9165]}, {"v": [0.91650001]}))
    ['/v[0]: 0.9165 != 0.91650001']
    >>> list(differences({"v": 1.0}, {"v": 1.0, "w": 2}))
    ['/w: missing on one side']
    """
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                yield f"{at}/{k}: missing on one side"
            else:
                yield from differences(a[k], b[k], f"{at}/{k}")
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{at}[{i}]")
    elif json.dumps(a) != json.dumps(b):
        yield f"{at}: {a!r} != {b!r}"


def write_space(folder: Path) -> Path:
    folder.mkdir()
    f = folder / "seeded.yaml"
    f.write_text(SPACE)
    return f


@pytest.mark.slow  # two real runs at once; the in-process check below runs by default
def test_two_seeded_runs_store_the_same_values(tmp_path: Path) -> None:
    """Two ``explore run`` processes at once (each a load on the other's timing)."""
    runs = [subprocess.Popen([sys.executable, "-m", "explore.cli", "run",
                              str(write_space(tmp_path / x)), "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for x in "ab"]
    for p in runs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    a, b = (stored(f"sqlite:///{tmp_path / x / 'seeded.db'}") for x in "ab")
    assert len(a["trials"]) == 6
    assert {t["state"] for t in a["trials"]} == {"COMPLETE", "PRUNED"}
    assert all(t["user_attrs"]["explore"]["metrics"]["roc_auc"] > 0.5 for t in a["trials"]
               if t["state"] == "COMPLETE")
    assert a["user_attrs"]["models"]  # the kept models, in order
    differ = list(differences(a, b))
    assert not differ, "\n".join(differ)


def test_the_metrics_do_not_depend_on_which_program_found_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial compiled bigger than its training batch validates in bigger chunks, and
    may run as a smaller program where the bigger one finds no room; float32 sums
    over other chunks round otherwise (``0.9165`` and ``0.91650001``), so a seeded
    run's trials must validate the same way whatever program they run as."""
    first = write_space(tmp_path / "largest")
    run_here(first)
    largest = stored(f"sqlite:///{first.with_suffix('.db')}")

    def smallest_first(self: Candidate) -> Iterator[Any]:
        return iter(list(fitting(self))[::-1])

    fitting = Candidate.fitting
    monkeypatch.setattr(Candidate, "fitting", smallest_first)
    second = write_space(tmp_path / "smallest")
    run_here(second)
    smallest = stored(f"sqlite:///{second.with_suffix('.db')}")
    differ = list(differences(largest, smallest))
    assert not differ, "\n".join(differ)
