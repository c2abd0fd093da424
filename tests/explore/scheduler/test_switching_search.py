"""Trials paused at a rung switched out of the arena and back, in real worker processes:
a seeded successive-halving search on one worker gives the same trials, parameters,
states and metrics in an arena that holds every trial as in one that holds about a
quarter of them, where paused trials wait in files, and none is pruned for room."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import optuna
import pytest

from engine.alignment import align_up
from explore.binding import bind
from explore.datasets import load_digits
from explore.results import load
from explore.scheduler import Scheduler
from explore.scheduler.placement import Worker
from explore.scheduler.switched import SWITCHED
from explore.space import load_space
from explore.study import RECORD_ATTR, open_study
from tests.explore.cli_run import IN_TEST
from tests.explore.drivers import small_disk

SPACE = """\
name: sw
dataset: digits
budget: {trials: 12, rounds: 3, memory: 400MB, workers: 1}
sampler: {name: random, seed: 0}
pruner: {name: successive_halving, warmup_rounds: 1, pause: true}
model:
  depth: 1
  width: {choice: [16, 64, 256]}
  activation: relu
  dropout: {float: [0.0, 0.3]}
training:
  optimizer: {choice: [adam, sgd]}
  lr: {float: [1.0e-3, 1.0e-1], log: true}
  batch_size: 32
  eval_batch_size: 32
"""


class ArenaOf(Scheduler):
    """A run whose worker's arena holds ``arena`` bytes (the budget leaves more): the
    room for trials, set exactly, where a budget would move it by the worker's
    measured overhead, which differs from run to run by more than a trial's heap."""

    arena: int | None = None

    def _arena_on(self, device: int, ws: list[Worker]) -> int:
        return self.arena or super()._arena_on(device, ws)


def search(folder: Path, arena: int | None = None,
           states: Path | None = None) -> tuple[list[dict[str, Any]], Any]:
    folder.mkdir()
    f = folder / "sw.yaml"
    f.write_text(SPACE)
    space = load_space(f)
    study = open_study(space, f"sqlite:///{folder / 'sw.db'}")
    sched = ArenaOf(bind(space), study, load_digits(), workers=1,
                    memory=space.budget.memory, device="cpu", main=IN_TEST,
                    switch_dir=(states or folder) / "artifacts")
    sched.arena = arena
    stats = sched.run(space.budget.trials)
    trials = [{"number": t.number, "state": t.state.name, "params": t.params,
               "values": t.values, "reports": sorted(t.intermediate_values.items()),
               "record": t.user_attrs.get(RECORD_ATTR, {})}
              for t in sorted(optuna.load_study(study_name="sw", storage=f"sqlite:///"
                                                f"{folder / 'sw.db'}").trials,
                              key=lambda t: t.number)]
    assert load(f"sqlite:///{folder / 'sw.db'}", "sw") is not None
    return trials, stats


@pytest.mark.parametrize("asked", ["on disk", pytest.param("in memory", marks=pytest.mark.slow)])
def test_paused_trials_wait_switched_out_and_the_search_is_the_same(
        tmp_path: Path, on_disk: Path, asked: str) -> None:
    """``asked``: where the run is told to put its states; "in memory" is a tmpfs
    mounted for the test, which the states pass over for /var/tmp on disk (a folder in
    memory would hold them uncounted by the budget)."""
    with contextlib.ExitStack() as stack:
        states = on_disk if asked == "on disk" else stack.enter_context(
            small_disk(tmp_path, "64m"))
        search_both(tmp_path, states, asked)


def search_both(tmp_path: Path, states: Path, asked: str) -> None:
    """The search with room for all, then in a quarter of that with its states asked
    under ``states`` (``asked``: on disk or in memory)."""
    roomy, roomy_stats = search(tmp_path / "roomy")
    heaps = [align_up(t["record"]["total_bytes"]) for t in roomy]
    assert roomy_stats.counts.get("switched_out", 0) == 0  # all fit: nothing moved
    assert {t["state"] for t in roomy} == {"COMPLETE", "PRUNED"}
    assert roomy_stats.counts["resumed"] > 0  # paused trials were promoted

    tight, stats = search(tmp_path / "tight", arena=max(max(heaps), sum(heaps) // 4),
                          states=states)
    # the same search, to the bit: what each trial was drawn, how it ended, every
    # value it reported (a switch that lost a bit of any weight, moment or generator
    # would move them)
    assert [(t["number"], t["state"], t["params"]) for t in tight] == \
        [(t["number"], t["state"], t["params"]) for t in roomy]
    assert [(t["values"], t["reports"]) for t in tight] == \
        [(t["values"], t["reports"]) for t in roomy]
    for a, b in zip(tight, roomy, strict=True):
        assert (a["record"].get("rounds"), a["record"].get("pauses")) == \
            (b["record"].get("rounds"), b["record"].get("pauses"))
    # trials left the arena and came back; none was pruned for room (the same
    # trials were pruned as with room for all, each at the end of the run)
    assert stats.counts["switched_out"] > 0 and stats.counts["switched_in"] > 0
    moved = [t for t in tight if t["record"].get("switched_out")]
    assert moved and all(t["record"]["switch_bytes"] > 0 for t in moved)
    assert any(t["state"] == "COMPLETE" for t in moved)  # out, back in, and finished
    assert {t["record"]["pruned"] for t in tight if t["state"] == "PRUNED"} <= {
        "by the pruner", "paused, not promoted"}  # what each pruned trial's record says
    assert not (states / "artifacts" / SWITCHED).exists()  # nothing left
    folder = Path(stats.switch_folder)
    if asked == "in memory":
        assert folder.parent == Path("/var/tmp") / SWITCHED, folder
    else:
        assert folder.parent == (states / "artifacts").resolve() / SWITCHED, folder
    assert not folder.exists()
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)
