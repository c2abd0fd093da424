"""Commuting Relu past a max pooling: ``MaxPool(Relu(X))`` becomes
``Relu(MaxPool(X))``.

Both give the same values and the same gradients: Relu keeps the maximum of every
window (``max relu(x) = relu(max x)``, as any non-decreasing function does), and the
gradient reaches the same element of each window, the first maximum of ``x`` (equal
positive values are equal under Relu too; where Relu flattens every element of a
window to 0 the gradient is 0 either way).  The activation and its gradient then run
on the pooled tensor, a quarter of the elements for 2x2 windows: on the MNIST CNN's
step Relu and ReluGrad after the pooling take about a quarter of their time before
it, and the training plan at batch 64 is 5% smaller (the gradient zone holds none of
the activation's full-size gradients, the forward zone keeps the pooled
pre-activation beside the pooled activation; ``docs/measurements.md``).

Not Sigmoid or Tanh, though they are monotone too: they map neighbouring inputs to the
same float where they saturate, and the gradient would then reach the window's larger
input instead of its first (the same value, another position).  Not where a window can
lie wholly in the padding: MaxPool's output there is -inf, Relu's of it 0.  And only
where the activation's output has no other reader and is not read back by the user,
and the pooling has no ``Indices`` output (whose positions would be the same, but which
a user may read).

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 2, 4, 4)); p = g.path("f")
>>> y = p.MaxPool(p.Relu(x), kernel_shape=(2, 2), strides=(2, 2))
>>> [i.op for i in compile_graph(g, batch_size=1).instrs]
['MaxPool', 'Relu']
"""

from __future__ import annotations

from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.rewrite import readers
from engine.errors import ShapeError
from engine.ops.pool import pool_geometry

ACTIVATIONS = ("Relu",)
POOLS = ("MaxPool",)


def every_window_reads_input(shape: tuple[int, ...], attrs: dict) -> bool:
    """Whether each window of a pooling over ``shape`` covers at least one input cell
    (none lies wholly in the padding or past the end)."""
    try:
        geo = pool_geometry(shape, attrs)
    except ShapeError:
        return False
    for n, k, s, d, (begin, _), out in zip(shape[2:], geo["k"], geo["s"], geo["d"],
                                           geo["pads"], geo["out"], strict=True):
        for o in range(out):
            first = o * s - begin
            if not any(0 <= first + u * d < n for u in range(k)):
                return False
    return True


def commute_pool_activation(ir: IR) -> IR:
    """MaxPool(Relu(X)) -> Relu(MaxPool(X)) where that is exact (the module's doc)."""
    ops = {node.op for path in ir.paths for node in path.forward}
    if ops.isdisjoint(POOLS) or ops.isdisjoint(ACTIVATIONS):
        return ir
    count = readers(ir)
    for path in ir.paths:
        producer: dict[str, int] = {}
        out: list[IRNode | None] = []
        for node in path.forward:
            if node.op in POOLS and len(node.outputs) == 1:
                via = node.inputs[0]
                j = producer.get(via, -1)
                act = out[j] if j >= 0 else None
                if act is not None and act.op in ACTIVATIONS and count[via] == 1 and \
                        via not in ir.keep and \
                        every_window_reads_input(ir.descs[via].shape, node.attrs):
                    # ``via`` now names the pooled pre-activation, of the pooling's shape
                    ir.descs[via] = ir.descs[node.outputs[0]]
                    out[j] = None
                    pooled = IRNode(node.op, (act.inputs[0], *node.inputs[1:]), (via,),
                                    node.attrs, node.path,
                                    origin=f"{node.origin} before {act.origin}",
                                    variant_fixed=node.variant_fixed)
                    after = IRNode(act.op, (via,), node.outputs, act.attrs, act.path,
                                   origin=f"{act.origin} after {node.origin}",
                                   variant_fixed=act.variant_fixed)
                    for n in (pooled, after):
                        for o in n.outputs:
                            producer[o] = len(out)
                        out.append(n)
                    continue
            for o in node.outputs:
                producer[o] = len(out)
            out.append(node)
        path.forward = [n for n in out if n is not None]
    return ir
