"""The PostgreSQL storage against a real server (tests/pg_server.py, started by the
session's ``postgres`` fixture): a study opened through ``explore.storages.connect``, and
a whole ``explore run`` read back by ``explore show``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from explore.storages import connect

ROOT = Path(__file__).resolve().parents[2]
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


def test_explore_run_into_postgres_and_show_reads_it(postgres_url: str,
                                                     tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(SPACE)
    r = cli("run", "q.yaml", "--storage", postgres_url, "--study", "s", "--quiet",
            cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "q.db").exists()  # the study went to the server, not SQLite
    study = optuna.load_study(study_name="s", storage=postgres_url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    shown = cli("show", "--storage", postgres_url, "--study", "s", cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "study 's'" in shown.stdout
    counts = next(line for line in shown.stdout.splitlines() if line.startswith("│ 3"))
    assert counts.split("│")[1:5] == [" 3      ", " 3        ", " 0      ", " 0      "], counts


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
