"""Failed trials are visible: the run's summary and ``explore show`` say why trials
failed (grouped by reason, a traceback by its exception and line), ``explore run`` exits
1 and :func:`explore.run` warns when every trial of the run failed, and Ctrl-C's last
words count the trials it failed apart from those kept.  With them, what ``show``
lists of a trial: only the parameters it used, and no number broken over lines."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from click.testing import CliRunner
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

import explore
from explore.attrs import RECORD_ATTR, SPACE_ATTR
from explore.cli import console as cli
from explore.cli import main
from explore.cli.search import _stopped, interrupted_here
from explore.failures import every_one_failed, grouped, headline, listed, run_failed
from tests.explore.cli_run import explore_run


def traceback(width: int) -> str:
    """A model builder's traceback as the trial's reason holds it."""
    return ('the model builder raised:\n  File "/home/me/nets.py", line 9, in build\n'
            f"    raise ValueError(f'too wide: {{widths[i]}}')\nValueError: too wide: {width}")


def failed(reason: str, **record: Any) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.FAIL,
                        user_attrs={RECORD_ATTR: {"fail_reason": reason, **record}})


def complete(value: float, **record: Any) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.COMPLETE, value=value,
                        user_attrs={RECORD_ATTR: record})


def study_of(storage: str, name: str, *trials: optuna.trial.FrozenTrial) -> optuna.Study:
    s = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    for t in trials:
        s.add_trial(t)
    return s


# -- the reasons, grouped ----------------------------------------------------------------
def test_a_traceback_is_said_by_its_exception_and_where_it_was_raised() -> None:
    assert headline(traceback(64)) == (
        "the model builder raised: ValueError: too wide: 64 (nets.py, line 9, in build)")
    # an exception whose message goes on over lines: its first line says what it is
    assert headline('error:\n  File "C:\\\\m\\\\a.py", line 2, in f\n    g()\n'
                    "KeyError: 'x'\n  more of its message") == \
        "error: KeyError: 'x' (a.py, line 2, in f)"
    assert headline("does not fit:\nneeds 9 bytes") == "does not fit: needs 9 bytes"
    assert headline("  ") == "no reason recorded"


def test_reasons_alike_but_for_their_numbers_are_one_group_and_retried_ones_apart() -> None:
    s = study_of("sqlite:///:memory:", "g", failed(traceback(64)),
                 complete(0.5), failed(traceback(48)),
                 failed("interrupted", retried=True), failed("does not fit: 9 bytes"),
                 failed(traceback(64)))
    lines = [g.line() for g in grouped(s.trials)]
    assert lines == [
        "3 trials (0, 2, 5), e.g. trial 0: the model builder raised: ValueError: too "
        "wide: 64 (nets.py, line 9, in build)",
        "1 trial (4): does not fit: 9 bytes",
        "1 trial (3), failed and queued again (not counted): interrupted"]
    same = grouped([t for t in s.trials if t.number in (0, 5)])
    assert same[0].same and "e.g." not in same[0].line()
    assert listed(range(3, 30), most=5) == "3, 4, 5, 6, ..., 29"


def test_a_run_failed_when_every_trial_it_ran_that_counts_failed() -> None:
    a, b = "host:1:aaaaaa", "host:2:bbbbbb"
    s = study_of("sqlite:///:memory:", "r", failed("x", driver=a),
                 failed("interrupted", driver=a, retried=True), failed("y", driver=a),
                 complete(0.9, driver=b), failed("x", driver=b))
    groups = run_failed(s, {"driver": a})
    assert [(g.numbers, g.retried) for g in groups] == [([0], False), ([2], False),
                                                        ([1], True)]
    assert run_failed(s, {"driver": b}) == []  # one of its trials completed
    assert run_failed(s, {"driver": "host:3:cccccc"}) == []  # it ran none
    assert run_failed(s, {}) == []  # a run recorded before runs named their driver
    # failed only by an interrupt: nothing that counts failed
    assert not every_one_failed([failed("interrupted", retried=True)])


def test_ctrl_c_counts_the_trials_it_failed_apart_from_those_kept() -> None:
    here = f"{socket.gethostname()}:{os.getpid()}:abcdef"
    there = f"{socket.gethostname()}:{os.getpid() + 1}:abcdef"
    trials = [failed("interrupted", driver=here, retried=True),
              failed("interrupted", driver=here, retried=True),
              failed("interrupted", driver=there, retried=True),  # another run's
              failed("diverged: loss nan", driver=here), complete(0.5, driver=here)]
    assert interrupted_here(trials) == 2


def test_ctrl_c_says_what_was_kept_and_what_runs_again(tmp_path: Path, monkeypatch) -> None:
    err = Console(width=300, record=True)
    monkeypatch.setattr(cli, "err", err)
    here = f"{socket.gethostname()}:{os.getpid()}:abcdef"
    storage = f"sqlite:///{tmp_path / 'c.db'}"
    study_of(storage, "c", complete(0.5, driver=here), complete(0.6, driver=here),
             *[failed("interrupted", driver=here, retried=True) for _ in range(3)])
    with pytest.raises(SystemExit) as stopped:
        _stopped(SimpleNamespace(study_name="c", storage=storage), "interrupted", 130)
    assert stopped.value.code == 130
    assert f"kept: 2 finished trials in study 'c' at {storage}; 3 in hand were failed as " \
        "interrupted and run again next time" in err.export_text()


# -- what the summary and show print -----------------------------------------------------
def test_show_lists_this_studys_failures_grouped_and_in_full(tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=200))
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study_of(storage, "s", complete(0.8), failed(traceback(64)),
             failed(traceback(64)), failed("does not fit: 12,000 bytes"))
    study_of(storage, "other", failed("a reason of another study"))
    result = CliRunner().invoke(main, ["show", "--storage", storage, "--study", "s"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "2 trials (1, 2): the model builder raised: ValueError: too wide: 64 (nets.py, " \
        "line 9, in build)" in out
    assert "1 trial (3): does not fit: 12,000 bytes" in out
    assert "another study" not in out
    lines = out.splitlines()
    table = "\n".join(lines[next(i for i, ln in enumerate(lines)
                                 if ln.strip() == "failed trials"):])
    assert table.splitlines()[1].split() == ["trials", "reason"]
    # the full text, its brackets as they are (not taken for markup)
    assert "raise ValueError(f'too wide: {widths[i]}')" in table
    assert re.search(r"^1, 2 +the model builder raised:", table, re.M), table
    assert re.search(r"^3 +does not fit: 12,000 bytes", table, re.M), table


def test_explore_run_exits_1_naming_the_reason_when_every_trial_failed(tmp_path: Path
                                                                      ) -> None:
    (tmp_path / "broken_nets.py").write_text(
        "def build(trial):\n    width = trial.suggest_int('width', 8, 64)\n"
        "    raise ValueError('bad width')\n")
    f = tmp_path / "b.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 3, rounds: 1, memory: 400MB, workers: 1}\n"
                 "model: {builder: 'broken_nets:build'}\nkeep_models: 0\n")
    r = explore_run(f)
    said = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert r.exit_code == 1, r.output
    assert "3 trials (0, 1, 2): the model builder raised: ValueError: bad width " \
        "(broken_nets.py, line 3, in build)" in said, said
    assert "every trial of this run failed (3 trials" in said


def raising(trial: Any) -> Any:
    trial.suggest_int("width", 8, 64)
    raise ValueError("bad width")


def test_explore_run_warns_naming_the_reasons_when_every_trial_failed(tmp_path: Path) -> None:
    space = {"name": "w", "dataset": "digits", "keep_models": 0,
             "budget": {"trials": 2, "rounds": 1, "memory": "400MB", "workers": 1},
             "training": {"lr": 0.02, "batch_size": 32}}
    with pytest.warns(UserWarning, match=r"every trial of this run of study 'w' failed "
                                         r"\(2 trials\):\n  2 trials \(0, 1\): the model "
                                         r"builder raised: ValueError: bad width"):
        study = explore.run(space, builder=raising, storage=f"sqlite:///{tmp_path}/w.db")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]  # returned all the same


# -- the parameters a trial used, and numbers kept whole --------------------------------
FULL = {"depth": 1, "widths": [32], "activations": ["relu"], "blocks": 0, "channels": [],
        "kernel": 3, "stride": 1, "pool": True, "stage_blocks": 1, "weight_decay": 0.0,
        "batch_size": 32}


def params_study(db: Path) -> None:
    """Three complete trials of an mlp space recorded as the scheduler records them
    (every key of every family), Adam's with the momentum it never used."""
    study = optuna.create_study(study_name="p", storage=f"sqlite:///{db}",
                                direction="maximize")
    study.set_user_attr(SPACE_ATTR, {"model": {"family": "mlp"}})
    dists = {"optimizer": CategoricalDistribution(["adam", "sgd"]),
             "lr": FloatDistribution(1e-3, 0.3, log=True)}
    for i, (opt, lr, mom) in enumerate([("adam", 0.0123, 0.0), ("sgd", 0.2, 0.9),
                                        ("adam", 0.003, 0.0)]):
        study.add_trial(create_trial(
            params={"optimizer": opt, "lr": lr}, distributions=dists, value=0.5 + i / 10,
            user_attrs={RECORD_ATTR: {
                "params": {**FULL, "optimizer": opt, "lr": lr, "momentum": mom},
                "metrics": {"accuracy": 0.5 + i / 10, "loss": 1.23456, "f1": 0.4321,
                            "roc_auc": 0.98765, "train_loss": 1.5},
                "train_seconds": 12.3456, "total_bytes": 123_456_789 + i}}))


def test_show_lists_only_the_parameters_a_trial_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=200))
    params_study(tmp_path / "p.db")
    result = CliRunner().invoke(main, ["show", "--storage", str(tmp_path / "p.db"),
                                       "--study", "p"])
    assert result.exit_code == 0, result.output
    lines = {ln.split(":")[0]: ln for ln in result.output.splitlines()
             if ln.startswith("trial ")}
    assert "momentum=0.9" in lines["trial 1"]  # sgd's
    assert "momentum" not in lines["trial 2"] + lines["trial 0"]  # adam has no use for it
    for cnn_only in ("blocks=", "channels=", "kernel=", "stride=", "pool=", "stage_blocks="):
        assert cnn_only not in result.output
    assert "the same in every trial: depth=1, widths=[32], activations=[\"relu\"], " \
        "weight_decay=0.0, batch_size=32" in result.output


@pytest.mark.parametrize("width", [80, 50])
def test_show_never_breaks_a_number_over_lines(tmp_path: Path, monkeypatch,
                                               width: int) -> None:
    monkeypatch.setattr(cli, "out", Console(width=width))
    params_study(tmp_path / "p.db")
    result = CliRunner().invoke(main, ["show", "--storage", str(tmp_path / "p.db"),
                                       "--study", "p"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert all(len(ln) <= width for ln in out.splitlines()), out
    best = out[out.index("best trials"):out.index("trial 2:")]
    rows = [ln.split() for ln in best.splitlines() if re.match(r"\d", ln)]
    assert [r[:2] for r in rows] == [["2", "0.7"], ["1", "0.6"], ["0", "0.5"]], best
    # each number whole on its row, or its column left out and said so
    for column, number in [("bytes", "123,456,791"), ("train_seconds", "12.35"),
                           ("roc_auc", "0.9877")]:
        header = best.splitlines()[1].split()
        if column in header:
            assert number in rows[0], best
        else:
            assert column in out[out.index("left out for the terminal's width"):], out
    if width == 50:
        assert "train_seconds" not in best.splitlines()[1]
    for lr in ("0.0123", "0.2", "0.003"):  # the parameter lines break between values
        assert re.search(rf"(^|\s)lr={re.escape(lr)}(\s|$)", out, re.M), out
    assert "widths=[32]" in out
