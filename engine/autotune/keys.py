"""What a decision is keyed by: the problem (op, input and output shapes and dtypes, the
attributes that matter: all but ``algorithm``), the candidates, the device and the
library versions.  A change of any of them is another key, so a decision made under
another numpy, cupy or engine version is never reused.

>>> from engine.graph import DType, TensorDesc
>>> p = problem("Gemm", [TensorDesc(DType.FLOAT32, (64, 784))] * 2, [], {"algorithm": "x"})
>>> p["op"], p["attrs"]
('Gemm', {})
"""

from __future__ import annotations

import functools
import json
import os
import platform
from typing import Any

from engine.graph import TensorDesc
from engine.ops._base import VARIANT_ATTR

ENGINE_VERSION = "1"
"""The version of the engine's kernels that decisions depend on: bump it when a kernel
variant's code changes, and every persisted decision expires."""


def versions(device: str) -> dict[str, str]:
    """numpy's, cupy's (on the GPU) and the engine's kernels' versions."""
    import numpy

    out = {"numpy": numpy.__version__, "engine": ENGINE_VERSION,
           "python": platform.python_version()}
    if device == "gpu":
        import cupy

        out["cupy"] = cupy.__version__
    return out


@functools.cache
def device_name(device: str) -> str:
    """The processor the timings were taken on: the CPU model, its cores and the
    threads BLAS and the parallel compiled kernels run on (which variant wins hangs on
    them: a one-thread BLAS loses its GEMMs to the sparse form on two threads), or the
    GPU's name."""
    if device == "gpu":
        import cupy

        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        return f"gpu {name.decode() if isinstance(name, bytes) else name}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from engine.ops import jit

    return (f"cpu {model} x{os.cpu_count()} threads blas {jit.blas_threads()} "
            f"compiled {jit.parallel_threads()}")


def problem(op: str, ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
            ) -> dict[str, Any]:
    """One instruction's problem, as plain data (BestOf's problem size)."""
    return {"op": op, "in": [[d.dtype.value, list(d.shape)] for d in ins],
            "out": [[d.dtype.value, list(d.shape)] for d in outs],
            "attrs": {k: v for k, v in sorted(attrs.items()) if k != VARIANT_ATTR}}


def problem_text(p: dict[str, Any]) -> str:
    return json.dumps(p, sort_keys=True, default=str)


def decision_key(kind: str, problems: list[str], candidates: tuple[str, ...], device: str
                 ) -> str:
    """The key a decision is persisted under: its kind (an op, or a group), its members'
    problems (sorted), its candidates, the device and the versions."""
    return json.dumps({"kind": kind, "problems": sorted(set(problems)),
                       "candidates": list(candidates), "device": device_name(device),
                       "versions": versions(device)}, sort_keys=True)
