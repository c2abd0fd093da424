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

import numpy as np

from engine.vm import VM


def train_epoch(vm: VM, x: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None,
                path: str = "train", batch: int | None = None) -> float:
    """One pass over (x, y) in mini-batches of ``batch`` (default: the compiled batch),
    shuffled when ``rng`` is given; returns the mean training loss.  The data is
    checked for non-finite values once, and each mini-batch's rows are gathered
    straight into the heap."""
    b = batch or vm.program.batch_size
    n = len(y)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    pc = vm.program.paths[vm.program.path_index(path)]
    loss_name = vm.program.buffers[pc.loss].name if pc.loss is not None else None
    if vm.check_inputs:
        vm.check("x", x)
        vm.check("y", y)
    total = 0.0
    for start in range(0, n, b):
        rows = order[start:start + b]
        vm.gather("x", x, rows, check=False)
        vm.gather("y", y, rows, check=False)
        vm.train_step(path)
        if loss_name is not None:
            total += float(vm.view(loss_name)) * len(rows)
    vm.end_round()
    return total / max(n, 1)


def evaluate(vm: VM, x: np.ndarray, y: np.ndarray, path: str = "eval",
             metric: str = "accuracy") -> float:
    """Sample-weighted mean of a scalar metric over (x, y).  The forward programs of
    the paths whose results ``path`` reads run first (the paper's post path reads the
    learning path's output); a path with its own forward runs alone."""
    b = vm.program.batch_size
    first = _feeding_paths(vm, path)
    total = 0.0
    for start in range(0, len(y), b):
        vm.set("x", x[start:start + b])
        vm.set("y", y[start:start + b])
        for p in first:
            vm.forward(p)
        vm.forward(path)
        total += float(vm.view(metric)) * len(y[start:start + b])
    return total / max(len(y), 1)


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
