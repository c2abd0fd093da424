"""The machine's GEMM peak (FLOP/s), measured once and remembered per machine.

A run's utilisation is its model FLOPs per second over this peak
(:func:`engine.runtime.peak.measure_gemm_peak`: float32 square GEMMs, on a GPU the
device's).  Measuring takes about half a second, so the figure is kept in
``peak.json`` beside the measured constants (:mod:`explore.scheduler.constants`), keyed
by the machine (:func:`~explore.scheduler.constants.machine_key`), the BLAS thread count
and numpy's BLAS, and on a GPU CuPy's version and the device's name.  A damaged file is
ignored (the peak is measured again); ``$EXPLORE_GEMM_PEAK`` (FLOP/s) overrides both,
for a user who knows the machine's peak and for tests.

>>> import os
>>> os.environ["EXPLORE_GEMM_PEAK"] = "2.5e11"
>>> gemm_peak("cpu", 1)
250000000000.0
>>> del os.environ["EXPLORE_GEMM_PEAK"]
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy

from engine.runtime.backends.cupy_backend import import_cupy
from engine.runtime.peak import measure_gemm_peak
from explore.scheduler.constants import cache_file as constants_file
from explore.scheduler.constants import machine_key, write_entry

ENV = "EXPLORE_GEMM_PEAK"


class PeakError(ValueError):
    """``$EXPLORE_GEMM_PEAK`` is not a positive number of FLOP/s."""


def gemm_peak(device: str = "cpu", threads: int | None = None,
              measure: bool = True, fresh: bool = False) -> float | None:
    """``device``'s GEMM peak in FLOP/s with ``threads`` BLAS threads (None: the BLAS's
    own setting): ``$EXPLORE_GEMM_PEAK`` if set, else the figure cached for this
    machine, else (with ``measure``) measured now and cached; else None.  ``fresh``:
    measured now even where a figure is cached, and the higher of the two kept and
    returned.  On a shared machine a measurement taken while others compute
    understates the peak (and so overstates every utilisation read against it), and
    the cache would keep that figure for good: a benchmark measures afresh."""
    override = os.environ.get(ENV)
    if override is not None:
        return _parse_override(override)
    key = peak_key(device, threads)
    known = load(key)
    if not fresh and (known is not None or not measure):
        return known
    measured = measure_gemm_peak(device, threads)
    best = max(measured, known or 0.0)
    save(key, best)
    return best


def peak_key(device: str, threads: int | None) -> str:
    """What the peak depends on: the machine and libraries (as the constants), the BLAS
    threads and numpy's BLAS; on a GPU, CuPy's version and the device's name.  Not the
    fused kernels' setting (``CALCGRAPH_JIT``, part of the constants' key for numba's
    memory): the peak is the BLAS's, one figure whichever kernels a process binds."""
    parts = [machine_key(device, jit="0"),
             f"threads {threads if threads is not None else 'default'}",
             f"blas {_numpy_blas()}"]
    if device == "gpu":
        parts.append(_gpu_name())
    return "|".join(parts)


def cache_file() -> Path:
    """``peak.json``, in the folder of the constants' cache."""
    return constants_file().with_name("peak.json")


def load(key: str) -> float | None:
    """The peak measured here before, if any (a damaged file or entry is ignored)."""
    try:
        value = float(json.loads(cache_file().read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def save(key: str, flops: float) -> None:
    """Remember ``flops`` for ``key``: the larger of it and what is there (a measurement
    is only ever slowed by what else runs).  Written atomically; a cache that cannot be
    written is skipped (the next run measures again)."""
    write_entry(cache_file(), key, max(float(flops), load(key) or 0.0))


def _parse_override(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise PeakError(f"${ENV} must be a positive number of FLOP/s (such as 2.5e11), "
                        f"got {text!r}")
    return value


def _numpy_blas() -> str:
    """numpy's BLAS, name and version, from its build configuration."""
    try:
        blas: Any = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except (TypeError, KeyError, AttributeError):  # an older numpy without mode="dicts"
        return "unknown"


def _gpu_name() -> str:
    cp = import_cupy()
    device = cp.cuda.Device().id
    name = cp.cuda.runtime.getDeviceProperties(device)["name"]
    if isinstance(name, bytes):
        name = name.decode()
    return f"cupy {cp.__version__} {name}"
