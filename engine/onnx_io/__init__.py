"""ONNX export and import of CalcGraphs (``onnx`` is imported only when used).

>>> from engine.onnx_io import export_onnx, import_onnx
"""

from engine.onnx_io.export import export_onnx
from engine.onnx_io.importer import import_onnx

__all__ = ["export_onnx", "import_onnx"]
