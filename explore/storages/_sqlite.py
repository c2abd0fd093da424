"""SQLite with write-ahead logging and normal sync; an in-memory SQLite URL
(``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``) is Optuna's in-memory storage.

Once the database exists, a connection never creates it: SQLAlchemy opens a new
connection whenever two threads call at once or one failed, and had the file been
deleted meanwhile, SQLite would make an empty database at the path, which takes the
deleted one's write-ahead log as its own (see :mod:`explore.storages.files`).

>>> type(Sqlite().create("sqlite:///:memory:")).__name__
'InMemoryStorage'
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import optuna
from sqlalchemy import event

from explore.storages._base import BaseStorage, register, relational, sqlite_file


@register("sqlite")
class Sqlite(BaseStorage):
    """A trial's report is a transaction, and a full fsync for each cost seconds over a
    search of tiny models (a power cut may lose the last few; a crash loses none)."""

    def create(self, url: str) -> optuna.storages.BaseStorage | str:
        if sqlite_file(url) is None:  # in memory: every SQLAlchemy connection would get a
            return optuna.storages.InMemoryStorage()  # database of its own

        storage = relational(url)  # two processes may create the file's tables at once

        def pragmas(conn: Any, record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        event.listen(storage.engine, "do_connect", _existing_only)
        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()  # connections made from now on get the pragmas
        return storage


def _existing_only(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]
                   ) -> None:
    """Open the database file read-write but never create it (SQLite's ``mode=rw``): a
    connection to a database deleted under the run fails with "unable to open database
    file" instead.  A URL that is already a SQLite URI keeps its own mode."""
    name = str(cargs[0]) if cargs else ""
    if name and not name.startswith("file:") and not cparams.get("uri"):
        cargs[0] = f"file:{quote(name)}?mode=rw"
        cparams["uri"] = True
