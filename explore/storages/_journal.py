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

A whole line that is no record (garbage, a block of zero bytes that a crash leaves on
some file systems, a record cut short and joined to the next, JSON that is no Optuna
operation) is :class:`CorruptJournal`, raised by the read that meets it: Optuna's
reader skips such a line at the end, and the next append puts it in the middle, where
it raises a bare ``JSONDecodeError`` (or a ``KeyError`` deep in the replay) on every
read after.  A journal is replayed in order, so the records after a bad one are not
read: dropping it would apply them to a study missing what it held (a trial's
parameters, its end).  Nothing is appended after a bad record either, and an open that
finds one cuts nothing; the message names the line and its byte, and what to do.

>>> from explore.storages._journal import journal_path
>>> journal_path("journal:///tmp/s.log"), journal_path("journal://runs/s.log")
(PosixPath('/tmp/s.log'), PosixPath('runs/s.log'))
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._file import LOCK_FILE_SUFFIX

from explore.storages._base import BaseStorage, register
from explore.storages.errors import StorageError


def journal_path(url: str) -> Path:
    """The log file of a ``journal://`` URL."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    return Path(rest.split("?", 1)[0])


LOCK_GRACE = 5  # seconds after which a journal's lock file counts as abandoned


class LockTakenOverWarning(UserWarning):
    """This process's lock on a journal was taken over by another: it held the lock
    longer than :data:`LOCK_GRACE` (it was stopped or suspended inside an append)."""


class OwnOpenLock(JournalFileOpenLock):
    """Optuna's open-lock, but one that releases only its own lock file.  Another writer
    takes over a lock held past the grace; the holder, resumed, would otherwise fail
    the run on the missing file, or, where the other has taken the lock meanwhile,
    remove that writer's lock file."""

    _token = ""
    _breaking = False  # inside acquire: Optuna's takes over a stale lock by release()

    def acquire(self) -> bool:
        self._breaking = True
        try:
            got = super().acquire()
        finally:
            self._breaking = False
        # a token of its own in the file (an inode number is reused at once)
        self._token = uuid.uuid4().hex
        try:
            with open(self._lock_file, "w") as f:
                f.write(self._token)
        except OSError:
            self._token = ""
        return got

    def release(self) -> None:
        if self._breaking:
            super().release()
            return
        try:
            with open(self._lock_file) as f:
                mine = f.read() == self._token
        except FileNotFoundError:
            mine = False
        except OSError:  # unreadable: as Optuna's own lock does
            mine = True
        if not mine and self._token:
            warnings.warn(f"the lock on {self._lock_file[:-len(LOCK_FILE_SUFFIX)]} was taken "
                          f"over by another writer while this process held it (for over "
                          f"{LOCK_GRACE} s: it was stopped or suspended)",
                          LockTakenOverWarning, stacklevel=2)
            return
        super().release()


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


class CorruptJournal(StorageError):
    """A whole line of a journal that is no record: its file, line (from 1) and byte
    offset, and what is wrong with it; the message says what to do."""

    def __init__(self, path: str | Path, line: int, offset: int, reason: str) -> None:
        self.path, self.line, self.offset, self.reason = Path(path), line, offset, reason
        keep = line - 1
        rescue = (f", or keep the {keep:,} record{'s' if keep != 1 else ''} before it "
                  f"(head -n {keep} {path} > new.log; those after it are lost) and give "
                  "that file as --storage") if keep else ""
        super().__init__(f"journal {path} is corrupt at line {line:,} (byte {offset:,}): "
                         f"{reason}. A journal is replayed in order, so no record after it "
                         f"is read and none is appended; restore the file from a "
                         f"copy{rescue}")


# The fields each journal operation needs (Optuna's JournalOperation, by its number) and
# what they hold: without them Optuna's replay stops on a bare KeyError or assertion.
_ID = (int,)
OP_FIELDS: dict[int, dict[str, tuple[type, ...]]] = {
    0: {"study_name": (str,), "directions": (list,)},  # CREATE_STUDY
    1: {"study_id": _ID},  # DELETE_STUDY
    2: {"study_id": _ID, "user_attr": (dict,)},  # SET_STUDY_USER_ATTR
    3: {"study_id": _ID, "system_attr": (dict,)},  # SET_STUDY_SYSTEM_ATTR
    4: {"study_id": _ID, "datetime_start": (str, type(None))},  # CREATE_TRIAL
    5: {"trial_id": _ID, "param_name": (str,), "param_value_internal": (int, float),
        "distribution": (str,)},  # SET_TRIAL_PARAM
    6: {"trial_id": _ID, "state": (int,),  # SET_TRIAL_STATE_VALUES
        "values": (list, type(None))},
    7: {"trial_id": _ID, "step": (int,),  # SET_TRIAL_INTERMEDIATE_VALUE
        "intermediate_value": (int, float)},
    8: {"trial_id": _ID, "user_attr": (dict,)},  # SET_TRIAL_USER_ATTR
    9: {"trial_id": _ID, "system_attr": (dict,)},  # SET_TRIAL_SYSTEM_ATTR
    10: {},  # DISCARD_TRIALS
}


def record_problem(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """A whole line (its newline included) as a journal record, or None and what is
    wrong with it.

    >>> record_problem(b'{"op_code":1,"worker_id":"w","study_id":0}\\n')[0]["study_id"]
    0
    >>> record_problem(b'{"op_code":99,"worker_id":"w"}\\n')
    (None, 'op_code 99 is no Optuna journal operation')
    """
    body = line.rstrip(b"\n")
    if not body or body.isspace():
        return None, "an empty line"
    if body.startswith(b"\0"):  # a run of zeros where records should have begun
        return None, (f"{body.count(0):,} zero bytes, as a crash leaves on some file "
                      "systems where a write had not reached the disk")
    if b"\0" in body:  # zeros among other bytes: not a crash's run of them
        return None, f"binary bytes, {body.count(0):,} of them zero: no text record"
    try:
        log = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "bytes that are not text (UTF-8)"
    except ValueError as e:  # JSONDecodeError: a record cut short, or garbage
        return None, f"not a JSON record ({e})"
    if not isinstance(log, dict) or "op_code" not in log:
        return None, "JSON that is no Optuna journal record (it has no op_code)"
    op = log["op_code"]
    if type(op) is not int or op not in OP_FIELDS:
        return None, f"op_code {op!r} is no Optuna journal operation"
    for key, kinds in {"worker_id": (str,), **OP_FIELDS[op]}.items():
        value = log.get(key, ...)
        if value is ...:
            return None, f"a record of operation {op} without its {key!r}"
        if isinstance(value, bool) or not isinstance(value, kinds):
            return None, (f"a record of operation {op} whose {key!r} is a "
                          f"{type(value).__name__}")
    for key in ("user_attr", "system_attr"):
        if key in OP_FIELDS[op] and len(log[key]) != 1:
            return None, f"a record of operation {op} whose {key!r} is not one attribute"
    return log, ""


class SafeJournalBackend(JournalFileBackend):
    """Optuna's journal file backend whose file never holds a partial record that an
    append would extend, and whose reads and appends stop at a corrupt record (the
    module docstring says how)."""

    def __init__(self, path: str, lock_obj: Any = None) -> None:
        super().__init__(path, lock_obj=lock_obj)
        self._repair()

    def _records(self, f: IO[bytes], number: int, size: int
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
        """The records of ``f`` from record ``number`` (whose offset is known) to byte
        ``size``, each with its number; a line not yet whole (being written, or left by
        a write that did not finish) ends them.  Raises :class:`CorruptJournal`."""
        at = self._log_number_offset[number]
        f.seek(at)
        for line in f:
            if at + len(line) > size or not line.endswith(b"\n"):
                return  # the next read (or the cut) takes it
            log, problem = record_problem(line)
            if log is None:
                raise CorruptJournal(self._file_path, number + 1, at, problem)
            at += len(line)
            self._log_number_offset[number + 1] = at
            yield number, log
            number += 1

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        """Optuna's read (records from ``log_number_from``, up to the file's size when
        the read began), each record checked."""
        with open(self._file_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = log_number_from if log_number_from in self._log_number_offset else 0
            for number, log in self._records(f, start, size):
                if number >= log_number_from:
                    yield log

    def _check_unread(self) -> None:
        """Check the records no read of this process has checked yet (another's, since
        the last read): an append after a corrupt one could never be read."""
        with open(self._file_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for _ in self._records(f, max(self._log_number_offset), size):
                pass

    def _repair(self) -> None:
        if not ends_in_partial_record(self._file_path):
            return  # nothing to cut: no lock taken (a read-only mount can be read)
        self._check_unread()  # a corrupt journal is left as it is, partial record and all
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
            self._check_unread()  # nothing appended after a corrupt record
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
            SafeJournalBackend(path, lock_obj=OwnOpenLock(path,
                                                                  grace_period=LOCK_GRACE)))
