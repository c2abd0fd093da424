"""The machine's GEMM peak: measured within its time budget, cached per machine in
``peak.json`` beside the constants, ``$EXPLORE_GEMM_PEAK`` first, a damaged cache
ignored."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.runtime.backends import gpu_available
from engine.runtime.peak import measure_gemm_peak
from explore.scheduler import constants, peak


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(peak.ENV, raising=False)
    return tmp_path / "peak.json"


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """Calls of the measurement, which returns 1.5e11 FLOP/s without measuring."""
    calls: list[tuple[str, int | None]] = []

    def fake(device: str = "cpu", threads: int | None = None, seconds: float = 0.5,
             max_bytes: int | None = None) -> float:
        calls.append((device, threads))
        return 1.5e11

    monkeypatch.setattr(peak, "measure_gemm_peak", fake)
    return calls


def test_measured_within_its_budget() -> None:
    t0 = time.perf_counter()
    rate = measure_gemm_peak("cpu", threads=1)
    took = time.perf_counter() - t0
    assert isinstance(rate, float) and rate > 1e9, rate  # any machine does a GFLOP/s
    assert took < 1.5, f"half a second asked, {took:.2f} s taken"


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a CUDA device")
def test_measured_on_the_gpu(cache: Path) -> None:
    from engine.runtime.backends.cupy_backend import import_cupy

    cp = import_cupy()
    pool = cp.get_default_memory_pool()
    before = pool.total_bytes()
    rate = measure_gemm_peak("gpu", seconds=0.5)
    assert rate > 1e11, rate  # any CUDA device does 100 GFLOP/s in float32
    assert pool.total_bytes() <= before  # the operands are not kept in the pool
    key = peak.peak_key("gpu", None)
    assert f"cupy {cp.__version__}" in key
    assert key.startswith(constants.machine_key("gpu"))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        measure_gemm_peak("tpu")
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        measure_gemm_peak("cpu", threads=0)
    with pytest.raises(ValueError, match="seconds must be positive"):
        measure_gemm_peak("cpu", seconds=0)


def test_measured_once_then_cached(cache: Path, measured: list) -> None:
    assert peak.gemm_peak("cpu", 1) == 1.5e11
    assert measured == [("cpu", 1)]
    table = json.loads(cache.read_text())
    key = peak.peak_key("cpu", 1)
    assert table == {key: 1.5e11}
    assert key.startswith(constants.machine_key("cpu", jit="0")) and "threads 1" in key
    assert cache.parent == constants.cache_file().parent  # beside constants.json
    assert peak.gemm_peak("cpu", 1) == 1.5e11
    assert measured == [("cpu", 1)]  # the second call read the cache
    assert peak.gemm_peak("cpu", None) == 1.5e11  # another thread count: measured apart
    assert measured == [("cpu", 1), ("cpu", None)]
    assert len(json.loads(cache.read_text())) == 2


def test_measured_afresh_the_best_is_kept(cache: Path, measured: list,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rates = iter([1.5e11, 0.9e11, 2.0e11])  # the second while the machine was busy
    monkeypatch.setattr(peak, "measure_gemm_peak", lambda device, threads: next(rates))
    assert peak.gemm_peak("cpu", 1) == 1.5e11
    assert peak.gemm_peak("cpu", 1, fresh=True) == 1.5e11  # a slower reading: not kept
    assert peak.gemm_peak("cpu", 1, fresh=True) == 2.0e11  # a faster one replaces it
    assert peak.gemm_peak("cpu", 1, measure=False) == 2.0e11  # what runs read


def test_the_environment_overrides(cache: Path, measured: list,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(peak.ENV, "2.5e11")
    assert peak.gemm_peak("cpu", 1) == 2.5e11
    assert measured == [] and not cache.exists()
    for bad in ("fast", "-1", "0", "inf", "nan"):
        monkeypatch.setenv(peak.ENV, bad)
        with pytest.raises(peak.PeakError, match=f"EXPLORE_GEMM_PEAK.*{bad!r}"):
            peak.gemm_peak("cpu", 1)


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"KEY": "fast"}', '{"KEY": -3}',
                                    '{"KEY": null}'])
def test_a_damaged_cache_is_ignored(cache: Path, measured: list, damage: str) -> None:
    cache.write_text(damage.replace("KEY", peak.peak_key("cpu", 1)))
    assert peak.gemm_peak("cpu", 1) == 1.5e11
    assert measured == [("cpu", 1)]  # measured again
    assert json.loads(cache.read_text())[peak.peak_key("cpu", 1)] == 1.5e11  # and repaired


def test_saving_keeps_the_best_and_other_entries(cache: Path) -> None:
    cache.write_text(json.dumps({"another machine": 9e10}))
    peak.save("here", 1e11)
    peak.save("here", 8e10)  # a slower measurement: something else was running
    assert json.loads(cache.read_text()) == {"another machine": 9e10, "here": 1e11}
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(".peak-")]


def test_the_measurement_keeps_within_the_bytes_it_is_given() -> None:
    from engine.runtime.peak import measure_gemm_peak, operand_bytes

    assert measure_gemm_peak("cpu", threads=1, seconds=0.05,
                             max_bytes=operand_bytes(512)) > 0
    with pytest.raises(ValueError, match="no GEMM size fits"):
        measure_gemm_peak("cpu", max_bytes=operand_bytes(512) - 1)


def test_the_peak_is_one_figure_whichever_kernels_are_fused(
        cache: Path, measured: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with the fused kernels on (a compiled worker, a benchmark's child)
    reads the peak measured with them off: the BLAS is the same."""
    monkeypatch.setenv("CALCGRAPH_JIT", "0")
    assert peak.gemm_peak("cpu", 1) == 1.5e11
    monkeypatch.setenv("CALCGRAPH_JIT", "1")
    assert peak.gemm_peak("cpu", 1, measure=False) == 1.5e11
    assert measured == [("cpu", 1)]
