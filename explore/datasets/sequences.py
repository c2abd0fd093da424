"""Sequences held as arrays: :class:`SequenceDataset`, the search space's
``dataset: {kind: sequences, ...}`` (:func:`sequences_from_file`).

``x`` is either

- **tokens**: integers ``[N, L]``, each step an id in ``0..vocab-1`` (``vocab``
  inferred as the largest id plus one unless given), kept exactly as float32;
- **features**: numbers ``[N, L, F]``, each step ``F`` values, scaled per value
  (``standard`` or ``minmax``) on the training rows' real steps alone; real numbers
  ``[N, L]`` are a signal, one value a step (``F`` 1).

``y`` is ``[N]``: class labels or regression targets (the task inferred as for tables
unless given).  Rows may be padded: ``lengths`` (``[N]`` integers in ``1..L``) says
how many leading steps of each row are real, or ``padding`` is the value that marks a
padded step (a token id; for features, a step all of whose values are it).  A token
row's padded steps then hold the pad id (``padding``, by default 0, which no real step
may use), a feature row's steps end with a presence flag (1 real, 0 padding; padded
values are 0): :class:`~explore.datasets.sequence_shape.SequenceShape`.  The split is
random and stratified by class, by fraction (``valid``, ``test``), as for tables.

>>> x = np.array([[3, 1, 0, 0], [2, 2, 2, 1], [1, 3, 3, 0], [2, 1, 0, 0]] * 5)
>>> ds = SequenceDataset(x, np.array([0, 1] * 10), lengths=np.array([2, 4, 3, 2] * 5))
>>> ds.sequence
SequenceShape(length=4, channels=1, vocab=4, pad=0, masked=False)
>>> ds.rows, ds.features
((16, 4, 0), 4)
>>> sorted({tuple(r) for r in ds.load().train.x.tolist()})[:2]  # past a length: pad 0
[(1.0, 3.0, 3.0, 0.0), (2.0, 1.0, 0.0, 0.0)]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from explore.datasets._base import TASKS, BaseDataset, LoadedData, Split
from explore.datasets.data_files import _not_a_file, _npz_fits
from explore.datasets.errors import DataError, listing
from explore.datasets.preprocess import Preprocess, _plain
from explore.datasets.sequence_shape import SequenceShape
from explore.datasets.split import split_rows
from explore.datasets.target import (
    check_classes_seen,
    check_target,
    class_codes,
    encoded,
    infer_task,
    sorted_unique,
)

SCALES = ("standard", "minmax", "none")
MAX_TOKEN = 1 << 24  # ids above it are not exact as float32
ARRAYS = ("x", "y", "lengths")  # an .npz's


class SequenceDataset(BaseDataset):
    """Token or feature sequences ``x`` and their targets ``y`` (see the module):
    checked, split (``valid``, ``test`` fractions, stratified for a classification,
    reproducible from ``seed``) and, for features, scaled (``scale``: ``standard``,
    the default, ``minmax`` or ``none``; tokens are not scaled).  Raises
    :class:`DataError` naming the option (``x``, ``y``, ``lengths``, ``padding``,
    ``vocab``...) at fault.

    Attributes besides :class:`BaseDataset`'s: ``name``, ``rows`` (train, valid, test
    counts), ``preprocess`` (offset and scale per value of a row, the labels).
    """

    def __init__(self, x: Any, y: Any, *, lengths: Any = None,
                 padding: float | None = None, vocab: int | None = None,
                 valid: float = 0.2, test: float = 0.0, scale: str | None = None,
                 task: str | None = None, seed: int = 0, name: str = "sequences",
                 where: str = "the arrays") -> None:
        if task is not None and task not in TASKS:
            raise DataError(f"task {task!r}: one of {', '.join(TASKS)}", key="task")
        if scale is not None and scale not in SCALES:
            raise DataError(f"scale {scale!r}: one of {', '.join(SCALES)}", key="scale")
        for key, v, low in (("valid", valid, 0.0), ("test", test, -1.0)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not low < v < 1:
                raise DataError(f"{key}: a fraction of the rows in "
                                f"{'(0, 1)' if low == 0 else '[0, 1)'}, got {v!r}", key=key)
        self.name, self._where = name, where
        xs = _array(x, "x", where)
        ys = _array(y, "y", where)
        if xs.ndim not in (2, 3) or xs.shape[0] == 0 or xs.shape[1] == 0:
            raise DataError(f"{where}: x is {list(xs.shape)}: sequences are [rows, steps] "
                            "token ids or [rows, steps, values] features", key="x")
        n, steps = xs.shape[:2]
        if xs.dtype.kind not in "biuf":
            raise DataError(f"{where}: x is {xs.dtype}, not numbers", key="x")
        if xs.ndim == 2 and xs.dtype.kind == "f":  # one real value per step (a signal)
            xs = xs[:, :, None]
        tokens = xs.ndim == 2
        if ys.ndim != 1 or len(ys) != n:
            raise DataError(f"{where}: y is {list(ys.shape)}; x has {n:,} rows: y is one "
                            "target per row, [rows]", key="y")
        if vocab is not None and not tokens:
            raise DataError("vocab is the number of token ids: x holds features", key="vocab")
        if tokens and scale not in (None, "none"):
            raise DataError(f"scale {scale}: token ids are not scaled", key="scale")
        if padding is not None and (isinstance(padding, bool) or not isinstance(
                padding, int | float | np.number) or (tokens and padding != int(padding))):
            raise DataError(f"padding {padding!r}: the " + ("token id" if tokens else
                            "value") + " that marks a padded step", key="padding")
        if padding is not None and lengths is not None and not tokens:
            raise DataError("padding: lengths already say which steps are padding; give "
                            "one of them", key="padding")
        real = self._real_steps(xs, lengths, padding, tokens)  # bool [N, L]
        self.task = task or infer_task(ys)
        check_target(where, "y", ys, self.task)
        codes = None
        if self.task == "classification":
            codes = class_codes(ys, sorted_unique(ys))
            if codes.max() < 1:
                raise DataError(f"{where}: y has one class ({_plain(ys[0])!r}): nothing to "
                                "classify", key="y")
        try:
            train, valid_rows, test_rows = split_rows(n, valid, test, seed, codes)
        except DataError as e:
            raise DataError(str(e), key="valid") from None
        labels: tuple[Any, ...] = ()
        target_scale = None
        if self.task == "classification":
            labels = tuple(_plain(v) for v in sorted_unique(ys[train]))
            for part, rows in (("validation", valid_rows), ("test", test_rows)):
                check_classes_seen(f"{where} ({part} rows)", ys[rows], labels)
        else:
            yt = ys[train].astype(np.float64)
            target_scale = (float(yt.mean()), float(yt.std()) or 1.0)
        if tokens:
            # lengths or padding say rows may be padded: the layout says so even where
            # none of these rows is (a model of it takes padded rows)
            pad = int(padding) if padding is not None else \
                0 if lengths is not None else None
            self.sequence = self._token_shape(xs, real, pad, vocab, steps)
            rows_x = np.where(real, xs, pad if pad is not None else 0).astype(np.float32)
            names = tuple(f"x[{s}]" for s in range(steps))
            offset, spread = (0.0,) * steps, (1.0,) * steps
        else:
            feats = xs.shape[2]
            masked = lengths is not None or padding is not None
            self.sequence = SequenceShape(steps, feats, masked=masked)
            lo, span = _fit_scale(xs[train][real[train]].astype(np.float64),
                                  scale or "standard")
            values = ((xs - lo) / span).astype(np.float32)
            values[~real] = 0.0  # a padded step says nothing but its flag
            if masked:
                values = np.concatenate([values, real[..., None].astype(np.float32)], 2)
            rows_x = values.reshape(n, -1)
            width = self.sequence.step_width
            names = tuple(f"x[{s}][{f}]" if f < feats else f"x[{s}].present"
                          for s in range(steps) for f in range(width))
            offset = tuple(float(v) for _ in range(steps)
                           for v in (*lo, *([0.0] if masked else [])))
            spread = tuple(float(v) for _ in range(steps)
                           for v in (*span, *([1.0] if masked else [])))
        self.preprocess = Preprocess(
            columns=names, numeric=names, offset=offset, scale=spread, task=self.task,
            labels=labels, target_scale=target_scale,
            scaling="none" if tokens else scale or "standard")
        self.target_scale = target_scale
        self.classes = len(labels)
        self.features = self.sequence.features
        self.image = None
        self.pixel_scale = None
        self.rows = (len(train), len(valid_rows), len(test_rows))
        self.valid = self.rows[1]
        self._x = rows_x.reshape(n, self.features)
        self._y = ys
        self._parts = (train, valid_rows, test_rows)

    def _real_steps(self, xs: np.ndarray, lengths: Any, padding: float | None,
                    tokens: bool) -> np.ndarray:
        """Which steps of each row are real (bool ``[N, L]``), from ``lengths`` or the
        ``padding`` value (or all of them)."""
        n, steps = xs.shape[:2]
        where = self._where
        if lengths is not None:
            ls = _array(lengths, "lengths", where)
            if ls.ndim != 1 or len(ls) != n:
                raise DataError(f"{where}: lengths is {list(ls.shape)}; x has {n:,} rows: "
                                "one length per row", key="lengths")
            if ls.dtype.kind not in "iu":
                raise DataError(f"{where}: lengths is {ls.dtype}: whole numbers of steps",
                                key="lengths")
            bad = np.flatnonzero((ls < 1) | (ls > steps))
            if len(bad):
                raise DataError(f"{where}: row {bad[0]} has length {ls[bad[0]]}, not in "
                                f"1..{steps} (the steps of x)", key="lengths")
            return np.arange(steps) < ls[:, None]
        if padding is None:
            return np.ones((n, steps), bool)
        pad = xs == padding if tokens else np.all(xs == padding, axis=2)
        empty = np.flatnonzero(pad.all(1))
        if len(empty):
            raise DataError(f"{where}: row {empty[0]} is all padding ({padding!r}): every "
                            "row needs a real step", key="padding")
        return ~pad

    def _token_shape(self, xs: np.ndarray, real: np.ndarray, pad: int | None,
                     vocab: int | None, steps: int) -> SequenceShape:
        where = self._where
        if pad is not None and (pad < 0 or pad >= MAX_TOKEN):
            raise DataError(f"padding {pad}: a token id in 0..{MAX_TOKEN - 1}", key="padding")
        ids = xs[real]
        low = int(ids.min())
        if low < 0:
            row, step = (int(v[0]) for v in np.nonzero(real & (xs < 0)))
            raise DataError(f"{where}: row {row} has the token id {low} at step {step}: ids "
                            "are 0 or more", key="x")
        if pad is not None:
            used = real & (xs == pad)
            if used.any():
                row, step = (int(v[0]) for v in np.nonzero(used))
                raise DataError(f"{where}: row {row} has the padding id {pad} at step "
                                f"{step}, inside its length: a real token may not be the "
                                "padding id (set padding: to an id no token has, e.g. the "
                                "largest id plus one)", key="padding")
        top = max(int(ids.max()), -1 if pad is None else pad)
        if vocab is None:
            vocab = top + 1
        elif isinstance(vocab, bool) or vocab < 1:
            raise DataError(f"vocab {vocab!r}: the number of token ids, at least 1",
                            key="vocab")
        elif top >= vocab:
            over = real & (xs >= vocab)
            if over.any():
                row, step = (int(v[0]) for v in np.nonzero(over))
                raise DataError(f"{where}: row {row} has the token id {xs[row, step]} at "
                                f"step {step}, not below vocab {vocab}", key="x")
            raise DataError(f"padding {pad} is not below vocab {vocab}: the pad id is one "
                            "of the vocabulary's", key="padding")
        if vocab > MAX_TOKEN:
            raise DataError(f"vocab {vocab:,}: at most {MAX_TOKEN:,} ids (float32 holds "
                            "ids exactly up to it)", key="vocab")
        return SequenceShape(steps, 1, vocab=int(vocab), pad=pad)

    def load(self) -> LoadedData:
        """The train, valid and test rows: float32 ``[n, features]`` (token ids as
        float32, or scaled features with their presence flags) and the targets."""
        out = []
        for rows in self._parts:
            out.append(Split(self._x[rows], self._encode(self._y[rows])))
        return LoadedData(self.name, out[0], out[1], out[2], self.classes, self.task,
                          self.target_scale)

    def _encode(self, y: np.ndarray) -> np.ndarray:
        assert self.preprocess is not None
        return encoded(y, self.task, self.target_scale, self.preprocess.labels)


def _array(a: Any, key: str, where: str) -> np.ndarray:
    """``a`` as an array of numbers or labels; ragged lists and object arrays refused."""
    try:
        out = np.asarray(a)
    except ValueError:
        raise DataError(f"{where}: {key} is ragged (rows of different lengths): pad them "
                        "to one length and give lengths", key=key) from None
    if out.dtype == object and key != "y":
        raise DataError(f"{where}: {key} holds Python objects (ragged rows?): pad the rows "
                        "to one length in an array of numbers, and give lengths", key=key)
    return out


def _fit_scale(values: np.ndarray, scale: str) -> tuple[np.ndarray, np.ndarray]:
    """(offset, spread) per value of a step, over the training rows' real steps
    (``values``: ``[steps, F]``)."""
    k = values.shape[1]
    if scale == "none":
        return np.zeros(k), np.ones(k)
    if not np.all(np.isfinite(values)):
        raise DataError("x has missing or infinite values in real steps", key="x")
    if scale == "minmax":
        lo = values.min(0)
        span = values.max(0) - lo
        return lo, np.where(span == 0, 1.0, span)
    std = values.std(0)
    return values.mean(0), np.where(std == 0, 1.0, std)


def _load(path: Path, key: str) -> np.ndarray:
    if path.suffix.lower() != ".npy":
        raise DataError(f"{path}: {key} is a .npy file", key=key)
    if not path.is_file():
        raise DataError(f"{path}: {_not_a_file(path)}", key=key)
    try:
        a = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise DataError(f"{path}: {key} holds Python objects (ragged rows?): pad the "
                            "rows to one length in an array of numbers, and give lengths",
                            key=key) from None
        raise DataError(f"{path}: cannot read it: {e}", key=key) from None
    except Exception as e:
        raise DataError(f"{path}: cannot read it: {e}", key=key) from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise DataError(f"{path}: not a .npy array but an .npz archive; give it as path:",
                        key=key)
    return a


def sequences_from_file(path: str | Path | None = None, *, x: str | Path | None = None,
                        y: str | Path | None = None, lengths: str | Path | None = None,
                        **options: Any) -> SequenceDataset:
    """Sequences from an ``.npz`` (``path``: arrays ``x``, ``y`` and optionally
    ``lengths``) or ``.npy`` files (``x``, ``y``, optionally ``lengths``) as a
    :class:`SequenceDataset`; ``options`` are its own (``padding``, ``vocab``,
    ``valid``, ``test``, ``scale``, ``task``, ``seed``, ``name``).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     np.savez(f"{d}/s.npz", x=np.ones((10, 6, 2)), y=np.arange(10) % 2,
    ...              lengths=np.arange(10) % 6 + 1)
    ...     sequences_from_file(f"{d}/s.npz").sequence
    SequenceShape(length=6, channels=2, vocab=None, pad=None, masked=True)
    """
    if (path is None) == (x is None and y is None) or (x is None) != (y is None):
        raise DataError("give either path (an .npz of x, y and lengths) or x and y (.npy "
                        "files)", key="path")
    if path is not None:
        p = Path(path)
        if lengths is not None:
            raise DataError("lengths is an array of the .npz (path:), not a file of its "
                            "own", key="lengths")
        if p.suffix.lower() != ".npz":
            raise DataError(f"{p}: sequences are an .npz (path:) or .npy files (x: and "
                            "y:)", key="path")
        if not p.is_file():
            raise DataError(f"{p}: {_not_a_file(p)}", key="path")
        try:
            with np.load(p, allow_pickle=False) as z:
                names = list(z.files)
                extra = [a for a in names if a not in ARRAYS]
                if "x" not in names or "y" not in names or extra:
                    raise DataError(f"{p}: the arrays of sequences are x, y and optionally "
                                    f"lengths; it has {listing(names)}", key="path")
                have = [a for a in ARRAYS if a in names]
                _npz_fits(p, z, have)
                arrays = {a: z[a] for a in have}
        except DataError:
            raise
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise DataError(f"{p}: an array holds Python objects (ragged rows?): pad "
                                "the rows to one length and give lengths",
                                key="path") from None
            raise DataError(f"{p}: cannot read it: {e}", key="path") from None
        except Exception as e:
            raise DataError(f"{p}: cannot read it: {e}", key="path") from None
        options.setdefault("name", p.stem)
        return SequenceDataset(arrays["x"], arrays["y"], lengths=arrays.get("lengths"),
                               where=str(p), **options)
    assert x is not None and y is not None
    xs, ys = _load(Path(x), "x"), _load(Path(y), "y")
    ls = None if lengths is None else _load(Path(lengths), "lengths")
    options.setdefault("name", Path(x).stem)
    return SequenceDataset(xs, ys, lengths=ls, where=str(x), **options)
