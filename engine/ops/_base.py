"""The definition of an operator: every rule about one op lives in one :class:`OpDef`.

An op declares
- ``shape``: its shape rule, ``(input descs, attrs) -> output descs`` at concrete shapes;
- ``kernel``: a *kernel factory* ``(KernelArgs) -> step`` that is called once, when a
  program is loaded, with the views of its inputs, outputs and workspace, and returns a
  zero-argument function that performs the op with no allocation;
- ``grad``: its gradient, written with other ops through a :class:`GradBuilder`
  (or :data:`NON_DIFFERENTIABLE`, with the reason);
- ``inplace``: which inputs output 0 may overwrite (the memory planner gives output 0
  the input's memory when that input dies at this op; a test runs every such kernel
  aliased);
- ``view``: output 0 is input 0's bytes in another shape (a reshape): the planner may
  give it the input's memory even while the input stays live (or is a parameter), and
  the kernel must then do nothing (it sees one address for both);
- ``pure``: whether equal inputs give equal outputs (CSE and constant folding may merge
  or precompute it; a dropout draws and is not pure);
- ``workspace``: the scratch bytes one execution needs, per device;
- ``writes``: inputs the op may update in place (batch normalisation's running
  statistics): a parameter there is state, never folded as a constant;
- ``onnx``: its ONNX form (:class:`~engine.ops._onnx.OnnxForm`: the operator, export
  and import converters), or :class:`~engine.ops._onnx.EngineInternal` with the reason;
- ``variants``: named kernel variants (:class:`Variant`), chosen by the ``algorithm``
  attribute (the first registered is the default; a variant may hold inner variants,
  named by path: ``"im2col/tn"``); the op's own ``kernel`` and ``workspace`` then
  dispatch to the chosen one (:func:`pick_variant`).  An auto-tuner chooses among those
  that apply (:func:`applicable_variants`, :mod:`engine.autotune`);
- ``stacking``: how K models' copies of the op run as one (a :class:`StackRule` that
  :mod:`engine.compile.stack` dispatches on), or :class:`DoesNotStack` with the reason;
- ``flops``: its arithmetic, ``(input descs, output descs, attrs) -> int`` at concrete
  shapes (a :data:`FlopRule`; :mod:`engine.runtime.flops` sums a program's).

FLOPs are counted the way model-FLOPs utilisation (MFU) counts them: the arithmetic of
the op's definition, whatever a kernel does to get there.
- A multiply-add is 2 FLOPs: a matrix product (batched, broadcast) ``2·M·N·K``; a
  convolution ``2·N·Cout·Hout·Wout·(Cin/group)·kH·kW``, each of its two gradients as
  much; ``ConvTranspose`` ``2·N·Cin·(Cout/group)·(input cells)·(kernel cells)``, its
  gradient (dX and dW) twice that.  A bias adds 1 per output element; a scale
  factor other than 1 (Gemm's ``alpha``, ``beta``) 1 per element it scales.
- Elementwise ops and activations: 1 per output element, whatever the function
  (a transcendental is not weighted: ``exp`` counts as an add does); ``Sum``, ``Max``,
  ``Min`` of n inputs n - 1; ``DequantizeLinear`` 2 (``(x - zero) · scale``); the fused
  gradient ops count their formula: ``SigmoidGrad`` ``dy·y·(1-y)`` and ``TanhGrad`` 3,
  ``EluGrad`` 2, ``GeluGrad`` ``dy·(Phi(x) + x·phi(x))`` 5, ``ReluGrad``,
  ``LeakyReluGrad`` and a gradient routed by a mask 1.
- Reductions: 1 per input element, plus the elementwise transform they reduce
  (``ReduceL1``, ``ReduceL2``, ``ReduceSumSquare`` 2, ``ReduceLogSumExp`` 4).
- Softmax and log-softmax: 5 per element (max, subtract, exp, sum, divide or subtract),
  their gradients 4.  Softmax cross-entropy: 5 per score and 1 per target (the
  picked log-probability summed), its gradient 2 per score and 1 per target (the
  one-hot subtracted); class weights add 1 per target to each; a negative
  log-likelihood loss and its gradient 1 per target.  ``MSELoss`` and ``RMSE`` 3 per
  element, ``MAELoss`` 3, ``HuberLoss`` 6; their gradients 2, 3 and 3.
- Normalisation, a fixed count per element (the kernels' passes): BatchNormalization
  6 with the batch's statistics, 2 with running ones, its gradient 11 and 5;
  LayerNormalization 7 (8 with a bias), its gradient 18; LRN ``4 + size``, its gradient
  ``9 + 2·size``.
- Data movement is 0: reshapes, transposes, slices, gathers, concatenation, padding,
  casts, copies, constants, a pool's indices.  Where its gradient adds (``GatherGrad``,
  an edge, reflect or wrap ``PadGrad``), 1 per element added.
- Pooling: 1 per window element read (``N·C·output cells·kernel cells``), its gradient
  as much; a global average pool 1 per input element.
- Metrics: 1 per score for an arg-max and 1 per row for each comparison or count
  (``Accuracy`` ``C + 2`` per row, ``ClassCounts`` ``C + 3``, ``PositiveScore`` 2);
  ``RegressionSums`` 8 per element.
- Not counted: a mean's division, a row's log or square root, a loss's final ``1/n``,
  per-channel statistics, a random draw (the gradient of a mean, whose only arithmetic
  is its scale, counts 1 per element).
- Fused and stacked ops count every member's work (``FusedGemm`` is its Gemm and its
  activation; a stack of K models K times one model).  A kernel variant never changes
  the count: the sparse rows, Winograd and the dequantizing GEMM count the dense
  model's FLOPs, since MFU counts the model's arithmetic, not what a kernel skipped.
- The optimizer's update is not an op: :mod:`engine.runtime.flops` counts it per
  parameter element.

Kernels are written once against the array module ``xp`` (numpy or cupy); where the two
differ inside a kernel (numpy's ``take`` needs ``mode="clip"``, cupy's ufuncs have no
``where=``), the kernel asks :func:`is_numpy` at load, never in a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from engine.errors import ShapeError
from engine.graph import DType, TensorDesc
from engine.ops._onnx import EngineInternal, OnnxForm

Step = Callable[[], None]


@dataclass
class KernelArgs:
    """What a kernel factory receives when a program is bound to a heap."""

    xp: Any  # the array module: numpy or cupy
    ins: list[Any]  # input arrays (views into the heap)
    outs: list[Any]  # output arrays (views into the heap)
    ws: Any  # uint8 view of this instruction's workspace
    attrs: dict[str, Any]
    rng: Any = None  # the session's random generator, for ops that draw
    device: str = "cpu"

    def scratch(self, offset: int, shape: Sequence[int], dtype: Any) -> Any:
        """A typed view of the workspace at ``offset`` bytes."""
        dt = self.xp.dtype(dtype)
        n = 1
        for d in shape:
            n *= int(d)
        nbytes = n * dt.itemsize
        return self.ws[offset : offset + nbytes].view(dt).reshape(tuple(shape))


class GradBuilder(Protocol):
    """What a gradient rule may use to emit the backward program.  A rule depends only
    on its node, the output gradients it is given and what :meth:`desc` and
    :meth:`const` answer; it never reaches into the builder's IR (the compiler replays a
    rule's emissions for nodes alike, :mod:`engine.compile.autodiff`)."""

    def op(self, op: str, *inputs: str, **attrs: Any) -> str: ...

    def desc(self, name: str) -> TensorDesc: ...

    def const(self, value: float, like: str) -> str: ...


@dataclass(frozen=True)
class NonDifferentiable:
    """Marks an op without a gradient rule, and says why."""

    reason: str


NON_DIFFERENTIABLE_METRIC = NonDifferentiable("a metric: integer-valued or not used in training")
INTEGER_INPUT = NonDifferentiable("its input is integer data: no gradient flows back")
NO_INPUTS = NonDifferentiable("it has no inputs")
SHAPE_ONLY = NonDifferentiable("its output depends on shapes only: no gradient flows back")
FIRST_ORDER_ONLY = NonDifferentiable("a gradient op; second derivatives are not supported")

class StackRule(Enum):
    """How K models' copies of an op become one op of a stack (vmap rules, in JAX's
    terms).  The rules themselves are in :mod:`engine.compile.stack`, one per kind."""

    ELEMENTWISE = "elementwise"  # every output keeps input 0's model axis
    BROADCAST = "broadcast"  # elementwise with broadcasting: the model axes must line up
    DENSE = "dense"  # a product of data by a weight parameter: StackedGemm
    LOSS = "loss"  # softmax cross-entropy: StackedSoftmaxCrossEntropyLoss, a loss per model
    METRIC = "metric"  # a per-model value of per-model scores and shared labels (Accuracy)


@dataclass(frozen=True)
class DoesNotStack:
    """Marks an op that a stack cannot hold, and says why."""

    reason: str


NOT_STACKED = DoesNotStack("no stacking rule: train these models one by one")
MADE_AFTER_STACKING = DoesNotStack("made by autodiff or a compiler pass, after stacking")
ALREADY_STACKED = DoesNotStack("already the stacked form of an op")

ShapeRule = Callable[[list[TensorDesc], dict[str, Any]], list[TensorDesc]]
FlopRule = Callable[[list[TensorDesc], list[TensorDesc], dict[str, Any]], int]
"""``(input descs, output descs, attrs) -> FLOPs`` at concrete shapes (the module's
conventions)."""
KernelFactory = Callable[[KernelArgs], Step]
GradRule = Callable[[GradBuilder, "NodeView", list["str | None"]], list["str | None"]]
WorkspaceRule = Callable[[list[TensorDesc], list[TensorDesc], dict[str, Any], str], int]


@dataclass(frozen=True)
class NodeView:
    """A node as a gradient rule sees it."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One registered way to compute an op: where it applies, its exact scratch and its
    kernel factory (ONNX's versioned kernels, tinygrad's searched ones).

    ``inner``: the variant's own inner choice (BestOf's nested selection), named
    variants each a complete way to compute the op this way (im2col's GEMM layout);
    the variant's own ``kernel`` and ``workspace`` are then those of the first.  Their
    names are paths: ``"im2col/tn"``.  ``group``: a layout that the other instructions
    of the same parameter (the forward product, its gradient products) share: an
    auto-tuner chooses it for all of them together, and a user's fixed choice on the
    forward op carries over to them (see :mod:`engine.autotune`)."""

    applies: Callable[[list[TensorDesc], list[TensorDesc], dict[str, Any]], bool]
    workspace: WorkspaceRule
    kernel: KernelFactory
    doc: str = ""  # what it does, and where it applies
    inner: dict[str, Variant] = field(default_factory=dict, hash=False)
    group: str = ""


VARIANT_ATTR = "algorithm"  # the attribute that names an op's variant
VARIANT_SEP = "/"  # "im2col/tn": the inner variant tn of im2col


def pick_variant(op: str, variants: dict[str, Variant], attrs: dict[str, Any]) -> Variant:
    """The variant ``attrs`` name (the first registered by default; a path such as
    ``"im2col/tn"`` names an inner variant); an unknown name is an error listing the
    available ones."""
    return variant_named(op, variants, attrs.get(VARIANT_ATTR) or next(iter(variants)))


def dispatch_variants(op: str, variants: dict[str, Variant]) -> tuple[Any, Any]:
    """An op's kernel factory and workspace rule: those of the variant its attributes
    name (:func:`pick_variant`)."""
    def kernel(k: KernelArgs) -> Step:
        return pick_variant(op, variants, k.attrs).kernel(k)

    def workspace(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                  device: str) -> int:
        return pick_variant(op, variants, attrs).workspace(ins, outs, attrs, device)

    return kernel, workspace


def variant_named(op: str, variants: dict[str, Variant], name: str) -> Variant:
    """The variant at path ``name`` (``"im2col"``, ``"im2col/tn"``)."""
    found: Variant | None = None
    level = variants
    for part in name.split(VARIANT_SEP):
        found = level.get(part)
        if found is None:
            raise ShapeError(f"{op} algorithm {name!r} is not one of "
                             f"{', '.join(variant_leaves(variants, top=True))}") from None
        level = found.inner
    assert found is not None
    return found


def variant_leaves(variants: dict[str, Variant], top: bool = False) -> list[str]:
    """Every variant path that names a complete choice (inner variants expanded), in
    registration order; ``top``: the top-level names only."""
    if top:
        return list(variants)
    out: list[str] = []
    for name, v in variants.items():
        if v.inner:
            out.extend(f"{name}{VARIANT_SEP}{leaf}" for leaf in variant_leaves(v.inner))
        else:
            out.append(name)
    return out


def applicable_variants(op: OpDef, ins: list[TensorDesc], outs: list[TensorDesc],
                        attrs: dict[str, Any], fixed: str | None = None) -> tuple[str, ...]:
    """The variant paths of ``op`` that apply at these shapes, in registration order:
    all of them, or those under ``fixed`` (a user's ``algorithm``: a top-level name
    leaves its inner choice open, a full path leaves nothing).  An auto-tuner's
    candidates."""
    names = variant_leaves(op.variants)
    if fixed:
        names = [n for n in names if n == fixed or n.startswith(fixed + VARIANT_SEP)]
    out = []
    for n in names:
        path = n.split(VARIANT_SEP)
        level, ok = op.variants, True
        for part in path:  # a nested variant applies where it and its parents apply
            v = level[part]
            if not v.applies(ins, outs, attrs):
                ok = False
                break
            level = v.inner
        if ok:
            out.append(n)
    return tuple(out)


def no_workspace(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return 0


# -- FLOP rules shared by the op modules (conventions in the module's docstring) ------


def no_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """Data movement: no arithmetic."""
    return 0


def per_output(count: int = 1) -> FlopRule:
    """``count`` FLOPs per element of output 0 (elementwise ops).

    >>> from engine.graph import DType, TensorDesc
    >>> per_output(3)([], [TensorDesc(DType.FLOAT32, (2, 5))], {})
    30
    """
    def rule(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
        return count * outs[0].numel()

    return rule


def per_input(count: int = 1, index: int = 0) -> FlopRule:
    """``count`` FLOPs per element of input ``index`` (reductions)."""
    def rule(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
        return count * ins[index].numel()

    return rule


def matmul_flops(a: TensorDesc, y: TensorDesc, trans_a: bool = False) -> int:
    """``2·K`` per element of the product ``y`` of ``a`` (K its inner dimension: the
    last axis of ``a``, or the one before when ``a`` is read transposed)."""
    inner = a.shape[-2] if trans_a and len(a.shape) >= 2 else a.shape[-1]
    return 2 * inner * y.numel()


@dataclass(frozen=True, kw_only=True)
class OpDef:
    """Every rule about one operator, given by keyword (``OpDef(name=..., shape=...)``)."""

    name: str
    shape: ShapeRule
    kernel: KernelFactory
    grad: GradRule | NonDifferentiable
    inplace: tuple[int, ...] = ()
    workspace: WorkspaceRule = no_workspace
    num_inputs: tuple[int, int] = (1, 1)  # (min, max)
    num_outputs: int = 1
    attrs: dict[str, Any] = field(default_factory=dict)  # allowed attributes and defaults
    doc: str = ""
    pure: bool = True
    variadic_outputs: bool = False  # as many outputs as the node names (Split)
    writes: tuple[int, ...] = ()  # inputs it may update in place (running statistics)
    view: bool = False  # output 0 is input 0's bytes reshaped: may alias a live input
    variants: dict[str, Variant] = field(default_factory=dict)  # by name; see pick_variant
    stacking: StackRule | DoesNotStack | None = None  # None: not declared (a test fails)
    onnx: OnnxForm | EngineInternal | None = None  # None: not declared (a test fails)
    flops: FlopRule | None = None  # None: not declared (a test fails)

    def with_defaults(self, attrs: dict[str, Any]) -> dict[str, Any]:
        out = dict(self.attrs)
        out.update(attrs)
        return out


# -- helpers shared by the op modules --------------------------------------------


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcasting; raises ShapeError."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {a} and {b} do not broadcast (axis -{i}: {x} vs {y})")
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(reversed(out))


def same_dtype(ins: list[TensorDesc], what: str = "inputs") -> DType:
    dts = {d.dtype for d in ins}
    if len(dts) != 1:
        raise ShapeError(f"{what} have different dtypes: {', '.join(sorted(d.value for d in dts))}")
    return ins[0].dtype


def need_float(d: TensorDesc, what: str = "input") -> None:
    if not d.dtype.is_float:
        raise ShapeError(f"{what} must be a float tensor, got {d.dtype.value}")


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % max(rank, 1)


def is_numpy(xp: Any) -> bool:
    """Whether the array module is numpy (the host), not cupy: the one test a kernel
    makes where the two modules' APIs differ."""
    return bool(xp.__name__ == "numpy")


def data_ptr(a: Any) -> int:
    """Address of an array's first element (numpy or cupy)."""
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])


def copy_step(xp: Any, y: Any, x: Any) -> Step:
    """``y[...] = x`` (shapes already equal), or nothing when the planner put ``y``
    in ``x``'s memory (an in-place reshape or identity is free)."""
    if data_ptr(y) == data_ptr(x) and y.strides == x.strides:
        return lambda: None
    return lambda: xp.copyto(y, x)


def masked_add(xp: Any, scratch: Any) -> Callable[[Any, Any, Any], None]:
    """``target += src`` where ``mask``, without a cast buffer: numpy's ufunc ``where=``;
    cupy's ufuncs have none, so there it is a masked copy into ``scratch`` (of ``src``'s
    shape) and a plain add."""
    if is_numpy(xp):
        return lambda target, src, mask: xp.add(target, src, out=target, where=mask)

    def add(target: Any, src: Any, mask: Any) -> None:
        scratch.fill(0)
        xp.copyto(scratch, src, where=mask)
        xp.add(target, scratch, out=target)

    return add


