"""The file a command writes (``--output``): checked before anything is read, and
replaced whole or not at all."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from explore.cli.common import where
from explore.cli.console import fail


def checked_output(output: str, space_file: str | None, storage: str | None,
                   study_name: str | None) -> Path:
    """``--output`` checked before anything is read or written: its folder exists, and
    it is a new path or a regular file that is neither a link (not followed or replaced
    silently) nor a file the command reads (the space, the study's database).  Exit
    status 2 otherwise."""
    from explore.storages import sqlite_file  # noqa: PLC0415 (--help start-up: SQLAlchemy)

    target = Path(output)
    if not output.strip():
        fail("--output is empty: give the path of the file to write")
    if target.is_symlink():
        fail(f"--output {output}: a symbolic link (to {os.readlink(target)}); give the "
             "path of the file itself")
    try:
        st = target.stat() if target.exists() else None
    except OSError as e:
        fail(f"--output {output}: {e.strerror or e}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else \
            "not a regular file (a device, FIFO or socket)"
        fail(f"--output {output}: {kind}; give the path of a file to write")
    folder = target.parent
    if not folder.is_dir():
        fail(f"--output {output}: the folder {folder} does not exist")
    if st is not None:
        storage_url, _ = where(space_file, storage, study_name)
        db = sqlite_file(storage_url)
        reads = [Path(space_file)] if space_file else []
        if db is not None:
            reads += [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
        for r in reads:
            with contextlib.suppress(OSError):
                if os.path.samefile(r, target):
                    fail(f"--output {output}: the command reads this file ({r}); give "
                         "another path")
    return target


def write_output(target: Path, output: str, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` into a new file beside ``target``, then renamed over it: the
    target is replaced whole or not at all, and a file of the temporary's name is
    never touched.  A new file gets the usual permissions; a replaced one keeps its."""
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                    suffix=".tmp")
    except OSError as e:
        fail(f"--output {output}: {e.strerror or e}")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if target.exists():
            mode = stat.S_IMODE(target.stat().st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        fail(f"--output {output}: {e.strerror or e}")
    finally:
        tmp.unlink(missing_ok=True)
