"""What a storage is, and the registry of storages by URL scheme.

The study is kept where ``--storage URL`` says (default: a SQLite file next to the
space).  A storage plugin, registered under a URL scheme (``sqlite`` for
``sqlite:///...``, the part before ``:`` and any ``+driver``), opens the Optuna
storage for such a URL; a URL of a scheme no plugin claims goes to Optuna as it is.
Storages are opened in the scheduler's process and by the CLI; only the writer thread
(:class:`explore.study.StudyWriter`) writes to them during a run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import optuna

from explore.registry import Registry


class BaseStorage(ABC):
    """A storage for the URLs of one scheme."""

    @abstractmethod
    def create(self, url: str) -> optuna.storages.BaseStorage | str:
        """The Optuna storage of ``url`` (or a URL Optuna opens itself)."""

    def check(self, url: str, write: bool) -> None:
        """Raise :class:`~explore.storages.StorageError` if ``url`` cannot be opened
        (for writing, with ``write``; without it nothing may be created)."""
        return  # optional: most schemes are checked by connecting


STORAGES: Registry[BaseStorage] = Registry("storage")
register = STORAGES.register
get = STORAGES.get


def scheme(url: str) -> str:
    """``sqlite`` for ``sqlite:///x.db`` and ``sqlite+pysqlite:///x.db``."""
    return url.split(":", 1)[0].split("+", 1)[0].lower()


def open_storage(url: str) -> optuna.storages.BaseStorage | str:
    """The storage of ``url``: by the plugin registered for its scheme, else ``url``
    itself, for Optuna to open."""
    s = scheme(url)
    return STORAGES.get(s).create(url) if s in STORAGES else url


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite storage URL; None for another storage or an
    in-memory database.

    >>> sqlite_file("sqlite:////tmp/x.db"), sqlite_file("sqlite+pysqlite:///x.db?timeout=5")
    (PosixPath('/tmp/x.db'), PosixPath('x.db'))
    >>> sqlite_file("sqlite:///:memory:"), sqlite_file("postgresql://host/db")
    (None, None)
    """
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme.split("+", 1)[0].lower() != "sqlite":
        return None
    name = rest.split("?", 1)[0]
    return None if name in ("", ":memory:") else Path(name)
