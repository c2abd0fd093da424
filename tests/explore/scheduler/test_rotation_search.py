"""Rotation (the budget's ``in_flight``) in real worker processes: a seeded search on
one worker holding every trial in hand at once gives the same trials, parameters and
values, to the bit, in an arena that holds all of them as in one that holds a few,
where the others wait their turn switched out to files; and either way the trials
advance round by round: every trial's round r before any trial's round r + 1.

The core's own test of the rotation (tests/explore/scheduler/test_rotation.py) plays
the workers; this one runs them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import optuna
import pytest

from engine.alignment import align_up
from explore.binding import bind
from explore.datasets import load_digits
from explore.scheduler.protocol import Done, Report
from explore.scheduler.switched import SWITCHED
from explore.space import load_space
from explore.study import RECORD_ATTR, open_study
from tests.explore.cli_run import IN_TEST
from tests.explore.scheduler.test_switching_search import ArenaOf

ROUNDS = 3
# One architecture and one optimizer for every candidate: every trial's heap is the
# same, so that an arena of k heaps holds exactly k trials.  Only the dropout and the
# learning rate are drawn.
SPACE = """\
name: rot
dataset: digits
budget: {trials: TRIALS, rounds: ROUNDS, memory: 400MB, workers: 1, in_flight: TRIALS}
sampler: {name: random, seed: 0}
pruner: none
model:
  depth: 1
  width: 32
  activation: relu
  dropout: {float: [0.0, 0.3]}
training:
  optimizer: adam
  lr: {float: [1.0e-3, 1.0e-1], log: true}
  batch_size: 64
  eval_batch_size: 256
"""
# A run that has not ended by then is stopped (it hung: a trial nobody runs): the test
# fails instead of the suite waiting for ever.
DEADLINE_S = 120.0


class Rotating(ArenaOf):
    """ArenaOf that also keeps the order the workers' reports and results came in:
    (trial, round), one per round each trial ran."""

    order: list[tuple[int, int]]

    def _handle(self, w: Any, msg: Any) -> None:
        if isinstance(msg, Report | Done):
            self.order.append((msg.number, msg.round if isinstance(msg, Report)
                               else msg.rounds))
        super()._handle(w, msg)


def search(folder: Path, trials: int, arena: int | None = None, states: Path | None = None
           ) -> tuple[list[dict[str, Any]], Any, list[tuple[int, int]]]:
    folder.mkdir()
    f = folder / "rot.yaml"
    f.write_text(SPACE.replace("TRIALS", str(trials)).replace("ROUNDS", str(ROUNDS)))
    space = load_space(f)
    assert space.budget.in_flight == trials
    storage = f"sqlite:///{folder / 'rot.db'}"
    sched = Rotating(bind(space), open_study(space, storage), load_digits(), workers=1,
                     memory=space.budget.memory, device="cpu", main=IN_TEST,
                     switch_dir=(states or folder) / "artifacts")
    sched.arena, sched.order = arena, []

    def stop() -> None:  # as Ctrl-C would: the run stops between steps
        if getattr(sched, "stop_flag", None) is not None:
            sched.stop_flag.set = True
    watchdog = threading.Timer(DEADLINE_S, stop)
    watchdog.start()
    try:
        stats = sched.run(space.budget.trials)
    except BaseException as e:  # Stopped (the watchdog), or a failure of the run
        if watchdog.is_alive():
            raise
        pytest.fail(f"the run had not ended after {DEADLINE_S:.0f} s ({e!r}): "
                    f"reports so far {sched.order}")
    finally:
        watchdog.cancel()
    study = optuna.load_study(study_name="rot", storage=storage)
    rows = [{"number": t.number, "state": t.state.name, "params": t.params,
             "values": t.values, "reports": sorted(t.intermediate_values.items()),
             "record": t.user_attrs.get(RECORD_ATTR, {})}
            for t in sorted(study.trials, key=lambda t: t.number)]
    return rows, stats, sched.order


def round_by_round(trials: int) -> list[tuple[int, int]]:
    """One worker's order in rotation: every trial's round r, oldest first, before any
    trial's round r + 1 (the turn goes to the fewest rounds along, then the oldest)."""
    return [(n, r) for r in range(1, ROUNDS + 1) for n in range(trials)]


def check_rotation(tmp_path: Path, on_disk: Path, trials: int, held: int) -> None:
    roomy, roomy_stats, roomy_order = search(tmp_path / "roomy", trials)
    heaps = {align_up(t["record"]["total_bytes"]) for t in roomy}
    assert len(heaps) == 1, heaps  # one heap size: "holds ``held``" is exact
    heap = heaps.pop()
    assert roomy_stats.counts.get("switched_out", 0) == 0  # all fit: nothing moved
    assert roomy_order == round_by_round(trials)

    arena = held * heap
    tight, stats, order = search(tmp_path / "tight", trials, arena=arena, states=on_disk)
    # the same search, to the bit: what each trial was drawn, how it ended, every value
    # it reported (a switch that lost a bit of any weight, moment or generator would
    # move them)
    assert [(t["number"], t["state"], t["params"]) for t in tight] == \
        [(t["number"], t["state"], t["params"]) for t in roomy]
    assert [(t["values"], t["reports"]) for t in tight] == \
        [(t["values"], t["reports"]) for t in roomy]
    # every trial ran all its rounds and completed; none failed or was pruned for room
    assert [t["state"] for t in tight] == ["COMPLETE"] * trials
    assert all(t["record"]["rounds"] == ROUNDS for t in tight)
    assert all(len(t["reports"]) == ROUNDS - 1 for t in tight)  # the last is its value
    assert stats.counts["complete"] == trials
    assert stats.counts["failed"] == stats.counts["pruned"] == 0
    # round by round, as with room for all: not one trial to its end, then the next
    assert order == round_by_round(trials)

    # The arena holds ``held``: the others waited their turn switched out.  After the
    # first round, every round of the trials in hand brings each one not in the arena
    # back in, and one leaves for it: at least (trials - held) switches a round.
    outs, ins = stats.counts["switched_out"], stats.counts["switched_in"]
    assert outs == ins >= (trials - held) * (ROUNDS - 1)
    records = [t["record"] for t in tight]
    assert sum(r.get("switched_out", 0) for r in records) == outs
    moved = [r for r in records if r.get("switched_out")]
    assert len(moved) >= trials - held
    assert stats.switch_bytes == sum(r["switch_bytes"] for r in moved) > 0
    # each switch wrote the trial's state (the same architecture and optimizer: about
    # the same bytes each time, within its region)
    each = [r["switch_bytes"] / r["switched_out"] for r in moved]
    assert min(each) > 0 and max(each) <= min(each) * 1.01 and max(each) <= heap, each
    for r in moved:
        spans = r["out_spans"]
        # at most once between two of its rounds (a trial brought back runs at once)
        assert len(spans) == r["switched_out"] <= ROUNDS - 1, r
        flat = [t for span in spans for t in span]
        assert all(len(span) == 2 for span in spans), spans  # each came back
        assert flat == sorted(flat), spans  # out, in, out, in: in time order
        # out after its first round began, back before its last ended
        assert r["start"] <= flat[0] and flat[-1] <= r["end"], r
    # round by round in the records too: every trial began before any trial ended
    assert max(r["start"] for r in records) < min(r["end"] for r in records)
    assert not (on_disk / "artifacts" / SWITCHED).exists()  # nothing left

    # The accounting never held more than the budget, nor more heaps than the arena
    # holds, and the arena was full while trials waited their turn.
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)
    assert max(s.heaps for s in stats.timeline) == arena
    assert max(s.heaps for s in roomy_stats.timeline) == trials * heap


# slow's: two real runs of 40 trials (7 s alone, up to 27 s on a loaded 2-core machine);
# the default suite plays the same 40 in arenas of 8 on the core (test_rotation.py)
@pytest.mark.slow
def test_forty_trials_in_flight_in_an_arena_that_holds_eight(tmp_path: Path,
                                                            on_disk: Path) -> None:
    check_rotation(tmp_path, on_disk, trials=40, held=8)
