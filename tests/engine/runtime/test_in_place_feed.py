"""VM.set reads a suitable array in place (engine.runtime.vm.IN_PLACE_BYTES): the
same training as a copy, the caller's memory never written, changes before a step
seen by it, checks run once, a step allocates nothing, and the heap's bytes unchanged."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import engine.runtime.vm as vm_module
from engine import VM, Adam, InputError, compile_graph
from engine.models import paper_mlp
from engine.runtime.train import evaluate, train_epoch
from tests.allocations import step_allocations

RNG = np.random.default_rng(7)
X = RNG.random((96, 784), dtype=np.float32)
Y = RNG.integers(0, 10, 96)


def make(batch: int = 96) -> VM:
    return VM(compile_graph(paper_mlp(), batch_size=batch, optimizer=Adam(lr=0.01)), seed=1)


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every suitable array read in place, whatever its size."""
    monkeypatch.setattr(vm_module, "IN_PLACE_BYTES", 0)


def heap_x(vm: VM) -> np.ndarray:
    return vm._bind(vm.batch_size).views[vm._placeholders["x"]]


def train(vm: VM, x: np.ndarray, y: np.ndarray, steps: int = 5) -> np.ndarray:
    for _ in range(steps):
        vm.set("x", x)
        vm.set("y", y)
        vm.train_step("train")
    return vm.get("w0")


@pytest.mark.usefixtures("in_place")
def test_in_place_trains_exactly_as_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    a = make()
    w_in_place = train(a, X, Y)
    assert np.shares_memory(a.view("x"), X)  # read where it is
    assert not heap_x(a).any()  # the heap's buffer was never written
    monkeypatch.setattr(vm_module, "IN_PLACE_BYTES", 1 << 62)
    b = make()
    w_copied = train(b, X, Y)
    assert not np.shares_memory(b.view("x"), X)
    np.testing.assert_array_equal(w_in_place, w_copied)
    assert a.allocated_bytes == b.allocated_bytes == b.program.total_bytes


@pytest.mark.usefixtures("in_place")
def test_a_step_reads_the_array_as_it_is_then() -> None:
    """Like a PyTorch tensor: the step reads the caller's array when it runs, so a change
    made after set() and before the step is what the step sees."""
    x = X.copy()
    a, b = make(), make()
    a.set("x", x)
    a.set("y", Y)
    x[:10] = 0.5
    a.forward("train")
    b.set("x", x.copy())  # a copy of the changed data
    b.set("y", Y)
    b.forward("train")
    assert a.get("loss") == b.get("loss")


@pytest.mark.usefixtures("in_place")
def test_the_callers_array_is_never_written() -> None:
    x = X.copy()
    vm = make()
    train(vm, x, Y, steps=3)
    vm.forward("eval")
    np.testing.assert_array_equal(x, X)
    assert not vm.view("x").flags.writeable


@pytest.mark.usefixtures("in_place")
@pytest.mark.parametrize("bad", ["float64", "strided", "fortran", "list"])
def test_unsuitable_arrays_are_copied(bad: str) -> None:
    value = {"float64": X.astype(np.float64), "strided": np.repeat(X, 2, axis=0)[::2],
             "fortran": np.asfortranarray(X), "list": X.tolist()}[bad]
    vm = make()
    vm.set("x", value)
    assert not np.shares_memory(vm.view("x"), np.asarray(value))
    np.testing.assert_array_equal(vm.view("x"), X)


@pytest.mark.usefixtures("in_place")
def test_copy_after_in_place_and_gather_read_the_heap_again() -> None:
    vm = make()
    vm.set("x", X)
    vm.set("y", Y)
    vm.forward("train")
    vm.set("x", X.astype(np.float64))  # copied: the heap holds it now
    assert not np.shares_memory(vm.view("x"), X)
    vm.set("x", X)
    vm.gather("x", X, np.arange(96)[::-1])
    np.testing.assert_array_equal(vm.view("x"), X[::-1])


@pytest.mark.usefixtures("in_place")
def test_a_smaller_batch_in_place_and_back() -> None:
    vm, ref = make(), make()
    for v in (vm, ref):
        v.set("x", X[:40] if v is vm else X[:40].copy())
        v.set("y", Y[:40])
        v.train_step("train")
        v.set("x", X if v is vm else X.copy())
        v.set("y", Y)
        v.train_step("train")
    assert vm.batch_size == 96
    np.testing.assert_array_equal(vm.get("w0"), ref.get("w0"))


@pytest.mark.usefixtures("in_place")
def test_steps_fed_in_place_allocate_nothing() -> None:
    vm = make()

    def step() -> None:
        vm.set("x", X)
        vm.set("y", Y)
        vm.train_step("train")

    retained, peak = min(step_allocations(step) for _ in range(2))
    assert retained <= 0
    assert peak < 48 * 1024


@pytest.mark.usefixtures("in_place")
def test_a_model_switch_lets_the_callers_array_go() -> None:
    vm = make()
    x = X.copy()
    vm.set("x", x)
    vm.set("y", Y)
    vm.train_step("train")
    ref = weakref.ref(x)
    vm.load_state(vm.save_state())
    del x
    gc.collect()
    assert ref() is None


def test_checked_data_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = vm_module._check_values
    monkeypatch.setattr(vm_module, "_check_values",
                        lambda name, arr, dtype: calls.append(name) or real(name, arr, dtype))
    data = np.concatenate([X, X])
    vm = make()
    vm.check("x", data)
    calls.clear()
    vm.set("x", data[96:])  # a slice of the checked data set: not checked again
    vm.set("x", data[:96])
    assert calls == []
    vm.set("x", X)  # another array: checked
    assert calls == ["x"]
    bad = X.copy()
    bad[3, 5] = np.nan
    with pytest.raises(InputError, match=r"at index \(3, 5\)"):
        vm.set("x", bad)
    assert not vm._seen("x", data.view(np.int32))  # another dtype: not the checked data


@pytest.mark.usefixtures("in_place")
def test_unshuffled_epochs_read_the_data_in_place() -> None:
    a, b = make(32), make(32)
    train_epoch(a, X, Y, batch=32)
    for s in range(0, 96, 32):  # what train_epoch did before: the rows gathered
        b.gather("x", X, np.arange(s, s + 32))
        b.gather("y", Y, np.arange(s, s + 32))
        b.train_step("train")
    np.testing.assert_array_equal(a.get("w0"), b.get("w0"))
    assert np.shares_memory(a.view("x"), X)
    assert evaluate(a, X, Y) == evaluate(b, X, Y)
