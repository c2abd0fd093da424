"""A study's file deleted or replaced under a run (``explore.storages.files``): found
through Optuna's and explore's wrappers, and named; a deleted database's log removed
so that no later database at that path replays it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import optuna
import pytest

from explore.storages import open_storage, release
from explore.storages.files import StorageFile, backing_file


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_the_file_is_found_through_the_wrappers(tmp_path: Path, kind: str) -> None:
    name = "s.db" if kind == "sqlite" else "s.log"
    storage = open_storage(f"{kind}:///{tmp_path / name}")
    try:
        assert not isinstance(storage, str)
        optuna.create_study(storage=storage, study_name="s")
        wrapped = optuna.storages.get_storage(storage)  # Optuna's cache over a database
        assert backing_file(wrapped) == (kind, (tmp_path / name).resolve())
    finally:
        release(storage)


def test_memory_and_servers_have_no_file() -> None:
    assert backing_file(optuna.storages.InMemoryStorage()) is None
    assert backing_file(optuna.storages.RDBStorage("sqlite:///:memory:")) is None
    assert StorageFile.of(optuna.storages.InMemoryStorage()) is None


def test_a_replaced_file_is_named_as_replaced(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    watch = StorageFile.of(storage)
    assert watch is not None and watch.lost() is None
    shutil.copy(path, tmp_path / "copy.db")
    os.replace(tmp_path / "copy.db", path)  # a copy restored over it: another inode
    why = watch.lost()
    assert why is not None and f"database file {path}" in why and "replaced" in why


def test_a_deleted_databases_log_is_removed_with_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    watch = StorageFile.of(storage)
    assert watch is not None
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").write_bytes(b"\1" * 64)  # as a killed writer leaves them
    path.unlink()
    why = watch.lost()
    assert why is not None and "deleted" in why and "run the same command" in why
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    path.write_bytes(b"")  # a database at the path again: its log is its own
    Path(f"{path}-wal").write_bytes(b"\1")
    assert watch.lost() is not None and Path(f"{path}-wal").exists()


def test_a_file_made_anew_at_the_path_is_not_the_one_watched(tmp_path: Path) -> None:
    """A journal deleted under a run and made anew at its path by the next append: the
    new file must not pass for the watched one, even where the file system would hand
    it the freed inode number (the watch holds the file open, so none is freed)."""
    path = tmp_path / "s.log"
    for attempt in range(20):
        path.write_text("{}\n" * 100)
        watch = StorageFile("journal", path)
        path.unlink()
        path.write_text("{}\n")  # the next append, at the same path
        lost = watch.lost()
        assert lost is not None and "was deleted" in lost, attempt
        path.unlink()


def test_a_deleted_database_is_not_made_anew_by_the_next_connection(tmp_path: Path) -> None:
    """A connection opened after the database was deleted (another thread's call, or one
    replacing a connection that failed) must fail, not create an empty database at the
    path: that database would take the deleted one's log, and the watch would no longer
    find the path empty to remove the log."""
    path = tmp_path / "s.db"
    storage = open_storage(f"sqlite:///{path}")
    try:
        assert isinstance(storage, optuna.storages.RDBStorage)
        optuna.create_study(storage=storage, study_name="s")
        watch = StorageFile.of(storage)
        assert watch is not None
        path.unlink()
        storage.engine.dispose()  # every connection from now on is a new one
        with pytest.raises(Exception) as failed:  # Optuna wraps SQLite's error
            storage.get_all_studies()
        causes = [failed.value]
        while causes[-1].__cause__ is not None:
            causes.append(causes[-1].__cause__)
        assert any("unable to open database file" in str(e) for e in causes), causes
        assert not path.exists()
        why = watch.lost()
        assert why is not None and "deleted" in why
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        release(storage)
