"""Reading a data file into a :class:`~explore.datasets.source.Source`: a CSV or
Parquet table, an ``.npz`` of arrays, or ``x`` and ``y`` ``.npy`` files
(memory-mapped).  Each is refused with a :class:`DataError` naming the file when it
cannot be read, and when its header declares more than the limits allow, before its
data is read."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy

from explore.datasets.columns import MAX_FEATURES
from explore.datasets.errors import DataError, listing
from explore.datasets.preprocess import _pd
from explore.datasets.source import Source

FORMATS = (".csv", ".parquet", ".npz", ".npy")
# search_spaces/README.md, "Limits": checked before anything is allocated
MAX_NPZ_BYTES = 2 << 30  # an .npz's arrays, decompressed (read into memory whole)


def _npz_fits(path: Path, z: Any, names: list[str]) -> None:
    """Refuse an ``.npz`` whose arrays would decompress to more than
    :data:`MAX_NPZ_BYTES`, from their headers, before decompressing anything (a few MB
    of deflated zeros can declare gigabytes)."""
    total = 0
    for name in names:
        with z.zip.open(f"{name}.npy") as f:
            version = npy.read_magic(f)
            read = {(1, 0): npy.read_array_header_1_0,
                    (2, 0): npy.read_array_header_2_0}.get(version)
            if read is None:
                raise DataError(f"{path}: array {name!r} is in .npy format {version}; "
                                "save it with numpy.savez (format 1.0 or 2.0)", key="path")
            shape, _, dtype = read(f)
        total += math.prod(shape) * dtype.itemsize
    if total > MAX_NPZ_BYTES:
        raise DataError(f"{path}: its arrays would take {total:,} bytes decompressed, more "
                        f"than the {MAX_NPZ_BYTES:,} an .npz may (it is read into "
                        "memory whole); give larger data as x: and y: .npy files, which "
                        "are memory-mapped", key="path")


def _csv_columns(path: Path) -> int:
    """The columns of a CSV's header line (the first 16 MiB of it at most): pandas
    takes seconds and hundreds of MB to parse a header of 200,000 names alone."""
    with open(path, "rb") as f:
        line = f.readline(16 << 20).decode("utf-8", "replace")
    return max((len(r) for r in csv.reader([line.rstrip("\r\n")])), default=0)


def _few_columns(path: Path, n: int, key: str) -> None:
    """A table's columns, from its header, before its rows are read."""
    if n > MAX_FEATURES + 1:
        raise DataError(f"{path}: {n:,} columns, more than the {MAX_FEATURES:,} features "
                        "(and a target) a model's input may have", key=key)


def _not_a_file(path: Path) -> str:
    return "not a regular file (a folder, FIFO, device or socket)" if path.exists() else \
        "no such file"


def read_file(path: Path, target: str | None, features: Sequence[str] | None,
              key: str = "path") -> Source:
    """The table or arrays of ``path`` (a ``.csv``, ``.parquet`` or ``.npz``; an
    ``.npz``'s target array is ``target`` or ``y``, its features array the one other or
    ``features[0]``); ``key`` is the ``dataset:`` option that named the file."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: unknown format {path.suffix or '(no suffix)'!r}; data files "
                        f"are {', '.join(FORMATS)}", key=key)
    if not path.is_file():
        raise DataError(f"{path}: {_not_a_file(path)}", key=key)
    try:
        if suffix == ".csv":
            _few_columns(path, _csv_columns(path), key)
            return Source(str(path), frame=_pd().read_csv(path), csv=path)
        if suffix == ".parquet":
            # Imported only to read a Parquet file: like pandas, pyarrow is a large
            # import that most processes never need.
            import pyarrow.parquet as pq  # noqa: PLC0415 (only to read a Parquet file)

            _few_columns(path, len(pq.read_schema(path).names), key)
            return Source(str(path), frame=_pd().read_parquet(path))
        if suffix == ".npy":
            raise DataError(f"{path}: a .npy file holds one array: give x: and y: files "
                            f"instead of path:", key=key)
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            tname = target or ("y" if "y" in names else None)
            if tname is None or tname not in names:
                raise DataError(f"{path}: no array {tname!r} for the target; arrays: "
                                f"{', '.join(names)}" if tname else
                                f"{path}: name the target array (target:); arrays: "
                                f"{', '.join(names)}", key="target")
            others = [n for n in names if n != tname]
            if features is not None:
                if len(features) != 1 or features[0] not in names or features[0] == tname:
                    raise DataError(f"{path}: features names the one features array; "
                                    f"arrays: {', '.join(names)}", key="features")
                xname = features[0]
            elif len(others) != 1:
                raise DataError(f"{path}: {len(others)} arrays besides the target "
                                f"({', '.join(others)}); name the features one "
                                f"(features: [name])", key="features")
            else:
                xname = others[0]
            _npz_fits(path, z, [xname, tname])
            return Source(str(path), x=z[xname], y=z[tname])
    except DataError:
        raise
    except Exception as e:  # a parser's or numpy's own message
        raise DataError(f"{path}: cannot read it: {e}", key=key) from None


def read_pair(x: Path, y: Path) -> Source:
    """The features ``x`` and target ``y`` ``.npy`` files, memory-mapped."""
    for p, key in ((x, "x"), (y, "y")):
        if p.suffix.lower() != ".npy":
            raise DataError(f"{p}: x and y are .npy files", key=key)
        if not p.is_file():
            raise DataError(f"{p}: {_not_a_file(p)}", key=key)
    try:
        xs = np.load(x, mmap_mode="r", allow_pickle=False)
        ys = np.load(y, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise DataError(f"{x} / {y}: cannot read them: {e}", key="x") from None
    for p, a, key in ((x, xs, "x"), (y, ys, "y")):
        if not isinstance(a, np.ndarray):  # np.load opens an .npz whatever its name
            for b in (xs, ys):
                if hasattr(b, "close"):
                    b.close()
            raise DataError(f"{p}: not a .npy array but an .npz archive (arrays: "
                            f"{listing(list(a.files))}); give it as path:", key=key)
    return Source(f"{x}", x=xs, y=np.asarray(ys))
