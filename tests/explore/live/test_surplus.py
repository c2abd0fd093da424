"""Places left queued once a shared study has its total (``LiveStudy.settled``): claims
that raced past the total (two drivers claiming the last place at once) hold more places
than the total, and what is left of them once it is reached is ended as surplus, on each
storage a study can live in; a trial a user queued stays for a later run.  The races
themselves are the drivers' simulation's (``test_stale_races``, ``test_drivers_simulation``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from explore.live import REQUEUED_FROM, LiveStudy, counted
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


def test_a_claim_that_takes_a_surplus_place_while_it_is_ended_gives_it_up(
        stored: optuna.Study) -> None:
    """A driver that read the study before its total was reached takes a given-back
    claim from the queue while another ends it as surplus: whichever write lands
    second, the trial ends FAIL as surplus and the claim gives way to the total."""
    space = parse_space(SPACE)
    first, second = _drivers(stored, 1)
    try:
        a, b = _at_once(first, second)
        trial = first.ask(a, lambda t: suggest(t, space))
        assert trial is not None and second.ask(b, lambda t: suggest(t, space)) is None
        first.finish(trial, 0.5)
        first.flush()
        # the second driver takes the given-back claim (on a read from before the end)
        # between the first's read of the queue and its write
        write = first._write
        taken: list[bool] = []

        def take_first(fn: Any) -> Any:
            if not taken:
                taken.append(second.storage.set_trial_state_values(b.stored_id,
                                                                   TrialState.RUNNING))
            return write(fn)

        first._write = take_first  # type: ignore[method-assign,assignment]
        assert first.settled()
        assert taken == [True]  # it read the trial WAITING, and ended it taken all the same
        ended = stored._storage.get_trial(b.stored_id)
        assert ended.state == TrialState.FAIL and never_ran(ended)
        # the taker's ask finds the total reached and gives the claim back: a no-op now
        second.our_ids.add(b.stored_id)
        assert second.ask(b, lambda t: suggest(t, space)) is None
        assert stored._storage.get_trial(b.stored_id).state == TrialState.FAIL
        assert second.settled()
        assert not [t for t in stored.get_trials(deepcopy=False)
                    if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    finally:
        first.close()
        second.close()
