"""Search-space files: the shipped ones validate, and every kind of bad file gets a
clear message naming file, line and key, exit status 2, and no study on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from explore.cli import main
from explore.space import load_space, parse_size
from explore.yamlio import SpaceError
from tests.explore.cli_run import explore_run, explore_run_here

ROOT = Path(__file__).resolve().parent.parent.parent
GOOD = """\
dataset: digits
budget: {trials: 2, rounds: 1, memory: 64MB}
model:
  depth: {int: [1, 2]}
training:
  lr: {float: [1.0e-3, 1.0e-1], log: true}
"""


@pytest.mark.parametrize("name", ["quick", "paper_mnist", "mlp_nas", "cnn_mnist"])
def test_the_shipped_spaces_validate(name: str) -> None:
    space = load_space(ROOT / "search_spaces" / f"{name}.yaml")
    assert space.name == name


BAD = {
    "syntax": ("dataset: digits\nbudget: {trials: 2\n", 3, "", "began on line 2"),
    "tab indent": ("dataset: digits\nbudget:\n\ttrials: 2\n", 3, "", "YAML syntax"),
    "wrong type": (GOOD.replace("trials: 2", "trials: many"), 2, "budget.trials",
                   "valid integer"),
    "unknown key": (GOOD + "colour: red\n", 7, "colour", "unknown key"),
    "unknown nested key": (GOOD.replace("  depth:", "  deepness: 3\n  depth:"), 4,
                           "model.deepness", "unknown key"),
    "empty range": (GOOD.replace("[1, 2]", "[3, 1]"), 4, "model.depth", "empty range"),
    "log at zero": (GOOD.replace("1.0e-3", "0.0"), 6, "training.lr", "positive low bound"),
    "two kinds": (GOOD.replace("log: true", "choice: [1]"), 6, "training.lr",
                  "exactly one of"),
    "empty choice": (GOOD.replace("{int: [1, 2]}", "{choice: []}"), 4, "model.depth.choice",
                     "at least 1"),
    "bad size": (GOOD.replace("64MB", "64XB"), 2, "budget.memory", "unknown unit"),
    "negative size": (GOOD.replace("64MB", "-5"), 2, "budget.memory", "size"),
    "unknown dataset": (GOOD.replace("digits", "imagenet"), 1, "dataset.name", "mnist"),
    "duplicate key": (GOOD + "dataset: mnist\n", 7, "dataset", "duplicate key"),
    "merge key": ("base: &b {trials: 2}\n" + GOOD.replace("budget: {", "budget: {<<: *b, "),
                  3, "budget", "merge keys"),
    "not a mapping": ("- just\n- a list\n", 1, "", "mapping"),
    "null key": (GOOD + "~: 2\n", 7, "", "the key '~' is read as null"),
    "bool key": (GOOD.replace("model:\n", "model:\n  true: 3\n"), 4, "model",
                 "the key 'true' is read as true: a key is a name"),
    "empty file": ("", 1, "", "empty"),
    "python tag": (GOOD + "x: !!python/object/apply:os.system [ls]\n", 7, "x",
                   "is not allowed"),
    "python scalar tag": (GOOD + "x: !!python/name:os.system ''\n", 7, "x",
                          "is not allowed"),
    "nsga2 single objective": (GOOD + "sampler: nsga2\n", None, "", "nsga2"),
    "grid over a float": (GOOD + "sampler: grid\n", None, "", "grid needs finite"),
    "per layer lr": (GOOD.replace("log: true", "log: true, per_layer: true"), None, "",
                     "per_layer applies"),
    "cnn without blocks": (GOOD.replace("model:\n", "model:\n  family: cnn\n"), None, "",
                           "blocks of at least 1"),
    "mlp with blocks": (GOOD.replace("model:\n", "model:\n  blocks: 2\n"), None, "",
                        "blocks are for family cnn"),
    "when unknown": (GOOD.replace("log: true", "log: true, when: {optimiser: sgd}"), None, "",
                     "not a parameter"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_are_reported_with_file_line_and_key(case: str, tmp_path: Path) -> None:
    text, line, key, words = BAD[case]
    f = tmp_path / "space.yaml"
    f.write_text(text)
    with pytest.raises(SpaceError) as e:
        load_space(f)
    msg = str(e.value)
    assert words in msg, msg
    assert str(f) in msg
    if line is not None:
        assert f"{f}:{line}:" in msg, msg
    if key:
        assert f": {key}:" in msg, msg
    result = explore_run_here(f)
    assert result.exit_code == 2 and words in result.output, result.output
    assert not (tmp_path / "space.db").exists()  # nothing written


def test_all_errors_are_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(GOOD.replace("trials: 2", "trials: 0").replace("[1, 2]", "[2, 1]")
                 + "extra: 1\n")
    with pytest.raises(SpaceError) as e:
        load_space(f)
    assert len(e.value.errors) == 3


def test_an_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpaceError, match="nested aliases"):
        load_space(f)
    assert CliRunner().invoke(main, ["size", str(f)]).exit_code == 2


def test_sizes() -> None:
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("2 KiB") == 2048
    for bad in ("12XB", "lots", "0MB", True):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_cli_rejects_a_bad_memory_option(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    result = explore_run(f, "--memory", "lots")
    assert result.exit_code == 2 and "--memory" in result.output
    assert not (tmp_path / "s.db").exists()
