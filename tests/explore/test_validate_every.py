"""``training.validate_every``: a trial validates after every k-th round and after its
last; "auto" validates every round where a pruner reads the values and only the last
where none does.  A round not validated reports nothing to the pruner, and the trial's
value is still its last round's."""

from __future__ import annotations

from pathlib import Path

import pytest

from explore.binding import bind
from explore.candidate import compile_candidate
from explore.datasets import load_digits
from explore.space import SpaceError, parse_space
from explore.utilisation import round_flops
from tests.explore.digits_runs import run_digits

SPACE = """\
name: ve
dataset: digits
budget: {{trials: 2, rounds: 4, memory: 300MB, workers: 1}}
sampler: {{name: random, seed: 3}}
pruner: {pruner}
model: {{depth: 1, width: 16, activation: relu}}
training: {{optimizer: adam, lr: 0.01, batch_size: 32, validate_every: {every}}}
"""


def steps(tmp_path: Path, every: str, pruner: str) -> list[list[int]]:
    space, study = run_digits(tmp_path, "ve", SPACE.format(every=every, pruner=pruner), 2)
    bound = bind(space)
    for t in study.trials:
        assert t.state.name == "COMPLETE"
        r = t.user_attrs["explore"]
        # the value is the last round's, validated whatever k is
        assert t.value == r["metrics"]["accuracy"]
        # its FLOPs count the rounds it validated, not every round
        c = compile_candidate(bound, dict(r["params"]), 1 << 40)
        data = load_digits()
        train, valid = round_flops(c.program, c.train_batch, (len(data.train.y),
                                                              len(data.valid.y)))
        assert r["flops"] == 4 * train + (len(t.intermediate_values) + 1) * valid
    # the rounds reported before the last (whose value is the trial's own)
    return [sorted(t.intermediate_values) for t in study.trials]


@pytest.mark.parametrize(("every", "pruner", "want"), [
    ("auto", "none", []),  # nothing reads a round's value: only the last is validated
    ("auto", "{name: median, warmup_rounds: 1}", [1, 2, 3]),
    ("3", "{name: median, warmup_rounds: 1}", [3]),
    ("2", "none", [2]),
    ("1", "none", [1, 2, 3]),
])
def test_rounds_validated(tmp_path: Path, every: str, pruner: str, want: list[int]) -> None:
    assert steps(tmp_path, every, pruner) == [want, want]


def test_a_validation_interval_must_be_a_positive_count_or_auto() -> None:
    for bad in (0, -2, "sometimes", 1.5):
        with pytest.raises(SpaceError, match="validate_every"):
            parse_space({"dataset": "digits", "training": {"validate_every": bad}})
