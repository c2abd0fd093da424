"""Graphviz (DOT) views of a graph before optimisation and of a compiled program.

Each instruction is a box with its index, op and output shapes; in a program each
output also shows the zone and offset the planner gave it (Owl draws the same),
so buffers that share memory are easy to spot.  Placeholders and parameters are
ellipses.  Render with ``dot -Tsvg``.

>>> from engine import compile_graph
>>> from engine.models import paper_mlp
>>> g = paper_mlp((4, 3, 2))
>>> "Gemm" in to_dot(g), "FusedGemm" in to_dot(compile_graph(g, batch_size=8))
(True, True)
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.compile.passes.ir import IR, IRNode
from engine.graph import CalcGraph, TensorDesc
from engine.runtime.program import Program


def to_dot(obj: CalcGraph | IR | Program) -> str:
    """DOT text of a CalcGraph as written (shapes inferred, no optimisation), an IR,
    or a compiled Program (after optimisation, with zones and offsets)."""
    if isinstance(obj, Program):
        return program_dot(obj)
    if isinstance(obj, CalcGraph):
        from engine.compile.compiler import lower

        obj = lower(obj, passes=())
    return ir_dot(obj)


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lines(name: str, header: list[str], rows: Iterable[str], shape: str) -> str:
    label = "\\n".join([*header, *rows]).replace('"', '\\"')
    return f'  {name} [shape={shape}, label="{label}"];'


def _digraph(title: str, body: list[str]) -> str:
    return "\n".join([f"digraph {_q(title)} {{", "  rankdir=TB;",
                      '  node [fontname="monospace", fontsize=10];', *body, "}"]) + "\n"


def ir_dot(ir: IR) -> str:
    body: list[str] = []
    source: dict[str, str] = {}
    for i, name in enumerate(n for n, k in ir.kind.items() if k in ("placeholder", "param")):
        source[name] = f"v{i}"
        body.append(_lines(f"v{i}", [name], [str(ir.descs[name])], "ellipse"))
    nodes: list[IRNode] = ir.nodes()
    for i, node in enumerate(nodes):
        rows = [f"{o}: {ir.descs[o]}" for o in node.outputs if o in ir.descs]
        body.append(_lines(f"n{i}", [f"#{i} {node.op}"], rows, "box"))
        body.extend(f"  {source[x]} -> n{i};" for x in dict.fromkeys(node.inputs) if x in source)
        for o in node.outputs:
            source[o] = f"n{i}"
    return _digraph(ir.graph.name, body)


def program_dot(prog: Program) -> str:
    body: list[str] = []
    source: dict[int, str] = {}
    for j, b in enumerate(prog.buffers):
        if b.kind in ("placeholder", "param"):
            source[j] = f"v{j}"
            body.append(_lines(f"v{j}", [b.name], [f"{_at(b.desc, prog.batch_size)}",
                                                   f"{b.zone}@{b.offset}"], "ellipse"))
    for i, ins in enumerate(prog.instrs):
        rows = []
        for j in ins.outs:
            b = prog.buffers[j]
            rows.append(f"{b.name}: {_at(b.desc, prog.batch_size)} {b.zone}@{b.offset}"
                        + (" shared" if b.shared else ""))
        body.append(_lines(f"n{i}", [f"#{i} {ins.op}"], rows, "box"))
        body.extend(f"  {source[j]} -> n{i};" for j in dict.fromkeys(ins.ins) if j in source)
        for j in ins.outs:
            source[j] = f"n{i}"
    return _digraph(prog.name, body)


def _at(desc: TensorDesc, batch: int) -> str:
    return str(desc.at_batch(batch))
