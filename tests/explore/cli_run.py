"""``explore run`` as a user runs it: a process of its own.  The budget covers the run's
whole process tree, the command's own process included, so a run inside the test
process would be charged for everything the tests have loaded.  Refusals, which end
before any run begins, are checked inside the test process (:func:`explore_here`)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

# Where a test runs the scheduler inside its own process, it charges none of that
# process's memory (the tests' own imports) to the run's budget (Scheduler(main=)).
IN_TEST = 0


@dataclass
class Result:
    exit_code: int
    output: str


def explore_run(*args: str | Path, timeout: float = 300,
                env: dict[str, str] | None = None) -> Result:
    """``explore run ARGS --quiet`` in a fresh process (its environment this one's, with
    ``env`` added); its exit status and output."""
    r = subprocess.run([sys.executable, "-m", "explore.cli", "run", *map(str, args),
                        "--quiet"], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    return Result(r.returncode, r.stdout + r.stderr)


def explore_here(*args: str | Path, cwd: Path | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """``explore ARGS`` inside this process, through click's runner, in ``cwd``: for
    the refusals that end before a run begins, where a process of its own would add
    only its second of imports (a hundred such checks are a minute of the README's
    test command).  What a user would see as a traceback, an exception escaping the
    command, is raised here, so the test fails on it.  The process a user starts is
    tested where it matters: a run's memory, signals, exit paths (:func:`explore_run`)."""
    import optuna

    from explore.cli import main

    # the command sets its own warnings' format and Optuna's verbosity
    before, formatwarning = Path.cwd(), warnings.formatwarning
    verbosity = optuna.logging.get_verbosity()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(before)
        warnings.formatwarning = formatwarning
        optuna.logging.set_verbosity(verbosity)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(list(map(str, args)), r.exit_code, r.stdout, r.stderr)


def explore_run_here(*args: str | Path, cwd: Path | None = None) -> Result:
    """:func:`explore_run` inside this process (:func:`explore_here`)."""
    r = explore_here("run", *args, "--quiet", cwd=cwd)
    return Result(r.returncode, r.stdout + r.stderr)


def run_here(space_file: Path) -> None:
    """Run a space's trials with the scheduler inside this process, the way ``explore
    run`` would (its study next to the file): for plugins a test registers here, which
    a process of its own would not know."""
    from explore.binding import bind
    from explore.scheduler import Scheduler
    from explore.scheduler.shared_data import load_shared
    from explore.space import load_space
    from explore.study import default_storage, open_study

    space = load_space(space_file)
    study = open_study(space, default_storage(space_file))
    bound = bind(space)
    Scheduler(bound, study, load_shared(bound), workers=space.budget.workers,
              memory=space.budget.memory, device="cpu", main=IN_TEST).run(space.budget.trials)
