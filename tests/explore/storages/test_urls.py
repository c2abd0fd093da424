"""A storage URL is checked before use (explore.storages.connect): bad ones get a clear
message and exit status 2, nothing is written, and the commands that only read a study
create no file."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import optuna
import pytest

import explore
from explore.runner import RunRefused
from explore.storages import StorageError, check, connect
from tests.explore.cli_run import explore_here

ROOT = Path(__file__).resolve().parents[3]
SPACE = """name: q
dataset: digits
budget: {trials: 1, rounds: 1, memory: 256MB, workers: 1}
"""


def files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_not_a_url_and_an_unknown_scheme() -> None:
    with pytest.raises(StorageError, match="'garbage' is not a URL"):
        check("garbage", write=True)
    with pytest.raises(StorageError, match="unknown scheme 'foo'"):
        connect("foo://x")
    with pytest.raises(StorageError, match="storage is empty"):
        connect(" ")


def test_sqlite_in_a_missing_or_read_only_folder(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError, match="does not exist; create it"):
        connect(f"sqlite:///{tmp_path}/no/such/x.db")
    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p).name == "ro"
                        else real(p, mode))  # a read-only folder, even for root
    with pytest.raises(StorageError, match="is read-only"):
        connect(f"sqlite:///{tmp_path}/ro/x.db")
    assert files(tmp_path) == ["ro"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_a_really_read_only_folder(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(StorageError, match="is read-only"):
            connect(f"sqlite:///{ro}/x.db")
    finally:
        ro.chmod(0o755)


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None,
                    reason="the driver is installed")
def test_a_driver_not_installed_names_what_to_install() -> None:
    with pytest.raises(StorageError, match=r"driver is not installed.*pip install"):
        connect("mysql+mysqldb://u:secret@localhost/db")


def test_the_postgres_hint_names_the_extra() -> None:
    from explore.storages._check import DRIVER_HINTS

    assert '.[postgres]' in DRIVER_HINTS["postgresql"]
    assert 'postgres = ["psycopg[binary]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None, reason="no psycopg")
def test_a_server_that_does_not_answer_is_a_clear_error_soon() -> None:
    t = time.monotonic()
    with pytest.raises(StorageError, match=r"cannot open storage .*u:\*\*\*@") as e:
        connect("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(e.value)
    assert time.monotonic() - t < 30


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None, reason="no psycopg")
def test_a_server_that_accepts_but_never_answers_times_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that takes the connection and says nothing (a firewall's black hole, a
    hung server): the connect timeout ends the wait with a clear error.  The timeout is
    cut to 2 s here: what is tested is that it is passed to the driver and ends the
    wait, not the length of the default."""
    import socket

    from explore.storages import _check

    timeout = 2
    monkeypatch.setattr(_check, "CONNECT_TIMEOUT", timeout)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads
        port = silent.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(StorageError, match=r"cannot open storage .*u:\*\*\*@"):
            connect(f"postgresql+psycopg://u:secret@127.0.0.1:{port}/db")
        took = time.monotonic() - t
    assert timeout - 1 <= took < 3 * timeout + 5


def test_explore_run_and_load_model_refuse_bad_storages(tmp_path: Path) -> None:
    space = {"name": "q", "dataset": "digits",
             "budget": {"trials": 1, "rounds": 1, "memory": "256MB"}}
    for url in ("garbage", "foo://x", f"sqlite:///{tmp_path}/no/x.db"):
        with pytest.raises(RunRefused):
            explore.run(space, storage=url)
        with pytest.raises((StorageError, LookupError)):
            explore.load_model(url, "q")
    assert files(tmp_path) == []


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """A folder with a space and an Optuna database holding another study only."""
    (tmp_path / "q.yaml").write_text(SPACE)
    s = connect(f"sqlite:///{tmp_path}/other.db")
    optuna.create_study(storage=s, study_name="other")
    assert isinstance(s, optuna.storages.RDBStorage)
    s.engine.dispose()
    return tmp_path


def test_load_model_of_a_missing_study_keeps_no_connection(stored: Path) -> None:
    """A notebook goes on after the error: the SQLite file it looked in is left as it
    was, without the -wal and -shm files of a connection kept open."""
    before = files(stored)
    for where in (stored / "other.db", f"sqlite:///{stored}/other.db"):
        with pytest.raises(LookupError, match="no study 'q'"):
            explore.load_model(where, "q")
        assert files(stored) == before


# Five commands per storage, each a refusal: two kinds of storage in the
# README's test command (a URL that is none, a database without the study), the other
# kinds in CI's slow step.
@pytest.mark.parametrize("storage", [
    "garbage://", "sqlite:///{d}/other.db",
    *(pytest.param(s, marks=pytest.mark.slow) for s in (
        "sqlite:///{d}/no/such/x.db", "{d}/other.db", "foo://x", "sqlite:///{d}/q.yaml"))])
def test_read_only_commands_create_nothing(stored: Path, storage: str) -> None:
    url = storage.format(d=stored)
    before = files(stored)
    for cmd in (["show"], ["export", "--output", "t.csv"],
                ["export-model", "--output", "m.onnx"], ["evaluate", "q.yaml"],
                ["dashboard", "--port", "0"]):
        r = explore_here(*cmd, "--storage", url, "--study", "q", cwd=stored)
        assert r.returncode == 2, (cmd, r.stdout + r.stderr)
        assert "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert files(stored) == before, cmd


def test_run_refuses_bad_storages_with_exit_status_2(stored: Path) -> None:
    before = files(stored)
    os.mkfifo(stored / "f.db")
    before = files(stored)
    for url, says in (("garbage", "not a URL"), ("foo://x", "unknown scheme"),
                      (f"sqlite:///{stored}/no/x.db", "does not exist"),
                      ("sqlite:///%00x.db", "null byte"),
                      ("sqlite:///x.db?timeout=abc", "timeout=abc is not a number"),
                      ("sqlite:///x.db?mode=ro", "no option 'mode'"),
                      ("sqlite:///f.db", "not a regular file"),
                      ("sqlite:///a\x01b.db", "control character"),
                      ("sqlite:///x.db ", "begins or ends with a space"),
                      ("sqlite://x.db", "in-memory database: it keeps nothing once the run "
                                        "ends; did you mean sqlite:///x.db?"),
                      ("sqlite://", "in-memory database"),
                      ("sqlite+pysqlite://x.db", "in-memory database"),
                      ("sqlite:///:memory:", "in-memory database")):
        r = explore_here("run", "q.yaml", "--storage", url, "--quiet", cwd=stored)
        said = " ".join(r.stderr.split())  # as rich wrapped it
        assert r.returncode == 2 and says in said and "Traceback" not in said, said
    assert files(stored) == before
