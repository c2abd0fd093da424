"""bench/peers.py: the peers train what explore trains, the answer is computed from the
runs as its docstring says, and a smoke run of every side answers in the issue's shape.
No wall-time thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from bench import peers
from explore.binding import bind
from explore.candidate import graph_of
from explore.sampling import suggest
from explore.space import load_space

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("search", sorted(peers.SEARCHES))
def test_the_torch_networks_have_explores_parameters(search: str) -> None:
    """For candidates drawn at random from each search's space, the PyTorch network has
    the trainable parameters of explore's graph, shape for shape, and the same output."""
    torch = pytest.importorskip("torch")
    from bench import _torch_models as tm

    space = load_space(ROOT / "search_spaces" / peers.SEARCHES[search])
    data = bind(space).data
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(12):
        params = suggest(study.ask(), space)
        graph = graph_of(bind(space), dict(params))
        ours = sorted(v.desc.shape for v in graph.variables.values()
                      if v.kind.name == "PARAMETER" and v.trainable)
        net = tm.model(params, data.features, data.classes, data.image)
        theirs = sorted(tuple(p.shape) for p in net.parameters())
        assert theirs == ours, params
        assert net(torch.zeros(3, data.features)).shape == (3, data.classes)
        opt = tm.optimizer(params, list(net.parameters()))
        assert type(opt).__name__.lower() == params["optimizer"]


def run(curve: list[list[float]], seconds: float, **extra: Any) -> dict[str, Any]:
    return {"curve": curve, "seconds": seconds, "trials": len(curve), "in_flight": 2,
            "peak_pss_bytes": 100 * peers.MB, "peak_gpu_bytes": None, "launch_s": 1.0,
            **extra}


def test_the_answer_is_computed_from_the_runs() -> None:
    runs = {
        "explore": [run([[1.0, 0.5], [2.0, 0.99]], 3.0, budget_bytes=200 * peers.MB),
                    run([[1.5, 0.97]], 2.5, budget_bytes=200 * peers.MB,
                        peak_pss_bytes=250 * peers.MB)],
        "optuna_njobs": [run([[4.0, 1.0]], 5.0), run([[3.0, 0.6]], 4.0)],
        "optuna_journal": [run([[2.5, 0.98]], 6.0, launch_s=2.0),
                           run([[3.5, 0.99]], 7.0, launch_s=3.0)],
        "ray_tune": [run([[9.0, 0.9]], 9.5, startup_s=4.0),
                     run([[8.0, 0.99]], 8.5, startup_s=5.0)],
    }
    out = peers.summarise(runs)
    assert out["target"] == 0.98  # 98% of the best any run reached (1.0)
    s = out["sides"]
    assert s["explore"]["time_to_target_all"] == [2.0, None]
    # one run of two never got there: the median run is the later one, which never did
    assert s["explore"]["time_to_target_s"] is None
    assert s["explore"]["within_budget"] is False  # the second run measured 250 MB of 200
    assert s["explore"]["peak_pss_mb"] == 250.0
    assert s["optuna_journal"]["time_to_target_s"] == 3.0  # median of 2.5 and 3.5
    # on a user's stopwatch: each run's time to target after its own launch
    assert s["optuna_journal"]["time_to_target_from_launch_all"] == [4.5, 6.5]
    assert s["optuna_journal"]["time_to_target_from_launch_s"] == 5.5
    assert s["optuna_journal"]["launch_s"] == 2.5
    assert s["explore"]["time_to_target_from_launch_all"] == [3.0, None]
    assert s["optuna_njobs"]["time_to_target_s"] is None
    assert s["optuna_torch"]["variant"] == "optuna_journal"  # the one that got there
    assert s["ray_tune"]["startup_s"] == 4.5 and s["ray_tune"]["time_to_target_all"] == [
        None, 8.0]
    assert s["ray_tune"]["best_accuracy"] == pytest.approx(0.945)


def test_the_better_optuna_side_is_the_sooner_then_the_shorter() -> None:
    runs = {"optuna_njobs": [run([[2.0, 1.0]], 9.0)],
            "optuna_journal": [run([[2.0, 1.0]], 4.0)]}
    assert peers.summarise(runs)["sides"]["optuna_torch"]["variant"] == "optuna_journal"
    runs["optuna_njobs"] = [run([[1.0, 1.0]], 9.0)]
    assert peers.summarise(runs)["sides"]["optuna_torch"]["variant"] == "optuna_njobs"


def smoke(*sides: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--json", "--quick", "--searches",
         "paper_mlp", "--sides", ",".join(sides), "--trials", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def check(r: dict[str, Any], sides: tuple[str, ...]) -> None:
    assert r["errors"] == [] and r["device"] == "cpu" and set(r["utilisation"]) == {"paper_mlp"}
    search = r["searches"]["paper_mlp"]
    bests = [search["sides"][s]["best_accuracy"] for s in sides]
    assert search["target"] == pytest.approx(round(0.98 * max(bests), 4), abs=1e-4)
    for s in sides:
        got = search["sides"][s]
        assert got["trials"] == 4 and got["runs"] == 1 and 1 <= got["in_flight"] <= 4
        assert 0 < got["best_accuracy"] <= 1 and got["peak_pss_mb"] > 0
        t = got["time_to_target_s"]
        assert t is None or 0 < t <= got["seconds"]
        assert (t is not None) == (got["best_accuracy"] >= search["target"])
        assert got["launch_s"] > 0  # at least the interpreter's start and the imports
        # one run (the smoke runs one repeat): its time from launch is the sum
        launched = got["time_to_target_from_launch_s"]
        assert launched == (None if t is None else pytest.approx(t + got["launch_s"], abs=0.02))


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_explore_and_optuna_smoke_on_the_cpu() -> None:
    pytest.importorskip("torch")
    sides = ("explore", "optuna_njobs", "optuna_journal")
    r = smoke(*sides)
    check(r, sides)
    got = r["searches"]["paper_mlp"]["sides"]
    assert got["explore"]["within_budget"] and got["explore"]["budget_mb"] == 1000.0
    assert got["optuna_torch"]["variant"] in peers.OPTUNA_SIDES
    # explore's utilisation, from its run's own counters
    used = r["utilisation"]["paper_mlp"]
    assert used is not None and 0 < used["utilisation"] < 1 and used["model_tflop"] > 0
    assert used["shares"]["train"] > 0 and sum(used["shares"].values()) == \
        pytest.approx(1.0, abs=0.01)


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_ray_tune_smoke_on_the_cpu() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("ray.tune")
    r = smoke("ray_tune")
    check(r, ("ray_tune",))
    assert r["searches"]["paper_mlp"]["sides"]["ray_tune"]["startup_s"] > 0


HELD_OUT = """\
name: held_out
dataset: {name: digits}
objectives:
  - {metric: accuracy, direction: maximize}
budget: {trials: 4, rounds: 2, memory: 400MB, workers: 2}
sampler: {name: random, seed: 0}
pruner: {name: successive_halving}
model:
  family: mlp
  depth: {int: [1, 2]}
  width: {choice: [16, 32]}
training:
  optimizer: adam
  lr: {float: [1.0e-3, 1.0e-1], log: true}
  batch_size: 32
"""


@pytest.mark.parametrize("change, why", [
    ({"model": "model: {family: transformer}\n"}, "model.family 'transformer' has no PyTorch"),
    ({"model": "model: {builder: 'mymodels:build'}\n"}, "a builder of its own"),
    ({"objectives": "objectives:\n  - {metric: loss, direction: minimize}\n"},
     "one objective, accuracy maximised"),
    ({"training": "training:\n  optimizer: adam\n  batch_size: {choice: [auto, 32]}\n"},
     "batch_size: auto is explore's to choose"),
])
def test_a_space_no_pytorch_twin_trains_is_refused_with_why(tmp_path: Path, change: dict,
                                                             why: str) -> None:
    sections = HELD_OUT.split("\n")
    text = HELD_OUT
    for key, replacement in change.items():  # the section KEY replaced whole
        start = next(i for i, line in enumerate(sections) if line.startswith(f"{key}:"))
        end = next((i for i in range(start + 1, len(sections))
                    if sections[i] and not sections[i].startswith(" ")), len(sections))
        text = "\n".join(sections[:start]) + "\n" + replacement + "\n".join(sections[end:])
    (tmp_path / "space.yaml").write_text(text)
    said = peers.refusal(str(tmp_path / "space.yaml"))
    assert said is not None and why in said and "space.yaml" in said
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), "--searches",
                        str(tmp_path / "space.yaml"), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr and not r.stdout


def test_an_unknown_search_is_refused() -> None:
    said = peers.refusal("no_such_search")
    assert said is not None and "paper_mlp" in said


def test_a_held_out_space_is_run_with_its_own_sampler_and_pruner(tmp_path: Path) -> None:
    path = tmp_path / "held_out.yaml"
    path.write_text(HELD_OUT)
    assert peers.refusal(str(path)) is None and peers.search_name(str(path)) == "held_out"
    assert peers.space_file("paper_mlp").endswith("search_spaces/paper_mnist.yaml")
    space = load_space(path)
    sampler, pruner = peers.sampler_pruner(space, 5)
    assert isinstance(sampler, optuna.samplers.RandomSampler)
    assert isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner)
    assert peers.prunes(space) and peers.validation_interval(space) == 1
    # the shipped searches: explore's TPE (with the space's startup trials) and median
    cnn = load_space(ROOT / "search_spaces" / "cnn_mnist.yaml")
    sampler, pruner = peers.sampler_pruner(cnn, 5)
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert isinstance(pruner, optuna.pruners.MedianPruner)
    onnx_space = load_space(ROOT / "search_spaces" / "onnx_mnist.yaml")
    assert peers.sampler_pruner(onnx_space, 5)[0]._n_startup_trials == \
        onnx_space.sampler.startup_trials


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_a_held_out_space_runs_on_every_optuna_side_and_explore(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "held_out.yaml"
    path.write_text(HELD_OUT)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), "--searches",
                        str(path), "--sides", "explore,optuna_njobs,optuna_journal",
                        "--repeats", "1", "--json"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert not got["errors"] and set(got["searches"]) == {"held_out"}
    sides = got["searches"]["held_out"]["sides"]
    assert {"explore", "optuna_njobs", "optuna_journal", "optuna_torch"} <= set(sides)
    assert all(s["trials"] == 4 for s in sides.values())
