"""Where candidates come from: claim a trial of the study, let the sampler choose its
parameters, build its graph and compile it to fit an arena, stacked with others where
they share an architecture and an optimizer kind.  What comes out is a
:class:`~.stacking.Pending`, for the decision core to place; a trial whose model
cannot be built, gives outputs that do not fit the data's classes (a builder's:
:class:`~explore.families.OutputMismatch`) or does not fit an arena fails here, with
its reason, before any worker sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from engine import BudgetError
from engine.compile.stack import StackError
from engine.errors import EngineError
from explore.binding import BoundSpace
from explore.candidate import Candidate, compile_candidate, graph_of, user_errors
from explore.families import BuildError
from explore.live import LiveStudy
from explore.sampling import suggest
from explore.scheduler.stacking import Drawn, Pending, compile_stack, groups
from explore.scheduler.telemetry import RunStats
from explore.study import PARAMS_ATTR

# fail(trial, reason): the trial ends as failed before it started (explore.scheduler.core)
Fail = Callable[[optuna.trial.Trial, str], None]


def draws(stack: int, unclaimed: int, workers: int, asked: int) -> int:
    """How many trials the scheduler's next ask draws at most, having asked ``asked``
    times before: up to ``stack``, and no more than the study's ``unclaimed`` trials over
    the ``workers``; but one in each of the run's first ``workers`` asks where the
    unclaimed trials are more than those asks' stacks would hold.

    Those first single trials make each worker's first result come after one trial's
    rounds, not a stack's: that result is when a user first sees an accuracy, the
    sampler first learns and a pruner first has a value to compare, and a trial alone
    costs about as much per model as a small stack (``docs/measurements.md``).  A study
    the first stacks hold is one wave, which ends soonest all stacked.  The last asks are
    split so that near the end two workers each train a smaller stack, instead of one
    training the last big one while the other waits.

    >>> [draws(8, 60, 2, asked) for asked in range(4)]
    [1, 1, 8, 8]
    >>> draws(8, 16, 2, 0), draws(8, 5, 2, 10), draws(8, 0, 2, 10), draws(1, 60, 2, 0)
    (8, 3, 1, 1)
    """
    if asked < workers and unclaimed > stack * workers:
        return 1
    return max(1, min(stack, -(-unclaimed // max(1, workers))))


class Intake:
    """Asks ``live`` for trials of ``bound``'s space and compiles them to fit ``stats.arena``,
    ``stack`` at a time (1: never stacked); ``notes`` gets each trial's parameters."""

    def __init__(self, bound: BoundSpace, live: LiveStudy, stats: RunStats, notes: dict[int, Any],
                 fail: Fail, stack: int, fallbacks: bool = True,
                 rows: tuple[int, int] = (0, 0)) -> None:
        self.bound, self.live, self.stats, self.notes = bound, live, stats, notes
        self.rows = rows  # a round's training and validation rows: its FLOPs are counted on
        # and the batches forwarded before a validation (batch norms' statistics)
        self.refresh = bound.space.training.statistics_batches()
        self.fail, self.stack = fail, stack
        self.fallbacks = fallbacks  # compile_candidate's: smaller programs where room is short
        self.errors = user_errors(bound)

    def ask(self, most: int | None = None) -> tuple[bool, list[Pending]]:
        """Claim trials of the study (queued ones first), sample, build and compile them:
        one, or up to ``stack`` at once, and at most ``most`` (the scheduler's
        :func:`draws`).  The first is False once the study's total is claimed (and
        nothing was drawn)."""
        drawn: list[Drawn] = []
        claimed_all = False
        for _ in range(self.stack if most is None else max(1, min(self.stack, most))):
            d = self._draw()
            if d is None:
                claimed_all = True
                break
            if isinstance(d, Drawn):
                drawn.append(d)
        if not drawn:
            return not claimed_all, []
        out: list[Pending] = []
        for group in groups(drawn) if self.stack > 1 else [[x] for x in drawn]:
            if len(group) > 1:
                stacked = self._stacked(group)
                if stacked is not None:
                    out.append(stacked)
                    continue
            out.extend(p for p in map(self._alone, group) if p is not None)
        return True, out

    def _draw(self) -> Drawn | bool | None:
        """Claim a trial, sample it and build its graph: None when the study's total is
        claimed, False when the trial failed already (its builder raised)."""
        claim = self.live.claim()
        if claim is None:
            return None
        drawn: dict[str, Any] = {}

        def draw(t: optuna.trial.Trial) -> dict[str, Any]:
            # the last draw is the one kept: a draw given up (a point taken, a duplicate)
            # is drawn again, and the trial trains what the stored trial holds
            drawn["p"] = suggest(t, self.bound.space)
            return drawn["p"]

        trial = self.live.ask(claim, draw)
        if trial is None:
            return None
        params = drawn["p"]
        requeued = self.live.requeued(trial)
        self.notes.setdefault(trial.number, {})[PARAMS_ATTR] = params
        try:
            graph = graph_of(self.bound, params, trial=trial if self.bound.uses_builder
                             else None)
            if self.bound.uses_builder:
                self.live.new_params(trial)  # the builder's own, seen by other drivers
        except self.errors as e:
            self._fail_build(trial, e)
            return False
        return Drawn(trial, params, graph, requeued)

    def _fail_build(self, trial: optuna.trial.Trial, e: Exception) -> None:
        self.fail(trial, str(e) if isinstance(e, BuildError) else f"{type(e).__name__}: {e}")

    def _alone(self, d: Drawn) -> Pending | None:
        try:
            cand = compile_candidate(self.bound, d.params, self.stats.arena, graph=d.graph,
                                     fallbacks=self.fallbacks)
            cand.rows, cand.refresh = self.rows, self.refresh
        except BudgetError as e:
            self.fail(d.trial, f"does not fit: {e}")
            return None
        except self.errors as e:
            self._fail_build(d.trial, e)
            return None
        return Pending([d.trial], cand, [d.requeued])

    def _stacked(self, group: list[Drawn]) -> Pending | None:
        """``group`` as one stack; None if it does not stack or does not fit an arena
        (its trials then run one by one)."""
        try:
            pending = compile_stack(self.bound, group, self.stats.arena)
        except StackError as e:  # an op of the model has no stacked form: none will
            self.stack = 1
            note = f"trials are not stacked: {e}"
            if note not in self.stats.notes:  # said once, though the groups of one ask
                self.stats.notes.append(note)  # each find it
            return None
        except (BudgetError, BuildError, EngineError):
            return None  # too big as a stack, say: its trials run alone
        self.stats.counts["stacked"] = self.stats.counts.get("stacked", 0) + len(group)
        if isinstance(pending.candidate, Candidate):
            pending.candidate.rows, pending.candidate.models = self.rows, len(group)
            pending.candidate.refresh = self.refresh
        return pending
