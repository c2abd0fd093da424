"""``training.refresh_statistics``: before each validation a worker forwards that many
mini-batches of training rows through a trial whose batch norms keep running
statistics, so that it validates on its weights' statistics.  The weights train as
without it (the same training losses, round by round), the validation differs, the
forward passes are counted in the trial's FLOPs, and a model without batch norms is
left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from explore.binding import bind
from explore.candidate import compile_candidate
from explore.datasets import load_digits
from explore.space import SpaceError, parse_space
from explore.space_sections import Training
from explore.utilisation import round_flops
from tests.explore.digits_runs import run_digits

SPACE = """\
name: rs
dataset: digits
budget: {{trials: 2, rounds: 3, memory: 300MB, workers: 1}}
sampler: {{name: random, seed: 3}}
pruner: none
model: {model}
training: {{optimizer: adam, lr: 0.05, batch_size: 32, validate_every: 1,
           refresh_statistics: {refresh}}}
"""
CNN = "{family: cnn, blocks: 1, channels: 6, kernel: 3, pool: true, batch_norm: true}"
MLP = "{depth: 1, width: 16, activation: relu}"


def run(tmp_path: Path, model: str, refresh: str) -> list[dict[str, Any]]:
    """Each trial's record after a run of the space (one worker, its sampler seed)."""
    folder = tmp_path / refresh
    folder.mkdir()
    space, study = run_digits(folder, "rs", SPACE.format(model=model, refresh=refresh), 2)
    bound, data = bind(space), load_digits()
    out = []
    for t in sorted(study.trials, key=lambda t: t.number):
        assert t.state.name == "COMPLETE"
        r = t.user_attrs["explore"]
        c = compile_candidate(bound, dict(r["params"]), 1 << 40)
        train, valid = round_flops(c.program, c.train_batch,
                                   (len(data.train.y), len(data.valid.y)),
                                   refresh=space.training.statistics_batches())
        assert r["flops"] == 3 * (train + valid)  # every round validated
        out.append({"values": dict(t.intermediate_values), "flops": r["flops"],
                    "loss": r["metrics"]["train_loss"], "valid_flops": valid})
    return out


def test_batch_norms_validate_on_refreshed_statistics(tmp_path: Path) -> None:
    left = run(tmp_path, CNN, "0")
    refreshed = run(tmp_path, CNN, "auto")
    for a, b in zip(left, refreshed, strict=True):
        assert a["loss"] == b["loss"]  # the same weights: training is untouched
        assert a["values"] != b["values"]  # but validated on other statistics
        assert b["valid_flops"] > a["valid_flops"]  # whose forward passes are counted


def test_a_model_without_batch_norms_is_left_alone(tmp_path: Path) -> None:
    assert run(tmp_path, MLP, "0") == run(tmp_path, MLP, "30")


def test_a_refresh_count_must_be_a_count_or_auto() -> None:
    for bad in (-1, "sometimes", 1.5, 10**6):
        with pytest.raises(SpaceError, match="refresh_statistics"):
            parse_space({"dataset": "digits", "training": {"refresh_statistics": bad}})
    assert Training().statistics_batches() == 30  # the default: auto
