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
stack for a heap of its own while the others go on.  A member can also leave straight
for a file (:meth:`VM.write_member_state`, laid out by :func:`member_parts`): the
stream its own program's VM would write after :func:`move_member`, byte for byte, so
that a VM of that program reads it back (:meth:`VM.read_state`) with no heap of its
own in between.

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

from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.runtime.optim import PerModelLR
from engine.runtime.program import Program
from engine.runtime.state import Pieces, initial_bytes, initial_slots
from engine.runtime.zones import FORWARD, OPTIMIZER, WORKSPACE

GAP_BUFFER = 64 << 10
"""Host bytes :func:`member_parts` writes the values of a program's gaps through (a few
bytes of alignment between parameters, where a member is written)."""


def models(program: Program) -> int | None:
    """How many models ``program`` stacks, or None for an unstacked one."""
    for ps in program.params:
        if ps.init.method == "stacked":
            return len(ps.init.members or ())
    return None


def base_slots(program: Program) -> int:
    """The optimizer's state slots that hold learned state (a PerModelLR's last slots
    hold the stack's learning rates and momenta, which belong to the program, not the
    model)."""
    opt = program.optimizer
    if opt is None:
        return 0
    return opt.state_slots - (opt.per_model_slots if isinstance(opt, PerModelLR) else 0)


def move_member(src: Any, k: int | None, dst: Any, j: int | None) -> None:
    """Copy model ``k`` of VM ``src`` into model ``j`` of VM ``dst`` (``None``: the VM
    runs one unstacked model): parameters, optimizer state, the optimizer's step count
    (Adam's bias correction), the rounds done and the random generator's state.  The
    two programs must be of one architecture and one optimizer kind; a parameter that
    is not stacked (a constant the models share) is copied as it is."""
    sp, dp = src.program, dst.program
    xp = dst.xp
    for dps, sps, places in _pairs(sp, k, dp, j):
        for zone, at_src, at_dst in places:
            xp.copyto(_member_view(dst, dp, dps, j, zone, at_dst),
                      _member_view(src, sp, sps, k, zone, at_src))
    dst.take_counters(src)


def _pairs(sp: Program, k: int | None, dp: Program, j: int | None
           ) -> Iterator[tuple[Any, Any, list[tuple[str, int, int]]]]:
    """Each parameter of ``dp`` with its namesake in ``sp`` and where model ``k``'s
    values go to model ``j``'s: ``(zone, base in the source's zone, base in the
    target's)``, the values (in the forward zone) and each base slot of a parameter
    both learn (in the optimizer zone), after checking that the two programs can
    hold one model."""
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
    for dps in dp.params:
        name = dp.buffers[dps.buffer].name
        sps = by_name.get(name)
        if sps is None:
            raise EngineError(f"parameter {name!r} of {dp.name!r} is not in {sp.name!r}")
        places = [(FORWARD, 0, 0)]  # the values, then each slot of a learned one
        if sps.grad is not None and dps.grad is not None:
            places += [(OPTIMIZER, a, b) for a, b in
                       zip(sp.state_offsets[:slots], dp.state_offsets[:slots], strict=True)]
        yield dps, sps, places


def member_parts(src: Any, k: int, program: Program) -> list[Pieces]:
    """The parts of the state stream (:func:`~engine.runtime.state.write_stream`) that
    a VM of ``program`` (one unstacked model) would write (:meth:`VM.write_state`)
    once :func:`move_member` had copied model ``k`` of VM ``src`` (a stack) into it:
    its parameter prefix and its optimizer zone, byte for byte, made from views of
    ``src``'s heap where the model's values are and from what
    :func:`~engine.runtime.state.write_initial` writes elsewhere (alignment gaps:
    zeros in the forward zone, a slot's initial value in the optimizer zone; whole
    slots ``move_member`` leaves as they are).

    No host copy of the model: a member's contiguous slice of a parameter (models
    along the first axis) goes to the file from where it is; a strided one (a weight
    ``[in, K, out]``) is first copied into ``src``'s workspace zone, whose bytes are
    rewritten before they are read (at least the stack's parameter region, so at
    least one parameter of one model), a block of rows at a time where it holds
    less; a device's bytes then cross through the stream's bounded host buffer.  The
    host memory taken beyond that buffer is one buffer of at most
    :data:`GAP_BUFFER` bytes for the gaps' values.  The parts
    are drawn while the file is written: ``src`` must not run meanwhile."""
    sp = src.program
    holes: dict[str, list[tuple[int, Any]]] = {FORWARD: [], OPTIMIZER: []}
    for dps, sps, places in _pairs(sp, k, program, None):
        spec = program.buffers[dps.buffer]
        for zone, at_src, at_dst in places:
            view = _member_view(src, sp, sps, k, zone, at_src)
            if tuple(view.shape) != spec.shape or np.dtype(view.dtype) != np.dtype(spec.dtype):
                raise EngineError(f"parameter {spec.name!r} of {program.name!r} is "
                                  f"{spec.dtype}{list(spec.shape)}; model {k} of "
                                  f"{sp.name!r} holds {view.dtype}{list(view.shape)}")
            holes[zone].append((at_dst + spec.offset, view))
    dt, values = initial_slots(program)
    region = program.param_region
    slots = list(zip(program.state_offsets, values, strict=True))
    buf = np.empty(min(GAP_BUFFER, max(region, program.state_bytes)) + 2 * dt.itemsize,
                   dtype=np.uint8)
    ws = src.heap.zones[WORKSPACE][: sp.zone_bytes[WORKSPACE]]

    def between(zone: str, start: int, stop: int) -> Iterator[Any]:
        """What a fresh VM of ``program`` holds in bytes [start, stop) of the zone."""
        edges = [(0, None, start, stop)] if zone == FORWARD else \
            [(a, v, max(start, a), min(stop, a + region)) for a, v in slots]
        at = start
        for base, value, lo, hi in sorted((e for e in edges if e[2] < e[3]),
                                          key=lambda e: e[0]):
            if at < lo:
                yield from initial_bytes(0, dt, at, lo, buf)
            yield from initial_bytes(value, dt, lo - base, hi - base, buf)
            at = hi
        if at < stop:
            yield from initial_bytes(0, dt, at, stop, buf)

    def pieces(zone: str, size: int) -> Iterator[Any]:
        at = 0
        for offset, view in sorted(holes[zone], key=lambda h: h[0]):
            yield from between(zone, at, offset)
            yield from _contiguous(src.xp, view, ws)
            at = offset + int(view.nbytes)
        yield from between(zone, at, size)

    return [Pieces(program.state_bytes, lambda: pieces(FORWARD, program.state_bytes)),
            Pieces(program.zone_bytes[OPTIMIZER],
                   lambda: pieces(OPTIMIZER, program.zone_bytes[OPTIMIZER]))]


def _contiguous(xp: Any, view: Any, ws: Any) -> Iterator[Any]:
    """The bytes of ``view`` in C order, as uint8 views: itself where it is
    contiguous, else copied into ``ws`` (the workspace) a block of rows at a time."""
    if view.flags.c_contiguous:
        yield view.reshape(-1).view(xp.uint8)
        return
    rows = view.shape[0]
    row = int(view.nbytes) // rows
    block = int(ws.nbytes) // row
    if not block:
        raise EngineError(f"a workspace of {int(ws.nbytes):,} bytes cannot stage a row "
                          f"of {row:,}")
    for a in range(0, rows, block):
        b = min(rows, a + block)
        staged = ws[: (b - a) * row]
        xp.copyto(staged.view(view.dtype).reshape((b - a, *view.shape[1:])), view[a:b])
        yield staged


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
