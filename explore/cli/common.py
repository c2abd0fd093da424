"""What the commands share: an option's checks, the space file they read, and the
study they name (by its space file, or by --storage and --study).

explore's own modules are imported inside the functions: each loads optuna, numpy,
the engine or yaml, which ``explore --help`` does not wait for.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.markup import escape

from explore.cli import console
from explore.cli.console import EXIT_USAGE, fail


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An option given as an empty string is a mistake (an unset variable), not a
    request for the default."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; leave the option out for the default")
    return value


def read_space(path: str, resolve_data: bool = True) -> Any:
    """The space of ``path`` (exit status 2 with every error); its data file is read
    and checked only with ``resolve_data`` (commands that read a study need only the
    space's name)."""
    # lazy: pydantic, numpy and the engine; yaml too (a fifth of the start of --help)
    from explore.space import load_space
    from explore.yamlio import SpaceError

    try:
        return load_space(path, resolve_data=resolve_data)
    except SpaceError as e:
        for item in e.errors:
            console.err.print(f"[red]{escape(str(item))}[/]", highlight=False)
        console.err.print(f"{len(e.errors)} error(s); nothing was run or written.",
                          highlight=False)
        sys.exit(EXIT_USAGE)


def byte_size(value: str | None, what: str) -> int | None:
    """The bytes of a size option such as ``--memory 512MB`` (exit status 2 if it is
    not one); None where the option is not given."""
    from explore.space import parse_size  # lazy: as read_space

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        fail(f"{what}: {e}")


def where(space_file: str | None, storage: str | None, study_name: str | None
          ) -> tuple[str, str]:
    """The storage and study a command names: by its space file (the study next to it,
    named after it) or by --storage and --study (exit status 2 if neither)."""
    from explore.study import default_storage  # lazy: optuna

    if space_file is None and (storage is None or study_name is None):
        fail("give SPACE_FILE, or both --storage and --study")
    if space_file is not None:
        space = read_space(space_file, resolve_data=False)
        storage = storage or default_storage(space_file)
        study_name = study_name or space.name
    assert storage is not None and study_name is not None
    return storage, study_name


def read_study(space_file: str | None, storage: str | None, study_name: str | None) -> Any:
    """The study to show or export.  A SQLite file that does not exist is an error (exit
    status 2), not an empty database created by looking."""
    # lazy: optuna and the storages load in a third of a second
    import optuna

    from explore.storages import StorageError, explain
    from explore.study import storage_url

    storage, study_name = where(space_file, storage, study_name)
    try:
        opened = storage_url(storage)
    except FileNotFoundError as e:
        fail(f"no study {study_name!r}: {e}; has `explore run` been run?")
    except StorageError as e:
        fail(str(e))
    try:
        return optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        fail(f"no study {study_name!r} in {storage}")
    except Exception as e:  # a corrupt file, a server gone: said as such
        fail(f"cannot read study {study_name!r} in {storage}: {explain(e)}")
