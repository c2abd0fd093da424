"""Modules and parameters, shaped like PyTorch's: submodules and parameters are
registered by attribute assignment and named by their attribute path
(``blocks.0.conv1.weight``), the names of :meth:`Module.state_dict` and of the graph's
variables.

A :class:`Parameter` is *lazy*: it has a shape and an init (PyTorch's default for its
layer), and gets values only when they are asked for (:attr:`Parameter.value`,
:meth:`Module.state_dict`: drawn from the generator :func:`manual_seed` seeds) or set
(:meth:`Module.load_state_dict`, assignment).  :func:`engine.nn.to_graph` puts a
parameter that has values into the graph as those values, and one that has none as its
init, which the VM draws from its own seed.

>>> import numpy as np
>>> from engine import nn
>>> nn.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
>>> [(k, p.shape) for k, p in net.named_parameters()]
[('0.weight', (2, 3)), ('0.bias', (2,))]
>>> net[0].weight.has_value
False
>>> sd = net.state_dict(); sorted(sd), sd["0.weight"].dtype, net[0].weight.has_value
(['0.bias', '0.weight'], dtype('float32'), True)
>>> bool(np.abs(sd["0.weight"]).max() <= 1 / np.sqrt(3))
True
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from engine.graph import DType, Init
from engine.nn._tensor import Tensor, _Ops
from engine.nn._trace import NNError, TraceError, current, tracing
from engine.runtime.initializers import initial_values

_GENERATOR: list[np.random.Generator] = [np.random.default_rng()]


def manual_seed(seed: int) -> None:
    """Seed the generator that draws parameters' values when they are first asked for
    (as ``torch.manual_seed``).  Until called, the generator is seeded from the OS."""
    _GENERATOR[0] = np.random.default_rng(seed)


def _describe(init: Init) -> str:
    if init.method == "uniform":
        return f"uniform({init.low:.4g}, {init.high:.4g})"
    if init.method == "normal":
        return f"normal({init.mean:.4g}, {init.std:.4g})"
    if init.method == "constant":
        return f"constant({init.value:.4g})"
    return init.method


class Parameter(_Ops):
    """A tensor of the model to learn (or, with ``requires_grad=False``, to keep: batch
    norm's running statistics).

    ``Parameter(array)`` holds those values; ``Parameter(shape=..., init=...)`` holds an
    init (an :class:`~engine.graph.Init`) and draws its values when first asked.  While a
    module is traced, a parameter is the graph variable named by its state-dict name and
    takes part in arithmetic like a :class:`~engine.nn.Tensor`.

    >>> import numpy as np
    >>> from engine import Init, nn
    >>> p = nn.Parameter(shape=(2, 2), init=Init.ones())
    >>> p
    Parameter(shape=(2, 2), init=ones, lazy)
    >>> p.value.tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    >>> p.value = np.zeros((2, 2)); p.value.sum()
    np.float32(0.0)
    """

    def __init__(self, data: Any = None, requires_grad: bool = True, *,
                 shape: Iterable[int] | None = None, init: Init | None = None,
                 dtype: str = "float32") -> None:
        self.dtype = DType.of(dtype).value
        self.requires_grad = bool(requires_grad)
        self._value: np.ndarray | None = None
        if data is not None:
            arr = np.array(data, dtype=self.dtype)
            self.shape: tuple[int, ...] = tuple(int(d) for d in arr.shape)
            self._value = arr
            self.init = Init.from_array(arr)
        elif shape is None:
            raise NNError("Parameter needs data (an array) or shape= (with init=)")
        else:
            self.shape = tuple(int(d) for d in shape)
            if any(d < 1 for d in self.shape):
                raise NNError(f"Parameter shape {self.shape} has a dimension below 1")
            self.init = init or Init.zeros()

    def _t(self) -> Tensor:
        tracer = current("a parameter in arithmetic")
        name = tracer.state.params.get(id(self))
        if name is None:
            raise TraceError(f"a parameter of shape {self.shape} that the traced module does "
                             "not own was used: assign parameters (and the modules holding "
                             "them) as attributes in __init__, not inside forward")
        return tracer.tensor(name)

    def __eq__(self, other: object) -> Any:
        """While traced, with a number, an array or a traced tensor: elementwise (a
        ``bool`` tensor: ``self.mask == 0``); otherwise identity, so that parameters stay
        items of lists and sets."""
        if isinstance(other, Parameter) or not tracing() or other is None or \
                not isinstance(other, _Ops | bool | int | float | np.ndarray | np.generic):
            return self is other
        return self._equal(other, negate=False)

    def __ne__(self, other: object) -> Any:
        eq = self.__eq__(other)
        return (not eq) if isinstance(eq, bool) else eq._emit("Not", eq)

    __hash__ = object.__hash__

    def __getitem__(self, index: Any) -> Tensor:
        """While traced, a slice of the parameter (``self.bias[:, :, :T, :T]``)."""
        return self._t()[index]

    def __iter__(self) -> Any:
        raise TraceError("iterating over a parameter is not supported: index it "
                         "(w[i]) or use tensor methods")

    def __getattr__(self, name: str) -> Any:
        # While traced, a parameter has the tensor methods (w.T, w.reshape(...), ...).
        if not name.startswith("_") and hasattr(Tensor, name) and tracing():
            return getattr(self._t(), name)
        raise AttributeError(f"'Parameter' object has no attribute {name!r}")

    @property
    def has_value(self) -> bool:
        """Whether values were drawn or set (else the graph carries the init)."""
        return self._value is not None

    @property
    def value(self) -> np.ndarray:
        """The values (drawn from the :func:`manual_seed` generator on first access)."""
        if self._value is None:
            self._value = initial_values(self.init, self.shape, self.dtype, _GENERATOR[0])
        return self._value

    @value.setter
    def value(self, values: Any) -> None:
        arr = np.array(values, dtype=self.dtype)
        if arr.shape != self.shape:
            raise NNError(f"a parameter of shape {self.shape} cannot take values of shape "
                          f"{arr.shape}")
        self._value = arr

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def numpy(self) -> np.ndarray:
        """The values (outside tracing)."""
        if tracing():
            return super().numpy()
        return self.value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if tracing():
            return super().__array__()
        return self.value if dtype is None else self.value.astype(dtype)

    def __bool__(self) -> bool:
        raise NNError("the truth value of a Parameter is ambiguous: test `p is not None`")

    def __repr__(self) -> str:
        state = "set" if self._value is not None else "lazy"
        grad = "" if self.requires_grad else ", requires_grad=False"
        return f"Parameter(shape={self.shape}, init={_describe(self.init)}, {state}{grad})"


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` returns (PyTorch's names)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


IGNORED_KEYS = ("num_batches_tracked",)
"""State-dict entries that are accepted and ignored (PyTorch's batch norm counter: the
engine's batch norm uses a fixed momentum, so it needs no count)."""


class Module:
    """Base class of layers and models (PyTorch's ``nn.Module``): subclasses assign
    parameters and submodules in ``__init__`` and compute in ``forward``, which
    :func:`engine.nn.to_graph` traces.

    >>> from engine import nn
    >>> class Two(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a = nn.Linear(4, 3); self.b = nn.Linear(3, 2)
    ...     def forward(self, x):
    ...         return self.b(nn.functional.tanh(self.a(x)))
    >>> m = Two()
    >>> [k for k, _ in m.named_parameters()]
    ['a.weight', 'a.bias', 'b.weight', 'b.bias']
    >>> [k for k, _ in m.named_modules()], m.training, m.eval().training
    (['', 'a', 'b'], True, False)
    """

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration by attribute --------------------------------------------------------
    def _dicts(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        try:
            return (self.__dict__["_parameters"], self.__dict__["_buffers"],
                    self.__dict__["_modules"])
        except KeyError:
            raise NNError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                          "assigning parameters or modules") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Parameter | Module) or name in self.__dict__.get("_parameters", {}) \
                or name in self.__dict__.get("_buffers", {}) \
                or name in self.__dict__.get("_modules", {}):
            params, buffers, modules = self._dicts()
            if isinstance(value, Parameter):
                if name in buffers:
                    if value.requires_grad:
                        value.requires_grad = False
                    buffers[name] = value
                    return
                self.__dict__.pop(name, None)
                modules.pop(name, None)
                params[name] = value
            elif isinstance(value, Module):
                self.__dict__.pop(name, None)
                params.pop(name, None)
                buffers.pop(name, None)
                modules[name] = value
            elif name in params or name in buffers:
                store = params if name in params else buffers
                if value is None:
                    store[name] = None
                elif store[name] is None:
                    raise NNError(f"{name!r} is None; assign a Parameter to it")
                else:  # an array: the parameter's values
                    store[name].value = value
            elif value is None:
                modules[name] = None
            else:
                raise NNError(f"cannot assign {type(value).__name__} to module {name!r} "
                              "(a Module or None)")
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__.get(store, {}):
                del self.__dict__[store][name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or None) under ``name``."""
        self._dicts()[0][name] = param

    def register_buffer(self, name: str, value: Any) -> None:
        """Add a non-trainable tensor saved with the state dict (a
        :class:`Parameter` with ``requires_grad=False`` in the graph; an array or
        Parameter here)."""
        if value is not None and not isinstance(value, Parameter):
            value = Parameter(value, requires_grad=False)
        if value is not None:
            value.requires_grad = False
        self._dicts()[1][name] = value

    def add_module(self, name: str, module: Module | None) -> None:
        self._dicts()[2][name] = module

    # -- running ---------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not tracing():
            raise TraceError(f"{type(self).__name__} was called outside tracing: engine.nn "
                             "modules run only while nn.to_graph(module, inputs=...) traces "
                             "them (then compile the graph and run it in a VM)")
        tracer = current()
        label = tracer.state.module_names.get(id(self))
        label = f"{label or '<module>'} ({type(self).__name__})" if label != "" else \
            f"the model ({type(self).__name__})"
        tracer.module_stack.append(label)
        try:
            return self.forward(*args, **kwargs)
        finally:
            tracer.module_stack.pop()

    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout active, batch norm on batch statistics) for this module
        and its descendants; returns the module."""
        object.__setattr__(self, "training", bool(mode))
        for m in self.children():
            m.train(mode)
        return self

    def eval(self) -> Module:
        """``train(False)``."""
        return self.train(False)

    # -- traversal -------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._dicts()[2].items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "", remove_duplicate: bool = True,
                      _memo: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """This module and its descendants with their qualified names (this one's is
        ``prefix``, ``""`` by default)."""
        memo = set() if _memo is None else _memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name,
                                       remove_duplicate, memo)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def _named(self, store: int, prefix: str, recurse: bool, remove_duplicate: bool
               ) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix, remove_duplicate) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for name, p in m._dicts()[store].items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mprefix}.{name}" if mprefix else name), p

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Parameters with their qualified names (each shared one once)."""
        return self._named(0, prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Buffers (batch norm's running statistics) with their qualified names."""
        return self._named(1, prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def _state_items(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter and buffer under its state-dict name, in PyTorch's order (per
        module: parameters, then buffers, then the children's)."""
        for mprefix, m in self.named_modules(remove_duplicate=False):
            params, buffers, _ = m._dicts()
            for store in (params, buffers):
                for name, p in store.items():
                    if p is not None:
                        yield (f"{mprefix}.{name}" if mprefix else name), p

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Every parameter's and buffer's values (copies, float32 numpy arrays) by
        PyTorch's names; values not yet drawn are drawn now (:func:`manual_seed`).
        Batch norm's ``num_batches_tracked`` is not included."""
        return OrderedDict((k, p.value.copy()) for k, p in self._state_items())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True
                        ) -> IncompatibleKeys:
        """Set values from ``state_dict`` (numpy arrays, or anything ``np.asarray``
        reads: a PyTorch state dict's CPU tensors too).  With ``strict`` a missing or
        unexpected key, or any shape mismatch, is an :class:`NNError`; PyTorch's
        ``num_batches_tracked`` entries are accepted and ignored."""
        own = dict(self._state_items())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own
                      and k.rsplit(".", 1)[-1] not in IGNORED_KEYS]
        if strict and (missing or unexpected):
            raise NNError(f"load_state_dict({type(self).__name__}): missing keys {missing}, "
                          f"unexpected keys {unexpected}")
        bad = []
        for k, p in own.items():
            if k in state_dict:
                arr = _to_numpy(state_dict[k])
                if tuple(arr.shape) != p.shape:
                    bad.append(f"{k}: {tuple(arr.shape)} for {p.shape}")
        if bad:
            raise NNError(f"load_state_dict({type(self).__name__}): shapes differ: "
                          + "; ".join(bad))
        for k, p in own.items():
            if k in state_dict:
                p.value = _to_numpy(state_dict[k])
        return IncompatibleKeys(missing, unexpected)

    # -- printing --------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in
                 self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


class Sequential(Module):
    """Modules applied one after the other, named ``0``, ``1``, ... (or by the keys of an
    ordered dict); indexable, sliceable and iterable.

    >>> from engine import nn
    >>> s = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> len(s), type(s[1]).__name__, len(s[:2]), [k for k, _ in s.named_parameters()][2]
    (3, 'ReLU', 2, '2.weight')
    """

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, m in modules[0].items():
                self.add_module(str(name), m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._dicts()[2])

    def __iter__(self) -> Iterator[Module]:
        return iter(self._dicts()[2].values())

    def __getitem__(self, idx: int | slice) -> Any:
        mods = list(self._dicts()[2].items())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(mods[idx]))
        return mods[idx][1]

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class ModuleList(Module):
    """A list of modules, named ``0``, ``1``, ...; the model's ``forward`` decides how to
    use them.

    >>> from engine import nn
    >>> ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    >>> len(ml), [k for k, _ in ml.named_parameters()][-1]
    (3, '2.bias')
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        for m in modules or ():
            self.append(m)

    def __len__(self) -> int:
        return len(self._dicts()[2])

    def __iter__(self) -> Iterator[Module]:
        return iter(self._dicts()[2].values())

    def __getitem__(self, idx: int | slice) -> Any:
        mods = list(self._dicts()[2].values())
        if isinstance(idx, slice):
            return ModuleList(mods[idx])
        return mods[idx]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ModuleList has no forward: iterate over it in yours")
