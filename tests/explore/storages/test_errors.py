"""Storage errors say what happened and what to do (issue 32, item 6), where Optuna's
relational storage reads "invalid data in the commit" for all of them: a corrupt SQLite
file, a disk full under it, a database server that is not there, a database that does
not exist.  A study name longer than PostgreSQL's column is refused on every storage
before anything is written.  Real files, real drivers and a real server; exit 2 for
what the user gave, no traceback."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from explore.space import MAX_STUDY_NAME
from explore.storages import StorageError, connect, explain
from tests.explore.cli_run import explore_here, explore_run, explore_run_here
from tests.explore.drivers import small_disk
from tests.explore.test_explore_run import write


def test_a_corrupt_sqlite_file_is_named_as_such(tmp_path: Path) -> None:
    f = write(tmp_path, trials=2)
    db = tmp_path / "broken.db"
    db.write_bytes(b"SQLite format 3\0" + bytes(range(256)) * 64)  # a header, then garbage
    out = explore_run(f, "--storage", f"sqlite:///{db}")
    assert out.exit_code == 2, out.output
    assert "corrupt" in out.output and "Traceback" not in out.output, out.output
    shown = explore_here("show", "--storage", f"sqlite:///{db}", "--study", "tiny")
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


class OperationalError(Exception):
    """A database driver's error (psycopg's name)."""


def driver_error(message: str) -> BaseException:
    """``message`` as a driver raises it and SQLAlchemy wraps it."""
    try:
        raise sqlalchemy.exc.OperationalError("SELECT 1", {}, OperationalError(message))
    except sqlalchemy.exc.SQLAlchemyError as e:
        return e


@pytest.mark.parametrize("message", [
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
    'database "gone" does not exist',
    # with the texts of a server that went away too: the more precise meaning wins
    'could not connect to server: connection refused? FATAL:  database "gone" does not '
    'exist',
])
def test_a_database_that_does_not_exist_is_named_as_such(message: str) -> None:
    said = explain(driver_error(message))
    assert said.startswith("the study's database does not exist ("), said
    assert "dropped, or never created; create it (createdb gone)" in said, said
    assert "went away" not in said


@pytest.mark.parametrize("message", ['relation "studies" does not exist',
                                     'role "nobody" does not exist',
                                     'column "database" does not exist'])
def test_a_missing_table_or_role_is_not_a_missing_database(message: str) -> None:
    assert explain(driver_error(message)) == f"OperationalError: {message}"


def _drop(url: str) -> None:
    """Drop the database of ``url``, its connections ended (an operator's DROP)."""
    psycopg = pytest.importorskip("psycopg")
    u = sqlalchemy.engine.make_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{u.database}" WITH (FORCE)')


def test_a_postgres_database_dropped_or_never_created_is_named(postgres_url: str) -> None:
    """A real server's words: a call once the database is dropped (after the one that
    finds its connection ended), and a storage opened where none was created."""
    storage = connect(postgres_url)
    study = optuna.create_study(study_name="s", storage=storage)
    _drop(postgres_url)
    said = []
    for i in range(2):
        with pytest.raises(Exception) as caught:
            study.set_user_attr("k", i)
        said.append(explain(caught.value))
    name = postgres_url.rsplit("/", 1)[1]
    assert said[-1].startswith("the study's database does not exist"), said
    assert f"createdb {name}" in said[-1]
    with pytest.raises(StorageError, match=rf"cannot open storage .*: the study's database "
                       rf"does not exist .*createdb {name}\) or give another --storage"):
        connect(postgres_url)


LONG = "s" * (MAX_STUDY_NAME + 1)


@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgres"])
def test_a_study_name_longer_than_512_characters_is_refused_on_every_storage(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """PostgreSQL holds no longer name; SQLite and the journal would, and their study
    could then not be moved to it.  Refused by --study and by the space's name, exit 2,
    nothing written."""
    storage = {"sqlite": f"sqlite:///{tmp_path / 't.db'}",
               "journal": f"journal://{tmp_path / 't.log'}"}.get(kind) or \
        request.getfixturevalue("postgres_url")
    f = write(tmp_path, trials=2)
    out = explore_run_here(f, "--storage", storage, "--study", LONG)
    assert out.exit_code == 2, out.output
    assert "study: a study name is at most 512 characters, and this one has 513" \
        in out.output and "Traceback" not in out.output, out.output
    f.write_text(f.read_text().replace("name: tiny", f"name: {LONG}"))
    out = explore_run_here(f, "--storage", storage)
    assert out.exit_code == 2, out.output
    assert "tiny.yaml:1: name: a study name is at most 512 characters" in out.output, \
        out.output
    assert LONG not in out.output  # too long to quote
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]
    if kind == "postgres":
        engine = sqlalchemy.create_engine(storage)
        try:
            assert sqlalchemy.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()


def test_the_limit_is_postgres_own(postgres_url: str) -> None:
    """512 characters is what PostgreSQL holds, not less; one more is refused by the
    database itself, and said so, where a study is made without explore's check."""
    storage = connect(postgres_url)
    optuna.create_study(study_name="s" * MAX_STUDY_NAME, storage=storage)
    with pytest.raises(Exception) as caught:
        optuna.create_study(study_name=LONG, storage=storage)
    assert explain(caught.value).startswith("a value is longer than the database holds")


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
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
