"""Compiler passes: each a small function IR -> IR (or IR -> plan)."""

from engine.compile.passes.ir import IR, IRNode, IRPath
from engine.compile.passes.shapes import infer_shapes, typecheck
from engine.compile.passes.validate import validate

__all__ = ["IR", "IRNode", "IRPath", "infer_shapes", "typecheck", "validate"]
