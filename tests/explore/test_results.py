"""Reading a study back: ``explore.results.load`` from a path, a URL or a storage,
the final metrics as columns, and ``explore show`` / ``export`` / ``--version``; what
trials switched out of their arenas show there, in the run's summary and in its live
progress table."""

from __future__ import annotations

import math
import re
from pathlib import Path

import optuna
import pandas as pd
import pytest
from click.testing import CliRunner
from optuna.distributions import CategoricalDistribution, FloatDistribution
from rich.console import Console

import explore
from explore.attrs import RUNS_ATTR, STALE_ATTR
from explore.cli import console as cli
from explore.cli import main
from explore.cli.search import _Display
from explore.results import COLUMNS, load, metric_columns
from explore.scheduler.telemetry import RunStats, Sample
from explore.study import RECORD_ATTR

LRS = [0.012345678901234567, 0.2718281828459045, 0.0031415926535897933]


def record(i: int, optimizer: str, lr: float, **extra: object) -> dict[str, object]:
    return {"params": {"depth": 1, "widths": [32], "optimizer": optimizer, "lr": lr,
                       "batch_size": 64},
            "planned_bytes": {"forward": 100, "gradient": 50, "optimizer": 20,
                              "workspace": 30},
            "total_bytes": 200 + i, "batch_size": 64, "rounds": 3, "worker": 0, **extra}


def make_study(db: Path, *, new: bool = True, switched: dict[str, object] | None = None
               ) -> None:
    """Three complete trials as ``explore run`` records them: with ``metrics`` and
    ``train_seconds`` (``new``), or as studies before them did (accuracy alone); the
    second with ``switched`` in its record, if given."""
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}",
                                direction="maximize")
    dists = {"optimizer": CategoricalDistribution(["adam", "sgd"]),
             "lr": FloatDistribution(1e-3, 0.3, log=True)}
    for i, (opt, lr) in enumerate(zip(["adam", "sgd", "adam"], LRS, strict=True)):
        acc = 0.5 + 0.1 * i
        extra: dict[str, object] = {"metrics": {"accuracy": acc, "loss": 1.0 - acc,
                                                "f1": acc - 0.05, "roc_auc": acc + 0.05},
                                    "train_seconds": 1.5 + i} if new else {"accuracy": acc}
        if switched and i == 1:
            extra.update(switched)
        study.add_trial(optuna.trial.create_trial(
            params={"optimizer": opt, "lr": lr}, distributions=dists, value=acc,
            user_attrs={RECORD_ATTR: record(i, opt, lr, **extra)}))


def test_load_takes_a_path_a_url_or_a_storage(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    make_study(db)
    frames = [load(db, "s"), load(str(db), "s"), load(f"sqlite:///{db}", "s"),
              load(optuna.storages.RDBStorage(f"sqlite:///{db}"), "s")]
    for df in frames[1:]:
        pd.testing.assert_frame_equal(df, frames[0])
    assert list(frames[0]["p_lr"]) == LRS


def test_a_missing_database_is_named_and_not_created(tmp_path: Path) -> None:
    for missing in (tmp_path / "none.db", str(tmp_path / "none.db"),
                    f"sqlite:///{tmp_path / 'none.db'}"):
        with pytest.raises(FileNotFoundError, match=r"none\.db"):
            load(missing, "s")
    assert list(tmp_path.iterdir()) == []
    make_study(tmp_path / "s.db")
    with pytest.raises(KeyError, match="no study 'other'"):
        load(tmp_path / "s.db", "other")


def test_the_final_metrics_are_columns_after_the_value(tmp_path: Path) -> None:
    make_study(tmp_path / "s.db")
    df = load(tmp_path / "s.db", "s")
    assert list(df.columns[:7]) == ["number", "state", "value", "accuracy", "loss", "f1",
                                    "roc_auc"]
    assert metric_columns(df) == ["accuracy", "loss", "f1", "roc_auc"]
    assert list(df["train_seconds"]) == [1.5, 2.5, 3.5]
    assert (df["accuracy"] == df["value"]).all()
    assert set(COLUMNS) <= set(df.columns)


def test_a_study_recorded_before_the_metrics_still_loads(tmp_path: Path) -> None:
    make_study(tmp_path / "s.db", new=False)
    df = load(tmp_path / "s.db", "s")
    assert metric_columns(df) == ["accuracy"]  # what such a study recorded
    assert df["train_seconds"].isna().all()
    assert list(df["value"]) == list(df["accuracy"])


def test_a_stale_trial_whose_driver_wrote_over_the_verdict_reads_as_the_verdict_says(
        tmp_path: Path) -> None:
    """A trial failed as stale whose stalled driver's record landed over the verdict's
    copy (explore.live.study._fail_stale): its reason is the verdict's."""
    make_study(tmp_path / "s.db")
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        user_attrs={RECORD_ATTR: record(3, "adam", 0.01, driver="a:1:x"),
                    STALE_ATTR: {"fail_reason": "stale: its driver a:1:x has exited",
                                 "retried": True, "failed_by": "b:2:y", "driver": "a:1:x"}}))
    df = load(tmp_path / "s.db", "s")
    assert list(df["fail_reason"])[-1] == "stale: its driver a:1:x has exited"
    assert df["fail_reason"][:3].isna().all()


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"explore {explore.__version__}\n"


def test_show_prints_the_parameters_in_full_and_the_metrics(tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=160))
    make_study(tmp_path / "s.db")
    result = CliRunner().invoke(main, ["show", "--storage", str(tmp_path / "s.db"),
                                       "--study", "s"])
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("best trials"):]
    header = table.splitlines()[1].split()
    assert header == ["trial", "value", "accuracy", "loss", "f1", "roc_auc",
                      "train_seconds", "bytes"]
    for lr in LRS:  # every digit, as the sampler chose it
        assert repr(lr) in table
    assert "sgd" in table and "adam" in table
    assert "the same in every trial: depth=1, widths=[32], batch_size=64" in table


def test_show_of_an_old_study(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=160))
    make_study(tmp_path / "s.db", new=False)
    result = CliRunner().invoke(main, ["show", "--storage", f"sqlite:///{tmp_path / 's.db'}",
                                       "--study", "s"])
    assert result.exit_code == 0, result.output
    header = result.output[result.output.index("best trials"):].splitlines()[1].split()
    assert header[:3] == ["trial", "value", "accuracy"] and "train_seconds" not in header


@pytest.mark.parametrize("command", ["show", "export"])
def test_show_and_export_of_a_missing_study_create_nothing(tmp_path: Path,
                                                           command: str) -> None:
    out = ["--output", str(tmp_path / "t.csv")] if command == "export" else []
    for storage in (str(tmp_path / "none.db"), f"sqlite:///{tmp_path / 'none.db'}"):
        result = CliRunner().invoke(main, [command, "--storage", storage, "--study", "s",
                                           *out])
        assert result.exit_code == 2, result.output
        assert "none.db" in result.output and "no study 's'" in result.output
    space = tmp_path / "tiny.yaml"  # the default storage: tiny.db beside the space
    space.write_text("name: tiny\ndataset: digits\nbudget: {trials: 1, rounds: 1, "
                     "memory: 64MB}\n")
    result = CliRunner().invoke(main, [command, str(space), *out])
    assert result.exit_code == 2 and "tiny.db" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]
    make_study(tmp_path / "s.db")  # a database without the study asked for
    result = CliRunner().invoke(main, [command, "--storage", str(tmp_path / "s.db"),
                                       "--study", "other", *out])
    assert result.exit_code == 2 and "no study 'other'" in result.output
    assert not (tmp_path / "t.csv").exists()


def test_export_parquet_reads_back_with_pandas(tmp_path: Path) -> None:
    make_study(tmp_path / "s.db")
    target = tmp_path / "trials.parquet"
    result = CliRunner().invoke(main, ["export", "--storage", str(tmp_path / "s.db"),
                                       "--study", "s", "--format", "parquet",
                                       "--output", str(target)])
    assert result.exit_code == 0, result.output
    back = pd.read_parquet(target)
    df = load(tmp_path / "s.db", "s")
    assert list(back.columns) == list(df.columns)
    assert list(back["p_lr"]) == LRS and list(back["f1"]) == list(df["f1"])
    assert list(back["train_seconds"]) == [1.5, 2.5, 3.5]
    assert all(math.isclose(a, b) for a, b in zip(back["value"], df["value"], strict=True))
    assert '"optimizer": "sgd"' in back["params"][1]


# A trial switched out of its arena twice while paused, as the scheduler records it
# (explore.scheduler.core.endings, _switch_record): the second time it ended while out.
SWITCHED = {"switched_out": 2, "switch_bytes": 12_500_000,
            "out_spans": [[3.14159, 5.0], [7.25, 9.0]]}


def make_switched_study(db: Path) -> None:
    """:func:`make_study`'s trials, the second switched out (:data:`SWITCHED`), and a
    run's record saying what it switched."""
    make_study(db, switched=SWITCHED)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    run = RunStats(400_000_000, switch_bytes=12_500_000,
                   switch_folder="/art/.switched/host-7-0a1b2c3d")
    run.counts.update(switched_out=2, switched_in=1)
    run.record(Sample(0.0, 0, 1_000, 0))
    study.set_user_attr(RUNS_ATTR, [{**run.record_dict(), "measured_peak": 2_000}])


def test_switches_are_columns_and_absent_ones_are_zero(tmp_path: Path) -> None:
    make_switched_study(tmp_path / "s.db")
    df = load(tmp_path / "s.db", "s")
    assert list(df["switched_out"]) == [0, 2, 0]
    assert list(df["switch_bytes"]) == [0, 12_500_000, 0]
    assert list(df["out_spans"]) == [[], [[3.14159, 5.0], [7.25, 9.0]], []]
    assert metric_columns(df) == ["accuracy", "loss", "f1", "roc_auc"]  # not metrics
    result = CliRunner().invoke(main, ["export", "--storage", str(tmp_path / "s.db"),
                                       "--study", "s", "--output", str(tmp_path / "t.csv")])
    assert result.exit_code == 0, result.output
    back = pd.read_csv(tmp_path / "t.csv")
    assert list(back["switched_out"]) == [0, 2, 0]
    assert list(back["switch_bytes"]) == [0, 12_500_000, 0]
    assert list(back["out_spans"]) == ["[]", "[[3.14159, 5.0], [7.25, 9.0]]", "[]"]


def test_show_lists_the_switched_trials_and_the_runs_switching(tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=200))
    make_switched_study(tmp_path / "s.db")
    result = CliRunner().invoke(main, ["show", "--storage", str(tmp_path / "s.db"),
                                       "--study", "s"])
    assert result.exit_code == 0, result.output
    # the run's summary: how often, the bytes, and where the states went
    assert ("switched out: paused trials left their arenas 2 times and came back in "
            "once (12.5 MB of state written out); the states were written to "
            "/art/.switched/host-7-0a1b2c3d (removed at the end)") in result.output
    table = result.output[result.output.index("switched out of the arena"):]
    assert table.splitlines()[1].split()[:4] == ["trial", "state", "times", "written"]
    row = table.splitlines()[3].split()
    assert row[:4] == ["1", "complete", "2", "12.5"]
    assert "3.1-5.0, 7.2-9.0" in table.splitlines()[3]
    assert len([ln for ln in table.splitlines()[3:] if ln.strip()]) == 1  # trial 1 alone


def test_show_of_a_study_never_switched_says_nothing_of_it(tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(width=200))
    make_study(tmp_path / "s.db")
    result = CliRunner().invoke(main, ["show", "--storage", str(tmp_path / "s.db"),
                                       "--study", "s"])
    assert result.exit_code == 0, result.output
    assert "switched" not in result.output


def test_the_progress_table_shows_the_switches_once_there_are_any() -> None:
    def rendered(stats: RunStats) -> list[list[str]]:
        """The table's rows (the header first), each a list of its cells."""
        console = Console(width=200, record=True)
        console.print(_Display(400_000_000, 10, 0, quiet=True).table(stats))
        return [[c.strip() for c in re.split("[│┃]", ln)[1:-1]]
                for ln in console.export_text().splitlines() if ln[:1] in "│┃"]

    stats = RunStats(400_000_000)
    stats.record(Sample(1.0, 100_000_000, 50_000_000, 0))
    header, _ = rendered(stats)
    assert "switched" not in header
    stats.counts.update(paused=3, switched_out=4, switched_in=2, out=2)
    stats.switch_bytes = 25_000_000
    header, row = rendered(stats)
    shown = dict(zip(header, row, strict=True))
    assert shown["switched"] == "4 out, 2 in (2 out now), 25.0 MB"
    assert shown["paused"] == "3"  # paused, out of the arena or not
