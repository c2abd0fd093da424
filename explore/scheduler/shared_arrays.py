"""A data set in shared memory: loaded once by the scheduler, mapped by every worker
without a copy (the workers' arrays are views of the same physical pages).

The arrays live in one file on a RAM file system (``/dev/shm`` on Linux; the temporary
directory elsewhere), mapped with ``numpy.memmap``.  A loader can write straight into
it (:meth:`SharedArrays.empty`), so the data set is never held twice, not even while
it is loaded; and unlike ``multiprocessing.shared_memory`` it needs no resource-tracker
process (about 10 MB of the budget on its own).  The scheduler keeps the file mapped
for the run, so its pages count in the process tree's memory; it unlinks the file when
the run ends (:meth:`SharedArrays.close`), and a run that could not (``kill -9``) leaves
it to the next one, which removes the files of processes that are gone
(:func:`sweep_stale`).

>>> import numpy as np
>>> with SharedArrays({"x": np.arange(6.0).reshape(2, 3)}) as shm:
...     view = attach(shm.spec)
...     float(view["x"][1, 2])
5.0
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.alignment import align_up
from explore.procmem import alive


@dataclass(frozen=True)
class ArraySpec:
    path: str  # the shared file
    offset: int
    shape: tuple[int, ...]
    dtype: str


PREFIX = "explore-data-"  # then the pid of the process that made the file, and a dash


class SharedMemoryFull(OSError):
    """The RAM file system has no room for an array: said before a byte is written (a
    page of a mapped file that cannot be backed kills the process that touches it with
    SIGBUS, a container's 64 MB ``/dev/shm`` being the usual cause)."""


def _directory() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else None


def sweep_stale(directory: str | None = None) -> list[str]:
    """Remove the shared files of runs whose process is gone (ended by ``kill -9``, or
    by a second Ctrl-C that left no time to clean up): each file's name carries the pid
    of the process that made it.  Returns the paths removed.  Every run sweeps when it
    makes its own file, so a leak lasts until the next run on the machine."""
    folder = directory or _directory() or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))
            removed.append(os.path.join(folder, name))
    return removed


class SharedArrays:
    """Named arrays in one shared file; ``spec`` tells workers where each one is.
    ``arrays`` are copied in; :meth:`empty` makes room for one to be written in place.
    Close (or use as a context manager) to unmap and remove the file."""

    def __init__(self, arrays: dict[str, np.ndarray] | None = None) -> None:
        sweep_stale()
        fd, self.path = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=_directory())
        os.close(fd)
        self.spec: dict[str, ArraySpec] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.nbytes = 0
        try:
            for k, a in (arrays or {}).items():
                self.put(k, a)
        except BaseException:
            self.close()
            raise

    def empty(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A new array ``name`` in the file, writable, its contents undefined."""
        if name in self.spec:
            raise ValueError(f"shared array {name!r} exists already")
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        size = int(np.prod(shape)) * dt.itemsize
        at = self.nbytes
        with open(self.path, "r+b") as f:
            f.truncate(at + max(size, 1))
            if size:
                self._reserve(f.fileno(), name, at, size)
        # A plain ndarray view (it keeps the map alive): memmap's subclass hooks run on
        # every slice a training step takes.
        a = np.memmap(self.path, dt, "r+", offset=at, shape=shape).view(np.ndarray) \
            if size else np.empty(shape, dt)
        self.spec[name] = ArraySpec(self.path, at, shape, dt.str)
        self.arrays[name] = a
        self.nbytes = align_up(at + size)
        return a

    def _reserve(self, fd: int, name: str, at: int, size: int) -> None:
        """Back ``size`` bytes at ``at`` with pages now, or raise :class:`SharedMemoryFull`
        (a file system without fallocate is left as it was: its pages come when written)."""
        try:
            os.posix_fallocate(fd, at, size)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            folder = os.path.dirname(self.path)
            try:
                st = os.statvfs(folder)
                free = f"{st.f_bavail * st.f_frsize:,} bytes free of {st.f_blocks * st.f_frsize:,}"
            except OSError:
                free = "its free space unknown"
            raise SharedMemoryFull(
                e.errno, f"the shared-memory file system {folder} has no room for the data "
                f"set's {name!r} ({size:,} bytes, {self.nbytes + size:,} in all; {free}): "
                f"make it larger (a container: docker run --shm-size=1g, or a Kubernetes "
                f"emptyDir with medium: Memory) or use fewer rows (dataset.train, "
                f"dataset.valid)") from None

    def put(self, name: str, array: np.ndarray) -> np.ndarray:
        """A copy of ``array`` in the file."""
        a = np.asarray(array)
        out = self.empty(name, a.shape, a.dtype)
        out[...] = a
        return out

    def close(self) -> None:
        self.arrays.clear()  # unmaps once nothing else holds a view
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> SharedArrays:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def attach(spec: dict[str, ArraySpec]) -> dict[str, np.ndarray]:
    """Read-only views of the shared arrays (mapped for the life of the process)."""
    out = {}
    for k, s in spec.items():
        if int(np.prod(s.shape)) == 0:
            out[k] = np.empty(s.shape, np.dtype(s.dtype))
        else:
            out[k] = np.memmap(s.path, np.dtype(s.dtype), "r", offset=s.offset,
                               shape=s.shape).view(np.ndarray)
    return out
