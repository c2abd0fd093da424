"""The study's summary that ``explore run`` ends with and ``explore show`` begins with:
its counts, its best trial, why its failed trials failed, and the memory of its last
run."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from explore.attrs import RECORD_ATTR, RUNS_ATTR
from explore.cli import console
from explore.utilisation import describe, of_run

FAILURES_SHOWN = 5  # reasons the summary lists (explore show: each trial's in full)


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
    """The study's counts and best trial, why its failed trials failed
    (:func:`print_failures`), and the memory of ``run`` (the run just ended, or the
    study's last): the budget, the planned peak, the peak the system measured for the
    run's processes, the packing efficiency and what it switched out of its arenas
    (:func:`switching`); then its utilisation of the machine and where its time went
    (:func:`explore.utilisation.describe`).  Reads the trials directly: pandas alone
    would add about 35 MB to the run's process at its end.  Numbers are never broken
    over lines: a terminal too narrow for a table leaves its least needed columns out
    (:func:`fitted`)."""
    out = console.out
    trials = study.get_trials(deepcopy=False)
    states = Counter(tr.state.name.lower() for tr in trials)
    best_v, best_n = "-", "-"
    if len(study.directions) == 1:
        with contextlib.suppress(ValueError):  # no complete trial yet
            best_v, best_n = f"{study.best_value:.4g}", str(study.best_trial.number)
    else:
        best_v = f"{len(study.best_trials)} on the Pareto front"
    print_fitted({"trials": [str(len(trials))], "complete": [str(states["complete"])],
                  "pruned": [str(states["pruned"])], "failed": [str(states["fail"])],
                  "best value": [best_v], "best trial": [best_n]},
                 ("best trial", "pruned"), title=f"study {study.study_name!r}",
                 header_style="bold")
    why = pruned(trials)
    if why:
        out.print(why, highlight=False)
    print_failures(trials)
    if run is None:
        return
    eff = run.get("packing_efficiency")
    fixed = run.get("main", 0) + run.get("tracker", 0) + sum(run.get("overheads", [])) + \
        run.get("data", 0)
    print_fitted({"budget": [mb(run["budget"])], "planned peak": [mb(run["peak"])],
                  "measured peak": [mb(run["measured_peak"]) if run.get("measured_peak")
                                    else "-"],
                  "packing": ["-" if eff is None else f"{eff:.0%}"],
                  "workers": [str(run.get("workers", "-"))], "fixed": [mb(fixed)]},
                 ("fixed", "workers", "packing"), title="memory (last run)",
                 header_style="bold")
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
    used = of_run(run)
    if used is not None:
        for line in describe(used):
            out.print(line, highlight=False)
    for note in run.get("notes", []):
        out.print(f"note: {note}", highlight=False)


def fitted(columns: dict[str, list[str]], droppable: Sequence[str] = (),
           **table: Any) -> tuple[Table, list[str]]:
    """A table (``table``: :class:`rich.table.Table`'s options) of ``columns``, header
    -> cells, whose cells are never broken over lines nor cut short (a header may wrap
    at its spaces); on a console too narrow for every column, the first of
    ``droppable`` are left out until it fits.  The table, and the headers left out.

    >>> t, dropped = fitted({"trial": ["7"], "bytes": ["1,234,567"]}, ["bytes"])
    >>> [c.header for c in t.columns], dropped
    (['trial', 'bytes'], [])
    """
    out = console.out
    wide = out.options.update_width(1 << 16)  # its own width, not cut to the console's
    cols, dropped = dict(columns), []
    for col in [None, *droppable]:
        if col is not None:
            del cols[col]
            dropped.append(col)
        t = Table(**table)
        for header, cells in cols.items():
            t.add_column(header, min_width=max(map(len, cells), default=0))
        for row in zip(*cols.values(), strict=True):
            t.add_row(*(Text(cell, no_wrap=True) for cell in row))
        if out.measure(t, options=wide).minimum <= out.width:
            break
    return t, dropped


def print_fitted(columns: dict[str, list[str]], droppable: Sequence[str] = (),
                 **table: Any) -> None:
    """Print :func:`fitted`'s table, and which columns it left out, if any."""
    t, dropped = fitted(columns, droppable, **table)
    console.out.print(t)
    if dropped:
        console.out.print(f"(left out for the terminal's width: {', '.join(dropped)})",
                          highlight=False)


def print_failures(trials: list[Any]) -> None:
    """Why ``trials`` failed, grouped by reason (:func:`explore.failures.grouped`), the
    first :data:`FAILURES_SHOWN` reasons; nothing when none failed."""
    from explore.failures import grouped  # noqa: PLC0415 (--help start-up: the study side)

    groups = grouped(trials)
    if not groups:
        return
    out = console.out
    out.print("failed trials, by reason (each in full: explore show, explore export's "
              "fail_reason):", highlight=False)
    for g in groups[:FAILURES_SHOWN]:
        out.print(f"  {g.line()}", highlight=False, markup=False)
    left = groups[FAILURES_SHOWN:]
    if left:
        n = sum(len(g.numbers) for g in left)
        out.print(f"  ... and {n} more trial{'s' * (n != 1)} failed for {len(left)} other "
                  f"reason{'s' * (len(left) != 1)}", highlight=False)


def pruned(trials: list[Any]) -> str | None:
    """Why ``trials`` were pruned, in a line (their records' ``pruned``; None if none
    says): by the pruner, paused at a rung and never promoted, or for room.

    >>> from types import SimpleNamespace as T
    >>> print(pruned([T(user_attrs={"explore": {"pruned": w}}) for w in
    ...              ["by the pruner", "paused, not promoted", "by the pruner"]]))
    pruned: 2 by the pruner, 1 paused, not promoted
    >>> pruned([T(user_attrs={})]) is None
    True
    """
    why = Counter(t.user_attrs.get(RECORD_ATTR, {}).get("pruned") for t in trials)
    why.pop(None, None)
    if not why:
        return None
    return "pruned: " + ", ".join(f"{n} {w}" for w, n in why.most_common())


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
