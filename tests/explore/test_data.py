"""The offline MNIST loader: integrity check, safe unpickling, shapes."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from explore.datasets import DataError, load_digits, load_mnist, mnist_path, read_mnist_pickle


def test_mnist_has_the_documented_splits() -> None:
    ds = load_mnist()
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (50_000, 10_000, 10_000)
    assert ds.train.x.dtype == np.float32 and ds.train.y.dtype == np.int64
    assert ds.train.x.shape == (50_000, 784)
    assert ds.train.x.min() >= 0.0 and ds.train.x.max() <= 1.0
    assert set(np.unique(ds.test.y)) == set(range(10))


def test_a_modified_file_is_rejected_before_unpickling(tmp_path: Path) -> None:
    bad = tmp_path / "mnist.pkl.gz"
    bad.write_bytes(mnist_path().read_bytes()[:-1] + b"\0")
    with pytest.raises(DataError, match=r"SHA-256 .* does not match"):
        read_mnist_pickle(bad)


def test_only_numpy_arrays_are_unpickled(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pkl.gz"

    class Boom:
        def __reduce__(self):
            return (print, ("pwned",))

    with gzip.open(evil, "wb") as f:
        pickle.dump(Boom(), f)
    import hashlib

    digest = hashlib.sha256(evil.read_bytes()).hexdigest()
    with pytest.raises(DataError, match=r"refusing to unpickle builtins\.print"):
        read_mnist_pickle(evil, sha256=digest)


def test_digits_stand_in_splits_everything_once() -> None:
    ds = load_digits()
    n = len(ds.train) + len(ds.valid) + len(ds.test)
    assert n == 1797 and ds.features == 64
