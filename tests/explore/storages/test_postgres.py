"""The PostgreSQL storage against a real server (tests/pg_server.py, started by the
session's ``postgres`` fixture): a study opened through ``explore.storages.connect``, a
whole ``explore run`` read back by ``explore show``, and processes that open the same
new database at the same instant (PostgreSQL and a SQLite file): Optuna creates its
schema when it opens a storage, and the one that loses that race must not fail
(``explore.storages.relational``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from explore.storages import _base, connect, relational
from tests.explore.cli_run import explore_here

ROOT = Path(__file__).resolve().parents[3]
SPACE = """name: q
dataset: digits
budget: {trials: 3, rounds: 1, memory: 300MB, workers: 1}
sampler: {name: random, seed: 0}
"""


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``explore ARGS`` in a fresh process importing this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "explore.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180)


def test_connect_opens_a_postgres_storage_and_optuna_creates_a_study(postgres_url: str
                                                                     ) -> None:
    storage = connect(postgres_url, write=True)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert storage.engine.dialect.name == "postgresql"
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.tell(study.ask(), 0.25)
    again = optuna.load_study(study_name="s", storage=connect(postgres_url, write=False))
    assert [t.value for t in again.trials] == [0.25]
    storage.engine.dispose()


def test_a_session_stopped_inside_a_transaction_is_ended_by_the_server(
        postgres_url: str) -> None:
    """A driver's connections carry a limit on a transaction left idle (a driver stopped
    inside one would hold every other driver's writes to its rows) and keepalives."""
    from sqlalchemy import text

    storage = connect(postgres_url, write=True)
    assert isinstance(storage, optuna.storages.RDBStorage)
    try:
        with storage.engine.connect() as conn:
            shown = {name: conn.execute(text(f"SHOW {name}")).scalar() for name in
                     ("idle_in_transaction_session_timeout", "tcp_keepalives_idle")}
    finally:
        storage.engine.dispose()
    assert shown == {"idle_in_transaction_session_timeout": "1min",
                     "tcp_keepalives_idle": "30"}


def test_explore_run_into_postgres_and_show_reads_it(postgres_url: str,
                                                     tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(SPACE)
    r = cli("run", "q.yaml", "--storage", postgres_url, "--study", "s", "--quiet",
            cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "q.db").exists()  # the study went to the server, not SQLite
    study = optuna.load_study(study_name="s", storage=postgres_url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    shown = explore_here("show", "--storage", postgres_url, "--study", "s", cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "study 's'" in shown.stdout
    counts = next(line for line in shown.stdout.splitlines() if line.startswith("│ 3"))
    assert counts.split("│")[1:5] == [" 3      ", " 3        ", " 0      ", " 0      "], counts


# -- the schema created by two processes at once ----------------------------------------
PROCESSES = 3


def _open_together(urls: list[str], barrier: Any, results: Any) -> None:
    """For each URL in turn: wait for the other processes, then all open the same new
    storage and its study at once (a process of its own: spawned)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for url in urls:
        barrier.wait(timeout=60)
        try:
            storage = connect(url, write=True)
            optuna.create_study(storage=storage, study_name="s", load_if_exists=True)
            if isinstance(storage, optuna.storages.RDBStorage):
                storage.engine.dispose()
            results.put((url, "ok"))
        except BaseException as e:
            results.put((url, f"{type(e).__name__}: {e}"))


def open_together(urls: list[str]) -> dict[str, list[str]]:
    """What each of :data:`PROCESSES` processes got opening each URL at the same
    instant as the others ("ok", or the error)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_together, args=(urls, barrier, results))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    got: dict[str, list[str]] = {u: [] for u in urls}
    try:
        for _ in range(PROCESSES * len(urls)):
            url, said = results.get(timeout=120)
            got[url].append(said)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_processes_creating_a_new_postgres_schema_at_once_all_succeed(postgres: Any
                                                                      ) -> None:
    """Without the retry, two of three processes failed in most rounds ("duplicate key
    value violates unique constraint pg_type_typname_nsp_index")."""
    urls = [postgres.new_database(f"race_{i}") for i in range(4)]
    got = open_together(urls)
    assert got == {u: ["ok"] * PROCESSES for u in urls}
    for u in urls:
        assert len(optuna.get_all_study_summaries(storage=u)) == 1


def test_processes_creating_a_new_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Without the retry: "table trial_values already exists" (each CREATE TABLE of
    SQLite commits on its own), or a duplicate alembic revision."""
    urls = [f"sqlite:///{tmp_path}/race_{i}.db" for i in range(4)]
    got = open_together(urls)
    assert got == {u: ["ok"] * PROCESSES for u in urls}
    for u in urls:
        assert len(optuna.get_all_study_summaries(storage=u)) == 1


def test_the_retry_is_for_the_schema_race_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A duplicate while creating the schema is retried; any other error is not."""
    calls: list[str] = []
    race = IntegrityError("CREATE TYPE studydirection", {}, Exception("duplicate key"))
    other = OperationalError("connect", {}, Exception("password authentication failed"))

    def rdb(url: str, engine_kwargs: Any = None) -> Any:
        calls.append(url)
        if len(calls) < 3:
            raise race
        return "opened"

    monkeypatch.setattr(_base.optuna.storages, "RDBStorage", rdb)
    monkeypatch.setattr(_base.time, "sleep", lambda s: None)
    assert relational("x://") == "opened" and len(calls) == 3

    def refused(url: str, engine_kwargs: Any = None) -> Any:
        calls.append(url)
        raise other

    calls.clear()
    monkeypatch.setattr(_base.optuna.storages, "RDBStorage", refused)
    with pytest.raises(OperationalError):
        relational("x://")
    assert len(calls) == 1


def test_no_server_programs_fail_in_ci_and_skip_elsewhere(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Where no PostgreSQL is installed the fixture says so and how to install it: the
    tests that need it fail when $CI is set (they must run there) and skip elsewhere."""
    from tests import pg_server
    from tests.conftest import _unavailable

    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config, no initdb
    monkeypatch.delenv("PG_BINDIR", raising=False)
    monkeypatch.setattr(pg_server, "DEBIAN_BINDIRS", str(tmp_path / "postgresql/*/bin"))
    with pytest.raises(pg_server.PostgresUnavailable,
                       match=r"no PostgreSQL server programs.*apt-get install postgresql"):
        pg_server.find_bindir()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _unavailable("no PostgreSQL")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL"):
        _unavailable("no PostgreSQL")


def test_a_server_that_cannot_start_names_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import pg_server

    monkeypatch.setitem(pg_server.SETTINGS, "no_such_setting", "1")
    with pytest.raises(RuntimeError, match=r"PostgreSQL did not start") as e:
        pg_server.PgServer().start()
    log = Path(str(e.value).split("its log, ", 1)[1].split(", ends:", 1)[0])
    try:
        assert "no_such_setting" in log.read_text() and "no_such_setting" in str(e.value)
        assert [p.name for p in log.parent.iterdir()] == ["server.log"]  # nothing else kept
    finally:
        log.unlink()
        log.parent.rmdir()
