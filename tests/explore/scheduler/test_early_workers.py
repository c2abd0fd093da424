"""Workers started while the driver opens its study (explore.scheduler.early): the run
trains on them, starts them only where it will use them as they are, ends those it does
not take on every way out, and charges the driver what it holds alone."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from explore.procmem import alive, pss
from explore.runner import RunRefused, execute, prepare
from explore.scheduler import early as early_module
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import machine_key
from explore.scheduler.early import EarlyWorkers
from explore.scheduler.loop import startup
from explore.scheduler.processes import await_ready, spawn
from explore.scheduler.shared_arrays import SharedArrays

SPACE: dict[str, Any] = {
    "name": "early", "dataset": "digits",
    "budget": {"trials": 3, "rounds": 1, "memory": "1GB", "workers": 2, "kernels": "numpy"},
    "model": {"depth": 1, "width": 16}, "keep_models": 0,
}


def spawns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The process ids of the workers spawned early and by the scheduler, as they start."""
    seen: dict[str, list[int]] = {"early": [], "scheduler": []}

    def recording(where: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spawned(*args: Any, **kwargs: Any) -> Any:
            w = real(*args, **kwargs)
            seen[where].append(w.process.pid)
            return w
        return spawned

    monkeypatch.setattr(early_module, "spawn", recording("early", early_module.spawn))
    monkeypatch.setattr(startup, "spawn", recording("scheduler", startup.spawn))
    return seen


def run(tmp_path: Path, name: str = "early", **budget: Any) -> Any:
    space = {**SPACE, "budget": {**SPACE["budget"], **budget}}
    return execute(prepare(space, storage=f"sqlite:///{tmp_path}/{name}.db", study=name))


def known(tmp_path: Path) -> None:
    """A run before, which measures the workers' cost on this machine (the first run
    anywhere starts one worker on its own to measure it, and none early)."""
    run(tmp_path, name="first")
    assert load_constants(machine_key("cpu", "0")) is not None


def ended(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_the_run_trains_on_the_workers_it_started_early(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    known(tmp_path)
    seen = spawns(monkeypatch)
    study, record = run(tmp_path)
    assert len(seen["early"]) == 2 and seen["scheduler"] == []
    assert record is not None
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    assert {t.user_attrs["explore"]["worker"] for t in done} <= {0, 1}
    assert ended(seen["early"])  # stopped with the run


def test_no_worker_starts_early_before_its_cost_here_is_known(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path / "empty-cache"))
    seen = spawns(monkeypatch)
    _, record = run(tmp_path)
    assert record is not None
    assert seen["early"] == [] and len(seen["scheduler"]) == 2


def test_a_budget_that_holds_fewer_workers_starts_none_early(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Two workers asked, one held: the one the run starts has both cores' share of
    threads, which a worker started early for two would not have."""
    fixed: list[int] = []
    real_start = startup.Startup.start

    def start(self: Any) -> None:
        real_start(self)
        fixed.append(self.stats.main + self.stats.data + self.stats.tracker)

    monkeypatch.setattr(startup.Startup, "start", start)
    known(tmp_path)
    c = load_constants(machine_key("cpu", "0"))
    assert c is not None and fixed
    seen = spawns(monkeypatch)
    # room for the driver, the data, the tracker and one and a half workers, beside the
    # headroom (2% of the budget)
    _, record = run(tmp_path, memory=str(int((fixed[0] + 1.5 * c.worker) / 0.98)))
    assert record is not None
    assert seen["early"] == [] and len(seen["scheduler"]) == 1


def test_workers_started_early_end_when_the_study_needs_no_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known(tmp_path)
    run(tmp_path)
    seen = spawns(monkeypatch)
    _, record = run(tmp_path)  # the study has its 3 trials already
    assert record is None
    assert len(seen["early"]) == 2 and ended(seen["early"])


def test_workers_started_early_end_when_the_study_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study of the same name that minimises: refused after the workers started, and
    they end with nothing of the run left (its shared data set removed)."""
    known(tmp_path)
    optuna.create_study(study_name="early", storage=f"sqlite:///{tmp_path}/early.db",
                        direction="minimize")
    seen = spawns(monkeypatch)
    files: list[str] = []
    real_start = early_module.EarlyWorkers.start.__func__  # type: ignore[attr-defined]

    def start(cls: Any, bound: Any, data: SharedArrays, **kw: Any) -> EarlyWorkers:
        files.append(data.path)
        return real_start(cls, bound, data, **kw)

    monkeypatch.setattr(EarlyWorkers, "start", classmethod(start))
    with pytest.raises(RunRefused, match=r"minimi|maximi|direction"):
        run(tmp_path)
    assert len(seen["early"]) == 2 and ended(seen["early"])
    assert files and not Path(files[0]).exists()


def test_a_worker_started_otherwise_than_the_scheduler_decides_is_ended() -> None:
    with SharedArrays({"x": np.zeros((4, 4), np.float32)}) as arrays:
        w = spawn(mp.get_context("spawn"), 0, arrays.spec, "cpu", 2, jit="0")
        early = EarlyWorkers({0: w}, jit="0", share=2, pss_before=1, rss_before=1)
        assert early.take(0, 0, "1", 2) is None  # compiled kernels wanted
        assert ended([w.process.pid])
        assert early.take(0, 0, "0", 2) is None  # taken (and ended) once: gone


def test_the_driver_is_charged_what_it_holds_alone() -> None:
    """Workers map the libraries the driver maps, and take a share of those pages from
    its PSS; the driver is charged as before they started, plus what it maps since."""
    mb = 1 << 20
    with SharedArrays({"x": np.zeros((4, 4), np.float32)}) as arrays:
        early = EarlyWorkers(jit="0", share=2)
        early.pss_before, early.rss_before = pss(), early_module.rss()
        ctx = mp.get_context("spawn")
        for i in range(2):
            early.workers[i] = spawn(ctx, i, arrays.spec, "cpu", 2, jit="0")
        try:
            for w in early.workers.values():
                await_ready(w)
            alone = early.driver_alone()
            assert alone >= pss()  # its share of what the workers map too is its own
            assert abs(alone - early.pss_before) < 4 * mb, (alone, early.pss_before)
            grown = np.ones(40 * mb // 8)  # pages of its own, written
            assert early.driver_alone() - alone >= 39 * mb
            del grown
        finally:
            pids = [w.process.pid for w in early.workers.values()]
            early.close()
        assert ended(pids)
