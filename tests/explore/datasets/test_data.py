"""The offline MNIST loader: integrity check, safe unpickling, shapes."""

from __future__ import annotations

import gzip
import os
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


def test_a_compact_load_is_the_same_pixels_in_a_quarter_of_the_bytes() -> None:
    """The rows a run asks for, streamed as uint8: exactly the float images' heads."""
    from explore.datasets import get

    full = load_mnist()
    small = get("mnist").load_compact(train=3000, valid=700)
    assert small.train.x.dtype == np.uint8 and small.train.x.shape == (3000, 784)
    assert small.valid.x.shape == (700, 784) and len(small.test) == 0
    np.testing.assert_array_equal(small.train.x.astype(np.float32) / 256, full.train.x[:3000])
    np.testing.assert_array_equal(small.valid.y, full.valid.y[:700])


def test_a_compact_load_never_holds_the_float_set() -> None:
    """Its peak (tracemalloc: numpy reports its buffers) is the kept uint8 rows plus a
    few chunks, not the 157 MB of the training images."""
    import tracemalloc

    from explore.datasets import get

    tracemalloc.start()
    try:
        get("mnist").load_compact(train=1000, valid=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = 1100 * 784 + 60_000 * 8  # pixels, and the labels read whole
    assert peak < kept + 4 * (4 << 20), f"peak {peak:,} bytes"


def test_the_streaming_reader_reads_arrays_of_any_protocol(tmp_path: Path) -> None:
    """Protocols 3 and 4 (MNIST's file is Python 2's protocol 2): the opcodes numpy
    arrays in tuples are written with."""
    from explore.datasets._pickle_arrays import load_arrays

    a = np.arange(600_000, dtype=np.float32).reshape(1000, 600)  # streamed (> 1 MiB)
    b = np.array([3, 1, 2], dtype=np.int64)
    for protocol in (3, 4):
        f = tmp_path / f"p{protocol}.pkl"
        f.write_bytes(pickle.dumps(((a, b), (b, a[:1])), protocol=protocol))
        seen: list[tuple] = []

        def stream(i: int, shape: tuple, dtype: np.dtype, r: object, n: int,
                   seen: list[tuple] = seen) -> np.ndarray:
            seen.append(shape)
            return np.frombuffer(r.read(n), dtype).reshape(shape)  # type: ignore[attr-defined]

        with open(f, "rb") as r:
            (x, y), (y2, x2) = load_arrays(r, stream)
        np.testing.assert_array_equal(y2, b)
        np.testing.assert_array_equal(x, a)
        np.testing.assert_array_equal(y, b)
        np.testing.assert_array_equal(x2, a[:1])
        assert seen == [(1000, 600)]


@pytest.mark.parametrize("cut", [10, 1000, 200_000])
def test_a_truncated_file_is_an_error(tmp_path: Path, cut: int) -> None:
    import hashlib

    bad = tmp_path / "short.pkl.gz"
    with gzip.open(mnist_path()) as f:
        head = f.read(cut)
    with gzip.open(bad, "wb") as f:
        f.write(head)
    digest = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(DataError, match="truncated"):
        read_mnist_pickle(bad, sha256=digest)


def test_digits_are_scikit_learns_read_without_importing_it() -> None:
    import subprocess
    import sys

    sklearn = pytest.importorskip("sklearn.datasets", reason="in the dev extra")
    ours = load_digits()
    theirs = sklearn.load_digits()
    order = np.random.default_rng(0).permutation(1797)
    np.testing.assert_array_equal(ours.train.x, (theirs.data[order][:1078] / 16.0)
                                  .astype(np.float32))
    np.testing.assert_array_equal(ours.test.y, theirs.target[order][1437:])
    code = ("import sys; from explore.datasets import load_digits; load_digits(); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_run_sweeps_the_shared_files_of_processes_that_are_gone(tmp_path: Path) -> None:
    """A shared file carries the pid of the process that made it; one whose process is
    gone (``kill -9``) is removed by the next sweep, the others are left alone."""
    import subprocess
    import sys

    from explore.scheduler.shared_arrays import PREFIX, SharedArrays, sweep_stale

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    names = [f"{PREFIX}{dead}-abc", f"{PREFIX}{os.getpid()}-def", f"{PREFIX}old", "other"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    removed = sweep_stale(str(tmp_path))
    assert removed == [str(tmp_path / names[0])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
    with SharedArrays({"x": np.zeros(3)}) as shm:  # its own file carries this pid
        assert os.path.basename(shm.path).startswith(f"{PREFIX}{os.getpid()}-")
