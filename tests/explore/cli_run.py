"""``explore run`` as a user runs it: a process of its own.  The budget covers the run's
whole process tree, the command's own process included, so a run inside the test
process would be charged for everything the tests have loaded."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Where a test runs the scheduler inside its own process, it charges none of that
# process's memory (the tests' own imports) to the run's budget (Scheduler(main=)).
IN_TEST = 0


@dataclass
class Result:
    exit_code: int
    output: str


def explore_run(*args: str | Path, timeout: float = 300) -> Result:
    """``explore run ARGS --quiet`` in a fresh process; its exit status and output."""
    r = subprocess.run([sys.executable, "-m", "explore.cli", "run", *map(str, args),
                        "--quiet"], capture_output=True, text=True, timeout=timeout)
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
