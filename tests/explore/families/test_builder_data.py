"""A model builder knows the data: ``build(trial, data)`` gets a :class:`DataInfo`
(features, classes, input shape, task, a table's names), ``build(trial)`` still works
(decided by the signature), and a model whose outputs do not fit the data's classes
fails its trial when traced, naming the builder and both numbers, before any worker
trains it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from click.testing import CliRunner

from engine import nn
from explore.binding import bind
from explore.candidate import BUILDER_PARAMS, compile_candidate, graph_of
from explore.cli import main
from explore.datasets import Digits, from_python
from explore.families import DataInfo, OutputMismatch, Shape, get
from explore.families.builder import (
    LowTrial,
    builder_name,
    call_builder,
    check_outputs,
    graph_of_model,
    spec_of,
    takes_data,
)
from explore.sampling import fixed
from explore.space import parse_space
from explore.study import RECORD_ATTR
from tests.explore.cli_run import explore_run

DIGITS = Shape(64, 10, image=(1, 8, 8), pixel_scale=1 / 16)


# -- the data's facts --------------------------------------------------------------------
def test_the_facts_of_a_built_in_image_set() -> None:
    info = DataInfo.of(Digits())
    assert (info.task, info.n_features, info.n_classes, info.n_outputs) == \
        ("classification", 64, 10, 10)
    assert info.input_shape == (1, 8, 8)
    assert info.feature_names is None and info.class_labels is None
    with pytest.raises(AttributeError):  # frozen: a builder cannot change what others see
        info.n_classes = 3  # type: ignore[misc]


def test_the_facts_of_a_table_after_its_preprocessing() -> None:
    """A categorical column becomes one feature per category: ``n_features`` is the
    model's input width, not the table's column count."""
    frame = pd.DataFrame({"age": [20.0, 30, 40, 50] * 10, "plan": ["a", "b", "c", "a"] * 10,
                          "y": ["no", "yes", "maybe", "no"] * 10})
    info = DataInfo.of(from_python(frame, target="y", categorical=["plan"]))
    assert info.n_features == 4 and info.input_shape == (4,)
    assert info.feature_names == ("age", "plan=a", "plan=b", "plan=c")
    assert info.n_classes == 3 and sorted(info.class_labels or ()) == ["maybe", "no", "yes"]
    reg = DataInfo.of(from_python(frame.assign(y=frame["age"] * 2.0).drop(columns="plan"),
                                  target="y", task="regression"))
    assert (reg.task, reg.n_classes, reg.n_outputs, reg.n_features) == ("regression", None, 1, 1)


# -- one argument or two, by the signature ------------------------------------------------
def _two(trial: Any, data: Any) -> Any:
    return data


def _one(trial: Any, width: int = 8) -> Any:
    return width


class _Nets:
    def build(self, trial: Any, data: Any) -> Any:
        return data

    def __call__(self, trial: Any) -> Any:
        return "called"


def _wrapped(fn: Any) -> Any:
    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return inner


@pytest.mark.parametrize(("fn", "how"), [
    (_two, "positional"),
    (lambda trial, info: info, "positional"),  # any name for the second parameter
    (_one, None),  # a default: a parameter of the user's own, not the data
    (lambda trial, data=None: data, "positional"),  # named data: the data, default or not
    (lambda trial, *, data: data, "keyword"),
    (lambda trial, *, data=None: data, None),  # optional and by keyword: left alone
    (functools.partial(_two, data="mine"), None),  # the user bound it already
    (functools.partial(lambda scale, trial, data: data, 2), "positional"),
    (_Nets().build, "positional"),  # a bound method, without self
    (_Nets(), None),  # a callable object: its __call__
    (lambda *args: args, None),  # says nothing: the one-argument contract
    (_wrapped(_two), "positional"),  # read through functools.wraps
    (print, None),
])
def test_whether_a_builder_takes_the_data_is_read_from_its_signature(fn: Any,
                                                                     how: str | None) -> None:
    assert takes_data(fn) == how


def test_call_builder_gives_the_data_to_a_builder_that_takes_it() -> None:
    got = call_builder(_two, LowTrial(), DIGITS)
    assert isinstance(got, DataInfo) and got.n_features == 64 and got.input_shape == (1, 8, 8)
    assert call_builder(lambda trial, *, data: data.n_classes, LowTrial(), DIGITS) == 10
    assert call_builder(_one, LowTrial(), DIGITS) == 8  # its own default, not the data
    assert call_builder(_Nets(), LowTrial(), DIGITS) == "called"


def test_spec_of_names_only_what_the_name_gives_back() -> None:
    """A partial, a bound method or a callable object recorded by a name that imports
    something else would rebuild another model (or fail confusingly) later."""
    assert spec_of(_two) == f"{__name__}:_two"
    for fn in (functools.partial(_two, data=1), _Nets().build, _Nets(), lambda t: t):
        assert spec_of(fn) is None, fn


def test_builder_name_says_which_function_and_where_it_is_defined() -> None:
    line = _two.__code__.co_firstlineno
    here = Path(__file__).resolve()
    for fn in (_two, functools.partial(_two, data=1), _wrapped(_two)):
        name = builder_name(fn)
        assert name.startswith(f"{__name__}:_two (") and name.endswith(f":{line})"), name
        assert Path(name.split(" (", 1)[1].rsplit(":", 1)[0]).resolve() == here
    assert builder_name(_Nets()).startswith(f"{__name__}:_Nets.__call__ (")


# -- outputs that do not fit the data ------------------------------------------------------
def _linear(k: int) -> Any:
    def build(trial: Any, data: Any) -> Any:
        return nn.Linear(data.n_features, k)
    return build


@pytest.mark.parametrize(("shape", "outputs", "got", "want", "says"), [
    (Shape(64, 10), 5, 5, 10, "gives 5 outputs per row, but the data set has 10 classes"),
    (Shape(4, 3), 1, 1, 3, "gives 1 output per row, but the data set has 3 classes"),
    # a loss-side TraceError would come first; the mismatch is said as such instead
    (Shape(4, 2), 1, 1, 2, "gives 1 output per row, but the data set has 2 classes"),
    (Shape(4, 0, task="regression"), 3, 3, 1,
     "gives 3 outputs per row, but a regression predicts 1 value per row"),
])
def test_a_model_whose_outputs_do_not_fit_the_data_is_caught_when_traced(
        shape: Shape, outputs: int, got: int, want: int, says: str) -> None:
    build = _linear(outputs)
    with pytest.raises(OutputMismatch) as e:
        graph_of_model(call_builder(build, LowTrial(), shape), shape, {}, builder=build)
    assert (e.value.got, e.value.want) == (got, want)
    message = str(e.value)
    assert says in message, message
    assert f"{__name__}:_linear.<locals>.build (" in message  # the builder, by name
    assert f"test_builder_data.py:{build.__code__.co_firstlineno})" in message  # and line
    assert "data.n_outputs" in message


@pytest.mark.parametrize("out", [(1,), ()])
def test_a_regression_may_give_one_value_as_a_column_or_flat(out: tuple[int, ...]) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, x: Any) -> Any:
            y = self.fc(x)
            return y if out else y.reshape(-1)

    shape = Shape(4, 0, task="regression")
    assert "logits" in graph_of_model(Net(), shape, {}).variables


def test_a_calcgraph_of_other_classes_from_a_builder_is_caught_too() -> None:
    """A builder may return a CalcGraph (a family's, here): its logits are checked."""
    g = get("mlp").build({"depth": 0, "widths": [], "activations": [], "dropouts": [],
                          "init": "he_uniform"}, Shape(64, 3))
    check_outputs(g, Shape(64, 3))
    with pytest.raises(OutputMismatch, match="gives 3 outputs per row, but the data set "
                                             "has 10 classes"):
        graph_of_model(g, DIGITS, {})


def test_graph_of_a_bound_space_passes_the_data_and_compiles() -> None:
    def build(trial: Any, data: Any) -> Any:
        width = trial.suggest_int("width", 4, 32)
        return nn.Sequential(nn.Linear(data.n_features, width), nn.ReLU(),
                             nn.Linear(width, data.n_outputs))

    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"}})
    bound = bind(space, builder=build)
    params = fixed(space)
    cand = compile_candidate(bound, params, share=1 << 30)
    assert params[BUILDER_PARAMS] == {"width": 4} and cand.program.total_bytes > 0
    with pytest.raises(OutputMismatch, match="10 classes"):
        graph_of(bind(space, builder=_linear(7)), fixed(space))


# -- end to end: the trial fails before it trains, the run goes on ------------------------
NETS = '''
from engine import nn


def build(trial, data):
    width = trial.suggest_int("width", 4, 8)
    # "five": 5 outputs for the data's 10 classes (the smallest candidate fits)
    head = trial.suggest_categorical("head", ["fits", "five"])
    out = data.n_outputs if head == "fits" else 5
    return nn.Sequential(nn.Linear(data.n_features, width), nn.ReLU(), nn.Linear(width, out))


def five(trial):
    return nn.Linear(64, 5)
'''


@pytest.fixture
def nets(tmp_path: Path) -> Any:
    (tmp_path / "data_nets.py").write_text(NETS)
    yield tmp_path
    sys.modules.pop("data_nets", None)


def test_a_mismatched_trial_fails_with_its_reason_before_any_worker_trains(nets: Path) -> None:
    f = nets / "m.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 4, rounds: 1, memory: 400MB}\n"
                 "sampler: {name: random, seed: 0}\npruner: none\n"
                 "model: {builder: 'data_nets:build'}\n"
                 "training: {lr: 0.02, batch_size: 32}\nkeep_models: 0\n")
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="m", storage=f"sqlite:///{nets / 'm.db'}")
    heads = sorted(t.params["head"] for t in study.trials)
    assert len(heads) == 4 and "fits" in heads and "five" in heads  # (the seed's draw)
    for t in study.trials:
        record = t.user_attrs[RECORD_ATTR]
        if t.params["head"] == "fits":
            assert t.state.name == "COMPLETE", record
            continue
        assert t.state.name == "FAIL"
        reason = record["fail_reason"]
        assert "data_nets:build (" in reason and "data_nets.py:5)" in reason, reason
        assert "gives 5 outputs per row, but the data set has 10 classes" in reason
        assert "worker" not in record  # never placed: no worker saw it


def test_explore_size_says_the_mismatch(nets: Path) -> None:
    f = nets / "s.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 400MB}\n"
                 "model: {builder: 'data_nets:five'}\n")
    r = CliRunner().invoke(main, ["size", str(f)])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert "data_nets:five (" in text and "gives 5 outputs per row" in text, text
