"""A candidate: sampled parameters compiled into a program of exactly known size.

Compiling is cheap (milliseconds) and touches no device memory, so the scheduler
compiles every candidate before deciding where — or whether — it runs.

>>> from explore.binding import bind
>>> from explore.space import parse_space
>>> from explore.sampling import fixed
>>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
...     "memory": "64MB"}, "training": {"batch_size": "auto", "auto_max_batch": 128}})
>>> c = compile_candidate(bind(space), fixed(space), share=4_000_000)
>>> c.train_batch, c.program.batch_size, c.program.total_bytes <= 4_000_000
(128, 359, True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine import BeyondMachineError, BudgetError, CalcGraph, Program, compile_graph
from engine.errors import EngineError
from explore import families
from explore.binding import BoundSpace
from explore.families import BuildError
from explore.families.builder import LowTrial, call_builder, graph_of_model, replay
from explore.optimizers import build_optimizer
from explore.utilisation import round_flops

BUILDER_PARAMS = "builder_params"  # in a builder trial's params: what the builder chose


def graph_of(bound: BoundSpace, params: dict[str, Any], eval_loss: bool = True,
             trial: Any = None) -> CalcGraph:
    """The CalcGraph of ``params`` for the space's data set, by the space's family, or
    by its model builder (:mod:`explore.families.builder`): called with ``trial`` (the live
    Optuna trial, which then records what the builder chose in
    ``params["builder_params"]``), else replaying ``params["builder_params"]``, else
    with every range at its low end; and with the data's facts, where it takes them.
    A builder's model that does not give the data's outputs raises
    :class:`~explore.families.builder.OutputMismatch`."""
    if bound.builder is None:
        return families.get(bound.space.model.family).build(params, bound.data,
                                                             eval_loss=eval_loss)
    if trial is None:
        chosen = params.get(BUILDER_PARAMS)
        trial = replay(chosen) if chosen is not None else LowTrial()
    before = set(trial.params)  # what the space's own ranges asked already
    result = call_builder(bound.builder, trial, bound.data)
    if BUILDER_PARAMS not in params:
        params[BUILDER_PARAMS] = {k: v for k, v in trial.params.items() if k not in before}
    return graph_of_model(result, bound.data, params, builder=bound.builder)


@dataclass
class Candidate:
    params: dict[str, Any]
    program: Program
    train_batch: int  # mini-batches of training; the program may be compiled bigger
    # When ``program`` is compiled bigger than the training batch (to validate in larger
    # chunks), the same model compiled for smaller chunks, halving down to the training
    # batch: where the preferred program fits no gap, the scheduler places the largest
    # of these that does.  Compiled when first asked for.
    fallback_batches: tuple[int, ...] = ()
    compile_at: Callable[[int], Program] | None = field(default=None, repr=False)
    _fallbacks: dict[int, Program] = field(default_factory=dict, repr=False)
    # The rows a round trains on and validates (the scheduler's data; 0: not known) and
    # the models its program runs (a stack's members): what its FLOPs are counted over.
    rows: tuple[int, int] = (0, 0)
    models: int = 1
    refresh: int = 0  # training.refresh_statistics: counted where the program has them

    @property
    def heap_bytes(self) -> int:
        return self.program.total_bytes

    @property
    def round_flops(self) -> tuple[int, int]:
        """One model's FLOPs in a round: training on ``rows[0]`` rows in mini-batches of
        ``train_batch``, and validating ``rows[1]`` rows (a stack's divided among its
        models), the refreshed statistics' forward passes counted with validation; see
        :func:`explore.utilisation.round_flops`."""
        return round_flops(self.program, self.train_batch, self.rows, self.models,
                           self.refresh)

    def fitting(self) -> Iterator[Program]:
        """The programs it can run as, preferred (largest) first, each compiled once."""
        yield self.program
        for b in self.fallback_batches:
            if b not in self._fallbacks:
                assert self.compile_at is not None
                self._fallbacks[b] = self.compile_at(b)
            yield self._fallbacks[b]


def halvings(top: int, bottom: int) -> tuple[int, ...]:
    """Batches from ``top`` halving while above ``bottom``, then ``bottom``.

    >>> halvings(10_000, 64)
    (5000, 2500, 1250, 625, 312, 156, 78, 64)
    """
    if bottom < 1:  # the schema refuses such a batch; halving towards it would not end
        raise ValueError(f"a batch size is at least 1, got {bottom}")
    out, b = [], top // 2
    while b > bottom:
        out.append(b)
        b //= 2
    return (*out, bottom) if top > bottom else ()


def compile_candidate(bound: BoundSpace, params: dict[str, Any], share: int,
                      graph: CalcGraph | None = None, optimizer: Any = None, *,
                      fallbacks: bool = True) -> Candidate:
    """Compile ``params``; ``batch_size: auto`` takes the largest batch whose heap fits
    ``share`` bytes (at most ``training.auto_max_batch``).  The program is compiled for
    ``training.eval_batch_size`` when that is bigger and fits: training then runs on a
    prefix of each buffer (the engine's smaller last batch), and validation in chunks
    of the full size (twice as fast at 512 as at 64).  Raises
    :class:`~engine.BudgetError` when even batch 1 does not fit.  ``graph`` and
    ``optimizer`` (default: those of ``params``) may be given: a stack of trials'.
    ``fallbacks=False``: no smaller programs for where the preferred one finds no room
    (a seeded run on one worker: float32 sums over validation chunks of another size
    round otherwise, and its metrics would hang on what else was in memory)."""
    space = bound.space
    if graph is None:  # every metric of the task is reported, loss too
        graph = graph_of(bound, params)
    opt = build_optimizer(params) if optimizer is None else optimizer
    device = space.budget.device
    bs = params["batch_size"]

    def at(b: int) -> Program:
        return compile_graph(graph, batch_size=b, optimizer=opt, device=device)

    if bs == "auto":
        fit = compile_graph(graph, memory=share, optimizer=opt, device=device).batch_size
        train = min(fit, space.training.auto_max_batch)
    else:
        train = int(bs)
        fit = None
    rows = train_rows(bound)
    if rows is not None:  # a mini-batch holds every row at most: no bytes for rows never
        train = max(1, min(train, rows))  # there (the same training, one batch an epoch)
    head = space.dataset.heads[1] if space.dataset is not None else None
    n_valid = bound.data.valid if head is None else min(head, bound.data.valid)
    want = max(train, min(space.training.eval_batch_size, n_valid))
    if fit is not None:
        want = min(want, fit)
    if want > train:
        try:
            bigger: Program | None = at(want)
        except BeyondMachineError:  # the validation chunk is too big: train's may not be
            bigger = None
        if bigger is not None and bigger.total_bytes <= share:
            # Smaller batches need fewer bytes, so the fallbacks fit too; each is
            # compiled only if a gap calls for it (the scheduler asks and places
            # trials one at a time, and filling the arenas waits on it).
            return Candidate(params, bigger, train,
                             halvings(want, train) if fallbacks else (), at)
    prog = at(train)
    if prog.total_bytes > share:
        raise BudgetError(f"the model needs {prog.total_bytes:,} bytes at batch {train}; a "
                          f"worker's arena holds {share:,}")
    return Candidate(params, prog, train)


def train_rows(bound: BoundSpace) -> int | None:
    """The training rows a trial of ``bound`` trains on, where known without loading
    them (a table's count, a built-in set's split, the space's ``train:`` head); None
    where not.

    >>> from explore.binding import bind
    >>> from explore.space import parse_space
    >>> train_rows(bind(parse_space({"dataset": {"name": "digits", "train": 500},
    ...                              "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})))
    500
    """
    head = bound.space.dataset.heads[0] if bound.space.dataset is not None else None
    counts = [n for n in (bound.data.known_train_rows, head) if n is not None]
    return min(counts) if counts else None


def user_errors(bound: BoundSpace) -> tuple[type[Exception], ...]:
    """What building a model raises for its own trial to fail: the user's model code
    fails its own trial, whatever it raised; the run goes on."""
    return (BuildError, EngineError) if bound.uses_builder else (BuildError,)
