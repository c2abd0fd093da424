"""A data set's compact rows kept on disk, so that a run reads them in milliseconds
instead of decoding its source again (MNIST's pickle is a gzip stream of float32
pixels: every run inflated 170 MB of it to keep 8 MB of uint8 rows).

An entry is the first rows of the train and valid splits, exactly as
``load_compact`` made them (uint8 pixels, int64 labels), in ``.npy`` files under
:func:`~explore.cache_dir.cache_root` ``/datasets/``, in a folder named by the data
set, the SHA-256 its source file is checked against, the pixel scale and the entries'
:data:`FORMAT`, and within it by the row counts.  A request is served by any entry that
holds at least its rows: the first rows of a split are the same whatever the count
asked, so a larger entry replaces the smaller ones.  An entry is written whole to a
hidden folder, synced and renamed into place, so a reader sees it complete or not at
all; a cache that cannot be written (a read-only or full disk) is passed over, a
damaged entry is removed, and the source is decoded as before.  Deleting the folder is
always safe.

>>> import os, tempfile
>>> import numpy as np
>>> saved = {k: v for k, v in os.environ.items() if k == "EXPLORE_CACHE_DIR"}
>>> tmp = tempfile.TemporaryDirectory()
>>> os.environ["EXPLORE_CACHE_DIR"] = tmp.name
>>> cache = RowCache("toy", "ab" * 32, scale=1 / 256, full=(4, 2), features=3)
>>> x = np.arange(12, dtype=np.uint8).reshape(4, 3)
>>> cache.write({"x_train": x, "y_train": np.arange(4), "x_valid": x[:2],
...              "y_valid": np.arange(2)})
>>> got = cache.read(2, None)
>>> got["x_train"].tolist(), got["y_valid"].tolist()
([[0, 1, 2], [3, 4, 5]], [0, 1])
>>> cache.read(None, None)["x_train"].shape  # all: the four rows the split has
(4, 3)
>>> _ = os.environ.pop("EXPLORE_CACHE_DIR"); os.environ.update(saved); tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from explore.cache_dir import cache_root
from explore.datasets._base import Empty, plain_empty
from explore.datasets.errors import DataError

NAMES = ("x_train", "y_train", "x_valid", "y_valid")
FORMAT = 1
"""The entries' form (in their folder's name): a change to what ``load_compact`` makes
(the quantization, the labels' dtype) raises it, and old entries are not read."""
DTYPES = {"x": np.dtype(np.uint8), "y": np.dtype(np.int64)}
HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
           (2, 0): np.lib.format.read_array_header_2_0}
"""The ``.npy`` headers ``np.save`` writes for these arrays."""
STALE_S = 3600.0
"""A hidden folder older than this is a writer's that died (an entry takes well under a
second to write): the next writer removes it."""


class RowCache:
    """The cached rows of one data set's source (:mod:`explore.datasets.row_cache`):
    ``kind`` names the data set, ``content`` is its source file's SHA-256, ``scale``
    the pixel scale its uint8 values are of, ``full`` the rows of its train and valid
    splits, ``features`` the values per row."""

    def __init__(self, kind: str, content: str, scale: float, full: tuple[int, int],
                 features: int) -> None:
        self.folder = cache_root() / "datasets" / \
            f"{kind}-{content[:16]}-u8x{1 / scale:g}-v{FORMAT}"
        self.full = full
        self.features = features

    def wanted(self, train: int | None, valid: int | None) -> tuple[int, int]:
        """The rows a request gets: its counts, capped at the splits' (None: all)."""
        if any(n is not None and n < 0 for n in (train, valid)):
            raise ValueError(f"rows to load must be 0 or more, not {train} and {valid}")
        return tuple(f if n is None else min(n, f)  # type: ignore[return-value]
                     for n, f in zip((train, valid), self.full, strict=True))

    def read(self, train: int | None, valid: int | None, empty: Empty = plain_empty
             ) -> dict[str, np.ndarray] | None:
        """The first ``train`` and ``valid`` rows (None: all) from an entry that holds
        them, each array made by ``empty(name, shape, dtype)`` and filled in place;
        None where no entry holds them whole (nothing is made then)."""
        need = self.wanted(train, valid)
        for entry in self._entries():
            if entry[0] < need[0] or entry[1] < need[1]:
                continue
            folder = self.folder / f"{entry[0]}-{entry[1]}"
            with contextlib.ExitStack() as files:
                try:
                    opened = {name: self._open(files, folder / f"{name}.npy", name,
                                               entry[name.endswith("valid")])
                              for name in NAMES}
                except (ValueError, FileNotFoundError):  # damaged, or a file of it gone:
                    self._discard(folder)  # removed, so that a whole one is written
                    continue
                except OSError:
                    continue  # unreadable: another entry, or the source
                return {name: self._fill(f, name, need[name.endswith("valid")], empty)
                        for name, f in opened.items()}
        return None

    def write(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Keep ``arrays`` (the four of :data:`NAMES`, as ``load_compact`` made them) as
        an entry, and remove the entries it makes redundant (no more rows in either
        split); where an entry of the same rows exists already, or the disk refuses,
        this does nothing."""
        rows = (len(arrays["y_train"]), len(arrays["y_valid"]))
        final = self.folder / f"{rows[0]}-{rows[1]}"
        if final.is_dir():
            return
        hidden = self.folder / f".{uuid.uuid4().hex}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._sweep()
            hidden.mkdir()
            for name in NAMES:
                a = np.ascontiguousarray(arrays[name])
                if a.dtype != DTYPES[name[0]]:
                    return  # not the compact form this cache holds
                with open(hidden / f"{name}.npy", "wb") as f:
                    np.save(f, a, allow_pickle=False)
                    f.flush()
                    os.fsync(f.fileno())  # on disk before it is named: a power cut
                    # leaves no entry of empty files
            os.rename(hidden, final)  # whole or not at all; a racing writer's stays
            self._sync_folder()
            for entry in self._entries():
                if entry != rows and entry[0] <= rows[0] and entry[1] <= rows[1]:
                    self._discard(self.folder / f"{entry[0]}-{entry[1]}")
        except OSError:
            pass  # a read-only or full disk: the source is decoded again next time
        finally:
            shutil.rmtree(hidden, ignore_errors=True)

    def _entries(self) -> list[tuple[int, int]]:
        """The row counts of the entries there, smallest first."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        out = []
        for name in names:
            parts = name.split("-")
            if len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts):
                out.append((int(parts[0]), int(parts[1])))
        return sorted(out)

    def _open(self, files: contextlib.ExitStack, path: Path, name: str, rows: int
              ) -> io.BufferedReader:
        """``path`` opened at its data, its header checked: ``rows`` rows of this
        cache's shape and dtype, and the bytes to match (a ValueError otherwise)."""
        f: io.BufferedReader = files.enter_context(open(path, "rb"))  # noqa: SIM115 (the stack closes it)
        header = HEADERS.get(np.lib.format.read_magic(f))
        if header is None:
            raise ValueError(f"{path}: a .npy version this cache does not write")
        shape, fortran, dtype = header(f)
        want = self._shape(name, rows)
        if tuple(shape) != want or fortran or dtype != DTYPES[name[0]]:
            raise ValueError(f"{path}: {shape} {dtype}, expected {want} {DTYPES[name[0]]}")
        if os.fstat(f.fileno()).st_size - f.tell() != int(np.prod(want)) * dtype.itemsize:
            raise ValueError(f"{path}: truncated")
        return f

    def _shape(self, name: str, rows: int) -> tuple[int, ...]:
        return (rows, self.features) if name[0] == "x" else (rows,)

    def _fill(self, f: io.BufferedReader, name: str, rows: int, empty: Empty) -> np.ndarray:
        out = empty(name, self._shape(name, rows), DTYPES[name[0]])
        if out.nbytes and f.readinto(out.data.cast("B")) != out.nbytes:
            raise DataError(f"{f.name}: cut short while it was read; delete {self.folder}")
        return out

    def _discard(self, entry: Path) -> None:
        """Remove ``entry``: renamed out of sight first, so no reader opens half of it."""
        hidden = self.folder / f".{uuid.uuid4().hex}"
        with contextlib.suppress(OSError):
            os.rename(entry, hidden)
        shutil.rmtree(hidden, ignore_errors=True)

    def _sync_folder(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _sweep(self) -> None:
        """Remove the hidden folders of writers that died mid-entry."""
        now = time.time()
        for p in self.folder.glob(".*"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_S:
                    shutil.rmtree(p, ignore_errors=True)
