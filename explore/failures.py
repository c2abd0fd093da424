"""Why a study's trials failed, in a few lines: its failed trials grouped by reason,
which ``explore run``'s summary and ``explore show`` print and :func:`explore.run`
warns with when every trial of a run failed.

A trial's reason is its record's ``fail_reason`` (:func:`explore.live.names.final_record`),
in full in ``explore show`` and ``explore export``.  A long one, such as a model
builder's traceback, is said here by its :func:`headline`; trials whose headlines differ
only in their numbers (a width, a byte count) share a group.

>>> import optuna
>>> from explore.attrs import RECORD_ATTR
>>> study = optuna.create_study()
>>> for why in ["does not fit: 1,200 bytes", "does not fit: 900 bytes", "interrupted",
...             "surplus: queued when the study reached its total"]:
...     study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
...         RECORD_ATTR: {"fail_reason": why, "retried": not why.startswith("does")}}))
>>> for group in grouped(study.trials):
...     print(group.line())
2 trials (0, 1), e.g. trial 0: does not fit: 1,200 bytes
1 trial (2), failed and queued again (not counted): interrupted
1 trial (3), never ran (not counted): surplus: queued when the study reached its total
"""

from __future__ import annotations

import ntpath
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from explore.attrs import RUNS_ATTR
from explore.live.names import NEVER_RAN, counted, final_record

NO_REASON = "no reason recorded"
# A traceback's frame line: where the innermost frame is, said after the headline.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_NUMBER = re.compile(r"\d(?:[\d,.]*\d)?")  # 12, 1,200, 0.05


def reason(t: FrozenTrial) -> str:
    """Why failed trial ``t`` failed, in full, as its record says."""
    return str(final_record(t).get("fail_reason") or NO_REASON)


def headline(text: str) -> str:
    """A reason in one line: a traceback's first line, its exception and where the
    innermost frame is; any other text as it is, its lines joined.

    >>> headline('the model builder raised:\\n  File "/home/me/m.py", line 9, in build\\n'
    ...          '    raise ValueError(w)\\nValueError: bad width 7')
    'the model builder raised: ValueError: bad width 7 (m.py, line 9, in build)'
    >>> headline("does not fit: needs 12,000 bytes")
    'does not fit: needs 12,000 bytes'
    """
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return NO_REASON
    frames = [m for m in map(_FRAME.match, lines) if m]
    if not frames:
        return " ".join(ln.strip() for ln in lines)
    last = frames[-1]
    # the file's name alone, of a path written on any system (ntpath splits at / and \)
    where = f"{ntpath.basename(last['file'])}, line {last['line']}, in {last['func']}"
    # the exception: the first line after the frames that is not indented (its
    # message may go on over more lines: the first says what it is)
    after = lines[lines.index(last.string) + 1:]
    raised = next((ln for ln in after if not ln[:1].isspace()), after[-1] if after else "")
    return f"{lines[0].rstrip(':')}: {raised.strip()} ({where})"


@dataclass
class FailureGroup:
    """Failed trials that share a reason: their ``numbers``, the first one's
    :func:`headline`, whether every headline is that one (``same``, else they differ in
    their numbers), and whether they failed by an interrupt or a lost process and were
    queued again, not counted (``retried``)."""

    reason: str
    retried: bool
    numbers: list[int] = field(default_factory=list)
    same: bool = True

    def line(self, most: int = 8) -> str:
        """The group in a line: how many trials, which (the first ``most``), why."""
        n = len(self.numbers)
        said = f"{n} trial{'s' * (n != 1)} ({listed(self.numbers, most)})"
        if not self.same:
            said += f", e.g. trial {self.numbers[0]}"
        if self.retried:
            said += ", never ran (not counted)" if self.reason.startswith(NEVER_RAN) \
                else ", failed and queued again (not counted)"
        return f"{said}: {self.reason}"


def listed(numbers: Sequence[int], most: int = 8) -> str:
    """Trial numbers, the first ``most`` - 1 and the last when there are more.

    >>> listed([1, 2, 3]), listed(range(20), most=4)
    ('1, 2, 3', '0, 1, 2, ..., 19')
    """
    ns = [str(n) for n in numbers]
    return ", ".join(ns if len(ns) <= most else [*ns[:most - 1], "...", ns[-1]])


def grouped(trials: Iterable[FrozenTrial]) -> list[FailureGroup]:
    """The failed ones of ``trials`` grouped by reason (headlines alike but for their
    numbers), those that count first, then those with the most trials."""
    groups: dict[tuple[str, bool], FailureGroup] = {}
    for t in trials:
        if t.state != TrialState.FAIL:
            continue
        said = headline(reason(t))
        retried = bool(final_record(t).get("retried"))
        key = (_NUMBER.sub("#", said), retried)
        g = groups.setdefault(key, FailureGroup(said, retried))
        g.numbers.append(t.number)
        g.same = g.same and said == g.reason
    return sorted(groups.values(), key=lambda g: (g.retried, -len(g.numbers), g.numbers[0]))


def run_trials(study: Any, run: dict[str, Any] | None) -> list[FrozenTrial]:
    """The trials of ``study`` that ``run`` (a record of the study's ``runs``) ran: those
    its driver claimed.  None of them for a run recorded without its driver."""
    driver = (run or {}).get("driver")
    if not driver:
        return []
    return [t for t in study.get_trials(deepcopy=False)
            if final_record(t).get("driver") == driver]


def every_one_failed(trials: Iterable[FrozenTrial]) -> bool:
    """Whether at least one of ``trials`` counts and every one that counts failed (those
    failed by an interrupt or a lost process ran again and do not count).

    >>> from optuna.trial import create_trial
    >>> every_one_failed([create_trial(state=TrialState.FAIL)]), every_one_failed([])
    (True, False)
    """
    states = [t.state for t in trials if counted(t)]
    return bool(states) and all(s == TrialState.FAIL for s in states)


def run_failed(study: Any, run: dict[str, Any] | None = None) -> list[FailureGroup]:
    """The failures of ``run`` (default: the study's last) grouped by reason, when
    every trial it ran failed; empty otherwise (a run with a trial that completed or
    was pruned, one that ran none)."""
    if run is None:
        runs = study.user_attrs.get(RUNS_ATTR) or []
        run = runs[-1] if runs else None
    trials = run_trials(study, run)
    return grouped(trials) if every_one_failed(trials) else []


def warn_if_run_failed(study: Any, run: dict[str, Any], stacklevel: int = 1) -> None:
    """Warn (a UserWarning naming the reasons, :func:`run_failed`) when every trial of
    ``run`` failed: what :func:`explore.run` says rather than return as if it had
    searched.  ``stacklevel``: as :func:`warnings.warn`'s, counted from the caller."""
    groups = run_failed(study, run)
    if groups:
        n = sum(len(g.numbers) for g in groups if not g.retried)
        warnings.warn(f"every trial of this run of study {study.study_name!r} failed "
                      f"({n} trial{'s' * (n != 1)}):\n" +
                      "\n".join(f"  {g.line()}" for g in groups), stacklevel=stacklevel + 1)
