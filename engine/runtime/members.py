"""One model of a stack moved into another program: a stack shrinks, or a member
leaves it to run alone, without losing what it learned.

A stack (:mod:`engine.compile.stack`) keeps model k's parameters in slice k of each
stacked parameter (``[K, ...]``; a weight fed by shared data ``[in, K, out]``, its
slice ``[:, k]``), and the optimizer's state slots
mirror the parameter region element for element.  :func:`move_member` copies model
``k`` of one VM into model ``j`` of another (``None``: a VM that runs one unstacked
model): every parameter and every state slot of the base optimizer (Adam's moments,
momentum), device to device, through views of the two heaps; no host copy, nothing
allocated.  The learning rates of a :class:`~engine.runtime.optim.PerModelLR` stay
the target's own (its program was compiled with the member's rate).

What the search does with it (``explore``): a pruned member's stack is restacked
without it, so it stops costing updates, and a member paused at a rung leaves its
stack for a heap of its own while the others go on.

>>> import numpy as np
>>> from engine import SGD, VM, compile_graph
>>> from engine.compile.stack import member_params, stack_graphs, stack_optimizers
>>> from engine.models import paper_mlp
>>> graphs = [paper_mlp((4, 8, 3)) for _ in range(3)]
>>> opt = stack_optimizers([SGD(lr=0.1), SGD(lr=0.2), SGD(lr=0.3)])
>>> three = VM(compile_graph(stack_graphs(graphs), batch_size=8, optimizer=opt), seed=1)
>>> alone = VM(compile_graph(graphs[1], batch_size=8, optimizer=SGD(lr=0.2)))
>>> move_member(three, 1, alone, None)
>>> bool(np.array_equal(alone.get("w0"), member_params(three, 1)["w0"]))
True
"""

from __future__ import annotations

from typing import Any

from engine.errors import EngineError
from engine.runtime.optim import PerModelLR
from engine.runtime.program import Program
from engine.runtime.zones import FORWARD, OPTIMIZER


def models(program: Program) -> int | None:
    """How many models ``program`` stacks, or None for an unstacked one."""
    for ps in program.params:
        if ps.init.method == "stacked":
            return len(ps.init.members or ())
    return None


def base_slots(program: Program) -> int:
    """The optimizer's state slots that hold learned state (a PerModelLR's last slot
    holds the stack's learning rates, which belong to the program, not the model)."""
    opt = program.optimizer
    if opt is None:
        return 0
    return opt.state_slots - (1 if isinstance(opt, PerModelLR) else 0)


def move_member(src: Any, k: int | None, dst: Any, j: int | None) -> None:
    """Copy model ``k`` of VM ``src`` into model ``j`` of VM ``dst`` (``None``: the VM
    runs one unstacked model): parameters, optimizer state, the optimizer's step count
    (Adam's bias correction), the rounds done and the random generator's state.  The
    two programs must be of one architecture and one optimizer kind; a parameter that
    is not stacked (a constant the models share) is copied as it is."""
    sp, dp = src.program, dst.program
    if base_slots(sp) != base_slots(dp):
        raise EngineError(f"program {sp.name!r} keeps {base_slots(sp)} optimizer slots per "
                          f"parameter and {dp.name!r} {base_slots(dp)}: not one optimizer kind")
    for who, index, prog in (("source", k, sp), ("target", j, dp)):
        n = models(prog)
        if (n is None) != (index is None) or (n is not None and not 0 <= index < n):  # type: ignore[operator]
            raise EngineError(f"the {who} program {prog.name!r} "
                              f"{'stacks ' + str(n) + ' models' if n else 'runs one model'}: "
                              f"model {index} is not one of them")
    by_name = {sp.buffers[ps.buffer].name: ps for ps in sp.params}
    slots = base_slots(dp)
    xp = dst.xp
    for dps in dp.params:
        name = dp.buffers[dps.buffer].name
        sps = by_name.get(name)
        if sps is None:
            raise EngineError(f"parameter {name!r} of {dp.name!r} is not in {sp.name!r}")
        places = [(FORWARD, 0, 0)]  # the values, then each slot of a learned one
        if sps.grad is not None and dps.grad is not None:
            places += [(OPTIMIZER, a, b) for a, b in
                       zip(sp.state_offsets[:slots], dp.state_offsets[:slots], strict=True)]
        for zone, at_src, at_dst in places:
            xp.copyto(_member_view(dst, dp, dps, j, zone, at_dst),
                      _member_view(src, sp, sps, k, zone, at_src))
    dst.take_counters(src)


def _member_view(vm: Any, prog: Program, ps: Any, k: int | None, zone: str,
                 base: int) -> Any:
    """Model ``k``'s values of parameter ``ps`` (or of its state slot at ``base`` in the
    optimizer zone) as the member's own shape: a view (strided where the models are
    not the parameter's first axis)."""
    spec = prog.buffers[ps.buffer]
    shape = spec.desc.shape
    whole = vm.heap.view(zone, base + spec.offset, spec.desc.nbytes(), vm.xp.dtype(spec.dtype),
                         shape)
    if k is None or ps.init.method != "stacked":
        return whole
    return ps.init.member(whole, k)


def member_losses(program: Program, path: str = "train") -> str | None:
    """The variable holding each model's own loss (``[K]``) on ``path`` of a stack,
    whose sum is the path's loss; None for an unstacked program or a path without one."""
    pc = program.paths[program.path_index(path)]
    if models(program) is None or pc.loss is None:
        return None
    for ins in program.instrs:
        if pc.loss in ins.outs and ins.op == "ReduceSum":
            return program.buffers[ins.ins[0]].name
    return None
