"""The names a study's storage holds for explore, and the small types of the study side:
which attributes the drivers write (:data:`CLAIM_ATTR`, :data:`REQUEUED_FROM`, the
heartbeat and storage-time prefixes, the flat copies of a record, :data:`FLAT`), what a
driver is called, which trials count towards the total, and a claim."""

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
    STORAGE_TIME_PREFIX,
)

__all__ = ["CLAIM_ATTR", "FLAT", "GRACE", "HEARTBEAT_EVERY", "HEARTBEAT_PREFIX",
           "PARAMS_ATTR", "RECORD_ATTR", "REFRESH_EVERY", "REQUEUED_FROM",
           "STORAGE_TIME_PREFIX", "Claim", "Ours", "WriteFailed", "counted", "driver_host_pid",
           "driver_name"]

HEARTBEAT_EVERY = 5.0  # seconds between a driver's heartbeats
REFRESH_EVERY = 2.0  # seconds between reads of the other drivers' trials
GRACE = 60.0  # default seconds of silence after which a driver's trials are stale


class WriteFailed(RuntimeError):
    """A call to the study's storage failed (a write, or a read during the run): the
    run stops at once.  The message says what it means (:func:`explore.storages.explain`)."""


def counted(t: FrozenTrial) -> bool:
    """Whether ``t`` counts towards the study's ``budget.trials``: it ended on its own
    (a trial failed because its driver or worker died, or by an interrupt, was
    re-queued and its repeat counts instead)."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and not t.user_attrs.get(RECORD_ATTR, {}).get("retried")


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
