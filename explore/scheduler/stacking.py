"""Stacked trials: candidates of one architecture and one optimizer kind, asked of the
sampler together, trained as one program (:mod:`engine.compile.stack`).

Most of a hyperparameter search varies the learning rate and the initialisation of a
few architectures.  At small batches such a trial spends more of each step in
per-instruction dispatch than in arithmetic; K of them stacked do K models' work per
dispatch and read each mini-batch once (HFTA's horizontal fusion, the paper's
multi-model scenario).  With ``budget.stack: K`` the scheduler draws up to K trials
at once, groups those whose graphs differ only in their inits and whose optimizers
only in their learning rate (and SGD's momentum: :func:`~engine.compile.stack.stack_key`;
and that train at one batch size), and compiles each
group of two or more as one stacked program, placed as one heap.  A group that does
not stack (an op without a stacking rule) or that does not fit runs its trials one by
one, as without stacking.  A member measures the metrics made of means per model
(accuracy, loss); a space whose objective needs class counts or per-row values
(macro F1, R², ROC AUC) is not stacked (:func:`stacks_for`).

Each member is still a trial of its own: reported, pruned, paused and ended by its
number.  When members leave a stack (pruned, failed), the survivors are *regrouped*
into a smaller stack (:func:`part_program`), so a pruned member stops costing
updates; a member paused at a rung moves to a heap of its own and waits there while
the others go on.  The worker moves each member's parameters and optimizer state
(:func:`engine.runtime.members.move_member`) into the new program, placed beside
the old one in the same arena.

>>> from explore.binding import bind
>>> from explore.space import parse_space
>>> from explore.sampling import fixed
>>> space = parse_space({"dataset": "digits", "budget": {"trials": 2, "rounds": 1,
...     "memory": "64MB", "stack": 2}, "training": {"batch_size": 32}})
>>> params = fixed(space)
>>> drawn = [Drawn(None, params, graph_of(bind(space), params), False) for _ in range(2)]
>>> stacks_for(space), [len(g) for g in groups(drawn)]
(True, [2])
>>> compile_stack(bind(space), drawn, 8_000_000).candidate.program.name
'mlp[x2]'
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

from engine import Program, compile_graph
from engine.compile.stack import stack_graphs, stack_key, stack_optimizers, stack_signature
from explore.binding import BoundSpace
from explore.candidate import compile_candidate, graph_of
from explore.metrics.evaluation import MEANS, ROWS, SUMS, outputs_needed
from explore.optimizers import build_optimizer
from explore.scheduler.placement import Sized, Stack
from explore.space import Space

__all__ = ["Drawn", "Pending", "compile_stack", "graph_of", "groups", "means_only",
           "part_program", "stacks_for"]


@dataclass
class Drawn:
    """A trial asked of the sampler and built, not yet compiled."""

    trial: Any  # optuna.trial.Trial
    params: dict[str, Any]
    graph: Any  # engine.CalcGraph
    requeued: bool

    @functools.cached_property
    def means(self) -> Any:
        """:func:`means_only` of ``graph``, made once: grouping and stacking both read
        it, and each copy of a graph is a deep one."""
        return means_only(self.graph)

    @functools.cached_property
    def key(self) -> tuple[str, str, Any]:
        """What the trials of one stack share (:func:`groups`)."""
        return (stack_signature(self.means), repr(stack_key(build_optimizer(self.params))),
                self.params.get("batch_size"))


@dataclass
class Pending:
    """Compiled and waiting for room: one trial, or a stack of them (``graphs`` and
    ``optimizers``, one per trial, are kept to stack again without some)."""

    trials: list[Any]
    candidate: Sized
    requeued: list[bool]
    graphs: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)

    @property
    def stacked(self) -> bool:
        return len(self.trials) > 1


def stacks_for(space: Space) -> bool:
    """Whether the space's objectives can be scored per member of a stack: each must
    read only means per model (accuracy, loss, ...).  Sums (the class counts of macro
    F1, a regression's R²) and per-row values (ROC AUC) have no per-model form."""
    names = [o.metric for o in space.objectives]
    return set(outputs_needed(names)) <= set(MEANS)


def means_only(graph: Any) -> Any:
    """A copy of ``graph`` without the eval outputs that are not means (sums, per-row
    values): what a member of a stack measures.  Its record then holds the metrics
    made of means (accuracy, loss), not those made of class counts or rows."""
    drop = set(SUMS + ROWS)
    out = copy.deepcopy(graph)
    for p in out.paths:
        gone = [n for n in p.nodes if set(n.outputs) <= drop]
        p.nodes = [n for n in p.nodes if n not in gone]
        for n in gone:
            for o in n.outputs:
                out.variables.pop(o, None)
    out.outputs = [o for o in out.outputs if o not in drop]
    return out


def groups(drawn: list[Drawn]) -> list[list[Drawn]]:
    """``drawn`` in groups that may stack (in the order drawn): graphs equal but for
    their inits, optimizers but for the learning rate (and SGD's momentum), and one
    batch size.  A trial
    that stacks with none is a group of its own."""
    out: dict[Any, list[Drawn]] = {}
    for d in drawn:
        out.setdefault(d.key, []).append(d)
    return list(out.values())


def compile_stack(bound: BoundSpace, group: list[Drawn], share: int) -> Pending:
    """One stacked candidate of ``group`` (at least two trials) fitting ``share`` bytes.
    Raises :class:`~engine.compile.stack.StackError` when the graphs do not stack and
    :class:`~engine.BudgetError` when the stack does not fit."""
    graphs = [d.means for d in group]
    optimizers = [build_optimizer(d.params) for d in group]
    cand = compile_candidate(bound, group[0].params, share, graph=stack_graphs(graphs),
                             optimizer=stack_optimizers(optimizers))
    return Pending([d.trial for d in group], cand, [d.requeued for d in group], graphs,
                   optimizers)


def part_program(stack: Stack, members: list[int]) -> Program:
    """The program of some of ``stack``'s members: a smaller stack, or one member
    alone, compiled for the stack's batch."""
    graphs = [stack.graphs[m] for m in members]
    opts = [stack.optimizers[m] for m in members]
    prog = stack.program
    if len(members) == 1:
        return compile_graph(graphs[0], batch_size=prog.batch_size, optimizer=opts[0],
                             device=prog.device)
    return compile_graph(stack_graphs(graphs), batch_size=prog.batch_size,
                         optimizer=stack_optimizers(opts), device=prog.device)
