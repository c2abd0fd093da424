"""Model switching: exact pause and resume, several programs in one arena, paused
models on disk, the pool's bound, and memory that stays constant."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, Adagrad, Adam, AdamW, EngineError, Optimizer, RMSProp, compile_graph
from engine.graph import Init
from engine.models import paper_mlp
from engine.runtime.arena import Arena
from engine.runtime.backends import gpu_available
from engine.runtime.pool import ModelPool, PoolFullError
from engine.runtime.program import Program
from engine.runtime.state import ModelState
from engine.runtime.train import train_epoch

OPTIMIZERS: list[Optimizer] = [
    SGD(lr=0.1), SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    Adam(lr=0.01), AdamW(lr=0.01, weight_decay=0.01), RMSProp(lr=0.01, momentum=0.5),
    Adagrad(lr=0.05),
]
R = np.random.default_rng(0)
X = R.normal(size=(100, 12)).astype(np.float32)  # 100 samples: the last batch is 4 of 32
Y = (X[:, :3].argmax(axis=1)).astype(np.int64)


def program(opt: Optimizer, hidden: int = 16) -> Program:
    return compile_graph(paper_mlp((12, hidden, 3), dropout=0.3), batch_size=32, optimizer=opt)


def rounds(vm, n: int, seed: int) -> None:
    for _ in range(n):
        train_epoch(vm, X, Y, np.random.default_rng(seed * 100 + vm.round))


def snapshot(vm) -> dict[str, np.ndarray]:
    out = {b.name: vm.get(b.name) for b in vm.program.buffers if b.kind == "param"}
    out["optimizer"] = vm.backend.to_host(vm.heap.zones["optimizer"]).copy()
    return out


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: repr(o)[:40])
def test_pause_and_resume_are_exact(opt: Optimizer) -> None:
    prog = program(opt)
    straight = ModelPool(Arena.for_programs([prog]))
    m = straight.add(prog, seed=3)
    vm = straight.activate(m)
    rounds(vm, 10, seed=1)
    expected = snapshot(vm)

    other = program(Adam(lr=0.02), hidden=24)
    pool = ModelPool(Arena.for_programs([prog, other]))
    a, same, b = pool.add(prog, seed=3), pool.add(prog, seed=7), pool.add(other, seed=4)
    rounds(pool.activate(a), 5, seed=1)
    rounds(pool.activate(same), 2, seed=8)  # the same bytecode and generator in between
    rounds(pool.activate(b), 3, seed=9)  # another program: a rebind
    vm = pool.activate(a)
    rounds(vm, 5, seed=1)
    assert vm.round == 10 and pool.switches == 4
    assert_same(snapshot(vm), expected)


def test_unconsumed_gradients_survive_a_switch() -> None:
    prog = program(Adam(lr=0.01))

    def accumulate(pool: ModelPool, m, switch: bool) -> dict[str, np.ndarray]:
        vm = pool.activate(m)
        for s in (0, 32):
            vm.set("x", X[s:s + 32])
            vm.set("y", Y[s:s + 32])
            vm.forward("train")
            vm.apply_loss("train", 0.5)
            vm.backward("train")
        if switch:
            pool.activate(pool.add(prog, seed=8))
            vm = pool.activate(m)
        vm.optimize()
        return snapshot(vm)

    p1, p2 = ModelPool(Arena.for_programs([prog])), ModelPool(Arena.for_programs([prog]))
    assert_same(accumulate(p1, p1.add(prog, seed=2), False),
                accumulate(p2, p2.add(prog, seed=2), True))


def test_a_paused_model_goes_to_disk_and_back(tmp_path) -> None:
    prog = program(RMSProp(lr=0.01, momentum=0.5))
    pool = ModelPool(Arena.for_programs([prog]))
    m = pool.add(prog, seed=5)
    rounds(pool.activate(m), 4, seed=2)
    path = pool.save(m, tmp_path / "trial.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial.npz"]  # nothing else
    rounds(pool.activate(m), 3, seed=2)
    expected = snapshot(pool.activate(m))

    fresh = ModelPool(Arena.for_programs([prog]))  # a new worker: only the file
    back = fresh.load(path)
    assert back.program == prog and back.state.round == 4
    vm = fresh.activate(back)
    rounds(vm, 3, seed=2)
    assert_same(snapshot(vm), expected)


def test_saving_is_atomic_and_loading_checks(tmp_path, monkeypatch) -> None:
    prog = program(SGD(lr=0.1))
    pool = ModelPool(Arena.for_programs([prog]))
    m = pool.add(prog)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        pool.save(m, tmp_path / "m.npz")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(EngineError, match="not a saved model state"):
        pool.load(tmp_path / "junk.npz")


def on_arena(prog: Program, offset: int, seed: int = 0):
    """A VM of ``prog`` at ``offset`` of an arena of its own (a worker's region)."""
    from engine.runtime.heap import CalcHeap
    from engine.runtime.vm import VM

    arena = Arena(offset + prog.total_bytes)
    region = arena.buffer[offset:offset + prog.total_bytes]
    return VM(prog, seed=seed, heap=CalcHeap(arena.backend, prog.zone_bytes, buffer=region))


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: repr(o)[:40])
def test_a_state_streams_to_a_file_and_back_exactly(tmp_path, opt: Optimizer) -> None:
    """Straight from one heap to a file and into another at another offset (a switched-
    out trial coming back into another worker): the same model as one never moved,
    through dropout's generator, the step count and the rounds."""
    prog = program(opt)
    straight = on_arena(prog, 0, seed=3)
    rounds(straight, 7, seed=1)
    expected = snapshot(straight)

    vm = on_arena(prog, 0, seed=3)
    rounds(vm, 3, seed=1)
    for k, offset in enumerate((4096, 64, 12_288)):  # out and in, three times
        nbytes = vm.write_state(tmp_path / "trial.state", extra={"moved": k})
        assert nbytes > prog.state_bytes + prog.zone_bytes["optimizer"]
        vm = on_arena(prog, offset, seed=99)  # another seed: the file's generator wins
        assert vm.read_state(tmp_path / "trial.state") == {"moved": k}
        rounds(vm, 1 if k < 2 else 2, seed=1)
    assert vm.round == 7
    assert_same(snapshot(vm), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial.state"]  # nothing else


def test_unconsumed_gradients_stream_too(tmp_path) -> None:
    prog = program(Adam(lr=0.01))

    def accumulate(vm, out: bool) -> dict[str, np.ndarray]:
        for s in (0, 32):
            vm.set("x", X[s:s + 32])
            vm.set("y", Y[s:s + 32])
            vm.forward("train")
            vm.apply_loss("train", 0.5)
            vm.backward("train")
        if out:
            vm.write_state(tmp_path / "t.state")
            vm = on_arena(prog, 640)
            vm.read_state(tmp_path / "t.state")
        vm.optimize()
        return snapshot(vm)

    assert_same(accumulate(on_arena(prog, 0, seed=2), False),
                accumulate(on_arena(prog, 0, seed=2), True))


def test_streaming_a_state_copies_no_model_to_the_host(tmp_path) -> None:
    """The heap goes to the file and back with no host copy: what a budget counting
    host memory could not hold beside the model."""
    import tracemalloc

    prog = compile_graph(paper_mlp((256, 1024, 1024, 10)), batch_size=32, optimizer=Adam())
    vm = on_arena(prog, 0, seed=1)
    state = prog.state_bytes + prog.zone_bytes["optimizer"]
    assert state > 10_000_000
    tracemalloc.start()
    try:
        vm.write_state(tmp_path / "big.state")
        on_arena(prog, 0).read_state(tmp_path / "big.state")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < state // 20, f"{peak:,} bytes traced for a state of {state:,}"


class DeviceBytes:
    """Bytes a host cannot view in place, as a GPU's: only copies reach them."""

    def __init__(self, data: np.ndarray) -> None:
        self.data_ = data

    @property
    def nbytes(self) -> int:
        return int(self.data_.nbytes)

    def __getitem__(self, s: slice) -> DeviceBytes:
        return DeviceBytes(self.data_[s])


class CopyingBackend:
    """The backend calls a stream makes for device bytes, counted."""

    def __init__(self) -> None:
        self.copies, self.host = 0, 0

    def host_alloc(self, nbytes: int) -> np.ndarray:
        self.host = max(self.host, nbytes)
        return np.empty(nbytes, np.uint8)

    def copy_out(self, dst: np.ndarray, src: DeviceBytes) -> None:
        self.copies += 1
        np.copyto(dst, src.data_)

    def copy_in(self, dst: DeviceBytes, src: np.ndarray) -> None:
        self.copies += 1
        np.copyto(dst.data_, src)

    def synchronize(self) -> None:
        pass


def test_a_devices_bytes_stream_through_a_bounded_host_buffer(tmp_path, monkeypatch) -> None:
    import engine.runtime.state as state_module

    monkeypatch.setattr(state_module, "STREAM_CHUNK", 1000)
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (2_500, 1_000, 7)]
    be = CopyingBackend()
    state_module.write_stream(tmp_path / "d.state", {"format": state_module.STREAM_FORMAT},
                              [DeviceBytes(p) for p in parts], be)
    assert be.host == 1000 and be.copies == 3 + 1 + 1  # chunks of at most 1000 bytes
    back = [np.zeros_like(p) for p in parts]
    with open(tmp_path / "d.state", "rb") as f:
        assert state_module.stream_header(f, "d")["parts"] == [2_500, 1_000, 7]
        state_module.read_stream(f, "d", [DeviceBytes(b) for b in back], be)
    for a, b in zip(parts, back, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_stream_is_refused_by_another_program_and_when_cut_or_junk(tmp_path) -> None:
    prog = program(SGD(lr=0.1))
    on_arena(prog, 0).write_state(tmp_path / "a.state")
    with pytest.raises(EngineError, match="a state of program"):
        on_arena(program(SGD(lr=0.1), hidden=24), 0).read_state(tmp_path / "a.state")
    data = (tmp_path / "a.state").read_bytes()
    (tmp_path / "cut.state").write_bytes(data[:-10])
    with pytest.raises(EngineError, match="cut short"):
        on_arena(prog, 0).read_state(tmp_path / "cut.state")
    (tmp_path / "junk.state").write_bytes(b"not a state")
    with pytest.raises(EngineError, match="not a state stream"):
        on_arena(prog, 0).read_state(tmp_path / "junk.state")


def test_a_stream_that_cannot_be_written_leaves_nothing(tmp_path, monkeypatch) -> None:
    import engine.runtime.state as state_module

    def boom(f, view):
        raise OSError("disk full")

    monkeypatch.setattr(state_module, "_write_all", boom)
    with pytest.raises(OSError, match="disk full"):
        on_arena(program(SGD(lr=0.1)), 0).write_state(tmp_path / "a.state")
    assert list(tmp_path.iterdir()) == []


def test_the_pool_bound_is_a_clear_error() -> None:
    prog = program(Adam())
    one = pool_state(prog).nbytes
    pool = ModelPool(Arena.for_programs([prog]), max_host_bytes=2 * one + one // 2)
    pool.add(prog), pool.add(prog)
    with pytest.raises(PoolFullError, match=r"2 models hold .* bound: remove"):
        pool.add(prog)
    pool.remove(next(iter(pool.models.values())))
    pool.add(prog)  # room again


def pool_state(prog: Program) -> ModelState:
    from engine.runtime.state import empty_state

    return empty_state(prog)


def test_a_program_too_big_for_the_arena_is_refused() -> None:
    small, big = program(SGD(lr=0.1)), program(SGD(lr=0.1), hidden=256)
    pool = ModelPool(Arena.for_programs([small]))
    with pytest.raises(EngineError, match="arena holds"):
        pool.add(big)


def test_trials_differing_in_learning_rate_and_init_share_one_vm() -> None:
    from engine import Init

    a = program(Adam(lr=0.01))
    b = compile_graph(paper_mlp((12, 16, 3), dropout=0.3, init=Init.he_uniform()),
                      batch_size=32, optimizer=Adam(lr=0.05))
    c = program(SGD(lr=0.1))  # another optimizer: other code
    assert a.code_key == b.code_key != c.code_key
    pool = ModelPool(Arena.for_programs([a, b, c]))
    ma, mb, mc = pool.add(a), pool.add(b), pool.add(c)
    va, vb, vc = pool.activate(ma), pool.activate(mb), pool.activate(mc)
    assert va is vb is not vc and vb.program is b

    # and the retargeted VM trains b exactly as b's own VM would
    alone = ModelPool(Arena.for_programs([b]))
    m = alone.add(b)
    rounds(alone.activate(m), 2, seed=4)
    rounds(pool.activate(mb), 2, seed=4)
    assert_same(snapshot(pool.activate(mb)), snapshot(alone.activate(m)))


def test_a_state_runs_only_on_its_program() -> None:
    a, b = program(SGD(lr=0.1)), program(SGD(lr=0.1), hidden=20)
    vm = Arena.for_programs([a, b]).vm(a)
    with pytest.raises(EngineError, match="differ"):
        vm.load_state(pool_state(b))


def test_switching_allocates_nothing_and_memory_stays_constant() -> None:
    progs = [program(Adam(lr=0.01)), program(SGD(lr=0.1, momentum=0.9), hidden=24)]
    arena = Arena.for_programs(progs)
    pool = ModelPool(arena)
    models = [pool.add(progs[i % 2], seed=i) for i in range(6)]
    for m in models:  # every model trained once: bindings for both batch sizes exist
        rounds(pool.activate(m), 1, seed=m.id)

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def switch(n: int) -> None:
        for i in range(n):
            vm = pool.activate(models[i % len(models)])
            vm.set("x", X[:32])
            vm.set("y", Y[:32])
            vm.train_step("train")

    switch(10)
    before = rss()
    switch(1000)
    assert abs(rss() - before) <= 1 << 20
    assert arena.nbytes == max(p.total_bytes for p in progs)


def test_an_arena_maps_programs_with_views_only() -> None:
    small, big = program(SGD(lr=0.1)), program(Adam(), hidden=40)
    arena = Arena.for_programs([small, big])
    base = arena.buffer.__array_interface__["data"][0]
    for prog in (small, big, small):
        vm = arena.vm(prog)
        assert vm.heap.allocated_bytes == 0  # nothing of its own
        starts = [z.__array_interface__["data"][0] - base for z in vm.heap.zones.values()
                  if z.nbytes]
        assert starts[0] == 0 and starts == sorted(starts)
        assert all(z.base is not None for z in vm.heap.zones.values())
    with pytest.raises(EngineError, match="arena holds"):
        Arena(1024).heap(big)


# -- a stack's member streamed alone, as its own program ----------------------------------

MEMBER_INITS = [Init.xavier_uniform(), Init.he_uniform(), Init.uniform(-0.3, 0.3)]
MEMBER_LRS = [1e-3, 3e-3, 1e-2]
MEMBER_OPTS = {
    "sgd": lambda lr: SGD(lr=lr),
    "sgd-momentum": lambda lr: SGD(lr=lr, momentum=0.9, weight_decay=1e-3),
    # a momentum per member (PerModelLR.momenta: one more slot the program keeps)
    "sgd-momenta": lambda lr: SGD(lr=lr, momentum=0.5 + 0.4 * MEMBER_LRS.index(lr) / 3,
                                  nesterov=True),
    "adam": lambda lr: Adam(lr=lr),
    # a slot that does not start from zero: the gaps between parameters hold 0.1 too
    "adagrad": lambda lr: Adagrad(lr=lr, initial_accumulator_value=0.1),
}
ON_GPU = [pytest.mark.gpu,
          pytest.mark.skipif(not gpu_available(), reason="needs cupy and a CUDA device")]
MEMBER_CASES = [*((kind, k, "cpu") for kind in MEMBER_OPTS for k in (1, 2, 0)),
                *(pytest.param(kind, 1, "gpu", marks=ON_GPU) for kind in ("sgd", "adam"))]


def members_of(kind: str, device: str = "cpu", sizes: tuple[int, ...] = (12, 16, 9, 3),
               n: int = 3) -> tuple[Program, list[Program]]:
    """A stack of ``n`` models (with dropout: the generator moves too) and each one's own
    program, compiled apart as the scheduler's ``part_program`` does."""
    from engine.compile.stack import stack_graphs, stack_optimizers

    graphs = [paper_mlp(sizes, dropout=0.3, init=MEMBER_INITS[m]) for m in range(n)]
    opts = [MEMBER_OPTS[kind](MEMBER_LRS[m]) for m in range(n)]
    stack = compile_graph(stack_graphs(graphs), batch_size=32,
                          optimizer=stack_optimizers(opts), device=device)
    return stack, [compile_graph(g, batch_size=32, optimizer=o, device=device)
                   for g, o in zip(graphs, opts, strict=True)]


@pytest.mark.parametrize(("kind", "k", "device"), MEMBER_CASES)
def test_a_stacks_member_streams_as_its_own_program_would(tmp_path, kind: str, k: int,
                                                          device: str) -> None:
    """Model ``k`` written straight from the stack's heap is, byte for byte, the file its
    own program's VM writes once the member is moved into it (a regroup): so the same
    VM.read_state resumes it, and it trains on exactly as the regrouped one.  The
    stack is left as it was (its workspace staged the strided first layer)."""
    prog, own = members_of(kind, device)
    stack, twin = on_device(prog, device, seed=5), on_device(prog, device, seed=5)
    for vm in (stack, twin):
        rounds(vm, 2, seed=1)
    extra = {"rounds": 5, "save_to": None}
    nbytes = stack.write_member_state(k, own[k], tmp_path / "member.state", extra=extra)
    moved = regrouped(stack, k, own[k], device)
    assert moved.write_state(tmp_path / "regrouped.state", extra=extra) == nbytes
    assert (tmp_path / "member.state").read_bytes() == \
        (tmp_path / "regrouped.state").read_bytes()

    back = on_device(own[k], device, seed=99, offset=4096, initialize=False)
    assert back.read_state(tmp_path / "member.state") == extra
    assert (back.round, back._t[0]) == (moved.round, moved._t[0]) == (2, stack._t[0])
    for vm in (back, moved, stack, twin):
        rounds(vm, 2, seed=3)
    assert_same(snapshot(back), snapshot(moved))
    assert_same(snapshot(stack), snapshot(twin))


def on_device(prog: Program, device: str, seed: int, offset: int = 0,
              initialize: bool = True):
    """A VM of ``prog`` at ``offset`` of an arena of its own, on ``device``."""
    from engine.runtime.heap import CalcHeap
    from engine.runtime.vm import VM

    arena = Arena(offset + prog.total_bytes, device)
    region = arena.buffer[offset:offset + prog.total_bytes]
    return VM(prog, seed=seed, heap=CalcHeap(arena.backend, prog.zone_bytes, buffer=region),
              initialize=initialize)


def regrouped(stack, k: int, own: Program, device: str):
    """Model ``k`` moved into a fresh VM of its own program: what a regroup makes."""
    from engine.runtime.members import move_member

    vm = on_device(own, device, seed=42, offset=128)
    move_member(stack, k, vm, None)
    return vm


def test_a_member_streams_with_no_host_copy_of_it(tmp_path) -> None:
    """A member of a stack whose first layer is strided (``[in, K, out]``) goes to its
    file with no host copy: staged in the stack's workspace, a parameter at a time."""
    import tracemalloc

    from engine.compile.stack import stack_graphs, stack_optimizers

    graphs = [paper_mlp((256, 1024, 1024, 10), init=MEMBER_INITS[m]) for m in range(2)]
    opts = [Adam(lr=MEMBER_LRS[m]) for m in range(2)]
    stack = on_device(compile_graph(stack_graphs(graphs), batch_size=32,
                                    optimizer=stack_optimizers(opts)), "cpu", seed=1)
    own = compile_graph(graphs[1], batch_size=32, optimizer=opts[1])
    state = own.state_bytes + own.zone_bytes["optimizer"]
    assert state > 10_000_000
    tracemalloc.start()
    try:
        stack.write_member_state(1, own, tmp_path / "big.state")
        on_arena(own, 0).read_state(tmp_path / "big.state")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < state // 20, f"{peak:,} bytes traced for a state of {state:,}"


def test_a_member_is_refused_for_another_program_and_mid_batch(tmp_path) -> None:
    prog, own = members_of("adam")
    stack = on_device(prog, "cpu", seed=5)
    other_width = members_of("adam", sizes=(12, 20, 9, 3))[1][1]
    other_kind = members_of("sgd-momentum")[1][1]
    cases = [
        (own[1], 3, "model 3 is not one of them"),
        (prog, 1, "stacks 3 models: model None"),  # a stack is not a member's own program
        (other_width, 1, r"parameter 'w0' .* float32\[12, 20\]; model 1 .* float32\[12, 16\]"),
        (other_kind, 1, "not one optimizer kind"),
        (compile_graph(paper_mlp((12, 16, 3)), batch_size=32, optimizer=Adam()), 1,
         "parameter 'w1' .* model 1"),
    ]
    for target, k, match in cases:
        with pytest.raises(EngineError, match=match):
            stack.write_member_state(k, target, tmp_path / "m.state")
    stack.set("x", X[:32])
    stack.set("y", Y[:32])
    stack.forward("train")
    stack.apply_loss("train")
    stack.backward("train")
    with pytest.raises(EngineError, match="has not consumed"):
        stack.write_member_state(1, own[1], tmp_path / "m.state")
    assert list(tmp_path.iterdir()) == []
    stack.optimize()
    stack.write_member_state(1, own[1], tmp_path / "m.state")
    assert [p.name for p in tmp_path.iterdir()] == ["m.state"]
