"""`explore run` end to end on the 8x8 digits: trials packed into worker arenas,
results in SQLite, candidates too big for the budget failed without running, a
crashed worker replaced and its trial re-queued, a second run resuming the first."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from engine import compile_graph
from explore.binding import bind
from explore.candidate import graph_of
from explore.cli import main
from explore.datasets import load_digits
from explore.families import Shape, get
from explore.optimizers import build_optimizer
from explore.results import load
from explore.sampling import fixed
from explore.scheduler import Scheduler
from explore.space import load_space, parse_space
from explore.study import open_study
from tests.explore.cli_run import IN_TEST, explore_run

SPACE = """\
name: tiny
dataset: digits
budget: {{trials: {trials}, rounds: 2, memory: {memory}, workers: 2}}
sampler: {sampler}
pruner: none
model:
  depth: 1
  width: {width}
  activation: relu
training:
  optimizer: adam
  lr: {lr}
  batch_size: 32
"""


def write(tmp_path: Path, **kw: object) -> Path:
    args = {"trials": 4, "memory": "400MB", "sampler": "{name: random, seed: 1}",
            "width": "{choice: [16, 32]}", "lr": "{float: [1.0e-3, 3.0e-2], log: true}",
            **kw}
    f = tmp_path / "tiny.yaml"
    f.write_text(SPACE.format(**args))
    return f


def run(*args: str) -> object:
    result = explore_run(*args)
    assert result.exit_code == 0, result.output
    return result


def test_a_run_records_every_trial(tmp_path: Path) -> None:
    f = write(tmp_path)
    run(str(f))
    df = load(f"sqlite:///{tmp_path / 'tiny.db'}", "tiny")
    assert len(df) == 4 and (df["state"] == "complete").all()
    assert df["value"].between(0.0, 1.0).all()
    assert set(df["worker"]) <= {0, 1} and (df["rounds"] == 2).all()
    assert (df["total_bytes"] == df[[f"{z}_bytes" for z in ("forward", "gradient",
                                                             "optimizer", "workspace")]]
            .sum(axis=1)).all()
    assert (df["end"] > df["start"]).all() and (df["batch_size"] == 32).all()
    runs = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'tiny.db'}") \
        .user_attrs["runs"]
    assert runs[0]["peak"] <= runs[0]["budget"]
    # resume: the same command adds nothing; more trials continue the study
    run(str(f))
    run(str(f), "--trials", "6")
    assert len(load(f"sqlite:///{tmp_path / 'tiny.db'}", "tiny")) == 6
    out = tmp_path / "trials.csv"
    result = CliRunner().invoke(main, ["export", str(f), "--output", str(out)])
    assert result.exit_code == 0 and len(out.read_text().splitlines()) == 7


def test_candidates_too_big_fail_without_running(tmp_path: Path) -> None:
    # a 200,000-unit layer needs ~290 MB at Adam; the workers' arenas get ~60 MB each
    f = write(tmp_path, trials=2, memory="260MB", sampler="grid",
              width="{choice: [16, 200000]}", lr=0.01)
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'tiny.db'}"
    study = open_study(space, storage)
    stats = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST).run(2)
    df = load(storage, "tiny").set_index("number")
    big = df[df["params"].map(lambda p: p["widths"][0] == 200000)].iloc[0]
    small = df[df["params"].map(lambda p: p["widths"][0] == 16)].iloc[0]
    assert big["state"] == "fail" and "does not fit" in big["fail_reason"]
    assert big["worker"] is None or big["worker"] != big["worker"]  # never placed
    assert small["state"] == "complete"
    assert stats.peak <= stats.budget
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)


def _beyond_the_machine() -> int:
    """A width whose two square layers (weights, gradients and Adam's two moments) need
    twice this machine's physical memory."""
    from engine.compile.compiler import physical_memory

    return int((2 * (physical_memory() or 1 << 40) / 16) ** 0.5) + 1


def test_a_candidate_beyond_the_machine_is_a_trial_that_does_not_fit(tmp_path: Path) -> None:
    """Its plan is a BudgetError (the trial fails "does not fit"), not an internal fault
    that stops the run and leaves the trial RUNNING."""
    from engine import BeyondMachineError, BudgetError
    from explore.candidate import compile_candidate

    wide = _beyond_the_machine()
    f = write(tmp_path, width=f"{{choice: [16, {wide}]}}")
    f.write_text(f.read_text().replace("depth: 1", "depth: 2"))
    bound = bind(load_space(f))
    params = fixed(bound.space, {"width": wide})
    with pytest.raises(BudgetError, match="physical memory") as e:
        compile_candidate(bound, params, 400 << 20)
    assert isinstance(e.value, BeyondMachineError)


def test_a_space_whose_smallest_model_is_beyond_the_machine_is_refused(tmp_path: Path) -> None:
    f = write(tmp_path, width=str(_beyond_the_machine()))
    f.write_text(f.read_text().replace("depth: 1", "depth: 2"))
    r = explore_run(f)
    assert r.exit_code == 2, r.output
    assert "tiny.yaml:6: model: its smallest candidate" in r.output, r.output
    assert "physical memory" in r.output and not (tmp_path / "tiny.db").exists()
    # a choice's first value need not be its least: the run goes on, that trial fails
    from explore.scheduler.admission import smallest_heap

    f = write(tmp_path, width=f"{{choice: [{_beyond_the_machine()}, 16]}}")
    f.write_text(f.read_text().replace("depth: 1", "depth: 2"))
    assert smallest_heap(bind(load_space(f))) == 0


def test_a_crashed_worker_is_replaced_and_its_trial_requeued(tmp_path: Path) -> None:
    f = write(tmp_path, trials=3)
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'tiny.db'}"
    study = open_study(space, storage)
    killed: list[int] = []

    def kill_once(stats: object) -> None:
        if not killed:
            busy = [w for w in sched.workers.values() if w.residents]
            if busy:
                killed.append(busy[0].pid)
                os.kill(busy[0].pid, signal.SIGKILL)

    sched = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST, progress=kill_once)
    stats = sched.run(3)
    df = load(storage, "tiny")
    failed = df[df["state"] == "fail"]
    assert killed and len(failed) >= 1
    # said in the run's summary (printed with --quiet too), not only in the trials
    assert [n for n in stats.notes if f"(pid {killed[0]}) died" in n]
    assert failed["fail_reason"].str.contains("died").all()
    trials = optuna.load_study(study_name="tiny", storage=storage).trials
    requeued = [t for t in trials if "requeued_from" in t.user_attrs]
    assert requeued and all(t.state.name == "COMPLETE" for t in requeued)
    assert (df["state"] == "complete").sum() == 3


def test_size_prints_the_plan_as_json(tmp_path: Path) -> None:
    f = write(tmp_path)
    result = CliRunner().invoke(main, ["size", str(f), "--params", "width=32", "--json",
                                       "--memory", "1MB"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    space = load_space(f)
    p = fixed(space, {"width": 32})
    graph = get("mlp").build(p, Shape(64, 10, pixel_scale=1 / 16))  # every metric: loss too
    prog = compile_graph(graph, batch_size=got["compiled_batch"], optimizer=build_optimizer(p))
    assert got["zones"] == prog.zone_bytes and got["total_bytes"] == prog.total_bytes
    assert got["batch_size"] == 32 and got["compiled_batch"] == 359  # the validation set
    assert got["max_batch"] >= 32
    bigger = compile_graph(get("mlp").build(p, Shape(64, 10, pixel_scale=1 / 16)),
                           batch_size=got["max_batch"] + 1, optimizer=build_optimizer(p))
    assert bigger.total_bytes > 1_000_000


@pytest.mark.parametrize("memory", [pytest.param("2MB", marks=pytest.mark.slow), "90MB"])
def test_a_budget_too_small_for_the_run_is_refused_with_its_minimum(tmp_path: Path,
                                                                    memory: str) -> None:
    """Exit 2, the least budget that would do, and nothing written: no study file."""
    f = write(tmp_path, memory=memory)
    result = explore_run(f)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "cannot hold this run" in text and "is the least that would do" in text
    named = re.search(r"--memory (\d+)MB is the least", text)
    assert named is not None, text
    need = named.group(1)
    assert int(need) * 1_000_000 > 90_000_000
    assert not (tmp_path / "tiny.db").exists() and not (tmp_path / "tiny.artifacts").exists()
    # and the minimum it names is enough
    again = explore_run(f, "--memory", f"{need}MB", "--trials", "1")
    assert again.exit_code == 0, again.output


def test_export_parquet_of_a_run_reads_back(tmp_path: Path) -> None:
    import pandas as pd

    f = write(tmp_path, trials=2)
    run(str(f))
    out = tmp_path / "t.parquet"
    result = CliRunner().invoke(main, ["export", str(f), "--format", "parquet",
                                       "--output", str(out)])
    assert result.exit_code == 0, result.output
    back, df = pd.read_parquet(out), load(tmp_path / "tiny.db", "tiny")
    assert list(back.columns) == list(df.columns) and len(back) == 2
    assert list(back["value"]) == list(df["value"])
    assert [json.loads(p) for p in back["params"]] == list(df["params"])
    # the suffix chooses the format; one that contradicts --format is refused
    by_suffix = tmp_path / "s.parquet"
    assert CliRunner().invoke(main, ["export", str(f), "--output", str(by_suffix)]
                              ).exit_code == 0
    assert len(pd.read_parquet(by_suffix)) == 2
    wrong = CliRunner().invoke(main, ["export", str(f), "--format", "parquet",
                                      "--output", str(tmp_path / "t.csv")])
    assert wrong.exit_code == 2 and "its suffix says csv" in wrong.output
    assert not (tmp_path / "t.csv").exists()


def test_a_cnn_space_runs(tmp_path: Path) -> None:
    f = tmp_path / "cnn.yaml"
    f.write_text("""\
dataset: digits
budget: {trials: 2, rounds: 1, memory: 400MB, workers: 1}
sampler: {name: random, seed: 0}
pruner: none
model: {family: cnn, blocks: {int: [1, 2]}, channels: {choice: [4, 8], per_layer: true},
        kernel: 3, depth: 0}
training: {optimizer: adam, lr: 0.01, batch_size: 32}
""")
    run(str(f))
    df = load(f"sqlite:///{tmp_path / 'cnn.db'}", "cnn")
    assert (df["state"] == "complete").all() and len(df) == 2
    assert all(len(p["channels"]) == p["blocks"] for p in df["params"])


def test_a_cnn_with_batch_norm_and_residual_blocks_runs(tmp_path: Path) -> None:
    f = tmp_path / "bn.yaml"
    f.write_text("""\
dataset: digits
budget: {trials: 1, rounds: 2, memory: 400MB, workers: 1}
pruner: none
model: {family: cnn, blocks: 2, channels: 4, pool: false, kernel: 3, depth: 0,
        batch_norm: true, residual: true}
training: {optimizer: adam, lr: 0.01, batch_size: 32}
""")
    run(str(f))
    df = load(f"sqlite:///{tmp_path / 'bn.db'}", "bn")
    assert df["state"].tolist() == ["complete"] and df["value"].iloc[0] > 0.5
    space = load_space(f)
    g = graph_of(bind(space), fixed(space))
    ops = [n.op for n in g.paths[0].nodes]
    # block 0 goes from 1 channel to 4: no residual; block 1 keeps 4: one Add
    assert ops.count("BatchNormalization") == 2 and ops.count("Add") == 1
    stats = [v for v in g.variables.values() if v.name.endswith(("_mean", "_var"))]
    assert len(stats) == 4 and not any(v.trainable for v in stats)


def test_a_strided_cnn_halves_the_image_and_skips_the_residual() -> None:
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"},
                         "model": {"family": "cnn", "blocks": 2, "channels": 4, "pool": False,
                                   "stride": 2, "residual": True, "depth": 0}})
    prog = compile_graph(graph_of(bind(space), fixed(space)), batch_size=2)
    # 8x8 digits -> 4x4 -> 2x2, four channels: the dense layer reads 16 values
    assert prog.buffers[prog.params[-2].buffer].shape == (10, 16)  # Linear: [out, in]
    assert "Add" not in [ins.op for ins in prog.instrs]


@pytest.mark.parametrize("pause", [True, False])
def test_a_trial_paused_at_a_rung_resumes_when_promoted(tmp_path: Path, pause: bool) -> None:
    # Successive halving (eta 4, first rung after round 1) on one worker: trial 0 is
    # best and goes on; trial 1 is second best, so the rung stops it while it has a
    # single competitor; once 8 trials have reached the rung the top 2 go on, and a
    # paused trial 1 resumes and completes.  The six poor trials stay paused until the
    # end of the run, then are pruned; without pausing, trial 1 is lost at once.
    f = write(tmp_path, trials=8, sampler="{name: random, seed: 0}", lr=0.01)
    text = f.read_text().replace("pruner: none", "pruner: {name: successive_halving, "
                                 f"warmup_rounds: 1, pause: {str(pause).lower()}}}")
    f.write_text(text.replace("rounds: 2", "rounds: 3").replace("workers: 2", "workers: 1")
                 .replace("lr: 0.01", "lr: {float: [1.0e-6, 3.0e-2], log: true}"))
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'tiny.db'}"
    study = open_study(space, storage)
    for lr in (0.03, 0.003, 1e-6, 1.5e-6, 2e-6, 3e-6, 4e-6, 5e-6):
        study.enqueue_trial({"width": 16, "lr": lr})  # asked in this order
    stats = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST).run(8)
    df = load(storage, "tiny").set_index("number")
    assert df.loc[0, "state"] == "complete" and df.loc[0, "pauses"] == 0
    assert (df.loc[2:, "state"] == "pruned").all() and (df.loc[2:, "rounds"] == 1).all()
    assert (df["wall_s"] > 0).all()  # pruned trials too: their start comes with a report
    if pause:
        assert df.loc[1, "state"] == "complete" and df.loc[1, "rounds"] == 3
        assert (df.loc[1:, "pauses"] == 1).all()
        assert stats.counts["resumed"] == 1 and stats.counts["paused"] == 0
    else:
        assert df.loc[1, "state"] == "pruned" and df.loc[1, "rounds"] == 1
        assert stats.counts["resumed"] == 0
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)
