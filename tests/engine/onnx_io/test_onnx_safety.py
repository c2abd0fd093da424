"""Loading untrusted ONNX models: external data stays inside the model's folder, sizes
are checked before anything is allocated, broken graphs get clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import VM, GraphError, compile_graph
from engine.onnx_io import import_onnx


def model(weight: TensorProto, *, nodes: list | None = None,
          inputs: list | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    graph = helper.make_graph(nodes or [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              inputs or [x], [y], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bare(name: str, shape: list[int]) -> TensorProto:
    """A float tensor header with no data (make_tensor would check the count)."""
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(shape)
    return t


def external(name: str, shape: tuple[int, ...], location: str, **info: int) -> TensorProto:
    t = bare(name, list(shape))
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    for k, v in info.items():
        t.external_data.add(key=k, value=str(v))
    return t


def save(tmp: Path, m: onnx.ModelProto, name: str = "m.onnx") -> Path:
    path = tmp / name
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16 + w.tobytes())
    path = save(tmp_path, model(external("w", (3, 2), "weights.bin", offset=16, length=24)))
    g = import_onnx(path, freeze=True)
    vm = VM(compile_graph(g, batch_size=1))
    vm.set("x", np.ones((1, 3), np.float32))
    vm.forward("infer")
    assert vm.get("y").tolist() == [[6.0, 9.0]]


@pytest.mark.parametrize("location, message", [
    ("../secret.bin", "leaves the model's folder"),
    ("sub/../../secret.bin", "leaves the model's folder"),
    ("/etc/passwd", "must be a path relative"),
    ("", "must be a path relative"),
    ("missing.bin", "missing or not a regular file"),
])
def test_bad_external_locations_are_refused(tmp_path: Path, location: str, message: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    folder = tmp_path / "model"
    folder.mkdir()
    path = save(folder, model(external("w", (3, 2), location)))
    with pytest.raises(GraphError, match=message):
        import_onnx(path)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_symbolic_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").symlink_to(tmp_path / "secret.bin")
    path = save(folder, model(external("w", (3, 2), "w.bin")))
    with pytest.raises(GraphError, match="symbolic link"):
        import_onnx(path)


def test_external_data_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 20)
    path = save(tmp_path, model(external("w", (3, 2), "w.bin")))
    with pytest.raises(GraphError, match="does not hold the 24 bytes"):
        import_onnx(path)


def test_external_data_needs_the_models_path() -> None:
    with pytest.raises(GraphError, match="load the model from its path"):
        import_onnx(model(external("w", (3, 2), "w.bin")))


def test_absurd_dimensions_are_errors_not_allocations(tmp_path: Path) -> None:
    huge = bare("w", [1 << 20, 1 << 20])
    with pytest.raises(GraphError, match="is not a tensor this engine can hold"):
        import_onnx(model(huge))
    lying = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
    lying.dims[:] = [3, 4]  # 24 bytes of data for 48
    with pytest.raises(GraphError, match="needs 48 bytes, its data has 24"):
        import_onnx(model(lying))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1 << 40])
    w = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
    with pytest.raises(GraphError, match="input 'x'"):
        import_onnx(model(w, inputs=[x]))
    m = model(w, nodes=[helper.make_node("ConstantOfShape", ["s"], ["big"]),
                        helper.make_node("Add", ["x", "big"], ["z"]),
                        helper.make_node("MatMul", ["z", "w"], ["y"])])
    m.graph.initializer.append(numpy_helper.from_array(np.array([1 << 30, 1 << 30]), "s"))
    with pytest.raises(GraphError, match="ConstantOfShape"):
        import_onnx(m)


def test_cycles_and_dangling_inputs_are_clear_errors() -> None:
    w = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
    dangling = [helper.make_node("MatMul", ["x", "nowhere"], ["y"])]
    with pytest.raises(GraphError, match="nowhere"):
        import_onnx(model(w, nodes=dangling))
    cycle = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["a", "w"], ["y"])]
    with pytest.raises(GraphError, match="not a valid ONNX model"):
        import_onnx(model(w, nodes=cycle))


def test_other_domains_are_refused_by_name() -> None:
    w = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
    m = model(w, nodes=[helper.make_node("FusedMatMul", ["x", "w"], ["y"],
                                         domain="com.microsoft")])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(GraphError, match=r"com\.microsoft"):
        import_onnx(m)


def test_garbage_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x08\x07 definitely not protobuf \xff\xfe")
    with pytest.raises(GraphError, match=r"junk\.onnx"):
        import_onnx(path)
