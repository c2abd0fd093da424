"""Optuna's journal file storage: ``journal:///path/to/study.log``.

Many processes on one host share a study through one append-only file, without a
server (Optuna's own advice for one machine; several machines want a database).  The
path is absolute after ``journal://`` (``journal:///home/me/s.log``) or relative to
the current folder (``journal://s.log``).  Reading a study that is not there creates
nothing.

>>> from explore.storages._journal import journal_path
>>> journal_path("journal:///tmp/s.log"), journal_path("journal://runs/s.log")
(PosixPath('/tmp/s.log'), PosixPath('runs/s.log'))
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna

from explore.storages._base import BaseStorage, register


def journal_path(url: str) -> Path:
    """The log file of a ``journal://`` URL."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    return Path(rest.split("?", 1)[0])


LOCK_GRACE = 5  # seconds after which a journal's lock file counts as abandoned


@register("journal")
class Journal(BaseStorage):
    """Every write is a line appended under a file lock; every read replays the lines
    added since the last one, so a process sees the others' trials at its next read."""

    def check(self, url: str, write: bool) -> None:
        from explore.storages._check import StorageError

        path = journal_path(url)
        if not str(path) or str(path) == ".":
            raise StorageError(f"storage {url!r} names no file: write "
                               "journal:///path/to/study.log")
        if path.is_dir():
            raise StorageError(f"storage {url}: {path} is a folder, not a journal file")
        if not write:
            if not path.is_file():
                raise FileNotFoundError(f"no journal file {path} (is the path right?)")
            return
        folder = path.resolve().parent
        if not folder.is_dir():
            raise StorageError(f"storage {url}: the folder {folder} does not exist; "
                               "create it, or give another path")
        if not os.access(folder, os.W_OK | os.X_OK) or \
                (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
            raise StorageError(f"storage {url}: {path} cannot be written by this user "
                               "(the journal and its lock live in its folder)")

    def create(self, url: str) -> optuna.storages.BaseStorage:
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = str(journal_path(url))
        # An open-lock (a file created with O_EXCL) rather than a symlink lock: it works
        # on every file system the log may live on, network ones included.  A writer
        # holds it for one append (milliseconds); one left by a process killed while
        # holding it is taken over after LOCK_GRACE seconds (Optuna's default, 30 s,
        # stalled every driver for that long after a kill -9).
        return optuna.storages.JournalStorage(
            JournalFileBackend(path, lock_obj=JournalFileOpenLock(path,
                                                                  grace_period=LOCK_GRACE)))
