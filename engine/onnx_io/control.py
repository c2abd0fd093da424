"""Constant ``Loop`` and ``If`` nodes, folded one body node at a time.

ONNX's reference evaluator runs a subgraph with no bound on what its nodes make: an
``Expand`` in an ``If`` branch, or a ``Loop`` whose body concatenates its carried value
with itself (doubling it on every iteration), allocates whatever the file asks.  So a
control-flow node is folded here by running its body's nodes through :func:`fold`,
which sizes every node's outputs against the folding caps before it evaluates it, with
the iterations and the body nodes run counted against ``MAX_LOOP_STEPS`` before the
first one starts, and the stacked scan outputs held to the caps as they grow.

A node is folded only when everything its body reads from outside (its outer scope) is
a constant; otherwise it is left to the importer, which refuses the control flow it
cannot run.  Nested control flow is refused (:func:`engine.onnx_io.fold.check_bounded`).

>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> body = helper.make_graph(
...     [helper.make_node("Identity", ["c"], ["c_out"]),
...      helper.make_node("Add", ["v", "i"], ["v_out"])], "body",
...     [helper.make_tensor_value_info("i", TensorProto.INT64, []),
...      helper.make_tensor_value_info("c", TensorProto.BOOL, []),
...      helper.make_tensor_value_info("v", TensorProto.INT64, [])],
...     [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
...      helper.make_tensor_value_info("v_out", TensorProto.INT64, [])])
>>> loop = helper.make_node("Loop", ["m", "", "v0"], ["total"], body=body)
>>> from engine.onnx_io.fold import fold
>>> fold_control(loop, {"m": np.array(5), "v0": np.array(0)}, set(), 17, fold)[0].item()
10
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.onnx_io.safety import MAX_FOLD_BYTES, subgraphs

# fold(nodes, consts, shapes, weights, train_generated, opset) -> (consts, kept, generated)
Fold = Callable[..., tuple[dict[str, np.ndarray], list[Any], set[str]]]

# Body nodes run by one folded Loop (iterations times body nodes): each is one call of
# ONNX's reference evaluator, well under a millisecond for the small values a constant
# loop computes, so the cap keeps a hostile file to seconds of import.
MAX_LOOP_STEPS = 1 << 16


def outer_names(node: Any) -> set[str]:
    """The names a control-flow node's bodies read from the graph around it."""
    out: set[str] = set()
    for g in subgraphs(node):
        made = {i.name for i in g.input} | {t.name for t in g.initializer}
        for n in g.node:
            out |= {i for i in n.input if i and i not in made}
            made |= set(n.output)
    return out


def fold_control(node: Any, consts: dict[str, np.ndarray], weights: set[str], opset: int,
                 fold: Fold) -> list[np.ndarray]:
    """The outputs of a constant ``Loop`` or ``If`` (every input and outer-scope read a
    constant), its body's nodes run by ``fold`` (:func:`engine.onnx_io.fold.fold`, which
    bounds each one)."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "If":
        taken = bool(np.asarray(consts[node.input[0]]).reshape(-1)[0])
        branch = attrs["then_branch" if taken else "else_branch"].g
        env = _body_env(branch, consts)
        return _run(node, branch, env, weights, opset, fold)
    if node.op_type != "Loop":
        raise GraphError(f"node {_name(node)!r} ({node.op_type}): not folded")
    body = attrs["body"].g
    trips = int(np.asarray(consts[node.input[0]]).reshape(-1)[0])
    steps = max(trips, 0) * max(len(body.node), 1)
    if steps > MAX_LOOP_STEPS:
        raise GraphError(f"node {_name(node)!r} (Loop): {trips:,} iterations of a "
                         f"{len(body.node)}-node body is {steps:,} node evaluations; at most "
                         f"{MAX_LOOP_STEPS:,} are folded")
    cond_in = node.input[1] if len(node.input) > 1 else ""
    cond = bool(np.asarray(consts[cond_in]).reshape(-1)[0]) if cond_in else True
    carried = [np.asarray(consts[i]) for i in node.input[2:]]
    n_scan = len(body.output) - 1 - len(carried)
    if n_scan < 0 or len(body.input) != 2 + len(carried):
        raise GraphError(f"node {_name(node)!r} (Loop): its body takes {len(body.input)} "
                         f"inputs and gives {len(body.output)} outputs for "
                         f"{len(carried)} carried values")
    scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
    scanned = 0
    base = _body_env(body, consts)
    for i in range(max(trips, 0)):
        if not cond:
            break
        env = dict(base)
        env[body.input[0].name] = np.array(i, np.int64)
        env[body.input[1].name] = np.array(cond)
        for vi, v in zip(body.input[2:], carried, strict=True):
            env[vi.name] = v
        outs = _run(node, body, env, weights, opset, fold)
        cond = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = outs[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(v)
            scanned += int(v.nbytes)
        _refuse_scans(node, scanned)
    if any(not s for s in scans):
        raise GraphError(f"node {_name(node)!r} (Loop): it runs no iteration, so its scan "
                         "outputs have no shape to fold")
    return [*carried, *(np.stack(s) for s in scans)]


def _body_env(body: Any, consts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    env = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    for name in _reads(body):
        if name in consts and name not in env:
            env[name] = consts[name]
    return env


def _reads(body: Any) -> set[str]:
    return {i for n in body.node for i in n.input if i}


def _run(node: Any, body: Any, env: dict[str, np.ndarray], weights: set[str], opset: int,
         fold: Fold) -> list[np.ndarray]:
    consts, kept, _ = fold(list(body.node), env, {}, weights, False, opset)
    missing = [o.name for o in body.output if o.name not in consts]
    if kept or missing:
        what = ", ".join(sorted({n.op_type for n in kept})) or ", ".join(missing)
        raise GraphError(f"node {_name(node)!r} ({node.op_type}): its body does not fold to "
                         f"constants ({what}); control flow is imported only when it does")
    return [np.asarray(consts[o.name]) for o in body.output]


def _refuse_scans(node: Any, nbytes: int) -> None:
    if nbytes > MAX_FOLD_BYTES:
        raise GraphError(f"node {_name(node)!r} (Loop): its scan outputs reach {nbytes:,} "
                         f"bytes; at most {MAX_FOLD_BYTES:,} bytes are folded")


def _name(node: Any) -> str:
    return str(node.name or (node.output[0] if node.output else node.op_type))
