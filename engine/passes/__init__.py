"""Compiler passes: each a small function IR -> IR (or IR -> plan)."""

from engine.passes.ir import IR, IRNode, IRPath
from engine.passes.shapes import infer_shapes, typecheck
from engine.passes.validate import validate

__all__ = ["IR", "IRNode", "IRPath", "infer_shapes", "typecheck", "validate"]
