"""A space on the digits data run by the scheduler inside the test process, on one
worker: for tests that read what a run wrote in its study."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from explore.binding import bind
from explore.datasets import load_digits
from explore.scheduler import Scheduler
from explore.space import Space, load_space
from explore.study import open_study
from tests.explore.cli_run import IN_TEST


def run_digits(folder: Path, name: str, text: str, trials: int) -> tuple[Space, Any]:
    """Write ``text`` as ``folder/NAME.yaml``, run ``trials`` of it into the SQLite study
    ``folder/NAME.db``; the space and the study."""
    f = folder / f"{name}.yaml"
    f.write_text(text)
    space = load_space(f)
    study = open_study(space, f"sqlite:///{folder / (name + '.db')}")
    Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
              device="cpu", main=IN_TEST).run(trials)
    return space, study
