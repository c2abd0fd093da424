"""A GPU worker's overhead is its own device memory as the driver lists it, not the
device's memory in use (which counts the workers started beside it), with the
device-wide figure where the driver does not list the process.  Checked on the CPU
with stand-ins for cupy and NVML; on a GPU, tests/engine/runtime/test_gpu.py runs the
real ones."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explore.procmem import gpu_bytes
from explore.scheduler.worker import device_overhead

GIB = 1 << 30


class _NVMLError(Exception):
    pass


def fake_modules(monkeypatch: pytest.MonkeyPatch, listed: list[tuple[int, int | None]],
                 fail: bool = False, used: int = 3 * GIB, total: int = 80 * GIB) -> dict:
    """cupy and pynvml stand-ins: NVML lists ``listed`` (pid, bytes) on the device whose
    bus id cupy reports; memGetInfo says ``used`` of ``total`` are taken."""
    calls: dict[str, Any] = {"bus": None, "shutdown": 0}
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Device=lambda: types.SimpleNamespace(pci_bus_id="0000:3B:00.0"),
        runtime=types.SimpleNamespace(memGetInfo=lambda: (total - used, total)))
    nvml = types.ModuleType("pynvml")

    def handle(bus: str) -> str:
        if fail:
            raise _NVMLError("NVML_ERROR_NOT_SUPPORTED")
        calls["bus"] = bus
        return "handle"

    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.__setitem__(  # type: ignore[attr-defined]
        "shutdown", calls["shutdown"] + 1)
    nvml.nvmlDeviceGetHandleByPciBusId = handle  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in listed]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return calls


def test_the_overhead_is_this_process_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    me = os.getpid()
    calls = fake_modules(monkeypatch, [(me - 1, 2 * GIB), (me, 512 << 20), (me + 1, GIB)])
    assert gpu_bytes() == 512 << 20
    assert device_overhead("gpu") == 512 << 20  # not the 3 GiB the device has in use
    assert calls["bus"] == "0000:3B:00.0" and calls["shutdown"] == 2


@pytest.mark.parametrize("case", ["not listed", "no figure", "nvml fails"])
def test_the_device_wide_figure_where_the_driver_cannot_say(
        monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    me = os.getpid()
    listed = {"not listed": [(me + 7, GIB)],  # a container: the host's process ids
              "no figure": [(me, None)], "nvml fails": [(me, GIB)]}[case]
    calls = fake_modules(monkeypatch, listed, fail=case == "nvml fails")
    assert gpu_bytes() is None
    assert device_overhead("gpu") == 3 * GIB
    assert calls["shutdown"] == 2  # NVML is shut down on every path


def test_without_nvml_the_device_wide_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_modules(monkeypatch, [(os.getpid(), GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert gpu_bytes() is None
    assert device_overhead("gpu") == 3 * GIB


def fake_nvml_devices(monkeypatch: pytest.MonkeyPatch,
                      devices: list[list[tuple[int, int | None]]]) -> None:
    """pynvml alone (no cupy: the scheduler makes no CUDA context), listing
    ``devices[i]`` (pid, bytes) on GPU i."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda i: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in devices[i]]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_gpu_processes_sums_each_process_over_the_devices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from explore.procmem import gpu_processes

    fake_nvml_devices(monkeypatch, [[(10, GIB), (11, 2 * GIB)], [(10, 512 << 20), (12, None)]])
    assert gpu_processes() == {10: GIB + (512 << 20), 11: 2 * GIB}
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu_processes() is None


def test_a_gpu_run_s_peak_and_growth_are_its_processes_device_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the sampler counts the device memory the driver lists for the run's
    processes (not the host's PSS, and not another process on the device), and a
    worker's growth is what it holds beyond its arena and its constant."""
    from explore.scheduler import telemetry
    from explore.scheduler.placement import Worker
    from explore.scheduler.telemetry import MemorySampler, RunStats

    a = Worker(index=0, process=None, conn=None)  # type: ignore[arg-type]
    b = Worker(index=1, process=None, conn=None)  # type: ignore[arg-type]
    a.pid, a.overhead, a.arena = 101, 500 << 20, GIB
    b.pid, b.overhead, b.arena = 102, 500 << 20, GIB
    monkeypatch.setattr(telemetry, "children", lambda: [101, 102, 103])  # 103: the tracker
    listed = {101: (500 << 20) + GIB, 102: (500 << 20) + GIB + (6 << 20), 999: 40 * GIB}
    monkeypatch.setattr(telemetry, "gpu_processes", lambda: dict(listed))
    stats = RunStats(budget=4 * GIB, overheads=[a.overhead, b.overhead])
    sampler = MemorySampler(stats, this_process=False, device="gpu")
    sampler.measure([a, b], now=True)
    assert stats.measured_peak == 2 * ((500 << 20) + GIB) + (6 << 20)  # not pid 999's
    assert stats.growth == 6 << 20
    listed[101] -= 4 << 20  # one under its constant does not cancel another's growth
    sampler.measure([a, b], now=True)
    assert stats.growth == 6 << 20
    listed[101] += 4 << 20
    listed[102] -= 6 << 20  # a peak and a growth are the highest seen
    sampler.measure([a, b], now=True)
    assert stats.measured_peak == 2 * ((500 << 20) + GIB) + (6 << 20)
    assert stats.growth == 6 << 20
    monkeypatch.setattr(telemetry, "gpu_processes", lambda: None)  # the driver cannot say
    sampler.measure([a, b], now=True)
    assert stats.measured_peak == 2 * ((500 << 20) + GIB) + (6 << 20)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_refused_budget_names_what_the_device_holds(device: str) -> None:
    """On a GPU the budget is device memory: the refusal names the worker's context and
    the smallest candidate, not the host's scheduler, data and tracker (0 there)."""
    from explore.scheduler.constants import Measured
    from explore.scheduler.loop import Scheduler
    from explore.scheduler.telemetry import RunStats

    host = {"main": 100_000_000, "data": 5_000_000} if device == "cpu" else {}
    me = types.SimpleNamespace(stats=RunStats(budget=64_000_000, **host), devices=[0],
                               device=device, per_device=64_000_000)
    me._host_share = lambda tracker: Scheduler._host_share(me, tracker)  # type: ignore
    text = Scheduler._too_small(me, 525_696, Measured(worker=614_465_536,  # type: ignore
                                                      tracker=10_000_000 if host else 0))
    assert "614,465,536" in text and "is the least that would do" in text
    if device == "gpu":
        assert "of device memory for a worker (its CUDA context and libraries)" in text
        assert "2,097,152 for the smallest candidate of the space (525,696 bytes, in " \
            "whole 2 MiB pages)" in text
        assert "scheduler" not in text and "resource tracker" not in text
        least = int(text.split("--memory ")[1].split("MB")[0]) * 1_000_000
        assert least >= 614_465_536 + 2_097_152
    else:
        assert "100,000,000 bytes for the scheduler, 5,000,000 for the data" in text
        assert "525,696 for the smallest candidate" in text


@settings(max_examples=500, deadline=None)
@given(budget=st.integers(600_000_000, 20_000_000_000),
       worker=st.integers(100_000_000, 800_000_000),
       smallest=st.integers(1, 300_000_000), asked=st.integers(1, 16))
def test_a_gpu_budget_that_admits_workers_gives_each_an_arena_its_smallest_fits(
        budget: int, worker: int, smallest: int, asked: int) -> None:
    """Admission counts the smallest candidate in whole pages, as the arenas are cut: a
    budget that admits n workers never leaves them arenas too small for it (it refused
    runs one worker would fit: 1,256 MB with two workers asked on an H100)."""
    from explore.scheduler.admission import admitted_heap, arena_size, headroom
    from explore.scheduler.constants import workers_that_fit

    left = budget - headroom(budget)
    n = min(asked, workers_that_fit(left, 0, worker, admitted_heap(smallest, "gpu")))
    if n >= 1:
        arena = arena_size((left - n * worker) // n, "gpu")
        assert arena >= smallest and arena % (2 << 20) == 0
    else:
        assert left < worker + smallest or left < worker + admitted_heap(smallest, "gpu")
