"""Workers started ahead of their run (:mod:`explore.scheduler.prestart`): the run takes
those started as it needs them, measures them only once they hold the data, and every
other one exits, whether the run took the rest, refused, or its driver died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import explore
from explore.binding import bind
from explore.datasets import load_digits
from explore.runner import RunRefused
from explore.scheduler import Scheduler
from explore.scheduler.constants import Measured, machine_key
from explore.scheduler.constants import save as save_constants
from explore.scheduler.loop import startup
from explore.scheduler.prestart import Prestarted, how_many, prestart
from explore.space import parse_space
from explore.study import open_study
from tests.explore.cli_run import IN_TEST


def _space(kernels: str = "numpy", workers: int = 1, memory: str = "300MB",
           trials: int = 3) -> dict:
    return {"name": "pre", "dataset": "digits", "keep_models": 0,
            "budget": {"trials": trials, "rounds": 2, "memory": memory, "workers": workers,
                       "kernels": kernels},
            "model": {"depth": 1, "width": 8}, "training": {"batch_size": 32}}


def _gone(pid: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # exited, not yet reaped by its parent
        time.sleep(0.05)
    return False


def test_a_run_takes_the_workers_started_ahead_and_accounts_them_as_its_own(
        tmp_path: Path) -> None:
    space = parse_space(_space(workers=2, memory="400MB", trials=4))
    started = prestart(space.budget, each=2)
    pids = {w.process.pid for w in started.workers.values()}
    assert len(pids) == 2
    study = open_study(space, f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST, prestarted=started)
    stats = sched.run(space.budget.trials)
    assert {w.pid for w in sched.workers.values()} == pids  # taken, none spawned anew
    assert started.workers == {}
    assert all(w.overhead > 0 for w in sched.workers.values())
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) == 4
    assert stats.peak <= space.budget.memory
    assert all(_gone(p) for p in pids)  # the run ended them


def test_workers_started_for_other_kernels_are_not_taken_and_exit(tmp_path: Path) -> None:
    started = prestart(parse_space(_space(kernels="numpy")).budget, each=1)
    (pid,) = (w.process.pid for w in started.workers.values())
    space = parse_space(_space(kernels="compiled"))
    study = open_study(space, f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST, prestarted=started)
    sched.start()
    try:
        (worker,) = sched.workers.values()
        assert worker.pid != pid  # spawned with the kernels the run asks for
        assert "llvmlite" in Path(f"/proc/{worker.pid}/maps").read_text()
        assert _gone(pid)
    finally:
        sched.close()


def test_a_worker_that_died_before_its_run_is_replaced(tmp_path: Path) -> None:
    space = parse_space(_space())
    started = prestart(space.budget, each=1)
    (w,) = started.workers.values()
    os.kill(w.process.pid, signal.SIGKILL)
    w.process.join(timeout=10)
    study = open_study(space, f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST, prestarted=started)
    sched.run(space.budget.trials)
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) == 3


def test_a_run_refused_leaves_none_of_its_workers_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []

    def ahead(*args: Any, **kwargs: Any) -> Prestarted:
        got = prestart(*args, **{**kwargs, "each": 1})  # one, whatever the budget
        started.extend(w.process.pid for w in got.workers.values())
        return got

    monkeypatch.setattr("explore.runner.prestart", ahead)
    # A worker's measured PSS depends on how many other processes share its libraries'
    # pages (other tests' too): costs remembered here make the refusal certain.
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path / "cache"))
    save_constants(machine_key("cpu", "0"), Measured(worker=40 * MB, tracker=10 * MB))
    with pytest.raises(RunRefused, match="cannot hold this run"):
        # 40 MB hold no worker of 40 MB
        explore.run(_space(memory="40MB"), storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert len(started) == 1
    assert all(_gone(p) for p in started)
    assert not (tmp_path / "r.db").exists()  # and nothing written


def test_workers_started_ahead_die_with_a_driver_killed_before_its_run(
        tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import time
        from explore.scheduler.prestart import prestart
        from explore.space import parse_space
        started = prestart(parse_space(SPACE).budget, each=2)
        print(*(w.process.pid for w in started.workers.values()), flush=True)
        time.sleep(600)
    """).replace("SPACE", repr(_space(workers=2)))
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[3])
    try:
        assert driver.stdout is not None
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(1.0)  # at their warm-up, or waiting for their data
        driver.kill()
        driver.wait(timeout=10)
        assert all(_gone(p) for p in pids)
    finally:
        if driver.poll() is None:
            driver.kill()


MB = 1_000_000


def test_only_the_workers_the_budget_surely_holds_start_ahead() -> None:
    known = Measured(worker=30 * MB, tracker=10 * MB)
    budget = parse_space(_space(workers=4, memory="300MB")).budget

    def ahead(main: int, data: int = MB, known: Measured | None = known) -> int:
        return how_many(budget, smallest=MB, data=data, main=main, known=known)

    # 300 MB less 3 MB of headroom, less twice a driver of 50 MB, the tracker and the
    # data: 186 MB, which hold 6 workers of 31 MB: all 4 asked for
    assert ahead(50 * MB) == 4
    # a driver of 90 MB counted twice leaves 106 MB: 3 workers
    assert ahead(90 * MB) == 3
    assert ahead(150 * MB) == 0  # a driver that could double leaves room for none
    assert ahead(50 * MB, data=160 * MB) == 0  # the data set counts once, whole
    assert ahead(50 * MB, known=None) == 0  # nothing measured on this machine yet
    # on a GPU the host's processes are not the budget's: only the devices' overheads
    gpu = budget.model_copy(update={"device": "gpu"})
    assert how_many(gpu, smallest=MB, data=0, main=10**12, known=known) == 4


def test_a_run_within_its_budget_starts_its_workers_ahead_and_takes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []
    original = Prestarted.take

    def take(self: Prestarted, *args: object) -> object:
        w = original(self, *args)  # type: ignore[arg-type]
        if w is not None:
            taken.append(w.process.pid)
        return w

    monkeypatch.setattr(Prestarted, "take", take)
    monkeypatch.setattr("explore.scheduler.prestart.how_many", lambda *a, **k: 2)
    study = explore.run(_space(workers=2, memory="400MB", trials=4),
                        storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert len(taken) == 2
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) == 4
    assert all(_gone(p) for p in taken)


def test_the_driver_is_charged_as_if_it_shared_no_page_with_workers_started_ahead(
        tmp_path: Path) -> None:
    # Beside its workers the driver's PSS is smaller (the pages of the libraries they
    # share are split among them: about 12 MB on a quiet machine), and grows back as
    # soon as they end: the run charges it its size before they started plus what it
    # has grown by since.  How much smaller depends on every other process that maps
    # those libraries (other tests' too), so the test checks the charge at the moment
    # the run takes it, not against a PSS read at another moment: the driver runs in a
    # process of its own, as a driver does.
    script = textwrap.dedent("""
        import sys
        import explore.scheduler.loop.startup as startup
        from explore.binding import bind
        from explore.procmem import pss_and_shmem
        from explore.scheduler import Scheduler
        from explore.scheduler.prestart import Prestarted, prestart
        from explore.scheduler.shared_data import load_shared
        from explore.space import parse_space
        from explore.study import open_study
        seen = {}
        def read_pss():
            total, shmem = pss_and_shmem()
            seen["pss"] = total
            return total, shmem
        charge = Prestarted.driver_alone
        def alone_now(self):
            seen["alone"] = charge(self)
            return seen["alone"]
        startup.pss_and_shmem = read_pss
        Prestarted.driver_alone = alone_now
        space = parse_space(SPACE)
        bound = bind(space)
        data = load_shared(bound)
        started = prestart(space.budget, each=2)
        before = started.driver_pss
        study = open_study(space, "sqlite:///" + sys.argv[1])
        sched = Scheduler(bound, study, data, workers=2, memory=space.budget.memory,
                          device="cpu", prestarted=started)
        try:
            sched.start()
            s = sched.stats
            print(s.started_ahead, s.main, s.data, before, seen["pss"], seen["alone"])
        finally:
            sched.close()
            started.close()
    """).replace("SPACE", repr(_space(workers=2, memory="2GB")))
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "p.db")],
                         capture_output=True, text=True, cwd=Path(__file__).parents[3],
                         timeout=120)
    assert out.returncode == 0, out.stderr
    ahead, main, data, before, beside, alone = map(int, out.stdout.split())
    assert ahead == 2
    assert alone >= before  # its size before they started, plus what it grew by since
    assert main == max(beside, alone) - data  # charged that, where beside them is less


def test_workers_started_ahead_for_more_than_the_budget_holds_end_before_any_is_spawned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The run finds room for one worker of the two started ahead (their share of the
    # cores then differs): both end before the one it runs is spawned, so the tree
    # never holds three.
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path / "cache"))
    save_constants(machine_key("cpu", "0"), Measured(worker=40 * MB, tracker=10 * MB))
    # 80 MB less 2 of headroom and the tracker's 10 hold one worker of 40 MB
    space = parse_space(_space(workers=2, memory="80MB"))
    started = prestart(space.budget, each=2)
    ahead = [w.process.pid for w in started.workers.values()]
    alive_at_spawn: list[bool] = []
    real_spawn = startup.spawn

    def spawn(*args: Any, **kwargs: Any) -> Any:
        alive_at_spawn.append(not all(_gone(p, within=0.001) for p in ahead))
        return real_spawn(*args, **kwargs)

    monkeypatch.setattr(startup, "spawn", spawn)
    study = open_study(space, f"sqlite:///{tmp_path / 'p.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST, prestarted=started)
    sched.start()
    try:
        assert len(sched.workers) == 1 and sched.stats.started_ahead == 0
        assert alive_at_spawn == [False]
    finally:
        sched.close()
