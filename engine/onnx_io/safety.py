"""Loading an ONNX model without trusting it.

- **External data** (tensors stored beside the model) is read by this module, not by
  the onnx package: a location must be a relative path that stays inside the model's
  folder after ``..`` and symbolic links are resolved, name a regular file, and hold
  the bytes the tensor's shape and element type call for (an ``offset``/``length``
  pair inside the file).
- **Sizes** are checked before anything is allocated: a tensor (initializer, Constant
  or graph input) with a negative dimension or more than ``MAX_TENSOR_ELEMENTS`` (2^30)
  elements, or whose stored data does not match its shape, is an error naming it; so
  are an ``offset`` or ``length`` that is not a number and a location with a NUL byte.
- **Structure**: ``onnx.checker`` rejects cycles, inputs nothing produces and
  malformed nodes; its message is passed on.  Operators of domains other than the
  default one are refused by the importer, all named.

>>> import onnx
>>> from onnx import TensorProto, helper
>>> t = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
>>> t.data_location = TensorProto.EXTERNAL
>>> del t.float_data[:]
>>> _ = t.external_data.add(key="location", value="../../etc/passwd")
>>> try:
...     load_external(t, "/models/m")
... except Exception as e:
...     print(e)
tensor 'w': external data location '../../etc/passwd' leaves the model's folder
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from engine.errors import GraphError

# One tensor of a model (an initializer, a Constant, a generated weight, an input's
# row): 2^30 elements, 4 GiB of float32.  The largest single weights of the models this
# engine runs are a few hundred million elements (VGG's first dense layer, 103 M); an
# engine-wide 2^34 (64 GiB of float32) would let an input [N, 2^34] import and compile
# to a 137 GB program.  Whole programs are also held to the machine's memory by the
# compiler (engine.compile.compiler.check_fits_machine).
MAX_TENSOR_ELEMENTS = 1 << 30
# A folded constant is materialised by ONNX's reference evaluator (numpy, no streaming):
# 64 Mi elements or 256 MiB, whichever is smaller, is far above any shape computation
# or generated weight a real model folds, and far below what a machine holds
# (engine.onnx_io.fold).
MAX_FOLD_ELEMENTS = 1 << 26
MAX_FOLD_BYTES = 1 << 28


def load_model(model: Any) -> Any:
    """An ``onnx.ModelProto`` from a path or a proto, with its external data read
    safely and every tensor's size checked (a :class:`GraphError` otherwise)."""
    import onnx

    base = None
    if not isinstance(model, onnx.ModelProto):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise GraphError(f"{path}: " + ("a folder, not an ONNX file" if os.path.isdir(path)
                                            else "no such ONNX file"))
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as e:  # protobuf's DecodeError and friends
            raise GraphError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from None
        base = os.path.dirname(os.path.abspath(path))
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if base is None:
                raise GraphError(f"tensor {tensor.name!r} keeps its data in an external file; "
                                 "load the model from its path so the file can be found")
            load_external(tensor, base)
        check_tensor(tensor)
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        static = [d.dim_value for d in dims if d.HasField("dim_value")]
        if any(d < 0 for d in static) or math.prod(static) > MAX_TENSOR_ELEMENTS:
            raise GraphError(f"input {vi.name!r}: shape {static} is not a tensor this engine "
                             f"can hold (at most {MAX_TENSOR_ELEMENTS:,} elements)")
    return model


def subgraphs(node: Any) -> list[Any]:
    """The graphs a node carries in its attributes (a Loop's body, an If's branches)."""
    from onnx import AttributeProto

    out = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _tensors(graph: Any) -> list[Any]:
    """Initializers and Constant values, in subgraphs too."""
    from onnx import AttributeProto

    out = list(graph.initializer)
    for node in graph.node:
        out.extend(a.t for a in node.attribute if a.type == AttributeProto.TENSOR)
        for g in subgraphs(node):
            out.extend(_tensors(g))
    return out


def expected_bytes(tensor: Any) -> int:
    """Bytes a tensor's raw data must have, from its shape and element type; raises for
    a negative or absurd shape before anything is read or allocated."""
    from onnx import helper

    dims = list(tensor.dims)
    n = math.prod(dims)
    if any(d < 0 for d in dims) or n > MAX_TENSOR_ELEMENTS:
        raise GraphError(f"tensor {tensor.name!r}: shape {dims} is not a tensor this engine "
                         f"can hold (at most {MAX_TENSOR_ELEMENTS:,} elements)")
    try:
        item = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        raise GraphError(f"tensor {tensor.name!r}: element type {tensor.data_type} is not "
                         "known") from None
    return n * item


def check_tensor(tensor: Any) -> None:
    """The stored data matches the shape (raw bytes, or the typed field's count)."""
    want = expected_bytes(tensor)
    if tensor.HasField("raw_data") or tensor.raw_data:
        if len(tensor.raw_data) != want:
            raise GraphError(f"tensor {tensor.name!r}: shape {list(tensor.dims)} needs {want:,} "
                             f"bytes, its data has {len(tensor.raw_data):,}")
        return
    fields = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data",
              "string_data")
    count = max(len(getattr(tensor, f)) for f in fields)
    n = math.prod(tensor.dims)
    if count not in (0, n) or (count == 0 and n and tensor.data_type != 8):
        raise GraphError(f"tensor {tensor.name!r}: shape {list(tensor.dims)} has {n:,} "
                         f"elements, its data {count:,}")


def load_external(tensor: Any, base: str) -> None:
    """Read a tensor's external data into it, after checking where it comes from."""
    from onnx import TensorProto

    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if "\0" in location:
        raise GraphError(f"tensor {tensor.name!r}: external data location {location!r} has "
                         "a NUL byte")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or \
            (len(location) > 1 and location[1] == ":"):
        raise GraphError(f"tensor {tensor.name!r}: external data location {location!r} must "
                         "be a path relative to the model's folder")
    root = os.path.realpath(base)
    target = os.path.realpath(os.path.join(root, location))  # symbolic links resolved
    if os.path.commonpath([root, target]) != root:
        what = "leaves" if ".." in location.replace("\\", "/").split("/") else \
            "resolves (through a symbolic link) outside"
        raise GraphError(f"tensor {tensor.name!r}: external data location {location!r} "
                         f"{what} the model's folder")
    if not os.path.isfile(target):
        raise GraphError(f"tensor {tensor.name!r}: external data file {location!r} is missing "
                         "or not a regular file")
    want = expected_bytes(tensor)
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info.get("length", want) or want)
    except ValueError:
        raise GraphError(f"tensor {tensor.name!r}: external data offset "
                         f"{info.get('offset')!r} or length {info.get('length')!r} is not a "
                         "number") from None
    size = os.path.getsize(target)
    if offset < 0 or length != want or offset + length > size:
        raise GraphError(f"tensor {tensor.name!r}: external data ({location!r}, offset "
                         f"{offset}, length {length}) does not hold the {want:,} bytes of "
                         f"shape {list(tensor.dims)} (the file has {size:,})")
    with open(target, "rb") as f:
        f.seek(offset)
        tensor.raw_data = f.read(length)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
