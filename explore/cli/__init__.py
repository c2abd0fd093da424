"""The ``explore`` command: run a search space, size a candidate, show or export a
study.

    explore run search_spaces/quick.yaml
    explore size search_spaces/paper_mnist.yaml --params lr=0.01 --memory 64MB --json
    explore show search_spaces/quick.yaml
    explore export search_spaces/quick.yaml --format csv --output trials.csv
    explore refit search_spaces/quick.yaml

Bad input (a malformed space, an unknown parameter, a size that is not one) is
reported with the file, line and key at fault and exit status 2, before any study is
created or changed.

One module per command group (:mod:`.search`: run; :mod:`.sizing`: size;
:mod:`.studies`: show, export; :mod:`.models`: export-model, evaluate; :mod:`.refit`:
refit; :mod:`.serve`: dashboard), sharing :mod:`.console` (output, exit statuses),
:mod:`.common` (the space and study a command names), :mod:`.output` (--output files)
and :mod:`.summary`.
The commands import pandas, onnx, the engine and the rest of explore when they run, not
at the top: ``explore --help`` starts without them (each would add 0.3 to 1 s to it).

The ``explore`` executable runs :func:`entry`: an exception no command expected (a bug,
not bad input) ends it with a short message and exit status 1, not a traceback;
``EXPLORE_TRACEBACK=1`` shows the traceback.  :func:`main`, the click group, lets such
an exception through, so that tests that call it see it.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings

import click
import optuna

from explore import __version__
from explore.cli.models import evaluate, export_model
from explore.cli.refit import refit_command
from explore.cli.search import run
from explore.cli.serve import dashboard
from explore.cli.sizing import size
from explore.cli.studies import export, show

__all__ = ["entry", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="explore",
                      message="%(prog)s %(version)s")
def main() -> None:
    """Hyperparameter and architecture search that never runs out of memory."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.formatwarning = _said  # explore's own warnings are messages to the user


def _said(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          line: str | None = None) -> str:
    """A warning as a line the user reads, ``warning: ...``, where explore raised it
    (its message says what happened and what to do); others as Python writes them."""
    if filename.startswith(_EXPLORE + os.sep):
        return f"warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)


_EXPLORE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_python_format = warnings.formatwarning


for _command in (run, size, show, export, export_model, evaluate, refit_command, dashboard):
    main.add_command(_command)


TRACEBACK_ENV = "EXPLORE_TRACEBACK"  # "1": an unexpected error shows its traceback


def entry() -> None:
    """The ``explore`` executable: :func:`main`, with any exception that no command
    expected said in a few lines (what, where, how to see more) and exit status 1."""
    try:
        main()
    except BrokenPipeError:  # its reader went away (explore show | head): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:  # the last resort: what each command catches is said by it
        if os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0"):
            raise
        from explore.cli import console  # noqa: PLC0415 (rich, loaded by now anyway)

        console.err.print(unexpected(e), markup=False, highlight=False)
        sys.exit(console.EXIT_FAILED)


def unexpected(e: BaseException) -> str:
    """What :func:`entry` says of an exception no command expected: its type and
    message, the command line, and explore's innermost frame it passed through."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if f.filename.startswith(_EXPLORE + os.sep)] or frames
    where = ""
    if ours:
        f = ours[-1]
        where = f" (at {os.path.relpath(f.filename, os.path.dirname(_EXPLORE))}:{f.lineno}, " \
            f"in {f.name})"
    command = " ".join(["explore", *sys.argv[1:]])
    said = f"error: unexpected {type(e).__name__}: {e}{where}\n  while running: {command}\n"
    if isinstance(e, OSError | MemoryError):  # the machine's, not a fault of explore's
        return said + "  The operating system refused what the command asked of it."
    return said + (f"  This is a fault in explore, not in your input. Run it again with "
                   f"{TRACEBACK_ENV}=1 to see the traceback, and report it with that.")
