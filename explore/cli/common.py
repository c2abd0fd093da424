"""What the commands share: an option's checks, the space file they read, and the
study they name (by its space file, or by --storage and --study).

The space, the study and the storages are imported inside the functions: they load
pydantic, the engine and SQLAlchemy, which ``explore --help`` does not wait for.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click
from rich.markup import escape

from explore.cli import console
from explore.cli.console import EXIT_USAGE, fail
from explore.yamlio import SpaceError


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An option given as an empty string is a mistake (an unset variable), not a
    request for the default."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; leave the option out for the default")
    return value


def lasting_storage(ctx: click.Context, param: click.Parameter, value: str | None
                    ) -> str | None:
    """``explore run``'s storage: not empty, and not an in-memory SQLite database,
    which keeps nothing once the command ends (``sqlite://x.db``, two slashes, is one:
    SQLAlchemy reads ``x.db`` as a host)."""
    value = not_empty(ctx, param, value)
    from explore.storages import scheme, sqlite_file  # noqa: PLC0415 (--help start-up)

    if value is not None and "://" in value and scheme(value.strip()) == "sqlite" and \
            sqlite_file(value.strip()) is None:
        rest = value.strip().split(":", 1)[1].lstrip("/")
        hint = f"; did you mean sqlite:///{rest}?" if rest and rest != ":memory:" else ""
        raise click.BadParameter(f"{value} is an in-memory database: it keeps nothing once "
                                 f"the run ends{hint} (sqlite:/// and a file's path)")
    return value


def read_space(path: str) -> Any:
    """The space of ``path``, as data (exit status 2 with every error): what commands
    that read a study need (its name)."""
    from explore.space import load_space  # noqa: PLC0415 (--help start-up: pydantic, the engine)

    with _refused():
        return load_space(path)


def read_bound(path: str) -> Any:
    """The space of ``path`` bound to its data set and builder
    (:func:`explore.binding.bind`; exit status 2 with every error)."""
    from explore.binding import bind  # noqa: PLC0415 (--help start-up: the data sets, the engine)

    space = read_space(path)
    with _refused():
        return bind(space)


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """A space's errors printed, each with its file, line and key; exit status 2."""
    try:
        yield
    except SpaceError as e:
        for item in e.errors:
            console.err.print(f"[red]{escape(str(item))}[/]", highlight=False)
        console.err.print(f"{len(e.errors)} error(s); nothing was run or written.",
                          highlight=False)
        sys.exit(EXIT_USAGE)


def byte_size(value: str | None, what: str) -> int | None:
    """The bytes of a size option such as ``--memory 512MB`` (exit status 2 if it is
    not one); None where the option is not given."""
    from explore.space import parse_size  # noqa: PLC0415 (--help start-up: pydantic, the engine)

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
    from explore.study import default_storage  # noqa: PLC0415 (--help start-up: the space, engine)

    if space_file is None and (storage is None or study_name is None):
        fail("give SPACE_FILE, or both --storage and --study")
    if space_file is not None:
        space = read_space(space_file)
        storage = storage or default_storage(space_file)
        study_name = study_name or space.name
    assert storage is not None and study_name is not None
    return storage, study_name


def read_study(space_file: str | None, storage: str | None, study_name: str | None) -> Any:
    """The study to show or export.  A SQLite file that does not exist is an error (exit
    status 2), not an empty database created by looking."""
    from explore.storages import StorageError, explain  # noqa: PLC0415 (--help start-up: SQLAlchemy)
    from explore.study import load_stored, storage_url  # noqa: PLC0415 (--help start-up: the space, engine)

    storage, study_name = where(space_file, storage, study_name)
    try:
        opened = storage_url(storage)
    except FileNotFoundError as e:
        fail(f"no study {study_name!r}: {e}; has `explore run` been run?")
    except StorageError as e:
        fail(str(e))
    try:
        return load_stored(opened, study_name)
    except KeyError:
        fail(f"no study {study_name!r} in {storage}")
    except Exception as e:  # a corrupt file, a server gone: said as such
        fail(f"cannot read study {study_name!r} in {storage}: {explain(e)}")
