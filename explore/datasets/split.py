"""Splitting a table's rows into train, validation and test (:func:`split_rows`):
random, reproducible from a seed, and stratified by class for a classification."""

from __future__ import annotations

import numpy as np

from explore.datasets.errors import DataError


def _count(frac: float, n: int) -> int:
    return 0 if frac <= 0 else max(1, round(frac * n))


def _allocate(want: int, room: np.ndarray, share: np.ndarray) -> np.ndarray | None:
    """``want`` rows over classes in proportion to ``share`` (largest remainders, ties
    to the first class), at most ``room`` each; None if they do not fit."""
    if want > room.sum():
        return None
    quota = want * share / share.sum()
    take = np.minimum(np.floor(quota).astype(np.int64), room)
    order = np.argsort(-(quota - np.floor(quota)), kind="stable")
    while take.sum() < want:
        for c in order:
            if take.sum() < want and take[c] < room[c]:
                take[c] += 1
    return take


def split_rows(n: int, valid: float, test: float, seed: int = 0,
               classes: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Row indices (train, valid, test) of ``n`` rows, each in a random order: ``valid``
    and ``test`` fractions of the rows (at least one each when above 0), stratified by
    ``classes`` (class index per row) when given, so that each class keeps its share in
    every split and at least one row in train.  The same arguments give the same split.

    >>> y = np.array([0] * 8 + [1] * 2)
    >>> tr, va, te = split_rows(10, 0.5, 0.0, seed=0, classes=y)
    >>> sorted(np.bincount(y[tr]).tolist()), np.bincount(y[va]).tolist()
    ([1, 4], [4, 1])
    """
    rng = np.random.default_rng(seed)
    n_valid, n_test = _count(valid, n), _count(test, n)
    if n - n_valid - n_test < 1:
        raise DataError(f"too few rows: {n} rows cannot give {n_valid} validation and "
                        f"{n_test} test rows and still leave one to train on")
    if classes is None:
        perm = rng.permutation(n)
        return perm[n_valid + n_test:], perm[:n_valid], perm[n_valid:n_valid + n_test]
    counts = np.bincount(classes)
    per = [rng.permutation(np.flatnonzero(classes == c)) for c in range(len(counts))]
    room = counts - 1  # every class keeps a row to train on
    parts: list[list[np.ndarray]] = [[], [], []]
    taken = np.zeros(len(counts), np.int64)
    for slot, want in ((1, n_valid), (2, n_test)):
        take = _allocate(want, room - taken, counts.astype(np.float64))
        if take is None:
            raise DataError(f"too few rows: {n} rows in {len(counts)} classes cannot give "
                            f"{n_valid} validation and {n_test} test rows while every class "
                            f"keeps a row in training")
        for c, k in enumerate(take):
            parts[slot].append(per[c][taken[c]:taken[c] + k])
        taken += take
    for c in range(len(counts)):
        parts[0].append(per[c][taken[c]:])
    return tuple(rng.permutation(np.concatenate(p)) if p else np.empty(0, np.int64)
                 for p in parts)
