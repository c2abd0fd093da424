"""A trial failed as stale while its driver, stalled rather than gone, writes to it
(``LiveStudy._fail_stale`` against the owner's own writes), and a claimed repeat whose
driver goes quiet before its record (``Claiming._lost``): the schedules of the drivers'
simulation (:mod:`explore.scheduler.drivers_simulation`) that found each, and each
interleaving forced between LiveStudy objects on one in-memory storage.

The protocol under test: the stale-failer writes its verdict under a key of its own
(``STALE_ATTR``), then its copy in the record, then the state; the owner reads that key
before each record it writes and stops if it is condemned; whichever of the two sets the
state reads the finished trial and queues its repeat if the trial does not count
(``owes_repeat``); a record written over the verdict's copy all the same leaves the
verdict to say how the trial ended (``final_record``).  A claimed repeat holds its place
from its claim, whatever its number (``Claiming._holds``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import optuna
import pytest
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from explore.live import REQUEUED_FROM, LiveStudy, counted, simulated
from explore.live.names import STALE_ATTR, final_record
from explore.live.simulated import sim_space
from explore.optuna_adapter import trial_id
from explore.sampling import suggest
from explore.scheduler import drivers_simulated
from explore.scheduler.drivers_simulation import simulate
from explore.study import RECORD_ATTR

T0 = 1_700_000_000.0
GRACE = 60.0  # heartbeats every 5 s: a claim is waited for while silent for 15 s at most


# -- the schedules that found them -----------------------------------------------------------
# Found before the drivers drew ahead (``ahead=False`` plays those very schedules).
REPLAYS = [
    # a stalled owner's record (a launch noted) written between the verdict and the FAIL
    # (seed 55 found it; since a driver with no trial waits for the others' to end
    # rather than leave, seed 7 of the same simulation plays that schedule)
    ({"seed": 7, "slow": 0.3, "drivers": 4, "sampler": "random", "ahead": False}, "stale"),
    ({"seed": 1822, "mishaps": 3.0, "ahead": False}, "stale"),
    # a repeat claimed, its driver stopped before its record; a racing claim counted too
    ({"seed": 1093, "slow": 0.15, "mishaps": 2.0, "ahead": False}, "total"),
    # a stalled claimant that found its claim condemned gave it up while the driver that
    # condemned it stopped before its FAIL: the claim stayed RUNNING, held by no one
    ({"seed": 3394, "slow": 0.15, "mishaps": 2.0, "ahead": False}, "stale"),
]
IDS = ["7", "1822", "1093", "3394"]


@pytest.mark.parametrize("args", [args for args, _ in REPLAYS], ids=IDS)
def test_the_schedules_that_found_them_keep_the_invariants(args: dict[str, Any]) -> None:
    r = simulate(**args)  # a Violation is raised if an invariant breaks
    assert r.counted == r.total


@pytest.fixture
def reads_unseen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The study side's reads of one trial (the checks this fix added) hidden from the
    simulation's randomness and from its count of calls to fail: each seed then plays the
    very schedule that found the bug, up to where the study side now acts otherwise."""
    get = drivers_simulated.SlowStorage.__getattr__

    def unseen(self: Any, name: str) -> Any:
        return getattr(self._storage, name) if name == "get_trial" else get(self, name)

    monkeypatch.setattr(drivers_simulated.SlowStorage, "__getattr__", unseen)
    call = simulated.DriverStorage._call

    def counted_call(self: Any, name: str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        if name == "get_trial":
            return self.shared.get_trial(*args, **kwargs)
        return call(self, name, args, kwargs)

    monkeypatch.setattr(simulated.DriverStorage, "_call", counted_call)
    yield


@pytest.mark.parametrize(("args", "what"), REPLAYS[:3], ids=IDS[:3])
def test_the_very_schedules_that_found_them_keep_the_invariants(
        reads_unseen: None, args: dict[str, Any], what: str) -> None:
    r = simulate(**args)
    assert r.counted == r.total
    if what == "stale":  # the owner found itself condemned and dropped its write
        assert r.events.get("writes dropped", 0) >= 1, r
    else:  # the racing claim gave way; its place, queued, is ended once the total is in
        assert r.events.get("surplus ended") == 1 and not r.gaps, r


# -- the interleavings, forced ---------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Before:
    """A driver's storage whose call ``name`` (with ``state`` among its arguments, if
    given) first runs ``then``, once: another driver's act that lands just before it."""

    def __init__(self, storage: Any, name: str, then: Callable[[], Any],
                 state: TrialState | None = None) -> None:
        self._storage, self._name, self._state = storage, name, state
        self._then: Callable[[], Any] | None = then

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._storage, name)
        if name != self._name:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._then is not None and (self._state is None or
                                           any(a is self._state for a in args)):
                then, self._then = self._then, None
                then()
            return attr(*args, **kwargs)

        return call


def _before(live: LiveStudy, name: str, then: Callable[[], Any],
            state: TrialState | None = None) -> None:
    live.storage = cast(BaseStorage, Before(live.storage, name, then, state))


def _driver(stored: optuna.Study, name: str, clock: Clock, total: int = 2) -> LiveStudy:
    # each on a host of its own: only heartbeats say whether the other lives
    return LiveStudy(stored, sim_space("random"), total=total, device="cpu", grace=GRACE,
                     clock=clock, driver=name, inline=True)


def _owner_and_failer() -> tuple[optuna.Study, LiveStudy, Trial, LiveStudy]:
    """Driver O runs a trial and stalls; driver S, whose clock is past O's grace, is
    about to fail it as stale."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = optuna.create_study(direction="maximize")
    o_clock, s_clock = Clock(), Clock()
    owner = _driver(stored, "host-o:1:o", o_clock)
    claim = owner.claim()
    assert claim is not None
    trial = owner.ask(claim, lambda t: suggest(t, owner.space))
    assert trial is not None
    owner.writer.tick()  # its last heartbeat, at T0
    failer = _driver(stored, "host-s:2:s", s_clock)
    s_clock.now = T0 + 2 * GRACE
    return stored, owner, trial, failer


def _trials(stored: optuna.Study) -> list[FrozenTrial]:
    return stored.get_trials(deepcopy=False)


def _repeats(stored: optuna.Study, number: int) -> list[FrozenTrial]:
    return [t for t in _trials(stored) if t.user_attrs.get(REQUEUED_FROM) == number]


def test_an_owner_resuming_between_the_verdict_and_the_fail_writes_nothing() -> None:
    """The stalled owner notes its trial's launch after the stale verdict is written and
    before the trial is failed: it finds itself condemned and drops that write (its
    other work goes on); the trial fails with its reason, does not count, and is queued
    again once."""
    stored, owner, trial, failer = _owner_and_failer()
    number = owner.stored_number(trial)
    _before(failer, "set_trial_state_values",
            lambda: owner.record(trial, {"worker": 0}), TrialState.FAIL)
    failer.refresh(force=True)
    ended = _trials(stored)[number]
    assert ended.state == TrialState.FAIL and not counted(ended)
    record = ended.user_attrs[RECORD_ATTR]
    assert record["fail_reason"].startswith("stale:") and record["retried"]
    assert "worker" not in record  # the owner wrote nothing over the verdict
    (repeat,) = _repeats(stored, number)
    assert repeat.state == TrialState.WAITING
    assert repeat.system_attrs["fixed_params"] == ended.params
    owner.check()  # not a failure of the storage: the driver goes on
    assert owner.writer.taken_over == 1


def test_a_record_written_over_the_verdict_leaves_the_verdict_to_say_how_it_ended() -> None:
    """A record already on its way when the owner read the verdict's key (written
    straight to the storage here) lands between the verdict and the FAIL: the record
    stands without a reason, and the verdict says how the trial ended; it counts not,
    and is queued again once (decided from the trial as it ended)."""
    stored, owner, trial, failer = _owner_and_failer()
    number, sid = owner.stored_number(trial), owner.ours[trial_id(trial)].stored_id
    mine = {"driver": owner.driver, "worker": 0}
    _before(failer, "set_trial_state_values",
            lambda: owner.raw_storage.set_trial_user_attr(sid, RECORD_ATTR, mine),
            TrialState.FAIL)
    failer.refresh(force=True)
    ended = _trials(stored)[number]
    assert ended.state == TrialState.FAIL and ended.user_attrs[RECORD_ATTR] == mine
    assert final_record(ended)["fail_reason"].startswith("stale:")
    assert ended.user_attrs[STALE_ATTR]["driver"] == owner.driver
    assert not counted(ended) and len(_repeats(stored, number)) == 1


def test_an_owner_that_ends_its_trial_first_keeps_its_result() -> None:
    """The owner completes its trial between the verdict and the FAIL: its result stands
    (counted, with its own record), the FAIL fails, nothing is queued."""
    stored, owner, trial, failer = _owner_and_failer()
    number = owner.stored_number(trial)

    def complete() -> None:
        trial.set_user_attr(RECORD_ATTR, {"rounds": 2})
        owner.finish(trial, 0.5)

    _before(failer, "set_trial_state_values", complete, TrialState.FAIL)
    failer.refresh(force=True)
    ended = _trials(stored)[number]
    assert ended.state == TrialState.COMPLETE and counted(ended)
    assert "fail_reason" not in ended.user_attrs[RECORD_ATTR]
    assert not _repeats(stored, number)
    owner.check()  # no write of the owner failed


@pytest.mark.parametrize("retry", [False, True])
def test_a_failer_that_lands_inside_the_owners_end_queues_the_one_repeat(retry: bool
                                                                         ) -> None:
    """The trial is failed as stale between the owner's record of its end (a failure of
    its own, or its worker died) and its state: the stale FAIL takes, the owner's state
    fails, and the repeat is queued once (by the failer only)."""
    stored, owner, trial, failer = _owner_and_failer()
    number = owner.stored_number(trial)
    _before(owner, "set_trial_state_values",
            lambda: failer.refresh(force=True), TrialState.FAIL)
    trial.set_user_attr(RECORD_ATTR, {"fail_reason": "diverged"})
    owner.finish(trial, state=TrialState.FAIL, retry=retry)
    ended = _trials(stored)[number]
    assert ended.state == TrialState.FAIL and not counted(ended)
    assert final_record(ended)["fail_reason"].startswith("stale:")
    assert len(_repeats(stored, number)) == 1
    owner.check()  # its end dropped, as the trial ended already; the driver goes on
    assert owner.writer.taken_over == 1


def test_an_owner_whose_fail_takes_over_the_verdict_queues_the_repeat() -> None:
    """The verdict and its copy land between the owner's record of its own failure and
    its state, and the owner's state takes (the stale FAIL comes after): the trial as it
    ended says stale and retried, so the owner, whose write ended it, queues the repeat
    (the point is not lost), and the failer, whose FAIL fails, queues none."""
    stored, owner, trial, failer = _owner_and_failer()
    number, sid = owner.stored_number(trial), owner.ours[trial_id(trial)].stored_id
    verdict = {"fail_reason": "stale: its driver sent no heartbeat", "retried": True,
               "failed_by": failer.driver}

    def verdict_only() -> None:  # the failer's first two writes, not yet its state
        raw = failer.raw_storage
        raw.set_trial_user_attr(sid, STALE_ATTR, {**verdict, "driver": owner.driver})
        raw.set_trial_user_attr(sid, RECORD_ATTR, {"driver": owner.driver, **verdict})

    _before(owner, "set_trial_state_values", verdict_only, TrialState.FAIL)
    trial.set_user_attr(RECORD_ATTR, {"fail_reason": "diverged"})
    owner.finish(trial, state=TrialState.FAIL)
    owner.check()
    failer.refresh(force=True)  # too late: the trial has ended
    ended = _trials(stored)[number]
    assert ended.state == TrialState.FAIL and not counted(ended)
    (repeat,) = _repeats(stored, number)
    assert repeat.system_attrs["fixed_params"] == ended.params


def test_a_claimed_repeat_holds_its_place_before_its_record() -> None:
    """A repeat taken from the queue by a driver that then goes quiet (no record yet)
    while another driver's claim, which raced it for the study's last place, checks the
    claims before it: the repeat counts however it ends (failed as stale, a repeat
    counts), so the racing claim gives way; the total is never exceeded."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = optuna.create_study(direction="maximize")
    clock = Clock()
    first = _driver(stored, "host-a:1:a", clock, total=1)
    claim = first.claim()
    assert claim is not None
    trial = first.ask(claim, lambda t: suggest(t, first.space))
    assert trial is not None
    trial.set_user_attr(RECORD_ATTR, {"fail_reason": "worker 0 died"})
    first.finish(trial, state=TrialState.FAIL, retry=True)  # its repeat, queued
    first.close()
    quiet = _driver(stored, "host-b:2:b", clock, total=1)
    racer_clock = Clock()
    racer = _driver(stored, "host-c:3:c", racer_clock, total=1)
    (waiting,) = [t for t in _trials(stored) if t.state == TrialState.WAITING]

    taken: list[Any] = []
    # the racer read the study with the repeat still queued; the quiet driver takes it
    # just before the racer tries to, and the racer makes a new trial instead
    _before(racer, "set_trial_state_values",
            lambda: taken.append(quiet.claim()), TrialState.RUNNING)
    quiet.writer.tick()  # its last heartbeat, at T0
    racer_clock.now = T0 + 20.0  # quiet for longer than a claim is waited for
    late = racer.claim()
    assert taken[0] is not None and taken[0].number == waiting.number
    assert late is not None and late.number > waiting.number
    assert racer.ask(late, lambda t: suggest(t, racer.space)) is None  # gave way
    assert _trials(stored)[late.number].state == TrialState.WAITING
    racer_clock.now = T0 + 2 * GRACE
    racer.refresh(force=True)  # the quiet repeat failed as stale: it counts
    ended = _trials(stored)[waiting.number]
    assert ended.state == TrialState.FAIL and counted(ended)
    assert sum(counted(t) for t in _trials(stored)) == 1
    racer.close()


@pytest.mark.parametrize("failed_first", [True, False])
def test_a_quiet_repeat_numbered_after_a_claim_keeps_it_out(failed_first: bool) -> None:
    """Two repeats queued for the study's last place: a driver whose view still has
    both queued takes the later one (the earlier was taken just before) and goes quiet
    before its record; failed as stale, it counts (a repeat is not queued again).  The
    earlier repeat, checked before or after that, counts it though its number is higher
    (it would have waited for the earlier one, had its driver not gone quiet), and
    gives way: the total is never exceeded."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = optuna.create_study(direction="maximize")
    clock = Clock()
    first = _driver(stored, "host-a:1:a", clock)
    claim = first.claim()
    assert claim is not None
    trial = first.ask(claim, lambda t: suggest(t, first.space))
    assert trial is not None
    point = dict(_trials(stored)[0].params)
    trial.set_user_attr(RECORD_ATTR, {"rounds": 2})
    first.finish(trial, 0.5)  # one place of two taken
    first.close()
    for source in (90, 91):  # two repeats queued, as _requeue does
        stored.enqueue_trial(point, user_attrs={REQUEUED_FROM: source})
    early_number, late_number = (t.number for t in _trials(stored)
                                 if t.state == TrialState.WAITING)
    racer_clock = Clock()
    racer = _driver(stored, "host-c:3:c", racer_clock)
    quiet = _driver(stored, "host-b:2:b", clock)
    early: list[Any] = []
    _before(quiet, "set_trial_state_values",
            lambda: early.append(racer.claim()), TrialState.RUNNING)
    late = quiet.claim()
    assert early[0] is not None and early[0].number == early_number
    assert late is not None and late.number == late_number
    quiet.writer.tick()  # its last heartbeat, at T0
    if failed_first:
        racer_clock.now = T0 + 2 * GRACE
        racer.refresh(force=True)  # the quiet driver's repeat failed as stale: it counts
        assert counted(_trials(stored)[late_number])
    assert racer.ask(early[0], lambda t: suggest(t, racer.space)) is None  # gave way
    assert _trials(stored)[early_number].state == TrialState.WAITING
    racer_clock.now = T0 + 2 * GRACE
    racer.refresh(force=True)
    assert counted(_trials(stored)[late_number])
    assert sum(counted(t) for t in _trials(stored)) == 2
    racer.close()


def test_a_claim_condemned_by_a_failer_that_stopped_before_its_fail_is_ended() -> None:
    """The claimant stalls between its claim and the claim's write; a driver finds it
    silent, writes its verdict and stops before the FAIL.  Resumed, the claimant finds
    itself condemned and gives the claim up: it ends the trial itself (left RUNNING
    under its name, its heartbeats would keep it from ever turning stale), which then
    does not count and is queued again once, with the claim's point."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = optuna.create_study(direction="maximize")
    owner = _driver(stored, "host-o:1:o", Clock())
    claim = owner.claim()
    assert claim is not None
    verdict = {"fail_reason": "stale: its driver sent no heartbeat", "retried": True,
               "failed_by": "host-s:2:s", "driver": owner.driver}
    _before(owner, "set_trial_user_attr", lambda: owner.raw_storage.set_trial_user_attr(
        claim.stored_id, STALE_ATTR, verdict))
    assert owner.ask(claim, lambda t: suggest(t, owner.space)) is None
    owner.check()  # not a failure of the storage
    ended = _trials(stored)[claim.number]
    assert ended.state == TrialState.FAIL and not counted(ended)
    (repeat,) = _repeats(stored, claim.number)
    assert repeat.system_attrs["fixed_params"] == ended.params and ended.params
