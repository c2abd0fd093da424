"""Every op the table lets run in place computes the same bits when its output is
the very memory of that input: the planner relies on it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.graph import DType, TensorDesc
from engine.ops import OP_TABLE, KernelArgs, get_op
from tests.engine.ops.test_gradients import CASES

R = np.random.default_rng(3)


def _extra_cases() -> list[tuple[str, list[np.ndarray], dict[str, Any]]]:
    """In-place ops that no gradient case calls directly: the gradient ops."""
    pair = [R.uniform(-2, 2, (3, 4)), R.uniform(-2, 2, (3, 4))]
    return [(name, [a.copy() for a in pair], {}) for name, op in OP_TABLE.items()
            if op.inplace and name.endswith("Grad")]


def _runs() -> list[tuple[str, list[np.ndarray], dict[str, Any], int]]:
    runs = []
    for op, inputs, attrs in [(c.op, c.inputs, c.attrs) for c in CASES] + _extra_cases():
        opdef = get_op(op)
        descs = [TensorDesc(DType(a.dtype.name), a.shape) for a in inputs]
        out = opdef.shape(descs, opdef.with_defaults(attrs))[0]
        for k in opdef.inplace:
            if descs[k].dtype == out.dtype and descs[k].numel() == out.numel():
                runs.append((op, inputs, attrs, k))
    return runs


RUNS = _runs()


def _run(op: str, inputs: list[np.ndarray], attrs: dict[str, Any], alias: int | None) -> Any:
    opdef = get_op(op)
    attrs = opdef.with_defaults(attrs)
    ins = [a.copy() for a in inputs]
    descs = [TensorDesc(DType(a.dtype.name), a.shape) for a in ins]
    out_descs = opdef.shape(descs, attrs)
    outs = [np.empty(d.shape, d.dtype.value) for d in out_descs]
    if alias is not None:
        outs[0] = ins[alias].reshape(out_descs[0].shape)
    ws = np.zeros(opdef.workspace(descs, out_descs, attrs, "cpu"), np.uint8)
    opdef.kernel(KernelArgs(np, ins, outs, ws, attrs, np.random.default_rng(0)))()
    return outs[0].copy()


@pytest.mark.parametrize(("op", "inputs", "attrs", "k"), RUNS,
                         ids=[f"{r[0]}-in{r[3]}-{i}" for i, r in enumerate(RUNS)])
def test_in_place_gives_the_same_bits(op: str, inputs: list[np.ndarray],
                                      attrs: dict[str, Any], k: int) -> None:
    np.testing.assert_array_equal(_run(op, inputs, attrs, k), _run(op, inputs, attrs, None))


def test_every_in_place_op_is_covered() -> None:
    covered = {r[0] for r in RUNS}
    declared = {n for n, op in OP_TABLE.items() if op.inplace}
    assert declared <= covered, sorted(declared - covered)
