"""Running ONNX's own node tests (``onnx.backend.test``) on this engine.

Each case is one small model with its inputs and expected outputs.  A case is run when
every node's operator is one this engine claims (:data:`CLAIMED`); it is skipped, with
the reason, when an operator is not claimed, a tensor's element type is not one the
engine has, or the import refuses a form of an operator by name
(:class:`~engine.errors.UnsupportedForm`: ``Resize``'s linear mode, say).  Inputs
that ONNX passes where this engine takes attributes (a Reshape's
shape, ReduceSum's axes, a Dropout's ratio) are imported as the constants they are in
the case.  Shapes are the case's, exactly: no batch dimension.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import UnsupportedForm, ZeroSizeError
from engine.onnx_io.importer import DTYPES, FORMS, IMPORTED

# Operators whose every node test must pass.  Not yet claimed, with the reason:
NOT_CLAIMED: dict[str, str] = {
}
CLAIMED = IMPORTED - set(NOT_CLAIMED)
# ONNX inputs that are attributes here (OnnxForm.attr_inputs), by operator
ATTRIBUTE_INPUTS = {name: form.attr_inputs for name, (_, form) in FORMS.items()
                    if form.attr_inputs}


@dataclass
class Outcome:
    name: str
    operators: tuple[str, ...]
    status: str  # passed, failed, skipped
    reason: str = ""


def node_cases() -> list[Any]:
    """Every node test case ONNX ships (1,884 in onnx 1.23): each of ONNX's case
    modules is imported, which computes its expected outputs (about 10 s, most of it
    the pooling operators' reference loops)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():  # the case generators divide by zero on purpose
        warnings.simplefilter("ignore")
        return list(load_model_tests(kind="node"))


def case_modules() -> list[str]:
    """The names of ONNX's node case modules (mostly one per operator), listed without
    importing any, so that a test can be one module's cases, made when it runs."""
    import pkgutil

    import onnx.backend.test.case.node as node

    return sorted(m.name for m in pkgutil.iter_modules(node.__path__))


_MODULE_CASES: dict[str, list[Any]] = {}


def module_cases(name: str) -> list[Any]:
    """The node test cases of ONNX's case module ``name`` (:func:`case_modules`): the
    module is imported, its exporters computing the expected outputs; once a process.

    >>> [c.name for c in module_cases("relu")]
    ['test_relu', 'test_relu_expanded_ver18']
    """
    if name not in _MODULE_CASES:
        import importlib
        import sys

        from onnx.backend.test.case import node

        full = f"{node.__name__}.{name}"
        if full in sys.modules:  # its cases are among the others, no longer told apart
            raise RuntimeError(f"{full} was imported before: its cases cannot be told "
                               f"from the other modules' (use node_cases)")
        before = len(node._NodeTestCases)
        with warnings.catch_warnings():  # the case generators divide by zero on purpose
            warnings.simplefilter("ignore")
            importlib.import_module(full)
        _MODULE_CASES[name] = list(node._NodeTestCases[before:])
    return _MODULE_CASES[name]


def shape_inputs(model: Any) -> set[str]:
    """The graph inputs that only feed what this engine takes as attributes (a
    Reshape's shape, a Slice's starts, ...), directly or through the computation of
    those (Shape reads only its input's shape: the walk stops there).  The runner
    passes them as the constants they are in the case."""
    need = {n.input[k] for n in model.graph.node
            for k in ATTRIBUTE_INPUTS.get(n.op_type, ()) if k < len(n.input) and n.input[k]}
    for node in reversed(model.graph.node):
        if node.op_type != "Shape" and any(o in need for o in node.output):
            need.update(i for i in node.input if i)
    return need & {i.name for i in model.graph.input}


def _array(a: Any) -> Any:
    """A case's value as numpy: scalars and TensorProtos (how the cases of element types
    numpy lacks, such as float8, are given) are converted; sequences stay as they are."""
    from onnx import TensorProto, numpy_helper

    if isinstance(a, np.generic):
        return np.asarray(a)
    if isinstance(a, TensorProto):
        return numpy_helper.to_array(a)
    return a


def run_case(case: Any) -> Outcome:
    """Import, compile and run one node test; compare with its expected outputs."""
    from engine import VM, compile_graph
    from engine.onnx_io.importer import import_onnx

    model = case.model
    ops = tuple(sorted({n.op_type for n in model.graph.node}))
    missing = [o for o in ops if o not in CLAIMED]
    if missing:
        why = "; ".join(f"{o}: {NOT_CLAIMED.get(o, 'not supported')}" for o in missing)
        return Outcome(case.name, ops, "skipped", why)
    inputs, expected = case.data_sets[0]
    inputs = [_array(a) for a in inputs]
    expected = [_array(a) for a in expected]
    names = [vi.name for vi in model.graph.input]
    feeds = dict(zip(names, inputs, strict=False))
    if not all(isinstance(a, np.ndarray) for a in [*inputs, *expected]):
        return Outcome(case.name, ops, "skipped", "sequence or optional values")
    odd = [str(a.dtype) for a in [*inputs, *expected] if str(a.dtype) not in DTYPES.values()]
    if odd:
        return Outcome(case.name, ops, "skipped", f"element type(s) not supported: {odd}")
    constants = {k: feeds.pop(k) for k in shape_inputs(model) if k in feeds}
    training = [n.input[2] for n in model.graph.node
                if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]]
    if any(bool(np.asarray(constants.get(t, False)).any()) for t in training):
        return Outcome(case.name, ops, "skipped", "training-mode Dropout draws a random mask: "
                       "no generator can match the reference's")
    if any(0 in a.shape for a in [*feeds.values(), *expected]):
        return Outcome(case.name, ops, "skipped", "a zero-size dimension (0 marks the batch)")
    try:
        g = import_onnx(model, batch=False, constants=constants)
        vm = VM(compile_graph(g, batch_size=1))
        for k, v in feeds.items():
            vm.set(k, v, check=False)  # a case may feed NaN or infinity on purpose
        vm.forward("infer")
        got = [vm.get(o.name) for o in model.graph.output]
    except ZeroSizeError as e:
        return Outcome(case.name, ops, "skipped", f"a zero-size dimension inside: {e}")
    except UnsupportedForm as e:  # a form of a claimed operator the engine refuses, by name
        return Outcome(case.name, ops, "skipped", f"a form not supported: {e}")
    except Exception as e:  # a claimed operator must not fail: report it as a failure
        return Outcome(case.name, ops, "failed", f"{type(e).__name__}: {e}")
    for o, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want.shape != have.shape:
            return Outcome(case.name, ops, "failed",
                           f"output {o}: shape {have.shape}, expected {want.shape}")
        if not np.allclose(have, want, rtol=case.rtol, atol=case.atol, equal_nan=True):
            err = float(np.max(np.abs(have.astype(np.float64) - want)))
            return Outcome(case.name, ops, "failed", f"output {o}: max abs error {err:.3g}")
    return Outcome(case.name, ops, "passed")
