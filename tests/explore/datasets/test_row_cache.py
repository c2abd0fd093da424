"""explore.datasets.row_cache: MNIST's compact rows come from the cache exactly as the
pickle streams them, an entry serves any request it covers, and a damaged, partial,
unwritable or racing cache is passed over without changing what a run trains on."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from explore.datasets import get
from explore.datasets._mnist import FULL, MNIST_SHA256, mnist_path, read_mnist_pickle
from explore.datasets.row_cache import NAMES, RowCache
from explore.scheduler.shared_arrays import SharedArrays


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EXPLORE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@functools.cache  # the pickle read in full each time: once a process (not changed)
def streamed(train: int | None, valid: int | None) -> dict[str, np.ndarray]:
    d = read_mnist_pickle(mnist_path(), rows=(train, valid, 0), scale=1 / 256)
    return {"x_train": d.train.x, "y_train": d.train.y, "x_valid": d.valid.x,
            "y_valid": d.valid.y}


def arrays(data: object) -> dict[str, np.ndarray]:
    return {"x_train": data.train.x, "y_train": data.train.y,  # type: ignore[attr-defined]
            "x_valid": data.valid.x, "y_valid": data.valid.y}  # type: ignore[attr-defined]


def entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.glob("datasets/*/*"))


def same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name in NAMES:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_second_load_reads_the_rows_the_first_streamed(cache_dir: Path) -> None:
    first = arrays(get("mnist").load_compact(300, 200))
    assert entries(cache_dir) == ["300-200"]
    again = arrays(get("mnist").load_compact(300, 200))
    same(again, first)
    same(again, streamed(300, 200))


@pytest.mark.parametrize(("train", "valid"), [(100, 50), (300, None), (1, 0)])
def test_an_entry_serves_every_request_it_covers(cache_dir: Path, train: int | None,
                                                 valid: int | None) -> None:
    get("mnist").load_compact(300, None)  # an entry of 300 and every validation row
    assert entries(cache_dir) == [f"300-{FULL[1]}"]
    same(arrays(get("mnist").load_compact(train, valid)), streamed(train, valid))
    assert entries(cache_dir) == [f"300-{FULL[1]}"]  # nothing new written


def test_a_request_no_entry_covers_is_streamed_and_kept(cache_dir: Path) -> None:
    get("mnist").load_compact(100, 50)
    get("mnist").load_compact(50, 80)  # more validation rows: both entries are needed
    assert entries(cache_dir) == ["100-50", "50-80"]
    same(arrays(get("mnist").load_compact(400, 80)), streamed(400, 80))
    assert entries(cache_dir) == ["400-80"]  # it covers both: they are removed
    same(arrays(get("mnist").load_compact(100, 50)), streamed(100, 50))


def test_the_shared_file_gets_the_same_arrays_either_way() -> None:
    def shared_load() -> tuple[dict[str, tuple], dict[str, np.ndarray]]:
        shared = SharedArrays()
        try:
            arrays(get("mnist").load_compact(200, 100, empty=shared.empty))
            return ({k: (v.shape, v.dtype) for k, v in shared.spec.items()},
                    {k: np.array(a) for k, a in shared.arrays.items()})
        finally:
            shared.close()

    cold_spec, cold = shared_load()
    warm_spec, warm = shared_load()
    assert warm_spec == cold_spec  # the same names, shapes and dtypes (their order in
    # the file may differ: the workers find each array by its spec)
    for k in cold:
        np.testing.assert_array_equal(warm[k], cold[k])


@pytest.mark.parametrize("damage", ["truncated", "wrong dtype", "missing", "not npy"])
def test_a_damaged_entry_is_passed_over(cache_dir: Path, damage: str) -> None:
    get("mnist").load_compact(200, 100)
    (folder,) = cache_dir.glob("datasets/*/200-100")
    victim = folder / "x_train.npy"
    if damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:-10])
    elif damage == "wrong dtype":
        np.save(victim, np.zeros((200, 784), np.float32))
    elif damage == "missing":
        victim.unlink()
    else:
        victim.write_bytes(b"not a numpy file at all")
    same(arrays(get("mnist").load_compact(200, 100)), streamed(200, 100))
    # the damaged entry was removed and a whole one written in its place
    assert entries(cache_dir) == ["200-100"]
    got = RowCache("mnist", MNIST_SHA256, 1 / 256, FULL, 784).read(200, 100)
    assert got is not None
    same(got, streamed(200, 100))
    assert not list(folder.parent.glob(".*"))


def test_negative_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        RowCache("mnist", MNIST_SHA256, 1 / 256, FULL, 784).read(-1, None)


def test_an_unwritable_cache_leaves_the_load_as_it_was(cache_dir: Path) -> None:
    cache_dir.parent.mkdir(exist_ok=True)
    cache_dir.write_text("a file where the cache folder would be")
    same(arrays(get("mnist").load_compact(150, 20)), streamed(150, 20))
    assert cache_dir.read_text() == "a file where the cache folder would be"


def test_a_dead_writers_folder_is_ignored_then_swept(cache_dir: Path) -> None:
    cache = RowCache("mnist", MNIST_SHA256, 1 / 256, FULL, 784)
    hidden = cache.folder / ".deadbeef"
    hidden.mkdir(parents=True)
    (hidden / "x_train.npy").write_bytes(b"half")
    assert cache.read(10, 10) is None  # not an entry
    old = 10 * 3600
    os.utime(hidden, (os.path.getmtime(hidden) - old,) * 2)
    get("mnist").load_compact(10, 10)
    assert not hidden.exists() and entries(cache_dir) == ["10-10"]


def test_writers_racing_leave_one_whole_entry(cache_dir: Path) -> None:
    want = streamed(120, 30)
    cache = RowCache("mnist", MNIST_SHA256, 1 / 256, FULL, 784)
    gate = threading.Barrier(4)

    def write() -> None:
        gate.wait()
        cache.write(want)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert entries(cache_dir) == ["120-30"]
    assert not list(cache.folder.glob(".*"))  # no writer's folder left behind
    got = cache.read(120, 30)
    assert got is not None
    same(got, want)


def test_float_arrays_are_not_kept(cache_dir: Path) -> None:
    cache = RowCache("mnist", MNIST_SHA256, 1 / 256, FULL, 784)
    want = streamed(5, 5)
    cache.write({**want, "x_train": want["x_train"].astype(np.float32)})
    assert entries(cache_dir) == [] and cache.read(5, 5) is None
