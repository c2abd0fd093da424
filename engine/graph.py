"""The CalcGraph meta-model: a small, pure-data descriptor of a computation.

A :class:`CalcGraph` holds variables of the paper's three kinds (placeholders,
parameters "to optimize", generic results of operators) and one or more
:class:`Path` objects, each a sequence of operator nodes with a calculation mode
(``FORWARD_ONLY`` or ``BACKWARD_ENABLED``).  Nothing here holds an array or knows
about the op table: names of operators are checked by the compiler, which also
infers the shapes of generic variables.

Example (the CalcGraph paper's linear model ``O = W * I``)::

    >>> from engine import CalcGraph, Init, Mode
    >>> g = CalcGraph()
    >>> I = g.placeholder("I", (0, 6))          # 0 marks the batch dimension
    >>> T = g.placeholder("T", (0, 3))
    >>> W = g.parameter("W", (6, 3), init=Init.uniform(-1.0, 1.0))
    >>> learn = g.path("learn", Mode.BACKWARD_ENABLED)
    >>> O = learn.MatMul(I, W)
    >>> _ = learn.set_loss(learn.Abs(learn.Sub(O, T)))
    >>> post = g.path("post", Mode.FORWARD_ONLY)
    >>> rmse = post.RMSE(O, T)
    >>> [p.name for p in g.paths], rmse.name
    (['learn', 'post'], 'rmse_4')
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

BATCH = 0
"""The value that marks the batch dimension in a generic shape."""


class DType(str, enum.Enum):
    """Element types a tensor may have."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    INT64 = "int64"
    INT32 = "int32"
    INT8 = "int8"
    UINT8 = "uint8"  # compact data: pixels, dequantized in the graph
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT64)

    @classmethod
    def of(cls, value: DType | str) -> DType:
        try:
            return cls(value if isinstance(value, str) else value.value)
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype {value!r}; known: {known}") from None


ITEMSIZE: dict[DType, int] = {DType.FLOAT32: 4, DType.FLOAT64: 8, DType.INT64: 8,
                               DType.INT32: 4, DType.INT8: 1, DType.UINT8: 1, DType.BOOL: 1}
"""Bytes per element of each element type."""


@dataclass(frozen=True)
class TensorDesc:
    """Element type and shape of a tensor; ``0`` in ``shape`` marks the batch dimension.

    The batch dimension, when present, is the leading one.

    >>> TensorDesc(DType.FLOAT32, (0, 6)).at_batch(32).shape
    (32, 6)
    """

    dtype: DType
    shape: tuple[int, ...]

    @property
    def batched(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == BATCH

    def at_batch(self, batch: int) -> TensorDesc:
        """The current descriptor of this generic one for a given batch size."""
        shape = self.shape
        if not shape or shape[0] != BATCH:
            return self
        return TensorDesc(self.dtype, (batch, *shape[1:]))

    def numel(self, batch: int = 1) -> int:
        shape = self.shape
        if shape and shape[0] == BATCH:
            return batch * math.prod(shape[1:])
        return math.prod(shape)

    def nbytes(self, batch: int = 1) -> int:
        return self.numel(batch) * ITEMSIZE[self.dtype]

    def __str__(self) -> str:
        dims = ",".join("b" if (i == 0 and d == BATCH) else str(d)
                        for i, d in enumerate(self.shape))
        return f"{self.dtype.value}[{dims}]"


class Kind(str, enum.Enum):
    """The paper's three kinds of variables."""

    PLACEHOLDER = "placeholder"  # data from outside: has a setter
    PARAMETER = "parameter"  # "to optimize": init method, regularization
    GENERIC = "generic"  # the result of an operator


class Mode(str, enum.Enum):
    """Calculation mode of a path."""

    FORWARD_ONLY = "forward_only"
    BACKWARD_ENABLED = "backward_enabled"


class Device(str, enum.Enum):
    """Execution mode of a graph."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class Init:
    """How a parameter is initialised.

    Fan-in and fan-out are taken from the shape: ``(fan_in, fan_out)`` for a
    matrix (our ``Gemm``/``MatMul`` weights are ``[in, out]``), ``(in * k, out * k)``
    for a convolution kernel ``[out, in, *k]``; pass ``fan_in``/``fan_out`` to override.

    >>> Init.uniform(-1, 1).method, Init.he_normal().method
    ('uniform', 'he_normal')
    """

    method: str
    low: float = 0.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0
    value: float = 0.0
    fan_in: int | None = None
    fan_out: int | None = None
    values: tuple[float, ...] | None = None  # explicit contents (constants, imports)
    members: tuple[Init, ...] | None = None  # a stack's parameter: one init per model
    model_axis: int = 0  # stacked: the axis of the stored parameter that indexes the models
    member_transposed: bool = False  # stacked: each model's 2-D slice is stored transposed
    # ``from_array``: the values as an array (a real model's weights: no Python floats),
    # compared by ``digest``, their SHA-1, so that equal inits mean equal values
    digest: str | None = None
    array: Any = field(default=None, compare=False, hash=False, repr=False)

    METHODS = (
        "zeros", "ones", "constant", "uniform", "normal", "xavier_uniform",
        "xavier_normal", "he_uniform", "he_normal", "lecun_normal", "values", "stacked",
    )  # fmt: skip

    @staticmethod
    def zeros() -> Init:
        return Init("zeros")

    @staticmethod
    def ones() -> Init:
        return Init("ones")

    @staticmethod
    def constant(value: float) -> Init:
        return Init("constant", value=float(value))

    @staticmethod
    def uniform(low: float = -0.05, high: float = 0.05) -> Init:
        return Init("uniform", low=float(low), high=float(high))

    @staticmethod
    def normal(mean: float = 0.0, std: float = 0.05) -> Init:
        return Init("normal", mean=float(mean), std=float(std))

    @staticmethod
    def xavier_uniform(fan_in: int | None = None, fan_out: int | None = None) -> Init:
        return Init("xavier_uniform", fan_in=fan_in, fan_out=fan_out)

    @staticmethod
    def xavier_normal(fan_in: int | None = None, fan_out: int | None = None) -> Init:
        return Init("xavier_normal", fan_in=fan_in, fan_out=fan_out)

    @staticmethod
    def he_uniform(fan_in: int | None = None) -> Init:
        return Init("he_uniform", fan_in=fan_in)

    @staticmethod
    def he_normal(fan_in: int | None = None) -> Init:
        return Init("he_normal", fan_in=fan_in)

    @staticmethod
    def lecun_normal(fan_in: int | None = None) -> Init:
        return Init("lecun_normal", fan_in=fan_in)

    @staticmethod
    def from_values(values: Sequence[float]) -> Init:
        return Init("values", values=tuple(float(v) for v in values))

    @staticmethod
    def from_array(values: Any) -> Init:
        """Explicit contents from an array, kept as one (read-only) float64 copy: how
        imported weights are held (``from_values`` would make a Python float of each).

        >>> import numpy as np
        >>> a, b = Init.from_array(np.arange(3)), Init.from_array(np.arange(3.0))
        >>> a == b, a == Init.from_array(np.ones(3))
        (True, False)
        """
        import hashlib

        import numpy as np

        arr = np.array(values, dtype=np.float64).ravel()
        arr.setflags(write=False)
        return Init("values", digest=hashlib.sha1(arr.tobytes()).hexdigest(), array=arr)

    @staticmethod
    def stacked(members: Sequence[Init], model_axis: int = 0, transposed: bool = False
                ) -> Init:
        """A parameter of a stack of K models (:mod:`engine.compile.stack`), the models
        along axis ``model_axis`` of the stored array (``[K, *shape]`` by default; a
        dense layer fed by shared data keeps ``[in, K, out]``, and with ``transposed``
        a model's ``[out, in]`` weight is stored so too): model ``k``'s slice
        (:meth:`member`) is drawn by ``members[k]`` with the fans of its own shape."""
        return Init("stacked", members=tuple(members), model_axis=int(model_axis),
                    member_transposed=bool(transposed))

    def member(self, stored: Any, k: int) -> Any:
        """Model ``k``'s slice of a stacked parameter's array ``stored``: a view in the
        model's own shape (strided where the model axis is not the first).

        >>> import numpy as np
        >>> w = np.arange(24).reshape(2, 3, 4)
        >>> Init.stacked([Init.zeros()] * 3, model_axis=1).member(w, 2).shape
        (2, 4)
        >>> Init.stacked([Init.zeros()] * 3, 1, transposed=True).member(w, 2).shape
        (4, 2)
        """
        view = stored[(slice(None),) * self.model_axis + (k,)]
        return view.T if self.member_transposed else view


@dataclass(frozen=True)
class Regularization:
    """A penalty added to a parameter's gradient during ``optimize()``.

    ``L2`` adds ``coef * w``, ``L1`` adds ``coef * sign(w)``.

    >>> Regularization.l2(1e-4)
    Regularization(kind='l2', coef=0.0001)
    """

    kind: str
    coef: float

    @staticmethod
    def l1(coef: float) -> Regularization:
        return Regularization("l1", float(coef))

    @staticmethod
    def l2(coef: float) -> Regularization:
        return Regularization("l2", float(coef))


@dataclass
class Variable:
    """A tensor of the graph.  ``desc`` is ``None`` for generic variables until the
    compiler has inferred it."""

    name: str
    kind: Kind
    desc: TensorDesc | None
    init: Init | None = None
    regularization: Regularization | None = None
    trainable: bool = True


@dataclass(frozen=True)
class Var:
    """A handle on a variable of a graph, returned by the builder methods."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass
class Node:
    """One operator application: ``outputs = op(inputs, **attrs)``."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


class Path:
    """A sequence of operators with a calculation mode.

    Operators are appended with :meth:`op` or, more readably, by calling the
    operator's name as a method: ``path.MatMul(a, b)`` is ``path.op("MatMul", a, b)``.
    """

    def __init__(self, graph: CalcGraph, name: str, mode: Mode) -> None:
        self.graph = graph
        self.name = name
        self.mode = Mode(mode)
        self.nodes: list[Node] = []
        self.loss: str | None = None

    def op(
        self,
        op: str,
        *inputs: Var | str,
        outputs: int | Sequence[str] = 1,
        **attrs: Any,
    ) -> Any:
        """Append ``op`` to this path and return its output handle(s).

        ``outputs`` is how many outputs the caller wants handles for, or their
        names.  Outputs an operator always produces but the caller did not ask
        for (a dropout mask, say) are named by the compiler.
        """
        names = [v.name if isinstance(v, Var) else str(v) for v in inputs]
        if isinstance(outputs, int):
            out_names = [self.graph.fresh_name(op) for _ in range(outputs)]
        else:
            out_names = [str(o) for o in outputs]
        for o in out_names:
            self.graph._declare(Variable(o, Kind.GENERIC, None))
        self.nodes.append(Node(op, tuple(names), tuple(out_names), dict(attrs)))
        handles = [Var(o) for o in out_names]
        return handles[0] if len(handles) == 1 else tuple(handles)

    def set_loss(self, var: Var | str) -> Var:
        """Mark the loss of a ``BACKWARD_ENABLED`` path.  A non-scalar loss is
        averaged over all its elements by the compiler."""
        self.loss = var.name if isinstance(var, Var) else str(var)
        return Var(self.loss)

    def __getattr__(self, name: str) -> Any:
        if name[:1].isupper():
            def call(*inputs: Var | str, **attrs: Any) -> Any:
                return self.op(name, *inputs, **attrs)

            return call
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"Path({self.name!r}, {self.mode.value}, {len(self.nodes)} nodes)"


class CalcGraph:
    """A model: variables, and paths of operators over them.

    >>> g = CalcGraph(device="cpu")
    >>> x = g.placeholder("x", (0, 4))
    >>> g.variables["x"].desc
    TensorDesc(dtype=<DType.FLOAT32: 'float32'>, shape=(0, 4))
    """

    def __init__(self, device: Device | str = Device.CPU, name: str = "calcgraph") -> None:
        self.device = Device(device)
        self.name = name
        self.variables: dict[str, Variable] = {}
        self.paths: list[Path] = []
        self.outputs: list[str] = []  # declared outputs; empty: every leaf is one
        self._counter = 0

    # -- variables ---------------------------------------------------------------
    def placeholder(
        self, name: str, shape: Sequence[int], dtype: DType | str = DType.FLOAT32
    ) -> Var:
        """Data from outside the graph (inputs, labels); it has a setter."""
        return self._declare(
            Variable(name, Kind.PLACEHOLDER, TensorDesc(DType.of(dtype), tuple(shape)))
        )

    def parameter(
        self,
        name: str,
        shape: Sequence[int],
        init: Init | None = None,
        regularization: Regularization | None = None,
        dtype: DType | str = DType.FLOAT32,
        trainable: bool = True,
    ) -> Var:
        """A variable "to optimize": initialised by ``init``, updated by the optimizer."""
        return self._declare(
            Variable(
                name,
                Kind.PARAMETER,
                TensorDesc(DType.of(dtype), tuple(shape)),
                init or Init.xavier_uniform(),
                regularization,
                trainable,
            )
        )

    def constant(
        self, value: float | Sequence[float], name: str | None = None,
        dtype: DType | str = DType.FLOAT32, shape: Sequence[int] | None = None,
    ) -> Var:
        """A frozen parameter holding fixed values (a scalar by default)."""
        values = (float(value),) if isinstance(value, int | float) else tuple(map(float, value))
        shp = tuple(shape) if shape is not None else (() if len(values) == 1 else (len(values),))
        return self.parameter(
            name or self.fresh_name("const"), shp, Init.from_values(values),
            dtype=dtype, trainable=False,
        )

    def output(self, *variables: Var | str) -> None:
        """Declare variables the user reads back after a run (the graph's outputs).

        Outputs, losses, placeholders and parameters are never overwritten by the
        memory planner.  While no output is declared, every leaf (a variable no
        operator reads) counts as one; once some are declared, only those do and
        dead-code elimination drops what none of them needs.

        >>> g = CalcGraph()
        >>> x = g.placeholder("x", (0, 2)); p = g.path("f")
        >>> h = p.Tanh(x); y = p.Relu(h)
        >>> g.output(h, y); g.outputs
        ['tanh_1', 'relu_2']
        """
        for v in variables:
            name = v.name if isinstance(v, Var) else str(v)
            if name not in self.variables:
                raise ValueError(f"graph {self.name!r} has no variable {name!r} to output")
            if name not in self.outputs:
                self.outputs.append(name)

    def path(self, name: str, mode: Mode | str = Mode.FORWARD_ONLY) -> Path:
        """Create and append a path."""
        if any(p.name == name for p in self.paths):
            raise ValueError(f"graph {self.name!r} already has a path named {name!r}")
        p = Path(self, name, Mode(mode))
        self.paths.append(p)
        return p

    # -- helpers -------------------------------------------------------------------
    def fresh_name(self, op: str) -> str:
        self._counter += 1
        return f"{_CAMEL.sub('_', op).lower()}_{self._counter}"

    def _declare(self, var: Variable) -> Var:
        if var.name in self.variables:
            raise ValueError(f"variable {var.name!r} is declared twice in graph {self.name!r}")
        if var.desc is not None:
            for i, d in enumerate(var.desc.shape):
                if d < 0 or (d == BATCH and i != 0):
                    raise ValueError(
                        f"variable {var.name!r}: shape {var.desc.shape} is invalid; dimensions "
                        "are positive and only the leading one may be 0 (the batch)"
                    )
        self.variables[var.name] = var
        return Var(var.name)

    def path_index(self, path: int | str) -> int:
        if isinstance(path, int):
            return path
        for i, p in enumerate(self.paths):
            if p.name == path:
                return i
        raise KeyError(f"no path named {path!r}; paths: {[p.name for p in self.paths]}")
