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
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

from engine.alignment import ALIGN, align_up
from engine.compile.packing import STRATEGIES, lower_bound, pack
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
    offsets: list[int]  # by value number (Planner.values): offset in its zone (-1: none)
    param_region: int  # bytes of the trainable parameter region (same in forward/gradient)
    state_offsets: tuple[int, ...]  # one region per optimizer state slot
    workspace: dict[int, int]  # id(node) -> workspace bytes at this batch (absent: none)
    stats: dict[str, ZoneStats]
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


def nbytes_at(desc: TensorDesc, batch: int) -> int:
    """Bytes of a buffer of generic descriptor ``desc`` at ``batch``, aligned.

    >>> from engine.graph import DType
    >>> nbytes_at(TensorDesc(DType.FLOAT32, (0, 3)), batch=10)
    128
    """
    shape = desc.shape
    n = batch * math.prod(shape[1:]) if shape and shape[0] == BATCH else math.prod(shape)
    return -(-n * ITEMSIZE[desc.dtype] // ALIGN) * ALIGN


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
    A plan then sizes each distinct descriptor, packs and runs each group's rule once,
    which is what the max-batch search (:func:`~engine.compile.compiler.max_batch`,
    O(log b) plans) repeats.  Values go by their numbers (:attr:`values`, from the
    lifetime analysis): a plan's offsets are a list indexed by them.

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
        self.values = values = lt.values
        number, zone_of, desc = values.number, values.zone, values.desc
        # A plan sizes each distinct descriptor (the IR interns them: a 10,000-node
        # training graph has 30,000 buffers and a few dozen descriptors); what is kept
        # here names each value's descriptor by its id.
        desc_id = list(map(id, desc))
        self.descs = dict(zip(desc_id, desc, strict=True))
        # Values with memory of their own, in the order they are laid out: trainable
        # parameters (and their gradients at the same offsets), the other parameters,
        # then the persistent ones (under sharing="none", all) in the order the IR has.
        trainable = [(number[p], number[ir.grad_of[p]]) for p in ir.trainable()
                     if p in ir.grad_of]
        placed = {v for pair in trainable for v in pair}
        params = [v for v in map(number.__getitem__, ir.params) if v not in placed]
        placed.update(params)
        own = range(len(desc)) if sharing == "none" else \
            (v for v, p in enumerate(lt.persistent) if p)
        fixed = [v for v in own if v not in placed]
        own_zones = [(v, z) for p, g in trainable for v, z in ((p, FORWARD), (g, GRADIENT))]
        self.n_trainable = len(own_zones)  # then the trainable region ends
        own_zones += [(v, FORWARD) for v in params]
        own_zones += [(v, zone_of[v]) for v in fixed]
        self.own = [(v, z, desc_id[v]) for v, z in own_zones]
        # The pieces each arena packs: each memory-owning temporary over the interval
        # its memory is busy (an op that writes over its input, in place, or a view of
        # it shares that input's piece until the last of their lifetimes; a view of a
        # parameter or placeholder is no piece, it shows memory of its own).  Under
        # sharing="none" each temporary is its own piece (for the lower bound; nothing
        # is packed).
        self.alias = alias = lt.alias if sharing != "none" else {}
        busy = lt.end  # the last instruction at which each value's memory is busy
        if alias:
            busy = list(busy)
            for root, e in lt.alias_ends().items():
                busy[root] = max(busy[root], e)
        self.pieces: dict[str, tuple[list[int], list[int], list[int], list[int]]] = {}
        self.temps: dict[str, Counter[int]] = {}  # descriptors of all, for no sharing
        for zone in (FORWARD, GRADIENT):
            vs = [v for v in lt.temps if zone_of[v] == zone]
            self.temps[zone] = Counter(map(desc_id.__getitem__, vs))
            if alias:
                vs = [v for v in vs if v not in alias]
            self.pieces[zone] = (vs, list(map(lt.start.__getitem__, vs)),
                                 list(map(busy.__getitem__, vs)),
                                 list(map(desc_id.__getitem__, vs)))
        # Where a plan puts values, in the order it places them (buffers at equal offsets
        # keep this order): the ones with memory of their own, the pieces, the aliases.
        self.placed = [v for v, _, _ in self.own]
        if sharing != "none":
            for piece in self.pieces.values():
                self.placed += piece[0]
            self.placed += alias
        self.shared = [False] * len(desc)  # memory other values use at other times
        if sharing != "none":
            list(map(self.shared.__setitem__, lt.temps, repeat(True)))
        # Instructions that need workspace, grouped by their op's arguments; a
        # parameter-gradient sink also needs its parameter's bytes (for accumulation).
        self.nodes = values.nodes
        with_rule = {op for op in set(map(attrgetter("op"), self.nodes))
                     if get_op(op).workspace is not no_workspace}
        groups: dict[Any, tuple[IRNode, list[int]]] = {}
        for node, ins in zip(self.nodes, values.ins, strict=True):
            if node.op in with_rule:
                # The inputs and attributes fix the outputs (by the shape rule).
                key: Any = rule_key(node.op, list(map(desc.__getitem__, ins)), node.attrs,
                                    len(node.outputs))  # values.desc keeps the descriptors
                if key is None:
                    key = id(node)  # attributes not plain scalars: a group of its own
                group = groups.get(key)
                if group is None:
                    groups[key] = (node, [id(node)])
                else:
                    group[1].append(id(node))
        self.groups = list(groups.values())
        self.sinks = [(id(node), desc_id[number[node.param_sink]]) for node in self.nodes
                      if node.param_sink is not None]

    def plan(self, batch: int) -> MemoryPlan:
        """The plan at ``batch``."""
        sharing = self.sharing
        size = {i: nbytes_at(d, batch) for i, d in self.descs.items()}  # by descriptor
        offsets = [-1] * len(self.shared)
        used = dict.fromkeys(ZONES, 0)

        def place(own: list[tuple[int, str, int]]) -> None:
            for v, zone, d in own:
                offsets[v] = used[zone]
                used[zone] += size[d]

        place(self.own[:self.n_trainable])
        region = used[FORWARD]
        place(self.own[self.n_trainable:])  # the other parameters lead: a model's state
        persistent = dict(used)  # under sharing="none", everything is placed already

        stats: dict[str, ZoneStats] = {}
        for zone, (vs, starts, ends, ids) in self.pieces.items():
            items = list(zip(starts, ends, map(size.__getitem__, ids), strict=True))
            if sharing == "none":
                bound = lower_bound(items)
            else:
                packed, total, bound = pack(sharing, items)
                list(map(offsets.__setitem__, vs, map(used[zone].__add__, packed)))
                used[zone] += total
            temps = sum(size[d] * n for d, n in self.temps[zone].items())
            base = persistent[zone] - (temps if sharing == "none" else 0)
            stats[zone] = ZoneStats(base + temps, used[zone], base + bound)
        alias = self.alias  # in place over another, or a view of it: its offset
        list(map(offsets.__setitem__, alias, map(offsets.__getitem__, alias.values())))
        slots = self.optimizer.state_slots if self.optimizer is not None else 0
        state_offsets = tuple(i * region for i in range(slots))
        used[OPTIMIZER] = slots * region

        workspace, tunables = self._workspace(batch, size)
        ws = max(workspace.values(), default=0)
        if self.optimizer is not None and region:
            ws = max(ws, region)  # the update's scratch: one copy of the parameter region
        used[WORKSPACE] = ws

        for z in (OPTIMIZER, WORKSPACE):
            stats[z] = ZoneStats(used[z], used[z], used[z])
        stats = {z: stats[z] for z in ZONES}
        return MemoryPlan(batch, dict(used), offsets, region, state_offsets, workspace,
                          stats, tunables)

    def _workspace(self, batch: int, size: dict[int, int]
                   ) -> tuple[dict[int, int], dict[int, Tunable]]:
        """Each instruction's workspace at ``batch`` (those that need none left out),
        and the tunable ones' candidates.  ``size``: bytes by descriptor id."""
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
        for i, param in self.sinks:
            workspace[i] = workspace.get(i, 0) + size[param]
        return workspace, tunables
