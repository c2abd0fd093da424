"""Places left queued once a shared study has its total (``LiveStudy.settled``): claims
that raced past the total (two drivers claiming the last place at once) hold more places
than the total, and what is left of them once it is reached is ended as surplus, on each
storage a study can live in; a trial a user queued stays for a later run.  The races
themselves are the drivers' simulation's (``test_stale_races``, ``test_drivers_simulation``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from explore.live import CLAIM_ATTR, REQUEUED_FROM, LiveStudy, counted
from explore.live.names import SURPLUS, Claim, never_ran, owes_repeat
from explore.sampling import suggest
from explore.space import parse_space
from explore.study import RECORD_ATTR

SPACE: dict[str, Any] = {
    "name": "surplus", "dataset": "digits", "sampler": "random", "pruner": "none",
    "budget": {"trials": 1, "rounds": 1, "memory": "300MB", "workers": 1},
    "model": {"depth": 1, "width": {"int": [4, 64]}},
    "training": {"optimizer": "adam", "lr": {"float": [1e-4, 1e-1], "log": True}}}


@pytest.fixture(params=["memory", "sqlite", "journal"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[optuna.Study]:
    storage: BaseStorage | None = None
    if request.param == "sqlite":
        storage = RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    elif request.param == "journal":
        storage = JournalStorage(JournalFileBackend(str(tmp_path / "study.log")))
    yield optuna.create_study(study_name="surplus", storage=storage)


def _drivers(stored: optuna.Study, total: int) -> tuple[LiveStudy, LiveStudy]:
    space = parse_space({**SPACE, "budget": {**SPACE["budget"], "trials": total}})
    return (LiveStudy(stored, space, total=total, device="cpu", driver=f"host:1:{name}")
            for name in ("aaaaaa", "bbbbbb"))  # type: ignore[return-value]


def _at_once(first: LiveStudy, second: LiveStudy) -> tuple[Claim, Claim]:
    """Both drivers claim the study's one place, the second on its read from before the
    first's claim was written (as two drivers whose reads and writes cross do)."""
    a = first.claim()
    second.refresh = lambda force=False: None  # type: ignore[method-assign]
    try:
        b = second.claim()
    finally:
        del second.refresh
    assert a is not None and b is not None and (a.number, b.number) == (0, 1)
    return a, b


def test_the_places_that_claims_past_the_total_leave_queued_are_ended(
        stored: optuna.Study) -> None:
    """Two drivers claim the one place at once: the later claim gives way, back to the
    queue.  Once the first trial counts, the driver that finds the study settled ends
    the given-back claim and a repeat whose place was taken, and leaves the user's."""
    space = parse_space(SPACE)
    first, second = _drivers(stored, 1)
    try:
        a, b = _at_once(first, second)
        trial = first.ask(a, lambda t: suggest(t, space))
        assert trial is not None
        # a read of the queue while nothing waits (as Optuna's own ask makes): the
        # in-memory storage then answers later such reads from past this point
        assert not stored._storage.get_all_trials(stored._study_id,
                                                  states=(TrialState.WAITING,))
        assert second.ask(b, lambda t: suggest(t, space)) is None  # lost to the total
        given_back = stored._storage.get_trial(b.stored_id)
        assert given_back.state == TrialState.WAITING
        # a repeat queued by a driver that read the study between another's two writes
        # (as LiveStudy._requeue writes it), and a trial a user queued
        stored.enqueue_trial({"width": 8}, user_attrs={REQUEUED_FROM: 0})
        stored.enqueue_trial({"width": 16})
        first.finish(trial, 0.5)
        first.flush()
        assert first.settled()
        trials = {t.number: t for t in stored.get_trials(deepcopy=False)}
        assert counted(trials[a.number]) and sum(counted(t) for t in trials.values()) == 1
        ended = [t for t in trials.values() if t.state == TrialState.FAIL]
        assert sorted(t.number for t in ended) == [b.number, 2]
        for t in ended:
            reason = t.user_attrs[RECORD_ATTR]["fail_reason"]
            assert reason.startswith(SURPLUS) and "total of 1 trials" in reason
            assert never_ran(t) and not counted(t) and not owes_repeat(t)
        waiting = [t for t in trials.values() if t.state == TrialState.WAITING]
        assert [t.params.get("width") or t.system_attrs["fixed_params"]["width"]
                for t in waiting] == [16]
        assert second.settled()  # ending them again is no error
        assert len(stored.get_trials(deepcopy=False)) == 4  # nothing queued again
    finally:
        first.close()
        second.close()


def test_a_surplus_place_another_driver_took_meanwhile_is_left_to_it(
        stored: optuna.Study) -> None:
    """A driver that read the study before its total was reached takes a given-back
    claim from the queue between the settling driver's read and its write: the settling
    driver leaves it (it ends only what it takes from WAITING itself), the taker finds
    the total reached, gives it back, and ends it when it settles in turn."""
    space = parse_space(SPACE)
    first, second = _drivers(stored, 1)
    try:
        a, b = _at_once(first, second)
        trial = first.ask(a, lambda t: suggest(t, space))
        assert trial is not None and second.ask(b, lambda t: suggest(t, space)) is None
        first.finish(trial, 0.5)
        first.flush()
        write = first._write
        taken: list[bool] = []

        def take_first(fn: Any) -> Any:
            if not taken:
                taken.append(second.storage.set_trial_state_values(b.stored_id,
                                                                   TrialState.RUNNING))
            return write(fn)

        first._write = take_first  # type: ignore[method-assign,assignment]
        assert first.settled()
        assert taken == [True]  # it read the trial WAITING; the second took it first
        assert stored._storage.get_trial(b.stored_id).state == TrialState.RUNNING
        second.our_ids.add(b.stored_id)  # the second's claim, as claim() records it
        assert second.ask(b, lambda t: suggest(t, space)) is None  # lost to the total
        assert stored._storage.get_trial(b.stored_id).state == TrialState.WAITING
        assert second.settled()
        ended = stored._storage.get_trial(b.stored_id)
        assert ended.state == TrialState.FAIL and never_ran(ended)
        assert not [t for t in stored.get_trials(deepcopy=False)
                    if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    finally:
        first.close()
        second.close()


def test_a_repeat_queued_by_the_read_that_finds_the_total_is_ended(
        stored: optuna.Study) -> None:
    """The read that finds the total also fails a dead driver's claim as stale, which
    queues its repeat: that repeat, not in the read, is ended too."""
    space = parse_space(SPACE)
    first, other = _drivers(stored, 1)
    try:
        claim = first.claim()
        assert claim is not None
        trial = first.ask(claim, lambda t: suggest(t, space))
        assert trial is not None
        # a claim of a driver of this host that has exited, taken on a read from before
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dead = stored.ask()
        stored._storage.set_trial_user_attr(dead._trial_id, CLAIM_ATTR,
                                            f"{first.host}:{gone}:abc123")
        first.finish(trial, 0.5)
        first.flush()
        assert first.settled()
        trials = stored.get_trials(deepcopy=False)
        stale = trials[dead.number]
        assert stale.state == TrialState.FAIL and owes_repeat(stale)  # failed, re-queued
        repeat, = [t for t in trials if t.user_attrs.get(REQUEUED_FROM) == dead.number]
        assert repeat.state == TrialState.FAIL and never_ran(repeat)
        assert sum(counted(t) for t in trials) == 1
    finally:
        first.close()
        other.close()


def test_a_claim_of_a_trial_ended_as_it_is_taken_claims_nothing(
        stored: optuna.Study) -> None:
    """A queued trial ended (as stale or surplus) between a driver's taking it and
    writing its name: the claim returns nothing, and the next claim reads again."""
    first, second = _drivers(stored, 2)
    try:
        stored.enqueue_trial({}, user_attrs={REQUEUED_FROM: 0})
        first.refresh(force=True)
        take = first.storage.set_trial_state_values

        def ended_meanwhile(sid: int, state: TrialState, values: Any = None) -> bool:
            got = take(sid, state, values)
            if state == TrialState.RUNNING:
                second.storage.set_trial_state_values(sid, TrialState.FAIL)
            return got

        first.storage.set_trial_state_values = ended_meanwhile  # type: ignore[method-assign]
        assert first.claim() is None
        assert not first.our_ids
    finally:
        first.close()
        second.close()
