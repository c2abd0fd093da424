"""Whether a study's file is still the one a run opened.

A SQLite database or a journal deleted (or replaced) under a running study does not
fail at once: SQLite's open connections keep writing to the deleted file, a new one
creates an empty database at the path, and Optuna's journal appends to a new file that
begins mid-study.  Trials written from then on land where no one will read them, or
break the study.  :class:`StorageFile` remembers the file's identity (device and inode)
when the run opens it; a driver compares it now and then (``LiveStudy.refresh``) and
stops with :meth:`StorageFile.lost`'s message instead.

>>> import optuna, tempfile, os
>>> folder = tempfile.TemporaryDirectory()
>>> path = os.path.join(folder.name, "s.db")
>>> storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
>>> watch = StorageFile.of(storage)
>>> watch.lost() is None
True
>>> os.unlink(path)
>>> print(watch.lost())  # doctest: +ELLIPSIS
the study's database file .../s.db was deleted while the run went on, and ...
>>> folder.cleanup()
"""

from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path

from optuna.storages import BaseStorage

WHAT = {"sqlite": "database file", "journal": "journal file"}


def backing_file(storage: object) -> tuple[str, Path] | None:
    """(kind, path) of the file behind an Optuna storage: a SQLite database or a journal
    file; None for a server's database or one in memory.  Looks through Optuna's and
    explore's wrappers (``_backend``, ``_storage``)."""
    seen: set[int] = set()
    while storage is not None and id(storage) not in seen:
        seen.add(id(storage))
        engine = getattr(storage, "engine", None)
        if engine is not None:
            url = engine.url
            if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
                return "sqlite", Path(url.database).resolve()
            return None
        path = getattr(storage, "_file_path", None)  # a journal file's backend
        if isinstance(path, str):
            return "journal", Path(path).resolve()
        storage = getattr(storage, "_backend", None) or getattr(storage, "_storage", None)
    return None


class StorageFile:
    """The identity of a study's file as a run opened it (see the module)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path
        # The file is held open while watched: a deleted file's inode is then not freed,
        # so a new file at the path (a journal's next append creates one) cannot take
        # the same inode number and pass for the file the run opened.
        fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, fd)
        self.fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)

    @classmethod
    def of(cls, storage: BaseStorage) -> StorageFile | None:
        """The watch of ``storage``'s file, or None where it has none (a server, memory,
        a file not created yet)."""
        found = backing_file(storage)
        if found is None:
            return None
        try:
            return cls(*found)
        except OSError:
            return None

    def lost(self) -> str | None:
        """Why the run must stop: the file was deleted, moved away or replaced since it
        was opened; None while it is the same file."""
        how = self._change()
        if how is None:
            return None
        if how == "deleted" and self.kind == "sqlite":
            self._forget_log()
        return (f"the study's {WHAT[self.kind]} {self.path} was {how} while the run went on, "
                f"and the run stopped rather than write where no one reads: restore the file "
                f"from a copy to go on, or run the same command to start the study anew")

    def _change(self) -> str | None:
        """"deleted" or "replaced by another file"; None while it is the same file, or
        while its path cannot be read (the next write says why)."""
        with contextlib.suppress(OSError):
            if os.fstat(self.fd).st_nlink == 0:  # deleted, whatever now lies at the path
                return "deleted"
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None
        return None if (st.st_dev, st.st_ino) == self.identity else "replaced by another file"

    def _forget_log(self) -> None:
        """Remove a deleted database's write-ahead log and shared-memory index from its
        path: SQLite would replay a log left there into the next database created at
        that path, which holds none of the pages the log's frames assume (a mispaired
        log, which SQLite's "How to corrupt" names), unless that path holds a database
        again by now."""
        for suffix in ("-wal", "-shm"):
            if not self.path.exists():
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
