"""A finished (or running) study as a pandas DataFrame, one row per trial.

>>> import optuna
>>> study = optuna.create_study(study_name="s", storage="sqlite:///:memory:")
>>> df = frame(study)
>>> list(df.columns)[:4]
['number', 'state', 'value', 'params']
"""

from __future__ import annotations

from typing import Any

import optuna
import pandas as pd

from explore.study import PARAMS_ATTR, RECORD_ATTR

ZONES = ("forward", "gradient", "optimizer", "workspace")
COLUMNS = ["number", "state", "value", "params", "batch_size", "total_bytes",
           *(f"{z}_bytes" for z in ZONES), "rounds", "worker", "arena_offset", "switches", "pauses",
           "placed_at", "start", "end", "wall_s", "busy_s", "fail_reason"]


def load(storage: str | Any, study: str) -> pd.DataFrame:
    """Trials of ``study`` in ``storage`` (a URL or an Optuna storage): parameters (one
    column each, prefixed ``p_``, plus the full dict in ``params``), objective
    value(s), state, planned bytes per zone, batch size, rounds run, worker, switches,
    pauses at pruning rungs (:mod:`explore.rungs`), start and end (seconds from the
    run's start) and wall time."""
    return frame(optuna.load_study(study_name=study, storage=storage))


def frame(s: optuna.Study) -> pd.DataFrame:
    """The trials of an open study, as :func:`load` reads them."""
    rows = []
    for t in s.get_trials(deepcopy=False):
        ua = {**t.user_attrs, **t.user_attrs.get(RECORD_ATTR, {})}
        zones = ua.get("planned_bytes") or {}
        row: dict[str, Any] = {
            "number": t.number, "state": t.state.name.lower(),
            "params": ua.get(PARAMS_ATTR, dict(t.params)),
            "batch_size": ua.get("batch_size"), "total_bytes": ua.get("total_bytes"),
            **{f"{z}_bytes": zones.get(z) for z in ZONES},
            "rounds": ua.get("rounds"), "worker": ua.get("worker"),
            "arena_offset": ua.get("arena_offset"), "placed_at": ua.get("placed_at"),
            "switches": ua.get("switches"), "pauses": ua.get("pauses"),
            "start": ua.get("start"), "end": ua.get("end"),
            "busy_s": ua.get("busy_s"), "fail_reason": ua.get("fail_reason"),
        }
        row["wall_s"] = (row["end"] - row["start"]) if row["end"] is not None and \
            row["start"] is not None else None
        values = t.values or []
        if len(s.directions) == 1:
            row["value"] = values[0] if values else None
        else:
            row["value"] = None
            for i, v in enumerate(values):
                row[f"value_{i}"] = v
        for k, v in t.params.items():
            row[f"p_{k}"] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    first = [c for c in COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


RUN_COLUMNS = ["budget", "peak", "measured_peak", "packing_efficiency", "workers", "main",
               "tracker", "workers_overhead", "data", "growth", "arena"]


def runs(study: optuna.Study) -> pd.DataFrame:
    """One row per ``explore run`` of the study: the budget, the planned peak (constants
    and heaps at their most), the peak the system measured for the run's processes
    (PSS), packing efficiency, workers, and the measured constants (bytes).

    >>> study = optuna.create_study(study_name="r", storage="sqlite:///:memory:")
    >>> runs(study).empty
    True
    """
    rows = []
    for r in study.user_attrs.get("runs", []):
        rows.append({"budget": r.get("budget"), "peak": r.get("peak"),
                     "measured_peak": r.get("measured_peak"),
                     "packing_efficiency": r.get("packing_efficiency"),
                     "workers": r.get("workers", len(r.get("overheads", []))),
                     "main": r.get("main"), "tracker": r.get("tracker"),
                     "workers_overhead": sum(r.get("overheads", [])), "data": r.get("data"),
                     "growth": r.get("growth"), "arena": r.get("arena")})
    return pd.DataFrame(rows, columns=RUN_COLUMNS)
