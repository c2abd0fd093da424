"""A driver's time in the study's storage (``explore.live.StorageTime``): every call
counted, on the thread that made it, and carried into the run's stats and the study.

The storage here records each call it serves and the thread that made it, and moves a
clock of that thread by a fixed cost per call; ``explore.live`` measures with that
clock, so the figures must equal the record exactly (no wall time involved)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import optuna
import pytest
from optuna.storages import BaseStorage, InMemoryStorage

import explore.live
from explore.binding import bind
from explore.live import LiveStudy, StorageTime, storage_times
from explore.space import parse_space
from tests.explore.cli_run import IN_TEST

SPACE = {"dataset": "digits", "budget": {"trials": 2, "rounds": 2, "memory": "300MB",
                                         "workers": 1},
         "sampler": {"name": "random", "seed": 0}, "pruner": "none", "keep_models": 0,
         "model": {"depth": 1, "width": {"choice": [8, 16]}},
         "training": {"optimizer": "adam", "lr": 0.01, "batch_size": 32}}
# A call's cost on the fake clock: a power of two, so that sums are exact.
COST = {"get_all_trials": 0.25, "set_trial_intermediate_value": 2.0}
OTHER = 0.5
CPU_SHARE = 0.25


class Clocks:
    """A clock per thread that only the recording storage moves."""

    def __init__(self) -> None:
        self.local = threading.local()

    def __call__(self) -> float:
        return float(getattr(self.local, "t", 0.0))

    def spend(self, seconds: float) -> None:
        self.local.t = self() + seconds


class Recording(InMemoryStorage):
    """An in-memory storage that records its outermost calls: (thread name, method).
    A call costs its thread COST seconds of wall time, CPU_SHARE of them CPU."""

    def __init__(self, clocks: Clocks, cpu: Clocks) -> None:
        super().__init__()
        self.clocks, self.cpu, self.depth = clocks, cpu, threading.local()
        self.calls: list[tuple[str, str]] = []

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or not callable(attr) or not hasattr(BaseStorage, name):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.depth, "n", 0)
            if depth == 0:  # not one the storage makes of itself
                self.calls.append((threading.current_thread().name, name))
                self.clocks.spend(COST.get(name, OTHER))
                self.cpu.spend(COST.get(name, OTHER) * CPU_SHARE)
            self.depth.n = depth + 1
            try:
                return attr(*args, **kwargs)
            finally:
                self.depth.n = depth

        return recorded


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Recording:
    clocks, cpu = Clocks(), Clocks()
    monkeypatch.setattr(explore.live.timing, "_clock", clocks)
    monkeypatch.setattr(explore.live.timing, "_cpu_clock", cpu)
    return Recording(clocks, cpu)


def expected(calls: list[tuple[str, str]]) -> StorageTime:
    """The figures ``calls`` make: the writer's thread's apart from all others."""
    spent = StorageTime()
    for thread, name in calls:
        cost = COST.get(name, OTHER)
        if thread == "explore-study-writer":
            spent.writer_seconds += cost
            spent.writer_cpu_seconds += cost * CPU_SHARE
            spent.writer_calls += 1
        else:
            spent.scheduler_seconds += cost
            spent.scheduler_cpu_seconds += cost * CPU_SHARE
            spent.scheduler_calls += 1
    return spent


def test_every_storage_call_is_counted_on_the_thread_that_made_it(
        recording: Recording) -> None:
    space = parse_space({**SPACE, "name": "timed"})
    stored = optuna.create_study(storage=recording, study_name="timed")
    recording.calls.clear()  # the study's creation is not the driver's
    live = LiveStudy(stored, space, total=2, device="cpu")
    for v in (0.25, 0.75):
        claim = live.claim()
        assert claim is not None
        t = live.ask(claim, lambda trial: {"x": trial.suggest_float("x", 0, 1)})
        assert t is not None
        live.report(t, 1, v / 2)
        live.report(t, 2, v)
        live.finish(t, v)
    assert live.claim() is None  # the study has its total
    live.close()

    calls = recording.calls
    on = {thread: Counter(n for t, n in calls if t == thread) for thread, _ in calls}
    writer, scheduler = on.pop("explore-study-writer"), on.pop("MainThread")
    assert not on  # no third thread
    # the writer: the reports, the ends and the heartbeats (and the figures, last)
    assert writer["set_trial_intermediate_value"] == 4
    assert writer["set_trial_state_values"] == 2
    assert writer["set_study_system_attr"] >= 2  # a heartbeat, then the figures
    # the scheduler: the claims (created empty), the parameters and record of each
    # ask, and the reads; never a report or an end
    assert scheduler["create_new_trial"] == 2 and scheduler["set_trial_param"] == 2
    assert scheduler["get_all_trials"] >= 4
    assert "set_trial_intermediate_value" not in scheduler
    assert "set_trial_state_values" not in scheduler
    # the figures are the record, the last call (storing them) left out
    assert calls[-1] == ("explore-study-writer", "set_study_system_attr")
    assert live.storage_time == expected(calls[:-1])
    assert live.storage_time.keep_seconds == 0.0
    assert storage_times(stored) == {live.driver: live.storage_time.as_dict()}


def test_a_run_carries_the_figures_into_its_stats_and_its_record(
        recording: Recording) -> None:
    from explore.datasets import load_digits
    from explore.scheduler import Scheduler

    space = parse_space({**SPACE, "name": "carried"})
    stored = optuna.create_study(storage=recording, study_name="carried",
                                 direction="maximize")
    recording.calls.clear()
    sched = Scheduler(bind(space), stored, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST)
    stats = sched.run(2)
    calls = list(recording.calls)  # the driver's, before this test reads the study
    assert [t.state.name for t in stored.trials] == ["COMPLETE"] * 2
    assert stats.storage is sched.live.storage_time
    assert calls[-1] == ("explore-study-writer", "set_study_system_attr")
    assert stats.storage == expected(calls[:-1])
    assert stats.storage.writer_calls >= 2 + 2 * 2  # two ends, two reports each
    assert stats.record_dict()["storage"] == stats.storage.as_dict() == \
        storage_times(stored)[sched.live.driver]


def test_a_requeue_is_a_timed_write_of_the_writer_and_is_taken_by_the_next_claim(
        recording: Recording) -> None:
    from optuna.trial import TrialState

    from explore.study import RECORD_ATTR

    space = parse_space({**SPACE, "name": "requeue"})
    stored = optuna.create_study(storage=recording, study_name="requeue")
    live = LiveStudy(stored, space, total=1, device="cpu")
    claim = live.claim()
    assert claim is not None
    t = live.ask(claim, lambda trial: {"x": trial.suggest_float("x", 0, 1)})
    assert t is not None
    t.set_user_attr(RECORD_ATTR, {})  # as the scheduler notes a trial's end
    recording.calls.clear()
    live.finish(t, state=TrialState.FAIL, retry=True)
    live.flush()
    assert ("explore-study-writer", "create_new_trial") in recording.calls
    assert live.storage_time.writer_calls == len(recording.calls)
    again = live.claim()  # the queued repeat, with the failed trial's parameters
    assert again is not None and again.requeued_from == claim.number
    assert again.fixed == t.params
    live.close()
