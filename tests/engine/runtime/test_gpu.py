"""The cupy backend: same results as numpy, exact device memory, no allocation in a
step.  Skipped (with the reason) on machines without cupy and a CUDA device."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine import SGD, VM, Adam, compile_graph
from engine.models import mnist_cnn, paper_mlp
from engine.runtime.backends import gpu_available
from engine.runtime.program import Program
from tests.engine.ops.test_gradients import CASES as GRADIENT_CASES
from tests.engine.ops.test_variants import CASES as VARIANT_CASES
from tests.engine.ops.test_variants import leaves, run_case
from tests.gradcheck import Case, build

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs cupy and a CUDA device"),
]

RNG = np.random.default_rng(0)
X = RNG.random((256, 784), dtype=np.float32)
Y = RNG.integers(0, 10, 256)


def trained(device: str, steps: int = 5) -> VM:
    vm = VM(compile_graph(paper_mlp(dropout=0.0), batch_size=64, optimizer=Adam(),
                          device=device), seed=0)
    for i in range(steps):
        s = slice((i % 4) * 64, (i % 4 + 1) * 64)
        vm.set("x", X[s])
        vm.set("y", Y[s])
        vm.train_step("train")
    return vm


def test_gpu_matches_cpu() -> None:
    cpu, gpu = trained("cpu"), trained("gpu")
    for name in ("w0", "b0", "w2", "b2", "loss"):
        np.testing.assert_allclose(gpu.get(name), cpu.get(name), rtol=1e-4, atol=1e-5)


def test_gpu_heap_is_exact_and_steps_allocate_nothing() -> None:
    import cupy

    pool = cupy.get_default_memory_pool()
    vm = trained("gpu", 2)
    assert vm.allocated_bytes == vm.program.total_bytes
    vm.set("x", X[:64])
    vm.set("y", Y[:64])
    vm.train_step("train")
    cupy.cuda.Device().synchronize()
    before = pool.used_bytes()
    for _ in range(100):
        vm.train_step("train")
    cupy.cuda.Device().synchronize()
    assert pool.used_bytes() == before


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gpu_pause_and_resume_are_exact(dropout: float) -> None:
    import cupy

    from engine.runtime.arena import Arena
    from engine.runtime.pool import ModelPool

    prog = compile_graph(paper_mlp((784, 32, 10), dropout=dropout), batch_size=64,
                         optimizer=Adam(), device="gpu")

    def steps(vm: VM, n: int, offset: int) -> None:
        for i in range(n):
            s = slice(((i + offset) % 4) * 64, ((i + offset) % 4 + 1) * 64)
            vm.set("x", X[s])
            vm.set("y", Y[s])
            vm.train_step("train")

    straight = ModelPool(Arena.for_programs([prog]))
    m = straight.add(prog, seed=1)
    steps(straight.activate(m), 6, 0)
    expected = straight.activate(m).get("w0")

    pool = ModelPool(Arena.for_programs([prog]))
    a, b = pool.add(prog, seed=1), pool.add(prog, seed=2)
    steps(pool.activate(a), 3, 0)
    steps(pool.activate(b), 2, 1)
    steps(pool.activate(a), 3, 3)
    np.testing.assert_array_equal(pool.activate(a).get("w0"), expected)
    used = cupy.get_default_memory_pool().used_bytes()
    for i in range(50):  # switching allocates nothing on the device
        pool.activate((a, b)[i % 2])
    cupy.cuda.Device().synchronize()
    assert cupy.get_default_memory_pool().used_bytes() == used


# Every gradient-check case but dropout's (the devices' generators differ by design).
OP_CASES = [c for c in GRADIENT_CASES if c.op != "Dropout"]


@pytest.mark.parametrize("case", OP_CASES, ids=[c.id for c in OP_CASES])
def test_every_op_gives_the_same_gradients_on_the_gpu(case: Case) -> None:
    """Each gradient-check case run on both devices: every gradient agrees (the cases
    are float64, so to rounding)."""
    results = []
    for device in ("cpu", "gpu"):
        vm, params = build(case, device=device)
        vm.forward(0)
        vm.apply_loss(0)
        vm.backward(0)
        learned = {vm.program.buffers[ps.buffer].name for ps in vm.program.params
                   if ps.grad is not None}
        results.append([vm.grad(p) for p in params if p in learned])
    for cpu, gpu in zip(*results, strict=True):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("op, name", [(op, name) for op in sorted(VARIANT_CASES)
                                      for name in leaves(op)])
def test_every_kernel_variant_matches_the_cpu_and_allocates_nothing(op: str, name: str) -> None:

    cpu, _ = run_case(VARIANT_CASES[op], name, "cpu")
    gpu, vm = run_case(VARIANT_CASES[op], name, "gpu")
    for key, value in cpu.items():
        np.testing.assert_allclose(gpu[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    assert_steps_allocate_nothing_on_the_device(vm)


def test_tuning_on_the_gpu_freezes_with_exact_memory() -> None:

    from engine.autotune import Tuner

    prog = compile_graph(mnist_cnn(), batch_size=32, optimizer=Adam(), device="gpu",
                         autotune=True)
    vm = VM(prog, tune=Tuner(cache=None))
    assert vm.allocated_bytes == prog.total_bytes
    vm.set("x", X[:32])
    vm.set("y", Y[:32])
    for _ in range(100):
        vm.train_step("train")
        if not vm.autotune.tuning:  # type: ignore[union-attr]
            break
    assert vm.autotune.frozen  # type: ignore[union-attr]
    assert_steps_allocate_nothing_on_the_device(vm)


def pool_mallocs(run: Callable[[], None]) -> int:
    """How many blocks CuPy's memory pool hands out while ``run`` runs (a temporary
    taken and given back within a step counts: the pool's bytes in use would not show
    it, and the pool keeps the block cached, outside any plan)."""
    import cupy

    class Count(cupy.cuda.MemoryHook):  # type: ignore[misc]
        name = "CalcGraphTestCount"

        def __init__(self) -> None:
            self.n = 0

        def malloc_postprocess(self, **kwargs: object) -> None:
            self.n += 1

    counter = Count()
    with counter:
        run()
        cupy.cuda.Device().synchronize()
    return counter.n


def assert_steps_allocate_nothing_on_the_device(vm: VM, steps: int = 20) -> None:
    """After one step, ``steps`` more take nothing from CuPy's pool, not even for a
    moment, and leave it holding the same bytes."""
    import cupy

    vm.train_step("train")
    cupy.cuda.Device().synchronize()
    used = cupy.get_default_memory_pool().used_bytes()
    assert pool_mallocs(lambda: [vm.train_step("train") for _ in range(steps)]) == 0
    assert cupy.get_default_memory_pool().used_bytes() == used


def _stack_of(k: int, momenta: bool = False) -> Program:
    from engine.compile.stack import stack_graphs, stack_optimizers

    opts = [SGD(lr=10 ** -(1 + i / k), momentum=0.5 + 0.4 * i / k) if momenta else
            Adam(lr=10 ** -(2 + i / k)) for i in range(k)]
    return compile_graph(stack_graphs([paper_mlp((784, 32, 10)) for _ in range(k)]),
                         batch_size=64, optimizer=stack_optimizers(opts), device="gpu")


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_stack_of_sgd_momenta_trains_on_the_gpu_as_on_the_cpu(nesterov: bool) -> None:
    """The CUDA update with a momentum per member (broadcast over each member's
    parameters) gives the numpy update's parameters, from the same start and batches."""
    from engine.compile.stack import stack_graphs, stack_optimizers

    opts = stack_optimizers([SGD(lr=0.05 * (i + 1), momentum=0.3 + 0.2 * i,
                                 nesterov=nesterov, weight_decay=1e-3) for i in range(4)])
    assert len(opts.momenta) == 4
    graph = stack_graphs([paper_mlp((784, 32, 10)) for _ in range(4)])
    cpu, gpu = (VM(compile_graph(graph, batch_size=64, optimizer=opts, device=d), seed=0)
                for d in ("cpu", "gpu"))
    params = [b.name for b in cpu.program.buffers if b.kind == "param"]
    for name in params:
        gpu.assign(name, cpu.get(name))
    for i in range(6):
        s = slice((i % 4) * 64, (i % 4 + 1) * 64)
        for vm in (cpu, gpu):
            vm.set("x", X[s])
            vm.set("y", Y[s])
            vm.train_step("train")
    for name in params:
        np.testing.assert_allclose(gpu.get(name), cpu.get(name), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


MODELS: dict[str, Callable[[], Program]] = {
    "paper_mlp_adam": lambda: compile_graph(paper_mlp(), batch_size=64, optimizer=Adam(),
                                            device="gpu"),
    "paper_mlp_sgd_momentum": lambda: compile_graph(
        paper_mlp(), batch_size=64, optimizer=SGD(lr=0.1, momentum=0.9), device="gpu"),
    "mnist_cnn": lambda: compile_graph(mnist_cnn(), batch_size=64, optimizer=Adam(),
                                       device="gpu"),
    "stack_of_4": lambda: _stack_of(4),
    "stack_of_4_sgd_momenta": lambda: _stack_of(4, momenta=True),  # per-member momenta
    "nn_mlp_dropout_gelu": lambda: _nn_mlp(),
}


def _nn_mlp() -> Program:
    from engine import nn

    nn.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64),
                        nn.GELU(), nn.Linear(64, 10))
    return compile_graph(nn.to_graph(net, inputs={"x": (0, 784)}, loss="cross_entropy"),
                         batch_size=64, optimizer=Adam(), device="gpu")


@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_step_takes_nothing_from_the_pool(name: str) -> None:
    """The core promise on the device: predicted bytes are the heap, and a step (its
    loss, bias gradients, in-place activations, stacked products, optimizer update)
    allocates nothing, not even a temporary."""
    vm = VM(MODELS[name](), seed=0)
    assert vm.allocated_bytes == vm.program.total_bytes
    b = vm.program.batch_size
    for buf in vm.program.buffers:  # every placeholder fed once: steps reuse the heap
        if buf.kind == "placeholder":
            shape = tuple(b if d == 0 else d for d in buf.shape)
            vm.set(buf.name, np.zeros(shape, buf.dtype) if np.dtype(buf.dtype).kind in "iu"
                   else RNG.random(shape).astype(buf.dtype))
    assert_steps_allocate_nothing_on_the_device(vm)


def test_a_worker_s_overhead_is_its_own_device_memory() -> None:
    """With the CUDA context up, the driver lists this process: its figure is what a
    worker reports (nvidia-ml-py present), no more than the device's memory in use."""
    import cupy

    from explore.procmem import gpu_bytes
    from explore.scheduler.worker import device_overhead, warm_up

    warm_up("gpu")
    free, total = cupy.cuda.runtime.memGetInfo()
    own = gpu_bytes()
    overhead = device_overhead("gpu")
    assert 0 < overhead <= total - free
    if own is not None:
        assert abs(overhead - own) < 64 << 20  # two readings of the same process
