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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from engine.alignment import ALIGN, align_up
from engine.compile.packing import STRATEGIES, Item, lower_bound
from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.liveness import Lifetimes, analyze
from engine.compile.passes.shapes import rule_key
from engine.compile.tunable import Tunable, find_tunables
from engine.errors import CompileError
from engine.graph import BATCH, ITEMSIZE, TensorDesc
from engine.ops import OpDef, get_op
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
    workspace: dict[int, int]  # id(node) -> workspace bytes at this batch (absent: none)
    stats: dict[str, ZoneStats]
    shared: frozenset[str]  # buffers whose memory other buffers reuse at other times
    tunables: dict[int, Tunable] = field(default_factory=dict)  # id(node) -> candidates

    @property
    def total_bytes(self) -> int:
        return sum(self.zone_bytes.values())


def _node_descs(ir: IR, node: IRNode) -> list[TensorDesc]:
    desc = ir.descs.__getitem__
    return [*map(desc, node.inputs), *map(desc, node.outputs)]


def _op_workspace(op: OpDef, node: IRNode, descs: list[TensorDesc], batch: int,
                  device: str, candidates: tuple[str, ...] = ()) -> int:
    """The op's own workspace for ``node`` (generic ``descs``: its inputs', then its
    outputs') at ``batch``."""
    descs = [d.at_batch(batch) for d in descs]
    ins, outs = descs[:len(node.inputs)], descs[len(node.inputs):]
    if candidates:
        return max(align_up(variant_named(node.op, op.variants, c).workspace(
            ins, outs, node.attrs, device)) for c in candidates)
    return align_up(op.workspace(ins, outs, node.attrs, device))


def buffer_sizes(descs: Mapping[str, TensorDesc], batch: int) -> dict[str, int]:
    """Bytes of each buffer at ``batch``, aligned: the arithmetic is done once per
    distinct descriptor (the IR interns them: a 10,000-node training graph has 30,000
    buffers and a few dozen descriptors).

    >>> from engine.graph import DType
    >>> buffer_sizes({"x": TensorDesc(DType.FLOAT32, (0, 3))}, batch=10)
    {'x': 128}
    """
    prod, itemsize = math.prod, ITEMSIZE
    out = {}
    known: dict[int, int] = {}  # by identity: ``descs`` keeps each alive
    for name, d in descs.items():
        nbytes = known.get(id(d))
        if nbytes is None:
            shape = d.shape
            n = batch * prod(shape[1:]) if shape and shape[0] == BATCH else prod(shape)
            nbytes = known[id(d)] = -(-n * itemsize[d.dtype] // ALIGN) * ALIGN
        out[name] = nbytes
    return out


def plan_memory(ir: IR, batch: int, optimizer: Optimizer | None, device: str,
                sharing: str = "auto", lifetimes: Lifetimes | None = None,
                autotune: bool = False) -> MemoryPlan:
    """Offsets and zone sizes at ``batch`` (one :meth:`Planner.plan`).  ``lifetimes``
    (from :func:`~engine.compile.passes.liveness.analyze`) do not depend on the batch.
    ``autotune``: size every tunable instruction's workspace for all its candidates
    (:mod:`engine.compile.tunable`)."""
    return Planner(ir, optimizer, device, sharing, lifetimes, autotune).plan(batch)


class Planner:
    """Plans one IR at any batch size.  What does not depend on the batch is worked
    out once: the order of the buffers that keep their own memory, the pieces each
    zone's arena packs and when each is busy, and which instructions need workspace,
    grouped by their op's arguments (the rule is pure: equal arguments, equal need).
    A plan then sizes the buffers, packs and runs each group's rule once, which is
    what the max-batch search (:func:`~engine.compile.compiler.max_batch`, O(log b)
    plans) repeats.

    >>> from engine.models import paper_mlp
    >>> from engine.compile import lower
    >>> planner = Planner(lower(paper_mlp()), None, "cpu")
    >>> planner.plan(64).total_bytes < planner.plan(128).total_bytes
    True
    """

    def __init__(self, ir: IR, optimizer: Optimizer | None, device: str,
                 sharing: str = "auto", lifetimes: Lifetimes | None = None,
                 autotune: bool = False) -> None:
        if sharing not in SHARING:
            raise CompileError(f"unknown sharing strategy {sharing!r}; choose one of "
                               f"{', '.join(SHARING)}")
        self.ir, self.optimizer, self.device = ir, optimizer, device
        self.sharing, self.autotune = sharing, autotune
        lt = lifetimes if lifetimes is not None else analyze(ir, inplace=sharing != "none")
        zone_of, descs = ir.zone, ir.descs
        # Buffers with memory of their own, in the order they are laid out: trainable
        # parameters (and their gradients at the same offsets), the other parameters,
        # then the persistent ones (under sharing="none", all) in the order the IR has.
        self.trainable = [(p, ir.grad_of[p]) for p in ir.trainable() if p in ir.grad_of]
        placed = {n for pair in self.trainable for n in pair}
        self.params = [n for n in ir.params if n not in placed]
        placed.update(self.params)
        own = zone_of if sharing == "none" else filter(lt.persistent.__contains__, zone_of)
        self.fixed = [(n, zone_of[n]) for n in own if n not in placed and n in descs]
        # The pieces each arena packs: each memory-owning temporary over the interval
        # its memory is busy (an op that writes over its input, in place, shares that
        # input's piece until the later of their lifetimes).  Under sharing="none" each
        # temporary is its own piece (for the lower bound; nothing is packed).
        start, end = lt.start, lt.end
        self.alias = lt.alias if sharing != "none" else {}
        last = lt.alias_ends() if self.alias else {}
        self.pieces: dict[str, tuple[list[str], list[int], list[int]]] = {
            FORWARD: ([], [], []), GRADIENT: ([], [], [])}
        self.temps: dict[str, list[str]] = {FORWARD: [], GRADIENT: []}  # all, unshared
        for n, s in start.items():
            zone = zone_of[n]
            if zone not in self.temps:
                continue
            self.temps[zone].append(n)
            if n not in self.alias:
                names, starts, ends = self.pieces[zone]
                e = end[n]
                names.append(n)
                starts.append(s)
                ends.append(last[n] if n in last and last[n] > e else e)
        self.shared = frozenset() if sharing == "none" else frozenset(start)
        # Instructions that need workspace, grouped by their op's arguments; a
        # parameter-gradient sink also needs its parameter's bytes (for accumulation).
        self.nodes = ir.nodes()
        with_rule = {op for op in set(map(attrgetter("op"), self.nodes))
                     if get_op(op).workspace is not no_workspace}
        groups: dict[Any, tuple[IRNode, list[int]]] = {}
        desc = ir.descs.__getitem__
        for node in self.nodes:
            if node.op in with_rule:
                # The inputs and attributes fix the outputs (by the shape rule).
                key: Any = rule_key(node.op, list(map(desc, node.inputs)), node.attrs,
                                    len(node.outputs))  # ir.descs keeps the descriptors
                if key is None:
                    key = id(node)  # attributes not plain scalars: a group of its own
                group = groups.get(key)
                if group is None:
                    groups[key] = (node, [id(node)])
                else:
                    group[1].append(id(node))
        self.groups = list(groups.values())
        self.sinks = [node for node in self.nodes if node.param_sink is not None]

    def plan(self, batch: int) -> MemoryPlan:
        """The plan at ``batch``."""
        ir, sharing = self.ir, self.sharing
        size = buffer_sizes(ir.descs, batch)
        offsets: dict[str, int] = {}
        used = dict.fromkeys(ZONES, 0)

        def place(name: str, zone: str) -> None:
            offsets[name] = used[zone]
            used[zone] += size[name]

        for p, g in self.trainable:
            place(p, FORWARD)
            place(g, GRADIENT)
        region = used[FORWARD]
        for name in self.params:  # all parameters lead the forward zone: a model's state
            place(name, FORWARD)
        for name, zone in self.fixed:
            place(name, zone)
        persistent = dict(used)  # under sharing="none", everything is placed already

        items: dict[str, list[Item]] = {}
        for zone, (names, starts, ends) in self.pieces.items():
            items[zone] = list(zip(starts, ends, map(size.__getitem__, names), strict=True))
            if sharing != "none":
                packed, total = STRATEGIES[sharing](items[zone])
                offsets.update(zip(names, map(used[zone].__add__, packed), strict=True))
                used[zone] += total
        alias = self.alias  # a value written in place over another shares its offset
        offsets.update(zip(alias, map(offsets.__getitem__, alias.values()), strict=True))
        slots = self.optimizer.state_slots if self.optimizer is not None else 0
        state_offsets = tuple(i * region for i in range(slots))
        used[OPTIMIZER] = slots * region

        workspace, tunables = self._workspace(batch, size)
        ws = max(workspace.values(), default=0)
        if self.optimizer is not None and region:
            ws = max(ws, region)  # the update's scratch: one copy of the parameter region
        used[WORKSPACE] = ws

        stats = {z: ZoneStats(used[z], used[z], used[z]) for z in (OPTIMIZER, WORKSPACE)}
        for z, names in self.temps.items():
            temps = sum(map(size.__getitem__, names))
            base = persistent[z] - (temps if sharing == "none" else 0)
            stats[z] = ZoneStats(base + temps, used[z], base + lower_bound(items[z]))
        stats = {z: stats[z] for z in ZONES}
        return MemoryPlan(batch, dict(used), offsets, region, state_offsets, workspace,
                          stats, self.shared, tunables)

    def _workspace(self, batch: int, size: dict[str, int]
                   ) -> tuple[dict[int, int], dict[int, Tunable]]:
        """Each instruction's workspace at ``batch`` (those that need none left out),
        and the tunable ones' candidates."""
        ir, device = self.ir, self.device
        workspace: dict[int, int] = {}
        for node, members in self.groups:
            need = _op_workspace(get_op(node.op), node, _node_descs(ir, node), batch, device)
            workspace.update(dict.fromkeys(members, need))
        tunables = find_tunables(ir, batch, device) if self.autotune else {}
        if tunables:
            by_id = {id(node): node for node in self.nodes}
            for i, tun in tunables.items():
                node = by_id[i]
                workspace[i] = _op_workspace(get_op(node.op), node, _node_descs(ir, node),
                                             batch, device, tun.candidates)
        for node in self.sinks:
            assert node.param_sink is not None
            workspace[id(node)] = workspace.get(id(node), 0) + size[node.param_sink]
        return workspace, tunables
