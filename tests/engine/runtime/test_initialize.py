"""A fresh model is written straight into the VM's heap: the same bytes as the host
state the engine made before (the reference below is that code, kept verbatim), and
no host memory the size of the model outside the heap."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import numpy as np
import pytest

from engine import (
    SGD,
    VM,
    Adagrad,
    Adam,
    AdamW,
    CalcGraph,
    Init,
    Mode,
    Optimizer,
    RMSProp,
    compile_graph,
)
from engine.compile.stack import stack_graphs, stack_optimizers
from engine.errors import GraphError
from engine.models import paper_mlp
from engine.runtime import initializers
from engine.runtime.arena import Arena
from engine.runtime.backends import get_backend
from engine.runtime.heap import CalcHeap
from engine.runtime.initializers import fans, fill_initial, initial_values, put_initial
from engine.runtime.optim import PerModelLR
from engine.runtime.program import Program
from engine.runtime.state import ModelState, initial_state, region_dtype, write_initial
from engine.runtime.zones import ZONES


# -- the reference: initial_values and initial_state as they were, whole arrays ----------
def reference_values(init: Init, shape: tuple[int, ...], dtype: Any,
                     rng: np.random.Generator) -> np.ndarray:
    if init.method == "stacked":
        assert init.members is not None
        a = init.model_axis
        if len(shape) <= a or shape[a] != len(init.members):
            raise GraphError("stacked shape")
        own = shape[:a] + shape[a + 1:]
        return np.stack([reference_values(m, own, dtype, rng) for m in init.members], axis=a)
    fan_in, fan_out = fans(shape)
    fan_in = init.fan_in or fan_in
    fan_out = init.fan_out or fan_out
    m = init.method
    if m == "zeros":
        out = np.zeros(shape)
    elif m == "ones":
        out = np.ones(shape)
    elif m == "constant":
        out = np.full(shape, init.value)
    elif m == "values":
        vals = init.array if init.array is not None else np.asarray(init.values, np.float64)
        out = np.full(shape, vals[0]) if vals.size == 1 else vals.reshape(shape)
    elif m == "uniform":
        out = rng.uniform(init.low, init.high, shape)
    elif m == "normal":
        out = rng.normal(init.mean, init.std, shape)
    elif m == "xavier_uniform":
        a = math.sqrt(6.0 / (fan_in + fan_out))
        out = rng.uniform(-a, a, shape)
    elif m == "xavier_normal":
        out = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), shape)
    elif m == "he_uniform":
        a = math.sqrt(6.0 / fan_in)
        out = rng.uniform(-a, a, shape)
    elif m == "he_normal":
        out = rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)
    elif m == "lecun_normal":
        out = rng.normal(0.0, math.sqrt(1.0 / fan_in), shape)
    else:
        raise GraphError(m)
    return np.asarray(out, dtype=dtype, order="C")


def reference_state(program: Program, seed: int) -> ModelState:
    be = get_backend(program.device)
    st = ModelState(program, be.host_alloc(program.state_bytes),
                    be.host_alloc(program.zone_bytes["optimizer"]),
                    be.host_alloc(program.param_region))
    st.forward.fill(0)
    st.optimizer.fill(0)
    st.gradient.fill(0)
    host_rng = np.random.default_rng(seed)
    for ps in program.params:
        spec = program.buffers[ps.buffer]
        values = reference_values(ps.init, spec.shape, np.dtype(spec.dtype), host_rng)
        st.forward[spec.offset : spec.offset + values.nbytes] = values.reshape(-1).view(np.uint8)
    opt, region = program.optimizer, program.param_region
    if opt is not None and region:
        dt = region_dtype(program) or np.dtype(np.float32)
        layout = [(program.buffers[ps.buffer].offset // dt.itemsize,
                   program.buffers[ps.buffer].desc.numel()) for ps in program.params
                  if ps.grad is not None]
        values = opt.slot_values(layout)
        if isinstance(opt, PerModelLR):  # the rates, model k's along each model axis
            rates = np.zeros(region // dt.itemsize, dtype=np.float64)
            for ps in program.params:
                if ps.grad is None:
                    continue
                spec = program.buffers[ps.buffer]
                whole = rates[spec.offset // dt.itemsize:][: spec.desc.numel()]
                whole = whole.reshape(spec.shape)
                for k, lr in enumerate(opt.lrs):
                    whole[(slice(None),) * ps.init.model_axis + (k,)] = lr
            values = (*values[:-1], rates)
        for off, value in zip(program.state_offsets, values, strict=True):
            slot = st.optimizer[off : off + region].view(dt)
            if isinstance(value, np.ndarray):
                slot[: len(value)] = value
            elif value:
                slot.fill(value)
    st.rng = be.rng_state(be.rng(seed))
    return st


# -- the cases ---------------------------------------------------------------------------
INITS = [
    Init.zeros(), Init.ones(), Init.constant(0.1), Init.uniform(-0.3, 0.7), Init.normal(0.2, 0.9),
    Init.xavier_uniform(), Init.xavier_normal(), Init.he_uniform(), Init.he_normal(),
    Init.lecun_normal(), Init.xavier_uniform(fan_in=3, fan_out=11), Init.he_normal(fan_in=5),
    Init.from_values([0.3]),
]
SHAPES = [(), (1,), (7,), (5, 3), (4, 3, 2, 2), (130, 67)]
OPTIMIZERS: list[Optimizer] = [
    SGD(lr=0.1), SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    Adam(lr=0.01), AdamW(lr=0.01, weight_decay=0.01), RMSProp(lr=0.01, momentum=0.5),
    Adagrad(lr=0.05, initial_accumulator_value=0.1),
]


def _id(o: object) -> str:
    return getattr(o, "method", None) or type(o).__name__


def with_explicit(shape: tuple[int, ...]) -> list[Init]:
    n = math.prod(shape)
    vals = np.random.default_rng(9).normal(size=n)
    return [*INITS, Init.from_values(vals.tolist()), Init.from_array(vals)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_chunked_draws_equal_one_draw(shape: tuple[int, ...], chunk: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method, drawn ``chunk`` values at a time, gives the values and leaves the
    generator where one draw of the whole shape does (float32 and float64)."""
    monkeypatch.setattr(initializers, "CHUNK", chunk)
    for dtype in (np.float32, np.float64):
        for init in with_explicit(shape):
            ref_rng, rng, put_rng = (np.random.default_rng(4) for _ in range(3))
            want = reference_values(init, shape, dtype, ref_rng)
            got = np.full(shape, np.nan, dtype)
            fill_initial(init, got, rng)
            assert got.tobytes() == want.tobytes(), (init, shape, dtype)
            assert initial_values(init, shape, dtype, np.random.default_rng(4)).tobytes() == \
                want.tobytes()
            flat = np.full(math.prod(shape), np.nan, dtype)
            sizes: list[int] = []

            def put(start: int, values: np.ndarray, flat: Any = flat, sizes: Any = sizes) -> None:
                flat[start : start + len(values)] = values
                sizes.append(len(values))

            put_initial(init, shape, dtype, put_rng, put)
            assert flat.tobytes() == want.tobytes(), (init, shape, dtype)
            assert max(sizes, default=0) <= chunk
            assert rng.bit_generator.state == ref_rng.bit_generator.state == \
                put_rng.bit_generator.state


@pytest.mark.parametrize("chunk", [1, 5, 1 << 16])
@pytest.mark.parametrize("model_axis", [0, 1])
@pytest.mark.parametrize("own", [(4, 5), (2, 3, 2, 2), (6,)], ids=str)
def test_stacked_members_chunked(own: tuple[int, ...], model_axis: int, chunk: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(initializers, "CHUNK", chunk)
    shape = (*own[:model_axis], 3, *own[model_axis:])  # three models along model_axis
    members = [Init.he_uniform(), Init.normal(0.0, 2.0), Init.xavier_normal()]
    inits = [Init.stacked(members, model_axis), Init.stacked(INITS[:3], model_axis)]
    for init in inits:
        for k, member in enumerate(init.members or ()):  # each slice drawn as the model
            alone = reference_values(member, own, np.float32, np.random.default_rng(1))
            assert init.member(np.zeros(shape), k).shape == alone.shape
        want = reference_values(init, shape, np.float32, np.random.default_rng(1))
        got = np.full(shape, np.nan, np.float32)
        fill_initial(init, got, np.random.default_rng(1))
        assert got.tobytes() == want.tobytes()
        flat = np.full(math.prod(shape), np.nan, np.float32)

        def put(start: int, values: np.ndarray, flat: Any = flat) -> None:
            flat[start : start + len(values)] = values

        put_initial(init, shape, np.float32, np.random.default_rng(1), put)
        assert flat.tobytes() == want.tobytes()
    with pytest.raises(GraphError):
        fill_initial(inits[0], np.zeros((2, 4), np.float32), np.random.default_rng(0))


def test_explicit_values_of_the_wrong_size_are_refused() -> None:
    for init in (Init.from_values([1.0, 2.0, 3.0]), Init.from_array(np.arange(3.0))):
        with pytest.raises(ValueError):
            fill_initial(init, np.zeros((2, 2), np.float32), np.random.default_rng(0))
        with pytest.raises(ValueError):
            reference_values(init, (2, 2), np.float32, np.random.default_rng(0))


def every_init_graph() -> CalcGraph:
    """A regression model with one learned weight per init method, and one parameter
    that no path learns (it is not in the optimizer's region)."""
    g = CalcGraph(name="inits")
    x = g.placeholder("x", (0, 6))
    t = g.placeholder("t", (0, 6))
    p = g.path("fit", Mode.BACKWARD_ENABLED)
    h = x
    for i, init in enumerate(with_explicit((6, 6))):
        w = g.parameter(f"w{i}", (6, 6), init=init)
        explicit = init.method == "values" and init.values != (0.3,)  # 36 values: w's own
        b = g.parameter(f"b{i}", (6,), init=Init.from_array(np.arange(6.0) / 7) if explicit
                        else init)
        h = p.Tanh(p.Add(p.MatMul(h, w), b))
    p.set_loss(p.MSELoss(h, t))
    frozen = g.parameter("frozen", (6, 6), init=Init.uniform(-1, 1))
    g.path("other", Mode.FORWARD_ONLY).MatMul(x, frozen, outputs=["y"])
    return g


def stack_program(opts: list[Optimizer]) -> Program:
    inits = [Init.he_normal(), Init.uniform(-0.2, 0.2), Init.xavier_uniform()][: len(opts)]
    graphs = [paper_mlp((12, 40, 3), activation="Tanh", init=i) for i in inits]
    return compile_graph(stack_graphs(graphs), batch_size=8, optimizer=stack_optimizers(opts))


PROGRAMS = [("every_init", o) for o in OPTIMIZERS] + [
    ("stack", [Adam(lr=1e-3), Adam(lr=1e-2), Adam(lr=3e-2)]),
    ("stack", [SGD(lr=0.1, momentum=0.9), SGD(lr=0.01, momentum=0.9)]),
    ("stack", [Adagrad(lr=0.1, initial_accumulator_value=0.2)] * 3),
    ("stack", [RMSProp(lr=1e-3), RMSProp(lr=1e-2), RMSProp(lr=1e-1)]),
]


def build_program(kind: str, opt: Any) -> Program:
    if kind == "stack":
        return stack_program(opt)
    return compile_graph(every_init_graph(), batch_size=4, optimizer=opt)


def zone_bytes(vm: VM) -> dict[str, bytes]:
    return {z: vm.backend.to_host(vm.heap.zones[z][: vm.program.zone_bytes[z]]).tobytes()
            for z in ZONES}


def assert_same_vm(vm: VM, ref: VM) -> None:
    assert zone_bytes(vm) == zone_bytes(ref)
    assert vm.backend.rng_state(vm.rng) == ref.backend.rng_state(ref.rng)
    assert (vm._t[0], vm._dirty, vm.round, vm._forwarded, vm._fed, vm.batch_size) == \
        (ref._t[0], ref._dirty, ref.round, ref._forwarded, ref._fed, ref.batch_size)


@pytest.mark.parametrize(("kind", "opt"), PROGRAMS,
                         ids=[f"{k}-{_id(o if k != 'stack' else o[0])}" for k, o in PROGRAMS])
def test_a_fresh_vm_equals_the_reference_state(kind: str, opt: Any) -> None:
    prog = build_program(kind, opt)
    ref = VM(prog, initialize=False)
    ref.load_state(reference_state(prog, seed=7))
    vm = VM(prog, seed=7)
    assert_same_vm(vm, ref)
    # initial_state (a paused model in the pool) writes the same bytes
    st, want = initial_state(prog, seed=7), reference_state(prog, seed=7)
    assert st.forward.tobytes() == want.forward.tobytes()
    assert st.optimizer.tobytes() == want.optimizer.tobytes()
    assert st.gradient.tobytes() == want.gradient.tobytes()
    assert (st.t, st.dirty, st.round, st.rng) == (want.t, want.dirty, want.round, want.rng)


@pytest.mark.parametrize(("kind", "opt"), [PROGRAMS[2], PROGRAMS[-4]], ids=["adam", "stack"])
def test_reinitialize_after_training_resets_everything(kind: str, opt: Any) -> None:
    prog = build_program(kind, opt)
    vm = VM(prog, seed=1)
    rng = np.random.default_rng(0)
    data = {b.name: (rng.integers(0, 3, (3, *b.shape[1:])) if b.dtype.startswith("int")
                     else rng.normal(size=(3, *b.shape[1:]))).astype(b.dtype)
            for b in prog.buffers if b.kind == "placeholder"}
    vm.feed(data)  # a smaller batch than the compiled one
    path = next(i for i, p in enumerate(prog.paths) if p.seed is not None)
    vm.train_step(path)
    vm.feed(data)
    vm.forward(path)
    vm.apply_loss(path)
    vm.backward(path)  # unconsumed gradients
    vm.end_round()
    vm.initialize(seed=5)
    ref = VM(prog, initialize=False)
    ref.load_state(reference_state(prog, seed=5))
    assert_same_vm(vm, ref)


def test_the_device_path_writes_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's path (bounded host chunks through ``Backend.copy_in``), run on the
    CPU's arrays: the same bytes, through copies of at most a chunk."""
    monkeypatch.setattr(initializers, "CHUNK", 5)
    be = get_backend("cpu")
    copies: list[int] = []

    class Counting(type(be)):  # type: ignore[misc]
        def copy_in(self, dst: Any, src: np.ndarray) -> None:
            copies.append(src.nbytes)
            super().copy_in(dst, src)

    for kind, opt in [PROGRAMS[2], PROGRAMS[-4], PROGRAMS[-3]]:
        prog = build_program(kind, opt)
        want = reference_state(prog, seed=3)
        fwd = np.zeros(prog.state_bytes, np.uint8)
        optz = np.zeros(prog.zone_bytes["optimizer"], np.uint8)
        write_initial(prog, 3, fwd, optz, Counting(), host=False)
        assert fwd.tobytes() == want.forward.tobytes()
        assert optz.tobytes() == want.optimizer.tobytes()
    assert copies and max(copies) <= 5 * 8


# -- memory ------------------------------------------------------------------------------
BOUND = 2 << 20  # bytes of host memory a VM's set-up may take outside its heap


@pytest.fixture(scope="module")
def big() -> Program:
    return compile_graph(paper_mlp((784, 2048, 2048, 10)), batch_size=64, optimizer=Adam())


def traced_peak(f: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_vm_setup_allocates_nothing_model_sized(big: Program) -> None:
    """A worker's VM on a region of its arena: the set-up's host memory outside the
    heap is bounded by a constant (a chunk of draws and the bindings), not the model."""
    arena = Arena(big.total_bytes)
    region = arena.buffer[: big.total_bytes]
    vms: list[VM] = []
    peak = traced_peak(lambda: vms.append(
        VM(big, seed=1, heap=CalcHeap(arena.backend, big.zone_bytes, buffer=region))))
    param_bytes = big.state_bytes
    assert param_bytes > 20 << 20
    assert peak < BOUND, f"VM set-up took {peak:,} bytes of host memory outside the heap"
    assert peak < param_bytes / 10
    vm = vms[0]
    ref = reference_state(big, seed=1)
    assert vm.backend.to_host(vm.heap.zones["forward"][: big.state_bytes]).tobytes() == \
        ref.forward.tobytes()
    assert vm.backend.to_host(vm.heap.zones["optimizer"][: big.zone_bytes["optimizer"]]
                              ).tobytes() == ref.optimizer.tobytes()
    del ref

    # a model re-initialised in the same heap: nothing model-sized either
    peak = traced_peak(lambda: vm.initialize(seed=2))
    assert peak < BOUND, f"VM.initialize took {peak:,} bytes of host memory outside the heap"
    fresh = initial_state(big, seed=2)
    assert vm.backend.to_host(vm.heap.zones["forward"][: big.state_bytes]).tobytes() == \
        fresh.forward.tobytes()
