"""The compiler: CalcGraph -> Program, sized exactly before anything runs.

Passes, in order: ``validate`` (and lower to the IR) -> ``infer_shapes`` ->
``mark_outputs`` -> the graph optimisations (``passes=``, a list of names: see
:mod:`engine.compile.passes.pipeline`) -> ``differentiate`` -> lifetime analysis ->
``plan_memory`` (``sharing=``: ``"auto"``, ``"best_fit"``, ``"greedy_by_size"`` or
``"none"``)
-> ``emit``.  Two entry points:

- ``compile_graph(g, batch_size=B)``: the program for batch ``B``; its
  ``zone_bytes`` are exactly what the heap will allocate.
- ``compile_graph(g, memory=M)``: the program for the largest batch ``b`` with
  ``bytes(b) <= M < bytes(b + 1)``, found with O(log b) sizings
  (:func:`max_batch`); a :class:`~engine.errors.BudgetError` when batch 1 does not fit.

>>> from engine import CalcGraph, Init, Mode, compile_graph, size
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 100)); w = g.parameter("w", (100, 10), init=Init.zeros())
>>> p = g.path("f", Mode.FORWARD_ONLY); y = p.MatMul(x, w)
>>> size(g, 32)["forward"]
18112
>>> print(compile_graph(g, batch_size=32).plan_report())  # doctest: +NORMALIZE_WHITESPACE
zone         no sharing        planned    lower bound  planned/bound
forward          18,112         18,112         18,112          1.000
gradient              0              0              0          1.000
optimizer             0              0              0          1.000
workspace             0              0              0          1.000
total            18,112         18,112         18,112          1.000
>>> compile_graph(g, memory=100_000).batch_size
217

"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import attrgetter

from engine.autotune import autotune_enabled
from engine.compile.autodiff import differentiate
from engine.compile.passes.ir import IR
from engine.compile.passes.liveness import analyze
from engine.compile.passes.outputs import Keep, mark_outputs
from engine.compile.passes.pipeline import PassList, run_passes
from engine.compile.passes.shapes import infer_shapes, typecheck
from engine.compile.passes.validate import validate
from engine.compile.planner import MemoryPlan, Planner, plan_memory
from engine.compile.tunable import pin_groups
from engine.errors import BeyondMachineError, BudgetError, CompileError
from engine.graph import CalcGraph, Device, DType
from engine.runtime.optim import Optimizer
from engine.runtime.program import BufferSpec, Instr, ParamSpec, PathCode, Program

MAX_BATCH = 1 << 40
_DTYPE_NAME = {d: d.value for d in DType}  # Enum.value is slow in a 30,000-buffer loop


def lower(graph: CalcGraph, optimizer: Optimizer | None = None, debug: bool = False,
          passes: PassList = None, keep: Keep = None) -> IR:
    """Run the graph-level passes (everything but planning and emission)."""
    ir = validate(graph)
    ir = infer_shapes(ir)
    if debug:
        typecheck(ir, "infer_shapes")
    ir = mark_outputs(ir, graph, keep)
    ir.counts["nodes_before"] = ir.count_forward_nodes()
    ir = run_passes(ir, passes, debug)
    ir.counts["nodes_after"] = ir.count_forward_nodes()
    if optimizer is not None and not any(p.loss for p in ir.paths):
        raise CompileError(
            f"an optimizer ({optimizer.name}) was given but graph {graph.name!r} has no "
            "BACKWARD_ENABLED path: there is nothing to update"
        )
    ir = differentiate(ir)
    if debug:
        typecheck(ir, "differentiate")
    return pin_groups(ir)


def size(graph: CalcGraph, batch_size: int, optimizer: Optimizer | None = None,
         device: Device | str | None = None, passes: PassList = None, keep: Keep = None,
         sharing: str = "auto", autotune: bool | None = None) -> dict[str, int]:
    """Exact bytes per zone for ``batch_size``, without emitting a program."""
    ir = lower(graph, optimizer, passes=passes, keep=keep)
    dev = Device(device or graph.device).value
    return plan_memory(ir, _check_batch(batch_size), optimizer, dev, sharing,
                       autotune=autotune_enabled(autotune)).zone_bytes


def max_batch(sizing: Callable[[int], int], memory: int, what: str = "the program") -> int:
    """Largest ``b`` with ``sizing(b) <= memory`` (``sizing`` non-decreasing), by
    galloping then bisection: O(log b) calls."""
    need1 = sizing(1)
    if need1 > memory:
        raise BudgetError(f"{what} needs {need1:,} bytes at batch 1, more than the budget of "
                          f"{memory:,} bytes")
    lo = 1  # fits
    hi = 2
    while sizing(hi) <= memory:
        lo = hi
        if hi >= MAX_BATCH:
            return hi
        hi *= 2
    while hi - lo > 1:  # sizing(lo) fits, sizing(hi) does not
        mid = (lo + hi) // 2
        if sizing(mid) <= memory:
            lo = mid
        else:
            hi = mid
    return lo


def compile_graph(
    graph: CalcGraph,
    *,
    batch_size: int | None = None,
    memory: int | None = None,
    optimizer: Optimizer | None = None,
    device: Device | str | None = None,
    debug: bool = False,
    passes: PassList = None,
    keep: Keep = None,
    sharing: str = "auto",
    autotune: bool | None = None,
) -> Program:
    """Compile ``graph`` for a batch size, or for the largest batch that fits ``memory``.

    ``passes``: the graph optimisations to run, by name (default
    :data:`~engine.compile.passes.pipeline.DEFAULT_PASSES`; ``()`` for none).  ``keep``:
    variables to keep readable besides the graph's outputs and losses (``"all"``:
    every one).  ``sharing``: how buffers with disjoint lifetimes share memory
    (``"auto"``, ``"best_fit"``, ``"greedy_by_size"``, or ``"none"``: no sharing and no
    in-place; see :mod:`engine.compile.packing`).
    ``debug``: verify the IR after every pass.  ``autotune``: mark the instructions a
    kernel auto-tuner may choose variants for, their workspace sized for every candidate
    (:mod:`engine.autotune`; default: the ``ENGINE_AUTOTUNE`` environment variable, off
    when unset).
    """
    if (batch_size is None) == (memory is None):
        raise CompileError("give exactly one of batch_size= and memory=")
    with _no_gc():
        return _compile(graph, batch_size, memory, optimizer, device, debug, passes, keep,
                        sharing, autotune_enabled(autotune))


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cycle collector while compiling: it builds tens of thousands of small
    objects and none of them is garbage until the end (compiling makes no reference
    cycles), so the collector's scans are pure overhead.

    On success the objects made meanwhile (the program's instructions and buffers:
    ~120,000 for a 10,000-node training graph) go straight to the oldest generation,
    as ``gc.freeze()`` then ``gc.unfreeze()`` does in constant time.  Otherwise the
    first allocation after compiling starts a young collection that scans them all to
    find them alive, and a middle one scans them again; full collections still see
    them.  Skipped where the caller has frozen objects (unfreezing would release
    them) or had the collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if enabled and not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
    finally:
        if enabled:
            gc.enable()


def _compile(graph: CalcGraph, batch_size: int | None, memory: int | None,
             optimizer: Optimizer | None, device: Device | str | None, debug: bool,
             passes: PassList, keep: Keep, sharing: str, autotune: bool) -> Program:
    dev = Device(device or graph.device).value
    ir = lower(graph, optimizer, debug, passes, keep)
    planner = Planner(ir, optimizer, dev, sharing, analyze(ir, inplace=sharing != "none"),
                      autotune)
    if memory is not None:
        batch_size = max_batch(lambda b: planner.plan(b).total_bytes, int(memory),
                               f"graph {graph.name!r}")
    plan = planner.plan(_check_batch(batch_size))
    if dev == "cpu":
        check_fits_machine(plan.total_bytes, f"graph {graph.name!r} at batch {batch_size}")
    return emit(ir, planner, plan, optimizer, dev)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_machine(nbytes: int, what: str) -> None:
    """A CPU program is one arena in host memory: one larger than the machine's physical
    memory can never run (an imported input [N, 2^34] planned 137 GB), so it is a
    :class:`BeyondMachineError` (a :class:`BudgetError`: what a smaller budget does not
    hold, this machine does not) with both numbers, not a program that fails or swaps
    when a VM allocates it."""
    total = physical_memory()
    if total is not None and nbytes > total:
        raise BeyondMachineError(f"{what}: the program needs {nbytes:,} bytes, more than "
                                 f"this machine's {total:,} bytes of physical memory")


def _check_batch(batch_size: int | None) -> int:
    if batch_size is None or int(batch_size) < 1:
        raise CompileError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def emit(ir: IR, planner: Planner, plan: MemoryPlan, optimizer: Optimizer | None,
         device: str) -> Program:
    """Turn the planned IR into bytecode: buffers by index, instructions by index."""
    values, offsets = planner.values, plan.offsets
    # Buffers by zone (by name), then by offset, ties in the order the plan placed them;
    # the instructions name them by index.
    rank = {z: i for i, z in enumerate(sorted(set(values.zone)))}
    zone_rank = list(map(rank.__getitem__, values.zone))
    order = sorted(planner.placed, key=offsets.__getitem__)
    order.sort(key=zone_rank.__getitem__)
    at = [-1] * len(offsets)  # value number -> buffer index
    list(map(at.__setitem__, order, range(len(order))))
    descs = list(map(values.desc.__getitem__, order))
    buffers = tuple(map(
        BufferSpec, map(values.names.__getitem__, order), map(values.zone.__getitem__, order),
        map(offsets.__getitem__, order),
        map(_DTYPE_NAME.__getitem__, map(attrgetter("dtype"), descs)),
        map(attrgetter("shape"), descs), map(values.kind.__getitem__, order),
        map(planner.shared.__getitem__, order)))
    index = at.__getitem__
    number = values.number.__getitem__
    param_names = list(ir.params)
    pindex = {n: i for i, n in enumerate(param_names)}
    workspace, tunables = plan.workspace, plan.tunables
    instrs: list[Instr] = []
    # Every pass gives a node attributes of its own and the IR is dropped once emitted,
    # so the instructions take the nodes' attribute dicts over (the VM copies them
    # before a kernel sees them).
    for node, ins, outs in zip(values.nodes, values.ins, values.outs, strict=True):
        sink = node.param_sink
        tun = tunables.get(id(node)) if tunables else None
        instrs.append(Instr(
            node.op, tuple(map(index, ins)), tuple(map(index, outs)), node.attrs,
            workspace.get(id(node), 0), None if sink is None else pindex[sink],
            tun.candidates if tun else (), tun.group if tun else ""))
    forward: list[range] = []  # values.nodes: each path's forward then backward nodes
    backward: list[range] = []
    first = 0
    for p in ir.paths:
        forward.append(range(first, first + len(p.forward)))
        first += len(p.forward)
        backward.append(range(first, first + len(p.backward)))
        first += len(p.backward)
    paths = tuple(
        PathCode(p.name, p.mode.value, tuple(forward[i]), tuple(backward[i]),
                 index(number(p.loss)) if p.loss else None,
                 index(number(p.seed)) if p.seed else None,
                 tuple(pindex[n] for n in p.params))
        for i, p in enumerate(ir.paths)
    )
    params = tuple(
        ParamSpec(index(number(n)),
                  index(number(ir.grad_of[n])) if n in ir.grad_of else None,
                  ir.params[n].init, ir.params[n].regularization, ir.params[n].trainable)
        for n in param_names
    )
    memory = {z: {"no_sharing": st.no_sharing, "planned": st.planned,
                  "lower_bound": st.lower_bound} for z, st in plan.stats.items()}
    return Program(ir.graph.name, device, plan.batch, plan.zone_bytes, buffers, tuple(instrs),
                   paths, params, optimizer, plan.param_region, plan.state_offsets, memory,
                   dict(ir.counts))
