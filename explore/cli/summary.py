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


def small_mb(n: int) -> str:
    """Bytes in MB as :func:`mb` writes them, but in kB or bytes below a megabyte
    (a small model's switched-out state would read 0.0 MB).

    >>> small_mb(12_500_000), small_mb(5_685), small_mb(512)
    ('12.5 MB', '5.7 kB', '512 B')
    """
    return mb(n) if n >= 1e6 else f"{n / 1e3:.1f} kB" if n >= 1e3 else f"{n} B"


def last_run(study: Any) -> dict[str, Any] | None:
    """The study's last run with its memory measured, or None."""
    runs = study.user_attrs.get(RUNS_ATTR) or []
    return runs[-1] if runs and "measured_peak" in runs[-1] else None


def print_summary(study: Any, run: dict[str, Any] | None) -> None:
    """The study's counts and best trial, and the memory of ``run`` (the run just ended,
    or the study's last): the budget, the planned peak, the peak the system measured
    for the run's processes, the packing efficiency and what it switched out of its
    arenas (:func:`switching`).  Reads the trials directly:
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
    said = switching(run)
    if said:
        out.print(said, highlight=False)
    for note in run.get("notes", []):
        out.print(f"note: {note}", highlight=False)


def switching(run: dict[str, Any]) -> str | None:
    """What ``run`` switched out of its arenas, in a line (None if nothing was): how
    often paused trials left and came back, the bytes of state written out, and the
    folder the states went to.

    >>> print(switching({"switching": {"switched_out": 3, "switched_in": 2,
    ...       "bytes": 12_500_000, "folder": "/s/.switched/h-1-ab"}}))
    ... # doctest: +NORMALIZE_WHITESPACE
    switched out: paused trials left their arenas 3 times and came back in 2 times
    (12.5 MB of state written out); the states were written to /s/.switched/h-1-ab
    (removed at the end)
    >>> switching({"switching": {"switched_out": 0, "switched_in": 0}}) is None
    True
    """
    sw = run.get("switching") or {}
    if not sw.get("switched_out"):
        return None
    back = sw.get("switched_in", 0)
    line = (f"switched out: paused trials left their arenas {_times(sw['switched_out'])}"
            f" and {f'came back in {_times(back)}' if back else 'never came back in'}")
    if sw.get("bytes"):
        line += f" ({small_mb(sw['bytes'])} of state written out)"
    if sw.get("folder"):
        line += f"; the states were written to {sw['folder']} (removed at the end)"
    return line


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
