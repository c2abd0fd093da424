"""Claims of grid points by several drivers at once (``explore.live``), with the
interleavings forced: a grid point is held by one trial only, whatever the timing."""

from __future__ import annotations

import threading
from typing import Any

import optuna
from optuna.trial import TrialState

from explore.live import LiveStudy, counted
from explore.sampling import suggest
from explore.space import parse_space
from explore.study import PARAMS_ATTR, RECORD_ATTR

# one grid point: every draw is the same point
ONE_POINT = {"name": "one", "dataset": "digits", "sampler": "grid", "pruner": "none",
             "budget": {"trials": 2, "rounds": 1, "memory": "300MB", "workers": 1},
             "model": {"depth": 1, "width": {"choice": [8]}},
             "training": {"optimizer": "adam", "lr": {"choice": [0.01]}}}


def test_a_queued_claim_and_a_new_claim_written_at_once_do_not_both_run_the_point(
        ) -> None:
    """A claim taken from the queue keeps its early number, so a newer claim that
    checked before it was taken did not wait for it.  Here the newer claim checks,
    then its write is held back while the queued one is taken, checked and written;
    once both are written, the one that sees the other gives way."""
    space = parse_space(ONE_POINT)
    stored = optuna.create_study(study_name="one")
    first = LiveStudy(stored, space, total=2, device="cpu")
    second = LiveStudy(stored, space, total=2, device="cpu")
    try:
        early = first.claim()  # number 0
        late = second.claim()  # number 1, a new trial
        assert early is not None and late is not None
        assert (early.number, late.number) == (0, 1)
        # the first gives its claim back (as a claim lost to the total is)
        first.storage.set_trial_state_values(early.stored_id, TrialState.WAITING)

        checked, release = threading.Event(), threading.Event()
        write = second._write

        def held(fn: Any) -> Any:  # the second's parameters wait until released
            if not checked.is_set():
                checked.set()
                release.wait(30)
            return write(fn)

        second._write = held  # type: ignore[method-assign]
        got: dict[str, Any] = {}
        t = threading.Thread(target=lambda: got.setdefault(
            "late", second.ask(late, lambda trial: suggest(trial, space))))
        t.start()
        assert checked.wait(30)  # the second checked and found the point free
        retaken = first.claim()
        assert retaken is not None and retaken.number == 0  # taken from the queue
        ran_first = first.ask(retaken, lambda trial: suggest(trial, space))
        release.set()
        t.join(30)
        ran_second = got["late"]
        assert (ran_first is None) != (ran_second is None)  # exactly one runs the point
        holders = [tr for tr in stored.get_trials(deepcopy=False)
                   if tr.state == TrialState.RUNNING and RECORD_ATTR in tr.user_attrs]
        assert len(holders) == 1
        gave_way = [tr for tr in stored.get_trials(deepcopy=False)
                    if tr.state == TrialState.FAIL]
        assert len(gave_way) == 1 and not counted(gave_way[0])
        assert "claimed at the same time" in gave_way[0].user_attrs[RECORD_ATTR]["fail_reason"]
        assert gave_way[0].user_attrs[PARAMS_ATTR] == holders[0].user_attrs[PARAMS_ATTR]
    finally:
        first.close()
        second.close()


def test_a_queued_repeat_whose_point_ran_meanwhile_is_not_run_again() -> None:
    """A repeat queued for a failed trial, when a driver ran its point in the meantime
    (its grid looked exhausted): the repeat ends without running and without counting,
    rather than going back to the queue for ever."""
    space = parse_space(ONE_POINT)
    stored = optuna.create_study(study_name="one")
    live = LiveStudy(stored, space, total=2, device="cpu")
    try:
        claim = live.claim()
        assert claim is not None
        trial = live.ask(claim, lambda t: suggest(t, space))
        assert trial is not None
        point = dict(stored.get_trials(deepcopy=False)[0].params)
        stored.enqueue_trial(point, user_attrs={"requeued_from": 7})  # as _requeue does
        live.flush()
        repeat = live.claim()
        assert repeat is not None and repeat.fixed == point
        assert live.ask(repeat, lambda t: suggest(t, space)) is None
        live.flush()
        ended = stored.get_trials(deepcopy=False)[repeat.number]
        assert ended.state == TrialState.FAIL and not counted(ended)
        assert "ran meanwhile" in ended.user_attrs[RECORD_ATTR]["fail_reason"]
        assert not any(t.state == TrialState.WAITING for t in stored.get_trials())
    finally:
        live.finish(trial, 0.5)
        live.close()


def test_a_claim_of_a_driver_of_this_host_that_is_gone_is_stale_at_once() -> None:
    """A driver killed between claiming a trial and writing its record leaves a RUNNING
    trial that names it only by its claim; on the same host its pid is gone, so the
    trial is stale at once, not after the grace period (the next run waited for it)."""
    import subprocess
    import sys
    import time

    from explore.live import CLAIM_ATTR

    space = parse_space(ONE_POINT)
    stored = optuna.create_study(study_name="one")
    live = LiveStudy(stored, space, total=2, device="cpu", grace=600)
    try:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
        claimed = stored.ask()
        stored._storage.set_trial_user_attr(claimed._trial_id, CLAIM_ATTR,
                                            f"{live.host}:{gone}:abc123")
        frozen = stored._storage.get_trial(claimed._trial_id)
        assert live._silence(frozen, time.time()) == float("inf")
        alive = stored.ask()  # a claim of a driver that lives (this process) is waited for
        stored._storage.set_trial_user_attr(alive._trial_id, CLAIM_ATTR,
                                            f"{live.host}:{live.pid}:abc123")
        assert live._silence(stored._storage.get_trial(alive._trial_id), time.time()) < 60
    finally:
        live.close()
