"""Hostile data files, options and outputs: each is refused with exit status 2 and a
message naming the file and key at fault, before anything is written (no study, no
shared memory, no output file replaced), never a traceback."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explore.space import load_space
from explore.yamlio import SpaceError

ROOT = Path(__file__).resolve().parents[2]
REST = """budget: {trials: 1, rounds: 1, memory: 256MB, workers: 1}
keep_models: 0
model: {depth: 1, width: 8}
training: {batch_size: 16}
"""
X30 = np.random.default_rng(0).normal(size=(30, 3))
Y30 = np.arange(30) % 3


def _cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "explore.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _refused(tmp_path: Path, dataset: str, files: dict[str, bytes], key: str,
             words: str) -> None:
    """The space over ``files`` is refused at ``key`` with ``words``, by load_space and
    by ``explore run`` (status 2, no traceback, nothing written, no shared memory)."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    f = tmp_path / "s.yaml"
    f.write_text(f"dataset: {dataset}\n" + REST)
    with pytest.raises(SpaceError) as e:
        load_space(f)
    [err] = e.value.errors
    assert err.key == key and words in err.message, str(err)
    assert err.line == 1
    before, shm = sorted(os.listdir(tmp_path)), _shm()
    r = _cli("run", f, "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == before
    assert _shm() <= shm


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.savez(b, **arrays)  # type: ignore[arg-type]
    return b.getvalue()


def _parquet(frame: pd.DataFrame) -> bytes:
    b = io.BytesIO()
    frame.to_parquet(b)
    return b.getvalue()


XY = "{x: x.npy, y: y.npy}"
NPZ = "{path: data.npz}"


@pytest.mark.parametrize(("dataset", "files", "key", "words"), [
    ("{path: data.parquet, target: y}",
     {"data.parquet": _parquet(pd.DataFrame({"a": np.zeros(0), "y": np.zeros(0, int)}))},
     "dataset", "data.parquet: no rows (columns: a, y)"),
    ("{path: data.csv, target: y}", {"data.csv": b"a,b,y\n"}, "dataset",
     "data.csv: no rows (columns: a, b, y)"),
    (NPZ, {"data.npz": _npz(x=np.zeros((0, 3)), y=np.zeros(0, int))}, "dataset",
     "data.npz: no rows"),
    (XY, {"x.npy": _npy(np.zeros((0, 3))), "y.npy": _npy(np.zeros(0, int))}, "dataset",
     "x.npy: no rows"),
    (NPZ, {"data.npz": _npz(x=np.zeros((30, 0)), y=Y30)}, "dataset.x",
     "shape (30, 0): no features"),
    (NPZ, {"data.npz": _npz(x=X30, y=Y30.astype(complex))}, "dataset.target",
     "complex128"),
    (XY, {"x.npy": _npy(X30), "y.npy": _npy(Y30.astype(complex))}, "dataset.target",
     "complex128"),
    (XY, {"x.npy": _npz(x=X30), "y.npy": _npy(Y30)}, "dataset.x",
     "x.npy: not a .npy array but an .npz archive"),
    (XY, {"x.npy": _npy(np.float64(1.0)), "y.npy": _npy(Y30)}, "dataset.x",
     "a single value"),
])
def test_data_with_no_rows_no_features_or_no_real_target_is_refused(
        tmp_path: Path, dataset: str, files: dict[str, bytes], key: str, words: str) -> None:
    _refused(tmp_path, dataset, files, key, words)
