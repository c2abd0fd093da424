"""Traced tensors: :class:`Tensor` is a variable of the graph being traced, with its
type and shape; its operators and methods append ops to the path being traced.

Python numbers and numpy arrays mixed into arithmetic become frozen parameters (one
per scalar value).  Comparisons (``==``, ``<``, ...) are elementwise, as in PyTorch:
a ``bool`` tensor, the mask ``masked_fill`` and ``where`` take.  Whatever would need a
*value* (``bool()``, ``float()``, ``.item()``, a numpy function, iterating over the
batch) is a :class:`TraceError`: the graph is traced once and then runs on any data, so
a Python ``if`` on a value cannot be recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.graph import BATCH, DType, TensorDesc
from engine.nn._trace import TraceError, Tracer, batch, current, generic_shape

_NUMPY_ARITH = {np.add: "Add", np.subtract: "Sub", np.multiply: "Mul", np.true_divide: "Div",
                np.power: "Pow"}
_NUMPY_COMPARE = {np.equal: "Equal", np.not_equal: "Equal", np.less: "Less",
                  np.less_equal: "LessOrEqual", np.greater: "Greater",
                  np.greater_equal: "GreaterOrEqual"}


class _Ops:
    """The operators of a traced value (a :class:`Tensor`, or a
    :class:`~engine.nn.Parameter` while it is traced)."""

    __array_priority__ = 1000

    def _t(self) -> Tensor:
        raise NotImplementedError

    # -- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return binary("Add", self, other)

    def __radd__(self, other: Any) -> Tensor:
        return binary("Add", other, self)

    def __sub__(self, other: Any) -> Tensor:
        return binary("Sub", self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return binary("Sub", other, self)

    def __mul__(self, other: Any) -> Tensor:
        return binary("Mul", self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return binary("Mul", other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return binary("Div", self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return binary("Div", other, self)

    def __pow__(self, other: Any) -> Tensor:
        if isinstance(other, int | float) and not isinstance(other, bool):
            x = self._t()
            if other == 2:
                return x._emit("Square", x)
            if other == 1:
                return x
            if other == 0.5:
                return x._emit("Sqrt", x)
        return binary("Pow", self, other)

    def __rpow__(self, other: Any) -> Tensor:
        return binary("Pow", other, self)

    def __neg__(self) -> Tensor:
        x = self._t()
        return x._emit("Neg", x)

    def __pos__(self) -> Tensor:
        return self._t()

    def __abs__(self) -> Tensor:
        x = self._t()
        return x._emit("Abs", x)

    def __matmul__(self, other: Any) -> Tensor:
        return binary("MatMul", self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return binary("MatMul", other, self)

    # -- what needs a value ----------------------------------------------------------------
    def __bool__(self) -> bool:
        raise TraceError("bool() of a traced tensor: Python control flow (if/while/and/or) "
                         "cannot depend on values, which are not known while tracing; "
                         "compute both branches, or test shapes instead")

    def _no_value(self, what: str) -> Any:
        raise TraceError(f"{what} of a traced tensor: its value is not known while tracing "
                         "(the graph is traced once and runs on any data)")

    def __float__(self) -> float:
        return self._no_value("float()")

    def __int__(self) -> int:
        return self._no_value("int()")

    def __index__(self) -> int:
        return self._no_value("using as an index or int")

    def __complex__(self) -> complex:
        return self._no_value("complex()")

    def item(self) -> Any:
        """Not available: a :class:`TraceError` (values are not known while tracing)."""
        return self._no_value(".item()")

    def tolist(self) -> Any:
        return self._no_value(".tolist()")

    def numpy(self) -> Any:
        return self._no_value(".numpy()")

    # -- comparisons: bool tensors (masks for masked_fill / where) ------------------------
    def _compared(self, op: str, other: Any) -> Any:
        """``op`` (Equal, Less, ...) of this and ``other``, a ``bool`` tensor
        (:func:`compare`); what is no number, array or traced value is left to Python
        (``NotImplemented``: ``x == None`` is False)."""
        if other is None or \
                not isinstance(other, _Ops | bool | int | float | np.ndarray | np.generic):
            return NotImplemented
        return compare(op, self, other)

    def __lt__(self, other: Any) -> Any:
        return self._compared("Less", other)

    def __le__(self, other: Any) -> Any:
        return self._compared("LessOrEqual", other)

    def __gt__(self, other: Any) -> Any:
        return self._compared("Greater", other)

    def __ge__(self, other: Any) -> Any:
        return self._compared("GreaterOrEqual", other)

    def _equal(self, other: Any, negate: bool) -> Any:
        eq = self._compared("Equal", other)
        if eq is NotImplemented or not negate:
            return eq
        return eq._emit("Not", eq)

    def __invert__(self) -> Tensor:
        x = self._t()
        if x.desc.dtype != DType.BOOL:
            raise TraceError(f"~ of a {x.desc.dtype.value} tensor: engine.nn has logical "
                             "not of bool tensors (masks) only, no bitwise not")
        return x._emit("Not", x)

    # numpy: any numpy function on a traced tensor is an error, except plain arithmetic
    # with a numpy scalar or array on the left (np.float32(2) * x)
    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TraceError("numpy was asked for the values of a traced tensor (np.asarray, "
                         "np.array or a numpy function): use engine.nn.functional and tensor "
                         "methods, which record ops")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        op = _NUMPY_ARITH.get(ufunc)
        if op is not None and method == "__call__" and not kwargs and len(inputs) == 2:
            return binary(op, inputs[0], inputs[1])
        op = _NUMPY_COMPARE.get(ufunc)
        if op is not None and method == "__call__" and not kwargs and len(inputs) == 2:
            got = compare(op, inputs[0], inputs[1])  # an array on the left: arr < x
            return got._emit("Not", got) if ufunc is np.not_equal else got
        raise TraceError(f"numpy's {ufunc.__name__} was called on a traced tensor: numpy "
                         "cannot compute on traced values; use engine.nn.functional or "
                         "tensor methods (x.exp(), x.sum(1), nn.functional.relu(x), ...)")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TraceError(f"numpy's {func.__name__} was called on a traced tensor: numpy "
                         "cannot compute on traced values; use engine.nn.functional or "
                         "tensor methods")


class Tensor(_Ops):
    """A traced value: a variable of the graph being built, with its dtype and shape.

    Made by tracing (``nn.to_graph`` passes one per input to ``forward``), never by
    hand.  ``shape[0]`` of a batched tensor is :data:`engine.nn.batch`, the symbolic
    batch size.  Operators: ``+ - * / ** @``, unary ``-``/``abs``, with tensors, Python
    numbers and numpy arrays (frozen constants), broadcasting as numpy does.

    >>> import numpy as np
    >>> from engine import nn
    >>> class Affine(nn.Module):
    ...     def forward(self, x):
    ...         print(x.shape, x.dtype)
    ...         return (x * 2.0 + np.ones(4, np.float32))[:, 1:3].sum(1, keepdim=True)
    >>> g = nn.to_graph(Affine(), inputs={"x": (0, 4)}, loss="mse", metrics=["regression_sums"])
    (batch, 4) float32
    (batch, 4) float32
    >>> [n.op for n in g.paths[1].nodes]
    ['Mul', 'Add', 'Slice', 'ReduceSum', 'Reshape', 'RegressionSums']
    """

    __slots__ = ("desc", "name", "tracer")

    def __init__(self, tracer: Tracer, name: str, desc: TensorDesc) -> None:
        self.tracer = tracer
        self.name = name
        self.desc = desc

    def _t(self) -> Tensor:
        t = current("a traced tensor")
        if t is not self.tracer:
            raise TraceError(f"tensor {self.name!r} was traced on path "
                             f"{self.tracer.path.name!r} and is used on path {t.path.name!r}: "
                             "keep no traced tensor between forward calls")
        return self

    def _emit(self, op: str, *inputs: Tensor, **attrs: Any) -> Tensor:
        return self.tracer.emit(op, inputs, **attrs)

    # -- description ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[Any, ...]:
        """The shape, with :data:`engine.nn.batch` as a batched tensor's leading dimension."""
        return generic_shape(self.desc)

    def size(self, dim: int | None = None) -> Any:
        """``shape``, or ``shape[dim]``."""
        return self.shape if dim is None else self.shape[dim]

    @property
    def dtype(self) -> str:
        """The element type's name (``"float32"``, ``"int64"``, ...)."""
        return self.desc.dtype.value

    @property
    def ndim(self) -> int:
        return len(self.desc.shape)

    def dim(self) -> int:
        return self.ndim

    @property
    def batched(self) -> bool:
        """Whether the leading axis is the batch."""
        return self.desc.batched

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.desc})"

    def __eq__(self, other: object) -> Any:
        """Elementwise, as PyTorch's: a ``bool`` tensor (a mask), not a Python bool."""
        return self._equal(other, negate=False)

    def __ne__(self, other: object) -> Any:
        return self._equal(other, negate=True)

    __hash__ = object.__hash__

    def __len__(self) -> int:
        if self.desc.batched:
            raise TraceError("len() of a batched tensor: the batch size is symbolic while "
                             "tracing")
        if not self.desc.shape:
            raise TraceError("len() of a 0-d tensor")
        return self.desc.shape[0]

    def __iter__(self) -> Any:
        raise TraceError("iterating over a traced tensor is not supported: index it "
                         "(x[:, i]) or use tensor methods")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TraceError("assigning into a traced tensor (x[...] = v) is not supported: "
                         "tensors are immutable in a graph; build the new value "
                         "(nn.cat, arithmetic)")

    def __getitem__(self, key: Any) -> Tensor:
        return index(self._t(), key)

    # -- methods ---------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> Tensor:
        """The same values in ``shape``; a batched tensor's leading dimension is the batch
        (give ``-1``, ``nn.batch`` or ``x.shape[0]``)."""
        return reshape(self._t(), _dims(shape))

    def view(self, *shape: Any) -> Tensor:
        """``reshape`` (a graph has no views: both are free in place)."""
        return self.reshape(*shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Axes ``start_dim..end_dim`` merged into one (``start_dim >= 1`` when batched)."""
        x = self._t()
        n = max(x.ndim, 1)
        s, e = start_dim % n, end_dim % n
        if x.batched and s == 0:
            raise TraceError("flatten(0) of a batched tensor would merge the batch axis; "
                             "use flatten(1)")
        if s > e:
            raise TraceError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        shape = list(x.desc.shape)
        merged = 1
        for d in shape[s:e + 1]:
            merged *= d
        return reshape(x, [*shape[:s], merged, *shape[e + 1:]])

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Axes ``dim0`` and ``dim1`` swapped (never the batch axis)."""
        x = self._t()
        perm = list(range(x.ndim))
        a, b = _axis(dim0, x.ndim), _axis(dim1, x.ndim)
        perm[a], perm[b] = perm[b], perm[a]
        return x._emit("Transpose", x, perm=tuple(perm))

    def permute(self, *dims: Any) -> Tensor:
        """Axes in the order ``dims`` (the batch axis stays first)."""
        x = self._t()
        perm = tuple(_axis(d, x.ndim) for d in _dims(dims))
        return x._emit("Transpose", x, perm=perm)

    @property
    def T(self) -> Tensor:
        """A 2-D tensor transposed."""
        x = self._t()
        if x.ndim != 2:
            raise TraceError(f".T needs a 2-D tensor, got {x.ndim}-D; use permute")
        return x._emit("Transpose", x, perm=(1, 0))

    def unsqueeze(self, dim: int) -> Tensor:
        """A new axis of size 1 at ``dim``."""
        x = self._t()
        return x._emit("Unsqueeze", x, axes=(_axis(dim, x.ndim + 1),))

    def squeeze(self, dim: int | None = None) -> Tensor:
        """Axis ``dim`` (or every axis of size 1) removed; a no-op where it is not 1."""
        x = self._t()
        if dim is None:
            axes = tuple(i for i, d in enumerate(x.desc.shape) if d == 1)
        else:
            a = _axis(dim, x.ndim)
            axes = (a,) if x.desc.shape[a] == 1 else ()
        return x._emit("Squeeze", x, axes=axes) if axes else x

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0
              ) -> tuple[Tensor, ...]:
        """Pieces along ``dim`` (never the batch axis), as ``torch.Tensor.split``: each
        ``split_size_or_sections`` long (the last shorter where it does not divide), or
        of the sizes listed.  Each piece is a slice of this tensor (``x[..., a:b]``),
        whose gradient flows back into its place."""
        x = self._t()
        a, n = _unbatched_axis(x, dim, "split")
        if isinstance(split_size_or_sections, int):
            if split_size_or_sections < 1:
                raise TraceError(f"split size {split_size_or_sections}: it must be at least 1")
            step = split_size_or_sections
            sizes = [min(step, n - start) for start in range(0, n, step)]
        else:
            sizes = [int(k) for k in split_size_or_sections]
            if sum(sizes) != n or min(sizes, default=0) < 1:
                raise TraceError(f"split sizes {sizes}: each at least 1, summing to the "
                                 f"size of dimension {a}, {n}")
        pieces, start = [], 0
        for size in sizes:
            pieces.append(x if size == n else
                          index(x, (slice(None),) * a + (slice(start, start + size),)))
            start += size
        return tuple(pieces)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """``chunks`` pieces along ``dim`` as ``torch.Tensor.chunk``: each
        ceil(size / chunks) long, the last shorter (so fewer where that leaves none)."""
        _, n = _unbatched_axis(self._t(), dim, "chunk")
        if chunks < 1:
            raise TraceError(f"chunk into {chunks} pieces: at least 1")
        return self.split(max(1, -(-n // chunks)), dim)

    def contiguous(self) -> Tensor:
        """This tensor: a graph's values are laid out by the planner, never strided
        views, so PyTorch's ``.contiguous().view(...)`` is ``.view(...)`` here."""
        return self._t()

    def sum(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The sum over ``dim`` (an int or a tuple; all axes when None)."""
        return reduce("ReduceSum", self._t(), dim, keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The mean over ``dim`` (an int or a tuple; all axes when None)."""
        return reduce("ReduceMean", self._t(), dim, keepdim)

    def matmul(self, other: Any) -> Tensor:
        return binary("MatMul", self, other)

    def pow(self, exponent: Any) -> Tensor:
        return self ** exponent

    def exp(self) -> Tensor:
        return self._emit("Exp", self._t())

    def log(self) -> Tensor:
        return self._emit("Log", self._t())

    def sqrt(self) -> Tensor:
        return self._emit("Sqrt", self._t())

    def abs(self) -> Tensor:
        return self._emit("Abs", self._t())

    def relu(self) -> Tensor:
        return self._emit("Relu", self._t())

    def sigmoid(self) -> Tensor:
        return self._emit("Sigmoid", self._t())

    def tanh(self) -> Tensor:
        return self._emit("Tanh", self._t())

    def softmax(self, dim: int) -> Tensor:
        x = self._t()
        return x._emit("Softmax", x, axis=_axis(dim, x.ndim))

    def log_softmax(self, dim: int) -> Tensor:
        x = self._t()
        return x._emit("LogSoftmax", x, axis=_axis(dim, x.ndim))

    def clamp(self, min: float | None = None, max: float | None = None) -> Tensor:
        """Values limited to ``[min, max]`` (Clip)."""
        x = self._t()
        attrs = {k: float(v) for k, v in (("min", min), ("max", max)) if v is not None}
        return x._emit("Clip", x, **attrs)

    clip = clamp

    def float(self) -> Tensor:
        """As float32 (a Cast unless it is already)."""
        return self.to("float32")

    def long(self) -> Tensor:
        """As int64 (a Cast unless it is already)."""
        return self.to("int64")

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """``value`` where ``mask`` is True, else this tensor (see :func:`masked_fill`)."""
        return masked_fill(self._t(), mask, value)

    def to(self, dtype: Any) -> Tensor:
        """As ``dtype`` (a name, a numpy dtype or :class:`~engine.DType`)."""
        x = self._t()
        want = DType.of(np.dtype(dtype).name if not isinstance(dtype, str | DType) else dtype)
        return x if want == x.desc.dtype else x._emit("Cast", x, to=want.value)


Tracer.tensor_type = Tensor


# -- conversions and shared helpers --------------------------------------------------------


def as_tensor(value: Any, like: Tensor | None = None) -> Tensor:
    """A traced tensor for ``value``: a tensor, a parameter of the traced module, a Python
    number (a frozen scalar of ``like``'s dtype) or a numpy array (a frozen constant)."""
    if isinstance(value, _Ops):
        return value._t()
    tracer = current("an engine.nn operation") if like is None else like.tracer
    state = tracer.state
    if isinstance(value, bool) or not isinstance(value, int | float | np.ndarray | np.generic):
        raise TraceError(f"unsupported operand of type {type(value).__name__}: traced ops take "
                         "tensors, parameters, Python numbers and numpy arrays")
    dtype = like.desc.dtype if like is not None else DType.FLOAT32
    if isinstance(value, np.ndarray) and value.ndim > 0:
        arr = value
        if like is None:
            dtype = DType.of(arr.dtype.name) if arr.dtype.kind != "f" else DType.FLOAT32
        return tracer.tensor(state.array(np.asarray(arr), dtype))
    return tracer.tensor(state.scalar(float(value), dtype))


def compare(op: str, a: Any, b: Any) -> Tensor:
    """``op`` (Equal, Less, LessOrEqual, Greater, GreaterOrEqual) of two operands, at
    least one traced: a ``bool`` tensor.  A number or array beside an integer or bool
    tensor must be one of its values (``i < 2.5`` of an int64 ``i``, ``x > -1`` of uint8
    pixels, ``mask == 2`` are TraceErrors that say to cast first: converted, they would
    compare something else); ``True``/``False`` are 1 and 0, as in PyTorch."""
    ta = a._t() if isinstance(a, _Ops) else None
    tb = b._t() if isinstance(b, _Ops) else None
    if ta is None and tb is None:
        raise TraceError(f"{op} of two untraced values")
    t = ta if ta is not None else tb
    assert t is not None
    plain = [v for v in (a, b) if not isinstance(v, _Ops)]
    if plain:
        _check_comparable(t, plain[0], op)
    if t.desc.dtype == DType.BOOL and op != "Equal":
        raise TraceError(f"{op} of a bool tensor: masks compare with == and != only")
    a, b = (int(v) if isinstance(v, bool | np.bool_) else v for v in (a, b))
    return binary(op, a, b)


def _check_comparable(t: Tensor, value: Any, op: str) -> None:
    """Refuses a number or array that ``t``'s (integer or bool) type cannot hold."""
    dtype = t.desc.dtype
    if dtype.value.startswith("float"):
        return
    arr = np.asarray(value)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iuf":
        raise TraceError(f"{op} of a {dtype.value} tensor with {value!r}: compare with "
                         "numbers")
    ok = np.isfinite(arr).all() if arr.dtype.kind == "f" else True
    if ok:
        if dtype == DType.BOOL:
            ok = bool(np.isin(arr, (0, 1)).all())
        else:
            info = np.iinfo(np.dtype(dtype.value))
            ok = bool((arr == np.round(arr)).all() and (arr >= info.min).all() and
                      (arr <= info.max).all())
    if not ok:
        shown = value if arr.size <= 4 else f"an array of {arr.dtype} {arr.shape}"
        raise TraceError(f"{op} of a {dtype.value} tensor with {shown!r}: not a value a "
                         f"{dtype.value} holds, so converted it would compare something "
                         f"else; cast the tensor first (x.to('float32'))")


def binary(op: str, a: Any, b: Any) -> Tensor:
    """``op`` of two operands, at least one traced; the other may be a number or array."""
    ta = a._t() if isinstance(a, _Ops) else None
    tb = b._t() if isinstance(b, _Ops) else None
    if ta is None and tb is None:
        raise TraceError(f"{op} of two untraced values")
    x = ta if ta is not None else as_tensor(a, like=tb)
    y = tb if tb is not None else as_tensor(b, like=ta)
    return x._emit(op, x, y)


def _axis(dim: Any, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer):
        raise TraceError(f"an axis must be an int, got {dim!r}")
    if not -max(ndim, 1) <= int(dim) < max(ndim, 1):
        raise TraceError(f"axis {dim} is out of range for a {ndim}-D tensor")
    return int(dim) % max(ndim, 1)


def _unbatched_axis(x: Tensor, dim: int, what: str) -> tuple[int, int]:
    """Axis ``dim`` of ``x`` and its size, refused where it is the symbolic batch."""
    a = _axis(dim, x.ndim)
    if x.desc.batched and a == 0:
        raise TraceError(f"{what} along the batch axis: the batch size is symbolic while "
                         "tracing")
    return a, int(x.desc.shape[a])


def _dims(shape: Sequence[Any]) -> list[Any]:
    """``f(2, 3)`` and ``f((2, 3))`` alike."""
    if len(shape) == 1 and isinstance(shape[0], list | tuple):
        return list(shape[0])
    return list(shape)


def reshape(x: Tensor, shape: Sequence[Any]) -> Tensor:
    """Reshape keeping a batched tensor's batch leading (the target's first entry is
    the batch: -1, :data:`batch`, None, or a batched tensor's own leading 0)."""
    dims = list(shape)
    if x.batched:
        if not dims:
            raise TraceError("reshape of a batched tensor to a 0-d shape")
        lead = dims[0]
        if lead is batch or lead is None or (isinstance(lead, int) and lead in (-1, BATCH)):
            dims[0] = 0
        else:
            raise TraceError(f"reshape{tuple(shape)}: the leading dimension of a batched tensor "
                             "is the symbolic batch size; give -1 or x.shape[0] for it, not "
                             f"{lead!r}")
        rest = dims[1:]
    else:
        rest = dims
    for d in rest:
        if d is batch or isinstance(d, bool) or not isinstance(d, int | np.integer) or \
                (d < 1 and d != -1):
            raise TraceError(f"reshape{tuple(shape)}: dimension {d!r} is not a positive int "
                             "or -1" + (" (the batch may only lead)" if d is batch else ""))
    target = tuple(int(d) for d in dims)
    if -1 not in target and target == x.desc.shape:
        return x
    return x._emit("Reshape", x, shape=target)


def reduce(op: str, x: Tensor, dim: Any, keepdim: bool) -> Tensor:
    if dim is None:
        return x._emit(op, x, keepdims=int(keepdim))
    dims = dim if isinstance(dim, list | tuple) else [dim]
    axes = tuple(sorted({_axis(d, x.ndim) for d in dims}))
    return x._emit(op, x, axes=axes, keepdims=int(keepdim))


def index(x: Tensor, key: Any) -> Tensor:
    """``x[key]`` with ints, slices, ``None`` and ``...`` (the batch axis only ``:``):
    one Slice, then a Squeeze for the ints and an Unsqueeze for the Nones."""
    items = list(key) if isinstance(key, tuple) else [key]
    for it in items:
        if not (it is None or it is Ellipsis or isinstance(it, slice)
                or (isinstance(it, int | np.integer) and not isinstance(it, bool))):
            raise TraceError(f"indexing with {type(it).__name__} is not supported: use ints, "
                             "slices, None and ... (no tensor or list indices)")
    if sum(it is Ellipsis for it in items) > 1:
        raise TraceError("an index can have only one ellipsis (...)")
    n_axes = sum(1 for it in items if it is not None and it is not Ellipsis)
    if n_axes > x.ndim:
        raise TraceError(f"too many indices ({n_axes}) for a {x.ndim}-D tensor")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - n_axes)
    else:
        items += [slice(None)] * (x.ndim - n_axes)
    starts, ends, axes, steps = [], [], [], []
    squeeze, new_axes = [], []
    axis = out_pos = 0
    for it in items:
        if it is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        size = x.desc.shape[axis]
        if axis == 0 and x.batched:
            if not (isinstance(it, slice) and it == slice(None)):
                raise TraceError(f"index {it!r} on the batch axis: the batch can only be taken "
                                 "whole (:) in a traced model")
        elif isinstance(it, slice):
            if it != slice(None):
                start, stop, step = it.indices(size)
                if len(range(start, stop, step)) == 0:
                    raise TraceError(f"slice {it} of an axis of size {size} is empty")
                starts.append(start)
                ends.append(stop if stop >= 0 else -(size + 1))
                axes.append(axis)
                steps.append(step)
        else:
            i = int(it)
            if not -size <= i < size:
                raise TraceError(f"index {i} is out of range for an axis of size {size}")
            i %= size
            starts.append(i)
            ends.append(i + 1)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        if not isinstance(it, int | np.integer):
            out_pos += 1
        axis += 1
    y = x
    if axes:
        y = y._emit("Slice", y, starts=tuple(starts), ends=tuple(ends), axes=tuple(axes),
                    steps=tuple(steps))
    if squeeze:
        y = y._emit("Squeeze", y, axes=tuple(squeeze))
    if new_axes:
        y = y._emit("Unsqueeze", y, axes=tuple(new_axes))
    return y


def masked_fill(x: Any, mask: Any, value: float) -> Tensor:
    """PyTorch's ``x.masked_fill(mask, value)``: ``value`` where ``mask`` is True, ``x``
    elsewhere, one ``Where`` (its gradient flows to ``x`` where the mask is False).
    ``mask`` is a numpy bool array (a frozen constant) or a traced ``bool`` tensor (a
    comparison, ``x > 0``, or a graph input declared ``(shape, "bool")``), broadcasting
    to ``x``'s shape.

    >>> import numpy as np
    >>> from engine import nn
    >>> class Fill(nn.Module):
    ...     def forward(self, x):
    ...         return x.masked_fill(np.array([True, False, True]), -1.0)
    >>> g = nn.to_graph(Fill(), inputs={"x": (0, 3)}, loss=None)
    >>> [n.op for n in g.paths[0].nodes]
    ['Where']
    """
    if not isinstance(x, _Ops):
        raise TraceError(f"masked_fill needs a traced tensor, got {type(x).__name__}")
    t = x._t()
    if isinstance(mask, np.ndarray):
        if mask.dtype != np.bool_:
            raise TraceError(f"masked_fill: the mask must be bool, got a numpy array of "
                             f"{mask.dtype}")
        m = as_tensor(mask, like=None) if mask.ndim else None
        if m is None:
            raise TraceError("masked_fill: a 0-d mask; give an array of the tensor's shape")
    elif isinstance(mask, _Ops):
        m = mask._t()
        if m.dtype != "bool":
            raise TraceError(f"masked_fill: the mask must be bool, got {m.dtype} (a "
                             "comparison such as m == 0, or an input declared (shape, 'bool'))")
    else:
        raise TraceError(f"masked_fill: the mask must be a numpy bool array or a traced bool "
                         f"tensor, got {type(mask).__name__}")
    if isinstance(value, _Ops | bool) or not isinstance(
            value, int | float | np.floating | np.integer):
        raise TraceError(f"masked_fill: value must be a Python number, got "
                         f"{type(value).__name__}")
    if m.batched and not t.batched:
        raise TraceError(f"masked_fill: a batched mask {m.shape} on an unbatched tensor "
                         f"{t.shape}")
    ms, ts = m.desc.shape, t.desc.shape
    if len(ms) > len(ts) or any(a not in (1, b) for a, b in zip(ms[::-1], ts[::-1],
                                                                strict=False)):
        raise TraceError(f"masked_fill: the mask {m.shape} does not broadcast to the "
                         f"tensor's shape {t.shape}")
    return t._emit("Where", m, as_tensor(float(value), like=t), t)
