"""Storage URLs checked before use, and opened: the one place that says what is wrong
with ``--storage`` (not a URL, an unknown scheme, a driver not installed, a SQLite file
in a folder that is missing or read-only, a server that does not answer).

:func:`connect` checks a URL and opens its storage, raising :class:`StorageError` (the
CLI's exit status 2) with the reason and what to do.  ``write=False`` (the commands that
only read a study: show, export, export-model, evaluate, :func:`explore.load_model`)
creates nothing: a SQLite file must already exist and hold Optuna's tables, and it is
opened without the write-ahead-log pragma (which would convert a file in another
journal mode).

>>> try:
...     check("garbage", write=True)
... except StorageError as e:
...     print(str(e)[:34])
storage 'garbage' is not a URL: wr
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from explore.storages._base import STORAGES, relational, scheme
from explore.storages.errors import MISSING_DATABASE, StorageError, explain

CONNECT_TIMEOUT = 10  # seconds a database server has to answer
# A driver stopped inside a transaction (a suspended laptop, a paused VM, SIGSTOP) would
# hold its row locks for as long as it stays stopped, and every other driver's write to
# those trials would wait as long; the server ends such a session after a minute (the
# default grace: the driver's trials are stale by then anyway), and probes a client's
# connection that went silent, so a vanished machine's locks go too.
POSTGRES_OPTIONS = ("-c idle_in_transaction_session_timeout=60s "
                    "-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 "
                    "-c tcp_keepalives_count=3")
EXAMPLE = ("sqlite:///path/to/study.db, journal:///path/to/study.log or "
           "postgresql+psycopg://user@host/db")
# What to install for a scheme's driver.
DRIVER_HINTS = {
    "postgresql": 'pip install -e ".[postgres]" (psycopg 3), and write the URL as '
                  "postgresql+psycopg://user@host/db",
    "mysql": "pip install pymysql, and write the URL as mysql+pymysql://user@host/db",
}


def _shown(url: Any) -> str:
    """The URL as messages show it, its password hidden."""
    try:
        return str(url.render_as_string(hide_password=True))
    except AttributeError:
        return str(url)


def check(url: str, *, write: bool) -> None:
    """Raise :class:`StorageError` if ``url`` cannot be opened (for writing, with
    ``write``); a SQLite file that a read needs and that is not there is a
    :class:`FileNotFoundError`.  Connects to no server (:func:`connect` does)."""
    text = url.strip()
    if not text:
        raise StorageError(f"storage is empty: give a URL such as {EXAMPLE}")
    if "\0" in text or "%00" in text:
        raise StorageError(f"storage {url!r} holds a null byte (%00), which no file or "
                           "server name can")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise StorageError(f"storage {url!r} holds a control character: the file it made "
                           "would be named so, and no command shown could name it again")
    if text != url:
        raise StorageError(f"storage {url!r} begins or ends with a space: the file would be "
                           "named with it; remove it (quote a path that has one inside)")
    if "://" not in text:
        raise StorageError(f"storage {url!r} is not a URL: write one such as {EXAMPLE}")
    s = scheme(text)
    if s in STORAGES and s != "sqlite":
        STORAGES.get(s).check(text, write)  # a plugin's URL: the plugin says what is wrong
        return
    try:
        u = make_url(text)
    except ArgumentError:
        raise StorageError(f"storage {url!r} is not a URL: write one such as "
                           f"{EXAMPLE}") from None
    try:
        dialect = u.get_dialect()
    except NoSuchModuleError:
        known = ", ".join(sorted({*STORAGES.names(), "postgresql", "mysql"}))
        raise StorageError(f"storage {_shown(u)}: unknown scheme {u.drivername!r} "
                           f"(known: {known})") from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        hint = DRIVER_HINTS.get(s, f"install the Python driver of {u.drivername}")
        raise StorageError(f"storage {_shown(u)}: its driver is not installed ({e}); "
                           f"{hint}") from None
    if s == "sqlite":
        _check_query(u.query, _shown(u))
        _check_sqlite(u.database, _shown(u), write)


# What SQLite's driver takes after ``?`` (SQLAlchemy passes these on, ignores others).
SQLITE_OPTIONS = ("timeout", "isolation_level", "detect_types", "check_same_thread",
                  "cached_statements", "uri")


def _check_query(query: Any, shown: str) -> None:
    """``?timeout=abc`` is a float() error deep in SQLAlchemy, and ``?mode=ro`` is
    ignored with a warning (the run would write): both refused here."""
    for k, v in query.items():
        if k not in SQLITE_OPTIONS:
            raise StorageError(f"storage {shown}: SQLite takes no option {k!r} (it would "
                               f"be ignored); options: {', '.join(SQLITE_OPTIONS)}")
        if k == "timeout":
            try:
                ok = float(v) >= 0 and float(v) < float("inf")
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise StorageError(f"storage {shown}: timeout={v} is not a number of "
                                   "seconds")


def _unwritable(db: Path) -> bool:
    """Whether SQLite could not make its lock and log files beside ``db`` (a read-only
    mount, a folder of another user): then a study there is read as an immutable file."""
    return not os.access(db.resolve().parent, os.W_OK | os.X_OK)


def _read_only(db: Path) -> str:
    """The SQLite URI that reads ``db`` without locks or a log: nothing can write a
    file nobody may write beside, so none is needed."""
    return f"file:{quote(str(db.resolve()))}?mode=ro&immutable=1"


def _check_sqlite(database: str | None, shown: str, write: bool) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    db = Path(database)
    if not write:
        if not db.is_file():
            raise FileNotFoundError(f"no SQLite database {db} (is the path right?)")
        # Read by SQLite alone: closing any other descriptor of the file drops every
        # POSIX lock this process holds on it, and a writer elsewhere may then rewrite
        # what this process's open connections are reading ("malformed" images seen in a
        # process that read a study while a run wrote it).  A connection that only reads
        # writes nothing, and removes the write-ahead log it opened when it closes.
        conn = sqlite3.connect(_read_only(db), uri=True) if _unwritable(db) else \
            sqlite3.connect(db)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            if "not a database" in str(e):
                raise StorageError(f"{db} is not a SQLite database ({shown})") from None
            raise StorageError(f"{db}: {e} ({shown})") from None
        finally:
            conn.close()
        if "studies" not in tables:
            raise StorageError(f"{db} holds no Optuna study: it is a SQLite database "
                               "of something else")
        return
    folder = db.resolve().parent
    if not folder.is_dir():
        raise StorageError(f"storage {shown}: the folder {folder} does not exist; "
                           "create it, or give another path")
    if db.is_dir():
        raise StorageError(f"storage {shown}: {db} is a folder, not a database file")
    if db.exists() and not db.is_file():
        raise StorageError(f"storage {shown}: {db} is not a regular file (a device, FIFO "
                           "or socket); give the path of a database file")
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise StorageError(f"storage {shown}: {db} is read-only; give a file this user "
                           "may write")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StorageError(f"storage {shown}: the folder {folder} is read-only, and "
                           "SQLite writes the database and its journal there; give a "
                           "path in a folder this user may write")


def connect(url: str, *, write: bool = True) -> optuna.storages.BaseStorage:
    """Check ``url`` (:func:`check`) and open its storage: by the plugin registered for
    its scheme, else Optuna's relational storage, waiting at most
    :data:`CONNECT_TIMEOUT` seconds for a server.  Raises :class:`StorageError`."""
    check(url, write=write)
    s = scheme(url)
    try:
        database = make_url(url).database if s == "sqlite" else None
        if not write and database and not database.startswith("file:") and \
                database != ":memory:" and _unwritable(Path(database)):
            # a study on a read-only mount: read as an immutable file (no locks, no log)
            return relational(f"sqlite:///{_read_only(Path(database))}&uri=true")
        if s in STORAGES and (write or s != "sqlite"):
            got = STORAGES.get(s).create(url)
            return relational(got) if isinstance(got, str) else got
        kwargs: dict[str, Any] = {}
        args: dict[str, Any] = {}
        if s in ("postgresql", "mysql") and "connect_timeout" not in url:
            args["connect_timeout"] = CONNECT_TIMEOUT
        if s == "postgresql" and "options" not in url:
            args["options"] = POSTGRES_OPTIONS
        if args:
            kwargs["connect_args"] = args
        return relational(url, kwargs)
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        if MISSING_DATABASE.search(reason):  # what to do, as a run that meets it is told
            reason = explain(e)
        raise StorageError(f"cannot open storage {_shown(make_url(url))}: {reason}"
                           ) from None
    except (ImportError, RuntimeError, OSError) as e:
        raise StorageError(f"cannot open storage {url}: {e}") from None
