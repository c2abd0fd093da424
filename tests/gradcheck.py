"""Finite-difference gradient checking over the engine, in float64.

A case is one op applied to inputs that are trainable parameters (the ones whose
gradients are checked) or placeholders (labels, masks); the scalar checked is
``sum(output_k * R_k)`` with fixed random ``R_k``, so every element of the gradient
matters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import SGD, VM, CalcGraph, Init, Mode, compile_graph


@dataclass
class Case:
    op: str
    inputs: list[np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    diff: tuple[int, ...] | None = None  # inputs to differentiate (default: float ones)
    outputs: tuple[int, ...] = (0,)  # outputs entering the checked scalar
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            shapes = "x".join(str(list(a.shape)) for a in self.inputs)
            extra = ",".join(f"{k}={v}" for k, v in sorted(self.attrs.items()))
            self.id = f"{self.op}-{shapes}{('-' + extra) if extra else ''}"


def build(case: Case, seed: int = 0, sharing: str = "auto", device: str = "cpu"
          ) -> tuple[VM, list[str]]:
    rng = np.random.default_rng(seed + 1)
    g = CalcGraph(name=case.id)
    diff = case.diff if case.diff is not None else tuple(
        i for i, a in enumerate(case.inputs) if a.dtype.kind == "f")
    names = []
    for i, a in enumerate(case.inputs):
        name = f"in{i}"
        if i in diff:
            g.parameter(name, a.shape, init=Init.from_values(a.ravel().tolist()),
                        dtype=a.dtype.name)
        else:
            g.placeholder(name, a.shape, dtype=a.dtype.name)
        names.append(name)
    p = g.path("check", Mode.BACKWARD_ENABLED)
    n_out = max(case.outputs) + 1
    outs = p.op(case.op, *names, outputs=n_out, **case.attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    terms = []
    for k in case.outputs:
        prog_shape = _probe_shape(case, k)
        r = g.constant(rng.normal(size=prog_shape).ravel().tolist() if prog_shape else
                       [float(rng.normal())], shape=prog_shape, dtype="float64",
                       name=f"R{k}")
        terms.append(p.ReduceSum(p.Mul(outs[k], r), keepdims=0))
    total = terms[0]
    for t in terms[1:]:
        total = p.Add(total, t)
    p.set_loss(total)
    # The op as written: no graph optimisation may rewrite the op under test.
    prog = compile_graph(g, batch_size=1, optimizer=SGD(lr=0.0), debug=True, passes=(),
                         sharing=sharing, device=device)
    vm = VM(prog, seed=seed)
    for i, a in enumerate(case.inputs):
        if i not in diff:
            vm.set(names[i], a)
    return vm, [names[i] for i in diff]


def _probe_shape(case: Case, k: int) -> tuple[int, ...]:
    g = CalcGraph()
    names = []
    for i, a in enumerate(case.inputs):
        g.placeholder(f"x{i}", a.shape, dtype=a.dtype.name)
        names.append(f"x{i}")
    p = g.path("probe")
    p.op(case.op, *names, outputs=max(case.outputs) + 1, **case.attrs)
    from engine.compile.compiler import lower

    ir = lower(g, passes=())
    node = ir.paths[0].forward[0]
    return tuple(ir.descs[node.outputs[k]].shape)


def loss_value(vm: VM, state: Any) -> float:
    vm.rng.bit_generator.state = state  # the same dropout mask at every evaluation
    vm.forward(0)
    return float(vm.get(vm.program.buffers[vm.program.paths[0].loss].name))  # type: ignore[index]


def loss_grads_workspace(case: Case) -> tuple[float, dict[str, np.ndarray], int]:
    """One forward and backward of ``case`` with the heap checked exact: the loss, each
    parameter's gradient, and the program's workspace bytes (what a kernel variant's
    tests compare between two ways of running the same op)."""
    vm, params = build(case)
    assert vm.allocated_bytes == vm.program.total_bytes
    loss = loss_value(vm, vm.rng.bit_generator.state)
    vm.apply_loss(0)
    vm.backward(0)
    return loss, {p: vm.grad(p) for p in params}, vm.program.zone_bytes["workspace"]


def check(case: Case, eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    vm, params = build(case)
    state = vm.rng.bit_generator.state
    loss_value(vm, state)
    vm.apply_loss(0)
    vm.backward(0)
    learned = {vm.program.buffers[ps.buffer].name for ps in vm.program.params
               if ps.grad is not None}
    for name in params:
        # An op with a zero derivative (Sign) leaves the parameter without a gradient.
        analytic = vm.grad(name) if name in learned else np.zeros_like(vm.get(name))
        base = vm.get(name)
        numeric = np.zeros_like(base)
        flat = base.reshape(-1)
        for j in range(flat.size):
            plus, minus = flat.copy(), flat.copy()
            plus[j] += eps
            minus[j] -= eps
            vm.assign(name, plus.reshape(base.shape))
            fp = loss_value(vm, state)
            vm.assign(name, minus.reshape(base.shape))
            fm = loss_value(vm, state)
            numeric.reshape(-1)[j] = (fp - fm) / (2 * eps)
        vm.assign(name, base)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"{case.id}: gradient of {name}")


def ops_in(case: Case) -> set[str]:
    vm, _ = build(case)
    return {i.op for i in vm.program.instrs}
