"""The checks of :func:`tests.engine.nn.harness.compare` for models with several inputs
(sequences, bool masks): the same weights in PyTorch and the engine, then the eval
forward, the loss ``sum(out * r)`` and every parameter's gradient, the parameters after
optimizer steps, exact memory and no allocation in a step."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine import VM, Adam, compile_graph, nn
from tests.engine.nn.harness import (
    OPTIMIZERS,
    TOL,
    assert_step_allocates_nothing,
    close,
    compile_checked,
    sum_loss,
    torch_state,
)

# Attention's key bias has a zero gradient (a softmax ignores what is added to a whole
# row), so each library's is float32 noise, which Adam with a tiny eps scales up to a
# full step of either sign: these optimizers' eps keeps a noise gradient a noise step.
ATTENTION_OPTIMIZERS = {
    "sgd": OPTIMIZERS["sgd"],
    "adam": (lambda: Adam(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-3, weight_decay=1e-3),
             lambda torch, ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-3,
                                                weight_decay=1e-3)),
}


def compile_forward(g: Any, batch: int) -> VM:
    """A VM of a graph without a training path; its heap is exactly the plan."""
    prog = compile_graph(g, batch_size=batch)
    vm = VM(prog, seed=0)
    assert vm.allocated_bytes == prog.total_bytes
    return vm


def torch_inputs(torch: Any, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: torch.from_numpy(v.copy()) for k, v in inputs.items()}


def engine_graph(em: nn.Module, inputs: dict[str, np.ndarray], out_shape: tuple[int, ...]
                 ) -> Any:
    specs = {k: ((0, *v.shape[1:]), v.dtype.name) for k, v in inputs.items()}
    return nn.to_graph(em, inputs=specs, loss=sum_loss, target_shape=(0, *out_shape[1:]))


def compare_inputs(torch: Any, tm: Any, em: nn.Module, inputs: dict[str, np.ndarray], *,
                   steps: int = 2, optimizers: tuple[str, ...] = ("sgd", "adam"),
                   tol: float = TOL, check_memory: bool = True) -> None:
    """``em`` against ``tm`` (PyTorch), both called with the keyword ``inputs``."""
    em.load_state_dict(torch_state(tm))
    tx = torch_inputs(torch, inputs)
    tm.eval()
    with torch.no_grad():
        want_eval = tm(**tx).numpy()
    r = np.random.default_rng(7).normal(size=want_eval.shape).astype(np.float32)
    tr = torch.from_numpy(r)
    g = engine_graph(em, inputs, want_eval.shape)
    start = torch_state(tm)
    batch = len(next(iter(inputs.values())))
    for opt_name in optimizers:
        make_engine, make_torch = ATTENTION_OPTIMIZERS[opt_name]
        tm.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
        _, vm = compile_checked(g, batch, make_engine())
        for k, v in inputs.items():
            vm.set(k, v)
        vm.forward("eval")
        close(vm.get("logits"), want_eval, tol, "eval forward")
        opt = make_torch(torch, list(tm.parameters()))
        tm.train()
        for step in range(steps):
            vm.set("y", r)
            vm.forward("train")
            vm.apply_loss("train")
            vm.backward("train")
            opt.zero_grad()
            loss = (tm(**tx) * tr).sum()
            loss.backward()
            close(vm.get("loss"), loss.item(), tol, f"loss at step {step}")
            for k, p in tm.named_parameters():
                if p.grad is None:  # unused by this model: the engine prunes it
                    continue
                close(vm.grad(k), p.grad.numpy(), tol, f"gradient of {k} at step {step}")
            vm.optimize()
            opt.step()
            for k, v in tm.state_dict().items():
                close(vm.get(k), v.detach().numpy(), tol, f"{k} after {opt_name} step {step}")
        tm.eval()
        with torch.no_grad():
            after = tm(**tx).numpy()
        vm.forward("eval")
        close(vm.get("logits"), after, tol, f"eval forward after {opt_name}")
        if check_memory:
            vm.set("y", np.zeros_like(r))
            assert_step_allocates_nothing(vm)
