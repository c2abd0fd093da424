"""Storages by URL scheme: ``open_storage("sqlite:///x.db")``.

Add one with a module that subclasses :class:`BaseStorage` and registers it under its
URL scheme (``@register("scheme")``); ``--storage scheme://...`` opens through it as
soon as the module is imported (the built-in ones are imported here).  A scheme no
plugin claims (``postgresql``, ``mysql``) goes to Optuna unchanged.
:func:`connect` checks a URL before it opens it (:class:`StorageError` says what is
wrong); the CLI, :func:`explore.run` and :func:`explore.load_model` open storages
through it.

>>> open_storage("postgresql://host/db"), scheme("sqlite+pysqlite:///x.db")
('postgresql://host/db', 'sqlite')
"""

from explore.registry import import_plugins
from explore.storages import _journal, _sqlite  # noqa: F401  (registers them)
from explore.storages._base import (
    STORAGES,
    BaseStorage,
    get,
    open_storage,
    register,
    relational,
    release,
    scheme,
    sqlite_file,
)
from explore.storages._check import StorageError, check, connect
from explore.storages._sqlite import Sqlite
from explore.storages.errors import explain

names = STORAGES.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = [
    "STORAGES",
    "BaseStorage",
    "Sqlite",
    "StorageError",
    "check",
    "connect",
    "explain",
    "get",
    "names",
    "open_storage",
    "register",
    "relational",
    "release",
    "scheme",
    "sqlite_file",
]
