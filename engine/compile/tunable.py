"""Which instructions an auto-tuner may choose a kernel variant for, and their groups.

An instruction is *tunable* when its op registers variants, more than one of them
applies at its shapes (inner variants counted: ``im2col/nt``, ``im2col/tn``), and the
user did not name its ``algorithm`` in full (a top-level name such as ``"im2col"``
leaves its inner choice open).  Its planned workspace is then the largest of its
candidates' (:class:`~engine.compile.planner.Planner`), so whichever the tuner
runs, allocated = planned.

Variants that declare a ``group`` (a dense layer's layout, a stacked layer's form)
choose together over the instructions of one parameter: those that read it and the
one that writes its gradient.  A user's choice on one of them (the forward op) carries
over to the others (:func:`pin_groups`), with or without tuning.

>>> from engine import CalcGraph, Mode, Init
>>> from engine.compile import lower
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); w = g.parameter("w", (3, 2))
>>> p = g.path("t", Mode.BACKWARD_ENABLED)
>>> _ = p.set_loss(p.ReduceSum(p.Gemm(x, w, algorithm="transposed"), keepdims=0))
>>> ir = lower(g)
>>> sorted({n.attrs.get("algorithm") for n in ir.nodes() if n.op == "Gemm"})
['transposed']
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.compile.passes.ir import IR, IRNode
from engine.errors import GraphError, ShapeError
from engine.ops import get_op
from engine.ops._base import VARIANT_ATTR, VARIANT_SEP, applicable_variants, variant_named


@dataclass(frozen=True)
class Tunable:
    """An instruction's candidate variants and its group (``""``: it chooses alone)."""

    candidates: tuple[str, ...]
    group: str = ""


def _group_name(node: IRNode) -> str:
    """The group the op's variants declare (all of them must declare the same one)."""
    names = {v.group for v in get_op(node.op).variants.values()}
    return names.pop() if len(names) == 1 else ""


def _group_of(ir: IR, node: IRNode) -> str:
    """``"<group>:<parameter>"`` for an op whose variants declare a group and which
    reads a parameter (or writes one's gradient); ``""`` otherwise."""
    name = _group_name(node)
    if not name:
        return ""
    param = next((x for x in node.inputs if x in ir.params), node.param_sink)
    return f"{name}:{param}" if param else ""


def pin_groups(ir: IR) -> IR:
    """A user's ``algorithm`` on one member of a group (the forward product) becomes
    every member's: a dense layer's gradient products follow its layout."""
    nodes = ir.nodes()
    chosen = [node for node in nodes if node.variant_fixed]
    if not chosen:
        return ir  # nothing to check or to carry over
    fixed: dict[str, str] = {}
    members: dict[str, list[IRNode]] = {}
    for node in nodes:
        if not get_op(node.op).variants:
            continue
        group = _group_of(ir, node)
        if not group:
            continue
        members.setdefault(group, []).append(node)
        if node.variant_fixed:
            fixed.setdefault(group, node.attrs[VARIANT_ATTR])
    for node in chosen:
        _check_fixed(ir, node)
    for group, name in fixed.items():
        top = name.split(VARIANT_SEP)[0]
        for node in members[group]:
            if not node.variant_fixed and top in get_op(node.op).variants:
                node.attrs = {**node.attrs, VARIANT_ATTR: name}
                node.variant_fixed = True
    return ir


def _check_fixed(ir: IR, node: IRNode) -> None:
    """A named variant must exist and apply at the node's shapes."""
    op = get_op(node.op)
    name = node.attrs[VARIANT_ATTR]
    try:
        variant_named(node.op, op.variants, name)
    except ShapeError as e:
        raise GraphError(f"{node.origin}: {e}") from None
    ins = [ir.descs[x].at_batch(1) for x in node.inputs]
    outs = [ir.descs[x].at_batch(1) for x in node.outputs]
    if not applicable_variants(op, ins, outs, node.attrs, name):
        raise ShapeError(f"{node.origin}: {node.op} algorithm {name!r} does not apply here")


def find_tunables(ir: IR, batch: int, device: str) -> dict[int, Tunable]:
    """``id(node)`` -> its candidates and group, for every tunable node at ``batch``.
    A group's members share the candidates that all of them have."""
    found: dict[int, Tunable] = {}
    groups: dict[str, list[IRNode]] = {}
    for node in ir.nodes():
        op = get_op(node.op)
        if not op.variants:
            continue
        fixed = node.attrs.get(VARIANT_ATTR) if node.variant_fixed else None
        if fixed and fixed.split(VARIANT_SEP)[0] not in op.variants:
            continue
        ins = [ir.descs[x].at_batch(batch) for x in node.inputs]
        outs = [ir.descs[x].at_batch(batch) for x in node.outputs]
        names = applicable_variants(op, ins, outs, node.attrs, fixed)
        if len(names) < 2:
            continue
        group = "" if fixed else _group_of(ir, node)
        found[id(node)] = Tunable(names, group)
        if group:
            groups.setdefault(group, []).append(node)
    for group, nodes in groups.items():
        common = [n for n in found[id(nodes[0])].candidates
                  if all(n in found[id(m)].candidates for m in nodes)]
        for m in nodes:
            if len(common) < 2:
                del found[id(m)]
            else:
                found[id(m)] = Tunable(tuple(common), group)
    return found
