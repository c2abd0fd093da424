"""``explore dashboard``: optuna-dashboard on a study, live, until Ctrl-C."""

from __future__ import annotations

import sys

import click

from explore.cli import console
from explore.cli.common import not_empty, where
from explore.cli.console import EXIT_INTERRUPTED, fail


@click.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage", callback=not_empty,
              help="the study's storage URL (default: SQLite next to the file)")
@click.option("--study", "study_name", callback=not_empty,
              help="the study name (default: the space's name)")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="the address to listen on (0.0.0.0: every interface)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="the port to listen on (0: any free one)")
def dashboard(space_file: str | None, storage: str | None, study_name: str | None,
              host: str, port: int) -> None:
    """Serve optuna-dashboard on the study, live, until Ctrl-C (the dashboard extra)."""
    from explore.dashboard import DashboardError, serve  # noqa: PLC0415 (--help start-up: the study, engine)

    storage, study_name = where(space_file, storage, study_name)

    def announce(url: str) -> None:
        console.out.print(f"dashboard of study {study_name!r} in {storage}: {url} "
                          "(Ctrl-C to stop)", highlight=False, soft_wrap=True)
        sys.stdout.flush()  # at once, into a log or a pipe too: the server runs on

    try:
        serve(storage, study_name, host, port, announce=announce)
    except DashboardError as e:
        fail(str(e))
    except KeyboardInterrupt:
        console.err.print("dashboard stopped", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
