"""A run whose sampler draws its first trials blind draws them ahead and trains the
cheapest first, by the compiler's count of their FLOPs
(:meth:`explore.scheduler.core.Core.release`); a sampler that reads every result is
asked one trial at a time, as before."""

from __future__ import annotations

from pathlib import Path

from explore.results import frame
from explore.scheduler.core.placing import AHEAD_PER_WORKER
from tests.explore.digits_runs import run_digits

SPACE = """
name: {name}
dataset: digits
pruner: none
sampler: {sampler}
budget: {{trials: 6, rounds: 2, memory: 400MB, workers: 1, seed: 3}}
model: {{depth: {{int: [1, 3]}}, width: {{int: [8, 256], log: true}}}}
training: {{batch_size: 32}}
"""


def _ended(tmp_path: Path, name: str, sampler: str) -> list[tuple[int, float]]:
    """(number, FLOPs) of a run's trials in the order they ended."""
    _, study = run_digits(tmp_path, name, SPACE.format(name=name, sampler=sampler), 6)
    df = frame(study).sort_values("end")
    assert (df["state"] == "complete").all()
    return list(zip(df["number"], df["flops"], strict=True))


def test_the_blind_draws_are_trained_cheapest_first(tmp_path: Path) -> None:
    # TPE's ten random draws, one worker: four drawn ahead, then the last two (a
    # budget's seed, not the sampler's, so that one worker is not in lockstep)
    ended = _ended(tmp_path, "blind", "{name: tpe}")
    first, rest = ended[:AHEAD_PER_WORKER], ended[AHEAD_PER_WORKER:]
    assert sorted(n for n, _ in first) == list(range(AHEAD_PER_WORKER))
    assert [f for _, f in first] == sorted(f for _, f in first)
    assert [f for _, f in rest] == sorted(f for _, f in rest)
    # the seed's draws are not in order of cost: the order is the scheduler's
    assert [n for n, _ in first] != sorted(n for n, _ in first)


def test_a_sampler_that_reads_every_result_is_asked_one_trial_at_a_time(
        tmp_path: Path) -> None:
    ended = _ended(tmp_path, "seen", "{name: tpe, startup_trials: 1}")
    assert [n for n, _ in ended] == list(range(6))
