"""Memory planning: an offset for every buffer in each of the four zones.

This planner gives every buffer its own 64-byte-aligned slot (no sharing between
buffers whose lifetimes do not overlap: that is a separate, replaceable step).  Its
layout fixes what the optimizer relies on: trainable parameters first and contiguous
in the forward zone, their gradients at the same offsets in the gradient zone, and
each optimizer state slot a copy of that region in the optimizer zone.

Workspace is one region shared by all instructions, sized by the largest need.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.graph import TensorDesc
from engine.ops import get_op
from engine.ops._base import align
from engine.optim import Optimizer
from engine.passes.ir import FORWARD, GRADIENT, IR, OPTIMIZER, WORKSPACE, ZONES, IRNode

ALIGN = 64


@dataclass(frozen=True)
class MemoryPlan:
    batch: int
    zone_bytes: dict[str, int]
    offsets: dict[str, int]  # buffer -> offset in its zone
    param_region: int  # bytes of the trainable parameter region (same in forward/gradient)
    state_offsets: tuple[int, ...]  # one region per optimizer state slot
    workspace: dict[int, int]  # id(node) -> workspace bytes of its op at this batch

    @property
    def total_bytes(self) -> int:
        return sum(self.zone_bytes.values())


def buffer_bytes(desc: TensorDesc, batch: int) -> int:
    return align(desc.nbytes(batch), ALIGN)


def node_workspace(ir: IR, node: IRNode, batch: int, device: str) -> int:
    """Workspace bytes of one execution of ``node`` at ``batch`` (aligned), including,
    for a parameter-gradient sink, the scratch that accumulation writes first."""
    op = get_op(node.op)
    ins = [ir.descs[x].at_batch(batch) for x in node.inputs]
    outs = [ir.descs[x].at_batch(batch) for x in node.outputs]
    need = align(op.workspace(ins, outs, node.attrs, device), ALIGN)
    if node.param_sink is not None:
        need += buffer_bytes(ir.descs[node.param_sink], batch)
    return need


def plan_memory(ir: IR, batch: int, optimizer: Optimizer | None, device: str) -> MemoryPlan:
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
    assert used[GRADIENT] == region
    placed = set(offsets)
    for name, zone in ir.zone.items():
        if name in placed or name not in ir.descs:
            continue
        if zone in (FORWARD, GRADIENT):
            place(name, zone)

    slots = optimizer.state_slots if optimizer is not None else 0
    state_offsets = tuple(i * region for i in range(slots))
    used[OPTIMIZER] = slots * region

    workspace: dict[int, int] = {}
    ws = 0
    for node in ir.nodes():
        workspace[id(node)] = node_workspace(ir, node, batch, device)
        ws = max(ws, workspace[id(node)])
    if optimizer is not None and region:
        ws = max(ws, region)  # the update's scratch: one copy of the parameter region
    used[WORKSPACE] = ws
    return MemoryPlan(batch, dict(used), offsets, region, state_offsets, workspace)
