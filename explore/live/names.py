"""The names a study's storage holds for explore, and the small types of the study side:
which attributes the drivers write (:data:`CLAIM_ATTR`, :data:`REQUEUED_FROM`,
:data:`STALE_ATTR`, the heartbeat and storage-time prefixes, the flat copies of a record,
:data:`FLAT`), what a driver is called, how a trial ended (:func:`final_record`), which
trials count towards the total and which are owed a repeat, and a claim."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from explore.attrs import (
    CLAIM_ATTR,
    FLAT,
    HEARTBEAT_PREFIX,
    PARAMS_ATTR,
    RECORD_ATTR,
    REQUEUED_FROM,
    STALE_ATTR,
    STORAGE_TIME_PREFIX,
)

__all__ = ["CLAIM_ATTR", "FLAT", "GAVE_UP", "GRACE", "HEARTBEAT_EVERY", "HEARTBEAT_PREFIX",
           "NEVER_RAN", "PARAMS_ATTR", "RECORD_ATTR", "REFRESH_EVERY", "REQUEUED_FROM",
           "STALE_ATTR", "STORAGE_TIME_PREFIX", "SURPLUS", "Claim", "Ours", "WriteFailed",
           "counted", "driver_host_pid", "driver_name", "final_record", "never_ran",
           "owes_repeat"]

HEARTBEAT_EVERY = 5.0  # seconds between a driver's heartbeats
REFRESH_EVERY = 2.0  # seconds between reads of the other drivers' trials
GRACE = 60.0  # default seconds of silence after which a driver's trials are stale
# How the reason of a claim given up in LiveStudy.ask begins (its grid point taken): it
# fails "retried", so as not to count, but it never ran and is owed no repeat.
GAVE_UP = "its grid point"
# How the reason of a queued trial ended once the study had its total begins
# (LiveStudy.settled): a place that claims racing past the total left queued.  It too
# fails "retried" and is owed no repeat.
SURPLUS = "surplus"
# The reasons of trials that never ran: not counted, owed no repeat.
NEVER_RAN = (GAVE_UP, SURPLUS)


class WriteFailed(RuntimeError):
    """A call to the study's storage failed (a write, or a read during the run): the
    run stops at once.  The message says what it means (:func:`explore.storages.explain`)."""


def final_record(t: FrozenTrial) -> dict[str, Any]:
    """How failed trial ``t`` ended, as its record (``RECORD_ATTR``) says, or, where a
    stale trial's record lacks its reason, with the verdict of the driver that failed it
    (:data:`STALE_ATTR`): its stalled driver wrote its record over the verdict's copy
    after the verdict was given and before the trial was failed.  Any other trial's
    record as it is.

    >>> from optuna.trial import create_trial
    >>> t = create_trial(state=TrialState.FAIL, user_attrs={
    ...     RECORD_ATTR: {"driver": "a:1:x"},
    ...     STALE_ATTR: {"fail_reason": "stale: ...", "retried": True, "failed_by": "b:2:y"}})
    >>> final_record(t)["retried"], counted(t)
    (True, False)
    """
    record = t.user_attrs.get(RECORD_ATTR) or {}
    verdict = t.user_attrs.get(STALE_ATTR)
    if t.state != TrialState.FAIL or "fail_reason" in record or not isinstance(verdict, dict):
        return record
    return {**record, **{k: verdict[k] for k in ("fail_reason", "retried", "failed_by")
                         if k in verdict}}


def counted(t: FrozenTrial) -> bool:
    """Whether ``t`` counts towards the study's ``budget.trials``: it ended on its own
    (a trial failed because its driver or worker died, or by an interrupt, was
    re-queued and its repeat counts instead; a claim given up never ran)."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and not final_record(t).get("retried")


def owes_repeat(t: FrozenTrial) -> bool:
    """Whether finished trial ``t`` is owed a repeat: it failed without counting, and
    not as a claim given up.  Read once the trial is finished (it cannot change any
    more), by the one driver whose write finished it, which then queues the repeat:
    so a trial is re-queued exactly when it does not count, whoever's record stands."""
    return t.state == TrialState.FAIL and bool(final_record(t).get("retried")) and \
        not never_ran(t)


def never_ran(t: FrozenTrial) -> bool:
    """Whether failed trial ``t`` never ran: a claim given up (its grid point taken) or a
    place left queued once the study had its total (:data:`NEVER_RAN`).

    >>> from optuna.trial import create_trial
    >>> t = create_trial(state=TrialState.FAIL, user_attrs={RECORD_ATTR: {
    ...     "fail_reason": "surplus: the study had its 8 trials", "retried": True}})
    >>> never_ran(t), counted(t), owes_repeat(t)
    (True, False, False)
    """
    return t.state == TrialState.FAIL and \
        str(final_record(t).get("fail_reason", "")).startswith(NEVER_RAN)


def driver_name() -> str:
    """This process's name as a driver: host, pid and a random tag (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def driver_host_pid(name: Any) -> tuple[str | None, int | None]:
    """The host and pid of a :func:`driver_name` (None, None for anything else).

    >>> driver_host_pid("node-3:4242:ab12cd"), driver_host_pid(None)
    (('node-3', 4242), (None, None))
    """
    parts = name.split(":") if isinstance(name, str) else []
    if len(parts) < 3 or not parts[-2].isdigit():
        return None, None
    return ":".join(parts[:-2]), int(parts[-2])



@dataclass
class Claim:
    """A trial of the storage this driver took (RUNNING, no parameters yet): a new
    one, or one taken from the queue with the parameters it was queued with."""

    stored_id: int
    number: int
    fixed: dict[str, Any] | None = None  # a queued trial's parameters
    requeued_from: int | None = None


@dataclass
class Ours:
    """One of this driver's trials: its id and number in the storage."""

    stored_id: int
    number: int
    requeued_from: int | None
    reported: set[int] = field(default_factory=set)
    params: set[str] = field(default_factory=set)  # written to the storage
