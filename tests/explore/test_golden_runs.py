"""A run of each shipped space (shrunk, one worker, its sampler seed) gives the trials
it gave before the scheduler's structure changed: the same numbers, states and
parameters, and the same values and reports up to the last bits a different BLAS
build may change (``golden_runs.py`` says how the stored runs were made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.explore.golden_runs import GOLDEN, SHIPPED, run

STORED = json.loads(GOLDEN.read_text())


def close(a: Any, b: Any) -> bool:
    """Equal, floats to a relative 1e-5 (TPE's choices follow the values: a value off
    in its last bits moves a sampled float by as little)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and \
            a == pytest.approx(b, rel=1e-5, abs=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_every_shipped_space_has_a_stored_run() -> None:
    assert sorted(STORED) == SHIPPED


# CI's slow step runs these: the convolutional and attention spaces take several times
# the others, and the README's command (8 minutes on CI's two cores) keeps one space of
# each kind of data beside them (MNIST's MLPs, the two tables, a series)
HEAVY = {"cnn_mnist", "residual_mnist", "transformer_rows", "onnx_mnist", "mlp_nas",
         "mnist_full", "paper_mnist"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY
                                  else n for n in SHIPPED])
def test_a_shipped_space_runs_as_it_did(tmp_path: Path, name: str) -> None:
    got = json.loads(json.dumps(run(name, tmp_path)))  # tuples as stored: lists
    want = STORED[name]
    assert [(t["number"], t["state"]) for t in got] == \
        [(t["number"], t["state"]) for t in want]
    for g, w in zip(got, want, strict=True):
        assert close(g, w), (name, g, w)


def test_the_comparison_sees_a_changed_value() -> None:
    want = STORED["quick"][0]
    changed = json.loads(json.dumps(want))
    changed["values"][0] += 1e-3
    assert close(want, want) and not close(changed, want)
