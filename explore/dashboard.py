"""optuna-dashboard on a study's storage, live: ``explore dashboard SPACE``.

The dashboard reads the storage the drivers write (:mod:`explore.live`), so it shows
every trial from the moment a driver claims it: RUNNING with the ``explore`` user
attribute (host, pid, driver, device; worker, arena offset, ``planned_bytes`` per zone,
``total_bytes`` and batch size once placed), its intermediate values as they are
reported, and its end (state, values, ``fail_reason``).  Any storage ``--storage``
opens works, our ``journal://`` plugin included: optuna-dashboard is given the opened
storage object, not the URL.

The storage is opened as the commands that read a study open it
(:func:`explore.study.storage_url`): nothing is created by looking, so a mistyped path
is an error rather than an empty database.  What optuna-dashboard writes itself (notes,
a trial marked from the page) goes to the same storage.

optuna-dashboard is an extra (``pip install -e ".[dashboard]"``), imported only here
and only when a dashboard is started.
"""

from __future__ import annotations

import errno
import socket
import socketserver
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import optuna

from explore.storages import StorageError, release
from explore.study import storage_url

INSTALL = 'pip install -e ".[dashboard]"'


class DashboardError(Exception):
    """A dashboard that cannot start; the message says why and what to do (the CLI's
    exit status 2)."""


def open_study(storage: str, study: str) -> tuple[optuna.storages.BaseStorage, int]:
    """The storage ``storage`` names, opened creating nothing, and the id of its study
    ``study``; :class:`DashboardError` names the storage and the studies it holds if
    that study is not there."""
    try:
        opened = storage_url(storage)
    except FileNotFoundError as e:
        raise DashboardError(f"no study {study!r}: {e}; has `explore run` been run?"
                             ) from None
    except StorageError as e:
        raise DashboardError(str(e)) from None
    names = [s.study_name for s in opened.get_all_studies()]
    if study not in names:
        release(opened)
        held = ", ".join(repr(n) for n in sorted(names)) or "none"
        raise DashboardError(f"no study {study!r} in {storage} (studies there: {held}); "
                             "give one with --study")
    return opened, opened.get_study_id_from_name(study)


def import_dashboard() -> Any:
    """The ``optuna_dashboard`` module, or :class:`DashboardError` saying how to
    install it."""
    try:
        import optuna_dashboard  # noqa: PLC0415 (optional dependency: the dashboard extra)
    except ImportError as e:
        raise DashboardError(f"optuna-dashboard is not installed ({e}); install it with "
                             f"{INSTALL}") from None
    return optuna_dashboard


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per request, as optuna-dashboard's own command serves: a page asks
    for several things at once, and a slow read of a large study holds up none of
    them.  Its threads do not keep the process alive after Ctrl-C."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return  # a line per request buries the URL; the app's errors still print


def listen(app: Any, host: str, port: int) -> WSGIServer:
    """A server bound to ``host:port`` (port 0: one the system picks), not yet serving.
    A port in use or a host that cannot be bound is a :class:`DashboardError`."""
    server_class: type[WSGIServer] = _Server
    if ":" in host:  # an IPv6 address (wsgiref binds IPv4 unless told)
        class _Server6(_Server):
            address_family = socket.AF_INET6

        server_class = _Server6
    try:
        server = server_class((host, port), _QuietHandler)
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == errno.EADDRINUSE:
            reason += " (another program listens there); give another --port"
        raise DashboardError(f"cannot listen on {host}:{port}: {reason}") from None
    server.set_app(app)
    return server


def url(host: str, port: int, study_id: int) -> str:
    """The address of the study's page."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/dashboard/studies/{study_id}"


def serve(storage: str, study: str, host: str = "127.0.0.1", port: int = 8080,
          announce: Callable[[str], None] = print) -> None:
    """Serve optuna-dashboard on the storage of ``study`` until interrupted: check that
    optuna-dashboard is installed, open the storage, find the study, bind the port, then
    ``announce`` the study's URL (the port is already held, so the URL answers) and
    serve.  Raises :class:`DashboardError` before serving; Ctrl-C is a
    :class:`KeyboardInterrupt`, after the socket and the storage's connections are
    closed."""
    dashboard = import_dashboard()  # first: no storage opened for nothing
    opened, study_id = open_study(storage, study)
    try:
        server = listen(dashboard.wsgi(opened), host, port)
        try:
            announce(url(host, server.server_port, study_id))
            server.serve_forever()
        finally:
            server.server_close()
    finally:
        release(opened)
