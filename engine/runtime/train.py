"""Small training helpers over a VM: epochs of shuffled mini-batches, evaluation.

>>> import numpy as np
>>> from engine import VM, Adam, compile_graph
>>> from engine.models import paper_mlp
>>> vm = VM(compile_graph(paper_mlp((4, 8, 3)), batch_size=16, optimizer=Adam(lr=0.05)))
>>> x = np.random.default_rng(0).random((64, 4), dtype=np.float32); y = (x[:, 0] * 3).astype(int)
>>> for _ in range(30): _ = train_epoch(vm, x, y, np.random.default_rng(1))
>>> evaluate(vm, x, y) > 0.8
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engine.runtime.vm import VM

STOP_EVERY = 16  # mini-batches between two calls of train_epoch's ``stop``


def train_epoch(vm: VM, x: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None,
                path: str = "train", batch: int | None = None, loss: str | None = None,
                stop: Callable[[], bool] | None = None) -> Any:
    """One pass over (x, y) in mini-batches of ``batch`` (default: the compiled batch),
    shuffled when ``rng`` is given; returns the sample-weighted mean of ``loss``
    (default: the path's loss): a float, or an array for a non-scalar variable such as
    the per-model losses of a stack (:mod:`engine.compile.stack`).  The data is checked for
    non-finite values once; each shuffled mini-batch's rows are gathered straight into
    the heap, and without ``rng`` each mini-batch is a contiguous slice that
    :meth:`VM.set` reads in place when it can (full-batch training reads the data
    set itself).  ``stop`` is called every ``STOP_EVERY`` mini-batches; when it returns
    True the pass ends there (the round is abandoned: ``end_round`` is not called)
    and the result is None."""
    b = batch or vm.program.batch_size
    n = len(y)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    pc = vm.program.paths[vm.program.path_index(path)]
    if loss is None and pc.loss is not None:
        loss = vm.program.buffers[pc.loss].name
    if vm.check_inputs:
        vm.check("x", x)
        vm.check("y", y)
    total = _Mean()
    slices = rng is None and x.dtype == vm.placeholder_dtype("x") and \
        y.dtype == vm.placeholder_dtype("y")  # else gather says which type is wrong
    for i, start in enumerate(range(0, n, b)):
        if stop is not None and i % STOP_EVERY == 0 and i and stop():
            return None
        rows = order[start:start + b]
        if slices:  # rows start..stop in order: a slice, no gathering
            vm.set("x", x[start:start + b], check=False)
            vm.set("y", y[start:start + b], check=False)
        else:
            vm.gather("x", x, rows, check=False)
            vm.gather("y", y, rows, check=False)
        vm.train_step(path)
        if loss is not None:
            total.add(vm, loss, len(rows))
    vm.end_round()
    return total.value()


def running_statistics(program: Any, path: str = "train") -> bool:
    """Whether ``path``'s forward updates running statistics in place: a batch norm in
    training mode that keeps them (``running_update``, :mod:`engine.ops.norm`)."""
    pc = program.paths[program.path_index(path)]
    return any(program.instrs[i].op == "BatchNormalization" and
               program.instrs[i].attrs.get("running_update") for i in pc.forward)


def refresh_batches(rows: int, batches: int, batch: int) -> int:
    """How many mini-batches :func:`refresh_statistics` forwards: ``batches``, or as many
    whole ``batch``-row mini-batches as ``rows`` training rows hold if fewer.

    >>> refresh_batches(1000, 30, 64), refresh_batches(100, 30, 64)
    (15, 1)
    """
    return max(0, min(batches, rows // max(batch, 1)))


def refresh_statistics(vm: VM, x: np.ndarray, y: np.ndarray, batches: int,
                       path: str = "train", batch: int | None = None, turn: int = 0) -> int:
    """Forward ``batches`` mini-batches of ``batch`` rows of (x, y) through ``path``, the
    weights left as they are, so that its batch norms' running statistics are those of
    the weights now rather than an average over the weights of the round's last steps
    (which lag them: a network validated on them can score far below what it has
    learnt).  Each batch moves a running statistic by the op's momentum: 30 at
    PyTorch's 0.1 leave 4% of what it was.  The rows are spread evenly over the data
    (a data set sorted by class gives each batch every class), shifted by ``turn`` so
    that each call reads others; the heap is not touched beyond the path's own
    buffers.  Returns the batches forwarded (fewer where the data has fewer rows).

    >>> import numpy as np
    >>> from engine import CalcGraph, Init, Mode, VM, compile_graph
    >>> g = CalcGraph(); x = g.placeholder("x", (0, 1)); _ = g.placeholder("y", (0,))
    >>> m = g.parameter("m", (1,), init=Init.zeros(), trainable=False)
    >>> v = g.parameter("v", (1,), init=Init.ones(), trainable=False)
    >>> one, zero = g.parameter("s", (1,), init=Init.ones()), g.parameter("b", (1,))
    >>> _ = g.path("train", Mode.FORWARD_ONLY).BatchNormalization(
    ...     x, one, zero, m, v, training_mode=1, running_update=1, momentum=0.9)
    >>> vm = VM(compile_graph(g, batch_size=4))
    >>> rows = np.full((64, 1), 5.0, np.float32)
    >>> refresh_statistics(vm, rows, np.zeros(64, np.float32), 30, batch=4)
    16
    >>> round(float(vm.get("m")[0]), 2)  # 5 * (1 - 0.9 ** 16)
    4.07
    """
    b = batch or vm.program.batch_size
    n = len(y)
    k = refresh_batches(n, batches, b)
    if k == 0:
        return 0
    stride = n // (k * b)
    # k*b rows evenly spaced, dealt out so that each batch spans the whole data
    rows = np.ascontiguousarray(
        (turn % stride + np.arange(k * b) * stride).reshape(b, k).T)
    for r in rows:
        vm.gather("x", x, r, check=False)
        vm.gather("y", y, r, check=False)
        vm.forward(path)
    return k


class _Mean:
    """A sample-weighted mean of a variable read after each mini-batch: a float for
    a scalar (the common case, kept cheap), an array otherwise."""

    def __init__(self) -> None:
        self.scalar = 0.0
        self.array: np.ndarray | None = None
        self.n = 0

    def add(self, vm: VM, name: str, rows: int) -> None:
        v = vm.view(name)
        self.n += rows
        if v.ndim == 0:
            self.scalar += float(v) * rows
            return
        host = vm.backend.to_host(v).astype(np.float64) * rows
        self.array = host if self.array is None else self.array + host

    def value(self) -> Any:
        n = max(self.n, 1)
        return self.scalar / n if self.array is None else self.array / n


def evaluate(vm: VM, x: np.ndarray, y: np.ndarray, path: str = "eval",
             metric: str = "accuracy") -> Any:
    """Sample-weighted mean of a metric over (x, y) (per model for a stack).  The
    forward programs of the paths whose results ``path`` reads run first (the paper's
    post path reads the learning path's output); a path with its own forward runs
    alone."""
    return evaluate_metrics(vm, x, y, (metric,), path)[metric]


def evaluate_metrics(vm: VM, x: np.ndarray, y: np.ndarray, metrics: Sequence[str],
                     path: str = "eval", check: bool | None = None, sums: Sequence[str] = (),
                     per_row: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """:func:`evaluate` of several metrics in one pass over (x, y): ``{name: mean}``.
    ``sums`` are variables added up over the batches instead (statistics such as
    per-class counts, returned as float64 arrays), and each variable of ``per_row`` has
    its per-row values copied into the given host array of ``len(y)`` rows.  ``check``
    is :meth:`VM.set`'s (default: the VM's ``check_inputs``); a caller that checked the
    data once passes False."""
    b = vm.program.batch_size  # contiguous slices: read in place by VM.set when they can
    first = _feeding_paths(vm, path)
    totals = {m: _Mean() for m in metrics}
    added: dict[str, np.ndarray] = {}
    for start in range(0, len(y), b):
        vm.set("x", x[start:start + b], check=check)  # a slice: one contiguous copy
        vm.set("y", y[start:start + b], check=check)
        for p in first:
            vm.forward(p)
        vm.forward(path)
        rows = len(y[start:start + b])
        for m, total in totals.items():
            total.add(vm, m, rows)
        for m in sums:
            v = vm.backend.to_host(vm.view(m))
            if m in added:
                added[m] += v
            else:
                added[m] = v.astype(np.float64)
        for m, into in (per_row or {}).items():
            into[start:start + rows] = vm.backend.to_host(vm.view(m))
    return {**{m: total.value() for m, total in totals.items()}, **added}


def _feeding_paths(vm: VM, path: str) -> list[str]:
    """The other paths whose forward programs write what ``path``'s forward reads."""
    prog = vm.program
    target = prog.paths[prog.path_index(path)]
    reads = {j for k in target.forward for j in prog.instrs[k].ins}
    out = []
    for pc in prog.paths:
        if pc is not target and any(j in reads for k in pc.forward for j in prog.instrs[k].outs):
            out.append(pc.name)
    return out
