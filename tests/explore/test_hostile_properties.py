"""Property-based: a valid search space mutated one field at a time, or replaced by raw
garbage, is either accepted — and then its smallest candidate compiles — or refused with
located errors (file, line and key); nothing else escapes, and ``explore size`` on it
exits 0 or 2 without a traceback, within a bound."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explore.binding import bind
from explore.yamlio import SpaceError

VALID: dict[str, Any] = {
    "dataset": "digits",
    "objectives": [{"metric": "accuracy"}],
    "budget": {"trials": 2, "rounds": 1, "memory": "64MB", "workers": 1},
    "sampler": {"name": "tpe", "seed": 0},
    "pruner": {"name": "median", "warmup_rounds": 1},
    "model": {"family": "mlp", "depth": {"int": [1, 2]}, "width": {"int": [8, 32]},
              "activation": {"choice": ["relu", "tanh"]}, "dropout": 0.1},
    "training": {"optimizer": "adam", "lr": {"float": [1.0e-3, 1.0e-1], "log": True},
                 "batch_size": 32},
}


def paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested dict/list document."""
    out: list[tuple[Any, ...]] = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out += paths(v, (*prefix, k))
    return out


PATHS = paths(VALID)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["auto", "relu", "nope", "1e-3", "512MB", "-1", "0", "1e400", ".inf",
                     "0.5B", "100TB", "tpe", "mlp", "cnn", "sgd"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["int", "float", "choice", "log", "step", "when", "per_layer", "name", "x"]),
        inner, max_size=3)), max_leaves=6)


def mutate(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    node: Any = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def check_located(text: str) -> None:
    """Read ``text`` as a space file, as the CLI does: accepted (and its smallest
    candidate compiles or fails as a BuildError/BudgetError), or a SpaceError whose
    every item names the file and a line."""
    import tempfile

    from engine import BudgetError
    from explore.candidate import compile_candidate
    from explore.families import BuildError
    from explore.sampling import fixed
    from explore.space import load_space

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "s.yaml"
        f.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            space = load_space(f)
        except SpaceError as e:
            assert e.errors
            for item in e.errors:
                assert item.file.endswith("s.yaml") and item.line is not None and \
                    item.line >= 1, item
            return
    try:
        p = fixed(space)
        if p["batch_size"] == "auto":
            p["batch_size"] = 1
        compile_candidate(bind(space), p, 1 << 40)
    except (BuildError, BudgetError):
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), values)
def test_a_space_mutated_in_one_field_is_accepted_or_refused_with_its_location(
        path: tuple[Any, ...], value: Any) -> None:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        value = float(value)  # YAML writes them as .nan / .inf: a real hostile input
    check_located(dump(mutate(path, value)))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_raw_garbage_is_refused_with_a_location(text: str) -> None:
    try:
        check_located(text)
    except SpaceError:
        raise
    except Exception as e:  # pragma: no cover - the property's failure
        pytest.fail(f"{type(e).__name__}: {e}")


@pytest.mark.slow  # twelve `explore size` processes: CI's slow step
@settings(max_examples=12, deadline=None)
@given(st.sampled_from(PATHS), values)
def test_explore_size_on_a_mutated_space_exits_0_or_2_without_a_traceback(
        tmp_path_factory: pytest.TempPathFactory, path: tuple[Any, ...], value: Any) -> None:
    d = tmp_path_factory.mktemp("size")
    f = Path(d) / "s.yaml"
    f.write_text(dump(mutate(path, value)))
    r = subprocess.run([sys.executable, "-m", "explore.cli", "size", str(f), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 2), r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["s.yaml"]  # nothing written


OPTIONS = {
    "--trials": st.one_of(st.integers(-5, 3), st.sampled_from(["", "x", "1.5", "1e9", "true"])),
    "--workers": st.one_of(st.integers(-2, 3), st.sampled_from(["", "0", "300", "two"])),
    "--memory": st.sampled_from(["", "0", "-1MB", "0.5B", "1e400", ".inf", "nan", "64MB",
                                 "400MB", "1" * 40, "100TB", "4GiB", "12 parsecs"]),
    "--storage": st.sampled_from(["", " ", "garbage", "sqlite:///", "sqlite:////no/dir/x.db",
                                  "mysql://u@127.0.0.1:1/x", "nosuch://x", "journal:"]),
    "--study": st.sampled_from(["", " ", "a" * 300, "ok", "ü", "../x"]),
    "--device": st.sampled_from(["", "cpu", "gpu", "tpu"]),
}


@pytest.mark.slow  # 15 runs of explore: CI's slow step runs it
@settings(max_examples=15, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), min_size=1,
                       max_size=3).flatmap(lambda keys: st.fixed_dictionaries(
                           {k: OPTIONS[k] for k in keys})))
def test_explore_run_with_hostile_options_starts_or_exits_2_without_a_traceback(
        tmp_path_factory: pytest.TempPathFactory, options: dict[str, Any]) -> None:
    """Whatever the command line says, ``explore run`` either runs (exit 0) or refuses
    (exit 2, a message, no traceback) and then leaves nothing beside the space file."""
    d = tmp_path_factory.mktemp("run")
    f = Path(d) / "s.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 400MB}\n"
                 "model: {depth: 1, width: 8}\ntraining: {batch_size: 64}\nkeep_models: 0\n")
    args = [x for k, v in options.items() for x in (k, str(v))]
    r = subprocess.run([sys.executable, "-m", "explore.cli", "run", str(f), *args, "--quiet"],
                       capture_output=True, text=True, timeout=180, cwd=d)
    assert r.returncode in (0, 2), (args, r.stdout + r.stderr)
    assert "Traceback" not in r.stderr, (args, r.stderr)
    if r.returncode == 2:
        assert r.stderr.strip(), args
        assert sorted(p.name for p in d.iterdir()) == ["s.yaml"], (args, list(d.iterdir()))
