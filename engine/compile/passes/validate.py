"""Pass 1: validate a CalcGraph and lower it to the IR.

Checks, each with a message that names the op (index, name, path) or variable:
unknown ops (listing what is available), wrong input counts, unknown attributes,
variables used before they are defined or defined twice, parameters with a batch
dimension, a BACKWARD_ENABLED path without a loss.
"""

from __future__ import annotations

from engine.compile.passes.ir import IR, IRNode, IRParam, IRPath
from engine.errors import GraphError
from engine.graph import CalcGraph, Kind, Mode
from engine.ops import get_op
from engine.ops._base import VARIANT_ATTR
from engine.runtime.zones import FORWARD


def validate(graph: CalcGraph) -> IR:
    if not graph.paths:
        raise GraphError(f"graph {graph.name!r} has no path; add one with graph.path(...)")
    ir = IR(graph, [])
    defined: set[str] = set()
    for name, var in graph.variables.items():
        if var.kind is Kind.GENERIC:
            continue
        assert var.desc is not None
        defined.add(name)
        ir.descs[name] = ir.intern(var.desc)
        ir.zone[name] = FORWARD
        if var.kind is Kind.PARAMETER:
            if var.desc.batched:
                raise GraphError(f"parameter {name!r} has a batch dimension in its shape "
                                 f"{var.desc.shape}; parameters have fixed shapes")
            assert var.init is not None
            given = var.init.values if var.init.array is None else var.init.array
            if given is not None and len(given) not in (1, var.desc.numel()):
                raise GraphError(f"parameter {name!r}: {len(given)} initial values "
                                 f"for shape {var.desc.shape}")
            ir.params[name] = IRParam(name, var.init, var.regularization, var.trainable)
            ir.kind[name] = "param"
        else:
            ir.kind[name] = "placeholder"

    for pi, path in enumerate(graph.paths):
        ipath = IRPath(path.name, path.mode)
        in_path = f"in path {path.name!r}"
        for ni, node in enumerate(path.nodes):
            where = f"op #{ni} {node.op!r} {in_path}"
            try:
                op = get_op(node.op)
            except GraphError as e:
                raise GraphError(f"{where}: {e}") from None
            lo, hi = op.num_inputs
            if not lo <= len(node.inputs) <= hi:
                want = str(lo) if lo == hi else f"{lo} to {hi}"
                raise GraphError(f"{where}: takes {want} inputs, got {len(node.inputs)}")
            if node.attrs and not node.attrs.keys() <= op.attrs.keys():
                known = set(op.attrs) | ({VARIANT_ATTR} if op.variants else set())
                unknown = set(node.attrs) - known
                if unknown:
                    allowed = ", ".join(sorted(known)) or "none"
                    raise GraphError(f"{where}: unknown attribute(s) {sorted(unknown)}; "
                                     f"allowed: {allowed}")
            if not defined.issuperset(node.inputs):
                x = next(x for x in node.inputs if x not in defined)
                hint = (" (it is produced later)" if x in graph.variables
                        else " (no such variable)")
                raise GraphError(f"{where}: input {x!r} is not defined before use{hint}")
            if len(node.outputs) > op.num_outputs:
                raise GraphError(f"{where}: produces {op.num_outputs} output(s), "
                                 f"{len(node.outputs)} were named")
            outputs = tuple(node.outputs)
            if len(outputs) < op.num_outputs and not op.variadic_outputs:
                outputs += tuple(f"{outputs[0]}:{i}" for i in range(len(outputs),
                                                                   op.num_outputs))
            for o in outputs:
                if o in defined:
                    raise GraphError(f"{where}: output {o!r} is already defined")
                defined.add(o)
                ir.zone[o] = FORWARD
                ir.kind[o] = "generic"
            attrs = op.with_defaults(node.attrs)
            if node.op == "Dropout" and attrs["training"] is None:
                attrs["training"] = int(path.mode is Mode.BACKWARD_ENABLED)
            ipath.forward.append(IRNode(node.op, tuple(node.inputs), outputs, attrs, pi,
                                        False, None, where,
                                        bool(op.variants) and VARIANT_ATTR in node.attrs))
            for k in op.writes:
                if k < len(node.inputs) and node.inputs[k] in ir.params:
                    ir.params[node.inputs[k]].written = True
        if path.mode is Mode.BACKWARD_ENABLED:
            if path.loss is None:
                raise GraphError(f"path {path.name!r} is BACKWARD_ENABLED but has no loss; "
                                 "mark one with path.set_loss(var)")
            produced = {o for n in ipath.forward for o in n.outputs}
            if path.loss not in produced:
                raise GraphError(f"path {path.name!r}: loss {path.loss!r} is not computed "
                                 "by this path")
            ipath.loss = path.loss
        elif path.loss is not None:
            raise GraphError(f"path {path.name!r} is FORWARD_ONLY but has a loss; make it "
                             "BACKWARD_ENABLED to learn from it")
        ir.paths.append(ipath)
    return ir
