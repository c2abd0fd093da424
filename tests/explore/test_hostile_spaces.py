"""Hostile or mistaken spaces: each is refused at validation with its file, line and
key (exit status 2 from the CLI), never a traceback, a hang or a runaway allocation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from explore.candidate import halvings
from explore.space import load_space, parse_size
from explore.yamlio import MAX_BYTES, MAX_DEPTH, MAX_NODES, SpaceError, load_text
from tests.explore.cli_run import explore_here

ROOT = Path(__file__).resolve().parents[2]
BASE = """\
dataset: digits
budget: {trials: 2, rounds: 1, memory: 64MB}
model:
  depth: 1
  width: 8
training:
  optimizer: adam
  lr: 0.01
  batch_size: 32
"""


def _space(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    return f


def _refused(tmp_path: Path, text: str, key: str, match: str) -> str:
    """The one error's text; it names the key, the line the key is on, and ``match``."""
    f = _space(tmp_path, text)
    with pytest.raises(SpaceError) as e:
        load_space(f)
    hits = [x for x in e.value.errors if x.key == key or x.key.startswith(key + ".")]
    assert hits, [str(x) for x in e.value.errors]
    line = next(i + 1 for i, t in enumerate(text.splitlines())
                if t.strip().startswith(key.split(".")[-1] + ":"))
    assert hits[0].line == line, str(hits[0])
    assert match in hits[0].message, str(hits[0])
    return str(hits[0])


def _with(section_key: str, value: str) -> str:
    """BASE with ``model.x`` or ``training.x`` (or ``budget.x``) set to ``value``."""
    section, key = section_key.split(".")
    lines = BASE.splitlines()
    if section == "budget":
        lines[1] = "budget:\n  trials: 2\n  rounds: 1\n  memory: 64MB"
        lines[1] = "\n".join(x for x in lines[1].splitlines() if not x.strip().startswith(
            key + ":")) + f"\n  {key}: {value}"
        return "\n".join(lines) + "\n"
    at = lines.index(f"{section}:")
    kept = [x for x in lines if not (x.startswith("  ") and x.strip().startswith(key + ":")
                                     and lines.index(x) > at)]
    at = kept.index(f"{section}:")
    kept.insert(at + 1, f"  {key}: {value}")
    return "\n".join(kept) + "\n"


# -- class 1: hangs and runaway sizes --------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "match"), [
    ("training.batch_size", "-1", "[1, 1,048,576]"),
    ("training.batch_size", "0", "[1, 1,048,576]"),
    ("training.batch_size", "2000000", "[1, 1,048,576]"),
    ("model.depth", "100000", "outside [0, 64]"),
    ("model.blocks", "1000", "outside [0, 64]"),
    ("model.width", "100000000000000000000", "outside [1, 1,048,576]"),
    ("model.width", "{int: [8, 2000000]}", "outside [1, 1,048,576]"),
    ("model.channels", "2000000", "outside [1, 1,048,576]"),
    ("budget.trials", "10000000000", "less than or equal to 1000000"),
    ("budget.rounds", "10000000", "less than or equal to 100000"),
])
def test_caps(tmp_path: Path, key: str, value: str, match: str) -> None:
    _refused(tmp_path, _with(key, value), key, match)


def test_halvings_refuses_a_batch_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        halvings(512, 0)
    with pytest.raises(ValueError, match="at least 1"):
        halvings(512, -1)


def test_a_file_too_big_too_deep_or_too_long_says_which_limit(tmp_path: Path) -> None:
    big = _space(tmp_path, "a: 1\n" + "#" * MAX_BYTES)
    with pytest.raises(SpaceError, match="bytes, more than"):
        load_space(big)
    with pytest.raises(SpaceError, match=f"nested more than {MAX_DEPTH} levels"):
        load_text("a: " + "[" * 500 + "]" * 500)
    with pytest.raises(SpaceError, match=f"nested more than {MAX_DEPTH} levels"):
        load_text("a: " + "{b: " * 100 + "1" + "}" * 100)
    with pytest.raises(SpaceError) as e:
        load_text("a: [" + ", ".join(["1"] * (MAX_NODES + 1)) + "]")
    assert f"more than {MAX_NODES:,} values" in str(e.value)
    assert "alias" not in str(e.value)
    with pytest.raises(SpaceError, match="4300 digits"):
        load_text("a: " + "9" * 5000)


# -- class 2: values that would crash later ----------------------------------------------------

@pytest.mark.parametrize(("key", "value", "match"), [
    ("model.dropout", "1.0", "outside [0, 1)"),
    ("model.dropout", "-0.1", "outside [0, 1)"),
    ("model.dropout", "{float: [0.0, 1.5]}", "outside [0, 1)"),
    ("training.lr", ".nan", "finite"),
    ("training.lr", "{float: [1.0e-4, .inf], log: true}", "finite"),
    ("training.lr", "fast", "a number, not 'fast'"),
    ("model.width", "1.0e308", "an integer"),
    ("model.width", "'16'", "an integer"),
    ("budget.memory", ".inf", "finite"),
    ("budget.memory", "1" * 400, "more than 1 PB"),
    ("budget.memory", "2000TB", "more than 1 PB"),
    ("budget.memory", "0.5B", "less than one byte"),
    ("budget.memory", "900TB", "more than this machine has"),
])
def test_values_that_would_crash(tmp_path: Path, key: str, value: str, match: str) -> None:
    _refused(tmp_path, _with(key, value), key, match)


def test_parse_size_limits() -> None:
    for bad in (float("inf"), float("nan"), "1" * 400, 10**400, "0.5B", "0", True):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_size("1.5GB") == 1_500_000_000


# -- class 3: semantic errors ------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "match"), [
    ("training.optimizer", "adamm", "known: sgd, adam"),
    ("training.optimizer", "{choice: [sgd, nesterov]}", "choice 1: unknown optimizer"),
    ("model.activation", "gelu", "known: relu, tanh"),
    ("model.init", "glorot", "known: xavier_uniform"),
    ("training.loss", "hinge", "known: auto, cross_entropy, mse"),
    ("model.kernel", "4", "even"),
    ("model.width", "0", "outside [1, 1,048,576]"),
    ("model.width", "-8", "outside [1, 1,048,576]"),
    ("model.depth", "-1", "outside [0, 64]"),
    ("training.lr", "0", "outside (0, 3.40282e+38]"),
    ("training.lr", "-0.1", "outside (0, 3.40282e+38]"),
    ("training.momentum", "1.0", "outside [0, 1)"),
    ("training.momentum", "-0.5", "outside [0, 1)"),
    ("training.weight_decay", "-1.0e-4", "outside [0, 3.40282e+38]"),
    ("model.pool", "'yes'", "true or false"),
])
def test_semantic_errors(tmp_path: Path, key: str, value: str, match: str) -> None:
    _refused(tmp_path, _with(key, value), key, match)


# -- class 4: silent coercion -------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "match"), [
    ("budget.trials", "true", "integer"),
    ("model.depth", "2.7", "an integer, not 2.7"),
    ("model.width", "16.7", "an integer, not 16.7"),
    ("model.depth", "{float: [1, 3]}", "use int"),
    ("model.width", "{int: [16, 100], step: 32}", "does not divide"),
    ("training.lr", "{float: [0.1, 0.5], step: 0.3}", "does not divide"),
    ("training.lr", "{float: [0.001, 0.01], step: 1.0e-300}", "more than 1,000,000,000"),
    ("training.lr", "1.0e+300", "outside (0, 3.40282e+38]"),
    ("training.weight_decay", "{float: [0, 1.0e+39]}", "outside [0, 3.40282e+38]"),
])
def test_no_silent_coercion(tmp_path: Path, key: str, value: str, match: str) -> None:
    _refused(tmp_path, _with(key, value), key, match)


def test_an_empty_condition_and_an_objective_twice_are_refused(tmp_path: Path) -> None:
    """``when: {}`` asks for nothing (the parameter would be asked always, not as the
    user meant), and a metric twice only weighs one objective double."""
    _refused(tmp_path, _with("training.momentum", "{float: [0.1, 0.9], when: {}}"),
             "training.momentum", "an empty condition")
    f = _space(tmp_path, BASE + "objectives:\n  - {metric: loss}\n  - {metric: loss}\n")
    with pytest.raises(SpaceError) as e:
        load_space(f)
    assert [str(x) for x in e.value.errors] == [
        f"{f}:12: objectives[1].metric: 'loss' (minimize) is objective 0 already; an objective "
        "is given once"]


@pytest.mark.parametrize(("section", "key", "value", "match"), [
    ("dataset", "train", "true", "integer"),
    ("dataset", "train", "2.0", "integer"),
    ("dataset", "train", "'5'", "integer"),
    ("dataset", "valid", "true", "a row count, a fraction or a file, not True"),
    ("dataset", "test", "[0.1]", "a fraction or a file"),
    ("dataset", "seed", "1.0", "integer"),
    ("sampler", "seed", "true", "integer"),
    ("sampler", "startup_trials", "2.0", "integer"),
    ("pruner", "warmup_rounds", "true", "integer"),
    ("pruner", "pause", "yes", "true or false, not 'yes'"),
    ("pruner", "pause", "1", "true or false, not 1"),
    ("keep_models", "", "true", "integer"),
    ("keep_models", "", "2.0", "integer"),
    ("sampler", "seed", "-1", "greater than or equal to 0"),
    ("sampler", "seed", "4294967296", "less than or equal to 4294967295"),
    ("dataset", "seed", "-1", "greater than or equal to 0"),
    ("name", "", '"\\ud800"', "cannot be written as UTF-8"),
    ("name", "", '"a\\x00b"', "control character"),
    ("name", "", '"   "', "a study name is not blank"),
])
def test_no_silent_coercion_in_any_section(tmp_path: Path, section: str, key: str, value: str,
                                           match: str) -> None:
    """Every integer and flag of the schema is as strict as the searched ones."""
    if not key:  # a top-level key
        _refused(tmp_path, BASE + f"{section}: {value}\n", section, match)
        return
    head = {"dataset": "  name: digits\n", "sampler": "  name: tpe\n",
            "pruner": "  name: median\n"}[section]
    base = BASE.replace("dataset: digits\n", "") if section == "dataset" else BASE
    text = base + f"{section}:\n{head}  {key}: {value}\n"
    _refused(tmp_path, text, f"{section}.{key}", match)


def test_a_study_name_is_at_most_512_characters(tmp_path: Path) -> None:
    """PostgreSQL's column, held on every storage; a longer name is too long to quote
    back."""
    assert load_space(_space(tmp_path, BASE + "name: " + "n" * 512 + "\n")).name == "n" * 512
    said = _refused(tmp_path, BASE + "name: " + "n" * 513 + "\n", "name",
                    "a study name is at most 512 characters, and this one has 513")
    assert "n" * 513 not in said


def test_a_cross_field_error_is_on_its_line(tmp_path: Path) -> None:
    text = _with("training.momentum", "{float: [0.0, 0.9], when: {optimiser: sgd}}")
    with pytest.raises(SpaceError) as e:
        load_space(_space(tmp_path, text))
    [err] = e.value.errors
    assert err.key == "training.momentum.when.optimiser"
    assert err.line == text.splitlines().index(
        "  momentum: {float: [0.0, 0.9], when: {optimiser: sgd}}") + 1
    assert "not a parameter" in err.message


# -- class 5: YAML 1.2 numbers ---------------------------------------------------------------

def test_yaml_12_floats_are_numbers(tmp_path: Path) -> None:
    text = _with("training.lr", "{float: [1e-4, 1.0e-1], log: true}")
    space = load_space(_space(tmp_path, text))
    assert space.training.lr.bounds == (1e-4, 0.1)
    assert load_text("a: 1e3\nb: '1e3'\nc: 7\n").data == {"a": 1000.0, "b": "1e3", "c": 7}


def test_yaml_12_integers_only() -> None:
    """1.1's integer forms are strings (1_0 was 10, 1:30 was 90, 010 was 8): refused
    where a number belongs, on their line; 0o and 0x are 1.2's octal and hex."""
    got = load_text("a: 1_0\nb: 1:30\nc: 010\nd: 0o17\ne: 0x1F\nf: 0b11\ng: 1_0.5\n").data
    assert got == {"a": "1_0", "b": "1:30", "c": 10, "d": 15, "e": 31, "f": "0b11",
                   "g": "1_0.5"}
    for tagged in ("!!int 1_0", "!!float 1:30.5"):
        with pytest.raises(SpaceError) as e:
            load_text(f"x: 1\ny: {tagged}\n")
        [err] = e.value.errors
        assert err.line == 2 and "YAML 1.2" in err.message


@pytest.mark.parametrize("value", ["1_0", "1:30"])
def test_a_yaml_11_integer_is_refused_where_a_number_belongs(tmp_path: Path,
                                                              value: str) -> None:
    _refused(tmp_path, _with("model.width", value), "model.width", f"not '{value}'")


def test_yaml_12_booleans_and_no_dates() -> None:
    """Only true and false are booleans (1.1's yes, no, on, off are strings), dates are
    strings, and an explicit tag that makes anything else is refused on its line."""
    got = load_text("a: yes\nb: [no, se]\nc: True\nd: false\ne: 2001-01-01\n").data
    assert got == {"a": "yes", "b": ["no", "se"], "c": True, "d": False, "e": "2001-01-01"}
    for tag in ("!!binary aGVsbG8=", "!!timestamp 2001-01-01", "!mine 3"):
        with pytest.raises(SpaceError) as e:
            load_text(f"x: 1\ny: {tag}\n")
        [err] = e.value.errors
        assert err.line == 2 and err.key == "y" and "not allowed" in err.message


# -- the command line ------------------------------------------------------------------------

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "explore.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def test_cli_refuses_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    good = _space(tmp_path, BASE)
    r = _cli("size", str(good), "--params", "batch_size=-1", cwd=tmp_path)
    assert r.returncode == 2 and "batch_size" in r.stderr and "Traceback" not in r.stderr
    r = _cli("size", str(good), "--params", "depth=2.7", cwd=tmp_path)
    assert r.returncode == 2 and "an integer" in r.stderr and "Traceback" not in r.stderr
    for opt in ("--storage", "--study"):
        r = _cli("run", str(good), opt, "", "--quiet", cwd=tmp_path)
        assert r.returncode == 2 and "is empty" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", str(good), "--memory", "1" * 400, "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "1 PB" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(_with("model.kernel", "4"))
    r = _cli("run", str(bad), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "bad.yaml:" in r.stderr and "model.kernel" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "s.yaml"]


def test_budget_overrides_are_checked_as_the_files_values_are(tmp_path: Path) -> None:
    """--memory beyond the machine's memory and swap, and --trials beyond the cap, are
    refused from the command line too, before anything is written."""
    good = _space(tmp_path, BASE)
    r = _cli("run", str(good), "--memory", "900TB", "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "--memory" in r.stderr and "more than this machine has" \
        in r.stderr, r.stderr
    r = _cli("run", str(good), "--trials", "2000000", "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "--trials" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("sampler", ["sampler: cmaes", "sampler: {name: cmaes, seed: 1}"])
def test_a_samplers_own_rule_is_reported_on_the_samplers_line(tmp_path: Path,
                                                               sampler: str) -> None:
    f = _space(tmp_path, "dataset: digits\nobjectives: [{metric: accuracy}, "
               "{metric: planned_bytes}]\nbudget: {trials: 2, rounds: 1, memory: 64MB}\n"
               f"{sampler}\n")
    with pytest.raises(SpaceError) as e:
        load_space(f)
    (err,) = e.value.errors
    assert (err.line, err.key) == (4, "sampler.name") and "one objective" in err.message


def test_a_when_value_no_trial_can_have_is_refused_on_its_line(tmp_path: Path) -> None:
    """A typo in ``when`` would silently never ask for the parameter."""
    for cond, ok in (("sgdd", False), ("sgd", True), ("[adam, sgdd]", True)):
        f = _space(tmp_path, "dataset: digits\nbudget: {trials: 2, rounds: 1, memory: 64MB}\n"
                   "training:\n  optimizer: {choice: [adam, sgd]}\n"
                   f"  momentum: {{float: [0.5, 0.9], when: {{optimizer: {cond}}}}}\n")
        if ok:
            load_space(f)
            continue
        with pytest.raises(SpaceError) as e:
            load_space(f)
        (err,) = e.value.errors
        assert (err.line, err.key) == (5, "training.momentum.when.optimizer")
        assert "never a value of optimizer" in err.message


def test_a_gpu_budget_above_the_gpus_memory_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a CPU budget is held to the machine's memory, a GPU budget is held to the
    device's (a 1 GiB device stands in for the real one here)."""
    import engine.runtime.backends as backends
    from explore.runner import RunRefused, prepare

    monkeypatch.setattr(backends, "gpu_available", lambda: True)
    monkeypatch.setattr(backends, "gpu_count", lambda: 1)
    monkeypatch.setattr(backends, "gpu_memory_bytes", lambda device=0: 1 << 30)
    f = _space(tmp_path, BASE.replace("memory: 64MB", "memory: 2GB, device: gpu"))
    db = tmp_path / "s.db"
    with pytest.raises(RunRefused, match=r"budget.memory: 2,000,000,000 bytes is more than "
                                         r"GPU 0 has \(1,073,741,824 bytes\)"):
        prepare(f, storage=f"sqlite:///{db}")
    assert not db.exists()
    prepare(f, storage=f"sqlite:///{db}", memory="512MB")  # within the device: accepted


# -- conditional parameters ------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "match"), [
    ("training.batch_size", "{int: [8, 16], when: {optimizer: sgd}}", "every trial needs"),
    ("training.lr", "{float: [0.01, 0.1], when: {optimizer: sgd}}", "every trial needs"),
    ("model.width", "{int: [8, 16], when: {activation: relu}}", "every trial needs"),
    ("model.depth", "{int: [1, 2], when: {optimizer: sgd}}", "every trial needs"),
    ("model.width", "{int: [8, 16], when: {width: 8}}", "itself"),
    ("training.momentum", "{float: [0.5, 0.9], when: {momentum: 0.5}}", "itself"),
])
def test_a_when_on_a_parameter_every_trial_needs_or_on_itself_is_refused(
        tmp_path: Path, key: str, value: str, match: str) -> None:
    """A trial that did not ask for lr would have none (a TypeError in some trial
    later): only parameters that are off when not asked (momentum, weight_decay,
    dropout, loss) may be conditional."""
    text = _with(key, value).replace("optimizer: adam", "optimizer: {choice: [adam, sgd]}")
    text = text.replace("  width: 8\n", "  width: 8\n  activation: {choice: [relu, tanh]}\n") \
        if "activation" in value else text
    _refused(tmp_path, text, key, match)


def test_a_circular_when_is_refused_on_its_line(tmp_path: Path) -> None:
    text = (BASE + "  momentum: {float: [0.5, 0.9], when: {weight_decay: 0.1}}\n"
            "  weight_decay: {choice: [0.0, 0.1], when: {momentum: 0.5}}\n")
    _refused(tmp_path, text, "training.momentum", "circular")


def test_a_when_may_name_a_parameter_asked_later(tmp_path: Path) -> None:
    """dropout (a model parameter) on the optimizer (a training one): asked after it,
    and off (0.0 on every layer) when it does not match."""
    import optuna

    from explore.sampling import fixed, suggest

    text = (BASE.replace("optimizer: adam", "optimizer: {choice: [sgd, adam]}")
            .replace("  width: 8\n", "  width: 8\n  dropout: {float: [0.1, 0.2], "
                     "when: {optimizer: adam}}\n"))
    space = load_space(_space(tmp_path, text))
    assert fixed(space)["dropouts"] == [0.0]  # sgd: the first choice
    for opt, want in (("adam", [0.15]), ("sgd", [0.0])):
        p = suggest(optuna.trial.FixedTrial({"optimizer": opt, "dropout": 0.15}), space)
        assert p["dropouts"] == want and p["optimizer"] == opt


def test_a_conditional_required_parameter_is_refused_by_theexplore_here(tmp_path: Path) -> None:
    text = _with("training.batch_size", "{int: [8, 16], when: {optimizer: sgd}}").replace(
        "optimizer: adam", "optimizer: {choice: [adam, sgd]}")
    f = _space(tmp_path, text)
    for cmd in ("size", "run"):
        r = explore_here(cmd, str(f), cwd=tmp_path)
        assert r.returncode == 2 and "training.batch_size.when" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# -- the artifact store -------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/proc/nope", "s.yaml", "s.yaml/models", "/proc"])
def test_an_artifacts_folder_that_cannot_be_made_is_refused_at_its_line(
        tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_models with artifacts: a file, or a folder under /proc: refused when the
    space is read, not by a mkdir after the study is written."""
    monkeypatch.chdir(tmp_path)
    _refused(tmp_path, BASE + f"keep_models: 1\nartifacts: {where}\n", "artifacts",
             "name a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]
    # nothing kept: the folder is not used
    load_space(_space(tmp_path, BASE + f"keep_models: 0\nartifacts: {where}\n"))


def test_the_default_artifacts_folder_is_checked_before_the_study(tmp_path: Path) -> None:
    f = _space(tmp_path, BASE + "keep_models: 1\n")
    (tmp_path / "s.artifacts").write_text("a file where the folder goes")
    r = explore_here("run", str(f), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "s.artifacts is not a directory" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.artifacts", "s.yaml"]


# -- explore size --params --------------------------------------------------------------------

@pytest.mark.parametrize(("given", "says"), [
    ("depth=[1,2]", "depth takes one value, not a list"),
    ("lr=[0.01]", "lr takes one value, not a list"),
    ("depth=64", "depth=64 is not a value the space searches: depth is in [1, 3]"),
    ("lr=1", "lr is in [0.001, 0.1]"),
    ("batch_size=17", "batch_size is one of [16, 32]"),
    ("width=[8,100]", "width=100 is not a value the space searches"),
    ("width_0=8", "give per-layer values as one list, width=[first,second,...]"),
    ("width=[8,16]", "give depth=2 too"),
    ("width=[8", "'[8' is not a list"),
    ("width=[8]]]", "is not a list"),
    ("width=[[8]]", "is not a list"),
    ("width=[8,16,", "is not a list"),
    ("optimizer=sgd", "the space fixes optimizer at 'adam'"),
    ("momentum=0.5", "the space fixes momentum at 0.0"),
])
def test_size_params_outside_the_space_are_refused_naming_the_range(
        tmp_path: Path, given: str, says: str) -> None:
    f = _space(tmp_path, "dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 64MB}\n"
               "model: {depth: {int: [1, 3]}, width: {int: [8, 64], per_layer: true}}\n"
               "training: {batch_size: {choice: [16, 32]}, "
               "lr: {float: [0.001, 0.1], log: true}}\n")
    r = explore_here("size", str(f), "--params", given, "--json", cwd=tmp_path)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and says in said and "--params" in said, said
    assert "Traceback" not in said
    ok = explore_here("size", str(f), "--params", "depth=2", "--params", "width=[8,64]",
                      "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    named = explore_here("size", str(f), "--params", "optimizer=Adam", "--json", cwd=tmp_path)
    assert named.returncode == 0, named.stderr  # a name in any case, as the schema reads it
    twice = explore_here("size", str(f), "--params", "depth=2", "--params", "depth=1",
                         cwd=tmp_path)
    assert twice.returncode == 2 and "--params depth is given twice" in twice.stderr


@pytest.mark.parametrize("seed", ["-3", "4294967296", "99999999999999999999"])
def test_a_budget_seed_outside_32_bits_is_refused_by_run_and_size(tmp_path: Path,
                                                                   seed: str) -> None:
    """Optuna's samplers take the seed into numpy's RandomState: one outside [0, 2**32)
    failed after the study was written."""
    f = _space(tmp_path, _with("budget.seed", seed))
    for cmd in ("size", "run"):
        r = explore_here(cmd, str(f), cwd=tmp_path)
        assert r.returncode == 2 and "budget.seed" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize(("model", "count"), [
    ("{depth: 1, width: {int: [1, 1048576]}}", "1,048,576 points"),
    ("{depth: {int: [1, 64]}, width: {int: [1, 1048576], per_layer: true}}",
     "about 10^387 points"),
])
def test_a_grid_too_big_to_list_is_refused_with_its_count_at_once(
        tmp_path: Path, model: str, count: str) -> None:
    """Optuna's grid lists every point; the count is a product, never a listing."""
    import time

    text = BASE.replace("model:\n  depth: 1\n  width: 8\n", f"model: {model}\n") + \
        "sampler: grid\n"
    t0 = time.monotonic()
    with pytest.raises(SpaceError) as e:
        load_space(_space(tmp_path, text))
    assert time.monotonic() - t0 < 5
    [err] = e.value.errors
    assert err.key == "sampler.name" and err.line == text.splitlines().index(
        "sampler: grid") + 1 and count in err.message, str(err)
    small = BASE.replace("  width: 8\n", "  width: {int: [1, 1000]}\n") + "sampler: grid\n"
    load_space(_space(tmp_path, small))
