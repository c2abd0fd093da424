"""``explore size``: the values it assumed for the parameters ``--params`` did not give
(a range's low end, a choice's first, a builder's too), and a plan table whose lower
bound no plan goes below."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from explore.cli import main

SEARCHED = """\
dataset: digits
budget: {trials: 2, rounds: 1, memory: 400MB}
model:
  depth: {int: [0, 2]}
  width: {int: [8, 32], per_layer: true}
  activation: {choice: [tanh, relu]}
training:
  optimizer: {choice: [sgd, adam]}
  lr: {float: [1.0e-3, 1.0e-1], log: true}
  momentum: {float: [0.5, 0.9], when: {optimizer: sgd}}
  batch_size: auto
"""

# a linear regression: its gradients are written in place, over their inputs
IN_PLACE = """\
dataset: {name: diabetes, valid: 0.2}
objectives: [{metric: r2}]
budget: {trials: 2, rounds: 1, memory: 400MB}
model: {depth: 0, width: 8}
training: {loss: mse, lr: 0.01, batch_size: 32}
"""

BUILDER = '''
from explore.families import Shape, get


def build(trial):
    width = trial.suggest_int("width", 8, 64, log=True)
    act = trial.suggest_categorical("act", ["relu", "tanh"])
    return get("mlp").build({"depth": 1, "widths": [width], "activations": [act],
                             "dropouts": [0.0], "init": "he_uniform"},
                            Shape(64, 10, pixel_scale=1 / 16))
'''


def size(tmp_path: Path, text: str, *args: str) -> str:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    result = CliRunner().invoke(main, ["size", str(f), *args])
    assert result.exit_code == 0, result.output
    return result.output


def sized(tmp_path: Path, text: str, **given: Any) -> dict[str, Any]:
    args = [a for k, v in given.items() for a in ("--params", f"{k}={v}")]
    out: dict[str, Any] = json.loads(size(tmp_path, text, *args, "--json"))
    return out


def test_the_values_assumed_are_the_low_ends_and_first_choices(tmp_path: Path) -> None:
    got = sized(tmp_path, SEARCHED, depth=2)
    assert got["assumed"] == {"width": [8, 8], "activation": "tanh", "optimizer": "sgd",
                              "lr": 0.001, "momentum": 0.5, "batch_size": 512}
    # momentum is not asked of adam: not assumed
    got = sized(tmp_path, SEARCHED, depth=1, optimizer="adam", lr=0.01)
    assert got["assumed"] == {"width": [8], "activation": "tanh", "batch_size": 512}


def test_giving_the_assumed_values_sizes_the_same_model(tmp_path: Path) -> None:
    """What it says it assumed is what it sized."""
    first = sized(tmp_path, SEARCHED, depth=2)
    given = {k: (f"[{','.join(map(str, v))}]" if isinstance(v, list) else v)
             for k, v in first["assumed"].items()}
    again = sized(tmp_path, SEARCHED, depth=2, **given)
    assert again["assumed"] == {}
    assert again["total_bytes"] == first["total_bytes"]
    assert again["zones"] == first["zones"]


def test_the_text_says_what_it_assumed(tmp_path: Path) -> None:
    out = " ".join(size(tmp_path, SEARCHED, "--params", "lr=0.01").split())
    assert "assumed, as --params did not say: depth=0, optimizer=sgd, momentum=0.5, " \
           "batch_size=512" in out
    out = size(tmp_path, SEARCHED, *(a for kv in ("depth=0", "optimizer=adam", "lr=0.01",
                                                  "batch_size=64")
                                     for a in ("--params", kv)))
    assert "assumed" not in out


def test_a_builders_assumed_parameters_are_its_low_answers(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    (tmp_path / "size_assumed_models.py").write_text(BUILDER)
    monkeypatch.delitem(sys.modules, "size_assumed_models", raising=False)
    text = ('dataset: digits\nbudget: {trials: 2, rounds: 1, memory: 400MB}\n'
            'model: {builder: "size_assumed_models:build"}\n'
            'training: {lr: 0.02, batch_size: 32}\n')
    assert sized(tmp_path, text)["assumed"] == {"width": 8, "act": "relu"}
    assert sized(tmp_path, text, width=16)["assumed"] == {"act": "relu"}


def table(out: str) -> tuple[list[str], dict[str, list[int]]]:
    """The plan table's column names and its rows of numbers, by zone."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("zone "))
    columns = [c.strip() for c in lines[head].split("  ") if c.strip()]
    rows = {}
    for line in lines[head + 1:]:
        zone, *cells = line.split()
        if zone not in ("forward", "gradient", "optimizer", "workspace", "total"):
            break
        rows[zone] = [int(c.replace(",", "")) for c in cells[:3]]
    return columns, rows


def test_no_plan_goes_below_the_lower_bound_in_place_ops_included(tmp_path: Path) -> None:
    """The lower bound is over the pieces the plan packs: an in-place op's result
    shares its input's piece, so (unlike a bound that counts each value apart) the plan
    never goes below it, and on this in-place chain it meets it."""
    columns, rows = table(size(tmp_path, IN_PLACE))
    assert columns == ["zone", "no sharing", "planned", "lower bound", "planned/bound"]
    planned, bound = columns.index("planned") - 1, columns.index("lower bound") - 1
    assert all(r[planned] >= r[bound] for r in rows.values()), rows
    assert any(r[planned] == r[bound] < r[0] for r in rows.values()), rows
