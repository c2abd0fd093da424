"""Optuna's journal file storage: ``journal:///path/to/study.log``.

Many processes on one host share a study through one append-only file, without a
server (Optuna's own advice for one machine; several machines want a database).  The
path is absolute after ``journal://`` (``journal:///home/me/s.log``) or relative to
the current folder (``journal://s.log``).  Reading a study that is not there creates
nothing.

A record is one line.  A write that fails half way (a full disk) or a process killed
while writing leaves a partial last line; an append onto it would make a line no reader
can parse, and the whole study unreadable.  So a failed append cuts the file back to
where it began, and opening a journal, or appending to one, first cuts off a partial
last line left by a process that could not (with a warning naming the bytes cut): it
was never a whole record, so no reader ever took it for one.

>>> from explore.storages._journal import journal_path
>>> journal_path("journal:///tmp/s.log"), journal_path("journal://runs/s.log")
(PosixPath('/tmp/s.log'), PosixPath('runs/s.log'))
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

from explore.storages._base import BaseStorage, register
from explore.storages._check import StorageError


def journal_path(url: str) -> Path:
    """The log file of a ``journal://`` URL."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    return Path(rest.split("?", 1)[0])


LOCK_GRACE = 5  # seconds after which a journal's lock file counts as abandoned


class PartialRecordWarning(UserWarning):
    """A journal ended in a partial record, which was cut off."""


def ends_in_partial_record(path: str | Path) -> bool:
    """Whether the file's last byte is not a newline (False when empty or missing)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(size - 1)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def cut_partial_record(path: str | Path) -> int:
    """Cut off a last line without its newline (a write that never finished); the
    bytes cut, 0 when the file ends in a whole record (or is empty or missing).  The
    caller holds the journal's lock."""
    if not ends_in_partial_record(path):
        return 0
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            # the last newline: read back from the end in blocks
            end, keep = size, 0
            while end > 0:
                start = max(0, end - 65536)
                f.seek(start)
                block = f.read(end - start)
                at = block.rfind(b"\n")
                if at >= 0:
                    keep = start + at + 1
                    break
                end = start
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            return size - keep
    except FileNotFoundError:
        return 0


class SafeJournalBackend(JournalFileBackend):
    """Optuna's journal file backend whose file never holds a partial record that an
    append would extend (the module docstring says how)."""

    def __init__(self, path: str, lock_obj: Any = None) -> None:
        super().__init__(path, lock_obj=lock_obj)
        self._repair()

    def _repair(self) -> None:
        if not ends_in_partial_record(self._file_path):
            return  # nothing to cut: no lock taken (a read-only mount can be read)
        try:
            self._lock.acquire()
            try:
                self._cut()
            finally:
                self._lock.release()
        except OSError as e:  # a reader on a read-only mount: readers skip such a line
            warnings.warn(f"{self._file_path} ends in a partial record that could not be cut "
                          f"off ({e}); a run that writes to it will cut it",
                          PartialRecordWarning, stacklevel=3)

    def _cut(self) -> None:
        cut = cut_partial_record(self._file_path)
        if cut:
            warnings.warn(f"{self._file_path} ended in a partial record ({cut:,} bytes, a write "
                          "that did not finish: a full disk, or a process killed while "
                          "writing); it was cut off", PartialRecordWarning, stacklevel=3)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) +
                "\n").encode("utf-8")
        self._lock.acquire()
        try:
            self._cut()  # a writer killed since this process opened the journal
            # unbuffered, so that nothing of a failed write is written later on close
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except BaseException:
                    os.ftruncate(fd, start)  # no partial record for the next to extend
                    raise
            finally:
                os.close(fd)
        finally:
            self._lock.release()


@register("journal")
class Journal(BaseStorage):
    """Every write is a line appended under a file lock; every read replays the lines
    added since the last one, so a process sees the others' trials at its next read."""

    def check(self, url: str, write: bool) -> None:
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
        path = str(journal_path(url))
        # An open-lock (a file created with O_EXCL) rather than a symlink lock: it works
        # on every file system the log may live on, network ones included.  A writer
        # holds it for one append (milliseconds); one left by a process killed while
        # holding it is taken over after LOCK_GRACE seconds (Optuna's default, 30 s,
        # would stall every driver for that long after a kill -9).
        return optuna.storages.JournalStorage(
            SafeJournalBackend(path, lock_obj=JournalFileOpenLock(path,
                                                                  grace_period=LOCK_GRACE)))
