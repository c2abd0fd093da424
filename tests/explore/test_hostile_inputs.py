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

from explore.binding import bind
from explore.space import load_space, parse_space
from explore.yamlio import SpaceError
from tests.explore.cli_run import explore_here

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


def _refused(tmp_path: Path, dataset: str, files: dict[str, bytes], key: str,
             words: str) -> None:
    """The space over ``files`` is refused at ``key`` with ``words`` when it is bound to
    its data, and by ``explore run`` (status 2, no traceback, nothing written).  Refused
    when the run is prepared, so before any shared memory is made (a complex target used
    to leave its /dev/shm file behind)."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    f = tmp_path / "s.yaml"
    f.write_text(f"dataset: {dataset}\n" + REST)
    with pytest.raises(SpaceError) as e:
        bind(load_space(f))
    [err] = e.value.errors
    assert err.key == key and words in err.message, str(err)
    assert err.line == 1
    before = sorted(os.listdir(tmp_path))
    r = explore_here("run", f, "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == before


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


# -- a stored study: export, export-model, evaluate -----------------------------------------

@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``s.yaml`` and its study ``s`` (one trial, its model kept)."""
    d = tmp_path_factory.mktemp("study")
    (d / "s.yaml").write_text("dataset: digits\n" + REST.replace("keep_models: 0",
                                                                  "keep_models: 1"))
    r = _cli("run", "s.yaml", "--quiet", cwd=d)
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture
def stored(study_dir: Path, tmp_path: Path) -> Path:
    import shutil

    d = tmp_path / "d"
    shutil.copytree(study_dir, d)
    return d


def _state(d: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``d``: its type, size and modification time (links not
    followed)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _special(d: Path, kind: str) -> str:
    """A FIFO, socket, character device (one like /dev/null's), link or folder named
    ``out.csv`` in ``d``."""
    import socket
    import stat

    p = d / "out.csv"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    elif kind == "device":
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "link":
        (d / "real.csv").write_text("keep me\n")
        p.symlink_to(d / "real.csv")
    elif kind == "folder":
        p.mkdir()
    return p.name


@pytest.mark.parametrize("cmd", ["export", "export-model"])
@pytest.mark.parametrize(("kind", "says"), [
    ("fifo", "not a regular file"), ("socket", "not a regular file"),
    ("device", "not a regular file"), ("link", "a symbolic link"), ("folder", "directory"),
])
def test_output_never_replaces_a_special_file_or_follows_a_link(
        stored: Path, cmd: str, kind: str, says: str) -> None:
    name = _special(stored, kind)
    before = _state(stored)
    # a FIFO opened for writing would block: a process of its own, and its timeout
    r = (_cli if kind == "fifo" else explore_here)(cmd, "s.yaml", "--output", name, cwd=stored)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _state(stored) == before


@pytest.mark.parametrize("cmd", ["export", "export-model"])
@pytest.mark.parametrize(("output", "says"), [
    ("no/such/out.csv", "the folder no/such does not exist"),
    ("s.db", "the command reads this file"),
    ("s.yaml", "the command reads this file"),
    ("", "--output is empty"),
])
def test_output_in_a_missing_folder_or_over_what_the_command_reads_is_refused(
        stored: Path, cmd: str, output: str, says: str) -> None:
    before = _state(stored)
    r = explore_here(cmd, "s.yaml", "--output", output, cwd=stored)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _state(stored) == before


def test_output_replaces_a_regular_file_whole_keeping_its_mode(stored: Path) -> None:
    (stored / "t.csv").write_text("old\n")
    os.chmod(stored / "t.csv", 0o640)
    (stored / ".t.csv.tmp").write_text("not the exporter's\n")  # the old fixed temp name
    r = explore_here("export", "s.yaml", "--output", "t.csv", cwd=stored)
    assert r.returncode == 0, r.stderr
    assert (stored / "t.csv").read_text().startswith("number,") or \
        "number" in (stored / "t.csv").read_text().splitlines()[0]
    assert (stored / "t.csv").stat().st_mode & 0o777 == 0o640
    assert (stored / ".t.csv.tmp").read_text() == "not the exporter's\n"
    assert not [p for p in stored.iterdir() if p.name.startswith(".t.csv.") and
                p.name != ".t.csv.tmp"]


def test_evaluate_with_a_space_of_another_data_set_is_refused(stored: Path) -> None:
    (stored / "other.yaml").write_text("dataset: iris\n" + REST)
    r = explore_here("evaluate", "other.yaml", "--storage", "sqlite:///s.db", "--study", "s",
                     cwd=stored)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "is not the one study 's' was trained on" in said, said
    assert "features: 4 where the model has 64" in said and "Traceback" not in said


def test_a_fifo_as_the_space_or_a_data_file_is_refused_without_blocking(
        tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.yaml")
    r = _cli("run", "f.yaml", "--quiet", cwd=tmp_path)  # timeout=120: a hang fails
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    os.mkfifo(tmp_path / "data.csv")
    (tmp_path / "s.yaml").write_text("dataset: {path: data.csv, target: y}\n" + REST)
    with pytest.raises(SpaceError) as e:
        bind(load_space(tmp_path / "s.yaml"))
    [err] = e.value.errors
    assert err.key == "dataset.path" and "not a regular file" in err.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv", "f.yaml", "s.yaml"]


# -- sizes: refused from headers and counts, before anything big is allocated ---------------

def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    import struct

    d = str({"descr": descr, "fortran_order": False, "shape": shape})
    d += " " * (64 - (10 + len(d) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()


def test_an_npz_declaring_more_than_the_cap_is_refused_before_decompressing(
        tmp_path: Path) -> None:
    """A few MB of deflated zeros can declare gigabytes: the header says, and is read
    first (here the data after it is not even there)."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "data.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", _npy_header((10**9, 4)) + b"\0" * 64)
        z.writestr("y.npy", _npy(Y30))
    _refused(tmp_path, NPZ, {}, "dataset.path", "32,000,000,240 bytes decompressed")


def test_a_csv_wider_than_the_feature_cap_is_refused_from_its_header(tmp_path: Path) -> None:
    import time

    from explore.datasets.columns import MAX_FEATURES

    n = MAX_FEATURES + 1
    (tmp_path / "data.csv").write_text(",".join(f"c{i}" for i in range(n)) + ",y\n" +
                                       ",".join("1" for _ in range(n)) + ",0\n")
    t0 = time.monotonic()
    _refused(tmp_path, "{path: data.csv, target: y}", {}, "dataset.path",
             f"{n + 1:,} columns, more than the {MAX_FEATURES:,} features")
    assert time.monotonic() - t0 < 60  # two reads of the space and a CLI run


def test_a_categorical_column_of_too_many_categories_is_refused(tmp_path: Path) -> None:
    from explore.datasets.columns import MAX_CATEGORIES

    rows = "".join(f"{i},k{i},{i % 2}\n" for i in range(int(MAX_CATEGORIES * 1.3)))
    (tmp_path / "data.csv").write_text("a,cat,y\n" + rows)
    _refused(tmp_path, "{path: data.csv, target: y, categorical: [cat]}", {},
             "dataset.categorical", f"more than the {MAX_CATEGORIES:,} a column may")


def test_table_rows_larger_than_the_budget_are_refused_before_any_study(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(3000, 100)), columns=[f"c{i}" for i in range(100)])
    frame["y"] = np.arange(3000) % 2
    frame.to_csv(tmp_path / "data.csv", index=False)
    f = tmp_path / "s.yaml"
    f.write_text("dataset: {path: data.csv, target: y}\n" +
                 REST.replace("memory: 256MB", "memory: 1MB"))
    r = _cli("run", f, "--quiet", cwd=tmp_path)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "3,000 training and validation rows of 100 features" in said
    assert "more than the budget of 1,000,000 bytes" in said and "Traceback" not in said
    assert "s.yaml:1: dataset: its 3,000" in said, said  # the file, line and key at fault
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv", "s.yaml"]


@pytest.mark.parametrize(("option", "says"), [
    ("valid: 1000", "1,000 validation rows asked for, but the split has 12"),
    ("train: 1000", "1,000 training rows asked for, but the split has 48"),
])
def test_more_head_rows_than_the_split_has_are_refused(tmp_path: Path, option: str,
                                                      says: str) -> None:
    rows = "".join(f"{i},{i * 2},{i % 3}\n" for i in range(60))
    _refused(tmp_path, f"{{path: data.csv, target: y, {option}}}",
             {"data.csv": ("a,b,y\n" + rows).encode()}, f"dataset.{option.split(':')[0]}",
             says)


@pytest.mark.parametrize(("name", "train", "says"), [
    ("digits", 100_000, "100,000 training rows asked for, but the split has 1,078"),
    ("mnist", 60_000, "60,000 training rows asked for, but the split has 50,000"),
    ("mnist_rows", 50_001, "but the split has 50,000"),
])
def test_a_built_in_sets_training_head_beyond_its_split_is_refused(
        name: str, train: int, says: str) -> None:
    """It was clamped to the split without a word; a table's is refused so too."""
    space = parse_space({"dataset": {"name": name, "train": train},
                         "budget": {"trials": 1, "rounds": 1, "memory": "400MB"}})
    with pytest.raises(SpaceError, match=says):
        bind(space)
    bind(parse_space({"dataset": {"name": name, "train": 1078 if name == "digits"
                                  else 50_000},  # all of the split is fine
                      "budget": {"trials": 1, "rounds": 1, "memory": "400MB"}}))


def test_digits_training_split_is_the_size_it_says() -> None:
    from explore.datasets import get

    digits = get("digits")
    assert len(digits.load().train.y) == digits.train_rows


# -- messages: one paragraph, naming the key ------------------------------------------------

@pytest.mark.parametrize(("column", "key"), [("l", "dataset.categorical"),
                                             ("y", "dataset.target")])
def test_a_parquet_list_column_is_named_with_its_row(tmp_path: Path, column: str,
                                                     key: str) -> None:
    frame = pd.DataFrame({"a": np.arange(30.0), "l": [[1, 2]] * 30, "y": np.arange(30) % 2})
    if column == "y":
        frame = pd.DataFrame({"a": np.arange(30.0), "y": [[1, 2]] * 30})
    cats = ", categorical: [l]" if column == "l" else ""
    _refused(tmp_path, f"{{path: data.parquet, target: y{cats}}}",
             {"data.parquet": _parquet(frame)}, key,
             f"row 1, column '{column}': holds a list of values")


def test_an_infinite_target_is_one_error_without_numpys_warnings(tmp_path: Path) -> None:
    rows = "".join(f"{i},{'inf' if i == 5 else i * 0.37}\n" for i in range(30))
    (tmp_path / "data.csv").write_text("a,y\n" + rows)
    (tmp_path / "s.yaml").write_text("dataset: {path: data.csv, target: y}\n" + REST)
    r = _cli("size", "s.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "target 'y': 1 infinite, at index 5 (line 7)" in r.stderr, r.stderr
    assert "Warning" not in r.stderr


def test_a_choice_of_lists_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("dataset: digits\n" + REST.replace(
        "width: 8", "width: {choice: [[8, 16], 32]}"))
    with pytest.raises(SpaceError) as e:
        load_space(tmp_path / "s.yaml")
    [err] = e.value.errors
    assert err.key == "model.width.choice" and "option 0 is a list" in err.message
    assert "per_layer: true" in err.message
