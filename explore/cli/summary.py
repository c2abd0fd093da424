"""The study's summary that ``explore run`` ends with and ``explore show`` begins with:
its counts, its best trial, and the memory of its last run."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

from rich.table import Table

from explore.attrs import RUNS_ATTR
from explore.cli import console


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def last_run(study: Any) -> dict[str, Any] | None:
    """The study's last run with its memory measured, or None."""
    runs = study.user_attrs.get(RUNS_ATTR) or []
    return runs[-1] if runs and "measured_peak" in runs[-1] else None


def print_summary(study: Any, run: dict[str, Any] | None) -> None:
    """The study's counts and best trial, and the memory of ``run`` (the run just ended,
    or the study's last): the budget, the planned peak, the peak the system measured
    for the run's processes, and the packing efficiency.  Reads the trials directly:
    pandas alone would add about 35 MB to the run's process at its end."""
    out = console.out
    trials = study.get_trials(deepcopy=False)
    states = Counter(tr.state.name.lower() for tr in trials)
    t = Table(title=f"study {study.study_name!r}", header_style="bold")
    for col in ("trials", "complete", "pruned", "failed", "best value", "best trial"):
        t.add_column(col)
    best_v, best_n = "-", "-"
    if len(study.directions) == 1:
        with contextlib.suppress(ValueError):  # no complete trial yet
            best_v, best_n = f"{study.best_value:.4g}", str(study.best_trial.number)
    else:
        best_v = f"{len(study.best_trials)} on the Pareto front"
    t.add_row(str(len(trials)), str(states["complete"]), str(states["pruned"]),
              str(states["fail"]), best_v, best_n)
    out.print(t)
    if run is None:
        return
    m = Table(title="memory (last run)", header_style="bold")
    for col in ("budget", "planned peak", "measured peak", "packing", "workers", "fixed"):
        m.add_column(col)
    eff = run.get("packing_efficiency")
    fixed = run.get("main", 0) + run.get("tracker", 0) + sum(run.get("overheads", [])) + \
        run.get("data", 0)
    m.add_row(mb(run["budget"]), mb(run["peak"]),
              mb(run["measured_peak"]) if run.get("measured_peak") else "-",
              "-" if eff is None else f"{eff:.0%}", str(run.get("workers", "-")), mb(fixed))
    out.print(m)
    out.print(f"fixed: scheduler {mb(run.get('main', 0))}, resource tracker "
              f"{mb(run.get('tracker', 0))}, workers "
              f"{', '.join(mb(o) for o in run.get('overheads', []))}, data "
              f"{mb(run.get('data', 0))}; measured peak = " + (
                  "the device memory the driver lists for the run's processes"
                  if run.get("device") == "gpu" else "the run's processes' PSS"),
              highlight=False)
    for note in run.get("notes", []):
        out.print(f"note: {note}", highlight=False)
