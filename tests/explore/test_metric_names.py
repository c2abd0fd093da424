"""A study is named by its objectives' metrics (Optuna's ``metric_names``, which
optuna-dashboard shows in place of "Objective 0"), by every driver that opens it, and
the plots of the analysis notebook label their axes with them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from explore.live import LiveStudy
from explore.plots import objective_labels, objective_names
from explore.space import Space, parse_space
from explore.study import metric_names, name_objectives, open_study, storage_url


def space(*objectives: dict[str, Any]) -> Space:
    return parse_space({"name": "named", "dataset": "digits",
                        "objectives": list(objectives) or [{"metric": "accuracy"}],
                        "budget": {"trials": 2, "rounds": 1, "memory": "64MB"}})


@pytest.mark.parametrize("url", ["sqlite:///{}/s.db", "journal:///{}/s.log"])
def test_open_study_names_the_objectives_and_again_changes_nothing(tmp_path: Path,
                                                                   url: str) -> None:
    storage = url.format(tmp_path)
    s = space({"metric": "accuracy"}, {"metric": "planned_bytes"})
    study = open_study(s, storage)
    assert study.metric_names == ["accuracy", "planned_bytes"]
    # a second driver, and a third: the same names, no failure
    for _ in range(2):
        again = open_study(s, storage)
        assert again.metric_names == ["accuracy", "planned_bytes"]
    assert optuna.load_study(study_name="named", storage=storage_url(storage)
                             ).metric_names == ["accuracy", "planned_bytes"]
    assert objective_labels(again) == ["accuracy (maximize)", "planned_bytes (minimize)"]


def test_a_study_made_before_studies_were_named_is_named(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="named", storage=storage, direction="minimize")
    assert optuna.load_study(study_name="named", storage=storage).metric_names is None
    assert open_study(space({"metric": "loss"}), storage).metric_names == ["loss"]


def test_open_study_keeps_the_names_a_study_has(tmp_path: Path) -> None:
    """Opening is not yet running (a changed space may be refused): the study keeps the
    names its trials were measured by until :func:`name_objectives` renames it."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    open_study(space({"metric": "accuracy"}), storage)
    study = open_study(space({"metric": "f1"}), storage)
    assert study.metric_names == ["accuracy"]
    name_objectives(study, space({"metric": "f1"}))
    assert optuna.load_study(study_name="named", storage=storage).metric_names == ["f1"]


def test_a_metric_named_twice_is_numbered() -> None:
    s = space({"metric": "loss"}, {"metric": "loss", "direction": "maximize"})
    assert metric_names(s) == ["loss", "loss_2"]


def test_the_plots_name_an_unnamed_study_from_its_space_or_by_number() -> None:
    study = optuna.create_study(directions=["maximize"])
    assert objective_names(study) == ["objective 0"]
    study.set_user_attr("space", {"objectives": [{"metric": "r2"}]})
    assert objective_labels(study) == ["r2 (maximize)"]


# -- the working copy's creation is not logged ------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def optuna_log() -> Iterator[_Records]:
    """What Optuna logs at INFO (its own handler writes to stderr; this one keeps it)."""
    records = _Records()
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    logger = logging.getLogger("optuna")
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        optuna.logging.set_verbosity(level)


def test_the_in_memory_working_copy_is_not_announced(tmp_path: Path,
                                                     optuna_log: _Records) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    stored = open_study(space(), storage)
    assert optuna_log.messages == ["A new study created in RDB with name: named"]
    live = LiveStudy(stored, space(), total=2, device="cpu", inline=True)
    live.close()
    assert not [m for m in optuna_log.messages if "in memory" in m], optuna_log.messages
    # only while the copy is made, and on its thread: Optuna's log is as it was after
    optuna.create_study(study_name="after")
    assert optuna_log.messages[-1] == "A new study created in memory with name: after"


def test_another_threads_in_memory_study_is_still_announced(optuna_log: _Records,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The filter drops the working copy's record alone: a study another thread creates
    meanwhile is logged."""
    stored = open_study(space(), f"sqlite:///{tmp_path / 's.db'}")
    real = optuna.create_study

    def create_and_meanwhile(**kw: Any) -> optuna.Study:
        other = threading.Thread(target=lambda: real(study_name="other thread's"))
        other.start()
        other.join()
        return real(**kw)

    monkeypatch.setattr(optuna, "create_study", create_and_meanwhile)
    LiveStudy(stored, space(), total=2, device="cpu", inline=True).close()
    in_memory = [m for m in optuna_log.messages if "in memory" in m]
    assert in_memory == ["A new study created in memory with name: other thread's"]
