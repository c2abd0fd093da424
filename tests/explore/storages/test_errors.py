"""Storage errors say what happened and what to do (issue 32, item 6), where Optuna's
relational storage reads "invalid data in the commit" for all of them: a corrupt SQLite
file, a disk full under it, a database server that is not there, a study name longer
than PostgreSQL's column.  Real files, real drivers and a real server; exit 2 for what
the user gave, no traceback."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from explore.storages import explain
from tests.explore.cli_run import explore_run
from tests.explore.drivers import small_disk
from tests.explore.test_explore_run import write


def test_a_corrupt_sqlite_file_is_named_as_such(tmp_path: Path) -> None:
    f = write(tmp_path, trials=2)
    db = tmp_path / "broken.db"
    db.write_bytes(b"SQLite format 3\0" + bytes(range(256)) * 64)  # a header, then garbage
    out = explore_run(f, "--storage", f"sqlite:///{db}")
    assert out.exit_code == 2, out.output
    assert "corrupt" in out.output and "Traceback" not in out.output, out.output
    shown = subprocess.run([sys.executable, "-m", "explore.cli", "show", "--storage",
                            f"sqlite:///{db}", "--study", "tiny"], capture_output=True,
                           text=True)
    assert shown.returncode == 2, shown.stderr
    assert "corrupt" in shown.stdout + shown.stderr
    assert "Traceback" not in shown.stdout + shown.stderr


def test_a_full_disk_under_sqlite_is_named_through_optunas_commit_error() -> None:
    """Optuna's own wrapping of a real SQLite error, as a commit raises it."""
    with pytest.raises(optuna.exceptions.StorageInternalError) as caught:
        try:
            raise sqlalchemy.exc.OperationalError(
                "INSERT ...", {}, sqlite3.OperationalError("database or disk is full"))
        except sqlalchemy.exc.SQLAlchemyError as e:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit. This typically happens due "
                "to invalid data in the commit, e.g. exceeding max length.") from e
    said = explain(caught.value)
    assert said.startswith("the disk that holds the study's storage is full")
    assert "run the same command to go on" in said


def test_a_database_server_that_does_not_answer_is_named() -> None:
    pytest.importorskip("psycopg")
    engine = sqlalchemy.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                                      connect_args={"connect_timeout": 2})
    with pytest.raises(sqlalchemy.exc.OperationalError) as caught:
        engine.connect()
    assert explain(caught.value).startswith("the database server went away")


def test_an_unknown_error_gives_its_innermost_cause() -> None:
    try:
        try:
            raise KeyError("deep")
        except KeyError as e:
            raise RuntimeError("outer") from e
    except RuntimeError as e:
        assert explain(e) == "KeyError: 'deep'"


@pytest.mark.slow
def test_a_study_name_longer_than_postgres_holds(tmp_path: Path, postgres_url: str) -> None:
    f = write(tmp_path, trials=2)
    out = explore_run(f, "--storage", postgres_url, "--study", "s" * 600)
    assert out.exit_code == 2, out.output
    assert "at most 512 characters" in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_study_on_a_read_only_mount_can_be_shown_and_exported(tmp_path: Path,
                                                                 kind: str) -> None:
    """Results copied to a read-only share are read there: SQLite as an immutable file
    (it cannot make its lock and log files beside it), the journal without its lock
    (issue 32, item 9)."""
    f = write(tmp_path, trials=2)
    with small_disk(tmp_path, "20m") as disk:
        storage = f"sqlite:///{disk / 't.db'}" if kind == "sqlite" else \
            f"journal://{disk / 't.log'}"
        assert explore_run(f, "--storage", storage).exit_code == 0
        remounted = subprocess.run(["mount", "-o", "remount,ro", str(disk)],
                                   capture_output=True, text=True)
        assert remounted.returncode == 0, remounted.stderr
        for command in (["show"], ["export", "--output", str(tmp_path / "t.csv")]):
            got = subprocess.run([sys.executable, "-m", "explore.cli", *command,
                                  "--storage", storage, "--study", "tiny"],
                                 capture_output=True, text=True)
            assert got.returncode == 0, got.stdout + got.stderr
        assert len((tmp_path / "t.csv").read_text().splitlines()) == 3  # a header, 2 trials
