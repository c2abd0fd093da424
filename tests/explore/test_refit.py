"""``explore refit`` and :func:`explore.refit.refit`: a searched trial trained again on
the training and validation rows of the search's split, reproducibly, with its test
metrics recorded beside the searched model's, loaded by ``load_model(refit=True)``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml
from click.testing import CliRunner
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

import explore
from explore.attrs import SPACE_ATTR
from explore.cli import main
from explore.datasets import get
from explore.keeper import REFIT_ATTR
from explore.refit import Recipe, choose_trial, refit, searched_rows, train
from explore.trained import (
    ModelError,
    StoredData,
    evaluate_split,
    find_model,
    load_model,
    open_stored,
    read_model,
    rebuild,
)
from explore.weights import parameter_names

NAME = "refit-iris"
SPACE = {"name": NAME, "dataset": {"name": "iris", "test": 0.2}, "pruner": "none",
         "keep_models": 1, "budget": {"trials": 2, "rounds": 3, "memory": "300MB",
                                      "workers": 1},
         "training": {"lr": 0.02, "batch_size": 16}}


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small search of iris (two trials, three rounds, the best model kept), run from
    its space file: the file and the study's storage."""
    folder = tmp_path_factory.mktemp("refit")
    space = folder / "iris.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    study = explore.run(space)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    return space, f"sqlite:///{folder / 'iris.db'}"


@pytest.fixture(scope="module")
def searched_compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The search of :func:`searched`, its workers on the compiled kernels."""
    folder = tmp_path_factory.mktemp("refit-compiled")
    space = folder / "iris.yaml"
    space.write_text(yaml.safe_dump({**SPACE, "budget": {**SPACE["budget"],
                                                         "kernels": "compiled"}}))
    explore.run(space)
    return space, f"sqlite:///{folder / 'iris.db'}"


def _rows() -> Any:
    """iris as the space splits it."""
    return get("iris").configure(test=0.2).load()


def _weights(vm: Any) -> dict[str, np.ndarray]:
    return {n: np.array(vm.get(n)) for n in parameter_names(vm.program)}


def test_refit_trains_the_best_trial_on_the_training_and_validation_rows(
        searched: tuple[Path, str]) -> None:
    _, storage = searched
    model = refit(storage, NAME)
    study = optuna.load_study(study_name=NAME, storage=storage)
    best = study.best_trial
    data = _rows()
    record = model.refit
    assert record is not None and model.trial == best.number == record["trial"]
    assert record["rows"] == {"train": len(data.train), "valid": len(data.valid)}
    assert record["rounds"] == best.user_attrs["explore"]["rounds"] == \
        SPACE["budget"]["rounds"]
    assert record["seed"] == best.number  # budget.seed 0 + the trial's number
    assert record["test_rows"] == len(data.test) > 0
    # one program, its heap exactly the planned bytes
    assert record["heap_bytes"] == model.vm.program.total_bytes == \
        model.vm.heap.allocated_bytes
    assert study.user_attrs[REFIT_ATTR] == record


def test_a_refit_is_reproducible_and_is_not_the_searched_model(
        searched: tuple[Path, str]) -> None:
    _, storage = searched
    first, second = refit(storage, NAME), refit(storage, NAME)
    a, b = _weights(first.vm), _weights(second.vm)
    assert a.keys() == b.keys() and a
    assert all(np.array_equal(a[k], b[k]) for k in a)
    kept = _weights(load_model(storage, NAME, trial=first.trial).vm)
    assert kept.keys() == a.keys()
    assert not all(np.array_equal(a[k], kept[k]) for k in a)
    # the refit before is replaced in the store, not left beside it
    folder = Path(second.refit["artifacts"])  # type: ignore[index]
    assert first.refit["artifact"] not in {p.name for p in folder.iterdir()}  # type: ignore[index]


@pytest.mark.parametrize(("search", "kernels"), [("searched", "numpy"),
                                                ("searched_compiled", "compiled")])
def test_the_recipe_on_the_training_rows_alone_gives_the_searched_model(
        search: str, kernels: str, request: pytest.FixtureRequest) -> None:
    """A refit differs from the searched model by its rows alone: trained as it on the
    training rows, with the kernels its worker ran (the trial's record says which), it
    is the kept model bit for bit."""
    _, storage = request.getfixturevalue(search)
    study = open_stored(storage, NAME)
    trial = choose_trial(study, None)
    recipe = Recipe.of(study, trial)
    assert recipe.kernels == kernels
    graph = rebuild(study.user_attrs[SPACE_ATTR], recipe.params,
                    StoredData.from_record(study.user_attrs["data"]))
    rows, _, _ = searched_rows(study)
    vm, _ = train(graph, recipe, rows.x, rows.y)
    _, artifact = find_model(study, trial.number)
    kept = read_model(study, artifact, trial.number)
    again = _weights(vm)
    assert kept.keys() == again.keys()
    assert all(np.array_equal(kept[k], again[k]) for k in kept)


def test_load_model_refit_loads_the_stored_refit_model(searched: tuple[Path, str]) -> None:
    _, storage = searched
    model = refit(storage, NAME)
    loaded = load_model(storage, NAME, refit=True)
    assert loaded.refit == model.refit and loaded.trial == model.trial
    a, b = _weights(model.vm), _weights(loaded.vm)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    test = _rows().test
    assert np.array_equal(loaded.logits(test.x), model.logits(test.x))
    other = 1 - model.trial
    with pytest.raises(ModelError, match=f"is trial {model.trial}'s, not trial {other}'s"):
        load_model(storage, NAME, trial=other, refit=True)


def test_refit_records_its_test_metrics_beside_the_searched_models(
        searched: tuple[Path, str]) -> None:
    _, storage = searched
    model = refit(storage, NAME)
    record = model.refit
    assert record is not None
    test = _rows().test
    assert "accuracy" in record["metrics"]
    assert record["metrics"] == pytest.approx(evaluate_split(model, test.x, test.y))
    kept = load_model(storage, NAME, trial=model.trial)
    assert record["searched_metrics"] == pytest.approx(evaluate_split(kept, test.x, test.y))


def test_a_study_without_a_refit_model_says_how_to_make_one(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    optuna.create_study(study_name="none", storage=storage)
    with pytest.raises(ModelError, match=r"has no refit model: run `explore refit SPACE`"):
        load_model(storage, "none", refit=True)


def test_refit_refuses_a_trial_it_cannot_refit(searched: tuple[Path, str],
                                               tmp_path: Path) -> None:
    space, _ = searched
    copy = tmp_path / "copy.db"
    with sqlite3.connect(space.with_suffix(".db")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)  # the write-ahead log's pages too
    storage = f"sqlite:///{copy}"
    study = optuna.load_study(study_name=NAME, storage=storage)
    study.add_trial(create_trial(state=TrialState.FAIL))
    failed = len(study.trials) - 1
    before = study.user_attrs.get(REFIT_ATTR)
    with pytest.raises(ModelError, match="has no trial 99; completed trials: 0, 1"):
        refit(storage, NAME, trial=99)
    with pytest.raises(ModelError, match=rf"trial {failed} of study .* failed: only a "
                                         "completed trial can be refit"):
        refit(storage, NAME, trial=failed)
    with pytest.raises(ModelError, match=r"not the one study .* was searched on .*features"):
        refit(storage, NAME, data=get("wine"))
    study.set_user_attr(SPACE_ATTR, {**study.user_attrs[SPACE_ATTR], "dataset": None})
    with pytest.raises(ModelError, match="data given from Python: pass the same data set"):
        refit(storage, NAME)
    assert study.user_attrs.get(REFIT_ATTR) == before  # nothing was stored


def test_a_study_of_several_objectives_needs_the_trial_named() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([0.9, 2.0], [0.8, 1.0]):
        study.add_trial(create_trial(values=values, params={"lr": 0.1},
                                     distributions={"lr": FloatDistribution(0.01, 1)}))
    with pytest.raises(ModelError, match="2 objectives, so no single best trial: name one "
                                         r"\(trial=N.*--trial N\); its Pareto front: "
                                         "trials 0, 1"):
        choose_trial(study, None)
    assert choose_trial(study, 1).number == 1


def test_explore_refit_prints_what_it_trained_and_both_models_metrics(
        searched: tuple[Path, str]) -> None:
    space, storage = searched
    r = CliRunner().invoke(main, ["refit", str(space)])
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name=NAME, storage=storage)
    record = study.user_attrs[REFIT_ATTR]
    data = _rows()
    rows = len(data.train) + len(data.valid)
    assert f"refit trial {study.best_trial.number} of study {NAME!r}: 3 rounds on " \
           f"{rows:,} rows ({len(data.train)} training + {len(data.valid)} validation)" \
           in r.output
    assert record["artifact"] in r.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in r.output.splitlines()
             if line.startswith("│")]
    table = {row[0]: row[1] for row in cells}
    assert table["refit"] == f"{record['metrics']['accuracy']:.4g}"
    assert table["searched"] == f"{record['searched_metrics']['accuracy']:.4g}"


def test_explore_refit_of_a_trial_the_search_did_not_keep(searched: tuple[Path, str]
                                                           ) -> None:
    space, storage = searched
    kept = optuna.load_study(study_name=NAME, storage=storage).best_trial.number
    r = CliRunner().invoke(main, ["refit", str(space), "--trial", str(1 - kept)])
    assert r.exit_code == 0, r.output
    assert f"the search kept no model of trial {1 - kept}" in r.output
    assert load_model(storage, NAME, refit=True).trial == 1 - kept


@pytest.mark.parametrize(("args", "said"), [
    (["--trial", "7"], "has no trial 7; completed trials: 0, 1"),
    (["--study", "nope"], "no study 'nope'"),
])
def test_explore_refit_exits_2_on_bad_input(searched: tuple[Path, str], args: list[str],
                                            said: str) -> None:
    space, _ = searched
    r = CliRunner().invoke(main, ["refit", str(space), *args])
    assert r.exit_code == 2
    assert said in " ".join(r.output.split())


def test_explore_refit_exits_2_for_another_data_set(searched: tuple[Path, str],
                                                    tmp_path: Path) -> None:
    _, storage = searched
    other = tmp_path / "wine.yaml"
    other.write_text(yaml.safe_dump({**SPACE, "dataset": {"name": "wine", "test": 0.2}}))
    r = CliRunner().invoke(main, ["refit", str(other), "--storage", storage,
                                  "--study", NAME])
    assert r.exit_code == 2
    assert "is not the one study 'refit-iris' was searched on" in " ".join(r.output.split())
