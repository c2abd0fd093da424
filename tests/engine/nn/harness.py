"""Shared checks of engine.nn against PyTorch: the same weights in both, then the same
forward outputs, gradients of every parameter, parameters after optimizer steps and
batch norm's running statistics; and the memory checks every traced model passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine import SGD, VM, Adam, CalcGraph, Optimizer, Program, compile_graph, nn
from tests.allocations import step_allocations
from tests.planverify import assert_no_clobber

TOL = 1e-4  # float32: relative, and absolute on the reference's scale


def close(got: Any, want: Any, tol: float = TOL, what: str = "") -> None:
    want = np.asarray(want, dtype=np.float64)
    assert np.isfinite(want).all(), f"{what}: the reference is not finite"
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol,
                               atol=tol * scale, err_msg=what)


def torch_state(tm: Any) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in tm.state_dict().items()}


def compile_checked(g: CalcGraph, batch: int, optimizer: Optimizer | None = None
                    ) -> tuple[Program, VM]:
    """Compile and load; the heap is exactly the plan and no two live buffers share bytes."""
    prog = compile_graph(g, batch_size=batch, optimizer=optimizer or SGD(lr=0.0))
    vm = VM(prog, seed=0)
    assert vm.allocated_bytes == prog.total_bytes
    assert_no_clobber(prog)
    return prog, vm


def assert_step_allocates_nothing(vm: VM, train: bool = True) -> None:
    """A train step and an eval forward retain nothing; the only transient is numpy's
    ufunc iteration buffer: 8,192 elements per operand of a strided or broadcasting
    call, at most three float32 operands (ConvGradInput's strided adds, the bound of
    tests/engine/ops/test_conv_algorithms.py) or one int64 (Accuracy's sum, as in
    tests/explore/test_task_models.py), whatever the batch."""

    def step() -> None:
        if train:
            vm.train_step("train")
        vm.forward("eval")

    retained, peak = step_allocations(step, warmup=3, runs=10)
    assert retained < 4096 and peak <= 3 * 8192 * 4 + 4096, (retained, peak)


OPTIMIZERS: dict[str, tuple[Callable[[], Optimizer], Callable[[Any, Any], Any]]] = {
    # engine optimizer, torch.optim equivalent (the same hyperparameters by name)
    "sgd": (lambda: SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
            lambda torch, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "adam": (lambda: Adam(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-7, weight_decay=1e-3),
             lambda torch, ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-7,
                                                weight_decay=1e-3)),
}


def sum_loss(out: Any, r: Any) -> Any:
    """A loss every element of the output matters to: ``sum(out * r)``."""
    return (out * r).sum()


def compare(torch: Any, tm: Any, em: nn.Module, x: np.ndarray, *, steps: int = 2,
            optimizers: tuple[str, ...] = ("sgd", "adam"), tol: float = TOL,
            x_dtype: str = "float32") -> None:
    """``em`` (an engine module) against ``tm`` (the PyTorch one), same weights: eval
    forward, the train path's loss and every parameter's gradient for ``sum(out * r)``,
    the parameters and buffers after ``steps`` optimizer steps of each optimizer, and
    the eval forward after them; the program's memory is exact and a step allocates
    nothing."""
    em.load_state_dict(torch_state(tm))
    tx = torch.from_numpy(x)
    tm.eval()
    with torch.no_grad():
        want_eval = tm(tx).numpy()
    rng = np.random.default_rng(7)
    r = rng.normal(size=want_eval.shape).astype(np.float32)
    tr = torch.from_numpy(r)
    g = nn.to_graph(em, inputs={"x": ((0, *x.shape[1:]), x_dtype)}, loss=sum_loss,
                    target_shape=(0, *want_eval.shape[1:]))
    start = torch_state(tm)
    # buffers no op writes, folded away by the compiler into the constants they make
    buffers = {k for k, v in g.variables.items() if v.kind.name == "PARAMETER" and
               not v.trainable}
    folded: set[str] = set()
    for opt_name in optimizers:
        make_engine, make_torch = OPTIMIZERS[opt_name]
        tm.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
        _, vm = compile_checked(g, len(x), make_engine())
        folded = buffers - {b.name for b in vm.program.buffers}
        vm.set("x", x)
        vm.forward("eval")
        close(vm.get("logits"), want_eval, tol, "eval forward")
        opt = make_torch(torch, list(tm.parameters()))
        tm.train()
        for step in range(steps):
            vm.set("x", x)
            vm.set("y", r)
            vm.forward("train")
            vm.apply_loss("train")
            vm.backward("train")
            opt.zero_grad()
            loss = (tm(tx) * tr).sum()
            loss.backward()
            close(vm.get("loss"), loss.item(), tol, f"loss at step {step}")
            for k, p in tm.named_parameters():
                close(vm.grad(k), p.grad.numpy(), tol, f"gradient of {k} at step {step}")
            vm.optimize()
            opt.step()
            for k, v in tm.state_dict().items():
                if k.endswith("num_batches_tracked"):
                    continue
                if k in folded:  # a constant buffer the compiler folded into what reads it
                    close(start[k], v.detach().numpy(), 0.0, f"{k}, constant, at step {step}")
                    continue
                close(vm.get(k), v.detach().numpy(), tol, f"{k} after {opt_name} step {step}")
        tm.eval()
        with torch.no_grad():
            after = tm(tx).numpy()
        vm.set("x", x)
        vm.forward("eval")
        close(vm.get("logits"), after, tol, f"eval forward after {opt_name}")
        vm.set("x", x)
        vm.set("y", np.zeros_like(r))  # steps without a gradient: the values stay finite
        assert_step_allocates_nothing(vm)
