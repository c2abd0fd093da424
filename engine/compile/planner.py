"""Memory planning: an offset for every buffer in each of the four zones.

Layout of a zone: first the *persistent* buffers (see
:mod:`engine.compile.passes.liveness`), then one shared arena where buffers whose lifetimes
do not overlap share memory, packed by a strategy of :mod:`engine.compile.packing`
(``sharing="none"`` gives every buffer its own slot instead).

The layout fixes what the optimizer and model switching rely on: trainable
parameters first and contiguous in the forward zone, then the other parameters (so
a model's parameters are one prefix of the zone), their gradients at the same offsets
in the gradient zone, and each optimizer state slot a copy of that region in the optimizer zone.
Workspace is one region shared by all instructions, sized by the largest need (a
tunable instruction's need is the largest of its candidate variants').

Every plan also reports, per zone, the bytes without sharing, the bytes planned and
the lower bound (the most bytes live at any one instruction).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.alignment import align_up
from engine.compile.packing import STRATEGIES, lower_bound
from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.liveness import Lifetimes, analyze
from engine.compile.tunable import Tunable, find_tunables
from engine.errors import CompileError
from engine.graph import TensorDesc
from engine.ops import get_op
from engine.ops._base import no_workspace, variant_named
from engine.runtime.optim import Optimizer
from engine.runtime.zones import FORWARD, GRADIENT, OPTIMIZER, WORKSPACE, ZONES

SHARING = ("none", *STRATEGIES)


@dataclass(frozen=True)
class ZoneStats:
    no_sharing: int  # every buffer its own slot
    planned: int  # what the plan allocates
    lower_bound: int  # the most bytes of packed pieces busy at one instruction



@dataclass(frozen=True)
class MemoryPlan:
    batch: int
    zone_bytes: dict[str, int]
    offsets: dict[str, int]  # buffer -> offset in its zone
    param_region: int  # bytes of the trainable parameter region (same in forward/gradient)
    state_offsets: tuple[int, ...]  # one region per optimizer state slot
    workspace: dict[int, int]  # id(node) -> workspace bytes of its op at this batch
    stats: dict[str, ZoneStats]
    shared: frozenset[str]  # buffers whose memory other buffers reuse at other times
    tunables: dict[int, Tunable] = field(default_factory=dict)  # id(node) -> candidates

    @property
    def total_bytes(self) -> int:
        return sum(self.zone_bytes.values())


def buffer_bytes(desc: TensorDesc, batch: int) -> int:
    return align_up(desc.nbytes(batch))


def node_workspace(ir: IR, node: IRNode, batch: int, device: str,
                   candidates: tuple[str, ...] = ()) -> int:
    """Workspace bytes of one execution of ``node`` at ``batch`` (aligned), including,
    for a parameter-gradient sink, the scratch that accumulation writes first.  A
    tunable node (``candidates``: the variants a tuner may run) needs the largest of
    theirs."""
    op = get_op(node.op)
    need = 0
    if candidates:
        ins = [ir.descs[x].at_batch(batch) for x in node.inputs]
        outs = [ir.descs[x].at_batch(batch) for x in node.outputs]
        need = max(align_up(variant_named(node.op, op.variants, c).workspace(
            ins, outs, node.attrs, device)) for c in candidates)
    elif op.workspace is not no_workspace:
        ins = [ir.descs[x].at_batch(batch) for x in node.inputs]
        outs = [ir.descs[x].at_batch(batch) for x in node.outputs]
        need = align_up(op.workspace(ins, outs, node.attrs, device))
    if node.param_sink is not None:
        need += buffer_bytes(ir.descs[node.param_sink], batch)
    return need


def plan_memory(ir: IR, batch: int, optimizer: Optimizer | None, device: str,
                sharing: str = "auto", lifetimes: Lifetimes | None = None,
                autotune: bool = False) -> MemoryPlan:
    """Offsets and zone sizes at ``batch``.  ``lifetimes`` (from
    :func:`~engine.compile.passes.liveness.analyze`) do not depend on the batch: pass them
    when planning the same IR at many batch sizes.  ``autotune``: size every tunable
    instruction's workspace for all its candidates (:mod:`engine.compile.tunable`)."""
    if sharing not in SHARING:
        raise CompileError(f"unknown sharing strategy {sharing!r}; choose one of "
                           f"{', '.join(SHARING)}")
    lt = lifetimes if lifetimes is not None else analyze(ir, inplace=sharing != "none")
    offsets: dict[str, int] = {}
    used = dict.fromkeys(ZONES, 0)

    def place(name: str, zone: str) -> None:
        offsets[name] = used[zone]
        used[zone] += buffer_bytes(ir.descs[name], batch)

    trainable = [p for p in ir.trainable() if p in ir.grad_of]
    for p in trainable:
        place(p, FORWARD)
        place(ir.grad_of[p], GRADIENT)
    region = used[FORWARD]
    for name in ir.params:  # all parameters lead the forward zone: a model's state prefix
        if name not in offsets:
            place(name, FORWARD)
    for name, zone in ir.zone.items():
        if name not in offsets and name in ir.descs and (sharing == "none" or
                                                         name in lt.persistent):
            place(name, zone)
    persistent = dict(used)  # under sharing="none", everything is placed already
    if sharing != "none":
        roots = lt.groups()
        for zone in (FORWARD, GRADIENT):
            names = [n for n in roots if ir.zone[n] == zone]
            items = [(*roots[n], buffer_bytes(ir.descs[n], batch)) for n in names]
            packed, total = STRATEGIES[sharing](items)
            for n, o in zip(names, packed, strict=True):
                offsets[n] = used[zone] + o
            used[zone] += total
        for member in lt.alias:
            offsets[member] = offsets[lt.root(member)]
    slots = optimizer.state_slots if optimizer is not None else 0
    state_offsets = tuple(i * region for i in range(slots))
    used[OPTIMIZER] = slots * region

    tunables = find_tunables(ir, batch, device) if autotune else {}
    workspace: dict[int, int] = {}
    ws = 0
    for node in ir.nodes():
        tun = tunables.get(id(node))
        workspace[id(node)] = node_workspace(ir, node, batch, device,
                                             tun.candidates if tun else ())
        ws = max(ws, workspace[id(node)])
    if optimizer is not None and region:
        ws = max(ws, region)  # the update's scratch: one copy of the parameter region
    used[WORKSPACE] = ws

    stats = {z: ZoneStats(used[z], used[z], used[z]) for z in (OPTIMIZER, WORKSPACE)}
    for z in (FORWARD, GRADIENT):
        temps = [(lt.start[n], lt.end[n], buffer_bytes(ir.descs[n], batch))
                 for n in lt.start if ir.zone[n] == z]
        base = persistent[z] - (sum(i[2] for i in temps) if sharing == "none" else 0)
        # the bound is over the memory the plan packs: an op that writes over its input
        # (in place) shares that input's piece, busy until the later of their lifetimes
        groups = lt.groups() if sharing != "none" else {n: (lt.start[n], lt.end[n])
                                                        for n in lt.start}
        owned = [(*groups[n], buffer_bytes(ir.descs[n], batch)) for n in groups
                 if ir.zone[n] == z]
        stats[z] = ZoneStats(base + sum(i[2] for i in temps), used[z], base + lower_bound(owned))
    stats = {z: stats[z] for z in ZONES}
    shared = frozenset() if sharing == "none" else frozenset(lt.start)
    return MemoryPlan(batch, dict(used), offsets, region, state_offsets, workspace, stats,
                      shared, tunables)
