"""The workers' kernels (``budget.kernels``): numba's compiled ones where the space asks
for them, or where each worker's share of the budget makes their memory small (auto);
numpy's otherwise; a user's ``CALCGRAPH_JIT`` kept; the choice keyed into the
constants remembered per machine, since a worker's overhead depends on it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from explore.binding import bind
from explore.datasets import load_digits
from explore.scheduler import Scheduler
from explore.scheduler.constants import machine_key
from explore.scheduler.kernels import COMPILED_FROM, for_workers
from explore.space import SpaceError, load_space, parse_space
from explore.study import open_study
from tests.explore.cli_run import IN_TEST, explore_here, explore_run

MB = 1 << 20


def test_auto_compiles_where_a_workers_share_is_half_a_gigabyte_or_more() -> None:
    assert for_workers("auto", 2 * COMPILED_FROM, 2, {}) == "1"
    assert for_workers("auto", 2 * COMPILED_FROM - 1, 2, {}) == "0"
    assert for_workers("auto", 8 * COMPILED_FROM, 16, {}) == "0"  # many small workers
    assert for_workers("compiled", 64 * MB, 4, {}) == "1"
    assert for_workers("numpy", 64 * COMPILED_FROM, 1, {}) == "0"
    # on a GPU the fused kernels never run: numba is not loaded for nothing
    assert for_workers("auto", 64 * COMPILED_FROM, 1, {}, device="gpu") == "0"
    assert for_workers("compiled", 64 * COMPILED_FROM, 1, {}, device="gpu") == "0"


@pytest.mark.parametrize(("name", "compiled"), [("paper_mnist", True), ("cnn_mnist", True),
                                                ("quick", False)])
def test_the_shipped_spaces_kernels(name: str, compiled: bool) -> None:
    # the 1 GB spaces of two workers were measured faster compiled, within budget
    space = load_space(Path(__file__).parents[3] / "search_spaces" / f"{name}.yaml")
    b = space.budget
    assert for_workers(b.kernels, b.memory, b.workers, {}) == ("1" if compiled else "0")


def test_auto_keeps_a_users_calcgraph_jit_and_an_explicit_choice_overrides_it() -> None:
    assert for_workers("auto", 64 * MB, 1, {"CALCGRAPH_JIT": "1"}) == "1"
    assert for_workers("auto", 64 * COMPILED_FROM, 1, {"CALCGRAPH_JIT": "0"}) == "0"
    assert for_workers("numpy", 64 * MB, 1, {"CALCGRAPH_JIT": "1"}) == "0"
    with pytest.raises(ValueError, match="kernels must be one of auto, numpy, compiled"):
        for_workers("fast", 64 * MB, 1, {})


def test_an_unknown_kernels_setting_is_refused_naming_the_key() -> None:
    with pytest.raises(SpaceError, match=r"budget\.kernels"):
        parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                     "memory": "64MB", "kernels": "fast"}})


def test_the_constants_of_a_machine_are_kept_per_choice() -> None:
    assert machine_key("cpu", "1") != machine_key("cpu", "0")
    assert machine_key("cpu", "1").endswith("jit 1")


@pytest.mark.parametrize("kernels", ["compiled", "numpy"])
def test_the_workers_run_the_kernels_the_space_chose(tmp_path: Path, kernels: str,
                                                     monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    monkeypatch.delenv("CALCGRAPH_JIT", raising=False)
    space = parse_space({
        "name": "k", "dataset": "digits",
        "budget": {"trials": 1, "rounds": 1, "memory": "400MB", "workers": 1,
                   "kernels": kernels},
        "model": {"depth": 1, "width": 8}, "training": {"batch_size": 32}})
    study = open_study(space, f"sqlite:///{tmp_path / 'k.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1,
                      memory=space.budget.memory, device="cpu", main=IN_TEST)
    assert sched.stats.work()["kernels"] == kernels
    sched.start()
    try:
        (worker,) = sched.workers.values()
        maps = Path(f"/proc/{worker.pid}/maps").read_text()
    finally:
        sched.close()
    # numba's LLVM is loaded by the warm-up's first compiled kernel, and only then
    assert ("llvmlite" in maps) == (kernels == "compiled")


def test_the_summary_says_which_kernels_the_workers_ran() -> None:
    from explore.utilisation import describe, of_run

    work = {"wall_s": 10.0, "workers": 2, "peak_flops": 1e11, "kernels": "compiled",
            "flops": {"train": 4e11}, "spent": {"train": 10.0}}
    assert ", compiled kernels: training 50%" in describe(of_run({"work": work}))[1]
    del work["kernels"]  # a run recorded before the choice existed
    assert describe(of_run({"work": work}))[1].startswith("the workers' 20.0 s: ")


def test_explore_run_kernels_overrides_the_space_and_each_trial_records_it(
        tmp_path: Path) -> None:
    space = {"name": "k", "dataset": "digits", "keep_models": 0,
             "budget": {"trials": 1, "rounds": 1, "memory": "300MB", "workers": 1},
             "model": {"depth": 1, "width": 8}, "training": {"batch_size": 32}}
    f = tmp_path / "k.yaml"
    f.write_text(yaml.safe_dump(space))
    r = explore_run(f, "--kernels", "compiled")
    assert r.exit_code == 0, r.output
    (trial,) = optuna.load_study(study_name="k", storage=f"sqlite:///{tmp_path / 'k.db'}"
                                 ).trials
    assert trial.user_attrs["explore"]["kernels"] == "compiled"  # auto: numpy at 300 MB
    bad = explore_here("run", f, "--kernels", "fast", "--quiet")
    assert bad.returncode == 2 and "'fast' is not one of 'auto', 'numpy'" in bad.stderr + bad.stdout
