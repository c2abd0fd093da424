"""Fused elementwise kernels: a chain of elementwise work as one compiled pass.

A numpy kernel is one call, and one pass over memory, per term: Adam's update is ten
passes over the parameter region, a sigmoid's gradient three, a softmax over ten
classes a dozen calls whose per-row reductions numpy runs slowly.  The kernels of
:mod:`engine.ops._jit_kernels` do each chain in one loop, compiled by numba (LLVM
vectorises it), writing into the same heap views, so a step still allocates nothing.

**Why numba, not numexpr.**  numexpr's interpreter runs a scalar loop per term,
4-5x slower than one numpy call, so its one pass loses to numpy's ten even for Adam,
where numba's one loop beats both (float32, medians; the figures are in
``docs/measurements.md``, "Fused kernels").  Transcendentals are the
exception: numba's scalar libm calls are 10-40x slower than numpy's SIMD ``exp``, so the
fused kernels keep those calls in numpy and fuse the arithmetic around them.  float32's
``tanh`` (and so the sigmoid) is the exception to the exception: numpy's is a scalar
loop on AVX2 machines, so it is a rational function here that LLVM vectorises, within
3.3e-7 of the exact tanh (:func:`engine.ops._jit_kernels.tanh1`).

**Off the hot path.**  numba is imported on first use, when a kernel is bound, never
by ``import engine``; compiled code is cached on disk (``cache=True``).  If numba is
missing or fails to import, or ``CALCGRAPH_JIT=0``, every kernel is the numpy one:
the same results to float32 rounding (tanh and the sigmoid within the bound above),
nothing else changes.  numba's own memory
(LLVM, about 100 MB of proportional set size once a kernel is compiled) is the
process's, outside any heap: an explore worker counts it in its measured overhead.

**Threads.**  The elementwise kernels are serial: at the sizes measured a parallel
dispatch cost more than a second core gave, and the GEMMs between them already use
every core.  The one parallel kernel, a product that skips its data's zeros (a stack's
``sparse`` first layer), runs on numba's threads only where BLAS runs on one thread
(:func:`parallel_threads`): OpenBLAS's idle threads spin for a while after each call,
and numba's pool working beside them made a stack's step over ten times slower on
two cores (``docs/measurements.md``).  ``NUMBA_NUM_THREADS`` is among the variables
the explore scheduler sets to each worker's share.

**Which one runs.**  Each op that has a fused form registers it as a ``Variant``
named ``"numba"`` beside ``"numpy"`` (an auto-tuner may time both on the real
shapes); without one, the op's kernel picks by size with :func:`use_fused`.

>>> from engine.ops import jit
>>> jit.use_fused("SigmoidGrad", 64) in (True, False)
True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from engine.graph import TensorDesc
from engine.ops._base import KernelArgs, KernelFactory, Step, Variant, WorkspaceRule, is_numpy

ENV = "CALCGRAPH_JIT"  # "0": never compile, numpy everywhere

# Elements (of the op's largest tensor, or the parameter region) from which the fused
# form is the static default, and up to which it stays so (None: no bound).  Timed
# with each op's numpy and numba variants interleaved, float32, medians
# (docs/measurements.md, "Fused kernels"): the fused form won at every size from 68
# elements up (a call through numba costs a fraction of one through numpy), by 1.1x
# (float64's Sigmoid at 170k, where numpy's tanh is the work; float32's is 5-8x with
# the rational tanh) to 30x (the cross-entropy at 4 rows), so every threshold is 0.
# They stay per kind: a machine where numpy's calls cost less, or numba's more, raises
# them.
THRESHOLDS: dict[str, tuple[int, int | None]] = {
    "elementwise": (0, None),
    "optimizer": (0, None),
    "SumTo": (0, None),
    "SoftmaxCrossEntropyLoss": (0, None),
    "SoftmaxCrossEntropyLossGrad": (0, None),
}

_kernels: Any = None  # the compiled kernels' module, False once the import failed


def enabled() -> bool:
    """Whether fused kernels may be used at all (``CALCGRAPH_JIT`` is not "0")."""
    return os.environ.get(ENV, "1") != "0"


def kernels() -> Any | None:
    """The module of fused kernels (:mod:`engine.ops._jit_kernels`), importing numba on
    first use; None where numba cannot be imported or the fused kernels are off."""
    global _kernels
    if not enabled():
        return None
    if _kernels is None:
        try:
            importlib.import_module("numba")
            _kernels = importlib.import_module("engine.ops._jit_kernels")
        except Exception:  # missing, or broken: the numpy kernels do the work
            _kernels = False
    return _kernels or None


def reset() -> None:
    """Forget the import's outcome (tests that hide numba)."""
    global _kernels, _threads
    _kernels = None
    _threads = None


_threads: int | None = None  # parallel_threads()'s answer, found once


def blas_threads() -> int:
    """The most threads any loaded BLAS library runs on (threadpoolctl's count; 0 where
    it cannot tell)."""
    try:
        from threadpoolctl import threadpool_info

        return max((int(i.get("num_threads") or 0) for i in threadpool_info()
                    if i.get("user_api") == "blas"), default=0)
    except Exception:
        return 0


def parallel_threads() -> int:
    """The threads a parallel compiled kernel may use: numba's (``NUMBA_NUM_THREADS``)
    where BLAS runs on one thread (``OPENBLAS_NUM_THREADS=1``, or threadpoolctl's
    limits), else 1, the kernel then running in the caller's thread.  Found once per
    process (threadpoolctl inspects the loaded libraries)."""
    global _threads
    if _threads is None:
        _threads = 1
        try:
            import numba

            n = int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))
            if n > 1 and blas_threads() == 1:
                _threads = n
        except Exception:  # no numba: serial, which is always safe
            _threads = 1
    return _threads


def use_fused(kind: str, elements: int) -> bool:
    """The static default: whether ``kind``'s fused kernel should run on ``elements``
    elements (its threshold in :data:`THRESHOLDS`; elementwise ops share one)."""
    lo, hi = THRESHOLDS.get(kind, THRESHOLDS["elementwise"])
    return lo <= elements and (hi is None or elements <= hi) and kernels() is not None


def flat(a: Any) -> Any | None:
    """``a`` as a 1-D view (no copy), or None when it is not C-contiguous."""
    if not a.flags.c_contiguous:
        return None
    return a.reshape(-1)


FusedFactory = Callable[[KernelArgs, Any], Step | None]
"""A fused kernel factory: ``(args, kernels module) -> step``, or None where it does not
apply to these views (not contiguous, a broadcast it does not handle)."""


def largest(k: KernelArgs) -> int:
    """The elements of an instruction's largest input or output: what it streams."""
    return max((int(a.size) for a in (*k.ins, *k.outs)), default=0)


def variants(numpy: KernelFactory, fused: FusedFactory, workspace: WorkspaceRule,
             doc: str) -> dict[str, Variant]:
    """An op's two registered variants: ``"numpy"`` (its kernel of numpy calls) and
    ``"numba"`` (``fused``, falling back to ``numpy`` wherever it cannot run: no numba,
    the GPU, views it does not handle).  Both use the op's workspace rule, so the plan
    is the same whichever runs."""

    def fused_or_numpy(k: KernelArgs) -> Step:
        ks = kernels() if is_numpy(k.xp) else None
        step = fused(k, ks) if ks is not None else None
        return step if step is not None else numpy(k)

    return {
        "numpy": Variant(applies=_always, workspace=workspace, kernel=numpy,
                         doc="numpy calls, one pass per term"),
        "numba": Variant(applies=_floats, workspace=workspace, kernel=fused_or_numpy,
                         doc=doc),
    }


def by_size(kind: str, table: dict[str, Variant],
            size: Callable[[KernelArgs], int] = largest) -> KernelFactory:
    """The kernel factory of an op with fused and numpy variants: the fused one where
    :func:`use_fused` says so for this instruction's size, else numpy's."""

    def factory(k: KernelArgs) -> Step:
        fused = is_numpy(k.xp) and use_fused(kind, size(k))
        return table["numba" if fused else "numpy"].kernel(k)

    return factory


def _always(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return True


def _floats(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return all(d.dtype.is_float for d in outs)
