"""A journal never holds a partial record that a later append extends (issue 32, item
3): one left by a write that did not finish is cut off when the journal is opened or
appended to, and a failed append cuts the file back to where it began.  After either,
Optuna's own reader (no explore code) loads the whole study."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from explore.storages import open_storage
from explore.storages._journal import PartialRecordWarning, cut_partial_record
from tests.explore.drivers import fill, small_disk


def plain_load(path: Path) -> optuna.Study:
    """The study as Optuna alone reads it."""
    return optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(
        str(path))))


def study_with_trials(path: Path, n: int) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(f"journal://{path}"))
    for i in range(n):
        study.add_trial(optuna.trial.create_trial(params={"x": float(i)},
                                                  distributions={"x": optuna.distributions
                                                                 .FloatDistribution(0, 100)},
                                                  value=float(i)))


def test_a_partial_last_record_is_cut_off_on_open_and_the_study_stays_readable(
        tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 3)
    whole = path.stat().st_size
    partial = b'{"op_code":4,"worker_id":"x","study_id":0,"datetime_st'
    with open(path, "ab") as f:  # what a write cut short by a full disk leaves
        f.write(partial)
    with pytest.warns(PartialRecordWarning, match=rf"\({len(partial)} bytes"):
        storage = open_storage(f"journal://{path}")
    assert path.stat().st_size == whole
    study = optuna.load_study(study_name="s", storage=storage)
    study.add_trial(optuna.trial.create_trial(
        params={"x": 50.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 100)},
        value=50.0))
    assert [t.value for t in plain_load(path).trials] == [0.0, 1.0, 2.0, 50.0]


def test_cutting_keeps_every_whole_record(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(b"a\n" + b"b" * 70_000 + b"\n" + b"c" * 100_000)  # past one block
    assert cut_partial_record(path) == 100_000
    assert path.read_bytes() == b"a\n" + b"b" * 70_000 + b"\n"
    assert cut_partial_record(path) == 0
    path.write_bytes(b"no newline at all")
    assert cut_partial_record(path) == 17 and path.read_bytes() == b""
    assert cut_partial_record(tmp_path / "missing") == 0


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 2)
    before = path.read_bytes()
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    study = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        study.set_user_attr("note", "x" * 1000)
    monkeypatch.undo()
    assert path.read_bytes() == before
    study.set_user_attr("note", "written")  # the next append is whole
    assert plain_load(path).user_attrs == {"note": "written"}


def test_a_journal_on_a_full_disk_stays_readable(tmp_path: Path) -> None:
    """A real full disk: appends fail with ENOSPC until room is made, and the file never
    holds a partial record (Optuna's reader loads it after every failure)."""
    with small_disk(tmp_path, "256k") as disk:
        path = disk / "s.log"
        study_with_trials(path, 1)
        study = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
        filler = fill(disk)
        before = path.read_bytes()
        for i in range(3):
            with pytest.raises(OSError) as e:
                study.set_user_attr(f"k{i}", "v" * 20_000)
            assert e.value.errno == errno.ENOSPC
            assert path.read_bytes() == before  # cut back: no partial record
        filler.unlink()
        study.set_user_attr("k", "v" * 20_000)
        assert plain_load(path).user_attrs == {"k": "v" * 20_000}
