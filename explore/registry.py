"""A registry of named implementations: one per plugin kind (samplers, pruners,
storages, datasets, model families, optimizers, metrics).

A plugin module defines a subclass of its kind's base and registers it by name; the
search-space schema accepts exactly the registered names (:meth:`Registry.check`), so
the schema, the builders and the documentation read the same list.  Implementations
are stateless: one instance each, made at registration, shared by every caller.

>>> class Greeter:
...     pass
>>> greeters: Registry[Greeter] = Registry("greeter")
>>> @greeters.register("hello")
... class Hello(Greeter):
...     pass
>>> type(greeters.get("hello")).__name__, greeters.names()
('Hello', ('hello',))
>>> greeters.get("bye")
Traceback (most recent call last):
...
LookupError: unknown greeter 'bye'; available: hello
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Generic[T]):
    """Name -> implementation of one plugin kind, in registration order.  ``error`` is
    the exception :meth:`get` raises for an unknown name (its message lists the
    available names)."""

    def __init__(self, kind: str, error: type[Exception] = LookupError) -> None:
        self.kind = kind
        self.error = error
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: register one instance of the class under ``name``."""

        def add(cls: C) -> C:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered "
                                 f"({type(self._items[name]).__qualname__})")
            self._items[name] = cls()
            return cls

        return add

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests that register a throwaway implementation)."""
        del self._items[name]

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.kind} {name!r}; available: "
                             f"{', '.join(self._items)}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._items.items()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._items

    def check(self, value: Any) -> str:
        """``value`` if it is a registered name, else a ValueError worded as pydantic's
        for a ``Literal`` of the names (the schema's message before the registries)."""
        if value in self:
            return str(value)
        quoted = [repr(n) for n in self._items]
        listed = quoted[0] if len(quoted) == 1 else \
            f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise ValueError(f"Input should be {listed}")


def import_plugins(package: str, path: Iterable[str]) -> list[str]:
    """Import every private module (``_name.py``, not ``_base``) of a plugin package that
    is not imported yet, in name order, so that a new implementation registers by being
    there: adding one touches one new module.  The package's ``__init__`` imports its
    built-in ones first, which fixes the order error messages list them in.  Returns the
    modules imported here.

    >>> import explore.samplers
    >>> import_plugins("explore.samplers", explore.samplers.__path__)  # all imported already
    []
    """
    found = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        name = f"{package}.{info.name}"
        if info.name.startswith("_") and info.name != "_base" and name not in sys.modules:
            importlib.import_module(name)
            found.append(name)
    return found
