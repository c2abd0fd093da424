"""What the graph-optimisation passes share: who reads a value, renaming values,
and the values of compile-time constants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from engine.compile.passes.ir import IR
from engine.runtime.initializers import initial_values

DETERMINISTIC_INITS = frozenset({"zeros", "ones", "constant", "values"})


def readers(ir: IR) -> Counter[str]:
    """How many forward input slots, over all paths, read each value."""
    return Counter(chain.from_iterable(
        map(attrgetter("inputs"), chain.from_iterable(p.forward for p in ir.paths))))


def resolve(mapping: Mapping[str, str], name: str) -> str:
    """Follow ``mapping`` (value -> the value that replaces it) to its end."""
    while name in mapping:
        name = mapping[name]
    return name


def rename(ir: IR, mapping: Mapping[str, str]) -> None:
    """Make every reader of a replaced value read its replacement instead."""
    if not mapping:
        return
    for path in ir.paths:
        for node in path.forward:
            if not mapping.keys().isdisjoint(node.inputs):
                node.inputs = tuple(resolve(mapping, x) for x in node.inputs)
        if path.loss is not None:
            path.loss = resolve(mapping, path.loss)


def is_constant(ir: IR, name: str) -> bool:
    """A frozen parameter whose values are known before anything runs."""
    p = ir.params.get(name)
    return p is not None and not p.trainable and not p.written and \
        p.init.method in DETERMINISTIC_INITS


def constant_scalar(ir: IR, name: str) -> float | None:
    """The single value every element of constant ``name`` holds, if there is one."""
    if not is_constant(ir, name):
        return None
    init = ir.params[name].init
    if init.method == "zeros":
        return 0.0
    if init.method == "ones":
        return 1.0
    if init.method == "constant":
        return init.value
    if init.array is not None:
        a = init.array
        return float(a[0]) if a.size and bool((a == a[0]).all()) else None
    values = init.values or ()
    return values[0] if values and all(v == values[0] for v in values) else None


def constant_array(ir: IR, name: str) -> np.ndarray[Any, Any]:
    """The host values of constant ``name``."""
    d = ir.descs[name]
    return initial_values(ir.params[name].init, d.shape, np.dtype(d.dtype.value),
                          np.random.default_rng(0))
