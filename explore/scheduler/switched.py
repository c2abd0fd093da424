"""Where a driver's switched-out trials wait: one folder of state files, its own.

A trial paused at a rung whose memory another trial needs leaves its worker's arena
(:mod:`.core` decides, :mod:`.worker` writes); its state waits in a file here, named
by :func:`~.protocol.state_file`, until a worker switches it back in (and removes the
file) or the trial ends out (:class:`~.commands.DropState`).  The folder is on disk,
not in memory: on the CPU the budget is the host memory the run's processes use, so
a state kept in memory would only move the bytes, not free them (a folder on a
memory-backed file system, ``tmpfs``, would hold them uncounted).

Several drivers may share the parent (the study's artifact folder), so each has a
folder of its own, named like the keeper's staging folders (``<host>-<pid>-<token>``):
a driver removes only its own when it ends, and the next driver on the host removes
those of drivers that were killed (:func:`explore.keeper.sweep_stale_staging`).

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     folder = SwitchFolder(Path(d) / "quick.artifacts")
...     folder.path.mkdir(parents=True)  # a worker's first switch out makes it
...     folder.close()
...     list(Path(d).iterdir())  # what it made is gone, parents it made too
[]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

from explore.folders import directory_problem
from explore.keeper import sweep_stale_staging
from explore.scheduler.protocol import state_file

SWITCHED = ".switched"  # under the parent: every driver's folder
# File systems whose files are memory (Linux's names in /proc/mounts)
MEMORY_BACKED = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def memory_backed(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> bool:
    """Whether files under ``path`` (made or not) are kept in memory: the file system
    of the deepest mount point above it is one of :data:`MEMORY_BACKED`.  False where
    the system does not say.

    >>> memory_backed("/proc/self", mounts="/nonexistent")
    False
    """
    target = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return kind in MEMORY_BACKED


# Where states wait when the folder asked for is in memory: folders that outlive a
# reboot, so on disk wherever the system keeps /tmp in memory (the FHS's /var/tmp).
DISK_FALLBACKS = ("/var/tmp",)


def on_disk(parent: Path, fallbacks: tuple[str, ...] = DISK_FALLBACKS,
            mounts: str = "/proc/mounts") -> tuple[Path, bool]:
    """The folder states under ``parent`` should wait in, and whether it is in memory:
    ``parent`` itself unless it is memory-backed, else the first of ``fallbacks`` on
    disk that can be written (``parent`` again, in memory, where none is).

    >>> on_disk(Path("/srv/run"), mounts="/nonexistent")
    (PosixPath('/srv/run'), False)
    """
    if not memory_backed(parent, mounts):
        return parent, False
    for other in map(Path, fallbacks):
        if not memory_backed(other, mounts) and directory_problem(other) is None:
            return other, False
    return parent, True


class SwitchFolder:
    """This driver's folder of switched-out states under ``parent`` (default: the
    system's temporary folder).  Named now, made by the first worker that switches a
    trial out (a run that switches none leaves nothing, not even an empty artifact
    folder), and removed by :meth:`close` with the parents that did not exist before.

    Where ``parent`` is in memory (``tmpfs``: ``/tmp`` on many systems), the states wait
    under the first of ``fallbacks`` on disk instead (:attr:`instead_of` names the
    parent asked for); :attr:`in_memory` says that none was."""

    def __init__(self, parent: str | os.PathLike[str] | None = None,
                 fallbacks: tuple[str, ...] = DISK_FALLBACKS,
                 mounts: str = "/proc/mounts") -> None:
        asked = (Path(parent) if parent is not None else Path(tempfile.gettempdir())).resolve()
        base, self.in_memory = on_disk(asked, fallbacks, mounts)
        # there, the states are memory that no process is charged: on the CPU the run
        # does not switch (explore.scheduler.loop)
        self.instead_of: Path | None = asked if base != asked else None
        self.shared = base / SWITCHED
        self.path = self.shared / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        sweep_stale_staging(self.shared)
        # the parents to remove again when empty, deepest first: those not there now
        self._parents = [d for d in self.path.parents if not d.exists()] or [self.shared]

    def discard(self, number: int) -> None:
        """Trial ``number`` ended while out: its state is not needed."""
        with contextlib.suppress(OSError):
            os.unlink(state_file(str(self.path), number))

    def close(self) -> None:
        """Remove this driver's folder and what a stopped run left in it, then the
        shared parent if nothing else is in it (another driver's folder keeps it), and
        the parents it was the first to need, where empty."""
        shutil.rmtree(self.path, ignore_errors=True)
        for d in dict.fromkeys([self.shared, *self._parents]):
            with contextlib.suppress(OSError):
                d.rmdir()
