"""Test-session settings shared by every test."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.pg_server import PgServer, PostgresUnavailable
from tests.session_guard import CACHE, SESSION_ENV, SessionGuard, add_options, enter_session_folder

# What the tests, and the processes they start, put in the temporary directory goes into
# one folder of the session's, removed at its end (tests/session_guard.py); made here, on
# import, so that xdist's workers inherit it.
_SESSION_FOLDER = enter_session_folder()
# The constants a run measures (explore.scheduler.constants) are remembered per machine;
# tests keep theirs apart from the user's cache, in the session's folder.
os.environ.setdefault("EXPLORE_CACHE_DIR", os.path.join(os.environ[SESSION_ENV], CACHE))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SessionGuard(config, _SESSION_FOLDER),
                                  "explore-session-guard")


@pytest.fixture
def on_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on disk for switched-out states: ``tmp_path``, unless that is in memory
    (``/tmp`` on ``tmpfs``), where a CPU run does not switch
    (:mod:`explore.scheduler.switched`); then one beside the tests, removed after."""
    from explore.scheduler.switched import memory_backed

    if not memory_backed(tmp_path):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix=".switch-", dir=Path(__file__).parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- a real PostgreSQL server (tests/pg_server.py) ---------------------------------------
def _unavailable(reason: str) -> NoReturn:
    """Fail in CI (``$CI`` set, and not to 0 or false: the server's tests must run
    there), skip elsewhere."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason} (CI is set, so this fails rather than skips)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for the whole session (started on first use,
    stopped and removed at the end); :meth:`PgServer.new_database` gives URLs."""
    if importlib.util.find_spec("psycopg") is None:
        _unavailable('psycopg (the dev extra: pip install -e ".[dev]") is not installed')
    try:
        server = PgServer()
    except PostgresUnavailable as e:
        missing = str(e)
    else:
        with server:
            yield server
        return
    _unavailable(missing)  # outside the except: the message alone, no traceback chain


_databases = 0


@pytest.fixture
def postgres_url(postgres: PgServer, request: pytest.FixtureRequest) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    global _databases
    _databases += 1
    name = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:50].strip("_")
    return postgres.new_database(f"t{_databases}_{name}")


# -- the deterministic simulation (tests/explore/scheduler/test_simulation.py) -----------
def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
    # 2,000 in the README's command; CI's step of its own plays 10,000 (.ci/run)
    parser.addoption("--simulate", type=int, default=2_000, metavar="N",
                     help="schedules the scheduler's simulation plays (default 2,000)")
