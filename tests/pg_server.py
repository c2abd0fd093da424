"""A throwaway PostgreSQL server for the tests: a cluster of its own in a temporary
folder, started and thrown away by the test session (tests/conftest.py's ``postgres``
fixture), so that the PostgreSQL storage is tested against a real server without any
set-up::

    with PgServer() as pg:      # initdb, start, wait until it answers
        url = pg.new_database("study")  # postgresql+psycopg://postgres@127.0.0.1:PORT/study
        ...                     # the server and its folder are gone after the block

What it does:

* finds the server's programs (``initdb``, ``postgres``, ``pg_ctl``) with
  :func:`find_bindir`: ``$PG_BINDIR``, ``pg_config --bindir``, the ``PATH``, then
  Debian's ``/usr/lib/postgresql/<version>/bin`` (newest first);
* ``initdb`` into a fresh temporary folder, one superuser (:data:`SUPERUSER`), trust
  authentication, no sync;
* starts ``postgres`` on 127.0.0.1 at a free port, and on a Unix socket in the same
  folder, with ``fsync``, ``synchronous_commit`` and ``full_page_writes`` off (nothing
  in it outlives the session), through ``pg_ctl start`` (so that the server is no
  descendant of the tests' process: a run inside it is charged every descendant's
  memory), and waits (:data:`START_TIMEOUT` at most) until it accepts connections: a
  server that exits or does not answer in time is a :class:`RuntimeError` that names
  its log (kept, the rest of the folder removed) and quotes its end;
* :meth:`PgServer.new_database` creates an empty database and gives its SQLAlchemy URL;
* :meth:`PgServer.stop` stops it (``pg_ctl stop -m immediate``: the data is thrown
  away, so there is nothing to checkpoint) and removes the folder.

PostgreSQL refuses to run as root.  Run by root, every server program runs as the
``postgres`` system user (Debian's package creates it), and the folder is given to that
user; run by anyone else, they run as that user.

No server programs at all is :class:`PostgresUnavailable`: the fixture fails the tests
that need the server when ``$CI`` is set, and skips them (with this reason) elsewhere.
The client side needs psycopg 3 (the dev extra), which the URLs name.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SUPERUSER = "postgres"  # the cluster's superuser: every URL connects as it (trust)
START_TIMEOUT = 30.0  # seconds the server has to accept connections
PROGRAMS = ("initdb", "pg_ctl", "postgres")
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
# Settings for a server whose data nobody keeps: no flush to disk, small and quiet.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "log_min_messages": "warning",
}


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server programs on this machine (the message says where it looked
    and how to install them)."""


def _has_programs(d: str | Path) -> bool:
    return all(os.access(Path(d) / p, os.X_OK) for p in PROGRAMS)


def _version_key(d: str) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` -> (15,), for newest first."""
    return tuple(int(n) for n in re.findall(r"\d+", Path(d).parent.name)) or (0,)


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: ``$PG_BINDIR``,
    ``pg_config --bindir``, the folder of ``initdb`` on the ``PATH`` (links followed),
    else the newest ``/usr/lib/postgresql/*/bin``.  Raises :class:`PostgresUnavailable`
    if none has all three."""
    tried: list[str] = []
    candidates: list[str] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.strip()
            if out:
                candidates.append(out)  # libpq-dev's pg_config may name a bindir
    initdb = shutil.which("initdb")  # without the server: hence the check below
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    candidates += sorted(glob.glob(DEBIAN_BINDIRS), key=_version_key, reverse=True)
    for d in candidates:
        if _has_programs(d):
            return Path(d)
        tried.append(d)
    where = ", ".join(tried) if tried else "no pg_config, no initdb on the PATH"
    raise PostgresUnavailable(
        "no PostgreSQL server programs (initdb, pg_ctl, postgres) found "
        f"(tried: $PG_BINDIR, pg_config --bindir, PATH, {DEBIAN_BINDIRS}; {where}); "
        "install them (Debian/Ubuntu: apt-get install postgresql; macOS: brew install "
        "postgresql) or set PG_BINDIR")


def _free_port() -> int:
    """A TCP port nobody listens on now on 127.0.0.1 (someone may take it before the
    server does: :meth:`PgServer.start` then tries another)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One throwaway PostgreSQL cluster; :meth:`start` it (or use ``with``), get
    databases from :meth:`new_database`, :meth:`stop` it."""

    def __init__(self, bindir: str | Path | None = None) -> None:
        self.bindir = Path(bindir) if bindir is not None else find_bindir()
        self.folder: Path | None = None  # data/, the socket and server.log
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.user = SUPERUSER
        self.running = False
        self._run_as: dict[str, Any] = {}  # subprocess arguments: the user to run as
        if os.name == "posix" and os.geteuid() == 0:
            import pwd  # POSIX only: the tests' conftest imports this module everywhere

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "PostgreSQL refuses to run as root, and there is no 'postgres' "
                    "system user to run it as: create one (useradd --system postgres) "
                    "or run the tests as another user") from None
            self._run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            self._owner: tuple[int, int] | None = (pw.pw_uid, pw.pw_gid)
        else:
            self._owner = None

    # -- paths ----------------------------------------------------------------------
    @property
    def data(self) -> Path:
        assert self.folder is not None, "the server is not started"
        return self.folder / "data"

    @property
    def log(self) -> Path:
        assert self.folder is not None, "the server is not started"
        return self.folder / "server.log"

    def url(self, database: str, driver: str = "psycopg") -> str:
        """The SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+{driver}://{self.user}@{self.host}:{self.port}/{database}"

    # -- running the server's programs ----------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        assert self.folder is not None
        env.update(HOME=str(self.folder), LC_ALL="C", LANG="C")
        return env

    def _run(self, *args: str, timeout: float = 60) -> None:
        """Run one of the server's programs as the server's user; a failure is a
        RuntimeError with its output."""
        r = subprocess.run([str(self.bindir / args[0]), *args[1:]], cwd=self.folder,
                           env=self._env(), capture_output=True, text=True,
                           timeout=timeout, **self._run_as)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed (exit status {r.returncode}):\n"
                               f"{r.stdout}{r.stderr}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- life cycle ------------------------------------------------------------------
    def start(self, folder: Path | None = None) -> PgServer:
        """initdb a fresh cluster, start the server and wait until it accepts
        connections (at most :data:`START_TIMEOUT` seconds).  ``folder``: an empty one
        to hold it (a small disk, say) instead of a new temporary one."""
        self.folder = folder if folder is not None else \
            Path(tempfile.mkdtemp(prefix="explore-pg-"))
        try:
            self.folder.mkdir(exist_ok=True)
            if self._owner is not None:
                os.chown(self.folder, *self._owner)
            self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust",
                      "--encoding=UTF8", "--no-locale", "--no-sync")
            for attempt in range(3):  # the free port may be taken before the server binds
                self.port = _free_port()
                try:
                    self._start_server()
                    return self
                except _PortTaken:
                    if attempt == 2:
                        raise RuntimeError(f"PostgreSQL found no free port; see {self.log}"
                                           ) from None
            raise AssertionError("unreachable")
        except BaseException:
            self.stop(keep_log=True)
            raise

    def _start_server(self) -> None:
        """``pg_ctl start``: the server is not a child of this process, so explore's
        memory accounting, which charges a run every descendant of the process that
        runs it (``explore.procmem.children``), never counts it in a test's run."""
        options = ["-p", str(self.port), "-k", str(self.folder)]
        for k, v in SETTINGS.items():
            options += ["-c", f"{k}={v}"]
        with contextlib.suppress(FileNotFoundError):
            self.log.unlink()  # a port taken at an earlier try is not this try's error
        self.running = True  # as far as stop() knows: pg_ctl may time out on a live one
        try:
            self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log),
                      "-w", "-t", f"{START_TIMEOUT:.0f}", "-o", shlex.join(options),
                      timeout=START_TIMEOUT + 30)
        except RuntimeError as e:
            tail = self._log_tail()
            if "could not bind" in tail or "already in use" in tail:
                self.running = False  # the server exited
                raise _PortTaken from None
            raise RuntimeError(f"PostgreSQL did not start, or did not accept connections "
                               f"within {START_TIMEOUT:g} s ({e}); its log, {self.log}, "
                               f"ends:\n{tail}") from None
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # pg_ctl waited for "ready"; a connection proves it
            try:
                self._connect("postgres").close()
                return
            except Exception as e:  # psycopg.OperationalError
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not accept connections within {START_TIMEOUT:g} "
                        f"s on {self.host}:{self.port} ({e}); its log, {self.log}, "
                        f"ends:\n{self._log_tail()}") from None
                time.sleep(0.05)

    def _connect(self, database: str) -> Any:
        import psycopg

        return psycopg.connect(host=self.host, port=self.port, user=self.user,
                               dbname=database, connect_timeout=2, autocommit=True)

    def new_database(self, name: str) -> str:
        """Create the empty database ``name`` (letters, digits and ``_``, at most 63)
        and return its URL, ``postgresql+psycopg://USER@127.0.0.1:PORT/NAME``."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r}: letters, digits and _, at most 63")
        with self._connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database of ``url`` (one :meth:`new_database` gave) at once, its
        clients' connections ended, as an operator's ``DROP DATABASE ... WITH (FORCE)``."""
        name = url.rsplit("/", 1)[1]
        with self._connect("postgres") as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server (immediate: nothing is kept) and remove its folder, all but
        the server's log with ``keep_log`` (a failed start, whose error names it).  Safe
        to call twice."""
        if self.running:
            try:
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w",
                          "-t", "20", timeout=40)
            except (RuntimeError, subprocess.TimeoutExpired):
                self._kill()
            self.running = False
        if self.folder is not None:
            if keep_log and self.log.exists():
                for p in self.folder.iterdir():
                    if p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)
                    elif p != self.log:
                        p.unlink()
            else:
                shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def answers(self) -> bool:
        """Whether the server accepts a connection now (it may have stopped by itself,
        as on a full disk it cannot write its log to)."""
        try:
            with self._connect("postgres") as conn:
                conn.execute("SELECT 1")
        except Exception:
            return False
        return True

    def pause(self) -> None:
        """Stop the server at once, as a crash or an operator would, keeping its data:
        :meth:`resume` starts it again on the same port."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t",
                  "20", timeout=40)
        self.running = False

    def resume(self) -> None:
        """Start the paused server again (its data and port as they were)."""
        self._start_server()

    def _kill(self) -> None:
        """SIGKILL the server (its pid is the first line of ``postmaster.pid``), when
        ``pg_ctl stop`` failed."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _PortTaken(Exception):
    """The server's port was taken between choosing it and binding it."""
