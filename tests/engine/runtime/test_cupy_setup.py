"""What the cupy backend sets up in a process, checked on the CPU with a stand-in for
cupy (tests/engine/runtime/test_gpu.py runs the real one where a GPU is lent)."""

from __future__ import annotations

import sys
import types

import pytest

from engine.runtime.backends.cupy_backend import import_cupy, no_accelerators


def fake_cupy(setters: tuple[str, ...]) -> tuple[types.ModuleType, dict[str, list]]:
    calls: dict[str, list] = {}
    core = types.SimpleNamespace(**{name: (lambda n: lambda acc: calls.__setitem__(n, acc))(name)
                                    for name in setters})
    cupy = types.ModuleType("cupy")
    cupy._core = core  # type: ignore[attr-defined]
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return cupy, calls


def test_every_accelerator_is_turned_off() -> None:
    """CUB's reductions take temporary storage from the pool at every call: a step on
    the GPU would allocate.  Each of CuPy's accelerator lists is emptied."""
    names = ("set_reduction_accelerators", "set_routine_accelerators",
             "set_elementwise_accelerators")
    cupy, calls = fake_cupy(names)
    no_accelerators(cupy)
    assert calls == {key: [] for key in names}


def test_an_older_cupy_without_some_lists_is_fine() -> None:
    cupy, calls = fake_cupy(("set_reduction_accelerators",))
    no_accelerators(cupy)
    assert calls == {"set_reduction_accelerators": []}
    no_accelerators(types.ModuleType("cupy"))  # no _core at all: nothing to turn off


def test_importing_cupy_through_the_backend_turns_them_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cupy, calls = fake_cupy(("set_reduction_accelerators", "set_routine_accelerators"))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert import_cupy() is cupy
    assert calls == {"set_reduction_accelerators": [], "set_routine_accelerators": []}
