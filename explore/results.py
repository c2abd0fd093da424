"""A finished (or running) study as a pandas DataFrame, one row per trial.

>>> import optuna
>>> study = optuna.create_study(study_name="s", storage="sqlite:///:memory:")
>>> df = frame(study)
>>> list(df.columns)[:4]
['number', 'state', 'value', 'params']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from explore.attrs import RUNS_ATTR
from explore.live.names import final_record
from explore.storages import open_storage, release
from explore.study import PARAMS_ATTR, storage_url
from explore.utilisation import PARTS, of_run, trial_rate

ZONES = ("forward", "gradient", "optimizer", "workspace")
COLUMNS = ["number", "state", "value", "params", "batch_size", "total_bytes",
           *(f"{z}_bytes" for z in ZONES), "rounds", "worker", "arena_offset", "switches", "pauses",
           "switched_out", "switch_bytes", "out_spans",
           "placed_at", "start", "end", "wall_s", "busy_s", "train_seconds", "valid_seconds",
           "flops", "flop_rate", "fail_reason"]


def load(storage: str | Path | optuna.storages.BaseStorage, study: str) -> pd.DataFrame:
    """Trials of ``study`` in ``storage`` (a path to the SQLite file, a storage URL or an
    Optuna storage; a SQLite file that does not exist is a :class:`FileNotFoundError`,
    and none is created): parameters (one column each, prefixed ``p_``, plus the full
    dict in ``params``), objective value(s), the final validation metrics (one column
    each, named after the metric: ``accuracy``, ``loss``, ``f1``, ``rmse``, ... as the
    trials recorded them), state, planned bytes per zone, batch size, rounds run,
    worker, switches, pauses at pruning rungs (:mod:`explore.rungs`), start and end
    (seconds from the run's start), wall time and training time (``train_seconds``;
    ``valid_seconds`` of it validating), its model FLOPs (``flops``) and their rate on
    its worker (``flop_rate``, FLOP/s: :mod:`explore.utilisation`), and what a paused
    trial cost when it was switched out of its worker's arena to a file:
    ``switched_out`` (times it left), ``switch_bytes`` (bytes written out; both 0
    for a trial never switched out) and ``out_spans`` (``[left, back]`` in seconds from
    the run's start; empty if never out)."""
    if not isinstance(study, str):  # None would open whichever study is alone there
        raise TypeError(f"study: a study's name (a string), not {study!r}")
    url = storage_url(storage)
    opened = open_storage(url) if isinstance(url, str) else url
    try:
        return frame(optuna.load_study(study_name=study, storage=opened))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(opened)]
        raise KeyError(f"no study {study!r} in {storage}; studies there: "
                       f"{', '.join(map(repr, names)) or 'none'}") from None
    finally:
        if opened is not storage:  # opened here for this read: closed again
            release(opened)


def frame(s: optuna.Study) -> pd.DataFrame:
    """The trials of an open study, as :func:`load` reads them."""
    rows = []
    values: list[str] = ["value"]
    measured: dict[str, None] = {}  # the metric columns, in the order first recorded
    for t in s.get_trials(deepcopy=False):
        ua = {**t.user_attrs, **final_record(t)}  # a stale trial's verdict included
        zones = ua.get("planned_bytes") or {}
        row: dict[str, Any] = {
            "number": t.number, "state": t.state.name.lower(),
            "params": ua.get(PARAMS_ATTR, dict(t.params)),
            "batch_size": ua.get("batch_size"), "total_bytes": ua.get("total_bytes"),
            **{f"{z}_bytes": zones.get(z) for z in ZONES},
            "rounds": ua.get("rounds"), "worker": ua.get("worker"),
            "arena_offset": ua.get("arena_offset"), "placed_at": ua.get("placed_at"),
            "switches": ua.get("switches"), "pauses": ua.get("pauses"),
            "switched_out": ua.get("switched_out") or 0,
            "switch_bytes": ua.get("switch_bytes") or 0,
            "out_spans": [list(span) for span in ua.get("out_spans") or []],
            "start": ua.get("start"), "end": ua.get("end"),
            "busy_s": ua.get("busy_s"), "train_seconds": ua.get("train_seconds"),
            "valid_seconds": ua.get("valid_seconds"), "flops": ua.get("flops"),
            "flop_rate": trial_rate(ua), "fail_reason": ua.get("fail_reason"),
        }
        row["wall_s"] = (row["end"] - row["start"]) if row["end"] is not None and \
            row["start"] is not None else None
        trial_values = t.values or []
        if len(s.directions) == 1:
            row["value"] = trial_values[0] if trial_values else None
        else:
            row["value"] = None
            for i, v in enumerate(trial_values):
                row[f"value_{i}"] = v
            values = ["value", *(f"value_{i}" for i in range(len(s.directions)))]
        # The final validation metrics; a study recorded before they were kept has its
        # accuracy alone.
        final = ua.get("metrics")
        if not isinstance(final, dict):
            final = {"accuracy": ua["accuracy"]} if ua.get("accuracy") is not None else {}
        for name, v in final.items():
            col = metric_column(name)
            measured[col] = None
            row[col] = v
        for k, v in t.params.items():
            row[f"p_{k}"] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    first = [c for c in ["number", "state", *values, *measured, *COLUMNS] if c in df.columns]
    first = list(dict.fromkeys(first))
    return df[first + [c for c in df.columns if c not in first]]


def metric_column(name: str) -> str:
    """The column of metric ``name``: its name, unless a column of the frame has it.

    >>> metric_column("accuracy"), metric_column("rounds")
    ('accuracy', 'metric_rounds')
    """
    return f"metric_{name}" if name in COLUMNS or name.startswith(("value", "p_")) else name


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The final-metric columns of a frame from :func:`frame` (those after the values)."""
    fixed = set(COLUMNS)
    return [c for c in df.columns[df.columns.get_loc("state") + 1:df.columns.get_loc("params")]
            if c not in fixed and not c.startswith("value_")]


RUN_COLUMNS = ["budget", "peak", "measured_peak", "packing_efficiency", "workers", "main",
               "tracker", "workers_overhead", "data", "growth", "arena", "wall_s", "flops",
               "peak_flops", "utilisation", *(f"{k}_share" for k in PARTS)]


def runs(study: optuna.Study) -> pd.DataFrame:
    """One row per ``explore run`` of the study: the budget, the planned peak (constants
    and heaps at their most), the peak the system measured for the run's processes
    (PSS), packing efficiency, workers, and the measured constants (bytes).

    >>> study = optuna.create_study(study_name="r", storage="sqlite:///:memory:")
    >>> runs(study).empty
    True
    """
    rows = []
    for r in study.user_attrs.get(RUNS_ATTR, []):
        rows.append({"budget": r.get("budget"), "peak": r.get("peak"),
                     "measured_peak": r.get("measured_peak"),
                     "packing_efficiency": r.get("packing_efficiency"),
                     "workers": r.get("workers", len(r.get("overheads", []))),
                     "main": r.get("main"), "tracker": r.get("tracker"),
                     "workers_overhead": sum(r.get("overheads", [])), "data": r.get("data"),
                     "growth": r.get("growth"), "arena": r.get("arena"), **_work(r)})
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def _work(run: dict[str, Any]) -> dict[str, Any]:
    """A run's utilisation columns (:mod:`explore.utilisation`; empty for a run recorded
    without them)."""
    u = of_run(run)
    if u is None:
        return {}
    return {"wall_s": u.wall_s, "flops": u.total_flops, "peak_flops": u.peak,
            "utilisation": u.utilisation, **{f"{k}_share": u.shares.get(k) for k in PARTS}}
