"""What a storage is, and the registry of storages by URL scheme.

The study is kept where ``--storage URL`` says (default: a SQLite file next to the
space).  A storage plugin, registered under a URL scheme (``sqlite`` for
``sqlite:///...``, the part before ``:`` and any ``+driver``), opens the Optuna
storage for such a URL; a URL of a scheme no plugin claims goes to Optuna as it is.
Storages are opened in the scheduler's process and by the CLI; only the writer thread
(:class:`explore.live.LiveStudy`) writes to them during a run.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.exc import DBAPIError, IntegrityError

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


SCHEMA_ATTEMPTS = 6  # tries at opening a relational storage whose schema others create


def _schema_race(e: Exception) -> bool:
    """Whether ``e``, raised while Optuna created its tables, is another process
    creating them at the same moment: a duplicate (a table, a type, an index, the
    version row) or a deadlock between the two."""
    if isinstance(e, IntegrityError):
        return True
    text = str(getattr(e, "orig", None) or e).lower()
    return isinstance(e, DBAPIError) and ("already exists" in text or "deadlock" in text)


def relational(url: str, engine_kwargs: dict[str, Any] | None = None
               ) -> optuna.storages.RDBStorage:
    """Optuna's relational storage of ``url``, created safely when other processes open
    the same new database at the same moment (two ``explore run`` started together, the
    workers of a distributed search).

    Optuna creates its schema when it opens a storage: it looks for each table, creates
    the missing ones, then writes the version row and stamps alembic's revision.  Two
    processes doing that at once on an empty database both find nothing and both create:
    the slower one fails (PostgreSQL: a duplicate key in ``pg_type``, or "relation
    already exists"; SQLite: "table ... already exists", each CREATE TABLE committing on
    its own; a duplicate alembic revision).  Every statement of that schema is "create
    if missing", so opening again, after a short random pause, finds what the other
    created and completes it; a different error, or the same one
    :data:`SCHEMA_ATTEMPTS` times, is raised.
    """
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except DBAPIError as e:
            if attempt == SCHEMA_ATTEMPTS or not _schema_race(e):
                raise
            time.sleep(random.uniform(0.02, 0.1) * attempt)
    raise AssertionError("unreachable")


def release(storage: object) -> None:
    """Close what a storage opened for one read holds (its session and pooled
    connections).  A SQLite connection left open in a process that reads a study
    again and again (a notebook, a monitor) keeps the file's shared-memory index of the
    moment; once a writer elsewhere has checkpointed and removed the write-ahead log,
    that process's new connections read a "malformed" image."""
    inner = getattr(storage, "_backend", storage)  # Optuna's cached wrapper
    remove = getattr(inner, "remove_session", None)
    if remove is not None:
        remove()
    engine = getattr(inner, "engine", None)
    if engine is not None:
        engine.dispose()
