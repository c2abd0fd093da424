"""Conv's forward variants beyond im2col: one module each, registered by name.

Each module here defines ``VARIANT`` (a :class:`~engine.ops._base.Variant`); its module
name is the variant's name, the value of Conv's ``algorithm`` attribute.  They are found
when :mod:`engine.ops` loads (after :mod:`engine.ops.conv`, whose helpers they use), so
adding one is adding a module (and its test): nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil

from engine.ops._base import Variant


def register(into: dict[str, Variant]) -> None:
    """Adds every module's ``VARIANT`` to ``into`` (Conv's variants), by module name."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if info.name in into:
            raise RuntimeError(f"Conv variant {info.name} is defined twice")
        into[info.name] = module.VARIANT
