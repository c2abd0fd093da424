"""SQLite with write-ahead logging and normal sync; an in-memory SQLite URL
(``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``) is Optuna's in-memory storage.

>>> type(Sqlite().create("sqlite:///:memory:")).__name__
'InMemoryStorage'
"""

from __future__ import annotations

from typing import Any

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

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()  # connections made from now on get the pragmas
        return storage
