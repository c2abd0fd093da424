"""What a storage error means, in words a user can act on.

Optuna's relational storage turns every database error met in a commit into one
``StorageInternalError`` ("invalid data in the commit, e.g. exceeding max length"),
whatever happened: a full disk and a database server that went away read the same.
The cause is still in the exception's chain (``__cause__``, ``__context__``, a
driver's ``orig``); :func:`explain` finds it and says what it is and what to do.
A :class:`StorageError` is one this package raised with both already said.

>>> import sqlite3
>>> try:
...     try:
...         raise sqlite3.OperationalError("database or disk is full")
...     except sqlite3.Error as e:
...         raise RuntimeError("An exception is raised during the commit.") from e
... except RuntimeError as e:
...     print(explain(e))
the disk that holds the study's storage is full (database or disk is full): make room \
on it, then run the same command to go on; every trial written before is kept
"""

from __future__ import annotations

import errno
import re


class StorageError(ValueError):
    """A storage that cannot be used (a URL that is wrong, a file that is corrupt); the
    message says why and what to do."""


# A database the server does not have (dropped while a run went on, or never created):
# psycopg's 'FATAL:  database "x" does not exist'.  Matched as a pattern, not as the text
# "does not exist", which a missing table has too ('relation "x" does not exist', a
# fault of the storage's schema, not of its name).  The name is in the remedy.
MISSING_DATABASE = re.compile(r'\bdatabase "(?P<name>(?:[^"]|"")*)" does not exist',
                              re.IGNORECASE)

# (texts or patterns found in a cause's message, what it means and what to do); the
# first match wins, so an entry whose text may come with a broader one's is before it
# (a missing database's message may hold a server's "could not connect" too).
KNOWN: tuple[tuple[tuple[str | re.Pattern[str], ...], str], ...] = (
    (("database or disk is full", "no space left on device", "disk quota exceeded"),
     "the disk that holds the study's storage is full ({cause}): make room on it, then run "
     "the same command to go on; every trial written before is kept"),
    (("database disk image is malformed", "file is not a database", "file is encrypted"),
     "the study's database file is corrupt ({cause}): restore it from a copy, or give "
     "another --storage (SQLite's .recover command may save what is left)"),
    (("readonly database", "read-only file system", "read only file system"),
     "the study's storage cannot be written ({cause}): it is on a read-only file system "
     "or the file is read-only; give a writable --storage"),
    (("value too long for type character varying",),
     "a value is longer than the database holds ({cause}): Optuna's names and keys (a "
     "study's, a parameter's, an attribute's) are at most 512 characters"),
    ((MISSING_DATABASE,),
     "the study's database does not exist ({cause}): it was dropped, or never created; "
     "create it (createdb {name}) or give another --storage"),
    (("server closed the connection", "connection refused", "terminating connection",
      "could not connect", "connection is closed", "connection timed out",
      "the database system is shutting down", "the database system is starting up",
      "consuming input failed", "ssl syscall error", "connection reset"),
     "the database server went away ({cause}): when it answers again, run the same "
     "command to go on; every trial written before is kept"),
    (("database is locked",),
     "the database stayed locked by another process longer than the storage waits "
     "({cause}): many drivers on one SQLite file write in turn; use PostgreSQL for more"),
)


def causes(e: BaseException) -> list[BaseException]:
    """``e`` and what it came from (explicit causes, the exception being handled, a
    database driver's original error), outermost first, each once."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop(0)
        if x is None or any(x is y for y in out):
            continue
        out.append(x)
        orig = getattr(x, "orig", None)
        todo += [x.__cause__, x.__context__,
                 orig if isinstance(orig, BaseException) else None]
    return out


def _first_line(x: BaseException) -> str:
    lines = str(x).strip().splitlines()
    return lines[0].strip() if lines else type(x).__name__


def _found(needle: str | re.Pattern[str], text: str) -> dict[str, str] | None:
    """What a pattern captured in ``text`` (nothing for a plain text, which is lower
    case, found in it in any case); None where it is not there."""
    if isinstance(needle, str):
        return {} if needle in text.lower() else None
    m = needle.search(text)  # in the cause's own case: the name it captures is quoted
    return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


def explain(e: BaseException) -> str:
    """What ``e``, an error met reading or writing a study's storage, means and what to
    do; the innermost cause's first line when it is none of the known ones.  A
    :class:`StorageError` (a corrupt journal met during a run) already says both: its
    message as it is."""
    chain = causes(e)
    for x in chain:
        if isinstance(x, StorageError):
            return str(x)
        text = str(x)
        is_enospc = isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT)
        for needles, meaning in KNOWN:
            for n in needles:
                found = _found(n, text)
                if found is not None:
                    return meaning.format(cause=_first_line(x), **found)
            if is_enospc and needles is KNOWN[0][0]:
                return meaning.format(cause=_first_line(x))
    inner = chain[-1]
    return f"{type(inner).__name__}: {_first_line(inner)}"
